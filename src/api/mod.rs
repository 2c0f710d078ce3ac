//! The API: the three kinds, the names that are contracts, and the conditions.

pub mod conditions;
pub mod labels;
pub mod names;
pub mod object;
pub mod types;

pub use names::Kind;
pub use object::TerraformObject;
pub use types::*;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::CustomResourceExt;

/// The three CRDs, in the order `captf crds` prints them, each with the status fields of
/// its kind only ([`status_fields`]).
pub fn crds() -> Vec<CustomResourceDefinition> {
    vec![
        with_status_of(Kind::TerraformCluster, TerraformCluster::crd()),
        with_status_of(Kind::TerraformMachine, TerraformMachine::crd()),
        with_status_of(Kind::TerraformMachinePool, TerraformMachinePool::crd()),
    ]
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
        for (crd, kind) in crds().iter().zip(Kind::ALL) {
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
}
