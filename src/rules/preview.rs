//! `DeletionReady`: what a deletion of a live object would reach if it were asked now,
//! decided by the deletion's own table ([`decide`]) with the deletion assumed. Nothing
//! here gates a deletion: the condition only says, before anyone asks, whether the
//! deletion would destroy and release or be held, and why.
//!
//! The rows that only make a deletion wait (a pause, an unfinished Job, a cluster's
//! machines and pools) are set aside, so that the condition names the row the deletion
//! reaches once they are over; its message says what it would wait for first.

use super::*;

const BEING_DELETED: &str = "being deleted";

/// The preview of one object's deletion.
#[derive(Clone, Debug, PartialEq)]
pub struct Preview {
    /// The deletion table's decision with the deletion assumed, `None` when the state
    /// was not read (nothing can be said of it then).
    pub decision: Option<Decision>,
    /// The `DeletionReady` condition.
    pub ready: Desired,
}

impl Preview {
    /// The row the deletion would reach.
    pub fn row(&self) -> Option<Row> {
        self.decision.as_ref().and_then(|d| d.row)
    }

    pub fn runbook(&self) -> Option<&'static str> {
        self.decision.as_ref().and_then(|d| d.runbook)
    }
}

/// The preview of `f`, the facts of a live object's pass (its `deleting` is ignored).
pub fn preview(f: &Facts) -> Preview {
    if f.state == StateFacts::NotRead {
        return Preview {
            decision: None,
            ready: Desired::new(
                cond::DELETION_READY,
                Status::Unknown,
                reason::STATE_NOT_READ,
                "the state has not been read since the manager started or it last changed; it is read on the object's next pass",
            ),
        };
    }
    // A Job of the object that runs may be writing the state a deletion would decide on
    // (a first apply's, as Terraform goes): while there is none yet, nothing can be said
    // of it. A missing state is a lost state only once no Job runs.
    if f.state == StateFacts::Missing && !f.unfinished_jobs.is_empty() {
        return Preview {
            decision: None,
            ready: Desired::new(
                cond::DELETION_READY,
                Status::Unknown,
                reason::WAITING_FOR_JOB,
                format!(
                    "if deleted now: a deletion first waits for {} to finish, and decides on the state it leaves; it has written none yet",
                    UnfinishedJob::list(&f.unfinished_jobs)
                ),
            ),
        };
    }
    let assumed = Facts {
        deleting: true,
        paused: None,
        unfinished_jobs: Vec::new(),
        dependents: Vec::new(),
        cleanup: None,
        ..f.clone()
    };
    let decision = decide(&assumed);
    let ready = ready_of(&decision, "if deleted now", &waits(f));
    Preview {
        decision: Some(decision),
        ready,
    }
}

/// What a deletion of `f`'s object would wait for before the row [`preview`] names.
fn waits(f: &Facts) -> String {
    let mut w = Vec::new();
    if let Some(cause) = &f.paused {
        w.push(format!(
            "it is paused now ({}): a deletion waits until it is unpaused",
            cause.describe()
        ));
    }
    if !f.unfinished_jobs.is_empty() {
        w.push(format!(
            "a deletion first waits for {} to finish, and decides on the state it leaves",
            UnfinishedJob::list(&f.unfinished_jobs)
        ));
    }
    if f.kind == Kind::TerraformCluster && !f.dependents.is_empty() {
        w.push(format!(
            "a deletion first waits for its {} machine(s) and pool(s) to go: {}",
            f.dependents.len(),
            f.dependents.join(", ")
        ));
    }
    if w.is_empty() {
        String::new()
    } else {
        format!(" ({})", w.join("; "))
    }
}

/// The `DeletionReady` condition of an object being deleted, from its pass's decision:
/// the condition goes on saying whether the deletion will finish by itself.
pub fn deletion_ready(d: &Decision) -> Desired {
    ready_of(d, BEING_DELETED, "")
}

/// The `DeletionReady` condition of a decision on a deleting (or assumed deleting)
/// object: True when the deletion would end in a destroy or a release with nothing
/// destroyed; False with the row's own reason and runbook when it would be held or
/// could not start its destroy, or would release without a destroy (an abandon).
fn ready_of(d: &Decision, lead: &str, waits: &str) -> Desired {
    let row = d.row.map(|r| r.number()).unwrap_or_default();
    let (status, why, message) = match d.action {
        Action::StartDestroy { attempt } => (
            Status::True,
            reason::DESTROY_WOULD_RUN,
            format!(
                "{lead} (row {row}): terraform destroy attempt {attempt} runs, then the object is released{waits}; {}",
                state_summary(d)
            ),
        ),
        Action::CleanUp | Action::RemoveFinalizer => (
            Status::True,
            reason::NOTHING_TO_DESTROY,
            format!(
                "{lead} (row {row}): nothing to destroy, the object is cleaned up and released{waits}; {}",
                d.deleting.message
            ),
        ),
        Action::Abandon => (
            Status::False,
            reason::WOULD_ABANDON,
            format!(
                "{lead} (row {row}): released without a destroy, its infrastructure left running{waits}; {}",
                d.deleting.message
            ),
        ),
        Action::Hold => (
            Status::False,
            held_reason(d),
            format!(
                "{lead} (row {row}): the deletion {} held{waits}: {}",
                if lead == BEING_DELETED {
                    "is"
                } else {
                    "would be"
                },
                d.deleting.message
            ),
        ),
        Action::RetryLater { .. } => (
            Status::False,
            held_reason(d),
            format!("{lead} (row {row}): {}{waits}", d.deleting.message),
        ),
        // Not reached with the deletion assumed and the waits set aside.
        Action::NotDeleting
        | Action::BookkeepingOnly
        | Action::WaitForJob
        | Action::WaitForDependents => (
            Status::Unknown,
            d.deleting.reason,
            format!("{lead} (row {row}): {}", d.deleting.message),
        ),
    };
    Desired::new(cond::DELETION_READY, status, why, message)
}

/// Why a deletion would be held: the state's reason (rows 5 and 6), the blocker's own
/// (an owner gone, an errored state), else why the destroy could not start.
fn held_reason(d: &Decision) -> &'static str {
    let of = |t: &str, status: Status| {
        d.others
            .iter()
            .find(|c| c.type_ == t && c.status == status)
            .map(|c| c.reason)
    };
    match d.row {
        Some(Row::StateMissing | Row::StateUntrusted) => {
            of(cond::STATE_READABLE, Status::False).unwrap_or(reason::HELD)
        }
        _ => of(cond::DELETION_BLOCKED, Status::True).unwrap_or(d.deleting.reason),
    }
}

fn state_summary(d: &Decision) -> String {
    d.others
        .iter()
        .find(|c| c.type_ == cond::STATE_READABLE)
        .map(|c| c.message.clone())
        .unwrap_or_default()
}
