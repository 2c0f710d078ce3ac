//! The backup: a copy of the latest readable state the object's passes read, kept in
//! Secrets of its own (`tfstate-backup-<suffix>` and parts) under the protection
//! finalizer, so that what a destroy starts from survives whatever happens to the state.
//!
//! Write order: the parts first, the base last (the base names the lineage and serial its
//! parts hold, so a base present means the backup is whole); then the parts an earlier,
//! larger backup had, their protection off before the delete.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Secret;
use kube::ResourceExt;

use super::owner_labels;
use crate::api::TerraformObject;
use crate::api::names;
use crate::controller::writes::{self, guarded_patch, remove_finalizer_ops};
use crate::controller::{Context, Error, Scope};
use crate::gather::Findings;
use crate::state::{self, StateSecrets};

/// The lineage and serial of the state this pass read, when it is readable.
pub fn readable_fingerprint(findings: &Findings) -> Option<(&str, u64)> {
    let v = findings.verdict.as_ref().filter(|v| v.readable)?;
    Some((v.lineage.as_deref()?, v.serial?))
}

/// Keeps the backup Secret(s) a copy of the latest readable state this object's passes
/// read: written before the first attempt, and again whenever a pass reads a newer serial
/// of the same lineage (a backup of another lineage is never overwritten). The backup
/// carries the lineage and serial it holds; a backup without them (written by an older
/// version) is replaced only when the object's recorded fingerprint names the lineage.
pub async fn ensure_backup<K: TerraformObject>(
    ctx: &Context,
    scope: &Scope<K>,
    obj: &K,
    state: &StateSecrets,
    fingerprint: (&str, u64),
) -> Result<(), Error> {
    let (lineage, serial) = fingerprint;
    let uid = &scope.uid;
    if ctx.backed_up(uid) == Some((lineage.to_string(), serial)) {
        return Ok(());
    }
    let secrets = &scope.secrets;
    let base = names::backup_secret_name(&scope.suffix);
    let existing = secrets.get_metadata_opt(&base).await?;
    if let Some(existing) = &existing {
        let ann = existing.metadata.annotations.clone().unwrap_or_default();
        let held_serial = ann
            .get(names::STATE_SERIAL)
            .and_then(|v| v.parse::<u64>().ok());
        let replace = match (ann.get(names::STATE_LINEAGE), held_serial) {
            (Some(l), Some(n)) => l == lineage && n < serial,
            _ => {
                obj.annotations()
                    .get(names::STATE_LINEAGE)
                    .map(String::as_str)
                    == Some(lineage)
            }
        };
        if !replace {
            if ann.get(names::STATE_LINEAGE).map(String::as_str) == Some(lineage)
                && held_serial == Some(serial)
            {
                ctx.set_backed_up(uid, lineage, serial);
            }
            return Ok(());
        }
    }
    let Some(joined) = state.joined() else {
        return Ok(());
    };
    let chunks = state::chunk(&joined);
    // Parts first, the base last: the base names the lineage and serial of what its parts
    // hold, and a base present means the backup is complete.
    for (i, chunk) in chunks.iter().enumerate().skip(1).rev() {
        let s = backup_secret(
            scope,
            &names::part_secret_name(&base, i as u32),
            chunk,
            None,
        );
        writes::create_or_replace(secrets, &s).await?;
    }
    if let Some(first) = chunks.first() {
        let s = backup_secret(scope, &base, first, Some((lineage, serial)));
        writes::create_or_replace(secrets, &s).await?;
    }
    // Parts an earlier, larger backup had.
    let mut n = chunks.len().max(1) as u32;
    while let Some(m) = secrets
        .get_metadata_opt(&names::part_secret_name(&base, n))
        .await?
    {
        let ops = remove_finalizer_ops(&m.metadata, names::PROTECT_FINALIZER);
        let _ = guarded_patch(secrets, &m.metadata, ops).await;
        writes::delete_if_present(secrets, &names::part_secret_name(&base, n)).await?;
        n += 1;
    }
    ctx.set_backed_up(uid, lineage, serial);
    Ok(())
}

fn backup_secret<K: TerraformObject>(
    scope: &Scope<K>,
    name: &str,
    chunk: &[u8],
    holds: Option<(&str, u64)>,
) -> Secret {
    let mut labels = owner_labels(scope);
    labels.insert(names::CLUSTERCTL_MOVE_LABEL.into(), String::new());
    let mut annotations: BTreeMap<String, String> =
        [("encoding".to_string(), "gzip".to_string())].into();
    if let Some((lineage, serial)) = holds {
        annotations.insert(names::STATE_LINEAGE.into(), lineage.into());
        annotations.insert(names::STATE_SERIAL.into(), serial.to_string());
    }
    Secret {
        metadata: kube::api::ObjectMeta {
            name: Some(name.into()),
            namespace: Some(scope.namespace.clone()),
            labels: Some(labels),
            finalizers: Some(vec![names::PROTECT_FINALIZER.into()]),
            annotations: Some(annotations),
            ..Default::default()
        },
        data: Some(
            [(
                names::TF_STATE_KEY.to_string(),
                k8s_openapi::ByteString(chunk.to_vec()),
            )]
            .into(),
        ),
        ..Default::default()
    }
}
