//! The runner container's environment: what code sets (reserved), what the inputs and the
//! template may add, and why a name is refused.

use k8s_openapi::api::core::v1::{EnvVar, EnvVarSource, SecretKeySelector};

use super::layout::{RENDER_DIR, WORKSPACE_DIR};
use super::{JobRequest, RenderError};
use crate::api::names;

/// Environment variables the runner's container gets from code; an inputs `env` entry or a
/// template env var of one of these names is dropped.
pub const RESERVED_ENV: &[&str] = &[
    "HOME",
    "TF_DATA_DIR",
    "TMPDIR",
    "TF_IN_AUTOMATION",
    "TF_INPUT",
    "CAPTF_RENDER_DIR",
    "CAPTF_WORKSPACE",
    "CAPTF_NAMESPACE",
    "CAPTF_SUFFIX",
    "CAPTF_OPERATION",
    "CAPTF_ERRORED_SUFFIX_BEFORE_TAG",
    "CAPTF_ERRORED_SUFFIX_AFTER_TAG",
    "CAPTF_JOB_NAME",
    "CAPTF_RUNTIME",
    "CAPTF_PLUGIN_DIR",
    "CAPTF_PLAN_GUARD",
    "CAPTF_PLAN_APPROVED",
    "CAPTF_STATE_PROXY_PORT_FILE",
    "CHECKPOINT_DISABLE",
];

/// Why an environment variable of this name may not come from the inputs or a template:
/// it would change what Terraform or the runner does (`TF_WORKSPACE`, `TF_CLI_ARGS_*`,
/// `KUBE_CONFIG_PATH` for the backend, a `TF_VAR_` that overrides a recorded variable).
/// Credentials are fine, and so are `TF_TOKEN_*` (registry tokens) and a `TF_VAR_` of a
/// variable the inputs do not set (a Terraform variable fed from a Secret).
pub fn env_refusal(
    name: &str,
    variables: &serde_json::Map<String, serde_json::Value>,
) -> Option<&'static str> {
    if RESERVED_ENV.contains(&name) {
        return Some("the runner sets it");
    }
    if name.starts_with("TF_TOKEN_") {
        return None;
    }
    if let Some(var) = name.strip_prefix("TF_VAR_") {
        return variables
            .contains_key(var)
            .then_some("it would override a variable the inputs record");
    }
    if name.starts_with("TF_") {
        return Some("TF_* variables change what Terraform does");
    }
    if name.starts_with("KUBE_") {
        return Some("KUBE_* variables change Terraform's kubernetes backend");
    }
    if name.starts_with("CAPTF_") {
        return Some("CAPTF_* variables are the runner's");
    }
    None
}

/// Whether `name` can be an environment variable the runner's shell reads: letters,
/// digits and `_`, not starting with a digit.
fn is_env_name(name: &str) -> bool {
    let mut bytes = name.bytes();
    bytes
        .next()
        .is_some_and(|b| b.is_ascii_alphabetic() || b == b'_')
        && bytes.all(|b| b.is_ascii_alphanumeric() || b == b'_')
}

/// The container's env: the template's own (proxies, …), the credentials from the inputs
/// (by Secret name and key), then the runner's settings. Reserved names come from code only.
pub(super) fn env(template: Vec<EnvVar>, req: &JobRequest) -> Result<Vec<EnvVar>, RenderError> {
    let variables = &req.inputs.variables;
    if let Some((name, why)) = req
        .inputs
        .env
        .iter()
        .find_map(|e| env_refusal(&e.name, variables).map(|why| (e.name.clone(), why)))
    {
        return Err(RenderError::ForbiddenEnv { name, why });
    }
    let from_inputs: Vec<&str> = req.inputs.env.iter().map(|e| e.name.as_str()).collect();
    let mut out: Vec<EnvVar> = template
        .into_iter()
        .filter(|e| {
            env_refusal(&e.name, variables).is_none() && !from_inputs.contains(&e.name.as_str())
        })
        .collect();
    if let Some(identity) = req.credentials {
        let job_name = names::job_name(req.suffix, req.operation, req.attempt);
        for name in identity.values.keys() {
            let refused = |why| RenderError::ForbiddenIdentityEnv {
                identity: identity.name.clone(),
                name: name.clone(),
                why,
            };
            if !is_env_name(name) {
                return Err(refused(
                    "not a variable name (letters, digits and _, not starting with a digit)",
                ));
            }
            if let Some(why) = env_refusal(name, variables) {
                return Err(refused(why));
            }
            if from_inputs.contains(&name.as_str()) {
                return Err(refused(
                    "the spec's env gives it too (remove it from one of them)",
                ));
            }
            out.retain(|o| &o.name != name);
            out.push(EnvVar {
                name: name.clone(),
                value: None,
                value_from: Some(EnvVarSource {
                    secret_key_ref: Some(SecretKeySelector {
                        name: job_name.clone(),
                        key: super::identity_key(name),
                        optional: Some(false),
                    }),
                    ..Default::default()
                }),
            });
        }
    }
    for e in &req.inputs.env {
        if out.iter().any(|o| o.name == e.name) {
            continue;
        }
        out.push(EnvVar {
            name: e.name.clone(),
            value: None,
            value_from: Some(EnvVarSource {
                secret_key_ref: Some(SecretKeySelector {
                    name: e.secret_key_ref.name.clone(),
                    key: e.secret_key_ref.key.clone(),
                    optional: Some(false),
                }),
                ..Default::default()
            }),
        });
    }
    let plain = |name: &str, value: String| EnvVar {
        name: name.to_string(),
        value: Some(value),
        value_from: None,
    };
    let (errored_before, errored_after) = names::errored_suffix_around_tag(req.suffix, req.attempt);
    out.extend([
        plain("HOME", format!("{WORKSPACE_DIR}/home")),
        plain("TF_DATA_DIR", format!("{WORKSPACE_DIR}/.terraform-data")),
        plain("TMPDIR", format!("{WORKSPACE_DIR}/tmp")),
        plain("TF_IN_AUTOMATION", "1".to_string()),
        plain("TF_INPUT", "0".to_string()),
        plain("CAPTF_RENDER_DIR", RENDER_DIR.to_string()),
        plain("CAPTF_WORKSPACE", WORKSPACE_DIR.to_string()),
        plain("CAPTF_NAMESPACE", req.namespace.to_string()),
        plain("CAPTF_SUFFIX", req.suffix.to_string()),
        plain("CAPTF_OPERATION", req.operation.to_string()),
        plain("CAPTF_ERRORED_SUFFIX_BEFORE_TAG", errored_before),
        plain("CAPTF_ERRORED_SUFFIX_AFTER_TAG", errored_after),
        plain(
            "CAPTF_JOB_NAME",
            names::job_name(req.suffix, req.operation, req.attempt),
        ),
        plain("CHECKPOINT_DISABLE", "1".to_string()),
    ]);
    if let Some(runtime) = req.inputs.runner.runtime {
        out.push(plain("CAPTF_RUNTIME", runtime.command().to_string()));
    }
    if let Some(dir) = &req.inputs.runner.plugin_dir {
        out.push(plain("CAPTF_PLUGIN_DIR", dir.clone()));
    }
    if req.plan_guard.on && req.operation == names::OPERATION_APPLY {
        out.push(plain("CAPTF_PLAN_GUARD", "1".to_string()));
        if let Some(hash) = req.plan_guard.approved {
            out.push(plain("CAPTF_PLAN_APPROVED", hash.trim().to_string()));
        }
    }
    Ok(out)
}
