//! What the latest apply did, read from its Job while the Job is there, else from the
//! object's bookkeeping: how it ended, what it ran with, and the state it left (what the
//! pass that records it writes).

use super::*;

/// The number of the latest apply attempt, and how it ended: from its Job while the Job
/// is there, else from the bookkeeping on the object.
pub(super) fn apply_history(o: &Observed) -> (u32, LastApply) {
    let attempt: u32 = annotation(&o.meta, names::APPLY_ATTEMPT)
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0);
    if attempt == 0 {
        return (0, LastApply::None);
    }
    let failures = annotation(&o.meta, names::APPLY_FAILURES)
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0u32);
    let failed_at = annotation(&o.meta, names::APPLY_FAILED_AT).and_then(|v| v.parse().ok());
    let suffix = names::state_suffix(o.kind, o.meta.name.as_deref().unwrap_or_default());
    let job = attempt_job(o, &suffix, names::OPERATION_APPLY, attempt);
    let last = match job.map(|j| (j, job::outcome(j, &o.pods))) {
        Some((_, JobOutcome::Succeeded)) => LastApply::Succeeded,
        Some((
            j,
            JobOutcome::Failed {
                reason, error_tail, ..
            },
        )) => match error_tail.as_deref().and_then(job::DestructivePlan::of) {
            // The plan guard stopped it: nothing was changed, and nothing is retried
            // until its plan is approved or the inputs change.
            Some(plan) => LastApply::PlanBlocked(plan),
            None => LastApply::Failed {
                // Counted once the failure is recorded; until then it is one more.
                failures: if failed_at.is_some() {
                    failures.max(1)
                } else {
                    failures + 1
                },
                at: failed_at.or_else(|| job::finished_at(j)).unwrap_or(o.now),
                message: job::failure_message(&reason, error_tail.as_deref(), j, &o.pods),
            },
        },
        // Row A5 waits for it.
        Some((_, JobOutcome::Unfinished { .. })) => LastApply::None,
        None => match failed_at {
            Some(at) => LastApply::Failed {
                failures: failures.max(1),
                at,
                message: format!(
                    "its Job {} is gone; see the object's Events",
                    names::job_name(&suffix, names::OPERATION_APPLY, attempt)
                ),
            },
            // Its success was recorded (with the state's fingerprint) before the Job went.
            None if names::apply_success_recorded(o.meta.annotations.as_ref(), attempt) => {
                LastApply::Succeeded
            }
            // Never made (a crash after the write-ahead, a Job the API server refused), or
            // deleted while it ran: the attempt ended without a result, and it starts
            // again under its own number (the table starts the one after the latest it is
            // given), rather than a new number on every pass while a refusal lasts.
            None => return (attempt - 1, LastApply::None),
        },
    };
    (attempt, last)
}

/// The latest apply attempt whose end is not recorded yet: its number, its Job (none
/// when the Job was deleted before a pass saw it end, and its Pod is what is left), and
/// how it ended. A success is recorded with `applied-attempt` once the state is read, a
/// failure with `apply-failed-at`.
#[derive(Clone, Debug, PartialEq)]
pub struct UnrecordedApply<'a> {
    pub attempt: u32,
    pub job: Option<&'a Job>,
    pub outcome: JobOutcome,
}

impl UnrecordedApply<'_> {
    pub fn succeeded(&self) -> bool {
        self.outcome == JobOutcome::Succeeded
    }
}

/// See [`UnrecordedApply`].
pub fn unrecorded_apply(o: &Observed) -> Option<UnrecordedApply<'_>> {
    let n: u32 = annotation(&o.meta, names::APPLY_ATTEMPT)?
        .trim()
        .parse()
        .ok()?;
    let success_recorded = names::apply_success_recorded(o.meta.annotations.as_ref(), n);
    let failure_recorded = annotation(&o.meta, names::APPLY_FAILED_AT).is_some();
    let suffix = names::state_suffix(o.kind, o.meta.name.as_deref().unwrap_or_default());
    let (job, outcome) = match attempt_job(o, &suffix, names::OPERATION_APPLY, n) {
        Some(j) => (Some(j), job::outcome(j, &o.pods)),
        // Its Job gone unseen (a cleanup policy, a hand): what its Pod left says how it
        // ended; with neither, nothing is known (it may never have been made).
        None => {
            let pod = o.pods.iter().find(|p| {
                let l = p.metadata.labels.as_ref();
                l.and_then(|l| l.get(names::LABEL_OPERATION))
                    .map(String::as_str)
                    == Some(names::OPERATION_APPLY)
                    && l.and_then(|l| l.get(names::LABEL_ATTEMPT)) == Some(&n.to_string())
            })?;
            (None, job::pod_outcome(pod)?)
        }
    };
    let unrecorded = match &outcome {
        JobOutcome::Succeeded => !success_recorded,
        JobOutcome::Failed { .. } => !failure_recorded && !success_recorded,
        JobOutcome::Unfinished { .. } => false,
    };
    unrecorded.then_some(UnrecordedApply {
        attempt: n,
        job,
        outcome,
    })
}

