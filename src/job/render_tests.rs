//! Tests of the Job rendering: the golden Job, the fields a template cannot change, the
//! size limit and the placeholders.

use std::collections::BTreeMap;
use std::path::PathBuf;

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Container, PodSecurityContext, Secret};
use serde_json::json;

use super::render::*;
use super::*;
use crate::api::names;
use crate::api::types::{EnvFromSecret, SecretKeyRef};
use crate::inputs::{Backend, Inputs, Module, Runner};

pub(crate) const NS: &str = "team-a";
pub(crate) const SUFFIX: &str = "web-1.tfm";

/// Inputs with an inline module, variables, credentials and a lock file.
pub(crate) fn inline_inputs() -> Inputs {
    Inputs {
        version: 1,
        runner: Runner {
            image: "hashicorp/terraform:1.11.4".into(),
            runtime: None,
            plugin_dir: None,
        },
        module: Module::Files(BTreeMap::from([
            (
                "main.tf".into(),
                "resource \"terraform_data\" \"vm\" {\n  input = var.name\n}\n".into(),
            ),
            (
                "variables.tf".into(),
                "variable \"name\" {\n  type = string\n}\n".into(),
            ),
            ("modules/net/main.tf".into(), "# a nested file\n".into()),
        ])),
        variables: json!({"name": "web-1", "replicas": 3, "quote": "a \"b\" ${c}"})
            .as_object()
            .unwrap()
            .clone(),
        env: vec![EnvFromSecret {
            name: "AWS_ACCESS_KEY_ID".into(),
            secret_key_ref: SecretKeyRef {
                name: "aws-creds".into(),
                key: "id".into(),
            },
        }],
        backend: Backend {
            namespace: NS.into(),
            secret_suffix: SUFFIX.into(),
        },
        timeout_seconds: Some(1800),
        lock_file: Some("# lock file\n".into()),
        contract_variables: Default::default(),
        ran: None,
        identity: None,
    }
}

pub(crate) fn request(inputs: &Inputs) -> JobRequest<'_> {
    JobRequest {
        kind: Kind::TerraformMachine,
        name: "web-1",
        uid: "0a1b2c3d-0000-4000-8000-000000000001",
        namespace: NS,
        suffix: SUFFIX,
        cluster_name: Some("prod"),
        operation: names::OPERATION_DESTROY,
        attempt: 2,
        inputs,
        plan_guard: PlanGuard::default(),
        service_account: names::RUNNER_NAME,
        credentials: None,
    }
}

/// The value of each projected file, by path, as the kubelet would write it.
pub(crate) fn projected_files(job: &Job, secret: &Secret) -> BTreeMap<String, String> {
    let pod = &job.spec.as_ref().unwrap().template;
    let annotations = pod.metadata.as_ref().unwrap().annotations.as_ref().unwrap();
    let volume = pod
        .spec
        .as_ref()
        .unwrap()
        .volumes
        .as_ref()
        .unwrap()
        .iter()
        .find(|v| v.name == RENDER_VOLUME)
        .unwrap();
    let mut files = BTreeMap::new();
    for source in volume.projected.as_ref().unwrap().sources.as_ref().unwrap() {
        if let Some(d) = &source.downward_api {
            for item in d.items.as_ref().unwrap() {
                let path = &item.field_ref.as_ref().unwrap().field_path;
                let key = path
                    .strip_prefix("metadata.annotations['")
                    .unwrap()
                    .strip_suffix("']")
                    .unwrap();
                files.insert(item.path.clone(), annotations[key].clone());
            }
        }
        if let Some(sp) = &source.secret {
            assert_eq!(Some(&sp.name), secret.metadata.name.as_ref());
            let data = secret.data.as_ref().unwrap();
            for item in sp.items.as_ref().unwrap() {
                let bytes = &data[&item.key].0;
                files.insert(item.path.clone(), String::from_utf8(bytes.clone()).unwrap());
            }
        }
    }
    files
}

/// The Job and the Secret of one attempt.
pub(crate) fn rendered(templates: &Templates, req: &JobRequest) -> (Job, Secret) {
    (
        render(templates, req).unwrap(),
        attempt_secret(templates, req).unwrap(),
    )
}

fn container(job: &Job) -> &Container {
    let pod = job.spec.as_ref().unwrap().template.spec.as_ref().unwrap();
    pod.containers
        .iter()
        .find(|c| c.name == CONTAINER_NAME)
        .unwrap()
}

/// The Pod's security context.
fn pod_security(job: &Job) -> &PodSecurityContext {
    let pod = job.spec.as_ref().unwrap().template.spec.as_ref().unwrap();
    pod.security_context.as_ref().unwrap()
}

fn golden_path() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("src/job/testdata/destroy-job.yaml")
}

