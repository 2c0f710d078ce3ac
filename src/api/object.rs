//! One view over the three kinds, so that the reconcile, the facts and `captf explain` are
//! written once.

use k8s_openapi::NamespaceResourceScope;
use kube::Resource;
use kube::api::ObjectMeta;
use serde::Serialize;
use serde::de::DeserializeOwned;

use super::names::Kind;
use super::types::*;

/// Implemented by the three custom resources.
pub trait TerraformObject:
    Resource<DynamicType = (), Scope = NamespaceResourceScope>
    + Clone
    + std::fmt::Debug
    + Serialize
    + DeserializeOwned
    + Send
    + Sync
    + 'static
{
    const KIND: Kind;
    fn terraform(&self) -> &TerraformSpec;
    fn status(&self) -> Option<&TerraformStatus>;
}

impl TerraformObject for TerraformCluster {
    const KIND: Kind = Kind::TerraformCluster;
    fn terraform(&self) -> &TerraformSpec {
        &self.spec.terraform
    }
    fn status(&self) -> Option<&TerraformStatus> {
        self.status.as_ref()
    }
}

impl TerraformObject for TerraformMachine {
    const KIND: Kind = Kind::TerraformMachine;
    fn terraform(&self) -> &TerraformSpec {
        &self.spec.terraform
    }
    fn status(&self) -> Option<&TerraformStatus> {
        self.status.as_ref()
    }
}

impl TerraformObject for TerraformMachinePool {
    const KIND: Kind = Kind::TerraformMachinePool;
    fn terraform(&self) -> &TerraformSpec {
        &self.spec.terraform
    }
    fn status(&self) -> Option<&TerraformStatus> {
        self.status.as_ref()
    }
}

/// Any of the three kinds, for code that handles a mixed set (explain, orphans).
#[derive(Clone, Debug)]
pub enum AnyObject {
    Cluster(TerraformCluster),
    Machine(TerraformMachine),
    Pool(TerraformMachinePool),
}

impl AnyObject {
    pub fn kind(&self) -> Kind {
        match self {
            AnyObject::Cluster(_) => Kind::TerraformCluster,
            AnyObject::Machine(_) => Kind::TerraformMachine,
            AnyObject::Pool(_) => Kind::TerraformMachinePool,
        }
    }

    pub fn meta(&self) -> &ObjectMeta {
        match self {
            AnyObject::Cluster(o) => &o.metadata,
            AnyObject::Machine(o) => &o.metadata,
            AnyObject::Pool(o) => &o.metadata,
        }
    }

    pub fn terraform(&self) -> &TerraformSpec {
        match self {
            AnyObject::Cluster(o) => o.terraform(),
            AnyObject::Machine(o) => o.terraform(),
            AnyObject::Pool(o) => o.terraform(),
        }
    }

    pub fn status(&self) -> Option<&TerraformStatus> {
        match self {
            AnyObject::Cluster(o) => o.status.as_ref(),
            AnyObject::Machine(o) => o.status.as_ref(),
            AnyObject::Pool(o) => o.status.as_ref(),
        }
    }

    /// Builds the typed object from a JSON value whose `kind` is one of the three.
    pub fn from_value(
        kind: Kind,
        value: serde_json::Value,
    ) -> Result<AnyObject, serde_json::Error> {
        Ok(match kind {
            Kind::TerraformCluster => AnyObject::Cluster(serde_json::from_value(value)?),
            Kind::TerraformMachine => AnyObject::Machine(serde_json::from_value(value)?),
            Kind::TerraformMachinePool => AnyObject::Pool(serde_json::from_value(value)?),
        })
    }
}
