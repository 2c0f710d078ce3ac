//! The end-to-end environment: a real control plane ([`cluster::ControlPlane`]:
//! kube-apiserver, kube-controller-manager and the local kubelet, which runs the rendered
//! Jobs' Pods on this machine with the real `terraform`), or the cluster of
//! `CAPTF_E2E_KUBECONFIG`; the real manager in-process, talking to the API server through
//! a fault proxy; and an apply path that does what the apply side does before deletion
//! (inputs Secret, `applied-at`, a real `terraform apply` through the kubernetes backend,
//! fingerprint).
//!
//! A crate of the workspace, used by `tests/integration`, `examples/sandbox.rs` and the
//! benches; nothing here may use `CARGO_BIN_EXE_*` (only integration tests get it):
//! running the `captf` binary lives in `tests/integration/deletion.rs` (`EnvExt`).
//!
//! By what it holds: the environment, its manager and its lifecycle here; how a
//! scenario's environment is made in `builder.rs` ([`Env::builder`]); making and changing
//! the scenario's objects in `objects.rs`; what a scenario reads and waits for in
//! `reads.rs`; the control plane in [`cluster`], Cluster API's objects in [`capi`]; the
//! modules the scenarios run and `terraform` by hand in `modules.rs`; the waits in
//! `waits.rs`; the watches that witness a deletion on an outside cluster in `witness.rs`;
//! the local kubelet's faults in `kubelet.rs`.

mod builder;
pub mod capi;
pub mod cluster;
mod kubelet;
mod modules;
mod objects;
pub mod ports;
mod reads;
mod waits;
mod witness;

pub use builder::EnvBuilder;
pub use kubelet::*;
pub use modules::*;
pub use objects::backend_labels;
pub use waits::*;
pub use witness::*;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use captf::api::labels::Identity;
use captf::api::names::{self, Kind};
use captf::api::{TerraformCluster, TerraformMachine, TerraformMachinePool, TerraformObject};
use captf::controller::ManagerConfig;
use captf::gather::Settings;
use captf::inputs::{self, Backend, Inputs, Module, Runner};
use captf::rules::Backoff;
use captf::state::{self, StateContent};
use captf_faultproxy::FaultProxy;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Namespace, Pod, Secret};
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{
    Api, ApiResource, DeleteParams, DynamicObject, ListParams, ObjectMeta, Patch, PatchParams,
    PostParams,
};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config, ResourceExt};
use serde_json::{Value, json};

use cluster::ControlPlane;

/// The repository's root (this crate is `tests/support`).
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Where the end-to-end tests run.
pub enum Cluster {
    /// `captf-envtest` on this machine (the default): its kubelet runs the Pods here, so
    /// what Terraform did in them is read off the files it left.
    Envtest(Arc<ControlPlane>),
    /// The cluster of `CAPTF_E2E_KUBECONFIG`: the Jobs run in Pods there with the runner
    /// image, and what Terraform did is read off the cluster by [`Witness`].
    External(PathBuf),
}

pub struct Env {
    pub cluster: Cluster,
    /// The test's own client (admin, straight to the API server).
    pub client: Client,
    /// The manager's way to the API server: its requests are counted there, and faults
    /// are injected there.
    pub proxy: FaultProxy,
    pub witness: Witness,
    pub manager: Option<(
        tokio::sync::oneshot::Sender<()>,
        tokio::task::JoinHandle<()>,
    )>,
    pub dir: PathBuf,
    pub config: ManagerConfig,
    /// The objects' namespace, a fresh `captf-e2e-…` one (tests share the cluster).
    pub ns: String,
    /// The manager's namespace, a fresh one too.
    pub manager_ns: String,
    /// The `timeoutSeconds` (the Job's `activeDeadlineSeconds`) of the inputs written
    /// from now on: 120 on `captf-envtest`, 900 on an outside cluster (image pulls).
    pub job_timeout_seconds: i64,
    /// The user the manager's requests impersonate (see [`Env::run_manager_as_installed`]);
    /// none: the admin's credentials.
    pub manager_as: Option<String>,
    /// When the scenario began making this environment: [`Env::shutdown`] appends the
    /// scenario's duration to the file `CAPTF_TEST_TIMES` names, when set.
    pub started: Instant,
}

