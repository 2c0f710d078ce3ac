//! The rule table of SPEC section 4: one pure function from the facts of a pass to a
//! decision. No client and no clock: the time is a fact. Shared by the controllers and by
//! `captf explain`, so that what explain prints is what the controller does.

use std::time::Duration;

use jiff::Timestamp;
use serde::Serialize;
use sha2::{Digest, Sha256};

use crate::api::Kind;
use crate::api::conditions::{self as cond, Desired, Status, reason};

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
    fn describe(&self) -> String {
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
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StateFacts {
    /// Not read: rows 1 to 3 or the cleanup marker decide before the state matters.
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

    fn note(&self, uid: &str) -> String {
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
    LockHeld { holder: String, age: Option<String> },
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
    fn describe(&self) -> String {
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
            Blocker::LockHeld { holder, age } => match age {
                Some(age) => format!(
                    "Terraform's state lock is held by {holder} since {age}; it is never broken by CAPTF"
                ),
                None => format!(
                    "Terraform's state lock is held by {holder}; it is never broken by CAPTF"
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
            Blocker::Refused(why) => {
                format!("the API server refused what the destroy needs: {why}")
            }
        }
    }
}

/// The retry schedule: exponential from `base`, capped at `max`, jittered deterministically.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Backoff {
    pub base: Duration,
    pub max: Duration,
}

impl Default for Backoff {
    fn default() -> Self {
        Backoff {
            base: Duration::from_secs(30),
            max: Duration::from_secs(30 * 60),
        }
    }
}

impl Backoff {
    /// The delay after failed attempt `attempt` (1-based): `base * 2^(attempt-1)`, capped at
    /// `max`, less a jitter of up to 20% derived from the object's uid and the attempt, so
    /// that many objects failing together do not retry together, and a restart computes
    /// the same value again.
    pub fn delay(&self, attempt: u32, uid: &str) -> Duration {
        let exp = attempt.saturating_sub(1).min(32);
        let raw = self.base.saturating_mul(1u32 << exp.min(31));
        let capped = raw.min(self.max);
        let digest = Sha256::digest(format!("{uid}/{attempt}").as_bytes());
        let fraction = f64::from(u16::from_be_bytes([digest[0], digest[1]])) / f64::from(u16::MAX);
        capped.mul_f64(1.0 - 0.2 * fraction)
    }
}

/// Everything one pass knows, gathered once (see `facts.rs`).
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
    pub now: Timestamp,
    pub backoff: Backoff,
}

/// What the controller does with the pass.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum Action {
    NotDeleting,
    BookkeepingOnly,
    WaitForJob,
    WaitForDependents,
    RemoveFinalizer,
    Hold,
    StartDestroy,
    CleanUp,
    RetryLater,
    Abandon,
}

/// The decision of one pass.
#[derive(Clone, Debug, PartialEq)]
pub struct Decision {
    /// 1–9, or None when the object is not being deleted.
    pub row: Option<u8>,
    pub action: Action,
    /// Every condition the pass sets, Deleting first.
    pub conditions: Vec<Desired>,
    pub runbook: Option<&'static str>,
    pub next_retry_at: Option<Timestamp>,
    /// The attempt whose Job the controller starts now (row 7, or row 9 once the delay
    /// has passed and nothing blocks the start).
    pub start_attempt: Option<u32>,
}

impl Decision {
    /// The `Deleting` condition of the decision.
    pub fn deleting(&self) -> &Desired {
        // Every decision sets Deleting first (see `finish`).
        &self.conditions[0]
    }
}

pub const RUNBOOK_PAUSED: &str = "runbooks/Paused.md";
pub const RUNBOOK_WAITING_FOR_JOB: &str = "runbooks/WaitingForJob.md";
pub const RUNBOOK_DEPENDENTS_EXIST: &str = "runbooks/DependentsExist.md";
pub const RUNBOOK_STATE_LOST: &str = "runbooks/StateLost.md";
pub const RUNBOOK_STATE_CORRUPT: &str = "runbooks/StateCorrupt.md";
pub const RUNBOOK_STATE_ENCRYPTED: &str = "runbooks/StateEncrypted.md";
pub const RUNBOOK_STATE_INCONSISTENT: &str = "runbooks/StateInconsistent.md";
pub const RUNBOOK_DESTROY_FAILED: &str = "runbooks/DestroyFailed.md";
pub const RUNBOOK_DESTROY_CANNOT_START: &str = "runbooks/DestroyCannotStart.md";
pub const RUNBOOK_ABANDON: &str = "runbooks/Abandon.md";
pub const RUNBOOK_OWNER_GONE: &str = "runbooks/OwnerGone.md";
pub const RUNBOOK_ERRORED_STATE: &str = "runbooks/ErroredState.md";

