//! The manager as an operator runs it: two replicas elect one leader on a Lease, and the
//! probes and metrics answer.

use std::time::Duration;

use captf::controller::leader::{Elector, LeaderConfig};
use k8s_openapi::api::coordination::v1::Lease;
use kube::api::Api;

use crate::support::*;

fn leader_cfg(env: &Env, who: &str) -> LeaderConfig {
    LeaderConfig {
        namespace: env.manager_ns.clone(),
        name: "captf-manager-leader".into(),
        identity: who.into(),
        lease_duration: Duration::from_secs(1),
        renew_deadline: Duration::from_millis(700),
        renew_every: Duration::from_millis(200),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_elect_one_leader_and_the_other_takes_over_when_it_stops_renewing() {
    let env = Env::builder("leader").start().await;
    let api: Api<Lease> = Api::namespaced(env.client.clone(), &env.manager_ns);
    let (mut a, mut b) = (Elector::new(), Elector::new());
    let (ca, cb) = (leader_cfg(&env, "a"), leader_cfg(&env, "b"));
    assert!(
        a.try_acquire(&api, &ca).await.expect("a"),
        "the first replica leads"
    );
    assert!(
        !b.try_acquire(&api, &cb).await.expect("b"),
        "the second waits while the lease is fresh"
    );
    assert!(a.try_acquire(&api, &ca).await.expect("a renews"));
    // a stops renewing: b takes over once it has seen the same record for the lease
    // duration.
    assert!(!b.try_acquire(&api, &cb).await.expect("b sees the renewal"));
    tokio::time::sleep(Duration::from_millis(1300)).await;
    assert!(
        b.try_acquire(&api, &cb).await.expect("b"),
        "the second takes over once the lease expired"
    );
    assert!(
        !a.try_acquire(&api, &ca).await.expect("a"),
        "the old leader does not take it back"
    );
    env.shutdown().await;
}

/// A leader whose clock is a minute behind writes renew times a minute old; a replica
/// that compared them with its own clock would take the Lease from it at once. Judged by
/// how long the record stays unchanged, the healthy leader keeps it, and loses it only
/// once it stops renewing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_skewed_clock_does_not_take_the_lease_from_a_healthy_leader() {
    let env = Env::builder("leader-skew").start().await;
    let api: Api<Lease> = Api::namespaced(env.client.clone(), &env.manager_ns);
    let cb = leader_cfg(&env, "b");
    // Leader a, renewing every 200 ms with a clock 60 s behind.
    let renew = |n: i32| {
        let api = api.clone();
        let ns = env.manager_ns.clone();
        async move {
            let at = jiff::Timestamp::now() - jiff::SignedDuration::from_secs(60);
            let lease: Lease = serde_json::from_value(serde_json::json!({
                "metadata": {"name": "captf-manager-leader", "namespace": ns},
                "spec": {"holderIdentity": "a", "leaseDurationSeconds": 1,
                    "acquireTime": at.to_string(), "renewTime": (at + jiff::SignedDuration::from_millis(i64::from(n))).to_string(),
                    "leaseTransitions": 0}
            }))
            .expect("lease");
            match api.get_opt("captf-manager-leader").await.expect("get") {
                None => {
                    api.create(&Default::default(), &lease)
                        .await
                        .expect("create");
                }
                Some(old) => {
                    let mut l = lease;
                    l.metadata.resource_version = old.metadata.resource_version;
                    api.replace("captf-manager-leader", &Default::default(), &l)
                        .await
                        .expect("renew");
                }
            }
        }
    };
    let mut b = Elector::new();
    for n in 0..15 {
        renew(n * 200).await;
        assert!(
            !b.try_acquire(&api, &cb).await.expect("b"),
            "round {n}: the leader renews, so its Lease is not b's to take"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // a stops renewing.
    tokio::time::sleep(Duration::from_millis(1300)).await;
    assert!(b.try_acquire(&api, &cb).await.expect("b"));
    env.shutdown().await;
}

pub(crate) use captf_test_support::ports::free_port;

pub(crate) async fn http_get(port: u16, path: &str) -> (u16, String) {
    try_http_get(port, path)
        .await
        .unwrap_or_else(|e| panic!("GET 127.0.0.1:{port}{path}: {e}"))
}

/// `GET path` on `port`: its status code and the whole response, or why nothing answered.
pub(crate) async fn try_http_get(port: u16, path: &str) -> std::io::Result<(u16, String)> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port)).await?;
    s.write_all(format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes())
        .await?;
    let mut out = String::new();
    s.read_to_string(&mut out).await?;
    let out = dechunked(out);
    Ok((status_code(&out), out))
}

