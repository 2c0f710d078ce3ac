//! Reading what became of one attempt's Job (and its Pod).
//!
//! A Job is finished only when it has the condition `Complete` or `Failed` with status
//! `True`. Since Kubernetes 1.31 the Job controller first adds `SuccessCriteriaMet` or
//! `FailureTarget` while the Pods terminate: those alone mean "unfinished" (Terraform may
//! still be writing its state).

use jiff::Timestamp;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{ContainerStateTerminated, Pod};

use crate::api::names;

use super::failure::failure_text;
use super::render::CONTAINER_NAME;

/// What one attempt's Job came to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum JobOutcome {
    /// Not finished. `waiting_reason` is the Pod's reason for not running when it has one
    /// (`ImagePullBackOff`, `CreateContainerConfigError`, `Unschedulable`, …).
    Unfinished {
        waiting_reason: Option<String>,
    },
    Succeeded,
    /// `reason`: the Job's failure reason (`BackoffLimitExceeded`, `DeadlineExceeded`, …),
    /// or the Pod's. `error_tail`: the container's termination message (the tail of
    /// Terraform's error output). `interrupted`: Terraform did not exit by itself (deadline
    /// exceeded, Pod killed or evicted, exit code 137 or 143, the Job deleted while it ran,
    /// or no exit code known at all).
    Failed {
        reason: String,
        error_tail: Option<String>,
        exit_code: Option<i32>,
        interrupted: bool,
    },
}

/// Waiting reasons that are an ordinary start, not worth reporting.
const ORDINARY_WAITING: &[&str] = &["ContainerCreating", "PodInitializing"];

/// The attempt number from the Job's labels.
pub fn attempt_of(job: &Job) -> Option<u32> {
    job.metadata
        .labels
        .as_ref()?
        .get(names::LABEL_ATTEMPT)?
        .parse()
        .ok()
}

/// The operation (`apply` or `destroy`) from the Job's labels.
pub fn operation_of(job: &Job) -> Option<&str> {
    job.metadata
        .labels
        .as_ref()?
        .get(names::LABEL_OPERATION)
        .map(String::as_str)
}

/// Whether `pod` belongs to `job`: by the Job controller's labels (`job-name`,
/// `controller-uid`, with or without the `batch.kubernetes.io/` prefix) or by an
/// ownerReference to the Job's uid.
pub fn pod_of_job(job: &Job, pod: &Pod) -> bool {
    if pod.metadata.namespace.is_some()
        && job.metadata.namespace.is_some()
        && pod.metadata.namespace != job.metadata.namespace
    {
        return false;
    }
    let labels = pod.metadata.labels.as_ref();
    let label = |k: &str| labels.and_then(|l| l.get(k)).map(String::as_str);
    if let Some(uid) = job.metadata.uid.as_deref() {
        if label("batch.kubernetes.io/controller-uid").or(label("controller-uid")) == Some(uid) {
            return true;
        }
        if pod
            .metadata
            .owner_references
            .iter()
            .flatten()
            .any(|o| o.uid == uid)
        {
            return true;
        }
        // A Pod of another Job of the same name (deleted and created again) is not this Job's.
        if label("batch.kubernetes.io/controller-uid")
            .or(label("controller-uid"))
            .is_some()
        {
            return false;
        }
    }
    let name = job.metadata.name.as_deref();
    name.is_some() && label("batch.kubernetes.io/job-name").or(label("job-name")) == name
}

/// Whether `pod` has terminated: phase `Succeeded` or `Failed`, and no container of it
/// still running or waiting (its processes are gone).
pub fn pod_terminated(pod: &Pod) -> bool {
    let Some(status) = &pod.status else {
        return false;
    };
    if !matches!(status.phase.as_deref(), Some("Succeeded" | "Failed")) {
        return false;
    }
    status
        .container_statuses
        .iter()
        .flatten()
        .chain(status.init_container_statuses.iter().flatten())
        .all(|c| {
            c.state
                .as_ref()
                .is_none_or(|s| s.running.is_none() && s.waiting.is_none())
        })
}