/// The finalizers Cluster API's Cluster, Machine and MachinePool controllers keep until
/// what they own is gone.
/// The image the state proxy's sidecar names in the scenarios ([`EnvBuilder::state_proxy`]):
/// the local kubelet of every control plane runs it as this build's `captf`
/// (`--image-entrypoint`).
pub const STATE_PROXY_IMAGE: &str = "captf.test/captf:state-proxy";

pub const CAPI_CLUSTER_FINALIZER: &str = "cluster.cluster.x-k8s.io";
pub const CAPI_MACHINE_FINALIZER: &str = "machine.cluster.x-k8s.io";
pub const CAPI_MACHINE_POOL_FINALIZER: &str = "machinepool.cluster.x-k8s.io";

/// Appends "<seconds>\t<test>" to the file `CAPTF_TEST_TIMES` names, when set: how long
/// a scenario took from the start of its environment to its shutdown (the test's name is
/// its thread's, as the test harness names it). For finding the slow scenarios of a run;
/// a failed scenario, which does not shut down, is not listed.
fn record_duration(took: Duration) {
    use std::io::Write;
    let Some(path) = std::env::var_os("CAPTF_TEST_TIMES").filter(|p| !p.is_empty()) else {
        return;
    };
    let test = std::thread::current()
        .name()
        .unwrap_or("unnamed")
        .to_string();
    if let Ok(mut f) = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
    {
        let _ = writeln!(f, "{:.1}\t{test}", took.as_secs_f64());
    }
}

/// The kubeconfig of an outside cluster to run the end-to-end tests against
/// (`CAPTF_E2E_KUBECONFIG`), if set.
pub fn external_cluster() -> Option<PathBuf> {
    std::env::var_os("CAPTF_E2E_KUBECONFIG")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
}

/// True, and says why on stderr, when the tests run against an outside cluster and this
/// test needs the local control plane (a control plane of its own, because it deletes a
/// CRD every test shares; or the local kubelet).
/// Use as `if envtest_only("…") { return; }`.
pub fn envtest_only(why: &str) -> bool {
    if external_cluster().is_some() {
        eprintln!(
            "skipped with CAPTF_E2E_KUBECONFIG: this test needs the local control plane ({why})"
        );
        return true;
    }
    false
}

/// How long a scenario waits for a step: 90 s on `captf-envtest`; 10 minutes on an
/// outside cluster, where the first destroy Job also pulls the runner image.
pub fn long() -> Duration {
    if external_cluster().is_some() {
        Duration::from_secs(600)
    } else {
        Duration::from_secs(90)
    }
}

/// The runner image of the inputs the tests write (`CAPTF_E2E_RUNNER_IMAGE` overrides it
/// for an outside cluster; the local kubelet runs the host's programs whatever the image).
pub fn runner_image() -> String {
    std::env::var("CAPTF_E2E_RUNNER_IMAGE")
        .ok()
        .filter(|v| !v.is_empty())
        .unwrap_or_else(|| "hashicorp/terraform:1.11.4".into())
}

/// Whether `bin` is an executable file on PATH.
pub fn on_path(bin: &str) -> bool {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path).any(|p| p.join(bin).is_file())
}

pub fn require(bin: &str) -> PathBuf {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .map(|p| p.join(bin))
        .find(|p| p.is_file())
        .unwrap_or_else(|| {
            panic!("`{bin}` is not on PATH: the end-to-end tests need the real {bin}; install it")
        })
}

fn temp_dir(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "captf-e2e-{tag}-{}-{}",
        std::process::id(),
        rand_suffix()
    ));
    std::fs::create_dir_all(&dir).expect("temp dir");
    dir
}

fn rand_suffix() -> String {
    use std::sync::atomic::{AtomicU32, Ordering};
    static N: AtomicU32 = AtomicU32::new(0);
    let n = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    format!("{n:x}{:x}", N.fetch_add(1, Ordering::Relaxed))
}

/// The minimal CAPI `Cluster` CRD the tests need when Cluster API is not installed.
fn cluster_crd() -> CustomResourceDefinition {
    capi_crd("Cluster")
}

