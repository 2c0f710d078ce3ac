//! The three template kinds Cluster API makes objects from (a MachineDeployment's, a
//! MachinePool's and a ClusterClass's references): each a spec of the kind without what
//! CAPTF sets from the module's outputs, and what the autoscaler reads of it.

// Each `printcolumn(...)` repeats `type_ = "string"`; clippy reads that as a duplicated
// attribute, though they are separate columns.
#![allow(clippy::duplicated_attributes)]

use std::collections::BTreeMap;

use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::types::TerraformSpec;

/// Labels and annotations for the objects made from a template (Cluster API's
/// `ObjectMeta` of a template: nothing else of an object's metadata).
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq, Eq)]
pub struct TemplateMetadata {
    /// Labels given to each object made from the template.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    /// Annotations given to each object made from the template.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
}

// One shape for the three template kinds: each kind's spec is the shared `TerraformSpec`
// plus the field CAPTF sets from the module's outputs (`api::owned_spec_field`), which a
// template leaves out.

/// What Cluster API gives each object it makes from the template: its labels and
/// annotations, and its spec.
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
pub struct TemplateResource {
    /// Labels and annotations of the objects made from the template.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<TemplateMetadata>,
    /// The spec of each object made from the template: the object's spec without the
    /// fields CAPTF sets from the module's outputs (a TerraformCluster's
    /// controlPlaneEndpoint, a TerraformMachine's providerID, a TerraformMachinePool's
    /// providerIDList). Immutable once created (the ValidatingAdmissionPolicy of
    /// config/policy/): a change is a new template, rolled out by Cluster API.
    pub spec: TerraformSpec,
}

/// The template of the TerraformClusters a ClusterClass makes (Cluster API's
/// InfraClusterTemplate). Owns no infrastructure: CAPTF does not reconcile it.
#[derive(CustomResource, Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[kube(
    group = "infrastructure.cluster.x-k8s.io",
    version = "v1alpha1",
    kind = "TerraformClusterTemplate",
    namespaced,
    shortname = "tfct",
    category = "cluster-api",
    label("cluster.x-k8s.io/v1beta2", "v1alpha1"),
    label("clusterctl.cluster.x-k8s.io", ""),
    doc = "A template of TerraformClusters, for ClusterClasses. Owns no infrastructure.",
    printcolumn(
        name = "ClusterClass",
        type_ = "string",
        json_path = ".metadata.ownerReferences[?(@.kind==\"ClusterClass\")].name"
    ),
    printcolumn(
        name = "Cluster",
        type_ = "string",
        json_path = ".metadata.labels['cluster\\.x-k8s\\.io/cluster-name']"
    ),
    printcolumn(
        name = "Module",
        type_ = "string",
        json_path = ".spec.template.spec.module.source",
        priority = 1
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
pub struct TerraformClusterTemplateSpec {
    pub template: TemplateResource,
}

/// The template of the TerraformMachines a MachineDeployment, a MachineSet or a control
/// plane makes (Cluster API's InfraMachineTemplate). Owns no infrastructure: CAPTF does
/// not reconcile it.
#[derive(CustomResource, Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[kube(
    group = "infrastructure.cluster.x-k8s.io",
    version = "v1alpha1",
    kind = "TerraformMachineTemplate",
    namespaced,
    status = "TerraformMachineTemplateStatus",
    shortname = "tfmt",
    category = "cluster-api",
    label("cluster.x-k8s.io/v1beta2", "v1alpha1"),
    label("clusterctl.cluster.x-k8s.io", ""),
    doc = "A template of TerraformMachines, for MachineDeployments, control planes and ClusterClasses. Owns no infrastructure.",
    printcolumn(
        name = "ClusterClass",
        type_ = "string",
        json_path = ".metadata.ownerReferences[?(@.kind==\"ClusterClass\")].name"
    ),
    printcolumn(
        name = "Cluster",
        type_ = "string",
        json_path = ".metadata.labels['cluster\\.x-k8s\\.io/cluster-name']"
    ),
    printcolumn(
        name = "Module",
        type_ = "string",
        json_path = ".spec.template.spec.module.source",
        priority = 1
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
pub struct TerraformMachineTemplateSpec {
    pub template: TemplateResource,
}

/// What a machine made from a TerraformMachineTemplate offers, for the cluster
/// autoscaler to scale a MachineDeployment up from zero (Cluster API's
/// InfraMachineTemplate contract). CAPTF does not set it: a template applies no module,
/// so nothing tells it a machine's size (docs/decisions.md).
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct TerraformMachineTemplateStatus {
    /// The resources of a Node made from this template (`cpu`, `memory`, …).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(schema_with = "resource_list")]
    pub capacity: BTreeMap<String, k8s_openapi::apimachinery::pkg::api::resource::Quantity>,
    /// The architecture and operating system of a Node made from this template.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_info: Option<NodeInfo>,
}

/// Cluster API's `NodeInfo` of an InfraMachineTemplate.
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct NodeInfo {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub architecture: Option<Architecture>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub operating_system: Option<OperatingSystem>,
}

/// A Node's CPU architecture, as Cluster API names them.
#[derive(Clone, Copy, Debug, Serialize, Deserialize, JsonSchema, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum Architecture {
    Amd64,
    Arm64,
    S390x,
    Ppc64le,
}

/// A Node's operating system, as Cluster API names them.
#[derive(Clone, Copy, Debug, Serialize, Deserialize, JsonSchema, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum OperatingSystem {
    Linux,
    Windows,
}

/// A `ResourceList`, as Kubernetes' own types describe one: quantities by resource name.
fn resource_list(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "type": "object",
        "additionalProperties": {
            "pattern": "^(\\+|-)?(([0-9]+(\\.[0-9]*)?)|(\\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|([eE](\\+|-)?(([0-9]+(\\.[0-9]*)?)|(\\.[0-9]+))))?$",
            "x-kubernetes-int-or-string": true
        }
    })
}

/// The template of the TerraformMachinePools a ClusterClass makes (Cluster API's
/// InfraMachinePoolTemplate). Owns no infrastructure: CAPTF does not reconcile it.
#[derive(CustomResource, Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[kube(
    group = "infrastructure.cluster.x-k8s.io",
    version = "v1alpha1",
    kind = "TerraformMachinePoolTemplate",
    namespaced,
    shortname = "tfmpt",
    category = "cluster-api",
    label("cluster.x-k8s.io/v1beta2", "v1alpha1"),
    label("clusterctl.cluster.x-k8s.io", ""),
    doc = "A template of TerraformMachinePools, for ClusterClasses. Owns no infrastructure.",
    printcolumn(
        name = "ClusterClass",
        type_ = "string",
        json_path = ".metadata.ownerReferences[?(@.kind==\"ClusterClass\")].name"
    ),
    printcolumn(
        name = "Cluster",
        type_ = "string",
        json_path = ".metadata.labels['cluster\\.x-k8s\\.io/cluster-name']"
    ),
    printcolumn(
        name = "Module",
        type_ = "string",
        json_path = ".spec.template.spec.module.source",
        priority = 1
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
pub struct TerraformMachinePoolTemplateSpec {
    pub template: TemplateResource,
}
