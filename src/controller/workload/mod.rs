//! The workload cleanup's controller (docs/14-workload-cleanup.md): one pass per Cluster
//! API Cluster whose infrastructure is a TerraformCluster. It keeps Cluster API's
//! pre-terminate hook on the Cluster's Machines while the cleanup may run, so that no
//! infrastructure Machine is deleted before it ends; once the Cluster is deleted it
//! cleans the workload cluster up step by step ([`crate::rules::workload`] decides,
//! [`remote`] reaches it), records its progress on the TerraformCluster (annotations and
//! the `WorkloadCleanedUp` condition), and takes the hooks off when it is done or gives
//! up. Nothing of the deletion's rule table is involved: the Machines' deletion simply
//! waits for Cluster API's hook.

mod hooks;
mod record;
pub mod remote;

use std::sync::Arc;
use std::time::Duration;

use futures::{FutureExt, StreamExt};
use jiff::Timestamp;
use kube::api::{Api, ApiResource, DynamicObject};
use kube::core::PartialObjectMeta;
use kube::runtime::controller::{Action as Requeue, Controller};
use kube::runtime::events::EventType;
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Resource, ResourceExt};
use tokio::sync::oneshot;
use tracing::{info, warn};

use super::{Context, ManagerConfig};
use crate::api::TerraformCluster;
use crate::api::conditions::Status;
use crate::api::names;
use crate::io::Error;
use crate::metrics::labels::{ByStep, Reason};
use crate::rules::workload::{self as rules, Act, Settings, Step, StepPlan};
use hooks::{hooked_and_deleting, set_hooks};
use record::{
    annotate, clear_failing, current, forget_earlier, outcome, publish, restore_end, stamp,
    write_condition,
};

/// The condition on the TerraformCluster, and its reasons.
pub const CONDITION: &str = "WorkloadCleanedUp";
pub mod reason {
    pub const CLEANING: &str = "Cleaning";
    pub const UNREACHABLE: &str = "WorkloadClusterUnreachable";
    pub const REFUSED: &str = "WorkloadCleanupRefused";
    pub const CLEANED_UP: &str = "CleanedUp";
    pub const GAVE_UP: &str = "GaveUp";
}

/// The Events' reasons (on the TerraformCluster).
pub mod event {
    pub const STARTED: &str = "WorkloadCleanupStarted";
    pub const STEP: &str = "WorkloadCleanupStep";
    pub const FORCED: &str = "WorkloadObjectFinalized";
    pub const FAILING: &str = "WorkloadCleanupFailing";
    pub const DONE: &str = "WorkloadCleanedUp";
    pub const GAVE_UP: &str = "WorkloadCleanupGaveUp";
}

/// How often a running cleanup looks again (sooner when a finalizer's period ends).
const LOOK_AGAIN: Duration = Duration::from_secs(10);

/// What the passes share.
struct Shared {
    ctx: Arc<Context>,
    machines: Store<PartialObjectMeta<DynamicObject>>,
    machine_ar: ApiResource,
    cluster_ar: ApiResource,
    enabled_by_default: bool,
    give_up_after: Duration,
}