/// The rows as the docs list them: number, situation, Deleting reason. The docs test
/// checks that the overview page's table matches this list.
pub const ROWS: [(u8, &str, &str); 9] = [
    (1, "the object or its Cluster is paused", reason::PAUSED),
    (
        2,
        "a Job or Pod of the object has not finished",
        reason::WAITING_FOR_JOB,
    ),
    (
        3,
        "a TerraformCluster whose machines or pools still exist",
        reason::WAITING_FOR_DEPENDENTS,
    ),
    (
        4,
        "no state Secret, and the object never applied",
        reason::RELEASED,
    ),
    (
        5,
        "no state Secret, and the object applied before",
        reason::HELD,
    ),
    (
        6,
        "a state that cannot be read, or cannot be trusted",
        reason::HELD,
    ),
    (
        7,
        "a readable state with managed resource instances, no finished destroy attempt, and a destroy can start",
        reason::DESTROY_RUNNING,
    ),
    (
        8,
        "a readable state with no managed resource instance, or cleanup already started",
        reason::CLEANING_UP,
    ),
    (
        9,
        "a finished destroy attempt left instances, or a destroy cannot start",
        "DestroyFailed or DestroyCannotStart",
    ),
];

/// The rule table. Rows are evaluated in order; the first that applies decides.
pub fn decide(f: &Facts) -> Decision {
    let paused = paused_condition(f);
    if !f.deleting {
        let d = Desired::new(cond::DELETING, Status::False, reason::NOT_DELETING, "");
        return finish(
            None,
            Action::NotDeleting,
            d,
            vec![paused, not_blocked()],
            None,
            None,
            None,
        );
    }
    let ready = Desired::new(
        cond::READY,
        Status::False,
        reason::DELETING,
        "the object is being deleted",
    );

    // Row 1: paused. Only Job bookkeeping.
    if let Some(cause) = &f.paused {
        let msg = format!(
            "paused because {}: no Job is started and nothing is released until it is unpaused; see {RUNBOOK_PAUSED}",
            cause.describe()
        );
        let d = Desired::new(cond::DELETING, Status::True, reason::PAUSED, msg);
        return finish(
            Some(1),
            Action::BookkeepingOnly,
            d,
            vec![paused, ready],
            Some(RUNBOOK_PAUSED),
            None,
            None,
        );
    }

    // Row 2: a Job or Pod has not finished.
    if !f.unfinished_jobs.is_empty() {
        let list: Vec<String> = f
            .unfinished_jobs
            .iter()
            .map(|j| match &j.detail {
                Some(d) => format!("{} Job {} ({d})", j.operation, j.name),
                None => format!("{} Job {}", j.operation, j.name),
            })
            .collect();
        let msg = format!(
            "waiting for {} to finish; see {RUNBOOK_WAITING_FOR_JOB}",
            list.join(", ")
        );
        let d = Desired::new(cond::DELETING, Status::True, reason::WAITING_FOR_JOB, msg);
        return finish(
            Some(2),
            Action::WaitForJob,
            d,
            vec![paused, not_blocked(), ready],
            Some(RUNBOOK_WAITING_FOR_JOB),
            None,
            None,
        );
    }

    // Row 3: a cluster with machines or pools left.
    if f.kind == Kind::TerraformCluster && !f.dependents.is_empty() {
        let names = f.dependents.join(", ");
        let msg = format!(
            "waiting for {} machine(s) or pool(s) to be deleted first: {names}; see {RUNBOOK_DEPENDENTS_EXIST}",
            f.dependents.len()
        );
        let blocked = Desired::new(
            cond::DELETION_BLOCKED,
            Status::True,
            reason::DEPENDENTS_EXIST,
            msg.clone(),
        );
        let d = Desired::new(
            cond::DELETING,
            Status::True,
            reason::WAITING_FOR_DEPENDENTS,
            msg,
        );
        return finish(
            Some(3),
            Action::WaitForDependents,
            d,
            vec![paused, blocked, ready],
            Some(RUNBOOK_DEPENDENTS_EXIST),
            None,
            None,
        );
    }

    let mut others = vec![paused, not_blocked(), ready];

    // The cleanup marker sends the pass to row 8 before rows 4 to 7 and 9.
    match f.cleanup {
        Some(CleanupMarker::Destroyed) => {
            let msg = "cleanup after a successful destroy is under way: deleting the Jobs, the state, inputs and backup Secrets, then the finalizer";
            let d = Desired::new(cond::DELETING, Status::True, reason::CLEANING_UP, msg);
            return finish(Some(8), Action::CleanUp, d, others, None, None, None);
        }
        Some(CleanupMarker::Abandoned) => {
            let msg = format!(
                "the abandon release is under way: the state, inputs and backup Secrets are kept and marked abandoned; see {RUNBOOK_ABANDON}"
            );
            let d = Desired::new(cond::DELETING, Status::True, reason::ABANDONING, msg);
            return finish(
                Some(8),
                Action::Abandon,
                d,
                others,
                Some(RUNBOOK_ABANDON),
                None,
                None,
            );
        }
        None => {}
    }

    match &f.state {
        // Rows 4 and 5 need the state read; a caller that did not read it gets row 5's
        // caution rather than a release.
        StateFacts::NotRead | StateFacts::Missing => {
            if !f.applied && f.state == StateFacts::Missing {
                others.push(Desired::new(
                    cond::STATE_READABLE,
                    Status::False,
                    reason::NO_STATE,
                    format!(
                        "no state Secret {} and the object never applied: nothing to destroy",
                        f.state_secret
                    ),
                ));
                let d = Desired::new(
                    cond::DELETING,
                    Status::True,
                    reason::RELEASED,
                    "never applied and no state: the finalizer comes off",
                );
                return finish(
                    Some(4),
                    Action::RemoveFinalizer,
                    d,
                    others,
                    None,
                    None,
                    None,
                );
            }
            let msg = format!(
                "no state Secret {} although the object applied before: CAPTF cannot tell what exists; restore the state or abandon; see {RUNBOOK_STATE_LOST}",
                f.state_secret
            );
            others.push(Desired::new(
                cond::STATE_READABLE,
                Status::False,
                reason::STATE_LOST,
                msg.clone(),
            ));
            held(5, f, msg, RUNBOOK_STATE_LOST, others)
        }
        StateFacts::Unreadable { why, message } => {
            let runbook = match why {
                Unreadable::Corrupt => RUNBOOK_STATE_CORRUPT,
                Unreadable::Encrypted => RUNBOOK_STATE_ENCRYPTED,
                Unreadable::Inconsistent => RUNBOOK_STATE_INCONSISTENT,
            };
            let msg = if message.contains(runbook) {
                message.clone()
            } else {
                format!("{message}; see {runbook}")
            };
            others.push(Desired::new(
                cond::STATE_READABLE,
                Status::False,
                why.reason(),
                msg.clone(),
            ));
            held(6, f, msg, runbook, others)
        }
        StateFacts::Readable {
            managed_instances,
            lineage,
            serial,
            secret,
        } => {
            others.push(Desired::new(
                cond::STATE_READABLE,
                Status::True,
                reason::READABLE,
                format!("state {secret}: {managed_instances} managed resource instance(s), lineage {lineage}, serial {serial}"),
            ));
            readable(f, *managed_instances, others)
        }
    }
}

