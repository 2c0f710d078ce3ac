//! Uninstalling CAPTF (deleting its CRDs) while objects remain: an uninstall is not a
//! teardown. The real apiextensions-apiserver deletes the CRD (cleanup finalizer,
//! instances deleted and held by their finalizers), on a control plane of the test's own.

use std::time::Duration;

use captf::api::names::{self, Kind};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use serde_json::json;

use crate::support::*;

const FAST: Duration = Duration::from_millis(300);
/// Why these run on a control plane of their own: they delete a CAPTF CRD, which would
/// take the objects of every other test (and any other user) of a shared cluster with it.
/// They count the manager's passes with the fault proxy's request counter.
const UNINSTALL: &str = "it deletes a CAPTF CRD, which a shared cluster cannot afford";
/// How many manager passes the "nothing happens" window lasts.
const PASSES: u64 = 5;

fn crd_terminating(crd: &CustomResourceDefinition) -> bool {
    crd.metadata.deletion_timestamp.is_some()
        && crd
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|cs| {
                cs.iter()
                    .any(|c| c.type_ == "Terminating" && c.status == "True")
            })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn scenario_02_uninstalling_captf_destroys_nothing() {
    if envtest_only(UNINSTALL) {
        return;
    }
    let mut env = Env::builder("uninstall")
        .dedicated()
        .backoff(FAST, FAST * 4)
        .with_machine("web-1", &module(0))
        .start()
        .await;
    let suffix = names::state_suffix(Kind::TerraformMachine, "web-1");
    let state_secret = names::state_secret_name(&suffix);
    let inputs_secret = names::inputs_secret_name(&suffix);
    assert!(
        env.secret_exists(&state_secret).await,
        "applied: state saved"
    );
    let crd_name = Kind::TerraformMachine.crd_name();
    assert_eq!(
        crd_name,
        "terraformmachines.infrastructure.cluster.x-k8s.io"
    );
    let crds: Api<CustomResourceDefinition> = Api::all(env.client.clone());

    // The uninstall: delete the TerraformMachine CRD.
    crds.delete(&crd_name, &DeleteParams::default())
        .await
        .expect("delete the CRD");

    // The CRD's cleanup deletes the object; the manager's finalizer holds it.
    wait_for("the object to be marked for deletion", long(), || async {
        env.object::<Tfm>("web-1")
            .await
            .is_some_and(|o| o.metadata.deletion_timestamp.is_some())
    })
    .await;
    let msg = env.wait_deleting::<Tfm>("web-1", "Paused", long()).await;
    assert!(
        msg.contains("its CustomResourceDefinition is being deleted")
            && msg.contains("runbooks/Paused.md"),
        "{msg}"
    );
    let (status, reason, paused) = env
        .condition::<Tfm>("web-1", "Paused")
        .await
        .expect("Paused condition");
    assert_eq!((status.as_str(), reason.as_str()), ("True", "Paused"));
    assert!(
        paused.contains("CustomResourceDefinition is being deleted"),
        "{paused}"
    );

    // A bounded "nothing happens" window: several more passes of the manager, each one
    // triggered by an edit of the object (counted by the manager's metrics: the CRD comes
    // from its cache, and a paused pass makes no request).
    let port = crate::manager::restart_with_metrics(&mut env).await;
    for i in 0..PASSES {
        let before = crate::manager::passes(port).await;
        env.annotate::<Tfm>("web-1", &[("test.captf.dev/nudge", Some(i.to_string()))])
            .await;
        wait_for("one more manager pass", long(), || async {
            crate::manager::passes(port).await > before
        })
        .await;
    }
    let msg = env.wait_deleting::<Tfm>("web-1", "Paused", long()).await;
    assert!(msg.contains("CustomResourceDefinition"), "{msg}");
    assert_eq!(
        env.destroy_jobs_created(),
        0,
        "no destroy Job during an uninstall"
    );
    assert_eq!(env.tries("web-1"), 0, "Terraform destroyed nothing");
    assert!(!env.destroyed("web-1"));
    let obj = env.object::<Tfm>("web-1").await.expect("the object stays");
    assert!(
        obj.metadata
            .finalizers
            .unwrap_or_default()
            .contains(&Kind::TerraformMachine.finalizer().to_string()),
        "nothing released: the manager's finalizer stays"
    );
    assert!(env.secret_exists(&state_secret).await, "state kept");
    assert!(env.secret_exists(&inputs_secret).await, "inputs kept");
    let crd = crds.get_opt(&crd_name).await.expect("get CRD");
    assert!(
        crd.as_ref().is_some_and(crd_terminating),
        "the CRD stays, terminating, while the object is held: {crd:?}"
    );

    // runbooks/Paused.md, "The CRD is being deleted": strip the object's finalizer.
    env.api::<Tfm>()
        .patch(
            "web-1",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"finalizers": null}})),
        )
        .await
        .expect("strip the finalizer");
    env.wait_gone::<Tfm>("web-1", long()).await;
    // The CRD's finalizer is released only once no instance is left in storage.
    wait_for("the CRD to go", long(), || async {
        crds.get_opt(&crd_name).await.expect("get CRD").is_none()
    })
    .await;
    assert_eq!(env.destroy_jobs_created(), 0, "still no Job");
    assert_eq!(env.tries("web-1"), 0, "still nothing destroyed");
    assert!(
        env.secret_exists(&state_secret).await,
        "the state Secret stays: the infrastructure is not lost track of"
    );
    env.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn scenario_02_a_failed_read_of_the_crd_during_an_uninstall_starts_nothing() {
    if envtest_only(UNINSTALL) {
        return;
    }
    let mut env = Env::builder("uninstall-fault")
        .dedicated()
        .backoff(FAST, FAST * 4)
        .with_machine("web-1", &module(0))
        .start()
        .await;
    let crd_name = Kind::TerraformMachine.crd_name();
    Api::<CustomResourceDefinition>::all(env.client.clone())
        .delete(&crd_name, &DeleteParams::default())
        .await
        .expect("delete the CRD");
    env.wait_deleting::<Tfm>("web-1", "Paused", long()).await;
    // A manager that starts while the CRD cannot be read (its watch's first lists fail):
    // its passes wait for the CRD's cache, and a failed read is never "the CRD is not
    // being deleted".
    let log = env.proxy.request_log().clone();
    let before = log.count("list", "customresourcedefinitions", "");
    let status_writes = || {
        log.count("patch", "terraformmachines", "status")
            + log.count("update", "terraformmachines", "status")
    };
    let status_before = status_writes();
    env.proxy
        .faults()
        .fail_next(3, Some("list"), Some("customresourcedefinitions"), 500);
    let port = crate::manager::restart_with_metrics(&mut env).await;
    env.annotate::<Tfm>("web-1", &[("test.captf.dev/nudge", Some("1".into()))])
        .await;
    wait_for(
        "the failed lists and a good one after them",
        long(),
        || async { log.count("list", "customresourcedefinitions", "") > before + 3 },
    )
    .await;
    let seen = crate::manager::passes(port).await;
    env.annotate::<Tfm>("web-1", &[("test.captf.dev/nudge", Some("2".into()))])
        .await;
    wait_for("a pass after the CRD was read", long(), || async {
        crate::manager::passes(port).await > seen
    })
    .await;
    env.wait_deleting::<Tfm>("web-1", "Paused", long()).await;
    assert_eq!(
        env.destroy_jobs_created(),
        0,
        "no destroy Job on a failed read"
    );
    assert_eq!(env.tries("web-1"), 0, "Terraform destroyed nothing");
    // No pass decided on a cache without the CRD, the Cluster or the Jobs: the status
    // said Paused all along.
    assert_eq!(
        status_writes(),
        status_before,
        "no status but Paused was written"
    );
    env.shutdown().await;
}
