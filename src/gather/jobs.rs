//! The object's Jobs as the facts read them: what pauses it, which Jobs and Pods have
//! not finished, and its destroy attempts so far.

use std::collections::BTreeMap;

use jiff::Timestamp;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use crate::api::names::{self, Kind};
use crate::job::{self, JobOutcome};
use crate::rules::{LastAttempt, PauseCause, UnfinishedJob};

use super::{Observed, annotation, deletion_bookkeeping, deletion_time, label, owning_cluster};

pub(super) fn pause_cause(o: &Observed) -> Option<PauseCause> {
    if o.crd_deleting {
        return Some(PauseCause::CrdDeleting);
    }
    if annotation(&o.meta, names::CLUSTERCTL_DELETE_FOR_MOVE).is_some() {
        return Some(PauseCause::DeleteForMove);
    }
    if annotation(&o.meta, names::CAPI_PAUSED).is_some() {
        return Some(PauseCause::ObjectAnnotation);
    }
    if let (Some(why), Some(cluster)) = (&o.cluster_kind_unknown, owning_cluster(&o.meta)) {
        return Some(PauseCause::ClusterUnknown {
            cluster,
            why: why.clone(),
        });
    }
    match &o.cluster {
        Some(c) if c.spec_paused => Some(PauseCause::ClusterSpec(c.name.clone())),
        Some(c) if c.annotation_paused => Some(PauseCause::ClusterAnnotation(c.name.clone())),
        _ => None,
    }
}

/// How long a Job may be without a Pod before it counts as one whose Pods cannot be
/// made: the Job controller makes a Pod within a moment of the Job, unless it is refused.
pub const POD_EXPECTED_WITHIN: i64 = 5;

pub(super) fn unfinished(o: &Observed) -> Vec<UnfinishedJob> {
    let mut out = unfinished_of(
        &o.jobs,
        &o.pods,
        &o.job_refusals,
        &o.stuck_pods,
        None,
        o.now,
    );
    let earlier = format!(
        "of an earlier {} {}",
        o.kind.as_str(),
        o.meta.name.as_deref().unwrap_or_default()
    );
    out.extend(unfinished_of(
        &o.earlier_jobs,
        &o.earlier_pods,
        &BTreeMap::new(),
        &o.stuck_pods,
        Some(&earlier),
        o.now,
    ));
    out
}

/// The unfinished Jobs of `jobs`, and the Pods of `pods` still running without their Job;
/// `whose` is said of each when they are not this object's.
pub(super) fn unfinished_of(
    jobs: &[Job],
    pods: &[Pod],
    refusals: &BTreeMap<String, String>,
    stuck: &BTreeMap<String, String>,
    whose: Option<&str>,
    now: Timestamp,
) -> Vec<UnfinishedJob> {
    // A Pod stuck terminating: named with its node, whoever's it is.
    let stuck_note = |p: &Pod| {
        let name = p.metadata.name.clone().unwrap_or_default();
        stuck.get(&name).map(|node| {
            let note = format!(
                "its Pod {name} is still terminating past its grace period on {node}: the Job waits until the node confirms the Pod stopped; force-delete the Pod only once that node is confirmed gone (see runbooks/WaitingForJob.md)"
            );
            match whose {
                Some(w) => format!("{w}; {note}"),
                None => note,
            }
        })
    };
    let mut out = Vec::new();
    for j in jobs {
        if let JobOutcome::Unfinished { waiting_reason } = job::outcome(j, pods) {
            let name = j.metadata.name.clone().unwrap_or_default();
            let stuck_pod = pods
                .iter()
                .filter(|p| job::pod_of_job(j, p))
                .find_map(&stuck_note);
            let detail = if let Some(note) = stuck_pod {
                Some(note)
            } else if let Some(whose) = whose {
                Some(whose.to_string())
            } else if job::suspended(j) {
                Some("the Job is suspended (spec.suspend: true; a queue such as Kueue starts it once it admits it)".to_string())
            } else if let Some(w) = waiting_reason {
                Some(format!("its Pod is waiting: {w}"))
            } else if let Some(m) = refusals.get(&name) {
                Some(format!("its Pod cannot be created: {m}"))
            } else {
                podless_for(j, pods, now).map(|(since, secs)| {
                    format!(
                        "it has had no Pod since it was made at {since} ({secs}s), and no FailedCreate Event of it says why (Events expire after an hour): look for what refuses its Pods (admission policies, a quota, its ServiceAccount); see runbooks/WaitingForJob.md"
                    )
                })
            };
            out.push(UnfinishedJob {
                name,
                operation: job::operation_of(j).unwrap_or("unknown").to_string(),
                detail,
            });
        }
    }
    // A Pod whose Job is gone still runs Terraform until it ends.
    for p in pods {
        let job_name = label(&p.metadata, "job-name")
            .or_else(|| label(&p.metadata, "batch.kubernetes.io/job-name"));
        let has_job =
            job_name.is_some_and(|n| jobs.iter().any(|j| j.metadata.name.as_deref() == Some(n)));
        if !has_job && !crate::job::pod_terminated(p) {
            out.push(UnfinishedJob {
                name: p.metadata.name.clone().unwrap_or_default(),
                operation: format!(
                    "{} Pod of a deleted",
                    label(&p.metadata, names::LABEL_OPERATION).unwrap_or("unknown")
                ),
                detail: stuck_note(p).or_else(|| whose.map(str::to_string)),
            });
        }
    }
    out
}

