//! One test per row of the apply table, and the rules that cut across them (the latch,
//! the order of the rows, the retry schedule).

use super::*;
use std::time::Duration;

fn now() -> Timestamp {
    "2026-12-05T10:00:00Z".parse().unwrap()
}

/// A machine whose gates all pass, never applied.
fn machine() -> ApplyFacts {
    ApplyFacts {
        kind: Kind::TerraformMachine,
        uid: "uid-1".into(),
        now: now(),
        backoff: Backoff::default(),
        externally_managed: false,
        paused: None,
        owner: Some("web-1".into()),
        prerequisite: None,
        unfinished_jobs: Vec::new(),
        foreign_state: None,
        inputs: Ok("sha-a".into()),
        applied_sha: None,
        attempt: 0,
        last: LastApply::None,
        outputs_invalid: None,
        change_refused: None,
        provisioned: false,
        unrecorded: None,
        state: StateFacts::NotRead,
        state_expected: false,
        errored: None,
        lock_held: None,
        approved_plan: None,
        refused: None,
    }
}

fn applied() -> ApplyFacts {
    ApplyFacts {
        applied_sha: Some("sha-a".into()),
        attempt: 1,
        last: LastApply::Succeeded,
        provisioned: true,
        ..machine()
    }
}

fn condition<'a>(d: &'a ApplyDecision, type_: &str) -> &'a Desired {
    d.conditions
        .iter()
        .find(|c| c.type_ == type_)
        .unwrap_or_else(|| panic!("no {type_} in {:?}", d.conditions))
}

fn failed(failures: u32, minutes_ago: i64) -> ApplyFacts {
    ApplyFacts {
        applied_sha: Some("sha-a".into()),
        attempt: failures,
        last: LastApply::Failed {
            failures,
            at: now() - jiff::SignedDuration::from_mins(minutes_ago),
            message: "Error: creating instance: quota exceeded".into(),
        },
        ..machine()
    }
}

#[test]
fn a1_an_externally_managed_cluster_gets_nothing() {
    let d = decide_apply(&ApplyFacts {
        kind: Kind::TerraformCluster,
        externally_managed: true,
        ..machine()
    });
    assert_eq!(d.row, ApplyRow::ExternallyManaged);
    assert_eq!(d.action, ApplyAction::Nothing);
    assert!(d.conditions.is_empty(), "nothing is written");
    // The annotation means nothing on a machine.
    let m = decide_apply(&ApplyFacts {
        externally_managed: true,
        ..machine()
    });
    assert_eq!(m.row, ApplyRow::Apply);
}

#[test]
fn a2_a_paused_object_starts_no_apply() {
    let d = decide_apply(&ApplyFacts {
        paused: Some(PauseCause::ClusterSpec("prod".into())),
        ..machine()
    });
    assert_eq!(d.row, ApplyRow::Paused);
    assert_eq!(d.action, ApplyAction::Wait);
    let p = condition(&d, PROVISIONED);
    assert_eq!((p.status, p.reason), (Status::Unknown, reason::PAUSED));
    assert!(
        p.message.contains("Cluster prod has spec.paused"),
        "{}",
        p.message
    );
}

#[test]
fn a3_no_owner_yet_waits_unknown() {
    let d = decide_apply(&ApplyFacts {
        owner: None,
        ..machine()
    });
    assert_eq!(d.row, ApplyRow::NoOwner);
    for c in &d.conditions {
        assert_eq!(
            (c.status, c.reason),
            (Status::Unknown, reason::WAITING_FOR_OWNER)
        );
    }
    let msg = &condition(&d, cond::READY).message;
    assert!(
        msg.contains("a Machine's spec.infrastructureRef")
            && msg.ends_with("; see runbooks/WaitingForOwner.md"),
        "{msg}"
    );
}