/// A whole HTTP/1.1 response with a chunked body (`Transfer-Encoding: chunked`, as Go's
/// servers send a long body, kube-state-metrics' among them) made plain: the chunk-size
/// lines, which may fall in the middle of a line of the body, taken out.
pub(crate) fn dechunked(response: String) -> String {
    let Some((head, mut body)) = response.split_once("\r\n\r\n") else {
        return response;
    };
    let chunked = head.lines().any(|l| {
        l.split_once(':').is_some_and(|(name, value)| {
            name.trim().eq_ignore_ascii_case("transfer-encoding")
                && value.trim().eq_ignore_ascii_case("chunked")
        })
    });
    if !chunked {
        return response;
    }
    let mut plain = format!("{head}\r\n\r\n");
    while let Some((size, rest)) = body.split_once("\r\n") {
        let size = size.split(';').next().unwrap_or_default().trim();
        let size = usize::from_str_radix(size, 16)
            .unwrap_or_else(|_| panic!("a chunk size, not {size:?}, in:\n{response}"));
        if size == 0 {
            break;
        }
        let chunk = rest
            .get(..size)
            .unwrap_or_else(|| panic!("a chunk of {size} bytes cut short in:\n{response}"));
        plain.push_str(chunk);
        body = rest[size..].strip_prefix("\r\n").unwrap_or(&rest[size..]);
    }
    plain
}

#[test]
fn a_chunked_response_is_read_whole_with_lines_split_across_chunks_joined() {
    let response =
        "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nTransfer-Encoding: chunked\r\n\r\n\
                    c\r\nfoo_total{a=\r\n8\r\n\"b\"} 1\nx\r\n0\r\n\r\n"
            .to_string();
    let plain = dechunked(response);
    assert!(
        plain.ends_with("\r\n\r\nfoo_total{a=\"b\"} 1\nx"),
        "{plain:?}"
    );
    assert_eq!(status_code(&plain), 200);
    let unchunked = "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok".to_string();
    assert_eq!(dechunked(unchunked.clone()), unchunked);
}

