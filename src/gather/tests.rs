//! The facts a pass gathers: the "current inputs when they build" rule, adoption, the
//! lock, and what counts as paused.

use std::collections::BTreeMap;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use super::*;
use crate::api::VariablesSourceKind;
use crate::inputs;
use crate::rules::{Action, Blocker, LastAttempt, PauseCause, Row, StateFacts, Unreadable};
use crate::testing::{meta, observed, spec};

fn rebuilt_sha(kind: Kind) -> String {
    let suffix = names::state_suffix(kind, "prod");
    let none = |_: VariablesSourceKind, _: &str, _: &str| None;
    let inputs = inputs::build_from_spec(&spec(), "team-a", &suffix, &none).expect("builds");
    inputs.sha256()
}

fn blocker(o: &Observed) -> Option<Blocker> {
    gather(o, &Settings::default()).0.blocker
}

#[test]
fn a_cluster_without_inputs_secret_destroys_from_current_inputs_when_they_build_and_match() {
    let sha = rebuilt_sha(Kind::TerraformCluster);
    let o = observed(Kind::TerraformCluster, &[(names::INPUTS_SHA256, &sha)]);
    assert_eq!(blocker(&o), None);
    let (_, findings) = gather(&o, &Settings::default());
    assert!(
        findings.inputs.is_some(),
        "the rebuilt inputs render the destroy"
    );
}

#[test]
fn a_changed_spec_that_no_longer_hashes_to_the_recorded_inputs_cannot_start() {
    let o = observed(
        Kind::TerraformMachinePool,
        &[(names::INPUTS_SHA256, "0000")],
    );
    match blocker(&o) {
        Some(Blocker::Inputs(m)) => assert!(m.contains("do not hash"), "{m}"),
        other => panic!("expected an inputs blocker, got {other:?}"),
    }
}

#[test]
fn a_reference_that_does_not_resolve_cannot_start() {
    let mut o = observed(Kind::TerraformCluster, &[]);
    o.spec.variables_from = vec![crate::api::VariablesFrom {
        kind: VariablesSourceKind::ConfigMap,
        name: "gone".into(),
        key: "vars.json".into(),
    }];
    assert!(matches!(blocker(&o), Some(Blocker::Inputs(m)) if m.contains("cannot be rebuilt")));
}

#[test]
fn a_machine_never_rebuilds_its_inputs() {
    let sha = rebuilt_sha(Kind::TerraformMachine);
    let o = observed(Kind::TerraformMachine, &[(names::INPUTS_SHA256, &sha)]);
    assert!(matches!(blocker(&o), Some(Blocker::Inputs(m)) if m.contains("never rebuilds")));
}

#[test]
fn a_missing_credentials_secret_names_secret_and_key() {
    let mut o = observed(Kind::TerraformCluster, &[]);
    o.spec.env = vec![crate::api::EnvFromSecret {
        name: "TOKEN".into(),
        secret_key_ref: crate::api::SecretKeyRef {
            name: "creds".into(),
            key: "token".into(),
        },
    }];
    assert_eq!(
        blocker(&o),
        Some(Blocker::Credentials {
            secret: "creds".into(),
            key: "token".into()
        })
    );
    let secret = Secret {
        data: Some([("token".to_string(), ByteString(b"x".to_vec()))].into()),
        ..Default::default()
    };
    o.referenced_secrets.insert("creds".into(), secret);
    assert_eq!(blocker(&o), None);
}

#[test]
fn a_crd_being_deleted_and_delete_for_move_count_as_paused() {
    let mut o = observed(Kind::TerraformMachine, &[]);
    o.crd_deleting = true;
    assert_eq!(
        gather(&o, &Settings::default()).0.paused,
        Some(PauseCause::CrdDeleting)
    );
    let o = observed(
        Kind::TerraformMachine,
        &[(names::CLUSTERCTL_DELETE_FOR_MOVE, "")],
    );
    assert_eq!(
        gather(&o, &Settings::default()).0.paused,
        Some(PauseCause::DeleteForMove)
    );
    let mut o = observed(Kind::TerraformMachine, &[]);
    o.cluster = Some(ClusterView {
        name: "prod".into(),
        uid: "c-1".into(),
        spec_paused: true,
        annotation_paused: false,
        infrastructure_provisioned: true,
        control_plane_initialized: true,
        ..Default::default()
    });
    assert_eq!(
        gather(&o, &Settings::default()).0.paused,
        Some(PauseCause::ClusterSpec("prod".into()))
    );
}

