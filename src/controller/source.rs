//! The cluster as the [`Source`] of a pass's observation: the manager's caches where it
//! has them (the Jobs and Pods, the watched Clusters, Machines and MachinePools, the CRD,
//! the Namespaces, the machines and pools of a cluster, the state Secrets' metadata, the
//! bootstrap data and recorded values kept from an earlier read), else the API server
//! (`captf explain` without `-f`, and what no cache holds or must be read live: the state
//! and what is read beside it, the Secrets and ConfigMaps the spec references, Nodes,
//! Events). What is read and in which order is [`crate::gather::source`]'s.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use jiff::Timestamp;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Namespace, Pod, Secret};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, ApiResource, DynamicObject, ListParams, ObjectMeta};
use kube::runtime::reflector::{ObjectRef, Store};
use serde_json::{Map, Value};

use super::caches::namesakes as caches_namesakes;
use super::observe;
use super::{ClusterKind, Context, Error, Scope};
use crate::api::TerraformObject;
use crate::api::labels::namesake_selector;
use crate::api::names::{self, Kind};
use crate::gather::apply as gather_apply;
use crate::gather::source::{Source, StateRead};
use crate::gather::{self, Observed, StateWanted};
use crate::state::permits::Lane;

/// The cluster, as a pass on the object of `scope` reads it.
pub struct Cluster<'a, K: TerraformObject> {
    ctx: &'a Context,
    scope: &'a Scope<K>,
    /// The lane of the pass's state-read permit ([`Lane`]).
    lane: Lane,
    /// Whether the Jobs were listed from the API server (the cache lacked the running
    /// attempt's Job): the Pods are then listed too, not taken from the cache.
    jobs_listed: AtomicBool,
}

impl<'a, K: TerraformObject> Cluster<'a, K> {
    pub fn new(ctx: &'a Context, scope: &'a Scope<K>, lane: Lane) -> Self {
        Cluster {
            ctx,
            scope,
            lane,
            jobs_listed: AtomicBool::new(false),
        }
    }

    fn caches(&self) -> Option<&super::Caches> {
        self.scope.caches.as_deref()
    }

    /// The object's Secret `name` as the manager kept it, when the cache of the object's
    /// Secrets shows the version kept (or what the manager's write of it replaced:
    /// [`super::caches::KeptInputs`]); never without the manager's caches.
    fn kept(&self, name: &str) -> Option<Arc<Secret>> {
        let caches = self.caches()?;
        let shown = caches
            .secret_meta(&self.scope.namespace, name)
            .and_then(|m| m.metadata.resource_version.clone());
        self.ctx
            .kept_inputs
            .get(&self.scope.uid, name, shown.as_deref())
    }

    /// The object's inputs Secret as kept ([`Cluster::kept`]).
    fn kept_inputs(&self) -> Option<Arc<Secret>> {
        self.kept(&names::inputs_secret_name(&self.scope.suffix))
    }

    /// Keeps the object's inputs Secret as read (with the manager's caches only).
    fn keep_inputs(&self, secret: &Secret) {
        if self.caches().is_some() {
            self.ctx.kept_inputs.keep_read(&self.scope.uid, secret);
        }
    }

    /// The `T`s (Jobs, Pods) made for objects of `kind` named `name` in the namespace,
    /// listed from the API server.
    async fn list_namesakes<T>(&self, kind: Kind, name: &str) -> Result<Vec<T>, Error>
    where
        T: kube::Resource<Scope = kube::core::NamespaceResourceScope, DynamicType = ()>
            + Clone
            + serde::de::DeserializeOwned
            + std::fmt::Debug,
    {
        let lp = ListParams::default().labels(&namesake_selector(kind, name));
        Ok(
            Api::<T>::namespaced(self.ctx.client.clone(), &self.scope.namespace)
                .list(&lp)
                .await?
                .items,
        )
    }

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

    fn cluster_api(&self) -> Result<(), String> {
        match &self.ctx.cluster_api {
            ClusterKind::Known(_) => Ok(()),
            ClusterKind::Unknown(why) => Err(why.clone()),
        }
    }

    fn now(&self) -> Timestamp {
        Timestamp::now()
    }

