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
//! By what it holds: the environment and its objects here; the control plane in
//! [`cluster`], Cluster API's objects in [`capi`]; the modules the scenarios run and
//! `terraform` by hand in `modules.rs`; the waits in `waits.rs`; the watches that witness
//! a deletion on an outside cluster in `witness.rs`; the local kubelet's faults in
//! `kubelet.rs`.

pub mod capi;
pub mod cluster;
mod kubelet;
mod modules;
mod waits;
mod witness;

pub use kubelet::*;
pub use modules::*;
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
}

/// The finalizers Cluster API's Cluster, Machine and MachinePool controllers keep until
/// what they own is gone.
pub const CAPI_CLUSTER_FINALIZER: &str = "cluster.cluster.x-k8s.io";
pub const CAPI_MACHINE_FINALIZER: &str = "machine.cluster.x-k8s.io";
pub const CAPI_MACHINE_POOL_FINALIZER: &str = "machinepool.cluster.x-k8s.io";

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

/// How a scenario's environment is made: [`Env::builder`], what differs from the usual
/// one, then [`EnvBuilder::start`]. The usual one: the control plane this test process
/// shares (or the cluster of `CAPTF_E2E_KUBECONFIG`), two fresh namespaces, the manager
/// configured but not started.
#[must_use = "an EnvBuilder does nothing until it is started"]
pub struct EnvBuilder {
    tag: String,
    plane: Plane,
    names: Option<(String, String)>,
    provision: bool,
    backoff: Option<(Duration, Duration)>,
    machine: Option<Machine>,
}

/// The control plane of an [`EnvBuilder`].
enum Plane {
    Shared,
    Dedicated {
        kubelet: Vec<String>,
        kcm: Vec<String>,
        cluster_api: bool,
    },
    WithoutClusterApi,
}

/// The machine an [`EnvBuilder`] starts with.
enum Machine {
    Applied { name: String, module_body: String },
    ByHand { module_body: String },
}

impl EnvBuilder {
    /// On a control plane of its own (with the real Cluster API), for a test that changes
    /// what every test shares. Gate it with [`envtest_only`].
    pub fn dedicated(self) -> EnvBuilder {
        self.tuned(&[], &[], true)
    }

    /// On a control plane of its own whose local kubelet gets `kubelet_args`.
    pub fn kubelet_args(self, kubelet_args: &[&str]) -> EnvBuilder {
        self.tuned(kubelet_args, &[], true)
    }

    /// On a control plane of its own, with `kubelet_args` for the local kubelet,
    /// `kcm_args` for kube-controller-manager, and the real Cluster API only when
    /// `cluster_api` (else its Cluster CRD only).
    pub fn tuned(
        mut self,
        kubelet_args: &[&str],
        kcm_args: &[&str],
        cluster_api: bool,
    ) -> EnvBuilder {
        let own = |args: &[&str]| args.iter().map(|a| a.to_string()).collect();
        self.plane = Plane::Dedicated {
            kubelet: own(kubelet_args),
            kcm: own(kcm_args),
            cluster_api,
        };
        self
    }

    /// On a control plane of its own without Cluster API's Cluster CRD.
    pub fn without_cluster_api(mut self) -> EnvBuilder {
        self.plane = Plane::WithoutClusterApi;
        self
    }

    /// With the objects' namespace `ns` and the manager's `manager_ns` (the sandbox's
    /// `team-a` and `captf-system`) instead of two fresh names.
    pub fn in_namespaces(mut self, ns: &str, manager_ns: &str) -> EnvBuilder {
        self.names = Some((ns.to_string(), manager_ns.to_string()));
        self
    }

    /// With the manager started and applying live objects (`provision` on).
    pub fn provisioning(mut self) -> EnvBuilder {
        self.provision = true;
        self
    }

    /// With the manager's retries `base` apart, up to `max`.
    pub fn backoff(mut self, base: Duration, max: Duration) -> EnvBuilder {
        self.backoff = Some((base, max));
        self
    }

    /// Provisioning, with a Cluster `prod` and a TerraformMachine `name` of `module_body`
    /// the manager applied ([`Env::add_machine`]).
    pub fn with_machine(mut self, name: &str, module_body: &str) -> EnvBuilder {
        self.machine = Some(Machine::Applied {
            name: name.to_string(),
            module_body: module_body.to_string(),
        });
        self.provisioning()
    }

    /// With the manager started (deleting only) and a TerraformMachine `web-1` of a Cluster
    /// `prod` applied by hand ([`Env::apply`]): for a scenario whose inputs the product
    /// itself would refuse to apply (an inline module too large to render), as an older
    /// CAPTF may have written them.
    pub fn with_machine_applied_by_hand(mut self, module_body: &str) -> EnvBuilder {
        self.machine = Some(Machine::ByHand {
            module_body: module_body.to_string(),
        });
        self
    }

