//! The three custom resources and the spec and status parts they share.
//! The spec carries what a destroy needs when there is no inputs Secret yet (section 3);
//! the status is a cache of conditions, never the record (clusterctl move drops it).

// Each `printcolumn(...)` repeats `type_ = "string"`; clippy reads that as a duplicated
// attribute, though they are separate columns.
#![allow(clippy::duplicated_attributes)]

use std::collections::BTreeMap;

use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::conditions::Condition;

/// The runner image used when the spec names none.
pub const DEFAULT_RUNNER_IMAGE: &str = "hashicorp/terraform:1.11.4";

/// The per-attempt timeout used when the spec names none.
pub const DEFAULT_TIMEOUT_SECONDS: i64 = 3600;

/// What Terraform runs and with which values; shared by the three kinds.
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct TerraformSpec {
    /// The Terraform module: a pinned source address, or the module's files inline.
    pub module: ModuleSpec,
    /// Input variables of the module, as values.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "free_form_object")]
    pub variables: Option<serde_json::Map<String, serde_json::Value>>,
    /// More input variables, each read from a key of a ConfigMap or Secret whose value is a
    /// JSON object of variables. Later entries and `variables` win over earlier ones.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub variables_from: Vec<VariablesFrom>,
    /// Environment variables taken from Secrets (credentials). Only the names are recorded
    /// in the inputs Secret, never the values.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub env: Vec<EnvFromSecret>,
    /// How the runner Job runs.
    #[serde(default)]
    pub runner: RunnerSpec,
    /// A `TerraformClusterIdentity`: the runner gets its Secret's keys as environment
    /// variables (cloud credentials a platform team keeps in the manager's namespace), or
    /// runs as an account of the object's own with its workload identity annotations. A
    /// TerraformMachine or TerraformMachinePool without one uses its cluster's. Read at
    /// each attempt; the apply's is recorded with the inputs and its destroy uses the
    /// same identity, as the identity is then (a rotated Secret's new values).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub identity_ref: Option<super::identity::IdentityRef>,
    /// The provider lock file (`.terraform.lock.hcl`) to use, if pinned.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lock_file: Option<String>,
}

fn free_form_object(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "type": "object",
        "x-kubernetes-preserve-unknown-fields": true
    })
}

/// One of `source`, `files` or `path`.
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ModuleSpec {
    /// A pinned module source address, e.g. `git::https://example.com/infra.git//vm?ref=v1.4.0`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<String>,
    /// The module's files, by file name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub files: Option<BTreeMap<String, String>>,
    /// An absolute directory in the runner image that holds the module: a module image
    /// (with `runner.pluginDir`, its providers too), run by digest once applied.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
}

/// A ConfigMap or Secret key holding a JSON object of variables.
#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct VariablesFrom {
    /// `ConfigMap` or `Secret`.
    pub kind: VariablesSourceKind,
    /// The object's name, in the object's namespace.
    pub name: String,
    /// The key whose value is a JSON object of variables.
    pub key: String,
}

#[derive(Clone, Copy, Debug, Serialize, Deserialize, JsonSchema, PartialEq, Eq)]
pub enum VariablesSourceKind {
    ConfigMap,
    Secret,
}

/// An environment variable from a Secret key, as in a container's `env`.
#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct EnvFromSecret {
    pub name: String,
    pub secret_key_ref: SecretKeyRef,
}

#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema, PartialEq, Eq)]
pub struct SecretKeyRef {
    pub name: String,
    pub key: String,
}

/// The runner Job's settings.
#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct RunnerSpec {
    /// The runner image; it must contain `terraform` (or `tofu`) and a POSIX shell.
    #[serde(default = "default_image")]
    pub image: String,
    /// The deadline of one attempt, in seconds (the Job's `activeDeadlineSeconds`).
    #[serde(default = "default_timeout")]
    pub timeout_seconds: i64,
    /// An absolute directory in the runner image holding the providers the module needs,
    /// in a provider mirror's layout (`terraform init -plugin-dir`): `init` reaches no
    /// registry.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub plugin_dir: Option<String>,
    /// The command the runner runs: `terraform`, or `tofu` (OpenTofu). Unset: `terraform`,
    /// or `tofu` in an image that has no `terraform`. Recorded with the inputs: the destroy
    /// runs the same one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runtime: Option<Runtime>,
    /// A ServiceAccount of the object's own for its runner Pods, so that its module can
    /// use a cloud's workload identity with no static key. CAPTF makes it, named
    /// `captf-runner-<name>.<tfc|tfm|tfmp>`, binds the namespace's runner Role to it, gives
    /// it these annotations at each attempt (a destroy's too: the identity is what the spec
    /// says now, not what the last apply had), and deletes it with the object. Unset: the
    /// namespace's shared `captf-runner`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service_account: Option<RunnerServiceAccount>,
}

