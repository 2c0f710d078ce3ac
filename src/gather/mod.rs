//! Gathering the facts of a pass from what was observed. The controllers fill an
//! [`Observed`] from the API server, `captf explain -f` from files; both then call
//! [`gather`], so that the rule table sees the same facts either way. The facts' own
//! vocabulary is the rule table's (`crate::rules`); what is here turns observations into
//! it: the object's own bookkeeping ([`meta`]), its Jobs ([`jobs`]), its state and lock
//! ([`tfstate`]), and what keeps a destroy from starting ([`blockers`]).

pub mod apply;
mod blockers;
mod jobs;
pub mod leftovers;
mod meta;
pub mod source;
mod tfstate;
pub mod verdict;

use std::collections::BTreeMap;

use jiff::Timestamp;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Pod, Secret};
use kube::api::ObjectMeta;
use serde_json::Value;

use crate::api::TerraformSpec;
use crate::api::names::{self, Kind};
use crate::inputs::Inputs;
use crate::job;
use crate::rules::{self, AbandonMark, Backoff, CleanupMarker, Facts};
use crate::state::{self, StateSecrets, Verdict};

use blockers::blocker;
pub use jobs::{ERRORED_SETTLES, POD_EXPECTED_WITHIN, failed_lately, started_job_unseen};
use jobs::{destroy_history, pause_cause, unfinished};
use meta::{annotation, deletion_time, label};
pub use meta::{
    capi_owners, deletion_bookkeeping, destroy_without_owner, of_earlier_namesake, owned_by,
    owners_gone, owning_cluster,
};
pub use tfstate::errored_uncovered;
use tfstate::lock_blocker;
use tfstate::state_of;

/// The owning Cluster, as far as pausing goes.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ClusterView {
    pub name: String,
    /// Empty when the dump or the read did not carry it.
    pub uid: String,
    pub spec_paused: bool,
    pub annotation_paused: bool,
    /// `status.initialization.infrastructureProvisioned` (v1beta2), or
    /// `status.infrastructureReady` (v1beta1).
    pub infrastructure_provisioned: bool,
    /// `status.initialization.controlPlaneInitialized` (v1beta2), or
    /// `status.controlPlaneReady` (v1beta1).
    pub control_plane_initialized: bool,
    /// The disposal mark and hold annotations, when set.
    pub dispose_after: Option<String>,
    pub disposal_hold: Option<String>,
    /// `dispose-hibernate: "true"`: the modules hibernate while the disposal runs.
    pub dispose_hibernate: bool,
    pub deleting: bool,
    /// The TerraformCluster its `spec.infrastructureRef` names, when its infrastructure is
    /// CAPTF's.
    pub infrastructure: Option<String>,
}

impl ClusterView {
    /// Reads a `cluster.x-k8s.io` Cluster of any version.
    pub fn from_value(value: &Value) -> ClusterView {
        ClusterView {
            infrastructure: crate::contract::values::handoff_source(value).map(str::to_string),
            name: value["metadata"]["name"]
                .as_str()
                .unwrap_or_default()
                .to_string(),
            uid: value["metadata"]["uid"]
                .as_str()
                .unwrap_or_default()
                .to_string(),
            spec_paused: value["spec"]["paused"].as_bool().unwrap_or(false),
            annotation_paused: value["metadata"]["annotations"]
                .get(names::CAPI_PAUSED)
                .is_some(),
            infrastructure_provisioned:
                value["status"]["initialization"]["infrastructureProvisioned"]
                    .as_bool()
                    .or(value["status"]["infrastructureReady"].as_bool())
                    .unwrap_or(false),
            control_plane_initialized: value["status"]["initialization"]["controlPlaneInitialized"]
                .as_bool()
                .or(value["status"]["controlPlaneReady"].as_bool())
                .unwrap_or(false),
            dispose_after: value["metadata"]["annotations"][names::DISPOSE_AFTER]
                .as_str()
                .map(str::to_string),
            disposal_hold: value["metadata"]["annotations"][names::DISPOSAL_HOLD]
                .as_str()
                .map(str::to_string),
            dispose_hibernate: value["metadata"]["annotations"][names::DISPOSE_HIBERNATE]
                .as_str()
                .is_some_and(|v| v.trim() == "true"),
            deleting: !value["metadata"]["deletionTimestamp"].is_null(),
        }
    }
}