    /// From the cache, unless it lacks the Job of the attempt the object says runs
    /// ([`gather::started_job_unseen`], which looks at this object's Jobs only).
    async fn jobs(&self, kind: Kind, meta: &ObjectMeta) -> Result<Vec<Job>, Error> {
        let ns = &self.scope.namespace;
        let name = meta.name.as_deref().unwrap_or_default();
        let cached = self
            .caches()
            .map(|c| caches_namesakes(&c.jobs, &c.jobs_by_owner, kind, ns, name))
            .filter(|jobs| !gather::started_job_unseen(meta, kind, jobs));
        self.jobs_listed.store(cached.is_none(), Ordering::Relaxed);
        Ok(match cached {
            Some(jobs) => jobs,
            None => self.list_namesakes(kind, name).await?,
        })
    }

    async fn pods(&self, kind: Kind, meta: &ObjectMeta) -> Result<Vec<Pod>, Error> {
        let ns = &self.scope.namespace;
        let name = meta.name.as_deref().unwrap_or_default();
        Ok(
            match self
                .caches()
                .filter(|_| !self.jobs_listed.load(Ordering::Relaxed))
            {
                Some(c) => caches_namesakes(&c.pods, &c.pods_by_owner, kind, ns, name),
                None => self.list_namesakes(kind, name).await?,
            },
        )
    }

    async fn crd_deleting(&self, kind: Kind) -> Result<bool, Error> {
        if let Some(c) = self.caches() {
            return Ok(c
                .crd
                .get(&ObjectRef::new(&kind.crd_name()))
                .is_some_and(|m| m.metadata.deletion_timestamp.is_some()));
        }
        // A failed read fails the pass: it must never count as "the CRD is not being
        // deleted", or a transient error during an uninstall would start a destroy.
        Ok(
            Api::<CustomResourceDefinition>::all(self.ctx.client.clone())
                .get_opt(&kind.crd_name())
                .await?
                .is_some_and(|c| c.metadata.deletion_timestamp.is_some()),
        )
    }

    async fn namespace_terminating(&self, ns: &str) -> Result<bool, Error> {
        // A namespace the cache does not hold (a watch that has not seen it yet) is read.
        if let Some(m) = self
            .caches()
            .and_then(|c| c.namespaces.get(&ObjectRef::new(ns)))
        {
            return Ok(m.metadata.deletion_timestamp.is_some());
        }
        Ok(Api::<Namespace>::all(self.ctx.client.clone())
            .get_opt(ns)
            .await?
            .is_some_and(|n| {
                n.metadata.deletion_timestamp.is_some()
                    || n.status.and_then(|s| s.phase).as_deref() == Some("Terminating")
            }))
    }

    async fn dependents(&self, ns: &str, cluster: &str) -> Result<Vec<String>, Error> {
        match self.caches() {
            Some(c) if c.machines.is_some() => Ok(observe::cached_dependents(c, ns, cluster)),
            _ => observe::dependents(&self.ctx.client, ns, cluster).await,
        }
    }

    /// From the cache of the kind's owners when the manager keeps one (it holds the
    /// owners of the kind's own owner kind only; a destroy's start reads them live once
    /// more: `act::attempt::owner_gone_since_read`), else read live.
    async fn owner_uid(
        &self,
        of: Kind,
        kind: &str,
        ns: &str,
        name: &str,
    ) -> Result<Option<String>, Error> {
        let Some(ar) = self.ctx.cluster_api.resource() else {
            return Ok(None);
        };
        let owner_ar = super::owner_resource(ar, kind);
        let store = self
            .caches()
            .and_then(|c| c.owners.as_ref())
            .filter(|_| gather_apply::owner_kind(of) == Some(kind));
        Ok(match store {
            Some(store) => store
                .get(&ObjectRef::new_with(name, owner_ar).within(ns))
                .map(|o| o.metadata.uid.clone().unwrap_or_default()),
            None => Api::<DynamicObject>::namespaced_with(self.ctx.client.clone(), ns, &owner_ar)
                .get_metadata_opt(name)
                .await?
                .map(|o| o.metadata.uid.unwrap_or_default()),
        })
    }

    async fn stuck_pods(
        &self,
        pods: &[&Pod],
        now: Timestamp,
    ) -> Result<BTreeMap<String, String>, Error> {
        observe::stuck_pods(&self.ctx.client, pods.iter().copied(), now).await
    }

