//! `captf manager`: one controller per kind, all running the same generic reconcile.
//! Each watches its kind, its Jobs and Pods (by owner labels: Jobs carry no
//! ownerReference), the metadata of its Secrets, the owning Clusters, its CRD; for
//! TerraformClusters the machines and pools; for machines and pools their Machines or
//! MachinePools and the bootstrap data Secrets those name.
//!
//! A pass ([`reconcile::reconcile`]) observes ([`observe`]), decides with the rule table,
//! records what Jobs did ([`bookkeeping`]), writes the status ([`status`]) and dispatches
//! to one action ([`act`]). The files around it: the error type ([`error`]), what passes
//! share ([`context`]), the fair pass limit ([`gate`]), what triggers a pass
//! ([`triggers`]), the Events ([`events`]); the guarded writes are [`crate::io::writes`].

pub mod act;
pub mod bookkeeping;
pub mod caches;
pub mod context;
pub mod disposal;
pub mod error;
pub mod events;
mod gate;
pub mod leader;
pub mod leftovers;
pub mod live;
pub mod metrics_auth;
pub mod observe;
pub mod preview;
pub mod rbac;
pub mod reconcile;
pub mod scope;
pub mod server;
pub mod status;
mod triggers;
pub mod workload;

use std::future::Future;
use std::sync::Arc;

use futures::stream::FuturesUnordered;
use futures::{FutureExt, StreamExt};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Event as CoreEvent, Namespace, Pod, Secret};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, DynamicObject};
use kube::core::PartialObjectMeta;
use kube::runtime::controller::Controller;
use kube::runtime::reflector::ObjectRef;
use kube::runtime::{WatchStreamExt, reflector, watcher};
use kube::{Client, ResourceExt};
use tokio::sync::{oneshot, watch};
use tracing::{info, warn};

pub use caches::Caches;
pub use context::{ClusterKind, Context, ManagerConfig, Released, discover_cluster};
pub use error::Error;
pub use scope::Scope;

use crate::api::labels;
use crate::api::names::{self, Kind};
use crate::api::{TerraformMachine, TerraformMachinePool, TerraformObject};
use crate::gather;
use crate::job::Templates;
use crate::metrics::Metrics;
use crate::state::permits::StateReads;
use gate::Gate;
use triggers::{cached_owner, job_finished, objects_of_cluster, owner_of, scoped, state_owner};

/// Cluster API's `kind` (`Machine`, `MachinePool`) in the group and version of its
/// Cluster kind `cluster`.
pub fn owner_resource(cluster: &kube::api::ApiResource, kind: &str) -> kube::api::ApiResource {
    kube::api::ApiResource {
        kind: kind.to_string(),
        plural: format!("{}s", kind.to_lowercase()),
        ..cluster.clone()
    }
}

/// One controller for kind `K`.
fn controller<K: TerraformObject>(
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
        unfiltered: cfg.watch_filter.is_none(),
        live_pauses: Default::default(),
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
            error::error_policy::<K>,
            ctx,
        )
        .for_each(|_| futures::future::ready(()));
    async move {
        let _synced = synced;
        passes.await
    }
}