#[test]
fn a_namesake_that_neither_applied_nor_adopted_leaves_the_orphaned_state_alone() {
    let mut o = observed(Kind::TerraformMachine, &[]);
    let gz = {
        use std::io::Write;
        let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        let _ = e.write_all(br#"{"version":4,"serial":3,"lineage":"l-1","resources":[{"mode":"managed","type":"terraform_data","name":"a","instances":[{}]}]}"#);
        e.finish().expect("gzip")
    };
    let base = names::state_secret_name("prod.tfm");
    let secret = Secret {
        metadata: ObjectMeta {
            name: Some(base.clone()),
            ..Default::default()
        },
        data: Some([("tfstate".to_string(), ByteString(gz))].into()),
        ..Default::default()
    };
    o.state = Some(StateSecrets::from_secrets(&base, &[secret]));
    let (d, _, findings) = decide(&o, &Settings::default());
    assert!(findings.foreign_state);
    assert_eq!(
        (d.row, d.action),
        (Some(Row::NeverApplied), Action::RemoveFinalizer)
    );
    // With the adopt annotation, it is this object's state: a destroy starts.
    o.meta = meta(&[(names::ADOPT, "true")]);
    let (d, _, _) = decide(&o, &Settings::default());
    assert_eq!(
        d.row,
        Some(Row::FailedOrBlocked),
        "adopted: its inputs are missing, so the destroy cannot start yet"
    );
}

#[test]
fn a_lock_of_a_gone_pod_of_this_object_is_stale_and_any_other_lock_holds() {
    let sha = rebuilt_sha(Kind::TerraformCluster);
    let lease = |who: &str| -> Lease {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "lock-tfstate-default-prod.tfc", "annotations": {
                names::TF_LOCK_INFO: format!("{{\"ID\":\"abc\",\"Who\":\"{who}\",\"Created\":\"2026-12-01T09:00:00Z\"}}")
            }},
            "spec": {"holderIdentity": "abc"}
        }))
        .expect("lease")
    };
    let mut o = observed(Kind::TerraformCluster, &[(names::INPUTS_SHA256, &sha)]);
    o.lock = Some(lease("root@captf-prod-tfc-destroy-1-x7k2p"));
    let (f, findings) = gather(&o, &Settings::default());
    assert_eq!(f.blocker, None);
    assert!(findings.stale_lock);
    o.lock = Some(lease("alice@laptop"));
    match gather(&o, &Settings::default()).0.blocker {
        Some(Blocker::LockHeld { holder, age, why }) => {
            assert!(holder.contains("alice@laptop"));
            assert!(age.is_some_and(|a| a.contains("3h")));
            assert!(
                why.contains("laptop is not a runner Pod of this object"),
                "{why}"
            );
        }
        other => panic!("expected LockHeld, got {other:?}"),
    }
}

