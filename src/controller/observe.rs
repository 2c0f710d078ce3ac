//! Observing one object from the API server into an [`Observed`]: the cheap part first
//! (Jobs, Pods, Cluster, CRD, Namespace, dependents), and the Secrets only when the rule
//! table needs the state. Secrets are read on demand, never cached whole.

use std::collections::BTreeMap;
use std::sync::Arc;

use jiff::Timestamp;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Event as CoreEvent, Namespace, Node, Pod, Secret};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::ResourceExt;
use kube::api::{Api, DynamicObject, ListParams};
use kube::core::ObjectMeta;
use kube::runtime::reflector::ObjectRef;

use kube::Client;

use super::caches;
use super::{Caches, ClusterKind, Error};
use crate::api::labels::namesake_selector;
use crate::api::names::{self, Kind};
use crate::api::{TerraformMachine, TerraformMachinePool, TerraformObject, VariablesSourceKind};
use crate::gather::{self, ClusterView, Observed, POD_EXPECTED_WITHIN, Settings};
use crate::inputs;
use crate::job::{self, JobOutcome};
use crate::state::permits::{Lane, StatePermit, StateReads};
use crate::state::secrets as chunked;
use crate::state::{self, StateSecrets};

/// Splits the Jobs or Pods of [`namesake_selector`] into this object's and earlier ones'.
fn split_namesakes<T: kube::Resource>(items: Vec<T>, uid: &str) -> (Vec<T>, Vec<T>) {
    items.into_iter().partition(|i| {
        i.meta()
            .labels
            .as_ref()
            .and_then(|l| l.get(names::LABEL_OWNER_UID))
            .map(String::as_str)
            == Some(uid)
    })
}

/// Observes everything but the Secrets and the lock.
pub async fn observe<K: TerraformObject>(
    client: &Client,
    cluster_api: &ClusterKind,
    obj: &K,
) -> Result<Observed, Error> {
    let unused = StateReads::new(1);
    Ok(observe_rounds(
        client,
        None,
        cluster_api,
        obj,
        |_| false,
        (&unused, Lane::Ordinary),
    )
    .await?
    .0)
}

/// The base state Secret's metadata as a pass read it: `None` when the pass did not read
/// the state, `Some(None)` when that Secret does not exist.
pub type StateMeta = Option<Option<ObjectMeta>>;

/// One reconcile pass's observation: [`observe`], then the Secrets and the lock when the
/// rule table needs the state ([`crate::rules::state_needed`]), always read after the Jobs are
/// listed, so that a Job seen finished is followed by a read of the state it left. When
/// the Jobs, the Cluster, the CRD and the dependents already say the state will be needed
/// (the usual pass of a deletion), the Secrets are read at the same time as the Pods; a
/// read that the Pods then make unnecessary is dropped, so the decision is the one made
/// without it.
pub async fn observe_pass<K: TerraformObject>(
    client: &Client,
    caches: Option<&Caches>,
    cluster_api: &ClusterKind,
    obj: &K,
    settings: &Settings,
    state_reads: (&StateReads, Lane),
) -> Result<(Observed, StateMeta), Error> {
    // The state is read when the deletion's table needs it, and once after an apply
    // ended: a success for the fingerprint its bookkeeping records, either for whether
    // the apply wrote the state (then its inputs become the destroy's).
    let needed = |o: &Observed| {
        crate::rules::state_needed(&gather::gather(o, settings).0)
            || gather::apply::unrecorded_apply(o).is_some()
    };
    let (mut o, early) =
        observe_rounds(client, caches, cluster_api, obj, needed, state_reads).await?;
    if !needed(&o) {
        return Ok((o, None));
    }
    let read = match early {
        Some(read) => read,
        None => read_secrets(client, caches, &o, state_reads).await?,
    };
    let meta = read.apply(&mut o);
    Ok((o, Some(meta)))
}

