//! What every pass shares: the manager's settings, the clients, the recorder, the
//! metrics, and what the manager remembers between passes (releases, refusals, backups,
//! the state-read permits); and Cluster API's Cluster kind as discovered.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::core::v1::ServiceAccount;
use kube::Client;
use kube::api::ApiResource;
use kube::core::PartialObjectMeta;
use kube::runtime::events::{Recorder, Reporter};
use kube::runtime::reflector::Store;

use super::Caches;
use super::caches::{KeptInputs, KeptStates};
use crate::api::names::{self, Kind};
use crate::gather::Settings;
use crate::job::Templates;
use crate::metrics::Metrics;
use crate::state::permits::StateReads;

/// The manager's settings (SPEC section 10).
#[derive(Clone, Debug)]
pub struct ManagerConfig {
    pub namespace: Option<String>,
    pub watch_filter: Option<String>,
    pub concurrency: u16,
    pub settings: Settings,
    pub templates_dir: Option<PathBuf>,
    /// Whether runner Pods get the state proxy (`--state-proxy`), and its image
    /// (`--state-proxy-image`; `None`: the manager's own, read from its Pod).
    pub state_proxy: bool,
    pub state_proxy_image: Option<String>,
    pub leader_elect: bool,
    pub metrics_addr: Option<SocketAddr>,
    /// `/metrics` over HTTPS to callers the API server authenticates and allows (see
    /// [`super::metrics_auth`]); plain HTTP to anyone otherwise. `captf manager` turns it
    /// on by default; the tests' in-process managers keep it off.
    pub metrics_secure: bool,
    /// `tls.crt` and `tls.key` for the secure metrics port; a self-signed certificate is
    /// made when none is given.
    pub metrics_cert_dir: Option<PathBuf>,
    pub health_addr: Option<SocketAddr>,
    /// Where the leader Lease and abandoned copies live.
    pub manager_namespace: String,
    /// This replica's identity for leader election and Events.
    pub identity: String,
    pub rbac_sweep_every: Duration,
    /// How often the manager looks for Cluster API's Cluster kind while it is unknown.
    pub rediscover_every: Duration,
    pub lease_duration: Duration,
    /// How many passes may hold a state read at once (see [`Context::state_reads`]).
    pub max_state_reads: usize,
    /// How long a pass may wait for a state-read permit before the health probe fails.
    pub state_read_starved_after: Duration,
    /// How long a controller with objects may go without finishing a pass, or one pass
    /// may run, before the health probe fails (see [`super::server::Probes`]).
    pub stalled_after: Duration,
    /// Whether `/metrics` has one `captf_object_info` series per object.
    pub metrics_object_info: bool,
    /// Whether live objects are applied (the apply table); off, the manager only deletes
    /// (what was applied by someone else, as the deletion tests and benchmarks do).
    pub provision: bool,
    /// The retention of a disposal mark without one of its own.
    pub disposal_retention: Duration,
    /// How long the passes under way at a shutdown may go on before they are dropped
    /// where they are (see [`super::run`]). Zero (the default) drops them at once, as a
    /// crash would: the tests stop and restart managers that way after any write.
    /// `captf manager` gives them [`crate::cli::SHUTDOWN_GRACE`].
    pub shutdown_grace: Duration,
    /// Whether a Cluster's workload cluster is cleaned up before its infrastructure goes,
    /// when the Cluster does not say (see [`super::workload`]).
    pub workload_cleanup: bool,
    /// How long a workload cleanup may fail (its cluster unreachable, its requests
    /// refused) before it gives up and lets the Machines go.
    pub workload_cleanup_give_up_after: Duration,
}

