use super::*;
use crate::rules::apply::{ApplyAction, ApplyRow, decide_apply};
use crate::testing::{job, observed, pod_of};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;

/// `team-a/prod` of `kind`, live, owned by `owners` (kind, controller).
fn live(kind: Kind, annotations: &[(&str, &str)], owners: &[(&str, bool)]) -> Observed {
    let mut o = observed(kind, annotations);
    o.meta.deletion_timestamp = None;
    o.meta.owner_references = Some(
        owners
            .iter()
            .map(|(k, controller)| OwnerReference {
                api_version: "cluster.x-k8s.io/v1beta2".into(),
                kind: k.to_string(),
                name: format!("{}-owner", k.to_lowercase()),
                uid: "owner-uid".into(),
                controller: Some(*controller),
                ..Default::default()
            })
            .collect(),
    );
    o
}

fn ready() -> ApplyObserved {
    ApplyObserved {
        provisioned: false,
        state_exists: false,
        prerequisite: None,
        contract: Ok(Default::default()),
    }
}

#[test]
fn the_owner_is_the_one_cluster_api_sets_for_the_kind() {
    let machine = live(
        Kind::TerraformMachine,
        &[],
        &[("MachineSet", true), ("Machine", false)],
    );
    assert_eq!(
        capi_owner(Kind::TerraformMachine, &machine.meta),
        None,
        "not the controller"
    );
    let machine = live(
        Kind::TerraformMachine,
        &[],
        &[("MachineSet", false), ("Machine", true)],
    );
    assert_eq!(
        capi_owner(Kind::TerraformMachine, &machine.meta).as_deref(),
        Some("machine-owner")
    );
    let cluster = live(Kind::TerraformCluster, &[], &[("Cluster", false)]);
    assert_eq!(
        capi_owner(Kind::TerraformCluster, &cluster.meta).as_deref(),
        Some("cluster-owner")
    );
    let pool = live(Kind::TerraformMachinePool, &[], &[("Cluster", false)]);
    assert_eq!(capi_owner(Kind::TerraformMachinePool, &pool.meta), None);
}

#[test]
fn a_state_the_object_never_applied_nor_adopted_is_foreign() {
    let o = live(Kind::TerraformMachine, &[], &[("Machine", true)]);
    let a = ApplyObserved {
        state_exists: true,
        ..ready()
    };
    let f = apply_facts(&o, &a, &Settings::default());
    assert!(
        f.foreign_state
            .as_deref()
            .is_some_and(|m| m.contains("tfstate-default-prod.tfm")),
        "{:?}",
        f.foreign_state
    );
    for own in [
        (names::APPLIED_AT, "2026-12-01T09:00:00Z"),
        (names::STATE_LINEAGE, "lin-1"),
        (names::ADOPT, "true"),
    ] {
        let o = live(Kind::TerraformMachine, &[own], &[("Machine", true)]);
        assert_eq!(
            apply_facts(&o, &a, &Settings::default()).foreign_state,
            None,
            "{own:?}"
        );
    }
}

/// The hash of the inputs the test spec builds to.
fn spec_sha() -> String {
    inputs_sha(&live(Kind::TerraformMachine, &[], &[]), &ready()).expect("the test spec builds")
}

