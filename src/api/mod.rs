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

/// The three CRDs, in the order `captf crds` prints them.
pub fn crds() -> Vec<CustomResourceDefinition> {
    vec![
        TerraformCluster::crd(),
        TerraformMachine::crd(),
        TerraformMachinePool::crd(),
    ]
}