fn condition_true<'a>(
    job: &'a Job,
    type_: &str,
) -> Option<&'a k8s_openapi::api::batch::v1::JobCondition> {
    job.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == type_ && c.status == "True")
}

fn pod_finished(pod: &Pod) -> bool {
    matches!(
        pod.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Succeeded" | "Failed")
    )
}

/// The runner container's terminated state.
fn terminated(pod: &Pod) -> Option<&ContainerStateTerminated> {
    let statuses = pod.status.as_ref()?.container_statuses.as_ref()?;
    let status = statuses
        .iter()
        .find(|s| s.name == CONTAINER_NAME)
        .or(statuses.first())?;
    status.state.as_ref()?.terminated.as_ref()
}

/// Why a Pod that has not finished does not run, if there is a reason worth reporting.
fn waiting_reason(pod: &Pod) -> Option<String> {
    let status = pod.status.as_ref()?;
    for s in status
        .init_container_statuses
        .iter()
        .flatten()
        .chain(status.container_statuses.iter().flatten())
    {
        if let Some(reason) = s
            .state
            .as_ref()
            .and_then(|st| st.waiting.as_ref())
            .and_then(|w| w.reason.as_deref())
            && !ORDINARY_WAITING.contains(&reason)
        {
            return Some(reason.to_string());
        }
    }
    let unscheduled = status
        .conditions
        .iter()
        .flatten()
        .find(|c| c.type_ == "PodScheduled" && c.status == "False")?;
    Some(
        unscheduled
            .reason
            .clone()
            .unwrap_or_else(|| "Unschedulable".to_string()),
    )
}

/// Whether the Pod was stopped from outside rather than Terraform exiting by itself.
fn pod_interrupted(pod: &Pod) -> bool {
    let status = pod.status.as_ref();
    let reason = status.and_then(|s| s.reason.as_deref());
    if matches!(
        reason,
        Some(
            "DeadlineExceeded" | "Evicted" | "Preempting" | "Terminated" | "Shutdown" | "NodeLost"
        )
    ) {
        return true;
    }
    if status
        .and_then(|s| s.conditions.as_ref())
        .into_iter()
        .flatten()
        .any(|c| c.type_ == "DisruptionTarget" && c.status == "True")
    {
        return true;
    }
    match terminated(pod) {
        Some(t) => matches!(t.exit_code, 137 | 143) || t.reason.as_deref() == Some("OOMKilled"),
        None => true,
    }
}

/// The Pod that tells the most: the newest finished one, else the newest.
fn main_pod<'a>(pods: &[&'a Pod]) -> Option<&'a Pod> {
    let newest = |it: &mut dyn Iterator<Item = &'a Pod>| {
        it.max_by_key(|p| p.metadata.creation_timestamp.clone().map(|t| t.0))
    };
    newest(&mut pods.iter().copied().filter(|p| pod_finished(p)))
        .or_else(|| newest(&mut pods.iter().copied()))
}

/// The failure reason of a Job whose deadline passed before any of its Pods ran the
/// runner (refused by admission or a quota, an image that is not pulled, no node).
pub const RUNNER_NEVER_STARTED: &str = "RunnerNeverStarted";

/// The failure reason of a runner the kernel killed for exceeding its memory limit.
pub const OOM_KILLED: &str = "OOMKilled";

/// Whether the Pod's runner container ever started.
fn runner_started(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref())
        .into_iter()
        .flatten()
        .any(|c| {
            c.state
                .as_ref()
                .is_some_and(|st| st.running.is_some() || st.terminated.is_some())
                || c.last_state
                    .as_ref()
                    .is_some_and(|st| st.running.is_some() || st.terminated.is_some())
        })
}

