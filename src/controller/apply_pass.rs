//! The apply side of a pass on an object not being deleted, once the deletion's table
//! has said "not deleting" and the bookkeeping has run: observe what the apply table needs
//! beside the deletion's observation → decide (`rules::apply`, pure) → write the
//! conditions of both tables → act (`act::apply`). A destroy always wins: this pass never
//! runs on an object being deleted, and a deletion that begins while it runs fails its
//! guarded write.

use std::sync::Arc;
use std::time::Duration;

use kube::runtime::controller::Action as Requeue;
use kube::runtime::events::EventType;
use tracing::{info, warn};

use super::act::{self, attempt::Started};
use super::events::publish;
use super::source;
use super::status::{write_provisioned, write_status_keeping_with};
use super::{Context, Error, Scope};
use crate::api::TerraformObject;
use crate::api::names;
use crate::contract::Role;
use crate::gather::Observed;
use crate::gather::apply::{self as gather_apply, ApplyStateSeen};
use crate::gather::source::{LiveObservation, observe_live};
use crate::gather::verdict::{self, LOOK_AGAIN, Verdict};
use crate::rules::Decision;
use crate::rules::apply::{ApplyAction, ApplyRow, Prerequisite};
use crate::state::permits::Lane;

/// What the apply side of a pass decided, and what it decided from.
pub struct LiveDecision {
    /// The observation, with the state when an apply was due (and its permit).
    pub observed: Observed,
    pub state_seen: ApplyStateSeen,
    /// The decision, what the conditions say, and the attempt to start, rendered.
    pub verdict: Verdict<act::attempt::Attempt>,
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

/// The key of the apply's remembered refusals (apart from the destroy's).
fn refusal_key<K: TerraformObject>(scope: &Scope<K>) -> String {
    format!("{}/apply", scope.uid)
}

/// The apply side's decision on a live object: one observation of the cluster
/// ([`observe_live`], through the manager's caches where it has them) and one decision
/// ([`verdict::decide`]), the code `captf explain` runs too (with and without `-f`). With
/// `rebuild`, a provisioned object whose status was dropped (by a move) has it rebuilt
/// first, as the manager does; without, the decision is made as it will be once it is.
pub async fn decide_live<K: TerraformObject>(
    ctx: &Context,
    scope: &Scope<K>,
    obj: &K,
    observed: Observed,
    state_seen: ApplyStateSeen,
    rebuild: bool,
) -> Result<Live, Error> {
    let latched = obj
        .status()
        .and_then(|s| s.initialization.as_ref())
        .and_then(|i| i.provisioned)
        == Some(true);
    if rebuild && gather_apply::provisioned(obj.meta(), latched) && !latched {
        // Rebuilt from the recorded success (after clusterctl move, which drops the
        // status), without a Job: provisioned, and the status fields of the outputs, read
        // from the state again. The next pass decides on the object as written.
        rebuild_status(ctx, scope, obj).await?;
        return Ok(Live::StatusRebuilt);
    }
    let source = source::Cluster::new(ctx, scope, Lane::Ordinary);
    let LiveObservation {
        observed,
        state_seen,
        sources,
    } = observe_live(&source, observed, state_seen, latched, &ctx.settings).await?;
    let refused = ctx.refusal(&refusal_key(scope));
    let verdict = verdict::decide(
        &observed,
        &sources,
        &state_seen,
        &ctx.settings,
        refused.as_deref(),
        |n, inputs| act::apply::render(ctx, scope, obj, n, inputs),
    );
    let bootstrap_unwatched = scope.caches.as_ref().is_none_or(|c| c.owners.is_none())
        || (sources.bootstrap.is_none()
            && sources
                .owner
                .as_ref()
                .and_then(|o| gather_apply::bootstrap_secret_name(observed.kind, o))
                .is_some());
    Ok(Live::Decided(Box::new(LiveDecision {
        observed,
        state_seen,
        verdict,
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
        verdict: Verdict {
            facts,
            decision,
            start,
        },
        bootstrap_unwatched,
    } = match decide_live(ctx, scope, obj.as_ref(), observed, state_seen, true).await? {
        Live::StatusRebuilt => return Ok(Requeue::requeue(Duration::ZERO)),
        Live::Decided(d) => *d,
    };
    info!(row = %decision.row.label(), action = ?decision.action, "apply decision");

    // While the API server refuses what the attempt needs, each pass tries again, and the
    // conditions keep saying why it cannot start instead of "attempt n is starting"; a
    // pass that starts none forgets the refusal.
    let refusal_key = refusal_key(scope);
    if decision.action.start_attempt().is_none() {
        ctx.clear_refusal(&refusal_key);
    }
    // What a deletion asked now would reach, written with the apply table's conditions.
    let ready = super::preview::deletion_ready(ctx, scope, &observed, true).await?;
    let mut conditions = decision.conditions.clone();
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
        &decision,
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
                // Refused (an admission policy, a quota, a permission): remembered, and the
                // next pass, at once the first time, decides with it: its conditions say
                // so instead of "starting", and it tries again.
                Err(e) => match e.refusal() {
                    Some(why) => {
                        warn!(%why, "the API server refused what the apply needs");
                        if ctx.set_refusal(&refusal_key, &why) {
                            publish(
                                ctx,
                                obj.as_ref(),
                                EventType::Warning,
                                super::events::APPLY_CANNOT_START,
                                "Apply",
                                &verdict::refused_message(&observed, n, &why),
                            )
                            .await;
                        }
                        Ok(Requeue::requeue(super::retry::after_refusal(
                            facts.refused.is_some(),
                        )))
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
            Ok(Requeue::requeue(LOOK_AGAIN.min(resync)))
        }
        _ => Ok(Requeue::requeue(resync)),
    }
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
