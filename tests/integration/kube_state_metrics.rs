//! config/metrics, CAPTF's custom-resource-state configuration, run by the real
//! kube-state-metrics (built from the Go module tests/kube-state-metrics pins) against the
//! test control plane: the series of an applied machine say its conditions, their
//! reasons, that it is provisioned, its owners and its Cluster.

use std::time::Duration;

use crate::manager::{free_port, http_get};
use crate::support::cluster::binaries;
use crate::support::*;

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

/// The sample lines of `family` whose labels include every one of `labels`.
fn samples<'a>(text: &'a str, family: &str, labels: &[(&str, &str)]) -> Vec<&'a str> {
    text.lines()
        .filter(|l| l.starts_with(&format!("{family}{{")))
        .filter(|l| {
            labels
                .iter()
                .all(|(k, v)| l.contains(&format!("{k}=\"{v}\"")))
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn kube_state_metrics_reads_an_applied_machine_with_the_shipped_configuration() {
    let env = Env::builder("ksm")
        .backoff(Duration::from_millis(300), Duration::from_millis(1200))
        .with_machine("web-1", &module(0))
        .start()
        .await;
    let (port, telemetry) = (free_port(), free_port());
    let config = format!("{ROOT}/config/metrics/crd-metrics-config.yaml");
    let log = env.dir.join("kube-state-metrics.log");
    let mut ksm = tokio::process::Command::new(binaries().join("kube-state-metrics"))
        .args([
            "--kubeconfig",
            &env.kubeconfig_path().display().to_string(),
            "--custom-resource-state-only",
            "--custom-resource-state-config-file",
            &config,
            "--host",
            "127.0.0.1",
            "--port",
            &port.to_string(),
            "--telemetry-host",
            "127.0.0.1",
            "--telemetry-port",
            &telemetry.to_string(),
        ])
        .stdout(std::fs::File::create(&log).expect("log"))
        .stderr(std::fs::File::create(env.dir.join("kube-state-metrics.err")).expect("log"))
        .kill_on_drop(true)
        .spawn()
        .expect("start kube-state-metrics");
    let ns = env.ns.clone();
    let me = [("namespace", ns.as_str()), ("name", "web-1")];
    let ready = [
        me[0],
        me[1],
        ("cluster_name", "prod"),
        ("type", "Ready"),
        ("status", "True"),
    ];
    let mut text = String::new();
    let start = std::time::Instant::now();
    loop {
        if let Ok(Some(status)) = ksm.try_wait() {
            panic!(
                "kube-state-metrics exited ({status}):\n{}",
                std::fs::read_to_string(env.dir.join("kube-state-metrics.err")).unwrap_or_default()
            );
        }
        if tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .is_ok()
        {
            text = http_get(port, "/metrics").await.1;
            if samples(&text, "captf_terraformmachine_status_condition", &ready)
                .iter()
                .any(|l| l.ends_with(" 1"))
            {
                break;
            }
        }
        assert!(
            start.elapsed() < Duration::from_secs(90),
            "timed out waiting for web-1's Ready in kube-state-metrics:\n{text}\n{}",
            std::fs::read_to_string(env.dir.join("kube-state-metrics.err")).unwrap_or_default()
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let one = |family: &str, labels: &[(&str, &str)]| {
        let found = samples(&text, family, labels);
        assert!(
            found.iter().any(|l| l.ends_with(" 1")),
            "{family} with {labels:?} at 1 in:\n{}",
            text.lines()
                .filter(|l| l.contains("web-1"))
                .collect::<Vec<_>>()
                .join("\n")
        );
    };
    one(
        "captf_terraformmachine_status_condition_reason",
        &[
            me[0],
            me[1],
            ("type", "InputsApplied"),
            ("reason", "Applied"),
        ],
    );
    one("captf_terraformmachine_status_provisioned", &me);
    one(
        "captf_terraformmachine_owner",
        &[me[0], me[1], ("owner_kind", "Machine")],
    );
    one(
        "captf_terraformmachine_info",
        &[me[0], me[1], ("provider_id", "captf:///web-1")],
    );
    // Not deleting: no deletion timestamp series for it.
    assert!(
        samples(&text, "captf_terraformmachine_deletion_timestamp", &me).is_empty(),
        "{text}"
    );
    let _ = ksm.kill().await;
    env.shutdown().await;
}