#[test]
fn the_destroy_job_matches_the_golden_file() {
    let inputs = inline_inputs();
    let job = render(&Templates::embedded(), &request(&inputs)).unwrap();
    let yaml = serde_saphyr::to_string(&job).unwrap();
    let path = golden_path();
    if std::env::var_os("CAPTF_UPDATE_GOLDEN").is_some() {
        std::fs::write(&path, &yaml).unwrap();
    }
    let golden = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        yaml == golden,
        "the rendered Job differs from {} (run with CAPTF_UPDATE_GOLDEN=1 to rewrite it after checking the change):\n{yaml}",
        path.display()
    );
    // The golden file is a Job that parses back to the same object.
    let back: Job = serde_saphyr::from_str(&golden).unwrap();
    assert_eq!(back, job);
}

#[test]
fn the_job_carries_the_safety_fields_labels_and_files() {
    let inputs = inline_inputs();
    let job = render(&Templates::embedded(), &request(&inputs)).unwrap();
    assert_eq!(
        job.metadata.name.as_deref(),
        Some("captf-web-1-tfm-destroy-2")
    );
    assert_eq!(
        job.metadata.name.as_deref(),
        Some(names::job_name(SUFFIX, names::OPERATION_DESTROY, 2).as_str())
    );
    assert_eq!(job.metadata.namespace.as_deref(), Some(NS));
    assert!(job.metadata.owner_references.is_none());
    let spec = job.spec.as_ref().unwrap();
    assert_eq!(spec.backoff_limit, Some(0));
    assert_eq!(spec.pod_replacement_policy.as_deref(), Some("Failed"));
    assert_eq!(spec.active_deadline_seconds, Some(1800));
    assert_eq!(spec.ttl_seconds_after_finished, None);
    for labels in [
        job.metadata.labels.as_ref().unwrap(),
        spec.template
            .metadata
            .as_ref()
            .unwrap()
            .labels
            .as_ref()
            .unwrap(),
    ] {
        assert_eq!(labels[names::LABEL_OWNER_KIND], "TerraformMachine");
        assert_eq!(labels[names::LABEL_OWNER_NAME], "web-1");
        assert_eq!(
            labels[names::LABEL_OWNER_UID],
            "0a1b2c3d-0000-4000-8000-000000000001"
        );
        assert_eq!(labels[names::LABEL_OPERATION], "destroy");
        assert_eq!(labels[names::LABEL_ATTEMPT], "2");
        assert_eq!(labels[names::CAPI_CLUSTER_NAME_LABEL], "prod");
    }
    assert_eq!(attempt_of(&job), Some(2));
    assert_eq!(operation_of(&job), Some("destroy"));
    let pod = spec.template.spec.as_ref().unwrap();
    assert_eq!(pod.restart_policy.as_deref(), Some("Never"));
    assert_eq!(
        pod.service_account_name.as_deref(),
        Some(names::RUNNER_NAME)
    );
    assert_eq!(pod.termination_grace_period_seconds, Some(300));
    let psc = pod.security_context.as_ref().unwrap();
    assert_eq!(
        (psc.run_as_non_root, psc.run_as_user, psc.fs_group),
        (Some(true), Some(65532), Some(65532))
    );
    let c = container(&job);
    assert_eq!(c.image.as_deref(), Some("hashicorp/terraform:1.11.4"));
    assert_eq!(
        c.command,
        Some(vec![
            "/bin/sh".to_string(),
            "/captf/render/runner.sh".to_string()
        ])
    );
    assert_eq!(
        c.termination_message_path.as_deref(),
        Some("/dev/termination-log")
    );
    assert_eq!(
        c.termination_message_policy.as_deref(),
        Some("FallbackToLogsOnError")
    );
    let sc = c.security_context.as_ref().unwrap();
    assert_eq!(sc.read_only_root_filesystem, Some(true));
    assert_eq!(sc.allow_privilege_escalation, Some(false));
    assert_eq!(
        sc.capabilities.as_ref().unwrap().drop,
        Some(vec!["ALL".to_string()])
    );
    assert_eq!(sc.seccomp_profile.as_ref().unwrap().type_, "RuntimeDefault");
    let env: BTreeMap<_, _> = c
        .env
        .as_ref()
        .unwrap()
        .iter()
        .map(|e| (e.name.as_str(), e))
        .collect();
    let cred = env["AWS_ACCESS_KEY_ID"]
        .value_from
        .as_ref()
        .unwrap()
        .secret_key_ref
        .as_ref()
        .unwrap();
    assert_eq!((cred.name.as_str(), cred.key.as_str()), ("aws-creds", "id"));
    assert_eq!(env["HOME"].value.as_deref(), Some("/workspace/home"));
    assert_eq!(
        env["TF_DATA_DIR"].value.as_deref(),
        Some("/workspace/.terraform-data")
    );
    assert_eq!(
        (
            env["CAPTF_ERRORED_SUFFIX_BEFORE_TAG"].value.as_deref(),
            env["CAPTF_ERRORED_SUFFIX_AFTER_TAG"].value.as_deref()
        ),
        (Some("errored-2-"), Some(".web-1.tfm"))
    );
    assert_eq!(env["CAPTF_OPERATION"].value.as_deref(), Some("destroy"));
    assert_eq!(env["TF_INPUT"].value.as_deref(), Some("0"));

    let files = projected_files(
        &job,
        &attempt_secret(&Templates::embedded(), &request(&inputs)).unwrap(),
    );
    assert_eq!(files["runner.sh"], template::EMBEDDED_RUNNER);
    assert_eq!(
        files["module/main.tf"],
        "resource \"terraform_data\" \"vm\" {\n  input = var.name\n}\n"
    );
    assert!(files.contains_key("module/modules/net/main.tf"));
    assert_eq!(files["terraform.lock.hcl"], "# lock file\n");
    assert!(!files.contains_key("module-source"));
    let vars: serde_json::Value = serde_json::from_str(&files["terraform.tfvars.json"]).unwrap();
    assert_eq!(
        vars,
        json!({"name": "web-1", "replicas": 3, "quote": "a \"b\" ${c}"})
    );
    let backend = &files["backend.hcl"];
    assert!(backend.contains("namespace     = \"team-a\""), "{backend}");
    assert!(
        backend.contains("secret_suffix = \"web-1.tfm\""),
        "{backend}"
    );
    assert!(
        backend.contains("\"clusterctl.cluster.x-k8s.io/move\" = \"\""),
        "{backend}"
    );
    assert!(
        backend.contains("\"terraform.infrastructure.cluster.x-k8s.io/owner-uid\" = \"0a1b2c3d"),
        "{backend}"
    );
    // The errored state's backend: the same namespace, suffix and labels, and the label
    // that keeps cleanup off it.
    let errored = &files["errored-backend.hcl"];
    assert_eq!(
        errored.replace(
            "  \"terraform.infrastructure.cluster.x-k8s.io/errored-state\" = \"true\"\n",
            ""
        ),
        backend.replace("secret_suffix = \"web-1.tfm\"\n", ""),
        "the same settings but the suffix, which the runner adds: {errored}"
    );
    assert!(
        errored.contains(&format!("\"{}\" = \"true\"", names::LABEL_ERRORED_STATE)),
        "{errored}"
    );
}

