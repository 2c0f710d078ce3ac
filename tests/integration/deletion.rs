//! End-to-end deletions: the real manager against the test API server, the real
//! `terraform` doing the apply and, in the destroy Jobs, the destroy. Each test is a
//! scenario a person would recognise.

use std::time::Duration;

use captf::api::names::{self, Kind};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::ServiceAccount;
use kube::api::{Api, ListParams};

use crate::support::*;

const LONG: Duration = Duration::from_secs(90);

fn destroyed(markers: &std::path::Path, name: &str) -> bool {
    (0..2).all(|i| markers.join(format!("{name}-{i}.destroyed")).exists())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn scenario_01_clean_teardown_destroys_everything_in_order() {
    let mut env = Env::start("clean").await;
    env.start_manager();
    let markers = env.markers();
    let uid = env.create_cluster("prod").await;
    env.create_object::<Tfc>("prod", "prod", &uid, &markers)
        .await;
    env.create_object::<Tfm>("web-1", "prod", &uid, &markers)
        .await;
    env.create_object::<Tfm>("web-2", "prod", &uid, &markers)
        .await;
    env.create_object::<Tfmp>("pool", "prod", &uid, &markers)
        .await;
    wait_for("finalizers on first sight", LONG, || async {
        env.object::<Tfm>("web-1").await.is_some_and(|o| {
            o.metadata
                .finalizers
                .as_deref()
                .unwrap_or_default()
                .contains(&Kind::TerraformMachine.finalizer().to_string())
        }) && env
            .object::<Tfc>("prod")
            .await
            .is_some_and(|o| o.metadata.finalizers.is_some())
            && env
                .object::<Tfmp>("pool")
                .await
                .is_some_and(|o| o.metadata.finalizers.is_some())
            && env
                .object::<Tfm>("web-2")
                .await
                .is_some_and(|o| o.metadata.finalizers.is_some())
    })
    .await;
    env.apply::<Tfc>("prod", &module(0), &markers).await;
    env.apply::<Tfm>("web-1", &module(0), &markers).await;
    env.apply::<Tfm>("web-2", &module(0), &markers).await;
    env.apply::<Tfmp>("pool", &module(0), &markers).await;

    env.delete_cluster("prod").await;

    // The cluster holds on its dependents first.
    wait_for("the cluster to report its dependents", LONG, || async {
        match env.condition::<Tfc>("prod", "DeletionBlocked").await {
            Some((s, r, _)) if s == "True" && r == "DependentsExist" => true,
            _ => !env.exists::<Tfm>("web-1").await, // dependents may already be gone
        }
    })
    .await;
    wait_for("every object to be released", LONG, || async {
        !env.exists::<Tfm>("web-1").await
            && !env.exists::<Tfm>("web-2").await
            && !env.exists::<Tfmp>("pool").await
            && !env.exists::<Tfc>("prod").await
    })
    .await;

    // Terraform really destroyed every instance, machines and pool before the cluster.
    for name in ["web-1", "web-2", "pool", "prod"] {
        assert!(
            destroyed(&markers, name),
            "{name} was not destroyed by Terraform"
        );
    }
    let cluster_done = std::fs::metadata(markers.join("prod-0.destroyed"))
        .and_then(|m| m.modified())
        .expect("marker");
    for name in ["web-1", "web-2", "pool"] {
        let t = std::fs::metadata(markers.join(format!("{name}-0.destroyed")))
            .and_then(|m| m.modified())
            .expect("marker");
        assert!(t <= cluster_done, "{name} was destroyed after the cluster");
    }
    // State, inputs, backups, Jobs, the lock Lease and the runner RBAC are gone.
    for (kind, name) in [
        (Kind::TerraformCluster, "prod"),
        (Kind::TerraformMachine, "web-1"),
        (Kind::TerraformMachine, "web-2"),
        (Kind::TerraformMachinePool, "pool"),
    ] {
        let suffix = names::state_suffix(kind, name);
        for secret in [
            names::state_secret_name(&suffix),
            names::inputs_secret_name(&suffix),
            names::backup_secret_name(&suffix),
        ] {
            assert!(!env.secret_exists(&secret).await, "{secret} is left");
        }
        let lease: Api<Lease> = Api::namespaced(env.client.clone(), NS);
        assert!(
            lease
                .get_opt(&names::lock_lease_name(&suffix))
                .await
                .expect("lease")
                .is_none(),
            "lock Lease of {name} is left"
        );
    }
    let jobs: Api<Job> = Api::namespaced(env.client.clone(), NS);
    assert!(
        jobs.list(&ListParams::default())
            .await
            .expect("jobs")
            .items
            .is_empty(),
        "Jobs are left"
    );
    wait_for("the RBAC sweep", LONG, || async {
        let sas: Api<ServiceAccount> = Api::namespaced(env.client.clone(), NS);
        sas.get_opt(names::RUNNER_NAME).await.expect("sa").is_none()
    })
    .await;
    assert!(
        env.event_reasons("web-1")
            .contains(&"DestroyStarted".to_string()),
        "{:?}",
        env.event_reasons("web-1")
    );
    env.shutdown().await;
}