/// The status code of a whole HTTP/1.1 response (0 when it has none).
pub(crate) fn status_code(response: &str) -> u16 {
    response
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn probes_and_metrics_answer() {
    let mut env = Env::builder("probes").start().await;
    let port = restart_with_metrics(&mut env).await;
    assert_eq!(http_get(port, "/healthz").await.0, 200);
    wait_for("readiness", LONG_WAIT, || async {
        http_get(port, "/readyz").await.0 == 200
    })
    .await;
    let markers = env.markers();
    let uid = env.create_cluster("prod").await;
    env.create_object::<Tfm>("web-1", "prod", &uid, &markers)
        .await;
    // A pass is counted when it starts and timed when it ends.
    wait_for("a reconcile counted and timed", LONG_WAIT, || async {
        let (_, text) = http_get(port, "/metrics").await;
        text.contains("captf_reconciles_total{kind=\"TerraformMachine\"}")
            && text.contains("captf_pass_duration_seconds_count{kind=\"TerraformMachine\"}")
    })
    .await;
    let (_, metrics) = http_get(port, "/metrics").await;
    // OpenMetrics: a family is declared once it has a sample; counters' samples end in
    // _total; the text ends with # EOF.
    for declared in [
        "# TYPE captf_reconciles counter",
        "# TYPE captf_pass_duration_seconds histogram",
        "# TYPE captf_gate_wait_seconds histogram",
    ] {
        assert!(metrics.contains(declared), "{declared} in {metrics}");
    }
    assert!(metrics.trim_end().ends_with("# EOF"), "{metrics}");
    env.shutdown().await;
}

const LONG_WAIT: Duration = Duration::from_secs(30);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_filter_and_namespace_limit_what_a_manager_handles() {
    let mut env = Env::builder("filter").start().await;
    env.config.watch_filter = Some("blue".into());
    env.config.namespace = Some(env.ns.clone());
    env.start_manager();
    let markers = env.markers();
    let uid = env.create_cluster("prod").await;
    for (name, filter) in [("blue-1", "blue"), ("green-1", "green")] {
        env.create_object::<Tfm>(name, "prod", &uid, &markers).await;
        env.api::<Tfm>()
            .patch(
                name,
                &kube::api::PatchParams::default(),
                &kube::api::Patch::Merge(serde_json::json!({"metadata": {"labels": {captf::api::names::CAPI_WATCH_FILTER_LABEL: filter}}})),
            )
            .await
            .expect("label");
    }
    env.wait_finalizer::<Tfm>("blue-1").await;
    tokio::time::sleep(Duration::from_millis(800)).await;
    let green = env.object::<Tfm>("green-1").await.expect("green");
    assert!(
        green.metadata.finalizers.is_none(),
        "another manager's object is left alone"
    );
    env.shutdown().await;
}

/// The manager and the CLI name themselves in every request's User-Agent (the proxy keys
/// its counts by it): an administrator tells them apart in the audit log.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_manager_and_the_cli_name_themselves_in_their_user_agent() {
    let env = Env::builder("agents").start().await;
    let log = env.proxy.request_log();
    let version = env!("CARGO_PKG_VERSION");
    let manager_agent = format!("captf/{version} (manager)");
    let cli_agent = format!("captf/{version} (cli)");
    let sent_by = |agent: &str| {
        log.snapshot_by_client()
            .iter()
            .filter(|((client, ..), _)| client == agent)
            .map(|(_, n)| *n)
            .sum::<u64>()
    };
    let manager = manager_process(&env, &[], std::process::Stdio::null());
    wait_for("the manager's watches", LONG_WAIT, || async {
        sent_by(&manager_agent) >= 5
    })
    .await;
    drop(manager);
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_captf"))
        .args(["orphans", "-n", &env.ns, "-o", "json"])
        .env("KUBECONFIG", env.proxy.kubeconfig_path())
        .output()
        .expect("run captf orphans");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(sent_by(&cli_agent) > 0, "{:?}", log.snapshot_by_client());
    // Nobody else went through the proxy, and nothing without a User-Agent.
    let others: Vec<String> = log
        .snapshot_by_client()
        .keys()
        .map(|(client, ..)| client.clone())
        .filter(|c| *c != manager_agent && *c != cli_agent)
        .collect();
    assert!(others.is_empty(), "{others:?}");
    env.shutdown().await;
}

/// The manager's JSON log lines (the Deployment sets `CAPTF_LOG_FORMAT=json`) name the
/// object each pass is about: its span carries the kind, namespace and name, and the JSON
/// formatter's own keys (`name` is the span's name there) do not hide any of them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_json_log_lines_of_a_pass_name_its_object() {
    let env = Env::builder("json-logs").start().await;
    let uid = env.create_cluster("prod").await;
    env.create_object::<Tfm>("web-1", "prod", &uid, &env.markers())
        .await;
    let log_path = env.dir.join("manager-json.log");
    let _manager = manager_process(
        &env,
        &[
            ("CAPTF_LOG_FORMAT", "json"),
            ("RUST_LOG", "info,captf=debug,kube=warn"),
        ],
        std::fs::File::create(&log_path)
            .expect("the log file")
            .into(),
    );
    // A line logged inside a pass over web-1: its spans name the object.
    let of_web_1 = |line: &serde_json::Value| {
        line["spans"].as_array().is_some_and(|spans| {
            spans.iter().any(|s| {
                s["kind"] == "TerraformMachine"
                    && s["namespace"] == env.ns.as_str()
                    && s.as_object()
                        .is_some_and(|o| o.values().any(|v| v == "web-1"))
            })
        })
    };
    let lines = || -> Vec<serde_json::Value> {
        std::fs::read_to_string(&log_path)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect()
    };
    wait_for(
        "a log line of a pass over web-1 naming it",
        long(),
        || async { lines().iter().any(of_web_1) },
    )
    .await;
    env.shutdown().await;
}

