//! The state's Secret I/O. Chunked Secrets: a gzip stream split into a base Secret and part Secrets
//! (`<base>-part-N`), each holding at most Terraform's chunk size (1 MiB) under
//! [`names::TF_STATE_KEY`], as Terraform's kubernetes backend keeps a state. The state,
//! its backup, an errored state and the abandoned copies are such sets; this is the one
//! place that reads them and writes them.
//!
//! Write order ([`write`]): the parts first, the base last, then the parts of an earlier,
//! longer set (each deleted, then its protection off): a reader never sees a base whose
//! stream runs past the parts written, and no surplus part is left held in deletion.

use std::collections::BTreeMap;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, ListParams, ObjectMeta, PostParams};
use kube::core::PartialObjectMeta;

use super::StateSecrets;
use crate::api::names;
use crate::io::Error;
use crate::io::writes::{self, guarded_patch, remove_finalizer_ops};

/// Reads a chunked Secret set and its parts. With Terraform's suffix label (a state),
/// every Secret with the label is listed at once and the base read by name only when the
/// list lacks it; without one, the parts are fetched by name up to the first gap.
pub async fn read(
    secrets: &Api<Secret>,
    base: &str,
    tf_suffix: Option<&str>,
) -> Result<StateSecrets, Error> {
    Ok(read_with_meta(secrets, base, tf_suffix).await?.0)
}

/// [`read`], with the base Secret's metadata.
pub async fn read_with_meta(
    secrets: &Api<Secret>,
    base: &str,
    tf_suffix: Option<&str>,
) -> Result<(StateSecrets, Option<ObjectMeta>), Error> {
    match tf_suffix {
        Some(suffix) => read_by_label(secrets, base, suffix).await,
        None => {
            let Some(base_secret) = secrets.get_opt(base).await? else {
                return Ok((StateSecrets::from_secrets(base, &[]), None));
            };
            let meta = base_secret.metadata.clone();
            let mut found = vec![base_secret];
            let mut n = 1;
            while let Some(s) = secrets.get_opt(&names::part_secret_name(base, n)).await? {
                found.push(s);
                n += 1;
            }
            Ok((StateSecrets::from_secrets(base, &found), Some(meta)))
        }
    }
}

/// Reads a state by Terraform's suffix label, each Secret once: one list of every Secret
/// with that label (the base and its parts, and any other Secret that Terraform's backend
/// would select with them), and a read of the base by name only when the list did not
/// hold it (a base without Terraform's labels). Returns the state and the base's metadata.
async fn read_by_label(
    secrets: &Api<Secret>,
    base: &str,
    suffix: &str,
) -> Result<(StateSecrets, Option<ObjectMeta>), Error> {
    let lp = ListParams::default().labels(&crate::api::labels::suffix_selector(suffix));
    let mut listed = secrets.list(&lp).await?.items;
    if !listed
        .iter()
        .any(|s| s.metadata.name.as_deref() == Some(base))
    {
        match secrets.get_opt(base).await? {
            Some(b) => listed.push(b),
            // No base: no state, whatever else carries the label.
            None => return Ok((StateSecrets::from_secrets(base, &[]), None)),
        }
    }
    let meta = listed
        .iter()
        .find(|s| s.metadata.name.as_deref() == Some(base))
        .map(|s| s.metadata.clone());
    Ok((StateSecrets::from_owned(base, listed), meta))
}

/// The names of a chunked Secret set's members that exist (base and parts).
pub async fn names_of(secrets: &Api<Secret>, base: &str) -> Result<Vec<String>, Error> {
    Ok(metas(secrets, base)
        .await?
        .into_iter()
        .filter_map(|m| m.metadata.name)
        .collect())
}

/// The metadata of a chunked Secret set's members that exist (base and parts): the base
/// and the first part at once, then the parts up to the first gap.
pub async fn metas(
    secrets: &Api<Secret>,
    base: &str,
) -> Result<Vec<PartialObjectMeta<Secret>>, Error> {
    let first = names::part_secret_name(base, 1);
    let (base_meta, mut part) = futures::try_join!(
        secrets.get_metadata_opt(base),
        secrets.get_metadata_opt(&first)
    )?;
    let mut out: Vec<_> = base_meta.into_iter().collect();
    let mut n = 1;
    while let Some(meta) = part {
        out.push(meta);
        n += 1;
        part = secrets
            .get_metadata_opt(&names::part_secret_name(base, n))
            .await?;
    }
    Ok(out)
}