#[test]
fn a_template_cannot_remove_the_safety_fields() {
    let hostile = r#"
apiVersion: batch/v1
kind: Job
metadata:
  name: other
  namespace: elsewhere
  labels:
    terraform.infrastructure.cluster.x-k8s.io/operation: apply
    team: blue
  ownerReferences:
    - apiVersion: infrastructure.cluster.x-k8s.io/v1alpha1
      kind: TerraformMachine
      name: web-1
      uid: abc
spec:
  backoffLimit: 6
  ttlSecondsAfterFinished: 60
  activeDeadlineSeconds: 5
  parallelism: 3
  suspend: true
  podReplacementPolicy: TerminatingOrFailed
  template:
    metadata:
      labels:
        job-name: fake
        terraform.infrastructure.cluster.x-k8s.io/attempt: "99"
      annotations:
        terraform.infrastructure.cluster.x-k8s.io/file-0: "echo pwned"
        keep: me
    spec:
      restartPolicy: OnFailure
      terminationGracePeriodSeconds: 5
      serviceAccountName: default
      hostname: fixed
      securityContext:
        runAsUser: 0
        runAsNonRoot: false
      volumes:
        - name: captf-workspace
          hostPath:
            path: /
      containers:
        - name: sidecar
          image: busybox
        - name: terraform
          image: evil
          args: ["-c", "true"]
          env:
            - name: HOME
              value: /root
            - name: HTTPS_PROXY
              value: http://proxy:3128
          securityContext:
            privileged: true
            readOnlyRootFilesystem: false
            capabilities:
              add: ["SYS_ADMIN"]
"#;
    let templates = Templates {
        job: hostile.to_string(),
        runner: "#!/bin/sh\n".to_string(),
        state_proxy_image: None,
    };
    let inputs = inline_inputs();
    let job = render(&templates, &request(&inputs)).unwrap();
    assert_eq!(
        job.metadata.name.as_deref(),
        Some("captf-web-1-tfm-destroy-2")
    );
    assert_eq!(job.metadata.namespace.as_deref(), Some(NS));
    assert!(job.metadata.owner_references.is_none());
    let labels = job.metadata.labels.as_ref().unwrap();
    assert_eq!(labels[names::LABEL_OPERATION], "destroy");
    assert_eq!(labels["team"], "blue");
    let spec = job.spec.as_ref().unwrap();
    assert_eq!(spec.backoff_limit, Some(0));
    assert_eq!(spec.ttl_seconds_after_finished, None);
    assert_eq!(spec.active_deadline_seconds, Some(1800));
    assert_eq!(spec.parallelism, Some(1));
    assert_eq!(spec.suspend, None);
    assert_eq!(spec.pod_replacement_policy.as_deref(), Some("Failed"));
    let meta = spec.template.metadata.as_ref().unwrap();
    let pod_labels = meta.labels.as_ref().unwrap();
    assert_eq!(pod_labels[names::LABEL_ATTEMPT], "2");
    assert!(!pod_labels.contains_key("job-name"));
    let annotations = meta.annotations.as_ref().unwrap();
    assert_eq!(annotations["keep"], "me");
    assert_eq!(annotations[&file_annotation(0)], "#!/bin/sh\n");
    let pod = spec.template.spec.as_ref().unwrap();
    assert_eq!(pod.restart_policy.as_deref(), Some("Never"));
    assert_eq!(
        pod.termination_grace_period_seconds,
        Some(MIN_GRACE_SECONDS)
    );
    assert_eq!(
        pod.service_account_name.as_deref(),
        Some(names::RUNNER_NAME)
    );
    // An object with a runner ServiceAccount of its own runs as that one, whatever the
    // template says.
    let own = names::object_runner_name(SUFFIX);
    let job = render(
        &templates,
        &JobRequest {
            service_account: &own,
            ..request(&inputs)
        },
    )
    .unwrap();
    let pod_spec = job.spec.as_ref().unwrap().template.spec.as_ref().unwrap();
    assert_eq!(
        pod_spec.service_account_name.as_deref(),
        Some("captf-runner-web-1.tfm")
    );
    assert_eq!(pod.hostname, None);
    let psc = pod.security_context.as_ref().unwrap();
    assert_eq!(
        (psc.run_as_user, psc.run_as_non_root),
        (Some(65532), Some(true)),
        "root becomes the runner user"
    );
    let ws: Vec<_> = pod
        .volumes
        .as_ref()
        .unwrap()
        .iter()
        .filter(|v| v.name == WORKSPACE_VOLUME)
        .collect();
    assert_eq!(ws.len(), 1);
    assert!(ws[0].host_path.is_none() && ws[0].empty_dir.is_some());
    assert_eq!(
        pod.containers[0].image.as_deref(),
        Some("busybox"),
        "other containers are the template's"
    );
    let c = container(&job);
    assert_eq!(c.image.as_deref(), Some("hashicorp/terraform:1.11.4"));
    assert_eq!(c.args, None);
    let sc = c.security_context.as_ref().unwrap();
    assert_eq!(
        (sc.privileged, sc.read_only_root_filesystem),
        (Some(false), Some(true))
    );
    assert_eq!(sc.capabilities.as_ref().unwrap().add, None);
    let env = c.env.as_ref().unwrap();
    assert_eq!(env.iter().filter(|e| e.name == "HOME").count(), 1);
    assert_eq!(
        env.iter()
            .find(|e| e.name == "HOME")
            .unwrap()
            .value
            .as_deref(),
        Some("/workspace/home")
    );
    assert!(env.iter().any(|e| e.name == "HTTPS_PROXY"));
}