/// The text of a failed attempt for the condition and the Event: what killed the runner
/// when something did (its memory, a deadline before it ever ran), else a summary of
/// Terraform's errors with where to read the rest, else the Job's reason.
pub fn failure_message(reason: &str, error_tail: Option<&str>, job: &Job, pods: &[Pod]) -> String {
    let ns = job.metadata.namespace.clone().unwrap_or_default();
    let name = job.metadata.name.clone().unwrap_or_default();
    match error_tail.filter(|t| !t.trim().is_empty()) {
        Some(t) if reason != OOM_KILLED && reason != RUNNER_NEVER_STARTED => {
            failure_text(t, &name, &ns)
        }
        _ => reason_text(reason, job, pods),
    }
}

/// The runner's container of a Job (by its name, else the first: a template may rename
/// it).
pub fn runner_container(job: &Job) -> Option<&k8s_openapi::api::core::v1::Container> {
    let pod = job.spec.as_ref()?.template.spec.as_ref()?;
    pod.containers
        .iter()
        .find(|c| c.name == CONTAINER_NAME)
        .or(pod.containers.first())
}

/// What an operator reads for a failure without Terraform output: the reason, or for a
/// runner that never started, what kept it, and where to look.
pub fn reason_text(reason: &str, job: &Job, pods: &[Pod]) -> String {
    if reason == OOM_KILLED {
        let limit = runner_container(job).and_then(|c| {
            c.resources
                .as_ref()?
                .limits
                .as_ref()?
                .get("memory")
                .cloned()
        });
        let limit = match limit {
            Some(q) => format!("its memory limit is {}", q.0),
            None => "it has no memory limit, so the node ran out".to_string(),
        };
        return format!(
            "the runner was killed for its memory use (OOMKilled; {limit}): raise resources.limits.memory of the runner container in the Job template (--templates-dir), or make the module load less"
        );
    }
    if reason != RUNNER_NEVER_STARTED {
        return reason.to_string();
    }
    let name = job.metadata.name.clone().unwrap_or_default();
    let ns = job.metadata.namespace.clone().unwrap_or_default();
    let own: Vec<&Pod> = pods.iter().filter(|p| pod_of_job(job, p)).collect();
    let why = match own.iter().find_map(|p| waiting_reason(p)) {
        Some(w) => format!("its Pod waited with {w}"),
        None if own.is_empty() => "no Pod was made (see the Job's FailedCreate Events)".to_string(),
        None => "its Pod was never scheduled or started".to_string(),
    };
    format!(
        "the runner Pod never started before the Job's deadline ({why}); Terraform did not run: kubectl describe job/{name} -n {ns}"
    )
}

