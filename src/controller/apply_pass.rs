//! The apply side of a pass on an object not being deleted, once the deletion's table
//! has said "not deleting" and the bookkeeping has run: observe what the apply table needs
//! beside the deletion's observation → decide (`rules::apply`, pure) → write the
//! conditions of both tables → act (`act::apply`). A destroy always wins: this pass never
//! runs on an object being deleted, and a deletion that begins while it runs fails its
//! guarded write.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, DynamicObject};
use kube::runtime::controller::Action as Requeue;
use kube::runtime::events::EventType;
use kube::runtime::reflector::{ObjectRef, Store};
use tracing::{info, warn};

use super::act::{self, attempt::Started};
use super::events::publish;
use super::observe;
use super::status::{write_provisioned, write_status_keeping_with};
use super::{Context, Error, Scope};
use crate::api::TerraformObject;
use crate::api::names::{self, Kind};
use crate::contract::Role;
use crate::gather::Observed;
use crate::gather::apply::{
    self as gather_apply, ApplySources, ApplyStateSeen, apply_facts_seen, capi_owner,
};
use crate::inputs::Inputs;
use crate::rules::Decision;
use crate::rules::apply::{
    ApplyAction, ApplyDecision, ApplyFacts, ApplyRow, INPUTS_APPLIED, Prerequisite,
    apply_state_needed, decide_apply,
};
use crate::state::permits::Lane;

/// What the apply side of a pass decided, and what it decided from.
pub struct LiveDecision {
    /// The observation, with the state when an apply was due (and its permit).
    pub observed: Observed,
    pub state_seen: ApplyStateSeen,
    pub facts: ApplyFacts,
    pub decision: ApplyDecision,
    /// The attempt to start, rendered, with the inputs it runs.
    pub start: Option<(Inputs, act::attempt::Attempt)>,
    /// Whether the bootstrap data waited for can come without a watch event: its Secret,
    /// named, is missing (a Secret of the user's may lack the cluster-name label the
    /// watch selects by), or the Machines and MachinePools are not watched.
    pub bootstrap_unwatched: bool,
}

/// What [`decide_live`] came to.
pub enum Live {
    /// A recorded success whose status is gone (a move): rebuilt, and the next pass
    /// decides on the object as written.
    StatusRebuilt,
    Decided(Box<LiveDecision>),
}