#[test]
fn a_template_without_a_user_leaves_it_to_the_platform_and_never_runs_as_root() {
    // OpenShift assigns the user from the namespace's range: a template naming none gets
    // none, and the Pod still may not run as root.
    let job = Templates::embedded()
        .job
        .replace("        runAsUser: 65532\n", "")
        .replace("        runAsGroup: 65532\n", "")
        .replace("        fsGroup: 65532\n", "");
    let templates = Templates {
        job,
        runner: String::new(),
        state_proxy_image: None,
    };
    let inputs = inline_inputs();
    let job = render(&templates, &request(&inputs)).unwrap();
    let psc = pod_security(&job);
    assert_eq!(
        (
            psc.run_as_user,
            psc.run_as_group,
            psc.fs_group,
            psc.run_as_non_root
        ),
        (None, None, None, Some(true))
    );
    // The shipped template names the runner user.
    let job = render(&Templates::embedded(), &request(&inputs)).unwrap();
    let psc = pod_security(&job);
    assert_eq!(
        (psc.run_as_user, psc.run_as_group, psc.fs_group),
        (Some(65532), Some(65532), Some(65532))
    );
}

#[test]
fn a_disruption_is_not_a_failed_attempt() {
    let inputs = inline_inputs();
    let job = render(&Templates::embedded(), &request(&inputs)).unwrap();
    let spec = job.spec.unwrap();
    assert_eq!(
        (spec.backoff_limit, spec.pod_replacement_policy.as_deref()),
        (Some(0), Some("Failed"))
    );
    let policy = spec.pod_failure_policy.expect("a pod failure policy");
    assert_eq!(policy.rules.len(), 1);
    let rule = &policy.rules[0];
    assert_eq!(rule.action, "Ignore");
    let on = rule.on_pod_conditions.as_ref().expect("on pod conditions");
    assert_eq!(
        (on[0].type_.as_str(), on[0].status.as_str()),
        ("DisruptionTarget", "True")
    );
}