#[test]
fn a4_a_machine_waits_for_its_prerequisites_in_order_of_the_gates() {
    for (p, why) in [
        (
            Prerequisite::ClusterInfrastructure {
                cluster: "prod".into(),
            },
            reason::WAITING_FOR_CLUSTER_INFRASTRUCTURE,
        ),
        (
            Prerequisite::ControlPlaneInitialized {
                cluster: "prod".into(),
            },
            reason::WAITING_FOR_CONTROL_PLANE,
        ),
        (
            Prerequisite::BootstrapData {
                detail: "Machine web-1 names no spec.bootstrap.dataSecretName yet".into(),
            },
            reason::WAITING_FOR_BOOTSTRAP_DATA,
        ),
        (
            Prerequisite::ClusterOutputs {
                detail: "TerraformCluster prod has no readable state".into(),
            },
            reason::WAITING_FOR_CLUSTER_OUTPUTS,
        ),
    ] {
        let d = decide_apply(&ApplyFacts {
            prerequisite: Some(p),
            ..machine()
        });
        assert_eq!(d.row, ApplyRow::Prerequisite);
        assert_eq!(d.action, ApplyAction::Wait);
        let r = condition(&d, cond::READY);
        assert_eq!((r.status, r.reason), (Status::Unknown, why));
        let runbook = format!("see runbooks/{why}.md");
        assert!(r.message.ends_with(&runbook), "{}", r.message);
        assert!(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                .join(&runbook[4..])
                .is_file(),
            "{runbook} exists"
        );
    }
    // A gate before it wins: no owner yet says so, not the prerequisite.
    let d = decide_apply(&ApplyFacts {
        owner: None,
        prerequisite: Some(Prerequisite::ClusterInfrastructure {
            cluster: "prod".into(),
        }),
        ..machine()
    });
    assert_eq!(d.row, ApplyRow::NoOwner);
}

#[test]
fn a5_an_unfinished_job_is_waited_for_and_named() {
    let d = decide_apply(&ApplyFacts {
        unfinished_jobs: vec![UnfinishedJob {
            name: "captf-web-1-tfm-apply-1".into(),
            operation: "apply".into(),
            detail: Some("its Pod is waiting: ImagePullBackOff".into()),
        }],
        ..machine()
    });
    assert_eq!(d.row, ApplyRow::JobUnfinished);
    assert_eq!(d.action, ApplyAction::Wait);
    let p = condition(&d, PROVISIONED);
    assert_eq!((p.status, p.reason), (Status::False, reason::APPLYING));
    assert!(
        p.message
            .contains("apply Job captf-web-1-tfm-apply-1 (its Pod is waiting: ImagePullBackOff)"),
        "{}",
        p.message
    );
}

#[test]
fn a6_a_state_the_object_did_not_make_is_never_applied_to() {
    let d = decide_apply(&ApplyFacts {
        foreign_state: Some("state Secret tfstate-default-web-1.tfm exists and the object neither applied nor adopted it".into()),
        ..machine()
    });
    assert_eq!(d.row, ApplyRow::ForeignState);
    assert_eq!(d.action.start_attempt(), None);
    let p = condition(&d, PROVISIONED);
    assert_eq!(
        (p.status, p.reason),
        (Status::False, reason::APPLY_CANNOT_START)
    );
}

#[test]
fn a7_a_success_that_cannot_be_recorded_holds_and_is_not_ready() {
    let f = ApplyFacts {
        applied_sha: Some("sha-a".into()),
        attempt: 1,
        last: LastApply::Succeeded,
        unrecorded: Some("StateEncrypted: state tfstate-default-web-1.tfm is encrypted".into()),
        ..machine()
    };
    let d = decide_apply(&f);
    assert_eq!(d.row, ApplyRow::Unrecorded);
    assert_eq!(d.action, ApplyAction::Wait);
    for c in [PROVISIONED, INPUTS_APPLIED, cond::READY] {
        let c = condition(&d, c);
        assert_eq!(
            (c.status, c.reason),
            (Status::False, reason::APPLY_UNRECORDED),
            "{}",
            c.type_
        );
        assert!(
            c.message.contains("StateEncrypted")
                && c.message.contains("runbooks/ApplyUnrecorded.md"),
            "{}",
            c.message
        );
    }
    // Whatever the inputs are now: nothing is applied over a state CAPTF cannot read.
    let changed = decide_apply(&ApplyFacts {
        inputs: Ok("sha-b".into()),
        ..f.clone()
    });
    assert_eq!(changed.row, ApplyRow::Unrecorded);
    // A provisioned object (an earlier success recorded) stays provisioned and Ready.
    let latched = decide_apply(&ApplyFacts {
        provisioned: true,
        ..f
    });
    assert_eq!(condition(&latched, cond::READY).status, Status::True);
    assert_eq!(
        condition(&latched, INPUTS_APPLIED).reason,
        reason::APPLY_UNRECORDED
    );
}