/// The apply side's decision on a live object, from what a pass reads (the same code for
/// the manager's pass and `captf explain` without `-f`). With `rebuild`, a provisioned
/// object whose status was dropped (by a move) has it rebuilt first, as the manager does;
/// without, the decision is made as it will be once it is.
pub async fn decide_live<K: TerraformObject>(
    ctx: &Context,
    scope: &Scope<K>,
    obj: &K,
    mut observed: Observed,
    mut state_seen: ApplyStateSeen,
    rebuild: bool,
) -> Result<Live, Error> {
    // Observe: what the spec references (read live: an apply acts on it), whether a state
    // exists (the cache of state Secrets), whether it is provisioned; then the Cluster API
    // objects the gates (until the first success) and the contract's values read.
    let (secrets, maps) = observe::read_referenced(&ctx.client, &observed, None).await?;
    observed.referenced_secrets = secrets;
    observed.referenced_config_maps = maps;
    let state_exists = scope
        .secret_meta(&names::state_secret_name(&scope.suffix))
        .await?
        .is_some();
    let latched = obj
        .status()
        .and_then(|s| s.initialization.as_ref())
        .and_then(|i| i.provisioned)
        == Some(true);
    let provisioned = gather_apply::provisioned(obj.meta(), latched);
    if rebuild && provisioned && !latched {
        // Rebuilt from the recorded success (after clusterctl move, which drops the
        // status), without a Job: provisioned, and the status fields of the outputs, read
        // from the state again. The next pass decides on the object as written.
        rebuild_status(ctx, scope, obj).await?;
        return Ok(Live::StatusRebuilt);
    }
    // The Cluster API objects the module contract's values come from: the Cluster (from
    // the cache), and for a machine or pool its owner and bootstrap data Secret (read),
    // then the TerraformCluster's hand-off; a provisioned machine's from its inputs
    // Secret instead (it keeps them).
    let cluster = read_cluster(ctx, scope, &observed).await?;
    let mut sources = ApplySources {
        latched,
        state_exists,
        cluster: cluster.as_ref(),
        ..Default::default()
    };
    let keeps_recorded = gather_apply::keeps_recorded_values(observed.kind, provisioned);
    if keeps_recorded {
        sources.recorded = match &observed.inputs_secret {
            // The pass read it already when it read the state.
            Some(s) => gather_apply::recorded_values(s, &scope.namespace, &scope.suffix),
            None => recorded_values(ctx, scope).await?,
        };
    }
    let (owner, bootstrap) = if sources.recorded.is_some() {
        (None, None)
    } else {
        let owners = scope.caches.as_ref().and_then(|c| c.owners.as_ref());
        let owner = read_owner(ctx, &observed, owners).await?;
        let bootstrap = read_bootstrap(scope, observed.kind, owner.as_ref()).await?;
        (owner, bootstrap)
    };
    let bootstrap_unwatched = scope.caches.as_ref().is_none_or(|c| c.owners.is_none())
        || (bootstrap.is_none()
            && owner
                .as_ref()
                .and_then(|o| gather_apply::bootstrap_secret_name(observed.kind, o))
                .is_some());
    sources.owner = owner.as_ref();
    sources.bootstrap = bootstrap.as_ref();
    if sources.recorded.is_none()
        && gather_apply::needs_handoff(&observed, provisioned, sources.owner, sources.bootstrap)
    {
        sources.handoff = Some(cluster_outputs(ctx, scope, cluster.as_ref()).await?);
    }
    let mut seen = gather_apply::apply_observed(&observed, &sources);

    // Decide. An apply that is due reads its state first (with the errored states and
    // Terraform's lock): no apply starts against a state that was lost or cannot be
    // trusted, beside an errored state, or under another's lock (row A11). The permit
    // is taken only now, when no other is held. Starting an attempt needs its Job, which
    // only the manager can render: one that does not render keeps the apply from
    // starting, as inputs that do not resolve.
    let mut facts = apply_facts_seen(&observed, &seen, &state_seen, &ctx.settings);
    if apply_state_needed(&facts) {
        observe::read_state_into(
            &ctx.client,
            scope.caches.as_deref(),
            &mut observed,
            &ctx.state_reads,
        )
        .await?;
        state_seen = gather_apply::apply_state_seen(&observed, &ctx.settings);
        if keeps_recorded {
            // An attempt starts from the recorded values as this read found them, not as
            // an earlier pass kept them.
            sources.recorded = observed
                .inputs_secret
                .as_ref()
                .and_then(|s| gather_apply::recorded_values(s, &scope.namespace, &scope.suffix));
            seen = gather_apply::apply_observed(&observed, &sources);
        }
        facts = apply_facts_seen(&observed, &seen, &state_seen, &ctx.settings);
    }
    let mut decision = decide_apply(&facts);
    let mut start = None;
    if let Some(n) = decision.action.start_attempt() {
        let rendered = gather_apply::spec_inputs_of(&observed, &seen.contract).and_then(|inputs| {
            act::apply::render(ctx, scope, obj, n, &inputs).map(|a| (inputs, a))
        });
        match rendered {
            Ok(r) => start = Some(r),
            Err(why) => {
                facts.inputs = Err(why);
                decision = decide_apply(&facts);
            }
        }
    }
    Ok(Live::Decided(Box::new(LiveDecision {
        observed,
        state_seen,
        facts,
        decision,
        start,
        bootstrap_unwatched,
    })))
}

/// What a live pass writes beside the apply table's conditions: the deletion table's
/// decision (not deleting), and the pass's other conditions (`Disposal`).
pub struct Shown<'a> {
    pub deletion: &'a Decision,
    pub others: &'a [crate::api::conditions::Desired],
}