/// The controller, on Clusters of kind `cluster_ar`, until `stop`.
pub fn controller(
    ctx: Arc<Context>,
    cfg: &ManagerConfig,
    cluster_ar: ApiResource,
    stop: oneshot::Receiver<()>,
) -> impl std::future::Future<Output = ()> + Send + 'static {
    let client = ctx.client.clone();
    let scoped = |ar: &ApiResource| -> Api<DynamicObject> {
        match &cfg.namespace {
            Some(n) => Api::namespaced_with(client.clone(), n, ar),
            None => Api::all_with(client.clone(), ar),
        }
    };
    let mut wc = watcher::Config::default().any_semantic();
    if let Some(f) = &cfg.watch_filter {
        wc = wc.labels(&crate::api::labels::watch_filter_selector(f));
    }
    let (clusters, clusters_stream) =
        super::caches::reflect_dynamic(scoped(&cluster_ar), cluster_ar.clone(), wc);
    // The Machines' metadata: their Cluster (a label), their hook, their deletion.
    let machine_ar = super::owner_resource(&cluster_ar, "Machine");
    let machines_api: Api<PartialObjectMeta<DynamicObject>> = match &cfg.namespace {
        Some(n) => Api::namespaced_with(client.clone(), n, &machine_ar),
        None => Api::all_with(client.clone(), &machine_ar),
    };
    let writer = reflector::store::Writer::new(machine_ar.clone());
    let machines = writer.as_reader();
    let machines_stream = reflector::reflector(
        writer,
        watcher(machines_api, watcher::Config::default().any_semantic())
            .default_backoff()
            .modify(|m: &mut PartialObjectMeta<DynamicObject>| m.metadata.managed_fields = None),
    )
    .touched_objects()
    .boxed();
    let shared = Arc::new(Shared {
        ctx,
        machines,
        machine_ar: machine_ar.clone(),
        cluster_ar: cluster_ar.clone(),
        enabled_by_default: cfg.workload_cleanup,
        give_up_after: cfg.workload_cleanup_give_up_after,
    });
    let ar = cluster_ar.clone();
    Controller::for_stream_with(clusters_stream, clusters, cluster_ar.clone())
        .watches_stream_with(
            machines_stream,
            move |m: PartialObjectMeta<DynamicObject>| {
                let cluster = m.labels().get(names::CAPI_CLUSTER_NAME_LABEL).cloned();
                let ns = m.namespace().unwrap_or_default();
                cluster.map(|c| ObjectRef::new_with(&c, ar.clone()).within(&ns))
            },
            machine_ar,
        )
        .graceful_shutdown_on(stop.map(|_| ()))
        .run(pass, error_policy, shared)
        .for_each(|_| futures::future::ready(()))
}

fn error_policy(cluster: Arc<DynamicObject>, err: &Error, _: Arc<Shared>) -> Requeue {
    warn!(cluster = %cluster.name_any(), namespace = cluster.namespace().unwrap_or_default(), error = %err, "workload cleanup pass failed; retrying");
    Requeue::requeue(Duration::from_secs(5))
}

