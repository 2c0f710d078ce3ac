//! The deletion's observation of one object, read from a [`Source`] in one order: the
//! Jobs with the Cluster, the CRD, the Namespace, the dependents and the Machine and
//! MachinePool owners; then the Pods (a Pod listed before the Jobs could belong to a Job
//! created after), with the state at the same time when the first round already says the
//! table will need it; then where stuck Pods are and why Pods were refused. The manager's
//! pass and `captf explain` (with and without `-f`) observe through it, so an
//! [`Observed`] is built here and nowhere else (but the tests' fixtures).

use std::collections::BTreeMap;

use jiff::Timestamp;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::api::ObjectMeta;

use super::Source;
use crate::api::TerraformObject;
use crate::api::names::{self, Kind};
use crate::api::types::{ApiEndpoint, TerraformSpec};
use crate::gather::{self, ClusterView, Observed};
use crate::state::permits::StatePermit;
use crate::state::{Errored, StateSecrets};

/// The object a pass observes, as its kind, metadata and spec.
pub struct Subject {
    pub kind: Kind,
    pub meta: ObjectMeta,
    pub spec: TerraformSpec,
    pub control_plane_endpoint: Option<ApiEndpoint>,
}

impl Subject {
    pub fn of<K: TerraformObject>(obj: &K) -> Subject {
        Subject {
            kind: K::KIND,
            meta: obj.meta().clone(),
            spec: obj.terraform().clone(),
            control_plane_endpoint: obj.control_plane_endpoint().cloned(),
        }
    }
}

/// What a pass read of an object's state, with what is read beside it: its errored
/// states, its inputs Secret, the variables of an apply whose end is to be recorded, the
/// Secrets and ConfigMaps the inputs or the spec reference, and Terraform's lock.
pub struct StateRead {
    /// Whether the inputs Secret and what it and the spec reference were read, or seen
    /// absent ([`gather::StateWanted`]); when not, they are empty here.
    pub inputs_read: bool,
    /// The manager's permit to hold this state in memory, when it reads under one.
    pub permit: Option<StatePermit>,
    pub state: StateSecrets,
    pub errored: Vec<Errored>,
    /// The base state Secret's metadata (`None`: it does not exist).
    pub state_meta: Option<ObjectMeta>,
    pub inputs_secret: Option<Secret>,
    pub attempt_secret: Option<Secret>,
    pub referenced_secrets: BTreeMap<String, Secret>,
    pub referenced_config_maps: BTreeMap<String, ConfigMap>,
    pub lock: Option<Lease>,
}

impl StateRead {
    /// Puts what was read into `o`, observed at `now`; returns the base state Secret's
    /// metadata.
    pub fn apply(self, o: &mut Observed, now: Timestamp) -> Option<ObjectMeta> {
        o.state_permit = self.permit.map(std::sync::Arc::new);
        o.state = Some(self.state);
        o.errored = self.errored;
        o.inputs_secret = self.inputs_secret;
        o.attempt_secret = self.attempt_secret;
        o.referenced_secrets = self.referenced_secrets;
        o.referenced_config_maps = self.referenced_config_maps;
        o.lock = self.lock;
        o.now = now;
        self.state_meta
    }
}

/// Splits the Jobs or Pods of an object's name into this object's (by its uid label) and
/// earlier namesakes'.
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