/// Runs the apply side of a pass on a live object; `shown` is the deletion table's
/// decision (not deleting), whose conditions are written with the apply table's.
pub async fn run<K: TerraformObject>(
    ctx: &Context,
    scope: &Scope<K>,
    obj: Arc<K>,
    observed: Observed,
    state_seen: ApplyStateSeen,
    shown: Shown<'_>,
    resync: Duration,
) -> Result<Requeue, Error> {
    let LiveDecision {
        observed,
        state_seen,
        facts,
        decision,
        start,
        bootstrap_unwatched,
    } = match decide_live(ctx, scope, obj.as_ref(), observed, state_seen, true).await? {
        Live::StatusRebuilt => return Ok(Requeue::requeue(Duration::ZERO)),
        Live::Decided(d) => *d,
    };
    info!(row = %decision.row.label(), action = ?decision.action, "apply decision");

    // While the API server refuses what the attempt needs, each pass tries again, and the
    // conditions keep saying why it cannot start instead of "attempt n is starting" (the
    // apply's refusals are remembered apart from the destroy's).
    let refusal_key = format!("{}/apply", scope.uid);
    let shown_apply = match (decision.action.start_attempt(), ctx.refusal(&refusal_key)) {
        (Some(n), Some(why)) => refused_decision(scope, &facts, n, &why),
        (None, Some(_)) => {
            ctx.clear_refusal(&refusal_key);
            decision.clone()
        }
        _ => decision.clone(),
    };
    // What a deletion asked now would reach, written with the apply table's conditions.
    let ready = super::preview::deletion_ready(ctx, scope, &observed, true).await?;
    let mut conditions = shown_apply.conditions.clone();
    conditions.push(ready);
    conditions.extend(shown.others.iter().cloned());
    // Hibernation while the Cluster is in disposal: what this object's module does.
    let shown_before = obj.status().is_some_and(|s| {
        s.conditions
            .iter()
            .any(|c| c.type_ == crate::rules::disposal::HIBERNATED)
    });
    conditions.extend(gather_apply::hibernation_condition(
        &observed,
        &shown_apply,
        shown_before,
    ));
    let obj = write_status_keeping_with(&scope.api, obj, shown.deletion, &conditions).await?;
    match (decision.action, start) {
        (
            ApplyAction::StartApply { attempt: n } | ApplyAction::RetryLater { start: Some(n), .. },
            Some((inputs, a)),
        ) => {
            let started = act::apply::start_apply(
                ctx,
                scope,
                obj.as_ref(),
                &observed,
                state_seen.stale_lock,
                &inputs,
                a,
            )
            .await;
            match started {
                Ok(started) => {
                    ctx.clear_refusal(&refusal_key);
                    Ok(match started {
                        Started::Running => Requeue::requeue(resync),
                        Started::NumberMovedOn => Requeue::requeue(Duration::ZERO),
                        // The cache catches up with the pause meanwhile.
                        Started::ClusterPaused | Started::OwnerGone => {
                            Requeue::requeue(Duration::from_secs(1))
                        }
                    })
                }
                // Refused (an admission policy, a quota, a permission): the conditions say
                // so instead of "starting", and the pass tries again soon.
                Err(e) => match e.refusal() {
                    Some(why) => {
                        warn!(%why, "the API server refused what the apply needs");
                        let refused = refused_decision(scope, &facts, n, &why);
                        let current = scope.api.get(&scope.name).await?;
                        write_status_keeping_with(
                            &scope.api,
                            Arc::new(current),
                            shown.deletion,
                            &refused.conditions,
                        )
                        .await?;
                        if ctx.set_refusal(&refusal_key, &why) {
                            let message = refused
                                .conditions
                                .iter()
                                .find(|c| c.type_ == INPUTS_APPLIED)
                                .map(|c| c.message.clone())
                                .unwrap_or_default();
                            publish(
                                ctx,
                                obj.as_ref(),
                                EventType::Warning,
                                super::events::APPLY_CANNOT_START,
                                "Apply",
                                &message,
                            )
                            .await;
                        }
                        Ok(Requeue::requeue(UNWATCHED_POLL))
                    }
                    None => Err(e),
                },
            }
        }
        (ApplyAction::RetryLater { at, .. }, None) => {
            let ms = at.as_millisecond() - facts.now.as_millisecond();
            let wait = Duration::from_millis(u64::try_from(ms.max(0)).unwrap_or(0));
            Ok(Requeue::requeue(wait.min(resync)))
        }
        // What is not watched is looked at again soon while the pass waits for it: the
        // TerraformCluster's outputs, the Secrets and ConfigMaps the spec references,
        // Terraform's lock (a Lease), and bootstrap data the watches cannot see come
        // (`LiveDecision::bootstrap_unwatched`).
        _ if matches!(
            facts.prerequisite,
            Some(Prerequisite::ClusterOutputs { .. })
        ) || (bootstrap_unwatched
            && matches!(facts.prerequisite, Some(Prerequisite::BootstrapData { .. })))
            || decision.row == ApplyRow::InputsUnresolvable
            || (decision.row == ApplyRow::CannotStart && facts.lock_held.is_some()) =>
        {
            Ok(Requeue::requeue(UNWATCHED_POLL.min(resync)))
        }
        _ => Ok(Requeue::requeue(resync)),
    }
}

