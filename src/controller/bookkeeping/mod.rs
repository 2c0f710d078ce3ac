//! What a pass records of its Jobs, on every pass, paused or not: a destroy attempt that
//! failed or was interrupted (`destroy-failed-at`, with a Warning Event), an apply that
//! ended without Terraform exiting by itself (`apply-interrupted`), an adopted state's
//! fingerprint, `block-move`, which finished destroy Jobs are pruned, and whether the state
//! gets its protection finalizers.
//!
//! [`plan`] decides all of it from the observation, the facts and the decision, with no
//! I/O; [`apply`] carries it out. Write order: the Events, the pruning and the state's
//! protection first, the object's annotations last, in one guarded write (a pass that
//! writes them ends, and the next decides on the object as written).

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Secret;
use kube::ResourceExt;
use kube::api::{Api, ObjectMeta};

use super::events::{self, Note, publish_note};
use super::observe::StateMeta;
use super::{Context, Error, Scope};
use crate::api::TerraformObject;
use crate::api::names;
use crate::gather::{self, Observed, Settings};
use crate::io::writes::{self, annotation_ops, guarded_patch};
use crate::job::{self, JobOutcome};
use crate::metrics::labels::{ByCause, ByJob, KindValue};
use crate::rules::{Action, Decision, Facts, StateFacts};

mod write;

pub use write::{Kept, apply};

#[cfg(test)]
mod tests;

/// Which of the state's Secrets get the protection finalizer in this pass.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Protect {
    /// None: a Job of the object runs (Terraform writes the state with the resourceVersion
    /// it read, and a finalizer added in between fails that write), or the cleanup began.
    Nothing,
    /// The base only: this pass starts a Job, which takes the parts' finalizers off again
    /// (Terraform deletes the parts a shrinking state no longer has).
    Base,
    /// The base and its parts.
    BaseAndParts,
}

/// What the bookkeeping of a pass is to do.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Bookkeeping {
    /// Annotation edits on the object (set, or remove with `None`), in one guarded write.
    pub edits: Vec<(&'static str, Option<String>)>,
    /// The Events to publish.
    pub notes: Vec<Note>,
    /// The reason of a destroy failure to count in the metrics, and how long its Job ran.
    pub failure: Option<String>,
    pub failed_job_ran: Option<std::time::Duration>,
    /// Finished destroy Jobs to delete, each with its variables Secret of the same name.
    pub prune: Vec<String>,
    pub protect: Protect,
    /// The reason of an apply failure to count in the metrics.
    pub apply_failure: Option<String>,
    /// How long the apply Job whose end this pass records ran, and how it ended.
    pub apply_job_ran: Option<(std::time::Duration, &'static str)>,
    /// The fields a successful apply's outputs set (the set-once ones are checked against
    /// the object when written): their presence is what provisions the object.
    pub fields: Option<crate::contract::outputs::Fields>,
    /// The apply attempt whose inputs become the destroy's (it wrote the state), with
    /// its Pod when it succeeded, whose report of what it ran is recorded with them.
    pub promote: Option<Promote>,
}

/// See [`Bookkeeping::promote`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Promote {
    pub attempt: u32,
    pub ran: Option<gather::apply::ApplyRan>,
}

impl Bookkeeping {
    /// An apply's success is recorded with valid outputs: `status.initialization.provisioned`
    /// is set after the record.
    pub fn provisioned(&self) -> bool {
        self.fields.is_some()
    }
}

