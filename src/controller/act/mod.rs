//! The actions a decision dispatches to, one file each, with the write order each keeps
//! stated at its top: starting a destroy attempt ([`destroy`]), keeping the backup
//! ([`backup`]), the cleanup after a verified destroy ([`cleanup`]) and the abandon
//! ([`abandon`]). What more than one of them does is here: the release, deleting the
//! object's Jobs and Terraform's lock, and the owner labels.

pub mod abandon;
pub mod apply;
pub mod backup;
pub mod cleanup;
pub mod destroy;

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use kube::api::{Api, ListParams};
use tracing::debug;

use super::{Context, Error, Scope, events};
use crate::api::TerraformObject;
use crate::api::names;
use crate::gather::Observed;
use crate::io::writes::{self, annotation_ops, guarded_patch, remove_finalizer_ops};
use crate::state::lock::{self, Lock};

/// Removes the object finalizer and block-move in one write, remembers the release, and
/// forgets the rest the manager remembered of the object.
pub async fn release<K: TerraformObject>(
    ctx: &Context,
    scope: &Scope<K>,
    obj: &K,
) -> Result<(), Error> {
    let mut ops = annotation_ops(obj.meta(), &[(names::CLUSTERCTL_BLOCK_MOVE, None)]);
    ops.extend(remove_finalizer_ops(obj.meta(), K::KIND.finalizer()));
    match guarded_patch(&scope.api, obj.meta(), ops).await {
        Ok(_) => {}
        Err(e) if e.is_not_found() => {}
        Err(e) => return Err(e),
    }
    ctx.released.insert(&scope.uid);
    ctx.forget(K::KIND, &scope.namespace, &scope.name, &scope.uid);
    if let Some(asked) = &obj.meta().deletion_timestamp {
        let took = jiff::Timestamp::now().duration_since(asked.0);
        ctx.metrics.release_seconds.observe(
            &crate::metrics::ByKind::of(K::KIND),
            std::time::Duration::try_from(took).unwrap_or_default(),
        );
    }
    Ok(())
}

/// Deletes the object's Jobs (their Pods go with them) and Pods left without a Job.
pub async fn delete_jobs<K: TerraformObject>(scope: &Scope<K>, o: &Observed) -> Result<(), Error> {
    let jobs: Api<Job> = scope.api_of();
    for j in &o.jobs {
        writes::delete_if_present(&jobs, &j.name_any()).await?;
    }
    let pods: Api<Pod> = scope.api_of();
    // The pass's Pods come from the cache, which may lag a Pod made a moment ago; without
    // the caches they are listed.
    let listed = match &scope.caches {
        Some(_) => o.pods.clone(),
        None => {
            pods.list(&ListParams::default().labels(&scope.identity().owned_selector()))
                .await?
                .items
        }
    };
    for p in listed {
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
pub async fn delete_lock_if_free<K: TerraformObject>(
    scope: &Scope<K>,
    o: &Observed,
) -> Result<(), Error> {
    let leases: Api<Lease> = scope.api_of();
    let name = names::lock_lease_name(&scope.suffix);
    // As this pass read it with the state (after the Job was seen finished), or read now.
    let lease = match (&o.state, &o.lock) {
        (Some(_), lock) => lock.clone(),
        (None, _) => leases.get_opt(&name).await?,
    };
    let Some(lease) = lease else {
        return Ok(());
    };
    let pods: Vec<Pod> = o.pods.iter().chain(&o.earlier_pods).cloned().collect();
    match lock::judge(Some(&lease), &scope.suffix, &pods, jiff::Timestamp::now()) {
        Lock::Free | Lock::StaleOwn { .. } => {
            writes::delete_as_read(&leases, &lease.metadata).await?;
        }
        Lock::Held { holder, .. } => debug!(%holder, "lock Lease left in place: held"),
    }
    Ok(())
}

/// The metadata of the object's errored states (what Terraform could not save, kept by a
/// runner) and their parts, whatever uid of the object's kind and name they were kept
/// under (see [`crate::api::names::is_errored_suffix_of`]): as this pass read them with the
/// state, else from the cache of the object's Secrets, else listed.
pub async fn errored_metas<K: TerraformObject>(
    scope: &Scope<K>,
    o: &Observed,
) -> Result<Vec<kube::api::ObjectMeta>, Error> {
    let legacy = names::errored_secret_name(&scope.suffix);
    let mine = |m: &kube::api::ObjectMeta| {
        m.name.as_deref() == Some(legacy.as_str())
            || m.labels
                .as_ref()
                .and_then(|l| l.get(names::TF_LABEL_SUFFIX))
                .is_some_and(|e| names::is_errored_suffix_of(e, &scope.suffix))
    };
    if o.state.is_some() {
        let mut out = Vec::new();
        for e in &o.errored {
            match e {
                crate::state::Errored::Pushed(set) => out.extend(set.metas.values().cloned()),
                crate::state::Errored::Legacy { name, .. } => {
                    out.extend(scope.secret_meta(name).await?);
                }
            }
        }
        return Ok(out);
    }
    let listed: Vec<kube::api::ObjectMeta> = match &scope.caches {
        Some(c) => super::caches::namesakes(
            &c.secrets,
            &c.secrets_by_owner,
            K::KIND,
            &scope.namespace,
            &scope.name,
        )
        .into_iter()
        .map(|m| m.metadata)
        .collect(),
        None => scope
            .secrets
            .list_metadata(&ListParams::default().labels(&scope.identity().namesake_selector()))
            .await?
            .items
            .into_iter()
            .map(|m| m.metadata)
            .collect(),
    };
    Ok(listed.into_iter().filter(mine).collect())
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
            &super::owner_resource(ar, &r.kind),
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
/// Returns what became of the start and whether this call created the Job.
pub async fn create_attempt_job<K: TerraformObject>(
    scope: &Scope<K>,
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
        writes::create_if_absent(&scope.secrets, secret).await?;
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
