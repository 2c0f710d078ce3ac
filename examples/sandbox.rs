//! `cargo run --example sandbox`: a whole apply and clean teardown in one
//! process, with the real Cluster API.
//!
//! Starts a real control plane (`captf-envtest --cluster-api`: etcd, kube-apiserver,
//! kube-controller-manager, Cluster API v1.14.2's core manager, CRDs and webhooks, and the
//! local kubelet, which runs the Jobs' Pods with the real `terraform`) and the real manager
//! (`captf::controller::run`); creates a CAPI Cluster `prod` whose infrastructure is a
//! TerraformCluster, a MachineDeployment of two machines from a TerraformMachineTemplate,
//! and a MachinePool of a TerraformMachinePool (modules of `terraform_data` instances).
//! Cluster API's controllers do their part (owning, cloning the template, waiting for the
//! infrastructure, copying the provider IDs); the manager applies each module in a Job.
//! Then it deletes the Cluster and prints both as they happen: condition changes, Jobs,
//! Events, then an inventory of what is left in the namespace and the destroy markers
//! Terraform wrote. Exit status 0 when everything was applied, destroyed and released, 1
//! when the apply or the teardown did not complete in time or left something behind, 2
//! when `terraform` is missing. Manager logs go to stderr with `CAPTF_SANDBOX_LOG=1`.

use captf_test_support as support;

use std::collections::BTreeMap;
use std::path::Path;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use captf::api::TerraformObject;
use captf::api::names::{self, Kind};
use futures::{Stream, StreamExt};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Pod, Secret, ServiceAccount};
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use kube::api::{Api, ListParams};
use kube::runtime::watcher;
use kube::{Client, ResourceExt};

use support::{Env, Tfc, Tfm, Tfmp};

/// The objects' namespace.
const NS: &str = "team-a";

/// How long the teardown may take before the sandbox gives up (it takes several seconds:
/// Cluster API deletes the machines, then the pool, then the infrastructure, and looks
/// again every few seconds).
const TEARDOWN_TIMEOUT: Duration = Duration::from_secs(90);
const CLUSTER: &str = "prod";
/// The MachineDeployment's replicas.
const MACHINES: usize = 2;