/// One member of a chunked Secret set: `chunk` under Terraform's key, `encoding: gzip`
/// beside `annotations`, and the protection finalizer when `protect`.
pub fn member(
    name: &str,
    namespace: &str,
    labels: &BTreeMap<String, String>,
    annotations: &BTreeMap<String, String>,
    protect: bool,
    chunk: &[u8],
) -> Secret {
    let mut annotations = annotations.clone();
    annotations.insert("encoding".into(), "gzip".into());
    Secret {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some(namespace.into()),
            labels: Some(labels.clone()),
            annotations: Some(annotations),
            finalizers: protect.then(|| vec![names::PROTECT_FINALIZER.into()]),
            ..Default::default()
        },
        data: Some([(names::TF_STATE_KEY.to_string(), ByteString(chunk.to_vec()))].into()),
        ..Default::default()
    }
}

/// How [`write`] writes a member over one of the same name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Over {
    /// The member as built replaces it (the backup: CAPTF's own Secrets).
    Replace,
    /// Only the data changes and the labels are added to its own; its annotations and
    /// finalizers stay (a state: Terraform's and the operator's Secrets).
    Merge,
}

/// Where [`write`] learns whether an earlier, longer set left parts past the new one's.
#[derive(Clone, Copy)]
pub enum Earlier<'a> {
    /// From the API server: each part past the new set's is read, until one is absent.
    Read,
    /// From a cache that cannot lack one (it listed before the writer's first write and
    /// holds every write of the writer's longer than this set): whether a Secret of that
    /// name is there. Nothing is read.
    Cached(&'a (dyn Fn(&str) -> bool + Sync)),
}

/// Writes the gzip stream `gzip` as the chunked set `base` in the order the file's head
/// states, each member built by `build(name, index, chunk)` (index 0 is the base).
/// Returns how many part Secrets the set has.
pub async fn write(
    secrets: &Api<Secret>,
    base: &str,
    gzip: &[u8],
    (over, earlier): (Over, Earlier<'_>),
    build: impl Fn(&str, u32, &[u8]) -> Secret,
) -> Result<usize, Error> {
    let chunks = super::chunk(gzip);
    for (i, chunk) in chunks.iter().enumerate().skip(1).rev() {
        let name = names::part_secret_name(base, i as u32);
        put(secrets, &build(&name, i as u32, chunk), over).await?;
    }
    put(
        secrets,
        &build(base, 0, chunks.first().copied().unwrap_or_default()),
        over,
    )
    .await?;
    // Parts an earlier, longer set had (usually there is none): each deleted first, then
    // its protection taken off. Once a Secret is being deleted the API server lets no
    // finalizer onto it, so a manager's pass that protects the state's parts meanwhile
    // cannot keep it; taken off first, a pass could put it back before the delete, and
    // the part stayed held in deletion beside the shorter set.
    let mut n = chunks.len().max(1) as u32;
    loop {
        let part = names::part_secret_name(base, n);
        let there = match earlier {
            Earlier::Read => secrets.get_metadata_opt(&part).await?.is_some(),
            Earlier::Cached(there) => there(&part),
        };
        if !there {
            break;
        }
        writes::delete_if_present(secrets, &part).await?;
        unprotect_deleting(secrets, &part).await?;
        n += 1;
    }
    Ok(chunks.len().saturating_sub(1))
}

/// Takes the protection finalizer off Secret `name`, being deleted, as read now (again
/// when it changed between the read and the write); gone is done.
async fn unprotect_deleting(secrets: &Api<Secret>, name: &str) -> Result<(), Error> {
    for _ in 0..5 {
        let Some(m) = secrets.get_metadata_opt(name).await? else {
            return Ok(());
        };
        let ops = remove_finalizer_ops(&m.metadata, names::PROTECT_FINALIZER);
        match guarded_patch(secrets, &m.metadata, ops).await {
            Ok(_) => return Ok(()),
            Err(e) if e.is_not_found() => return Ok(()),
            Err(Error::Stale(_)) => continue,
            Err(e) => return Err(e),
        }
    }
    Err(Error::Stale(format!(
        "Secret {name} kept changing while its protection finalizer was being taken off; the next write tries again"
    )))
}

async fn put(secrets: &Api<Secret>, member: &Secret, over: Over) -> Result<(), Error> {
    match over {
        Over::Replace => writes::create_or_replace(secrets, member).await,
        Over::Merge => {
            let name = member.metadata.name.clone().unwrap_or_default();
            match secrets.get_opt(&name).await? {
                Some(mut existing) => {
                    existing.data = member.data.clone();
                    existing.string_data = None;
                    existing
                        .metadata
                        .labels
                        .get_or_insert_with(BTreeMap::new)
                        .extend(member.metadata.labels.clone().unwrap_or_default());
                    secrets
                        .replace(&name, &PostParams::default(), &existing)
                        .await?;
                }
                None => {
                    secrets.create(&PostParams::default(), member).await?;
                }
            }
            Ok(())
        }
    }
}
