//! The actions a decision dispatches to, one file each, with the write order each keeps
//! stated at its top: starting a destroy attempt ([`destroy`]) or an apply attempt
//! ([`apply`]), both through what an attempt is ([`attempt`]: its rendering, its Job and
//! variables Secret, its number; [`identity`]: the credentials it runs with), keeping the
//! backup ([`backup`]), the cleanup after a verified destroy ([`cleanup`]) and the abandon
//! ([`abandon`]). What more than one of them
//! does is here: the release, deleting the object's Jobs and Terraform's lock, the
//! errored states' metadata.

pub mod abandon;
pub mod apply;
pub mod attempt;
pub mod backup;
pub mod cleanup;
pub mod destroy;
pub mod identity;

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use kube::api::{Api, ListParams};
use tracing::debug;

use super::{Context, Error, Scope};
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
    // Its own runner ServiceAccount goes first: nothing of it runs any more.
    crate::controller::rbac::remove_object_runner(ctx, scope, obj).await?;
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
/// else stays, whatever the step. One that changed since it was read (the pass may have
/// taken it from the manager's cache, a version behind Terraform's unlock) is read live
/// and judged once more.
pub async fn delete_lock_if_free<K: TerraformObject>(
    scope: &Scope<K>,
    o: &Observed,
) -> Result<(), Error> {
    let leases: Api<Lease> = scope.api_of();
    let name = names::lock_lease_name(&scope.suffix);
    // As this pass read it with the state (after the Job was seen finished), or from the
    // cache, or read now.
    let lease = match (&o.state, &o.lock) {
        (Some(_), lock) => lock.clone(),
        (None, _) => {
            crate::controller::observe::lock_of(scope.caches.as_deref(), &leases, &name).await?
        }
    };
    let Some(lease) = lease else {
        return Ok(());
    };
    let pods: Vec<Pod> = o.pods.iter().chain(&o.earlier_pods).cloned().collect();
    match delete_if_free(&leases, &lease, &scope.suffix, &pods).await {
        Err(Error::Stale(why)) => {
            debug!(%why, "the lock Lease changed since it was read: read again");
            match leases.get_opt(&name).await? {
                Some(now) => delete_if_free(&leases, &now, &scope.suffix, &pods).await,
                None => Ok(()),
            }
        }
        done => done,
    }
}

/// Deletes `lease`, as read, when [`lock::judge`] finds it free or held by a runner of
/// the object of `suffix` that is provably gone.
async fn delete_if_free(
    leases: &Api<Lease>,
    lease: &Lease,
    suffix: &str,
    pods: &[Pod],
) -> Result<(), Error> {
    match lock::judge(Some(lease), suffix, pods, jiff::Timestamp::now()) {
        Lock::Free | Lock::StaleOwn { .. } => {
            writes::delete_as_read(leases, &lease.metadata).await?;
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