/// Observes `subject` from `source`: everything but the state, and the state too when
/// `state_now` says, of what the first round read, that the table will need it (read
/// beside the Pods, and handed back unapplied: the caller applies it once it knows the
/// Pods did not make it unnecessary).
pub async fn observe_object<S: Source>(
    source: &S,
    subject: Subject,
    state_now: impl Fn(&Observed) -> bool,
) -> Result<(Observed, Option<StateRead>), S::Error> {
    let Subject {
        kind,
        meta,
        spec,
        control_plane_endpoint,
    } = subject;
    let ns = meta.namespace.clone().unwrap_or_default();
    let uid = meta.uid.clone().unwrap_or_default();
    let cluster_name = gather::owning_cluster(&meta);
    let deleting = meta.deletion_timestamp.is_some();
    let capi_known = source.cluster_api();

    let cluster = async {
        Ok(match &cluster_name {
            Some(name) => source
                .cluster(&ns, name)
                .await?
                .map(|v| ClusterView::from_value(&v)),
            None => None,
        })
    };
    let dependents = async {
        match &cluster_name {
            Some(c) if kind == Kind::TerraformCluster && deleting => {
                source.dependents(&ns, c).await
            }
            _ => Ok(Vec::new()),
        }
    };
    // During a deletion, the Machines and MachinePools that own the object (the Cluster
    // is read above): one gone means a move or a stripped finalizer, not a teardown.
    let owners = async {
        let mut found = BTreeMap::new();
        if deleting && capi_known.is_ok() {
            for r in gather::capi_owners(&meta).filter(|r| r.kind != "Cluster") {
                if let Some(uid) = source.owner_uid(kind, &r.kind, &ns, &r.name).await? {
                    found.insert((r.kind.clone(), r.name.clone()), uid);
                }
            }
        }
        Ok(found)
    };
    let (jobs, cluster, crd_deleting, namespace_terminating, dependents, owners) = futures::try_join!(
        source.jobs(kind, &meta),
        cluster,
        source.crd_deleting(kind),
        source.namespace_terminating(&ns),
        dependents,
        owners
    )?;
    // Only while Cluster API's kinds are known: while they are not, an object that names
    // a Cluster is held as paused anyway.
    let owners_gone = if deleting && capi_known.is_ok() {
        gather::owners_gone(&meta, |kind, name| {
            if kind == "Cluster" {
                cluster
                    .as_ref()
                    .filter(|c| c.name == name)
                    .map(|c| c.uid.clone())
            } else {
                owners.get(&(kind.to_string(), name.to_string())).cloned()
            }
        })
    } else {
        Vec::new()
    };
    let (jobs, earlier_jobs) = split_namesakes(jobs, &uid);
    let mut o = Observed {
        cluster_kind_unknown: match (&cluster_name, capi_known) {
            (Some(_), Err(why)) => Some(why),
            _ => None,
        },
        cluster,
        crd_deleting,
        namespace_terminating,
        owners_gone,
        jobs,
        earlier_jobs,
        dependents,
        ..Observed::new(kind, meta, spec, control_plane_endpoint, source.now())
    };
    let read_now = state_now(&o);
    let state = async {
        match read_now {
            true => Ok(Some(
                source.state(&o, gather::StateWanted::for_pass(&o)).await?,
            )),
            false => Ok(None),
        }
    };
    let (pods, state) = futures::try_join!(source.pods(kind, &o.meta), state)?;
    (o.pods, o.earlier_pods) = split_namesakes(pods, &uid);
    let all: Vec<_> = o.pods.iter().chain(o.earlier_pods.iter()).collect();
    o.stuck_pods = source.stuck_pods(&all, o.now).await?;
    o.job_refusals = source.job_refusals(&ns, &o.jobs, &o.pods, o.now).await?;
    o.now = source.now();
    Ok((o, state))
}

/// One pass's observation: [`observe_object`], then the state (with what is read beside
/// it) when the rule table needs it ([`crate::rules::state_needed`]), or an apply ended
/// whose record needs it ([`gather::apply::unrecorded_apply`]): always read after the
/// Jobs are listed, so that a Job seen finished is followed by a read of the state it
/// left. When the first round already says so (the usual pass of a deletion), the state
/// is read at the same time as the Pods; a read the Pods then make unnecessary is
/// dropped, so the decision is the one made without it. Returns the base state Secret's
/// metadata as the pass read it: `None` when it did not read the state, `Some(None)`
/// when that Secret does not exist. The inputs Secret, and what it and the spec
/// reference, are read with the state unless a destroy of this deletion succeeded
/// ([`gather::inputs_with_state`]); then only when the state lists something after all.
pub async fn observe_pass<S: Source>(
    source: &S,
    subject: Subject,
    settings: &gather::Settings,
) -> Result<(Observed, Option<Option<ObjectMeta>>), S::Error> {
    let needed = |o: &Observed| {
        crate::rules::state_needed(&gather::gather(o, settings).0)
            || gather::apply::unrecorded_apply(o).is_some()
    };
    let (mut o, early) = observe_object(source, subject, needed).await?;
    if !needed(&o) {
        return Ok((o, None));
    }
    let read = match early {
        Some(read) => read,
        None => source.state(&o, gather::StateWanted::for_pass(&o)).await?,
    };
    let inputs_read = read.inputs_read;
    let meta = read.apply(&mut o, source.now());
    if !inputs_read && gather::inputs_wanted_after(&o, settings) {
        source.inputs(&mut o).await?;
    }
    Ok((o, Some(meta)))
}