#[test]
fn a_longer_grace_period_in_the_template_is_kept() {
    let job = Templates::embedded().job.replace(
        "terminationGracePeriodSeconds: 300",
        "terminationGracePeriodSeconds: 900",
    );
    let templates = Templates {
        job,
        runner: String::new(),
        state_proxy_image: None,
    };
    let inputs = inline_inputs();
    let job = render(&templates, &request(&inputs)).unwrap();
    assert_eq!(
        job.spec
            .unwrap()
            .template
            .spec
            .unwrap()
            .termination_grace_period_seconds,
        Some(900)
    );
}

#[test]
fn a_too_large_inline_module_is_refused() {
    let mut inputs = inline_inputs();
    let Module::Files(files) = &mut inputs.module else {
        unreachable!()
    };
    files.insert("big.tf".into(), "#".repeat(SECRET_MAX_BYTES));
    let err = attempt_secret(&Templates::embedded(), &request(&inputs)).unwrap_err();
    assert!(matches!(err, RenderError::SecretTooLarge { .. }), "{err}");
}

#[test]
fn the_modules_files_are_in_the_attempts_secret_not_in_the_pods_annotations() {
    // Private module code (inline, or recorded from a source) is readable by whoever may
    // read Secrets, not by whoever may read Pods; and the Pods the manager caches stay
    // small whatever the module.
    let mut inputs = inline_inputs();
    let Module::Files(files) = &mut inputs.module else {
        unreachable!()
    };
    files.insert("private.tf".into(), "# the-secret-sauce-7a1e\n".into());
    files.insert("big.tf".into(), "#".repeat(ANNOTATIONS_MAX_BYTES));
    let req = request(&inputs);
    let (job, secret) = rendered(&Templates::embedded(), &req);
    let annotations = job
        .spec
        .as_ref()
        .unwrap()
        .template
        .metadata
        .as_ref()
        .unwrap()
        .annotations
        .clone()
        .unwrap();
    let size: usize = annotations.values().map(String::len).sum();
    assert!(size < 64 * 1024, "{size} bytes of annotations");
    let text = serde_json::to_string(&job).unwrap();
    assert!(!text.contains("the-secret-sauce-7a1e"));
    let files = projected_files(&job, &secret);
    assert!(files["module/private.tf"].contains("the-secret-sauce-7a1e"));
    assert!(files.contains_key("runner.sh") && files.contains_key("backend.hcl"));
}

#[test]
fn a_template_with_an_unknown_placeholder_is_refused() {
    let templates = Templates {
        job: Templates::embedded()
            .job
            .replace("{{ image }}", "{{ imag }}"),
        runner: String::new(),
        state_proxy_image: None,
    };
    let inputs = inline_inputs();
    let err = render(&templates, &request(&inputs)).unwrap_err();
    assert!(
        err.to_string().contains("unknown placeholder \"imag\""),
        "{err}"
    );
}

#[test]
fn a_source_module_renders_module_source_and_no_module_files() {
    let mut inputs = inline_inputs();
    inputs.module = Module::Source("git::https://example.com/infra.git//vm?ref=v1.4.0".into());
    inputs.lock_file = None;
    inputs.timeout_seconds = None;
    let mut req = request(&inputs);
    req.cluster_name = None;
    req.operation = names::OPERATION_APPLY;
    let (job, secret) = rendered(&Templates::embedded(), &req);
    let files = projected_files(&job, &secret);
    assert_eq!(
        files["module-source"],
        "git::https://example.com/infra.git//vm?ref=v1.4.0"
    );
    assert!(files.keys().all(|k| !k.starts_with("module/")));
    assert!(!files.contains_key("terraform.lock.hcl"));
    assert_eq!(
        job.metadata.name.as_deref(),
        Some("captf-web-1-tfm-apply-2")
    );
    assert!(
        !job.metadata
            .labels
            .as_ref()
            .unwrap()
            .contains_key(names::CAPI_CLUSTER_NAME_LABEL)
    );
    assert_eq!(job.spec.unwrap().active_deadline_seconds, Some(3600));
}

