//! The module contract, version 1: the input variables CAPTF gives a module of each role,
//! and the outputs it reads from the module's state. One table, read by `captf module
//! check` and by the tests that hold the JSON Schemas of `docs/provisioning/schemas/` to
//! it (and by the apply path, as it is built).
//!
//! A module declares only the variables it uses: CAPTF writes them into a tfvars file of
//! their own (`captf.auto.tfvars.json`), where Terraform takes a value for an undeclared
//! variable as a warning, not an error. Every contract variable starts with the reserved
//! prefix `captf_`; a module's own variables must not.

use std::fmt;

use clap::ValueEnum;
use serde::Serialize;

pub mod check;
pub(crate) mod hcl;
pub mod outputs;
pub mod values;

/// The contract's version, given to modules as `captf_contract`.
pub const CONTRACT_VERSION: &str = "v1";

/// The cluster's output its machines and pools are given as `captf_cluster_outputs`.
pub const HANDOFF_OUTPUT: &str = "machine_inputs";

/// The prefix of the variables CAPTF gives; a module's own variables must not use it.
pub const RESERVED_PREFIX: &str = "captf_";

/// The file CAPTF writes the contract variables into, beside the user's variables.
pub const TFVARS_FILE: &str = "captf.auto.tfvars.json";

/// What a module makes: the infrastructure of a cluster, of one machine, or of a pool.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
#[value(rename_all = "kebab-case")]
pub enum Role {
    Cluster,
    Machine,
    MachinePool,
}

impl Role {
    pub const ALL: [Role; 3] = [Role::Cluster, Role::Machine, Role::MachinePool];

    pub fn as_str(self) -> &'static str {
        match self {
            Role::Cluster => "cluster",
            Role::Machine => "machine",
            Role::MachinePool => "machine-pool",
        }
    }
}

impl From<crate::api::Kind> for Role {
    /// The role of a kind's module.
    fn from(kind: crate::api::Kind) -> Role {
        match kind {
            crate::api::Kind::TerraformCluster => Role::Cluster,
            crate::api::Kind::TerraformMachine => Role::Machine,
            crate::api::Kind::TerraformMachinePool => Role::MachinePool,
        }
    }
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

const ALL: &[Role] = &Role::ALL;
const CLUSTER: &[Role] = &[Role::Cluster];
const MACHINE: &[Role] = &[Role::Machine];
const POOL: &[Role] = &[Role::MachinePool];
const NODES: &[Role] = &[Role::Machine, Role::MachinePool];

/// An input variable CAPTF gives.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Variable {
    pub name: &'static str,
    /// The type a module declares it with, in Terraform's type syntax.
    #[serde(rename = "type")]
    pub type_: &'static str,
    /// Whether its value can be null ("not known", or not set on the Cluster API object).
    pub nullable: bool,
    /// Whether a module must declare it `sensitive = true`.
    pub sensitive: bool,
    pub roles: &'static [Role],
    pub description: &'static str,
}

/// How CAPTF reads an output.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Need {
    /// A module of the role must declare it; a successful apply without a value is
    /// `OutputsInvalid`.
    Required,
    /// Read when declared.
    Optional,
}

/// An output CAPTF reads from the state.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Output {
    pub name: &'static str,
    #[serde(rename = "type")]
    pub type_: &'static str,
    pub need: Need,
    pub roles: &'static [Role],
    /// The Cluster API field it sets, and how.
    pub sets: &'static str,
}

/// The input variables of contract v1.
pub const VARIABLES: &[Variable] = &[
    Variable {
        name: "captf_contract",
        type_: "string",
        nullable: false,
        sensitive: false,
        roles: ALL,
        description: "the contract's version, \"v1\"",
    },
    Variable {
        name: "captf_cluster_name",
        type_: "string",
        nullable: false,
        sensitive: false,
        roles: ALL,
        description: "the Cluster API Cluster's name",
    },
    Variable {
        name: "captf_namespace",
        type_: "string",
        nullable: false,
        sensitive: false,
        roles: ALL,
        description: "the namespace of the object",
    },
    Variable {
        name: "captf_object_name",
        type_: "string",
        nullable: false,
        sensitive: false,
        roles: ALL,
        description: "the name of the TerraformCluster, TerraformMachine or TerraformMachinePool",
    },
    Variable {
        name: "captf_tags",
        type_: "map(string)",
        nullable: false,
        sensitive: false,
        roles: ALL,
        description: "tags to put on every cloud resource: the cluster's name and the object's (resources are found by tags, never by names)",
    },
    Variable {
        name: "captf_kubernetes_version",
        type_: "string",
        nullable: true,
        sensitive: false,
        roles: ALL,
        description: "the Kubernetes version: the Cluster's topology version, the Machine's or the MachinePool template's spec.version",
    },
    Variable {
        name: "captf_control_plane_endpoint",
        type_: "object({ host = string, port = number })",
        nullable: true,
        sensitive: false,
        roles: CLUSTER,
        description: "the Cluster's spec.controlPlaneEndpoint when someone else set it (null when this module provides it)",
    },
    Variable {
        name: "captf_cluster_network",
        type_: "object({ pods = list(string), services = list(string), service_domain = string })",
        nullable: true,
        sensitive: false,
        roles: CLUSTER,
        description: "the Cluster's spec.clusterNetwork",
    },
    Variable {
        name: "captf_machine_name",
        type_: "string",
        nullable: false,
        sensitive: false,
        roles: MACHINE,
        description: "the owning Machine's name",
    },
    Variable {
        name: "captf_control_plane",
        type_: "bool",
        nullable: false,
        sensitive: false,
        roles: MACHINE,
        description: "whether the Machine is a control plane machine (the cluster.x-k8s.io/control-plane label)",
    },
    Variable {
        name: "captf_failure_domain",
        type_: "string",
        nullable: true,
        sensitive: false,
        roles: MACHINE,
        description: "the Machine's spec.failureDomain; the module must place the machine there",
    },
    Variable {
        name: "captf_machine_pool_name",
        type_: "string",
        nullable: false,
        sensitive: false,
        roles: POOL,
        description: "the owning MachinePool's name",
    },
    Variable {
        name: "captf_replicas",
        type_: "number",
        nullable: false,
        sensitive: false,
        roles: POOL,
        description: "the MachinePool's spec.replicas (1 when unset)",
    },
    Variable {
        name: "captf_failure_domains",
        type_: "list(string)",
        nullable: false,
        sensitive: false,
        roles: POOL,
        description: "the MachinePool's spec.failureDomains (may be empty)",
    },
    Variable {
        name: "captf_node_labels",
        type_: "map(string)",
        nullable: false,
        sensitive: false,
        roles: POOL,
        description: "the labels of the MachinePool template's metadata, for its Nodes",
    },
    Variable {
        name: "captf_bootstrap_data",
        type_: "string",
        nullable: false,
        sensitive: true,
        roles: NODES,
        description: "the bootstrap data, base64-encoded (it may be gzip, not text); recorded in the inputs Secret, so a destroy never needs the bootstrap Secret",
    },
    Variable {
        name: "captf_bootstrap_format",
        type_: "string",
        nullable: false,
        sensitive: false,
        roles: NODES,
        description: "the bootstrap data's format: the Secret's `format`, else \"cloud-config\"",
    },
    Variable {
        name: "captf_cluster_outputs",
        type_: "any",
        nullable: true,
        sensitive: false,
        roles: NODES,
        description: "the TerraformCluster's `machine_inputs` output, as it is (null when it has none)",
    },
];

