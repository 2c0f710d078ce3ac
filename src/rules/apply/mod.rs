//! The apply table: the pure decision of a pass on a live object, beside the deletion's
//! rule table. The first row that applies decides; each row says what the pass does and
//! the `Provisioned`, `InputsApplied` and `Ready` conditions it sets. No client and no
//! clock: the time is a fact, as in the deletion's table.
//!
//! `Provisioned` latches: once an apply of the object succeeded it stays True whatever a
//! later apply does (Cluster API stops the cluster's health checks on a False Ready, and
//! a re-apply that fails must not take a running machine away). `InputsApplied` says
//! whether the latest inputs are the ones applied; it never feeds Ready.

use jiff::Timestamp;

use super::{Backoff, PauseCause, StateFacts, UnfinishedJob, add};
use crate::api::Kind;
use crate::api::conditions::{self as cond, Desired, Status};

/// The apply side's condition types and reasons live with the others.
pub use crate::api::conditions::{INPUTS_APPLIED, PROVISIONED, reason};

mod facts;
mod row;

pub use facts::{ApplyFacts, LastApply, Prerequisite};
pub use row::{ApplyAction, ApplyDecision, ApplyRow};

/// Whether the apply table needs the state read to decide: it would start an attempt,
/// and the state was not read (it is, before anything starts, as the deletion's table
/// reads it before a destroy).
pub fn apply_state_needed(f: &ApplyFacts) -> bool {
    f.state == StateFacts::NotRead && decide_apply(f).action.start_attempt().is_some()
}

/// The apply table. Rows are evaluated in order; the first that applies decides. A row
/// that starts an attempt the API server refused last time ([`ApplyFacts::refused`]) still
/// starts it, and its conditions say the refusal instead of "starting".
pub fn decide_apply(f: &ApplyFacts) -> ApplyDecision {
    let d = decide_rows(f);
    match (&f.refused, d.action.start_attempt()) {
        (Some(why), Some(_)) => {
            let msg = refused_message(why);
            ApplyDecision {
                conditions: not_applied(f, d.row, reason::APPLY_CANNOT_START, msg, d.action)
                    .conditions,
                ..d
            }
        }
        _ => d,
    }
}

/// The message of a refused attempt, [`ApplyFacts::refused`] with its runbook.
pub fn refused_message(refused: &str) -> String {
    format!("{refused}; see runbooks/ApplyCannotStart.md")
}

