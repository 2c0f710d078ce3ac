//! clusterctl itself (v1.14.2, built beside the control plane) on CAPTF's objects:
//! `move` between two control planes, each running Cluster API and a CAPTF manager, and
//! `describe`.

use std::process::Output;

use captf::api::names::{self, Kind};
use captf::api::{TerraformCluster as Tfc, TerraformMachine as Tfm};

use crate::steps::EnvExt;
use crate::support::*;

/// Runs clusterctl with its own home (its config and cache) and no version check (there
/// is no network to check with).
fn clusterctl(env: &Env, args: &[&str]) -> Output {
    let home = env.dir.join("clusterctl-home");
    std::fs::create_dir_all(&home).expect("clusterctl home");
    std::process::Command::new(cluster::clusterctl())
        .args(args)
        .env("HOME", &home)
        .env("CLUSTERCTL_DISABLE_VERSIONCHECK", "true")
        .output()
        .expect("clusterctl")
}

fn path(p: &std::path::Path) -> &str {
    p.to_str().expect("a UTF-8 path")
}

/// A Cluster `prod` whose TerraformCluster and TerraformMachine `web-1` the manager
/// applied, its control plane initialised and the Machine's Node registered: what
/// `clusterctl move` requires before it moves anything.
async fn provisioned(tag: &str) -> Env {
    let env = Env::builder(tag).provisioning().start().await;
    env.create_cluster("prod").await;
    env.provision::<Tfc>("prod", "prod", &apply_module(0)).await;
    env.mark_cluster_ready("prod").await;
    env.provision::<Tfm>("web-1", "prod", &apply_module(0))
        .await;
    env.give_machine_a_node("web-1").await;
    env
}

/// The control plane to move to: one of its own with Cluster API, the same namespace,
/// and a CAPTF manager of its own.
pub(crate) async fn target_of(env: &Env, tag: &str) -> Env {
    let mut target = Env::builder(tag)
        .dedicated()
        .in_namespaces(&env.ns, &env.manager_ns)
        .start()
        .await;
    target.config.provision = true;
    target.start_manager();
    target
}

