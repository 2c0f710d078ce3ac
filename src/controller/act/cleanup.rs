//! The cleanup after a verified destroy (SPEC section 6, row 5 of the rule table).
//!
//! Write order: the cleanup marker on the object first, before the first delete and
//! before the status (this action writes the status itself), with the reads of what there
//! is to delete at the same time; a crash from then on resumes the cleanup. Then, at once,
//! the status, the Jobs, the Secrets (protection off first, then one labelled delete, then
//! by name what it did not take) and Terraform's lock when it is free. The release last,
//! after all of them. The errored states are never deleted.

use k8s_openapi::api::core::v1::Secret;
use kube::ResourceExt;
use kube::api::{Api, ListParams, Patch, PatchParams};
use kube::core::PartialObjectMeta;
use kube::runtime::events::EventType;
use serde_json::json;

use super::{delete_jobs, delete_lock_if_free, release};
use crate::api::TerraformObject;
use crate::api::names;
use crate::controller::events::{self, publish};
use crate::controller::status::write_status;
use crate::controller::{Context, Error, Scope};
use crate::gather::{self, Observed};
use crate::io::writes::{self, annotation_ops, guarded_patch, remove_finalizer_ops};
use crate::job::{self, JobOutcome};
use crate::rules::Decision;
use crate::state::secrets as chunked;