#[test]
fn a11_an_apply_that_is_due_reads_its_state_first_and_starts_only_on_one_it_can_trust() {
    use crate::rules::Unreadable;
    let due = machine();
    // Not read yet: the table says the state is needed, and would start.
    assert!(apply_state_needed(&due));
    assert_eq!(decide_apply(&due).action.start_attempt(), Some(1));
    // Nothing due: the state is not needed.
    let up_to_date = ApplyFacts {
        applied_sha: Some("sha-a".into()),
        attempt: 1,
        last: LastApply::Succeeded,
        ..machine()
    };
    assert!(!apply_state_needed(&up_to_date));
    let readable = StateFacts::Readable {
        managed_instances: 2,
        lineage: "l-1".into(),
        serial: 3,
        secret: "tfstate-default-web-1.tfm".into(),
    };
    // Readable, or not there yet before any apply wrote one: it starts.
    for state in [readable.clone(), StateFacts::Missing] {
        let f = ApplyFacts { state, ..machine() };
        assert!(!apply_state_needed(&f));
        assert_eq!(decide_apply(&f).row, ApplyRow::Apply);
    }
    let held = |f: ApplyFacts, reason: &str, says: &str| {
        let d = decide_apply(&f);
        assert_eq!(d.row, ApplyRow::CannotStart, "{reason}");
        assert_eq!(d.action, ApplyAction::Wait, "{reason}");
        let c = condition(&d, INPUTS_APPLIED);
        assert_eq!((c.status, c.reason), (Status::False, reason));
        assert!(c.message.contains(says), "{}", c.message);
    };
    held(
        ApplyFacts {
            state: StateFacts::Missing,
            state_expected: true,
            ..machine()
        },
        "StateLost",
        "runbooks/StateLost.md",
    );
    held(
        ApplyFacts {
            state: StateFacts::Unreadable {
                why: Unreadable::Inconsistent,
                message: "the state has lineage l-2, but the object recorded lineage l-1".into(),
            },
            ..machine()
        },
        "StateInconsistent",
        "runbooks/StateInconsistent.md",
    );
    held(
        ApplyFacts {
            state: readable.clone(),
            errored: Some("the errored state X records 1 managed resource instance(s) that the state does not: vm[2]".into()),
            ..machine()
        },
        "ErroredState",
        "runbooks/ErroredState.md",
    );
    held(
        ApplyFacts {
            state: readable.clone(),
            lock_held: Some("someone@laptop (lock 1234)".into()),
            ..machine()
        },
        "ApplyCannotStart",
        "someone@laptop",
    );
    // The retry of a failed apply, once due, too.
    held(
        ApplyFacts {
            state: readable,
            errored: Some("the errored state X records vm[2]".into()),
            ..failed(1, 10)
        },
        "ErroredState",
        "merge the errored state",
    );
    // A retry not due yet does not read the state.
    assert!(!apply_state_needed(&failed(4, 0)));
}

#[test]
fn a8_inputs_that_do_not_resolve_say_which_and_start_nothing() {
    let d = decide_apply(&ApplyFacts {
        inputs: Err("variablesFrom: Secret prod-vars has no key vars.json".into()),
        ..machine()
    });
    assert_eq!(d.row, ApplyRow::InputsUnresolvable);
    assert_eq!(d.action, ApplyAction::Wait);
    let p = condition(&d, PROVISIONED);
    assert_eq!(
        (p.status, p.reason),
        (Status::False, reason::APPLY_CANNOT_START)
    );
    assert!(p.message.contains("Secret prod-vars has no key vars.json"));
    assert!(p.message.contains("runbooks/ApplyCannotStart.md"));
}

