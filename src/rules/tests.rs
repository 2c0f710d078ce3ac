//! One named case per row, one per precedence between rows, and the shortcuts.

use super::*;

fn t(s: &str) -> Timestamp {
    s.parse().expect("timestamp")
}

/// A fixture builder: a deleting TerraformMachine with a readable state of 2 instances,
/// applied, untried, nothing blocking. Each test changes what it is about.
fn facts() -> Facts {
    Facts {
        kind: Kind::TerraformMachine,
        uid: "uid-1".into(),
        state_secret: "tfstate-default-web-1.tfm".into(),
        deleting: true,
        paused: None,
        unfinished_jobs: vec![],
        dependents: vec![],
        cleanup: None,
        applied: true,
        state: readable(2),
        abandon: AbandonMark::Absent,
        attempt: 0,
        last_attempt: LastAttempt::NoneFinished,
        attempt_unstarted: false,
        blocker: None,
        errored_uncovered: false,
        refused: None,
        now: t("2026-12-01T12:00:00Z"),
        backoff: Backoff::default(),
    }
}

fn readable(n: u64) -> StateFacts {
    StateFacts::Readable {
        managed_instances: n,
        lineage: "l-1".into(),
        serial: 5,
        secret: "tfstate-default-web-1.tfm".into(),
    }
}

fn unreadable(why: Unreadable) -> StateFacts {
    StateFacts::Unreadable {
        why,
        message: "the state says so".into(),
    }
}

fn running_job() -> UnfinishedJob {
    UnfinishedJob {
        name: "captf-web-1-tfm-apply-1".into(),
        operation: "apply".into(),
        detail: None,
    }
}

fn failed(at: &str) -> LastAttempt {
    LastAttempt::Failed {
        at: Some(t(at)),
        error: "Error: boom".into(),
    }
}

fn cond<'a>(d: &'a Decision, type_: &str) -> &'a Desired {
    d.conditions()
        .find(|c| c.type_ == type_)
        .unwrap_or_else(|| panic!("no {type_} condition in {d:?}"))
}

#[test]
fn not_deleting_sets_no_row() {
    let d = decide(&Facts {
        deleting: false,
        ..facts()
    });
    assert_eq!(d.row, None);
    assert_eq!(d.action, Action::NotDeleting);
    assert_eq!(d.deleting.status, Status::False);
    assert_eq!(d.deleting.reason, "NotDeleting");
    assert_eq!(cond(&d, "Paused").status, Status::False);
}

#[test]
fn row1_paused_only_bookkeeping() {
    let d = decide(&Facts {
        paused: Some(PauseCause::ClusterSpec("prod".into())),
        ..facts()
    });
    assert_eq!(d.row, Some(Row::Paused));
    assert_eq!(d.action, Action::BookkeepingOnly);
    assert_eq!(d.deleting.reason, "Paused");
    assert_eq!(cond(&d, "Paused").status, Status::True);
    assert!(cond(&d, "Paused").message.contains("prod"));
    assert_eq!(d.runbook, Some("runbooks/Paused.md"));
    assert_eq!(d.action.start_attempt(), None);
}

#[test]
fn row1_delete_for_move_and_crd_deletion_count_as_paused() {
    for cause in [
        PauseCause::DeleteForMove,
        PauseCause::CrdDeleting,
        PauseCause::ObjectAnnotation,
    ] {
        let d = decide(&Facts {
            paused: Some(cause),
            ..facts()
        });
        assert_eq!(d.row, Some(Row::Paused));
    }
}

#[test]
fn row2_waits_for_an_unfinished_job() {
    let mut job = running_job();
    job.detail = Some("its Pod is waiting: ImagePullBackOff".into());
    let d = decide(&Facts {
        unfinished_jobs: vec![job],
        ..facts()
    });
    assert_eq!(d.row, Some(Row::JobUnfinished));
    assert_eq!(d.action, Action::WaitForJob);
    assert_eq!(d.deleting.reason, "WaitingForJob");
    assert!(
        d.deleting
            .message
            .contains("apply Job captf-web-1-tfm-apply-1 (its Pod is waiting: ImagePullBackOff)"),
        "{}",
        d.deleting.message
    );
    assert!(d.deleting.message.contains("ImagePullBackOff"));
    assert!(d.deleting.message.contains("runbooks/WaitingForJob.md"));
}

