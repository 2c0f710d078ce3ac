//! Who owns a live object in Cluster API's terms, and the gates its first apply waits
//! for (the Cluster's infrastructure, the control plane, the bootstrap data).

use super::*;

/// The owner Cluster API sets on an infrastructure object once its own object names it:
/// the Cluster of a TerraformCluster, the controlling Machine of a TerraformMachine (a
/// MachineSet's or control plane's reference comes first and does not count), the
/// MachinePool of a TerraformMachinePool.
pub fn capi_owner(kind: Kind, meta: &ObjectMeta) -> Option<String> {
    let owner_kind = owner_kind(kind).unwrap_or("Cluster");
    let controller_only = kind == Kind::TerraformMachine;
    meta.owner_references
        .iter()
        .flatten()
        .find(|r| {
            r.kind == owner_kind
                && r.api_version.split('/').next() == Some(names::CAPI_GROUP)
                && (!controller_only || r.controller == Some(true))
        })
        .map(|r| r.name.clone())
}

/// The Cluster API kind that owns a machine (`Machine`) or a pool (`MachinePool`); none
/// for a TerraformCluster.
pub fn owner_kind(kind: Kind) -> Option<&'static str> {
    match kind {
        Kind::TerraformCluster => None,
        Kind::TerraformMachine => Some("Machine"),
        Kind::TerraformMachinePool => Some("MachinePool"),
    }
}

/// Where a machine's or pool's owner names its bootstrap data Secret.
fn bootstrap_path(kind: Kind) -> &'static str {
    match kind {
        Kind::TerraformMachinePool => "spec.template.spec.bootstrap.dataSecretName",
        _ => "spec.bootstrap.dataSecretName",
    }
}

/// The bootstrap data Secret a machine's or pool's `owner` names, if it names one.
pub fn bootstrap_secret_name(kind: Kind, owner: &serde_json::Value) -> Option<&str> {
    let at = bootstrap_path(kind)
        .split('.')
        .fold(owner, |v, field| &v[field]);
    at.as_str().filter(|n| !n.is_empty())
}

/// The first of a machine's or pool's own gates not met before its first apply: the
/// Cluster's infrastructure, then (for a worker) the control plane, then the bootstrap
/// data its owner names. `owner` is the owning Machine or MachinePool as read; a
/// TerraformCluster has none of these gates.
pub fn prerequisite(
    o: &Observed,
    owner: Option<&serde_json::Value>,
    bootstrap: Option<&k8s_openapi::api::core::v1::Secret>,
) -> Option<Prerequisite> {
    if o.kind == Kind::TerraformCluster {
        return None;
    }
    let cluster = crate::gather::owning_cluster(&o.meta).unwrap_or_default();
    match &o.cluster {
        Some(c) if c.infrastructure_provisioned => {}
        _ => return Some(Prerequisite::ClusterInfrastructure { cluster }),
    }
    let owner = owner?;
    let owner_kind = owner_kind(o.kind).unwrap_or_default();
    let data_secret = bootstrap_secret_name(o.kind, owner);
    let name = owner["metadata"]["name"].as_str().unwrap_or_default();
    let path = bootstrap_path(o.kind);
    if let Some(secret) = data_secret {
        let has_value = bootstrap
            .and_then(|s| s.data.as_ref())
            .and_then(|d| d.get("value"))
            .is_some_and(|v| !v.0.is_empty());
        return match (bootstrap, has_value) {
            (_, true) => None,
            (None, _) => Some(Prerequisite::BootstrapData {
                detail: format!(
                    "Secret {secret}, which {owner_kind} {name}'s {path} names, does not exist yet"
                ),
            }),
            (Some(_), false) => Some(Prerequisite::BootstrapData {
                detail: format!("Secret {secret} of {owner_kind} {name} has no key value yet"),
            }),
        };
    }
    let control_plane = owner["metadata"]["labels"]
        .get("cluster.x-k8s.io/control-plane")
        .is_some();
    let initialized = o
        .cluster
        .as_ref()
        .is_some_and(|c| c.control_plane_initialized);
    if !control_plane && !initialized {
        return Some(Prerequisite::ControlPlaneInitialized { cluster });
    }
    Some(Prerequisite::BootstrapData {
        detail: format!("{owner_kind} {name} has no {path} yet"),
    })
}
