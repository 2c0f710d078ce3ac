//! The rule table of SPEC section 4: one pure function from the facts of a pass to a
//! decision. No client and no clock: the time is a fact. Shared by the controllers and by
//! `captf explain`, so that what explain prints is what the controller does.

use std::time::Duration;

use jiff::Timestamp;
use serde::Serialize;

use crate::api::Kind;
use crate::api::conditions::{self as cond, Desired, Status, reason};

pub mod apply;
mod backoff;
pub mod disposal;
mod facts;
mod preview;
mod readable;
mod row;
pub mod workload;

pub use backoff::Backoff;
pub use facts::*;
pub use preview::{Preview, deletion_ready, preview};
pub use row::*;

use readable::readable;

/// What the controller does with the pass, with what it needs to do it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    NotDeleting,
    BookkeepingOnly,
    WaitForJob,
    WaitForDependents,
    RemoveFinalizer,
    Hold,
    /// Row 7: start destroy attempt `attempt`.
    StartDestroy {
        attempt: u32,
    },
    CleanUp,
    /// Row 9: the next attempt is due `at`; `start` is the attempt to start now, once it
    /// is due and nothing keeps it from starting (the action stays `RetryLater`).
    RetryLater {
        at: Timestamp,
        start: Option<u32>,
    },
    Abandon,
}

impl Action {
    /// The action's name, as `captf explain` prints it (SPEC section 9).
    pub fn name(&self) -> &'static str {
        match self {
            Action::NotDeleting => "NotDeleting",
            Action::BookkeepingOnly => "BookkeepingOnly",
            Action::WaitForJob => "WaitForJob",
            Action::WaitForDependents => "WaitForDependents",
            Action::RemoveFinalizer => "RemoveFinalizer",
            Action::Hold => "Hold",
            Action::StartDestroy { .. } => "StartDestroy",
            Action::CleanUp => "CleanUp",
            Action::RetryLater { .. } => "RetryLater",
            Action::Abandon => "Abandon",
        }
    }

    /// The attempt whose Job the controller starts now, if any.
    pub fn start_attempt(&self) -> Option<u32> {
        match *self {
            Action::StartDestroy { attempt } => Some(attempt),
            Action::RetryLater { start, .. } => start,
            _ => None,
        }
    }

    /// When the next destroy attempt is due (row 9).
    pub fn next_retry_at(&self) -> Option<Timestamp> {
        match *self {
            Action::RetryLater { at, .. } => Some(at),
            _ => None,
        }
    }
}

/// As its name.
impl Serialize for Action {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.name())
    }
}

/// The decision of one pass.
#[derive(Clone, Debug, PartialEq)]
pub struct Decision {
    /// The row that decided, or None when the object is not being deleted.
    pub row: Option<Row>,
    pub action: Action,
    /// The `Deleting` condition.
    pub deleting: Desired,
    /// The other conditions the pass sets (`StateReadable`, `DeletionBlocked`, `Paused`,
    /// `Ready`).
    pub others: Vec<Desired>,
    pub runbook: Option<&'static str>,
}

impl Decision {
    /// Every condition the pass sets, Deleting first.
    pub fn conditions(&self) -> impl Iterator<Item = &Desired> {
        std::iter::once(&self.deleting).chain(self.others.iter())
    }
}

/// Whether the state decides this pass: false when a row before the state's (1 to 3) or
/// the cleanup marker decides it whatever the state, as the table itself says when asked
/// with the state not read. The controller reads the state Secrets only when this is true.
pub fn state_needed(f: &Facts) -> bool {
    let unread = decide(&Facts {
        state: StateFacts::NotRead,
        ..f.clone()
    });
    match unread.row {
        None | Some(Row::Paused | Row::JobUnfinished | Row::DependentsExist) => false,
        // A destroy's cleanup under way reads the state once more: the marker never sends
        // a state that lists instances to cleanup (see `decide`).
        Some(Row::CleanUp) => f.cleanup == Some(CleanupMarker::Destroyed),
        Some(_) => true,
    }
}

/// The rule table. Rows are evaluated in order; the first that applies decides. An
/// attempt the API server refused last time ([`Facts::refused`]) is row 9's destroy that
/// cannot start, with the refusal as what keeps it, and a retry that is due: it starts the
/// attempt again, unless the abandon annotation releases it (row 9's abandon).
pub fn decide(f: &Facts) -> Decision {
    let d = decide_rows(f);
    let (Some(why), Some(attempt)) = (&f.refused, d.action.start_attempt()) else {
        return d;
    };
    let blocked = decide_rows(&Facts {
        blocker: Some(Blocker::Refused(why.clone())),
        refused: None,
        ..f.clone()
    });
    match blocked.action {
        Action::RetryLater { at, .. } => Decision {
            action: Action::RetryLater {
                at,
                start: Some(attempt),
            },
            ..blocked
        },
        // Row 9 with the abandon annotation: the abandon (or its hold when it cannot
        // finish), as its conditions say; not the start the refusal stopped.
        _ => blocked,
    }
}

/// What the manager says when the API server refuses what destroy attempt `attempt` needs
/// (its Event; the conditions of the next pass say it in full).
pub fn refused_message(attempt: u32, why: &str) -> String {
    format!(
        "destroy attempt {attempt} cannot start: {}; see {RUNBOOK_DESTROY_CANNOT_START}",
        Blocker::Refused(why.to_string()).describe()
    )
}