#[test]
fn row3_cluster_waits_for_dependents_and_names_them() {
    let d = decide(&Facts {
        kind: Kind::TerraformCluster,
        dependents: vec![
            "TerraformMachine/web-1".into(),
            "TerraformMachinePool/pool".into(),
        ],
        ..facts()
    });
    assert_eq!(d.row, Some(Row::DependentsExist));
    assert_eq!(d.action, Action::WaitForDependents);
    let blocked = cond(&d, "DeletionBlocked");
    assert_eq!(
        (blocked.status, blocked.reason),
        (Status::True, "DependentsExist")
    );
    assert!(
        blocked.message.contains("TerraformMachine/web-1")
            && blocked.message.contains("TerraformMachinePool/pool")
    );
    assert_eq!(d.runbook, Some("runbooks/DependentsExist.md"));
}

#[test]
fn row3_applies_only_to_clusters() {
    let d = decide(&Facts {
        dependents: vec!["TerraformMachine/x".into()],
        ..facts()
    });
    assert_eq!(d.row, Some(Row::Destroy));
}

#[test]
fn row4_never_applied_and_no_state_releases_at_once() {
    let d = decide(&Facts {
        applied: false,
        state: StateFacts::Missing,
        ..facts()
    });
    assert_eq!(d.row, Some(Row::NeverApplied));
    assert_eq!(d.action, Action::RemoveFinalizer);
    assert_eq!(d.runbook, None);
    assert_eq!(d.action.start_attempt(), None);
}

#[test]
fn row5_applied_without_state_is_held_as_state_lost() {
    let d = decide(&Facts {
        state: StateFacts::Missing,
        ..facts()
    });
    assert_eq!(d.row, Some(Row::StateMissing));
    assert_eq!(d.action, Action::Hold);
    assert_eq!(d.deleting.reason, "Held");
    let s = cond(&d, "StateReadable");
    assert_eq!((s.status, s.reason), (Status::False, "StateLost"));
    assert_eq!(d.runbook, Some("runbooks/StateLost.md"));
}

#[test]
fn a_state_not_read_is_never_taken_for_a_release() {
    let d = decide(&Facts {
        applied: false,
        state: StateFacts::NotRead,
        ..facts()
    });
    assert_ne!(d.action, Action::RemoveFinalizer);
}

#[test]
fn row6_unreadable_states_are_held_with_their_reason() {
    for (why, reason, runbook) in [
        (
            Unreadable::Corrupt,
            "StateCorrupt",
            "runbooks/StateCorrupt.md",
        ),
        (
            Unreadable::Encrypted,
            "StateEncrypted",
            "runbooks/StateEncrypted.md",
        ),
        (
            Unreadable::Inconsistent,
            "StateInconsistent",
            "runbooks/StateInconsistent.md",
        ),
    ] {
        let d = decide(&Facts {
            state: unreadable(why),
            ..facts()
        });
        assert_eq!(d.row, Some(Row::StateUntrusted), "{reason}");
        assert_eq!(d.action, Action::Hold);
        let s = cond(&d, "StateReadable");
        assert_eq!((s.status, s.reason), (Status::False, reason));
        assert_eq!(d.runbook, Some(runbook));
        assert!(d.deleting.message.contains(runbook));
    }
}

#[test]
fn row7_readable_state_with_instances_starts_attempt_one() {
    let d = decide(&facts());
    assert_eq!(d.row, Some(Row::Destroy));
    assert_eq!(d.action.name(), "StartDestroy");
    assert_eq!(d.deleting.reason, "DestroyRunning");
    assert_eq!(d.action.start_attempt(), Some(1));
    assert_eq!(cond(&d, "StateReadable").status, Status::True);
}

#[test]
fn row7_numbers_the_attempt_after_the_recorded_one() {
    // An attempt recorded by an earlier deletion (a recreated object) that did not finish
    // in this deletion: the next number is used, never a repeat.
    let d = decide(&Facts {
        attempt: 3,
        ..facts()
    });
    assert_eq!(d.action.start_attempt(), Some(4));
}

#[test]
fn row7_restarts_an_attempt_recorded_but_never_started_under_the_same_number() {
    let d = decide(&Facts {
        attempt: 2,
        attempt_unstarted: true,
        ..facts()
    });
    assert_eq!(
        (d.row, d.action.start_attempt()),
        (Some(Row::Destroy), Some(2))
    );
}

#[test]
fn row8_empty_readable_state_cleans_up_without_a_destroy() {
    let d = decide(&Facts {
        state: readable(0),
        ..facts()
    });
    assert_eq!(d.row, Some(Row::CleanUp));
    assert_eq!(d.action, Action::CleanUp);
    assert_eq!(d.action.start_attempt(), None);
}

#[test]
fn row8_after_a_successful_destroy() {
    let d = decide(&Facts {
        state: readable(0),
        attempt: 1,
        last_attempt: LastAttempt::Succeeded { at: None },
        ..facts()
    });
    assert_eq!(d.row, Some(Row::CleanUp));
    assert_eq!(d.action, Action::CleanUp);
}