/// The Pod of a successful apply whose run is recorded with its inputs (what it ran: see
/// [`crate::inputs::Ran`]), and the image digest its runner container names.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ApplyRan {
    pub pod: String,
    pub image_digest: Option<String>,
}

/// The Pod of successful apply attempt `n`, whose report of what it ran is recorded with
/// its inputs, and the image digest its runner container names; none when its Pod is gone.
pub fn apply_ran(o: &Observed, n: u32) -> Option<ApplyRan> {
    let attempt = n.to_string();
    let pod = o.pods.iter().find(|p| {
        let l = p.metadata.labels.as_ref();
        l.and_then(|l| l.get(names::LABEL_OPERATION))
            .map(String::as_str)
            == Some(names::OPERATION_APPLY)
            && l.and_then(|l| l.get(names::LABEL_ATTEMPT)) == Some(&attempt)
            && p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Succeeded")
    })?;
    let image_digest = pod
        .status
        .iter()
        .flat_map(|s| s.container_statuses.iter().flatten())
        .filter(|c| c.name == crate::job::layout::CONTAINER_NAME)
        .find_map(|c| crate::inputs::image_digest_of(&c.image_id));
    Some(ApplyRan {
        pod: pod.metadata.name.clone()?,
        image_digest,
    })
}

/// The state an apply that ended left, as its record reads it: the pass's read of the
/// state, classified as if no apply had been interrupted, since this one wrote the state
/// after any that was (`NotRead` when the pass did not read it).
pub fn state_left_by_apply(o: &Observed, settings: &Settings) -> StateFacts {
    if o.state.is_none() {
        return StateFacts::NotRead;
    }
    let adopt = annotation(&o.meta, names::ADOPT) == Some("true");
    let own_lineage = annotation(&o.meta, names::STATE_LINEAGE).is_some();
    let applied = annotation(&o.meta, names::APPLIED_AT).is_some() || adopt;
    crate::gather::tfstate::state_of_after(
        o,
        settings,
        applied,
        own_lineage,
        false,
        &mut Findings::default(),
    )
}

/// The fingerprint of the state an apply that ended left, when that apply wrote it: it
/// reads, and it is not the one the object recorded before (another lineage or a higher
/// serial; any, when none is recorded). Its inputs are then the destroy's.
pub fn written_by_apply(o: &Observed, left: &StateFacts) -> Option<(String, u64)> {
    let StateFacts::Readable {
        lineage, serial, ..
    } = left
    else {
        return None;
    };
    let recorded_lineage = annotation(&o.meta, names::STATE_LINEAGE);
    let recorded_serial: Option<u64> =
        annotation(&o.meta, names::STATE_SERIAL).and_then(|v| v.trim().parse().ok());
    let written =
        recorded_lineage != Some(lineage.as_str()) || recorded_serial.is_none_or(|r| *serial > r);
    written.then(|| (lineage.clone(), *serial))
}

/// The inputs apply attempt `n` ran: those its variables Secret carries (as the pass read
/// it), or, for an attempt an older CAPTF started (it wrote them into the inputs Secret
/// before the Job), the inputs Secret's when they hash as the object says.
pub fn inputs_of_attempt(o: &Observed, n: u32) -> Option<Inputs> {
    let namespace = o.meta.namespace.as_deref().unwrap_or_default();
    let suffix = names::state_suffix(o.kind, o.meta.name.as_deref().unwrap_or_default());
    let own = o.attempt_secret.as_ref().filter(|s| {
        s.metadata.name.as_deref()
            == Some(names::job_name(&suffix, names::OPERATION_APPLY, n).as_str())
    });
    if let Some(secret) = own {
        return secret
            .data
            .as_ref()
            .and_then(|d| d.get(names::INPUTS_KEY))
            .and_then(|b| crate::inputs::parse(&b.0, namespace, &suffix).ok());
    }
    let legacy = crate::inputs::from_secret(o.inputs_secret.as_ref()?, namespace, &suffix).ok()?;
    (annotation(&o.meta, names::INPUTS_SHA256) == Some(legacy.sha256().as_str())).then_some(legacy)
}

/// The attempt whose inputs the object's inputs Secret (as the pass read it) holds: what
/// the Secret's `inputs-of-attempt` annotation says.
pub fn inputs_secret_attempt(o: &Observed) -> Option<u32> {
    o.inputs_secret
        .as_ref()?
        .metadata
        .annotations
        .as_ref()?
        .get(names::INPUTS_OF_ATTEMPT)?
        .trim()
        .parse()
        .ok()
}
