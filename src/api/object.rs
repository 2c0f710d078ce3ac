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
    /// A TerraformCluster's `spec.controlPlaneEndpoint` (set from its module's outputs);
    /// none for the other kinds.
    fn control_plane_endpoint(&self) -> Option<&ApiEndpoint>;
}

/// The three impls, alike but for the type, its kind and its variant of [`AnyObject`].
macro_rules! terraform_object {
    ($($type:ty => $kind:expr, $variant:ident, |$o:ident| $endpoint:expr);+ $(;)?) => {$(
        impl From<$type> for AnyObject {
            fn from(o: $type) -> Self {
                AnyObject::$variant(o)
            }
        }

        impl TerraformObject for $type {
            const KIND: Kind = $kind;
            fn terraform(&self) -> &TerraformSpec {
                &self.spec.terraform
            }
            fn status(&self) -> Option<&TerraformStatus> {
                self.status.as_ref()
            }
            fn control_plane_endpoint(&self) -> Option<&ApiEndpoint> {
                let $o = self;
                $endpoint
            }
        }
    )+};
}

terraform_object! {
    TerraformCluster => Kind::TerraformCluster, Cluster, |o| o.spec.control_plane_endpoint.as_ref();
    TerraformMachine => Kind::TerraformMachine, Machine, |_o| None;
    TerraformMachinePool => Kind::TerraformMachinePool, Pool, |_o| None;
}

/// The one dispatcher from a [`Kind`] to its type: evaluates `$body` with `$k` naming the
/// type of `$kind` (`with_kind!(kind, K => explain::<K>(..))`).
#[macro_export]
macro_rules! with_kind {
    ($kind:expr, $k:ident => $body:expr) => {
        match $kind {
            $crate::api::Kind::TerraformCluster => {
                type $k = $crate::api::TerraformCluster;
                $body
            }
            $crate::api::Kind::TerraformMachine => {
                type $k = $crate::api::TerraformMachine;
                $body
            }
            $crate::api::Kind::TerraformMachinePool => {
                type $k = $crate::api::TerraformMachinePool;
                $body
            }
        }
    };
}

/// `$body` with `$o` bound to the typed object inside an [`AnyObject`].
macro_rules! any {
    ($object:expr, $o:ident => $body:expr) => {
        match $object {
            AnyObject::Cluster($o) => $body,
            AnyObject::Machine($o) => $body,
            AnyObject::Pool($o) => $body,
        }
    };
}

fn kind_of<K: TerraformObject>(_: &K) -> Kind {
    K::KIND
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
        any!(self, o => kind_of(o))
    }

    pub fn meta(&self) -> &ObjectMeta {
        any!(self, o => &o.metadata)
    }

    pub fn terraform(&self) -> &TerraformSpec {
        any!(self, o => o.terraform())
    }

    pub fn status(&self) -> Option<&TerraformStatus> {
        any!(self, o => o.status.as_ref())
    }

    pub fn control_plane_endpoint(&self) -> Option<&ApiEndpoint> {
        any!(self, o => o.control_plane_endpoint())
    }

    /// Builds the typed object from a JSON value whose `kind` is one of the three.
    pub fn from_value(
        kind: Kind,
        value: serde_json::Value,
    ) -> Result<AnyObject, serde_json::Error> {
        fn typed<K: TerraformObject + Into<AnyObject>>(
            value: serde_json::Value,
        ) -> Result<AnyObject, serde_json::Error> {
            Ok(serde_json::from_value::<K>(value)?.into())
        }
        crate::with_kind!(kind, K => typed::<K>(value))
    }
}
