//! The manager's caches: one reflector per watched kind, each the same watch that triggers
//! the passes (the store is written before the trigger fires, so a pass that a change
//! triggered reads a store that holds it). A pass reads the Cluster, the CRD, the
//! Namespace, the object's Jobs, Pods and Secrets' metadata, its FailedCreate Events and,
//! for a TerraformCluster, its machines and pools from here, never from the API server,
//! and Terraform's lock Leases when the one watch of them ([`terraform_locks`], not a
//! trigger) holds them; the reads that stay live are named in `docs/decisions.md` (API
//! reads).
//!
//! Jobs and Pods are kept trimmed ([`trim_job`], [`trim_pod`]): what the facts read of
//! them (metadata, status, `suspend`, the containers' names and resources, the node), not
//! their templates, env or volumes.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, PoisonError, RwLock};

use futures::{Stream, StreamExt, TryStreamExt};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Event as CoreEvent, Namespace, Pod, Secret, ServiceAccount};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, ApiResource, DynamicObject};
use kube::core::PartialObjectMeta;
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, Resource, ResourceExt};

use crate::api::labels::{labelled_owner, name_label_value};
use crate::api::names::{self, Kind};
use crate::api::{TerraformMachine, TerraformMachinePool};

mod bootstrap;
mod budget;
mod by_label;
mod trim;
pub use bootstrap::{BOOTSTRAP_KEPT, BootstrapSecrets};
pub use by_label::ByLabel;
use trim::trim_meta;
pub use trim::{trim_event, trim_job, trim_pod, trim_to_owners};
mod inputs;
pub use inputs::{INPUTS_KEPT_BYTES, KeptInputs};
mod state;
pub use state::{KeptStates, STATES_KEPT_BYTES};

/// What one controller (one kind) reads from its watches.
#[derive(Clone)]
pub struct Caches {
    /// The kind's Jobs and Pods (by the owner-kind label), trimmed, and each by its
    /// owner's name label.
    pub jobs: Store<Job>,
    pub jobs_by_owner: ByLabel,
    pub pods: Store<Pod>,
    pub pods_by_owner: ByLabel,
    /// The metadata of the kind's Secrets (by the owner-kind label), by their owner's
    /// uid, their owner's name label and Terraform's suffix label.
    pub secrets: Store<PartialObjectMeta<Secret>>,
    pub secrets_by_uid: ByLabel,
    pub secrets_by_owner: ByLabel,
    pub secrets_by_suffix: ByLabel,
    /// The metadata of Terraform's state Secrets (by its state label) that lack the owner
    /// labels (the others are in `secrets`), by the suffix label.
    pub states: Store<PartialObjectMeta<Secret>>,
    pub states_by_suffix: ByLabel,
    /// The kind's CRD's metadata.
    pub crd: Store<PartialObjectMeta<CustomResourceDefinition>>,
    /// The watched namespace's (or every namespace's) metadata.
    pub namespaces: Store<PartialObjectMeta<Namespace>>,
    /// `FailedCreate` Events of Jobs.
    pub refusals: Store<CoreEvent>,
    /// The Clusters, while Cluster API's Cluster kind is known.
    pub clusters: Option<Store<DynamicObject>>,
    /// For the TerraformCluster controller: the machines and pools, unfiltered, each by
    /// Cluster API's cluster-name label (empty for the other controllers).
    pub machines: Option<Store<PartialObjectMeta<TerraformMachine>>>,
    pub pools: Option<Store<PartialObjectMeta<TerraformMachinePool>>>,
    pub machines_by_cluster: ByLabel,
    pub pools_by_cluster: ByLabel,
    /// For the machine and pool controllers, while Cluster API's kinds are known: the
    /// Machines or MachinePools (see [`reflect_owners`]).
    pub owners: Option<Store<DynamicObject>>,
    /// For the machine and pool controllers, while Cluster API's kinds are known: the
    /// bootstrap data Secrets passes read, while unchanged (see [`BootstrapSecrets`]).
    pub bootstrap: Option<Arc<BootstrapSecrets>>,
    /// How many objects of the kind the controller's own cache holds in a namespace.
    pub objects_in: Arc<dyn Fn(&str) -> usize + Send + Sync>,
    /// Whether the cached object (namespace, name) of the kind is provisioned; none when
    /// the cache does not hold it.
    pub provisioned: ProvisionedOf,
    /// The `TerraformClusterIdentity` the cached object (namespace, name) of the kind
    /// names (`Some(None)`: none); none when the cache does not hold it.
    pub identity_of: IdentityOf,
    /// Visits the metadata of every object of the kind in the controller's own cache.
    pub members: Members,
    /// Whether that cache holds every object of the kind (no `--watch-filter`).
    pub unfiltered: bool,
    /// Clusters a pass found paused when it read them from the API server while the
    /// `clusters` cache still said otherwise: `namespace/name` → the resourceVersion the
    /// cache held then (see [`Caches::note_pause_read_live`]).
    pub live_pauses: Arc<std::sync::Mutex<HashMap<String, String>>>,
    /// Terraform's lock Leases ([`terraform_locks`]), when the manager watches them.
    pub locks: Option<Store<Lease>>,
}

