//! Cluster API's part in the end-to-end tests. Its real controllers run on the control
//! plane (`captf-envtest --cluster-api`: the core manager v1.14.2, its CRDs and webhooks):
//! a Cluster, a Machine, a MachinePool behave here as in production. What needs a real
//! workload cluster underneath, which a test control plane has none of, is played by the
//! fixtures below, each named and saying why:
//!
//! - [`CONTROL_PLANE_KIND`]: a control-plane provider's kind of the tests' own. Cluster API
//!   learns that a Cluster's control plane is initialised from its control-plane
//!   provider; the real ones (kubeadm) boot kube-apiservers on machines.
//! - [`BOOTSTRAP_KIND`]: a bootstrap provider's kind of the tests' own, for a Machine
//!   whose bootstrap data comes later ([`Env::give_bootstrap_data`]): Cluster API's webhook
//!   refuses a Machine that names neither a bootstrap config nor a data Secret, and the
//!   real providers (kubeadm) need a control plane that answers.
//! - [`Env::give_workload_cluster`]: the Cluster's `<name>-kubeconfig` Secret pointing at
//!   this same API server, so that Cluster API reaches "the workload cluster" as it does a
//!   real one.
//! - [`Env::give_machine_a_node`]: a Node of that workload cluster whose providerID is the
//!   Machine's, so that the Machine gets its `status.nodeRef` (`clusterctl move` requires
//!   one on every Machine); a real one is a kubelet that joined.

use k8s_openapi::api::core::v1::{Node, Secret};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{
    Api, ApiResource, DynamicObject, GroupVersionKind, Patch, PatchParams, PostParams,
};
use serde_json::json;
use std::time::Duration;

use crate::{Env, long, wait_for, wait_for_value};

/// The workload cluster's Nodes are the shared API server's, and the providerID CAPTF gives
/// a Machine is the same in every test (`captf:///web-1`): while two Nodes carry it, Cluster
/// API sets neither Machine's `nodeRef` ("unexpectedly found more than one Node matching the
/// providerID", `getNode` in `core/reconcilers/machine` of v1.14.2). Tests that run at once
/// take turns: a Node is made only when no other carries its providerID, and goes with its
/// test ([`Env::shutdown`]).
static NODE_TURN: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// The group, version and kind of the tests' control-plane provider.
pub const CONTROL_PLANE_GROUP: &str = "controlplane.test.captf.dev";
pub const CONTROL_PLANE_VERSION: &str = "v1alpha1";
pub const CONTROL_PLANE_KIND: &str = "TestControlPlane";

/// The group and kind of the tests' bootstrap provider (version [`CONTROL_PLANE_VERSION`]).
pub const BOOTSTRAP_GROUP: &str = "bootstrap.test.captf.dev";
pub const BOOTSTRAP_KIND: &str = "TestBootstrapConfig";

/// The CRDs of the fixtures' kinds: [`CONTROL_PLANE_KIND`] and [`BOOTSTRAP_KIND`].
pub fn fixture_crds() -> Vec<CustomResourceDefinition> {
    vec![
        fixture_crd(CONTROL_PLANE_GROUP, CONTROL_PLANE_KIND),
        fixture_crd(BOOTSTRAP_GROUP, BOOTSTRAP_KIND),
    ]
}

/// A schema-less CRD with a status, labelled with Cluster API's contract
/// (`cluster.x-k8s.io/v1beta2: v1alpha1`) as a provider's CRDs are, and with clusterctl's
/// label so that `clusterctl move` takes its objects along.
fn fixture_crd(group: &str, kind: &str) -> CustomResourceDefinition {
    let plural = plural(kind);
    serde_json::from_value(json!({
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": format!("{plural}.{group}"),
            "labels": {"cluster.x-k8s.io/v1beta2": CONTROL_PLANE_VERSION,
                "clusterctl.cluster.x-k8s.io": ""}},
        "spec": {"group": group, "scope": "Namespaced",
            "names": {"kind": kind, "plural": plural,
                "singular": kind.to_lowercase(), "listKind": format!("{kind}List")},
            "versions": [{"name": CONTROL_PLANE_VERSION, "served": true, "storage": true,
                "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}},
                "subresources": {"status": {}}}]}
    }))
    .expect("a fixture's CRD")
}

