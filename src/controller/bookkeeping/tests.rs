//! The bookkeeping plan, one case per choice it makes, on the facts and decision the rule
//! table gives for the observation (as a pass would have them).

use super::*;
use crate::api::names::Kind;
use crate::gather::Settings;
use crate::rules::{CleanupMarker, UnfinishedJob};
use crate::testing::{created_at, job, observed, pod_of};

const FAILED_AT: &str = "2026-12-01T11:30:00Z";
const NOW: &str = "2026-12-01T12:00:00Z";

/// A TerraformMachine being deleted whose destroy attempt `n` was recorded, with `extra`
/// annotations.
fn deleting_at_attempt(n: u32, extra: &[(&str, &str)]) -> Observed {
    let attempt = n.to_string();
    let mut annotations = vec![
        (names::DESTROY_ATTEMPT, attempt.as_str()),
        (names::DELETION_UID, "uid-1"),
    ];
    annotations.extend_from_slice(extra);
    let mut o = observed(Kind::TerraformMachine, &annotations);
    o.meta = created_at(o.meta, "2026-12-01T08:00:00Z");
    o
}

fn plan_of(o: &Observed) -> Bookkeeping {
    let (decision, facts, _) = gather::decide(o, &Settings::default());
    plan(o, &Settings::default(), &facts, &decision)
}

fn failed(kind: Kind, operation: &str, n: u32, reason: &str) -> Job {
    job(kind, operation, n, &[("Failed", "True", reason, FAILED_AT)])
}

fn edit<'a>(p: &'a Bookkeeping, key: &str) -> Option<&'a Option<String>> {
    p.edits.iter().find(|(k, _)| *k == key).map(|(_, v)| v)
}

#[test]
fn a_failed_destroy_attempt_is_recorded_at_its_jobs_end_with_a_warning_and_its_reason() {
    let mut o = deleting_at_attempt(2, &[]);
    let mut j = failed(Kind::TerraformMachine, "destroy", 2, "BackoffLimitExceeded");
    j.status.get_or_insert_default().start_time =
        Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
            "2026-12-01T11:28:30Z".parse().unwrap(),
        ));
    o.pods = vec![pod_of(
        &j,
        Some((1, "Error: deleting subnet: DependencyViolation")),
    )];
    o.jobs = vec![j];
    let p = plan_of(&o);
    assert_eq!(
        edit(&p, names::DESTROY_FAILED_AT),
        Some(&Some(
            FAILED_AT.parse::<jiff::Timestamp>().unwrap().to_string()
        ))
    );
    assert_eq!(p.failure.as_deref(), Some("BackoffLimitExceeded"));
    assert_eq!(
        p.failed_job_ran,
        Some(std::time::Duration::from_secs(90)),
        "from its start to its end"
    );
    assert_eq!(p.notes.len(), 1);
    assert_eq!(p.notes[0].reason, events::DESTROY_FAILED);
    assert!(
        p.notes[0].note.starts_with("destroy attempt 2 failed: ")
            && p.notes[0].note.contains("DependencyViolation"),
        "{}",
        p.notes[0].note
    );
}

#[test]
fn a_failure_already_recorded_for_this_object_is_not_recorded_again() {
    let mut o = deleting_at_attempt(2, &[(names::DESTROY_FAILED_AT, FAILED_AT)]);
    let j = failed(Kind::TerraformMachine, "destroy", 2, "BackoffLimitExceeded");
    o.pods = vec![pod_of(&j, Some((1, "Error")))];
    o.jobs = vec![j];
    let p = plan_of(&o);
    assert_eq!(edit(&p, names::DESTROY_FAILED_AT), None);
    assert!(p.notes.is_empty() && p.failure.is_none());
}

#[test]
fn a_destroy_job_deleted_while_its_pod_runs_is_an_interrupted_attempt_recorded_now() {
    let mut o = deleting_at_attempt(3, &[]);
    let gone = job(Kind::TerraformMachine, "destroy", 3, &[]);
    o.pods = vec![pod_of(&gone, None)];
    let p = plan_of(&o);
    assert_eq!(
        edit(&p, names::DESTROY_FAILED_AT),
        Some(&Some(NOW.parse::<jiff::Timestamp>().unwrap().to_string()))
    );
    assert_eq!(p.notes.len(), 1);
    assert_eq!(p.notes[0].reason, events::DESTROY_INTERRUPTED);
    assert!(p.failure.is_none(), "not counted as a failure of Terraform");
}

