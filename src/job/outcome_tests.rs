use super::*;
use crate::job::failure::{SUMMARY_MAX, error_summary};
use serde_json::{Value, json};

const JOB_UID: &str = "job-uid-1";

/// A Job of attempt 3 with the given conditions (type, status, reason).
fn job(conditions: &[(&str, &str, &str)]) -> Job {
    let conditions: Vec<Value> = conditions
        .iter()
        .map(|(t, s, r)| json!({"type": t, "status": s, "reason": r}))
        .collect();
    serde_json::from_value(json!({
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": "captf-web-1-tfm-destroy-3", "namespace": "team-a", "uid": JOB_UID,
            "labels": {names::LABEL_ATTEMPT: "3", names::LABEL_OPERATION: "destroy"}},
        "spec": {"template": {"spec": {"containers": []}}},
        "status": {"conditions": conditions}
    }))
    .unwrap()
}

fn deleting(mut job: Job) -> Job {
    job.metadata.deletion_timestamp =
        Some(serde_json::from_value(json!("2026-12-01T10:00:00Z")).unwrap());
    job
}

/// A Pod of that Job with the given status.
fn pod(status: Value) -> Pod {
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "captf-web-1-tfm-destroy-3-abcde", "namespace": "team-a",
            "creationTimestamp": "2026-12-01T09:00:00Z",
            "labels": {"batch.kubernetes.io/job-name": "captf-web-1-tfm-destroy-3",
                "batch.kubernetes.io/controller-uid": JOB_UID}},
        "spec": {"containers": [{"name": "terraform"}]},
        "status": status
    }))
    .unwrap()
}

fn waiting(reason: &str) -> Pod {
    pod(
        json!({"phase": "Pending", "containerStatuses": [{"name": "terraform", "image": "x", "imageID": "",
        "ready": false, "restartCount": 0, "state": {"waiting": {"reason": reason, "message": "m"}}}]}),
    )
}

fn running() -> Pod {
    pod(
        json!({"phase": "Running", "containerStatuses": [{"name": "terraform", "image": "x", "imageID": "",
        "ready": true, "restartCount": 0, "state": {"running": {"startedAt": "2026-12-01T09:00:01Z"}}}]}),
    )
}

fn exited(phase: &str, code: i32, message: Option<&str>, pod_reason: Option<&str>) -> Pod {
    let mut terminated =
        json!({"exitCode": code, "reason": if code == 0 { "Completed" } else { "Error" }});
    if let Some(m) = message {
        terminated["message"] = json!(m);
    }
    let mut status = json!({"phase": phase, "containerStatuses": [{"name": "terraform", "image": "x",
        "imageID": "", "ready": false, "restartCount": 0, "state": {"terminated": terminated}}]});
    if let Some(r) = pod_reason {
        status["reason"] = json!(r);
    }
    pod(status)
}

fn unfinished(reason: Option<&str>) -> JobOutcome {
    JobOutcome::Unfinished {
        waiting_reason: reason.map(str::to_string),
    }
}

