//! `captf manager`: one controller per kind, all running the same generic reconcile.
//! Each watches its kind, its Jobs and Pods (by owner labels: Jobs carry no
//! ownerReference), the metadata of its Secrets, the owning Clusters, its CRD, and for
//! TerraformClusters the machines and pools.

pub mod leader;
pub mod observe;
pub mod rbac;
pub mod reconcile;
pub mod server;
pub mod writes;

use std::collections::{BTreeSet, HashMap};
use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Pod, Secret};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, ApiResource, DynamicObject};
use kube::core::PartialObjectMeta;
use kube::runtime::controller::{Action as Requeue, Config as ControllerConfig, Controller};
use kube::runtime::events::{Recorder, Reporter};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::watcher;
use kube::{Client, Resource, ResourceExt};
use tracing::{info, warn};

use crate::api::names::{self, Kind};
use crate::api::{TerraformCluster, TerraformMachine, TerraformMachinePool, TerraformObject};
use crate::facts::{self, Settings};
use crate::job::Templates;
use crate::metrics::Metrics;

/// Failures to talk to the API server (expected outcomes are data, not errors).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("Kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    /// A guarded write (JSON patch with a `test` of the resourceVersion) that did not
    /// apply to the object as it is now: the pass acted on a copy older than the object.
    #[error("{0} changed since this pass read it; the next pass decides again")]
    Stale(String),
    #[error("{0}")]
    Setup(String),
}

impl Error {
    /// A write made from a stale view (409 Conflict, or a guarded patch that did not
    /// apply): the next pass decides again on fresh facts.
    pub fn is_conflict(&self) -> bool {
        match self {
            Error::Kube(kube::Error::Api(s)) => s.code == 409,
            Error::Stale(_) => true,
            _ => false,
        }
    }

    /// The API server refused the request as it is (an admission policy or webhook, a
    /// quota, a missing permission, an invalid object): trying again the same way fails
    /// again until someone changes something. The API's message.
    pub fn refusal(&self) -> Option<String> {
        match self {
            Error::Kube(kube::Error::Api(s)) if matches!(s.code, 400 | 403 | 422) => {
                Some(s.message.clone())
            }
            _ => None,
        }
    }

    pub fn is_not_found(&self) -> bool {
        matches!(self, Error::Kube(kube::Error::Api(s)) if s.code == 404)
    }

    /// A short label for metrics and logs.
    pub fn label(&self) -> String {
        match self {
            Error::Kube(kube::Error::Api(s)) => format!("api_{}", s.code),
            Error::Kube(_) => "api_transport".into(),
            Error::Stale(_) => "stale".into(),
            Error::Setup(_) => "setup".into(),
        }
    }
}

/// The manager's settings (SPEC section 10).
#[derive(Clone, Debug)]
pub struct ManagerConfig {
    pub namespace: Option<String>,
    pub watch_filter: Option<String>,
    pub concurrency: u16,
    pub settings: Settings,
    pub templates_dir: Option<PathBuf>,
    pub leader_elect: bool,
    pub metrics_addr: Option<SocketAddr>,
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
}

impl Default for ManagerConfig {
    fn default() -> Self {
        ManagerConfig {
            namespace: None,
            watch_filter: None,
            concurrency: 4,
            settings: Settings::default(),
            templates_dir: None,
            leader_elect: false,
            metrics_addr: None,
            health_addr: None,
            manager_namespace: "captf-system".into(),
            identity: "captf-manager".into(),
            rbac_sweep_every: Duration::from_secs(300),
            rediscover_every: Duration::from_secs(30),
            lease_duration: Duration::from_secs(15),
            max_state_reads: 4,
        }
    }
}