/// Everything a pass looked at, whichever way it was read.
#[derive(Clone, Debug)]
pub struct Observed {
    pub kind: Kind,
    pub meta: ObjectMeta,
    pub spec: TerraformSpec,
    /// A TerraformCluster's own `spec.controlPlaneEndpoint` (from its module's outputs).
    pub control_plane_endpoint: Option<crate::api::types::ApiEndpoint>,
    /// The owning Cluster when it exists.
    pub cluster: Option<ClusterView>,
    /// Why Cluster API's Cluster kind is unknown to the manager, when it is and the object
    /// names a Cluster.
    pub cluster_kind_unknown: Option<String>,
    pub crd_deleting: bool,
    pub namespace_terminating: bool,
    /// The Pods of the object (or of an earlier namesake) still terminating after their
    /// grace period, by name: where they are stuck (their node and its state). A node
    /// that is lost never confirms that a Pod stopped, and the Job waits for it.
    pub stuck_pods: BTreeMap<String, String>,
    /// The Cluster API owners (Cluster, Machine, MachinePool, by ownerReference) that no
    /// longer exist or exist with another uid, described for the message; looked at only
    /// during a deletion (see [`owners_gone`]).
    pub owners_gone: Vec<String>,
    /// Why the Pods of an unfinished Job of the object that has none could not be made:
    /// the message of the Job's latest `FailedCreate` Event, by Job name.
    pub job_refusals: BTreeMap<String, String>,
    /// The object's Jobs and Pods (found by the owner labels).
    pub jobs: Vec<Job>,
    pub pods: Vec<Pod>,
    /// The Jobs and Pods of earlier objects of the same kind, namespace and name (another
    /// uid: this one's finalizer was stripped and the object made again). Their Terraform
    /// writes the same state.
    pub earlier_jobs: Vec<Job>,
    pub earlier_pods: Vec<Pod>,
    /// For a TerraformCluster: its machines and pools, as `Kind/name`.
    pub dependents: Vec<String>,
    /// The state Secret and its parts; `None` when not read in this pass.
    pub state: Option<StateSecrets>,
    /// The states Terraform could not save that runners kept for this object (read with
    /// the state).
    pub errored: Vec<state::Errored>,
    /// The manager's permit to hold this pass's state in memory (see
    /// `Context::state_reads`), released with the observation.
    pub state_permit: Option<std::sync::Arc<crate::state::permits::StatePermit>>,
    pub inputs_secret: Option<Secret>,
    /// The variables Secret of the latest apply attempt, when its end is to be recorded
    /// (read with the state): it carries the inputs that attempt ran.
    pub attempt_secret: Option<Secret>,
    /// Secrets and ConfigMaps the inputs or the spec reference (credentials, variablesFrom).
    pub referenced_secrets: BTreeMap<String, Secret>,
    pub referenced_config_maps: BTreeMap<String, ConfigMap>,
    /// Terraform's lock Lease, when it exists.
    pub lock: Option<Lease>,
    pub now: Timestamp,
}