#[test]
fn an_attempt_with_neither_job_nor_pod_records_nothing() {
    let o = deleting_at_attempt(3, &[]);
    let p = plan_of(&o);
    assert_eq!(edit(&p, names::DESTROY_FAILED_AT), None);
    assert!(p.notes.is_empty());
}

#[test]
fn an_interrupted_apply_is_recorded_once_and_cleared_by_a_later_success() {
    let mut o = applying(2, &[]);
    o.jobs = vec![
        failed(Kind::TerraformMachine, "apply", 1, "BackoffLimitExceeded"),
        failed(Kind::TerraformMachine, "apply", 2, "DeadlineExceeded"),
    ];
    let p = plan_of(&o);
    let at = Some(FAILED_AT.parse::<jiff::Timestamp>().unwrap().to_string());
    assert_eq!(
        edit(&p, names::APPLY_INTERRUPTED),
        Some(&at),
        "the latest apply (2) ran past its deadline"
    );
    assert_eq!(
        edit(&p, names::APPLY_FAILED_AT),
        Some(&at),
        "with its failure"
    );

    // Recorded: the failure and the interruption are not written again, and once an
    // operator removes apply-interrupted (the runbook's step), it stays removed.
    let mut recorded = o.clone();
    recorded.meta.annotations.as_mut().unwrap().extend([
        (names::APPLY_FAILED_AT.to_string(), FAILED_AT.to_string()),
        (names::APPLY_FAILURES.to_string(), "1".to_string()),
    ]);
    assert_eq!(edit(&plan_of(&recorded), names::APPLY_INTERRUPTED), None);

    // A later apply succeeded: recorded with the state it left, which clears it.
    let mut later = recorded.clone();
    later.meta.annotations.as_mut().unwrap().extend([
        (names::APPLY_ATTEMPT.to_string(), "3".to_string()),
        (names::APPLY_INTERRUPTED.to_string(), FAILED_AT.to_string()),
    ]);
    later.jobs.push(job(
        Kind::TerraformMachine,
        "apply",
        3,
        &[("Complete", "True", "", NOW)],
    ));
    later.state = Some(crate::testing::state_with_outputs(
        "prod.tfm",
        serde_json::json!({"provider_id": "aws:///eu-west-1a/i-0abc"}),
    ));
    let (decision, facts, _) = gather::decide(&later, &Settings::default());
    assert_eq!(
        edit(
            &plan(&later, &Settings::default(), &facts, &decision),
            names::APPLY_INTERRUPTED
        ),
        Some(&None),
        "a later apply succeeded"
    );
}

#[test]
fn an_adopted_states_fingerprint_is_recorded_once() {
    let o = deleting_at_attempt(0, &[(names::ADOPT, "true")]);
    let (decision, mut facts, _) = gather::decide(&o, &Settings::default());
    facts.state = StateFacts::Readable {
        managed_instances: 1,
        lineage: "lin-1".into(),
        serial: 7,
        secret: "tfstate-default-prod.tfm".into(),
    };
    let p = plan(&o, &Settings::default(), &facts, &decision);
    assert_eq!(edit(&p, names::STATE_LINEAGE), Some(&Some("lin-1".into())));
    assert_eq!(edit(&p, names::STATE_SERIAL), Some(&Some("7".into())));

    let recorded = deleting_at_attempt(
        0,
        &[
            (names::ADOPT, "true"),
            (names::STATE_LINEAGE, "lin-1"),
            (names::STATE_SERIAL, "5"),
        ],
    );
    let p = plan(&recorded, &Settings::default(), &facts, &decision);
    assert_eq!(edit(&p, names::STATE_LINEAGE), None);
    assert_eq!(edit(&p, names::STATE_SERIAL), None);
}