/// `clusterctl move` of the test's namespace from `from` to `to`.
pub(crate) fn move_to(from: &Env, to: &Env) {
    let out = clusterctl(
        from,
        &[
            "move",
            "--kubeconfig",
            path(from.kubeconfig_path()),
            "--to-kubeconfig",
            path(to.kubeconfig_path()),
            "-n",
            &from.ns,
        ],
    );
    assert!(
        out.status.success(),
        "clusterctl move: {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// What `captf orphans` lists in the namespace, as (resource, name).
fn orphans(env: &Env) -> Vec<(String, String)> {
    let out = env.captf(&["orphans", "-n", &env.ns, "-o", "json"]);
    assert!(
        out.status.success(),
        "captf orphans: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let listed: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    listed
        .as_array()
        .expect("an array")
        .iter()
        .map(|o| {
            (
                o["resource"].as_str().unwrap_or_default().to_string(),
                o["name"].as_str().unwrap_or_default().to_string(),
            )
        })
        .collect()
}

/// Damages the state Secret `state` (its content is no gzip), as a hand or a bad restore
/// would.
async fn corrupt(env: &Env, state: &str) {
    let mut s = env.secrets().get(state).await.expect("the state Secret");
    s.data = Some(
        [(
            "tfstate".to_string(),
            k8s_openapi::ByteString(b"this is not gzip".to_vec()),
        )]
        .into(),
    );
    env.secrets()
        .replace(state, &Default::default(), &s)
        .await
        .expect("damage the state");
}

/// Waits until the deletion of `web-1` is held because its state is corrupt.
async fn wait_held_corrupt(env: &Env) {
    env.wait_deleting::<Tfm>("web-1", "Held", long()).await;
    let (_, reason, msg) = env
        .condition::<Tfm>("web-1", "StateReadable")
        .await
        .expect("StateReadable");
    assert_eq!(reason, "StateCorrupt", "{msg}");
}

/// A provisioned Cluster moves with the real `clusterctl move`: nothing of the moved
/// objects is left in the source (Jobs, Pods, Secrets, Leases), nothing is destroyed or
/// applied again on either side, the target rebuilds the status from what the apply
/// recorded, and deleting the Cluster there destroys everything once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn clusterctl_move_takes_a_provisioned_cluster_and_leaves_nothing_behind() {
    if envtest_only("it moves between two local control planes") {
        return;
    }
    let env = provisioned("move-real").await;
    let target = target_of(&env, "move-real-to").await;
    let applied = env.jobs_created();

    move_to(&env, &target);

    // The source: the objects are gone, and everything CAPTF made for them with them.
    wait_for("the source to let the moved objects go", long(), || async {
        !env.exists::<Tfm>("web-1").await && !env.exists::<Tfc>("prod").await
    })
    .await;
    wait_for(
        "the source to have nothing of them left",
        long(),
        || async { orphans(&env).is_empty() },
    )
    .await;
    env.assert_nothing_left(Kind::TerraformMachine, "web-1")
        .await;
    env.assert_nothing_left(Kind::TerraformCluster, "prod")
        .await;
    assert_eq!(env.jobs_created(), applied, "no Job in the source");

    // The target: provisioned again from the recorded success, without a Job.
    target.wait_provisioned::<Tfc>("prod").await;
    target.wait_provisioned::<Tfm>("web-1").await;
    let moved = target.object::<Tfm>("web-1").await.expect("moved");
    assert_eq!(moved.spec.provider_id.as_deref(), Some("captf:///web-1"));
    assert_eq!(
        target.jobs_created(),
        0,
        "nothing applied again in the target"
    );
    for name in ["web-1", "prod"] {
        assert!(!env.destroyed(name), "{name} was destroyed by the move");
    }

    // Deleting the Cluster there destroys what the source applied (the markers are the
    // source's: the recorded inputs name its directory), once.
    target.delete_cluster("prod").await;
    wait_for("the target to release everything", long(), || async {
        !target.exists::<Tfm>("web-1").await && !target.exists::<Tfc>("prod").await
    })
    .await;
    for name in ["web-1", "prod"] {
        assert!(env.destroyed(name), "{name} was not destroyed");
    }
    assert_eq!(
        target.destroy_jobs_created(),
        2,
        "one destroy each, in the target"
    );
    assert_eq!(env.destroy_jobs_created(), 0, "no destroy in the source");
    target
        .assert_nothing_left(Kind::TerraformMachine, "web-1")
        .await;
    target
        .assert_nothing_left(Kind::TerraformCluster, "prod")
        .await;
    target.shutdown().await;
    env.shutdown().await;
}

/// The entry `clusterctl init` writes in its inventory for CAPTF installed in the
/// manager's namespace (the manager runs in the test's process, not installed by it):
/// `clusterctl move` reads Secrets in an infrastructure provider's namespace only, an
/// identity's among them, and requires each provider of the source in the target.
async fn register_provider(env: &Env) {
    use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, PostParams};
    let gvk = GroupVersionKind::gvk("clusterctl.cluster.x-k8s.io", "v1alpha3", "Provider");
    let ar = ApiResource::from_gvk_with_plural(&gvk, "providers");
    let provider: DynamicObject = serde_json::from_value(serde_json::json!({
        "apiVersion": "clusterctl.cluster.x-k8s.io/v1alpha3", "kind": "Provider",
        "metadata": {"name": "infrastructure-terraform", "namespace": env.manager_ns,
            "labels": {"clusterctl.cluster.x-k8s.io": "",
                "clusterctl.cluster.x-k8s.io/core": "inventory"}},
        "providerName": "terraform",
        "type": "InfrastructureProvider",
        "version": "v0.1.0"
    }))
    .expect("provider");
    Api::<DynamicObject>::namespaced_with(env.client.clone(), &env.manager_ns, &ar)
        .create(&PostParams::default(), &provider)
        .await
        .expect("clusterctl's inventory entry for CAPTF");
}

/// `clusterctl move` carries a TerraformCluster's identity and the identity's Secret (a
/// global hierarchy: copied, and left in the source); deleting the Cluster in the target
/// destroys with the moved credentials.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn clusterctl_move_carries_the_identity_and_its_secret() {
    use crate::identity::{create_identity, identities, identity_name, identity_ref, marker};
    use k8s_openapi::api::core::v1::Secret;
    use kube::Api;
    if envtest_only("it moves between two local control planes") {
        return;
    }
    // A control plane of its own: the provider's entry in clusterctl's inventory below
    // would make the other moves' targets lack a provider the source has.
    let env = Env::builder("move-identity")
        .dedicated()
        .provisioning()
        .start()
        .await;
    register_provider(&env).await;
    create_identity(&env, "token-moved", serde_json::json!({"list": [env.ns]})).await;
    env.create_terraform_cluster(&crate::identity::token_module(), identity_ref(&env))
        .await;
    env.wait_provisioned::<Tfc>("prod").await;
    env.mark_cluster_ready("prod").await;
    let target = target_of(&env, "move-identity-to").await;
    register_provider(&target).await;

    move_to(&env, &target);

    wait_for("the source to let the moved objects go", long(), || async {
        !env.exists::<Tfc>("prod").await
    })
    .await;
    let name = identity_name(&env);
    let moved = identities(&target)
        .get(&name)
        .await
        .expect("the identity moved");
    let secret = Api::<Secret>::namespaced(target.client.clone(), &target.manager_ns)
        .get("team-creds")
        .await
        .expect("its Secret moved");
    assert!(
        secret
            .metadata
            .owner_references
            .iter()
            .flatten()
            .any(|r| Some(&r.uid) == moved.metadata.uid.as_ref()),
        "the Secret is the moved identity's: {:?}",
        secret.metadata.owner_references
    );
    assert!(
        identities(&env)
            .get_opt(&name)
            .await
            .expect("get")
            .is_some(),
        "a global identity stays in the source too"
    );

    target.wait_provisioned::<Tfc>("prod").await;
    target.delete_cluster("prod").await;
    wait_for("the target to release the cluster", long(), || async {
        !target.exists::<Tfc>("prod").await
    })
    .await;
    assert_eq!(
        marker(&env, "prod.destroy-token").as_deref(),
        Some("token-moved"),
        "the target's destroy ran with the moved identity"
    );
    for e in [&env, &target] {
        let _ = identities(e).delete(&name, &Default::default()).await;
    }
    target.shutdown().await;
    env.shutdown().await;
}

