//! MachineDeployments with the real Cluster API: its MachineSets clone a
//! TerraformMachineTemplate into one TerraformMachine per Machine, delete Machines on a
//! scale-down, and replace them on a rollout; CAPTF applies and destroys each.

use std::collections::BTreeSet;

use captf::api::names::Kind;
use captf::api::{
    TerraformCluster as Tfc, TerraformMachine as Tfm, TerraformMachinePool as Tfmp,
    TerraformMachineTemplate, TerraformObject,
};
use kube::ResourceExt;
use kube::api::{Api, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;

use crate::support::*;

/// A machine module named by the contract's `captf_machine_name` (every machine of a
/// template has the same spec): it leaves `<machine>.created` (holding `generation`) and,
/// destroyed, `<machine>.destroyed`.
fn machine_module() -> String {
    r#"variable "captf_machine_name" { type = string }
variable "marker_dir" { type = string }
variable "generation" { type = string }
resource "terraform_data" "vm" {
  input = "${var.marker_dir}/${var.captf_machine_name}"
  provisioner "local-exec" {
    command = "echo ${var.generation} > '${self.input}.created'"
  }
  provisioner "local-exec" {
    when    = destroy
    command = "touch '${self.input}.destroyed'"
  }
}
output "provider_id" { value = "captf:///${var.captf_machine_name}" }
output "addresses" { value = [{ type = "InternalIP", address = "10.0.1.1" }] }
"#
    .to_string()
}

/// The TerraformMachineTemplate `name` of [`machine_module`] at `generation`.
async fn create_template(env: &Env, name: &str, generation: &str) {
    let template: TerraformMachineTemplate = serde_json::from_value(json!({
        "apiVersion": captf::api::names::API_VERSION, "kind": "TerraformMachineTemplate",
        "metadata": {"name": name, "namespace": env.ns},
        "spec": {"template": {"spec": {
            "module": {"files": {"main.tf": machine_module()}},
            "variables": {"marker_dir": env.markers().display().to_string(), "generation": generation}
        }}}
    }))
    .expect("template");
    Api::<TerraformMachineTemplate>::namespaced(env.client.clone(), &env.ns)
        .create(&PostParams::default(), &template)
        .await
        .expect("create the TerraformMachineTemplate");
}

/// The MachineDeployment `md` of the Cluster `prod`, `replicas` Machines from the
/// TerraformMachineTemplate `template`, their bootstrap data the Secret `md-bootstrap`.
/// Its rollout takes a Machine down before it makes the next one: the test's Machines
/// never become available (no kubelet joins), which a surge would wait for.
async fn create_machine_deployment(env: &Env, replicas: u32, template: &str) {
    let md: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "MachineDeployment",
        "metadata": {"name": "md", "namespace": env.ns},
        "spec": {
            "clusterName": "prod", "replicas": replicas,
            "selector": {"matchLabels": {"pool": "md"}},
            "rollout": {"strategy": {"type": "RollingUpdate",
                "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1}}},
            "template": {
                "metadata": {"labels": {"pool": "md"}},
                "spec": {"clusterName": "prod",
                    "bootstrap": {"dataSecretName": "md-bootstrap"},
                    "infrastructureRef": {"apiGroup": captf::api::names::GROUP,
                        "kind": "TerraformMachineTemplate", "name": template}}
            }
        }
    }))
    .expect("MachineDeployment");
    env.capi_api("MachineDeployment")
        .create(&PostParams::default(), &md)
        .await
        .expect("create the MachineDeployment");
}

/// The TerraformMachines of the namespace now, by name.
async fn machines(env: &Env) -> Vec<Tfm> {
    env.api::<Tfm>()
        .list(&ListParams::default())
        .await
        .expect("TerraformMachines")
        .items
}

fn provisioned<K: TerraformObject>(o: &K) -> bool {
    captf::gather::apply::object_provisioned(o)
}

/// The names of the TerraformMachines when the namespace holds exactly `n`, none being
/// deleted, each provisioned and its Machine carrying the providerID CAPTF set.
async fn settled_machines(env: &Env, n: usize) -> Option<BTreeSet<String>> {
    let tfms = machines(env).await;
    let live: Vec<&Tfm> = tfms
        .iter()
        .filter(|m| m.metadata.deletion_timestamp.is_none())
        .collect();
    if tfms.len() != n || live.len() != n || !live.iter().all(|m| provisioned(*m)) {
        return None;
    }
    let with_ids = env
        .capi_api("Machine")
        .list(&ListParams::default())
        .await
        .ok()?
        .items
        .iter()
        .filter(|m| {
            m.data["spec"]["providerID"]
                .as_str()
                .is_some_and(|p| p.starts_with("captf:///"))
        })
        .count();
    (with_ids == n).then(|| live.iter().map(|m| m.name_any()).collect())
}