/// The runner's own ServiceAccount ([`RunnerSpec::service_account`]).
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq, Eq)]
pub struct RunnerServiceAccount {
    /// Its annotations, e.g. `eks.amazonaws.com/role-arn` (EKS IRSA),
    /// `iam.gke.io/gcp-service-account` (GKE Workload Identity),
    /// `azure.workload.identity/client-id` (Azure Workload Identity).
    #[serde(default)]
    pub annotations: BTreeMap<String, String>,
}

/// What runs the module: Terraform or OpenTofu (the same kubernetes backend and state).
#[derive(Clone, Copy, Debug, Serialize, Deserialize, JsonSchema, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum Runtime {
    Terraform,
    Tofu,
}

impl Runtime {
    /// The command's name, as the runner calls it.
    pub fn command(self) -> &'static str {
        match self {
            Runtime::Terraform => "terraform",
            Runtime::Tofu => "tofu",
        }
    }
}

fn default_image() -> String {
    DEFAULT_RUNNER_IMAGE.to_string()
}

fn default_timeout() -> i64 {
    DEFAULT_TIMEOUT_SECONDS
}

impl Default for RunnerSpec {
    fn default() -> Self {
        RunnerSpec {
            image: default_image(),
            timeout_seconds: default_timeout(),
            plugin_dir: None,
            runtime: None,
            service_account: None,
        }
    }
}

/// The control plane endpoint (CAPI contract).
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq, Eq)]
pub struct ApiEndpoint {
    pub host: String,
    pub port: i32,
}

/// The status of the three kinds, one type: each kind's CRD serves only the shared fields
/// and its own ([`super::status_fields`]). A cache: the deletion never depends on it.
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct TerraformStatus {
    /// Conditions of CAPI v1beta2 style: Ready, Paused, Deleting, DeletionBlocked, StateReadable.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    /// The generation the conditions were computed for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// CAPI v1beta2 initialization status, set by the apply path.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub initialization: Option<Initialization>,
    /// A TerraformCluster's failure domains (the module's `failure_domains` output).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub failure_domains: Vec<FailureDomain>,
    /// A TerraformMachine's addresses (the module's `addresses` output).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub addresses: Vec<MachineAddress>,
    /// A TerraformMachine's failure domain (the module's `failure_domain` output).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure_domain: Option<String>,
    /// Whether a TerraformMachine is interruptible (the module's `interruptible` output).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interruptible: Option<bool>,
    /// A TerraformMachinePool's number of instances (the module's `replicas` output, else
    /// the length of its `provider_id_list`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replicas: Option<i32>,
    /// A TerraformMachinePool is ready: its provider IDs are complete (Cluster API's
    /// MachinePool controller still reads this field).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ready: Option<bool>,
    /// A TerraformMachinePool's instances, for people to read (the module's `instances`
    /// output; Cluster API does not read it).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub instances: Vec<PoolInstance>,
}

/// An instance of a machine pool, as the module's `instances` output describes it.
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct PoolInstance {
    #[serde(rename = "providerID")]
    pub provider_id: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub addresses: Vec<MachineAddress>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure_domain: Option<String>,
}

/// A failure domain of a cluster (CAPI v1beta2 `FailureDomain`).
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct FailureDomain {
    pub name: String,
    #[serde(default)]
    pub control_plane: bool,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub attributes: BTreeMap<String, String>,
}

/// An address of a machine (CAPI `MachineAddress`).
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq, Eq)]
pub struct MachineAddress {
    #[serde(rename = "type")]
    pub type_: String,
    pub address: String,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq, Eq)]
pub struct Initialization {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provisioned: Option<bool>,
}