#[test]
fn a9_outputs_that_break_the_contract_hold_provisioning_and_say_how() {
    let f = ApplyFacts {
        outputs_invalid: Some(
            "output provider_id is required of a machine module and is null".into(),
        ),
        provisioned: false,
        ..applied()
    };
    let d = decide_apply(&f);
    assert_eq!(d.row, ApplyRow::OutputsInvalid);
    assert_eq!(d.action, ApplyAction::Wait);
    for t in [PROVISIONED, INPUTS_APPLIED, cond::READY] {
        let c = condition(&d, t);
        assert_eq!(
            (c.status, c.reason),
            (Status::False, reason::OUTPUTS_INVALID),
            "{t}"
        );
    }
    let msg = &condition(&d, PROVISIONED).message;
    assert!(
        msg.contains("apply attempt 1 succeeded, but its outputs break module contract v1: output provider_id is required")
            && msg.contains("runbooks/OutputsInvalid.md"),
        "{msg}"
    );
    // Once provisioned, a later apply's invalid outputs show on InputsApplied only.
    let d = decide_apply(&ApplyFacts {
        provisioned: true,
        ..f.clone()
    });
    assert_eq!(condition(&d, PROVISIONED).status, Status::True);
    assert_eq!(condition(&d, cond::READY).status, Status::True);
    assert_eq!(
        condition(&d, INPUTS_APPLIED).reason,
        reason::OUTPUTS_INVALID
    );
    // Changed inputs apply again at once.
    let d = decide_apply(&ApplyFacts {
        inputs: Ok("sha-b".into()),
        ..f
    });
    assert_eq!(d.action, ApplyAction::StartApply { attempt: 2 });
}

#[test]
fn a10_applied_inputs_are_left_alone() {
    let d = decide_apply(&applied());
    assert_eq!(d.row, ApplyRow::UpToDate);
    assert_eq!(d.action, ApplyAction::Wait);
    for c in &d.conditions {
        assert_eq!(c.status, Status::True, "{c:?}");
    }
}

#[test]
fn a10_a_refused_change_of_a_set_once_field_shows_on_inputs_applied() {
    let why = "the outputs give spec.controlPlaneEndpoint {\"host\":\"10.0.0.2\",\"port\":6443}, and it is {\"host\":\"10.0.0.1\",\"port\":6443}: it is set once and kept";
    let d = decide_apply(&ApplyFacts {
        change_refused: Some(why.into()),
        ..applied()
    });
    assert_eq!(d.row, ApplyRow::UpToDate);
    assert_eq!(
        d.action,
        ApplyAction::Wait,
        "nothing to retry: the same module gives the same value"
    );
    let c = condition(&d, INPUTS_APPLIED);
    assert_eq!(
        (c.status, c.reason),
        (Status::False, reason::CHANGE_REFUSED)
    );
    assert!(
        c.message.starts_with(
            "apply attempt 1 succeeded, but the outputs give spec.controlPlaneEndpoint"
        ) && c.message.contains("runbooks/ChangeRefused.md"),
        "{}",
        c.message
    );
    // The object stays provisioned and Ready: its infrastructure is there.
    assert_eq!(condition(&d, PROVISIONED).status, Status::True);
    assert_eq!(condition(&d, cond::READY).status, Status::True);
}

#[test]
fn a12_a_failed_apply_is_retried_on_the_schedule() {
    // Failed a minute ago: the first retry is due after 24 to 30 s.
    let d = decide_apply(&failed(1, 1));
    assert_eq!(d.row, ApplyRow::Failed);
    assert_eq!(d.action.start_attempt(), Some(2));
    let p = condition(&d, PROVISIONED);
    assert_eq!((p.status, p.reason), (Status::False, reason::APPLY_FAILED));
    assert!(p.message.contains("quota exceeded"), "{}", p.message);
    assert!(p.message.contains("attempt 2 is starting"), "{}", p.message);
    // Fourth failure just now: the next one waits 4 minutes at most.
    let d = decide_apply(&failed(4, 0));
    let ApplyAction::RetryLater { at, start: None } = d.action else {
        panic!("{:?}", d.action)
    };
    let wait = Duration::try_from(at.duration_since(now())).unwrap();
    assert!(
        wait <= Duration::from_secs(240) && wait >= Duration::from_secs(192),
        "{wait:?}"
    );
    assert!(condition(&d, PROVISIONED).message.contains(&at.to_string()));
}