/// A minimal CRD of one of Cluster API's kinds (schema-less, as far as CAPTF cares).
fn capi_crd(kind: &str) -> CustomResourceDefinition {
    let plural = format!("{}s", kind.to_lowercase());
    serde_json::from_value(json!({
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": format!("{plural}.cluster.x-k8s.io")},
        "spec": {"group": "cluster.x-k8s.io", "scope": "Namespaced",
            "names": {"kind": kind, "plural": plural, "singular": kind.to_lowercase(), "listKind": format!("{kind}List")},
            "versions": [{"name": "v1beta2", "served": true, "storage": true,
                "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}},
                "subresources": {"status": {}}}]}
    }))
    .expect("Cluster API CRD")
}

/// Cluster API's Machine and MachinePool kinds, which own machines and pools.
async fn install_machine_crds(client: &Client) {
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    for kind in ["Machine", "MachinePool"] {
        let crd = capi_crd(kind);
        if crds
            .get_opt(&crd.name_any())
            .await
            .expect("get CRD")
            .is_none()
        {
            let _ = crds.create(&PostParams::default(), &crd).await;
        }
    }
}

async fn create_namespace(client: &Client, name: &str, labels: BTreeMap<String, String>) {
    let n = Namespace {
        metadata: ObjectMeta {
            name: Some(name.into()),
            labels: Some(labels),
            ..Default::default()
        },
        ..Default::default()
    };
    Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &n)
        .await
        .unwrap_or_else(|e| panic!("create namespace {name}: {e}"));
}

/// The manager settings of every scenario: fast retries (300 ms .. 3 s) and sweeps.
fn test_config(manager_ns: &str) -> ManagerConfig {
    ManagerConfig {
        concurrency: 4,
        settings: Settings {
            backoff: Backoff {
                base: Duration::from_millis(300),
                max: Duration::from_secs(3),
            },
            ..Settings::default()
        },
        manager_namespace: manager_ns.into(),
        identity: "test-manager".into(),
        rbac_sweep_every: Duration::from_millis(500),
        rediscover_every: Duration::from_millis(500),
        // The scenarios apply by hand (`Env::apply`); the apply scenarios turn it on.
        provision: false,
        ..Default::default()
    }
}

/// Installs CAPTF's CRDs (or replaces them with this build's) and, when Cluster API is
/// not installed, the minimal Cluster CRD, then waits until their resources are served.
async fn install_crds(client: &Client, with_cluster_crd: bool) {
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    for crd in captf::api::crds() {
        match crds.get_opt(&crd.name_any()).await.expect("get CRD") {
            None => {
                let _ = crds.create(&PostParams::default(), &crd).await;
            }
            Some(old) => {
                let mut crd = crd;
                crd.metadata.resource_version = old.metadata.resource_version;
                // Another test may have replaced it in between: that one is as new.
                let _ = crds
                    .replace(&crd.name_any(), &PostParams::default(), &crd)
                    .await;
            }
        }
    }
    if with_cluster_crd
        && crds
            .get_opt("clusters.cluster.x-k8s.io")
            .await
            .expect("get CRD")
            .is_none()
    {
        let _ = crds.create(&PostParams::default(), &cluster_crd()).await;
    }
    if with_cluster_crd {
        install_machine_crds(client).await;
    }
    // Custom resources are served a moment after their CRD is established.
    wait_for("the CRDs to be served", Duration::from_secs(60), || async {
        Api::<TerraformMachine>::all(client.clone())
            .list(&ListParams::default().limit(1))
            .await
            .is_ok()
            && Api::<TerraformCluster>::all(client.clone())
                .list(&ListParams::default().limit(1))
                .await
                .is_ok()
            && Api::<TerraformMachinePool>::all(client.clone())
                .list(&ListParams::default().limit(1))
                .await
                .is_ok()
            && (!with_cluster_crd
                || Api::<DynamicObject>::all_with(client.clone(), &cluster_resource())
                    .list(&ListParams::default().limit(1))
                    .await
                    .is_ok())
    })
    .await;
}

