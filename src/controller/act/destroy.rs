//! Starting destroy attempt `n` (rows 4 and 6 of the rule table).
//!
//! Write order: everything the Job needs first (the backup of the state it starts from,
//! the backend's labels on the state Secrets with the parts' protection off, the runner's
//! RBAC, a stale lock of a runner that is gone), all before the attempt number; then the
//! attempt number, under this object's uid, on the object (write-ahead: a crash after it
//! starts the same attempt again, never a second one beside it); then the attempt's
//! variables Secret; the Job last. Creating a name that exists is a no-op, so a restarted
//! pass makes nothing twice.

use std::collections::BTreeMap;

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;
use tracing::info;

use super::backup::{ensure_backup, readable_fingerprint};
use crate::api::TerraformObject;
use crate::api::names::{self, Kind};
use crate::controller::{Context, Error, Scope};
use crate::gather::{self, Findings, Observed};
use crate::inputs::Inputs;
use crate::io::writes::{self, annotation_ops, guarded_patch, remove_finalizer_ops};
use crate::job::{self, JobRequest};
use crate::state::StateSecrets;

/// What an attempt is started with: its Job, its variables Secret, and the labels
/// Terraform's backend selects the state's Secrets by.
pub struct Attempt {
    pub n: u32,
    pub job: Job,
    pub secret: Secret,
    pub backend_labels: BTreeMap<String, String>,
}

/// Renders attempt `n` of the object from its inputs; the error says why it does not
/// render (a Job that does not render keeps the destroy from starting: row 9).
pub fn render<K: TerraformObject>(
    ctx: &Context,
    scope: &Scope<K>,
    obj: &K,
    n: u32,
    inputs: &Inputs,
) -> Result<Attempt, String> {
    render_operation(ctx, scope, obj, names::OPERATION_DESTROY, n, inputs)
}

/// [`render`] for `operation` (`names::OPERATION_DESTROY` or `names::OPERATION_APPLY`).
pub fn render_operation<K: TerraformObject>(
    ctx: &Context,
    scope: &Scope<K>,
    obj: &K,
    operation: &'static str,
    n: u32,
    inputs: &Inputs,
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
    let request = JobRequest {
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
    })
}

pub use super::Started;

/// Starts `attempt` in the order the file's head states.
pub async fn start_attempt<K: TerraformObject>(
    ctx: &Context,
    scope: &Scope<K>,
    obj: &K,
    o: &Observed,
    findings: &Findings,
    attempt: Attempt,
) -> Result<Started, Error> {
    let Attempt {
        n,
        job,
        secret,
        backend_labels,
    } = attempt;
    // What the Job needs, all before the attempt number is written; independent of each
    // other, so their requests run at once.
    let backup_and_labels = async {
        if let Some(state) = &o.state {
            let backup = async {
                match readable_fingerprint(findings) {
                    Some(fp) => ensure_backup(ctx, scope, obj, state, fp).await,
                    None => Ok(()),
                }
            };
            futures::try_join!(backup, ensure_backend_labels(scope, state, &backend_labels),)?;
        }
        Ok::<_, Error>(())
    };
    let stale_lock = async {
        if let (true, Some(lease)) = (findings.stale_lock, &o.lock) {
            let leases: Api<Lease> = scope.api_of();
            info!("clearing Terraform's lock held by a runner of this object that is gone");
            writes::delete_as_read(&leases, &lease.metadata).await?;
        }
        Ok::<_, Error>(())
    };
    futures::try_join!(
        backup_and_labels,
        crate::controller::rbac::ensure_runner_rbac(ctx, &scope.namespace),
        stale_lock,
    )?;
    // Write-ahead: the attempt number is on the object before its Job exists, under this
    // object's uid; a cleanup marker of an earlier object of this name goes.
    let edits = [
        (names::DESTROY_ATTEMPT, Some(n.to_string())),
        (names::DELETION_UID, Some(scope.uid.clone())),
        (names::DESTROY_FAILED_AT, None),
        (names::CLEANUP_STARTED, None),
        (names::CLUSTERCTL_BLOCK_MOVE, Some("true".to_string())),
    ];
    let written = guarded_patch(&scope.api, obj.meta(), annotation_ops(obj.meta(), &edits)).await?;
    let current = written.as_ref().map(|o| o.meta()).unwrap_or(obj.meta());
    if super::paused_since_read(ctx, scope, current).await? {
        return Ok(Started::ClusterPaused);
    }
    if super::owner_gone_since_read(ctx, scope, current).await? {
        return Ok(Started::OwnerGone);
    }
    let (started, created) =
        super::create_attempt_job(scope, o, &job, &secret, names::DESTROY_ATTEMPT, n, current)
            .await?;
    if created {
        super::announce_start(ctx, obj, names::OPERATION_DESTROY, n, &job).await;
    }
    Ok(started)
}

/// Terraform's backend finds the state's Secrets by its labels, its own and the `labels`
/// setting: a state Secret lacking one (restored by hand, or written by an apply with
/// other labels) reads as no state, Terraform then writes an empty state over the base
/// (by name), and the destroy finds nothing to destroy.
async fn ensure_backend_labels<K: TerraformObject>(
    scope: &Scope<K>,
    state: &StateSecrets,
    labels: &BTreeMap<String, String>,
) -> Result<(), Error> {
    let names = std::iter::once(state.base_name.clone()).chain(
        state
            .parts
            .keys()
            .map(|n| names::part_secret_name(&state.base_name, *n)),
    );
    let mut metas = Vec::new();
    for name in names {
        // As this pass read them with the state, or else from the cache.
        match state.metas.get(&name) {
            Some(m) => metas.push(m.clone()),
            None => metas.extend(scope.secret_meta(&name).await?),
        }
    }
    ensure_backend_labels_on(scope, &state.base_name, metas, labels).await
}

/// [`ensure_backend_labels`] on the state Secrets `metas` (the base `base` and its parts),
/// with the parts' protection finalizer off.
pub(super) async fn ensure_backend_labels_on<K: TerraformObject>(
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
