//! One generic reconcile for the three kinds: observe (I/O) -> the rule table (pure) ->
//! act (I/O) -> status. Writes that must survive a crash (the attempt number, the cleanup
//! marker) are made before what they guard.

use std::sync::Arc;
use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Pod, Secret};
use std::collections::BTreeMap;

use kube::api::{Api, ListParams, Patch, PatchParams};
use kube::runtime::controller::Action as Requeue;
use kube::runtime::events::{Event, EventType};
use kube::{Resource, ResourceExt};
use serde_json::json;
use tracing::{debug, info, instrument, warn};

use super::observe::{self, StateMeta, owner_selector};
use super::writes::{self, annotation_ops, guarded_patch, remove_finalizer_ops};
use super::{Context, Error};
use crate::api::TerraformObject;
use crate::api::conditions::{self, Condition};
use crate::api::names;
use crate::facts::{self, Extras, Observed};
use crate::job::{self, JobOutcome, JobRequest};
use crate::rules::{self, AbandonMark, Action, Blocker, Decision, Facts, StateFacts};
use crate::state::lock::{self, Lock};
use crate::state::{self, StateSecrets};

/// How often an object is looked at again when nothing it watches changes.
const RESYNC: Duration = Duration::from_secs(600);

/// How soon an attempt the API server refused to start is tried again.
const REFUSED_RETRY: Duration = Duration::from_secs(10);

/// The decision shown while the API server refuses what an attempt needs: row 9.
fn refused_decision(facts: &Facts, why: &str) -> Decision {
    rules::decide(&Facts {
        blocker: Some(Blocker::Refused(why.to_string())),
        ..facts.clone()
    })
}

fn annotation<'a, K: ResourceExt>(obj: &'a K, key: &str) -> Option<&'a str> {
    obj.annotations().get(key).map(String::as_str)
}