fn decide_rows(f: &ApplyFacts) -> ApplyDecision {
    if f.kind == Kind::TerraformCluster && f.externally_managed {
        return ApplyDecision {
            row: ApplyRow::ExternallyManaged,
            action: ApplyAction::Nothing,
            conditions: Vec::new(),
        };
    }
    if let Some(cause) = &f.paused {
        let msg = format!("paused because {}: no apply starts", cause.describe());
        return gated(f, ApplyRow::Paused, reason::PAUSED, msg);
    }
    if f.owner.is_none() {
        let owner = match f.kind {
            Kind::TerraformCluster => "a Cluster's spec.infrastructureRef",
            Kind::TerraformMachine => "a Machine's spec.infrastructureRef",
            Kind::TerraformMachinePool => "a MachinePool's spec.template.spec.infrastructureRef",
        };
        let msg = format!(
            "waiting for Cluster API to set the owner: the object must be named by {owner}"
        );
        return gated(f, ApplyRow::NoOwner, reason::WAITING_FOR_OWNER, msg);
    }
    if let Some(p) = &f.prerequisite {
        return gated(f, ApplyRow::Prerequisite, p.reason(), p.describe());
    }
    if !f.unfinished_jobs.is_empty() {
        let msg = format!("{} running", UnfinishedJob::list(&f.unfinished_jobs));
        return not_applied(
            f,
            ApplyRow::JobUnfinished,
            reason::APPLYING,
            msg,
            ApplyAction::Wait,
        );
    }
    if let Some(why) = &f.foreign_state {
        let msg = format!(
            "{why}: an apply never starts against a state the object neither created nor adopted; see runbooks/ApplyCannotStart.md"
        );
        return not_applied(
            f,
            ApplyRow::ForeignState,
            reason::APPLY_CANNOT_START,
            msg,
            ApplyAction::Wait,
        );
    }
    if let Some(why) = &f.unrecorded {
        let msg = format!(
            "apply attempt {} succeeded, but its state cannot be recorded: {why}; nothing more is applied, and Cluster API is not told the object is provisioned, until the state reads; see runbooks/ApplyUnrecorded.md",
            f.attempt
        );
        return not_applied(
            f,
            ApplyRow::Unrecorded,
            reason::APPLY_UNRECORDED,
            msg,
            ApplyAction::Wait,
        );
    }
    let sha = match &f.inputs {
        Ok(sha) => sha,
        Err(why) => {
            let msg = format!("{why}; see runbooks/ApplyCannotStart.md");
            return not_applied(
                f,
                ApplyRow::InputsUnresolvable,
                reason::APPLY_CANNOT_START,
                msg,
                ApplyAction::Wait,
            );
        }
    };
    let same_inputs = f.applied_sha.as_deref() == Some(sha.as_str());
    let next = f.attempt.saturating_add(1);
    match &f.last {
        LastApply::Succeeded if same_inputs && f.outputs_invalid.is_some() => {
            let why = f.outputs_invalid.as_deref().unwrap_or_default();
            let msg = format!(
                "apply attempt {} succeeded, but its outputs break module contract v1: {why}; fix the module, and its next apply (a change of the spec) sets the fields; see runbooks/OutputsInvalid.md",
                f.attempt
            );
            not_applied(
                f,
                ApplyRow::OutputsInvalid,
                reason::OUTPUTS_INVALID,
                msg,
                ApplyAction::Wait,
            )
        }
        LastApply::Succeeded if same_inputs && f.change_refused.is_some() => {
            let why = f.change_refused.as_deref().unwrap_or_default();
            let msg = format!(
                "apply attempt {} succeeded, but {why}; make the module give the value again (a change of the spec applies it), or replace the object; see runbooks/ChangeRefused.md",
                f.attempt
            );
            not_applied(
                f,
                ApplyRow::UpToDate,
                reason::CHANGE_REFUSED,
                msg,
                ApplyAction::Wait,
            )
        }
        LastApply::Succeeded if same_inputs => ApplyDecision {
            row: ApplyRow::UpToDate,
            action: ApplyAction::Wait,
            conditions: vec![
                Desired::new(PROVISIONED, Status::True, reason::PROVISIONED, ""),
                Desired::new(INPUTS_APPLIED, Status::True, reason::APPLIED, ""),
                Desired::new(cond::READY, Status::True, reason::READY, ""),
            ],
        },
        LastApply::Failed {
            failures,
            at,
            message,
        } if same_inputs => {
            let due = add(*at, f.backoff.delay(*failures, &f.uid));
            let start = (due <= f.now).then_some(next);
            if start.is_some()
                && let Some(held) = cannot_start(f)
            {
                return held;
            }
            let msg = match start {
                Some(n) => format!(
                    "apply attempt {} failed: {message}; attempt {n} is starting; see runbooks/ApplyFailed.md",
                    f.attempt
                ),
                None => format!(
                    "apply attempt {} failed: {message}; the next attempt starts at {due}; see runbooks/ApplyFailed.md",
                    f.attempt
                ),
            };
            not_applied(
                f,
                ApplyRow::Failed,
                reason::APPLY_FAILED,
                msg,
                ApplyAction::RetryLater { at: due, start },
            )
        }
        LastApply::PlanBlocked(plan) if same_inputs => {
            if f.approved_plan.as_deref().map(str::trim) == Some(plan.hash.as_str()) {
                if let Some(held) = cannot_start(f) {
                    return held;
                }
                let msg = format!(
                    "apply attempt {next} is starting: plan {} is approved ({})",
                    plan.hash,
                    plan.list(10)
                );
                return not_applied(
                    f,
                    ApplyRow::PlanBlocked,
                    reason::APPLYING,
                    msg,
                    ApplyAction::StartApply { attempt: next },
                );
            }
            let msg = format!(
                "apply attempt {} stopped before changing anything: its plan would {}; to apply it, approve this plan: annotate the object {}={} (a later plan that destroys or replaces anything else needs its own approval), or change the inputs; see runbooks/DestructivePlanBlocked.md",
                f.attempt,
                plan.list(10),
                crate::api::names::APPROVE_PLAN,
                plan.hash
            );
            not_applied(
                f,
                ApplyRow::PlanBlocked,
                reason::DESTRUCTIVE_PLAN_BLOCKED,
                msg,
                ApplyAction::Wait,
            )
        }
        _ => {
            if let Some(held) = cannot_start(f) {
                return held;
            }
            let why = if f.attempt == 0 {
                "first apply".to_string()
            } else if same_inputs {
                "the last apply ended without a result".to_string()
            } else {
                "the inputs changed".to_string()
            };
            let msg = format!("apply attempt {next} is starting ({why})");
            not_applied(
                f,
                ApplyRow::Apply,
                reason::APPLYING,
                msg,
                ApplyAction::StartApply { attempt: next },
            )
        }
    }
}

