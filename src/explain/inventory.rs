//! The objects of a set of files, sorted by kind, each checked for what explain needs
//! (a kind it knows, a name, a namespace). Bad input is an error naming the file and
//! the object, never a guess.

use std::collections::BTreeSet;

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Pod, Secret};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use serde::de::DeserializeOwned;
use serde_json::Value;

use super::load::Loaded;
use crate::api::Kind;
use crate::api::names::{CAPI_GROUP, GROUP};
use crate::api::object::AnyObject;

/// Everything explain read, by kind.
#[derive(Default, Debug)]
pub struct Inventory {
    /// The CAPTF objects, with the file each came from.
    pub objects: Vec<(String, AnyObject)>,
    /// `cluster.x-k8s.io` Clusters, kept as JSON (any version).
    pub clusters: Vec<Value>,
    /// Cluster API Machines and MachinePools (the owners of machines and pools).
    pub machines: Vec<Value>,
    pub jobs: Vec<Job>,
    pub pods: Vec<Pod>,
    pub secrets: Vec<Secret>,
    pub config_maps: Vec<ConfigMap>,
    pub leases: Vec<Lease>,
    pub namespaces: Vec<Namespace>,
    pub crds: Vec<CustomResourceDefinition>,
}

#[derive(Debug, thiserror::Error)]
pub enum InventoryError {
    #[error(
        "{source_file}: {what}: captf explain reads TerraformCluster, TerraformMachine, TerraformMachinePool, Cluster, Job, Pod, Secret, ConfigMap, Lease, Namespace and CustomResourceDefinition objects (Events, RBAC and other Cluster API kinds are skipped); remove this object from the input"
    )]
    UnknownKind { source_file: String, what: String },
    #[error("{source_file}: {what} has no metadata.name")]
    NoName { source_file: String, what: String },
    #[error(
        "{source_file}: {what} has no metadata.namespace; kubectl get -o yaml writes it for namespaced objects: add it"
    )]
    NoNamespace { source_file: String, what: String },
    #[error("{source_file}: {what} is not a valid object of its kind: {message}")]
    Invalid {
        source_file: String,
        what: String,
        message: String,
    },
    #[error("{source_file}: {what} appears twice (also in {first}); pass each object once")]
    Duplicate {
        source_file: String,
        what: String,
        first: String,
    },
}

/// Kinds that may appear in a dump of a namespace and do not matter to a deletion.
fn skipped(group: &str, kind: &str) -> bool {
    matches!(
        (group, kind),
        ("" | "events.k8s.io", "Event") | ("", "ServiceAccount") | ("rbac.authorization.k8s.io", _)
    ) || (group == CAPI_GROUP && !matches!(kind, "Cluster" | "Machine" | "MachinePool"))
        || (group == GROUP && kind.ends_with("Template"))
}

impl Inventory {
    pub fn from_loaded(loaded: Vec<Loaded>) -> Result<Inventory, InventoryError> {
        let mut inv = Inventory::default();
        let mut seen: Vec<((String, String, String, String), String)> = Vec::new();
        for Loaded { source, value } in loaded {
            let api_version = value["apiVersion"].as_str().unwrap_or_default().to_string();
            let group = api_version
                .rsplit_once('/')
                .map(|(g, _)| g)
                .unwrap_or("")
                .to_string();
            let kind = value["kind"].as_str().unwrap_or_default().to_string();
            let name = value["metadata"]["name"]
                .as_str()
                .unwrap_or_default()
                .to_string();
            let namespace = value["metadata"]["namespace"]
                .as_str()
                .unwrap_or_default()
                .to_string();
            let what = if name.is_empty() {
                format!("a {kind}")
            } else {
                format!("{kind} {name}")
            };
            if skipped(&group, &kind) {
                continue;
            }
            let cluster_scoped = matches!(kind.as_str(), "Namespace" | "CustomResourceDefinition");
            if name.is_empty() {
                return Err(InventoryError::NoName {
                    source_file: source,
                    what,
                });
            }
            if !cluster_scoped && namespace.is_empty() {
                return Err(InventoryError::NoNamespace {
                    source_file: source,
                    what,
                });
            }
            let key = (group.clone(), kind.clone(), namespace.clone(), name.clone());
            if let Some((_, first)) = seen.iter().find(|(k, _)| *k == key) {
                return Err(InventoryError::Duplicate {
                    source_file: source,
                    what,
                    first: first.clone(),
                });
            }
            seen.push((key, source.clone()));
            let invalid = |e: serde_json::Error| InventoryError::Invalid {
                source_file: source.clone(),
                what: what.clone(),
                message: e.to_string(),
            };
            match (group.as_str(), kind.as_str()) {
                (GROUP, k) if Kind::parse(k).is_some_and(|kind| kind.as_str() == k) => {
                    let kind = Kind::parse(k).unwrap_or(Kind::TerraformMachine);
                    let object = AnyObject::from_value(kind, value).map_err(invalid)?;
                    inv.objects.push((source, object));
                }
                (CAPI_GROUP, "Cluster") => inv.clusters.push(value),
                (CAPI_GROUP, "Machine" | "MachinePool") => inv.machines.push(value),
                ("batch", "Job") => inv.jobs.push(typed(value).map_err(invalid)?),
                ("", "Pod") => inv.pods.push(typed(value).map_err(invalid)?),
                ("", "Secret") => inv.secrets.push(typed(value).map_err(invalid)?),
                ("", "ConfigMap") => inv.config_maps.push(typed(value).map_err(invalid)?),
                ("", "Namespace") => inv.namespaces.push(typed(value).map_err(invalid)?),
                ("coordination.k8s.io", "Lease") => inv.leases.push(typed(value).map_err(invalid)?),
                ("apiextensions.k8s.io", "CustomResourceDefinition") => {
                    inv.crds.push(typed(value).map_err(invalid)?)
                }
                _ => {
                    let what = format!("{what} ({api_version})");
                    return Err(InventoryError::UnknownKind {
                        source_file: source,
                        what,
                    });
                }
            }
        }
        Ok(inv)
    }

    /// The namespaces the objects live in.
    pub fn namespaces_of_objects(&self) -> BTreeSet<String> {
        self.objects
            .iter()
            .filter_map(|(_, o)| o.meta().namespace.clone())
            .collect()
    }
}

fn typed<T: DeserializeOwned>(value: Value) -> Result<T, serde_json::Error> {
    serde_json::from_value(value)
}
