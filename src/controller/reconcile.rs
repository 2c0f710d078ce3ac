//! The pass: one generic reconcile for the three kinds. released? -> finalizer -> observe
//! (I/O) -> decide (the rule table, pure) -> bookkeeping -> status -> dispatch to one
//! action (`act/`). Writes that must survive a crash (the attempt number, the cleanup
//! marker) are made before what they guard; each action's file states its order.

use std::sync::Arc;
use std::time::Duration;

use jiff::Timestamp;
use kube::ResourceExt;
use kube::runtime::controller::Action as Requeue;
use kube::runtime::events::EventType;
use tracing::{debug, info, instrument, warn};

use super::act::{self, abandon, backup, cleanup, destroy};
use super::events::{self, publish};
use super::observe;
use super::status::{write_status, write_status_keeping, write_status_keeping_with};
use super::{Context, Error, Scope, bookkeeping};
use crate::api::TerraformObject;
use crate::api::conditions;
use crate::api::names;
use crate::gather;
use crate::gather::source::Subject;
use crate::io::writes::{self, guarded_patch};
use crate::metrics::labels::{ByKind, ByRow, KindValue};
use crate::rules::{self, AbandonMark, Action, Decision, Facts};
use crate::state::permits::Lane;

/// How often an object is looked at again when nothing it watches changes.
pub(crate) const RESYNC: Duration = Duration::from_secs(600);

/// How soon an attempt the API server refused to start is tried again.
const REFUSED_RETRY: Duration = crate::gather::verdict::LOOK_AGAIN;

fn annotation<'a, K: ResourceExt>(obj: &'a K, key: &str) -> Option<&'a str> {
    obj.annotations().get(key).map(String::as_str)
}

