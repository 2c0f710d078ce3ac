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

mod jobs;
mod secrets;

pub use jobs::podless;
use jobs::{cached_refusals, job_refusals, stuck_pods};
use secrets::read_secrets;
pub use secrets::{SecretsRead, observe_secrets, read_referenced, read_state_into};

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