impl Observed {
    /// What a pass of `kind`'s object of `meta` and `spec` observes at `now` before it
    /// reads anything around it: nothing seen yet.
    pub fn new(
        kind: Kind,
        meta: ObjectMeta,
        spec: TerraformSpec,
        control_plane_endpoint: Option<crate::api::types::ApiEndpoint>,
        now: Timestamp,
    ) -> Observed {
        Observed {
            kind,
            meta,
            spec,
            control_plane_endpoint,
            cluster: None,
            cluster_kind_unknown: None,
            crd_deleting: false,
            namespace_terminating: false,
            stuck_pods: BTreeMap::new(),
            owners_gone: Vec::new(),
            job_refusals: BTreeMap::new(),
            jobs: Vec::new(),
            pods: Vec::new(),
            earlier_jobs: Vec::new(),
            earlier_pods: Vec::new(),
            dependents: Vec::new(),
            state: None,
            errored: Vec::new(),
            state_permit: None,
            inputs_secret: None,
            attempt_secret: None,
            referenced_secrets: BTreeMap::new(),
            referenced_config_maps: BTreeMap::new(),
            lock: None,
            now,
        }
    }

    /// The object as what CAPTF makes for it names it (an empty part for a dump that
    /// lacks it).
    pub fn identity(&self) -> crate::api::labels::Identity<'_> {
        crate::api::labels::Identity {
            kind: self.kind,
            namespace: self.meta.namespace.as_deref().unwrap_or_default(),
            name: self.meta.name.as_deref().unwrap_or_default(),
            uid: self.meta.uid.as_deref().unwrap_or_default(),
        }
    }
}

/// What the act step needs beside the decision.
#[derive(Clone, Debug, Default)]
pub struct Findings {
    /// The usable inputs, when they are.
    pub inputs: Option<Inputs>,
    /// The state verdict, when the state was read.
    pub verdict: Option<Verdict>,
    /// The lock Lease is held by a runner of this object (or of an earlier one of its
    /// name) that is provably gone: clear it, as read, before an attempt.
    pub stale_lock: bool,
    /// The state Secret belongs to an earlier object of this name that this one did not
    /// adopt: it is left alone.
    pub foreign_state: bool,
}

/// Settings that are facts of a pass but not of the object.
#[derive(Clone, Copy, Debug)]
pub struct Settings {
    pub backoff: Backoff,
    pub decompression_cap: u64,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            backoff: Backoff::default(),
            decompression_cap: state::DEFAULT_DECOMPRESSION_CAP,
        }
    }
}

/// Gathers the facts of a pass. Pure: everything comes from `o`.
pub fn gather(o: &Observed, settings: &Settings) -> (Facts, Findings) {
    let name = o.meta.name.clone().unwrap_or_default();
    let suffix = names::state_suffix(o.kind, &name);
    let namespace = o.meta.namespace.clone().unwrap_or_default();
    let mut findings = Findings::default();

    let paused = pause_cause(o);
    let unfinished_jobs = unfinished(o);
    let cleanup = match deletion_bookkeeping(&o.meta, names::CLEANUP_STARTED) {
        Some(names::CLEANUP_DESTROYED) => Some(CleanupMarker::Destroyed),
        Some(names::CLEANUP_ABANDONED) => Some(CleanupMarker::Abandoned),
        _ => None,
    };
    let adopt = annotation(&o.meta, names::ADOPT) == Some("true");
    let own_lineage = annotation(&o.meta, names::STATE_LINEAGE).is_some();
    let applied = annotation(&o.meta, names::APPLIED_AT).is_some() || adopt;

    let state = state_of(o, settings, applied, own_lineage, &mut findings);

    let (attempt, last_attempt) = destroy_history(o, &suffix);
    let attempt_unstarted = attempt > 0
        && deletion_bookkeeping(&o.meta, names::DESTROY_FAILED_AT).is_none()
        && !o.jobs.iter().any(|j| {
            job::operation_of(j) == Some(names::OPERATION_DESTROY)
                && job::attempt_of(j) == Some(attempt)
        });
    let errored = errored_uncovered(o, settings.decompression_cap);
    let blocker = blocker(o, &suffix, &namespace, errored.as_deref(), &mut findings);

    let facts = Facts {
        kind: o.kind,
        uid: o.meta.uid.clone().unwrap_or_default(),
        state_secret: names::state_secret_name(&suffix),
        deleting: o.meta.deletion_timestamp.is_some(),
        paused,
        unfinished_jobs,
        dependents: o.dependents.clone(),
        cleanup,
        applied,
        state,
        abandon: AbandonMark::of(
            annotation(&o.meta, names::ABANDON),
            o.meta.uid.as_deref().unwrap_or_default(),
        ),
        attempt,
        last_attempt,
        attempt_unstarted,
        blocker,
        errored_uncovered: errored.is_some(),
        refused: None,
        now: o.now,
        backoff: settings.backoff,
    };
    (facts, findings)
}