impl Default for ManagerConfig {
    fn default() -> Self {
        ManagerConfig {
            namespace: None,
            watch_filter: None,
            concurrency: 4,
            settings: Settings::default(),
            templates_dir: None,
            state_proxy: false,
            state_proxy_image: None,
            leader_elect: false,
            metrics_addr: None,
            metrics_secure: false,
            metrics_cert_dir: None,
            health_addr: None,
            manager_namespace: "captf-system".into(),
            identity: "captf-manager".into(),
            rbac_sweep_every: Duration::from_secs(300),
            rediscover_every: Duration::from_secs(30),
            lease_duration: Duration::from_secs(15),
            max_state_reads: 4,
            state_read_starved_after: Duration::from_secs(600),
            stalled_after: super::server::STALLED_AFTER,
            metrics_object_info: false,
            provision: true,
            disposal_retention: crate::rules::disposal::DEFAULT_RETENTION,
            shutdown_grace: Duration::ZERO,
            workload_cleanup: false,
            workload_cleanup_give_up_after: Duration::from_secs(600),
        }
    }
}

/// What every reconcile shares.
pub struct Context {
    pub client: Client,
    pub settings: Settings,
    /// [`ManagerConfig::provision`].
    pub provision: bool,
    /// [`ManagerConfig::disposal_retention`].
    pub disposal_retention: Duration,
    pub templates: Templates,
    pub recorder: Recorder,
    pub metrics: Arc<Metrics>,
    pub manager_namespace: String,
    pub watch_namespace: Option<String>,
    /// The `cluster.x-k8s.io` Cluster resource served by the API server, if any.
    pub cluster_api: ClusterKind,
    /// Namespaces where the runner RBAC is known to exist.
    pub rbac_ready: Mutex<BTreeSet<String>>,
    /// Held while the runner RBAC is being created.
    pub rbac_creating: tokio::sync::Mutex<()>,
    /// Objects this manager released.
    pub released: Released,
    /// The API's refusal of the latest try to start an attempt, by object uid, until an
    /// attempt starts: shown in place of "attempt N is starting" while it lasts.
    pub refused: Mutex<HashMap<String, String>>,
    /// The lineage and serial each object's backup was last seen or written to hold, by
    /// uid: a pass that reads the same state again need not look at the backup.
    pub backups: Mutex<HashMap<String, (String, u64)>>,
    /// The most part Secrets a backup this process wrote had, by object uid: a backup
    /// written after a longer one of this process's reads what parts are left past its
    /// own, since the cache of Secrets may not show the longer one's yet.
    pub backup_parts: Mutex<HashMap<String, usize>>,
    /// The `machine_inputs` output of each TerraformCluster (by `namespace/name`), with the
    /// resourceVersion of the state Secret it was read from: the cluster's machines and
    /// pools are given it, and its state is read again only once it changed.
    pub handoffs: Mutex<HashMap<String, (String, serde_json::Value)>>,
    /// The inputs Secrets the manager read or wrote, kept while the cache shows the
    /// version kept ([`KeptInputs`]): a provisioned machine's recorded values and a
    /// deletion's preview come from them.
    pub kept_inputs: KeptInputs,
    /// The state each record of an apply's end read, kept for the deletion preview of the
    /// pass after it ([`KeptStates`]).
    pub kept_states: KeptStates,
    /// A permit per state a pass may hold in memory at once: taken before a pass reads the
    /// state Secrets, kept until the pass ends (its backup and abandon copies are written
    /// from what it read). This bounds the manager's memory whatever the states' sizes.
    /// One is kept for the pass after a Job ([`StateReads`]).
    pub state_reads: Arc<StateReads>,
    /// Each controller's caches, by kind (empty for passes a test runs without them: those
    /// read the API server).
    caches: Mutex<BTreeMap<Kind, Arc<Caches>>>,
    /// What each live object's `DeletionReady` was last decided from (see
    /// [`super::preview`]).
    pub previews: super::preview::Previews,
    /// The TerraformClusters counted in `captf_clusters_in_disposal`.
    pub disposals: super::disposal::Counted,
    /// The health probes, which count the passes (none for passes a test runs itself).
    pub probes: Option<Arc<super::server::Probes>>,
    /// The runner ServiceAccounts the manager made, when watched (see [`super::rbac`]).
    pub runner_accounts: std::sync::OnceLock<Store<PartialObjectMeta<ServiceAccount>>>,
    /// Terraform's lock Leases, when watched (see [`super::caches::terraform_locks`]).
    pub locks: std::sync::OnceLock<Store<k8s_openapi::api::coordination::v1::Lease>>,
}