#[test]
fn row8_cleanup_marker_beats_a_missing_state() {
    // A crash after the state Secret was deleted but before the finalizer came off.
    let d = decide(&Facts {
        state: StateFacts::Missing,
        cleanup: Some(CleanupMarker::Destroyed),
        ..facts()
    });
    assert_eq!(d.row, Some(Row::CleanUp));
    assert_eq!(d.action, Action::CleanUp);
}

#[test]
fn row8_abandoned_marker_continues_the_abandon_release() {
    let d = decide(&Facts {
        state: StateFacts::Missing,
        cleanup: Some(CleanupMarker::Abandoned),
        ..facts()
    });
    assert_eq!(d.row, Some(Row::CleanUp));
    assert_eq!(d.action, Action::Abandon);
    assert_eq!(d.runbook, Some("runbooks/Abandon.md"));
}

#[test]
fn row9_failed_attempt_retries_after_the_backoff() {
    let f = Facts {
        attempt: 2,
        last_attempt: failed("2026-12-01T11:59:50Z"),
        ..facts()
    };
    let d = decide(&f);
    assert_eq!(d.row, Some(Row::FailedOrBlocked));
    assert_eq!(d.action.name(), "RetryLater");
    assert_eq!(d.deleting.reason, "DestroyFailed");
    assert_eq!(d.runbook, Some("runbooks/DestroyFailed.md"));
    assert_eq!(d.action.start_attempt(), None, "the delay has not passed");
    let at = d.action.next_retry_at().expect("a retry time");
    let delay = f.backoff.delay(2, "uid-1");
    assert_eq!(
        at.as_millisecond() - t("2026-12-01T11:59:50Z").as_millisecond(),
        delay.as_millis() as i64
    );
    let msg = &d.deleting.message;
    assert!(
        msg.contains("attempt 2 failed: Error: boom") && msg.contains("attempt 3 at"),
        "{msg}"
    );
}

#[test]
fn row9_starts_the_next_attempt_once_the_delay_has_passed() {
    let d = decide(&Facts {
        attempt: 2,
        last_attempt: failed("2026-12-01T10:00:00Z"),
        ..facts()
    });
    assert_eq!(d.row, Some(Row::FailedOrBlocked));
    assert_eq!(d.action.name(), "RetryLater");
    assert_eq!(d.action.start_attempt(), Some(3));
}

#[test]
fn row9_success_that_left_instances_counts_as_failed() {
    let d = decide(&Facts {
        attempt: 1,
        last_attempt: LastAttempt::Succeeded { at: None },
        ..facts()
    });
    assert_eq!(d.row, Some(Row::FailedOrBlocked));
    assert_eq!(d.deleting.reason, "DestroyFailed");
    assert!(
        d.deleting
            .message
            .contains("reported success but the state still describes 2")
    );
}

#[test]
fn row9_cannot_start_names_what_keeps_it() {
    for (blocker, needle) in [
        (
            Blocker::Credentials {
                secret: "aws-creds".into(),
                key: "id".into(),
            },
            "aws-creds",
        ),
        (
            Blocker::NamespaceTerminating("team-a".into()),
            "team-a is terminating",
        ),
        (
            Blocker::LockHeld {
                holder: "alice@laptop".into(),
                age: Some("2h".into()),
                why: "not stale".into(),
            },
            "alice@laptop",
        ),
        (
            Blocker::Inputs("the inputs Secret captf-inputs-web-1.tfm is missing".into()),
            "captf-inputs-web-1.tfm",
        ),
        (
            Blocker::JobDoesNotRender("the files are 300000 bytes, at most 262144".into()),
            "does not render (the files are 300000 bytes",
        ),
        (
            Blocker::Refused(
                "jobs.batch \"captf-web-1-tfm-destroy-1\" is forbidden: exceeded quota".into(),
            ),
            "the API server refused what the destroy needs: jobs.batch \"captf-web-1-tfm-destroy-1\" is forbidden: exceeded quota",
        ),
    ] {
        let d = decide(&Facts {
            blocker: Some(blocker),
            ..facts()
        });
        assert_eq!(d.row, Some(Row::FailedOrBlocked));
        assert_eq!(d.action.name(), "RetryLater");
        assert_eq!(d.deleting.reason, "DestroyCannotStart");
        assert!(
            d.deleting.message.contains(needle),
            "{}",
            d.deleting.message
        );
        assert_eq!(d.runbook, Some("runbooks/DestroyCannotStart.md"));
        assert_eq!(d.action.start_attempt(), None);
        assert!(d.action.next_retry_at().is_some());
    }
}