#[test]
fn the_latest_apply_is_read_from_its_job_then_from_the_bookkeeping() {
    let sha = spec_sha();
    let annotations = [
        (names::APPLY_ATTEMPT, "2"),
        (names::INPUTS_SHA256, sha.as_str()),
        (names::APPLIED_AT, "2026-12-01T09:00:00Z"),
    ];
    // Its Job failed, not recorded yet: one failure more than recorded.
    let mut o = live(Kind::TerraformMachine, &annotations, &[("Machine", true)]);
    let j = job(
        Kind::TerraformMachine,
        names::OPERATION_APPLY,
        2,
        &[(
            "Failed",
            "True",
            "BackoffLimitExceeded",
            "2026-12-01T11:59:00Z",
        )],
    );
    o.pods = vec![pod_of(&j, Some((1, "Error: quota exceeded")))];
    o.jobs = vec![j];
    let f = apply_facts(&o, &ready(), &Settings::default());
    let LastApply::Failed {
        failures, message, ..
    } = &f.last
    else {
        panic!("{:?}", f.last)
    };
    assert_eq!(*failures, 1);
    assert!(message.contains("quota exceeded"), "{message}");
    assert_eq!(decide_apply(&f).row, ApplyRow::Failed);
    // Its Job succeeded: up to date.
    let mut o = live(Kind::TerraformMachine, &annotations, &[("Machine", true)]);
    o.jobs = vec![job(
        Kind::TerraformMachine,
        names::OPERATION_APPLY,
        2,
        &[("Complete", "True", "", "2026-12-01T11:59:00Z")],
    )];
    let f = apply_facts(
        &o,
        &ApplyObserved {
            provisioned: true,
            ..ready()
        },
        &Settings::default(),
    );
    assert_eq!(f.last, LastApply::Succeeded);
    // Its success not recorded (the pass that read the state could not): held, never
    // Ready on a success nothing recorded.
    assert_eq!(decide_apply(&f).row, ApplyRow::Unrecorded);
    o.meta
        .annotations
        .get_or_insert_default()
        .insert(names::APPLIED_ATTEMPT.into(), "2".into());
    let f = apply_facts(
        &o,
        &ApplyObserved {
            provisioned: true,
            ..ready()
        },
        &Settings::default(),
    );
    assert_eq!(decide_apply(&f).row, ApplyRow::UpToDate);
    // The Job gone: its recorded success says it succeeded (a fingerprint alone, or the
    // success of an earlier attempt, does not); without it, it ended without a result,
    // and it starts again.
    let mut recorded = annotations.to_vec();
    recorded.push((names::APPLIED_ATTEMPT, "2"));
    let o = live(Kind::TerraformMachine, &recorded, &[("Machine", true)]);
    assert_eq!(
        apply_facts(&o, &ready(), &Settings::default()).last,
        LastApply::Succeeded
    );
    for earlier in [
        (names::APPLIED_ATTEMPT, "1"),
        (names::STATE_LINEAGE, "lin-1"),
    ] {
        let mut not_this = annotations.to_vec();
        not_this.push(earlier);
        let o = live(Kind::TerraformMachine, &not_this, &[("Machine", true)]);
        assert_eq!(
            apply_facts(&o, &ready(), &Settings::default()).last,
            LastApply::None,
            "{earlier:?}"
        );
    }
    let o = live(Kind::TerraformMachine, &annotations, &[("Machine", true)]);
    let f = apply_facts(&o, &ready(), &Settings::default());
    assert_eq!(f.last, LastApply::None);
    assert_eq!(
        decide_apply(&f).action,
        ApplyAction::StartApply { attempt: 2 },
        "the attempt without a result starts again under its own number"
    );
}

#[test]
fn a_running_apply_job_is_waited_for() {
    let mut o = live(
        Kind::TerraformMachine,
        &[(names::APPLY_ATTEMPT, "1")],
        &[("Machine", true)],
    );
    let j = job(Kind::TerraformMachine, names::OPERATION_APPLY, 1, &[]);
    o.pods = vec![pod_of(&j, None)];
    o.jobs = vec![j];
    let f = apply_facts(&o, &ready(), &Settings::default());
    assert_eq!(decide_apply(&f).row, ApplyRow::JobUnfinished);
}

#[test]
fn externally_managed_and_paused_come_from_the_object() {
    let o = live(
        Kind::TerraformCluster,
        &[(names::CAPI_MANAGED_BY, "hosted")],
        &[("Cluster", false)],
    );
    assert_eq!(
        decide_apply(&apply_facts(&o, &ready(), &Settings::default())).row,
        ApplyRow::ExternallyManaged
    );
    let o = live(
        Kind::TerraformCluster,
        &[(names::CAPI_PAUSED, "")],
        &[("Cluster", false)],
    );
    assert_eq!(
        decide_apply(&apply_facts(&o, &ready(), &Settings::default())).row,
        ApplyRow::Paused
    );
}