/// On an outside cluster: checks that Cluster API is installed (the scenarios need its
/// controllers), then installs the fixtures' CRDs.
pub(crate) async fn install_fixtures_outside(client: &kube::Client) {
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    if crds
        .get_opt("clusters.cluster.x-k8s.io")
        .await
        .expect("get CRD")
        .is_none()
    {
        panic!(
            "the cluster of CAPTF_E2E_KUBECONFIG does not run Cluster API (no clusters.cluster.x-k8s.io CRD): install Cluster API v1.14 there first (clusterctl init --bootstrap - --control-plane -)"
        );
    }
    for crd in fixture_crds() {
        if crds
            .get_opt(crd.metadata.name.as_deref().unwrap_or_default())
            .await
            .expect("get CRD")
            .is_none()
        {
            let _ = crds.create(&PostParams::default(), &crd).await;
        }
    }
    let role: k8s_openapi::api::rbac::v1::ClusterRole =
        serde_json::from_value(fixture_role()).expect("ClusterRole");
    let roles: Api<k8s_openapi::api::rbac::v1::ClusterRole> = Api::all(client.clone());
    let _ = roles.create(&PostParams::default(), &role).await;
    for (group, kind) in [
        (CONTROL_PLANE_GROUP, CONTROL_PLANE_KIND),
        (BOOTSTRAP_GROUP, BOOTSTRAP_KIND),
    ] {
        let api: Api<DynamicObject> = Api::all_with(client.clone(), &fixture_resource(group, kind));
        crate::wait_for(&format!("{kind} to be served"), long(), || async {
            api.list(&Default::default()).await.is_ok()
        })
        .await;
    }
}

/// The ClusterRole by which Cluster API's manager reads the fixtures' kinds: Cluster API
/// runs under its own RBAC (as its ServiceAccount, on a cluster and on `captf-envtest`),
/// and its ClusterRole aggregates those labelled `aggregate-to-manager`, as a provider's
/// installation adds one for its kinds.
pub fn fixture_role() -> serde_json::Value {
    json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
        "metadata": {"name": "captf-e2e-fixtures",
            "labels": {"cluster.x-k8s.io/aggregate-to-manager": "true"}},
        "rules": [{"apiGroups": [CONTROL_PLANE_GROUP, BOOTSTRAP_GROUP],
            "resources": ["*"], "verbs": ["get", "list", "watch", "create", "patch", "update", "delete"]}]
    })
}

fn plural(kind: &str) -> String {
    format!("{}s", kind.to_lowercase())
}

fn fixture_resource(group: &str, kind: &str) -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk(group, CONTROL_PLANE_VERSION, kind),
        &plural(kind),
    )
}

impl Env {
    /// Whether Cluster API's controllers run: on `captf-envtest --cluster-api`, and on an
    /// outside cluster (which the tests require to have Cluster API installed).
    pub fn runs_cluster_api(&self) -> bool {
        match &self.cluster {
            crate::Cluster::Envtest(plane) => plane.cluster_api,
            crate::Cluster::External(_) => true,
        }
    }

    /// The test control planes in the test's namespace.
    pub fn control_planes(&self) -> Api<DynamicObject> {
        Api::namespaced_with(
            self.client.clone(),
            &self.ns,
            &fixture_resource(CONTROL_PLANE_GROUP, CONTROL_PLANE_KIND),
        )
    }

    /// Creates the Cluster `name` and its control plane (a [`CONTROL_PLANE_KIND`] of the
    /// same name, not initialised yet); returns the Cluster's uid. Cluster API's own
    /// controllers put their finalizer on it, own its infrastructure and control plane,
    /// and delete it in their order. It names no infrastructure until a TerraformCluster
    /// is made for it (`Env::create_owned`, `Env::provision`); until then Cluster API
    /// counts its infrastructure as provisioned, as for any Cluster that names none.
    pub async fn create_cluster(&self, name: &str) -> String {
        self.create_cluster_naming(name, None).await
    }

    /// As [`Env::create_cluster`], the Cluster naming the TerraformCluster of its own name
    /// as its infrastructure from the start, before it exists: Cluster API then waits for
    /// it to be provisioned (`status.initialization.infrastructureProvisioned` unset).
    pub async fn create_cluster_with_infrastructure(&self, name: &str) -> String {
        self.create_cluster_naming(name, Some(name)).await
    }