#[test]
fn paused_beats_a_running_job() {
    let d = decide(&Facts {
        paused: Some(PauseCause::ObjectAnnotation),
        unfinished_jobs: vec![running_job()],
        ..facts()
    });
    assert_eq!(d.row, Some(Row::Paused));
}

#[test]
fn a_running_job_beats_dependents() {
    let d = decide(&Facts {
        kind: Kind::TerraformCluster,
        unfinished_jobs: vec![running_job()],
        dependents: vec!["TerraformMachine/web-1".into()],
        ..facts()
    });
    assert_eq!(d.row, Some(Row::JobUnfinished));
}

#[test]
fn dependents_beat_state() {
    let d = decide(&Facts {
        kind: Kind::TerraformCluster,
        dependents: vec!["TerraformMachine/web-1".into()],
        state: unreadable(Unreadable::Corrupt),
        ..facts()
    });
    assert_eq!(d.row, Some(Row::DependentsExist));
}

#[test]
fn dependents_beat_the_cleanup_marker() {
    let d = decide(&Facts {
        kind: Kind::TerraformCluster,
        dependents: vec!["TerraformMachine/web-1".into()],
        cleanup: Some(CleanupMarker::Destroyed),
        ..facts()
    });
    assert_eq!(d.row, Some(Row::DependentsExist));
}

#[test]
fn abandon_releases_rows_5_6_and_9() {
    let cases = [
        Facts {
            state: StateFacts::Missing,
            abandon: AbandonMark::ThisObject,
            ..facts()
        },
        Facts {
            state: unreadable(Unreadable::Encrypted),
            abandon: AbandonMark::ThisObject,
            ..facts()
        },
        Facts {
            attempt: 1,
            last_attempt: failed("2026-12-01T11:59:59Z"),
            abandon: AbandonMark::ThisObject,
            ..facts()
        },
        Facts {
            blocker: Some(Blocker::NamespaceTerminating("team-a".into())),
            abandon: AbandonMark::ThisObject,
            ..facts()
        },
    ];
    for (f, row) in cases.iter().zip([
        Row::StateMissing,
        Row::StateUntrusted,
        Row::FailedOrBlocked,
        Row::FailedOrBlocked,
    ]) {
        let d = decide(f);
        assert_eq!(d.row, Some(row));
        assert_eq!(d.action, Action::Abandon);
        assert_eq!(d.runbook, Some("runbooks/Abandon.md"));
        assert_eq!(d.deleting.reason, "Abandoning");
        assert_eq!(d.action.start_attempt(), None);
    }
}

#[test]
fn abandon_never_overrides_rows_1_to_3() {
    let paused = decide(&Facts {
        paused: Some(PauseCause::ObjectAnnotation),
        abandon: AbandonMark::ThisObject,
        ..facts()
    });
    assert_eq!(
        (paused.row, paused.action),
        (Some(Row::Paused), Action::BookkeepingOnly)
    );
    let job = decide(&Facts {
        unfinished_jobs: vec![running_job()],
        abandon: AbandonMark::ThisObject,
        ..facts()
    });
    assert_eq!(
        (job.row, job.action),
        (Some(Row::JobUnfinished), Action::WaitForJob)
    );
    let deps = decide(&Facts {
        kind: Kind::TerraformCluster,
        dependents: vec!["TerraformMachine/a".into()],
        abandon: AbandonMark::ThisObject,
        ..facts()
    });
    assert_eq!(
        (deps.row, deps.action),
        (Some(Row::DependentsExist), Action::WaitForDependents)
    );
}

#[test]
fn abandon_never_skips_an_untried_readable_destroy() {
    let d = decide(&Facts {
        abandon: AbandonMark::ThisObject,
        ..facts()
    });
    assert_eq!(d.row, Some(Row::Destroy));
    assert_eq!(d.action.name(), "StartDestroy");
}

#[test]
fn abandon_on_a_never_applied_object_is_a_plain_release() {
    let d = decide(&Facts {
        applied: false,
        state: StateFacts::Missing,
        abandon: AbandonMark::ThisObject,
        ..facts()
    });
    assert_eq!(
        (d.row, d.action),
        (Some(Row::NeverApplied), Action::RemoveFinalizer)
    );
}