/// The reads of [`observe`] in two rounds: the Jobs with the Cluster, the CRD, the
/// Namespace and the dependents; then the Pods (a Pod listed before the Jobs could belong
/// to a Job created after), with the Secrets at the same time when `secrets_now` says so
/// of what the first round read. With `caches` (the manager's), all of it but the
/// Machine and MachinePool owners is read from them; the Jobs and Pods are listed live
/// when the cache lacks the Job of the attempt the object says runs
/// ([`gather::started_job_unseen`]).
async fn observe_rounds<K: TerraformObject>(
    client: &Client,
    caches: Option<&Caches>,
    cluster_api: &ClusterKind,
    obj: &K,
    secrets_now: impl Fn(&Observed) -> bool,
    state_reads: (&StateReads, Lane),
) -> Result<(Observed, Option<SecretsRead>), Error> {
    let meta = obj.meta().clone();
    let ns = obj.namespace().unwrap_or_default();
    let name = obj.name_any();
    let uid = meta.uid.clone().unwrap_or_default();
    let client = client.clone();
    let lp = ListParams::default().labels(&namesake_selector(K::KIND, &name));
    // The Jobs from the cache, unless it lacks the running attempt's (the check looks at
    // this object's Jobs only, by their uid label).
    let cached_jobs = caches
        .map(|c| caches::namesakes(&c.jobs, &c.jobs_by_owner, K::KIND, &ns, &name))
        .filter(|jobs| !gather::started_job_unseen(&meta, K::KIND, jobs));
    let from_cache = cached_jobs.is_some();
    let jobs = async {
        Ok::<_, Error>(match cached_jobs {
            Some(jobs) => jobs,
            None => {
                Api::<Job>::namespaced(client.clone(), &ns)
                    .list(&lp)
                    .await?
                    .items
            }
        })
    };
    let cluster_name = gather::owning_cluster(&meta);
    let cluster = async {
        let view = |c: &DynamicObject| {
            ClusterView::from_value(&serde_json::to_value(c).unwrap_or_default())
        };
        Ok::<_, Error>(match (&cluster_name, cluster_api.resource()) {
            (Some(name), Some(ar)) => {
                match caches.and_then(|c| c.clusters.as_ref().map(|s| (c, s))) {
                    Some((caches, store)) => store
                        .get(&ObjectRef::new_with(name, ar.clone()).within(&ns))
                        .map(|c| {
                            let mut v = view(&c);
                            let rv = c.metadata.resource_version.as_deref().unwrap_or_default();
                            // Read paused from the API server since this version was cached.
                            if caches.paused_read_live(&ns, name, rv) {
                                v.spec_paused = true;
                            }
                            v
                        }),
                    None => Api::<DynamicObject>::namespaced_with(client.clone(), &ns, ar)
                        .get_opt(name)
                        .await?
                        .map(|c| view(&c)),
                }
            }
            _ => None,
        })
    };
    let crd_deleting = async {
        if let Some(c) = caches {
            return Ok(c
                .crd
                .get(&ObjectRef::new(&K::KIND.crd_name()))
                .is_some_and(|m| m.metadata.deletion_timestamp.is_some()));
        }
        Ok::<_, Error>(
            // A failed read fails the pass: it must never count as "the CRD is not being
            // deleted", or a transient error during an uninstall would start a destroy.
            Api::<CustomResourceDefinition>::all(client.clone())
                .get_opt(&K::KIND.crd_name())
                .await?
                .is_some_and(|c| c.metadata.deletion_timestamp.is_some()),
        )
    };
    let namespace_terminating = async {
        // A namespace the cache does not hold (a watch that has not seen it yet) is read.
        if let Some(m) = caches.and_then(|c| c.namespaces.get(&ObjectRef::new(&ns))) {
            return Ok(m.metadata.deletion_timestamp.is_some());
        }
        Ok::<_, Error>(
            Api::<Namespace>::all(client.clone())
                .get_opt(&ns)
                .await?
                .is_some_and(|n| {
                    n.metadata.deletion_timestamp.is_some()
                        || n.status.and_then(|s| s.phase).as_deref() == Some("Terminating")
                }),
        )
    };
    let dependents = async {
        if K::KIND == Kind::TerraformCluster && meta.deletion_timestamp.is_some() {
            match (&cluster_name, caches) {
                (Some(c), Some(caches)) if caches.machines.is_some() => {
                    Ok(cached_dependents(caches, &ns, c))
                }
                (Some(c), _) => dependents(&client, &ns, c).await,
                (None, _) => Ok(Vec::new()),
            }
        } else {
            Ok(Vec::new())
        }
    };
    // During a deletion, the Machines and MachinePools that own the object (the Cluster
    // is read above): one gone means a move or a stripped finalizer, not a teardown. From
    // the cache of the kind's owners when the manager keeps one (a destroy's start reads
    // them live once more: `act::attempt::owner_gone_since_read`), else live.
    let owners = async {
        let mut found = BTreeMap::new();
        if let (Some(_), Some(ar)) = (&meta.deletion_timestamp, cluster_api.resource()) {
            // The cache holds the owners of the kind's own owner kind only.
            let cached = caches
                .and_then(|c| c.owners.as_ref())
                .map(|s| (s, gather::apply::owner_kind(K::KIND)));
            for r in gather::capi_owners(&meta).filter(|r| r.kind != "Cluster") {
                let owner_ar = super::owner_resource(ar, &r.kind);
                let store = cached
                    .filter(|(_, kind)| *kind == Some(r.kind.as_str()))
                    .map(|(s, _)| s);
                let uid = match store {
                    Some(store) => store
                        .get(&ObjectRef::new_with(&r.name, owner_ar).within(&ns))
                        .map(|o| o.metadata.uid.clone()),
                    None => Api::<DynamicObject>::namespaced_with(client.clone(), &ns, &owner_ar)
                        .get_metadata_opt(&r.name)
                        .await?
                        .map(|o| o.metadata.uid),
                };
                if let Some(uid) = uid {
                    found.insert((r.kind.clone(), r.name.clone()), uid.unwrap_or_default());
                }
            }
        }
        Ok::<_, Error>(found)
    };
    let (jobs, cluster, crd_deleting, namespace_terminating, dependents, owners) = futures::try_join!(
        jobs,
        cluster,
        crd_deleting,
        namespace_terminating,
        dependents,
        owners
    )?;
    // Only while Cluster API's kinds are known: while they are not, an object that names
    // a Cluster is held as paused anyway.
    let owners_gone = match (&meta.deletion_timestamp, cluster_api.resource()) {
        (Some(_), Some(_)) => gather::owners_gone(&meta, |kind, name| {
            if kind == "Cluster" {
                cluster
                    .as_ref()
                    .filter(|c| c.name == name)
                    .map(|c| c.uid.clone())
            } else {
                owners.get(&(kind.to_string(), name.to_string())).cloned()
            }
        }),
        _ => Vec::new(),
    };
    let (jobs, earlier_jobs) = split_namesakes(jobs, &uid);
    let mut o = Observed {
        kind: K::KIND,
        meta,
        spec: obj.terraform().clone(),
        control_plane_endpoint: obj.control_plane_endpoint().cloned(),
        cluster_kind_unknown: match (&cluster_name, cluster_api) {
            (Some(_), ClusterKind::Unknown(why)) => Some(why.clone()),
            _ => None,
        },
        cluster,
        crd_deleting,
        namespace_terminating,
        owners_gone,
        stuck_pods: BTreeMap::new(),
        jobs,
        pods: Vec::new(),
        earlier_jobs,
        earlier_pods: Vec::new(),
        job_refusals: BTreeMap::new(),
        dependents,
        state: None,
        errored: Vec::new(),
        state_permit: None,
        inputs_secret: None,
        attempt_secret: None,
        referenced_secrets: BTreeMap::new(),
        referenced_config_maps: BTreeMap::new(),
        lock: None,
        now: Timestamp::now(),
    };
    let read_now = secrets_now(&o);
    let pods = async {
        Ok::<_, Error>(match caches.filter(|_| from_cache) {
            Some(c) => caches::namesakes(&c.pods, &c.pods_by_owner, K::KIND, &ns, &name),
            None => {
                Api::<Pod>::namespaced(client.clone(), &ns)
                    .list(&lp)
                    .await?
                    .items
            }
        })
    };
    let secrets = async {
        if read_now {
            Ok(Some(read_secrets(&client, caches, &o, state_reads).await?))
        } else {
            Ok(None)
        }
    };
    let (pods, secrets) = futures::try_join!(pods, secrets)?;
    (o.pods, o.earlier_pods) = split_namesakes(pods, &uid);
    o.stuck_pods = stuck_pods(&client, o.pods.iter().chain(o.earlier_pods.iter()), o.now).await?;
    o.job_refusals = match caches {
        Some(c) => cached_refusals(c, &ns, &o.jobs, &o.pods, o.now),
        None => job_refusals(&client, &ns, &o.jobs, &o.pods, o.now).await?,
    };
    o.now = Timestamp::now();
    Ok((o, secrets))
}