#[test]
fn an_earlier_objects_unfinished_job_holds_the_deletion_and_its_runner_keeps_the_lock() {
    let sha = rebuilt_sha(Kind::TerraformCluster);
    let mut o = observed(Kind::TerraformCluster, &[(names::INPUTS_SHA256, &sha)]);
    let job_name = names::job_name("prod.tfc", names::OPERATION_DESTROY, 1);
    let pod_name = format!("{job_name}-x7k2p");
    let labels = serde_json::json!({
        names::LABEL_OWNER_KIND: "TerraformCluster", names::LABEL_OWNER_NAME: "prod",
        names::LABEL_OWNER_UID: "uid-of-the-earlier-prod",
        names::LABEL_OPERATION: names::OPERATION_DESTROY, "job-name": job_name,
    });
    let job: Job = serde_json::from_value(serde_json::json!({
        "metadata": {"name": job_name, "labels": labels}, "status": {"active": 1}
    }))
    .expect("job");
    let pod: Pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": pod_name, "labels": labels},
        "status": {"phase": "Running"}
    }))
    .expect("pod");
    assert!(of_earlier_namesake(
        Kind::TerraformCluster,
        &o.meta,
        &job.metadata
    ));
    o.earlier_jobs = vec![job];
    o.earlier_pods = vec![pod.clone()];
    let (d, f, _) = decide(&o, &Settings::default());
    assert_eq!(d.row, Some(Row::JobUnfinished));
    assert_eq!(
        f.unfinished_jobs[0].detail.as_deref(),
        Some("of an earlier TerraformCluster prod")
    );
    // Its Job gone (deleted with orphan propagation), its Pod still runs Terraform, and
    // holds the lock: held, not stale.
    o.earlier_jobs.clear();
    o.lock = Some(
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "lock-tfstate-default-prod.tfc", "annotations": {
                names::TF_LOCK_INFO: format!("{{\"ID\":\"abc\",\"Who\":\"runner@{pod_name}\"}}")
            }},
            "spec": {"holderIdentity": "abc"}
        }))
        .expect("lease"),
    );
    let (d, f, findings) = decide(&o, &Settings::default());
    assert_eq!(d.row, Some(Row::JobUnfinished), "{:?}", f.unfinished_jobs);
    assert!(!findings.stale_lock);
    // The Pod terminated: the lock it left is stale, and the deletion goes on.
    let mut done = pod;
    done.status.as_mut().expect("status").phase = Some("Failed".into());
    o.earlier_pods = vec![done];
    let (f, findings) = gather(&o, &Settings::default());
    assert!(f.unfinished_jobs.is_empty());
    assert!(findings.stale_lock);
    assert_eq!(f.blocker, None);
}

#[test]
fn a_suspended_or_podless_job_says_why_it_has_no_pod() {
    let sha = rebuilt_sha(Kind::TerraformCluster);
    let mut o = observed(Kind::TerraformCluster, &[(names::INPUTS_SHA256, &sha)]);
    let job_name = names::job_name("prod.tfc", names::OPERATION_DESTROY, 1);
    let job = |suspend: bool| -> Job {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": job_name, "labels": {names::LABEL_OPERATION: names::OPERATION_DESTROY}},
            "spec": {"suspend": suspend, "template": {}}
        }))
        .expect("job")
    };
    let detail = |o: &Observed| unfinished(o)[0].detail.clone();
    o.jobs = vec![job(false)];
    assert_eq!(detail(&o), None, "nothing known yet");
    o.job_refusals.insert(
        job_name.clone(),
        "Error creating: pods is forbidden: quota".into(),
    );
    assert_eq!(
        detail(&o).as_deref(),
        Some("its Pod cannot be created: Error creating: pods is forbidden: quota")
    );
    o.jobs = vec![job(true)];
    assert!(
        detail(&o).is_some_and(|d| d.starts_with("the Job is suspended")),
        "{:?}",
        detail(&o)
    );
    let (d, _, _) = decide(&o, &Settings::default());
    assert_eq!(d.row, Some(Row::JobUnfinished));
    assert!(
        d.deleting.message.contains("the Job is suspended"),
        "{}",
        d.deleting.message
    );
}

#[test]
fn an_unknown_cluster_kind_holds_an_object_that_names_a_cluster_as_paused() {
    let mut o = observed(Kind::TerraformMachine, &[]);
    o.cluster_kind_unknown = Some("no Cluster kind is served".into());
    // Naming no Cluster: nothing to miss.
    assert_eq!(gather(&o, &Settings::default()).0.paused, None);
    o.meta.labels = Some(BTreeMap::from([(
        names::CAPI_CLUSTER_NAME_LABEL.to_string(),
        "prod".to_string(),
    )]));
    let (d, f, _) = decide(&o, &Settings::default());
    assert_eq!(
        f.paused,
        Some(PauseCause::ClusterUnknown {
            cluster: "prod".into(),
            why: "no Cluster kind is served".into()
        })
    );
    assert_eq!(d.row, Some(Row::Paused));
    assert!(
        d.deleting
            .message
            .contains("it names Cluster prod, and whether that Cluster is paused cannot be seen: no Cluster kind is served"),
        "{}",
        d.deleting.message
    );
}

