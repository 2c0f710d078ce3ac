//! What the destroy and the apply share: an attempt (its number, its Job, its variables
//! Secret), rendered from the object's inputs by the manager's templates, and started in
//! the order each action's file states: the attempt number written ahead, the checks that
//! the object may still act (its Cluster not paused since the read, its owner not gone),
//! the variables Secret, then the Job, announced by an Event.

use std::collections::BTreeMap;

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Secret;
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;

use crate::api::TerraformObject;
use crate::api::names::{self, Kind};
use crate::controller::caches::KeptInputs;
use crate::controller::{Context, Error, Scope, events};
use crate::gather::{self, Observed};
use crate::inputs::Inputs;
use crate::io::writes::{self, annotation_ops, guarded_patch, remove_finalizer_ops};
use crate::job::{self, JobRequest};

/// What an attempt is started with: its Job, its variables Secret, the labels
/// Terraform's backend selects the state's Secrets by, and the annotations of the runner
/// ServiceAccount of the object's own its Pod runs as (none: the namespace's), from the
/// spec's `runner.serviceAccount` or the identity's `serviceAccount`.
pub struct Attempt {
    pub n: u32,
    pub job: Job,
    pub secret: Secret,
    pub backend_labels: BTreeMap<String, String>,
    pub runner_account: Option<BTreeMap<String, String>>,
}

/// Renders attempt `n` of the object for `operation` (`names::OPERATION_DESTROY` or
/// `names::OPERATION_APPLY`), without an identity's credentials (see [`with_identity`]).
pub fn render_operation<K: TerraformObject>(
    ctx: &Context,
    scope: &Scope<K>,
    obj: &K,
    operation: &'static str,
    n: u32,
    inputs: &Inputs,
) -> Result<Attempt, String> {
    render_with(ctx, scope, obj, operation, n, inputs, None)
}

/// `attempt` as it starts: rendered again with the credentials of the identity it runs
/// with, read now (an apply's inputs then record it), or as it is when it runs with none.
/// Before anything of the attempt is written: a refusal ([`Error::Identity`]) leaves nothing.
pub async fn with_identity<K: TerraformObject>(
    ctx: &Context,
    scope: &Scope<K>,
    obj: &K,
    o: &Observed,
    operation: &'static str,
    inputs: &Inputs,
    attempt: Attempt,
) -> Result<(Attempt, Inputs), Error> {
    let Some(resolved) = super::identity::resolve(ctx, scope, obj, o, operation, inputs).await?
    else {
        return Ok((attempt, inputs.clone()));
    };
    let inputs = match operation {
        names::OPERATION_APPLY => inputs.with_identity(Some(resolved.used.clone())),
        _ => inputs.clone(),
    };
    let attempt = render_with(
        ctx,
        scope,
        obj,
        operation,
        attempt.n,
        &inputs,
        Some(&resolved),
    )
    .map_err(Error::Identity)?;
    Ok((attempt, inputs))
}

fn render_with<K: TerraformObject>(
    ctx: &Context,
    scope: &Scope<K>,
    obj: &K,
    operation: &'static str,
    n: u32,
    inputs: &Inputs,
    identity: Option<&super::identity::Resolved>,
) -> Result<Attempt, String> {
    let cluster = gather::owning_cluster(obj.meta());
    // An operator's image in place of the digest the apply ran (one the registry no
    // longer serves), for the destroy only.
    let replaced = match obj
        .meta()
        .annotations
        .as_ref()
        .and_then(|a| a.get(names::RUNNER_IMAGE))
    {
        Some(image) if operation == names::OPERATION_DESTROY => {
            Some(inputs.with_runner_image(image))
        }
        _ => None,
    };
    let inputs = replaced.as_ref().unwrap_or(inputs);
    let ann = |key: &str| obj.meta().annotations.as_ref().and_then(|a| a.get(key));
    // An apply after the object's first success plans first, unless the object opts out;
    // a pool only when it opts in (its re-applies are its bootstrap token's rotations,
    // which must not wait for a person: see docs/provisioning/01-lifecycle.md).
    let guard = ann(names::DESTRUCTIVE_PLANS).map(|v| v.trim());
    let guarded = match K::KIND {
        Kind::TerraformMachinePool => guard == Some(names::DESTRUCTIVE_PLANS_GUARD),
        _ => guard != Some(names::DESTRUCTIVE_PLANS_ALLOW),
    };
    let plan_guard = job::PlanGuard {
        on: operation == names::OPERATION_APPLY && ann(names::APPLIED_ATTEMPT).is_some() && guarded,
        approved: ann(names::APPROVE_PLAN).map(String::as_str),
    };
    // The object's own runner account, with the spec's annotations or the identity's
    // (never both: `identity::resolve` refuses that).
    let runner_account = obj
        .terraform()
        .runner
        .service_account
        .as_ref()
        .map(|a| a.annotations.clone())
        .or_else(|| identity.and_then(|i| i.account.clone()));
    let service_account = job::runner_account_name(runner_account.is_some(), &scope.suffix);
    let request = JobRequest {
        service_account: &service_account,
        kind: K::KIND,
        name: &scope.name,
        uid: &scope.uid,
        namespace: &scope.namespace,
        suffix: &scope.suffix,
        cluster_name: cluster.as_deref(),
        operation,
        attempt: n,
        inputs,
        plan_guard,
        credentials: identity.map(|i| &i.env),
    };
    let job = job::render(&ctx.templates, &request).map_err(|e| e.to_string())?;
    let secret = job::attempt_secret(&ctx.templates, &request).map_err(|e| e.to_string())?;
    Ok(Attempt {
        n,
        job,
        secret,
        // Before the attempt, the state's Secrets get every label Terraform's backend
        // selects them by, its own included (a state restored by hand may lack one, and
        // Terraform would then find no state and write an empty one over it).
        backend_labels: scope.identity().state_labels(),
        runner_account,
    })
}