/// [`dependents`] from the TerraformCluster controller's caches of machines and pools.
fn cached_dependents(caches: &Caches, ns: &str, cluster: &str) -> Vec<String> {
    let in_ns = |m: &ObjectMeta| m.namespace.as_deref() == Some(ns);
    let machines = caches
        .machines
        .iter()
        .flat_map(|s| caches.machines_by_cluster.get(s, cluster))
        .filter(|m| in_ns(&m.metadata))
        .map(|m| format!("TerraformMachine/{}", m.name_any()));
    let pools = caches
        .pools
        .iter()
        .flat_map(|s| caches.pools_by_cluster.get(s, cluster))
        .filter(|p| in_ns(&p.metadata))
        .map(|p| format!("TerraformMachinePool/{}", p.name_any()));
    let mut out: Vec<String> = machines.chain(pools).collect();
    out.sort();
    out
}

/// The Pods still terminating after their grace period (their `deletionTimestamp` has
/// passed and a container has not stopped), with their node and the node's state: a lost
/// node never confirms that a Pod stopped, and its Job waits. Nodes are read only for such
/// Pods.
async fn stuck_pods<'a>(
    client: &Client,
    pods: impl Iterator<Item = &'a Pod>,
    now: Timestamp,
) -> Result<BTreeMap<String, String>, Error> {
    let mut out = BTreeMap::new();
    for p in pods {
        let Some(deleted) = &p.metadata.deletion_timestamp else {
            continue;
        };
        if deleted.0 > now || crate::job::pod_terminated(p) {
            continue;
        }
        let name = p.metadata.name.clone().unwrap_or_default();
        let node = p.spec.as_ref().and_then(|s| s.node_name.clone());
        let text = match node {
            None => "no node (it was never scheduled)".to_string(),
            Some(n) => match Api::<Node>::all(client.clone()).get_opt(&n).await {
                Ok(None) => format!("node {n}, which no longer exists"),
                Ok(Some(node)) => {
                    let ready = node
                        .status
                        .and_then(|s| s.conditions)
                        .unwrap_or_default()
                        .into_iter()
                        .find(|c| c.type_ == "Ready");
                    match ready {
                        Some(c) => format!(
                            "node {n} (Ready={}{}{})",
                            c.status,
                            c.reason.map(|r| format!(" {r}")).unwrap_or_default(),
                            c.last_transition_time
                                .map(|t| format!(" since {}", t.0))
                                .unwrap_or_default()
                        ),
                        None => format!("node {n} (it reports no Ready condition)"),
                    }
                }
                Err(e) => format!("node {n} (its state cannot be read: {e})"),
            },
        };
        out.insert(name, text);
    }
    Ok(out)
}

