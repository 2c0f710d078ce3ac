//! Disposal instead of deletion, with the real Cluster API: a Cluster marked for
//! disposal is deleted by CAPTF when its retention ends, unless the mark is taken back
//! first or a hold keeps it; the deletion itself is the ordinary one.

use captf::api::names;
use kube::api::{Patch, PatchParams};
use serde_json::{Value, json};

use crate::provisioning::{annotation, wait_condition};
use crate::steps::EnvExt;

/// The condition `type_` of `name` in `captf explain -n NS -o json`'s apply table.
fn explained(env: &Env, name: &str, type_: &str) -> Option<Value> {
    let out = env.captf(&["explain", "-n", &env.ns, "-o", "json"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let items: Value = serde_json::from_slice(&out.stdout).expect("JSON");
    items.as_array()?.iter().find(|e| e["name"] == name)?["apply"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == type_)
        .cloned()
}
use crate::support::*;

async fn annotate_cluster(env: &Env, edits: Value) {
    env.cluster_api()
        .patch(
            "prod",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": edits}})),
        )
        .await
        .expect("annotate the Cluster");
}

/// Mark, see the time it will be deleted, take it back; mark again with a short
/// retention and a hold: held past its end; the hold removed, the Cluster is deleted by
/// CAPTF and everything its TerraformCluster made is destroyed.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_cluster_marked_for_disposal_is_deleted_at_the_end_unless_taken_back_or_held() {
    if envtest_only("it reads the files Terraform leaves on this machine") {
        return;
    }
    let env = Env::builder("dispose").provisioning().start().await;
    let uid = env.create_cluster("prod").await;
    env.create_owned::<Tfc>(
        "prod",
        "prod",
        &[("Cluster", "prod", &uid, false)],
        &format!(
            "{}{}",
            apply_module(0),
            contract_outputs(names::Kind::TerraformCluster)
        ),
        json!({}),
    )
    .await;
    wait_condition::<Tfc>(&env, "prod", "Provisioned", "True", "Provisioned").await;
    // A Cluster never marked shows no Disposal condition.
    assert!(env.condition::<Tfc>("prod", "Disposal").await.is_none());

    // Marked: recorded, and the time of the deletion named with how to take it back.
    annotate_cluster(&env, json!({ names::DISPOSE_AFTER: "1h" })).await;
    let msg = wait_condition::<Tfc>(&env, "prod", "Disposal", "True", "DisposalPending").await;
    let obj = env
        .object::<Tfc>("prod")
        .await
        .expect("the TerraformCluster");
    let requested = annotation(&obj, names::DISPOSAL_REQUESTED_AT).expect("the record");
    assert!(
        msg.contains(&format!("requested at {requested}"))
            && msg.contains("its deletion at")
            && msg.contains(&format!("{}-", names::DISPOSE_AFTER)),
        "{msg}"
    );

    // Taken back: the record goes.
    annotate_cluster(&env, json!({ names::DISPOSE_AFTER: null })).await;
    wait_condition::<Tfc>(&env, "prod", "Disposal", "False", "NotMarked").await;
    wait_for("the record to go", long(), || async {
        env.object::<Tfc>("prod")
            .await
            .is_some_and(|o| annotation(&o, names::DISPOSAL_REQUESTED_AT).is_none())
    })
    .await;

    // A short retention with a hold: over, and held.
    annotate_cluster(
        &env,
        json!({ names::DISPOSE_AFTER: "2s", names::DISPOSAL_HOLD: "recovering a volume" }),
    )
    .await;
    let msg = wait_condition::<Tfc>(&env, "prod", "Disposal", "True", "DisposalHeld").await;
    assert!(msg.contains("recovering a volume"), "{msg}");
    let cluster = env.cluster_api().get("prod").await.expect("the Cluster");
    assert!(
        cluster.metadata.deletion_timestamp.is_none(),
        "held: not deleted"
    );
    assert!(!env.destroyed("prod"));

    // The hold removed: CAPTF deletes the Cluster, and the ordinary deletion destroys.
    annotate_cluster(&env, json!({ names::DISPOSAL_HOLD: null })).await;
    wait_for("the TerraformCluster to be released", long(), || async {
        !env.exists::<Tfc>("prod").await
    })
    .await;
    assert!(
        env.destroyed("prod"),
        "Terraform destroyed what the apply made"
    );
    wait_for("the Cluster to be gone", long(), || async {
        env.cluster_api()
            .get_opt("prod")
            .await
            .ok()
            .flatten()
            .is_none()
    })
    .await;
    env.shutdown().await;
}

/// A cluster module that can hibernate: its machines' power follows `captf_hibernated`
/// (an in-place change, which the plan guard lets through).
const HIBERNATING_MODULE: &str = r#"variable "captf_hibernated" {
  type    = bool
  default = false
}
resource "terraform_data" "power" {
  input = var.captf_hibernated ? "stopped" : "running"
}
output "power" {
  value = terraform_data.power.output
}
"#;

