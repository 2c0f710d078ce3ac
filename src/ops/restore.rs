//! `captf state restore KIND/NAME`: a state written back in Terraform's format, from the
//! backup, a file or an errored state.

use std::collections::BTreeMap;

use flate2::Compression;
use flate2::write::GzEncoder;
use k8s_openapi::api::core::v1::Secret;
use kube::Client;
use kube::api::Api;

use super::{ToolError, object_meta, parse_target};
use crate::api::names;
use crate::state::secrets::{self as chunked, Over};
use crate::state::{self, Fingerprint, StateContent};

/// The largest state file `--from-file` reads.
pub const MAX_STATE_FILE_BYTES: u64 = 512 * 1024 * 1024;

/// Where a restore takes the state from.
pub enum RestoreSource {
    Backup,
    File(std::path::PathBuf),
    /// An errored state a runner kept, by the name of its (base) Secret in the object's
    /// namespace: Terraform's last state of the failed run, to merge back.
    Errored(String),
}

/// `captf state restore KIND/NAME`: writes a state back in Terraform's format (parts
/// included). A readable current state is never overwritten without `force`.
pub async fn restore(
    client: &Client,
    ns: &str,
    target: &str,
    source: RestoreSource,
    force: bool,
) -> Result<String, ToolError> {
    let (kind, name) = parse_target(target)?;
    let obj_meta = object_meta(client, ns, kind, &name).await?;
    let suffix = names::state_suffix(kind, &name);
    let secrets: Api<Secret> = Api::namespaced(client.clone(), ns);
    let state_name = names::state_secret_name(&suffix);

    let gzip = match &source {
        RestoreSource::Backup => {
            let backup = chunked::read(&secrets, &names::backup_secret_name(&suffix), None).await?;
            backup.joined().ok_or_else(|| {
                ToolError::Refused(format!(
                    "no complete backup Secret {} (with its parts) in namespace {ns}; restore --from-file instead",
                    names::backup_secret_name(&suffix)
                ))
            })?
        }
        RestoreSource::File(path) => read_state_file(path)?,
        RestoreSource::Errored(name) => {
            let secret = secrets
                .get_opt(name)
                .await?
                .ok_or_else(|| ToolError::Refused(format!("no Secret {name} in namespace {ns}")))?;
            let data = secret.data.unwrap_or_default();
            if let Some(json) = data.get(names::LEGACY_ERRORED_KEY) {
                // An older runner's: plain JSON.
                let mut enc = GzEncoder::new(Vec::new(), Compression::default());
                std::io::copy(&mut &json.0[..], &mut enc)
                    .and_then(|_| enc.finish())
                    .map_err(|e| ToolError::Refused(format!("Secret {name}: {e}")))?
            } else if data.contains_key(names::TF_STATE_KEY) {
                chunked::read(&secrets, name, None)
                    .await?
                    .joined()
                    .ok_or_else(|| {
                        ToolError::Refused(format!(
                            "the errored state {name} is not complete (a part Secret is missing)"
                        ))
                    })?
            } else {
                return Err(ToolError::Refused(format!(
                    "Secret {name} holds no state (neither {} nor {})",
                    names::TF_STATE_KEY,
                    names::LEGACY_ERRORED_KEY
                )));
            }
        }
    };
    // The source itself must be a readable Terraform state.
    match state::read_bytes(&gzip[..], state::DEFAULT_DECOMPRESSION_CAP) {
        StateContent::Parsed { .. } => {}
        StateContent::Encrypted { message, .. } | StateContent::Corrupt { message } => {
            return Err(ToolError::Refused(format!(
                "the state to restore is not usable: {message}"
            )));
        }
        StateContent::Missing => {
            return Err(ToolError::Refused("the state to restore is empty".into()));
        }
    }

    let current = chunked::read(&secrets, &state_name, Some(&suffix)).await?;
    let recorded = obj_meta.as_ref().and_then(|m| {
        Fingerprint::from_annotations(m.annotations.as_ref().unwrap_or(&BTreeMap::new()))
            .ok()
            .flatten()
    });
    let verdict = state::classify(
        &state::read(&current, state::DEFAULT_DECOMPRESSION_CAP),
        recorded.as_ref(),
        false,
    );
    if verdict.readable && !force {
        return Err(ToolError::Refused(format!(
            "the current state {state_name} is readable ({}); restoring would overwrite it: pass --force if that is what you want",
            verdict.message
        )));
    }

    // Every label Terraform's backend selects the state by: its own, and the owner and
    // move labels the runner configures (the owner name as a valid label value, however
    // long the name; the uid when the object exists).
    let uid = obj_meta
        .as_ref()
        .and_then(|m| m.uid.clone())
        .unwrap_or_default();
    let labels = crate::api::labels::Identity {
        kind,
        namespace: ns,
        name: &name,
        uid: &uid,
    }
    .state_labels();
    // Over what is there: the data replaced, the labels added, the rest kept; a new base
    // gets the protection finalizer (the parts get theirs from the manager when no Job
    // runs).
    let none = BTreeMap::new();
    let parts = chunked::write(
        &secrets,
        &state_name,
        &gzip,
        (Over::Merge, chunked::Earlier::Read),
        |n, i, chunk| chunked::member(n, ns, &labels, &none, i == 0, chunk),
    )
    .await?;
    let after = state::classify(
        &state::read(
            &chunked::read(&secrets, &state_name, Some(&suffix)).await?,
            state::DEFAULT_DECOMPRESSION_CAP,
        ),
        recorded.as_ref(),
        false,
    );
    let mut out = format!(
        "restored {state_name} in {ns} ({parts} part Secret(s)): {}",
        after.message
    );
    if after.reason == state::StateReason::StateInconsistent {
        out.push_str(&format!(
            "\nthe restored state does not match the object's fingerprint; once you have checked it, accept it with:\n  kubectl annotate -n {ns} {}/{name} --overwrite {}={} {}={}",
            kind.as_str().to_lowercase(),
            names::STATE_LINEAGE,
            after.lineage.clone().unwrap_or_default(),
            names::STATE_SERIAL,
            after.serial.unwrap_or(0)
        ));
    }
    Ok(out)
}

/// Reads a state file: plain JSON (as `terraform state pull` or `errored.tfstate`) or gzip.
fn read_state_file(path: &std::path::Path) -> Result<Vec<u8>, ToolError> {
    let shown = path.display();
    let meta = std::fs::metadata(path).map_err(|e| ToolError::Refused(format!("{shown}: {e}")))?;
    if meta.len() > MAX_STATE_FILE_BYTES {
        return Err(ToolError::Refused(format!(
            "{shown}: {} bytes, more than the limit of {MAX_STATE_FILE_BYTES}",
            meta.len()
        )));
    }
    let bytes = std::fs::read(path).map_err(|e| ToolError::Refused(format!("{shown}: {e}")))?;
    if bytes.starts_with(&[0x1f, 0x8b]) {
        return Ok(bytes);
    }
    let mut enc = GzEncoder::new(Vec::new(), Compression::default());
    std::io::copy(&mut &bytes[..], &mut enc)
        .map_err(|e| ToolError::Refused(format!("{shown}: {e}")))?;
    enc.finish()
        .map_err(|e| ToolError::Refused(format!("{shown}: {e}")))
}
