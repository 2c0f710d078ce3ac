//! `captf state inspect`: a state read from Secret files (as `kubectl get -o yaml` writes
//! them), offline, and classified as the manager would.

use std::path::{Path, PathBuf};

use k8s_openapi::api::core::v1::Secret;

use super::ToolError;
use crate::api::names::{self, SecretRole};
use crate::api::object::AnyObject;
use crate::explain::{inventory::Inventory, load};
use crate::state::{self, Fingerprint, StateSecrets, Verdict};

fn refused(e: impl std::fmt::Display) -> ToolError {
    ToolError::Refused(e.to_string())
}

/// Reads the state the Secrets in `secret_files` hold (the state Secret and its parts, or
/// the backup's, or an errored state's) and classifies it against the fingerprint the
/// object in `object` records, if given.
pub fn inspect(secret_files: &[PathBuf], object: Option<&Path>) -> Result<Verdict, ToolError> {
    let mut secrets: Vec<(String, Secret)> = Vec::new();
    for loaded in load::load_paths(secret_files).map_err(refused)? {
        let kind = loaded.value["kind"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        let name = loaded.value["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        if kind != "Secret" {
            return Err(ToolError::Refused(format!(
                "{}: {kind} {name} is not a Secret; --secret-file takes the state Secret and its part Secrets",
                loaded.source
            )));
        }
        let secret: Secret = serde_json::from_value(loaded.value).map_err(|e| {
            ToolError::Refused(format!(
                "{}: Secret {name} is not a valid Secret: {e}",
                loaded.source
            ))
        })?;
        secrets.push((loaded.source, secret));
    }
    let object = match object {
        Some(path) => Some((path, load_object(path)?)),
        None => None,
    };
    let base_name = match &object {
        Some((_, o)) => names::state_secret_name(&names::state_suffix(
            o.kind(),
            o.meta().name.as_deref().unwrap_or_default(),
        )),
        None => base_of(&secrets)?,
    };
    let annotations = object
        .as_ref()
        .and_then(|(_, o)| o.meta().annotations.clone())
        .unwrap_or_default();
    let recorded = Fingerprint::from_annotations(&annotations).map_err(|e| {
        ToolError::Refused(format!(
            "{}: {e}",
            object
                .as_ref()
                .map(|(p, _)| p.display().to_string())
                .unwrap_or_default()
        ))
    })?;
    let interrupted = annotations.contains_key(names::APPLY_INTERRUPTED);
    let only: Vec<Secret> = secrets.into_iter().map(|(_, s)| s).collect();
    let (content, stale_parts) = state::read_noting(
        &StateSecrets::from_secrets(&base_name, &only),
        state::DEFAULT_DECOMPRESSION_CAP,
    );
    let mut verdict = state::classify_named(&base_name, &content, recorded.as_ref(), interrupted);
    if let Some(note) = stale_parts.filter(|_| verdict.readable) {
        verdict.message = format!("{}; {note}", verdict.message);
    }
    Ok(verdict)
}

/// The one state the given Secrets belong to: every name is the base or `<base>-part-N`.
fn base_of(secrets: &[(String, Secret)]) -> Result<String, ToolError> {
    let mut bases: Vec<String> = Vec::new();
    for (source, s) in secrets {
        let name = s.metadata.name.clone().unwrap_or_default();
        let role = names::parse_secret_name(&name).map(|n| n.role);
        let labelled = s
            .metadata
            .labels
            .as_ref()
            .is_some_and(|l| l.contains_key(names::TF_LABEL_STATE));
        let a_state = matches!(
            role,
            Some(
                SecretRole::State
                    | SecretRole::Backup
                    | SecretRole::Errored
                    | SecretRole::AbandonedState
                    | SecretRole::AbandonedBackup
            )
        );
        if !a_state && !labelled {
            return Err(ToolError::Refused(format!(
                "{source}: Secret {name} is not a Terraform state Secret (no tfstate label, and its name does not start with tfstate-); give the state Secret tfstate-default-<suffix> and its parts"
            )));
        }
        let base = match names::split_part(&name) {
            Some((b, _)) => b.to_string(),
            None => name,
        };
        if !bases.contains(&base) {
            bases.push(base);
        }
    }
    match bases.as_slice() {
        [one] => Ok(one.clone()),
        [] => Err(ToolError::Refused("no Secret given".into())),
        many => Err(ToolError::Refused(format!(
            "the Secrets belong to {} different states ({}); give the Secrets of one state, or --object to pick one",
            many.len(),
            many.join(", ")
        ))),
    }
}

/// Reads exactly one CAPTF object from a file.
fn load_object(path: &std::path::Path) -> Result<AnyObject, ToolError> {
    let loaded = load::load_file(path).map_err(refused)?;
    let inv = Inventory::from_loaded(loaded).map_err(refused)?;
    let mut objects = inv.objects.into_iter();
    match (objects.next(), objects.next()) {
        (Some((_, o)), None) => Ok(o),
        (None, _) => Err(ToolError::Refused(format!(
            "{}: no TerraformCluster, TerraformMachine or TerraformMachinePool in this file",
            path.display()
        ))),
        (Some(_), Some(_)) => Err(ToolError::Refused(format!(
            "{}: more than one CAPTF object; --object takes one",
            path.display()
        ))),
    }
}