/// Hibernation during a disposal: the module that declares `captf_hibernated` is applied
/// with it and says `Hibernated`; the machine whose module does not is left running and
/// says so, without a re-apply; taking the disposal back wakes the module.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_cluster_in_disposal_hibernates_what_can_and_wakes_when_taken_back() {
    let env = Env::builder("hibernate")
        .backoff(
            std::time::Duration::from_millis(300),
            std::time::Duration::from_millis(1200),
        )
        .with_machine("web-1", &module(0))
        .start()
        .await;
    let uid = env
        .cluster_api()
        .get("prod")
        .await
        .expect("the Cluster")
        .metadata
        .uid
        .unwrap_or_default();
    env.create_owned::<Tfc>(
        "prod",
        "prod",
        &[("Cluster", "prod", &uid, false)],
        &format!(
            "{HIBERNATING_MODULE}{}",
            contract_outputs(names::Kind::TerraformCluster)
        ),
        json!({}),
    )
    .await;
    wait_condition::<Tfc>(&env, "prod", "InputsApplied", "True", "Applied").await;
    let power = || async {
        env.state_output(names::Kind::TerraformCluster, "prod", "power")
            .await
            .unwrap_or_default()
    };
    assert_eq!(power().await, "running");
    let machine_attempt = || async {
        env.object::<Tfm>("web-1")
            .await
            .and_then(|o| annotation(&o, names::APPLY_ATTEMPT))
    };
    let before = machine_attempt().await;

    annotate_cluster(
        &env,
        json!({ names::DISPOSE_AFTER: "1h", names::DISPOSE_HIBERNATE: "true" }),
    )
    .await;
    let msg = wait_condition::<Tfc>(&env, "prod", "Hibernated", "True", "Hibernated").await;
    assert!(msg.contains("captf_hibernated = true"), "{msg}");
    assert_eq!(power().await, "stopped");
    let shown = explained(&env, "prod", "Hibernated").expect("explain shows hibernation");
    assert_eq!(shown["reason"], "Hibernated", "{shown}");
    let msg = wait_condition::<Tfm>(&env, "web-1", "Hibernated", "False", "NotHibernatable").await;
    assert!(msg.contains("left running"), "{msg}");
    assert_eq!(
        machine_attempt().await,
        before,
        "no re-apply for a module that cannot hibernate"
    );
    wait_condition::<Tfc>(&env, "prod", "Disposal", "True", "DisposalPending").await;

    // Taken back: woken by a re-apply without the variable.
    annotate_cluster(
        &env,
        json!({ names::DISPOSE_AFTER: null, names::DISPOSE_HIBERNATE: null }),
    )
    .await;
    wait_condition::<Tfc>(&env, "prod", "Hibernated", "False", "NotHibernated").await;
    wait_for("the module to be running again", long(), || async {
        power().await == "running"
            && env
                .condition::<Tfc>("prod", "InputsApplied")
                .await
                .is_some_and(|(s, r, _)| s == "True" && r == "Applied")
    })
    .await;
    wait_condition::<Tfm>(&env, "web-1", "Hibernated", "False", "NotHibernated").await;
    wait_condition::<Tfc>(&env, "prod", "Disposal", "False", "NotMarked").await;
    env.shutdown().await;
}