/// Rows 7, 8 and 9 for a readable state.
fn readable(f: &Facts, managed: u64, others: Vec<Desired>) -> Decision {
    // Row 8: nothing left to destroy (whether a destroy ran or the state was empty) ...
    // unless an errored state records instances the state does not and no destroy of
    // this deletion succeeded (one starts only once the errored states are covered): after
    // an apply that could not save its state, the errored state may be the only record of
    // what exists. Then row 9 holds, as for a destroy that cannot start.
    let errored_hold = f.errored_uncovered
        && !matches!(f.last_attempt, LastAttempt::Succeeded { .. })
        && f.blocker.is_some();
    if managed == 0 && !errored_hold {
        let msg = "the state describes no managed resource instance: cleaning up, then the finalizer comes off";
        let d = Desired::new(cond::DELETING, Status::True, reason::CLEANING_UP, msg);
        return finish(Some(8), Action::CleanUp, d, others, None, None, None);
    }
    let next = if f.attempt_unstarted && f.last_attempt == LastAttempt::NoneFinished {
        f.attempt
    } else {
        f.attempt + 1
    };
    let failure = match &f.last_attempt {
        LastAttempt::NoneFinished => None,
        LastAttempt::Succeeded { at } => Some((
            *at,
            format!(
                "destroy attempt {} reported success but the state still describes {managed} managed resource instance(s)",
                f.attempt
            ),
        )),
        LastAttempt::Failed { at, error } => Some((
            *at,
            format!("destroy attempt {} failed: {error}", f.attempt),
        )),
    };
    match (failure, &f.blocker) {
        // Row 7: untried, and nothing keeps the Job from starting.
        (None, None) => {
            let msg = format!(
                "destroy attempt {next} is starting for {managed} managed resource instance(s)"
            );
            let d = Desired::new(cond::DELETING, Status::True, reason::DESTROY_RUNNING, msg);
            finish(
                Some(7),
                Action::StartDestroy,
                d,
                others,
                None,
                None,
                Some(next),
            )
        }
        // Row 9: a destroy cannot start. Checked again on every change and at least at
        // the backoff schedule.
        (failure, Some(blocker)) => {
            let retry_at = match &failure {
                Some((Some(at), _)) => add(*at, f.backoff.delay(f.attempt, &f.uid)).max(f.now),
                _ => add(f.now, f.backoff.base),
            };
            let history = match &failure {
                Some((_, text)) => format!(" ({text})"),
                None => String::new(),
            };
            // An owner gone and an errored state are runbooks of their own, and
            // DeletionBlocked says so.
            let own = match blocker {
                Blocker::OwnerGone(_) => Some((reason::OWNER_GONE, RUNBOOK_OWNER_GONE)),
                Blocker::ErroredState(_) => Some((reason::ERRORED_STATE, RUNBOOK_ERRORED_STATE)),
                _ => None,
            };
            let (runbook, others) = match own {
                Some((why, runbook)) => {
                    let others = others
                        .into_iter()
                        .map(|c| {
                            if c.type_ == cond::DELETION_BLOCKED {
                                Desired::new(
                                    cond::DELETION_BLOCKED,
                                    Status::True,
                                    why,
                                    format!("{}; see {runbook}", blocker.describe()),
                                )
                            } else {
                                c
                            }
                        })
                        .collect();
                    (runbook, others)
                }
                None => (RUNBOOK_DESTROY_CANNOT_START, others),
            };
            // No time in the message: it would change on every pass and rewrite the status.
            let msg = format!(
                "destroy attempt {next} cannot start: {}{history}; checked again whenever anything it depends on changes, and at least every {}s; see {runbook}",
                blocker.describe(),
                f.backoff.base.as_secs().max(1)
            );
            retry(
                f,
                reason::DESTROY_CANNOT_START,
                msg,
                runbook,
                others,
                retry_at,
                None,
            )
        }
        // Row 9: a finished attempt left instances: retry with backoff, forever.
        (Some((at, text)), None) => {
            let at = at.unwrap_or(f.now);
            let retry_at = add(at, f.backoff.delay(f.attempt.max(1), &f.uid));
            let due = retry_at <= f.now;
            let msg = if due {
                format!("{text}; starting attempt {next} now; see {RUNBOOK_DESTROY_FAILED}")
            } else {
                format!("{text}; attempt {next} at {retry_at}; see {RUNBOOK_DESTROY_FAILED}")
            };
            retry(
                f,
                reason::DESTROY_FAILED,
                msg,
                RUNBOOK_DESTROY_FAILED,
                others,
                retry_at,
                due.then_some(next),
            )
        }
    }
}

