//! What an operator watches without running `captf explain`: the gauges of what is so now
//! (counted from the manager's caches at each scrape), and health and readiness probes
//! that mean something.

use std::time::Duration;

use captf::api::TerraformMachine as Tfm;
use captf::api::names;

use crate::alerts::{Expected, alerts_on_recorded};
use crate::manager::{http_get, restart_with_metrics};
use crate::support::*;

const WAIT: Duration = Duration::from_secs(90);

/// The value of the sample `series` (name and labels, as the text format writes them) in
/// the manager's `/metrics`, if it has one.
async fn sample(port: u16, series: &str) -> Option<f64> {
    let (_, text) = http_get(port, "/metrics").await;
    text.lines().find_map(|l| {
        l.strip_prefix(series)?
            .strip_prefix(' ')?
            .trim()
            .parse()
            .ok()
    })
}

/// Waits until `series` is `want`; on a timeout, says what it was.
async fn wait_sample(port: u16, series: &str, want: f64) {
    let start = std::time::Instant::now();
    loop {
        let now = sample(port, series).await;
        if now == Some(want) {
            return;
        }
        if start.elapsed() > WAIT {
            let (_, text) = http_get(port, "/metrics").await;
            panic!("timed out waiting for {series} = {want}: it is {now:?}; /metrics:\n{text}");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// A machine applied, then deleted: its destroy fails, then its state is lost and it is
/// held, then it is abandoned. At each step the gauges say so, and the abandon's
/// Secrets are counted as orphans by the next sweep.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_gauges_say_what_is_held_now_and_for_how_long() {
    // One failed destroy, retried 60 s later: long enough to see it failing and to lose
    // the state before the retry.
    let mut env = Env::builder("gauges")
        .backoff(Duration::from_secs(60), Duration::from_secs(240))
        .with_machine("web-1", &module(1))
        .start()
        .await;
    env.config.rbac_sweep_every = Duration::from_secs(1);
    let port = restart_with_metrics(&mut env).await;
    let tfm = r#"kind="TerraformMachine""#;
    wait_sample(
        port,
        &format!("captf_objects{{{tfm},phase=\"provisioned\"}}"),
        1.0,
    )
    .await;
    wait_sample(
        port,
        &format!("captf_objects{{{tfm},phase=\"deleting\"}}"),
        0.0,
    )
    .await;
    wait_sample(port, &format!("captf_destroys_failing{{{tfm}}}"), 0.0).await;

    env.delete::<Tfm>("web-1").await;
    wait_sample(port, &format!("captf_destroys_failing{{{tfm}}}"), 1.0).await;
    wait_sample(
        port,
        &format!("captf_destroy_failures_in_a_row_max{{{tfm}}}"),
        1.0,
    )
    .await;
    wait_sample(
        port,
        &format!("captf_deletions{{{tfm},reason=\"DestroyFailed\"}}"),
        1.0,
    )
    .await;
    wait_sample(
        port,
        &format!("captf_objects{{{tfm},phase=\"provisioned\"}}"),
        0.0,
    )
    .await;
    wait_sample(
        port,
        &format!("captf_objects{{{tfm},phase=\"deleting\"}}"),
        1.0,
    )
    .await;

    let state = names::state_secret_name("web-1.tfm");
    env.lose_secret(&state).await;
    let held = format!("captf_deletions_held{{{tfm},reason=\"StateLost\"}}");
    wait_sample(port, &held, 1.0).await;
    wait_sample(port, &format!("captf_destroys_failing{{{tfm}}}"), 0.0).await;
    // The age of the oldest held deletion grows from when the deletion was asked.
    let oldest = format!("captf_deletion_held_oldest_seconds{{{tfm},reason=\"StateLost\"}}");
    let first = sample(port, &oldest)
        .await
        .expect("the oldest held deletion's age");
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let later = sample(port, &oldest)
        .await
        .expect("the oldest held deletion's age");
    assert!(first > 0.0 && later >= first + 1.0, "{first} then {later}");
    let (_, held_now) = http_get(port, "/metrics").await;
    alerts_on_recorded(
        "held",
        &held_now,
        &[
            Expected {
                alert: "CaptfDeletionHeld",
                at_minutes: 20,
                firing: vec![vec![("kind", "TerraformMachine"), ("reason", "StateLost")]],
            },
            Expected {
                alert: "CaptfDestroyFailing",
                at_minutes: 40,
                firing: vec![],
            },
            Expected {
                alert: "CaptfCannotStart",
                at_minutes: 40,
                firing: vec![],
            },
        ],
    );

    // Abandoned: released, its inputs and backup Secrets kept, which the sweep counts.
    env.abandon::<Tfm>("web-1").await;
    env.wait_gone::<Tfm>("web-1", WAIT).await;
    wait_sample(
        port,
        &format!("captf_objects{{{tfm},phase=\"deleting\"}}"),
        0.0,
    )
    .await;
    let (_, text) = http_get(port, "/metrics").await;
    assert!(!text.contains("captf_deletions_held{"), "{text}");
    wait_sample(port, r#"captf_orphaned_secrets{role="backup"}"#, 1.0).await;
    wait_sample(port, r#"captf_orphaned_secrets{role="inputs"}"#, 1.0).await;
    wait_sample(port, r#"captf_orphaned_secrets{role="state"}"#, 0.0).await;
    // The alert's runbook lists them.
    let run = crate::runbooks::run_runbook(&env, "runbooks/OrphanedState.md").await;
    for secret in [
        names::backup_secret_name("web-1.tfm"),
        names::inputs_secret_name("web-1.tfm"),
    ] {
        assert!(run.stdout.contains(&secret), "{secret} in:\n{}", run.stdout);
    }
    env.shutdown().await;
}

/// A pass that does not end (its write held by the proxy) makes `/healthz` fail naming
/// it; a controller that then finishes no pass for longer than `--stalled-after` while
/// it has objects keeps it failing; with no object left it is healthy again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_fails_while_a_pass_does_not_end_or_a_controller_with_objects_finishes_none() {
    let mut env = Env::builder("stalled").start().await;
    env.config.stalled_after = Duration::from_secs(3);
    let port = restart_with_metrics(&mut env).await;
    wait_for("readiness", WAIT, || async {
        http_get(port, "/readyz").await.0 == 200
    })
    .await;
    assert_eq!(http_get(port, "/healthz").await.0, 200);
    // The first pass puts the finalizer on: its patch is held for 30 s.
    env.proxy.faults().delay_next(
        1,
        Some("patch"),
        Some("terraformmachines"),
        Duration::from_secs(30),
    );
    let markers = env.markers();
    let uid = env.create_cluster("prod").await;
    env.create_object::<Tfm>("web-1", "prod", &uid, &markers)
        .await;
    let object = format!("{}/web-1", env.ns);
    let running = format!("a TerraformMachine pass over {object} has run for");
    wait_for(
        "the health probe naming the pass that does not end",
        WAIT,
        || async {
            let (code, body) = http_get(port, "/healthz").await;
            code == 503 && body.contains(&running) && body.contains("--stalled-after")
        },
    )
    .await;
    // Once it ended, the object waits for its next resync (600 s): longer than 3 s with
    // an object is a stall as far as the probe knows.
    env.wait_finalizer::<Tfm>("web-1").await;
    wait_for(
        "the health probe naming the stalled controller",
        WAIT,
        || async {
            let (code, body) = http_get(port, "/healthz").await;
            code == 503
                && body.contains("the TerraformMachine controller has finished no pass for")
                && body.contains("while it has objects")
        },
    )
    .await;
    // Nothing left to look at: healthy.
    env.delete::<Tfm>("web-1").await;
    env.wait_gone::<Tfm>("web-1", WAIT).await;
    wait_for("healthy again", WAIT, || async {
        http_get(port, "/healthz").await.0 == 200
    })
    .await;
    env.shutdown().await;
}

/// Terraform's lock held by a person: the deletion cannot start, and the object's status
/// and `captf explain` (live) both name the holder, the lock, Terraform's operation, since
/// when, and why CAPTF did not judge it stale.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_held_lock_is_named_with_its_holder_in_the_status_and_in_explain() {
    use crate::steps::EnvExt;
    use k8s_openapi::api::coordination::v1::Lease;
    use kube::api::Api;
    let env = Env::builder("lock-holder")
        .backoff(Duration::from_millis(300), Duration::from_millis(1200))
        .with_machine("web-1", &module(0))
        .start()
        .await;
    env.wait_protected(&names::state_secret_name("web-1.tfm"))
        .await;
    let info = serde_json::json!({"ID": "alice-1", "Operation": "OperationTypePlan",
        "Who": "alice@laptop", "Version": "1.11.4", "Created": "2026-12-01T10:00:00Z", "Path": ""});
    env.take_lock("web-1.tfm", "alice-1", &info).await;
    let lock_name = names::lock_lease_name("web-1.tfm");
    let leases: Api<Lease> = Api::namespaced(env.client.clone(), &env.ns);
    env.delete::<Tfm>("web-1").await;
    let named = [
        "held by alice@laptop (lock alice-1, operation plan) since 2026-12-01T10:00:00Z",
        "laptop is not a runner Pod of this object",
        "terraform force-unlock alice-1",
    ];
    let mut message = String::new();
    let start = std::time::Instant::now();
    while !named.iter().all(|n| message.contains(n)) {
        assert!(
            start.elapsed() < WAIT,
            "timed out waiting for the lock's holder in Deleting: {message}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
        message = env
            .condition::<Tfm>("web-1", "Deleting")
            .await
            .map(|(_, reason, m)| format!("{reason}: {m}"))
            .unwrap_or_default();
    }
    assert!(message.starts_with("DestroyCannotStart: "), "{message}");
    let out = env.captf(&["explain", "-n", &env.ns]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for n in named {
        assert!(text.contains(n), "{n} in captf explain:\n{text}");
    }
    // Alice lets go: the destroy runs and the object goes.
    leases
        .patch(
            &lock_name,
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(serde_json::json!({"spec": {"holderIdentity": null}})),
        )
        .await
        .expect("release the lock");
    env.wait_gone::<Tfm>("web-1", WAIT).await;
    assert!(env.destroyed("web-1"));
    env.shutdown().await;
}

/// A TLS client that accepts any server certificate: the manager's is self-signed (as a
/// ServiceMonitor's `insecureSkipVerify` accepts it).
fn trusting_client() -> tokio_rustls::TlsConnector {
    use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
    use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
    #[derive(Debug)]
    struct AnyCert(std::sync::Arc<rustls::crypto::CryptoProvider>);
    impl ServerCertVerifier for AnyCert {
        fn verify_server_cert(
            &self,
            _: &CertificateDer<'_>,
            _: &[CertificateDer<'_>],
            _: &ServerName<'_>,
            _: &[u8],
            _: UnixTime,
        ) -> Result<ServerCertVerified, rustls::Error> {
            Ok(ServerCertVerified::assertion())
        }
        fn verify_tls12_signature(
            &self,
            message: &[u8],
            cert: &CertificateDer<'_>,
            dss: &rustls::DigitallySignedStruct,
        ) -> Result<HandshakeSignatureValid, rustls::Error> {
            rustls::crypto::verify_tls12_signature(
                message,
                cert,
                dss,
                &self.0.signature_verification_algorithms,
            )
        }
        fn verify_tls13_signature(
            &self,
            message: &[u8],
            cert: &CertificateDer<'_>,
            dss: &rustls::DigitallySignedStruct,
        ) -> Result<HandshakeSignatureValid, rustls::Error> {
            rustls::crypto::verify_tls13_signature(
                message,
                cert,
                dss,
                &self.0.signature_verification_algorithms,
            )
        }
        fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
            self.0.signature_verification_algorithms.supported_schemes()
        }
    }
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .expect("TLS versions")
        .dangerous()
        .with_custom_certificate_verifier(std::sync::Arc::new(AnyCert(provider)))
        .with_no_client_auth();
    tokio_rustls::TlsConnector::from(std::sync::Arc::new(config))
}

/// `GET /metrics` over TLS on `port`, with `token` as the bearer token when given: the
/// status code and the whole response.
async fn https_metrics(port: u16, token: Option<&str>) -> (u16, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .expect("connect");
    let name = rustls::pki_types::ServerName::try_from("localhost").expect("name");
    let mut tls = trusting_client()
        .connect(name, tcp)
        .await
        .expect("a TLS handshake");
    let auth = token
        .map(|t| format!("Authorization: Bearer {t}\r\n"))
        .unwrap_or_default();
    tls.write_all(
        format!("GET /metrics HTTP/1.1\r\nHost: localhost\r\n{auth}Connection: close\r\n\r\n")
            .as_bytes(),
    )
    .await
    .expect("write");
    let mut out = Vec::new();
    let _ = tls.read_to_end(&mut out).await;
    let out = String::from_utf8_lossy(&out).to_string();
    (crate::manager::status_code(&out), out)
}

/// `/metrics` over HTTPS, as `captf manager` serves it by default, on the real API server:
/// the token of a ServiceAccount bound to `captf-metrics-reader` gets the metrics, another
/// ServiceAccount's is refused (403), and no or a bad token is not authenticated (401).
/// The manager runs with the ClusterRole of config/rbac/role.yaml, which must let it
/// create the TokenReview and the SubjectAccessReview.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_over_https_are_served_only_to_callers_the_api_server_allows() {
    use k8s_openapi::api::authentication::v1::TokenRequest;
    use k8s_openapi::api::core::v1::ServiceAccount;
    use k8s_openapi::api::rbac::v1::ClusterRoleBinding;
    use kube::api::{Api, DeleteParams, PostParams};
    let mut env = Env::builder("secure-metrics").start().await;
    env.stop_manager().await;
    let binding = env.run_manager_as_installed().await;
    let out = std::process::Command::new("kubectl")
        .arg("--kubeconfig")
        .arg(env.kubeconfig_path())
        .args(["apply", "-f"])
        .arg(repo_root().join("config/rbac/metrics_reader_role.yaml"))
        .output()
        .expect("kubectl");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let (metrics, health) = (crate::manager::free_port(), crate::manager::free_port());
    env.config.metrics_secure = true;
    env.config.metrics_addr = Some(format!("127.0.0.1:{metrics}").parse().expect("addr"));
    env.config.health_addr = Some(format!("127.0.0.1:{health}").parse().expect("addr"));
    env.start_manager();
    // Two ServiceAccounts; the scraper is bound to the reader role.
    let accounts: Api<ServiceAccount> = Api::namespaced(env.client.clone(), &env.ns);
    let mut tokens = Vec::new();
    for name in ["scraper", "stranger"] {
        let sa: ServiceAccount =
            serde_json::from_value(serde_json::json!({"metadata": {"name": name}})).expect("sa");
        accounts
            .create(&PostParams::default(), &sa)
            .await
            .expect("create the ServiceAccount");
        let request: TokenRequest = serde_json::from_value(
            serde_json::json!({"spec": {"audiences": [], "expirationSeconds": 600}}),
        )
        .expect("request");
        let issued: TokenRequest = accounts
            .create_subresource("token", name, &PostParams::default(), &request)
            .await
            .expect("a token");
        tokens.push(issued.status.expect("status").token);
    }
    let reader = format!("captf-metrics-reader-{}", env.ns);
    let crb: ClusterRoleBinding = serde_json::from_value(serde_json::json!({
        "metadata": {"name": reader},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "captf-metrics-reader"},
        "subjects": [{"kind": "ServiceAccount", "name": "scraper", "namespace": env.ns}]
    }))
    .expect("binding");
    let bindings: Api<ClusterRoleBinding> = Api::all(env.client.clone());
    bindings
        .create(&PostParams::default(), &crb)
        .await
        .expect("bind the reader role");
    wait_for("the secure metrics port", WAIT, || async {
        tokio::net::TcpStream::connect(("127.0.0.1", metrics))
            .await
            .is_ok()
    })
    .await;
    // The scraper's token: the metrics, the census of the objects among them once the
    // controllers run (the server answers before: on a loaded machine a scrape can come
    // while the manager still waits for its lease or its caches' first lists).
    wait_for("the scraper's scrape of the census", WAIT, || async {
        let (code, body) = https_metrics(metrics, Some(&tokens[0])).await;
        code == 200 && body.contains("captf_objects")
    })
    .await;
    // Another ServiceAccount's: refused, naming what it lacks.
    let (code, body) = https_metrics(metrics, Some(&tokens[1])).await;
    assert_eq!(code, 403, "{body}");
    assert!(
        body.contains(&format!(
            "system:serviceaccount:{}:stranger may not get /metrics",
            env.ns
        )) && body.contains("captf-metrics-reader"),
        "{body}"
    );
    // No token, a token the API server does not know.
    let (code, body) = https_metrics(metrics, None).await;
    assert_eq!(code, 401, "{body}");
    let (code, body) = https_metrics(metrics, Some("not-a-token")).await;
    assert_eq!(code, 401, "{body}");
    assert!(body.contains("does not accept the bearer token"), "{body}");
    // The probes stay plain on their own port.
    assert_eq!(http_get(health, "/healthz").await.0, 200);
    let _ = bindings.delete(&reader, &DeleteParams::default()).await;
    env.remove_manager_binding(&binding).await;
    env.shutdown().await;
}