#[instrument(skip(obj, ctx), fields(kind = %K::KIND, namespace = obj.namespace().unwrap_or_default(), name = obj.name_any()))]
pub async fn reconcile<K: TerraformObject>(
    obj: Arc<K>,
    ctx: Arc<Context>,
) -> Result<Requeue, Error> {
    let ns = obj.namespace().unwrap_or_default();
    let api: Api<K> = Api::namespaced(ctx.client.clone(), &ns);
    let deleting = obj.meta().deletion_timestamp.is_some();
    if deleting
        && let Some(uid) = obj.meta().uid.as_deref()
        && ctx.released.contains(uid)
    {
        debug!("released by an earlier pass; this cached copy is older than the release");
        return Ok(Requeue::await_change());
    }
    ctx.metrics.reconciles.inc(&[K::KIND.as_str()]);

    // The finalizer goes on at first sight, before anything can be created for the object,
    // paused or not (as CAPI's controllers do), except on an object clusterctl move is
    // taking away: it strips the finalizers before it deletes the source copy, and one put
    // back in between would hold that copy for ever.
    let moving = annotation(obj.as_ref(), names::CLUSTERCTL_DELETE_FOR_MOVE).is_some();
    if !deleting && !moving && !obj.finalizers().iter().any(|f| f == K::KIND.finalizer()) {
        let ops = writes::add_finalizer_ops(obj.meta(), K::KIND.finalizer());
        guarded_patch(&api, obj.meta(), ops).await?;
        return Ok(Requeue::await_change());
    }
    if !deleting && obj.finalizers().is_empty() {
        return Ok(Requeue::await_change());
    }

    let (observed, state_meta) = observe::observe_pass(
        &ctx.client,
        &ctx.cluster_api,
        obj.as_ref(),
        &ctx.settings,
        &ctx.state_reads,
    )
    .await?;
    let (mut decision, mut facts, extras) = facts::decide(&observed, &ctx.settings);
    // Starting an attempt needs its Job, which only the manager can render (its templates):
    // a Job that does not render is one more thing that keeps the destroy from starting,
    // and the rule table turns it into row 9 like the others.
    let mut job = None;
    if let (Some(n), Some(inputs)) = (decision.start_attempt, extras.inputs.as_ref()) {
        let suffix = names::state_suffix(K::KIND, &obj.name_any());
        let cluster = facts::owning_cluster(obj.meta());
        let request = owner_request(obj.as_ref(), &suffix, cluster.as_deref(), n, inputs);
        match job::render(&ctx.templates, &request) {
            // Before the attempt, the state's Secrets get every label Terraform's backend
            // selects them by, its own included (a state restored by hand may lack one,
            // and Terraform would then find no state and write an empty one over it).
            Ok(j) => match job::attempt_secret(&ctx.templates, &request) {
                Ok(secret) => {
                    let uid = obj.meta().uid.as_deref().unwrap_or_default();
                    job = Some((
                        j,
                        secret,
                        crate::inputs::state_selector(K::KIND, &obj.name_any(), uid),
                    ));
                }
                Err(e) => {
                    facts.blocker = Some(Blocker::JobDoesNotRender(e.to_string()));
                    decision = rules::decide(&facts);
                }
            },
            Err(e) => {
                facts.blocker = Some(Blocker::JobDoesNotRender(e.to_string()));
                decision = rules::decide(&facts);
            }
        }
    }
    info!(row = ?decision.row, action = ?decision.action, reason = decision.deleting().reason, message = %decision.deleting().message, "decision");
    // While the API server refuses what an attempt needs, each pass tries again, and the
    // conditions say why it cannot start instead of "attempt N is starting".
    let uid = obj.meta().uid.clone().unwrap_or_default();
    let shown = match decision.start_attempt.and_then(|_| ctx.refusal(&uid)) {
        Some(why) => refused_decision(&facts, &why),
        None => {
            ctx.clear_refusal(&uid);
            decision.clone()
        }
    };

    // Bookkeeping runs on every pass, paused or not: it records what Jobs did.
    let kept = bookkeeping(
        &ctx,
        &api,
        obj.as_ref(),
        &observed,
        &state_meta,
        &facts,
        &decision,
    )
    .await?;
    if kept.written {
        // The object changed; the next pass decides on fresh facts.
        return Ok(Requeue::requeue(Duration::ZERO));
    }
    // A part too new to protect yet is looked at again soon.
    let resync = if kept.young_parts {
        REFUSED_RETRY
    } else {
        RESYNC
    };
    // Our status write changes the resourceVersion; the guarded writes that follow in
    // this pass (write-ahead attempt, cleanup marker, release) test the new one when
    // nothing but the status changed, instead of failing on their own status write and
    // redoing the pass.
    // The cleanup writes its status itself, after its marker; so does an abandon in a
    // terminating namespace, after its copies are made and verified (until then it is
    // not abandoning, and a failure is shown instead).
    let copies_first = decision.action == Action::Abandon && observed.namespace_terminating;
    let obj = if decision.action == Action::CleanUp || copies_first {
        obj
    } else {
        write_status_keeping(&api, obj, &shown).await?
    };
    if deleting {
        ctx.metrics
            .decisions
            .inc(&[K::KIND.as_str(), &row_label(&decision)]);
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
            ctx.metrics.held.inc(&[
                K::KIND.as_str(),
                decision
                    .conditions
                    .iter()
                    .find(|c| c.type_ == conditions::STATE_READABLE)
                    .map(|c| c.reason)
                    .unwrap_or("Held"),
            ]);
            publish(
                &ctx,
                obj.as_ref(),
                EventType::Warning,
                decision.deleting().reason,
                "Hold",
                &decision.deleting().message,
            )
            .await;
            Ok(Requeue::requeue(resync))
        }
        Action::RemoveFinalizer => {
            release(&ctx, &api, obj.as_ref()).await?;
            publish(
                &ctx,
                obj.as_ref(),
                EventType::Normal,
                "Released",
                "RemoveFinalizer",
                "never applied and no state: released without a destroy",
            )
            .await;
            Ok(Requeue::await_change())
        }
        Action::StartDestroy | Action::RetryLater => match (decision.start_attempt, job) {
            (Some(n), Some((job, secret, labels))) => {
                let started = start_attempt(
                    &ctx,
                    &api,
                    obj.as_ref(),
                    &observed,
                    &extras,
                    n,
                    (job, secret),
                    &labels,
                )
                .await;
                match started {
                    Err(e) => match e.refusal() {
                        Some(why) => {
                            warn!(%why, "the API server refused what the destroy needs");
                            if ctx.set_refusal(&uid, &why) {
                                let refused = refused_decision(&facts, &why);
                                write_status(&api, obj.as_ref(), &refused).await?;
                                publish(
                                    &ctx,
                                    obj.as_ref(),
                                    EventType::Warning,
                                    refused.deleting().reason,
                                    "StartDestroy",
                                    &refused.deleting().message,
                                )
                                .await;
                            }
                            Ok(Requeue::requeue(REFUSED_RETRY))
                        }
                        None => Err(e),
                    },
                    Ok(next) => {
                        ctx.clear_refusal(&uid);
                        Ok(next)
                    }
                }
            }
            _ => {
                // Between attempts, the backup follows the state a failed attempt left.
                if let (Some(state), Some(fp)) = (&observed.state, readable_fingerprint(&extras)) {
                    let suffix = names::state_suffix(K::KIND, &obj.name_any());
                    ensure_backup(&ctx, obj.as_ref(), &ns, &suffix, state, fp).await?;
                }
                let wait = decision
                    .next_retry_at
                    .map(|at| until(at, facts.now))
                    .unwrap_or(RESYNC);
                Ok(Requeue::requeue(wait.min(RESYNC)))
            }
        },
        Action::CleanUp => {
            cleanup(&ctx, &api, obj.as_ref(), &observed, &decision).await?;
            Ok(Requeue::await_change())
        }
        Action::Abandon if copies_first => {
            let suffix = names::state_suffix(K::KIND, &obj.name_any());
            let ns = obj.namespace().unwrap_or_default();
            if let Err(e) = copy_out(&ctx, obj.as_ref(), &ns, &suffix).await {
                let why = e.to_string();
                warn!(%why, "the abandon's copies could not be made; nothing is released");
                let held = rules::decide(&Facts {
                    abandon: AbandonMark::CannotFinish(format!(
                        "copying the state, inputs and backup Secrets to namespace {} before namespace {ns} goes failed: {why}; nothing is released and the copy is tried again every {}s",
                        ctx.manager_namespace,
                        REFUSED_RETRY.as_secs()
                    )),
                    ..facts.clone()
                });
                write_status(&api, obj.as_ref(), &held).await?;
                return Ok(Requeue::requeue(REFUSED_RETRY));
            }
            let obj = write_status_keeping(&api, obj, &shown).await?;
            abandon(&ctx, &api, obj.as_ref(), &observed, &extras).await?;
            Ok(Requeue::await_change())
        }
        Action::Abandon => {
            abandon(&ctx, &api, obj.as_ref(), &observed, &extras).await?;
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

/// What the bookkeeping of a pass did.
struct Kept {
    /// The object was written: the next pass decides on fresh facts.
    written: bool,
    /// A state part was too new to protect (see [`protect_state`]).
    young_parts: bool,
}

/// Records Job outcomes on the object (destroy failure time, interrupted apply), keeps
/// block-move while a Job is unfinished or the object is being deleted, keeps only the
/// last three finished destroy Jobs, and protects the state.
async fn bookkeeping<K: TerraformObject>(
    ctx: &Context,
    api: &Api<K>,
    obj: &K,
    o: &Observed,
    state_meta: &StateMeta,
    facts: &Facts,
    decision: &Decision,
) -> Result<Kept, Error> {
    let mut edits: Vec<(&str, Option<String>)> = Vec::new();
    let suffix = names::state_suffix(K::KIND, &obj.name_any());

    // The latest destroy attempt failed and that is not recorded yet.
    if facts.attempt > 0
        && facts::deletion_bookkeeping(obj.meta(), names::DESTROY_FAILED_AT).is_none()
    {
        let name = names::job_name(&suffix, names::OPERATION_DESTROY, facts.attempt);
        let job = o
            .jobs
            .iter()
            .find(|j| j.metadata.name.as_deref() == Some(name.as_str()));
        // Its Job is gone while its Pod is still there (the Job was deleted by hand, or
        // by foreground deletion of something else): the attempt was aborted. Recorded
        // now, because the Pod goes too once Terraform has saved its state, and the next
        // attempt then continues from that state.
        let pod_left = o.pods.iter().any(|p| {
            let l = p.metadata.labels.as_ref();
            l.and_then(|l| l.get(names::LABEL_OPERATION))
                .map(String::as_str)
                == Some(names::OPERATION_DESTROY)
                && l.and_then(|l| l.get(names::LABEL_ATTEMPT)) == Some(&facts.attempt.to_string())
        });
        if job.is_none() && pod_left {
            edits.push((names::DESTROY_FAILED_AT, Some(o.now.to_string())));
            publish(
                ctx,
                obj,
                EventType::Warning,
                "DestroyInterrupted",
                "Destroy",
                &format!("the Job of destroy attempt {} was deleted while it ran; the next attempt continues from the state Terraform saves", facts.attempt),
            )
            .await;
        }
        if let Some(j) = job
            && let JobOutcome::Failed {
                reason, error_tail, ..
            } = job::outcome(j, &o.pods)
        {
            let at = job::finished_at(j).unwrap_or(o.now);
            edits.push((names::DESTROY_FAILED_AT, Some(at.to_string())));
            ctx.metrics
                .destroy_failures
                .inc(&[K::KIND.as_str(), &reason]);
            let text = job::failure_message(&reason, error_tail.as_deref(), j, &o.pods);
            publish(
                ctx,
                obj,
                EventType::Warning,
                "DestroyFailed",
                "Destroy",
                &format!("destroy attempt {} failed: {text}", facts.attempt),
            )
            .await;
        }
    }

    // The latest apply Job ended without Terraform exiting by itself, or completed.
    let latest_apply = o
        .jobs
        .iter()
        .filter(|j| job::operation_of(j) == Some(names::OPERATION_APPLY))
        .max_by_key(|j| job::attempt_of(j).unwrap_or(0));
    if let Some(j) = latest_apply {
        match job::outcome(j, &o.pods) {
            JobOutcome::Failed {
                interrupted: true, ..
            } if annotation(obj, names::APPLY_INTERRUPTED).is_none() => {
                edits.push((
                    names::APPLY_INTERRUPTED,
                    Some(job::finished_at(j).unwrap_or(o.now).to_string()),
                ));
            }
            JobOutcome::Succeeded if annotation(obj, names::APPLY_INTERRUPTED).is_some() => {
                edits.push((names::APPLY_INTERRUPTED, None));
            }
            _ => {}
        }
    }

    // An adopted state's fingerprint is recorded once: from then on it is checked like
    // any other, and adopt no longer matters.
    if annotation(obj, names::ADOPT) == Some("true")
        && annotation(obj, names::STATE_LINEAGE).is_none()
        && annotation(obj, names::STATE_SERIAL).is_none()
        && let StateFacts::Readable {
            lineage, serial, ..
        } = &facts.state
    {
        edits.push((names::STATE_LINEAGE, Some(lineage.clone())));
        edits.push((names::STATE_SERIAL, Some(serial.to_string())));
    }

    // block-move: on while a Job is unfinished, and from deletion until the finalizer goes.
    // When the action itself writes the object (the attempt number, the cleanup marker,
    // the release), block-move goes into that write instead of one of its own.
    let action_writes_object = decision.start_attempt.is_some()
        || matches!(
            decision.action,
            Action::CleanUp | Action::Abandon | Action::RemoveFinalizer
        );
    let want_block = (facts.deleting && !action_writes_object) || !facts.unfinished_jobs.is_empty();
    let keep_block = facts.deleting;
    match (
        want_block,
        annotation(obj, names::CLUSTERCTL_BLOCK_MOVE).is_some(),
    ) {
        (true, false) => edits.push((names::CLUSTERCTL_BLOCK_MOVE, Some("true".into()))),
        (false, true) if !keep_block => edits.push((names::CLUSTERCTL_BLOCK_MOVE, None)),
        _ => {}
    }

    prune_destroy_jobs(ctx, o, facts.attempt).await?;
    // Not while a Job of the object runs: Terraform writes the state with the
    // resourceVersion it read, and a finalizer added in between fails that write. Nor on
    // the parts when this pass starts a Job, which takes their finalizer off again.
    let mut young_parts = false;
    if facts.cleanup.is_none() && facts.unfinished_jobs.is_empty() {
        let parts = decision.start_attempt.is_none();
        young_parts = protect_state(ctx, obj, o, state_meta, &suffix, parts).await?;
    }

    let ops = annotation_ops(obj.meta(), &edits);
    Ok(Kept {
        written: guarded_patch(api, obj.meta(), ops).await?.is_some(),
        young_parts,
    })
}

/// A part Secret younger than this is not protected yet: Terraform makes a new part with
/// a create and then an update, and a finalizer added in between fails its write. (Only
/// a Terraform run outside CAPTF's Jobs can be writing when no Job runs.)
const PART_SETTLES: i64 = 10;

/// Puts the protection finalizer on the base state Secret and, with `parts`, on its part
/// Secrets: whenever no Job of the object runs, so that a namespace deletion, which
/// deletes every Secret in one call, leaves the whole state. (While a Job runs they stay
/// off the parts: Terraform deletes parts itself when a state shrinks, and a part held in
/// deletion would corrupt the next read; the backup is the protected copy then.) Uses
/// the metadata this pass read with the state, or lists the base and parts by
/// Terraform's suffix label. Returns whether a part was left for being too new.
async fn protect_state<K: TerraformObject>(
    ctx: &Context,
    obj: &K,
    o: &Observed,
    state_meta: &StateMeta,
    suffix: &str,
    parts: bool,
) -> Result<bool, Error> {
    let ns = o.meta.namespace.clone().unwrap_or_default();
    let secrets: Api<Secret> = Api::namespaced(ctx.client.clone(), &ns);
    let base = names::state_secret_name(suffix);
    let metas: Vec<kube::api::ObjectMeta> = match (&o.state, state_meta) {
        (Some(state), Some(_)) => state.metas.values().cloned().collect(),
        _ => {
            let lp = ListParams::default().labels(&format!("{}={suffix}", names::TF_LABEL_SUFFIX));
            let mut found: Vec<kube::api::ObjectMeta> = secrets
                .list_metadata(&lp)
                .await?
                .items
                .into_iter()
                .map(|m| m.metadata)
                .filter(|m| {
                    m.name
                        .as_deref()
                        .is_some_and(|n| n == base || names::part_index(&base, n).is_some())
                })
                .collect();
            // A base restored by hand may lack the label.
            if !found
                .iter()
                .any(|m| m.name.as_deref() == Some(base.as_str()))
                && annotation(obj, names::APPLIED_AT).is_some()
                && let Some(m) = secrets.get_metadata_opt(&base).await?
            {
                found.push(m.metadata);
            }
            found
        }
    };
    let mut young = false;
    for meta in metas {
        let is_base = meta.name.as_deref() == Some(base.as_str());
        if meta.deletion_timestamp.is_some() || !(is_base || parts) {
            continue;
        }
        let ops = writes::add_finalizer_ops(&meta, names::PROTECT_FINALIZER);
        if ops.is_empty() {
            continue;
        }
        let age = meta
            .creation_timestamp
            .as_ref()
            .map(|t| o.now.as_second() - t.0.as_second());
        if !is_base && age.is_some_and(|a| a < PART_SETTLES) {
            young = true;
            continue;
        }
        match guarded_patch(&secrets, &meta, ops).await {
            Ok(_) => {}
            Err(e) if e.is_not_found() => {}
            Err(e) => return Err(e),
        }
    }
    Ok(young)
}

/// Keeps the last three finished destroy Jobs for their logs; older ones go. Only
/// attempts before the current one, whose outcome is recorded, are ever pruned.
async fn prune_destroy_jobs(ctx: &Context, o: &Observed, current: u32) -> Result<(), Error> {
    let mut finished: Vec<(&Job, u32)> = o
        .jobs
        .iter()
        .filter(|j| job::operation_of(j) == Some(names::OPERATION_DESTROY))
        .filter_map(|j| job::attempt_of(j).map(|a| (j, a)))
        .filter(|(j, a)| {
            *a < current && !matches!(job::outcome(j, &o.pods), JobOutcome::Unfinished { .. })
        })
        .collect();
    finished.sort_by_key(|(_, a)| *a);
    let keep_from = finished.len().saturating_sub(2); // plus the current attempt: three kept
    let ns = o.meta.namespace.clone().unwrap_or_default();
    let jobs: Api<Job> = Api::namespaced(ctx.client.clone(), &ns);
    let secrets: Api<Secret> = Api::namespaced(ctx.client.clone(), &ns);
    for (j, _) in &finished[..keep_from] {
        writes::delete_if_present(&jobs, &j.name_any()).await?;
        writes::delete_if_present(&secrets, &j.name_any()).await?;
    }
    Ok(())
}

/// [`write_status`], then the object to go on with: the written one when only its status
/// changed (so that the guarded writes after it test the new resourceVersion), else the
/// one read.
async fn write_status_keeping<K: TerraformObject>(
    api: &Api<K>,
    obj: Arc<K>,
    decision: &Decision,
) -> Result<Arc<K>, Error> {
    Ok(match write_status(api, obj.as_ref(), decision).await? {
        Some(written) if writes::only_status_changed(obj.as_ref(), &written) => Arc::new(written),
        _ => obj,
    })
}

/// Merges the decision's conditions into the status; unchanged status is not rewritten.
/// Returns the object as written, if it was.
async fn write_status<K: TerraformObject>(
    api: &Api<K>,
    obj: &K,
    decision: &Decision,
) -> Result<Option<K>, Error> {
    let existing: Vec<Condition> = obj
        .status()
        .map(|s| s.conditions.clone())
        .unwrap_or_default();
    let generation = obj.meta().generation;
    let merged = conditions::merge(
        &existing,
        &decision.conditions,
        generation,
        Timestamp::now(),
    );
    let same_generation = obj.status().and_then(|s| s.observed_generation) == generation;
    if !conditions::differ_ignoring_time(&existing, &merged) && same_generation {
        return Ok(None);
    }
    let status = json!({ "conditions": merged, "observedGeneration": generation });
    match writes::patch_status(api, &obj.name_any(), status).await {
        Ok(written) => Ok(Some(written)),
        Err(e) if e.is_not_found() => Ok(None),
        Err(e) => Err(e),
    }
}

/// Removes the object finalizer and block-move in one write, and remembers the release.
async fn release<K: TerraformObject>(ctx: &Context, api: &Api<K>, obj: &K) -> Result<(), Error> {
    let mut ops = annotation_ops(obj.meta(), &[(names::CLUSTERCTL_BLOCK_MOVE, None)]);
    ops.extend(remove_finalizer_ops(obj.meta(), K::KIND.finalizer()));
    match guarded_patch(api, obj.meta(), ops).await {
        Ok(_) => {}
        Err(e) if e.is_not_found() => {}
        Err(e) => return Err(e),
    }
    if let Some(uid) = obj.meta().uid.as_deref() {
        ctx.released.insert(uid);
    }
    Ok(())
}

fn owner_request<'a, K: TerraformObject>(
    obj: &'a K,
    suffix: &'a str,
    cluster: Option<&'a str>,
    attempt: u32,
    inputs: &'a crate::inputs::Inputs,
) -> JobRequest<'a> {
    JobRequest {
        kind: K::KIND,
        name: obj.meta().name.as_deref().unwrap_or_default(),
        uid: obj.meta().uid.as_deref().unwrap_or_default(),
        namespace: obj.meta().namespace.as_deref().unwrap_or_default(),
        suffix,
        cluster_name: cluster,
        operation: names::OPERATION_DESTROY,
        attempt,
        inputs,
    }
}