/// The outputs of contract v1.
pub const OUTPUTS: &[Output] = &[
    Output {
        name: "control_plane_endpoint",
        type_: "object({ host = string, port = number })",
        need: Need::Optional,
        roles: CLUSTER,
        sets: "spec.controlPlaneEndpoint, once, when the Cluster has none (a later different value is refused)",
    },
    Output {
        name: "failure_domains",
        type_: "list(object({ name = string, control_plane = optional(bool), attributes = optional(map(string)) }))",
        need: Need::Optional,
        roles: CLUSTER,
        sets: "status.failureDomains",
    },
    Output {
        name: HANDOFF_OUTPUT,
        type_: "any",
        need: Need::Optional,
        roles: CLUSTER,
        sets: "nothing: given to the cluster's machines and pools as captf_cluster_outputs",
    },
    Output {
        name: "provider_id",
        type_: "string",
        need: Need::Required,
        roles: MACHINE,
        sets: "spec.providerID, once; it must equal the Node's spec.providerID",
    },
    Output {
        name: "addresses",
        type_: "list(object({ type = string, address = string }))",
        need: Need::Optional,
        roles: MACHINE,
        sets: "status.addresses (types Hostname, ExternalIP, InternalIP, ExternalDNS, InternalDNS)",
    },
    Output {
        name: "failure_domain",
        type_: "string",
        need: Need::Optional,
        roles: MACHINE,
        sets: "status.failureDomain (it must equal captf_failure_domain when that is set)",
    },
    Output {
        name: "interruptible",
        type_: "bool",
        need: Need::Optional,
        roles: MACHINE,
        sets: "status.interruptible",
    },
    Output {
        name: "provider_id_list",
        type_: "list(string)",
        need: Need::Required,
        roles: POOL,
        sets: "spec.providerIDList, complete (a Node whose providerID drops out is deleted by Cluster API)",
    },
    Output {
        name: "replicas",
        type_: "number",
        need: Need::Optional,
        roles: POOL,
        sets: "status.replicas (the length of provider_id_list when not declared)",
    },
    Output {
        name: "instances",
        type_: "list(object({ provider_id = string, addresses = optional(list(object({ type = string, address = string }))), failure_domain = optional(string) }))",
        need: Need::Optional,
        roles: POOL,
        sets: "status.instances, informational",
    },
];

/// The variables given only while they are true: `captf_hibernated`, while the module's
/// Cluster is in disposal with hibernation asked (docs/10-before-a-deletion.md). Given to
/// every module as `false` they would change every object's inputs, and re-apply the
/// whole fleet, when CAPTF learned them; a module declares them with `default = false`.
pub const CONDITIONAL: &[Variable] = &[Variable {
    name: HIBERNATED,
    type_: "bool",
    nullable: false,
    sensitive: false,
    roles: ALL,
    description: "true while the Cluster is in disposal with hibernation asked; given only then: declare it with `default = false`, and stop the machines or scale the pools to zero while it is true",
}];

/// The contract variable a module hibernates by.
pub const HIBERNATED: &str = "captf_hibernated";

/// The contract variables a module of `role` may declare: those always given, and the
/// conditional ones.
pub fn variables(role: Role) -> impl Iterator<Item = &'static Variable> {
    VARIABLES
        .iter()
        .chain(CONDITIONAL)
        .filter(move |v| v.roles.contains(&role))
}

/// The contract variables every apply of a module of `role` is given.
pub fn given(role: Role) -> impl Iterator<Item = &'static Variable> {
    VARIABLES.iter().filter(move |v| v.roles.contains(&role))
}

/// The outputs CAPTF reads from a module of `role`.
pub fn outputs(role: Role) -> impl Iterator<Item = &'static Output> {
    OUTPUTS.iter().filter(move |o| o.roles.contains(&role))
}

#[cfg(test)]
mod tests;
