//! The facts of a pass, the rule table's whole input, and their vocabulary: what the
//! gatherer (`crate::gather`) finds in an observation, in the terms the rows speak.

use jiff::Timestamp;

use super::{Backoff, RUNBOOK_ABANDON};
use crate::api::Kind;
use crate::api::conditions::reason;

/// Why an object counts as paused (SPEC section 2).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PauseCause {
    /// The object's own `cluster.x-k8s.io/paused` annotation.
    ObjectAnnotation,
    /// The owning Cluster's `spec.paused: true`.
    ClusterSpec(String),
    /// The owning Cluster's `cluster.x-k8s.io/paused` annotation.
    ClusterAnnotation(String),
    /// `clusterctl.cluster.x-k8s.io/delete-for-move` on the object.
    DeleteForMove,
    /// The object's CRD is being deleted (an uninstall is not a teardown).
    CrdDeleting,
    /// The object names a Cluster, but the manager does not know Cluster API's Cluster
    /// kind (not installed yet, or its discovery failed): a pause of that Cluster could
    /// not be seen, so none is assumed away.
    ClusterUnknown { cluster: String, why: String },
}

impl PauseCause {
    pub fn describe(&self) -> String {
        match self {
            PauseCause::ObjectAnnotation => "the object carries cluster.x-k8s.io/paused".into(),
            PauseCause::ClusterSpec(c) => format!("its Cluster {c} has spec.paused: true"),
            PauseCause::ClusterAnnotation(c) => format!("its Cluster {c} carries cluster.x-k8s.io/paused"),
            PauseCause::DeleteForMove => {
                "it carries clusterctl.cluster.x-k8s.io/delete-for-move (clusterctl move is deleting the source copy)".into()
            }
            PauseCause::CrdDeleting => "its CustomResourceDefinition is being deleted (an uninstall, not a teardown)".into(),
            PauseCause::ClusterUnknown { cluster, why } => format!(
                "it names Cluster {cluster}, and whether that Cluster is paused cannot be seen: {why}"
            ),
        }
    }
}

/// A Job or Pod of the object that has not finished.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UnfinishedJob {
    /// The Job's name (or the Pod's, when only a Pod is left).
    pub name: String,
    /// `apply` or `destroy`, from the operation label.
    pub operation: String,
    /// What the operator should know beside its name: the Pod's waiting reason ("its Pod
    /// is waiting: ImagePullBackOff"), or that it belongs to an earlier object of the same
    /// kind and name ("of an earlier TerraformMachine web-1").
    pub detail: Option<String>,
}

impl UnfinishedJob {
    /// "destroy Job NAME (DETAIL)", as the conditions name it.
    pub fn describe(&self) -> String {
        match &self.detail {
            Some(d) => format!("{} Job {} ({d})", self.operation, self.name),
            None => format!("{} Job {}", self.operation, self.name),
        }
    }

    /// The Jobs of `jobs`, described, one after the other.
    pub fn list(jobs: &[UnfinishedJob]) -> String {
        let described: Vec<String> = jobs.iter().map(UnfinishedJob::describe).collect();
        described.join(", ")
    }
}

/// The cleanup marker (`A/cleanup-started`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CleanupMarker {
    Destroyed,
    Abandoned,
}

/// Why a state cannot be read or trusted (row 6).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unreadable {
    Corrupt,
    Encrypted,
    Inconsistent,
}

impl Unreadable {
    pub fn reason(self) -> &'static str {
        match self {
            Unreadable::Corrupt => reason::STATE_CORRUPT,
            Unreadable::Encrypted => reason::STATE_ENCRYPTED,
            Unreadable::Inconsistent => reason::STATE_INCONSISTENT,
        }
    }
}

/// What the pass knows of the state.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum StateFacts {
    /// Not read: rows 1 to 3 or the cleanup marker decide before the state matters.
    #[default]
    NotRead,
    /// No base state Secret.
    Missing,
    /// A state that cannot be read, or cannot be trusted; the message says why.
    Unreadable { why: Unreadable, message: String },
    /// A readable state.
    Readable {
        managed_instances: u64,
        lineage: String,
        serial: u64,
        secret: String,
    },
}