/// The apply table's decision while the API server refuses what attempt `n` needs: row A7,
/// with the API's message.
fn refused_decision<K: TerraformObject>(
    scope: &Scope<K>,
    facts: &ApplyFacts,
    n: u32,
    why: &str,
) -> crate::rules::apply::ApplyDecision {
    decide_apply(&ApplyFacts {
        inputs: Err(format!(
            "{} {}/{}: the API server refused what apply attempt {n} needs: {why}; tried again every {}s",
            K::KIND.as_str(),
            scope.namespace,
            scope.name,
            UNWATCHED_POLL.as_secs()
        )),
        ..facts.clone()
    })
}

/// How often a pass waiting for something the manager does not watch looks again.
const UNWATCHED_POLL: Duration = Duration::from_secs(10);

/// The Machine or MachinePool that owns a machine or pool, as read now (its bootstrap
/// data is what the gate waits for); none for a TerraformCluster, or while Cluster API's
/// kinds are unknown or the owner is not set.
async fn read_owner(
    ctx: &Context,
    o: &Observed,
    owners: Option<&Store<DynamicObject>>,
) -> Result<Option<serde_json::Value>, Error> {
    let (Some(ar), Some(name)) = (ctx.cluster_api.resource(), capi_owner(o.kind, &o.meta)) else {
        return Ok(None);
    };
    let Some(kind) = gather_apply::owner_kind(o.kind) else {
        return Ok(None);
    };
    let owner_ar = super::owner_resource(ar, kind);
    let ns = o.meta.namespace.clone().unwrap_or_default();
    // The manager's cache of them (watched), else the API server (`captf explain`).
    cached_or_read(ctx, owners, &owner_ar, &ns, &name).await
}

/// Cluster API's object `name` of `ar` in `ns`: from the manager's cache of its kind
/// (`store`, watched), else read from the API server.
async fn cached_or_read(
    ctx: &Context,
    store: Option<&Store<DynamicObject>>,
    ar: &kube::api::ApiResource,
    ns: &str,
    name: &str,
) -> Result<Option<serde_json::Value>, Error> {
    let got = match store {
        Some(store) => store
            .get(&ObjectRef::new_with(name, ar.clone()).within(ns))
            .map(|g| g.as_ref().clone()),
        None => {
            Api::<DynamicObject>::namespaced_with(ctx.client.clone(), ns, ar)
                .get_opt(name)
                .await?
        }
    };
    Ok(got.map(|g| serde_json::to_value(g).unwrap_or_default()))
}

/// The owning Cluster as read (the manager's cache, else the API server).
async fn read_cluster<K: TerraformObject>(
    ctx: &Context,
    scope: &Scope<K>,
    o: &Observed,
) -> Result<Option<serde_json::Value>, Error> {
    let (Some(ar), Some(name)) = (
        ctx.cluster_api.resource(),
        crate::gather::owning_cluster(&o.meta),
    ) else {
        return Ok(None);
    };
    let clusters = scope.caches.as_ref().and_then(|c| c.clusters.as_ref());
    cached_or_read(ctx, clusters, ar, &scope.namespace, &name).await
}