#[test]
fn inputs_that_do_not_build_name_the_object_and_what_is_missing() {
    let mut o = live(Kind::TerraformMachine, &[], &[("Machine", true)]);
    o.spec.variables_from = vec![crate::api::VariablesFrom {
        kind: crate::api::VariablesSourceKind::Secret,
        name: "prod-vars".into(),
        key: "vars.json".into(),
    }];
    let f = apply_facts(&o, &ready(), &Settings::default());
    let why = f.inputs.clone().expect_err("a missing Secret");
    assert!(why.contains("TerraformMachine team-a/prod"), "{why}");
    assert!(why.contains("prod-vars"), "{why}");
    assert_eq!(decide_apply(&f).row, ApplyRow::InputsUnresolvable);
    // The same spec with the Secret read: it builds, and its hash is the inputs'.
    let secret: k8s_openapi::api::core::v1::Secret = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "prod-vars", "namespace": "team-a"},
        "data": {"vars.json": "eyJzaXplIjogMn0="}
    }))
    .expect("a Secret");
    o.referenced_secrets.insert("prod-vars".into(), secret);
    let f = apply_facts(&o, &ready(), &Settings::default());
    assert!(
        f.inputs.as_ref().is_ok_and(|sha| *sha != spec_sha()),
        "{:?}",
        f.inputs
    );
    assert_eq!(
        decide_apply(&f).action,
        ApplyAction::StartApply { attempt: 1 }
    );
}

#[test]
fn a_machine_meets_its_gates_in_order_and_a_cluster_has_none() {
    let cluster_view = |infra: bool, cp: bool| crate::gather::ClusterView {
        name: "prod".into(),
        uid: "c-1".into(),
        spec_paused: false,
        annotation_paused: false,
        infrastructure_provisioned: infra,
        control_plane_initialized: cp,
        ..Default::default()
    };
    let worker = serde_json::json!({"metadata": {"name": "web-1"}, "spec": {"bootstrap": {}}});
    let mut o = live(Kind::TerraformMachine, &[], &[("Machine", true)]);
    o.meta
        .labels
        .get_or_insert_default()
        .insert(names::CAPI_CLUSTER_NAME_LABEL.into(), "prod".into());
    // No Cluster seen, or not provisioned.
    assert_eq!(
        prerequisite(&o, Some(&worker), None),
        Some(Prerequisite::ClusterInfrastructure {
            cluster: "prod".into()
        })
    );
    o.cluster = Some(cluster_view(false, true));
    assert!(matches!(
        prerequisite(&o, Some(&worker), None),
        Some(Prerequisite::ClusterInfrastructure { .. })
    ));
    // A worker then waits for the control plane; a control-plane machine does not.
    o.cluster = Some(cluster_view(true, false));
    assert_eq!(
        prerequisite(&o, Some(&worker), None),
        Some(Prerequisite::ControlPlaneInitialized {
            cluster: "prod".into()
        })
    );
    let control_plane = serde_json::json!({"metadata": {"name": "cp-1",
        "labels": {"cluster.x-k8s.io/control-plane": ""}}, "spec": {"bootstrap": {}}});
    assert_eq!(
        prerequisite(&o, Some(&control_plane), None),
        Some(Prerequisite::BootstrapData {
            detail: "Machine cp-1 has no spec.bootstrap.dataSecretName yet".into()
        })
    );
    // Then the bootstrap data; with it, no gate.
    o.cluster = Some(cluster_view(true, true));
    assert!(matches!(
        prerequisite(&o, Some(&worker), None),
        Some(Prerequisite::BootstrapData { .. })
    ));
    let named = serde_json::json!({"metadata": {"name": "web-1"},
        "spec": {"bootstrap": {"dataSecretName": "web-1-bootstrap"}}});
    // Named, then the Secret with its value.
    assert_eq!(
        prerequisite(&o, Some(&named), None),
        Some(Prerequisite::BootstrapData {
            detail: "Secret web-1-bootstrap, which Machine web-1's spec.bootstrap.dataSecretName names, does not exist yet".into()
        })
    );
    let mut secret = k8s_openapi::api::core::v1::Secret::default();
    assert_eq!(
        prerequisite(&o, Some(&named), Some(&secret)),
        Some(Prerequisite::BootstrapData {
            detail: "Secret web-1-bootstrap of Machine web-1 has no key value yet".into()
        })
    );
    secret.data = Some(
        [(
            "value".to_string(),
            k8s_openapi::ByteString(b"#cloud-config".to_vec()),
        )]
        .into(),
    );
    assert_eq!(prerequisite(&o, Some(&named), Some(&secret)), None);
    // A pool's bootstrap data is in its template.
    let mut pool = o.clone();
    pool.kind = Kind::TerraformMachinePool;
    let mp = serde_json::json!({"metadata": {"name": "pool"},
        "spec": {"template": {"spec": {"bootstrap": {}}}}});
    assert_eq!(
        prerequisite(&pool, Some(&mp), None),
        Some(Prerequisite::BootstrapData {
            detail: "MachinePool pool has no spec.template.spec.bootstrap.dataSecretName yet"
                .into()
        })
    );
    // A TerraformCluster has none of these gates.
    let mut c = o.clone();
    c.kind = Kind::TerraformCluster;
    c.cluster = None;
    assert_eq!(prerequisite(&c, None, None), None);
}