/// The abandon annotation as the pass sees it. An abandon names the object it is meant
/// for: its value must be the object's uid, so that one left in a GitOps repository or a
/// saved YAML does not release a later object of the same name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AbandonMark {
    /// No abandon annotation.
    Absent,
    /// The annotation holds this object's uid: rows 5, 6 and 9 release.
    ThisObject,
    /// The annotation holds something else (`"true"`, another object's uid): ignored, and
    /// the held condition says so.
    Ignored(String),
    /// The annotation holds this object's uid, but the release cannot finish: what keeps
    /// it (the manager could not copy the kept Secrets out of a terminating namespace).
    /// Only the manager, which tried, knows this; the object is held, nothing released.
    CannotFinish(String),
}

impl AbandonMark {
    /// Reads the annotation's value against the object's uid.
    pub fn of(value: Option<&str>, uid: &str) -> AbandonMark {
        match value {
            None => AbandonMark::Absent,
            Some(v) if !uid.is_empty() && v.trim() == uid => AbandonMark::ThisObject,
            Some(v) => AbandonMark::Ignored(v.to_string()),
        }
    }

    pub(super) fn note(&self, uid: &str) -> String {
        match self {
            AbandonMark::Ignored(v) => {
                let shown: String = v.chars().take(80).collect();
                format!(
                    "; the abandon annotation {} is {shown:?}, not this object's uid {uid}, and is ignored (see {RUNBOOK_ABANDON})",
                    crate::api::names::ABANDON
                )
            }
            _ => String::new(),
        }
    }
}

/// The outcome of the latest destroy attempt of this deletion.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LastAttempt {
    /// No attempt of this deletion has finished (none started, or its Job not created yet).
    NoneFinished,
    /// The attempt's Job completed at `at` (whether the state agrees is checked against
    /// the state; a retry falls due one backoff delay after `at`).
    Succeeded { at: Option<Timestamp> },
    /// The attempt failed at `at`; `error` is Terraform's error tail or the Job's reason.
    Failed {
        at: Option<Timestamp>,
        error: String,
    },
}

/// Why a destroy Job cannot start now.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Blocker {
    /// The inputs are missing or unusable; the message says which and why.
    Inputs(String),
    /// A credentials Secret or key the inputs reference is missing.
    Credentials { secret: String, key: String },
    /// The namespace is terminating: Kubernetes refuses new Jobs there.
    NamespaceTerminating(String),
    /// Terraform's lock is held by something that is not a gone Pod of this object.
    LockHeld {
        holder: String,
        age: Option<String>,
        why: String,
    },
    /// The attempt's Job does not render from the inputs and the manager's templates (an
    /// inline module too large for the Pod, a template the operator broke). Only the
    /// manager knows its templates, so only it reports this; `captf explain` cannot.
    JobDoesNotRender(String),
    /// A Cluster API owner of the object (Cluster, Machine, MachinePool) is gone, or is a
    /// new object of its name. Cluster API keeps those owners until their infrastructure
    /// is deleted, so this means clusterctl move (the infrastructure now belongs to the
    /// target) or stripped finalizers: nothing is destroyed unless the operator says so.
    OwnerGone(String),
    /// A state Terraform could not save (`errored.tfstate`, kept by a runner) lists managed
    /// resource instances the state does not, or cannot be read: they may be live, and a
    /// destroy against the state would leave them. Which, and why, for the message.
    ErroredState(String),
    /// The API server refused something the attempt needs (the Job, the backup Secret, the
    /// runner RBAC): an admission policy, a quota, a missing permission. The API's message.
    /// Only the manager, which tried, reports this; `captf explain` cannot.
    Refused(String),
}