impl Context {
    /// The context of the passes, as `run` makes it (a test can run passes itself).
    pub fn new(
        client: Client,
        cfg: &ManagerConfig,
        templates: Templates,
        metrics: Arc<Metrics>,
        cluster_api: ClusterKind,
    ) -> Context {
        Context {
            client: client.clone(),
            settings: cfg.settings,
            provision: cfg.provision,
            disposal_retention: cfg.disposal_retention,
            templates,
            recorder: Recorder::new(
                client,
                Reporter {
                    controller: "captf-manager".into(),
                    instance: Some(cfg.identity.clone()),
                },
            ),
            metrics,
            manager_namespace: cfg.manager_namespace.clone(),
            watch_namespace: cfg.namespace.clone(),
            cluster_api,
            rbac_ready: Mutex::new(BTreeSet::new()),
            rbac_creating: tokio::sync::Mutex::new(()),
            released: Released::default(),
            refused: Mutex::default(),
            backups: Mutex::default(),
            backup_parts: Mutex::default(),
            handoffs: Mutex::default(),
            kept_inputs: KeptInputs::default(),
            kept_states: KeptStates::default(),
            state_reads: Arc::new(StateReads::new(cfg.max_state_reads)),
            caches: Mutex::default(),
            previews: Default::default(),
            disposals: Default::default(),
            runner_accounts: std::sync::OnceLock::new(),
            locks: std::sync::OnceLock::new(),
            probes: None,
        }
    }

    /// The context with the health probes' permits and pass counts (see
    /// [`super::server::Probes`]).
    pub fn with_probes(mut self, probes: Arc<super::server::Probes>) -> Context {
        self.state_reads = probes.state_reads();
        self.probes = Some(probes);
        self
    }

    /// What object `uid`'s backup holds, as last seen or written.
    pub fn backed_up(&self, uid: &str) -> Option<(String, u64)> {
        self.backups
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(uid)
            .cloned()
    }

    pub fn set_backed_up(&self, uid: &str, lineage: &str, serial: u64) {
        self.backups
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(uid.to_string(), (lineage.to_string(), serial));
    }

    /// The most part Secrets a backup of object `uid` this process wrote (or began to
    /// write) had: 0 when none.
    pub fn backup_parts_written(&self, uid: &str) -> usize {
        self.backup_parts
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(uid)
            .copied()
            .unwrap_or_default()
    }

    /// Notes that a backup of object `uid` with `parts` part Secrets is being written
    /// (before the write: one interrupted half-way may have left them).
    pub fn note_backup_parts(&self, uid: &str, parts: usize) {
        let mut written = self.backup_parts.lock().unwrap_or_else(|e| e.into_inner());
        let most = written.entry(uid.to_string()).or_default();
        *most = (*most).max(parts);
    }

    pub fn register_caches(&self, kind: Kind, caches: Arc<Caches>) {
        self.caches
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(kind, caches);
    }

