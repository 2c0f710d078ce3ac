//! `captf manager`'s run: the controllers of the three kinds, the workload cleanup, the
//! runner-RBAC sweep, the metrics server, leadership, and the graceful stop.

use std::future::Future;
use std::sync::Arc;

use futures::stream::FuturesUnordered;
use futures::{FutureExt, StreamExt};
use kube::Client;
use tokio::sync::{oneshot, watch};
use tracing::{info, warn};

use super::wiring::controller;
use super::{ClusterKind, Context, Error, ManagerConfig, discover_cluster};
use super::{caches, leader, metrics_auth, rbac, server, workload};
use crate::api::names::Kind;
use crate::job::Templates;
use crate::metrics::Metrics;
use crate::state::permits::StateReads;

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
    let mut templates = match &cfg.templates_dir {
        Some(dir) => Templates::load_dir(dir)
            .map_err(|e| Error::Setup(format!("--templates-dir {}: {e}", dir.display())))?,
        None => Templates::embedded(),
    };
    templates.state_proxy_image = match (cfg.state_proxy, &cfg.state_proxy_image) {
        (false, _) => None,
        (true, Some(image)) => Some(image.clone()),
        (true, None) => Some(own_image(&client, &cfg).await?),
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
    let mut locks_watch = None;
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
        let (locks, locks_stream) = caches::terraform_locks(&client, &cfg.namespace);
        let _ = ctx.locks.set(locks);
        if let Some(old) = locks_watch.replace(caches::drive(locks_stream)) {
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
                stop_tasks(&mut [&mut sweep]).await;
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
    stop_tasks(&mut [&mut sweep, &mut accounts_watch, &mut locks_watch]).await;
    signal.abort();
    // Nothing guarded by the Lease runs any more (a pass dropped above may still have a
    // request in flight, as after a crash; every write is guarded by its resourceVersion).
    if let Some(l) = leadership.filter(|_| !lost_leadership) {
        l.release().await;
    }
    info!("CAPTF manager stopped");
    Ok(())
}

/// Aborts the tasks (the sweep, the watches of runner accounts and locks), and waits
/// until they are gone.
async fn stop_tasks(tasks: &mut [&mut Option<tokio::task::JoinHandle<()>>]) {
    for task in tasks.iter_mut().filter_map(|t| t.take()) {
        task.abort();
        let _ = task.await;
    }
}

/// The manager's own image, for `--state-proxy` without `--state-proxy-image`: its
/// container's in its Pod (`POD_NAMESPACE`, `POD_NAME`), which the manager may read.
async fn own_image(client: &Client, cfg: &ManagerConfig) -> Result<String, Error> {
    use k8s_openapi::api::core::v1::Pod;
    let fail = |why: String| {
        Error::Setup(format!(
            "--state-proxy: no --state-proxy-image, and the manager's own image cannot be read from Pod {}/{}: {why}; give --state-proxy-image (CAPTF's image)",
            cfg.manager_namespace, cfg.identity
        ))
    };
    let pod = kube::Api::<Pod>::namespaced(client.clone(), &cfg.manager_namespace)
        .get(&cfg.identity)
        .await
        .map_err(|e| fail(e.to_string()))?;
    let containers = pod.spec.map(|s| s.containers).unwrap_or_default();
    containers
        .iter()
        .find(|c| c.name == crate::ops::release::CONTAINER)
        .or(containers.first())
        .and_then(|c| c.image.clone())
        .filter(|i| !i.is_empty())
        .ok_or_else(|| fail("it names no image".to_string()))
}