#[test]
fn module_files_that_clash_as_file_and_directory_are_refused() {
    let mut inputs = inline_inputs();
    let Module::Files(files) = &mut inputs.module else {
        unreachable!()
    };
    files.insert("modules".into(), "x".into());
    assert!(matches!(
        render(&Templates::embedded(), &request(&inputs)),
        Err(RenderError::BadFileName { .. })
    ));
}

#[test]
fn inputs_for_another_backend_are_refused() {
    let mut inputs = inline_inputs();
    inputs.backend.secret_suffix = "web-2.tfm".into();
    let err = render(&Templates::embedded(), &request(&inputs)).unwrap_err();
    assert!(matches!(err, RenderError::ForeignBackend { .. }), "{err}");
}

#[test]
fn an_identitys_credentials_come_from_the_attempts_secret_and_are_checked() {
    let inputs = inline_inputs();
    let identity = IdentityEnv {
        name: "team-a".into(),
        values: BTreeMap::from([
            (
                "CLOUD_TOKEN".to_string(),
                k8s_openapi::ByteString(b"AKIA".to_vec()),
            ),
            (
                "TF_VAR_region".to_string(),
                k8s_openapi::ByteString(b"eu-west-1".to_vec()),
            ),
        ]),
    };
    let req = JobRequest {
        credentials: Some(&identity),
        ..request(&inputs)
    };
    let templates = Templates::embedded();
    let job = render(&templates, &req).unwrap();
    let secret = attempt_secret(&templates, &req).unwrap();
    let container = &job
        .spec
        .as_ref()
        .unwrap()
        .template
        .spec
        .as_ref()
        .unwrap()
        .containers[0];
    let job_name = job.metadata.name.clone().unwrap();
    for (name, value) in [("CLOUD_TOKEN", "AKIA"), ("TF_VAR_region", "eu-west-1")] {
        let var = container
            .env
            .iter()
            .flatten()
            .find(|e| e.name == name)
            .unwrap_or_else(|| panic!("{name} in the runner's env"));
        assert_eq!(var.value, None, "never in the Pod's spec");
        let from = var
            .value_from
            .as_ref()
            .and_then(|v| v.secret_key_ref.as_ref())
            .expect("from a Secret");
        assert_eq!(from.name, job_name, "the attempt's own Secret");
        assert_eq!(
            secret.data.as_ref().unwrap()[&from.key].0,
            value.as_bytes(),
            "{name}"
        );
    }
    // Not projected into the render directory.
    let files = projected_files(&job, &secret);
    assert!(files.values().all(|v| !v.contains("AKIA")), "{files:?}");

    // A key that would change what Terraform or the runner does, that is no variable
    // name, or that the spec's env gives too: refused, naming the identity and the key.
    for (key, why) in [
        ("TF_WORKSPACE", "TF_*"),
        ("CAPTF_SUFFIX", "runner"),
        ("TF_VAR_name", "override"),
        ("1PASSWORD", "not a variable name"),
        ("aws-key", "not a variable name"),
        ("TOKEN", "spec's env"),
    ] {
        let mut inputs = inline_inputs();
        inputs.env.push(EnvFromSecret {
            name: "TOKEN".into(),
            secret_key_ref: SecretKeyRef {
                name: "s".into(),
                key: "k".into(),
            },
        });
        let bad = IdentityEnv {
            name: "team-a".into(),
            values: BTreeMap::from([(key.to_string(), k8s_openapi::ByteString(b"x".to_vec()))]),
        };
        let err = render(
            &templates,
            &JobRequest {
                credentials: Some(&bad),
                ..request(&inputs)
            },
        )
        .unwrap_err();
        let msg = err.to_string();
        assert!(
            matches!(err, RenderError::ForbiddenIdentityEnv { .. })
                && msg.contains("TerraformClusterIdentity team-a")
                && msg.contains(&format!("{key:?}"))
                && msg.contains(why),
            "{key}: {msg}"
        );
    }
}