impl Blocker {
    pub(super) fn describe(&self) -> String {
        match self {
            Blocker::Inputs(m) => m.clone(),
            Blocker::Credentials { secret, key } => {
                format!(
                    "the credentials Secret {secret} (key {key}) that the inputs reference is missing; create it"
                )
            }
            Blocker::NamespaceTerminating(ns) => format!(
                "namespace {ns} is terminating and Kubernetes refuses new Jobs there; run the destroy from another namespace or abandon"
            ),
            Blocker::LockHeld { holder, age, why } => match age {
                Some(age) => format!(
                    "Terraform's state lock is held by {holder} since {age}; {why}; it is never broken by CAPTF"
                ),
                None => format!(
                    "Terraform's state lock is held by {holder}; {why}; it is never broken by CAPTF"
                ),
            },
            Blocker::JobDoesNotRender(why) => format!(
                "its Job does not render ({why}); fix the inputs, or the manager's --templates-dir"
            ),
            Blocker::OwnerGone(which) => format!(
                "its Cluster API owner is gone ({which}); Cluster API keeps an owner until its infrastructure is deleted, so clusterctl move or a stripped finalizer took it, and the infrastructure may now belong to another cluster: nothing is destroyed; abandon, or set {} to this object's uid to destroy on purpose",
                crate::api::names::DESTROY_WITHOUT_OWNER
            ),
            Blocker::ErroredState(what) => format!(
                "{what}; a destroy against the state would leave them: merge the errored state into the state with captf state restore --from-errored, or delete it once they are confirmed gone, or abandon"
            ),
            Blocker::Refused(why) => match crate::api::identity::refused_identity(why) {
                Some(why) => format!("the identity the destroy runs with cannot be used: {why}"),
                None => format!("the API server refused what the destroy needs: {why}"),
            },
        }
    }
}

/// Everything one pass knows, gathered once (see `crate::gather`).
#[derive(Clone, Debug)]
pub struct Facts {
    pub kind: Kind,
    pub uid: String,
    /// The base state Secret's name (`tfstate-default-<suffix>`), for messages.
    pub state_secret: String,
    pub deleting: bool,
    pub paused: Option<PauseCause>,
    pub unfinished_jobs: Vec<UnfinishedJob>,
    /// For a TerraformCluster: its machines and pools still there, as `Kind/name`.
    pub dependents: Vec<String>,
    pub cleanup: Option<CleanupMarker>,
    pub applied: bool,
    pub state: StateFacts,
    pub abandon: AbandonMark,
    /// The number in `A/destroy-attempt` (0 when none).
    pub attempt: u32,
    pub last_attempt: LastAttempt,
    /// The attempt in `A/destroy-attempt` was written but its Job never seen (a restart
    /// between the write-ahead record and the Job's creation): that same attempt starts,
    /// under the same Job name, so no attempt is lost or repeated.
    pub attempt_unstarted: bool,
    /// Why a destroy cannot start now, if anything keeps it.
    pub blocker: Option<Blocker>,
    /// An errored state records a managed resource instance the state does not, or cannot
    /// be read (then `blocker` says so, unless an earlier blocker does).
    pub errored_uncovered: bool,
    /// The API server refused what the last try at starting this attempt needed (the Job,
    /// the backup Secret, the runner RBAC), remembered by the manager since: a row that
    /// starts an attempt still starts it (the pass tries again), and its conditions say
    /// the refusal, as row 9 does for a destroy that cannot start. Only the manager, which
    /// tried, knows it; `captf explain` has none.
    pub refused: Option<String>,
    pub now: Timestamp,
    pub backoff: Backoff,
}

impl Facts {
    /// The attempt a destroy that starts now gets: the recorded one when its Job was never
    /// made (a restart between the write-ahead record and the Job), else the next one.
    pub fn next_attempt(&self) -> u32 {
        if self.attempt_unstarted && self.last_attempt == LastAttempt::NoneFinished {
            self.attempt
        } else {
            self.attempt + 1
        }
    }
}