    async fn job_refusals(
        &self,
        ns: &str,
        jobs: &[Job],
        pods: &[Pod],
        now: Timestamp,
    ) -> Result<BTreeMap<String, String>, Error> {
        match self.caches() {
            Some(c) => Ok(observe::cached_refusals(c, ns, jobs, pods, now)),
            None => observe::job_refusals(&self.ctx.client, ns, jobs, pods, now).await,
        }
    }

    /// Read live under a state-read permit of the pass's lane (see
    /// `Context::state_reads`); the errored states found in the cache of the object's
    /// Secrets' metadata.
    ///
    /// A preview and a record take the inputs Secret kept at the version the cache shows
    /// ([`Cluster::kept_inputs`]), a record none while the cache shows none
    /// ([`StateWanted::Record`]); an inputs Secret read is kept. A preview takes the state
    /// the record of an apply's end read, while the cache shows its Secrets unchanged
    /// ([`super::caches::KeptStates`]). An apply's end to be
    /// recorded takes its attempt's variables Secret as the manager wrote it, while the
    /// cache shows that version or none yet ([`Cluster::kept`]).
    async fn state(&self, o: &Observed, wanted: StateWanted) -> Result<StateRead, Error> {
        let inputs = match wanted {
            StateWanted::Preview | StateWanted::Record => self.kept_inputs(),
            _ => None,
        };
        let state = match (wanted, self.caches()) {
            (StateWanted::Preview, Some(caches)) => self.ctx.kept_states.take(
                &self.scope.uid,
                &caches.with_suffix(&self.scope.namespace, &self.scope.suffix),
            ),
            _ => None,
        };
        if state.is_some() {
            tracing::debug!("the state as the record of the apply's end read it, unchanged since");
        }
        let attempt = gather_apply::unrecorded_apply(o).and_then(|u| {
            self.kept(&names::job_name(
                &self.scope.suffix,
                names::OPERATION_APPLY,
                u.attempt,
            ))
        });
        let kept = observe::Kept {
            inputs: inputs.as_deref(),
            attempt: attempt.as_deref(),
            state: state.as_deref(),
        };
        let read = observe::read_secrets(
            &self.ctx.client,
            self.caches(),
            o,
            (&self.ctx.state_reads, self.lane),
            (wanted, kept),
        )
        .await?;
        if inputs.is_none()
            && let Some(s) = &read.inputs_secret
        {
            self.keep_inputs(s);
        }
        Ok(read)
    }

    async fn inputs(&self, o: &mut Observed) -> Result<(), Error> {
        let (inputs, (secrets, maps)) = observe::read_inputs(&self.ctx.client, o).await?;
        if let Some(s) = &inputs {
            self.keep_inputs(s);
        }
        o.inputs_secret = inputs;
        o.referenced_secrets = secrets;
        o.referenced_config_maps = maps;
        Ok(())
    }

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
        let clusters = self.caches().and_then(|c| c.clusters.as_ref());
        let mut got = self.cached_or_read(clusters, ar, ns, name).await?;
        // A pause read from the API server since the cached version (see
        // `Caches::paused_read_live`) holds.
        if let (Some(c), Some(v)) = (self.caches().filter(|_| clusters.is_some()), got.as_mut()) {
            let rv = v["metadata"]["resourceVersion"]
                .as_str()
                .unwrap_or_default();
            if c.paused_read_live(ns, name, rv) {
                match v.get_mut("spec").and_then(Value::as_object_mut) {
                    Some(spec) => {
                        spec.insert("paused".into(), Value::Bool(true));
                    }
                    None => v["spec"] = serde_json::json!({"paused": true}),
                }
            }
        }
        Ok(got)
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

    /// From the inputs Secret kept at the version the cache of the object's Secrets shows
    /// ([`Cluster::kept_inputs`]), else read (one GET) and kept. Without the manager's
    /// caches, always read.
    async fn recorded(&self) -> Result<Option<Map<String, Value>>, Error> {
        let scope = self.scope;
        let secret = match self.kept_inputs() {
            Some(kept) => Some(kept),
            None => {
                let name = names::inputs_secret_name(&scope.suffix);
                let read = scope.secrets.get_opt(&name).await?;
                if let Some(s) = &read {
                    self.keep_inputs(s);
                }
                read.map(Arc::new)
            }
        };
        Ok(secret
            .as_deref()
            .and_then(|s| gather_apply::recorded_values(s, &scope.namespace, &scope.suffix)))
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
}