#[test]
fn block_move_is_on_while_deleting_or_a_job_runs_and_rides_on_the_actions_own_write() {
    let unfinished = UnfinishedJob {
        name: "captf-prod-tfm-apply-1".into(),
        operation: "apply".into(),
        detail: None,
    };
    let o = deleting_at_attempt(1, &[]);
    let (decision, facts, _) = gather::decide(&o, &Settings::default());
    // (deleting, a Job runs, the action writes the object, block-move there) -> edit
    type Case = (bool, bool, bool, bool, Option<Option<String>>);
    let table: [Case; 8] = [
        (true, false, false, false, Some(Some("true".into()))),
        (true, false, true, false, None),
        (true, false, false, true, None),
        (true, false, true, true, None),
        (false, true, false, false, Some(Some("true".into()))),
        (false, true, false, true, None),
        (false, false, false, true, Some(None)),
        (false, false, false, false, None),
    ];
    for (deleting, running, action_writes, there, want) in table {
        let mut o = o.clone();
        if there {
            o.meta
                .annotations
                .get_or_insert_default()
                .insert(names::CLUSTERCTL_BLOCK_MOVE.into(), "true".into());
        }
        let mut f = facts.clone();
        f.deleting = deleting;
        f.unfinished_jobs = if running {
            vec![unfinished.clone()]
        } else {
            vec![]
        };
        let mut d = decision.clone();
        d.action = if action_writes {
            Action::StartDestroy { attempt: 2 }
        } else {
            Action::WaitForJob
        };
        let p = plan(&o, &Settings::default(), &f, &d);
        assert_eq!(
            edit(&p, names::CLUSTERCTL_BLOCK_MOVE).cloned(),
            want,
            "deleting {deleting}, a Job runs {running}, the action writes {action_writes}, block-move there {there}"
        );
    }
}

/// A deletion held for a person does not block a move (the held state moves with the
/// object); a pause (a move under way) changes nothing clusterctl then checks.
#[test]
fn block_move_is_off_while_a_deletion_is_held_and_untouched_under_a_pause() {
    let o = deleting_at_attempt(1, &[]);
    let (decision, facts, _) = gather::decide(&o, &Settings::default());
    // (held, paused, block-move there) -> edit
    type Case = (bool, bool, bool, Option<Option<String>>);
    let table: [Case; 6] = [
        (true, false, true, Some(None)),
        (true, false, false, None),
        (false, false, false, Some(Some("true".into()))),
        (false, true, false, None),
        (false, true, true, None),
        (true, true, false, None),
    ];
    for (held, paused, there, want) in table {
        let mut o = o.clone();
        if there {
            o.meta
                .annotations
                .get_or_insert_default()
                .insert(names::CLUSTERCTL_BLOCK_MOVE.into(), "true".into());
        }
        let mut f = facts.clone();
        f.deleting = true;
        f.unfinished_jobs = vec![];
        f.paused = paused.then_some(crate::rules::PauseCause::ObjectAnnotation);
        let mut d = decision.clone();
        d.action = if held {
            Action::Hold
        } else {
            Action::WaitForDependents
        };
        let p = plan(&o, &Settings::default(), &f, &d);
        assert_eq!(
            edit(&p, names::CLUSTERCTL_BLOCK_MOVE).cloned(),
            want,
            "held {held}, paused {paused}, block-move there {there}"
        );
    }
}

#[test]
fn the_last_three_finished_destroy_jobs_are_kept_and_no_unfinished_one_is_pruned() {
    let mut o = deleting_at_attempt(7, &[]);
    o.jobs = (1..=6)
        .map(|n| failed(Kind::TerraformMachine, "destroy", n, "BackoffLimitExceeded"))
        .collect();
    // Attempt 2's Job has not finished (its Pod still runs after a restart of the manager).
    o.jobs[1] = job(Kind::TerraformMachine, "destroy", 2, &[]);
    o.pods = vec![pod_of(&o.jobs[1], None)];
    o.jobs.push(job(Kind::TerraformMachine, "destroy", 7, &[]));
    let p = plan_of(&o);
    let name = |n| names::job_name("prod.tfm", "destroy", n);
    assert_eq!(p.prune, vec![name(1), name(3), name(4)]);
}