/// Cleans up and releases, in the order the file's head states.
pub async fn cleanup<K: TerraformObject>(
    ctx: &Context,
    scope: &Scope<K>,
    obj: &K,
    o: &Observed,
    decision: &Decision,
) -> Result<(), Error> {
    let (api, secrets) = (&scope.api, &scope.secrets);
    let marker = async {
        if gather::deletion_bookkeeping(obj.meta(), names::CLEANUP_STARTED).is_some() {
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
    let (marked, found, errored) = futures::try_join!(
        marker,
        secret_metas(scope, o),
        super::errored_metas(scope, o)
    )?;
    if marked.is_some() {
        // Once per deletion: how long the destroy that left nothing ran.
        let succeeded = o
            .jobs
            .iter()
            .filter(|j| job::operation_of(j) == Some(names::OPERATION_DESTROY))
            .filter(|j| job::outcome(j, &o.pods) == JobOutcome::Succeeded)
            .max_by_key(|j| job::attempt_of(j));
        if let Some(ran) = succeeded.and_then(job::ran_for) {
            let labels = crate::metrics::ByJob {
                kind: crate::metrics::labels::KindValue(K::KIND),
                operation: names::OPERATION_DESTROY,
                outcome: "succeeded",
            };
            ctx.metrics.job_seconds.observe(&labels, ran);
        }
    }
    let mut current = marked.unwrap_or_else(|| obj.clone());
    // The cleanup marker is written: a crash from here on resumes the cleanup. Each part
    // keeps its own order.
    let owner = scope.identity();
    let (written, (), (), (), ()) = futures::try_join!(
        write_status(api, &current, decision),
        delete_jobs(scope, o),
        delete_secrets(secrets, &found, &owner),
        delete_lock_if_free(scope, o),
        unprotect(secrets, &errored),
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
            events::CLEANED_UP,
            "CleanUp",
            "destroy verified: Jobs, state, inputs and backup Secrets deleted; releasing",
        ),
        release(ctx, scope, &current)
    );
    released
}

/// The metadata of the object's inputs, state, backup and errored-state Secrets and their
/// parts that exist: the state's as this pass read it with the state (Terraform wrote it
/// last), the others from the cache of the object's Secrets; without the caches, read at
/// once.
async fn secret_metas<K: TerraformObject>(
    scope: &Scope<K>,
    o: &Observed,
) -> Result<Vec<PartialObjectMeta<Secret>>, Error> {
    let (secrets, suffix) = (&scope.secrets, scope.suffix.as_str());
    // Not the errored state: what Terraform could not save may be the only record of
    // resources, and cleanup never deletes it (`captf orphans` lists it afterwards).
    let bases = [
        names::inputs_secret_name(suffix),
        names::state_secret_name(suffix),
        names::backup_secret_name(suffix),
    ];
    keep_errored_state(scope).await?;
    let Some(caches) = &scope.caches else {
        return Ok(
            futures::future::try_join_all(bases.iter().map(|b| chunked::metas(secrets, b)))
                .await?
                .into_iter()
                .flatten()
                .collect(),
        );
    };
    let read: Vec<PartialObjectMeta<Secret>> = o
        .state
        .iter()
        .flat_map(|s| s.metas.values())
        .map(|m| PartialObjectMeta {
            metadata: m.clone(),
            ..Default::default()
        })
        .collect();
    let mut out = read.clone();
    for base in &bases {
        let members =
            std::iter::once(base.clone()).chain((1..).map(|n| names::part_secret_name(base, n)));
        for name in members {
            if read
                .iter()
                .any(|m| m.metadata.name.as_deref() == Some(name.as_str()))
            {
                continue;
            }
            match caches.secret_meta(&scope.namespace, &name) {
                Some(m) => out.push(m.as_ref().clone()),
                // A base the caches lack is read by name (one without the owner labels,
                // made by hand, is deleted all the same); its parts are looked for
                // either way.
                None if name == *base => {
                    if let Some(m) = secrets.get_metadata_opt(base).await? {
                        out.push(m);
                    }
                }
                None => break,
            }
        }
    }
    Ok(out)
}

/// Takes the protection finalizer off the errored states, which stay: the destroy that
/// left nothing was not held by them (each records nothing the state did not), and
/// `captf orphans` lists them afterwards. Each is read again first: the bookkeeping of
/// this very pass may have protected one after the pass read it (one that was too new to
/// protect before the destroy's Job, which no pass protects under), and a cache may lag;
/// taken off by what was read, the finalizer would stay once the object is gone. Errored
/// states are few, and this runs once per cleanup.
async fn unprotect(secrets: &Api<Secret>, metas: &[kube::api::ObjectMeta]) -> Result<(), Error> {
    for name in metas.iter().filter_map(|m| m.name.as_deref()) {
        let Some(current) = secrets.get_metadata_opt(name).await? else {
            continue;
        };
        let m = &current.metadata;
        let ops = remove_finalizer_ops(m, names::PROTECT_FINALIZER);
        match guarded_patch(secrets, m, ops).await {
            Ok(_) => {}
            Err(e) if e.is_not_found() => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Marks an errored-state Secret written without [`names::LABEL_ERRORED_STATE`] (by an
/// older runner) with it, so that the labelled delete of the cleanup leaves it.
async fn keep_errored_state<K: TerraformObject>(scope: &Scope<K>) -> Result<(), Error> {
    let name = names::errored_secret_name(&scope.suffix);
    if let Some(m) = scope.secret_meta(&name).await?
        && !m
            .labels
            .as_ref()
            .is_some_and(|l| l.contains_key(names::LABEL_ERRORED_STATE))
    {
        let patch = json!({"metadata": {"labels": {names::LABEL_ERRORED_STATE: "true"}}});
        scope
            .secrets
            .patch(&name, &PatchParams::default(), &Patch::Merge(patch))
            .await?;
    }
    Ok(())
}

/// Deletes the Secrets `found` (from [`secret_metas`]): their protection finalizers off
/// first, then one delete of everything labelled as the object's (`owner`'s uid), then by name
/// whatever that delete did not return (a state Secret written without the owner labels).
async fn delete_secrets(
    secrets: &Api<Secret>,
    found: &[PartialObjectMeta<Secret>],
    owner: &crate::api::labels::Identity<'_>,
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
    if !owner.uid.is_empty() && !found.is_empty() {
        let lp = ListParams::default().labels(&owner.owned_but_errored_states_selector());
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
