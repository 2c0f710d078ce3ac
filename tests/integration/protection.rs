//! The opt-in admission policies of `config/protection` on the real API server, with the
//! real Cluster API and the manager: a Cluster, a TerraformCluster, a TerraformMachine
//! and a Namespace carrying the deletion-protection annotation cannot be deleted, with a
//! message naming the annotation and how to remove it; the abandon annotation is set
//! only by the configured group; and once the Cluster's own annotation is removed,
//! deleting it runs Cluster API's teardown through the protected descendants (Cluster
//! API's manager deletes them), with every destroy.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use captf::api::names::{self, Kind};
use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config, Resource};
use serde_json::json;

use crate::support::*;

const PROTECTED: &str = "terraform.infrastructure.cluster.x-k8s.io/deletion-protection";
const ABANDON: &str = "terraform.infrastructure.cluster.x-k8s.io/abandon";
const WAIT: Duration = Duration::from_secs(90);

fn kubectl(kubeconfig: &Path, args: &[&str]) {
    let out = Command::new("kubectl")
        .args(args)
        .env("KUBECONFIG", kubeconfig)
        .current_dir(repo_root())
        .output()
        .expect("kubectl");
    assert!(
        out.status.success(),
        "kubectl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The message of an API server's refusal by an admission policy (403 Forbidden).
fn forbidden(err: kube::Error) -> String {
    match err {
        kube::Error::Api(s) if s.code == 403 => s.message,
        other => panic!("not a refusal by an admission policy: {other}"),
    }
}

/// Annotates `obj` (`Some` sets, `None` removes) with a merge patch.
async fn annotate<K>(api: &Api<K>, name: &str, key: &str, value: Option<&str>) -> kube::Result<K>
where
    K: Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let patch = json!({"metadata": {"annotations": {key: value}}});
    api.patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
}

/// A client of the same control plane that impersonates `user` in `groups`.
async fn impersonating(kubeconfig: &Path, user: &str, groups: &[&str]) -> Client {
    let kc = Kubeconfig::read_from(kubeconfig).expect("kubeconfig");
    let mut config = Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
        .await
        .expect("config");
    config.auth_info.impersonate = Some(user.to_string());
    config.auth_info.impersonate_groups = Some(groups.iter().map(|g| g.to_string()).collect());
    Client::try_from(config).expect("client")
}

/// `config/protection` installed with kubectl as a user installs it, and enforced (a
/// policy is enforced a moment after it and its binding exist): a dry-run deletion of a
/// protected namespace is refused.
async fn install_protection(env: &Env) {
    let namespaces: Api<Namespace> = Api::all(env.client.clone());
    if namespaces
        .get_opt("captf-system")
        .await
        .expect("get")
        .is_none()
    {
        let ns: Namespace =
            serde_json::from_value(json!({"metadata": {"name": "captf-system"}})).expect("ns");
        namespaces
            .create(&PostParams::default(), &ns)
            .await
            .expect("create captf-system");
    }
    kubectl(
        env.kubeconfig_path(),
        &["apply", "--server-side", "-k", "config/protection"],
    );
    let probe: Namespace = serde_json::from_value(json!({"metadata": {
        "name": "protection-probe", "annotations": {PROTECTED: "true"}}}))
    .expect("probe");
    namespaces
        .create(&PostParams::default(), &probe)
        .await
        .expect("probe namespace");
    let dry_run = DeleteParams {
        dry_run: true,
        ..DeleteParams::default()
    };
    wait_for("the deletion protection to be enforced", WAIT, || async {
        namespaces
            .delete("protection-probe", &dry_run)
            .await
            .is_err()
    })
    .await;
    annotate(&namespaces, "protection-probe", PROTECTED, None)
        .await
        .expect("unprotect the probe");
    namespaces
        .delete("protection-probe", &DeleteParams::default())
        .await
        .expect("delete the probe");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn protected_objects_are_not_deleted_until_unmarked_and_cluster_api_still_tears_down() {
    if envtest_only("it installs cluster-wide admission policies on a control plane of its own") {
        return;
    }
    // A control plane of its own: the policies are cluster-wide, and other tests set the
    // abandon annotation.
    let mut env = Env::builder("protection").dedicated().start().await;
    env.config.provision = true;
    env.start_manager();
    install_protection(&env).await;

    // A provisioned Cluster: its TerraformCluster and a machine, all three protected.
    let cluster_uid = env.create_cluster_with_infrastructure("prod").await;
    env.create_owned::<Tfc>(
        "prod",
        "prod",
        &[("Cluster", "prod", &cluster_uid, false)],
        &format!(
            "{}{}",
            apply_module(0),
            contract_outputs(Kind::TerraformCluster)
        ),
        json!({}),
    )
    .await;
    env.wait_provisioned::<Tfc>("prod").await;
    env.mark_cluster_ready("prod").await;
    env.provision::<Tfm>("web-1", "prod", &apply_module(0))
        .await;
    let clusters = env.cluster_api();
    let tfcs = env.api::<Tfc>();
    let tfms = env.api::<Tfm>();
    annotate(&clusters, "prod", PROTECTED, Some("true"))
        .await
        .expect("protect the Cluster");
    annotate(&tfcs, "prod", PROTECTED, Some("true"))
        .await
        .expect("protect the TerraformCluster");
    annotate(&tfms, "web-1", PROTECTED, Some("true"))
        .await
        .expect("protect the TerraformMachine");

    // Deleting any of them is refused, naming the annotation and how to remove it.
    let msg = forbidden(
        clusters
            .delete("prod", &DeleteParams::background())
            .await
            .expect_err("a protected Cluster is not deleted"),
    );
    assert!(
        msg.contains(&format!(
            "Cluster {}/prod is protected from deletion (annotation {PROTECTED}=true)",
            env.ns
        )) && msg.contains(&format!(
            "kubectl annotate clusters.cluster.x-k8s.io prod -n {} {PROTECTED}-",
            env.ns
        )),
        "{msg}"
    );
    let msg = forbidden(
        tfcs.delete("prod", &DeleteParams::default())
            .await
            .expect_err("a protected TerraformCluster is not deleted"),
    );
    assert!(
        msg.contains(&format!("TerraformCluster {}/prod is protected", env.ns)),
        "{msg}"
    );
    let msg = forbidden(
        tfms.delete("web-1", &DeleteParams::default())
            .await
            .expect_err("a protected TerraformMachine is not deleted"),
    );
    assert!(
        msg.contains("destroys the infrastructure CAPTF made for it"),
        "{msg}"
    );
    let namespaces: Api<Namespace> = Api::all(env.client.clone());
    annotate(&namespaces, &env.ns, PROTECTED, Some("true"))
        .await
        .expect("protect the namespace");
    let dry_run = DeleteParams {
        dry_run: true,
        ..DeleteParams::default()
    };
    let msg = forbidden(
        namespaces
            .delete(&env.ns, &dry_run)
            .await
            .expect_err("a protected Namespace is not deleted"),
    );
    assert!(
        msg.contains(&format!("Namespace {} is protected", env.ns)),
        "{msg}"
    );
    annotate(&namespaces, &env.ns, PROTECTED, None)
        .await
        .expect("unprotect the namespace");
    // Nothing was deleted, nothing destroyed.
    for (what, deleting) in [
        (
            "Cluster",
            clusters
                .get("prod")
                .await
                .expect("Cluster")
                .metadata
                .deletion_timestamp
                .is_some(),
        ),
        (
            "TerraformCluster",
            tfcs.get("prod")
                .await
                .expect("TFC")
                .metadata
                .deletion_timestamp
                .is_some(),
        ),
        (
            "TerraformMachine",
            tfms.get("web-1")
                .await
                .expect("TFM")
                .metadata
                .deletion_timestamp
                .is_some(),
        ),
    ] {
        assert!(!deleting, "{what} is not being deleted");
    }
    assert!(!env.destroyed("prod") && !env.destroyed("web-1"));

    // The abandon annotation: refused to a user outside the configured group, even an
    // administrator; set by a member; removed by anyone.
    let msg = forbidden(
        annotate(&tfcs, "prod", ABANDON, Some("true"))
            .await
            .expect_err("an administrator outside the group cannot abandon"),
    );
    assert!(
        msg.contains(&format!(
            "TerraformCluster {}/prod: only members of captf-abandoners may set {ABANDON}",
            env.ns
        )),
        "{msg}"
    );
    kubectl(
        env.kubeconfig_path(),
        &[
            "create",
            "clusterrolebinding",
            "protection-test-abandoners",
            "--clusterrole=cluster-admin",
            "--group=captf-abandoners",
        ],
    );
    let alice = impersonating(env.kubeconfig_path(), "alice", &["captf-abandoners"]).await;
    let alices: Api<Tfc> = Api::namespaced(alice, &env.ns);
    annotate(&alices, "prod", ABANDON, Some("true"))
        .await
        .expect("a member of captf-abandoners sets the abandon annotation");
    annotate(&tfcs, "prod", ABANDON, None)
        .await
        .expect("anyone removes it");

    // The Cluster unmarked and deleted: Cluster API deletes the protected machine and
    // TerraformCluster itself, and the manager destroys them.
    annotate(&clusters, "prod", PROTECTED, None)
        .await
        .expect("unprotect the Cluster");
    env.delete_cluster("prod").await;
    env.wait_gone::<Tfm>("web-1", WAIT).await;
    env.wait_gone::<Tfc>("prod", WAIT).await;
    assert!(env.destroyed("web-1"), "terraform destroyed web-1");
    assert!(env.destroyed("prod"), "terraform destroyed prod");
    wait_for("the Cluster to go", WAIT, || async {
        clusters.get_opt("prod").await.ok().flatten().is_none()
    })
    .await;
    kubectl(
        env.kubeconfig_path(),
        &["delete", "clusterrolebinding", "protection-test-abandoners"],
    );
    env.shutdown().await;
}

/// A protected Cluster moves with the real `clusterctl move`: clusterctl's deletion in the
/// source (of objects it marked `delete-for-move`) is let through, nothing is destroyed,
/// and the protection travels with the objects to the target, where it holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_protected_cluster_moves_with_clusterctl_and_stays_protected() {
    if envtest_only("it installs cluster-wide admission policies on control planes of its own") {
        return;
    }
    let mut env = Env::builder("protection-move").dedicated().start().await;
    env.config.provision = true;
    env.start_manager();
    install_protection(&env).await;
    env.create_cluster("prod").await;
    env.provision::<Tfc>("prod", "prod", &apply_module(0)).await;
    env.mark_cluster_ready("prod").await;
    env.provision::<Tfm>("web-1", "prod", &apply_module(0))
        .await;
    env.give_machine_a_node("web-1").await;
    annotate(&env.cluster_api(), "prod", PROTECTED, Some("true"))
        .await
        .expect("protect the Cluster");
    annotate(&env.api::<Tfc>(), "prod", PROTECTED, Some("true"))
        .await
        .expect("protect the TerraformCluster");
    annotate(&env.api::<Tfm>(), "web-1", PROTECTED, Some("true"))
        .await
        .expect("protect the TerraformMachine");

    let target = crate::clusterctl::target_of(&env, "protection-move-to").await;
    install_protection(&target).await;
    crate::clusterctl::move_to(&env, &target);

    wait_for("the source to let the moved objects go", WAIT, || async {
        !env.exists::<Tfm>("web-1").await && !env.exists::<Tfc>("prod").await
    })
    .await;
    for name in ["web-1", "prod"] {
        assert!(!env.destroyed(name), "{name} was destroyed by the move");
    }
    // Protected in the target too.
    target.wait_provisioned::<Tfc>("prod").await;
    let msg = forbidden(
        target
            .cluster_api()
            .delete("prod", &DeleteParams::background())
            .await
            .expect_err("the moved Cluster is protected"),
    );
    assert!(msg.contains("is protected from deletion"), "{msg}");
    let msg = forbidden(
        target
            .api::<Tfm>()
            .delete("web-1", &DeleteParams::default())
            .await
            .expect_err("the moved TerraformMachine is protected"),
    );
    assert!(msg.contains("is protected from deletion"), "{msg}");
    // Unprotected, it goes as any other.
    annotate(&target.cluster_api(), "prod", PROTECTED, None)
        .await
        .expect("unprotect");
    target.delete_cluster("prod").await;
    wait_for("the target to release everything", WAIT, || async {
        !target.exists::<Tfm>("web-1").await && !target.exists::<Tfc>("prod").await
    })
    .await;
    for name in ["web-1", "prod"] {
        assert!(env.destroyed(name), "{name} was not destroyed");
    }
    target.shutdown().await;
    env.shutdown().await;
}

/// A protected Cluster can still be disposed of: the refusal of a deletion offers the
/// disposal, the mark is set, and at the end of its retention CAPTF's manager (as a
/// clusterctl installation runs it, `captf-system/captf-manager` under its own
/// ClusterRole) deletes the Cluster, which nobody else may while it is protected.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_protected_cluster_marked_for_disposal_is_deleted_by_the_manager_only() {
    if envtest_only("it installs cluster-wide admission policies on a control plane of its own") {
        return;
    }
    let ns = format!("dispose-protected-{}", std::process::id());
    let mut env = Env::builder("dispose-protected")
        .dedicated()
        .in_namespaces(&ns, "captf-system")
        .start()
        .await;
    env.run_manager_as_installed().await;
    env.config.provision = true;
    env.start_manager();
    install_protection(&env).await;
    let cluster_uid = env.create_cluster("prod").await;
    env.create_owned::<Tfc>(
        "prod",
        "prod",
        &[("Cluster", "prod", &cluster_uid, false)],
        &format!(
            "{}{}",
            apply_module(0),
            contract_outputs(Kind::TerraformCluster)
        ),
        json!({}),
    )
    .await;
    env.wait_provisioned::<Tfc>("prod").await;
    let clusters = env.cluster_api();
    annotate(&clusters, "prod", PROTECTED, Some("true"))
        .await
        .expect("protect the Cluster");
    let msg = forbidden(
        clusters
            .delete("prod", &DeleteParams::background())
            .await
            .expect_err("a protected Cluster is not deleted"),
    );
    assert!(
        msg.contains(&format!(
            "Or dispose of it later, with the chance to take it back until then: kubectl annotate clusters.cluster.x-k8s.io prod -n {ns} {}=72h",
            names::DISPOSE_AFTER
        )),
        "{msg}"
    );
    annotate(&clusters, "prod", names::DISPOSE_AFTER, Some("2s"))
        .await
        .expect("mark the Cluster");
    // Marked, it is still protected from everyone else.
    let msg = forbidden(
        clusters
            .delete("prod", &DeleteParams::background())
            .await
            .expect_err("a marked, protected Cluster is not deleted by a person"),
    );
    assert!(msg.contains("is protected from deletion"), "{msg}");
    // The manager deletes it at the end, and everything is destroyed.
    wait_for("the TerraformCluster to be released", long(), || async {
        !env.exists::<Tfc>("prod").await
    })
    .await;
    assert!(
        env.destroyed("prod"),
        "Terraform destroyed what the apply made"
    );
    env.shutdown().await;
}
