//! The API: the three kinds and their three templates, the names that are contracts, and
//! the conditions.

pub mod conditions;
pub mod identity;
pub mod labels;
pub mod names;
pub mod object;
pub mod templates;
pub mod types;

pub use identity::{IdentityRef, TerraformClusterIdentity, TerraformClusterIdentitySpec};
pub use names::{Kind, TemplateKind};
pub use object::TerraformObject;
pub use templates::*;
pub use types::*;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::CustomResourceExt;

/// The seven CRDs, in the order `captf crds` prints them: the three kinds, each with the
/// status fields of its kind only ([`status_fields`]), then their templates
/// ([`template_crds`]), then the identity kind ([`TerraformClusterIdentity`]).
pub fn crds() -> Vec<CustomResourceDefinition> {
    let mut all = object_crds();
    all.extend(template_crds());
    all.push(TerraformClusterIdentity::crd());
    all
}

/// The CRDs of the three kinds, in [`Kind::ALL`]'s order.
pub fn object_crds() -> Vec<CustomResourceDefinition> {
    vec![
        with_status_of(Kind::TerraformCluster, TerraformCluster::crd()),
        with_status_of(Kind::TerraformMachine, TerraformMachine::crd()),
        with_status_of(Kind::TerraformMachinePool, TerraformMachinePool::crd()),
    ]
}

/// The CRDs of the three template kinds, in [`TemplateKind::ALL`]'s order. Each
/// `spec.template.spec` is its kind's spec without the fields CAPTF sets from the
/// module's outputs ([`owned_spec_field`]).
pub fn template_crds() -> Vec<CustomResourceDefinition> {
    vec![
        TerraformClusterTemplate::crd(),
        TerraformMachineTemplate::crd(),
        TerraformMachinePoolTemplate::crd(),
    ]
}

/// The field of a kind's spec that CAPTF sets from the module's outputs, and a template
/// leaves out: Cluster API's contract field of that kind.
pub fn owned_spec_field(kind: Kind) -> &'static str {
    match kind {
        Kind::TerraformCluster => "controlPlaneEndpoint",
        Kind::TerraformMachine => "providerID",
        Kind::TerraformMachinePool => "providerIDList",
    }
}

/// The status fields every kind has: the conditions and the generation they are for, and
/// Cluster API's `initialization`.
const SHARED_STATUS_FIELDS: [&str; 3] = ["conditions", "observedGeneration", "initialization"];

/// The fields of `status` a kind's CRD serves: the shared ones, then the kind's own (the
/// fields Cluster API reads from that kind, set from its module's outputs). The Rust type
/// is one, [`TerraformStatus`]; the API is per kind: the API server prunes a field another
/// kind has, so neither a bug nor a person can put one on the wrong kind.
pub fn status_fields(kind: Kind) -> Vec<&'static str> {
    let own: &[&str] = match kind {
        Kind::TerraformCluster => &["failureDomains"],
        Kind::TerraformMachine => &["addresses", "failureDomain", "interruptible"],
        Kind::TerraformMachinePool => &["replicas", "ready", "instances"],
    };
    SHARED_STATUS_FIELDS.iter().chain(own).copied().collect()
}

