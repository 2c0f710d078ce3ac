//! The operator's commands: `captf state restore` ([`restore`]), `captf orphans`
//! ([`orphans`]) and, offline, `captf state inspect` ([`inspect`]). They use the same names, chunked
//! Secrets and state reading as the controllers. And the release's: `captf
//! release-assets` ([`release`]), offline.

mod image_ref;
pub mod inspect;
pub mod orphans;
pub mod release;
pub mod restore;

use kube::Client;
use kube::api::{Api, ObjectMeta};

use crate::api::names::Kind;

pub use orphans::{Orphan, orphans};
pub use restore::{MAX_STATE_FILE_BYTES, RestoreSource, restore};

/// Why an operator's command did not do what it was asked.
#[derive(Debug, thiserror::Error)]
pub enum ToolError {
    #[error("{0}")]
    Refused(String),
    #[error("Kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    #[error("{0}")]
    Io(#[from] crate::io::Error),
}

/// `KIND/NAME` as kubectl writes it (`tfm/web-1`, `terraformmachine/web-1`, …).
pub fn parse_target(target: &str) -> Result<(Kind, String), ToolError> {
    let (kind, name) = target.split_once('/').ok_or_else(|| {
        ToolError::Refused(format!(
            "{target:?}: expected KIND/NAME, e.g. terraformmachine/web-1"
        ))
    })?;
    let kind = Kind::parse(kind).ok_or_else(|| {
        ToolError::Refused(format!("{kind:?} is not a CAPTF kind: use terraformcluster (tfc), terraformmachine (tfm) or terraformmachinepool (tfmp)"))
    })?;
    if name.is_empty() {
        return Err(ToolError::Refused(format!("{target:?}: the name is empty")));
    }
    Ok((kind, name.to_string()))
}

/// The metadata of the object `kind`/`name` in `ns`, if it exists.
pub(crate) async fn object_meta(
    client: &Client,
    ns: &str,
    kind: Kind,
    name: &str,
) -> Result<Option<ObjectMeta>, ToolError> {
    crate::with_kind!(kind, K => Ok(Api::<K>::namespaced(client.clone(), ns)
        .get_metadata_opt(name)
        .await?
        .map(|o| o.metadata)))
}