/// One pass over `obj`. `lane` says whether it is the pass after a Job of the object
/// finished, which takes its state-read permit before the others ([`Lane`]). Its span
/// names the object `object`: in the JSON logs, a span's `name` is the span's own name.
#[instrument(skip(obj, ctx, lane), fields(kind = %K::KIND, namespace = obj.namespace().unwrap_or_default(), object = obj.name_any()))]
pub async fn reconcile<K: TerraformObject>(
    obj: Arc<K>,
    ctx: Arc<Context>,
    lane: Lane,
) -> Result<Requeue, Error> {
    let caches = ctx.caches(K::KIND);
    let scope = Scope::new(&ctx.client, obj.as_ref())?.with_caches(caches.clone());
    let deleting = obj.meta().deletion_timestamp.is_some();
    if deleting && ctx.released.contains(&scope.uid) {
        debug!("released by an earlier pass; this cached copy is older than the release");
        return Ok(Requeue::await_change());
    }
    ctx.metrics.reconciles.inc(&ByKind::of(K::KIND));

    // The finalizer goes on at first sight, before anything can be created for the object,
    // paused or not (as CAPI's controllers do), except on an object clusterctl move is
    // taking away: it strips the finalizers before it deletes the source copy, and one put
    // back in between would hold that copy for ever.
    let moving = annotation(obj.as_ref(), names::CLUSTERCTL_DELETE_FOR_MOVE).is_some();
    if !deleting && !moving && !obj.finalizers().iter().any(|f| f == K::KIND.finalizer()) {
        let ops = writes::add_finalizer_ops(obj.meta(), K::KIND.finalizer());
        guarded_patch(&scope.api, obj.meta(), ops).await?;
        return Ok(Requeue::await_change());
    }
    if !deleting && obj.finalizers().is_empty() {
        return Ok(Requeue::await_change());
    }

    // The manager's caches, once each has had its first list (a pass a test runs without
    // the controllers reads the API server).
    if let Some(c) = &caches {
        c.ready().await.map_err(Error::Setup)?;
    }
    let source = super::source::Cluster::new(&ctx, &scope, lane);
    let (observed, state_meta) =
        gather::source::observe_pass(&source, Subject::of(obj.as_ref()), &ctx.settings).await?;
    // Starting an attempt needs its Job, which only the manager can render (its templates):
    // it is rendered before the decision, and one that does not render keeps the destroy
    // from starting (row 9) like anything else. While the API server refuses what an
    // attempt needs, each pass tries again, and the conditions say why it cannot start
    // instead of "attempt N is starting": the refusal remembered is a fact of the decision.
    let uid = &scope.uid;
    let refused = ctx.refusal(uid);
    let (decision, facts, findings, attempt) =
        gather::decide_rendering(&observed, &ctx.settings, refused.as_deref(), |n, inputs| {
            destroy::render(&ctx, &scope, obj.as_ref(), n, inputs)
        });
    info!(row = ?decision.row, action = ?decision.action, reason = decision.deleting.reason, message = %decision.deleting.message, "decision");
    if decision.action.start_attempt().is_none() {
        ctx.clear_refusal(uid);
    }

    // Bookkeeping runs on every pass, paused or not: it records what Jobs did.
    let plan = bookkeeping::plan(&observed, &ctx.settings, &facts, &decision);
    let kept = bookkeeping::apply(&ctx, &scope, obj.as_ref(), &observed, &state_meta, plan).await?;
    if kept.written {
        // The object changed; the next pass decides on fresh facts. A record of an
        // apply's end read the state its Job left: the next pass's deletion preview takes
        // it from here while the caches show it unchanged ([`super::caches::KeptStates`]).
        if let (Some(state), Some(_)) = (&observed.state, &caches)
            && gather::apply::unrecorded_apply(&observed).is_some()
        {
            ctx.kept_states.keep(uid, state, &kept.protected);
        }
        return Ok(Requeue::requeue(Duration::ZERO));
    }
    // A part too new to protect yet is looked at again soon.
    let resync = if kept.young_parts {
        REFUSED_RETRY
    } else {
        RESYNC
    };
    // A TerraformCluster whose Cluster is marked for disposal: its record, its condition,
    // and at the end of the retention the Cluster's deletion.
    let mut extra = Vec::new();
    let mut resync = resync;
    if deleting {
        ctx.disposals.forget(&ctx, &scope.uid);
    } else {
        match super::disposal::pass(&ctx, &scope, obj.as_ref(), &observed).await? {
            Some(super::disposal::Disposal::Written) => {
                return Ok(Requeue::requeue(Duration::ZERO));
            }
            Some(super::disposal::Disposal::Decided { condition, wake_at }) => {
                extra.extend(condition);
                if let Some(at) = wake_at {
                    resync = resync.min(until(at, observed.now).max(Duration::from_secs(1)));
                }
            }
            None => {}
        }
    }
    // A live object: the apply table decides the rest of the pass. The state this pass
    // read goes first, and its permit with it: the live pass may wait for a permit of its
    // own (its TerraformCluster's outputs), and a pass that holds one while it waits for
    // another can wait for ever once as many do as there are permits.
    if !deleting && ctx.provision {
        let state_seen = gather::apply::apply_state_seen(&observed, &ctx.settings);
        let mut observed = observed;
        observed.state = None;
        observed.state_permit = None;
        let shown = super::apply_pass::Shown {
            deletion: &decision,
            others: &extra,
        };
        return super::apply_pass::run(&ctx, &scope, obj, observed, state_seen, shown, resync)
            .await;
    }
    // Our status write changes the resourceVersion; the guarded writes that follow in
    // this pass (write-ahead attempt, cleanup marker, release) test the new one when
    // nothing but the status changed, instead of failing on their own status write and
    // redoing the pass.
    // The cleanup writes its status itself, after its marker; so does an abandon in a
    // terminating namespace, after its copies are made and verified (until then it is
    // not abandoning, and a failure is shown instead).
    let copies_first = decision.action == Action::Abandon
        && observed.namespace_terminating
        && !abandon::copied(obj.meta());
    // DeletionReady: during a deletion, whether it will finish by itself; on a live
    // object (not provisioned by the manager here), what a deletion would reach.
    let ready = if deleting {
        ctx.previews.forget(&ctx, uid);
        rules::deletion_ready(&decision)
    } else {
        super::preview::deletion_ready(&ctx, &scope, &observed, false).await?
    };
    extra.push(ready);
    let obj = if decision.action == Action::CleanUp || copies_first {
        obj
    } else {
        write_status_keeping_with(&scope.api, obj, &decision, &extra).await?
    };
    if deleting {
        ctx.metrics.decisions.inc(&ByRow {
            kind: KindValue(K::KIND),
            row: row_label(&decision),
        });
    }

    match decision.action {
        Action::NotDeleting => Ok(Requeue::requeue(resync)),
        // A Job without a Pod changes nothing the manager watches while the Job controller
        // keeps failing to make its Pod: look again soon, for its FailedCreate Events.
        // Nor while a Pod is terminating: once its grace period is over, a Pod still there
        // is stuck (a lost node), and the message names it.
        Action::WaitForJob
            if observe::podless(&observed.jobs, &observed.pods)
                .next()
                .is_some()
                || observed
                    .pods
                    .iter()
                    .chain(observed.earlier_pods.iter())
                    .any(|p| p.metadata.deletion_timestamp.is_some()) =>
        {
            Ok(Requeue::requeue(REFUSED_RETRY))
        }
        Action::BookkeepingOnly | Action::WaitForJob | Action::WaitForDependents => {
            Ok(Requeue::requeue(resync))
        }
        Action::Hold => {
            ctx.metrics.held.inc(&crate::metrics::ByCause::new(
                K::KIND,
                decision
                    .others
                    .iter()
                    .find(|c| c.type_ == conditions::STATE_READABLE)
                    .map(|c| c.reason)
                    .unwrap_or("Held"),
            ));
            publish(
                &ctx,
                obj.as_ref(),
                EventType::Warning,
                decision.deleting.reason,
                "Hold",
                &decision.deleting.message,
            )
            .await;
            Ok(Requeue::requeue(resync))
        }
        Action::RemoveFinalizer => {
            act::release(&ctx, &scope, obj.as_ref()).await?;
            publish(
                &ctx,
                obj.as_ref(),
                EventType::Normal,
                events::RELEASED,
                "RemoveFinalizer",
                "never applied and no state: released without a destroy",
            )
            .await;
            Ok(Requeue::await_change())
        }
        Action::StartDestroy { .. } | Action::RetryLater { .. } => match attempt {
            Some(attempt) => {
                let started = destroy::start_attempt(
                    &ctx,
                    &scope,
                    obj.as_ref(),
                    &observed,
                    &findings,
                    attempt,
                )
                .await;
                match started {
                    // Refused (an admission policy, a quota, a permission): remembered, and
                    // the next pass, at once the first time, decides with it.
                    Err(e) => match e.refusal() {
                        Some(why) => {
                            warn!(%why, "the API server refused what the destroy needs");
                            if ctx.set_refusal(uid, &why) {
                                publish(
                                    &ctx,
                                    obj.as_ref(),
                                    EventType::Warning,
                                    conditions::reason::DESTROY_CANNOT_START,
                                    "StartDestroy",
                                    &rules::refused_message(facts.next_attempt(), &why),
                                )
                                .await;
                            }
                            Ok(Requeue::requeue(super::retry::after_refusal(
                                refused.is_some(),
                            )))
                        }
                        None => Err(e),
                    },
                    Ok(started) => {
                        ctx.clear_refusal(uid);
                        Ok(match started {
                            destroy::Started::Running => Requeue::requeue(RESYNC),
                            destroy::Started::NumberMovedOn => Requeue::requeue(Duration::ZERO),
                            destroy::Started::ClusterPaused | destroy::Started::OwnerGone => {
                                Requeue::requeue(Duration::from_secs(1))
                            }
                        })
                    }
                }
            }
            None => {
                // Between attempts, the backup follows the state a failed attempt left.
                if let (Some(state), Some(fp)) =
                    (&observed.state, backup::readable_fingerprint(&findings))
                {
                    backup::ensure_backup(&ctx, &scope, obj.as_ref(), state, fp).await?;
                }
                let wait = decision
                    .action
                    .next_retry_at()
                    .map(|at| until(at, facts.now))
                    .unwrap_or(RESYNC);
                Ok(Requeue::requeue(wait.min(RESYNC)))
            }
        },
        Action::CleanUp => {
            cleanup::cleanup(&ctx, &scope, obj.as_ref(), &observed, &decision).await?;
            Ok(Requeue::await_change())
        }
        Action::Abandon if copies_first => {
            if let Err(e) = abandon::copy_out(&ctx, &scope, &observed).await {
                let why = e.to_string();
                warn!(%why, "the abandon's copies could not be made; nothing is released");
                let held = rules::decide(&Facts {
                    abandon: AbandonMark::CannotFinish(format!(
                        "copying the state, inputs and backup Secrets to namespace {} before namespace {} goes failed: {why}; nothing is released and the copy is tried again every {}s",
                        ctx.manager_namespace,
                        scope.namespace,
                        REFUSED_RETRY.as_secs()
                    )),
                    ..facts.clone()
                });
                write_status(&scope.api, obj.as_ref(), &held).await?;
                return Ok(Requeue::requeue(REFUSED_RETRY));
            }
            let obj = write_status_keeping(&scope.api, obj, &decision).await?;
            abandon::abandon(&ctx, &scope, obj.as_ref(), &observed, &findings).await?;
            Ok(Requeue::await_change())
        }
        Action::Abandon => {
            abandon::abandon(&ctx, &scope, obj.as_ref(), &observed, &findings).await?;
            Ok(Requeue::await_change())
        }
    }
}

fn row_label(d: &Decision) -> String {
    d.row
        .map(|r| r.to_string())
        .unwrap_or_else(|| "none".into())
}

fn until(at: Timestamp, now: Timestamp) -> Duration {
    let ms = at.as_millisecond() - now.as_millisecond();
    Duration::from_millis(u64::try_from(ms.max(0)).unwrap_or(0))
}