#[test]
fn backoff_grows_is_capped_and_is_deterministic() {
    let b = Backoff {
        base: Duration::from_secs(30),
        max: Duration::from_secs(1800),
    };
    let d1 = b.delay(1, "u");
    let d2 = b.delay(2, "u");
    let d3 = b.delay(3, "u");
    assert!(
        d1 <= Duration::from_secs(30) && d1 >= Duration::from_secs(24),
        "{d1:?}"
    );
    assert!(
        d2 <= Duration::from_secs(60) && d2 >= Duration::from_secs(48),
        "{d2:?}"
    );
    assert!(
        d3 <= Duration::from_secs(120) && d3 >= Duration::from_secs(96),
        "{d3:?}"
    );
    assert!(b.delay(40, "u") <= Duration::from_secs(1800));
    assert!(b.delay(40, "u") >= Duration::from_secs(1440));
    assert_eq!(b.delay(5, "u"), b.delay(5, "u"));
    // Jitter spreads objects that fail together.
    let spread: std::collections::BTreeSet<_> =
        (0..20).map(|i| b.delay(3, &format!("uid-{i}"))).collect();
    assert!(spread.len() > 10);
}

#[test]
fn rows_are_listed_in_order() {
    for (i, row) in Row::ALL.iter().enumerate() {
        assert_eq!(usize::from(row.number()), i + 1);
        assert_eq!(row.to_string(), (i + 1).to_string());
        assert_eq!(serde_json::to_string(row).unwrap(), (i + 1).to_string());
    }
}

#[test]
fn row9_a_success_that_left_instances_is_retried_when_its_delay_has_passed() {
    // The Job completed at 10:00; the state still lists instances. The retry falls due
    // one backoff delay after the Job's end, whenever the pass runs.
    let ended = t("2026-12-01T10:00:00Z");
    let delay = facts().backoff.delay(1, &facts().uid);
    let later = Timestamp::from_second(ended.as_second() + delay.as_secs() as i64 + 1).unwrap();
    let d = decide(&Facts {
        attempt: 1,
        last_attempt: LastAttempt::Succeeded { at: Some(ended) },
        now: later,
        ..facts()
    });
    assert_eq!(d.row, Some(Row::FailedOrBlocked));
    assert_eq!(d.action.start_attempt(), Some(2), "{:?}", d.deleting);
    assert!(d.deleting.message.contains("starting attempt 2 now"));
}

#[test]
fn ready_during_a_deletion_carries_the_deleting_reason_and_message() {
    // clusterctl describe shows only Ready (and Machine InfrastructureReady copies it).
    let d = decide(&Facts {
        attempt: 1,
        last_attempt: failed("2026-12-01T10:00:00Z"),
        ..facts()
    });
    let ready = d.conditions().find(|c| c.type_ == "Ready").expect("Ready");
    assert_eq!(ready.reason, "Deleting");
    assert_eq!(
        ready.message,
        format!(
            "the object is being deleted: DestroyFailed: {}",
            d.deleting.message
        )
    );
    assert!(ready.message.contains("see runbooks/DestroyFailed.md"));
}

#[test]
fn an_owner_gone_holds_the_destroy_and_abandon_releases() {
    let gone = Blocker::OwnerGone("Cluster prod (uid c-1) no longer exists".into());
    let d = decide(&Facts {
        blocker: Some(gone.clone()),
        ..facts()
    });
    assert_eq!(
        (d.row, d.action.name()),
        (Some(Row::FailedOrBlocked), "RetryLater")
    );
    assert_eq!(d.action.start_attempt(), None, "nothing is destroyed");
    assert_eq!(d.deleting.reason, "DestroyCannotStart");
    assert_eq!(d.runbook, Some(RUNBOOK_OWNER_GONE));
    assert!(
        d.deleting
            .message
            .contains("Cluster prod (uid c-1) no longer exists")
    );
    let blocked = d
        .conditions()
        .find(|c| c.type_ == cond::DELETION_BLOCKED)
        .expect("DeletionBlocked");
    assert_eq!(
        (blocked.status, blocked.reason),
        (Status::True, "OwnerGone")
    );
    assert!(
        blocked.message.contains(RUNBOOK_OWNER_GONE),
        "{}",
        blocked.message
    );
    // After a failed attempt, the same: no retry starts.
    let d = decide(&Facts {
        attempt: 1,
        last_attempt: failed("2026-12-01T10:00:00Z"),
        blocker: Some(gone.clone()),
        ..facts()
    });
    assert_eq!(
        (d.row, d.action.start_attempt()),
        (Some(Row::FailedOrBlocked), None)
    );
    let d = decide(&Facts {
        blocker: Some(gone),
        abandon: AbandonMark::ThisObject,
        ..facts()
    });
    assert_eq!(d.action, Action::Abandon);
}

