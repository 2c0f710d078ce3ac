//! Rows 7, 8 and 9: what a readable state decides (destroy, clean up, or retry and hold).

use super::*;

/// Rows 7, 8 and 9 for a readable state.
pub(super) fn readable(f: &Facts, managed: u64, others: Vec<Desired>) -> Decision {
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
        return finish(Some(Row::CleanUp), Action::CleanUp, d, others, None);
    }
    let next = f.next_attempt();
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
                Some(Row::Destroy),
                Action::StartDestroy { attempt: next },
                d,
                others,
                None,
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
