//! Builders the unit tests of several modules share: an observed object and its Jobs and
//! Pods, as the API server would return them.

use std::collections::BTreeMap;

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::ObjectMeta;
use serde_json::{Value, json};

use crate::api::names::{self, Kind};
use crate::api::{ModuleSpec, TerraformSpec};
use crate::gather::Observed;

/// The metadata of `team-a/prod` (uid `uid-1`), being deleted, with `annotations`.
pub fn meta(annotations: &[(&str, &str)]) -> ObjectMeta {
    ObjectMeta {
        name: Some("prod".into()),
        namespace: Some("team-a".into()),
        uid: Some("uid-1".into()),
        deletion_timestamp: Some(Time("2026-12-01T10:00:00Z".parse().expect("time"))),
        annotations: Some(
            annotations
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        ),
        ..Default::default()
    }
}

/// A spec with an inline module and one variable.
pub fn spec() -> TerraformSpec {
    TerraformSpec {
        module: ModuleSpec {
            source: None,
            files: Some([("main.tf".to_string(), "# module".to_string())].into()),
            path: None,
        },
        variables: Some(
            [("name".to_string(), serde_json::json!("prod"))]
                .into_iter()
                .collect(),
        ),
        ..Default::default()
    }
}

/// What a pass of `team-a/prod` of `kind` observes with nothing else around it, at
/// 2026-12-01T12:00:00Z.
pub fn observed(kind: Kind, annotations: &[(&str, &str)]) -> Observed {
    Observed::new(
        kind,
        meta(annotations),
        spec(),
        None,
        "2026-12-01T12:00:00Z".parse().expect("time"),
    )
}

/// Job `captf-<suffix>-<operation>-<attempt>` of `team-a/prod` of `kind`, with the owner
/// labels and the given conditions (type, status, reason, lastTransitionTime).
pub fn job(
    kind: Kind,
    operation: &str,
    attempt: u32,
    conditions: &[(&str, &str, &str, &str)],
) -> Job {
    let suffix = names::state_suffix(kind, "prod");
    let name = names::job_name(&suffix, operation, attempt);
    let conditions: Vec<Value> = conditions
        .iter()
        .map(|(t, s, r, at)| json!({"type": t, "status": s, "reason": r, "lastTransitionTime": at}))
        .collect();
    serde_json::from_value(json!({
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": name, "namespace": "team-a", "uid": format!("job-uid-{operation}-{attempt}"),
            "labels": {
                names::LABEL_OWNER_KIND: kind.as_str(), names::LABEL_OWNER_NAME: "prod",
                names::LABEL_OWNER_UID: "uid-1",
                names::LABEL_ATTEMPT: attempt.to_string(), names::LABEL_OPERATION: operation}},
        "spec": {"template": {"spec": {"containers": []}}},
        "status": {"conditions": conditions}
    }))
    .expect("a Job")
}

/// The Pod of `job` (by the Job controller's labels and the owner labels), its runner
/// container terminated with `exit_code` and `message`, or running when `None`.
pub fn pod_of(job: &Job, exited: Option<(i32, &str)>) -> Pod {
    let name = job.metadata.name.clone().expect("named");
    let mut labels: BTreeMap<String, String> = job.metadata.labels.clone().unwrap_or_default();
    labels.insert("batch.kubernetes.io/job-name".into(), name.clone());
    labels.insert("job-name".into(), name.clone());
    labels.insert(
        "batch.kubernetes.io/controller-uid".into(),
        job.metadata.uid.clone().unwrap_or_default(),
    );
    let (phase, state) = match exited {
        Some((code, message)) => (
            if code == 0 { "Succeeded" } else { "Failed" },
            json!({"terminated": {"exitCode": code, "reason": if code == 0 { "Completed" } else { "Error" }, "message": message}}),
        ),
        None => (
            "Running",
            json!({"running": {"startedAt": "2026-12-01T11:00:00Z"}}),
        ),
    };
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": format!("{name}-abcde"), "namespace": "team-a",
            "creationTimestamp": "2026-12-01T11:00:00Z", "labels": labels},
        "spec": {"containers": [{"name": "terraform"}]},
        "status": {"phase": phase, "containerStatuses": [{"name": "terraform", "image": "x", "imageID": "",
            "ready": false, "restartCount": 0, "state": state}]}
    }))
    .expect("a Pod")
}

/// Marks `meta` as created at `at`.
pub fn created_at(mut meta: ObjectMeta, at: &str) -> ObjectMeta {
    meta.creation_timestamp = Some(Time(at.parse().expect("time")));
    meta
}

/// The state Secrets of `suffix` holding a state of two instances and `outputs` (name ->
/// value), gzipped as Terraform writes it.
pub fn state_with_outputs(suffix: &str, outputs: serde_json::Value) -> crate::state::StateSecrets {
    use std::io::Write;
    let outputs: serde_json::Map<String, serde_json::Value> = outputs
        .as_object()
        .into_iter()
        .flatten()
        .map(|(k, v)| (k.clone(), serde_json::json!({"value": v, "type": "string"})))
        .collect();
    let state = serde_json::json!({
        "version": 4, "serial": 4, "lineage": "lin-1", "outputs": outputs,
        "resources": [{"mode": "managed", "type": "terraform_data", "name": "vm",
            "instances": [{}, {}]}]
    });
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    e.write_all(state.to_string().as_bytes()).expect("gzip");
    let base = crate::api::names::state_secret_name(suffix);
    let secret = k8s_openapi::api::core::v1::Secret {
        metadata: ObjectMeta {
            name: Some(base.clone()),
            ..Default::default()
        },
        data: Some(
            [(
                "tfstate".to_string(),
                k8s_openapi::ByteString(e.finish().expect("gzip")),
            )]
            .into(),
        ),
        ..Default::default()
    };
    crate::state::StateSecrets::from_secrets(&base, &[secret])
}
