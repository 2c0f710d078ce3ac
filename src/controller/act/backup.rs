//! The backup: a copy of the latest readable state the object's passes read, kept in
//! Secrets of its own (`tfstate-backup-<suffix>` and parts) under the protection
//! finalizer, so that what a destroy starts from survives whatever happens to the state.
//!
//! Write order: as every chunked Secret set ([`crate::state::secrets::write`]): the parts
//! first, the base last (the base names the lineage and serial its parts hold, so a base
//! present means the backup is whole); then the parts an earlier, larger backup had,
//! their protection off before the delete. Every member carries the protection finalizer.

use std::collections::BTreeMap;

use kube::ResourceExt;

use crate::api::TerraformObject;
use crate::api::names;
use crate::controller::{Context, Error, Scope};
use crate::gather::Findings;
use crate::state::StateSecrets;
use crate::state::secrets::{self as chunked, Over};

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
    // From the cache of the object's Secrets (the manager's own writes: the memo above
    // makes a lagging cache harmless).
    let existing = scope.secret_meta(&base).await?;
    if let Some(existing) = &existing {
        let ann = existing.annotations.clone().unwrap_or_default();
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
    let labels = scope.identity().moved_labels();
    let holds: BTreeMap<String, String> = [
        (names::STATE_LINEAGE.to_string(), lineage.to_string()),
        (names::STATE_SERIAL.to_string(), serial.to_string()),
    ]
    .into();
    let none = BTreeMap::new();
    // Whether an earlier, longer backup left parts past this one's: the cache of the
    // object's Secrets answers (it listed before the first pass, and the backup is the
    // manager's alone) unless this process wrote a longer one itself, which the cache may
    // not show yet: then each part is read.
    let parts = crate::state::chunk(&joined).len().saturating_sub(1);
    let cached = scope
        .caches
        .as_ref()
        .map(|c| |name: &str| c.secret_meta(&scope.namespace, name).is_some());
    let earlier = match &cached {
        Some(there) if ctx.backup_parts_written(uid) <= parts => chunked::Earlier::Cached(there),
        _ => chunked::Earlier::Read,
    };
    // The base names the lineage and serial of what its parts hold, and a base present
    // means the backup is complete.
    ctx.note_backup_parts(uid, parts);
    chunked::write(
        secrets,
        &base,
        &joined,
        (Over::Replace, earlier),
        |name, i, chunk| {
            let annotations = if i == 0 { &holds } else { &none };
            chunked::member(name, &scope.namespace, &labels, annotations, true, chunk)
        },
    )
    .await?;
    ctx.set_backed_up(uid, lineage, serial);
    Ok(())
}