/// Decides the bookkeeping of a pass; `o.now` stands for "now".
pub fn plan(o: &Observed, settings: &Settings, facts: &Facts, decision: &Decision) -> Bookkeeping {
    let meta = &o.meta;
    let ann = |key: &str| {
        meta.annotations
            .as_ref()
            .and_then(|a| a.get(key))
            .map(String::as_str)
    };
    let mut edits: Vec<(&'static str, Option<String>)> = Vec::new();
    let mut notes = Vec::new();
    let mut failure = None;
    let mut failed_job_ran = None;
    let suffix = names::state_suffix(o.kind, meta.name.as_deref().unwrap_or_default());

    // The latest destroy attempt failed and that is not recorded yet.
    if facts.attempt > 0 && gather::deletion_bookkeeping(meta, names::DESTROY_FAILED_AT).is_none() {
        let name = names::job_name(&suffix, names::OPERATION_DESTROY, facts.attempt);
        let job = o
            .jobs
            .iter()
            .find(|j| j.metadata.name.as_deref() == Some(name.as_str()));
        // Its Job is gone while its Pod is still there (the Job was deleted by hand, or
        // by foreground deletion of something else): the attempt was aborted. Recorded
        // now, because the Pod goes too once Terraform has saved its state, and the next
        // attempt then continues from that state.
        let pod_left = o.pods.iter().any(|p| {
            let l = p.metadata.labels.as_ref();
            l.and_then(|l| l.get(names::LABEL_OPERATION))
                .map(String::as_str)
                == Some(names::OPERATION_DESTROY)
                && l.and_then(|l| l.get(names::LABEL_ATTEMPT)) == Some(&facts.attempt.to_string())
        });
        if job.is_none() && pod_left {
            edits.push((names::DESTROY_FAILED_AT, Some(o.now.to_string())));
            notes.push(Note::warning(
                events::DESTROY_INTERRUPTED,
                "Destroy",
                format!("the Job of destroy attempt {} was deleted while it ran; the next attempt continues from the state Terraform saves", facts.attempt),
            ));
        }
        if let Some(j) = job
            && let JobOutcome::Failed {
                reason, error_tail, ..
            } = job::outcome(j, &o.pods)
        {
            let at = job::finished_at(j).unwrap_or(o.now);
            edits.push((names::DESTROY_FAILED_AT, Some(at.to_string())));
            let text = job::failure_message(&reason, error_tail.as_deref(), j, &o.pods);
            notes.push(Note::warning(
                events::DESTROY_FAILED,
                "Destroy",
                format!("destroy attempt {} failed: {text}", facts.attempt),
            ));
            failure = Some(reason);
            failed_job_ran = job::ran_for(j);
        }
    }

    // The latest apply attempt's end, recorded once: a failure with its time and the
    // count of failures in a row (the retry schedule's); a success with the fingerprint of
    // the state it left (read in this pass for it), which latches `provisioned`. An
    // apply that wrote the state (every success; a failure whose state moved on) makes
    // its inputs the destroy's (`promote`); one that did not leaves the destroy the
    // inputs that made the state.
    let mut apply_failure = None;
    let mut recorded_fingerprint = false;
    let mut fields = None;
    let mut promote = None;
    let unrecorded = gather::apply::unrecorded_apply(o);
    let apply_job_ran = unrecorded.as_ref().and_then(|u| {
        let outcome = if u.succeeded() { "succeeded" } else { "failed" };
        u.job.and_then(job::ran_for).map(|d| (d, outcome))
    });
    let left = gather::apply::state_left_by_apply(o, settings);
    let promoted_already = |n: u32| gather::apply::inputs_secret_attempt(o) == Some(n);
    match &unrecorded {
        Some(gather::apply::UnrecordedApply {
            attempt: n,
            job,
            outcome:
                JobOutcome::Failed {
                    reason,
                    error_tail,
                    interrupted,
                    ..
                },
        }) => {
            let n = *n;
            let failures: u32 = ann(names::APPLY_FAILURES)
                .and_then(|v| v.trim().parse().ok())
                .unwrap_or(0);
            let at = job.and_then(job::finished_at).unwrap_or(o.now);
            edits.push((names::APPLY_FAILED_AT, Some(at.to_string())));
            edits.push((names::APPLY_FAILURES, Some((failures + 1).to_string())));
            // Terraform did not exit by itself: what it was creating may not be in the
            // state. Written with the failure, once: an operator who has dealt with it
            // removes it (the runbook's step), and it stays removed.
            if *interrupted && ann(names::APPLY_INTERRUPTED).is_none() {
                edits.push((names::APPLY_INTERRUPTED, Some(at.to_string())));
            }
            let text = match job {
                Some(j) => job::failure_message(reason, error_tail.as_deref(), j, &o.pods),
                None => format!(
                    "its Job was deleted before it was seen to end, and its Pod says: {}",
                    error_tail.as_deref().unwrap_or(reason)
                ),
            };
            match error_tail.as_deref().and_then(job::DestructivePlan::of) {
                Some(plan) => {
                    notes.push(Note::warning(
                        events::DESTRUCTIVE_PLAN_BLOCKED,
                        "Apply",
                        format!(
                            "apply attempt {n} stopped before changing anything: its plan would {}; approve plan {} with the annotation {}, or change the inputs",
                            plan.list(10),
                            plan.hash,
                            names::APPROVE_PLAN
                        ),
                    ));
                    apply_failure = Some(events::DESTRUCTIVE_PLAN_BLOCKED.to_string());
                }
                None => {
                    notes.push(Note::warning(
                        events::APPLY_FAILED,
                        "Apply",
                        format!("apply attempt {n} failed: {text}"),
                    ));
                    apply_failure = Some(reason.clone());
                }
            }
            // It wrote the state before it failed: the state's fingerprint moves on, and
            // what the state now holds was made with these inputs.
            if let Some((lineage, serial)) = gather::apply::written_by_apply(o, &left) {
                edits.push((names::STATE_LINEAGE, Some(lineage)));
                edits.push((names::STATE_SERIAL, Some(serial.to_string())));
                recorded_fingerprint = true;
                if !promoted_already(n) {
                    promote = Some(Promote {
                        attempt: n,
                        ran: None,
                    });
                }
            }
        }
        Some(gather::apply::UnrecordedApply { attempt: n, .. }) => {
            let n = *n;
            // Terraform ran these inputs to completion and wrote the state with them,
            // whether or not the state can be read now.
            if !promoted_already(n) {
                promote = Some(Promote {
                    attempt: n,
                    ran: gather::apply::apply_ran(o, n),
                });
            }
            match &left {
                StateFacts::Readable {
                    lineage, serial, ..
                } => {
                    edits.push((names::STATE_LINEAGE, Some(lineage.clone())));
                    edits.push((names::STATE_SERIAL, Some(serial.to_string())));
                    edits.push((names::APPLY_FAILED_AT, None));
                    edits.push((names::APPLY_FAILURES, None));
                    // This apply wrote the whole state after any that was interrupted.
                    if ann(names::APPLY_INTERRUPTED).is_some() {
                        edits.push((names::APPLY_INTERRUPTED, None));
                    }
                    recorded_fingerprint = true;
                    notes.push(Note::normal(
                        events::APPLY_SUCCEEDED,
                        "Apply",
                        format!("apply attempt {n} succeeded; its state is lineage {lineage}, serial {serial}"),
                    ));
                    // Its outputs set Cluster API's fields; outputs that break the
                    // contract leave the object unprovisioned and say how.
                    let ran = gather::apply::inputs_of_attempt(o, n);
                    match success_fields(o, ran.as_ref()) {
                        Ok(f) => {
                            edits.push((names::APPLIED_ATTEMPT, Some(n.to_string())));
                            edits.push((names::OUTPUTS_INVALID, None));
                            // What endpoint a cluster's module was given (none: it made
                            // one), so that Cluster API's copy of it is no new input.
                            if o.kind == crate::api::Kind::TerraformCluster {
                                let given = ran
                                    .as_ref()
                                    .and_then(|i| {
                                        i.contract_variables.get("captf_control_plane_endpoint")
                                    })
                                    .filter(|v| !v.is_null())
                                    .map(|v| {
                                        format!(
                                            "{}:{}",
                                            v["host"].as_str().unwrap_or_default(),
                                            v["port"]
                                        )
                                    })
                                    .unwrap_or_default();
                                if Some(given.as_str()) != ann(names::ENDPOINT_GIVEN) {
                                    edits.push((names::ENDPOINT_GIVEN, Some(given)));
                                }
                            }
                            fields = Some(f);
                        }
                        Err(errors) => {
                            let why = job::cut(&errors.join("; "), 900);
                            edits.push((names::OUTPUTS_INVALID, Some(format!("{n}: {why}"))));
                            notes.push(Note::warning(
                                events::OUTPUTS_INVALID,
                                "Apply",
                                format!(
                                    "the outputs of apply attempt {n} break module contract v1: {why}"
                                ),
                            ));
                        }
                    }
                }
                // Read, and not recordable: the object holds (apply row A7), and says so.
                StateFacts::Missing | StateFacts::Unreadable { .. } => {
                    let why = gather::apply::apply_state_seen(o, settings)
                        .not_recordable
                        .unwrap_or_default();
                    notes.push(Note::warning(
                        events::APPLY_UNRECORDED,
                        "Apply",
                        format!(
                            "apply attempt {n} succeeded, but its state cannot be recorded: {why}; see runbooks/ApplyUnrecorded.md"
                        ),
                    ));
                }
                StateFacts::NotRead => {}
            }
        }
        None => {}
    }

    // An adopted state's fingerprint is recorded once: from then on it is checked like
    // any other, and adopt no longer matters.
    if ann(names::ADOPT) == Some("true")
        && !recorded_fingerprint
        && ann(names::STATE_LINEAGE).is_none()
        && ann(names::STATE_SERIAL).is_none()
        && let StateFacts::Readable {
            lineage, serial, ..
        } = &facts.state
    {
        edits.push((names::STATE_LINEAGE, Some(lineage.clone())));
        edits.push((names::STATE_SERIAL, Some(serial.to_string())));
    }

    // block-move: what a move must wait for (see `block_move`). When the action itself
    // writes the object (the attempt number, the cleanup marker, the release), block-move
    // goes into that write instead of one of its own.
    let action_writes_object = decision.action.start_attempt().is_some()
        || matches!(
            decision.action,
            Action::CleanUp | Action::Abandon | Action::RemoveFinalizer
        );
    match (
        block_move(facts, decision),
        ann(names::CLUSTERCTL_BLOCK_MOVE).is_some(),
    ) {
        (Some(true), false) if !action_writes_object => {
            edits.push((names::CLUSTERCTL_BLOCK_MOVE, Some("true".into())))
        }
        (Some(false), true) => edits.push((names::CLUSTERCTL_BLOCK_MOVE, None)),
        _ => {}
    }

    let protect = if facts.cleanup.is_some() || !facts.unfinished_jobs.is_empty() {
        Protect::Nothing
    } else if decision.action.start_attempt().is_some() {
        Protect::Base
    } else {
        Protect::BaseAndParts
    };
    Bookkeeping {
        edits,
        notes,
        failure,
        failed_job_ran,
        prune: [
            prunable(o, names::OPERATION_DESTROY, facts.attempt),
            prunable(
                o,
                names::OPERATION_APPLY,
                ann(names::APPLY_ATTEMPT)
                    .and_then(|v| v.trim().parse().ok())
                    .unwrap_or(0),
            ),
        ]
        .concat(),
        protect,
        apply_failure,
        apply_job_ran,
        fields,
        promote,
    }
}

/// The decision the manager reaches on `o`: it records what Jobs did first, and a pass that
/// writes ends there, so the decision is that of the next pass, on the object as written
/// (what `captf explain` shows). Returns the observation as it will be, with its decision.
pub fn decide_after_bookkeeping(
    o: &Observed,
    settings: &Settings,
) -> (Observed, Decision, Facts, gather::Findings) {
    let (decision, facts, findings) = gather::decide(o, settings);
    let planned = plan(o, settings, &facts, &decision);
    if planned.edits.is_empty() && planned.promote.is_none() {
        return (o.clone(), decision, facts, findings);
    }
    let mut next = o.clone();
    let annotations = next.meta.annotations.get_or_insert_default();
    for (key, value) in &planned.edits {
        match value {
            Some(v) => annotations.insert(key.to_string(), v.clone()),
            None => annotations.remove(*key),
        };
    }
    if let Some(p) = &planned.promote
        && let Some(inputs) = gather::apply::inputs_of_attempt(o, p.attempt)
    {
        let mut secret = crate::inputs::inputs_secret(&inputs, &o.identity());
        secret.metadata.annotations =
            Some([(names::INPUTS_OF_ATTEMPT.to_string(), p.attempt.to_string())].into());
        next.inputs_secret = Some(secret);
    }
    let (decision, facts, findings) = gather::decide(&next, settings);
    (next, decision, facts, findings)
}

/// The fields a successful apply's outputs set, read from the state this pass read and
/// checked against the contract's values the apply was given (its inputs); or every way
/// they break the contract.
fn success_fields(
    o: &Observed,
    inputs: Option<&crate::inputs::Inputs>,
) -> Result<crate::contract::outputs::Fields, Vec<String>> {
    let out = o
        .state
        .as_ref()
        .ok_or_else(|| vec!["the state was not read".to_string()])
        .and_then(|st| {
            crate::state::outputs(st, crate::state::DEFAULT_DECOMPRESSION_CAP).map_err(|e| vec![e])
        })?;
    let given = inputs
        .map(|i| i.contract_variables.clone())
        .unwrap_or_default();
    let role = o.kind.into();
    let mut breaches = crate::contract::outputs::against_inputs(role, &out, &given);
    match crate::contract::outputs::fields(role, &out) {
        Ok(f) if breaches.is_empty() => Ok(f),
        Ok(_) => Err(breaches),
        Err(mut e) => {
            e.append(&mut breaches);
            Err(e)
        }
    }
}

/// The finished Jobs of `operation` past its last three attempts, oldest first: the last
/// three stay for their logs. Only attempts before the current one, whose outcome is
/// recorded, are ever pruned. (A pool re-applies at each rotation of its bootstrap token,
/// every few minutes with kubeadm: kept, its apply Jobs would grow without bound.)
fn prunable(o: &Observed, operation: &str, current: u32) -> Vec<String> {
    let mut finished: Vec<(&Job, u32)> = o
        .jobs
        .iter()
        .filter(|j| job::operation_of(j) == Some(operation))
        .filter_map(|j| job::attempt_of(j).map(|a| (j, a)))
        .filter(|(j, a)| {
            *a < current && !matches!(job::outcome(j, &o.pods), JobOutcome::Unfinished { .. })
        })
        .collect();
    finished.sort_by_key(|(_, a)| *a);
    let keep_from = finished.len().saturating_sub(2); // plus the current attempt: three kept
    finished[..keep_from]
        .iter()
        .filter_map(|(j, _)| j.metadata.name.clone())
        .collect()
}

/// Whether a `clusterctl move` must wait for the object (`block-move` on), or not (off);
/// none: leave it as it is. A Job of it is unfinished: on (its state is changing). Being
/// deleted and in motion (a destroy due or between attempts, a cleanup, an abandon, the
/// release): on (a half-destroyed object would come back to life in the target, against
/// a state that is still changing). Being deleted and held for a person (`Hold`: a state
/// that cannot be trusted, an errored state, an owner gone): off, so that one held object
/// does not keep a whole management cluster from moving for as long as it waits; the
/// held state and the bookkeeping move with it. Paused (a move under way): left as it
/// is, so that the pause clusterctl sets first changes nothing it then checks. Not being
/// deleted, no Job: off.
pub(crate) fn block_move(facts: &Facts, decision: &Decision) -> Option<bool> {
    if !facts.unfinished_jobs.is_empty() {
        return Some(true);
    }
    if !facts.deleting {
        return Some(false);
    }
    if facts.paused.is_some() {
        return None;
    }
    Some(decision.action != Action::Hold)
}