/// A machine whose deletion is held (its state cannot be read: `StateCorrupt`) when the
/// management cluster moves: nothing is destroyed in the source, the state moves with the
/// object as it was, and the target holds it too. clusterctl carries no deletion over (it
/// makes the objects anew in the target), so the Machine is deleted there again.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn clusterctl_move_of_a_held_deletion_destroys_nothing_and_takes_the_state_along() {
    if envtest_only("it moves between two local control planes") {
        return;
    }
    let env = provisioned("move-held").await;
    let state = names::state_secret_name(&names::state_suffix(Kind::TerraformMachine, "web-1"));
    corrupt(&env, &state).await;
    let corrupt = env
        .secrets()
        .get(&state)
        .await
        .expect("the state Secret")
        .data;
    env.capi_api("Machine")
        .delete("web-1", &Default::default())
        .await
        .expect("delete the Machine");
    wait_held_corrupt(&env).await;
    let target = target_of(&env, "move-held-to").await;

    move_to(&env, &target);

    wait_for("the source to let the moved objects go", long(), || async {
        !env.exists::<Tfm>("web-1").await
    })
    .await;
    assert!(
        !env.destroyed("web-1"),
        "the move destroyed the held machine"
    );
    assert!(
        env.destroy_jobs().await.is_empty(),
        "no destroy in the source"
    );
    // The state arrived as it was, and the target holds on it.
    let arrived = target
        .secrets()
        .get(&state)
        .await
        .expect("the state Secret in the target")
        .data;
    assert_eq!(arrived, corrupt, "the state moved as it was");
    target
        .capi_api("Machine")
        .delete("web-1", &Default::default())
        .await
        .expect("delete the Machine in the target");
    wait_held_corrupt(&target).await;
    assert!(!env.destroyed("web-1"));
    assert_eq!(target.jobs_created(), 0, "no Job at all in the target");
    target.shutdown().await;
    env.shutdown().await;
}

/// `clusterctl describe cluster --show-conditions all` shows a CAPTF object's reason and
/// the runbook its message names.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn clusterctl_describe_shows_the_reason_and_its_runbook() {
    if envtest_only("it runs clusterctl against the local control plane") {
        return;
    }
    let env = Env::builder("describe").provisioning().start().await;
    env.create_cluster("prod").await;
    env.provision::<Tfc>("prod", "prod", &apply_module(0)).await;
    env.mark_cluster_ready("prod").await;
    // A machine whose bootstrap data is not there yet.
    let machine_uid = env.create_machine("web-1", "prod", None).await;
    env.create_owned::<Tfm>(
        "web-1",
        "prod",
        &[("Machine", "web-1", &machine_uid, true)],
        &(apply_module(0) + contract_outputs(Kind::TerraformMachine)),
        serde_json::json!({}),
    )
    .await;
    env.wait_condition::<Tfm>(
        "web-1",
        "Provisioned",
        None,
        "WaitingForBootstrapData",
        long(),
    )
    .await;
    let out = clusterctl(
        &env,
        &[
            "describe",
            "cluster",
            "prod",
            "-n",
            &env.ns,
            "--show-conditions",
            "all",
            "--kubeconfig",
            path(env.kubeconfig_path()),
        ],
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    // docs/12-reading-captf-in-clusterctl-describe.md shows this output.
    println!("{stdout}");
    assert!(
        out.status.success(),
        "clusterctl describe: {stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains("TerraformMachine/web-1")
            || stdout.contains(&format!("TerraformMachine {}/web-1", env.ns)),
        "{stdout}"
    );
    assert!(
        stdout.contains("WaitingForBootstrapData")
            && stdout.contains("runbooks/WaitingForBootstrapData.md"),
        "describe shows the reason and the runbook: {stdout}"
    );
    env.shutdown().await;
}