#[test]
fn the_state_is_protected_whole_only_when_no_job_runs_or_starts_and_never_after_cleanup_began() {
    let o = deleting_at_attempt(1, &[]);
    let (decision, facts, _) = gather::decide(&o, &Settings::default());
    let mut d = decision.clone();
    d.action = Action::WaitForDependents;
    assert_eq!(
        plan(&o, &Settings::default(), &facts, &d).protect,
        Protect::BaseAndParts
    );
    d.action = Action::StartDestroy { attempt: 2 };
    assert_eq!(
        plan(&o, &Settings::default(), &facts, &d).protect,
        Protect::Base
    );

    let mut running = facts.clone();
    running.unfinished_jobs = vec![UnfinishedJob {
        name: "captf-prod-tfm-destroy-1".into(),
        operation: "destroy".into(),
        detail: None,
    }];
    assert_eq!(
        plan(&o, &Settings::default(), &running, &decision).protect,
        Protect::Nothing
    );

    let mut cleaning = facts.clone();
    cleaning.cleanup = Some(CleanupMarker::Destroyed);
    assert_eq!(
        plan(&o, &Settings::default(), &cleaning, &decision).protect,
        Protect::Nothing
    );
}

/// A live TerraformMachine whose apply attempt `n` started, with `extra` annotations.
fn applying(n: u32, extra: &[(&str, &str)]) -> Observed {
    let attempt = n.to_string();
    let mut annotations = vec![
        (names::APPLY_ATTEMPT, attempt.as_str()),
        (names::APPLIED_AT, "2026-12-01T09:00:00Z"),
    ];
    annotations.extend_from_slice(extra);
    let mut o = observed(Kind::TerraformMachine, &annotations);
    o.meta.deletion_timestamp = None;
    o
}

#[test]
fn an_apply_failure_is_recorded_once_with_the_count_of_failures_in_a_row() {
    let mut o = applying(3, &[(names::APPLY_FAILURES, "2")]);
    let mut j = failed(Kind::TerraformMachine, "apply", 3, "BackoffLimitExceeded");
    j.status.get_or_insert_default().start_time =
        Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
            "2026-12-01T11:29:00Z".parse().unwrap(),
        ));
    o.pods = vec![pod_of(&j, Some((1, "Error: quota exceeded")))];
    o.jobs = vec![j];
    let p = plan_of(&o);
    assert_eq!(
        p.apply_job_ran,
        Some((std::time::Duration::from_secs(60), "failed")),
        "its duration, for the histogram"
    );
    assert_eq!(
        edit(&p, names::APPLY_FAILED_AT),
        Some(&Some(
            FAILED_AT.parse::<jiff::Timestamp>().unwrap().to_string()
        ))
    );
    assert_eq!(edit(&p, names::APPLY_FAILURES), Some(&Some("3".into())));
    assert_eq!(p.apply_failure.as_deref(), Some("BackoffLimitExceeded"));
    assert!(!p.provisioned());
    assert_eq!(p.notes.len(), 1);
    assert_eq!(p.notes[0].reason, events::APPLY_FAILED);
    assert!(
        p.notes[0].note.starts_with("apply attempt 3 failed: ")
            && p.notes[0].note.contains("quota exceeded"),
        "{}",
        p.notes[0].note
    );

    // Recorded already: nothing again.
    let mut o = applying(
        3,
        &[
            (names::APPLY_FAILURES, "3"),
            (names::APPLY_FAILED_AT, FAILED_AT),
        ],
    );
    let j = failed(Kind::TerraformMachine, "apply", 3, "BackoffLimitExceeded");
    o.pods = vec![pod_of(&j, Some((1, "Error: quota exceeded")))];
    o.jobs = vec![j];
    let p = plan_of(&o);
    assert_eq!(edit(&p, names::APPLY_FAILED_AT), None);
    assert_eq!(edit(&p, names::APPLY_FAILURES), None);
    assert!(p.notes.is_empty(), "{:?}", p.notes);
}

