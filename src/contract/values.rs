//! The values of the contract's variables for one object: what the apply gives its
//! module in `captf.auto.tfvars.json`, built from the Cluster API objects as a pass read
//! them. Pure: the pass reads, this function builds.

use serde_json::{Map, Value, json};

use super::{CONTRACT_VERSION, Role};

/// What the contract's values are built from.
#[derive(Clone, Copy, Debug)]
pub struct Sources<'a> {
    pub role: Role,
    pub namespace: &'a str,
    /// The TerraformCluster's, TerraformMachine's or TerraformMachinePool's name.
    pub object_name: &'a str,
    /// Its kind, as `captf_tags` names it.
    pub object_kind: &'a str,
    pub cluster_name: &'a str,
    /// The Cluster API Cluster, as read (any version).
    pub cluster: Option<&'a Value>,
    /// The owning Machine or MachinePool, as read.
    pub owner: Option<&'a Value>,
    /// The bootstrap data Secret's `value` and `format`, for a machine or pool.
    pub bootstrap: Option<(&'a [u8], Option<&'a str>)>,
    /// The TerraformCluster's `machine_inputs` output, for a machine or pool (none: null).
    pub cluster_outputs: Option<&'a Value>,
    /// For a TerraformCluster: its own `spec.controlPlaneEndpoint` (`host`, `port`), set from
    /// its module's outputs, when it has one.
    pub own_endpoint: Option<(&'a str, i64)>,
    /// For a TerraformCluster whose apply succeeded before: whether that apply was given an
    /// endpoint (`captf_control_plane_endpoint` not null). None before any success.
    pub endpoint_given_before: Option<bool>,
}

/// The name of the TerraformCluster whose `machine_inputs` output a machine or pool of
/// `cluster` is given: the one the Cluster's `spec.infrastructureRef` names (v1beta2's
/// `apiGroup`, or v1beta1's `apiVersion`); none when its infrastructure is another
/// provider's, or not named yet.
pub fn handoff_source(cluster: &Value) -> Option<&str> {
    let r = &cluster["spec"]["infrastructureRef"];
    let group = r["apiGroup"]
        .as_str()
        .or_else(|| r["apiVersion"].as_str().and_then(|v| v.split('/').next()))?;
    (group == crate::api::names::GROUP && r["kind"].as_str() == Some("TerraformCluster"))
        .then(|| r["name"].as_str())
        .flatten()
        .filter(|n| !n.is_empty())
}

/// The bootstrap data's format when its Secret names none.
pub const DEFAULT_BOOTSTRAP_FORMAT: &str = "cloud-config";

/// The tags every cloud resource gets (`captf_tags`): names, never uids (a move makes
/// new uids, and a changed input would re-apply every module after it).
pub fn tags(s: &Sources) -> Map<String, Value> {
    [
        ("captf-cluster", s.cluster_name),
        ("captf-namespace", s.namespace),
        ("captf-kind", s.object_kind),
        ("captf-name", s.object_name),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), json!(v)))
    .collect()
}

/// The contract's variables for `s.role`, every one of the role's (null where the
/// contract allows it and the source says nothing).
pub fn values(s: &Sources) -> Map<String, Value> {
    let null = Value::Null;
    let cluster = s.cluster.unwrap_or(&null);
    let owner = s.owner.unwrap_or(&null);
    let text = |v: &Value| {
        v.as_str()
            .filter(|t| !t.is_empty())
            .map_or(Value::Null, |t| json!(t))
    };
    let mut m = Map::new();
    let mut set = |k: &str, v: Value| {
        m.insert(k.to_string(), v);
    };
    set("captf_contract", json!(CONTRACT_VERSION));
    set("captf_cluster_name", json!(s.cluster_name));
    set("captf_namespace", json!(s.namespace));
    set("captf_object_name", json!(s.object_name));
    set("captf_tags", Value::Object(tags(s)));
    match s.role {
        Role::Cluster => {
            set(
                "captf_kubernetes_version",
                text(&cluster["spec"]["topology"]["version"]),
            );
            let endpoint = &cluster["spec"]["controlPlaneEndpoint"];
            let given = endpoint["host"]
                .as_str()
                .filter(|h| !h.is_empty())
                .map(|host| (host, endpoint["port"].as_i64().unwrap_or(6443)));
            // The endpoint the module made comes back: Cluster API copies the
            // TerraformCluster's into the Cluster. That is no new input (the module, given
            // none, made it), or every cluster would be applied again once provisioned.
            let copied_back = given.is_some()
                && given == s.own_endpoint
                && s.endpoint_given_before == Some(false);
            set(
                "captf_control_plane_endpoint",
                match given.filter(|_| !copied_back) {
                    Some((host, port)) => json!({"host": host, "port": port}),
                    None => Value::Null,
                },
            );
            let network = &cluster["spec"]["clusterNetwork"];
            let blocks = |v: &Value| v["cidrBlocks"].as_array().cloned().unwrap_or_default();
            set(
                "captf_cluster_network",
                if network.is_object() {
                    json!({
                        "pods": blocks(&network["pods"]),
                        "services": blocks(&network["services"]),
                        "service_domain": network["serviceDomain"].as_str().unwrap_or("cluster.local"),
                    })
                } else {
                    Value::Null
                },
            );
        }
        Role::Machine => {
            set("captf_kubernetes_version", text(&owner["spec"]["version"]));
            set(
                "captf_machine_name",
                json!(owner["metadata"]["name"].as_str().unwrap_or_default()),
            );
            set(
                "captf_control_plane",
                json!(
                    owner["metadata"]["labels"]
                        .get("cluster.x-k8s.io/control-plane")
                        .is_some()
                ),
            );
            set(
                "captf_failure_domain",
                text(&owner["spec"]["failureDomain"]),
            );
        }
        Role::MachinePool => {
            let template = &owner["spec"]["template"];
            set(
                "captf_kubernetes_version",
                text(&template["spec"]["version"]),
            );
            set(
                "captf_machine_pool_name",
                json!(owner["metadata"]["name"].as_str().unwrap_or_default()),
            );
            set(
                "captf_replicas",
                json!(owner["spec"]["replicas"].as_i64().unwrap_or(1)),
            );
            set(
                "captf_failure_domains",
                json!(
                    owner["spec"]["failureDomains"]
                        .as_array()
                        .cloned()
                        .unwrap_or_default()
                ),
            );
            set(
                "captf_node_labels",
                json!(
                    template["metadata"]["labels"]
                        .as_object()
                        .cloned()
                        .unwrap_or_default()
                ),
            );
        }
    }
    if matches!(s.role, Role::Machine | Role::MachinePool) {
        let (data, format) = s.bootstrap.unwrap_or((&[], None));
        // Base64, as Kubernetes writes a Secret's bytes.
        set(
            "captf_bootstrap_data",
            serde_json::to_value(k8s_openapi::ByteString(data.to_vec())).unwrap_or(Value::Null),
        );
        set(
            "captf_bootstrap_format",
            json!(
                format
                    .filter(|f| !f.is_empty())
                    .unwrap_or(DEFAULT_BOOTSTRAP_FORMAT)
            ),
        );
        set(
            "captf_cluster_outputs",
            s.cluster_outputs.cloned().unwrap_or(Value::Null),
        );
    }
    m
}
