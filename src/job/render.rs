//! Rendering one attempt's Job from the inputs and the templates.
//!
//! The template gives the shape (resources, scheduling, extra volumes, …); code then sets
//! every field the deletion's correctness depends on, so that no template can remove it.
//!
//! How the runner gets its files: the stock `hashicorp/terraform` image has no `jq`, so
//! the runner parses no JSON. The controller renders every file the runner needs, and a
//! projected volume puts each at its path under `/captf/render` (read-only). The runner
//! script and the backend settings are Pod-template annotations `A/file-<index>`, readable
//! with `kubectl get pod -o yaml`. Everything else goes into the attempt's own Secret
//! (named as the Job, keys `file-<index>`), projected into the same directory: the
//! variables, which may hold values resolved from Secrets; the module's files and the
//! modules `init` installed, which may be private code; the lock file. Anyone who may read
//! Pods may read their annotations, and the manager's caches hold the Pods it watches; a
//! Secret is 1 MiB at most, which bounds inline modules (a larger module is given as
//! `module.source`).
//!
//! The script itself is one of those files, and the container runs
//! `/bin/sh /captf/render/runner.sh` rather than `sh -c <script>`: the Pod's command stays
//! short and readable in `kubectl get pod -o yaml` and in `ps`, the script is a file that
//! `kubectl exec` and the local test runner can look at, and the script, like every other
//! file, is covered by the one annotation size check.

use std::collections::BTreeMap;