/// The unfinished Jobs that have no Pod (none made yet, or each refused).
pub fn podless<'a>(jobs: &'a [Job], pods: &'a [Pod]) -> impl Iterator<Item = &'a Job> {
    jobs.iter().filter(|j| {
        matches!(job::outcome(j, pods), JobOutcome::Unfinished { .. })
            && !pods.iter().any(|p| job::pod_of_job(j, p))
    })
}

/// The unfinished Jobs without a Pod for [`POD_EXPECTED_WITHIN`] seconds.
fn refused_jobs<'a>(
    jobs: &'a [Job],
    pods: &'a [Pod],
    now: Timestamp,
) -> impl Iterator<Item = &'a Job> {
    podless(jobs, pods).filter(move |j| {
        j.metadata
            .creation_timestamp
            .as_ref()
            .is_none_or(|t| now.as_second() - t.0.as_second() >= POD_EXPECTED_WITHIN)
    })
}

/// The latest message of `events`.
fn latest_message(events: impl Iterator<Item = CoreEvent>) -> Option<String> {
    events
        .max_by_key(|e| {
            e.last_timestamp
                .as_ref()
                .map(|t| t.0)
                .or(e.event_time.as_ref().map(|t| t.0))
        })
        .and_then(|e| e.message)
}

/// The latest `FailedCreate` Event message of each unfinished Job that has had no Pod for
/// [`POD_EXPECTED_WITHIN`] seconds (its Pods are refused: admission, a quota, a missing
/// ServiceAccount). Read only for such Jobs, so a pass whose Jobs have Pods, or were just
/// made, reads no Event.
async fn job_refusals(
    client: &Client,
    ns: &str,
    jobs: &[Job],
    pods: &[Pod],
    now: Timestamp,
) -> Result<BTreeMap<String, String>, Error> {
    let mut out = BTreeMap::new();
    for j in refused_jobs(jobs, pods, now) {
        let name = j.metadata.name.clone().unwrap_or_default();
        let lp = ListParams::default().fields(&format!(
            "involvedObject.kind=Job,involvedObject.name={name},reason=FailedCreate"
        ));
        let events = Api::<CoreEvent>::namespaced(client.clone(), ns)
            .list(&lp)
            .await?
            .items;
        if let Some(message) = latest_message(events.into_iter()) {
            out.insert(name, message);
        }
    }
    Ok(out)
}