/// The state Secrets of `prod` (a TerraformMachine) holding one gzip-compressed state
/// of `instances` managed instances, with lineage `lineage` and serial `serial`.
fn machine_state(lineage: &str, serial: u64, instances: usize) -> StateSecrets {
    use std::io::Write;
    let state = serde_json::json!({
        "version": 4, "serial": serial, "lineage": lineage,
        "resources": [{"mode": "managed", "type": "terraform_data", "name": "a",
            "instances": vec![serde_json::json!({}); instances]}]
    });
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    e.write_all(state.to_string().as_bytes()).expect("gzip");
    let base = names::state_secret_name("prod.tfm");
    let secret = Secret {
        metadata: ObjectMeta {
            name: Some(base.clone()),
            ..Default::default()
        },
        data: Some([("tfstate".to_string(), ByteString(e.finish().expect("gzip")))].into()),
        ..Default::default()
    };
    StateSecrets::from_secrets(&base, &[secret])
}

/// Secrets holding `state` gzip-compressed as Terraform's backend stores it, under base
/// `base`, with `labels`.
fn state_secrets_of(base: &str, state: &serde_json::Value, labels: &[(&str, &str)]) -> Secret {
    use std::io::Write;
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    e.write_all(state.to_string().as_bytes()).expect("gzip");
    Secret {
        metadata: ObjectMeta {
            name: Some(base.to_string()),
            labels: Some(
                labels
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
            ),
            ..Default::default()
        },
        data: Some([("tfstate".to_string(), ByteString(e.finish().expect("gzip")))].into()),
        ..Default::default()
    }
}

/// A state of `terraform_data` instances with these ids.
fn state_of_ids(ids: &[&str]) -> serde_json::Value {
    let instance = |id: &str| serde_json::json!({"index_key": 0, "attributes": {"id": id}});
    serde_json::json!({"version": 4, "serial": 5, "lineage": "l-1", "resources": [
        {"mode": "managed", "type": "terraform_data", "name": "vm",
         "instances": ids.iter().map(|i| instance(i)).collect::<Vec<_>>()}]})
}

/// An applied TerraformCluster being deleted, its inputs rebuilt from the spec, with a
/// readable state of instances with these ids.
fn deleting_cluster_with_state(ids: &[&str]) -> Observed {
    let applied = (names::APPLIED_AT, "2026-11-30T10:00:00Z");
    let sha = rebuilt_sha(Kind::TerraformCluster);
    let mut o = observed(
        Kind::TerraformCluster,
        &[applied, (names::INPUTS_SHA256, &sha)],
    );
    o.meta.deletion_timestamp = Some(Time("2026-12-01T11:00:00Z".parse().expect("time")));
    let base = names::state_secret_name("prod.tfc");
    o.state = Some(StateSecrets::from_secrets(
        &base,
        &[state_secrets_of(&base, &state_of_ids(ids), &[])],
    ));
    o
}