/// Row A11: an apply is due, and what keeps it from starting, if anything: a state that
/// was lost or cannot be trusted (an apply would make a fresh one and create everything
/// again, or change another state as if it were the object's), an errored state that
/// records what the state does not (an apply would create it again), another holder of
/// Terraform's lock. Nothing when the state was not read: it is, before a start.
fn cannot_start(f: &ApplyFacts) -> Option<ApplyDecision> {
    let (why, msg): (&'static str, String) = match &f.state {
        StateFacts::NotRead | StateFacts::Readable { .. } => (reason::APPLY_CANNOT_START, String::new()),
        StateFacts::Missing if f.state_expected => (
            crate::api::conditions::reason::STATE_LOST,
            "the state Secret is missing although an apply of the object wrote it (its fingerprint is recorded): an apply now would make a fresh state and create everything again; restore the state; see runbooks/StateLost.md".to_string(),
        ),
        StateFacts::Missing => (reason::APPLY_CANNOT_START, String::new()),
        StateFacts::Unreadable { why, message } => {
            let runbook = format!("runbooks/{}.md", why.reason());
            let said = if message.contains(&runbook) {
                message.clone()
            } else {
                format!("{message}; see {runbook}")
            };
            (
                why.reason(),
                format!("no apply starts against a state CAPTF cannot read or trust: {said}"),
            )
        }
    };
    if !msg.is_empty() {
        return Some(not_applied(
            f,
            ApplyRow::CannotStart,
            why,
            msg,
            ApplyAction::Wait,
        ));
    }
    if let Some(what) = &f.errored {
        let msg = format!(
            "{what}; an apply against the state would create them again: merge the errored state into the state with captf state restore --from-errored, or delete it once they are confirmed gone; see runbooks/ErroredState.md"
        );
        return Some(not_applied(
            f,
            ApplyRow::CannotStart,
            reason::ERRORED_STATE,
            msg,
            ApplyAction::Wait,
        ));
    }
    if let Some(holder) = &f.lock_held {
        let msg = format!(
            "Terraform's state lock is held by {holder}, and CAPTF never breaks it; the apply starts once it is free; see runbooks/ApplyCannotStart.md"
        );
        return Some(not_applied(
            f,
            ApplyRow::CannotStart,
            reason::APPLY_CANNOT_START,
            msg,
            ApplyAction::Wait,
        ));
    }
    None
}

/// A gate holds the apply: Unknown, so that no False window starts Cluster API's
/// health-check timeouts; a provisioned object stays provisioned and Ready. Each gate's
/// reason has its runbook, of its name.
fn gated(f: &ApplyFacts, row: ApplyRow, why: &'static str, msg: String) -> ApplyDecision {
    let msg = format!("{msg}; see runbooks/{why}.md");
    decision(f, row, ApplyAction::Wait, Status::Unknown, why, msg)
}

/// The latest inputs are not applied (yet): False, except that a provisioned object
/// stays provisioned and Ready.
fn not_applied(
    f: &ApplyFacts,
    row: ApplyRow,
    why: &'static str,
    msg: String,
    action: ApplyAction,
) -> ApplyDecision {
    decision(f, row, action, Status::False, why, msg)
}

/// `InputsApplied` at `status` with `why`; `Provisioned` and `Ready` the same until the
/// object is provisioned, True from then on.
fn decision(
    f: &ApplyFacts,
    row: ApplyRow,
    action: ApplyAction,
    status: Status,
    why: &'static str,
    msg: String,
) -> ApplyDecision {
    let conditions = if f.provisioned {
        vec![
            Desired::new(PROVISIONED, Status::True, reason::PROVISIONED, ""),
            Desired::new(INPUTS_APPLIED, status, why, msg),
            Desired::new(cond::READY, Status::True, reason::READY, ""),
        ]
    } else {
        vec![
            Desired::new(PROVISIONED, status, why, msg.clone()),
            Desired::new(INPUTS_APPLIED, status, why, msg.clone()),
            Desired::new(cond::READY, status, why, msg),
        ]
    };
    ApplyDecision {
        row,
        action,
        conditions,
    }
}

#[cfg(test)]
mod tests;
