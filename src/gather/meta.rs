//! The object's own metadata as the facts read it: its annotations and labels, its
//! deletion bookkeeping, its owners, and which Jobs and Pods are its own.

use jiff::Timestamp;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::ObjectMeta;

use crate::api::labels::labelled_owner;

use crate::api::names::{self, Kind};

pub(super) fn annotation<'a>(meta: &'a ObjectMeta, key: &str) -> Option<&'a str> {
    meta.annotations
        .as_ref()
        .and_then(|a| a.get(key))
        .map(String::as_str)
}

pub(super) fn label<'a>(meta: &'a ObjectMeta, key: &str) -> Option<&'a str> {
    meta.labels
        .as_ref()
        .and_then(|a| a.get(key))
        .map(String::as_str)
}

/// A piece of deletion bookkeeping (the destroy attempt, its failure time, the cleanup
/// marker) as this object wrote it. It counts only under `A/deletion-uid` equal to the
/// object's uid, and a failure time only when it is not older than the object: the
/// bookkeeping of an earlier object of this name, carried over in a saved YAML, is not
/// this object's.
pub fn deletion_bookkeeping<'a>(meta: &'a ObjectMeta, key: &str) -> Option<&'a str> {
    let uid = meta.uid.as_deref().filter(|u| !u.is_empty())?;
    if annotation(meta, names::DELETION_UID) != Some(uid) {
        return None;
    }
    let value = annotation(meta, key)?;
    if key == names::DESTROY_FAILED_AT
        && let (Ok(at), Some(created)) = (value.parse::<Timestamp>(), &meta.creation_timestamp)
        && at < created.0
    {
        return None;
    }
    Some(value)
}

/// The name of the owning Cluster: the ownerReference of kind Cluster (group
/// cluster.x-k8s.io), else the cluster-name label.
pub fn owning_cluster(meta: &ObjectMeta) -> Option<String> {
    let by_ref = meta.owner_references.iter().flatten().find(|r| {
        r.kind == "Cluster" && r.api_version.split('/').next() == Some(names::CAPI_GROUP)
    });
    by_ref
        .map(|r| r.name.clone())
        .or_else(|| label(meta, names::CAPI_CLUSTER_NAME_LABEL).map(str::to_string))
}

/// The ownerReferences of `meta` to a Cluster API Cluster, Machine or MachinePool: the
/// owners Cluster API never lets go before their infrastructure is deleted.
pub fn capi_owners(meta: &ObjectMeta) -> impl Iterator<Item = &OwnerReference> {
    meta.owner_references.iter().flatten().filter(|r| {
        r.api_version.split('/').next() == Some(names::CAPI_GROUP)
            && matches!(r.kind.as_str(), "Cluster" | "Machine" | "MachinePool")
    })
}

/// Whether an operator allowed this object's destroy without its Cluster API owners
/// (`destroy-without-owner` set to the object's uid).
pub fn destroy_without_owner(meta: &ObjectMeta) -> bool {
    meta.uid.as_deref().is_some_and(|uid| {
        !uid.is_empty() && annotation(meta, names::DESTROY_WITHOUT_OWNER) == Some(uid)
    })
}

/// Which Cluster API owners of `meta` are gone: `found(kind, name)` is the uid of the
/// owner of that kind and name that exists (empty when its uid is unknown), or None.
/// An owner that exists with another uid is a new object of that name, not the owner.
pub fn owners_gone(meta: &ObjectMeta, found: impl Fn(&str, &str) -> Option<String>) -> Vec<String> {
    capi_owners(meta)
        .filter_map(|r| match found(&r.kind, &r.name) {
            None => Some(format!(
                "{} {} (uid {}) no longer exists",
                r.kind, r.name, r.uid
            )),
            Some(uid) if !uid.is_empty() && uid != r.uid => Some(format!(
                "{} {} exists with uid {uid}, not the owner's uid {}",
                r.kind, r.name, r.uid
            )),
            Some(_) => None,
        })
        .collect()
}

/// Whether a Job or Pod carries the owner labels of an object of this kind and name, but
/// another uid: an earlier object of the same name.
pub fn of_earlier_namesake(kind: Kind, meta: &ObjectMeta, candidate: &ObjectMeta) -> bool {
    labelled_owner(candidate.labels.as_ref()).is_some_and(|o| {
        o.is_named(kind, meta.name.as_deref().unwrap_or_default())
            && o.uid.is_some_and(|u| Some(u) != meta.uid.as_deref())
    })
}

/// Whether a Job or Pod carries this object's owner labels: the uid when both sides have
/// one, else kind and name.
pub fn owned_by(kind: Kind, meta: &ObjectMeta, candidate: &ObjectMeta) -> bool {
    let Some(owner) = labelled_owner(candidate.labels.as_ref()) else {
        return false;
    };
    match (owner.uid, meta.uid.as_deref()) {
        (Some(a), Some(b)) => a == b,
        _ => owner.is_named(kind, meta.name.as_deref().unwrap_or_default()),
    }
}

pub(super) fn deletion_time(meta: &ObjectMeta) -> Option<Timestamp> {
    meta.deletion_timestamp.as_ref().map(|t| t.0)
}
