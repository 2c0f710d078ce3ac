//! What one pass knows of its object before it reads anything else: the handles and names
//! every step of the pass uses, each made once.

use k8s_openapi::api::core::v1::Secret;
use kube::api::Api;
use kube::{Client, Resource, ResourceExt};

use std::sync::Arc;

use kube::api::ObjectMeta;

use super::{Caches, Error};
use crate::api::TerraformObject;
use crate::api::names;

/// The object of a pass, as the API server names it, and the APIs of its namespace.
pub struct Scope<K: TerraformObject> {
    /// The object's own kind in its namespace.
    pub api: Api<K>,
    /// The Secrets of the object's namespace (state, inputs, backup, attempt variables).
    pub secrets: Api<Secret>,
    pub client: Client,
    pub namespace: String,
    pub name: String,
    pub uid: String,
    /// Terraform's backend suffix of the object's state (`<name>.<short kind>`).
    pub suffix: String,
    /// The manager's caches of the kind (none for a pass a test runs without them).
    pub caches: Option<Arc<Caches>>,
}

impl<K: TerraformObject> Scope<K> {
    /// The scope of `obj`; an object without a namespace, name or uid (none read from the
    /// API server lacks them) is refused rather than acted on under an empty one.
    pub fn new(client: &Client, obj: &K) -> Result<Self, Error> {
        let missing = |what: &str| {
            Error::Incomplete(format!(
                "{} {:?} has no {what}; an object read from the API server always has one, so nothing is done to it",
                K::KIND,
                obj.name_any()
            ))
        };
        let namespace = obj.namespace().ok_or_else(|| missing("namespace"))?;
        let name = obj.meta().name.clone().ok_or_else(|| missing("name"))?;
        let uid = obj
            .meta()
            .uid
            .clone()
            .filter(|u| !u.is_empty())
            .ok_or_else(|| missing("uid"))?;
        Ok(Scope {
            api: Api::namespaced(client.clone(), &namespace),
            secrets: Api::namespaced(client.clone(), &namespace),
            client: client.clone(),
            suffix: names::state_suffix(K::KIND, &name),
            namespace,
            name,
            uid,
            caches: None,
        })
    }

    /// The object as what CAPTF makes for it names it.
    pub fn identity(&self) -> crate::api::labels::Identity<'_> {
        crate::api::labels::Identity {
            kind: K::KIND,
            namespace: &self.namespace,
            name: &self.name,
            uid: &self.uid,
        }
    }

    /// The metadata of the object's state Secrets as Terraform's labels find them (the
    /// base and its parts, by the state's suffix): from the cache of state Secrets, or
    /// listed without it. A base without the labels (restored by hand) is not among them.
    pub async fn labelled_state_metas(&self) -> Result<Vec<ObjectMeta>, Error> {
        let base = names::state_secret_name(&self.suffix);
        let mut metas: Vec<ObjectMeta> = match &self.caches {
            Some(c) => c
                .with_suffix(&self.namespace, &self.suffix)
                .iter()
                .map(|m| m.metadata.clone())
                .collect(),
            None => {
                let lp = kube::api::ListParams::default()
                    .labels(&crate::api::labels::suffix_selector(&self.suffix));
                self.secrets
                    .list_metadata(&lp)
                    .await?
                    .items
                    .into_iter()
                    .map(|m| m.metadata)
                    .collect()
            }
        };
        metas.retain(|m| {
            m.name
                .as_deref()
                .is_some_and(|n| n == base || names::part_index(&base, n).is_some())
        });
        Ok(metas)
    }

    /// The scope with the manager's caches of the kind.
    pub fn with_caches(mut self, caches: Option<Arc<Caches>>) -> Self {
        self.caches = caches;
        self
    }

    /// The metadata of Secret `name` of the object's namespace: from the caches, or read.
    pub async fn secret_meta(&self, name: &str) -> Result<Option<ObjectMeta>, Error> {
        Ok(match &self.caches {
            Some(c) => c
                .secret_meta(&self.namespace, name)
                .map(|m| m.metadata.clone()),
            None => self
                .secrets
                .get_metadata_opt(name)
                .await?
                .map(|m| m.metadata),
        })
    }

    /// An API of kind `T` in the object's namespace.
    pub fn api_of<T>(&self) -> Api<T>
    where
        T: Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>,
    {
        Api::namespaced(self.client.clone(), &self.namespace)
    }
}