    async fn create_cluster_naming(&self, name: &str, infra: Option<&str>) -> String {
        if !self.runs_cluster_api() {
            // The minimal Cluster CRD of the benches' control plane (no controller).
            let obj: DynamicObject = serde_json::from_value(json!({
                "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Cluster",
                "metadata": {"name": name, "namespace": self.ns}, "spec": {}
            }))
            .expect("cluster");
            let created = self
                .cluster_api()
                .create(&PostParams::default(), &obj)
                .await
                .expect("create the Cluster");
            return created.metadata.uid.unwrap_or_default();
        }
        let cp: DynamicObject = serde_json::from_value(json!({
            "apiVersion": format!("{CONTROL_PLANE_GROUP}/{CONTROL_PLANE_VERSION}"),
            "kind": CONTROL_PLANE_KIND,
            "metadata": {"name": name, "namespace": self.ns}, "spec": {}
        }))
        .expect("control plane");
        self.control_planes()
            .create(&PostParams::default(), &cp)
            .await
            .expect("create the test control plane");
        let obj = serde_json::from_value::<DynamicObject>(json!({
            "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Cluster",
            "metadata": {"name": name, "namespace": self.ns},
            "spec": {"controlPlaneRef": {"apiGroup": CONTROL_PLANE_GROUP,
                "kind": CONTROL_PLANE_KIND, "name": name}}
        }));
        let mut obj: DynamicObject = obj.expect("cluster");
        if let Some(infra) = infra {
            obj.data["spec"]["infrastructureRef"] = json!({
                "apiGroup": captf::api::names::GROUP, "kind": "TerraformCluster", "name": infra});
        }
        let created = self
            .cluster_api()
            .create(&PostParams::default(), &obj)
            .await
            .expect("create the Cluster");
        created.metadata.uid.unwrap_or_default()
    }