/// What every reconcile shares.
pub struct Context {
    pub client: Client,
    pub settings: Settings,
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
    /// A permit per state a pass may hold in memory at once: taken before a pass reads the
    /// state Secrets, kept until the pass ends (its backup and abandon copies are written
    /// from what it read). This bounds the manager's memory whatever the states' sizes.
    pub state_reads: Arc<tokio::sync::Semaphore>,
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
            state_reads: Arc::new(tokio::sync::Semaphore::new(cfg.max_state_reads.max(1))),
        }
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

fn scoped<T>(client: &Client, ns: &Option<String>) -> Api<T>
where
    T: Resource<DynamicType = ()> + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
    T: Resource<Scope = k8s_openapi::NamespaceResourceScope>,
{
    match ns {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    }
}

/// The object a Job, Pod or Secret belongs to, from its owner labels. The name label of
/// a name longer than a label value is cut and hashed, so the uid label is looked up in the
/// store first.
fn owner_of<K: TerraformObject>(
    store: &Store<K>,
    meta: &kube::api::ObjectMeta,
) -> Option<ObjectRef<K>> {
    if let Some(obj) = cached_owner(store, meta) {
        return Some(ObjectRef::from_obj(obj.as_ref()));
    }
    let labels = meta.labels.as_ref()?;
    if labels.get(names::LABEL_OWNER_KIND).map(String::as_str) != Some(K::KIND.as_str()) {
        return None;
    }
    let name = labels.get(names::LABEL_OWNER_NAME)?;
    Some(ObjectRef::new(name).within(meta.namespace.as_deref().unwrap_or_default()))
}

/// The cached object of kind `K` whose uid the owner labels of `meta` carry.
fn cached_owner<K: TerraformObject>(
    store: &Store<K>,
    meta: &kube::api::ObjectMeta,
) -> Option<Arc<K>> {
    let labels = meta.labels.as_ref()?;
    if labels.get(names::LABEL_OWNER_KIND).map(String::as_str) != Some(K::KIND.as_str()) {
        return None;
    }
    let uid = labels.get(names::LABEL_OWNER_UID)?;
    store
        .state()
        .into_iter()
        .find(|o| o.meta().uid.as_ref() == Some(uid))
}

/// The object a state Secret belongs to, from Terraform's suffix label.
fn state_owner<K: TerraformObject>(
    store: &Store<K>,
    meta: &kube::api::ObjectMeta,
) -> Option<ObjectRef<K>> {
    if let Some(r) = owner_of::<K>(store, meta) {
        return Some(r);
    }
    let suffix = meta.labels.as_ref()?.get(names::TF_LABEL_SUFFIX)?;
    let name = suffix.strip_suffix(&format!(".{}", K::KIND.short_name()))?;
    Some(ObjectRef::new(name).within(meta.namespace.as_deref().unwrap_or_default()))
}

fn objects_of_cluster<K: TerraformObject>(
    store: &Store<K>,
    ns: &str,
    cluster: &str,
) -> Vec<ObjectRef<K>> {
    store
        .state()
        .iter()
        .filter(|o| {
            o.namespace().as_deref() == Some(ns)
                && facts::owning_cluster(o.meta()).as_deref() == Some(cluster)
        })
        .map(|o| ObjectRef::from_obj(o.as_ref()))
        .collect()
}

fn error_policy<K: TerraformObject>(obj: Arc<K>, err: &Error, ctx: Arc<Context>) -> Requeue {
    if err.is_conflict() {
        tracing::debug!(kind = %K::KIND, name = %obj.name_any(), "the object changed under this pass; deciding again");
        return Requeue::requeue(Duration::from_millis(20));
    }
    warn!(kind = %K::KIND, name = %obj.name_any(), namespace = obj.namespace().unwrap_or_default(), error = %err, "reconcile failed; retrying");
    ctx.metrics
        .reconcile_errors
        .inc(&[K::KIND.as_str(), &err.label()]);
    Requeue::requeue(
        ctx.settings
            .backoff
            .base
            .clamp(Duration::from_millis(50), Duration::from_secs(5)),
    )
}

