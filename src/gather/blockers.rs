//! What keeps a destroy from starting, and the inputs a destroy renders from.

use k8s_openapi::api::core::v1::Secret;

use crate::api::VariablesSourceKind;
use crate::api::names::{self, Kind};
use crate::inputs::{self, Inputs};
use crate::rules::Blocker;

use super::{Findings, Observed, annotation, lock_blocker};

pub(super) fn blocker(
    o: &Observed,
    suffix: &str,
    namespace: &str,
    errored: Option<&str>,
    findings: &mut Findings,
) -> Option<Blocker> {
    if !o.owners_gone.is_empty() && !super::destroy_without_owner(&o.meta) {
        return Some(Blocker::OwnerGone(o.owners_gone.join("; ")));
    }
    if let Some(what) = errored {
        return Some(Blocker::ErroredState(what.to_string()));
    }
    if o.namespace_terminating {
        return Some(Blocker::NamespaceTerminating(namespace.to_string()));
    }
    let inputs = match usable_inputs(o, suffix, namespace) {
        Ok(i) => i,
        Err(message) => return Some(Blocker::Inputs(message)),
    };
    let missing =
        missing_credentials(o, &inputs).map(|(secret, key)| Blocker::Credentials { secret, key });
    findings.inputs = Some(inputs);
    missing.or_else(|| lock_blocker(o, suffix, findings))
}

/// The inputs the object's current spec builds to, its `variablesFrom` read from the
/// ConfigMaps and Secrets the pass read.
pub(super) fn spec_inputs(
    o: &Observed,
    namespace: &str,
    suffix: &str,
) -> Result<Inputs, inputs::InputsError> {
    let lookup = |kind: VariablesSourceKind, name: &str, key: &str| -> Option<Vec<u8>> {
        match kind {
            VariablesSourceKind::ConfigMap => {
                let cm = o.referenced_config_maps.get(name)?;
                cm.data
                    .as_ref()
                    .and_then(|d| d.get(key))
                    .map(|v| v.as_bytes().to_vec())
            }
            VariablesSourceKind::Secret => {
                let s = o.referenced_secrets.get(name)?;
                s.data
                    .as_ref()
                    .and_then(|d| d.get(key))
                    .map(|v| v.0.clone())
            }
        }
    };
    inputs::build_from_spec(&o.spec, namespace, suffix, &lookup)
}

/// The first credentials Secret or key of `inputs` the pass did not find.
pub(super) fn missing_credentials(o: &Observed, inputs: &Inputs) -> Option<(String, String)> {
    inputs
        .env
        .iter()
        .map(|e| &e.secret_key_ref)
        .find(|r| {
            !o.referenced_secrets
                .get(&r.name)
                .is_some_and(|s| has_key(s, &r.key))
        })
        .map(|r| (r.name.clone(), r.key.clone()))
}

pub(super) fn has_key(secret: &Secret, key: &str) -> bool {
    secret.data.as_ref().is_some_and(|d| d.contains_key(key))
        || secret
            .string_data
            .as_ref()
            .is_some_and(|d| d.contains_key(key))
}

/// The inputs a destroy renders from: the inputs Secret, or for a cluster or pool without
/// one, the current spec when every reference resolves and the result hashes to the
/// recorded `inputs-sha256`.
pub(super) fn usable_inputs(o: &Observed, suffix: &str, namespace: &str) -> Result<Inputs, String> {
    let secret_name = names::inputs_secret_name(suffix);
    if let Some(secret) = &o.inputs_secret {
        return inputs::from_secret(secret, namespace, suffix)
            .map_err(|e| format!("the inputs Secret {secret_name} is unusable: {e}; restore it from a backup of the apply"));
    }
    if o.kind == Kind::TerraformMachine {
        return Err(format!(
            "the inputs Secret {secret_name} is missing, and a TerraformMachine never rebuilds its inputs at deletion (its bootstrap data is gone by then); restore the Secret"
        ));
    }
    let rebuilt = spec_inputs(o, namespace, suffix).map_err(|e| {
        format!("the inputs Secret {secret_name} is missing and the inputs cannot be rebuilt from the current spec: {e}")
    })?;
    let recorded = annotation(&o.meta, names::INPUTS_SHA256);
    if !inputs::rebuilt_matches(&rebuilt, recorded) {
        return Err(format!(
            "the inputs Secret {secret_name} is missing and the inputs rebuilt from the current spec do not hash to the recorded {} (the spec or a referenced object changed since the apply, and Terraform would forget what it created); restore the inputs Secret",
            names::INPUTS_SHA256
        ));
    }
    Ok(rebuilt)
}