/// When Job `j`, which has no Pod, was made, and how many seconds ago: once that is more
/// than [`POD_EXPECTED_WITHIN`]. None while it has a Pod.
fn podless_for(j: &Job, pods: &[Pod], now: Timestamp) -> Option<(Timestamp, i64)> {
    if pods.iter().any(|p| job::pod_of_job(j, p)) {
        return None;
    }
    let made = j.metadata.creation_timestamp.as_ref()?.0;
    let secs = now.as_second() - made.as_second();
    (secs >= POD_EXPECTED_WITHIN).then_some((made, secs))
}

/// The Job of `operation` attempt `attempt` of the object, by its name or its labels.
pub(super) fn attempt_job<'a>(
    o: &'a Observed,
    suffix: &str,
    operation: &str,
    attempt: u32,
) -> Option<&'a Job> {
    let name = names::job_name(suffix, operation, attempt);
    o.jobs.iter().find(|j| {
        j.metadata.name.as_deref() == Some(name.as_str())
            || (job::operation_of(j) == Some(operation) && job::attempt_of(j) == Some(attempt))
    })
}

pub(super) fn destroy_history(o: &Observed, suffix: &str) -> (u32, LastAttempt) {
    let attempt: u32 = deletion_bookkeeping(&o.meta, names::DESTROY_ATTEMPT)
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0);
    if attempt == 0 {
        return (0, LastAttempt::NoneFinished);
    }
    let failed_at: Option<Timestamp> =
        deletion_bookkeeping(&o.meta, names::DESTROY_FAILED_AT).and_then(|v| v.parse().ok());
    let job_name = names::job_name(suffix, names::OPERATION_DESTROY, attempt);
    let job = attempt_job(o, suffix, names::OPERATION_DESTROY, attempt);
    let last = match job.map(|j| job::outcome(j, &o.pods)) {
        Some(JobOutcome::Succeeded) => LastAttempt::Succeeded {
            at: job.and_then(job::finished_at),
        },
        Some(JobOutcome::Failed {
            reason, error_tail, ..
        }) => LastAttempt::Failed {
            at: failed_at.or(Some(o.now)),
            error: match job {
                Some(j) => job::failure_message(&reason, error_tail.as_deref(), j, &o.pods),
                None => reason,
            },
        },
        // An unfinished Job is row 2's business.
        Some(JobOutcome::Unfinished { .. }) => LastAttempt::NoneFinished,
        None => match failed_at {
            // A failure recorded before this deletion began belongs to an earlier object
            // of this name (recreated from saved YAML): it does not count for this one.
            Some(at) if deletion_time(&o.meta).is_some_and(|d| at < d) => LastAttempt::NoneFinished,
            Some(at) => LastAttempt::Failed {
                at: Some(at),
                error: format!(
                    "its Job {job_name} is gone; read the earlier condition message or the errored-state Secret"
                ),
            },
            None => LastAttempt::NoneFinished,
        },
    };
    (attempt, last)
}

/// Whether `jobs` (the object's, as a cache holds them) lack the Job of the attempt the
/// object says is running: a destroy attempt's number written under this uid, no failure
/// recorded, no cleanup begun; or an apply attempt's number with neither its failure nor
/// its success recorded. A cache that has not seen a Job just made yet, or a Job deleted:
/// either way the pass lists the Jobs live instead of deciding on the cache (an apply
/// decided on a cache that lags its Job would start the next attempt beside it).
pub fn started_job_unseen(meta: &ObjectMeta, kind: Kind, jobs: &[Job]) -> bool {
    let suffix = names::state_suffix(kind, meta.name.as_deref().unwrap_or_default());
    let missing = |operation: &str, n: u32| {
        let name = names::job_name(&suffix, operation, n);
        !jobs.iter().any(|j| {
            j.metadata.name.as_deref() == Some(name.as_str())
                && j.metadata.uid.is_some()
                && label(&j.metadata, names::LABEL_OWNER_UID) == meta.uid.as_deref()
        })
    };
    let ann = |key: &str| meta.annotations.as_ref().and_then(|a| a.get(key));
    let apply = ann(names::APPLY_ATTEMPT)
        .and_then(|v| v.trim().parse::<u32>().ok())
        .filter(|n| *n > 0)
        .filter(|n| {
            ann(names::APPLY_FAILED_AT).is_none()
                && !names::apply_success_recorded(meta.annotations.as_ref(), *n)
        });
    if apply.is_some_and(|n| missing(names::OPERATION_APPLY, n)) {
        return true;
    }
    let Some(n) = deletion_bookkeeping(meta, names::DESTROY_ATTEMPT)
        .and_then(|v| v.trim().parse::<u32>().ok())
        .filter(|n| *n > 0)
    else {
        return false;
    };
    if deletion_bookkeeping(meta, names::DESTROY_FAILED_AT).is_some()
        || deletion_bookkeeping(meta, names::CLEANUP_STARTED).is_some()
    {
        return false;
    }
    missing(names::OPERATION_DESTROY, n)
}

/// How long after a Job of the object failed its errored states are listed live: a
/// runner writes one just before its Pod ends, and the cache of Secrets may not have it
/// yet when the Job's failure is seen.
pub const ERRORED_SETTLES: i64 = 60;

/// Whether a Job of the object failed within [`ERRORED_SETTLES`] seconds (or at a time
/// not known): the pass reads the errored states live.
pub fn failed_lately(o: &Observed) -> bool {
    o.jobs.iter().any(|j| {
        matches!(job::outcome(j, &o.pods), JobOutcome::Failed { .. })
            && job::finished_at(j)
                .is_none_or(|at| o.now.as_second() - at.as_second() < ERRORED_SETTLES)
    })
}