#[test]
fn an_apply_success_is_recorded_with_the_state_it_left_and_latches_provisioned() {
    let mut o = applying(
        2,
        &[
            (names::APPLY_FAILURES, "1"),
            (names::STATE_LINEAGE, "lin-1"),
            (names::STATE_SERIAL, "3"),
        ],
    );
    o.jobs = vec![job(
        Kind::TerraformMachine,
        "apply",
        2,
        &[("Complete", "True", "", FAILED_AT)],
    )];
    let (decision, mut facts, _) = gather::decide(&o, &Settings::default());
    // The state not read: nothing recorded, the next pass reads it.
    let p = plan(&o, &Settings::default(), &facts, &decision);
    assert_eq!(edit(&p, names::APPLIED_ATTEMPT), None);
    assert!(!p.provisioned());
    facts.state = StateFacts::Readable {
        managed_instances: 2,
        lineage: "lin-1".into(),
        serial: 4,
        secret: "tfstate-default-prod.tfm".into(),
    };
    o.state = Some(crate::testing::state_with_outputs(
        "prod.tfm",
        serde_json::json!({"provider_id": "aws:///eu-west-1a/i-0abc", "failure_domain": "eu-west-1a"}),
    ));
    let p = plan(&o, &Settings::default(), &facts, &decision);
    assert_eq!(edit(&p, names::APPLIED_ATTEMPT), Some(&Some("2".into())));
    assert_eq!(edit(&p, names::OUTPUTS_INVALID), Some(&None));
    let fields = p.fields.as_ref().expect("the outputs' fields");
    assert_eq!(fields.spec["providerID"], "aws:///eu-west-1a/i-0abc");
    assert_eq!(fields.status["failureDomain"], "eu-west-1a");
    assert_eq!(edit(&p, names::STATE_LINEAGE), Some(&Some("lin-1".into())));
    assert_eq!(edit(&p, names::STATE_SERIAL), Some(&Some("4".into())));
    assert_eq!(edit(&p, names::APPLY_FAILURES), Some(&None));
    assert_eq!(edit(&p, names::APPLY_FAILED_AT), Some(&None));
    assert!(
        p.provisioned(),
        "provisioned is written before the annotations"
    );
    assert_eq!(p.notes.len(), 1);
    assert_eq!(p.notes[0].reason, events::APPLY_SUCCEEDED);

    // Recorded already: nothing again.
    let mut recorded = o.clone();
    recorded
        .meta
        .annotations
        .get_or_insert_default()
        .insert(names::APPLIED_ATTEMPT.into(), "2".into());
    let p = plan(&recorded, &Settings::default(), &facts, &decision);
    assert_eq!(edit(&p, names::APPLIED_ATTEMPT), None);
    assert!(!p.provisioned());
    assert!(p.notes.is_empty(), "{:?}", p.notes);
}

#[test]
fn an_apply_whose_outputs_break_the_contract_is_recorded_without_provisioning() {
    let mut o = applying(2, &[]);
    o.jobs = vec![job(
        Kind::TerraformMachine,
        "apply",
        2,
        &[("Complete", "True", "", FAILED_AT)],
    )];
    // A machine module without its required provider_id.
    o.state = Some(crate::testing::state_with_outputs(
        "prod.tfm",
        serde_json::json!({"addresses": [{"type": "Carrier", "address": "x"}]}),
    ));
    let (decision, mut facts, _) = gather::decide(&o, &Settings::default());
    facts.state = StateFacts::Readable {
        managed_instances: 2,
        lineage: "lin-1".into(),
        serial: 4,
        secret: "tfstate-default-prod.tfm".into(),
    };
    let p = plan(&o, &Settings::default(), &facts, &decision);
    assert!(!p.provisioned());
    assert_eq!(p.fields, None);
    assert_eq!(edit(&p, names::APPLIED_ATTEMPT), None);
    // The fingerprint is recorded all the same: the deletion relies on it.
    assert_eq!(edit(&p, names::STATE_LINEAGE), Some(&Some("lin-1".into())));
    let Some(Some(invalid)) = edit(&p, names::OUTPUTS_INVALID) else {
        panic!("{:?}", p.edits)
    };
    assert!(
        invalid.starts_with(
            "2: output provider_id is required of a machine module and is not declared"
        ) && invalid.contains("output addresses must be a list of"),
        "{invalid}"
    );
    assert!(p.notes.iter().any(|n| n.reason == events::OUTPUTS_INVALID));

    // Recorded: the success is not recorded again, and the table says how it stands.
    let mut recorded = o.clone();
    recorded
        .meta
        .annotations
        .get_or_insert_default()
        .insert(names::OUTPUTS_INVALID.into(), invalid.clone());
    assert_eq!(gather::apply::unrecorded_apply(&recorded), None);
    let p = plan(&recorded, &Settings::default(), &facts, &decision);
    assert_eq!(edit(&p, names::OUTPUTS_INVALID), None);
}

