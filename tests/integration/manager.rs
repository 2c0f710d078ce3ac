//! The manager as an operator runs it: two replicas elect one leader on a Lease, and the
//! probes and metrics answer.

use std::time::Duration;

use captf::controller::leader::{LeaderConfig, try_acquire};
use k8s_openapi::api::coordination::v1::Lease;
use kube::api::Api;

use crate::support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_elect_one_leader_and_the_other_takes_over_when_it_stops_renewing() {
    let env = Env::start("leader").await;
    let api: Api<Lease> = Api::namespaced(env.client.clone(), &env.manager_ns);
    let cfg = |who: &str| LeaderConfig {
        namespace: env.manager_ns.clone(),
        name: "captf-manager-leader".into(),
        identity: who.into(),
        lease_duration: Duration::from_secs(1),
        renew_every: Duration::from_millis(300),
    };
    assert!(
        try_acquire(&api, &cfg("a")).await.expect("a"),
        "the first replica leads"
    );
    assert!(
        !try_acquire(&api, &cfg("b")).await.expect("b"),
        "the second waits while the lease is fresh"
    );
    assert!(try_acquire(&api, &cfg("a")).await.expect("a renews"));
    tokio::time::sleep(Duration::from_millis(2200)).await;
    assert!(
        try_acquire(&api, &cfg("b")).await.expect("b"),
        "the second takes over once the lease expired"
    );
    assert!(
        !try_acquire(&api, &cfg("a")).await.expect("a"),
        "the old leader does not take it back"
    );
    env.shutdown().await;
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

async fn http_get(port: u16, path: &str) -> (u16, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .expect("connect");
    s.write_all(format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes())
        .await
        .expect("write");
    let mut out = String::new();
    s.read_to_string(&mut out).await.expect("read");
    let code = out
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    (code, out)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn probes_and_metrics_answer() {
    let mut env = Env::start("probes").await;
    let port = free_port();
    env.config.health_addr = Some(format!("127.0.0.1:{port}").parse().expect("addr"));
    env.config.metrics_addr = env.config.health_addr;
    env.start_manager();
    wait_for("the probes", LONG_WAIT, || async {
        tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .is_ok()
    })
    .await;
    assert_eq!(http_get(port, "/healthz").await.0, 200);
    wait_for("readiness", LONG_WAIT, || async {
        http_get(port, "/readyz").await.0 == 200
    })
    .await;
    let markers = env.markers();
    let uid = env.create_cluster("prod").await;
    env.create_object::<Tfm>("web-1", "prod", &uid, &markers)
        .await;
    wait_for("a reconcile counted", LONG_WAIT, || async {
        http_get(port, "/metrics")
            .await
            .1
            .contains("captf_reconciles_total{kind=\"TerraformMachine\"}")
    })
    .await;
    let (_, metrics) = http_get(port, "/metrics").await;
    for name in [
        "captf_reconcile_errors_total",
        "captf_deletion_decisions_total",
        "captf_destroy_attempts_total",
        "captf_destroy_failures_total",
        "captf_held_deletions_total",
    ] {
        assert!(
            metrics.contains(&format!("# TYPE {name} counter")),
            "{name} in {metrics}"
        );
    }
    env.shutdown().await;
}

const LONG_WAIT: Duration = Duration::from_secs(30);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_filter_and_namespace_limit_what_a_manager_handles() {
    let mut env = Env::start("filter").await;
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