#[test]
fn a_running_job_reports_its_pods_waiting_reason() {
    for reason in [
        "ImagePullBackOff",
        "ErrImagePull",
        "CreateContainerConfigError",
    ] {
        assert_eq!(
            outcome(&job(&[]), &[waiting(reason)]),
            unfinished(Some(reason))
        );
    }
    assert_eq!(
        outcome(&job(&[]), &[waiting("ContainerCreating")]),
        unfinished(None)
    );
    assert_eq!(outcome(&job(&[]), &[running()]), unfinished(None));
    assert_eq!(outcome(&job(&[]), &[]), unfinished(None));
    let unschedulable = pod(json!({"phase": "Pending", "conditions": [
        {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": "0/3 nodes"}]}));
    assert_eq!(
        outcome(&job(&[]), &[unschedulable]),
        unfinished(Some("Unschedulable"))
    );
}

#[test]
fn pods_of_other_jobs_are_ignored() {
    let mut other = waiting("ImagePullBackOff");
    let labels = other.metadata.labels.as_mut().unwrap();
    labels.insert(
        "batch.kubernetes.io/controller-uid".into(),
        "another-uid".into(),
    );
    assert_eq!(outcome(&job(&[]), &[other]), unfinished(None));
}

#[test]
fn failure_target_or_success_criteria_alone_is_unfinished() {
    let j = job(&[("FailureTarget", "True", "BackoffLimitExceeded")]);
    assert_eq!(outcome(&j, &[running()]), unfinished(None));
    let j = job(&[("SuccessCriteriaMet", "True", "CompletionsReached")]);
    assert_eq!(
        outcome(&j, &[exited("Succeeded", 0, None, None)]),
        unfinished(None)
    );
    let j = job(&[("Failed", "False", "")]);
    assert_eq!(outcome(&j, &[running()]), unfinished(None));
}

#[test]
fn a_complete_job_succeeded() {
    let j = job(&[
        ("SuccessCriteriaMet", "True", "CompletionsReached"),
        ("Complete", "True", "CompletionsReached"),
    ]);
    assert_eq!(
        outcome(&j, &[exited("Succeeded", 0, None, None)]),
        JobOutcome::Succeeded
    );
}

#[test]
fn a_failed_job_carries_the_termination_message() {
    let j = job(&[
        ("FailureTarget", "True", "BackoffLimitExceeded"),
        ("Failed", "True", "BackoffLimitExceeded"),
    ]);
    let p = exited(
        "Failed",
        1,
        Some("terraform destroy failed (exit 1)\nError: boom"),
        None,
    );
    assert_eq!(
        outcome(&j, &[p]),
        JobOutcome::Failed {
            reason: "BackoffLimitExceeded".into(),
            error_tail: Some("terraform destroy failed (exit 1)\nError: boom".into()),
            exit_code: Some(1),
            interrupted: false,
        }
    );
}

#[test]
fn a_deadline_exceeded_job_was_interrupted() {
    let j = job(&[("Failed", "True", "DeadlineExceeded")]);
    let out = outcome(
        &j,
        &[exited(
            "Failed",
            1,
            Some("interrupted"),
            Some("DeadlineExceeded"),
        )],
    );
    let JobOutcome::Failed {
        reason,
        interrupted,
        exit_code,
        ..
    } = out
    else {
        panic!("{out:?}")
    };
    assert_eq!(reason, "DeadlineExceeded");
    assert!(interrupted);
    assert_eq!(exit_code, Some(1));
}

#[test]
fn a_deadline_before_the_runner_ever_ran_says_it_never_started() {
    let j = job(&[("Failed", "True", "DeadlineExceeded")]);
    // Its Pod waited on an image for the whole deadline.
    let pulling = waiting("ImagePullBackOff");
    let out = outcome(&j, std::slice::from_ref(&pulling));
    let JobOutcome::Failed { reason, .. } = &out else {
        panic!("{out:?}")
    };
    assert_eq!(reason, RUNNER_NEVER_STARTED);
    let text = reason_text(reason, &j, &[pulling]);
    assert!(
        text.contains("the runner Pod never started") && text.contains("ImagePullBackOff"),
        "{text}"
    );
    assert!(!text.contains("DeadlineExceeded"), "{text}");
    // No Pod at all (each one refused).
    let out = outcome(&j, &[]);
    let JobOutcome::Failed { reason, .. } = &out else {
        panic!("{out:?}")
    };
    assert!(reason_text(reason, &j, &[]).contains("no Pod was made"));
    // A runner that ran and was stopped by the deadline: Terraform's own timeout.
    let out = outcome(&j, &[running()]);
    assert!(
        matches!(&out, JobOutcome::Failed { reason, .. } if reason == "DeadlineExceeded"),
        "{out:?}"
    );
}

#[test]
fn an_oom_killed_runner_is_named_with_its_limit() {
    let mut j = job(&[("Failed", "True", "BackoffLimitExceeded")]);
    let mut p = exited("Failed", 137, None, None);
    p.status
        .as_mut()
        .unwrap()
        .container_statuses
        .as_mut()
        .unwrap()[0]
        .state
        .as_mut()
        .unwrap()
        .terminated
        .as_mut()
        .unwrap()
        .reason = Some("OOMKilled".into());
    let out = outcome(&j, std::slice::from_ref(&p));
    let JobOutcome::Failed { reason, .. } = &out else {
        panic!("{out:?}")
    };
    assert_eq!(reason, OOM_KILLED);
    assert!(reason_text(reason, &j, &[]).contains("no memory limit"));
    j.spec = Some(
        serde_json::from_value(json!({"template": {"spec": {"containers": [
            {"name": "terraform", "resources": {"limits": {"memory": "512Mi"}}}
        ]}}}))
        .unwrap(),
    );
    let text = reason_text(reason, &j, &[p]);
    assert!(
        text.contains("OOMKilled") && text.contains("512Mi"),
        "{text}"
    );
}

#[test]
fn exit_143_or_137_or_an_eviction_or_no_pod_means_interrupted() {
    let j = job(&[("Failed", "True", "BackoffLimitExceeded")]);
    for p in [
        exited(
            "Failed",
            143,
            Some("terraform destroy interrupted by SIGTERM"),
            None,
        ),
        exited("Failed", 137, None, None),
        exited("Failed", 1, None, Some("Evicted")),
    ] {
        let out = outcome(&j, &[p]);
        assert!(
            matches!(
                out,
                JobOutcome::Failed {
                    interrupted: true,
                    ..
                }
            ),
            "{out:?}"
        );
    }
    let out = outcome(&j, &[]);
    assert_eq!(
        out,
        JobOutcome::Failed {
            reason: "BackoffLimitExceeded".into(),
            error_tail: None,
            exit_code: None,
            interrupted: true
        }
    );
}

#[test]
fn a_deleted_job_is_unfinished_while_its_pod_runs_then_interrupted() {
    let j = deleting(job(&[]));
    assert_eq!(outcome(&j, &[running()]), unfinished(None));
    let out = outcome(&j, &[exited("Failed", 143, Some("SIGTERM"), None)]);
    let JobOutcome::Failed {
        reason,
        interrupted,
        exit_code,
        error_tail,
    } = out
    else {
        panic!("{out:?}")
    };
    assert_eq!(
        (reason.as_str(), interrupted, exit_code),
        ("JobDeleted", true, Some(143))
    );
    assert_eq!(error_tail.as_deref(), Some("SIGTERM"));
    assert_eq!(
        outcome(&j, &[exited("Succeeded", 0, None, None)]),
        JobOutcome::Succeeded
    );
    assert!(matches!(
        outcome(&j, &[]),
        JobOutcome::Failed {
            interrupted: true,
            ..
        }
    ));
}

#[test]
fn attempt_and_operation_come_from_the_labels() {
    let j = job(&[]);
    assert_eq!(attempt_of(&j), Some(3));
    assert_eq!(operation_of(&j), Some("destroy"));
    assert_eq!(attempt_of(&Job::default()), None);
    assert_eq!(operation_of(&Job::default()), None);
}

#[test]
fn the_summary_keeps_the_headlines_and_leaves_the_details_to_the_log() {
    let output = "terraform destroy failed (exit 1)\n\u{1b}[31m╷\u{1b}[0m\n\u{1b}[31m│\u{1b}[0m \u{1b}[1m\u{1b}[31mError: \u{1b}[0m\u{1b}[0m\u{1b}[1mdeleting VM web-1-0: 403 Forbidden\u{1b}[0m\n│ \n│   with aws_instance.web,\n│   password = \"hunter2\"\n╵\nError: local-exec provisioner error\n│ Error running command: exit status 1. Output: the cloud said no\n";
    let s = error_summary(output);
    assert_eq!(
        s,
        "terraform destroy failed (exit 1); Error: deleting VM web-1-0: 403 Forbidden; Error: local-exec provisioner error"
    );
    assert!(!s.contains("hunter2") && !s.contains('\u{1b}'));
    let long = format!(
        "terraform destroy failed (exit 1)\nError: {}",
        "é".repeat(500)
    );
    let s = error_summary(&long);
    assert!(s.len() <= SUMMARY_MAX && s.ends_with('…'), "{}", s.len());
    // No headline: the first and the last line.
    assert_eq!(error_summary("SIGTERM"), "SIGTERM");
    assert_eq!(error_summary("a\nb\nc"), "a; c");
    assert_eq!(
        failure_text("x", "captf-web-1-tfm-destroy-2", "team-a"),
        "x (Terraform's whole output: kubectl logs job/captf-web-1-tfm-destroy-2 -n team-a)"
    );
}