#[test]
fn an_errored_state_holds_an_empty_state_unless_a_destroy_succeeded() {
    let what = "the errored state tfstate-default-errored-1-ab1cd.web-1.tfm (what Terraform could not save) records 1 managed resource instance(s) that the state does not: aws_instance.vm (id i-1)";
    let mut f = Facts {
        state: readable(0),
        blocker: Some(Blocker::ErroredState(what.into())),
        errored_uncovered: true,
        ..facts()
    };
    // The state is empty, the errored state is not: no cleanup, no release.
    let d = decide(&f);
    assert_eq!(d.row, Some(Row::FailedOrBlocked));
    assert_eq!(d.runbook, Some(RUNBOOK_ERRORED_STATE));
    assert!(d.deleting.message.contains(what), "{}", d.deleting.message);
    // After a destroy of this deletion succeeded (it started only with the errored states
    // covered): row 8, cleanup.
    f.attempt = 1;
    f.last_attempt = LastAttempt::Succeeded { at: Some(f.now) };
    let d = decide(&f);
    assert_eq!((d.row, d.action), (Some(Row::CleanUp), Action::CleanUp));
}

#[test]
fn the_state_is_needed_exactly_when_no_row_before_it_or_the_cleanup_marker_decides() {
    // The rule the controller restated by hand before the table answered it: deleting,
    // not paused, no unfinished Job, no dependents of a cluster, no abandon under way (a
    // destroy's cleanup under way reads the state once more: the marker never sends a
    // state that lists instances to cleanup).
    let by_hand = |f: &Facts| {
        f.deleting
            && f.paused.is_none()
            && f.unfinished_jobs.is_empty()
            && (f.kind != Kind::TerraformCluster || f.dependents.is_empty())
            && f.cleanup != Some(CleanupMarker::Abandoned)
    };
    let mut seen = 0;
    for bits in 0u32..(1 << 8) {
        let on = |i: u32| bits & (1 << i) != 0;
        let f = Facts {
            kind: if on(0) {
                Kind::TerraformCluster
            } else {
                Kind::TerraformMachine
            },
            deleting: on(1),
            paused: on(2).then_some(PauseCause::ObjectAnnotation),
            unfinished_jobs: if on(3) { vec![running_job()] } else { vec![] },
            dependents: if on(4) {
                vec!["TerraformMachine/web-1".into()]
            } else {
                vec![]
            },
            cleanup: on(5).then_some(CleanupMarker::Destroyed),
            abandon: if on(6) {
                AbandonMark::ThisObject
            } else {
                AbandonMark::Absent
            },
            applied: on(7),
            ..facts()
        };
        assert_eq!(state_needed(&f), by_hand(&f), "{f:#?}");
        seen += usize::from(state_needed(&f));
    }
    assert!(seen > 0);
}

/// A refused start is row 9, and row 9 with the abandon annotation releases: the action
/// is the abandon its conditions say, not the start the refusal stopped.
#[test]
fn a_refused_start_with_the_abandon_annotation_is_abandoned() {
    let why = "jobs.batch \"captf-web-1-tfm-destroy-1\" is forbidden: exceeded quota";
    let d = decide(&Facts {
        refused: Some(why.into()),
        abandon: AbandonMark::ThisObject,
        ..facts()
    });
    assert_eq!(d.row, Some(Row::FailedOrBlocked));
    assert_eq!(d.action, Action::Abandon, "{}", d.deleting.message);
    assert!(
        d.deleting.message.starts_with("abandoned by the operator")
            && d.deleting.message.contains(why),
        "{}",
        d.deleting.message
    );
    // An abandon that cannot finish holds, and starts nothing either.
    let d = decide(&Facts {
        refused: Some(why.into()),
        abandon: AbandonMark::CannotFinish("the namespace is terminating".into()),
        ..facts()
    });
    assert_eq!(d.action.start_attempt(), None, "{:?}", d.action);
}

