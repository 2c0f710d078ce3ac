//! The runner's backend settings: `backend.hcl` for the state, `errored-backend.hcl` for
//! an errored state, and the labels both put on the Secrets they write.

use std::collections::BTreeMap;

use super::JobRequest;
use crate::api::names;

/// Quotes a string for HCL (JSON escaping, plus HCL's template sequences).
pub(super) fn hcl_string(s: &str) -> String {
    serde_json::to_string(s)
        .expect("a string serializes")
        .replace("${", "$${")
        .replace("%{", "%%{")
}

/// The labels the runner's backend puts on the state Secrets and on an errored state's:
/// the owner labels and the move label. Terraform's backend also
/// selects the state's Secrets by these labels, so a state Secret lacking one of them
/// reads as no state: the controller adds them before an attempt.
pub fn secret_labels(req: &JobRequest) -> BTreeMap<String, String> {
    req.identity().moved_labels()
}

/// `backend.hcl`: the backend's namespace and suffix, set explicitly (the backend does not
/// default to the Pod's namespace), and its `labels`. The runner appends
/// `in_cluster_config = true` unless it runs with a kubeconfig.
pub(super) fn backend_hcl(req: &JobRequest) -> String {
    backend_settings(
        req,
        Some(&req.inputs.backend.secret_suffix),
        secret_labels(req),
    )
}

/// `errored-backend.hcl`: the namespace and labels of [`backend_hcl`] and the errored-state
/// label (cleanup never deletes a Secret with it), for the state the runner pushes an
/// `errored.tfstate` into; the runner appends its `secret_suffix` (see
/// [`names::errored_suffix_around_tag`]).
pub(super) fn errored_backend_hcl(req: &JobRequest) -> String {
    let mut labels = secret_labels(req);
    labels.insert(names::LABEL_ERRORED_STATE.to_string(), "true".to_string());
    backend_settings(req, None, labels)
}

fn backend_settings(
    req: &JobRequest,
    suffix: Option<&str>,
    labels: BTreeMap<String, String>,
) -> String {
    let b = &req.inputs.backend;
    let mut out = format!("namespace     = {}\n", hcl_string(&b.namespace));
    if let Some(suffix) = suffix {
        out.push_str(&format!("secret_suffix = {}\n", hcl_string(suffix)));
    }
    out.push_str("labels = {\n");
    for (k, v) in labels {
        out.push_str(&format!("  {} = {}\n", hcl_string(&k), hcl_string(&v)));
    }
    out.push_str("}\n");
    out
}