#[test]
fn a_machine_placed_in_another_failure_domain_is_recorded_as_outputs_invalid() {
    let mut o = applying(1, &[]);
    o.jobs = vec![job(
        Kind::TerraformMachine,
        "apply",
        1,
        &[("Complete", "True", "", FAILED_AT)],
    )];
    o.state = Some(crate::testing::state_with_outputs(
        "prod.tfm",
        serde_json::json!({"provider_id": "captf:///prod", "failure_domain": "az-2"}),
    ));
    // The apply was given the Machine's failure domain az-1.
    let ns = o.meta.namespace.clone().unwrap_or_default();
    let name = o.meta.name.clone().unwrap_or_default();
    let suffix = names::state_suffix(Kind::TerraformMachine, &name);
    let inputs = serde_json::json!({
        "version": 1,
        "runner": {"image": "hashicorp/terraform:1.11.4"},
        "module": {"files": {"main.tf": ""}},
        "backend": {"namespace": ns, "secretSuffix": suffix},
        "contractVariables": {"captf_failure_domain": "az-1"}
    });
    let inputs =
        crate::inputs::parse(&serde_json::to_vec(&inputs).unwrap(), &ns, &suffix).expect("inputs");
    let owner = crate::api::labels::Identity {
        kind: Kind::TerraformMachine,
        name: &name,
        uid: "uid-1",
        namespace: &ns,
    };
    // The attempt's own inputs, in its variables Secret.
    let _ = owner;
    o.attempt_secret = Some(
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": names::job_name(&suffix, names::OPERATION_APPLY, 1)},
            "data": {names::INPUTS_KEY: k8s_openapi::ByteString(inputs.to_json_bytes())}
        }))
        .unwrap(),
    );
    let (decision, facts, _) = gather::decide(&o, &Settings::default());
    let p = plan(&o, &Settings::default(), &facts, &decision);
    assert_eq!(p.fields, None, "no field is set from it");
    let Some(Some(invalid)) = edit(&p, names::OUTPUTS_INVALID) else {
        panic!("{:?}", p.edits)
    };
    assert_eq!(
        invalid,
        "1: output failure_domain is az-2, but the Machine asks for az-1 (captf_failure_domain): the module must place the machine there"
    );
}

#[test]
fn the_last_three_finished_apply_jobs_are_kept_with_their_variables() {
    let mut o = applying(7, &[(names::APPLIED_ATTEMPT, "6")]);
    o.jobs = (1..=6)
        .map(|n| {
            job(
                Kind::TerraformMachine,
                "apply",
                n,
                &[("Complete", "True", "", FAILED_AT)],
            )
        })
        .collect();
    // Attempt 7 runs: never pruned, nor counted among the three.
    o.jobs.push(job(Kind::TerraformMachine, "apply", 7, &[]));
    o.pods = vec![pod_of(&o.jobs[6], None)];
    let p = plan_of(&o);
    let name = |n| names::job_name("prod.tfm", "apply", n);
    assert_eq!(p.prune, vec![name(1), name(2), name(3), name(4)]);
}

