//! `captf release-assets --version V --image REF DIR`: the files of a release, as
//! clusterctl's provider contract wants them beside each other. The components are the
//! install manifests of `config/default` (embedded, with this build's CRDs) with the
//! image and the manager flags that matter made clusterctl variables; `metadata.yaml` is
//! the repository's; the cluster templates and the ClusterClass are `release/`'s, as
//! they are. Everything is embedded: the command needs neither kustomize nor the
//! repository, and the integration tests check that the components are what
//! `kubectl kustomize config/default` builds, but for the variables.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Deserialize;
use serde_json::Value;

pub use super::image_ref::check_image;
use crate::api::names::{CAPI_PROVIDER_LABEL, CAPI_PROVIDER_NAME};

/// The namespace of the components (clusterctl's target namespace by default).
pub const NAMESPACE: &str = "captf-system";

/// The Deployment of the manager and its container (clusterctl wants it named `manager`).
pub const DEPLOYMENT: &str = "captf-manager";

pub const CONTAINER: &str = "manager";

/// The clusterctl variable of the manager image; its default is `--image`.
pub const IMAGE_VARIABLE: &str = "CAPTF_IMAGE";

/// A manager flag published as a clusterctl variable: `--flag=${VARIABLE:=default}`,
/// the default being the value `config/manager/manager.yaml` gives the flag (`captf
/// manager`'s own default, which a unit test checks).
#[derive(Clone, Copy, Debug)]
pub struct ManagerVariable {
    pub variable: &'static str,
    pub flag: &'static str,
}

/// The manager flags an operator sets at `clusterctl init` (docs/provisioning/05-clusterctl.md
/// says what each does). Not `--watch-filter` or `--namespace`: clusterctl takes an empty
/// default for "required", and they are empty by default.
pub const MANAGER_VARIABLES: [ManagerVariable; 6] = [
    ManagerVariable {
        variable: "CAPTF_CONCURRENCY",
        flag: "--concurrency",
    },
    ManagerVariable {
        variable: "CAPTF_MAX_STATE_READS",
        flag: "--max-state-reads",
    },
    ManagerVariable {
        variable: "CAPTF_DESTROY_BACKOFF_BASE",
        flag: "--destroy-backoff-base",
    },
    ManagerVariable {
        variable: "CAPTF_DESTROY_BACKOFF_MAX",
        flag: "--destroy-backoff-max",
    },
    ManagerVariable {
        variable: "CAPTF_PROVISION",
        flag: "--provision",
    },
    ManagerVariable {
        variable: "CAPTF_STATE_PROXY",
        flag: "--state-proxy",
    },
];

/// The install manifests of `config/default`, in its order (`../crd` is the CRDs,
/// [`crate::api::crds`]): a unit test checks this list against the kustomizations.
pub const CONFIG: [(&str, &str); 11] = [
    (
        "config/rbac/service_account.yaml",
        include_str!("../../config/rbac/service_account.yaml"),
    ),
    (
        "config/rbac/role.yaml",
        include_str!("../../config/rbac/role.yaml"),
    ),
    (
        "config/rbac/role_binding.yaml",
        include_str!("../../config/rbac/role_binding.yaml"),
    ),
    (
        "config/rbac/leader_election_role.yaml",
        include_str!("../../config/rbac/leader_election_role.yaml"),
    ),
    (
        "config/rbac/capi_aggregate_role.yaml",
        include_str!("../../config/rbac/capi_aggregate_role.yaml"),
    ),
    (
        "config/rbac/metrics_reader_role.yaml",
        include_str!("../../config/rbac/metrics_reader_role.yaml"),
    ),
    (
        "config/manager/namespace.yaml",
        include_str!("../../config/manager/namespace.yaml"),
    ),
    (
        "config/manager/manager.yaml",
        include_str!("../../config/manager/manager.yaml"),
    ),
    (
        "config/manager/metrics_service.yaml",
        include_str!("../../config/manager/metrics_service.yaml"),
    ),
    (
        "config/policy/template_immutability.yaml",
        include_str!("../../config/policy/template_immutability.yaml"),
    ),
    (
        "config/policy/machine_immutability.yaml",
        include_str!("../../config/policy/machine_immutability.yaml"),
    ),
];

/// The repository's `metadata.yaml`: which release series implements which contract.
pub const METADATA: &str = include_str!("../../metadata.yaml");

/// The cluster templates and the ClusterClass, published as they are.
pub const TEMPLATES: [(&str, &str); 5] = [
    (
        "cluster-template.yaml",
        include_str!("../../release/cluster-template.yaml"),
    ),
    (
        "cluster-template-machinepool.yaml",
        include_str!("../../release/cluster-template-machinepool.yaml"),
    ),
    (
        "cluster-template-topology.yaml",
        include_str!("../../release/cluster-template-topology.yaml"),
    ),
    (
        "clusterclass-terraform.yaml",
        include_str!("../../release/clusterclass-terraform.yaml"),
    ),
    (
        "cluster-template-offline.yaml",
        include_str!("../../release/cluster-template-offline.yaml"),
    ),
];