/// A machine module for a TerraformMachineTemplate: every machine made from it has the
/// same spec, so its instances are named by the contract's `captf_machine_name`.
fn machine_module() -> String {
    r#"variable "captf_machine_name" { type = string }
variable "marker_dir" { type = string }
resource "terraform_data" "vm" {
  count = 2
  input = "${var.marker_dir}/${var.captf_machine_name}-${count.index}"
  provisioner "local-exec" {
    command = "touch '${self.input}.created'"
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

fn now() -> String {
    jiff::Zoned::now().strftime("%H:%M:%S%.3f").to_string()
}

fn line(what: &str, text: &str) {
    println!("{}  {what:<42}  {text}", now());
}

fn main() -> ExitCode {
    if !support::on_path("terraform") {
        eprintln!(
            "error: `terraform` is not on PATH. The sandbox runs the real Terraform (the apply, \
             and the destroy in each Job); install it (1.11.x) and run again."
        );
        return ExitCode::from(2);
    }
    if std::env::var("CAPTF_SANDBOX_LOG").as_deref() == Ok("1") {
        captf::telemetry::init();
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(sandbox()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("\nerror: {message}");
            ExitCode::FAILURE
        }
    }
}

async fn sandbox() -> Result<(), String> {
    let started = Instant::now();
    println!(
        "CAPTF sandbox: a real control plane (kube-apiserver, kube-controller-manager, a local kubelet running the Jobs' Pods with the real terraform) + the real manager"
    );
    let mut env = Env::builder("sandbox")
        .dedicated()
        .in_namespaces(NS, "captf-system")
        .start()
        .await;
    if let support::Cluster::Envtest(plane) = &env.cluster {
        line(
            "control plane",
            &format!(
                "ready in {:.1}s (captf-envtest; its output: {})",
                plane.started_in.as_secs_f64(),
                plane.log().display()
            ),
        );
    }
    env.config.provision = true;
    env.start_manager();
    let markers = env.markers();
    // From here on the objects' changes are printed as they happen.
    let watchers = vec![
        tokio::spawn(watch_objects::<Tfc>(env.client.clone())),
        tokio::spawn(watch_objects::<Tfm>(env.client.clone())),
        tokio::spawn(watch_objects::<Tfmp>(env.client.clone())),
        tokio::spawn(watch_jobs(env.client.clone())),
        tokio::spawn(watch_events(env.client.clone())),
    ];

    // What a user makes (as `kubectl apply` of a cluster template would): the Cluster,
    // naming the TerraformCluster `prod` as its infrastructure; that TerraformCluster; a
    // TerraformMachineTemplate and a MachineDeployment of two machines from it; a
    // MachinePool and its TerraformMachinePool; the machines' bootstrap data, a Secret
    // each for the MachineDeployment and the pool (a bootstrap provider would make them).
    // Cluster API's controllers do the rest: they own the objects, clone the template
    // into a TerraformMachine per Machine once the infrastructure is provisioned, and copy
    // the endpoint and the provider IDs.
    let client = env.client.clone();
    let dynamic = |kind: &str, plural: &str| {
        let ar = kube::api::ApiResource {
            group: "cluster.x-k8s.io".into(),
            version: "v1beta2".into(),
            api_version: "cluster.x-k8s.io/v1beta2".into(),
            kind: kind.into(),
            plural: plural.into(),
        };
        Api::<kube::api::DynamicObject>::namespaced_with(client.clone(), NS, &ar)
    };
    let create = |kind: &'static str, plural: &'static str, value: serde_json::Value| {
        let api = dynamic(kind, plural);
        async move {
            let obj: kube::api::DynamicObject =
                serde_json::from_value(value).map_err(|e| format!("{kind}: {e}"))?;
            api.create(&Default::default(), &obj)
                .await
                .map_err(|e| format!("{kind}: {e}"))
        }
    };
    let infra = |kind: &str, name: &str| serde_json::json!({"apiGroup": names::GROUP, "kind": kind, "name": name});
    for (secret, name) in [("md-bootstrap", "md"), ("pool-bootstrap", "pool")] {
        create_bootstrap_secret(&env, secret, name).await?;
    }
    let cluster = create(
        "Cluster",
        "clusters",
        serde_json::json!({
            "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Cluster",
            "metadata": {"name": CLUSTER, "namespace": NS},
            "spec": {"infrastructureRef": infra("TerraformCluster", "prod")}
        }),
    )
    .await?;
    let uid = cluster.metadata.uid.unwrap_or_default();
    let body = |kind| support::apply_module(0) + support::contract_outputs(kind);
    let none = serde_json::json!({});
    env.create_owned::<Tfc>(
        "prod",
        CLUSTER,
        &[("Cluster", CLUSTER, uid.as_str(), false)],
        &body(Kind::TerraformCluster),
        none.clone(),
    )
    .await;
    let template: captf::api::TerraformMachineTemplate =
        serde_json::from_value(serde_json::json!({
            "apiVersion": names::API_VERSION, "kind": "TerraformMachineTemplate",
            "metadata": {"name": "md", "namespace": NS},
            "spec": {"template": {"spec": {
                "module": {"files": {"main.tf": machine_module()}},
                "variables": {"marker_dir": markers.display().to_string()}
            }}}
        }))
        .map_err(|e| e.to_string())?;
    Api::<captf::api::TerraformMachineTemplate>::namespaced(env.client.clone(), NS)
        .create(&Default::default(), &template)
        .await
        .map_err(|e| format!("TerraformMachineTemplate: {e}"))?;
    create(
        "MachineDeployment",
        "machinedeployments",
        serde_json::json!({
            "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "MachineDeployment",
            "metadata": {"name": "md", "namespace": NS},
            "spec": {"clusterName": CLUSTER, "replicas": MACHINES,
                "selector": {"matchLabels": {"pool": "md"}},
                "template": {"metadata": {"labels": {"pool": "md"}},
                    "spec": {"clusterName": CLUSTER,
                        "bootstrap": {"dataSecretName": "md-bootstrap"},
                        "infrastructureRef": infra("TerraformMachineTemplate", "md")}}}
        }),
    )
    .await?;
    let pool = create(
        "MachinePool",
        "machinepools",
        serde_json::json!({
            "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "MachinePool",
            "metadata": {"name": "pool", "namespace": NS},
            "spec": {"clusterName": CLUSTER, "replicas": 2,
                "template": {"spec": {"clusterName": CLUSTER,
                    "bootstrap": {"dataSecretName": "pool-bootstrap"},
                    "infrastructureRef": infra("TerraformMachinePool", "pool")}}}
        }),
    )
    .await?;
    let pool_uid = pool.metadata.uid.unwrap_or_default();
    env.create_owned::<Tfmp>(
        "pool",
        CLUSTER,
        &[("MachinePool", "pool", pool_uid.as_str(), true)],
        &body(Kind::TerraformMachinePool),
        none,
    )
    .await;
    line(
        &format!("Cluster {NS}/{CLUSTER}"),
        "created, its infrastructure TerraformCluster prod; MachineDeployment md (2 machines from TerraformMachineTemplate md) and MachinePool pool (TerraformMachinePool pool), their bootstrap data ready",
    );

    // The manager applies the cluster's module; Cluster API sees the TerraformCluster
    // provisioned, and its MachineSet makes the Machines and their TerraformMachines; the
    // manager applies them and the pool.
    if !wait_provisioned::<Tfc>(&env, "prod").await {
        return fail(
            &env,
            watchers,
            "the TerraformCluster was not provisioned in time",
        )
        .await;
    }
    let machines = tokio::time::timeout(APPLY_TIMEOUT, async {
        loop {
            let list = Api::<Tfm>::namespaced(env.client.clone(), NS)
                .list(&ListParams::default())
                .await
                .map(|l| l.items)
                .unwrap_or_default();
            let done: Vec<String> = list
                .iter()
                .filter(|m| captf::gather::apply::object_provisioned(*m))
                .map(|m| m.name_any())
                .collect();
            if done.len() == MACHINES && list.len() == MACHINES {
                return done;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await;
    let Ok(machines) = machines else {
        return fail(
            &env,
            watchers,
            "the MachineDeployment's machines were not provisioned in time",
        )
        .await;
    };
    if !wait_provisioned::<Tfmp>(&env, "pool").await {
        return fail(
            &env,
            watchers,
            "the TerraformMachinePool was not provisioned in time",
        )
        .await;
    }
    let mut objects: Vec<(Kind, String)> = machines
        .iter()
        .map(|m| (Kind::TerraformMachine, m.clone()))
        .collect();
    objects.push((Kind::TerraformMachinePool, "pool".into()));
    objects.push((Kind::TerraformCluster, "prod".into()));
    for (kind, name) in &objects {
        line(
            &format!("{kind} {NS}/{name}"),
            &contract_fields(&env, *kind, name).await,
        );
    }
    // What Cluster API copied from them (it does so a moment after CAPTF sets them).
    let machines_api = dynamic("Machine", "machines");
    let copied = tokio::time::timeout(APPLY_TIMEOUT, async {
        loop {
            let list = machines_api
                .list(&ListParams::default())
                .await
                .map(|l| l.items)
                .unwrap_or_default();
            if list.len() == MACHINES
                && list
                    .iter()
                    .all(|m| m.data["spec"]["providerID"].is_string())
            {
                return list;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await;
    let Ok(copied) = copied else {
        return fail(
            &env,
            watchers,
            "Cluster API did not copy the Machines' provider IDs in time",
        )
        .await;
    };
    for m in copied {
        line(
            &format!("Machine {NS}/{}", m.name_any()),
            &format!(
                "Cluster API copied spec.providerID={}  (infrastructure TerraformMachine {})",
                m.data["spec"]["providerID"], m.data["spec"]["infrastructureRef"]["name"]
            ),
        );
    }
    println!();
    line(
        "terraform apply, in the manager's Jobs",
        &format!(
            "{} objects provisioned (status.initialization.provisioned=true), {} of {} instances created; inputs Secrets, states and fingerprints written by the manager",
            objects.len(),
            created_markers(&markers),
            2 * objects.len()
        ),
    );
    // Let the watchers print what the applies left before the deletion starts.
    tokio::time::sleep(Duration::from_millis(300)).await;

    println!();
    line(
        &format!("Cluster {NS}/{CLUSTER}"),
        "DELETE: Cluster API deletes the MachineDeployment's machines, the pool, then the infrastructure",
    );
    let deleted_at = Instant::now();
    env.delete_cluster(CLUSTER).await;

    let all_gone = async {
        loop {
            let mut left = 0;
            for (kind, name) in &objects {
                if exists(&env, *kind, name).await {
                    left += 1;
                }
            }
            if left == 0 {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    };
    if tokio::time::timeout(TEARDOWN_TIMEOUT, all_gone)
        .await
        .is_err()
    {
        let mut report = Vec::new();
        for (kind, name) in &objects {
            if let Some(conds) = deleting_condition(&env, *kind, name).await {
                report.push(format!("  {kind} {NS}/{name}: {conds}"));
            }
        }
        for w in &watchers {
            w.abort();
        }
        env.shutdown().await;
        return Err(format!(
            "the teardown did not complete within {TEARDOWN_TIMEOUT:?}; still there:\n{}",
            report.join("\n")
        ));
    }
    let teardown = deleted_at.elapsed();
    // The runner RBAC goes with the periodic sweep once no CAPTF object is left.
    let rbac_swept = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            let sas: Api<ServiceAccount> = Api::namespaced(env.client.clone(), NS);
            if matches!(sas.get_opt(names::RUNNER_NAME).await, Ok(None)) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await
    .is_ok();
    tokio::time::sleep(Duration::from_millis(200)).await;
    for w in &watchers {
        w.abort();
    }

    println!();
    println!(
        "Teardown complete in {:.1}s (all {} objects released).",
        teardown.as_secs_f64(),
        objects.len()
    );
    println!("\nLeft in namespace {NS}:");
    let left = inventory(&env.client).await?;
    let destroyed = destroy_markers(&markers);
    println!(
        "\nTerraform destroy markers (one file per terraform_data instance, written by its destroy provisioner):"
    );
    let mut missing = Vec::new();
    for (_, name) in &objects {
        let mut have = Vec::new();
        for i in 0..2 {
            let instance = format!("{name}-{i}");
            if destroyed.contains_key(&instance) {
                have.push(format!("vm[{i}]"));
            } else {
                missing.push(instance);
            }
        }
        println!("  {name:<16} destroyed: {}", have.join(", "));
    }
    println!(
        "\n{} of {} instances destroyed by terraform; {} object(s) left; done in {:.1}s overall.",
        2 * objects.len() - missing.len(),
        2 * objects.len(),
        left,
        started.elapsed().as_secs_f64()
    );
    env.shutdown().await;
    if !missing.is_empty() {
        return Err(format!("Terraform did not destroy {}", missing.join(", ")));
    }
    if left > 0 || !rbac_swept {
        return Err(format!(
            "the teardown left {left} object(s) in namespace {NS}{}",
            if rbac_swept {
                ""
            } else {
                " (the runner RBAC was not swept within 10s)"
            }
        ));
    }
    Ok(())
}

/// The bootstrap data Secret `secret` of the MachineDeployment or MachinePool `name`, as a
/// bootstrap provider writes it (labelled with the cluster's name).
async fn create_bootstrap_secret(env: &Env, secret: &str, name: &str) -> Result<(), String> {
    let data: Secret = serde_json::from_value(serde_json::json!({
        "metadata": {"name": secret, "namespace": NS,
            "labels": {names::CAPI_CLUSTER_NAME_LABEL: CLUSTER}},
        "type": BOOTSTRAP_SECRET_TYPE,
        "stringData": {"value": format!("#cloud-config\nhostname: {name}\n"), "format": "cloud-config"}
    }))
    .map_err(|e| e.to_string())?;
    Api::<Secret>::namespaced(env.client.clone(), NS)
        .create(&Default::default(), &data)
        .await
        .map_err(|e| format!("Secret {secret}: {e}"))?;
    Ok(())
}

/// The type of Cluster API's bootstrap data Secrets: theirs, not CAPTF's, and left out of
/// the inventory of what the teardown left.
const BOOTSTRAP_SECRET_TYPE: &str = "cluster.x-k8s.io/secret";

/// How long each apply may take before the sandbox gives up (a few seconds each).
const APPLY_TIMEOUT: Duration = Duration::from_secs(120);

/// Waits until `K`/`name`'s `status.initialization.provisioned` is true.
async fn wait_provisioned<K: TerraformObject>(env: &Env, name: &str) -> bool {
    tokio::time::timeout(APPLY_TIMEOUT, async {
        loop {
            let done = env.object::<K>(name).await.is_some_and(|o| {
                o.status()
                    .and_then(|s| s.initialization.as_ref())
                    .and_then(|i| i.provisioned)
                    == Some(true)
            });
            if done {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await
    .is_ok()
}

/// Stops the watchers, says where each object's provisioning stands, and fails with `why`.
async fn fail(
    env: &Env,
    watchers: Vec<tokio::task::JoinHandle<()>>,
    why: &str,
) -> Result<(), String> {
    for w in &watchers {
        w.abort();
    }
    let mut report = Vec::new();
    let provisioned = |kind: Kind, name: String, c: Option<(String, String, String)>| {
        format!("  {kind} {NS}/{name}: Provisioned {c:?}")
    };
    for o in Api::<Tfc>::namespaced(env.client.clone(), NS)
        .list(&ListParams::default())
        .await
        .map(|l| l.items)
        .unwrap_or_default()
    {
        let c = env.condition::<Tfc>(&o.name_any(), "Provisioned").await;
        report.push(provisioned(Kind::TerraformCluster, o.name_any(), c));
    }
    for o in Api::<Tfm>::namespaced(env.client.clone(), NS)
        .list(&ListParams::default())
        .await
        .map(|l| l.items)
        .unwrap_or_default()
    {
        let c = env.condition::<Tfm>(&o.name_any(), "Provisioned").await;
        report.push(provisioned(Kind::TerraformMachine, o.name_any(), c));
    }
    for o in Api::<Tfmp>::namespaced(env.client.clone(), NS)
        .list(&ListParams::default())
        .await
        .map(|l| l.items)
        .unwrap_or_default()
    {
        let c = env.condition::<Tfmp>(&o.name_any(), "Provisioned").await;
        report.push(provisioned(Kind::TerraformMachinePool, o.name_any(), c));
    }
    Err(format!("{why}:\n{}", report.join("\n")))
}

/// The Cluster API contract fields the manager set on an object from its outputs.
async fn contract_fields(env: &Env, kind: Kind, name: &str) -> String {
    let value = match kind {
        Kind::TerraformCluster => env.object::<Tfc>(name).await.map(serde_json::to_value),
        Kind::TerraformMachine => env.object::<Tfm>(name).await.map(serde_json::to_value),
        Kind::TerraformMachinePool => env.object::<Tfmp>(name).await.map(serde_json::to_value),
    };
    let value = value.and_then(Result::ok).unwrap_or_default();
    let fields: &[&str] = match kind {
        Kind::TerraformCluster => &["/spec/controlPlaneEndpoint", "/status/failureDomains"],
        Kind::TerraformMachine => &["/spec/providerID", "/status/addresses"],
        Kind::TerraformMachinePool => &[
            "/spec/providerIDList",
            "/status/replicas",
            "/status/ready",
            "/status/instances",
        ],
    };
    fields
        .iter()
        .filter_map(|p| {
            value
                .pointer(p)
                .filter(|x| !x.is_null())
                .map(|x| format!("{}={x}", p.trim_start_matches('/').replace('/', ".")))
        })
        .collect::<Vec<_>>()
        .join("  ")
}

/// How many instances' create provisioners left their marker.
fn created_markers(dir: &Path) -> usize {
    std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().ends_with(".created"))
        .count()
}
async fn exists(env: &Env, kind: Kind, name: &str) -> bool {
    match kind {
        Kind::TerraformCluster => env.exists::<Tfc>(name).await,
        Kind::TerraformMachine => env.exists::<Tfm>(name).await,
        Kind::TerraformMachinePool => env.exists::<Tfmp>(name).await,
    }
}

async fn deleting_condition(env: &Env, kind: Kind, name: &str) -> Option<String> {
    let c = match kind {
        Kind::TerraformCluster => env.condition::<Tfc>(name, "Deleting").await,
        Kind::TerraformMachine => env.condition::<Tfm>(name, "Deleting").await,
        Kind::TerraformMachinePool => env.condition::<Tfmp>(name, "Deleting").await,
    };
    match c {
        Some((s, r, m)) => Some(format!("Deleting={s} {r}: {m}")),
        None => Some("no Deleting condition yet".into()),
    }
}

/// A watch stream of `api` that survives reconnects (the watcher re-lists itself).
fn events_of<K>(api: Api<K>) -> impl Stream<Item = watcher::Event<K>>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug + Send + 'static,
    K::DynamicType: Default,
{
    watcher(api, watcher::Config::default()).filter_map(|r| async move { r.ok() })
}

/// Prints an object's deletion, each change of its Deleting condition (and of
/// DeletionBlocked while it is True), and its release.
async fn watch_objects<K>(client: Client)
where
    K: TerraformObject + Send + Sync + 'static,
{
    let api: Api<K> = Api::namespaced(client, NS);
    let mut seen: BTreeMap<String, (bool, String, String)> = BTreeMap::new();
    let mut provisioned: BTreeMap<String, String> = BTreeMap::new();
    let stream = events_of(api);
    futures::pin_mut!(stream);
    while let Some(ev) = stream.next().await {
        match ev {
            watcher::Event::Apply(o) | watcher::Event::InitApply(o) => {
                let name = o.name_any();
                let who = format!("{} {NS}/{name}", K::KIND);
                let deleting = o.meta().deletion_timestamp.is_some();
                let cond = |t: &str| {
                    o.status()
                        .and_then(|s| s.conditions.iter().find(|c| c.type_ == t))
                        .map(|c| (c.status.clone(), c.reason.clone(), c.message.clone()))
                };
                if !deleting {
                    // Before the deletion: each change of Provisioned.
                    if let Some((st, r, m)) = cond("Provisioned") {
                        let text = if m.is_empty() {
                            format!("Provisioned={st} {r}")
                        } else {
                            format!("Provisioned={st} {r}  {m}")
                        };
                        if provisioned.get(&name) != Some(&text) {
                            line(&who, &text);
                            provisioned.insert(name.clone(), text);
                        }
                    }
                    continue;
                }
                let entry =
                    seen.entry(name.clone())
                        .or_insert((false, String::new(), String::new()));
                if !entry.0 {
                    entry.0 = true;
                    line(&who, "deletion requested (deletionTimestamp set)");
                }
                if let Some((_, r, m)) = cond("DeletionBlocked").filter(|(s, _, _)| s == "True") {
                    let text = format!("DeletionBlocked={r}  {m}");
                    if entry.2 != text {
                        line(&who, &text);
                        entry.2 = text;
                    }
                }
                // NotDeleting is what the object said before this deletion was looked at.
                if let Some((_, r, m)) = cond("Deleting").filter(|(_, r, _)| r != "NotDeleting") {
                    let text = format!("Deleting={r}  {m}");
                    if entry.1 != text {
                        line(&who, &text);
                        entry.1 = text;
                    }
                }
            }
            watcher::Event::Delete(o) => {
                let name = o.name_any();
                line(
                    &format!("{} {NS}/{name}", K::KIND),
                    "released: finalizer removed, object gone",
                );
                seen.remove(&name);
            }
            _ => {}
        }
    }
}

/// Prints each Job when it is created, when it finishes and when it is deleted.
async fn watch_jobs(client: Client) {
    let api: Api<Job> = Api::namespaced(client, NS);
    let mut seen: BTreeMap<String, (Instant, bool)> = BTreeMap::new();
    let stream = events_of(api);
    futures::pin_mut!(stream);
    while let Some(ev) = stream.next().await {
        match ev {
            watcher::Event::Apply(j) | watcher::Event::InitApply(j) => {
                let name = j.name_any();
                let who = format!("Job {NS}/{name}");
                let entry = seen.entry(name.clone()).or_insert_with(|| {
                    let labels = j.labels();
                    let owner = format!(
                        "{} {}",
                        labels
                            .get(names::LABEL_OWNER_KIND)
                            .map(String::as_str)
                            .unwrap_or("?"),
                        labels
                            .get(names::LABEL_OWNER_NAME)
                            .map(String::as_str)
                            .unwrap_or("?")
                    );
                    let attempt = labels
                        .get(names::LABEL_ATTEMPT)
                        .map(String::as_str)
                        .unwrap_or("?");
                    let operation = labels
                        .get(names::LABEL_OPERATION)
                        .map(String::as_str)
                        .unwrap_or("?");
                    line(
                        &who,
                        &format!("created: terraform {operation}, attempt {attempt} for {owner}"),
                    );
                    (Instant::now(), false)
                });
                if entry.1 {
                    continue;
                }
                let done = j
                    .status
                    .as_ref()
                    .and_then(|s| s.conditions.as_ref())
                    .and_then(|cs| {
                        cs.iter().find(|c| {
                            (c.type_ == "Complete" || c.type_ == "Failed") && c.status == "True"
                        })
                    })
                    .map(|c| c.type_.clone());
                if let Some(t) = done {
                    entry.1 = true;
                    line(
                        &who,
                        &format!(
                            "finished: {t} ({:.1}s after it was seen created)",
                            entry.0.elapsed().as_secs_f64()
                        ),
                    );
                }
            }
            watcher::Event::Delete(j) => {
                line(&format!("Job {NS}/{}", j.name_any()), "deleted");
            }
            _ => {}
        }
    }
}

/// Prints each Event the manager records (events.k8s.io/v1).
async fn watch_events(client: Client) {
    let api: Api<Event> = Api::namespaced(client, NS);
    let mut seen: BTreeMap<String, i32> = BTreeMap::new();
    let stream = events_of(api);
    futures::pin_mut!(stream);
    while let Some(ev) = stream.next().await {
        if let watcher::Event::Apply(e) | watcher::Event::InitApply(e) = ev {
            let count = e.deprecated_count.unwrap_or(1);
            let key = e.name_any();
            if seen.get(&key) == Some(&count) {
                continue;
            }
            seen.insert(key, count);
            let regarding = e
                .regarding
                .as_ref()
                .map(|r| {
                    format!(
                        "{} {}/{}",
                        r.kind.clone().unwrap_or_default(),
                        r.namespace.clone().unwrap_or_default(),
                        r.name.clone().unwrap_or_default()
                    )
                })
                .unwrap_or_default();
            line(
                &regarding,
                &format!(
                    "Event {} {}: {}",
                    e.type_.clone().unwrap_or_default(),
                    e.reason.clone().unwrap_or_default(),
                    e.note.clone().unwrap_or_default()
                ),
            );
        }
    }
}

/// Prints what is left in the namespace; returns how many objects that is.
async fn inventory(client: &Client) -> Result<usize, String> {
    async fn names_of<K>(api: Api<K>, filter: impl Fn(&K) -> bool) -> Result<Vec<String>, String>
    where
        K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
    {
        Ok(api
            .list(&ListParams::default())
            .await
            .map_err(|e| format!("listing: {e}"))?
            .items
            .iter()
            .filter(|o| filter(o))
            .map(|o| o.name_any())
            .collect())
    }
    let c = client.clone();
    let runner = |n: String| n == names::RUNNER_NAME;
    let rows: Vec<(&str, Vec<String>)> = vec![
        (
            "TerraformClusters",
            names_of(Api::<Tfc>::namespaced(c.clone(), NS), |_| true).await?,
        ),
        (
            "TerraformMachines",
            names_of(Api::<Tfm>::namespaced(c.clone(), NS), |_| true).await?,
        ),
        (
            "TerraformMachinePools",
            names_of(Api::<Tfmp>::namespaced(c.clone(), NS), |_| true).await?,
        ),
        (
            "Secrets (state, inputs, backup)",
            names_of(Api::<Secret>::namespaced(c.clone(), NS), |s| {
                s.type_.as_deref() != Some(BOOTSTRAP_SECRET_TYPE)
            })
            .await?,
        ),
        (
            "Jobs",
            names_of(Api::<Job>::namespaced(c.clone(), NS), |_| true).await?,
        ),
        (
            "Pods",
            names_of(Api::<Pod>::namespaced(c.clone(), NS), |_| true).await?,
        ),
        (
            "Leases (terraform locks)",
            names_of(Api::<Lease>::namespaced(c.clone(), NS), |_| true).await?,
        ),
        (
            "runner ServiceAccount",
            names_of(Api::<ServiceAccount>::namespaced(c.clone(), NS), |o| {
                runner(o.name_any())
            })
            .await?,
        ),
        (
            "runner Role",
            names_of(Api::<Role>::namespaced(c.clone(), NS), |o| {
                runner(o.name_any())
            })
            .await?,
        ),
        (
            "runner RoleBinding",
            names_of(Api::<RoleBinding>::namespaced(c.clone(), NS), |o| {
                runner(o.name_any())
            })
            .await?,
        ),
    ];
    let mut total = 0;
    for (what, items) in rows {
        total += items.len();
        let shown = if items.is_empty() {
            "none".to_string()
        } else {
            items.join(", ")
        };
        println!("  {what:<32} {shown}");
    }
    Ok(total)
}

/// `<name>-<i>` -> the marker file, for every instance Terraform destroyed.
fn destroy_markers(dir: &Path) -> BTreeMap<String, std::path::PathBuf> {
    std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            name.strip_suffix(".destroyed")
                .map(|n| (n.to_string(), e.path()))
        })
        .collect()
}