#[test]
fn an_apply_job_gone_while_its_killed_pod_is_left_is_an_interrupted_attempt_recorded_now() {
    // Attempt 1's Job was deleted (a cleanup policy, a hand) before a pass saw it end; its
    // Pod, SIGKILLed (137), is still there: Terraform did not exit by itself.
    let mut o = applying(1, &[]);
    let gone = job(Kind::TerraformMachine, "apply", 1, &[]);
    let mut pod = pod_of(&gone, Some((137, "")));
    pod.status.get_or_insert_default().phase = Some("Failed".into());
    o.pods = vec![pod];
    let p = plan_of(&o);
    assert!(
        matches!(edit(&p, names::APPLY_INTERRUPTED), Some(Some(_))),
        "{:?}",
        p.edits
    );
    assert!(
        matches!(edit(&p, names::APPLY_FAILED_AT), Some(Some(_))),
        "{:?}",
        p.edits
    );
}

/// The inputs Secret of `o` as promoted for attempt `n` (its `inputs-of-attempt`).
fn promoted_for(o: &mut Observed, n: u32) {
    let suffix = names::state_suffix(o.kind, "prod");
    let inputs = serde_json::json!({
        "version": 2,
        "runner": {"image": "hashicorp/terraform:1.11.4"},
        "module": {"files": {"main.tf": ""}},
        "backend": {"namespace": "team-a", "secretSuffix": suffix},
    });
    let mut secret: k8s_openapi::api::core::v1::Secret =
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": names::inputs_secret_name(&suffix),
                "annotations": {names::INPUTS_OF_ATTEMPT: n.to_string()}},
            "data": {names::INPUTS_KEY: k8s_openapi::ByteString(inputs.to_string().into_bytes())}
        }))
        .unwrap();
    secret.metadata.namespace = Some("team-a".into());
    o.inputs_secret = Some(secret);
}

#[test]
fn an_applys_inputs_become_the_destroys_only_once_it_wrote_the_state() {
    // Attempt 2 failed; the state it leaves is the one recorded before it (lin-1, 4):
    // Terraform never touched it (init failed, a refused save, the Pod never ran). The
    // destroy keeps the inputs that made it.
    let failed_two = |recorded_serial: &str| {
        let mut o = applying(
            2,
            &[
                (names::STATE_LINEAGE, "lin-1"),
                (names::STATE_SERIAL, recorded_serial),
            ],
        );
        let j = failed(Kind::TerraformMachine, "apply", 2, "BackoffLimitExceeded");
        o.pods = vec![pod_of(&j, Some((1, "Error: Unsupported argument")))];
        o.jobs = vec![j];
        o.state = Some(crate::testing::state_with_outputs(
            "prod.tfm",
            serde_json::json!({}),
        ));
        o
    };
    let untouched = failed_two("4");
    let p = plan_of(&untouched);
    assert_eq!(p.promote, None, "{:?}", p.edits);
    assert_eq!(edit(&p, names::STATE_SERIAL), None);
    assert!(matches!(edit(&p, names::APPLY_FAILED_AT), Some(Some(_))));
    // It wrote the state before it failed (serial 3 recorded, 4 now): what the state holds
    // was made with its inputs, and its fingerprint moves on.
    let wrote = failed_two("3");
    let p = plan_of(&wrote);
    assert_eq!(
        p.promote,
        Some(Promote {
            attempt: 2,
            ran: None
        })
    );
    assert_eq!(edit(&p, names::STATE_SERIAL), Some(&Some("4".into())));
    // A success always wrote it, with what it ran; once promoted, not again.
    let mut succeeded = applying(
        3,
        &[(names::STATE_LINEAGE, "lin-1"), (names::STATE_SERIAL, "3")],
    );
    let j = job(
        Kind::TerraformMachine,
        "apply",
        3,
        &[("Complete", "True", "", FAILED_AT)],
    );
    succeeded.pods = vec![pod_of(&j, Some((0, "")))];
    succeeded.jobs = vec![j];
    succeeded.state = Some(crate::testing::state_with_outputs(
        "prod.tfm",
        serde_json::json!({"provider_id": "aws:///eu-west-1a/i-0abc"}),
    ));
    let p = plan_of(&succeeded);
    assert_eq!(p.promote.as_ref().map(|p| p.attempt), Some(3));
    assert!(
        p.promote.as_ref().and_then(|p| p.ran.as_ref()).is_some(),
        "what it ran, from its Pod"
    );
    promoted_for(&mut succeeded, 3);
    assert_eq!(plan_of(&succeeded).promote, None);
}