use k8s_openapi::ByteString;
use k8s_openapi::api::batch::v1::{
    Job, PodFailurePolicy, PodFailurePolicyOnPodConditionsPattern, PodFailurePolicyRule,
};
use k8s_openapi::api::core::v1::{
    Capabilities, Container, DownwardAPIProjection, DownwardAPIVolumeFile, EmptyDirVolumeSource,
    KeyToPath, ObjectFieldSelector, PodSecurityContext, ProjectedVolumeSource, SeccompProfile,
    Secret, SecretProjection, SecurityContext, Volume, VolumeMount, VolumeProjection,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use super::backend::{backend_hcl, errored_backend_hcl};
use super::env::env;
use super::template::Templates;
use super::{JobRequest, RenderError};
use crate::api::names;
use crate::api::types::DEFAULT_TIMEOUT_SECONDS;
use crate::inputs::{self, Module};

pub use super::layout::*;

/// Labels the Job controller owns on the Pod template; a template must not set them.
const JOB_CONTROLLER_LABELS: &[&str] = &[
    "job-name",
    "controller-uid",
    "batch.kubernetes.io/job-name",
    "batch.kubernetes.io/controller-uid",
];

/// The annotation key of the file with this index.
pub fn file_annotation(index: usize) -> String {
    format!("{}/file-{index}", names::PREFIX)
}

fn file_annotation_prefix() -> String {
    format!("{}/file-", names::PREFIX)
}

/// The labels of an attempt's Job, its Pods and its Secret.
fn attempt_labels(req: &JobRequest) -> BTreeMap<String, String> {
    let mut labels = req.identity().owner_labels();
    labels.insert(
        names::LABEL_OPERATION.to_string(),
        req.operation.to_string(),
    );
    labels.insert(names::LABEL_ATTEMPT.to_string(), req.attempt.to_string());
    if let Some(cluster) = req.cluster_name {
        labels.insert(
            names::CAPI_CLUSTER_NAME_LABEL.to_string(),
            cluster.to_string(),
        );
    }
    labels
}

/// The files that stay in the Pod template's annotations, readable with `kubectl get pod
/// -o yaml`: the runner script and the backend settings. Everything else (the variables,
/// which `variablesFrom` may fill from Secrets; the module's files, which may be private
/// code; the lock file; the modules `init` installed) reaches the runner through the
/// attempt's Secret, which only those who may read Secrets can read.
const ANNOTATION_FILES: &[&str] = &[
    FILE_RUNNER,
    FILE_BACKEND,
    FILE_ERRORED_BACKEND,
    FILE_MODULE_SOURCE,
    FILE_MODULE_PATH,
];

/// The key of the attempt Secret's `index`th file.
fn secret_key(index: usize) -> String {
    format!("file-{index}")
}

/// Every file the runner needs, by path, with where it goes: an annotation key of the Pod
/// template (`true`), or a key of the attempt's Secret (`false`), numbered in a fixed
/// order so that the Job and its Secret agree.
fn placed_files(
    templates: &Templates,
    req: &JobRequest,
) -> Result<Vec<(String, String, String, bool)>, RenderError> {
    let (mut in_annotations, mut in_secret) = (0, 0);
    Ok(runner_files(templates, req)?
        .into_iter()
        .map(|(path, content)| {
            if ANNOTATION_FILES.contains(&path.as_str()) {
                in_annotations += 1;
                (file_annotation(in_annotations - 1), path, content, true)
            } else {
                in_secret += 1;
                (secret_key(in_secret - 1), path, content, false)
            }
        })
        .collect())
}

/// The Secret of one attempt: the files that are not the Pod's annotations (see
/// [`ANNOTATION_FILES`]), projected into the render directory beside them. Named as the
/// Job, labelled as it; made before the Job, and deleted with it.
pub fn attempt_secret(templates: &Templates, req: &JobRequest) -> Result<Secret, RenderError> {
    let mut data: BTreeMap<String, ByteString> = placed_files(templates, req)?
        .into_iter()
        .filter(|(_, _, _, annotation)| !annotation)
        .map(|(key, _, content, _)| (key, ByteString(content.into_bytes())))
        .collect();
    // An apply's inputs travel with it: they become the destroy's (the inputs Secret)
    // once this attempt wrote the state, and not before. Not projected into the Pod.
    if req.operation == names::OPERATION_APPLY {
        data.insert(
            names::INPUTS_KEY.to_string(),
            ByteString(req.inputs.to_json_bytes()),
        );
    }
    // The identity's credentials, for the runner's env (not projected as files).
    for (name, value) in req.credentials.iter().flat_map(|i| &i.values) {
        data.insert(super::identity_key(name), value.clone());
    }
    let size: usize = data.iter().map(|(k, v)| k.len() + v.0.len()).sum();
    if size > SECRET_MAX_BYTES {
        return Err(RenderError::SecretTooLarge {
            size,
            limit: SECRET_MAX_BYTES,
        });
    }
    Ok(Secret {
        metadata: ObjectMeta {
            name: Some(names::job_name(req.suffix, req.operation, req.attempt)),
            namespace: Some(req.namespace.to_string()),
            labels: Some(attempt_labels(req)),
            ..Default::default()
        },
        data: Some(data),
        type_: Some("Opaque".to_string()),
        ..Default::default()
    })
}

/// Every file the runner needs, by path under the render directory, in a fixed order.
pub fn runner_files(
    templates: &Templates,
    req: &JobRequest,
) -> Result<Vec<(String, String)>, RenderError> {
    let inputs = req.inputs;
    let mut files = vec![
        (FILE_RUNNER.to_string(), templates.runner.clone()),
        (FILE_BACKEND.to_string(), backend_hcl(req)),
        (
            FILE_VARIABLES.to_string(),
            serde_json::to_string_pretty(&inputs.variables).expect("variables serialize") + "\n",
        ),
        (FILE_ERRORED_BACKEND.to_string(), errored_backend_hcl(req)),
    ];
    if !inputs.contract_variables.is_empty() {
        files.push((
            FILE_CONTRACT.to_string(),
            serde_json::to_string_pretty(&inputs.contract_variables).expect("variables serialize")
                + "\n",
        ));
    }
    if let Some(lock) = inputs.run_lock_file() {
        files.push((FILE_LOCK.to_string(), lock.to_string()));
    }
    for (name, content) in inputs.run_installed_modules().into_iter().flatten() {
        if let Some(why) = inputs::bad_file_name(name) {
            return Err(RenderError::BadFileName {
                name: name.clone(),
                why,
            });
        }
        files.push((format!("{DIR_INSTALLED_MODULES}/{name}"), content.clone()));
    }
    match inputs.run_module().as_ref() {
        Module::Source(source) => files.push((FILE_MODULE_SOURCE.to_string(), source.clone())),
        Module::Path(path) => files.push((FILE_MODULE_PATH.to_string(), path.clone())),
        Module::Files(module_files) => {
            for (name, content) in module_files {
                if let Some(why) = inputs::bad_file_name(name) {
                    return Err(RenderError::BadFileName {
                        name: name.clone(),
                        why,
                    });
                }
                // A file cannot also be a directory of another file.
                let dir = format!("{name}/");
                if module_files.keys().any(|other| other.starts_with(&dir)) {
                    return Err(RenderError::BadFileName {
                        name: name.clone(),
                        why: "it is both a file and the directory of another file",
                    });
                }
                files.push((format!("{DIR_MODULE}/{name}"), content.clone()));
            }
        }
    }
    Ok(files)
}

/// Renders the Job of one attempt (see the module documentation).
pub fn render(templates: &Templates, req: &JobRequest) -> Result<Job, RenderError> {
    let backend = &req.inputs.backend;
    if backend.namespace != req.namespace || backend.secret_suffix != req.suffix {
        return Err(RenderError::ForeignBackend {
            namespace: backend.namespace.clone(),
            suffix: backend.secret_suffix.clone(),
            expected_namespace: req.namespace.to_string(),
            expected_suffix: req.suffix.to_string(),
        });
    }
    let job_name = names::job_name(req.suffix, req.operation, req.attempt);
    let owner_name_label = crate::api::labels::name_label_value(req.name);
    let values: BTreeMap<&str, String> = BTreeMap::from([
        ("name", job_name.clone()),
        ("namespace", req.namespace.to_string()),
        ("image", req.inputs.run_image().to_string()),
        ("operation", req.operation.to_string()),
        ("attempt", req.attempt.to_string()),
        ("suffix", req.suffix.to_string()),
        ("ownerKind", req.kind.as_str().to_string()),
        ("ownerName", req.name.to_string()),
        ("ownerUid", req.uid.to_string()),
        (
            "clusterName",
            req.cluster_name.unwrap_or_default().to_string(),
        ),
        ("serviceAccountName", req.service_account.to_string()),
    ]);
    let mut job = templates.job_with(&values)?;

    // The labels of the Job and of its Pods.
    let labels = attempt_labels(req);
    debug_assert_eq!(labels[names::LABEL_OWNER_NAME], owner_name_label);

    // Job metadata.
    let meta = &mut job.metadata;
    meta.name = Some(job_name.clone());
    meta.generate_name = None;
    meta.namespace = Some(req.namespace.to_string());
    meta.owner_references = None;
    meta.finalizers = None;
    meta.labels
        .get_or_insert_with(BTreeMap::new)
        .extend(labels.clone());
    meta.resource_version = None;
    meta.uid = None;

    // Job spec: one Job is one attempt; the controller counts attempts.
    let spec = job.spec.get_or_insert_with(Default::default);
    spec.backoff_limit = Some(0);
    spec.pod_replacement_policy = Some("Failed".to_string());
    spec.active_deadline_seconds = Some(
        req.inputs
            .timeout_seconds
            .unwrap_or(DEFAULT_TIMEOUT_SECONDS),
    );
    spec.ttl_seconds_after_finished = None;
    spec.completions = Some(1);
    spec.parallelism = Some(1);
    spec.suspend = None;
    spec.selector = None;
    spec.manual_selector = None;
    // A Pod stopped by a disruption (a drain, a node-pressure eviction, a preemption, a
    // node shutdown: the Pod's DisruptionTarget condition) is not a failed attempt: the
    // Job makes a new Pod, once the old one has stopped (podReplacementPolicy Failed
    // keeps it to one Terraform at a time).
    spec.pod_failure_policy = Some(PodFailurePolicy {
        rules: vec![PodFailurePolicyRule {
            action: "Ignore".to_string(),
            on_pod_conditions: Some(vec![PodFailurePolicyOnPodConditionsPattern {
                type_: "DisruptionTarget".to_string(),
                status: "True".to_string(),
            }]),
            on_exit_codes: None,
        }],
    });
    spec.success_policy = None;
    spec.completion_mode = None;
    spec.backoff_limit_per_index = None;
    spec.max_failed_indexes = None;
    spec.managed_by = None;

    // Pod template metadata: labels, and the files as annotations.
    let pod_meta = spec.template.metadata.get_or_insert_with(Default::default);
    let pod_labels = pod_meta.labels.get_or_insert_with(BTreeMap::new);
    pod_labels.retain(|k, _| !JOB_CONTROLLER_LABELS.contains(&k.as_str()));
    pod_labels.extend(labels);
    pod_meta.owner_references = None;
    let annotations = pod_meta.annotations.get_or_insert_with(BTreeMap::new);
    let prefix = file_annotation_prefix();
    annotations.retain(|k, _| !k.starts_with(&prefix));
    // The Secret's files by key and path (each key it has: one it lacked would keep the
    // Pod from starting), the annotations' in the Pod template.
    let mut secret_keys: Vec<(String, String)> = Vec::new();
    let mut files: Vec<(String, String, String)> = Vec::new();
    for (key, path, content, annotation) in placed_files(templates, req)? {
        if annotation {
            files.push((key, path, content));
        } else {
            secret_keys.push((key, path));
        }
    }
    let mut items = Vec::with_capacity(files.len());
    for (key, path, content) in files {
        items.push(DownwardAPIVolumeFile {
            path: path.clone(),
            field_ref: Some(ObjectFieldSelector {
                field_path: format!("metadata.annotations['{key}']"),
                ..Default::default()
            }),
            ..Default::default()
        });
        annotations.insert(key, content);
    }
    let size: usize = annotations.iter().map(|(k, v)| k.len() + v.len()).sum();
    if size > ANNOTATIONS_MAX_BYTES {
        return Err(RenderError::TooLarge {
            size,
            limit: ANNOTATIONS_MAX_BYTES,
        });
    }

    // Pod spec.
    let pod = spec.template.spec.get_or_insert_with(Default::default);
    pod.restart_policy = Some("Never".to_string());
    pod.termination_grace_period_seconds = Some(
        pod.termination_grace_period_seconds
            .unwrap_or(DEFAULT_GRACE_SECONDS)
            .max(MIN_GRACE_SECONDS),
    );
    pod.service_account_name = Some(req.service_account.to_string());
    pod.service_account = None;
    pod.automount_service_account_token = Some(true);
    // Terraform's lock names its holder by hostname; the controller matches it to a Pod
    // name, which is the hostname only when the template sets none.
    pod.hostname = None;
    pod.subdomain = None;
    pod.set_hostname_as_fqdn = None;
    let psc = pod
        .security_context
        .get_or_insert_with(PodSecurityContext::default);
    // Never root; the user is the template's (the shipped one names 65532), so that a
    // platform that assigns users from a range (OpenShift) can, when the template names
    // none.
    psc.run_as_non_root = Some(true);
    if psc.run_as_user == Some(0) {
        psc.run_as_user = Some(RUNNER_UID);
    }
    if psc.run_as_group == Some(0) {
        psc.run_as_group = Some(RUNNER_UID);
    }
    psc.seccomp_profile = Some(runtime_default());

    let volumes = pod.volumes.get_or_insert_with(Vec::new);
    volumes.retain(|v| v.name != RENDER_VOLUME && v.name != WORKSPACE_VOLUME);
    // One directory: the annotations' files and the attempt Secret's.
    volumes.push(Volume {
        name: RENDER_VOLUME.to_string(),
        projected: Some(ProjectedVolumeSource {
            default_mode: Some(0o444),
            sources: Some(vec![
                VolumeProjection {
                    downward_api: Some(DownwardAPIProjection { items: Some(items) }),
                    ..Default::default()
                },
                VolumeProjection {
                    secret: Some(SecretProjection {
                        name: job_name.clone(),
                        items: Some(
                            secret_keys
                                .iter()
                                .map(|(key, path)| KeyToPath {
                                    key: key.clone(),
                                    path: path.clone(),
                                    mode: None,
                                })
                                .collect(),
                        ),
                        optional: Some(false),
                    }),
                    ..Default::default()
                },
            ]),
        }),
        ..Default::default()
    });
    volumes.push(Volume {
        name: WORKSPACE_VOLUME.to_string(),
        empty_dir: Some(EmptyDirVolumeSource::default()),
        ..Default::default()
    });

    if pod.containers.is_empty() {
        pod.containers.push(Container {
            name: CONTAINER_NAME.to_string(),
            ..Default::default()
        });
    }
    let index = pod
        .containers
        .iter()
        .position(|c| c.name == CONTAINER_NAME)
        .unwrap_or(0);
    let c = &mut pod.containers[index];
    c.image = Some(req.inputs.run_image().to_string());
    c.command = Some(vec![
        "/bin/sh".to_string(),
        format!("{RENDER_DIR}/{FILE_RUNNER}"),
    ]);
    c.args = None;
    c.termination_message_path = Some(TERMINATION_MESSAGE_PATH.to_string());
    c.termination_message_policy = Some("FallbackToLogsOnError".to_string());
    if c.working_dir.is_none() {
        c.working_dir = Some(WORKSPACE_DIR.to_string());
    }
    harden(
        c.security_context
            .get_or_insert_with(SecurityContext::default),
    );

    let mounts = c.volume_mounts.get_or_insert_with(Vec::new);
    mounts.retain(|m| {
        m.name != RENDER_VOLUME
            && m.name != WORKSPACE_VOLUME
            && m.mount_path != RENDER_DIR
            && m.mount_path != WORKSPACE_DIR
    });
    mounts.push(VolumeMount {
        name: RENDER_VOLUME.to_string(),
        mount_path: RENDER_DIR.to_string(),
        read_only: Some(true),
        ..Default::default()
    });
    mounts.push(VolumeMount {
        name: WORKSPACE_VOLUME.to_string(),
        mount_path: WORKSPACE_DIR.to_string(),
        ..Default::default()
    });

    c.env = Some(env(c.env.take().unwrap_or_default(), req)?);
    if let Some(image) = &templates.state_proxy_image {
        super::sidecar::add_state_proxy(pod, index, req, image);
    }
    Ok(job)
}

/// What code sets on a container's security context whatever the template says (the
/// runner's, the state proxy's): a read-only root, no privilege or its escalation, no
/// capability, not root, the runtime's seccomp profile.
pub(super) fn harden(sc: &mut SecurityContext) {
    sc.read_only_root_filesystem = Some(true);
    sc.allow_privilege_escalation = Some(false);
    sc.privileged = Some(false);
    sc.run_as_non_root = Some(true);
    sc.capabilities = Some(Capabilities {
        add: None,
        drop: Some(vec!["ALL".to_string()]),
    });
    sc.seccomp_profile = Some(runtime_default());
}

fn runtime_default() -> SeccompProfile {
    SeccompProfile {
        type_: "RuntimeDefault".to_string(),
        localhost_profile: None,
    }
}