/// [`job_refusals`] from the cache of `FailedCreate` Events.
fn cached_refusals(
    caches: &Caches,
    ns: &str,
    jobs: &[Job],
    pods: &[Pod],
    now: Timestamp,
) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for j in refused_jobs(jobs, pods, now) {
        let name = j.metadata.name.clone().unwrap_or_default();
        let events = caches.refusals.state_filter(|e| {
            e.involved_object.namespace.as_deref() == Some(ns)
                && e.involved_object.name.as_deref() == Some(name.as_str())
        });
        if let Some(message) = latest_message(events.iter().map(|e| e.as_ref().clone())) {
            out.insert(name, message);
        }
    }
    out
}

/// The machines and pools of a cluster, listed live whatever `--watch-filter` says.
async fn dependents(client: &Client, ns: &str, cluster: &str) -> Result<Vec<String>, Error> {
    let lp = ListParams::default().labels(&crate::api::labels::cluster_selector(cluster));
    let mut out = Vec::new();
    for m in Api::<TerraformMachine>::namespaced(client.clone(), ns)
        .list(&lp)
        .await?
        .items
    {
        out.push(format!("TerraformMachine/{}", m.name_any()));
    }
    for p in Api::<TerraformMachinePool>::namespaced(client.clone(), ns)
        .list(&lp)
        .await?
        .items
    {
        out.push(format!("TerraformMachinePool/{}", p.name_any()));
    }
    Ok(out)
}

/// The Secrets, ConfigMaps and lock of one object, as read for a pass.
pub struct SecretsRead {
    /// The permit this read holds (see [`super::Context::state_reads`]).
    permit: StatePermit,
    state: StateSecrets,
    errored: Vec<state::Errored>,
    state_meta: Option<ObjectMeta>,
    inputs_secret: Option<Secret>,
    attempt_secret: Option<Secret>,
    referenced_secrets: BTreeMap<String, Secret>,
    referenced_config_maps: BTreeMap<String, ConfigMap>,
    lock: Option<Lease>,
}