#[test]
fn a_refused_start_is_tried_again_and_shown_as_a_destroy_that_cannot_start() {
    let why = "jobs.batch \"captf-web-1-tfm-destroy-1\" is forbidden: exceeded quota";
    // Row 7 and a due retry of row 9 start an attempt: each still does, and says why
    // it has not started.
    for (f, attempt) in [
        (facts(), 1),
        (
            Facts {
                attempt: 1,
                last_attempt: LastAttempt::Failed {
                    at: Some(t("2026-12-01T11:00:00Z")),
                    error: "timeout".into(),
                },
                ..facts()
            },
            2,
        ),
    ] {
        let d = decide(&Facts {
            refused: Some(why.into()),
            ..f.clone()
        });
        assert_eq!(d.action.start_attempt(), Some(attempt), "{:?}", d.action);
        assert_eq!(d.row, Some(Row::FailedOrBlocked));
        assert_eq!(d.deleting.reason, "DestroyCannotStart");
        assert!(
            d.deleting.message.contains(&format!(
                "destroy attempt {attempt} cannot start: the API server refused what the destroy needs: {why}"
            )) && d.deleting.message.contains("runbooks/DestroyCannotStart.md"),
            "{}",
            d.deleting.message
        );
        let c = deletion_ready(&d);
        assert_eq!(
            (c.status, c.reason),
            (Status::False, "DestroyCannotStart"),
            "{}",
            c.message
        );
        assert!(
            c.message.starts_with("being deleted (row 9)"),
            "{}",
            c.message
        );
    }
    // A decision that starts nothing is the row's own.
    let f = Facts {
        state: readable(0),
        refused: Some(why.into()),
        ..facts()
    };
    assert_eq!(decide(&f).row, Some(Row::CleanUp));
    assert_eq!(decide(&f).deleting.reason, "CleaningUp");
    assert_eq!(
        refused_message(1, why),
        format!(
            "destroy attempt 1 cannot start: the API server refused what the destroy needs: {why}; see runbooks/DestroyCannotStart.md"
        )
    );
    // The identity it runs with, refused by the manager, is told as such.
    let identity = crate::api::identity::refusal("TerraformClusterIdentity team-a does not exist");
    assert_eq!(
        refused_message(2, &identity),
        "destroy attempt 2 cannot start: the identity the destroy runs with cannot be used: TerraformClusterIdentity team-a does not exist; see runbooks/DestroyCannotStart.md"
    );
    let f = Facts {
        refused: Some(identity),
        ..facts()
    };
    let d = decide(&f);
    assert!(
        d.deleting
            .message
            .contains("the identity the destroy runs with cannot be used: TerraformClusterIdentity team-a does not exist"),
        "{}",
        d.deleting.message
    );
}

/// The preview of a live object (`DeletionReady`): the deletion table with the deletion
/// assumed, the waits set aside and named.
mod preview_of_a_live_object {
    use super::*;

    fn live() -> Facts {
        Facts {
            deleting: false,
            ..facts()
        }
    }

    #[test]
    fn a_readable_state_with_instances_is_ready_and_says_what_the_destroy_would_do() {
        let p = preview(&live());
        assert_eq!(p.row(), Some(Row::Destroy));
        assert_eq!(p.ready.type_, cond::DELETION_READY);
        assert_eq!(p.ready.status, Status::True);
        assert_eq!(p.ready.reason, "DestroyWouldRun");
        assert!(
            p.ready.message.contains("destroy attempt 1"),
            "{}",
            p.ready.message
        );
        assert!(
            p.ready.message.contains("2 managed resource instance(s)"),
            "{}",
            p.ready.message
        );
    }

    #[test]
    fn an_empty_state_and_no_state_never_applied_are_ready_with_nothing_to_destroy() {
        for f in [
            Facts {
                state: readable(0),
                ..live()
            },
            Facts {
                state: StateFacts::Missing,
                applied: false,
                ..live()
            },
        ] {
            let p = preview(&f);
            assert_eq!(p.ready.status, Status::True, "{p:?}");
            assert_eq!(p.ready.reason, "NothingToDestroy", "{p:?}");
        }
    }

    #[test]
    fn a_state_that_would_hold_the_deletion_is_not_ready_with_its_reason_and_runbook() {
        let cases = [
            (StateFacts::Missing, "StateLost", RUNBOOK_STATE_LOST),
            (
                unreadable(Unreadable::Corrupt),
                "StateCorrupt",
                RUNBOOK_STATE_CORRUPT,
            ),
            (
                unreadable(Unreadable::Encrypted),
                "StateEncrypted",
                RUNBOOK_STATE_ENCRYPTED,
            ),
            (
                unreadable(Unreadable::Inconsistent),
                "StateInconsistent",
                RUNBOOK_STATE_INCONSISTENT,
            ),
        ];
        for (state, reason, runbook) in cases {
            let p = preview(&Facts { state, ..live() });
            assert_eq!(p.ready.status, Status::False, "{reason}");
            assert_eq!(p.ready.reason, reason);
            assert_eq!(p.runbook(), Some(runbook));
            assert!(p.ready.message.contains(runbook), "{}", p.ready.message);
            assert!(
                p.ready.message.contains("would be held"),
                "{}",
                p.ready.message
            );
        }
    }