/// Installs the minimal Cluster CRD (as when Cluster API is installed) and waits until
/// Clusters are served.
pub async fn install_cluster_crd(client: &Client) {
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    crds.create(&PostParams::default(), &cluster_crd())
        .await
        .expect("create the Cluster CRD");
    install_machine_crds(client).await;
    wait_for("Clusters to be served", Duration::from_secs(60), || async {
        Api::<DynamicObject>::all_with(client.clone(), &cluster_resource())
            .list(&ListParams::default().limit(1))
            .await
            .is_ok()
    })
    .await;
}

impl Env {
    /// CAPTF's CRDs installed (or replaced), the Cluster CRD when Cluster API is not
    /// installed, two fresh namespaces labelled `captf-e2e=true` (or the two named), the
    /// fault proxy the manager will use, and the manager's settings (limited to the
    /// objects' namespace).
    async fn start_on(tag: &str, cluster: Cluster, names: Option<(String, String)>) -> Env {
        require("terraform");
        // The manager logs on stderr when CAPTF_TEST_LOG is set.
        if std::env::var_os("CAPTF_TEST_LOG").is_some() {
            captf::telemetry::init();
        }
        let kubeconfig = match &cluster {
            Cluster::Envtest(plane) => plane.kubeconfig().to_path_buf(),
            Cluster::External(k) => k.clone(),
        };
        let client = client_for(&kubeconfig).await;
        match &cluster {
            Cluster::Envtest(plane) => {
                plane
                    .crds
                    .get_or_init(|| install_crds(&client, plane.cluster_crd))
                    .await;
            }
            Cluster::External(_) => {
                install_crds(&client, false).await;
                capi::install_fixtures_outside(&client).await;
            }
        }
        let id = format!("{}-{}", tag.to_lowercase(), rand_suffix());
        let (ns, manager_ns) = names.unwrap_or_else(|| {
            let ns = format!("captf-e2e-{id}");
            (ns.clone(), format!("{ns}-sys"))
        });
        let labels: BTreeMap<String, String> =
            [("captf-e2e".to_string(), "true".to_string())].into();
        for n in [&ns, &manager_ns] {
            create_namespace(&client, n, labels.clone()).await;
        }
        let witness = Witness::start(client.clone(), &ns);
        let proxy = FaultProxy::start(&kubeconfig)
            .await
            .unwrap_or_else(|e| panic!("fault proxy: {e}"));
        let mut config = test_config(&manager_ns);
        config.namespace = Some(ns.clone());
        config.identity = format!("test-manager-{id}");
        let job_timeout_seconds = match &cluster {
            Cluster::Envtest(_) => 120,
            Cluster::External(_) => 900,
        };
        Env {
            cluster,
            client,
            proxy,
            witness,
            manager: None,
            dir: temp_dir(tag),
            config,
            ns,
            manager_ns,
            job_timeout_seconds,
            manager_as: None,
            started: Instant::now(),
        }
    }

    /// Whether this environment is an outside cluster (`CAPTF_E2E_KUBECONFIG`).
    pub fn is_external(&self) -> bool {
        matches!(self.cluster, Cluster::External(_))
    }

    /// The admin kubeconfig kubectl, captf and Terraform's backend use.
    pub fn kubeconfig_path(&self) -> &Path {
        match &self.cluster {
            Cluster::Envtest(plane) => plane.kubeconfig(),
            Cluster::External(kubeconfig) => kubeconfig,
        }
    }