#[test]
fn the_runners_environment_is_captfs() {
    // An inputs env entry that would change what Terraform or the runner does is refused,
    // naming the entry: the Job does not render, and the destroy cannot start.
    for name in [
        "TF_WORKSPACE",
        "TF_CLI_ARGS_destroy",
        "TF_VAR_name",
        "KUBE_CONFIG_PATH",
        "CAPTF_SUFFIX",
        "HOME",
        "CHECKPOINT_DISABLE",
    ] {
        let mut inputs = inline_inputs();
        inputs.env.push(EnvFromSecret {
            name: name.into(),
            secret_key_ref: SecretKeyRef {
                name: "s".into(),
                key: "k".into(),
            },
        });
        match render(&Templates::embedded(), &request(&inputs)) {
            Err(e @ RenderError::ForbiddenEnv { .. }) => {
                assert!(e.to_string().contains(&format!("{name:?}")), "{e}")
            }
            other => panic!("{name}: {other:?}"),
        }
    }
    // Credentials are fine, a registry token too, and a TF_VAR_ of a variable the inputs
    // do not set (a Terraform variable fed from a Secret).
    let mut inputs = inline_inputs();
    for name in ["TF_TOKEN_app_terraform_io", "TF_VAR_db_password"] {
        inputs.env.push(EnvFromSecret {
            name: name.into(),
            secret_key_ref: SecretKeyRef {
                name: "s".into(),
                key: "k".into(),
            },
        });
    }
    let job = render(&Templates::embedded(), &request(&inputs)).unwrap();
    let env = container(&job).env.clone().unwrap_or_default();
    let names: Vec<&str> = env.iter().map(|e| e.name.as_str()).collect();
    assert!(names.contains(&"TF_TOKEN_app_terraform_io"), "{names:?}");
    assert!(names.contains(&"TF_VAR_db_password"), "{names:?}");
    assert!(
        env.iter()
            .any(|e| e.name == "CHECKPOINT_DISABLE" && e.value.as_deref() == Some("1"))
    );
    // A template's own env of such a name is dropped; a proxy stays.
    let template = Templates::embedded().job.replace(
        "        - name: terraform\n",
        "        - name: terraform\n          env:\n            - name: TF_CLI_ARGS\n              value: -target=x\n            - name: KUBE_TOKEN\n              value: t\n            - name: HTTPS_PROXY\n              value: http://proxy:3128\n",
    );
    assert_ne!(
        template,
        Templates::embedded().job,
        "the template has an env list"
    );
    let templates = Templates {
        job: template,
        runner: "#!/bin/sh\n".to_string(),
        state_proxy_image: None,
    };
    let inputs = inline_inputs();
    let job = render(&templates, &request(&inputs)).unwrap();
    let names: Vec<String> = container(&job)
        .env
        .clone()
        .unwrap_or_default()
        .into_iter()
        .map(|e| e.name)
        .collect();
    assert!(names.contains(&"HTTPS_PROXY".to_string()), "{names:?}");
    assert!(
        !names
            .iter()
            .any(|n| n == "TF_CLI_ARGS" || n == "KUBE_TOKEN"),
        "{names:?}"
    );
}

#[test]
fn no_variable_value_is_in_the_job_only_in_the_attempts_secret() {
    let mut inputs = inline_inputs();
    inputs.variables.insert(
        "token".into(),
        serde_json::json!("tok-9f2c1e-from-a-secret"),
    );
    let req = request(&inputs);
    let (job, secret) = rendered(&Templates::embedded(), &req);
    let text = serde_json::to_string(&job).unwrap();
    assert!(!text.contains("tok-9f2c1e-from-a-secret"), "{text}");
    // The attempt's Secret holds them, is named as the Job and labelled as it.
    assert_eq!(secret.metadata.name, job.metadata.name);
    assert_eq!(secret.metadata.labels, job.metadata.labels);
    assert!(
        secret
            .data
            .as_ref()
            .unwrap()
            .values()
            .any(|v| String::from_utf8_lossy(&v.0).contains("tok-9f2c1e-from-a-secret"))
    );
    // And the runner finds them where it always did.
    let files = projected_files(&job, &secret);
    assert!(files["terraform.tfvars.json"].contains("tok-9f2c1e-from-a-secret"));
}

#[test]
fn the_contract_variables_are_a_file_of_their_own_only_when_there_are_any() {
    let mut inputs = inline_inputs();
    let (job, secret) = rendered(&Templates::embedded(), &request(&inputs));
    // Without them the Secret has no such key, and the projection names none (a key the
    // Secret lacks would keep the Pod from starting).
    assert!(
        !secret.data.as_ref().unwrap().contains_key(FILE_CONTRACT),
        "{secret:?}"
    );
    assert!(!projected_files(&job, &secret).contains_key(FILE_CONTRACT));

    inputs.contract_variables.insert(
        "captf_bootstrap_data".into(),
        serde_json::json!("I2Nsb3VkLWNvbmZpZw=="),
    );
    let (job, secret) = rendered(&Templates::embedded(), &request(&inputs));
    let text = serde_json::to_string(&job).unwrap();
    assert!(
        !text.contains("I2Nsb3VkLWNvbmZpZw=="),
        "only in the Secret: {text}"
    );
    let files = projected_files(&job, &secret);
    let contract: serde_json::Value = serde_json::from_str(&files[FILE_CONTRACT]).unwrap();
    assert_eq!(contract["captf_bootstrap_data"], "I2Nsb3VkLWNvbmZpZw==");
    let vars: serde_json::Value = serde_json::from_str(&files[FILE_VARIABLES]).unwrap();
    assert!(vars.get("captf_bootstrap_data").is_none(), "{vars}");
}