    /// Makes the environment.
    pub async fn start(self) -> Env {
        let tag = self.tag.as_str();
        let cluster = match (&self.plane, external_cluster()) {
            (Plane::Shared, Some(kubeconfig)) => Cluster::External(kubeconfig),
            (Plane::Shared, None) => Cluster::Envtest(ControlPlane::shared()),
            (
                Plane::Dedicated {
                    kubelet,
                    kcm,
                    cluster_api,
                },
                _,
            ) => {
                let kubelet: Vec<&str> = kubelet.iter().map(String::as_str).collect();
                let kcm: Vec<&str> = kcm.iter().map(String::as_str).collect();
                Cluster::Envtest(ControlPlane::dedicated_tuned(
                    tag,
                    &kubelet,
                    &kcm,
                    *cluster_api,
                ))
            }
            (Plane::WithoutClusterApi, _) => {
                Cluster::Envtest(ControlPlane::dedicated_without_capi(tag))
            }
        };
        let mut env = Env::start_on(tag, cluster, self.names).await;
        if let Some((base, max)) = self.backoff {
            env.config.settings.backoff.base = base;
            env.config.settings.backoff.max = max;
        }
        match self.machine {
            Some(Machine::Applied { name, module_body }) => {
                env.config.provision = true;
                env.start_manager();
                env.add_machine(&name, &module_body).await;
            }
            Some(Machine::ByHand { module_body }) => {
                env.start_manager();
                let markers = env.markers();
                let uid = env.create_cluster("prod").await;
                env.create_object::<TerraformMachine>("web-1", "prod", &uid, &markers)
                    .await;
                env.wait_finalizer::<TerraformMachine>("web-1").await;
                env.apply::<TerraformMachine>("web-1", &module_body, &markers)
                    .await;
            }
            None if self.provision => {
                env.config.provision = true;
                env.start_manager();
            }
            None => {}
        }
        env
    }
}