    #[test]
    fn what_would_keep_the_destroy_from_starting_is_not_ready_with_its_own_reason() {
        let cases = [
            (
                Blocker::ErroredState("an errored state lists 1 instance".into()),
                "ErroredState",
                RUNBOOK_ERRORED_STATE,
            ),
            (
                Blocker::OwnerGone("Machine web-1 is gone".into()),
                "OwnerGone",
                RUNBOOK_OWNER_GONE,
            ),
            (
                Blocker::Inputs("the inputs Secret is missing".into()),
                "DestroyCannotStart",
                RUNBOOK_DESTROY_CANNOT_START,
            ),
            (
                Blocker::LockHeld {
                    holder: "someone".into(),
                    age: None,
                    why: "not stale".into(),
                },
                "DestroyCannotStart",
                RUNBOOK_DESTROY_CANNOT_START,
            ),
        ];
        for (blocker, reason, runbook) in cases {
            let errored_uncovered = matches!(blocker, Blocker::ErroredState(_));
            let p = preview(&Facts {
                blocker: Some(blocker),
                errored_uncovered,
                ..live()
            });
            assert_eq!(p.row(), Some(Row::FailedOrBlocked));
            assert_eq!(p.ready.status, Status::False, "{reason}");
            assert_eq!(p.ready.reason, reason);
            assert_eq!(p.runbook(), Some(runbook));
        }
    }

    #[test]
    fn an_abandon_mark_for_this_object_is_named_as_leaving_the_infrastructure() {
        let p = preview(&Facts {
            state: StateFacts::Missing,
            abandon: AbandonMark::ThisObject,
            ..live()
        });
        assert_eq!(p.ready.status, Status::False);
        assert_eq!(p.ready.reason, "WouldAbandon");
        assert!(
            p.ready.message.contains("left running"),
            "{}",
            p.ready.message
        );
        // A readable state is destroyed whatever the annotation says.
        let p = preview(&Facts {
            abandon: AbandonMark::ThisObject,
            ..live()
        });
        assert_eq!(p.ready.reason, "DestroyWouldRun");
    }

    #[test]
    fn a_pause_a_running_job_and_dependents_are_waits_named_not_the_answer() {
        let p = preview(&Facts {
            kind: Kind::TerraformCluster,
            paused: Some(PauseCause::ObjectAnnotation),
            unfinished_jobs: vec![running_job()],
            dependents: vec!["TerraformMachine/web-1".into()],
            ..live()
        });
        assert_eq!(p.row(), Some(Row::Destroy));
        assert_eq!(p.ready.status, Status::True);
        for said in [
            "paused now",
            "captf-web-1-tfm-apply-1",
            "TerraformMachine/web-1",
        ] {
            assert!(
                p.ready.message.contains(said),
                "{said}: {}",
                p.ready.message
            );
        }
    }

    #[test]
    fn no_state_yet_while_a_job_runs_is_unknown_never_a_lost_state() {
        // A first apply: `applied-at` is written before its Job starts, and Terraform
        // writes the state as it goes. Until it has, a deletion would wait for the Job and
        // decide on the state it leaves: nothing can be said of that yet.
        let p = preview(&Facts {
            state: StateFacts::Missing,
            unfinished_jobs: vec![running_job()],
            ..live()
        });
        assert_eq!(p.decision, None);
        assert_eq!(p.ready.status, Status::Unknown);
        assert_eq!(p.ready.reason, "WaitingForJob");
        for said in ["captf-web-1-tfm-apply-1", "decides on the state it leaves"] {
            assert!(
                p.ready.message.contains(said),
                "{said}: {}",
                p.ready.message
            );
        }
        // Once no Job runs, a missing state of an object that applied is a lost state.
        let p = preview(&Facts {
            state: StateFacts::Missing,
            ..live()
        });
        assert_eq!(p.ready.reason, "StateLost");
    }

    #[test]
    fn a_state_not_read_is_unknown_never_a_lost_state() {
        let p = preview(&Facts {
            state: StateFacts::NotRead,
            ..live()
        });
        assert_eq!(p.decision, None);
        assert_eq!(p.ready.status, Status::Unknown);
        assert_eq!(p.ready.reason, "StateNotRead");
    }

    #[test]
    fn an_object_being_deleted_says_whether_its_deletion_finishes_by_itself() {
        let d = decide(&Facts {
            state: unreadable(Unreadable::Corrupt),
            ..facts()
        });
        let c = deletion_ready(&d);
        assert_eq!((c.status, c.reason), (Status::False, "StateCorrupt"));
        assert!(
            c.message.starts_with("being deleted (row 6)"),
            "{}",
            c.message
        );
        let c = deletion_ready(&decide(&facts()));
        assert_eq!((c.status, c.reason), (Status::True, "DestroyWouldRun"));
    }
}