/// The pass limit of one kind: at most `concurrency` passes at once in each of two lanes,
/// first come, first served in each.
///
/// kube-runtime's own limit (`Config::concurrency`) keeps the triggers it cannot run yet in
/// a hash set and takes whichever it finds first: while triggers keep coming, one object
/// can wait for minutes behind others triggered after it (158 s after its Job completed in
/// the scale bench). So its limit is off, every triggered pass starts at once and waits
/// here on a fair (FIFO) semaphore, then takes the newest copy of the object from the
/// cache, since the one it was handed may have aged while it waited.
///
/// The pass after a destroy or apply Job of the object has finished goes through a lane of
/// its own: it is the one that records a failure or cleans up and releases, and it would
/// otherwise wait behind every other pass triggered before it (after a mass deletion, the
/// passes that start the other destroys). Such passes come at most once per finished Job.
/// A pass already waiting in the first lane when the Job finishes moves to the other.
pub(crate) struct Gate<K: Resource + Clone + 'static>
where
    K::DynamicType: Eq + std::hash::Hash + Clone,
{
    lane: Option<Arc<tokio::sync::Semaphore>>,
    after_job: Option<Arc<tokio::sync::Semaphore>>,
    /// uids of objects whose Job was seen finished since their last pass began.
    job_finished: Mutex<BTreeSet<String>>,
    /// Wakes the waiting passes when a uid is added to `job_finished`.
    marked: tokio::sync::Notify,
    store: Store<K>,
}

impl<K: Resource + Clone + 'static> Gate<K>
where
    K::DynamicType: Eq + std::hash::Hash + Clone + Default,
{
    /// `concurrency` 0: no limit.
    pub(crate) fn new(concurrency: u16, store: Store<K>) -> Self {
        let semaphore =
            || (concurrency > 0).then(|| Arc::new(tokio::sync::Semaphore::new(concurrency.into())));
        Gate {
            lane: semaphore(),
            after_job: semaphore(),
            job_finished: Mutex::new(BTreeSet::new()),
            marked: tokio::sync::Notify::new(),
            store,
        }
    }

    /// The controller configuration that goes with the gate: kube-runtime's limit off.
    pub(crate) fn controller_config() -> ControllerConfig {
        ControllerConfig::default().concurrency(0)
    }

    /// A Job of the object `owner_uid` was seen finished: its next pass takes the other lane.
    pub(crate) fn job_finished(&self, owner_uid: &str) {
        self.job_finished
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(owner_uid.to_string());
        self.marked.notify_waiters();
    }

    fn take_mark(&self, uid: Option<&String>) -> bool {
        uid.is_some_and(|uid| {
            self.job_finished
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .remove(uid)
        })
    }

    /// A permit of the first lane, in its order, unless a Job of the object is seen
    /// finished meanwhile: then one of the other lane. `None` without a limit.
    async fn permit(
        &self,
        uid: Option<&String>,
    ) -> (Option<tokio::sync::OwnedSemaphorePermit>, bool) {
        let (Some(lane), Some(after_job)) = (&self.lane, &self.after_job) else {
            return (None, self.take_mark(uid));
        };
        let in_lane = lane.clone().acquire_owned();
        tokio::pin!(in_lane);
        loop {
            let marked = self.marked.notified();
            tokio::pin!(marked);
            marked.as_mut().enable();
            if self.take_mark(uid) {
                return (after_job.clone().acquire_owned().await.ok(), true);
            }
            tokio::select! {
                // Never closed; were it, the pass would run ungated rather than not at all.
                p = &mut in_lane => return (p.ok(), false),
                _ = marked => {}
            }
        }
    }

    /// Runs `pass` on the newest cached copy of `obj` once its lane has room, in the order
    /// the passes came; an object gone from the cache meanwhile needs no pass.
    pub(crate) async fn run<F, Fut, E>(&self, obj: Arc<K>, pass: F) -> Result<Requeue, E>
    where
        F: FnOnce(Arc<K>) -> Fut,
        Fut: Future<Output = Result<Requeue, E>>,
    {
        let (_permit, after_job) = self.permit(obj.meta().uid.as_ref()).await;
        if after_job {
            tracing::debug!(
                name = obj.meta().name.as_deref().unwrap_or_default(),
                "a Job of the object finished: its pass takes the second lane"
            );
        }
        let result = match self.store.get(&ObjectRef::from_obj(obj.as_ref())) {
            Some(current) => pass(current).await,
            None => Ok(Requeue::await_change()),
        };
        // The pass after a Job failed (a conflict, an API error): its retry keeps the lane,
        // or it would wait behind every pass triggered meanwhile.
        if after_job
            && result.is_err()
            && let Some(uid) = obj.meta().uid.as_deref()
        {
            self.job_finished(uid);
        }
        result
    }
}