/// `crd` with the status schema narrowed to `kind`'s fields.
fn with_status_of(kind: Kind, mut crd: CustomResourceDefinition) -> CustomResourceDefinition {
    let fields = status_fields(kind);
    for version in &mut crd.spec.versions {
        let status = version
            .schema
            .as_mut()
            .and_then(|s| s.open_api_v3_schema.as_mut())
            .and_then(|s| s.properties.as_mut())
            .and_then(|p| p.get_mut("status"));
        if let Some(status) = status {
            status.description = Some(format!(
                "The status of a {}. A cache: the deletion never depends on it.",
                kind.as_str()
            ));
            if let Some(props) = status.properties.as_mut() {
                props.retain(|name, _| fields.contains(&name.as_str()));
            }
        }
    }
    crd
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status_properties(crd: &CustomResourceDefinition) -> Vec<String> {
        let schema = crd.spec.versions[0]
            .schema
            .as_ref()
            .and_then(|s| s.open_api_v3_schema.as_ref())
            .expect("schema");
        let status = &schema.properties.as_ref().expect("properties")["status"];
        let mut names: Vec<String> = status
            .properties
            .as_ref()
            .expect("status properties")
            .keys()
            .cloned()
            .collect();
        names.sort();
        names
    }

    #[test]
    fn each_crd_serves_its_kinds_status_fields_and_together_every_field() {
        let mut served = Vec::new();
        for (crd, kind) in object_crds().iter().zip(Kind::ALL) {
            let mut expected: Vec<String> =
                status_fields(kind).into_iter().map(String::from).collect();
            expected.sort();
            assert_eq!(status_properties(crd), expected, "{kind:?}");
            served.extend(expected);
        }
        served.sort();
        served.dedup();
        // Every field of the shared type is some kind's: a new one must be given to one.
        assert_eq!(served, status_properties(&TerraformMachine::crd()));
    }

    fn spec_schema(crd: &CustomResourceDefinition) -> serde_json::Value {
        let schema = crd.spec.versions[0]
            .schema
            .as_ref()
            .and_then(|s| s.open_api_v3_schema.as_ref())
            .expect("schema");
        serde_json::to_value(&schema.properties.as_ref().expect("properties")["spec"])
            .expect("schema")
    }

    /// Cluster API's rule for templates: `spec.template.spec` is no stricter than the
    /// object's spec, and every field it lacks is optional in the object. Here it is the
    /// object's spec exactly, less the field CAPTF sets from the outputs.
    #[test]
    fn each_template_spec_is_its_kinds_spec_without_the_owned_field() {
        for (template, kind) in template_crds().iter().zip(TemplateKind::ALL) {
            let object = &object_crds()[Kind::ALL
                .iter()
                .position(|k| *k == kind.object_kind())
                .expect("kind")];
            assert_eq!(
                template.metadata.name.as_deref(),
                Some(kind.crd_name().as_str())
            );
            let mut expected = spec_schema(object);
            let owned = owned_spec_field(kind.object_kind());
            let props = expected["properties"].as_object_mut().expect("properties");
            assert!(props.remove(owned).is_some(), "{kind}: {owned}");
            let required = expected["required"].as_array().cloned().unwrap_or_default();
            assert!(
                !required.iter().any(|r| r == owned),
                "{owned} is optional in a {}",
                kind.object_kind()
            );
            let spec = spec_schema(template);
            let inner = &spec["properties"]["template"]["properties"]["spec"];
            assert_eq!(inner["properties"], expected["properties"], "{kind}");
            assert_eq!(inner["required"], expected["required"], "{kind}");
            assert_eq!(
                spec["properties"]["template"]["properties"]["metadata"]["properties"]
                    .as_object()
                    .map(|p| p.keys().cloned().collect::<Vec<_>>()),
                Some(vec!["annotations".to_string(), "labels".to_string()]),
                "{kind}: spec.template.metadata is labels and annotations"
            );
        }
    }

    #[test]
    fn templates_carry_the_contract_labels_short_names_and_no_status_but_the_machines() {
        for (crd, kind) in template_crds().iter().zip(TemplateKind::ALL) {
            let labels = crd.metadata.labels.clone().unwrap_or_default();
            assert_eq!(
                labels.get(names::CAPI_CONTRACT_LABEL).map(String::as_str),
                Some(names::CAPI_CONTRACT_VERSION)
            );
            assert_eq!(
                labels
                    .get("clusterctl.cluster.x-k8s.io")
                    .map(String::as_str),
                Some("")
            );
            let n = &crd.spec.names;
            assert_eq!(n.kind, kind.as_str());
            assert_eq!(n.plural, kind.plural());
            assert_eq!(
                n.short_names.as_deref(),
                Some(&[kind.short_name().to_string()][..])
            );
            assert_eq!(
                n.categories.as_deref(),
                Some(&["cluster-api".to_string()][..])
            );
            let status = crd.spec.versions[0]
                .schema
                .as_ref()
                .and_then(|s| s.open_api_v3_schema.as_ref())
                .and_then(|s| s.properties.as_ref())
                .and_then(|p| p.get("status").cloned());
            match kind {
                TemplateKind::TerraformMachineTemplate => {
                    let fields: Vec<String> = status
                        .and_then(|s| s.properties)
                        .map(|p| p.keys().cloned().collect())
                        .unwrap_or_default();
                    assert_eq!(fields, ["capacity", "nodeInfo"], "{kind}");
                }
                _ => assert!(status.is_none(), "{kind} has no status"),
            }
        }
    }
}