/// [`super::destroy`]'s `ensure_backend_labels` on the state Secrets `metas` (the base `base` and its parts),
/// with the parts' protection finalizer off.
pub async fn ensure_backend_labels_on<K: TerraformObject>(
    scope: &Scope<K>,
    base: &str,
    metas: Vec<kube::api::ObjectMeta>,
    labels: &BTreeMap<String, String>,
) -> Result<(), Error> {
    let secrets = &scope.secrets;
    for meta in metas {
        let name = meta.name.clone().unwrap_or_default();
        let have = meta.labels.clone().unwrap_or_default();
        let missing: BTreeMap<&String, &String> = labels
            .iter()
            .filter(|(k, v)| have.get(*k) != Some(*v))
            .collect();
        let mut current = meta;
        if !missing.is_empty() {
            let patch = json!({ "metadata": { "labels": missing } });
            current = secrets
                .patch(&name, &PatchParams::default(), &Patch::Merge(patch))
                .await?
                .metadata;
        }
        // A part keeps no finalizer while the Job runs: Terraform deletes the parts a
        // shrinking state no longer has.
        if name != base {
            let ops = remove_finalizer_ops(&current, names::PROTECT_FINALIZER);
            if !ops.is_empty() {
                guarded_patch(secrets, &current, ops).await?;
            }
        }
    }
    Ok(())
}
/// What became of a start.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Started {
    /// The attempt's Job exists (made now, or by an earlier pass that was interrupted).
    Running,
    /// Its name is taken by a Job of an earlier object of this name: the attempt number
    /// moved on, and the next pass starts that one.
    NumberMovedOn,
    /// The owning Cluster was paused after the pass read it (see [`paused_since_read`]):
    /// no Job, and `block-move` taken off again.
    ClusterPaused,
    /// A Machine or MachinePool owning the object was gone when read before the Job (see
    /// [`owner_gone_since_read`]): no Job, and `block-move` taken off again.
    OwnerGone,
}

/// Whether the Cluster owning the object is paused now, read from the API server after
/// the attempt's `block-move` annotation was written. clusterctl move pauses the Cluster,
/// then waits until no object carries `block-move`, then copies and deletes: a pass that
/// decided from a cache read before the pause could otherwise write `block-move` after
/// that check passed and start a Job under a move. Reading the Cluster after the write
/// closes that: either clusterctl's check sees the annotation and waits, or this read
/// sees the pause.
pub async fn paused_since_read<K: TerraformObject>(
    ctx: &Context,
    scope: &Scope<K>,
    current: &kube::api::ObjectMeta,
) -> Result<bool, Error> {
    let (Some(ar), Some(cluster)) = (
        ctx.cluster_api.resource(),
        crate::gather::owning_cluster(current),
    ) else {
        return Ok(false);
    };
    let api: Api<kube::api::DynamicObject> =
        Api::namespaced_with(ctx.client.clone(), &scope.namespace, ar);
    let Some(c) = api.get_opt(&cluster).await? else {
        return Ok(false);
    };
    let view =
        crate::gather::ClusterView::from_value(&serde_json::to_value(&c).unwrap_or_default());
    if !(view.spec_paused || view.annotation_paused) {
        return Ok(false);
    }
    tracing::info!(%cluster, "the Cluster was paused after this pass read it: no Job now");
    if let Some(c) = &scope.caches {
        c.note_pause_read_live(&scope.namespace, &cluster, ar);
    }
    block_move_off(scope, current).await?;
    Ok(true)
}

/// Takes the attempt's `block-move` off again when its Job is not made after all.
async fn block_move_off<K: TerraformObject>(
    scope: &Scope<K>,
    current: &kube::api::ObjectMeta,
) -> Result<(), Error> {
    let off = [(names::CLUSTERCTL_BLOCK_MOVE, None)];
    guarded_patch(&scope.api, current, annotation_ops(current, &off)).await?;
    Ok(())
}