/// A visit of every cached object's metadata.
pub type Members = Arc<dyn Fn(&mut dyn FnMut(&kube::api::ObjectMeta)) + Send + Sync>;

/// Whether the cached object (namespace, name) is provisioned; none when not cached.
pub type ProvisionedOf = Arc<dyn Fn(&str, &str) -> Option<bool> + Send + Sync>;

/// The identity the cached object (namespace, name) names; none when not cached.
pub type IdentityOf = Arc<dyn Fn(&str, &str) -> Option<Option<String>> + Send + Sync>;

/// How long a pass waits for the caches' first lists before it fails, naming them.
pub const READY_WITHIN: std::time::Duration = std::time::Duration::from_secs(30);

/// Whether `store` had its first list (false when its watch is gone for good).
async fn ready<T>(store: &Store<T>) -> bool
where
    T: Resource + Clone + 'static,
    T::DynamicType: Eq + std::hash::Hash + Clone,
{
    store.wait_until_ready().await.is_ok()
}

/// A watch that fills a store: the stream to drive (the controller's trigger), and the
/// store it fills.
pub type Watched<T> = (
    Store<T>,
    futures::stream::BoxStream<'static, Result<T, watcher::Error>>,
);

/// A reflector over `api` with `cfg`, each object passed through `trim` before it is
/// stored and handed on, and `indexes` kept from the same events as the store.
pub fn reflect<T>(
    api: Api<T>,
    cfg: watcher::Config,
    trim: fn(&mut T),
    indexes: &[ByLabel],
) -> Watched<T>
where
    T: Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug + Send + Sync + 'static,
    T::DynamicType: Default + Eq + std::hash::Hash + Clone + Send + Sync,
{
    let (reader, writer) = reflector::store();
    let indexes = indexes.to_vec();
    let events = watcher(api, cfg)
        .default_backoff()
        .modify(trim)
        .inspect_ok(move |e| indexes.iter().for_each(|i| i.apply(e)));
    let stream = reflector::reflector(writer, events)
        .touched_objects()
        .inspect_err(|e| log_failure(std::any::type_name::<T>(), e))
        .boxed();
    (reader, stream)
}

/// A watch's failure, in the manager's log: the passes that need its cache wait for it
/// (see [`Caches::ready`]), and the usual cause is a permission the manager lacks.
fn log_failure(what: &str, e: &watcher::Error) {
    tracing::warn!(
        watch = what,
        error = %e,
        "a watch of the manager failed and is retried; passes wait for its cache (a missing permission? compare the manager's ClusterRole with config/rbac/role.yaml)"
    );
}

/// [`reflect`] for a kind of runtime-known type (the Cluster).
pub fn reflect_dynamic(
    api: Api<DynamicObject>,
    ar: ApiResource,
    cfg: watcher::Config,
) -> Watched<DynamicObject> {
    let writer = reflector::store::Writer::new(ar);
    let reader = writer.as_reader();
    let stream = reflector::reflector(writer, watcher(api, cfg).default_backoff())
        .touched_objects()
        .inspect_err(|e| log_failure("Cluster", e))
        .boxed();
    (reader, stream)
}

