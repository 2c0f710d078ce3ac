//! One controller per kind: the watches that fill its caches and trigger its passes, its
//! fair pass limit, and the pass it runs.

use std::future::Future;
use std::sync::Arc;

use futures::{FutureExt, StreamExt};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Event as CoreEvent, Namespace, Pod, Secret};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::ResourceExt;
use kube::api::{Api, DynamicObject};
use kube::core::PartialObjectMeta;
use kube::runtime::controller::Controller;
use kube::runtime::reflector::ObjectRef;
use kube::runtime::{WatchStreamExt, reflector, watcher};
use tokio::sync::oneshot;

use super::gate::Gate;
use super::triggers::{
    cached_owner, job_finished, objects_of_cluster, owner_of, scoped, state_owner,
};
use super::{Caches, Context, ManagerConfig, owner_resource};
use super::{caches, reconcile, retry, triggers};
use crate::api::labels;
use crate::api::names::{self, Kind};
use crate::api::{TerraformMachine, TerraformMachinePool, TerraformObject};
use crate::gather;

/// One controller for kind `K`.
pub(super) fn controller<K: TerraformObject>(
    ctx: Arc<Context>,
    cfg: &ManagerConfig,
    stop: oneshot::Receiver<()>,
) -> impl Future<Output = ()> + Send + 'static
where
    K::DynamicType: Default,
{
    let client = ctx.client.clone();
    let ns = cfg.namespace.clone();
    let mut main_cfg = watcher::Config::default().any_semantic();
    if let Some(f) = &cfg.watch_filter {
        main_cfg = main_cfg.labels(&labels::watch_filter_selector(f));
    }
    let owned = watcher::Config::default().labels(&labels::kind_selector(K::KIND));
    // The objects are kept without their managedFields (most of a small object's bytes;
    // nothing reads them, and every write is a patch).
    let (store, writer) = reflector::store();
    let objects = reflector::reflector(
        writer,
        watcher(scoped::<K>(&client, &ns), main_cfg)
            .default_backoff()
            .modify(|o: &mut K| o.meta_mut().managed_fields = None),
    )
    .applied_objects();
    let c = Controller::for_stream(objects, store.clone());
    let gate = Arc::new(Gate::new(cfg.concurrency, store.clone()));
    // Each watch fills a cache the passes read (`caches`) and triggers the passes.
    let jobs_by_owner = caches::ByLabel::new(names::LABEL_OWNER_NAME);
    let (jobs, jobs_stream) = caches::reflect(
        scoped::<Job>(&client, &ns),
        owned.clone(),
        caches::trim_job,
        std::slice::from_ref(&jobs_by_owner),
    );
    let pods_by_owner = caches::ByLabel::new(names::LABEL_OWNER_NAME);
    let (pods, pods_stream) = caches::reflect(
        scoped::<Pod>(&client, &ns),
        owned.clone(),
        caches::trim_pod,
        std::slice::from_ref(&pods_by_owner),
    );
    // Secrets by metadata only: state Secrets can be megabytes.
    let secrets_by_uid = caches::ByLabel::new(names::LABEL_OWNER_UID);
    let secrets_by_owner = caches::ByLabel::new(names::LABEL_OWNER_NAME);
    let secrets_by_suffix = caches::ByLabel::new(names::TF_LABEL_SUFFIX);
    let (secrets, secrets_stream) = caches::reflect_metadata(
        scoped::<PartialObjectMeta<Secret>>(&client, &ns),
        owned,
        &[
            secrets_by_uid.clone(),
            secrets_by_owner.clone(),
            secrets_by_suffix.clone(),
        ],
    );
    // Terraform's state Secrets without the owner labels (written by hand, or before
    // the backend's labels were set): those with them are in `secrets` already.
    let states_by_suffix = caches::ByLabel::new(names::TF_LABEL_SUFFIX);
    let (states, states_stream) = caches::reflect_metadata(
        scoped::<PartialObjectMeta<Secret>>(&client, &ns),
        watcher::Config::default().labels(&labels::unowned_state_selector()),
        std::slice::from_ref(&states_by_suffix),
    );
    let (crd, crd_stream) = caches::reflect_metadata(
        Api::<PartialObjectMeta<CustomResourceDefinition>>::all(client.clone()),
        watcher::Config::default().fields(&format!("metadata.name={}", K::KIND.crd_name())),
        &[],
    );
    let ns_cfg = match &ns {
        Some(n) => watcher::Config::default().fields(&format!("metadata.name={n}")),
        None => watcher::Config::default(),
    };
    let (namespaces, namespaces_stream) = caches::reflect_metadata(
        Api::<PartialObjectMeta<Namespace>>::all(client.clone()),
        ns_cfg,
        &[],
    );
    let (refusals, refusals_stream) = caches::reflect(
        scoped::<CoreEvent>(&client, &ns),
        watcher::Config::default().fields("involvedObject.kind=Job,reason=FailedCreate"),
        caches::trim_event,
        &[],
    );
    let mut c = c
        .with_config(Gate::<K>::controller_config())
        // Once `stop` resolves no pass starts; the stream ends when the running ones end.
        .graceful_shutdown_on(stop.map(|_| ()))
        // The objects whose turn at the gate has come.
        .reconcile_on(gate.turns())
        .watches_stream(jobs_stream, {
            let store = store.clone();
            let gate = gate.clone();
            move |j: Job| {
                // Marked only for a cached object, which gets the pass that takes the mark.
                if job_finished(&j)
                    && let Some(uid) =
                        cached_owner::<K>(&store, &j.metadata).and_then(|o| o.meta().uid.clone())
                {
                    gate.job_finished(&uid);
                }
                owner_of::<K>(&store, &j.metadata)
            }
        })
        .watches_stream(pods_stream, {
            let store = store.clone();
            move |p: Pod| owner_of::<K>(&store, &p.metadata)
        })
        .watches_stream(secrets_stream, {
            let store = store.clone();
            move |s: PartialObjectMeta<Secret>| owner_of::<K>(&store, &s.metadata)
        })
        .watches_stream(states_stream, {
            let store = store.clone();
            move |s: PartialObjectMeta<Secret>| state_owner::<K>(&store, &s.metadata)
        })
        .watches_stream(crd_stream, {
            let store = store.clone();
            move |_crd: PartialObjectMeta<CustomResourceDefinition>| {
                store
                    .state()
                    .iter()
                    .map(|o| ObjectRef::from_obj(o.as_ref()))
                    .collect::<Vec<_>>()
            }
        })
        // A namespace being deleted: every object in it looks again (its state is kept).
        .watches_stream(namespaces_stream, {
            let store = store.clone();
            move |n: PartialObjectMeta<Namespace>| {
                let name = n.name_any();
                if n.metadata.deletion_timestamp.is_none() {
                    return Vec::new();
                }
                store
                    .state_filter(|o| o.namespace().as_deref() == Some(name.as_str()))
                    .iter()
                    .map(|o| ObjectRef::from_obj(o.as_ref()))
                    .collect::<Vec<_>>()
            }
        })
        .watches_stream(refusals_stream, {
            let store = store.clone();
            let jobs = jobs.clone();
            move |e: CoreEvent| {
                let job =
                    ObjectRef::<Job>::new(e.involved_object.name.as_deref().unwrap_or_default())
                        .within(e.involved_object.namespace.as_deref().unwrap_or_default());
                jobs.get(&job)
                    .and_then(|j| owner_of::<K>(&store, &j.metadata))
            }
        });
    let mut clusters = None;
    if let Some(ar) = ctx.cluster_api.resource().cloned() {
        let cluster_store = store.clone();
        let api: Api<DynamicObject> = match &ns {
            Some(n) => Api::namespaced_with(client.clone(), n, &ar),
            None => Api::all_with(client.clone(), &ar),
        };
        let (reader, stream) = caches::reflect_dynamic(api, ar.clone(), watcher::Config::default());
        clusters = Some(reader);
        c = c.watches_stream_with(
            stream,
            move |cl: DynamicObject| {
                objects_of_cluster(
                    &cluster_store,
                    &cl.namespace().unwrap_or_default(),
                    &cl.name_any(),
                )
            },
            ar,
        );
    }
    // A machine's or pool's Machine or MachinePool, and the bootstrap data Secret it names
    // (Cluster API's bootstrap providers label it with the cluster's name): a pass when
    // either changes, so that bootstrap data, or a rotated token, reaches the module at
    // once instead of at the next resync.
    let mut owners = None;
    let mut bootstrap_secrets = None;
    if let (Some(ar), Some(owner_kind)) = (
        ctx.cluster_api.resource(),
        gather::apply::owner_kind(K::KIND),
    ) {
        let owner_ar = owner_resource(ar, owner_kind);
        let api: Api<DynamicObject> = match &ns {
            Some(n) => Api::namespaced_with(client.clone(), n, &owner_ar),
            None => Api::all_with(client.clone(), &owner_ar),
        };
        let (reader, stream) = caches::reflect_owners(api, owner_ar.clone());
        owners = Some(reader.clone());
        let kept = Arc::new(caches::BootstrapSecrets::default());
        bootstrap_secrets = Some(kept.clone());
        let bootstrap = watcher(
            scoped::<PartialObjectMeta<Secret>>(&client, &ns),
            watcher::Config::default().labels(names::CAPI_CLUSTER_NAME_LABEL),
        )
        .default_backoff()
        .inspect(move |r| match r {
            Ok(e) => kept.saw(e),
            Err(_) => kept.lost(),
        })
        .touched_objects()
        .boxed();
        c = c
            .watches_stream_with(
                stream,
                |o: DynamicObject| triggers::infrastructure_of::<K>(&o),
                owner_ar,
            )
            .watches_stream(bootstrap, move |s: PartialObjectMeta<Secret>| {
                triggers::objects_of_bootstrap::<K>(&reader, &s.metadata)
            });
    }
    let (mut machines, mut pools) = (None, None);
    let machines_by_cluster = caches::ByLabel::new(names::CAPI_CLUSTER_NAME_LABEL);
    let pools_by_cluster = caches::ByLabel::new(names::CAPI_CLUSTER_NAME_LABEL);
    if K::KIND == Kind::TerraformCluster {
        let s1 = store.clone();
        let s2 = store.clone();
        // Metadata only: the owning Cluster and the name are all that is read.
        let (m, m_stream) = caches::reflect(
            scoped::<PartialObjectMeta<TerraformMachine>>(&client, &ns),
            watcher::Config::default(),
            caches::trim_to_owners,
            std::slice::from_ref(&machines_by_cluster),
        );
        let (p, p_stream) = caches::reflect(
            scoped::<PartialObjectMeta<TerraformMachinePool>>(&client, &ns),
            watcher::Config::default(),
            caches::trim_to_owners,
            std::slice::from_ref(&pools_by_cluster),
        );
        (machines, pools) = (Some(m), Some(p));
        c = c
            .watches_stream(m_stream, move |m: PartialObjectMeta<TerraformMachine>| {
                match gather::owning_cluster(&m.metadata) {
                    Some(cl) => objects_of_cluster(&s1, &m.namespace().unwrap_or_default(), &cl),
                    None => Vec::new(),
                }
            })
            .watches_stream(
                p_stream,
                move |p: PartialObjectMeta<TerraformMachinePool>| match gather::owning_cluster(
                    &p.metadata,
                ) {
                    Some(cl) => objects_of_cluster(&s2, &p.namespace().unwrap_or_default(), &cl),
                    None => Vec::new(),
                },
            );
    }
    let caches = Arc::new(Caches {
        jobs,
        jobs_by_owner,
        pods,
        pods_by_owner,
        secrets,
        secrets_by_uid,
        secrets_by_owner,
        secrets_by_suffix,
        states,
        states_by_suffix,
        crd,
        namespaces,
        refusals,
        clusters,
        machines,
        pools,
        machines_by_cluster,
        pools_by_cluster,
        owners,
        bootstrap: bootstrap_secrets,
        objects_in: {
            let store = store.clone();
            Arc::new(move |n: &str| {
                store
                    .state_filter(|o| o.namespace().as_deref() == Some(n))
                    .len()
            })
        },
        provisioned: {
            let store = store.clone();
            Arc::new(move |n: &str, name: &str| {
                store
                    .get(&ObjectRef::new(name).within(n))
                    .map(|o| gather::apply::object_provisioned(o.as_ref()))
            })
        },
        identity_of: {
            let store = store.clone();
            Arc::new(move |n: &str, name: &str| {
                store
                    .get(&ObjectRef::new(name).within(n))
                    .map(|o| o.terraform().identity_ref.as_ref().map(|r| r.name.clone()))
            })
        },
        unfiltered: cfg.watch_filter.is_none(),
        live_pauses: Default::default(),
        locks: ctx.locks.get().cloned(),
        members: {
            let store = store.clone();
            Arc::new(move |visit: &mut dyn FnMut(&kube::api::ObjectMeta)| {
                for o in store.state() {
                    visit(o.meta());
                }
            })
        },
    });
    ctx.register_caches(K::KIND, caches.clone());
    // What `/metrics` counts at each scrape, and what the health probes watch: the
    // objects in this controller's cache.
    ctx.metrics.count_from(K::KIND, {
        let store = store.clone();
        Arc::new(move || {
            store
                .state()
                .iter()
                .map(|o| crate::metrics::census::Entry::of(o.as_ref()))
                .collect()
        })
    });
    let mut synced = None;
    if let Some(probes) = ctx.probes.clone() {
        let has_work = {
            let store = store.clone();
            Arc::new(move || {
                store
                    .state()
                    .iter()
                    .any(|o| o.finalizers().iter().any(|f| f == K::KIND.finalizer()))
            })
        };
        probes.controller_started(K::KIND, has_work);
        let (store, caches) = (store.clone(), caches.clone());
        synced = Some(tokio::spawn(async move {
            // Ready once the objects' cache and every cache a pass reads had their first
            // list; a cache whose watch fails is waited for again (the log says why).
            // Each wait is a fresh one, a second at most: a single wait begun before the
            // reflector ran was seen to miss its wake-up here (kube-runtime 5.0.0).
            loop {
                let waited = tokio::time::timeout(
                    std::time::Duration::from_secs(1),
                    store.wait_until_ready(),
                )
                .await;
                match waited {
                    Ok(Ok(())) => break,
                    Ok(Err(_)) => return,
                    Err(_) => {}
                }
            }
            while caches.ready().await.is_err() {
                tokio::time::sleep(std::time::Duration::from_secs(1)).await;
            }
            probes.synced(K::KIND);
        }));
    }
    // The wait for the first lists ends with the controller.
    let synced = synced.map(|t| AbortOnDrop(t.abort_handle()));
    let passes = c
        .run(
            move |obj, ctx| {
                let gate = gate.clone();
                async move {
                    gate.run(obj, |o, waited, lane| async move {
                        let probes = ctx.probes.clone();
                        let _pass = probes.as_deref().map(|p| {
                            p.pass(
                                K::KIND,
                                format!("{}/{}", o.namespace().unwrap_or_default(), o.name_any()),
                            )
                        });
                        let kind = crate::metrics::ByKind::of(K::KIND);
                        ctx.metrics.gate_wait_seconds.observe(&kind, waited);
                        let started = std::time::Instant::now();
                        let metrics = ctx.metrics.clone();
                        let result = reconcile::reconcile::<K>(o, ctx, lane).await;
                        metrics.pass_seconds.observe(&kind, started.elapsed());
                        result
                    })
                    .await
                }
            },
            retry::error_policy::<K>,
            ctx,
        )
        .for_each(|_| futures::future::ready(()));
    async move {
        let _synced = synced;
        passes.await
    }
}

/// Aborts a task when dropped.
pub(super) struct AbortOnDrop(pub(super) tokio::task::AbortHandle);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}