/// Rows 5 and 6: held, unless the abandon annotation releases it.
fn held(row: u8, f: &Facts, msg: String, runbook: &'static str, others: Vec<Desired>) -> Decision {
    if f.abandon == AbandonMark::ThisObject {
        return abandon(row, msg, others);
    }
    if let AbandonMark::CannotFinish(why) = &f.abandon {
        return abandon_cannot_finish(row, why, others);
    }
    let msg = format!("{msg}{}", f.abandon.note(&f.uid));
    let d = Desired::new(cond::DELETING, Status::True, reason::HELD, msg);
    finish(
        Some(row),
        Action::Hold,
        d,
        others,
        Some(runbook),
        None,
        None,
    )
}

/// Row 9: retried later, unless the abandon annotation releases it.
fn retry(
    f: &Facts,
    why: &'static str,
    msg: String,
    runbook: &'static str,
    others: Vec<Desired>,
    retry_at: Timestamp,
    start: Option<u32>,
) -> Decision {
    if f.abandon == AbandonMark::ThisObject {
        return abandon(9, msg, others);
    }
    if let AbandonMark::CannotFinish(why) = &f.abandon {
        return abandon_cannot_finish(9, why, others);
    }
    let msg = format!("{msg}{}", f.abandon.note(&f.uid));
    let d = Desired::new(cond::DELETING, Status::True, why, msg);
    finish(
        Some(9),
        Action::RetryLater,
        d,
        others,
        Some(runbook),
        Some(retry_at),
        start,
    )
}