impl SecretsRead {
    /// Puts what was read into `o`; returns the base state Secret's metadata.
    fn apply(self, o: &mut Observed) -> Option<ObjectMeta> {
        o.state_permit = Some(Arc::new(self.permit));
        o.state = Some(self.state);
        o.errored = self.errored;
        o.inputs_secret = self.inputs_secret;
        o.attempt_secret = self.attempt_secret;
        o.referenced_secrets = self.referenced_secrets;
        o.referenced_config_maps = self.referenced_config_maps;
        o.lock = self.lock;
        o.now = Timestamp::now();
        self.state_meta
    }
}

/// Reads the state Secrets, the inputs Secret, what they reference, and the lock.
pub async fn observe_secrets(client: &Client, o: &mut Observed) -> Result<(), Error> {
    let one = StateReads::new(1);
    read_secrets(client, None, o, (&one, Lane::Ordinary))
        .await?
        .apply(o);
    Ok(())
}

/// [`observe_secrets`] for a pass of the manager that holds no permit yet: it waits for
/// one of `state_reads` (the observation holds it until it is dropped), and finds the
/// errored states in `caches`. Returns the base state Secret's metadata.
pub async fn read_state_into(
    client: &Client,
    caches: Option<&Caches>,
    o: &mut Observed,
    state_reads: &StateReads,
) -> Result<Option<ObjectMeta>, Error> {
    Ok(
        read_secrets(client, caches, o, (state_reads, Lane::Ordinary))
            .await?
            .apply(o),
    )
}

/// The reads of [`observe_secrets`]: the state, the inputs and the lock at once, then what
/// the inputs (or, without them, the spec) reference, at once. These are read live: the
/// decision acts on them. With `caches`, the errored states are found in the cache of
/// the object's Secrets' metadata, except shortly after a Job of the object failed
/// ([`gather::failed_lately`]).
async fn read_secrets(
    client: &Client,
    caches: Option<&Caches>,
    o: &Observed,
    (state_reads, lane): (&StateReads, Lane),
) -> Result<SecretsRead, Error> {
    // Waits its turn: at most as many states in memory as there are permits.
    let permit = state_reads.acquire(lane).await;
    let ns = o.meta.namespace.clone().unwrap_or_default();
    let name = o.meta.name.clone().unwrap_or_default();
    tracing::debug!(kind = o.kind.as_str(), %name, "reading the state, the inputs and the lock");
    let suffix = names::state_suffix(o.kind, &name);
    let secrets = Api::<Secret>::namespaced(client.clone(), &ns);
    let leases = Api::<Lease>::namespaced(client.clone(), &ns);
    let state_name = names::state_secret_name(&suffix);
    let inputs_name = names::inputs_secret_name(&suffix);
    let lock_name = names::lock_lease_name(&suffix);
    let ((state, state_meta), inputs_secret, lock, errored) = futures::try_join!(
        chunked::read_with_meta(&secrets, &state_name, Some(&suffix)),
        async { Ok(secrets.get_opt(&inputs_name).await?) },
        async { Ok(leases.get_opt(&lock_name).await?) },
        read_errored(
            &secrets,
            caches.filter(|_| !gather::failed_lately(o)),
            o.kind,
            &name,
        ),
    )?;

    let (referenced_secrets, referenced_config_maps) =
        read_referenced(client, o, inputs_secret.as_ref()).await?;
    // An apply attempt whose end is to be recorded: the inputs it ran, which become the
    // destroy's if it wrote the state.
    let attempt_secret = match gather::apply::unrecorded_apply(o) {
        Some(u) => {
            let job = names::job_name(&suffix, names::OPERATION_APPLY, u.attempt);
            secrets.get_opt(&job).await?
        }
        None => None,
    };
    Ok(SecretsRead {
        permit,
        state,
        errored,
        state_meta,
        inputs_secret,
        attempt_secret,
        referenced_secrets,
        referenced_config_maps,
        lock,
    })
}

