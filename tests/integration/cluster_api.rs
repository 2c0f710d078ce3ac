//! CAPTF beside Cluster API: a Cluster's pause is honoured even when Cluster API's Cluster
//! kind is not known to the manager yet.

use std::time::Duration;

use kube::api::PostParams;
use serde_json::json;

use crate::support::*;

/// Cluster API is installed after CAPTF (GitOps installs both at once), or its discovery
/// failed when the manager started: an object that names a Cluster is held as paused,
/// saying why, because a pause of that Cluster could not be seen. Once Clusters are served
/// the manager watches them, and the Cluster's own pause (or its absence) decides.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_cluster_pause_is_not_missed_when_cluster_api_comes_after_the_manager() {
    if envtest_only("it installs Cluster API's Cluster CRD during the test") {
        return;
    }
    let mut env = Env::builder("late-capi")
        .without_cluster_api()
        .start()
        .await;
    env.config.settings.backoff.base = Duration::from_millis(300);
    env.start_manager();
    let markers = env.markers();
    // Named by its label only (no ownerReference to a Cluster that does not exist yet).
    let obj: Tfm = serde_json::from_value(json!({
        "apiVersion": captf::api::names::API_VERSION, "kind": "TerraformMachine",
        "metadata": {"name": "web-1", "namespace": env.ns,
            "labels": {captf::api::names::CAPI_CLUSTER_NAME_LABEL: "prod"}},
        "spec": {"module": {"files": {"main.tf": module(0)}},
            "variables": {"name": "web-1", "marker_dir": markers.display().to_string()}}
    }))
    .expect("object");
    env.api::<Tfm>()
        .create(&PostParams::default(), &obj)
        .await
        .expect("create");
    env.wait_finalizer::<Tfm>("web-1").await;
    // Applied by hand: the manager applies nothing without a Cluster API owner, and
    // Cluster API is not installed yet.
    env.apply::<Tfm>("web-1", &module(0), &markers).await;
    env.delete::<Tfm>("web-1").await;
    let msg = env.wait_deleting::<Tfm>("web-1", "Paused", long()).await;
    assert!(
        msg.contains("it names Cluster prod, and whether that Cluster is paused cannot be seen"),
        "{msg}"
    );
    assert_eq!(
        env.jobs_created(),
        0,
        "no destroy while a pause could be missed"
    );

    // Cluster API arrives, with the Cluster paused, while its discovery fails (a flaky
    // API server): still held, for as long as the kind cannot be discovered.
    env.proxy
        .faults()
        .fail_discovery(captf::api::names::CAPI_GROUP, 503);
    install_cluster_crd(&env.client).await;
    let cluster: kube::api::DynamicObject = serde_json::from_value(json!({
        "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Cluster",
        "metadata": {"name": "prod", "namespace": env.ns}, "spec": {"paused": true}
    }))
    .expect("cluster");
    env.cluster_api()
        .create(&PostParams::default(), &cluster)
        .await
        .expect("create the Cluster");
    // Several rediscoveries (every 500 ms here) fail meanwhile.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let (_, reason, _) = env
        .condition::<Tfm>("web-1", "Deleting")
        .await
        .expect("Deleting");
    assert_eq!(reason, "Paused");
    assert_eq!(env.jobs_created(), 0);

    // Discovery works again: the manager finds the kind, watches Clusters, and the
    // Cluster's own pause decides.
    env.proxy.faults().clear();
    wait_for("the Cluster's own pause to decide", long(), || async {
        env.condition::<Tfm>("web-1", "Deleting")
            .await
            .is_some_and(|(_, r, m)| {
                r == "Paused" && m.contains("its Cluster prod has spec.paused: true")
            })
    })
    .await;
    assert_eq!(env.jobs_created(), 0);
    // Unpaused: the destroy runs.
    env.set_cluster_paused("prod", false).await;
    env.wait_gone::<Tfm>("web-1", long()).await;
    assert!(env.destroyed("web-1"));
    env.shutdown().await;
}