#[test]
fn a13_a_first_apply_and_changed_inputs_start_an_attempt() {
    let d = decide_apply(&machine());
    assert_eq!(d.row, ApplyRow::Apply);
    assert_eq!(d.action, ApplyAction::StartApply { attempt: 1 });
    let r = condition(&d, cond::READY);
    assert_eq!((r.status, r.reason), (Status::False, reason::APPLYING));
    // Changed inputs start at once, even after failures: the user's fix is not held
    // back by the schedule of the inputs it replaced.
    let d = decide_apply(&ApplyFacts {
        inputs: Ok("sha-b".into()),
        ..failed(5, 0)
    });
    assert_eq!(d.row, ApplyRow::Apply);
    assert_eq!(d.action, ApplyAction::StartApply { attempt: 6 });
    assert!(
        condition(&d, PROVISIONED)
            .message
            .contains("the inputs changed")
    );
    // An attempt that ended without a recorded result is started again.
    let d = decide_apply(&ApplyFacts {
        applied_sha: Some("sha-a".into()),
        attempt: 1,
        ..machine()
    });
    assert_eq!(d.action, ApplyAction::StartApply { attempt: 2 });
}

/// Once provisioned, nothing but a deletion takes Provisioned or Ready away: a gate or a
/// failing re-apply shows on InputsApplied only.
#[test]
fn provisioned_latches_through_gates_and_failed_reapplies() {
    let cases = [
        ApplyFacts {
            paused: Some(PauseCause::ObjectAnnotation),
            ..applied()
        },
        ApplyFacts {
            inputs: Ok("sha-b".into()),
            ..applied()
        },
        ApplyFacts {
            provisioned: true,
            ..failed(2, 0)
        },
        ApplyFacts {
            inputs: Err("Secret creds is missing".into()),
            ..applied()
        },
    ];
    for f in cases {
        let d = decide_apply(&f);
        assert_eq!(
            condition(&d, PROVISIONED).status,
            Status::True,
            "{:?}",
            d.row
        );
        assert_eq!(
            condition(&d, cond::READY).status,
            Status::True,
            "{:?}",
            d.row
        );
        assert_ne!(
            condition(&d, INPUTS_APPLIED).status,
            Status::True,
            "{:?}",
            d.row
        );
    }
}

#[test]
fn the_rows_are_labelled_in_order() {
    let labels: Vec<String> = ApplyRow::ALL.iter().map(|r| r.label()).collect();
    assert_eq!(labels.first().map(String::as_str), Some("A1"));
    assert_eq!(labels.last().map(String::as_str), Some("A14"));
    let mut sorted = ApplyRow::ALL.to_vec();
    sorted.sort();
    assert_eq!(
        sorted,
        ApplyRow::ALL.to_vec(),
        "evaluation order is declaration order"
    );
}

/// The table of docs/provisioning/01-lifecycle.md, row by row: label and situation.
#[test]
fn the_docs_table_matches_the_apply_table() {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/docs/provisioning/01-lifecycle.md"
    );
    let text = std::fs::read_to_string(path).expect("the lifecycle page");
    let documented: Vec<(String, String)> = text
        .lines()
        .filter(|l| l.starts_with("| A"))
        .map(|l| {
            let cells: Vec<&str> = l.trim_matches('|').split('|').map(str::trim).collect();
            (cells[0].to_string(), cells[1].to_string())
        })
        .collect();
    let product: Vec<(String, String)> = ApplyRow::ALL
        .iter()
        .map(|r| (r.label(), r.situation().to_string()))
        .collect();
    assert_eq!(
        documented, product,
        "the docs' table and rules::apply differ"
    );
}

/// A provisioned object whose re-apply (attempt 2, the inputs changed) was stopped by the
/// plan guard: its plan replaces one resource and deletes another.
fn plan_blocked() -> ApplyFacts {
    ApplyFacts {
        applied_sha: Some("sha-a".into()),
        attempt: 2,
        last: LastApply::PlanBlocked(crate::job::DestructivePlan {
            hash: "1803ba87162c431f".into(),
            changes: vec![
                "delete terraform_data.gone[0]".into(),
                "replace terraform_data.disk".into(),
            ],
        }),
        provisioned: true,
        state: StateFacts::Readable {
            managed_instances: 3,
            lineage: "l-1".into(),
            serial: 4,
            secret: "tfstate-default-web-1.tfm".into(),
        },
        ..machine()
    }
}