/// The Machines or MachinePools (Cluster API's `ar`) as a pass reads them: their
/// metadata without annotations or managed fields, and their spec (the bootstrap data
/// Secret, the infrastructure they name, the contract's values); their status is dropped.
/// The stream passes an object on only when what is kept of it changed.
pub fn reflect_owners(api: Api<DynamicObject>, ar: ApiResource) -> Watched<DynamicObject> {
    let writer = reflector::store::Writer::new(ar);
    let reader = writer.as_reader();
    let events = watcher(api, watcher::Config::default())
        .default_backoff()
        .modify(|o: &mut DynamicObject| {
            o.metadata.managed_fields = None;
            o.metadata.annotations = None;
            if let Some(data) = o.data.as_object_mut() {
                data.retain(|k, _| k == "spec");
            }
        });
    // A pass only when what a pass reads changes (the spec, the labels, a deletion), not at
    // each of Cluster API's status updates.
    let read = |o: &DynamicObject| {
        use std::hash::{Hash, Hasher};
        let mut h = std::collections::hash_map::DefaultHasher::new();
        o.metadata.labels.hash(&mut h);
        o.metadata.deletion_timestamp.is_some().hash(&mut h);
        o.data.to_string().hash(&mut h);
        Some(h.finish())
    };
    let stream = reflector::reflector(writer, events)
        .touched_objects()
        .predicate_filter(read, Default::default())
        .inspect_err(|e| log_failure("Machine or MachinePool", e))
        .boxed();
    (reader, stream)
}

/// [`reflect`] of the metadata only (an `Api` of `PartialObjectMeta` makes metadata-only
/// requests).
pub fn reflect_metadata<T>(
    api: Api<PartialObjectMeta<T>>,
    cfg: watcher::Config,
    indexes: &[ByLabel],
) -> Watched<PartialObjectMeta<T>>
where
    T: Clone + std::fmt::Debug + Send + Sync + 'static,
    PartialObjectMeta<T>: Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
    <PartialObjectMeta<T> as Resource>::DynamicType:
        Default + Eq + std::hash::Hash + Clone + Send + Sync,
{
    reflect(api, cfg, trim_meta::<T>, indexes)
}

/// Drives a stream nobody else drives (a store without a controller trigger).
pub fn drive<T: Send + 'static>(
    stream: impl Stream<Item = Result<T, watcher::Error>> + Send + 'static,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(stream.for_each(|_| futures::future::ready(())))
}

/// The watch of the runner ServiceAccounts (metadata) the manager made (the namespaces'
/// and the objects' own), for the RBAC sweep and for knowing that a namespace's runner
/// RBAC is still there.
pub fn runner_accounts(
    client: &Client,
    ns: &Option<String>,
) -> Watched<PartialObjectMeta<ServiceAccount>> {
    let api: Api<PartialObjectMeta<ServiceAccount>> = match ns {
        Some(n) => Api::namespaced(client.clone(), n),
        None => Api::all(client.clone()),
    };
    reflect_metadata(
        api,
        watcher::Config::default().labels(crate::controller::rbac::MANAGED_BY),
        &[],
    )
}

/// The watch of Terraform's lock Leases (by the labels its backend gives them, whoever
/// made them), kept without their managed fields: once it has listed, a pass takes an
/// object's lock (or its absence) from here; before, it reads the lock live. Whatever is
/// done to a lock is done only as it was read (a delete with its resourceVersion as
/// precondition), so a cached version behind the cluster's can delay, never break, a
/// lock; and Terraform takes no lock that is held, whatever the cache said.
pub fn terraform_locks(client: &Client, ns: &Option<String>) -> Watched<Lease> {
    let api: Api<Lease> = match ns {
        Some(n) => Api::namespaced(client.clone(), n),
        None => Api::all(client.clone()),
    };
    reflect(
        api,
        watcher::Config::default().labels(&crate::api::labels::terraform_lock_selector()),
        |l: &mut Lease| l.metadata.managed_fields = None,
        &[],
    )
}

/// Lease `ns/name` as `store` has it once it has listed (`Some(None)`: there is none);
/// `None` before.
fn listed_lock(store: &Store<Lease>, ns: &str, name: &str) -> Option<Option<Lease>> {
    use futures::FutureExt;
    if !matches!(store.wait_until_ready().now_or_never(), Some(Ok(()))) {
        return None;
    }
    Some(
        store
            .get(&reflector::ObjectRef::new(name).within(ns))
            .map(|l| l.as_ref().clone()),
    )
}

