//! The errored states: what Terraform could not save, kept by a runner, read back.

use k8s_openapi::api::core::v1::Secret;

use super::{StateSecrets, instances};
use crate::api::names::{
    LABEL_ERRORED_STATE, LEGACY_ERRORED_KEY, TF_LABEL_SUFFIX, errored_secret_name,
    is_errored_suffix_of, state_secret_name,
};

/// A state Terraform could not save (`errored.tfstate`), as a runner kept it: a record of
/// resources that may not be in the state.
#[derive(Debug, Clone, PartialEq)]
pub enum Errored {
    /// Pushed by the runner through Terraform's backend as the state of a suffix of its
    /// own (gzip, chunked, labelled [`LABEL_ERRORED_STATE`]).
    Pushed(StateSecrets),
    /// Saved by an older runner as plain JSON in `captf-errored-<suffix>` (key
    /// [`LEGACY_ERRORED_KEY`]; None = the key is missing).
    Legacy { name: String, json: Option<Vec<u8>> },
}

impl Errored {
    /// The name of its (base) Secret.
    pub fn name(&self) -> &str {
        match self {
            Errored::Pushed(s) => &s.base_name,
            Errored::Legacy { name, .. } => name,
        }
    }

    /// Its managed resource instances; an error says why they cannot be told.
    pub fn instances(&self, cap: u64) -> Result<instances::Instances, String> {
        match self {
            Errored::Pushed(s) => s.instances(cap),
            Errored::Legacy { json: Some(j), .. } => instances::read(&j[..], false, cap),
            Errored::Legacy { name, json: None } => {
                Err(format!("Secret {name} has no key {LEGACY_ERRORED_KEY}"))
            }
        }
    }

    /// The errored states of the object of `suffix` among `secrets`: the older runner's
    /// `captf-errored-<suffix>`, and each state of a Secret labelled as an errored state
    /// whose backend suffix is one of this object's ([`is_errored_suffix_of`]), with its
    /// parts, in name order. Another object's errored states are passed over, whichever
    /// Secrets are given (a dump of a whole namespace, say).
    pub fn find(suffix: &str, secrets: &[Secret]) -> Vec<Errored> {
        let legacy = errored_secret_name(suffix);
        let mut suffixes = std::collections::BTreeSet::new();
        let mut out = Vec::new();
        for s in secrets {
            if s.metadata.name.as_deref() == Some(legacy.as_str()) {
                out.push(Errored::Legacy {
                    name: legacy.clone(),
                    json: s
                        .data
                        .as_ref()
                        .and_then(|d| d.get(LEGACY_ERRORED_KEY))
                        .map(|v| v.0.clone()),
                });
            } else if let Some(labels) = s.metadata.labels.as_ref()
                && labels.contains_key(LABEL_ERRORED_STATE)
                && let Some(e) = labels.get(TF_LABEL_SUFFIX)
                && is_errored_suffix_of(e, suffix)
            {
                suffixes.insert(e.clone());
            }
        }
        for e in suffixes {
            let base = state_secret_name(&e);
            out.push(Errored::Pushed(StateSecrets::from_secrets(&base, secrets)));
        }
        out.sort_by(|a, b| a.name().cmp(b.name()));
        out
    }
}