#[test]
fn an_errored_state_with_instances_the_state_lacks_holds_the_destroy() {
    let mut o = deleting_cluster_with_state(&["a"]);
    let state = state_of_ids;
    let base = names::state_secret_name("prod.tfc");
    let errored_suffix = names::errored_suffix("prod.tfc", 1, "ab1cd");
    let errored_base = names::state_secret_name(&errored_suffix);
    let errored = |ids: &[&str]| {
        state::Errored::find(
            "prod.tfc",
            &[state_secrets_of(
                &errored_base,
                &state(ids),
                &[
                    (names::LABEL_ERRORED_STATE, "true"),
                    (names::TF_LABEL_SUFFIX, &errored_suffix),
                ],
            )],
        )
    };
    // Covered by the state (a destroy whose save failed leaves a subset): no hold.
    o.errored = errored(&["a"]);
    assert_eq!(o.errored.len(), 1);
    assert_eq!(blocker(&o), None);
    let (d, _, _) = decide(&o, &Settings::default());
    assert_eq!(
        (d.row, d.action.name()),
        (Some(Row::Destroy), "StartDestroy")
    );
    // An instance the state does not hold (another id): held, named, its own runbook.
    o.errored = errored(&["a", "b"]);
    let (d, _, _) = decide(&o, &Settings::default());
    assert_eq!(d.row, Some(Row::FailedOrBlocked), "{}", d.deleting.message);
    assert_ne!(d.action.name(), "StartDestroy");
    assert_eq!(d.runbook, Some(crate::rules::RUNBOOK_ERRORED_STATE));
    let msg = &d.deleting.message;
    assert!(
        msg.contains(&format!(
            "the errored state {errored_base} (what Terraform could not save) records 1 managed resource instance(s) that the state does not: terraform_data.vm[0] (id b)"
        )),
        "{msg}"
    );
    let blocked = d
        .conditions()
        .find(|c| c.type_ == crate::api::conditions::DELETION_BLOCKED)
        .expect("DeletionBlocked");
    assert_eq!(
        (blocked.status, blocked.reason),
        (crate::api::conditions::Status::True, "ErroredState")
    );
    // One that cannot be read holds too.
    let mut unreadable = errored(&["a"]);
    if let state::Errored::Pushed(s) = &mut unreadable[0] {
        s.base = Some(b"not gzip".to_vec());
    }
    o.errored = unreadable;
    assert!(
        matches!(blocker(&o), Some(Blocker::ErroredState(m)) if m.contains("cannot be read")),
        "{:?}",
        blocker(&o)
    );
    // An empty state (an apply that could not save left only the errored state):
    // held, not cleaned up and released.
    let empty = serde_json::json!({"version": 4, "serial": 1, "lineage": "l-1", "resources": []});
    o.state = Some(StateSecrets::from_secrets(
        &base,
        &[state_secrets_of(&base, &empty, &[])],
    ));
    o.errored = errored(&["b"]);
    let (d, _, _) = decide(&o, &Settings::default());
    assert_eq!(
        (d.row, d.runbook),
        (
            Some(Row::FailedOrBlocked),
            Some(crate::rules::RUNBOOK_ERRORED_STATE)
        ),
        "{}",
        d.deleting.message
    );
    // Abandon still releases.
    o.errored = errored(&["b"]);
    o.meta
        .annotations
        .get_or_insert_default()
        .insert(names::ABANDON.to_string(), "uid-1".to_string());
    let (d, _, _) = decide(&o, &Settings::default());
    assert_eq!(d.action, Action::Abandon);
}

#[test]
fn an_abandon_releases_only_the_object_whose_uid_it_names() {
    let applied = (names::APPLIED_AT, "2026-11-30T10:00:00Z");
    let decide_with = |value: &str| {
        let mut o = observed(Kind::TerraformMachine, &[applied, (names::ABANDON, value)]);
        o.state = Some(StateSecrets::from_secrets(
            &names::state_secret_name("prod.tfm"),
            &[],
        ));
        decide(&o, &Settings::default()).0
    };
    // The uid of this object: released without a destroy.
    let d = decide_with("uid-1");
    assert_eq!(
        (d.row, d.action),
        (Some(Row::StateMissing), Action::Abandon)
    );
    // "true" (left in a GitOps repository) or an earlier object's uid: held, saying so.
    for other in ["true", "uid-0"] {
        let d = decide_with(other);
        assert_eq!(
            (d.row, d.action),
            (Some(Row::StateMissing), Action::Hold),
            "{other}"
        );
        let msg = &d.deleting.message;
        assert!(
            msg.contains(&format!("is \"{other}\", not this object's uid uid-1"))
                && msg.contains("runbooks/Abandon.md"),
            "{msg}"
        );
    }
}

#[test]
fn deletion_bookkeeping_of_an_earlier_object_is_not_this_objects() {
    // Recreated from a YAML saved during an earlier object's cleanup: its markers were
    // written under the earlier uid, and its state still lists 2 instances.
    let earlier = [
        (names::APPLIED_AT, "2026-11-30T10:00:00Z"),
        (names::CLEANUP_STARTED, names::CLEANUP_DESTROYED),
        (names::DESTROY_ATTEMPT, "3"),
        (names::DESTROY_FAILED_AT, "2026-11-30T11:00:00Z"),
        (names::DELETION_UID, "uid-0"),
    ];
    let mut o = observed(Kind::TerraformMachine, &earlier);
    o.state = Some(machine_state("l-1", 4, 2));
    let (f, _) = gather(&o, &Settings::default());
    assert_eq!(f.cleanup, None);
    assert_eq!(
        (f.attempt, &f.last_attempt),
        (0, &LastAttempt::NoneFinished)
    );
    // The same bookkeeping under this object's uid is its own: cleanup goes on.
    let mut own = earlier;
    own[4] = (names::DELETION_UID, "uid-1");
    o.meta = meta(&own);
    let (f, _) = gather(&o, &Settings::default());
    assert_eq!(f.cleanup, Some(CleanupMarker::Destroyed));
    assert_eq!(f.attempt, 3);
    // A failure time older than the object is not this object's.
    o.meta.creation_timestamp = Some(Time("2026-12-01T09:00:00Z".parse().expect("time")));
    assert_eq!(
        deletion_bookkeeping(&o.meta, names::DESTROY_FAILED_AT),
        None
    );
    assert_eq!(
        deletion_bookkeeping(&o.meta, names::DESTROY_ATTEMPT),
        Some("3")
    );
}