    /// The caches of kind `kind`'s controller, when it runs.
    pub fn caches(&self, kind: Kind) -> Option<Arc<Caches>> {
        self.caches
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&kind)
            .cloned()
    }

    /// The caches of all three controllers, when all run.
    pub fn all_caches(&self) -> Option<Vec<Arc<Caches>>> {
        let map = self.caches.lock().unwrap_or_else(|e| e.into_inner());
        Kind::ALL.iter().map(|k| map.get(k).cloned()).collect()
    }

    fn refusals(&self) -> std::sync::MutexGuard<'_, HashMap<String, String>> {
        self.refused.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The API's refusal of the latest try to start an attempt of object `uid`, if any.
    pub fn refusal(&self, uid: &str) -> Option<String> {
        self.refusals().get(uid).cloned()
    }

    /// Remembers a refusal; true when it is new (not the one already shown).
    pub fn set_refusal(&self, uid: &str, why: &str) -> bool {
        self.refusals()
            .insert(uid.to_string(), why.to_string())
            .as_deref()
            != Some(why)
    }

    pub fn clear_refusal(&self, uid: &str) {
        self.refusals().remove(uid);
    }

    /// Forgets what the manager remembers of an object it released: its refusal, its
    /// inputs Secret and state kept, what its backup held and, for a TerraformCluster, its hand-off. A released object never needs
    /// them again, and kept they would grow with every object a fleet ever deleted, for
    /// the life of the process.
    pub fn forget(&self, kind: Kind, namespace: &str, name: &str, uid: &str) {
        self.clear_refusal(uid);
        self.kept_inputs.forget(uid);
        self.kept_states.forget(uid);
        self.backups
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(uid);
        self.backup_parts
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(uid);
        if kind == Kind::TerraformCluster {
            self.handoffs
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .remove(&format!("{namespace}/{name}"));
        }
    }
}

/// The uids of the objects this manager released (removed its finalizer from), for ten
/// minutes. A pass can start from a cached copy that is older than the release: the
/// release's own writes trigger the object again, and the cache may not have seen them yet
/// when that pass starts. Such a pass would decide on a copy without the cleanup marker
/// while the Secrets are already gone (and hold the object as `StateLost`, with a Warning
/// Event), or redo the cleanup. A released object never needs a pass again: no finalizer
/// can be added to an object being deleted.
#[derive(Default)]
pub struct Released(Mutex<std::collections::HashMap<String, std::time::Instant>>);

impl Released {
    const KEEP: Duration = Duration::from_secs(600);

    pub fn insert(&self, uid: &str) {
        let now = std::time::Instant::now();
        let mut map = self.0.lock().unwrap_or_else(|e| e.into_inner());
        map.retain(|_, at| now.duration_since(*at) < Self::KEEP);
        map.insert(uid.to_string(), now);
    }

    pub fn contains(&self, uid: &str) -> bool {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .contains_key(uid)
    }
}

/// Cluster API's Cluster kind as the manager knows it.
#[derive(Clone, Debug)]
pub enum ClusterKind {
    /// Served, at this version.
    Known(ApiResource),
    /// Not served, or its discovery failed: why, for the Paused message.
    Unknown(String),
}

impl ClusterKind {
    pub fn resource(&self) -> Option<&ApiResource> {
        match self {
            ClusterKind::Known(ar) => Some(ar),
            ClusterKind::Unknown(_) => None,
        }
    }
}

/// Finds the served version of the CAPI Cluster (any version of the group).
pub async fn discover_cluster(client: &Client) -> ClusterKind {
    let discovery = match kube::discovery::Discovery::new(client.clone())
        .filter(&[names::CAPI_GROUP])
        .run()
        .await
    {
        Ok(d) => d,
        Err(e) => {
            return ClusterKind::Unknown(format!(
                "the discovery of {} failed ({e}); the manager tries again",
                names::CAPI_GROUP
            ));
        }
    };
    for group in discovery.groups() {
        for (ar, _) in group.recommended_resources() {
            if ar.kind == "Cluster" {
                return ClusterKind::Known(ar);
            }
        }
    }
    ClusterKind::Unknown(format!(
        "the API server serves no Cluster kind in {} (is Cluster API installed?); the manager looks again",
        names::CAPI_GROUP
    ))
}

/// Cluster API's `kind` (`Machine`, `MachinePool`) in the group and version of its
/// Cluster kind `cluster`.
pub fn owner_resource(cluster: &kube::api::ApiResource, kind: &str) -> kube::api::ApiResource {
    kube::api::ApiResource {
        kind: kind.to_string(),
        plural: format!("{}s", kind.to_lowercase()),
        ..cluster.clone()
    }
}