    /// The directory the test modules' destroy provisioners leave their markers in,
    /// writable by the runner's user. On an outside cluster they run in Pods elsewhere,
    /// so this is `.` (Terraform's working directory there, thrown away with the Pod) and
    /// [`Witness`] tells what happened instead.
    pub fn markers(&self) -> PathBuf {
        if self.is_external() {
            return PathBuf::from(".");
        }
        let d = self.dir.join("markers");
        std::fs::create_dir_all(&d).expect("markers dir");
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o777)).expect("chmod");
        d
    }

    /// Starts the real manager in this process; its requests go through [`Env::proxy`].
    pub fn start_manager(&mut self) {
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let client = match &self.manager_as {
            Some(user) => self.proxy.client_as(user),
            None => self.proxy.client(),
        };
        let cfg = self.config.clone();
        let handle = tokio::spawn(async move {
            let shutdown = async move {
                let _ = rx.await;
            };
            if let Err(e) = captf::controller::run(client, cfg, shutdown).await {
                panic!("manager failed: {e}");
            }
        });
        self.manager = Some((tx, handle));
    }

    /// Makes the manager started from now on run as an installation from `config/` runs
    /// it: as the ServiceAccount `captf-manager` of its namespace, bound to the ClusterRole
    /// of `config/rbac/role.yaml` (applied with kubectl), its requests impersonating that
    /// ServiceAccount through the proxy. A permission the ClusterRole lacks fails its
    /// request as on a real installation. Returns the ClusterRoleBinding's name (remove it
    /// with [`Env::remove_manager_binding`]).
    pub async fn run_manager_as_installed(&mut self) -> String {
        self.kubectl_apply("config/rbac/role.yaml");
        let sa: k8s_openapi::api::core::v1::ServiceAccount =
            serde_json::from_value(json!({"metadata": {"name": "captf-manager"}})).expect("sa");
        Api::<k8s_openapi::api::core::v1::ServiceAccount>::namespaced(
            self.client.clone(),
            &self.manager_ns,
        )
        .create(&PostParams::default(), &sa)
        .await
        .expect("create the manager's ServiceAccount");
        let binding = format!("captf-manager-{}", self.manager_ns);
        let crb: k8s_openapi::api::rbac::v1::ClusterRoleBinding = serde_json::from_value(json!({
            "metadata": {"name": binding},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "captf-manager"},
            "subjects": [{"kind": "ServiceAccount", "name": "captf-manager", "namespace": self.manager_ns}]
        }))
        .expect("binding");
        Api::<k8s_openapi::api::rbac::v1::ClusterRoleBinding>::all(self.client.clone())
            .create(&PostParams::default(), &crb)
            .await
            .expect("bind the manager's ClusterRole");
        self.manager_as = Some(format!(
            "system:serviceaccount:{}:captf-manager",
            self.manager_ns
        ));
        binding
    }

    /// `kubectl apply -f` of `path` (relative to the repository) with the admin's
    /// credentials.
    pub fn kubectl_apply(&self, path: &str) {
        let out = std::process::Command::new("kubectl")
            .arg("--kubeconfig")
            .arg(self.kubeconfig_path())
            .args(["apply", "-f"])
            .arg(repo_root().join(path))
            .output()
            .expect("kubectl");
        assert!(
            out.status.success(),
            "kubectl apply {path}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// Takes Terraform's lock on the state of `suffix` as someone else would (a person
    /// running Terraform by hand, a CI job): the Lease Terraform's backend uses, held by
    /// lock `id` with lock info `info` (Terraform's fields: `ID`, `Operation`, `Who`, …).
    pub async fn take_lock(&self, suffix: &str, id: &str, info: &serde_json::Value) {
        use k8s_openapi::api::coordination::v1::Lease;
        let lock_name = names::lock_lease_name(suffix);
        let leases: Api<Lease> = Api::namespaced(self.client.clone(), &self.ns);
        // Labelled as Terraform's backend labels the Leases it makes.
        let held = json!({"metadata": {
                "labels": {names::TF_LABEL_STATE: "true", names::TF_LABEL_SUFFIX: suffix,
                    names::TF_LABEL_WORKSPACE: names::TF_WORKSPACE,
                    names::TF_LABEL_MANAGED_BY: "terraform"},
                "annotations": {names::TF_LOCK_INFO: info.to_string()}},
            "spec": {"holderIdentity": id}});
        match leases.get_opt(&lock_name).await.expect("lease") {
            Some(_) => {
                leases
                    .patch(&lock_name, &PatchParams::default(), &Patch::Merge(&held))
                    .await
                    .expect("take the lock");
            }
            None => {
                let mut lease: Lease = serde_json::from_value(held).expect("lease");
                lease.metadata.name = Some(lock_name.clone());
                leases
                    .create(&PostParams::default(), &lease)
                    .await
                    .expect("take the lock");
            }
        }
    }

    /// Removes a binding of [`Env::run_manager_as_installed`].
    pub async fn remove_manager_binding(&self, binding: &str) {
        let _ = Api::<k8s_openapi::api::rbac::v1::ClusterRoleBinding>::all(self.client.clone())
            .delete(binding, &DeleteParams::default())
            .await;
    }

    /// Stops the manager (as a crash would: nothing is flushed on the way out).
    pub async fn stop_manager(&mut self) {
        if let Some((tx, handle)) = self.manager.take() {
            let _ = tx.send(());
            let _ = tokio::time::timeout(Duration::from_secs(10), handle).await;
        }
    }

    /// Stops everything, strips the finalizers the test left in its two namespaces and
    /// deletes them (a test that panicked leaves them for inspection: README, "Tests").
    pub async fn shutdown(mut self) {
        self.stop_manager().await;
        self.delete_test_nodes().await;
        self.witness.stop();
        for ns in [&self.ns, &self.manager_ns] {
            strip_finalizers(&self.client, ns).await;
            let _ = Api::<Namespace>::all(self.client.clone())
                .delete(ns, &DeleteParams::background())
                .await;
        }
        let _ = std::fs::remove_dir_all(&self.dir);
        record_duration(self.started.elapsed());
    }

    pub fn cluster_api(&self) -> Api<DynamicObject> {
        cluster_api(&self.client, &self.ns)
    }

    /// Cluster API's `kind` (`Machine`, `MachinePool`) in the test's namespace.
    pub fn capi_api(&self, kind: &str) -> Api<DynamicObject> {
        capi_api(&self.client, &self.ns, kind)
    }

    pub fn api<K: TerraformObject>(&self) -> Api<K> {
        Api::namespaced(self.client.clone(), &self.ns)
    }

    pub fn secrets(&self) -> Api<Secret> {
        Api::namespaced(self.client.clone(), &self.ns)
    }
}

/// Typed aliases for brevity in scenarios.
pub type Tfc = TerraformCluster;
pub type Tfm = TerraformMachine;
pub type Tfmp = TerraformMachinePool;

async fn client_for(kubeconfig: &Path) -> Client {
    let kc = Kubeconfig::read_from(kubeconfig)
        .unwrap_or_else(|e| panic!("kubeconfig {}: {e}", kubeconfig.display()));
    let config = Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
        .await
        .expect("config");
    Client::try_from(config).expect("client")
}

/// Cluster API's `kind` (`Machine`, `MachinePool`) in `ns`.
fn capi_api(client: &Client, ns: &str, kind: &str) -> Api<DynamicObject> {
    let ar = ApiResource {
        kind: kind.into(),
        plural: format!("{}s", kind.to_lowercase()),
        ..cluster_resource()
    };
    Api::namespaced_with(client.clone(), ns, &ar)
}

fn cluster_resource() -> ApiResource {
    ApiResource {
        group: "cluster.x-k8s.io".into(),
        version: "v1beta2".into(),
        api_version: "cluster.x-k8s.io/v1beta2".into(),
        kind: "Cluster".into(),
        plural: "clusters".into(),
    }
}

fn cluster_api(client: &Client, ns: &str) -> Api<DynamicObject> {
    Api::namespaced_with(client.clone(), ns, &cluster_resource())
}

/// Removes every finalizer from the CAPTF objects, Clusters and Secrets of `ns`, so that
/// the namespace of a finished test can go.
async fn strip_finalizers(client: &Client, ns: &str) {
    async fn strip<K>(api: Api<K>)
    where
        K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
    {
        let Ok(list) = api.list(&Default::default()).await else {
            return;
        };
        let patch = Patch::Merge(json!({"metadata": {"finalizers": null}}));
        for o in list.items {
            if o.meta().finalizers.as_ref().is_some_and(|f| !f.is_empty()) {
                let name = o.meta().name.clone().unwrap_or_default();
                let _ = api.patch(&name, &PatchParams::default(), &patch).await;
            }
        }
    }
    strip(Api::<TerraformCluster>::namespaced(client.clone(), ns)).await;
    strip(Api::<TerraformMachine>::namespaced(client.clone(), ns)).await;
    strip(Api::<TerraformMachinePool>::namespaced(client.clone(), ns)).await;
    strip(Api::<Secret>::namespaced(client.clone(), ns)).await;
    strip(cluster_api(client, ns)).await;
    strip(capi_api(client, ns, "Machine")).await;
    strip(capi_api(client, ns, "MachinePool")).await;
}