#[test]
fn adopt_does_not_turn_off_the_fingerprint_check() {
    // Adopted earlier (its fingerprint recorded at serial 10), then an older backup of
    // the same lineage was restored over the state: held, not destroyed against.
    let mut o = observed(
        Kind::TerraformMachine,
        &[
            (names::ADOPT, "true"),
            (names::STATE_LINEAGE, "l-1"),
            (names::STATE_SERIAL, "10"),
        ],
    );
    o.state = Some(machine_state("l-1", 3, 2));
    let (d, f, _) = decide(&o, &Settings::default());
    assert_eq!((d.row, d.action), (Some(Row::StateUntrusted), Action::Hold));
    assert!(
        matches!(
            f.state,
            StateFacts::Unreadable {
                why: Unreadable::Inconsistent,
                ..
            }
        ),
        "{:?}",
        f.state
    );
    // With no fingerprint recorded yet, adopt takes the state as it is.
    o.meta = meta(&[(names::ADOPT, "true")]);
    let (_, f, _) = decide(&o, &Settings::default());
    assert!(
        matches!(f.state, StateFacts::Readable { serial: 3, .. }),
        "{:?}",
        f.state
    );
}

#[test]
fn a_gone_owner_blocks_the_destroy_unless_the_operator_names_this_object() {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
    let sha = rebuilt_sha(Kind::TerraformCluster);
    let mut o = observed(Kind::TerraformCluster, &[(names::INPUTS_SHA256, &sha)]);
    o.meta.owner_references = Some(vec![OwnerReference {
        api_version: "cluster.x-k8s.io/v1beta2".into(),
        kind: "Cluster".into(),
        name: "prod".into(),
        uid: "c-1".into(),
        ..Default::default()
    }]);
    // The Cluster exists with the owner's uid: nothing gone.
    let found = |uid: Option<&str>| {
        let uid = uid.map(str::to_string);
        move |kind: &str, name: &str| {
            (kind == "Cluster" && name == "prod")
                .then(|| uid.clone())
                .flatten()
        }
    };
    assert!(owners_gone(&o.meta, found(Some("c-1"))).is_empty());
    assert!(
        owners_gone(&o.meta, found(Some(""))).is_empty(),
        "uid unknown"
    );
    let other = owners_gone(&o.meta, found(Some("c-2")));
    assert_eq!(
        other,
        ["Cluster prod exists with uid c-2, not the owner's uid c-1"]
    );
    o.owners_gone = owners_gone(&o.meta, found(None));
    assert_eq!(o.owners_gone, ["Cluster prod (uid c-1) no longer exists"]);
    assert!(matches!(blocker(&o), Some(Blocker::OwnerGone(_))));
    // Set to this object's uid, the operator's annotation lets the destroy start.
    o.meta
        .annotations
        .get_or_insert_with(Default::default)
        .insert(names::DESTROY_WITHOUT_OWNER.into(), "uid-1".into());
    assert_eq!(blocker(&o), None);
    // Set to anything else, it does not.
    o.meta
        .annotations
        .get_or_insert_with(Default::default)
        .insert(names::DESTROY_WITHOUT_OWNER.into(), "true".into());
    assert!(matches!(blocker(&o), Some(Blocker::OwnerGone(_))));
}