/// Infrastructure of a whole cluster (network, load balancer, …) made by a Terraform module.
#[derive(CustomResource, Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[kube(
    group = "infrastructure.cluster.x-k8s.io",
    version = "v1alpha1",
    kind = "TerraformCluster",
    namespaced,
    status = "TerraformStatus",
    shortname = "tfc",
    category = "cluster-api",
    label("cluster.x-k8s.io/v1beta2", "v1alpha1"),
    label("clusterctl.cluster.x-k8s.io", ""),
    doc = "Infrastructure of a Cluster API Cluster, made and destroyed by a Terraform module.",
    printcolumn(
        name = "Cluster",
        type_ = "string",
        json_path = ".metadata.labels['cluster\\.x-k8s\\.io/cluster-name']"
    ),
    printcolumn(
        name = "Ready",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Ready\")].status"
    ),
    printcolumn(
        name = "Provisioned",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Provisioned\")].reason"
    ),
    printcolumn(
        name = "Deleting",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Deleting\")].reason"
    ),
    printcolumn(
        name = "State",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"StateReadable\")].reason"
    ),
    printcolumn(
        name = "Paused",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Paused\")].status",
        priority = 1
    ),
    printcolumn(
        name = "Endpoint",
        type_ = "string",
        json_path = ".spec.controlPlaneEndpoint.host",
        priority = 1
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct TerraformClusterSpec {
    /// The endpoint of the control plane (CAPI contract).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub control_plane_endpoint: Option<ApiEndpoint>,
    #[serde(flatten)]
    pub terraform: TerraformSpec,
}

/// Infrastructure of one Machine made by a Terraform module.
#[derive(CustomResource, Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[kube(
    group = "infrastructure.cluster.x-k8s.io",
    version = "v1alpha1",
    kind = "TerraformMachine",
    namespaced,
    status = "TerraformStatus",
    shortname = "tfm",
    category = "cluster-api",
    label("cluster.x-k8s.io/v1beta2", "v1alpha1"),
    label("clusterctl.cluster.x-k8s.io", ""),
    doc = "Infrastructure of a Cluster API Machine, made and destroyed by a Terraform module.",
    printcolumn(
        name = "Cluster",
        type_ = "string",
        json_path = ".metadata.labels['cluster\\.x-k8s\\.io/cluster-name']"
    ),
    printcolumn(
        name = "Ready",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Ready\")].status"
    ),
    printcolumn(
        name = "Provisioned",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Provisioned\")].reason"
    ),
    printcolumn(
        name = "Deleting",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Deleting\")].reason"
    ),
    printcolumn(
        name = "State",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"StateReadable\")].reason"
    ),
    printcolumn(
        name = "Paused",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Paused\")].status",
        priority = 1
    ),
    printcolumn(
        name = "ProviderID",
        type_ = "string",
        json_path = ".spec.providerID",
        priority = 1
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct TerraformMachineSpec {
    /// The provider ID of the machine (CAPI contract).
    #[serde(
        default,
        rename = "providerID",
        skip_serializing_if = "Option::is_none"
    )]
    pub provider_id: Option<String>,
    #[serde(flatten)]
    pub terraform: TerraformSpec,
}

/// Infrastructure of a MachinePool made by a Terraform module.
#[derive(CustomResource, Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[kube(
    group = "infrastructure.cluster.x-k8s.io",
    version = "v1alpha1",
    kind = "TerraformMachinePool",
    namespaced,
    status = "TerraformStatus",
    shortname = "tfmp",
    category = "cluster-api",
    label("cluster.x-k8s.io/v1beta2", "v1alpha1"),
    label("clusterctl.cluster.x-k8s.io", ""),
    doc = "Infrastructure of a Cluster API MachinePool, made and destroyed by a Terraform module.",
    printcolumn(
        name = "Cluster",
        type_ = "string",
        json_path = ".metadata.labels['cluster\\.x-k8s\\.io/cluster-name']"
    ),
    printcolumn(
        name = "Ready",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Ready\")].status"
    ),
    printcolumn(
        name = "Provisioned",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Provisioned\")].reason"
    ),
    printcolumn(name = "Replicas", type_ = "integer", json_path = ".status.replicas"),
    printcolumn(
        name = "Deleting",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Deleting\")].reason"
    ),
    printcolumn(
        name = "State",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"StateReadable\")].reason"
    ),
    printcolumn(
        name = "Paused",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Paused\")].status",
        priority = 1
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct TerraformMachinePoolSpec {
    /// The provider IDs of the pool's instances (CAPI contract).
    #[serde(
        default,
        rename = "providerIDList",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub provider_id_list: Vec<String>,
    #[serde(flatten)]
    pub terraform: TerraformSpec,
}