fn decide_rows(f: &Facts) -> Decision {
    let paused = paused_condition(f);
    if !f.deleting {
        let d = Desired::new(cond::DELETING, Status::False, reason::NOT_DELETING, "");
        return finish(
            None,
            Action::NotDeleting,
            d,
            vec![paused, not_blocked()],
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
            Some(Row::Paused),
            Action::BookkeepingOnly,
            d,
            vec![paused, ready],
            Some(RUNBOOK_PAUSED),
        );
    }

    // Row 2: a Job or Pod has not finished.
    if !f.unfinished_jobs.is_empty() {
        let msg = format!(
            "waiting for {} to finish; see {RUNBOOK_WAITING_FOR_JOB}",
            UnfinishedJob::list(&f.unfinished_jobs)
        );
        let d = Desired::new(cond::DELETING, Status::True, reason::WAITING_FOR_JOB, msg);
        return finish(
            Some(Row::JobUnfinished),
            Action::WaitForJob,
            d,
            vec![paused, not_blocked(), ready],
            Some(RUNBOOK_WAITING_FOR_JOB),
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
            Some(Row::DependentsExist),
            Action::WaitForDependents,
            d,
            vec![paused, blocked, ready],
            Some(RUNBOOK_DEPENDENTS_EXIST),
        );
    }

    let mut others = vec![paused, not_blocked(), ready];

    // The cleanup marker sends the pass to row 8 before rows 4 to 7 and 9: a crash in the
    // middle of the cleanup (the state Secret already deleted) never turns into a false
    // StateLost. It skips a state the cleanup began to delete, never one that reads with
    // managed resource instances (restored by an operator mid-cleanup, say): that goes
    // through the rows below like any other.
    let lists_instances = matches!(
        f.state,
        StateFacts::Readable { managed_instances, .. } if managed_instances > 0
    );
    match f.cleanup {
        Some(CleanupMarker::Destroyed) if lists_instances => {}
        Some(CleanupMarker::Destroyed) => {
            let msg = "cleanup after a successful destroy is under way: deleting the Jobs, the state, inputs and backup Secrets, then the finalizer";
            let d = Desired::new(cond::DELETING, Status::True, reason::CLEANING_UP, msg);
            return finish(Some(Row::CleanUp), Action::CleanUp, d, others, None);
        }
        Some(CleanupMarker::Abandoned) => {
            let msg = format!(
                "the abandon release is under way: the state, inputs and backup Secrets are kept and marked abandoned; see {RUNBOOK_ABANDON}"
            );
            let d = Desired::new(cond::DELETING, Status::True, reason::ABANDONING, msg);
            return finish(
                Some(Row::CleanUp),
                Action::Abandon,
                d,
                others,
                Some(RUNBOOK_ABANDON),
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
                    Some(Row::NeverApplied),
                    Action::RemoveFinalizer,
                    d,
                    others,
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
            held(Row::StateMissing, f, msg, RUNBOOK_STATE_LOST, others)
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
            held(Row::StateUntrusted, f, msg, runbook, others)
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

/// Rows 5 and 6: held, unless the abandon annotation releases it.
fn held(row: Row, f: &Facts, msg: String, runbook: &'static str, others: Vec<Desired>) -> Decision {
    if f.abandon == AbandonMark::ThisObject {
        return abandon(row, msg, others);
    }
    if let AbandonMark::CannotFinish(why) = &f.abandon {
        return abandon_cannot_finish(row, why, others);
    }
    let msg = format!("{msg}{}", f.abandon.note(&f.uid));
    let d = Desired::new(cond::DELETING, Status::True, reason::HELD, msg);
    finish(Some(row), Action::Hold, d, others, Some(runbook))
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
        return abandon(Row::FailedOrBlocked, msg, others);
    }
    if let AbandonMark::CannotFinish(why) = &f.abandon {
        return abandon_cannot_finish(Row::FailedOrBlocked, why, others);
    }
    let msg = format!("{msg}{}", f.abandon.note(&f.uid));
    let d = Desired::new(cond::DELETING, Status::True, why, msg);
    finish(
        Some(Row::FailedOrBlocked),
        Action::RetryLater {
            at: retry_at,
            start,
        },
        d,
        others,
        Some(runbook),
    )
}

fn abandon(row: Row, why_held: String, others: Vec<Desired>) -> Decision {
    let msg = format!(
        "abandoned by the operator ({}): releasing without a destroy, keeping the state, inputs and backup Secrets; see {RUNBOOK_ABANDON}. Held because: {why_held}",
        crate::api::names::ABANDON
    );
    let d = Desired::new(cond::DELETING, Status::True, reason::ABANDONING, msg);
    finish(Some(row), Action::Abandon, d, others, Some(RUNBOOK_ABANDON))
}

/// An abandon that cannot finish: held, saying why, nothing released.
fn abandon_cannot_finish(row: Row, why: &str, others: Vec<Desired>) -> Decision {
    let msg = format!("the abandon cannot finish: {why}; see {RUNBOOK_ABANDON}");
    let d = Desired::new(cond::DELETING, Status::True, reason::HELD, msg);
    finish(Some(row), Action::Hold, d, others, Some(RUNBOOK_ABANDON))
}

fn finish(
    row: Option<Row>,
    action: Action,
    deleting: Desired,
    others: Vec<Desired>,
    runbook: Option<&'static str>,
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
    let others = others.collect();
    Decision {
        row,
        action,
        deleting,
        others,
        runbook,
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

/// `t` plus `d`, saturating.
pub(crate) fn add(t: Timestamp, d: Duration) -> Timestamp {
    let ms = i64::try_from(d.as_millis()).unwrap_or(i64::MAX / 4);
    Timestamp::from_millisecond(t.as_millisecond().saturating_add(ms)).unwrap_or(Timestamp::MAX)
}

#[cfg(test)]
mod tests;
