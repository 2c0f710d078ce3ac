//! The cluster as a [`Source`] of a pass's apply observation: the manager's caches where it
//! has them (the watched Clusters, Machines and MachinePools, the state Secrets'
//! metadata, the bootstrap data and recorded values kept from an earlier read), else the
//! API server (`captf explain` without `-f`, and what no cache holds). What is read and in
//! which order is [`crate::gather::source::read_sources`]'s.

use std::sync::Arc;

use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, ApiResource, DynamicObject, ObjectMeta};
use kube::runtime::reflector::{ObjectRef, Store};
use serde_json::{Map, Value};

use super::{Context, Error, Scope};
use crate::api::TerraformObject;
use crate::api::names::{self, Kind};
use crate::gather::Observed;
use crate::gather::apply as gather_apply;
use crate::gather::source::Source;
use crate::state::permits::Lane;

/// The cluster, as a pass on the object of `scope` reads it.
pub struct Cluster<'a, K: TerraformObject> {
    pub ctx: &'a Context,
    pub scope: &'a Scope<K>,
}

impl<K: TerraformObject> Cluster<'_, K> {
    /// Cluster API's object `name` of `ar` in `ns`: from the manager's cache of its kind
    /// (`store`, watched), else read from the API server.
    async fn cached_or_read(
        &self,
        store: Option<&Store<DynamicObject>>,
        ar: &ApiResource,
        ns: &str,
        name: &str,
    ) -> Result<Option<Value>, Error> {
        let got = match store {
            Some(store) => store
                .get(&ObjectRef::new_with(name, ar.clone()).within(ns))
                .map(|g| g.as_ref().clone()),
            None => {
                Api::<DynamicObject>::namespaced_with(self.ctx.client.clone(), ns, ar)
                    .get_opt(name)
                    .await?
            }
        };
        Ok(got.map(|g| serde_json::to_value(g).unwrap_or_default()))
    }
}