/// What a pass reads of an object's state, and beside it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StateWanted {
    /// The state, its lock and errored states, the inputs Secret and what it and the
    /// spec reference.
    WithInputs,
    /// The same without the inputs Secret and what it references ([`inputs_with_state`]).
    WithoutInputs,
    /// Before the first apply of an object that never applied nor adopted a state
    /// ([`apply::never_applied`]): as [`StateWanted::WithInputs`], except that a source
    /// that sees there is no Secret of its state and no inputs Secret without reading
    /// (the manager's caches of the object's Secrets and of state Secrets) takes both as
    /// absent. Nothing of this object's own can be there: Terraform writes its state only
    /// in an apply, which this object never started, and the inputs Secret is written
    /// when an apply succeeded; and a state someone else left there is taken as missing
    /// whatever it holds (its being there is the apply table's `foreign_state`, from the
    /// same caches).
    FirstApply,
    /// For a deletion's preview (`DeletionReady`), which starts nothing: as
    /// [`StateWanted::WithInputs`], except that a source that kept the inputs Secret at
    /// the version its caches show serves it without reading.
    Preview,
    /// For a pass that records an apply's end, which starts nothing either: as
    /// [`StateWanted::Preview`], and the inputs Secret is taken as absent without reading
    /// when the cache of the object's Secrets shows none and the manager kept none it
    /// wrote. Only the manager writes it (the record of an apply's end; its own write is
    /// kept until the watch brings it), and the record's create of one is refused if it
    /// is there after all: the pass fails, and the next one decides again.
    Record,
}

impl StateWanted {
    /// What a pass reads with the state ([`inputs_with_state`]); a pass that records an
    /// apply's end: [`StateWanted::Record`].
    pub fn for_pass(o: &Observed) -> StateWanted {
        match (inputs_with_state(o), apply::unrecorded_apply(o).is_some()) {
            (true, true) => StateWanted::Record,
            (true, false) => StateWanted::WithInputs,
            (false, _) => StateWanted::WithoutInputs,
        }
    }

    /// What a live pass reads before an apply would start.
    pub fn before_apply(o: &Observed) -> StateWanted {
        match apply::never_applied(&o.meta) {
            true => StateWanted::FirstApply,
            false => StateWanted::WithInputs,
        }
    }

    /// Whether the inputs Secret is read (unless seen absent: [`StateWanted::FirstApply`],
    /// [`StateWanted::Record`], or kept: [`StateWanted::Preview`], [`StateWanted::Record`]).
    pub fn inputs(self) -> bool {
        self != StateWanted::WithoutInputs
    }
}

/// Whether a pass reads the inputs Secret, and what it and the spec reference, with the
/// state. Not after a destroy attempt of this deletion succeeded, unless an apply's end is
/// still to be recorded: the state that destroy left is expected to list nothing, and row 8
/// cleans up a state that lists nothing whatever the inputs say (the cleanup finds the
/// inputs Secret among the object's Secrets). A state that lists something after all is
/// followed by that read ([`inputs_wanted_after`]).
pub fn inputs_with_state(o: &Observed) -> bool {
    let name = o.meta.name.as_deref().unwrap_or_default();
    let succeeded = matches!(
        destroy_history(o, &names::state_suffix(o.kind, name)).1,
        rules::LastAttempt::Succeeded { .. }
    );
    o.meta.deletion_timestamp.is_none() || !succeeded || apply::unrecorded_apply(o).is_some()
}

