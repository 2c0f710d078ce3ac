//! The hand-off: a TerraformCluster's `machine_inputs` output, which its machines and
//! pools are given, and when it can be read.

use super::*;

/// The TerraformCluster whose `machine_inputs` the machines and pools of `cluster` are
/// given, and the name of its base state Secret; none when the Cluster's infrastructure
/// is not a TerraformCluster.
pub fn handoff_state(cluster: Option<&serde_json::Value>) -> Option<(&str, String)> {
    let name = cluster.and_then(crate::contract::values::handoff_source)?;
    let base = names::state_secret_name(&names::state_suffix(Kind::TerraformCluster, name));
    Some((name, base))
}

/// Why the hand-off of TerraformCluster `name` cannot be read yet: it has no state.
pub fn no_handoff_state(name: &str, base: &str) -> String {
    format!("TerraformCluster {name} has no state Secret {base} yet")
}

/// Whether the hand-off of TerraformCluster `name` (state Secret `base`) can be read, from
/// whether its state Secret exists and whether the TerraformCluster is provisioned (none:
/// it does not exist). A state alone is not enough: Terraform writes it when its first
/// apply begins (the kubernetes backend makes the Secret at `init`), before any output
/// is in it, and a machine given that would be applied with a null hand-off for good.
pub fn handoff_readable(
    name: &str,
    base: &str,
    state_exists: bool,
    cluster_provisioned: Option<bool>,
) -> Result<(), String> {
    match (state_exists, cluster_provisioned) {
        (false, _) => Err(no_handoff_state(name, base)),
        (true, None) => Err(format!(
            "TerraformCluster {name} does not exist (its state Secret {base} does)"
        )),
        (true, Some(false)) => Err(format!(
            "TerraformCluster {name} has not finished its first apply yet (its outputs are not in its state before it has)"
        )),
        (true, Some(true)) => Ok(()),
    }
}

/// Whether a CAPTF object is provisioned: its status says so, or a success is recorded.
pub fn object_provisioned<K: crate::api::TerraformObject>(obj: &K) -> bool {
    let latched = obj
        .status()
        .and_then(|s| s.initialization.as_ref())
        .and_then(|i| i.provisioned)
        == Some(true);
    provisioned(obj.meta(), latched)
}

/// The `machine_inputs` output in TerraformCluster `name`'s state (null when it has
/// none), or why its outputs cannot be read.
pub fn handoff_of(
    name: &str,
    state: &crate::state::StateSecrets,
) -> Result<serde_json::Value, String> {
    crate::state::outputs(state, crate::state::DEFAULT_DECOMPRESSION_CAP)
        .map(|o| {
            o.get(crate::contract::HANDOFF_OUTPUT)
                .cloned()
                .unwrap_or_default()
        })
        .map_err(|why| format!("the outputs of TerraformCluster {name} cannot be read: {why}"))
}

/// Whether a pass needs the TerraformCluster's hand-off: a machine or pool whose gates
/// before it are met (or that is provisioned, whose inputs carry it).
pub fn needs_handoff(
    o: &Observed,
    provisioned: bool,
    owner: Option<&serde_json::Value>,
    bootstrap: Option<&k8s_openapi::api::core::v1::Secret>,
) -> bool {
    o.kind != Kind::TerraformCluster && (provisioned || prerequisite(o, owner, bootstrap).is_none())
}