impl Env {
    /// The environment of one scenario, made as [`EnvBuilder`] says.
    pub fn builder(tag: &str) -> EnvBuilder {
        EnvBuilder {
            tag: tag.to_string(),
            plane: Plane::Shared,
            names: None,
            provision: false,
            backoff: None,
            machine: None,
        }
    }

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
        let held = json!({"metadata": {"annotations": {names::TF_LOCK_INFO: info.to_string()}},
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
    }

    pub fn cluster_api(&self) -> Api<DynamicObject> {
        cluster_api(&self.client, &self.ns)
    }

    /// Creates Cluster API's Machine `name` of the Cluster `cluster`, naming its bootstrap
    /// data Secret `data_secret` when given (else a bootstrap config of the tests' own
    /// that has none yet: [`Env::give_bootstrap_data`]) and the TerraformMachine `name` as its
    /// infrastructure; returns its uid. Cluster API's Machine controller puts its finalizer
    /// on it, owns the TerraformMachine, and deletes it before it lets the Machine go.
    pub async fn create_machine(
        &self,
        name: &str,
        cluster: &str,
        data_secret: Option<&str>,
    ) -> String {
        let bootstrap = match data_secret {
            Some(s) => json!({ "dataSecretName": s }),
            None => {
                self.create_bootstrap_config(name).await;
                json!({"configRef": {"apiGroup": capi::BOOTSTRAP_GROUP,
                    "kind": capi::BOOTSTRAP_KIND, "name": name}})
            }
        };
        let machine: DynamicObject = serde_json::from_value(json!({
            "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Machine",
            "metadata": {"name": name, "namespace": self.ns,
                "labels": {names::CAPI_CLUSTER_NAME_LABEL: cluster}},
            "spec": {"clusterName": cluster, "bootstrap": bootstrap,
                "infrastructureRef": {"apiGroup": names::GROUP, "kind": "TerraformMachine", "name": name}}
        }))
        .expect("machine");
        self.capi_api("Machine")
            .create(&PostParams::default(), &machine)
            .await
            .expect("create the Machine")
            .metadata
            .uid
            .unwrap_or_default()
    }

    /// Creates Cluster API's MachinePool `name` of the Cluster `cluster` with `replicas`,
    /// its template naming the bootstrap data Secret `data_secret` and the
    /// TerraformMachinePool `name` as its infrastructure;
    /// returns its uid.
    pub async fn create_machine_pool(
        &self,
        name: &str,
        cluster: &str,
        replicas: u32,
        data_secret: &str,
    ) -> String {
        let pool: DynamicObject = serde_json::from_value(json!({
            "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "MachinePool",
            "metadata": {"name": name, "namespace": self.ns,
                "labels": {names::CAPI_CLUSTER_NAME_LABEL: cluster}},
            "spec": {"clusterName": cluster, "replicas": replicas, "template": {"spec": {
                "clusterName": cluster,
                "bootstrap": {"dataSecretName": data_secret},
                "infrastructureRef": {"apiGroup": names::GROUP, "kind": "TerraformMachinePool", "name": name}}}}
        }))
        .expect("machine pool");
        self.capi_api("MachinePool")
            .create(&PostParams::default(), &pool)
            .await
            .expect("create the MachinePool")
            .metadata
            .uid
            .unwrap_or_default()
    }

    /// What Cluster API and a bootstrap provider make before CAPTF applies a machine or
    /// pool of the Cluster `cluster` (already created and marked ready): the bootstrap
    /// data Secret `<name>-bootstrap`, then the Machine or MachinePool `name` naming it;
    /// then the CAPTF object `name` of `module_body` (with the contract's outputs of its
    /// kind) owned by it. For a TerraformCluster, the object owned by the Cluster. Waits
    /// until the manager has applied it (`Provisioned` True).
    pub async fn provision<K: TerraformObject>(
        &self,
        name: &str,
        cluster: &str,
        module_body: &str,
    ) {
        let secret = format!("{name}-bootstrap");
        if K::KIND != Kind::TerraformCluster {
            self.create_bootstrap_secret(cluster, &secret, &format!("#cloud-config {name}"))
                .await;
        }
        let (owner_kind, owner_name, owner_uid) = match K::KIND {
            Kind::TerraformCluster => {
                let c = self.cluster_api().get(cluster).await.expect("the Cluster");
                ("Cluster", cluster, c.metadata.uid.unwrap_or_default())
            }
            Kind::TerraformMachine => (
                "Machine",
                name,
                self.create_machine(name, cluster, Some(&secret)).await,
            ),
            Kind::TerraformMachinePool => (
                "MachinePool",
                name,
                self.create_machine_pool(name, cluster, 2, &secret).await,
            ),
        };
        let owner = (owner_kind, owner_name, owner_uid.as_str(), true);
        let module = format!("{module_body}{}", contract_outputs(K::KIND));
        self.create_owned::<K>(name, cluster, &[owner], &module, json!({}))
            .await;
        self.wait_provisioned::<K>(name).await;
    }

    /// Changes the spec of the TerraformMachine `name` (made by [`EnvBuilder::with_machine`] of
    /// [`module`]`(0)`) so that the manager re-applies it: the same module, with one more
    /// instance whose create sleeps `seconds`.
    pub async fn reapply_slowly(&self, name: &str, seconds: u32) {
        let body = format!(
            r#"{}{}
resource "terraform_data" "slow" {{
  provisioner "local-exec" {{
    command = "sleep {seconds}"
  }}
}}
"#,
            module(0),
            contract_outputs(Kind::TerraformMachine)
        );
        self.api::<TerraformMachine>()
            .patch(
                name,
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"module": {"files": {"main.tf": body}}}})),
            )
            .await
            .expect("change the module");
    }

    /// Whether the manager's apply Job of attempt `n` of the TerraformMachine `name` runs.
    pub async fn apply_job_active(&self, name: &str, n: u32) -> bool {
        let suffix = names::state_suffix(Kind::TerraformMachine, name);
        let job = names::job_name(&suffix, names::OPERATION_APPLY, n);
        Api::<Job>::namespaced(self.client.clone(), &self.ns)
            .get_opt(&job)
            .await
            .ok()
            .flatten()
            .and_then(|j| j.status?.active)
            == Some(1)
    }

    /// Waits until the manager has applied `K`/`name` (`Provisioned` True).
    pub async fn wait_provisioned<K: TerraformObject>(&self, name: &str) {
        wait_for(&format!("{name} to be provisioned"), long(), || async {
            self.condition::<K>(name, "Provisioned")
                .await
                .is_some_and(|(s, _, _)| s == "True")
        })
        .await;
    }

    /// Creates the bootstrap data Secret `name` of the Cluster `cluster` with `value`, as a
    /// bootstrap provider does (labelled with the cluster's name).
    pub async fn create_bootstrap_secret(&self, cluster: &str, name: &str, value: &str) {
        let secret: Secret = serde_json::from_value(json!({
            "metadata": {"name": name, "labels": {names::CAPI_CLUSTER_NAME_LABEL: cluster}},
            "type": "cluster.x-k8s.io/secret",
            "stringData": {"value": value, "format": "cloud-config"}
        }))
        .expect("secret");
        self.secrets()
            .create(&PostParams::default(), &secret)
            .await
            .expect("create the bootstrap Secret");
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

    /// Creates a CAPTF object owned by the Cluster `cluster` (uid `cluster_uid`).
    pub async fn create_object<K: TerraformObject>(
        &self,
        name: &str,
        cluster: &str,
        cluster_uid: &str,
        marker_dir: &Path,
    ) -> K {
        let obj: K = serde_json::from_value(json!({
            "apiVersion": names::API_VERSION, "kind": K::KIND.as_str(),
            "metadata": {
                "name": name, "namespace": self.ns,
                "labels": {names::CAPI_CLUSTER_NAME_LABEL: cluster},
                "ownerReferences": [{"apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Cluster", "name": cluster, "uid": cluster_uid}]
            },
            "spec": {
                "module": {"files": {"main.tf": module(0)}},
                "variables": {"name": name, "marker_dir": marker_dir.display().to_string()}
            }
        }))
        .expect("object");
        self.api::<K>()
            .create(&PostParams::default(), &obj)
            .await
            .expect("create object")
    }

    /// Creates a CAPTF object of kind `K` with `module` (and the spec fields of `extra`
    /// beside it), labelled with the Cluster `cluster` and owned by `owners` (kind, name,
    /// uid, controller), for the manager to apply.
    pub async fn create_owned<K: TerraformObject>(
        &self,
        name: &str,
        cluster: &str,
        owners: &[(&str, &str, &str, bool)],
        module: &str,
        extra: Value,
    ) {
        let owner_refs: Vec<Value> = owners
            .iter()
            .map(|(kind, owner_name, uid, controller)| {
                json!({"apiVersion": "cluster.x-k8s.io/v1beta2", "kind": kind,
                    "name": owner_name, "uid": uid, "controller": controller})
            })
            .collect();
        let mut spec = json!({
            "module": {"files": {"main.tf": module}},
            "variables": {"name": name, "marker_dir": self.markers().display().to_string()}
        });
        if let (Some(spec), Value::Object(extra)) = (spec.as_object_mut(), extra) {
            spec.extend(extra);
        }
        let obj: K = serde_json::from_value(json!({
            "apiVersion": names::API_VERSION, "kind": K::KIND.as_str(),
            "metadata": {
                "name": name, "namespace": self.ns,
                "labels": {names::CAPI_CLUSTER_NAME_LABEL: cluster},
                "ownerReferences": owner_refs
            },
            "spec": spec
        }))
        .expect("object");
        self.api::<K>()
            .create(&PostParams::default(), &obj)
            .await
            .expect("create object");
        // A TerraformCluster of a Cluster is its infrastructure: named by the Cluster, as
        // a user's manifests (or a ClusterClass) name it. Cluster API then owns it and
        // deletes it after the Cluster's machines.
        if K::KIND == Kind::TerraformCluster && owners.iter().any(|(kind, ..)| *kind == "Cluster") {
            self.name_infrastructure(cluster, name).await;
        }
    }

    /// Does what the apply path does before a deletion can find anything: writes the
    /// inputs Secret and `applied-at`, runs the real `terraform apply` through the
    /// kubernetes backend, then records the state's fingerprint on the object.
    pub async fn apply<K: TerraformObject>(
        &self,
        name: &str,
        module_body: &str,
        marker_dir: &Path,
    ) {
        let (inputs, uid, suffix) = self.write_inputs::<K>(name, module_body, marker_dir).await;
        let variables = inputs.variables.clone();
        let work = self
            .dir
            .join(format!("apply-{}-{name}", K::KIND.short_name()));
        std::fs::create_dir_all(&work).expect("work dir");
        std::fs::write(work.join("main.tf"), module_body).expect("main.tf");
        std::fs::write(
            work.join("captf_backend_override.tf"),
            "terraform {\n  backend \"kubernetes\" {}\n}\n",
        )
        .expect("override");
        // The apply path passes the same backend labels as the destroy Job.
        let labels = backend_labels(K::KIND, name, &uid);
        let ns = &self.ns;
        let labels_hcl: Vec<String> = labels
            .iter()
            .map(|(k, v)| format!("    \"{k}\" = \"{v}\""))
            .collect();
        std::fs::write(
            work.join("backend.hcl"),
            format!(
                "namespace = \"{ns}\"\nsecret_suffix = \"{suffix}\"\nconfig_path = \"{}\"\nlabels = {{\n{}\n}}\n",
                self.kubeconfig_path().display(),
                labels_hcl.join("\n")
            ),
        )
        .expect("backend.hcl");
        std::fs::write(
            work.join("vars.tfvars.json"),
            serde_json::to_vec(&variables).expect("vars"),
        )
        .expect("vars");
        // `init` creates the state Secret, and the manager puts its protection finalizer
        // on it as soon as it sees it. Terraform's backend writes with the resourceVersion
        // it read, so a write of the manager in between makes it fail with a conflict. The
        // real apply path runs Terraform in a Job, and the manager leaves the state alone
        // while a Job of the object is unfinished; here Terraform runs outside a Job, so
        // run `init` again after a conflict and let the manager protect the Secret before
        // the apply writes it.
        let init = [
            "init",
            "-input=false",
            "-no-color",
            "-backend-config=backend.hcl",
        ];
        if try_terraform(&work, &init).is_err() {
            terraform(&work, &init);
        }
        if self.manager.is_some() {
            self.wait_protected(&names::state_secret_name(&suffix))
                .await;
        }
        terraform(
            &work,
            &[
                "apply",
                "-auto-approve",
                "-input=false",
                "-no-color",
                "-var-file=vars.tfvars.json",
            ],
        );
        let (lineage, serial) = self.fingerprint(K::KIND, name).await;
        self.annotate::<K>(
            name,
            &[
                (names::STATE_LINEAGE, Some(lineage)),
                (names::STATE_SERIAL, Some(serial.to_string())),
            ],
        )
        .await;
    }

    /// The apply path's writes before Terraform runs: the inputs Secret (created, or
    /// replaced), then `applied-at` and `inputs-sha256` on the object. Returns the inputs,
    /// the object's uid and its state suffix.
    pub async fn write_inputs<K: TerraformObject>(
        &self,
        name: &str,
        module_body: &str,
        marker_dir: &Path,
    ) -> (Inputs, String, String) {
        self.write_inputs_edited::<K>(name, module_body, marker_dir, |_| {})
            .await
    }

    /// As [`Env::write_inputs`], with `edit` applied to the inputs before they are written
    /// (an env entry, a runner image).
    pub async fn write_inputs_edited<K: TerraformObject>(
        &self,
        name: &str,
        module_body: &str,
        marker_dir: &Path,
        edit: impl FnOnce(&mut Inputs),
    ) -> (Inputs, String, String) {
        let api = self.api::<K>();
        let obj = api.get(name).await.expect("object");
        let suffix = names::state_suffix(K::KIND, name);
        let uid = obj.meta().uid.clone().unwrap_or_default();
        let variables: serde_json::Map<String, Value> = [
            ("name".to_string(), json!(name)),
            (
                "marker_dir".to_string(),
                json!(marker_dir.display().to_string()),
            ),
        ]
        .into_iter()
        .collect();
        let inputs = Inputs {
            version: 1,
            runner: Runner {
                image: runner_image(),
                runtime: None,
                plugin_dir: None,
            },
            module: Module::Files([("main.tf".to_string(), module_body.to_string())].into()),
            variables: variables.clone(),
            env: vec![],
            backend: Backend {
                namespace: self.ns.clone(),
                secret_suffix: suffix.clone(),
            },
            timeout_seconds: Some(self.job_timeout_seconds),
            lock_file: None,
            contract_variables: Default::default(),
            ran: None,
        };
        let mut inputs = inputs;
        edit(&mut inputs);
        let secret = inputs::inputs_secret(
            &inputs,
            &Identity {
                kind: K::KIND,
                name,
                uid: &uid,
                namespace: &self.ns,
            },
        );
        match self.secrets().create(&PostParams::default(), &secret).await {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 409 => {
                self.secrets()
                    .replace(&secret.name_any(), &PostParams::default(), &secret)
                    .await
                    .expect("replace inputs");
            }
            Err(e) => panic!("inputs Secret: {e}"),
        }
        self.annotate::<K>(
            name,
            &[
                (names::APPLIED_AT, Some(jiff::Timestamp::now().to_string())),
                (names::INPUTS_SHA256, Some(inputs.sha256())),
            ],
        )
        .await;
        (inputs, uid, suffix)
    }

    /// The lineage and serial of an object's state, read through the product's reader.
    pub async fn fingerprint(&self, kind: Kind, name: &str) -> (String, u64) {
        match self.read_state(kind, name).await {
            StateContent::Parsed {
                lineage, serial, ..
            } => (lineage, serial),
            other => panic!("state of {kind}/{name} is not readable: {other:?}"),
        }
    }

    /// The state Secret of `kind`/`name` and its parts, as read now.
    async fn state_secrets(&self, kind: Kind, name: &str) -> captf::state::StateSecrets {
        let suffix = names::state_suffix(kind, name);
        captf::state::secrets::read(
            &self.secrets(),
            &names::state_secret_name(&suffix),
            Some(&suffix),
        )
        .await
        .expect("read state")
    }

    pub async fn read_state(&self, kind: Kind, name: &str) -> StateContent {
        let secrets = self.state_secrets(kind, name).await;
        state::read(&secrets, state::DEFAULT_DECOMPRESSION_CAP)
    }

    /// The string output `output` of the state of `kind`/`name`, if it has one.
    pub async fn state_output(&self, kind: Kind, name: &str, output: &str) -> Option<String> {
        let secrets = self.state_secrets(kind, name).await;
        captf::state::outputs(&secrets, state::DEFAULT_DECOMPRESSION_CAP)
            .unwrap_or_else(|e| panic!("the outputs of {kind}/{name}: {e}"))
            .get(output)
            .and_then(|v| v.as_str().map(str::to_string))
    }

    pub async fn annotate<K: TerraformObject>(&self, name: &str, edits: &[(&str, Option<String>)]) {
        let map: serde_json::Map<String, Value> = edits
            .iter()
            .map(|(k, v)| {
                (
                    k.to_string(),
                    v.clone().map(Value::String).unwrap_or(Value::Null),
                )
            })
            .collect();
        self.api::<K>()
            .patch(
                name,
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"annotations": map}})),
            )
            .await
            .expect("annotate");
    }

    /// Deletes the object and strips its finalizers by hand (docs/08), and waits until it
    /// is gone: no destroy, no cleanup.
    pub async fn delete_stripping_finalizers<K: TerraformObject>(&self, name: &str) {
        self.delete::<K>(name).await;
        self.api::<K>()
            .patch(
                name,
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"finalizers": null}})),
            )
            .await
            .expect("strip the finalizers");
        self.wait_gone::<K>(name, long()).await;
    }

    /// Sets the abandon annotation as the runbook does: to the object's uid.
    pub async fn abandon<K: TerraformObject>(&self, name: &str) {
        let uid = self
            .object::<K>(name)
            .await
            .and_then(|o| o.meta().uid.clone())
            .expect("uid");
        self.annotate::<K>(name, &[(names::ABANDON, Some(uid))])
            .await;
    }

    /// What `clusterctl move` does to the source Cluster when CAPTF's kinds were not moved
    /// (a kustomize install without the clusterctl label on the CRDs): pauses it, strips
    /// its finalizers and deletes it, and its Machines and MachinePools the same way; the
    /// garbage collector then deletes the CAPTF objects they owned.
    pub async fn move_cluster_away(&self, name: &str) {
        let clusters = self.cluster_api();
        for patch in [
            json!({"spec": {"paused": true}}),
            json!({"metadata": {"finalizers": null}}),
        ] {
            clusters
                .patch(name, &PatchParams::default(), &Patch::Merge(patch))
                .await
                .expect("patch cluster");
        }
        clusters
            .delete(name, &DeleteParams::background())
            .await
            .expect("delete cluster");
        // And so it does with the Cluster's Machines and MachinePools.
        let of_cluster =
            ListParams::default().labels(&format!("{}={name}", names::CAPI_CLUSTER_NAME_LABEL));
        for kind in ["Machine", "MachinePool"] {
            let api = self.capi_api(kind);
            let Ok(list) = api.list(&of_cluster).await else {
                continue;
            };
            for o in list.items {
                let o_name = o.metadata.name.clone().unwrap_or_default();
                let strip = Patch::Merge(json!({"metadata": {"finalizers": null}}));
                let _ = api.patch(&o_name, &PatchParams::default(), &strip).await;
                let _ = api.delete(&o_name, &DeleteParams::background()).await;
            }
        }
    }

    /// Deletes the CAPI Cluster. Cluster API's controllers keep it while they delete
    /// its machines, control plane and infrastructure, in that order.
    pub async fn delete_cluster(&self, name: &str) {
        self.cluster_api()
            .delete(name, &DeleteParams::background())
            .await
            .expect("delete cluster");
    }

    pub async fn exists<K: TerraformObject>(&self, name: &str) -> bool {
        self.api::<K>().get_opt(name).await.expect("get").is_some()
    }

    pub async fn object<K: TerraformObject>(&self, name: &str) -> Option<K> {
        self.api::<K>().get_opt(name).await.expect("get")
    }

    /// The reason of a condition of an object, if set.
    pub async fn condition<K: TerraformObject>(
        &self,
        name: &str,
        type_: &str,
    ) -> Option<(String, String, String)> {
        let obj = self.object::<K>(name).await?;
        obj.status()?
            .conditions
            .iter()
            .find(|c| c.type_ == type_)
            .map(|c| (c.status.clone(), c.reason.clone(), c.message.clone()))
    }

    /// Asserts that nothing CAPTF made for the object `kind`/`name` is left in the test's
    /// namespace: no state, inputs or backup Secret (or part of one), no Secret, Job or Pod
    /// with its owner labels, and no lock Lease. Errored states are kept by design and are
    /// not looked at.
    pub async fn assert_nothing_left(&self, kind: Kind, name: &str) {
        let suffix = names::state_suffix(kind, name);
        let mine = |labels: Option<&BTreeMap<String, String>>| {
            captf::api::labels::labelled_owner(labels).is_some_and(|o| o.is_named(kind, name))
        };
        let secrets = self
            .secrets()
            .list_metadata(&ListParams::default())
            .await
            .expect("secrets");
        let left: Vec<String> = secrets
            .items
            .iter()
            .filter(|s| {
                let n = s.metadata.name.as_deref().unwrap_or_default();
                let parsed = names::parse_secret_name(n);
                let errored = parsed
                    .as_ref()
                    .is_some_and(|p| p.role == names::SecretRole::Errored);
                let of_suffix = parsed.as_ref().is_some_and(|p| p.rest == suffix);
                !errored && (of_suffix || mine(s.metadata.labels.as_ref()))
            })
            .map(|s| s.name_any())
            .collect();
        assert!(left.is_empty(), "Secrets of {kind} {name} left: {left:?}");
        let jobs: Api<Job> = Api::namespaced(self.client.clone(), &self.ns);
        let left: Vec<String> = jobs
            .list_metadata(&ListParams::default())
            .await
            .expect("jobs")
            .items
            .iter()
            .filter(|j| mine(j.metadata.labels.as_ref()))
            .map(|j| j.name_any())
            .collect();
        assert!(left.is_empty(), "Jobs of {kind} {name} left: {left:?}");
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), &self.ns);
        let left: Vec<String> = pods
            .list_metadata(&ListParams::default())
            .await
            .expect("pods")
            .items
            .iter()
            .filter(|p| mine(p.metadata.labels.as_ref()) && p.metadata.deletion_timestamp.is_none())
            .map(|p| p.name_any())
            .collect();
        assert!(left.is_empty(), "Pods of {kind} {name} left: {left:?}");
        let leases: Api<k8s_openapi::api::coordination::v1::Lease> =
            Api::namespaced(self.client.clone(), &self.ns);
        assert!(
            leases
                .get_opt(&names::lock_lease_name(&suffix))
                .await
                .expect("lease")
                .is_none(),
            "the lock Lease of {kind} {name} is left"
        );
    }

    /// The files of the attempt whose Job is `job` that its Secret holds, by the path the
    /// Job's projected volume gives each key (`file-<index>` → `terraform.tfvars.json`);
    /// waits for the Job and its Secret.
    pub async fn attempt_files(&self, job: &str) -> BTreeMap<String, String> {
        let jobs: Api<Job> = Api::namespaced(self.client.clone(), &self.ns);
        let job_obj = wait_for_value(&format!("the Job {job}"), long(), || async {
            jobs.get_opt(job).await.ok().flatten()
        })
        .await;
        let secret = wait_for_value(&format!("the Secret of {job}"), long(), || async {
            self.secrets().get_opt(job).await.ok().flatten()
        })
        .await;
        let data = secret.data.unwrap_or_default();
        let volumes = job_obj
            .spec
            .and_then(|s| s.template.spec)
            .map(|s| s.volumes.unwrap_or_default())
            .unwrap_or_default();
        volumes
            .iter()
            .filter_map(|v| v.projected.as_ref())
            .flat_map(|p| p.sources.iter().flatten())
            .filter_map(|src| src.secret.as_ref())
            .filter(|s| s.name == job)
            .flat_map(|s| s.items.iter().flatten())
            .filter_map(|item| {
                let content = data.get(&item.key)?;
                Some((
                    item.path.clone(),
                    String::from_utf8_lossy(&content.0).into_owned(),
                ))
            })
            .collect()
    }

    pub async fn secret_exists(&self, name: &str) -> bool {
        self.secrets()
            .get_opt(name)
            .await
            .expect("get secret")
            .is_some()
    }

    /// Event reasons recorded about an object (events.k8s.io/v1).
    pub async fn event_reasons(&self, name: &str) -> Vec<String> {
        Api::<Event>::namespaced(self.client.clone(), &self.ns)
            .list(&Default::default())
            .await
            .expect("list events")
            .items
            .into_iter()
            .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name))
            .filter_map(|e| e.reason)
            .collect()
    }
}