    /// Sets the Cluster `name`'s `spec.paused`.
    pub async fn set_cluster_paused(&self, name: &str, paused: bool) {
        self.cluster_api()
            .patch(
                name,
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"paused": paused}})),
            )
            .await
            .unwrap_or_else(|e| panic!("spec.paused: {paused} on Cluster {name}: {e}"));
    }

    /// The tests' bootstrap configs in the test's namespace.
    pub fn bootstrap_configs(&self) -> Api<DynamicObject> {
        Api::namespaced_with(
            self.client.clone(),
            &self.ns,
            &fixture_resource(BOOTSTRAP_GROUP, BOOTSTRAP_KIND),
        )
    }

    /// Creates the bootstrap config `name` (a [`BOOTSTRAP_KIND`]) with no data yet.
    pub async fn create_bootstrap_config(&self, name: &str) {
        let config: DynamicObject = serde_json::from_value(json!({
            "apiVersion": format!("{BOOTSTRAP_GROUP}/{CONTROL_PLANE_VERSION}"),
            "kind": BOOTSTRAP_KIND,
            "metadata": {"name": name, "namespace": self.ns}, "spec": {}
        }))
        .expect("bootstrap config");
        self.bootstrap_configs()
            .create(&PostParams::default(), &config)
            .await
            .expect("create the bootstrap config");
    }

    /// What a bootstrap provider does once a machine's data is ready: its config says the
    /// data Secret `secret` is created (whether or not it exists yet); Cluster API then
    /// copies the name into the Machine's `spec.bootstrap.dataSecretName`.
    pub async fn give_bootstrap_data(&self, config: &str, secret: &str) {
        self.bootstrap_configs()
            .patch_status(
                config,
                &PatchParams::default(),
                &Patch::Merge(json!({"status": {
                    "initialization": {"dataSecretCreated": true}, "dataSecretName": secret}})),
            )
            .await
            .expect("the bootstrap config's status");
    }

    /// Names the TerraformCluster `infra` as the Cluster `cluster`'s infrastructure
    /// (`spec.infrastructureRef`), when the Cluster names none yet.
    pub async fn name_infrastructure(&self, cluster: &str, infra: &str) {
        let c = self.cluster_api().get(cluster).await.expect("the Cluster");
        let named = c.data["spec"]["infrastructureRef"]["name"].as_str();
        if named.is_some_and(|n| !n.is_empty()) {
            return;
        }
        self.cluster_api()
            .patch(
                cluster,
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"infrastructureRef": {
                    "apiGroup": captf::api::names::GROUP, "kind": "TerraformCluster", "name": infra}}})),
            )
            .await
            .expect("the Cluster's infrastructureRef");
    }

    /// What a control-plane provider does once the control plane is up: its control
    /// plane reports initialised, and its kubeconfig is written (see
    /// [`Env::give_workload_cluster`]). Waits until Cluster API says so on the Cluster
    /// (`status.initialization.controlPlaneInitialized`), and its infrastructure
    /// provisioned, as a worker's bootstrap needs.
    pub async fn mark_cluster_ready(&self, name: &str) {
        self.give_workload_cluster(name).await;
        self.control_planes()
            .patch_status(
                name,
                &PatchParams::default(),
                &Patch::Merge(
                    json!({"status": {"initialization": {"controlPlaneInitialized": true}}}),
                ),
            )
            .await
            .expect("the test control plane's status");
        let clusters = self.cluster_api();
        wait_for(
            &format!("Cluster {name}'s control plane to be initialised"),
            long(),
            || async {
                clusters.get(name).await.is_ok_and(|c| {
                    c.data["status"]["initialization"]["controlPlaneInitialized"] == true
                })
            },
        )
        .await;
    }

    /// The Cluster's `<name>-kubeconfig` Secret, as a control-plane provider writes it,
    /// pointing at this control plane's own API server: Cluster API reaches "the workload
    /// cluster" through it (health probes, Nodes) as it does a real one.
    pub async fn give_workload_cluster(&self, cluster: &str) {
        let kubeconfig = std::fs::read(self.kubeconfig_path()).expect("the admin kubeconfig");
        let secret: Secret = serde_json::from_value(json!({
            "metadata": {"name": format!("{cluster}-kubeconfig"),
                "labels": {captf::api::names::CAPI_CLUSTER_NAME_LABEL: cluster}},
            "type": "cluster.x-k8s.io/secret",
            "data": {"value": k8s_openapi::ByteString(kubeconfig)}
        }))
        .expect("kubeconfig Secret");
        match self.secrets().create(&PostParams::default(), &secret).await {
            Ok(_) => {}
            Err(kube::Error::Api(e)) if e.code == 409 => {}
            Err(e) => panic!("create the workload kubeconfig: {e}"),
        }
    }

    /// A Node of the workload cluster for the Machine `machine`, with the providerID
    /// CAPTF gave it (waited for), as a kubelet that joined registers it; waits until
    /// Cluster API sets the Machine's `status.nodeRef`. Nodes are cluster-scoped: its name
    /// carries the test's namespace, and [`Env::shutdown`] deletes it.
    pub async fn give_machine_a_node(&self, machine: &str) {
        let machines = self.capi_api("Machine");
        let provider_id: String = wait_for_value(
            &format!("Machine {machine}'s providerID"),
            long(),
            || async {
                let m = machines.get(machine).await.ok()?;
                m.data["spec"]["providerID"].as_str().map(str::to_string)
            },
        )
        .await;
        let name = format!("{}-{machine}", self.ns);
        // Take turns with the tests that run at once (see NODE_TURN), for up to 15 minutes:
        // a Node a failed test left behind is its failure, not this test's.
        let turn = NODE_TURN.lock().await;
        let nodes: Api<Node> = Api::all(self.client.clone());
        let started = std::time::Instant::now();
        while started.elapsed() < Duration::from_secs(900) {
            // Another Node with this providerID, or the Nodes not listed: wait.
            let taken = nodes.list(&Default::default()).await.map_or(true, |list| {
                list.items.iter().any(|n| {
                    n.metadata.name.as_deref() != Some(name.as_str())
                        && n.spec.as_ref().and_then(|s| s.provider_id.as_deref())
                            == Some(provider_id.as_str())
                })
            });
            if !taken {
                break;
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
        let node: Node = serde_json::from_value(json!({
            "metadata": {"name": name, "labels": {"captf-e2e-namespace": self.ns}},
            "spec": {"providerID": provider_id}
        }))
        .expect("node");
        match Api::<Node>::all(self.client.clone())
            .create(&PostParams::default(), &node)
            .await
        {
            Ok(_) => {}
            Err(kube::Error::Api(e)) if e.code == 409 => {}
            Err(e) => panic!("create the Node of {machine}: {e}"),
        }
        drop(turn);
        wait_for(&format!("Machine {machine}'s nodeRef"), long(), || async {
            machines
                .get(machine)
                .await
                .is_ok_and(|m| m.data["status"]["nodeRef"]["name"].is_string())
        })
        .await;
    }

    /// Deletes the Nodes [`Env::give_machine_a_node`] made for this test.
    pub(crate) async fn delete_test_nodes(&self) {
        let nodes: Api<Node> = Api::all(self.client.clone());
        let lp =
            kube::api::ListParams::default().labels(&format!("captf-e2e-namespace={}", self.ns));
        if let Ok(list) = nodes.list(&lp).await {
            for n in list.items {
                let name = n.metadata.name.unwrap_or_default();
                let _ = nodes.delete(&name, &Default::default()).await;
            }
        }
    }
}