/// Inputs recorded for `team-a/prod` of `kind` before its apply, and the object saying it
/// applied them with attempt 1, whose Job completed on a Pod that ran `image_id`.
fn applied_with_image(kind: Kind, image_id: &str) -> (Observed, crate::inputs::Inputs) {
    let suffix = names::state_suffix(kind, "prod");
    let inputs: crate::inputs::Inputs = crate::inputs::parse(
        serde_json::json!({
            "version": 1,
            "runner": {"image": "hashicorp/terraform:1.11.4"},
            "module": {"files": {"main.tf": ""}},
            "backend": {"namespace": "team-a", "secretSuffix": suffix}
        })
        .to_string()
        .as_bytes(),
        "team-a",
        &suffix,
    )
    .expect("inputs");
    let sha = inputs.sha256();
    let mut o = live(
        kind,
        &[(names::APPLY_ATTEMPT, "1"), (names::INPUTS_SHA256, &sha)],
        &[],
    );
    let owner = crate::api::labels::Identity {
        kind,
        name: "prod",
        uid: "uid-1",
        namespace: "team-a",
    };
    o.inputs_secret = Some(crate::inputs::inputs_secret(&inputs, &owner));
    let j = job(
        kind,
        "apply",
        1,
        &[("Complete", "True", "", "2026-12-01T11:30:00Z")],
    );
    let mut pod = pod_of(&j, Some((0, "")));
    pod.status
        .as_mut()
        .unwrap()
        .container_statuses
        .as_mut()
        .unwrap()[0]
        .image_id = image_id.to_string();
    o.jobs = vec![j];
    o.pods = vec![pod];
    (o, inputs)
}

#[test]
fn the_pod_of_a_successful_apply_names_the_image_it_ran_by_digest() {
    let hex = "0123456789abcdef".repeat(4);
    let id = format!("docker.io/hashicorp/terraform@sha256:{hex}");
    let digest_of = |o: &Observed| apply_ran(o, 1).map(|r| r.image_digest);
    let (o, inputs) = applied_with_image(Kind::TerraformMachine, &id);
    let ran = apply_ran(&o, 1).expect("its Pod");
    assert!(
        ran.pod.starts_with("captf-prod-tfm-apply-1-"),
        "{}",
        ran.pod
    );
    assert_eq!(ran.image_digest, Some(id.clone()));
    assert_eq!(apply_ran(&o, 2), None, "another attempt's Pod");
    // Docker's prefix goes.
    let (o2, _) = applied_with_image(Kind::TerraformMachine, &format!("docker-pullable://{id}"));
    assert_eq!(digest_of(&o2), Some(Some(id.clone())));

    // What ran is no input: recording it does not change the hash.
    let mut recorded = inputs.clone();
    recorded.ran = Some(crate::inputs::Ran {
        image_digest: Some(id.clone()),
        ..Default::default()
    });
    assert_eq!(
        recorded.sha256(),
        inputs.sha256(),
        "what ran is not an input"
    );

    // An image ID that names no pullable digest (a local image), or none at all: the run
    // is recorded without one.
    for id in [
        String::new(),
        format!("sha256:{hex}"),
        format!("hashicorp/terraform@sha256:{}", &hex[..10]),
    ] {
        let (o5, _) = applied_with_image(Kind::TerraformMachine, &id);
        assert_eq!(digest_of(&o5), Some(None), "{id}");
    }
}