/// Whether a Job has finished (its `Complete` or `Failed` condition is true).
fn job_finished(job: &Job) -> bool {
    job.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| {
            cs.iter()
                .any(|c| (c.type_ == "Complete" || c.type_ == "Failed") && c.status == "True")
        })
}

/// One controller for kind `K`.
fn controller<K: TerraformObject>(
    ctx: Arc<Context>,
    cfg: &ManagerConfig,
) -> impl Future<Output = ()> + Send + 'static
where
    K::DynamicType: Default,
{
    let client = ctx.client.clone();
    let ns = cfg.namespace.clone();
    let mut main_cfg = watcher::Config::default().any_semantic();
    if let Some(f) = &cfg.watch_filter {
        main_cfg = main_cfg.labels(&format!("{}={f}", names::CAPI_WATCH_FILTER_LABEL));
    }
    let owned = watcher::Config::default().labels(&format!(
        "{}={}",
        names::LABEL_OWNER_KIND,
        K::KIND.as_str()
    ));
    let c = Controller::new(scoped::<K>(&client, &ns), main_cfg);
    let store = c.store();
    let gate = Arc::new(Gate::new(cfg.concurrency, store.clone()));
    let mut c = c
        .with_config(Gate::<K>::controller_config())
        .watches(scoped::<Job>(&client, &ns), owned.clone(), {
            let store = store.clone();
            let gate = gate.clone();
            move |j: Job| {
                // Marked only for a cached object, which gets the pass that takes the mark.
                if job_finished(&j)
                    && let Some(uid) =
                        cached_owner::<K>(&store, &j.metadata).and_then(|o| o.meta().uid.clone())
                {
                    gate.job_finished(&uid);
                }
                owner_of::<K>(&store, &j.metadata)
            }
        })
        .watches(scoped::<Pod>(&client, &ns), owned.clone(), {
            let store = store.clone();
            move |p: Pod| owner_of::<K>(&store, &p.metadata)
        })
        // Secrets by metadata only: state Secrets can be megabytes.
        .watches(scoped::<PartialObjectMeta<Secret>>(&client, &ns), owned, {
            let store = store.clone();
            move |s: PartialObjectMeta<Secret>| owner_of::<K>(&store, &s.metadata)
        })
        .watches(
            scoped::<PartialObjectMeta<Secret>>(&client, &ns),
            watcher::Config::default().labels(&format!("{}=true", names::TF_LABEL_STATE)),
            {
                let store = store.clone();
                move |s: PartialObjectMeta<Secret>| state_owner::<K>(&store, &s.metadata)
            },
        );
    let crd_store = store.clone();
    c = c.watches(
        Api::<CustomResourceDefinition>::all(client.clone()),
        watcher::Config::default().fields(&format!("metadata.name={}", K::KIND.crd_name())),
        move |_crd| {
            crd_store
                .state()
                .iter()
                .map(|o| ObjectRef::from_obj(o.as_ref()))
                .collect::<Vec<_>>()
        },
    );
    if let Some(ar) = ctx.cluster_api.resource().cloned() {
        let cluster_store = store.clone();
        let api: Api<DynamicObject> = match &ns {
            Some(n) => Api::namespaced_with(client.clone(), n, &ar),
            None => Api::all_with(client.clone(), &ar),
        };
        c = c.watches_with(
            api,
            ar,
            watcher::Config::default(),
            move |cl: DynamicObject| {
                objects_of_cluster(
                    &cluster_store,
                    &cl.namespace().unwrap_or_default(),
                    &cl.name_any(),
                )
            },
        );
    }
    if K::KIND == Kind::TerraformCluster {
        let s1 = store.clone();
        let s2 = store.clone();
        c = c
            .watches(
                scoped::<TerraformMachine>(&client, &ns),
                watcher::Config::default(),
                move |m: TerraformMachine| match facts::owning_cluster(&m.metadata) {
                    Some(cl) => objects_of_cluster(&s1, &m.namespace().unwrap_or_default(), &cl),
                    None => Vec::new(),
                },
            )
            .watches(
                scoped::<TerraformMachinePool>(&client, &ns),
                watcher::Config::default(),
                move |p: TerraformMachinePool| match facts::owning_cluster(&p.metadata) {
                    Some(cl) => objects_of_cluster(&s2, &p.namespace().unwrap_or_default(), &cl),
                    None => Vec::new(),
                },
            );
    }
    c.run(
        move |obj, ctx| {
            let gate = gate.clone();
            async move { gate.run(obj, |o| reconcile::reconcile::<K>(o, ctx)).await }
        },
        error_policy::<K>,
        ctx,
    )
    .for_each(|_| futures::future::ready(()))
}