/// Starts destroy attempt `n` with its rendered `job`: backup (first attempt), the
/// backend's `labels` on the state Secrets, runner RBAC, stale lock, the write-ahead
/// attempt number, then the Job (creating an existing name is a no-op).
#[allow(clippy::too_many_arguments)]
async fn start_attempt<K: TerraformObject>(
    ctx: &Context,
    api: &Api<K>,
    obj: &K,
    o: &Observed,
    extras: &Extras,
    n: u32,
    (job, secret): (Job, Secret),
    backend_labels: &BTreeMap<String, String>,
) -> Result<Requeue, Error> {
    let ns = obj.namespace().unwrap_or_default();
    let suffix = names::state_suffix(K::KIND, &obj.name_any());
    // What the Job needs, all before the attempt number is written; independent of each
    // other, so their requests run at once.
    let backup_and_labels = async {
        if let Some(state) = &o.state {
            let backup = async {
                match readable_fingerprint(extras) {
                    Some(fp) => ensure_backup(ctx, obj, &ns, &suffix, state, fp).await,
                    None => Ok(()),
                }
            };
            futures::try_join!(
                backup,
                ensure_backend_labels(ctx, &ns, state, backend_labels),
            )?;
        }
        Ok::<_, Error>(())
    };
    let stale_lock = async {
        if let (true, Some(lease)) = (extras.stale_lock, &o.lock) {
            let leases: Api<Lease> = Api::namespaced(ctx.client.clone(), &ns);
            info!("clearing Terraform's lock held by a runner of this object that is gone");
            writes::delete_as_read(&leases, &lease.metadata).await?;
        }
        Ok::<_, Error>(())
    };
    futures::try_join!(
        backup_and_labels,
        super::rbac::ensure_runner_rbac(ctx, &ns),
        stale_lock,
    )?;
    // Write-ahead: the attempt number is on the object before its Job exists, under this
    // object's uid; a cleanup marker of an earlier object of this name goes.
    let edits = [
        (names::DESTROY_ATTEMPT, Some(n.to_string())),
        (names::DELETION_UID, obj.meta().uid.clone()),
        (names::DESTROY_FAILED_AT, None),
        (names::CLEANUP_STARTED, None),
        (names::CLUSTERCTL_BLOCK_MOVE, Some("true".to_string())),
    ];
    let written = guarded_patch(api, obj.meta(), annotation_ops(obj.meta(), &edits)).await?;
    let jobs: Api<Job> = Api::namespaced(ctx.client.clone(), &ns);
    // The name is taken by a Job of an earlier object of this name: move on to the next
    // number (its Secret, of the same name, is that Job's). By this attempt's own Job (a
    // restart): it is made already.
    let existing = jobs.get_metadata_opt(&job.name_any()).await?;
    if existing
        .as_ref()
        .is_some_and(|j| j.labels().get(names::LABEL_OWNER_UID) != obj.meta().uid.as_ref())
    {
        let current = written.as_ref().map(|o| o.meta()).unwrap_or(obj.meta());
        let bump = [(names::DESTROY_ATTEMPT, Some((n + 1).to_string()))];
        guarded_patch(api, current, annotation_ops(current, &bump)).await?;
        return Ok(Requeue::requeue(Duration::ZERO));
    }
    // The attempt's Secret (the variables) first, then the Job. The Secret carries the
    // owner labels, so the cleanup's labelled delete takes it; a pruned Job's and an
    // abandoned object's are deleted with their Jobs.
    let secrets: Api<Secret> = Api::namespaced(ctx.client.clone(), &ns);
    writes::create_if_absent(&secrets, &secret).await?;
    let created = existing.is_none() && writes::create_if_absent(&jobs, &job).await?;
    if created {
        ctx.metrics.destroy_attempts.inc(&[K::KIND.as_str()]);
        publish(
            ctx,
            obj,
            EventType::Normal,
            "DestroyStarted",
            "Destroy",
            &format!("destroy attempt {n} started in Job {}", job.name_any()),
        )
        .await;
    }
    Ok(Requeue::requeue(RESYNC))
}