/// Aborts a task when dropped.
struct AbortOnDrop(tokio::task::AbortHandle);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Runs the manager until `shutdown` resolves (or leadership is lost). On `shutdown` it
/// stops gracefully: no pass starts any more, the runner-RBAC sweep stops, the passes
/// under way may finish for [`ManagerConfig::shutdown_grace`] (those still running then
/// are dropped where they are, as a crash would leave them), and the leader Lease is
/// given up ([`leader::Leadership::release`]), so that another replica takes over at once.
pub async fn run(
    client: Client,
    cfg: ManagerConfig,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), Error> {
    let templates = match &cfg.templates_dir {
        Some(dir) => Templates::load_dir(dir)
            .map_err(|e| Error::Setup(format!("--templates-dir {}: {e}", dir.display())))?,
        None => Templates::embedded(),
    };
    let metrics = Arc::new(Metrics::default());
    // One set of state-read permits for the life of the process (the controllers start
    // again when Cluster API's Cluster kind appears), which the health probe watches.
    let state_reads = Arc::new(StateReads::new(cfg.max_state_reads));
    let probes = Arc::new(server::Probes::new(
        state_reads.clone(),
        cfg.state_read_starved_after,
        cfg.stalled_after,
    ));
    metrics.keep_object_info(cfg.metrics_object_info);
    metrics.watch_permits(state_reads.clone());
    if let Some(addr) = cfg.health_addr {
        server::serve(addr, metrics.clone(), probes.clone())
            .await
            .map_err(|e| Error::Setup(format!("health probe address {addr}: {e}")))?;
    }
    match cfg.metrics_addr {
        Some(addr) if cfg.metrics_secure => {
            if Some(addr) == cfg.health_addr {
                return Err(Error::Setup(format!(
                    "--metrics-bind-address {addr} is also --health-probe-bind-address: secure metrics need a port of their own (or --metrics-secure=false)"
                )));
            }
            let tls = metrics_auth::serving_tls(
                cfg.metrics_cert_dir.as_deref(),
                vec!["localhost".into(), cfg.identity.clone()],
            )
            .map_err(|e| Error::Setup(format!("the metrics port's certificate: {e}")))?;
            let auth = Arc::new(metrics_auth::MetricsAuth::new(client.clone()));
            server::serve_metrics_secure(addr, tls, metrics.clone(), auth)
                .await
                .map_err(|e| Error::Setup(format!("metrics address {addr}: {e}")))?;
        }
        Some(addr) if Some(addr) != cfg.health_addr => {
            server::serve(addr, metrics.clone(), probes.clone())
                .await
                .map_err(|e| Error::Setup(format!("metrics address {addr}: {e}")))?;
        }
        _ => {}
    }
    // The shutdown, seen by every wait below (leader election included): once it came, it
    // stays come.
    let (stop_tx, stop_rx) = watch::channel(false);
    let signal = tokio::spawn(async move {
        shutdown.await;
        let _ = stop_tx.send(true);
    });
    let stopping = move || {
        let mut rx = stop_rx.clone();
        async move {
            let _ = rx.wait_for(|stop| *stop).await;
        }
    };
    let mut leadership = None;
    if cfg.leader_elect {
        let lc = leader::LeaderConfig {
            namespace: cfg.manager_namespace.clone(),
            name: "captf-manager-leader".into(),
            identity: cfg.identity.clone(),
            lease_duration: cfg.lease_duration,
            renew_deadline: cfg.lease_duration * 2 / 3,
            renew_every: cfg.lease_duration / 5,
        };
        match leader::lead(client.clone(), lc, stopping()).await {
            Some(l) => leadership = Some(l),
            None => {
                info!("shutting down before leading");
                signal.abort();
                return Ok(());
            }
        }
    }
    let mut cluster_api = discover_cluster(&client).await;
    let held = leadership.as_ref().map(|l| l.held.clone());
    let lost = async move {
        match held {
            Some(mut rx) => {
                while *rx.borrow() {
                    if rx.changed().await.is_err() {
                        break;
                    }
                }
                warn!("lost leadership: stopping");
            }
            None => futures::future::pending::<()>().await,
        }
    };
    tokio::pin!(lost);
    let mut sweep = None;
    let mut accounts_watch = None;
    let mut lost_leadership = false;
    // The controllers run with the Cluster kind as known; while it is unknown, the manager
    // looks for it again and, once found, starts them again to watch Clusters.
    loop {
        if let ClusterKind::Unknown(why) = &cluster_api {
            warn!(%why, "Cluster API's Cluster kind is unknown: objects that name a Cluster are held as paused");
        }
        let ctx = Arc::new(
            Context::new(
                client.clone(),
                &cfg,
                templates.clone(),
                metrics.clone(),
                cluster_api.clone(),
            )
            .with_probes(probes.clone()),
        );
        probes.set_running(true);
        info!(namespace = ?cfg.namespace, watch_filter = ?cfg.watch_filter, "CAPTF manager running");
        // The sweep shares the controllers' context (its record of the namespaces whose
        // runner RBAC exists), so it starts again with them.
        let (accounts, accounts_stream) = caches::runner_accounts(&client, &cfg.namespace);
        let _ = ctx.runner_accounts.set(accounts);
        if let Some(old) = accounts_watch.replace(caches::drive(accounts_stream)) {
            old.abort();
        }
        if let Some(old) = sweep.replace(tokio::spawn(rbac::sweep_forever(
            ctx.clone(),
            cfg.rbac_sweep_every,
        ))) {
            old.abort();
        }
        let unknown = matches!(cluster_api, ClusterKind::Unknown(_));
        let found = async {
            loop {
                tokio::time::sleep(cfg.rediscover_every).await;
                if let ClusterKind::Known(ar) = discover_cluster(&client).await {
                    return ClusterKind::Known(ar);
                }
            }
        };
        // One controller per kind, each stopped gracefully by its trigger; when any of
        // them ends by itself, the manager stops.
        let mut triggers = Vec::new();
        let mut controllers: FuturesUnordered<_> = Kind::ALL
            .map(|kind| {
                let (trigger, stop) = oneshot::channel::<()>();
                triggers.push(trigger);
                crate::with_kind!(kind, K => controller::<K>(ctx.clone(), &cfg, stop).boxed())
            })
            .into_iter()
            .collect();
        // The workload cleanup, on Clusters, when Cluster API is there.
        if let Some(ar) = ctx.cluster_api.resource().cloned() {
            let (trigger, stop) = oneshot::channel::<()>();
            triggers.push(trigger);
            controllers.push(workload::controller(ctx.clone(), &cfg, ar, stop).boxed());
        }
        tokio::select! {
            _ = controllers.next() => break,
            _ = stopping() => {
                info!(grace = ?cfg.shutdown_grace, "shutting down: no pass starts any more; the passes under way may finish");
                probes.set_running(false);
                stop_tasks(&mut sweep, &mut None).await;
                for trigger in triggers {
                    let _ = trigger.send(());
                }
                let drained = async { while controllers.next().await.is_some() {} };
                tokio::select! {
                    ended = tokio::time::timeout(cfg.shutdown_grace, drained) => {
                        if ended.is_err() {
                            warn!(grace = ?cfg.shutdown_grace, "passes still running after the shutdown grace: stopped where they were");
                        }
                    }
                    _ = &mut lost => lost_leadership = true,
                }
                break;
            }
            _ = &mut lost => {
                lost_leadership = true;
                break;
            }
            known = found, if unknown => {
                info!("Cluster API's Cluster kind is served now: restarting the controllers to watch Clusters");
                cluster_api = known;
            }
        }
    }
    stop_tasks(&mut sweep, &mut accounts_watch).await;
    signal.abort();
    // Nothing guarded by the Lease runs any more (a pass dropped above may still have a
    // request in flight, as after a crash; every write is guarded by its resourceVersion).
    if let Some(l) = leadership.filter(|_| !lost_leadership) {
        l.release().await;
    }
    info!("CAPTF manager stopped");
    Ok(())
}

/// Aborts the sweep and the watch of runner accounts, and waits until they are gone.
async fn stop_tasks(
    sweep: &mut Option<tokio::task::JoinHandle<()>>,
    accounts_watch: &mut Option<tokio::task::JoinHandle<()>>,
) {
    for task in sweep.take().into_iter().chain(accounts_watch.take()) {
        task.abort();
        let _ = task.await;
    }
}
