//! Reading a Terraform state from its Secret(s) in the kubernetes-backend format: joining
//! part Secrets, streaming gunzip under a decompression cap, and classifying the result
//! (SPEC section 4, "State readability").
//!
//! The state is never built in memory: [`read`] streams the base and part values through
//! gunzip into a scanner that keeps only what the rule table needs (lineage, serial and
//! whether managed resource instances exist).

mod classify;
mod errored;
pub mod instances;
pub mod lock;
pub mod permits;
mod read;
mod scan;
pub mod secrets;

use std::collections::BTreeMap;
use std::io::{self, Read};

use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use crate::api::names::{
    TF_CHUNK_SIZE, TF_LABEL_SUFFIX, TF_STATE_KEY, part_index, part_secret_name,
};

pub use classify::{Fingerprint, StateReason, Verdict, classify, classify_named};
pub use errored::Errored;
use read::{Chain, gzip_member_end, live_chunks};
pub use read::{outputs, read, read_bytes, read_noting};
use scan::{Field, GzipFailure, Scanned, Summary};

/// Default decompression cap: more decompressed JSON than this is a corrupt state.
pub const DEFAULT_DECOMPRESSION_CAP: u64 = 256 * 1024 * 1024;

/// The Secrets of one state (or of a backup, which has the same chunking): the base and
/// its parts.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct StateSecrets {
    pub base_name: String,
    /// Value of key `tfstate` of the base Secret; None = key missing (or no base Secret).
    pub base: Option<Vec<u8>>,
    /// Whether the base Secret exists.
    pub base_present: bool,
    /// Part N → value of its key `tfstate` (None = key missing).
    pub parts: BTreeMap<u32, Option<Vec<u8>>>,
    /// The other Secrets that were looked at and carry this state's `tfstateSecretSuffix`
    /// label: name → labels. Terraform's backend selects the state by labels, not by
    /// name, so one of these with the full set of its labels is read by Terraform as a
    /// part of this state (see [`StateSecrets::strangers`]).
    pub labelled_others: BTreeMap<String, BTreeMap<String, String>>,
    /// The metadata of the base and its parts, by name (for their protection finalizer).
    pub metas: BTreeMap<String, k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta>,
}

fn state_value(secret: &Secret) -> Option<Vec<u8>> {
    secret
        .data
        .as_ref()
        .and_then(|d| d.get(TF_STATE_KEY))
        .map(|v| v.0.clone())
}

impl StateSecrets {
    /// Picks the base Secret (named `base_name`) and its `-part-N` Secrets out of any set
    /// of Secrets (others ignored).
    pub fn from_secrets(base_name: &str, secrets: &[Secret]) -> StateSecrets {
        let mut out = StateSecrets::empty(base_name);
        for secret in secrets {
            out.add(&secret.metadata, || state_value(secret));
        }
        out
    }

    /// [`StateSecrets::from_secrets`], taking the Secrets: their values move, so a state
    /// read is in memory once, not twice.
    pub fn from_owned(base_name: &str, secrets: Vec<Secret>) -> StateSecrets {
        let mut out = StateSecrets::empty(base_name);
        for mut secret in secrets {
            let value = secret
                .data
                .as_mut()
                .and_then(|d| d.remove(TF_STATE_KEY))
                .map(|v| v.0);
            out.add(&secret.metadata, || value);
        }
        out
    }

    fn empty(base_name: &str) -> StateSecrets {
        StateSecrets {
            base_name: base_name.to_string(),
            ..StateSecrets::default()
        }
    }

    /// Takes in one Secret: the base, a part, or another with this state's suffix label.
    fn add(&mut self, meta: &ObjectMeta, value: impl FnOnce() -> Option<Vec<u8>>) {
        let Some(name) = meta.name.as_deref() else {
            return;
        };
        let suffix = self
            .base_name
            .strip_prefix(&format!("tfstate-{}-", crate::api::names::TF_WORKSPACE));
        if name == self.base_name {
            self.base_present = true;
            self.base = value();
            self.metas.insert(name.to_string(), meta.clone());
        } else if let Some(n) = part_index(&self.base_name, name) {
            self.parts.insert(n, value());
            self.metas.insert(name.to_string(), meta.clone());
        } else if let Some(labels) = &meta.labels
            && suffix.is_some()
            && labels.get(TF_LABEL_SUFFIX).map(String::as_str) == suffix
        {
            self.labelled_others
                .insert(name.to_string(), labels.clone());
        }
    }

    /// The Secrets, other than the base and its parts, that Terraform's backend would
    /// select with `selector` (its own labels and its configured ones): it reads them as
    /// chunks of this state, so Terraform and CAPTF would not read the same state.
    pub fn strangers(&self, selector: &BTreeMap<String, String>) -> Vec<String> {
        self.labelled_others
            .iter()
            .filter(|(_, labels)| selector.iter().all(|(k, v)| labels.get(k) == Some(v)))
            .map(|(name, _)| name.clone())
            .collect()
    }