/// Terraform's backend finds the state's Secrets by its labels, its own and the `labels`
/// setting: a state Secret lacking one (restored by hand, or written by an apply with
/// other labels) reads as no state, Terraform then writes an empty state over the base
/// (by name), and the destroy finds nothing to destroy.
async fn ensure_backend_labels(
    ctx: &Context,
    ns: &str,
    state: &StateSecrets,
    labels: &BTreeMap<String, String>,
) -> Result<(), Error> {
    let secrets: Api<Secret> = Api::namespaced(ctx.client.clone(), ns);
    let names = std::iter::once(state.base_name.clone()).chain(
        state
            .parts
            .keys()
            .map(|n| names::part_secret_name(&state.base_name, *n)),
    );
    for name in names {
        let Some(meta) = secrets.get_metadata_opt(&name).await? else {
            continue;
        };
        let have = meta.metadata.labels.clone().unwrap_or_default();
        let missing: BTreeMap<&String, &String> = labels
            .iter()
            .filter(|(k, v)| have.get(*k) != Some(*v))
            .collect();
        let mut current = meta.metadata;
        if !missing.is_empty() {
            let patch = json!({ "metadata": { "labels": missing } });
            current = secrets
                .patch(&name, &PatchParams::default(), &Patch::Merge(patch))
                .await?
                .metadata;
        }
        // A part keeps no finalizer while the Job runs: Terraform deletes the parts a
        // shrinking state no longer has.
        if name != state.base_name {
            let ops = remove_finalizer_ops(&current, names::PROTECT_FINALIZER);
            if !ops.is_empty() {
                guarded_patch(&secrets, &current, ops).await?;
            }
        }
    }
    Ok(())
}