/// The labels the apply path (and the destroy Job) give Terraform's backend: the owner
/// labels and clusterctl's move label.
pub fn backend_labels(kind: Kind, name: &str, uid: &str) -> BTreeMap<String, String> {
    Identity {
        kind,
        namespace: "",
        name,
        uid,
    }
    .moved_labels()
}

/// Typed aliases for brevity in scenarios.
pub type Tfc = TerraformCluster;
pub type Tfm = TerraformMachine;
pub type Tfmp = TerraformMachinePool;

impl Env {
    /// Writes (create, update, patch, delete) of the manager that the API server carried
    /// out so far.
    pub fn total_writes(&self) -> u64 {
        self.proxy.request_log().writes_done()
    }

    /// Deletes one CAPTF object.
    pub async fn delete<K: TerraformObject>(&self, name: &str) {
        self.api::<K>()
            .delete(name, &DeleteParams::background())
            .await
            .expect("delete");
    }

    /// Keeps an errored state of `web-1` (attempt 1) as a runner keeps one through
    /// Terraform's backend: a Secret of `tfstate` (gzipped state JSON) with Terraform's
    /// labels under an errored suffix of its own, the owner and move labels, and the
    /// errored-state label; no finalizer. Returns its name.
    pub async fn keep_errored_state(&self, tfstate: Vec<u8>) -> String {
        let suffix = names::state_suffix(Kind::TerraformMachine, "web-1");
        let errored_suffix = names::errored_suffix(&suffix, 1, "ab1cd");
        let name = names::state_secret_name(&errored_suffix);
        let uid = self
            .object::<TerraformMachine>("web-1")
            .await
            .and_then(|o| o.metadata.uid)
            .expect("uid");
        let mut labels = backend_labels(Kind::TerraformMachine, "web-1", &uid);
        labels.extend(captf::api::labels::terraform_state_labels(&errored_suffix));
        labels.insert(names::LABEL_ERRORED_STATE.to_string(), "true".to_string());
        let secret = Secret {
            metadata: ObjectMeta {
                name: Some(name.clone()),
                labels: Some(labels),
                ..Default::default()
            },
            data: Some(BTreeMap::from([(
                names::TF_STATE_KEY.to_string(),
                k8s_openapi::ByteString(tfstate),
            )])),
            ..Default::default()
        };
        self.secrets()
            .create(&PostParams::default(), &secret)
            .await
            .expect("the errored state");
        name
    }