/// The values a provisioned machine's inputs Secret records: as an earlier pass kept them
/// while the cache of the object's Secrets shows the version they were read at, else read
/// (one GET) and kept. Without the manager's caches, always read.
async fn recorded_values<K: TerraformObject>(
    ctx: &Context,
    scope: &Scope<K>,
) -> Result<Option<serde_json::Map<String, serde_json::Value>>, Error> {
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

/// The bootstrap data Secret a machine's or pool's owner names, as read.
async fn read_bootstrap<K: TerraformObject>(
    scope: &Scope<K>,
    kind: Kind,
    owner: Option<&serde_json::Value>,
) -> Result<Option<Secret>, Error> {
    match owner.and_then(|o| gather_apply::bootstrap_secret_name(kind, o)) {
        Some(name) if kind != Kind::TerraformCluster => {
            // Kept from an earlier pass while the watch saw no other version of it.
            let kept = scope.caches.as_ref().and_then(|c| c.bootstrap.as_ref());
            if let Some(s) = kept.and_then(|k| k.get(&scope.namespace, name)) {
                return Ok(Some(s.as_ref().clone()));
            }
            let got = scope.secrets.get_opt(name).await?;
            if let (Some(k), Some(s)) = (kept, &got) {
                k.keep(s.clone());
            }
            Ok(got)
        }
        _ => Ok(None),
    }
}

/// The `machine_inputs` output of the TerraformCluster the Cluster names (`Ok(None)`: its
/// infrastructure is not a TerraformCluster), or why it cannot be read yet. The state is
/// read once per change of its Secret (see `Context::handoffs`).
async fn cluster_outputs<K: TerraformObject>(
    ctx: &Context,
    scope: &Scope<K>,
    cluster: Option<&serde_json::Value>,
) -> Result<Result<Option<serde_json::Value>, String>, Error> {
    let Some((name, base)) = gather_apply::handoff_state(cluster) else {
        return Ok(Ok(None));
    };
    // The TerraformCluster controller's cache holds its state Secrets' metadata.
    let meta = match ctx.caches(Kind::TerraformCluster) {
        Some(c) => c
            .secret_meta(&scope.namespace, &base)
            .map(|m| m.metadata.clone()),
        None => scope
            .secrets
            .get_metadata_opt(&base)
            .await?
            .map(|m| m.metadata),
    };
    // Whether the TerraformCluster is provisioned: its controller's cache, else a read.
    let cached = ctx
        .caches(Kind::TerraformCluster)
        .and_then(|c| (c.provisioned)(&scope.namespace, name));
    let cluster_provisioned = match cached {
        Some(p) => Some(p),
        None => {
            Api::<crate::api::TerraformCluster>::namespaced(ctx.client.clone(), &scope.namespace)
                .get_opt(name)
                .await?
                .map(|c| gather_apply::object_provisioned(&c))
        }
    };
    if let Err(why) =
        gather_apply::handoff_readable(name, &base, meta.is_some(), cluster_provisioned)
    {
        return Ok(Err(why));
    }
    let Some(meta) = meta else {
        return Ok(Err(gather_apply::no_handoff_state(name, &base)));
    };
    let version = meta.resource_version.unwrap_or_default();
    let key = format!("{}/{name}", scope.namespace);
    let known = ctx
        .handoffs
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .get(&key)
        .filter(|(v, _)| *v == version)
        .map(|(_, out)| out.clone());
    if let Some(out) = known {
        return Ok(Ok(Some(out)));
    }
    let _permit = ctx.state_reads.acquire(Lane::Ordinary).await;
    let suffix = names::state_suffix(Kind::TerraformCluster, name);
    let secrets = crate::state::secrets::read(&scope.secrets, &base, Some(&suffix)).await?;
    let out = match gather_apply::handoff_of(name, &secrets) {
        Ok(out) => out,
        Err(why) => return Ok(Err(why)),
    };
    ctx.handoffs
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert(key, (version, out.clone()));
    Ok(Ok(Some(out)))
}

/// Writes `initialization.provisioned` and the status fields the state's outputs set (a
/// state that cannot be read now leaves them for the next apply, with a warning in the
/// log: provisioned is what Cluster API waits for).
async fn rebuild_status<K: TerraformObject>(
    ctx: &Context,
    scope: &Scope<K>,
    obj: &K,
) -> Result<(), Error> {
    // Every provisioned object's first pass after a move comes here: the permits bound how
    // many of their states are in memory at once. This pass holds none (see reconcile).
    let _permit = ctx.state_reads.acquire(Lane::Ordinary).await;
    let base = names::state_secret_name(&scope.suffix);
    let secrets = crate::state::secrets::read(&scope.secrets, &base, Some(&scope.suffix)).await?;
    let role = Role::from(K::KIND);
    let mut status = serde_json::Map::new();
    match crate::state::outputs(&secrets, crate::state::DEFAULT_DECOMPRESSION_CAP)
        .map_err(|e| vec![e])
        .and_then(|o| crate::contract::outputs::fields(role, &o))
    {
        Ok(f) => status = f.status,
        Err(why) => {
            tracing::warn!(why = %why.join("; "), "the outputs' status fields are not rebuilt");
        }
    }
    write_provisioned(&scope.api, obj, status).await?;
    Ok(())
}