impl<K: TerraformObject> Source for Cluster<'_, K> {
    type Error = Error;

    async fn referenced(&self, o: &mut Observed) -> Result<(), Error> {
        let (secrets, maps) = super::observe::read_referenced(&self.ctx.client, o, None).await?;
        o.referenced_secrets = secrets;
        o.referenced_config_maps = maps;
        Ok(())
    }

    async fn state_meta(
        &self,
        kind: Kind,
        ns: &str,
        name: &str,
    ) -> Result<Option<ObjectMeta>, Error> {
        if kind == K::KIND && ns == self.scope.namespace {
            return self.scope.secret_meta(name).await;
        }
        // Another kind's state Secrets are in its controller's cache.
        Ok(match self.ctx.caches(kind) {
            Some(c) => c.secret_meta(ns, name).map(|m| m.metadata.clone()),
            None => Api::<Secret>::namespaced(self.ctx.client.clone(), ns)
                .get_metadata_opt(name)
                .await?
                .map(|m| m.metadata),
        })
    }

    async fn cluster(&self, ns: &str, name: &str) -> Result<Option<Value>, Error> {
        let Some(ar) = self.ctx.cluster_api.resource() else {
            return Ok(None);
        };
        let clusters = self.scope.caches.as_ref().and_then(|c| c.clusters.as_ref());
        self.cached_or_read(clusters, ar, ns, name).await
    }

    async fn owner(
        &self,
        kind: &'static str,
        ns: &str,
        name: &str,
    ) -> Result<Option<Value>, Error> {
        let Some(ar) = self.ctx.cluster_api.resource() else {
            return Ok(None);
        };
        let owners = self.scope.caches.as_ref().and_then(|c| c.owners.as_ref());
        self.cached_or_read(owners, &super::owner_resource(ar, kind), ns, name)
            .await
    }

    async fn bootstrap(&self, ns: &str, name: &str) -> Result<Option<Secret>, Error> {
        // Kept from an earlier pass while the watch saw no other version of it.
        let kept = self
            .scope
            .caches
            .as_ref()
            .and_then(|c| c.bootstrap.as_ref());
        if let Some(s) = kept.and_then(|k| k.get(ns, name)) {
            return Ok(Some(s.as_ref().clone()));
        }
        let got = Api::<Secret>::namespaced(self.ctx.client.clone(), ns)
            .get_opt(name)
            .await?;
        if let (Some(k), Some(s)) = (kept, &got) {
            k.keep(s.clone());
        }
        Ok(got)
    }

    /// As an earlier pass kept them while the cache of the object's Secrets shows the
    /// version they were read at, else read (one GET) and kept. Without the manager's
    /// caches, always read.
    async fn recorded(&self) -> Result<Option<Map<String, Value>>, Error> {
        let (ctx, scope) = (self.ctx, self.scope);
        let name = names::inputs_secret_name(&scope.suffix);
        let cached = scope
            .caches
            .as_ref()
            .and_then(|c| c.secret_meta(&scope.namespace, &name))
            .and_then(|m| m.metadata.resource_version.clone());
        if let Some(kept) = cached.and_then(|rv| ctx.recorded.get(&scope.uid, &rv)) {
            return Ok(kept.map(|v| v.as_ref().clone()));
        }
        let secret = scope.secrets.get_opt(&name).await?;
        let values = secret
            .as_ref()
            .and_then(|s| gather_apply::recorded_values(s, &scope.namespace, &scope.suffix));
        let read_at = secret
            .as_ref()
            .and_then(|s| s.metadata.resource_version.as_deref());
        if scope.caches.is_some()
            && let Some(rv) = read_at
        {
            ctx.recorded
                .keep(&scope.uid, rv, values.clone().map(Arc::new));
        }
        Ok(values)
    }

    async fn terraform_cluster_provisioned(
        &self,
        ns: &str,
        name: &str,
    ) -> Result<Option<bool>, Error> {
        // The TerraformCluster controller's cache, else a read.
        let cached = self
            .ctx
            .caches(Kind::TerraformCluster)
            .and_then(|c| (c.provisioned)(ns, name));
        Ok(match cached {
            Some(p) => Some(p),
            None => Api::<crate::api::TerraformCluster>::namespaced(self.ctx.client.clone(), ns)
                .get_opt(name)
                .await?
                .map(|c| gather_apply::object_provisioned(&c)),
        })
    }

    /// Read once per version of the state's base Secret (see `Context::handoffs`), under
    /// a state-read permit.
    async fn handoff_outputs(
        &self,
        ns: &str,
        name: &str,
        base: &str,
        meta: &ObjectMeta,
    ) -> Result<Result<Value, String>, Error> {
        let ctx = self.ctx;
        let version = meta.resource_version.clone().unwrap_or_default();
        let key = format!("{ns}/{name}");
        let known = ctx
            .handoffs
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&key)
            .filter(|(v, _)| *v == version)
            .map(|(_, out)| out.clone());
        if let Some(out) = known {
            return Ok(Ok(out));
        }
        let _permit = ctx.state_reads.acquire(Lane::Ordinary).await;
        let suffix = names::state_suffix(Kind::TerraformCluster, name);
        let secrets = Api::<Secret>::namespaced(ctx.client.clone(), ns);
        let secrets = crate::state::secrets::read(&secrets, base, Some(&suffix)).await?;
        let out = match gather_apply::handoff_of(name, &secrets) {
            Ok(out) => out,
            Err(why) => return Ok(Err(why)),
        };
        ctx.handoffs
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(key, (version, out.clone()));
        Ok(Ok(out))
    }

    async fn read_state(&self, o: &mut Observed) -> Result<(), Error> {
        super::observe::read_state_into(
            &self.ctx.client,
            self.scope.caches.as_deref(),
            o,
            &self.ctx.state_reads,
        )
        .await?;
        Ok(())
    }
}