/// The lineage and serial of the state this pass read, when it is readable.
fn readable_fingerprint(extras: &Extras) -> Option<(&str, u64)> {
    let v = extras.verdict.as_ref().filter(|v| v.readable)?;
    Some((v.lineage.as_deref()?, v.serial?))
}

/// Keeps the backup Secret(s) a copy of the latest readable state this object's passes
/// read: written before the first attempt, and again whenever a pass reads a newer serial
/// of the same lineage (a backup of another lineage is never overwritten). The backup
/// carries the lineage and serial it holds; a backup without them (written by an older
/// version) is replaced only when the object's recorded fingerprint names the lineage.
async fn ensure_backup<K: TerraformObject>(
    ctx: &Context,
    obj: &K,
    ns: &str,
    suffix: &str,
    state: &StateSecrets,
    fingerprint: (&str, u64),
) -> Result<(), Error> {
    let (lineage, serial) = fingerprint;
    let uid = obj.meta().uid.clone().unwrap_or_default();
    if ctx.backed_up(&uid) == Some((lineage.to_string(), serial)) {
        return Ok(());
    }
    let secrets: Api<Secret> = Api::namespaced(ctx.client.clone(), ns);
    let base = names::backup_secret_name(suffix);
    let existing = secrets.get_metadata_opt(&base).await?;
    if let Some(existing) = &existing {
        let ann = existing.metadata.annotations.clone().unwrap_or_default();
        let held_serial = ann
            .get(names::STATE_SERIAL)
            .and_then(|v| v.parse::<u64>().ok());
        let replace = match (ann.get(names::STATE_LINEAGE), held_serial) {
            (Some(l), Some(n)) => l == lineage && n < serial,
            _ => annotation(obj, names::STATE_LINEAGE) == Some(lineage),
        };
        if !replace {
            if ann.get(names::STATE_LINEAGE).map(String::as_str) == Some(lineage)
                && held_serial == Some(serial)
            {
                ctx.set_backed_up(&uid, lineage, serial);
            }
            return Ok(());
        }
    }
    let Some(joined) = state.joined() else {
        return Ok(());
    };
    let chunks = state::chunk(&joined);
    // Parts first, the base last: the base names the lineage and serial of what its parts
    // hold, and a base present means the backup is complete.
    for (i, chunk) in chunks.iter().enumerate().skip(1).rev() {
        let s = backup_secret(
            obj,
            ns,
            &names::part_secret_name(&base, i as u32),
            chunk,
            None,
        );
        writes::create_or_replace(&secrets, &s).await?;
    }
    if let Some(first) = chunks.first() {
        let s = backup_secret(obj, ns, &base, first, Some((lineage, serial)));
        writes::create_or_replace(&secrets, &s).await?;
    }
    // Parts an earlier, larger backup had.
    let mut n = chunks.len().max(1) as u32;
    while let Some(m) = secrets
        .get_metadata_opt(&names::part_secret_name(&base, n))
        .await?
    {
        let ops = remove_finalizer_ops(&m.metadata, names::PROTECT_FINALIZER);
        let _ = guarded_patch(&secrets, &m.metadata, ops).await;
        writes::delete_if_present(&secrets, &names::part_secret_name(&base, n)).await?;
        n += 1;
    }
    ctx.set_backed_up(&uid, lineage, serial);
    Ok(())
}