/// Waits for [`settled_machines`].
async fn wait_machines(env: &Env, n: usize, what: &str) -> BTreeSet<String> {
    wait_for_value(what, long(), || settled_machines(env, n)).await
}

fn created_as(env: &Env, machine: &str) -> Option<String> {
    std::fs::read_to_string(env.markers().join(format!("{machine}.created")))
        .ok()
        .map(|s| s.trim().to_string())
}

fn destroyed(env: &Env, machine: &str) -> bool {
    env.markers().join(format!("{machine}.destroyed")).exists()
}

/// A Cluster with a MachineDeployment of three machines from a TerraformMachineTemplate
/// and a MachinePool, all provisioned by CAPTF. Scaled down to one, the MachineSet
/// deletes two Machines: two destroys. A rollout (the template changed) makes a new
/// machine and destroys the old one. Deleting the Cluster destroys the rest.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_machine_deployment_is_applied_scaled_down_rolled_out_and_torn_down() {
    if envtest_only("it reads the files Terraform leaves on this machine") {
        return;
    }
    let env = Env::builder("md").provisioning().start().await;
    env.create_cluster("prod").await;
    env.provision::<Tfc>("prod", "prod", &apply_module(0)).await;
    env.mark_cluster_ready("prod").await;
    env.create_bootstrap_secret("prod", "md-bootstrap", "#cloud-config md")
        .await;
    create_template(&env, "md-a", "a").await;
    create_machine_deployment(&env, 3, "md-a").await;
    env.provision::<Tfmp>("pool", "prod", &apply_module(0))
        .await;

    let first = wait_machines(&env, 3, "three machines applied from the template").await;
    for m in &first {
        assert_eq!(created_as(&env, m).as_deref(), Some("a"), "{m}");
        assert!(!destroyed(&env, m), "{m}");
    }
    assert_eq!(env.destroy_jobs_created(), 0);

    // Scale down: the MachineSet deletes two Machines, CAPTF destroys their machines.
    env.capi_api("MachineDeployment")
        .patch(
            "md",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"replicas": 1}})),
        )
        .await
        .expect("scale down");
    let kept = wait_machines(&env, 1, "one machine left after the scale-down").await;
    let gone: Vec<&String> = first.difference(&kept).collect();
    assert_eq!(gone.len(), 2, "{first:?} → {kept:?}");
    for m in &gone {
        assert!(destroyed(&env, m), "{m} was not destroyed");
    }
    assert_eq!(env.destroy_jobs_created(), 2, "two destroys");

    // Rollout: a new template; the old machine goes, a new one is applied from it.
    create_template(&env, "md-b", "b").await;
    env.capi_api("MachineDeployment")
        .patch(
            "md",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"template": {"spec": {"infrastructureRef": {
                "apiGroup": captf::api::names::GROUP,
                "kind": "TerraformMachineTemplate", "name": "md-b"}}}}})),
        )
        .await
        .expect("roll out");
    let survivor = kept.iter().next().expect("one").clone();
    let rolled = wait_for_value("the rollout's machine", long(), || async {
        let now = settled_machines(&env, 1).await?;
        (!now.contains(&survivor) && destroyed(&env, &survivor)).then_some(now)
    })
    .await;
    let new = rolled.iter().next().expect("one");
    assert_eq!(created_as(&env, new).as_deref(), Some("b"), "{new}");
    assert_eq!(env.destroy_jobs_created(), 3, "the old machine destroyed");

    // The Cluster goes: its machine, pool and infrastructure are destroyed, in order.
    env.delete_cluster("prod").await;
    wait_for("everything released", long(), || async {
        machines(&env).await.is_empty()
            && !env.exists::<Tfmp>("pool").await
            && !env.exists::<Tfc>("prod").await
    })
    .await;
    assert!(destroyed(&env, new), "{new} was not destroyed");
    for name in ["pool", "prod"] {
        assert!(env.destroyed(name), "{name} was not destroyed");
    }
    let cluster_done = env.destroyed_at("prod").expect("destroyed");
    assert!(
        env.destroyed_at("pool").expect("destroyed") <= cluster_done,
        "the pool was destroyed after the cluster"
    );
    for m in first.iter().chain(rolled.iter()) {
        env.assert_nothing_left(Kind::TerraformMachine, m).await;
    }
    env.assert_nothing_left(Kind::TerraformCluster, "prod")
        .await;
    env.shutdown().await;
}