#[test]
fn a14_a_destructive_plan_holds_until_its_hash_is_approved() {
    let d = decide_apply(&plan_blocked());
    assert_eq!(d.row, ApplyRow::PlanBlocked);
    assert_eq!(d.row.label(), "A14");
    assert_eq!(d.action, ApplyAction::Wait, "never retried by itself");
    let c = condition(&d, INPUTS_APPLIED);
    assert_eq!(
        (c.status, c.reason),
        (Status::False, "DestructivePlanBlocked")
    );
    for said in [
        "replace terraform_data.disk",
        "delete terraform_data.gone[0]",
        "terraform.infrastructure.cluster.x-k8s.io/approve-plan=1803ba87162c431f",
        "runbooks/DestructivePlanBlocked.md",
    ] {
        assert!(c.message.contains(said), "{said}: {}", c.message);
    }
    // Nothing was changed: the object stays provisioned and Ready.
    assert_eq!(condition(&d, cond::READY).status, Status::True);
    assert_eq!(condition(&d, PROVISIONED).status, Status::True);

    // Another hash approved (an earlier plan's): still held.
    let d = decide_apply(&ApplyFacts {
        approved_plan: Some("0000000000000000".into()),
        ..plan_blocked()
    });
    assert_eq!(d.action, ApplyAction::Wait);
}

#[test]
fn a14_an_approved_plan_starts_the_next_attempt_and_new_inputs_plan_again() {
    let d = decide_apply(&ApplyFacts {
        approved_plan: Some(" 1803ba87162c431f\n".into()),
        ..plan_blocked()
    });
    assert_eq!(d.row, ApplyRow::PlanBlocked);
    assert_eq!(d.action, ApplyAction::StartApply { attempt: 3 });
    assert!(
        condition(&d, INPUTS_APPLIED)
            .message
            .contains("is approved"),
        "{:?}",
        d.conditions
    );
    // Approved, but the state cannot be trusted now: A11 holds as for any start.
    let d = decide_apply(&ApplyFacts {
        approved_plan: Some("1803ba87162c431f".into()),
        state: StateFacts::Missing,
        state_expected: true,
        ..plan_blocked()
    });
    assert_eq!(d.row, ApplyRow::CannotStart);
    // The inputs changed again: a new attempt plans again (A13), approved or not.
    let d = decide_apply(&ApplyFacts {
        inputs: Ok("sha-b".into()),
        ..plan_blocked()
    });
    assert_eq!(d.row, ApplyRow::Apply);
    assert_eq!(d.action, ApplyAction::StartApply { attempt: 3 });
}

/// A refusal the API server gave the last try at an attempt is a fact of the table: the
/// attempt is started again (the pass tries it), and the conditions say why it has not
/// started rather than "starting"; a row that starts nothing ignores it, and a provisioned
/// object stays Ready.
#[test]
fn a_refused_attempt_is_tried_again_and_its_conditions_say_the_refusal() {
    let refused = Some("TerraformMachine ns/web-1: the API server refused what apply attempt 1 needs: quota; tried again every 10s".to_string());
    let d = decide_apply(&ApplyFacts {
        refused: refused.clone(),
        ..machine()
    });
    assert_eq!(d.action, ApplyAction::StartApply { attempt: 1 });
    assert_eq!(d.row, ApplyRow::Apply);
    for c in &d.conditions {
        assert_eq!(
            (c.status, c.reason),
            (Status::False, reason::APPLY_CANNOT_START)
        );
        assert!(
            c.message
                .contains("refused what apply attempt 1 needs: quota")
                && c.message.ends_with("see runbooks/ApplyCannotStart.md"),
            "{}",
            c.message
        );
    }
    let waiting = decide_apply(&ApplyFacts {
        refused: refused.clone(),
        ..applied()
    });
    assert_eq!(
        waiting,
        decide_apply(&applied()),
        "nothing to start: no refusal shown"
    );
    let changed = decide_apply(&ApplyFacts {
        inputs: Ok("sha-b".into()),
        refused,
        ..applied()
    });
    assert_eq!(changed.action, ApplyAction::StartApply { attempt: 2 });
    assert_eq!(condition(&changed, cond::READY).status, Status::True);
    assert_eq!(
        condition(&changed, INPUTS_APPLIED).reason,
        reason::APPLY_CANNOT_START
    );
}