#[test]
fn an_attempts_inputs_are_those_its_variables_secret_carries_or_an_older_managers() {
    let (mut o, inputs) = applied_with_image(Kind::TerraformMachine, "");
    let suffix = names::state_suffix(Kind::TerraformMachine, "prod");
    // An older CAPTF wrote the attempt's inputs into the inputs Secret before its Job:
    // taken when they hash as the object says.
    o.meta
        .annotations
        .get_or_insert_default()
        .insert(names::INPUTS_SHA256.into(), inputs.sha256());
    assert_eq!(inputs_of_attempt(&o, 1), Some(inputs.clone()));
    let mut other = o.clone();
    other
        .meta
        .annotations
        .get_or_insert_default()
        .insert(names::INPUTS_SHA256.into(), "another".into());
    assert_eq!(inputs_of_attempt(&other, 1), None, "not the ones it ran");
    // Its own variables Secret carries them: those, whatever the inputs Secret holds.
    let mut newer = inputs.clone();
    newer
        .variables
        .insert("size".into(), serde_json::json!("large"));
    let attempt: k8s_openapi::api::core::v1::Secret = serde_json::from_value(serde_json::json!({
        "metadata": {"name": names::job_name(&suffix, names::OPERATION_APPLY, 1)},
        "data": {names::INPUTS_KEY: k8s_openapi::ByteString(newer.to_json_bytes())}
    }))
    .unwrap();
    other.attempt_secret = Some(attempt);
    assert_eq!(inputs_of_attempt(&other, 1), Some(newer));
    assert_eq!(inputs_of_attempt(&other, 2), None, "another attempt's");
}

/// A machine's hand-off is read only from a TerraformCluster whose first apply
/// succeeded: a state Secret alone may be the one the backend made at `init`, with no
/// outputs yet.
#[test]
fn the_hand_off_waits_for_the_clusters_first_apply_not_just_its_state() {
    let base = "tfstate-default-prod.tfc";
    let no_state = handoff_readable("prod", base, false, Some(true)).unwrap_err();
    assert!(no_state.contains("has no state Secret"), "{no_state}");
    let gone = handoff_readable("prod", base, true, None).unwrap_err();
    assert!(
        gone.contains("TerraformCluster prod does not exist"),
        "{gone}"
    );
    let applying = handoff_readable("prod", base, true, Some(false)).unwrap_err();
    assert!(
        applying.contains("has not finished its first apply"),
        "{applying}"
    );
    assert_eq!(handoff_readable("prod", base, true, Some(true)), Ok(()));
    // Either the status or a recorded success says a TerraformCluster is provisioned.
    let mut c: crate::api::TerraformCluster = serde_json::from_value(serde_json::json!({
        "apiVersion": names::API_VERSION, "kind": "TerraformCluster",
        "metadata": {"name": "prod", "namespace": "team-a"},
        "spec": {"module": {"files": {"main.tf": ""}}}
    }))
    .unwrap();
    assert!(!object_provisioned(&c));
    c.metadata
        .annotations
        .get_or_insert_default()
        .insert(names::APPLIED_ATTEMPT.into(), "1".into());
    assert!(object_provisioned(&c));
}

#[test]
fn a_pass_that_records_an_apply_reads_the_inputs_as_a_record_does() {
    use crate::gather::StateWanted;
    let annotations = [
        (names::APPLY_ATTEMPT, "2"),
        (names::APPLIED_AT, "2026-12-01T09:00:00Z"),
    ];
    let complete = job(
        Kind::TerraformMachine,
        names::OPERATION_APPLY,
        2,
        &[("Complete", "True", "", "2026-12-01T11:59:00Z")],
    );
    // Its end not recorded yet: the pass records it, and starts nothing.
    let mut o = live(Kind::TerraformMachine, &annotations, &[("Machine", true)]);
    o.jobs = vec![complete.clone()];
    assert_eq!(StateWanted::for_pass(&o), StateWanted::Record);
    assert!(StateWanted::Record.inputs());
    // Recorded: the pass reads as any other.
    let mut recorded = annotations.to_vec();
    recorded.push((names::APPLIED_ATTEMPT, "2"));
    let mut o = live(Kind::TerraformMachine, &recorded, &[("Machine", true)]);
    o.jobs = vec![complete];
    assert_eq!(StateWanted::for_pass(&o), StateWanted::WithInputs);
    // Still running: nothing to record.
    let mut o = live(Kind::TerraformMachine, &annotations, &[("Machine", true)]);
    o.jobs = vec![job(Kind::TerraformMachine, names::OPERATION_APPLY, 2, &[])];
    assert_eq!(StateWanted::for_pass(&o), StateWanted::WithInputs);
}