/// The namesakes' items of a store: those of kind `kind`, namespace `ns` and name `name`
/// (by the owner labels, as [`crate::api::labels::namesake_selector`] selects them),
/// looked up in `by_owner`, the store's index by the owner's name label.
pub fn namesakes<T: Resource + Clone>(
    store: &Store<T>,
    by_owner: &ByLabel,
    kind: Kind,
    ns: &str,
    name: &str,
) -> Vec<T>
where
    T::DynamicType: Default + Eq + std::hash::Hash + Clone,
{
    by_owner
        .get(store, &name_label_value(name))
        .into_iter()
        .filter(|i| {
            i.meta().namespace.as_deref() == Some(ns)
                && labelled_owner(i.meta().labels.as_ref()).is_some_and(|o| o.is_named(kind, name))
        })
        .map(|i| i.as_ref().clone())
        .collect()
}

/// Namespace and name of an item.
type Key = (String, String);

impl Caches {
    /// Records that the Cluster `ns/name` was read paused from the API server: until the
    /// cache holds a newer version of it, passes take it as paused (without this, every
    /// pass decided from the stale cache again, wrote `block-move`, read the pause and
    /// took `block-move` off, which started the next pass at once).
    pub fn note_pause_read_live(&self, ns: &str, name: &str, ar: &ApiResource) {
        let Some(store) = &self.clusters else { return };
        let cached = store
            .get(&reflector::ObjectRef::new_with(name, ar.clone()).within(ns))
            .and_then(|c| c.metadata.resource_version.clone())
            .unwrap_or_default();
        self.live_pauses
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(format!("{ns}/{name}"), cached);
    }

    /// Whether the cached Cluster `ns/name` at `resource_version` was read paused from the
    /// API server since (the cache has not caught up yet); forgets an older record.
    pub fn paused_read_live(&self, ns: &str, name: &str, resource_version: &str) -> bool {
        let mut pauses = self
            .live_pauses
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let key = format!("{ns}/{name}");
        match pauses.get(&key) {
            Some(rv) if rv == resource_version => true,
            Some(_) => {
                pauses.remove(&key);
                false
            }
            None => false,
        }
    }

    /// Waits until every store has had its first list (once, at the start; at once
    /// later), at most [`READY_WITHIN`]; the error names the caches still empty.
    pub async fn ready(&self) -> Result<(), String> {
        let mut waits: Vec<(&str, futures::future::BoxFuture<'_, bool>)> = vec![
            ("Jobs", Box::pin(ready(&self.jobs))),
            ("Pods", Box::pin(ready(&self.pods))),
            ("Secrets", Box::pin(ready(&self.secrets))),
            ("state Secrets", Box::pin(ready(&self.states))),
            ("CustomResourceDefinition", Box::pin(ready(&self.crd))),
            ("Namespaces", Box::pin(ready(&self.namespaces))),
            ("Events", Box::pin(ready(&self.refusals))),
        ];
        if let Some(s) = &self.clusters {
            waits.push(("Clusters", Box::pin(ready(s))));
        }
        if let Some(s) = &self.owners {
            waits.push(("Machines or MachinePools", Box::pin(ready(s))));
        }
        if let Some(s) = &self.machines {
            waits.push(("TerraformMachines", Box::pin(ready(s))));
        }
        if let Some(s) = &self.pools {
            waits.push(("TerraformMachinePools", Box::pin(ready(s))));
        }
        let outcomes =
            futures::future::join_all(waits.into_iter().map(|(name, wait)| async move {
                let filled = tokio::time::timeout(READY_WITHIN, wait)
                    .await
                    .unwrap_or(false);
                (name, filled)
            }))
            .await;
        let empty: Vec<&str> = outcomes
            .into_iter()
            .filter(|(_, filled)| !filled)
            .map(|(name, _)| name)
            .collect();
        if empty.is_empty() {
            return Ok(());
        }
        Err(format!(
            "the manager's caches of {} have had no first list after {}s: their watches fail (the manager's log says why; a missing permission? compare its ClusterRole with config/rbac/role.yaml); nothing is decided until they have",
            empty.join(", "),
            READY_WITHIN.as_secs()
        ))
    }