/// Whether a Machine or MachinePool owning the object is gone when read from the API
/// server, after the attempt's `block-move` annotation was written and before a destroy's
/// Job is made. The passes find the owners in the manager's cache, which may not have seen
/// an owner go (a move, a stripped finalizer): a destroy must not start on that. When one
/// is gone, `block-move` is taken off again and no Job is made; the next pass holds with
/// `OwnerGone` once the cache has seen it.
pub async fn owner_gone_since_read<K: TerraformObject>(
    ctx: &Context,
    scope: &Scope<K>,
    current: &kube::api::ObjectMeta,
) -> Result<bool, Error> {
    let Some(ar) = ctx.cluster_api.resource() else {
        return Ok(false);
    };
    // An operator who allowed this object's destroy without its owners needs no read.
    if crate::gather::destroy_without_owner(current) {
        return Ok(false);
    }
    let mut gone = None;
    for r in crate::gather::capi_owners(current).filter(|r| r.kind != "Cluster") {
        let api: Api<kube::api::DynamicObject> = Api::namespaced_with(
            ctx.client.clone(),
            &scope.namespace,
            &crate::controller::owner_resource(ar, &r.kind),
        );
        let found = api.get_metadata_opt(&r.name).await?;
        if found.and_then(|o| o.metadata.uid).as_deref() != Some(r.uid.as_str()) {
            gone = Some(format!("{} {}", r.kind, r.name));
            break;
        }
    }
    let Some(owner) = gone else {
        return Ok(false);
    };
    tracing::info!(%owner, "an owner went after this pass read it: no Job now");
    block_move_off(scope, current).await?;
    Ok(true)
}

/// Creates attempt `n`'s variables Secret, then its Job, once the attempt number is on the
/// object (`current` is the object as that write left it). The Secret carries the owner
/// labels, so the cleanup's labelled delete takes it; a pruned Job's and an abandoned
/// object's are deleted with their Jobs. Creating a name that exists is a no-op, so a
/// restarted pass makes nothing twice. When the name is taken by a Job of an earlier
/// object of this name, the number under `attempt_key` moves on (the pass saw the Jobs of
/// both; one it did not see, made since, is read when the create finds the name taken).
/// Returns what became of the start and whether this call created the Job. With `keep`,
/// the variables Secret this call created is kept there (an apply's: the pass that records
/// its end reads the inputs it ran from it).
pub async fn create_attempt_job<K: TerraformObject>(
    (scope, keep): (&Scope<K>, Option<&KeptInputs>),
    o: &Observed,
    job: &Job,
    secret: &k8s_openapi::api::core::v1::Secret,
    attempt_key: &str,
    n: u32,
    current: &kube::api::ObjectMeta,
) -> Result<(Started, bool), Error> {
    let jobs: Api<Job> = scope.api_of();
    let name = job.name_any();
    let seen = |js: &[Job]| {
        js.iter()
            .any(|j| j.metadata.name.as_deref() == Some(name.as_str()))
    };
    let mut taken_by_earlier = seen(&o.earlier_jobs);
    let mut created = false;
    if !taken_by_earlier && !seen(&o.jobs) {
        let made = writes::create_unless_present(&scope.secrets, secret).await?;
        if let (Some(keep), Some(made)) = (keep.filter(|_| scope.caches.is_some()), made) {
            keep.keep_attempt(&scope.uid, &made);
        }
        created = writes::create_if_absent(&jobs, job).await?;
        if !created {
            taken_by_earlier = jobs
                .get_metadata_opt(&name)
                .await?
                .is_some_and(|j| j.labels().get(names::LABEL_OWNER_UID) != Some(&scope.uid));
        }
    }
    if taken_by_earlier {
        let bump = [(attempt_key, Some((n + 1).to_string()))];
        guarded_patch(&scope.api, current, annotation_ops(current, &bump)).await?;
        return Ok((Started::NumberMovedOn, false));
    }
    Ok((Started::Running, created))
}

/// Counts and announces a started attempt of `operation`: its metric, and a Normal Event
/// naming its Job.
pub async fn announce_start<K: TerraformObject>(
    ctx: &Context,
    obj: &K,
    operation: &str,
    n: u32,
    job: &Job,
) {
    let (counter, reason, action) = if operation == names::OPERATION_APPLY {
        (&ctx.metrics.apply_attempts, events::APPLY_STARTED, "Apply")
    } else {
        (
            &ctx.metrics.destroy_attempts,
            events::DESTROY_STARTED,
            "Destroy",
        )
    };
    counter.inc(&crate::metrics::ByKind::of(K::KIND));
    events::publish(
        ctx,
        obj,
        kube::runtime::events::EventType::Normal,
        reason,
        action,
        &format!("{operation} attempt {n} started in Job {}", job.name_any()),
    )
    .await;
}