/// What became of `job`; `pods` may contain any Pods, this Job's are picked out.
pub fn outcome(job: &Job, pods: &[Pod]) -> JobOutcome {
    let pods: Vec<&Pod> = pods.iter().filter(|p| pod_of_job(job, p)).collect();
    let deleting = job.metadata.deletion_timestamp.is_some();
    let pod = main_pod(&pods);

    if condition_true(job, "Complete").is_some() {
        return JobOutcome::Succeeded;
    }
    if let Some(failed) = condition_true(job, "Failed") {
        let t = pod.and_then(terminated);
        let job_reason = failed.reason.clone().filter(|r| !r.is_empty());
        let pod_reason = pod.and_then(|p| p.status.as_ref()?.reason.clone());
        let interrupted = job_reason.as_deref() == Some("DeadlineExceeded")
            || deleting
            || pod.is_none_or(pod_interrupted);
        // The runner killed for its memory: named as such, whatever the Job says.
        let oom = t.is_some_and(|t| t.reason.as_deref() == Some(OOM_KILLED));
        let job_reason = if oom {
            Some(OOM_KILLED.to_string())
        } else {
            job_reason
        };
        // The deadline passed before Terraform ever ran: not a Terraform timeout.
        let job_reason = match job_reason {
            Some(r) if r == "DeadlineExceeded" && !pods.iter().any(|p| runner_started(p)) => {
                Some(RUNNER_NEVER_STARTED.to_string())
            }
            other => other,
        };
        return JobOutcome::Failed {
            reason: job_reason
                .or(pod_reason)
                .unwrap_or_else(|| "Failed".to_string()),
            error_tail: t
                .and_then(|t| t.message.clone())
                .filter(|m| !m.trim().is_empty()),
            exit_code: t.map(|t| t.exit_code),
            interrupted,
        };
    }
    if deleting {
        // Deleted before the Job controller marked it finished: unfinished while any Pod
        // has not terminated; afterwards, what its Pod says.
        if pods.iter().any(|p| !pod_finished(p)) {
            return JobOutcome::Unfinished {
                waiting_reason: pods.iter().find_map(|p| waiting_reason(p)),
            };
        }
        let t = pod.and_then(terminated);
        if pod.is_some_and(|p| {
            p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Succeeded")
        }) && t.is_some_and(|t| t.exit_code == 0)
        {
            return JobOutcome::Succeeded;
        }
        return JobOutcome::Failed {
            reason: "JobDeleted".to_string(),
            error_tail: t
                .and_then(|t| t.message.clone())
                .filter(|m| !m.trim().is_empty()),
            exit_code: t.map(|t| t.exit_code),
            interrupted: true,
        };
    }
    let waiting = pods
        .iter()
        .filter(|p| !pod_finished(p))
        .find_map(|p| waiting_reason(p));
    JobOutcome::Unfinished {
        waiting_reason: waiting,
    }
}

/// What became of an attempt whose Job is gone (deleted by hand or by a cleanup policy
/// before a pass saw it end), from the Pod it left: unknown while the Pod runs (the Pod
/// of a deleted Job is waited for as unfinished); succeeded when Terraform exited 0;
/// otherwise failed, interrupted unless the Pod shows Terraform exiting by itself.
pub fn pod_outcome(pod: &Pod) -> Option<JobOutcome> {
    if !pod_finished(pod) {
        return None;
    }
    let t = terminated(pod);
    if pod.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Succeeded")
        && t.is_some_and(|t| t.exit_code == 0)
    {
        return Some(JobOutcome::Succeeded);
    }
    Some(JobOutcome::Failed {
        reason: "JobDeleted".to_string(),
        error_tail: t
            .and_then(|t| t.message.clone())
            .filter(|m| !m.trim().is_empty()),
        exit_code: t.map(|t| t.exit_code),
        interrupted: pod_interrupted(pod),
    })
}

/// Whether the Job is suspended (by `spec.suspend`, as a queue such as Kueue does):
/// the Job controller makes no Pod for it.
pub fn suspended(job: &Job) -> bool {
    job.spec.as_ref().and_then(|s| s.suspend) == Some(true)
        || condition_true(job, "Suspended").is_some()
}

/// When a Job finished: the time of its `Complete`, `Failed` or `FailureTarget` condition.
pub fn finished_at(j: &Job) -> Option<Timestamp> {
    j.status
        .as_ref()?
        .conditions
        .iter()
        .flatten()
        .find(|c| {
            (c.type_ == "Failed" || c.type_ == "FailureTarget" || c.type_ == "Complete")
                && c.status == "True"
        })
        .and_then(|c| c.last_transition_time.as_ref())
        .map(|t| t.0)
}

/// How long a finished Job ran: from its `startTime` to [`finished_at`].
pub fn ran_for(j: &Job) -> Option<std::time::Duration> {
    let start = j.status.as_ref()?.start_time.as_ref()?.0;
    let ms = finished_at(j)?.as_millisecond() - start.as_millisecond();
    u64::try_from(ms).ok().map(std::time::Duration::from_millis)
}

#[cfg(test)]
#[path = "outcome_tests.rs"]
mod tests;