/// The Secrets and ConfigMaps the inputs (or, without them, the spec) reference, read at
/// once; those that do not exist are left out.
pub async fn read_referenced(
    client: &Client,
    o: &Observed,
    inputs_secret: Option<&Secret>,
) -> Result<(BTreeMap<String, Secret>, BTreeMap<String, ConfigMap>), Error> {
    let ns = o.meta.namespace.clone().unwrap_or_default();
    let suffix = names::state_suffix(o.kind, o.meta.name.as_deref().unwrap_or_default());
    let mut secret_names: Vec<String> = o
        .spec
        .env
        .iter()
        .map(|e| e.secret_key_ref.name.clone())
        .collect();
    let mut config_maps = Vec::new();
    for v in &o.spec.variables_from {
        match v.kind {
            VariablesSourceKind::Secret => secret_names.push(v.name.clone()),
            VariablesSourceKind::ConfigMap => config_maps.push(v.name.clone()),
        }
    }
    if let Some(Ok(i)) = inputs_secret.map(|s| inputs::from_secret(s, &ns, &suffix)) {
        secret_names.extend(i.env.iter().map(|e| e.secret_key_ref.name.clone()));
    }
    secret_names.sort();
    secret_names.dedup();
    config_maps.sort();
    config_maps.dedup();
    let secrets = Api::<Secret>::namespaced(client.clone(), &ns);
    let cms = Api::<ConfigMap>::namespaced(client.clone(), &ns);
    let (found_secrets, found_maps) = futures::try_join!(
        futures::future::try_join_all(secret_names.into_iter().map(|s| {
            let secrets = &secrets;
            async move { Ok::<_, Error>(secrets.get_opt(&s).await?.map(|v| (s, v))) }
        })),
        futures::future::try_join_all(config_maps.into_iter().map(|c| {
            let cms = &cms;
            async move { Ok::<_, Error>(cms.get_opt(&c).await?.map(|v| (c, v))) }
        })),
    )?;
    Ok((
        found_secrets.into_iter().flatten().collect(),
        found_maps.into_iter().flatten().collect(),
    ))
}

/// The errored states a runner kept for the object (see [`state::Errored`]): the metadata
/// of the Secrets of every object of its kind and name (by the owner labels, whatever the
/// uid: after `clusterctl move` or a recreate, the errored states of the earlier uid are
/// this object's too), then, only when there are any, the errored ones in full.
async fn read_errored(
    secrets: &Api<Secret>,
    caches: Option<&Caches>,
    kind: Kind,
    name: &str,
) -> Result<Vec<state::Errored>, Error> {
    let suffix = names::state_suffix(kind, name);
    let legacy = names::errored_secret_name(&suffix);
    let ns = secrets.namespace().unwrap_or_default().to_string();
    let metas: Vec<kube::core::PartialObjectMeta<Secret>> = match caches {
        Some(c) => caches::namesakes(&c.secrets, &c.secrets_by_owner, kind, &ns, name),
        None => {
            let lp = ListParams::default().labels(&namesake_selector(kind, name));
            secrets.list_metadata(&lp).await?.items
        }
    };
    let errored: Vec<String> = metas
        .into_iter()
        .filter(|m| {
            m.metadata.name.as_deref() == Some(legacy.as_str())
                || m.labels()
                    .get(names::TF_LABEL_SUFFIX)
                    .is_some_and(|e| names::is_errored_suffix_of(e, &suffix))
        })
        .filter_map(|m| m.metadata.name)
        .collect();
    let found = futures::future::try_join_all(
        errored
            .iter()
            .map(|name| async move { Ok::<_, Error>(secrets.get_opt(name).await?) }),
    )
    .await?;
    let found: Vec<Secret> = found.into_iter().flatten().collect();
    Ok(state::Errored::find(&suffix, &found))
}