async fn pass(cluster: Arc<DynamicObject>, shared: Arc<Shared>) -> Result<Requeue, Error> {
    let ns = cluster.namespace().unwrap_or_default();
    let name = cluster.name_any();
    // A paused Cluster (`clusterctl move` pauses, and then deletes the source's objects
    // for the move) is left as it is, as Cluster API's own controllers leave it.
    let value = serde_json::to_value(cluster.as_ref()).unwrap_or_default();
    let view = crate::gather::ClusterView::from_value(&value);
    if view.spec_paused
        || view.annotation_paused
        || cluster
            .annotations()
            .contains_key(names::CLUSTERCTL_DELETE_FOR_MOVE)
    {
        return Ok(Requeue::await_change());
    }
    let settings = Settings::of(cluster.annotations(), shared.enabled_by_default);
    let deleting = cluster.meta().deletion_timestamp.is_some();
    // The TerraformCluster the Cluster names as its infrastructure, as the hand-off reads it.
    let infra = crate::contract::values::handoff_source(&value).map(str::to_string);
    let enabled = settings.enabled && infra.is_some();
    if !(enabled && deleting) {
        // A hook comes off a Machine being deleted while its Cluster is not. The Clusters'
        // cache may lag the Cluster's own deletion (the Machines are deleted because of it,
        // and their watch is another): then the hook must stay, so the Cluster is read
        // live first.
        if enabled && hooked_and_deleting(&shared, &ns, &name) {
            let clusters = Api::<DynamicObject>::namespaced_with(
                shared.ctx.client.clone(),
                &ns,
                &shared.cluster_ar,
            );
            let live = clusters.get_opt(&name).await?;
            if live.is_some_and(|c| c.metadata.deletion_timestamp.is_some()) {
                return Ok(Requeue::requeue(Duration::from_secs(1)));
            }
        }
        set_hooks(&shared, &ns, &name, |machine_deleting| {
            rules::hook_wanted(enabled, deleting, false, machine_deleting)
        })
        .await?;
        return Ok(Requeue::await_change());
    }
    let infra = infra.unwrap_or_default();
    let tfcs = Api::<TerraformCluster>::namespaced(shared.ctx.client.clone(), &ns);
    let Some(tfc) = tfcs.get_opt(&infra).await? else {
        warn!(cluster = %name, namespace = %ns, terraform_cluster = %infra, "the Cluster's TerraformCluster is gone: no workload cleanup to record; its Machines are let go");
        set_hooks(&shared, &ns, &name, |_| false).await?;
        return Ok(Requeue::await_change());
    };
    // What the TerraformCluster records counts only from this deletion on.
    let deleted_at = cluster
        .meta()
        .deletion_timestamp
        .as_ref()
        .map(|t| t.0)
        .unwrap_or_else(Timestamp::now);
    let recorded = stamp(&tfc, names::WORKLOAD_CLEANUP_STARTED);
    let started = rules::started_for(recorded, deleted_at);
    let tfc = if recorded.is_some() && started.is_none() {
        forget_earlier(&tfcs, &infra).await?
    } else {
        tfc
    };
    let finished = started.is_some()
        && tfc
            .annotations()
            .contains_key(names::WORKLOAD_CLEANUP_FINISHED);
    let hooks = set_hooks(&shared, &ns, &name, |d| {
        rules::hook_wanted(true, true, finished, d)
    })
    .await;
    if finished {
        hooks?;
        // The TerraformCluster's own status writes replace its conditions as they read
        // them: the end is written again if one of them lost it.
        restore_end(&tfcs, &tfc, &name).await?;
        return Ok(Requeue::await_change());
    }
    // A hook that cannot be put on a Machine (an admission policy refuses) does not stop
    // the cleanup, which the other Machines wait for; the failure is in the log.
    drop(hooks);
    let now = Timestamp::now();
    let (tfc, started) = match started {
        Some(t) => (tfc, t),
        None => {
            // Never before the deletion as the API server stamped it (the manager's clock
            // may be behind), or the next pass would take it for an earlier object's.
            let start = now.max(deleted_at);
            let tfc = annotate(
                &tfcs,
                &infra,
                &[(names::WORKLOAD_CLEANUP_STARTED, Some(start.to_string()))],
            )
            .await?;
            let note = format!(
                "Cluster {name} is being deleted: its workload cluster is cleaned up before its Machines' infrastructure goes (step 1 of 4 first)"
            );
            publish(&shared, &tfc, EventType::Normal, event::STARTED, &note).await;
            (tfc, start)
        }
    };
    let problems = if settings.problems.is_empty() {
        String::new()
    } else {
        format!(" ({})", settings.problems.join("; "))
    };
    match clean(&shared, &ns, &name, &settings, started, now).await {
        Ok(Cleaned { plan: None, .. }) => {
            let tfc = annotate(
                &tfcs,
                &infra,
                &[
                    (
                        names::WORKLOAD_CLEANUP_FINISHED,
                        Some(names::WORKLOAD_CLEANUP_DONE.into()),
                    ),
                    (names::WORKLOAD_CLEANUP_FAILING_SINCE, None),
                ],
            )
            .await?;
            let msg = format!(
                "the workload cluster of Cluster {name} is cleaned up (began {started}): its Machines' infrastructure may go{problems}"
            );
            write_condition(&tfcs, &tfc, Status::True, reason::CLEANED_UP, msg.clone()).await?;
            publish(&shared, &tfc, EventType::Normal, event::DONE, &msg).await;
            outcome(&shared, reason::CLEANED_UP);
            info!(cluster = %name, namespace = %ns, "workload cleanup done");
            set_hooks(&shared, &ns, &name, |_| false).await?;
            Ok(Requeue::await_change())
        }
        Ok(Cleaned {
            plan: Some(plan),
            forced,
        }) => {
            let tfc = clear_failing(&tfcs, tfc).await?;
            for o in &forced {
                shared.ctx.metrics.workload_objects_forced.inc(&ByStep {
                    step: Reason::new(plan.step.as_str()),
                });
                let note = format!(
                    "the finalizers of {} were removed by force, {} s after its deletion: what they guarded (a load balancer, a disk) may be left in the cloud; see runbooks/WorkloadObjectFinalized.md",
                    o.describe(),
                    settings.finalize_after(plan.step).as_secs()
                );
                publish(&shared, &tfc, EventType::Warning, event::FORCED, &note).await;
            }
            let msg = plan.message();
            let new_step = !current(&tfc).is_some_and(|(r, m)| {
                r == reason::CLEANING && m.starts_with(&format!("step {} ", plan.step.number()))
            });
            write_condition(
                &tfcs,
                &tfc,
                Status::False,
                reason::CLEANING,
                format!("{msg}{problems}"),
            )
            .await?;
            if new_step {
                publish(&shared, &tfc, EventType::Normal, event::STEP, &msg).await;
            }
            Ok(Requeue::requeue(look_again(&plan, now)))
        }
        Err(f) => {
            let (tfc, since) = match stamp(&tfc, names::WORKLOAD_CLEANUP_FAILING_SINCE) {
                Some(s) => (tfc, s),
                None => {
                    let written = annotate(
                        &tfcs,
                        &infra,
                        &[(names::WORKLOAD_CLEANUP_FAILING_SINCE, Some(now.to_string()))],
                    )
                    .await?;
                    (written, now)
                }
            };
            let give_up = rules::give_up_at(since, shared.give_up_after);
            if now >= give_up {
                let tfc = annotate(
                    &tfcs,
                    &infra,
                    &[(
                        names::WORKLOAD_CLEANUP_FINISHED,
                        Some(names::WORKLOAD_CLEANUP_GAVE_UP.into()),
                    )],
                )
                .await?;
                let msg = format!(
                    "gave up cleaning up the workload cluster of Cluster {name} after failing since {since}: {}. Its Machines' infrastructure goes now; what the workload cluster's load balancers and volumes made may be left in the cloud (runbooks/WorkloadClusterUnreachable.md){problems}",
                    f.message
                );
                write_condition(&tfcs, &tfc, Status::False, reason::GAVE_UP, msg.clone()).await?;
                publish(&shared, &tfc, EventType::Warning, event::GAVE_UP, &msg).await;
                outcome(&shared, reason::GAVE_UP);
                warn!(cluster = %name, namespace = %ns, "workload cleanup gave up");
                set_hooks(&shared, &ns, &name, |_| false).await?;
                return Ok(Requeue::await_change());
            }
            let why = if f.unreachable {
                reason::UNREACHABLE
            } else {
                reason::REFUSED
            };
            let msg = format!(
                "{}; failing since {since}, the cleanup gives up at {give_up} and lets the Machines go; see runbooks/WorkloadClusterUnreachable.md{problems}",
                f.message
            );
            if since == now {
                publish(&shared, &tfc, EventType::Warning, event::FAILING, &msg).await;
            }
            write_condition(&tfcs, &tfc, Status::False, why, msg).await?;
            let left = give_up.duration_since(now).unsigned_abs();
            Ok(Requeue::requeue(
                left.clamp(Duration::from_secs(1), LOOK_AGAIN),
            ))
        }
    }
}