/// `captf manager` as its own process through the fault proxy (`--provision=false`, one
/// namespace, no probes or metrics), with `vars` in its environment and its stderr to
/// `stderr`; killed when the handle drops, however the test ends.
fn manager_process(env: &Env, vars: &[(&str, &str)], stderr: std::process::Stdio) -> Killed {
    std::process::Command::new(env!("CARGO_BIN_EXE_captf"))
        .args([
            "manager",
            "--provision=false",
            "--metrics-bind-address=",
            "--health-probe-bind-address=",
            "--namespace",
            &env.ns,
            "--manager-namespace",
            &env.manager_ns,
        ])
        .env("KUBECONFIG", env.proxy.kubeconfig_path())
        .envs(vars.iter().copied())
        .stdout(std::process::Stdio::null())
        .stderr(stderr)
        .spawn()
        .map(Killed)
        .expect("start the manager")
}

/// A child process killed when dropped.
struct Killed(std::process::Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The passes the in-process manager serving metrics on `port` has counted, all kinds.
pub(crate) async fn passes(port: u16) -> u64 {
    let (_, text) = http_get(port, "/metrics").await;
    text.lines()
        .filter(|l| l.starts_with("captf_reconciles_total{"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>() as u64
}

/// (Re)starts the in-process manager with its probes and metrics on a free port, once it
/// answers there; returns the port.
pub(crate) async fn restart_with_metrics(env: &mut Env) -> u16 {
    env.stop_manager().await;
    let port = free_port();
    env.config.metrics_addr = Some(format!("127.0.0.1:{port}").parse().expect("addr"));
    env.config.health_addr = env.config.metrics_addr;
    env.start_manager();
    wait_for("the manager's metrics", LONG_WAIT, || async {
        tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .is_ok()
    })
    .await;
    port
}

/// A cache whose watch cannot list (here the Events', refused) holds the passes of its
/// kind: nothing is decided on an empty cache, and each pass fails, counted as a setup
/// error and logged with the caches it waits for.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cache_whose_watch_cannot_list_holds_the_passes() {
    let mut env = Env::builder("unfilled").start().await;
    env.proxy
        .faults()
        .fail_next(1_000_000, Some("list"), Some("events"), 403);
    let port = restart_with_metrics(&mut env).await;
    let markers = env.markers();
    let uid = env.create_cluster("prod").await;
    env.create_object::<Tfm>("web-1", "prod", &uid, &markers)
        .await;
    wait_for(
        "a pass failing on the cache that has no first list",
        Duration::from_secs(120),
        || async {
            let (_, text) = http_get(port, "/metrics").await;
            text.contains(r#"captf_reconcile_errors_total{kind="TerraformMachine",error="setup"}"#)
        },
    )
    .await;
    let obj = env.object::<Tfm>("web-1").await.expect("the object");
    assert!(
        obj.status
            .as_ref()
            .is_none_or(|s| s.observed_generation.is_none()),
        "nothing decided: {:?}",
        obj.status
    );
    // Not ready while a cache had no first list, and /readyz says which controllers wait.
    let (code, body) = http_get(port, "/readyz").await;
    assert_eq!(code, 503, "{body}");
    assert!(
        body.contains("TerraformCluster, TerraformMachine, TerraformMachinePool controller(s) have not had their first lists"),
        "{body}"
    );
    env.proxy.faults().clear();
    env.shutdown().await;
}