fn backup_secret<K: TerraformObject>(
    obj: &K,
    ns: &str,
    name: &str,
    chunk: &[u8],
    holds: Option<(&str, u64)>,
) -> Secret {
    let mut labels = owner_labels(obj);
    labels.insert(names::CLUSTERCTL_MOVE_LABEL.into(), String::new());
    let mut annotations: BTreeMap<String, String> =
        [("encoding".to_string(), "gzip".to_string())].into();
    if let Some((lineage, serial)) = holds {
        annotations.insert(names::STATE_LINEAGE.into(), lineage.into());
        annotations.insert(names::STATE_SERIAL.into(), serial.to_string());
    }
    Secret {
        metadata: kube::api::ObjectMeta {
            name: Some(name.into()),
            namespace: Some(ns.into()),
            labels: Some(labels),
            finalizers: Some(vec![names::PROTECT_FINALIZER.into()]),
            annotations: Some(annotations),
            ..Default::default()
        },
        data: Some(
            [(
                names::TF_STATE_KEY.to_string(),
                k8s_openapi::ByteString(chunk.to_vec()),
            )]
            .into(),
        ),
        ..Default::default()
    }
}

/// The owner labels, as every Secret and Job of the object carries them.
fn owner_labels<K: TerraformObject>(obj: &K) -> std::collections::BTreeMap<String, String> {
    crate::inputs::owner_labels(
        K::KIND,
        &obj.name_any(),
        obj.meta().uid.as_deref().unwrap_or_default(),
    )
}

/// The names of a chunked Secret set that exist (base and parts), from a read.
async fn chunk_names(secrets: &Api<Secret>, base: &str) -> Result<Vec<String>, Error> {
    Ok(chunk_metas(secrets, base)
        .await?
        .into_iter()
        .filter_map(|m| m.metadata.name)
        .collect())
}

/// The metadata of a chunked Secret set's members that exist (base and parts), from a
/// read: the base and the first part at once, then the parts up to the first gap.
async fn chunk_metas(
    secrets: &Api<Secret>,
    base: &str,
) -> Result<Vec<kube::core::PartialObjectMeta<Secret>>, Error> {
    let first = names::part_secret_name(base, 1);
    let (base_meta, mut part) = futures::try_join!(
        secrets.get_metadata_opt(base),
        secrets.get_metadata_opt(&first)
    )?;
    let mut out: Vec<_> = base_meta.into_iter().collect();
    let mut n = 1;
    while let Some(meta) = part {
        out.push(meta);
        n += 1;
        part = secrets
            .get_metadata_opt(&names::part_secret_name(base, n))
            .await?;
    }
    Ok(out)
}

/// Deletes the object's Jobs (their Pods go with them) and Pods left without a Job.
async fn delete_jobs(ctx: &Context, ns: &str, o: &Observed) -> Result<(), Error> {
    let jobs: Api<Job> = Api::namespaced(ctx.client.clone(), ns);
    for j in &o.jobs {
        writes::delete_if_present(&jobs, &j.name_any()).await?;
    }
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), ns);
    let uid = o.meta.uid.clone().unwrap_or_default();
    for p in pods
        .list(&ListParams::default().labels(&owner_selector(&uid)))
        .await?
        .items
    {
        let orphan = !o
            .jobs
            .iter()
            .any(|j| p.labels().get("job-name") == j.metadata.name.as_ref());
        if orphan && p.metadata.deletion_timestamp.is_none() {
            writes::delete_if_present(&pods, &p.name_any()).await?;
        }
    }
    Ok(())
}

/// Deletes Terraform's lock Lease when [`lock::judge`] finds it free or held by a runner
/// of this object that is provably gone, and only as it was read; a lock held by anyone
/// else stays, whatever the step.
async fn delete_lock_if_free(
    ctx: &Context,
    ns: &str,
    suffix: &str,
    o: &Observed,
) -> Result<(), Error> {
    let leases: Api<Lease> = Api::namespaced(ctx.client.clone(), ns);
    let name = names::lock_lease_name(suffix);
    let Some(lease) = leases.get_opt(&name).await? else {
        return Ok(());
    };
    let pods: Vec<Pod> = o.pods.iter().chain(&o.earlier_pods).cloned().collect();
    match lock::judge(Some(&lease), suffix, &pods, jiff::Timestamp::now()) {
        Lock::Free | Lock::StaleOwn { .. } => {
            writes::delete_as_read(&leases, &lease.metadata).await?;
        }
        Lock::Held { holder, .. } => debug!(%holder, "lock Lease left in place: held"),
    }
    Ok(())
}

/// SPEC section 6: after a destroy that left no managed resource instance. The cleanup
/// marker is written before the first delete (and before the status, which this action
/// writes itself), with the reads of what there is to delete at the same time; then the
/// status, the Jobs, the Secrets and the lock at once; the release after all of them.
async fn cleanup<K: TerraformObject>(
    ctx: &Context,
    api: &Api<K>,
    obj: &K,
    o: &Observed,
    decision: &Decision,
) -> Result<(), Error> {
    let ns = obj.namespace().unwrap_or_default();
    let suffix = names::state_suffix(K::KIND, &obj.name_any());
    let secrets: Api<Secret> = Api::namespaced(ctx.client.clone(), &ns);
    let marker = async {
        if facts::deletion_bookkeeping(obj.meta(), names::CLEANUP_STARTED).is_some() {
            return Ok(None);
        }
        // Before the status write of this pass, so the cached copy may lack the status
        // an earlier pass wrote: that alone does not fail the marker.
        writes::guarded_patch_past_status(api, obj, |meta| {
            annotation_ops(
                meta,
                &[
                    (
                        names::CLEANUP_STARTED,
                        Some(names::CLEANUP_DESTROYED.into()),
                    ),
                    (names::DELETION_UID, meta.uid.clone()),
                    (names::CLUSTERCTL_BLOCK_MOVE, Some("true".into())),
                ],
            )
        })
        .await
    };
    let (marked, found) = futures::try_join!(marker, secret_metas(&secrets, &suffix))?;
    let mut current = marked.unwrap_or_else(|| obj.clone());
    // The cleanup marker is written: a crash from here on resumes the cleanup. Each part
    // keeps its own order.
    let uid = obj.meta().uid.clone().unwrap_or_default();
    let (written, (), (), ()) = futures::try_join!(
        write_status(api, &current, decision),
        delete_jobs(ctx, &ns, o),
        delete_secrets(&secrets, &found, &uid),
        delete_lock_if_free(ctx, &ns, &suffix, o),
    )?;
    if let Some(w) = written
        && writes::only_status_changed(&current, &w)
    {
        current = w;
    }
    let (_, released) = tokio::join!(
        publish(
            ctx,
            obj,
            EventType::Normal,
            "CleanedUp",
            "CleanUp",
            "destroy verified: Jobs, state, inputs and backup Secrets deleted; releasing",
        ),
        release(ctx, api, &current)
    );
    released
}