/// What a pass of the cleanup did: the first step with work left (none: all done), and the
/// objects whose finalizers it removed by force.
struct Cleaned {
    plan: Option<StepPlan>,
    forced: Vec<rules::Object>,
}

/// One pass of the cleanup: the steps in order, acting on the first with work left.
async fn clean(
    shared: &Shared,
    ns: &str,
    cluster: &str,
    settings: &Settings,
    started: Timestamp,
    now: Timestamp,
) -> Result<Cleaned, remote::Failure> {
    let client = remote::connect(&shared.ctx.client, ns, cluster).await?;
    for step in Step::ALL {
        let period = settings.finalize_after(step);
        let mut objects = Vec::new();
        for t in step.targets(settings.only_services_and_volumes) {
            let wanted = |o: &rules::Object| rules::left_alone(o, None, started, period).is_none();
            objects.extend(remote::list(&client, t, wanted).await?);
        }
        if objects.is_empty() {
            continue;
        }
        // Listed after the objects: an object in a namespace made meanwhile is not taken
        // for one whose namespace is gone.
        let namespaces = remote::namespaces(&client).await?;
        let plan = rules::plan_step(step, objects, &namespaces, started, settings, now);
        if plan.done() {
            continue;
        }
        let mut forced = Vec::new();
        for (o, a) in &plan.remaining {
            if remote::act(&client, o, *a).await? {
                forced.push(o.clone());
            }
        }
        return Ok(Cleaned {
            plan: Some(plan),
            forced,
        });
    }
    Ok(Cleaned {
        plan: None,
        forced: Vec::new(),
    })
}

/// When a running step looks again: soon, and at the end of the first finalize period.
fn look_again(plan: &StepPlan, now: Timestamp) -> Duration {
    let forced_now = plan
        .remaining
        .iter()
        .any(|(_, a)| matches!(a, Act::Force | Act::Delete { .. }));
    if forced_now {
        return Duration::from_secs(1);
    }
    plan.next_force()
        .map(|t| t.duration_since(now).unsigned_abs())
        .unwrap_or(LOOK_AGAIN)
        .clamp(Duration::from_secs(1), LOOK_AGAIN)
}