#[test]
fn a_secret_terraform_would_select_with_the_state_makes_it_inconsistent() {
    let mut o = observed(
        Kind::TerraformMachine,
        &[(names::APPLIED_AT, "2026-11-30T10:00:00Z")],
    );
    let secrets = machine_state("l-1", 4, 2);
    let selector = crate::api::labels::Identity {
        kind: Kind::TerraformMachine,
        namespace: "team-a",
        name: "prod",
        uid: "uid-1",
    }
    .state_labels();
    let base = names::state_secret_name("prod.tfm");
    let copy = |labels: &BTreeMap<String, String>| Secret {
        metadata: ObjectMeta {
            name: Some(format!("{base}-bak")),
            labels: Some(labels.clone()),
            ..Default::default()
        },
        ..Default::default()
    };
    // A copy under an earlier object's uid is not selected by this object's runner.
    let mut earlier = selector.clone();
    earlier.insert(names::LABEL_OWNER_UID.into(), "uid-0".into());
    let with = |c: Secret| {
        let mut all = vec![c];
        all.push(Secret {
            metadata: ObjectMeta {
                name: Some(base.clone()),
                ..Default::default()
            },
            data: Some(
                [(
                    "tfstate".to_string(),
                    ByteString(secrets.base.clone().expect("base")),
                )]
                .into(),
            ),
            ..Default::default()
        });
        StateSecrets::from_secrets(&base, &all)
    };
    o.state = Some(with(copy(&earlier)));
    let (d, _, _) = decide(&o, &Settings::default());
    assert_eq!(
        d.row,
        Some(Row::FailedOrBlocked),
        "readable: its inputs are missing"
    );
    // With every label Terraform selects by: held, naming the copy.
    o.state = Some(with(copy(&selector)));
    let (d, f, _) = decide(&o, &Settings::default());
    assert_eq!((d.row, d.action), (Some(Row::StateUntrusted), Action::Hold));
    match f.state {
        StateFacts::Unreadable {
            why: Unreadable::Inconsistent,
            message,
        } => assert!(message.contains(&format!("{base}-bak")), "{message}"),
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_job_of_a_long_named_object_is_known_by_its_name_label_when_it_lacks_the_uid_label() {
    let long = format!("web-{}", "x".repeat(120));
    let mut object = meta(&[]);
    object.name = Some(long.clone());
    let labels = crate::api::labels::Identity {
        kind: Kind::TerraformMachine,
        namespace: "team-a",
        name: &long,
        uid: "",
    }
    .owner_labels();
    let job = ObjectMeta {
        labels: Some(labels),
        ..Default::default()
    };
    assert!(owned_by(Kind::TerraformMachine, &object, &job));
    assert!(!owned_by(Kind::TerraformCluster, &object, &job));
}

#[test]
fn a_job_that_does_not_render_holds_in_one_decision_and_one_that_does_is_handed_back() {
    let o = deleting_cluster_with_state(&["a"]);
    let settings = Settings::default();
    let (d, _, _, job) = decide_rendering(&o, &settings, None, |n, _| Ok(format!("job {n}")));
    assert_eq!(d.action, Action::StartDestroy { attempt: 1 });
    assert_eq!(job.as_deref(), Some("job 1"));

    let (d, f, _, job) = decide_rendering(&o, &settings, None, |_, _| {
        Err::<String, _>("the template's env is not a list".to_string())
    });
    assert_eq!(d.row, Some(Row::FailedOrBlocked));
    assert_eq!(d.deleting.reason, "DestroyCannotStart");
    assert!(
        d.deleting
            .message
            .contains("the template's env is not a list"),
        "{}",
        d.deleting.message
    );
    assert!(matches!(f.blocker, Some(Blocker::JobDoesNotRender(_))));
    assert_eq!(job, None);
}

#[test]
fn no_job_is_rendered_where_the_table_cannot_start_one() {
    let mut o = deleting_cluster_with_state(&["a"]);
    o.meta
        .annotations
        .get_or_insert_default()
        .insert(names::CLUSTERCTL_DELETE_FOR_MOVE.into(), "".into());
    let (d, _, _, job) = decide_rendering(
        &o,
        &Settings::default(),
        None,
        |_, _| -> Result<(), String> { panic!("rendered on a pass that row 1 decides") },
    );
    assert_eq!(d.row, Some(Row::Paused));
    assert_eq!(job, None);
    let empty = deleting_cluster_with_state(&[]);
    let (d, _, _, _) = decide_rendering(
        &empty,
        &Settings::default(),
        None,
        |_, _| -> Result<(), String> { panic!("rendered for a state with nothing to destroy") },
    );
    assert_eq!(d.row, Some(Row::CleanUp));
}

#[test]
fn a_cache_without_the_running_attempts_job_is_not_decided_on() {
    use crate::testing::job;
    let running = [
        (names::DESTROY_ATTEMPT, "2"),
        (names::DELETION_UID, "uid-1"),
    ];
    let kind = Kind::TerraformMachine;
    let o = observed(kind, &running);
    // No Job at all, or only an older attempt's: the cache has not seen attempt 2's.
    assert!(started_job_unseen(&o.meta, kind, &[]));
    assert!(started_job_unseen(
        &o.meta,
        kind,
        &[job(kind, "destroy", 1, &[])]
    ));
    // Attempt 2's Job of another uid (an earlier namesake's) is not this one's.
    let mut other = job(kind, "destroy", 2, &[]);
    other
        .metadata
        .labels
        .as_mut()
        .expect("labels")
        .insert(names::LABEL_OWNER_UID.into(), "uid-0".into());
    assert!(started_job_unseen(&o.meta, kind, &[other]));
    // Seen: decided on the cache.
    assert!(!started_job_unseen(
        &o.meta,
        kind,
        &[job(kind, "destroy", 2, &[])]
    ));
    // No attempt written, a failure recorded, a cleanup begun, or the bookkeeping of an
    // earlier uid: nothing is expected to run.
    for annotations in [
        &[][..],
        &[
            (names::DESTROY_ATTEMPT, "2"),
            (names::DELETION_UID, "uid-1"),
            (names::DESTROY_FAILED_AT, "2026-12-01T11:00:00Z"),
        ][..],
        &[
            (names::DESTROY_ATTEMPT, "2"),
            (names::DELETION_UID, "uid-1"),
            (names::CLEANUP_STARTED, names::CLEANUP_DESTROYED),
        ][..],
        &[
            (names::DESTROY_ATTEMPT, "2"),
            (names::DELETION_UID, "uid-0"),
        ][..],
    ] {
        let o = observed(kind, annotations);
        assert!(!started_job_unseen(&o.meta, kind, &[]), "{annotations:?}");
    }
}

#[test]
fn a_cache_without_the_running_applys_job_is_not_decided_on() {
    use crate::testing::job;
    let kind = Kind::TerraformCluster;
    let o = observed(kind, &[(names::APPLY_ATTEMPT, "1")]);
    // Decided on a cache that lags the Job just made, the pass would start attempt 2
    // beside it.
    assert!(started_job_unseen(&o.meta, kind, &[]));
    assert!(!started_job_unseen(
        &o.meta,
        kind,
        &[job(kind, "apply", 1, &[])]
    ));
    // Its failure or its success recorded: nothing is expected to run.
    for recorded in [
        (names::APPLY_FAILED_AT, "2026-12-01T11:00:00Z"),
        (names::APPLIED_ATTEMPT, "1"),
    ] {
        let o = observed(kind, &[(names::APPLY_ATTEMPT, "1"), recorded]);
        assert!(!started_job_unseen(&o.meta, kind, &[]), "{recorded:?}");
    }
    // An earlier attempt's success does not cover the latest.
    let o = observed(
        kind,
        &[(names::APPLY_ATTEMPT, "2"), (names::APPLIED_ATTEMPT, "1")],
    );
    assert!(started_job_unseen(&o.meta, kind, &[]));
}

#[test]
fn the_errored_states_are_read_live_for_a_minute_after_a_job_failed() {
    use crate::testing::job;
    let kind = Kind::TerraformMachine;
    let failed_at = |at: &str| {
        job(
            kind,
            "destroy",
            1,
            &[("Failed", "True", "BackoffLimitExceeded", at)],
        )
    };
    let mut o = observed(kind, &[]);
    // o.now is 12:00:00.
    o.jobs = vec![failed_at("2026-12-01T11:59:30Z")];
    assert!(failed_lately(&o));
    o.jobs = vec![failed_at("2026-12-01T11:58:00Z")];
    assert!(!failed_lately(&o));
    o.jobs = vec![job(
        kind,
        "destroy",
        1,
        &[("Complete", "True", "", "2026-12-01T11:59:59Z")],
    )];
    assert!(!failed_lately(&o));
    o.jobs = vec![job(kind, "destroy", 1, &[])];
    assert!(!failed_lately(&o));
}