/// The kinds of the components that are not namespaced.
const CLUSTER_SCOPED: [&str; 6] = [
    "Namespace",
    "CustomResourceDefinition",
    "ClusterRole",
    "ClusterRoleBinding",
    "ValidatingAdmissionPolicy",
    "ValidatingAdmissionPolicyBinding",
];

/// Why the assets were not written. Each message names what was wrong and how to fix it.
#[derive(Debug, thiserror::Error)]
pub enum ReleaseError {
    #[error(
        "--version {0:?} is not a release version: use a semantic version with a leading v, e.g. v0.1.0 or v0.2.0-rc.1 (clusterctl reads only those)"
    )]
    Version(String),
    #[error(
        "--version {version}: metadata.yaml has no release series {major}.{minor}, so clusterctl would refuse the release; add one (major {major}, minor {minor}, contract v1beta2) to metadata.yaml's releaseSeries and build again (series there: {known})"
    )]
    NoReleaseSeries {
        version: String,
        major: u64,
        minor: u64,
        known: String,
    },
    #[error(
        "--image {image:?}: {why}; clusterctl refuses an image whose name is not canonical (\"repository name must be canonical\"): give the registry and the repository in full, e.g. ghcr.io/captf/captf:v0.1.0"
    )]
    Image { image: String, why: String },
    #[error("{0}: {1}")]
    Io(PathBuf, std::io::Error),
    /// The embedded manifests do not have the shape this command expects: a bug of the
    /// build, which the unit tests catch.
    #[error("the embedded {0} {1}")]
    Manifest(&'static str, String),
}

/// The files of a release, by name, in the order they are written.
pub fn assets(version: &str, image: &str) -> Result<Vec<(&'static str, String)>, ReleaseError> {
    check_version(version)?;
    check_image(image)?;
    let mut files = vec![
        ("infrastructure-components.yaml", components(image)?),
        ("metadata.yaml", METADATA.to_string()),
    ];
    files.extend(TEMPLATES.iter().map(|(n, t)| (*n, t.to_string())));
    Ok(files)
}

/// Writes [`assets`] into `dir` (made if absent; other files in it are left alone) and
/// returns the paths written.
pub fn write(dir: &Path, version: &str, image: &str) -> Result<Vec<PathBuf>, ReleaseError> {
    let files = assets(version, image)?;
    std::fs::create_dir_all(dir).map_err(|e| ReleaseError::Io(dir.to_path_buf(), e))?;
    let mut written = Vec::new();
    for (name, text) in files {
        let path = dir.join(name);
        std::fs::write(&path, text).map_err(|e| ReleaseError::Io(path.clone(), e))?;
        written.push(path);
    }
    Ok(written)
}