/// The metadata of the object's inputs, state, backup and errored-state Secrets and their
/// parts that exist, read at once.
async fn secret_metas(
    secrets: &Api<Secret>,
    suffix: &str,
) -> Result<Vec<kube::core::PartialObjectMeta<Secret>>, Error> {
    // Not the errored state: what Terraform could not save may be the only record of
    // resources, and cleanup never deletes it (`captf orphans` lists it afterwards).
    let bases = [
        names::inputs_secret_name(suffix),
        names::state_secret_name(suffix),
        names::backup_secret_name(suffix),
    ];
    keep_errored_state(secrets, suffix).await?;
    Ok(
        futures::future::try_join_all(bases.iter().map(|b| chunk_metas(secrets, b)))
            .await?
            .into_iter()
            .flatten()
            .collect(),
    )
}

/// Marks an errored-state Secret written without [`names::LABEL_ERRORED_STATE`] (by an
/// older runner) with it, so that the labelled delete of the cleanup leaves it.
async fn keep_errored_state(secrets: &Api<Secret>, suffix: &str) -> Result<(), Error> {
    let name = names::errored_secret_name(suffix);
    if let Some(m) = secrets.get_metadata_opt(&name).await?
        && !m.labels().contains_key(names::LABEL_ERRORED_STATE)
    {
        let patch = json!({"metadata": {"labels": {names::LABEL_ERRORED_STATE: "true"}}});
        secrets
            .patch(&name, &PatchParams::default(), &Patch::Merge(patch))
            .await?;
    }
    Ok(())
}

/// Deletes the Secrets `found` (from [`secret_metas`]): their protection finalizers off
/// first, then one delete of everything labelled as the object's (`uid`), then by name
/// whatever that delete did not return (a state Secret written without the owner labels).
async fn delete_secrets(
    secrets: &Api<Secret>,
    found: &[kube::core::PartialObjectMeta<Secret>],
    uid: &str,
) -> Result<(), Error> {
    futures::future::try_join_all(found.iter().map(|m| async {
        let ops = remove_finalizer_ops(&m.metadata, names::PROTECT_FINALIZER);
        match guarded_patch(secrets, &m.metadata, ops).await {
            Ok(_) => Ok(()),
            Err(e) if e.is_not_found() => Ok(()),
            Err(e) => Err(e),
        }
    }))
    .await?;
    let mut left: Vec<String> = found
        .iter()
        .filter_map(|m| m.metadata.name.clone())
        .collect();
    // Whether the names left are known to exist (the labelled delete listed what it
    // deleted), or must be read first.
    let mut known = false;
    if !uid.is_empty() && !found.is_empty() {
        let lp = ListParams::default().labels(&format!(
            "{},!{}",
            observe::owner_selector(uid),
            names::LABEL_ERRORED_STATE
        ));
        if let Some(deleted) = secrets
            .delete_collection(&kube::api::DeleteParams::background(), &lp)
            .await?
            .left()
        {
            let gone: std::collections::BTreeSet<String> =
                deleted.items.iter().map(|s| s.name_any()).collect();
            left.retain(|n| !gone.contains(n));
            known = true;
        }
    }
    futures::future::try_join_all(left.into_iter().map(|name| async move {
        if known || secrets.get_metadata_opt(&name).await?.is_some() {
            writes::delete_if_present(secrets, &name).await?;
        }
        Ok::<_, Error>(())
    }))
    .await?;
    Ok(())
}

/// SPEC section 7: releases without a destroy, keeping the Secrets.
async fn abandon<K: TerraformObject>(
    ctx: &Context,
    api: &Api<K>,
    obj: &K,
    o: &Observed,
    extras: &Extras,
) -> Result<(), Error> {
    let ns = obj.namespace().unwrap_or_default();
    let suffix = names::state_suffix(K::KIND, &obj.name_any());
    let secrets: Api<Secret> = Api::namespaced(ctx.client.clone(), &ns);
    let described = extras
        .verdict
        .as_ref()
        .map(|v| v.message.clone())
        .unwrap_or_else(|| "the state was not read".into());

    if o.namespace_terminating {
        announce_copies(ctx, obj, &ns, &suffix, &described).await;
    }
    let mut current = obj.clone();
    if facts::deletion_bookkeeping(obj.meta(), names::CLEANUP_STARTED).is_none() {
        let ops = annotation_ops(
            obj.meta(),
            &[
                (
                    names::CLEANUP_STARTED,
                    Some(names::CLEANUP_ABANDONED.into()),
                ),
                (names::DELETION_UID, obj.meta().uid.clone()),
                (names::CLUSTERCTL_BLOCK_MOVE, Some("true".into())),
            ],
        );
        if let Some(updated) = guarded_patch(api, obj.meta(), ops).await? {
            current = updated;
        }
    }
    delete_jobs(ctx, &ns, o).await?;
    // The variables of its attempts (each in a Secret named as its Job) are not kept.
    for j in &o.jobs {
        writes::delete_if_present(&secrets, &j.name_any()).await?;
    }
    delete_lock_if_free(ctx, &ns, &suffix, o).await?;
    let now = Timestamp::now().to_string();
    for base in [
        names::state_secret_name(&suffix),
        names::inputs_secret_name(&suffix),
        names::backup_secret_name(&suffix),
    ] {
        for name in chunk_names(&secrets, &base).await? {
            let Some(s) = secrets.get_metadata_opt(&name).await? else {
                continue;
            };
            let mut ops = if s
                .metadata
                .annotations
                .as_ref()
                .is_some_and(|a| a.contains_key(names::ABANDONED_AT))
            {
                vec![]
            } else {
                annotation_ops(&s.metadata, &[(names::ABANDONED_AT, Some(now.clone()))])
            };
            ops.extend(remove_finalizer_ops(&s.metadata, names::PROTECT_FINALIZER));
            match guarded_patch(&secrets, &s.metadata, ops).await {
                Ok(_) => {}
                Err(e) if e.is_not_found() => {}
                Err(e) => return Err(e),
            }
        }
    }
    warn!(what = %described, "abandoned: released without a destroy; the state, inputs and backup Secrets are kept");
    if !o.namespace_terminating {
        publish(ctx, obj, EventType::Warning, "Abandoned", "Abandon", &format!("released without a destroy; Secrets kept and marked abandoned; the state described: {described}")).await;
    }
    ctx.metrics.decisions.inc(&[K::KIND.as_str(), "abandon"]);
    release(ctx, api, &current).await
}

