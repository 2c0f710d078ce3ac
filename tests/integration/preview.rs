//! `DeletionReady` on live objects and `captf explain --if-deleted`: what a deletion would
//! reach if it were asked now, said before anyone asks, by the deletion's own table.

use captf::api::names;
use k8s_openapi::ByteString;

use crate::manager::{http_get, restart_with_metrics};
use crate::provisioning::wait_condition;
use crate::steps::{EnvExt, FAST};
use crate::support::*;

/// The gauge's sample for `reason` of TerraformMachines, 0 when absent.
async fn not_ready(port: u16, reason: &str) -> i64 {
    let (_, text) = http_get(port, "/metrics").await;
    let sample =
        format!("captf_deletion_not_ready{{kind=\"TerraformMachine\",reason=\"{reason}\"}} ");
    text.lines()
        .find_map(|l| l.strip_prefix(&sample))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0)
}

/// `captf explain --if-deleted --cluster prod` in the test's namespace, as JSON: the
/// element of `name`.
fn if_deleted(env: &Env, name: &str) -> serde_json::Value {
    let items = env.captf_json(&[
        "explain",
        "--if-deleted",
        "--cluster",
        "prod",
        "-n",
        &env.ns,
        "-o",
        "json",
    ]);
    items
        .as_array()
        .expect("array")
        .iter()
        .find(|e| e["name"] == name)
        .cloned()
        .unwrap_or_else(|| panic!("{name} in {items}"))
}

/// A provisioned machine says its deletion would destroy what it made; its state
/// damaged, that the deletion would be held, with the reason and runbook the deletion
/// would show, counted by the gauge; `captf explain --if-deleted` says the same from the
/// live objects. Put back, it is ready again, and the deletion does what was previewed.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_live_machine_says_what_its_deletion_would_do_before_it_is_asked() {
    let mut env = Env::builder("preview")
        .backoff(FAST, FAST * 4)
        .with_machine("web-1", &module(0))
        .start()
        .await;
    let port = restart_with_metrics(&mut env).await;
    let msg =
        wait_condition::<Tfm>(&env, "web-1", "DeletionReady", "True", "DestroyWouldRun").await;
    assert!(
        msg.contains("terraform destroy attempt 1") && msg.contains("managed resource instance"),
        "{msg}"
    );
    let e = if_deleted(&env, "web-1");
    assert_eq!(e["ifDeleted"]["row"], 7, "{e}");
    assert_eq!(e["ifDeleted"]["action"], "StartDestroy", "{e}");
    assert_eq!(
        e["ifDeleted"]["condition"]["reason"], "DestroyWouldRun",
        "{e}"
    );
    assert_eq!(e["action"], "NotDeleting", "{e}");

    // The state damaged by a hand: a deletion now would be held.
    let state = names::state_secret_name("web-1.tfm");
    let kept = env.secrets().get(&state).await.expect("the state Secret");
    let mut damaged = kept.clone();
    damaged.data = Some([("tfstate".to_string(), ByteString(b"not gzip".to_vec()))].into());
    env.secrets()
        .replace(&state, &Default::default(), &damaged)
        .await
        .expect("damage the state");
    let msg = wait_condition::<Tfm>(&env, "web-1", "DeletionReady", "False", "StateCorrupt").await;
    assert!(
        msg.contains("would be held") && msg.contains("runbooks/StateCorrupt.md"),
        "{msg}"
    );
    wait_for("the gauge to count it", long(), || async {
        not_ready(port, "StateCorrupt").await == 1
    })
    .await;
    let e = if_deleted(&env, "web-1");
    assert_eq!(e["ifDeleted"]["row"], 6, "{e}");
    assert_eq!(e["ifDeleted"]["condition"]["status"], "False", "{e}");
    assert_eq!(e["ifDeleted"]["runbook"], "runbooks/StateCorrupt.md", "{e}");
    let text = env.captf(&["explain", "--if-deleted", "-n", &env.ns]);
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(
        text.contains("if deleted now: row 6: a state that cannot be read, or cannot be trusted"),
        "{text}"
    );
    // Nothing was gated: the object is live and provisioned, as before.
    let (s, _, _) = env.condition::<Tfm>("web-1", "Ready").await.expect("Ready");
    assert_eq!(s, "True");

    // Put back: ready again, uncounted, and the deletion destroys.
    let mut current = env.secrets().get(&state).await.expect("the state Secret");
    current.data = kept.data.clone();
    env.secrets()
        .replace(&state, &Default::default(), &current)
        .await
        .expect("put the state back");
    wait_condition::<Tfm>(&env, "web-1", "DeletionReady", "True", "DestroyWouldRun").await;
    wait_for("the gauge to uncount it", long(), || async {
        not_ready(port, "StateCorrupt").await == 0
    })
    .await;
    env.delete::<Tfm>("web-1").await;
    env.wait_gone::<Tfm>("web-1", long()).await;
    assert!(env.destroyed("web-1"), "the deletion destroyed");
    env.shutdown().await;
}

/// `--cluster` names a Cluster that has no CAPTF object: a clear error, not an empty list.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn explain_of_a_cluster_without_objects_says_so() {
    let env = Env::builder("preview-none").start().await;
    let out = env.captf(&[
        "explain",
        "--if-deleted",
        "--cluster",
        "nope",
        "-n",
        &env.ns,
    ]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("Cluster nope") && err.contains(&env.ns),
        "{err}"
    );
    env.shutdown().await;
}