#[test]
fn a_recorded_image_digest_is_the_image_the_job_runs() {
    let mut inputs = inline_inputs();
    let digest = format!("docker.io/hashicorp/terraform@sha256:{}", "0f".repeat(32));
    inputs.ran = Some(crate::inputs::Ran {
        image_digest: Some(digest.clone()),
        ..Default::default()
    });
    let (job, _) = rendered(&Templates::embedded(), &request(&inputs));
    assert_eq!(container(&job).image.as_deref(), Some(digest.as_str()));
}

/// With `--state-proxy-image`, the Pod's token is mounted in the state proxy only: a
/// native sidecar serving the attempt's object, the runner told where its port is, and no
/// token the API server would mount in every container.
#[test]
fn the_state_proxy_alone_holds_the_pods_token() {
    use super::sidecar::{PORT_FILE_ENV, PROXY_CONTAINER, PROXY_DIR, TOKEN_DIR, TOKEN_VOLUME};
    let inputs = inline_inputs();
    let plain = render(&Templates::embedded(), &request(&inputs)).unwrap();
    let pod = plain.spec.as_ref().unwrap().template.spec.as_ref().unwrap();
    assert_eq!(pod.automount_service_account_token, Some(true));
    assert!(pod.init_containers.is_none());

    let embedded = Templates::embedded();
    let templates = Templates {
        state_proxy_image: Some("registry.example/captf:v0.1.0".into()),
        // A template that runs the runner on the host's network: the proxy's loopback
        // would be the node's.
        job: embedded.job.replace(
            "      enableServiceLinks: false\n",
            "      enableServiceLinks: false\n      hostNetwork: true\n",
        ),
        ..embedded
    };
    assert!(templates.job.contains("hostNetwork: true"));
    let job = render(&templates, &request(&inputs)).unwrap();
    let pod = job.spec.as_ref().unwrap().template.spec.as_ref().unwrap();
    assert_eq!(pod.automount_service_account_token, Some(false));
    assert_eq!(pod.host_network, None);
    let inits = pod.init_containers.as_ref().unwrap();
    assert_eq!(inits.len(), 1);
    let proxy = &inits[0];
    assert_eq!(proxy.name, PROXY_CONTAINER);
    assert_eq!(proxy.restart_policy.as_deref(), Some("Always"));
    assert_eq!(
        proxy.image.as_deref(),
        Some("registry.example/captf:v0.1.0")
    );
    assert_eq!(proxy.command, None, "the image's entrypoint (captf) runs");
    assert_eq!(
        proxy.args.as_deref().unwrap(),
        [
            "state-proxy",
            "--namespace",
            NS,
            "--suffix",
            SUFFIX,
            "--port-file",
            &format!("{PROXY_DIR}/port"),
        ]
    );
    let sc = proxy.security_context.as_ref().unwrap();
    assert_eq!(sc.read_only_root_filesystem, Some(true));
    assert_eq!(sc.allow_privilege_escalation, Some(false));
    // The token: a projected volume, mounted where in-cluster configuration reads it, in
    // the proxy and nowhere else.
    let token = pod
        .volumes
        .as_ref()
        .unwrap()
        .iter()
        .find(|v| v.name == TOKEN_VOLUME)
        .unwrap();
    let sources = token.projected.as_ref().unwrap().sources.as_ref().unwrap();
    assert!(sources.iter().any(|s| s.service_account_token.is_some()));
    let mounts_token = |c: &Container| {
        c.volume_mounts
            .iter()
            .flatten()
            .any(|m| m.name == TOKEN_VOLUME || m.mount_path.starts_with(TOKEN_DIR))
    };
    assert!(mounts_token(proxy));
    assert!(pod.containers.iter().all(|c| !mounts_token(c)));
    let runner = container(&job);
    assert!(runner.env.iter().flatten().any(
        |e| e.name == PORT_FILE_ENV && e.value.as_deref() == Some(&format!("{PROXY_DIR}/port"))
    ));
    assert!(
        runner
            .volume_mounts
            .iter()
            .flatten()
            .any(|m| m.mount_path == PROXY_DIR && m.read_only == Some(true))
    );
    // What the template gives otherwise stays: the runner's own settings are the same.
    assert_eq!(runner.command, container(&plain).command);
    assert_eq!(
        pod.service_account_name,
        Some(crate::api::names::RUNNER_NAME.into())
    );
}