/// In a terminating namespace the kept Secrets would go with the namespace: before any
/// protection comes off, each of them (the state and its parts, the inputs, the backup
/// and its parts) is copied as it is, Secret for Secret, into the manager's namespace
/// (`captf-abandoned-<namespace>-<suffix>`, `…-part-N`, `…-inputs`, `…-backup`,
/// `…-backup-part-N`), and every copy is read back and compared with its source. Any
/// failure is returned, and the abandon does not go on.
async fn copy_out<K: TerraformObject>(
    ctx: &Context,
    obj: &K,
    ns: &str,
    suffix: &str,
) -> Result<(), Error> {
    let here: Api<Secret> = Api::namespaced(ctx.client.clone(), ns);
    let there: Api<Secret> = Api::namespaced(ctx.client.clone(), &ctx.manager_namespace);
    let base = names::abandoned_copy_name(ns, suffix);
    let mut labels = owner_labels(obj);
    labels.insert(names::LABEL_SOURCE_NAMESPACE.into(), ns.into());
    // Source → copy, by name.
    let mut pairs = Vec::new();
    for (source, copy) in [
        (names::state_secret_name(suffix), base.clone()),
        (
            names::backup_secret_name(suffix),
            names::abandoned_backup_copy_name(ns, suffix),
        ),
    ] {
        for name in chunk_names(&here, &source).await? {
            let target = match names::part_index(&source, &name) {
                Some(n) => names::part_secret_name(&copy, n),
                None => copy.clone(),
            };
            pairs.push((name, target));
        }
    }
    pairs.push((
        names::inputs_secret_name(suffix),
        names::abandoned_inputs_copy_name(ns, suffix),
    ));
    let now = Timestamp::now().to_string();
    for (source, target) in &pairs {
        let Some(original) = here.get_opt(source).await? else {
            continue;
        };
        let mut annotations = original.metadata.annotations.clone().unwrap_or_default();
        annotations.retain(|k, _| {
            k == "encoding" || k == names::STATE_LINEAGE || k == names::STATE_SERIAL
        });
        annotations.insert(names::ABANDONED_AT.into(), now.clone());
        annotations.insert(names::COPIED_FROM.into(), format!("{ns}/{source}"));
        let copy = Secret {
            metadata: kube::api::ObjectMeta {
                name: Some(target.clone()),
                namespace: Some(ctx.manager_namespace.clone()),
                labels: Some(labels.clone()),
                annotations: Some(annotations),
                ..Default::default()
            },
            data: original.data.clone(),
            ..Default::default()
        };
        // Made by an earlier pass: the same bytes, or made again from these.
        let same =
            |s: &Option<Secret>| s.as_ref().and_then(|s| s.data.as_ref()) == original.data.as_ref();
        let mut back = None;
        if !writes::create_if_absent(&there, &copy).await? {
            back = there.get_opt(target).await?;
            if !same(&back) {
                writes::create_or_replace(&there, &copy).await?;
                back = None;
            }
        }
        // Read back what is there now.
        if back.is_none() {
            back = there.get_opt(target).await?;
        }
        if !same(&back) {
            return Err(Error::Stale(format!(
                "the copy {}/{target} of {ns}/{source} does not read back as written",
                ctx.manager_namespace
            )));
        }
    }
    // The state, joined from the copies, reads as the original did.
    let original =
        observe::read_chunked(&here, &names::state_secret_name(suffix), Some(suffix)).await?;
    let copied = observe::read_chunked(&there, &base, None).await?;
    let cap = ctx.settings.decompression_cap;
    let fingerprint = |c: state::StateContent| match c {
        state::StateContent::Parsed {
            lineage, serial, ..
        } => Some((lineage, serial)),
        _ => None,
    };
    let (a, b) = (
        fingerprint(state::read(&original, cap)),
        fingerprint(state::read(&copied, cap)),
    );
    if a != b {
        return Err(Error::Stale(format!(
            "the copied state {}/{base} reads as {b:?}, the state in {ns} as {a:?} (lineage, serial)",
            ctx.manager_namespace
        )));
    }
    Ok(())
}

/// The Warning Event of an abandon in a terminating namespace, on the copy in the
/// manager's namespace (none can be made in a terminating one).
async fn announce_copies<K: TerraformObject>(
    ctx: &Context,
    obj: &K,
    ns: &str,
    suffix: &str,
    described: &str,
) {
    let there: Api<Secret> = Api::namespaced(ctx.client.clone(), &ctx.manager_namespace);
    let base = names::abandoned_copy_name(ns, suffix);
    let copy = match there.get_metadata_opt(&base).await {
        Ok(Some(m)) => Some(m),
        _ => there
            .get_metadata_opt(&names::abandoned_inputs_copy_name(ns, suffix))
            .await
            .ok()
            .flatten(),
    };
    if let Some(copy) = copy {
        let msg = format!(
            "{}/{} abandoned while namespace {ns} terminates: its state, inputs and backup Secrets were copied here as {base}…; the state described: {described}",
            K::KIND,
            obj.name_any()
        );
        publish_ref(
            ctx,
            &copy.object_ref(&()),
            EventType::Warning,
            "Abandoned",
            "Abandon",
            &msg,
        )
        .await;
    }
}

/// Publishes an Event about the object; a failure to publish is logged, never fatal.
async fn publish<K: TerraformObject>(
    ctx: &Context,
    obj: &K,
    type_: EventType,
    reason: &str,
    action: &str,
    note: &str,
) {
    publish_ref(ctx, &obj.object_ref(&()), type_, reason, action, note).await;
}

async fn publish_ref(
    ctx: &Context,
    reference: &k8s_openapi::api::core::v1::ObjectReference,
    type_: EventType,
    reason: &str,
    action: &str,
    note: &str,
) {
    let mut note = note.to_string();
    if note.len() > 1000 {
        let mut cut = 997;
        while !note.is_char_boundary(cut) {
            cut -= 1;
        }
        note.truncate(cut);
        note.push_str("...");
    }
    let ev = Event {
        type_,
        reason: reason.into(),
        note: Some(note),
        action: action.into(),
        secondary: None,
    };
    if let Err(e) = ctx.recorder.publish(&ev, reference).await {
        debug!(error = %e, "could not publish an Event");
    }
}