    /// The cached metadata of the Secrets of namespace `ns` carrying Terraform's suffix
    /// label `suffix`: the state's base and parts, and any other Secret Terraform's
    /// backend would select with them.
    pub fn with_suffix(&self, ns: &str, suffix: &str) -> Vec<Arc<PartialObjectMeta<Secret>>> {
        let matches = |m: &PartialObjectMeta<Secret>| {
            m.metadata.namespace.as_deref() == Some(ns)
                && m.labels().get(names::TF_LABEL_SUFFIX).map(String::as_str) == Some(suffix)
        };
        let mut out = self.secrets_by_suffix.get(&self.secrets, suffix);
        out.extend(self.states_by_suffix.get(&self.states, suffix));
        out.retain(|m| matches(m));
        out
    }

    /// Whether these caches hold no Secret of the state of suffix `suffix` in `ns`, nor its
    /// inputs Secret: neither its base Secret, nor any Secret with its suffix label (a
    /// part, a stranger), nor the inputs Secret.
    pub fn shows_no_state_nor_inputs(&self, ns: &str, suffix: &str) -> bool {
        [
            names::state_secret_name(suffix),
            names::inputs_secret_name(suffix),
        ]
        .iter()
        .all(|name| self.secret_meta(ns, name).is_none())
            && self.with_suffix(ns, suffix).is_empty()
    }

    /// The lock Lease `ns/name` as the cache of locks has it (`Some(None)`: there is
    /// none); `None` when there is no such cache or it has not listed yet.
    pub fn lock(&self, ns: &str, name: &str) -> Option<Option<Lease>> {
        listed_lock(self.locks.as_ref()?, ns, name)
    }