    /// Waits until the object's Deleting condition has `reason`.
    pub async fn wait_deleting<K: TerraformObject>(
        &self,
        name: &str,
        reason: &str,
        timeout: Duration,
    ) -> String {
        self.wait_condition::<K>(name, "Deleting", None, reason, timeout)
            .await
    }

    /// Waits until `K`/`name`'s condition `type_` has `reason`, and `status` when given;
    /// returns its message. The one wait for a condition the scenarios use: on a timeout
    /// it panics with the condition as it was last seen and the object's other conditions.
    pub async fn wait_condition<K: TerraformObject>(
        &self,
        name: &str,
        type_: &str,
        status: Option<&str>,
        reason: &str,
        timeout: Duration,
    ) -> String {
        let start = std::time::Instant::now();
        loop {
            let conditions = self
                .object::<K>(name)
                .await
                .and_then(|o| o.status().map(|s| s.conditions.clone()))
                .unwrap_or_default();
            if let Some(c) = conditions.iter().find(|c| c.type_ == type_)
                && c.reason == reason
                && status.is_none_or(|s| s == c.status)
            {
                return c.message.clone();
            }
            if start.elapsed() > timeout {
                let seen: Vec<String> = conditions
                    .iter()
                    .map(|c| format!("{}={}/{}: {}", c.type_, c.status, c.reason, c.message))
                    .collect();
                panic!(
                    "timed out after {timeout:?} waiting for {name}'s {type_} to be {}{reason}; its conditions: {seen:#?}",
                    status.map(|s| format!("{s}/")).unwrap_or_default()
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    pub async fn wait_gone<K: TerraformObject>(&self, name: &str, timeout: Duration) {
        wait_for(&format!("{name} to be released"), timeout, || async {
            !self.exists::<K>(name).await
        })
        .await;
    }

    /// How many times Terraform ran the destroy provisioner of an instance of `name` (the
    /// module's `.tries` marker). On an outside cluster, where the markers stay in the
    /// Pods: how many destroy Jobs of `name` were created.
    pub fn tries(&self, name: &str) -> u32 {
        match &self.cluster {
            Cluster::Envtest(_) => {
                std::fs::read_to_string(self.markers().join(format!("{name}-0.tries")))
                    .ok()
                    .and_then(|s| s.trim().parse().ok())
                    .unwrap_or(0)
            }
            Cluster::External(_) => self.witness.destroy_jobs(name),
        }
    }

    /// Whether Terraform destroyed both instances of `name`: their destroy markers; on an
    /// outside cluster, a state of `name` that held instances was seen holding none.
    pub fn destroyed(&self, name: &str) -> bool {
        self.destroyed_at(name).is_some()
    }

    /// When Terraform destroyed `name` (see [`Env::destroyed`]).
    pub fn destroyed_at(&self, name: &str) -> Option<std::time::SystemTime> {
        match &self.cluster {
            Cluster::Envtest(_) => {
                let markers = self.markers();
                let times: Vec<_> = (0..2)
                    .map(|i| {
                        std::fs::metadata(markers.join(format!("{name}-{i}.destroyed")))
                            .and_then(|m| m.modified())
                            .ok()
                    })
                    .collect::<Option<_>>()?;
                times.into_iter().max()
            }
            Cluster::External(_) => self.witness.emptied_at(name),
        }
    }

    /// The runner images of the Jobs of `operation` of the object `name` created so far.
    pub fn job_images(&self, name: &str, operation: &str) -> Vec<String> {
        self.witness.job_images(name, operation)
    }

    /// Jobs created so far in the test's namespace (the witness saw them).
    pub fn jobs_created(&self) -> u64 {
        self.witness.jobs() as u64
    }

    /// Destroy Jobs created so far in the test's namespace (the witness saw them).
    pub fn destroy_jobs_created(&self) -> u64 {
        self.witness.operation_jobs(names::OPERATION_DESTROY) as u64
    }

    /// The destroy Jobs in the namespace now.
    pub async fn destroy_jobs(&self) -> Vec<Job> {
        let lp = ListParams::default().labels(&format!(
            "{}={}",
            names::LABEL_OPERATION,
            names::OPERATION_DESTROY
        ));
        Api::<Job>::namespaced(self.client.clone(), &self.ns)
            .list(&lp)
            .await
            .expect("list jobs")
            .items
    }

    /// Whether a destroy of `name` has reached its destroy provisioner: the `.tries`
    /// marker; on an outside cluster, the log of a destroy Pod of `name`.
    pub async fn destroy_provisioner_started(&self, name: &str) -> bool {
        if !self.is_external() {
            return self.tries(name) >= 1;
        }
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), &self.ns);
        let lp = ListParams::default().labels(&format!(
            "{}={name},{}={}",
            names::LABEL_OWNER_NAME,
            names::LABEL_OPERATION,
            names::OPERATION_DESTROY
        ));
        let Ok(list) = pods.list(&lp).await else {
            return false;
        };
        for pod in list.items {
            if let Ok(log) = pods.logs(&pod.name_any(), &Default::default()).await
                && log.contains("local-exec")
            {
                return true;
            }
        }
        false
    }
}

impl Env {
    /// Loses a state Secret for real: strips its finalizers and deletes it until it is gone
    /// (the manager may put its protection finalizer back in between).
    pub async fn lose_secret(&self, name: &str) {
        wait_for("the Secret to be gone", long(), || async {
            let strip = Patch::Merge(json!({"metadata": {"finalizers": null}}));
            let _ = self
                .secrets()
                .patch(name, &PatchParams::default(), &strip)
                .await;
            let _ = self.secrets().delete(name, &DeleteParams::default()).await;
            !self.secret_exists(name).await
        })
        .await;
    }
}

impl Env {
    /// Starts the manager applying live objects (`provision` on), then makes a Cluster
    /// `prod`, ready, and a TerraformMachine `name` of `module_body` that the manager
    /// applies ([`Env::provision`]); for a scenario that sets something up (a fault of
    /// the local kubelet) before the machine.
    pub async fn add_machine(&mut self, name: &str, module_body: &str) {
        if self.manager.is_none() {
            self.config.provision = true;
            self.start_manager();
        }
        self.create_cluster("prod").await;
        self.mark_cluster_ready("prod").await;
        self.provision::<TerraformMachine>(name, "prod", module_body)
            .await;
    }

    /// Waits until the manager has put its finalizer on the object.
    pub async fn wait_finalizer<K: TerraformObject>(&self, name: &str) {
        wait_for("the finalizer", long(), || async {
            self.object::<K>(name)
                .await
                .is_some_and(|o| o.meta().finalizers.is_some())
        })
        .await;
    }

    /// Waits until a Secret carries the protection finalizer.
    pub async fn wait_protected(&self, secret: &str) {
        wait_for("the protection finalizer", long(), || async {
            self.secrets()
                .get_opt(secret)
                .await
                .ok()
                .flatten()
                .is_some_and(|s| {
                    s.metadata
                        .finalizers
                        .unwrap_or_default()
                        .contains(&names::PROTECT_FINALIZER.to_string())
                })
        })
        .await;
    }
}

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