/// Runs the manager until `shutdown` resolves (or leadership is lost).
pub async fn run(
    client: Client,
    cfg: ManagerConfig,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), Error> {
    let templates = match &cfg.templates_dir {
        Some(dir) => Templates::load_dir(dir)
            .map_err(|e| Error::Setup(format!("--templates-dir {}: {e}", dir.display())))?,
        None => Templates::embedded(),
    };
    let metrics = Arc::new(Metrics::default());
    let ready = Arc::new(server::Ready::default());
    if let Some(addr) = cfg.health_addr {
        server::serve(addr, metrics.clone(), ready.clone())
            .await
            .map_err(|e| Error::Setup(format!("health probe address {addr}: {e}")))?;
    }
    if let Some(addr) = cfg.metrics_addr.filter(|a| Some(*a) != cfg.health_addr) {
        server::serve(addr, metrics.clone(), ready.clone())
            .await
            .map_err(|e| Error::Setup(format!("metrics address {addr}: {e}")))?;
    }
    let mut leadership = None;
    if cfg.leader_elect {
        let lc = leader::LeaderConfig {
            namespace: cfg.manager_namespace.clone(),
            name: "captf-manager-leader".into(),
            identity: cfg.identity.clone(),
            lease_duration: cfg.lease_duration,
            renew_deadline: cfg.lease_duration * 2 / 3,
            renew_every: cfg.lease_duration / 5,
        };
        leadership = Some(leader::lead(client.clone(), lc).await);
    }
    let mut cluster_api = discover_cluster(&client).await;
    let lost = async move {
        match leadership {
            Some(mut rx) => {
                while *rx.borrow() {
                    if rx.changed().await.is_err() {
                        break;
                    }
                }
                warn!("lost leadership: stopping");
            }
            None => futures::future::pending::<()>().await,
        }
    };
    tokio::pin!(shutdown);
    tokio::pin!(lost);
    let mut sweep = None;
    // The controllers run with the Cluster kind as known; while it is unknown, the manager
    // looks for it again and, once found, starts them again to watch Clusters.
    loop {
        if let ClusterKind::Unknown(why) = &cluster_api {
            warn!(%why, "Cluster API's Cluster kind is unknown: objects that name a Cluster are held as paused");
        }
        let ctx = Arc::new(Context::new(
            client.clone(),
            &cfg,
            templates.clone(),
            metrics.clone(),
            cluster_api.clone(),
        ));
        ready.0.store(true, std::sync::atomic::Ordering::Relaxed);
        info!(namespace = ?cfg.namespace, watch_filter = ?cfg.watch_filter, "CAPTF manager running");
        // The sweep shares the controllers' context (its record of the namespaces whose
        // runner RBAC exists), so it starts again with them.
        if let Some(old) = sweep.replace(tokio::spawn(rbac::sweep_forever(
            ctx.clone(),
            cfg.rbac_sweep_every,
        ))) {
            old.abort();
        }
        let unknown = matches!(cluster_api, ClusterKind::Unknown(_));
        let found = async {
            loop {
                tokio::time::sleep(cfg.rediscover_every).await;
                if let ClusterKind::Known(ar) = discover_cluster(&client).await {
                    return ClusterKind::Known(ar);
                }
            }
        };
        tokio::select! {
            _ = controller::<TerraformCluster>(ctx.clone(), &cfg) => break,
            _ = controller::<TerraformMachine>(ctx.clone(), &cfg) => break,
            _ = controller::<TerraformMachinePool>(ctx.clone(), &cfg) => break,
            _ = &mut shutdown => {
                info!("shutting down");
                break;
            }
            _ = &mut lost => break,
            known = found, if unknown => {
                info!("Cluster API's Cluster kind is served now: restarting the controllers to watch Clusters");
                cluster_api = known;
            }
        }
    }
    if let Some(sweep) = sweep {
        sweep.abort();
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::runtime::reflector;

    fn gate(concurrency: u16, objects: &[&str]) -> (Arc<Gate<ConfigMap>>, Vec<Arc<ConfigMap>>) {
        let (store, mut writer) = reflector::store::<ConfigMap>();
        let objs: Vec<Arc<ConfigMap>> = objects
            .iter()
            .map(|name| {
                let cm = ConfigMap {
                    metadata: kube::api::ObjectMeta {
                        name: Some(name.to_string()),
                        namespace: Some("ns".into()),
                        uid: Some(format!("uid-{name}")),
                        ..Default::default()
                    },
                    ..Default::default()
                };
                writer.apply_watcher_event(&watcher::Event::Apply(cm.clone()));
                Arc::new(cm)
            })
            .collect();
        (Arc::new(Gate::new(concurrency, store)), objs)
    }

    /// Starts a pass of `obj` through `gate` that records its name, then waits for `hold`.
    fn start(
        gate: &Arc<Gate<ConfigMap>>,
        obj: &Arc<ConfigMap>,
        order: &Arc<Mutex<Vec<String>>>,
        hold: Option<tokio::sync::oneshot::Receiver<()>>,
    ) -> tokio::task::JoinHandle<()> {
        let (gate, obj, order) = (gate.clone(), obj.clone(), order.clone());
        tokio::spawn(async move {
            let _ = gate
                .run(obj, |o| async move {
                    order.lock().unwrap().push(o.name_any());
                    if let Some(h) = hold {
                        let _ = h.await;
                    }
                    Ok::<_, Error>(Requeue::await_change())
                })
                .await;
        })
    }

    /// Let the spawned passes reach the gate.
    async fn settle() {
        for _ in 0..20 {
            tokio::task::yield_now().await;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    #[tokio::test]
    async fn passes_run_in_the_order_they_came() {
        let names: Vec<String> = (0..30).map(|i| format!("o-{i:02}")).collect();
        let refs: Vec<&str> = names.iter().map(String::as_str).collect();
        let (gate, objs) = gate(1, &refs);
        let order = Arc::new(Mutex::new(Vec::new()));
        let (release, hold) = tokio::sync::oneshot::channel();
        let mut tasks = vec![start(&gate, &objs[0], &order, Some(hold))];
        settle().await;
        for o in &objs[1..] {
            tasks.push(start(&gate, o, &order, None));
            settle().await;
        }
        release.send(()).unwrap();
        for t in tasks {
            t.await.unwrap();
        }
        assert_eq!(*order.lock().unwrap(), names);
    }

    #[tokio::test]
    async fn a_waiting_pass_whose_job_finished_takes_the_second_lane() {
        let (gate, objs) = gate(1, &["busy", "a", "b", "job-done"]);
        let order = Arc::new(Mutex::new(Vec::new()));
        let (release, hold) = tokio::sync::oneshot::channel();
        let busy = start(&gate, &objs[0], &order, Some(hold));
        settle().await;
        let waiting: Vec<_> = objs[1..]
            .iter()
            .map(|o| start(&gate, o, &order, None))
            .collect();
        settle().await;
        assert_eq!(*order.lock().unwrap(), ["busy"], "the first lane is full");
        gate.job_finished("uid-job-done");
        settle().await;
        assert_eq!(
            *order.lock().unwrap(),
            ["busy", "job-done"],
            "the pass after the Job ran while the first lane was still full"
        );
        release.send(()).unwrap();
        busy.await.unwrap();
        for t in waiting {
            t.await.unwrap();
        }
        assert_eq!(*order.lock().unwrap(), ["busy", "job-done", "a", "b"]);
    }

    #[tokio::test]
    async fn the_retry_of_a_failed_pass_after_a_job_keeps_the_second_lane() {
        let (gate, objs) = gate(1, &["busy", "a", "job-done"]);
        let order = Arc::new(Mutex::new(Vec::new()));
        let (release, hold) = tokio::sync::oneshot::channel();
        let busy = start(&gate, &objs[0], &order, Some(hold));
        settle().await;
        gate.job_finished("uid-job-done");
        let conflict = || {
            Error::Kube(kube::Error::Api(
                kube::core::Status::failure("the object has been modified", "Conflict")
                    .with_code(409)
                    .boxed(),
            ))
        };
        let failed = gate
            .run(objs[2].clone(), |_| async { Err::<Requeue, _>(conflict()) })
            .await;
        assert!(failed.is_err());
        let waiting = start(&gate, &objs[1], &order, None);
        settle().await;
        let retry = start(&gate, &objs[2], &order, None);
        settle().await;
        assert_eq!(
            *order.lock().unwrap(),
            ["busy", "job-done"],
            "the retry ran while the first lane was still full"
        );
        // A pass that succeeds leaves no mark behind: the next one waits its turn.
        let next = start(&gate, &objs[2], &order, None);
        settle().await;
        assert_eq!(*order.lock().unwrap(), ["busy", "job-done"]);
        release.send(()).unwrap();
        for t in [busy, waiting, retry, next] {
            t.await.unwrap();
        }
        assert_eq!(
            *order.lock().unwrap(),
            ["busy", "job-done", "a", "job-done"]
        );
    }

    #[tokio::test]
    async fn a_pass_of_an_object_gone_from_the_cache_does_not_run() {
        let (store, _writer) = reflector::store::<ConfigMap>();
        let gate: Gate<ConfigMap> = Gate::new(1, store);
        let gone = Arc::new(ConfigMap {
            metadata: kube::api::ObjectMeta {
                name: Some("gone".into()),
                namespace: Some("ns".into()),
                ..Default::default()
            },
            ..Default::default()
        });
        let ran = gate
            .run(gone, |_| async {
                Ok::<_, Error>(Requeue::requeue(RESYNC_FOR_TEST))
            })
            .await
            .unwrap();
        assert_eq!(ran, Requeue::await_change());
    }

    const RESYNC_FOR_TEST: Duration = Duration::from_secs(1);
}