    /// The cached metadata of Secret `ns/name`, from the owned or the state Secrets.
    pub fn secret_meta(&self, ns: &str, name: &str) -> Option<Arc<PartialObjectMeta<Secret>>> {
        let key = reflector::ObjectRef::new(name).within(ns);
        self.secrets.get(&key).or_else(|| self.states.get(&key))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{job, pod_of};

    fn secret(ns: &str, name: &str, uid: &str) -> PartialObjectMeta<Secret> {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "v1", "kind": "Secret",
            "metadata": {"name": name, "namespace": ns,
                "labels": {names::LABEL_OWNER_UID: uid}}
        }))
        .expect("a Secret's metadata")
    }

    /// The index and the store, fed the same events as the reflector feeds them.
    fn feed(
        index: &ByLabel,
        writer: &mut reflector::store::Writer<PartialObjectMeta<Secret>>,
        event: watcher::Event<PartialObjectMeta<Secret>>,
    ) {
        index.apply(&event);
        writer.apply_watcher_event(&event);
    }

    fn names_of(items: Vec<Arc<PartialObjectMeta<Secret>>>) -> Vec<String> {
        let mut out: Vec<String> = items.iter().map(|i| i.name_any()).collect();
        out.sort();
        out
    }

    /// Before its first list the cache of locks says nothing (the pass reads the lock
    /// live); after, it says which lock there is, and that there is none.
    #[test]
    fn the_cache_of_locks_answers_only_once_it_has_listed() {
        use watcher::Event::{Init, InitApply, InitDone};
        let (store, mut writer) = reflector::store::<Lease>();
        let lease: Lease = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "lock-tfstate-default-web-1.tfm", "namespace": "a"},
            "spec": {"holderIdentity": "alice-1"}
        }))
        .expect("a Lease");
        assert_eq!(
            listed_lock(&store, "a", "lock-tfstate-default-web-1.tfm"),
            None
        );
        writer.apply_watcher_event(&Init);
        writer.apply_watcher_event(&InitApply(lease.clone()));
        assert_eq!(
            listed_lock(&store, "a", "lock-tfstate-default-web-1.tfm"),
            None,
            "not during the first list"
        );
        writer.apply_watcher_event(&InitDone);
        assert_eq!(
            listed_lock(&store, "a", "lock-tfstate-default-web-1.tfm"),
            Some(Some(lease))
        );
        assert_eq!(
            listed_lock(&store, "b", "lock-tfstate-default-web-1.tfm"),
            Some(None),
            "none in another namespace"
        );
    }

    #[test]
    fn the_label_index_follows_the_watch_events_and_the_relist() {
        use watcher::Event::{Apply, Delete, Init, InitApply, InitDone};
        let index = ByLabel::new(names::LABEL_OWNER_UID);
        let (store, mut writer) = reflector::store();
        feed(&index, &mut writer, Init);
        feed(&index, &mut writer, InitApply(secret("a", "s1", "u1")));
        feed(&index, &mut writer, InitApply(secret("b", "s1", "u1")));
        feed(&index, &mut writer, InitApply(secret("a", "s2", "u2")));
        feed(&index, &mut writer, InitDone);
        assert_eq!(names_of(index.get(&store, "u1")), ["s1", "s1"]);
        assert_eq!(names_of(index.get(&store, "u2")), ["s2"]);
        assert!(index.get(&store, "u3").is_empty());
        // A label that changes moves the item; a deletion removes it.
        feed(&index, &mut writer, Apply(secret("a", "s2", "u1")));
        feed(&index, &mut writer, Delete(secret("b", "s1", "u1")));
        assert_eq!(names_of(index.get(&store, "u1")), ["s1", "s2"]);
        assert!(index.get(&store, "u2").is_empty());
        // A relist replaces everything at its end, not before.
        feed(&index, &mut writer, Init);
        feed(&index, &mut writer, InitApply(secret("a", "s3", "u1")));
        assert_eq!(names_of(index.get(&store, "u1")), ["s1", "s2"]);
        feed(&index, &mut writer, InitDone);
        assert_eq!(names_of(index.get(&store, "u1")), ["s3"]);
        // An item without the label is not indexed.
        let mut bare = secret("a", "s4", "u1");
        bare.metadata.labels = None;
        feed(&index, &mut writer, Apply(bare));
        assert_eq!(names_of(index.get(&store, "u1")), ["s3"]);
    }

    #[test]
    fn a_trimmed_job_and_pod_keep_what_the_facts_read() {
        let mut j: Job = serde_json::from_value(serde_json::json!({
            "apiVersion": "batch/v1", "kind": "Job",
            "metadata": {"name": "j", "namespace": "ns", "labels": {"a": "b"},
                "managedFields": [{"manager": "x"}]},
            "spec": {"suspend": true, "template": {"metadata": {"labels": {"x": "y"}},
                "spec": {"volumes": [{"name": "v", "emptyDir": {}}],
                "containers": [{"name": "terraform", "image": "i", "command": ["sh"],
                    "env": [{"name": "E", "value": "1"}],
                    "resources": {"limits": {"memory": "256Mi"}}}]}}},
            "status": {"active": 1}
        }))
        .expect("a Job");
        let before = j.clone();
        trim_job(&mut j);
        assert_eq!(j.metadata.managed_fields, None);
        assert_eq!(j.metadata.labels, before.metadata.labels);
        assert_eq!(j.status, before.status);
        assert!(crate::job::suspended(&j));
        let spec = j
            .spec
            .as_ref()
            .and_then(|s| s.template.spec.as_ref())
            .expect("spec");
        assert_eq!(spec.volumes, None);
        assert_eq!(spec.containers.len(), 1);
        assert_eq!(spec.containers[0].name, "terraform");
        assert_eq!(spec.containers[0].env, None);
        assert_eq!(spec.containers[0].command, None);
        assert_eq!(
            spec.containers[0].resources,
            before
                .spec
                .as_ref()
                .and_then(|s| s.template.spec.as_ref())
                .expect("spec")
                .containers[0]
                .resources
        );
        // The Job's outcome and its Pod's are read alike before and after.
        let full = job(
            Kind::TerraformMachine,
            "destroy",
            1,
            &[(
                "Failed",
                "True",
                "BackoffLimitExceeded",
                "2026-12-01T11:00:00Z",
            )],
        );
        let mut pod = pod_of(&full, Some((1, "Error: boom")));
        let pod_before = pod.clone();
        let mut trimmed = full.clone();
        trim_job(&mut trimmed);
        trim_pod(&mut pod);
        assert_eq!(
            crate::job::outcome(&trimmed, std::slice::from_ref(&pod)),
            crate::job::outcome(&full, std::slice::from_ref(&pod_before))
        );
        assert_eq!(pod.status, pod_before.status);
        assert_eq!(pod.metadata.labels, pod_before.metadata.labels);
    }
}