/// Whether a pass that read the state without the inputs ([`inputs_with_state`]) must read
/// them now: unless the state read lists no managed resource instance, what is decided
/// may rest on them (a destroy to start, a blocker to name).
pub fn inputs_wanted_after(o: &Observed, settings: &Settings) -> bool {
    !matches!(
        gather(o, settings).0.state,
        rules::StateFacts::Readable {
            managed_instances: 0,
            ..
        }
    )
}

/// The facts of a TerraformCluster's disposal (its Cluster's mark and hold, its own
/// record); none for the other kinds.
pub fn disposal_facts(
    o: &Observed,
    default_retention: std::time::Duration,
) -> Option<rules::disposal::DisposalFacts> {
    if o.kind != Kind::TerraformCluster {
        return None;
    }
    let cluster = o.cluster.as_ref();
    Some(rules::disposal::DisposalFacts {
        namespace: o.meta.namespace.clone().unwrap_or_default(),
        cluster: cluster.map(|c| c.name.clone()).unwrap_or_default(),
        mark: cluster.and_then(|c| c.dispose_after.clone()),
        hold: cluster.and_then(|c| c.disposal_hold.clone()),
        cluster_deleting: cluster.is_some_and(|c| c.deleting),
        paused: pause_cause(o).map(|c| c.describe()),
        requested_at: annotation(&o.meta, names::DISPOSAL_REQUESTED_AT)
            .and_then(|v| v.parse::<Timestamp>().ok()),
        default_retention,
        now: o.now,
    })
}

/// Gathers the facts and decides, in one call, with every Job taken to render (as
/// `captf explain` does: it has no say over the manager's templates).
pub fn decide(o: &Observed, settings: &Settings) -> (rules::Decision, Facts, Findings) {
    let (decision, facts, findings, _) = decide_rendering(o, settings, None, |_, _| Ok(()));
    (decision, facts, findings)
}

/// Gathers the facts and decides, once. When a destroy could start (the object is being
/// deleted, its state is readable with instances and no row before the state's decides,
/// its inputs are usable and nothing else keeps a destroy from starting), the
/// attempt it would start is rendered first with `render(attempt, inputs)`: a Job that
/// does not render is one more thing that keeps the destroy from starting (row 9), and one
/// that does is handed back for the controller to create. `refused`: why the API server
/// refused what the manager's last try at that attempt needed, remembered since: the
/// attempt is tried again, and the conditions say why it has not started
/// ([`Facts::refused`]).
pub fn decide_rendering<T>(
    o: &Observed,
    settings: &Settings,
    refused: Option<&str>,
    render: impl FnOnce(u32, &Inputs) -> Result<T, String>,
) -> (rules::Decision, Facts, Findings, Option<T>) {
    let (mut facts, findings) = gather(o, settings);
    let mut rendered = None;
    // Only where the table could start one: a readable state with instances that no row
    // before the state's decides (not on every pass while a Job runs).
    let could_start = facts.deleting
        && facts.blocker.is_none()
        && matches!(facts.state, rules::StateFacts::Readable { managed_instances, .. } if managed_instances > 0)
        && rules::state_needed(&facts);
    if could_start && let Some(inputs) = findings.inputs.as_ref() {
        match render(facts.next_attempt(), inputs) {
            Ok(t) => {
                rendered = Some((facts.next_attempt(), t));
                facts.refused = refused.map(str::to_string);
            }
            Err(e) => facts.blocker = Some(rules::Blocker::JobDoesNotRender(e)),
        }
    }
    let decision = rules::decide(&facts);
    let rendered = match (decision.action.start_attempt(), rendered) {
        (Some(n), Some((m, t))) if n == m => Some(t),
        _ => None,
    };
    (decision, facts, findings, rendered)
}

#[cfg(test)]
mod tests;