fn abandon(row: u8, why_held: String, others: Vec<Desired>) -> Decision {
    let msg = format!(
        "abandoned by the operator ({}): releasing without a destroy, keeping the state, inputs and backup Secrets; see {RUNBOOK_ABANDON}. Held because: {why_held}",
        crate::api::names::ABANDON
    );
    let d = Desired::new(cond::DELETING, Status::True, reason::ABANDONING, msg);
    finish(
        Some(row),
        Action::Abandon,
        d,
        others,
        Some(RUNBOOK_ABANDON),
        None,
        None,
    )
}

/// An abandon that cannot finish: held, saying why, nothing released.
fn abandon_cannot_finish(row: u8, why: &str, others: Vec<Desired>) -> Decision {
    let msg = format!("the abandon cannot finish: {why}; see {RUNBOOK_ABANDON}");
    let d = Desired::new(cond::DELETING, Status::True, reason::HELD, msg);
    finish(
        Some(row),
        Action::Hold,
        d,
        others,
        Some(RUNBOOK_ABANDON),
        None,
        None,
    )
}

fn finish(
    row: Option<u8>,
    action: Action,
    deleting: Desired,
    others: Vec<Desired>,
    runbook: Option<&'static str>,
    next_retry_at: Option<Timestamp>,
    start_attempt: Option<u32>,
) -> Decision {
    // clusterctl describe shows an infrastructure object's Ready only (and a Machine's
    // InfrastructureReady copies it): during a deletion it says what the deletion waits on.
    let others = others.into_iter().map(|mut c| {
        if c.type_ == cond::READY && c.reason == reason::DELETING {
            c.message = format!(
                "the object is being deleted: {}: {}",
                deleting.reason, deleting.message
            );
        }
        c
    });
    let mut conditions = vec![deleting.clone()];
    conditions.extend(others);
    Decision {
        row,
        action,
        conditions,
        runbook,
        next_retry_at,
        start_attempt,
    }
}

fn paused_condition(f: &Facts) -> Desired {
    match &f.paused {
        Some(cause) => Desired::new(
            cond::PAUSED,
            Status::True,
            reason::PAUSED,
            format!("paused because {}", cause.describe()),
        ),
        None => Desired::new(cond::PAUSED, Status::False, reason::NOT_PAUSED, ""),
    }
}

fn not_blocked() -> Desired {
    Desired::new(
        cond::DELETION_BLOCKED,
        Status::False,
        reason::NOT_BLOCKED,
        "",
    )
}

fn add(t: Timestamp, d: Duration) -> Timestamp {
    let ms = i64::try_from(d.as_millis()).unwrap_or(i64::MAX / 4);
    Timestamp::from_millisecond(t.as_millisecond().saturating_add(ms)).unwrap_or(Timestamp::MAX)
}

#[cfg(test)]
mod tests;