    /// The first problem with the set of Secrets before any byte is read, as the message
    /// of a corrupt state (None = the chunks are all there).
    fn structural_problem(&self) -> Option<String> {
        let base = &self.base_name;
        let fix = "restore the state (see runbooks/StateCorrupt.md)";
        match &self.base {
            None => {
                return Some(format!(
                    "state Secret {base} has no key {TF_STATE_KEY}: {fix}"
                ));
            }
            Some(v) if v.is_empty() => {
                return Some(format!(
                    "state Secret {base} has an empty key {TF_STATE_KEY}: {fix}"
                ));
            }
            Some(_) => {}
        }
        let last = self.parts.keys().next_back().copied().unwrap_or(0);
        for n in 1..=last {
            match self.parts.get(&n) {
                None => {
                    let have: Vec<u32> = self.parts.keys().copied().collect();
                    let have = if have.len() == 1 {
                        format!("part {}", have[0])
                    } else {
                        format!("parts {}", list(&have))
                    };
                    return Some(format!(
                        "state Secret {} is missing: the state has {have}; {fix}",
                        part_secret_name(base, n)
                    ));
                }
                Some(None) => {
                    return Some(format!(
                        "state Secret {} has no key {TF_STATE_KEY}: {fix}",
                        part_secret_name(base, n)
                    ));
                }
                Some(Some(_)) => {}
            }
        }
        None
    }

    /// The chunks in order (base, then parts 1..N), when all are there.
    fn chunks(&self) -> Option<Vec<&[u8]>> {
        if !self.base_present {
            return None;
        }
        let mut out = vec![self.base.as_deref()?];
        for (i, (n, part)) in self.parts.iter().enumerate() {
            if *n as usize != i + 1 {
                return None;
            }
            out.push(part.as_deref()?);
        }
        Some(out)
    }

    /// The joined gzip bytes (base then parts 1..N), or None when absent/incomplete.
    /// (Used for the backup.) Parts left over past the end of the gzip stream (see
    /// [`read_noting`]) are not part of it.
    pub fn joined(&self) -> Option<Vec<u8>> {
        let chunks = self.chunks()?;
        let all = chunks.concat();
        let end = gzip_member_end(&all);
        match end.and_then(|e| live_chunks(&chunks, e)) {
            Some(live) => Some(chunks[..live].concat()),
            None => Some(all),
        }
    }
}

impl StateSecrets {
    /// The managed resource instances of this state, by identity (see
    /// [`instances::read`]); an error says why they cannot be told.
    pub fn instances(&self, cap: u64) -> Result<instances::Instances, String> {
        if !self.base_present {
            return Ok(instances::Instances {
                lineage: None,
                serial: None,
                managed: Default::default(),
            });
        }
        if let Some(message) = self.structural_problem() {
            return Err(message);
        }
        let chunks = self.chunks().expect("checked just above");
        instances::read(Chain { chunks, index: 0 }, true, cap)
    }
}

/// "1, 3 and 4".
fn list(items: &[u32]) -> String {
    match items {
        [] => String::new(),
        [one] => one.to_string(),
        [init @ .., last] => {
            let init: Vec<String> = init.iter().map(u32::to_string).collect();
            format!("{} and {last}", init.join(", "))
        }
    }
}

/// What a state's bytes turned out to be.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StateContent {
    /// No base Secret.
    Missing,
    /// Unreadable; the message says why and what to do.
    Corrupt { message: String },
    /// An OpenTofu encrypted state.
    Encrypted {
        lineage: Option<String>,
        serial: Option<u64>,
        message: String,
    },
    /// A version-4 Terraform state.
    Parsed {
        lineage: String,
        serial: u64,
        managed_instances: u64,
    },
}

/// The largest top-level `outputs` CAPTF reads (its JSON, as serde_json writes it back).
pub const OUTPUTS_MAX_BYTES: usize = 1024 * 1024;

/// How many bytes of the state the `outputs` member may take where it stands (its values
/// with their types and `sensitive` flags): read past this, it is refused before any of it
/// is held whole.
const OUTPUTS_MAX_RAW_BYTES: u64 = 4 * OUTPUTS_MAX_BYTES as u64;

/// Splits gzip bytes into chunks of TF_CHUNK_SIZE exactly as Terraform does (first chunk
/// in the base Secret, chunk N in part N): used to write backups and `captf state restore`.
pub fn chunk(gzip: &[u8]) -> Vec<&[u8]> {
    if gzip.is_empty() {
        return vec![gzip];
    }
    gzip.chunks(TF_CHUNK_SIZE).collect()
}

#[cfg(test)]
mod tests;