/// A release version: `v` and a semantic version. Its series `major.minor` must be one of
/// `metadata.yaml`'s, or clusterctl refuses it at `init`.
pub fn check_version(version: &str) -> Result<semver::Version, ReleaseError> {
    let parsed = version
        .strip_prefix('v')
        .and_then(|v| semver::Version::parse(v).ok())
        .ok_or_else(|| ReleaseError::Version(version.to_string()))?;
    let series = release_series()?;
    if !series
        .iter()
        .any(|s| s.major == parsed.major && s.minor == parsed.minor)
    {
        let known: Vec<String> = series
            .iter()
            .map(|s| format!("{}.{} ({})", s.major, s.minor, s.contract))
            .collect();
        return Err(ReleaseError::NoReleaseSeries {
            version: version.to_string(),
            major: parsed.major,
            minor: parsed.minor,
            known: known.join(", "),
        });
    }
    Ok(parsed)
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Metadata {
    release_series: Vec<ReleaseSeries>,
}

#[derive(Deserialize)]
pub struct ReleaseSeries {
    pub major: u64,
    pub minor: u64,
    pub contract: String,
}

/// The release series of the embedded `metadata.yaml`.
pub fn release_series() -> Result<Vec<ReleaseSeries>, ReleaseError> {
    let m: Metadata = serde_saphyr::from_str(METADATA)
        .map_err(|e| ReleaseError::Manifest("metadata.yaml", e.to_string()))?;
    Ok(m.release_series)
}

/// The components YAML: the objects of `config/default`, the Namespace first, then the
/// CRDs, then the rest in the kustomization's order; each labelled with the provider
/// label (and the manager's Pod template too), namespaced ones in [`NAMESPACE`], the
/// manager's image `${CAPTF_IMAGE:=<image>}` and the flags of [`MANAGER_VARIABLES`]
/// variables with their manifest's values as defaults.
pub fn components(image: &str) -> Result<String, ReleaseError> {
    let mut objects = component_objects()?;
    for o in &mut objects {
        label(o, &["metadata", "labels"]);
        if o["kind"] == "Deployment" && o["metadata"]["name"] == DEPLOYMENT {
            label(o, &["spec", "template", "metadata", "labels"]);
            manager_variables(o, image)?;
        }
    }
    check_scopes(&objects)?;
    let mut out = String::new();
    for o in &objects {
        let yaml = serde_saphyr::to_string(o)
            .map_err(|e| ReleaseError::Manifest("components", e.to_string()))?;
        out.push_str("---\n");
        out.push_str(&yaml);
    }
    Ok(out)
}

/// The objects of `config/default` as they are, in the order [`components`] writes them.
pub fn component_objects() -> Result<Vec<Value>, ReleaseError> {
    let mut rest = Vec::new();
    let mut namespaces = Vec::new();
    for (path, text) in CONFIG {
        let docs: Vec<Value> = serde_saphyr::from_multiple(text)
            .map_err(|e| ReleaseError::Manifest("manifest", format!("{path}: {e}")))?;
        for d in docs.into_iter().filter(|d| !d.is_null()) {
            if d["kind"] == "Namespace" {
                namespaces.push(d);
            } else {
                rest.push(d);
            }
        }
    }
    let mut objects = namespaces;
    for crd in crate::api::crds() {
        objects.push(
            serde_json::to_value(&crd)
                .map_err(|e| ReleaseError::Manifest("CRDs", e.to_string()))?,
        );
    }
    objects.extend(rest);
    Ok(objects)
}

fn label(o: &mut Value, path: &[&str]) {
    let mut node = o;
    for key in path {
        if !node[*key].is_object() {
            node[*key] = Value::Object(Default::default());
        }
        node = &mut node[*key];
    }
    node[CAPI_PROVIDER_LABEL] = Value::String(CAPI_PROVIDER_NAME.to_string());
}

/// Sets the manager container's image and makes its flags clusterctl variables.
fn manager_variables(deployment: &mut Value, image: &str) -> Result<(), ReleaseError> {
    let containers = deployment["spec"]["template"]["spec"]["containers"]
        .as_array_mut()
        .ok_or_else(|| {
            ReleaseError::Manifest("manager Deployment", "has no containers".to_string())
        })?;
    let manager = containers
        .iter_mut()
        .find(|c| c["name"] == CONTAINER)
        .ok_or_else(|| {
            ReleaseError::Manifest(
                "manager Deployment",
                format!("has no container named {CONTAINER}"),
            )
        })?;
    manager["image"] = Value::String(format!("${{{IMAGE_VARIABLE}:={image}}}"));
    let args = manager["args"]
        .as_array_mut()
        .ok_or_else(|| ReleaseError::Manifest("manager Deployment", "has no args".to_string()))?;
    for v in MANAGER_VARIABLES {
        let prefix = format!("{}=", v.flag);
        let arg = args
            .iter_mut()
            .find(|a| a.as_str().is_some_and(|a| a.starts_with(&prefix)))
            .ok_or_else(|| {
                ReleaseError::Manifest(
                    "manager Deployment",
                    format!("has no argument {}VALUE for {}", prefix, v.variable),
                )
            })?;
        let default = arg.as_str().unwrap_or_default()[prefix.len()..].to_string();
        if default.is_empty() {
            // clusterctl takes an empty default for a variable that must be set.
            return Err(ReleaseError::Manifest(
                "manager Deployment",
                format!("gives {} no value", v.flag),
            ));
        }
        *arg = Value::String(format!("{prefix}${{{}:={default}}}", v.variable));
    }
    Ok(())
}

/// clusterctl's rules for components: exactly one Namespace, every namespaced object in
/// it, the cluster-scoped ones in none.
fn check_scopes(objects: &[Value]) -> Result<(), ReleaseError> {
    let namespaces: Vec<&Value> = objects
        .iter()
        .filter(|o| o["kind"] == "Namespace")
        .collect();
    if namespaces.len() != 1 || namespaces[0]["metadata"]["name"] != NAMESPACE {
        return Err(ReleaseError::Manifest(
            "components",
            format!("must hold exactly one Namespace, {NAMESPACE}"),
        ));
    }
    let mut seen = BTreeMap::new();
    for o in objects {
        let kind = o["kind"].as_str().unwrap_or_default();
        let name = o["metadata"]["name"].as_str().unwrap_or_default();
        let ns = o["metadata"]["namespace"].as_str();
        let scoped_ok = if CLUSTER_SCOPED.contains(&kind) {
            ns.is_none()
        } else {
            ns == Some(NAMESPACE)
        };
        if !scoped_ok {
            return Err(ReleaseError::Manifest(
                "components",
                format!("{kind} {name} has namespace {ns:?}"),
            ));
        }
        if seen.insert((kind, name), ()).is_some() {
            return Err(ReleaseError::Manifest(
                "components",
                format!("hold {kind} {name} twice"),
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
#[path = "release_tests.rs"]
mod tests;
