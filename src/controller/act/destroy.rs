//! Starting destroy attempt `n` (rows 4 and 6 of the rule table).
//!
//! Write order: the identity it runs with read first (a refusal writes nothing); then
//! everything the Job needs (the backup of the state it starts from, the backend's labels
//! on the state Secrets with the parts' protection off, the runner's RBAC, a stale lock of
//! a runner that is gone), all before the attempt number; then the
//! attempt number, under this object's uid, on the object (write-ahead: a crash after it
//! starts the same attempt again, never a second one beside it); then the attempt's
//! variables Secret; the Job last. Creating a name that exists is a no-op, so a restarted
//! pass makes nothing twice.

use std::collections::BTreeMap;

use k8s_openapi::api::coordination::v1::Lease;
use kube::api::Api;
use tracing::info;

use super::backup::{ensure_backup, readable_fingerprint};
use crate::api::TerraformObject;
use crate::api::names;
use crate::controller::{Context, Error, Scope};
use crate::gather::{Findings, Observed};
use crate::inputs::Inputs;
use crate::io::writes::{self, annotation_ops, guarded_patch};
use crate::state::StateSecrets;

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

pub use super::attempt::Started;
use super::attempt::{self, Attempt, ensure_backend_labels_on, render_operation};

/// Starts `attempt` in the order the file's head states.
pub async fn start_attempt<K: TerraformObject>(
    ctx: &Context,
    scope: &Scope<K>,
    obj: &K,
    o: &Observed,
    findings: &Findings,
    attempt: Attempt,
) -> Result<Started, Error> {
    let attempt = match &findings.inputs {
        Some(inputs) => {
            attempt::with_identity(
                ctx,
                scope,
                obj,
                o,
                names::OPERATION_DESTROY,
                inputs,
                attempt,
            )
            .await?
            .0
        }
        None => attempt,
    };
    let Attempt {
        n,
        job,
        secret,
        backend_labels,
        runner_account,
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
        crate::controller::rbac::ensure_runner(ctx, scope, runner_account.as_ref()),
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
    if attempt::paused_since_read(ctx, scope, current).await? {
        return Ok(Started::ClusterPaused);
    }
    if attempt::owner_gone_since_read(ctx, scope, current).await? {
        return Ok(Started::OwnerGone);
    }
    let (started, created) = attempt::create_attempt_job(
        (scope, None),
        o,
        &job,
        &secret,
        names::DESTROY_ATTEMPT,
        n,
        current,
    )
    .await?;
    if created {
        attempt::announce_start(ctx, obj, names::OPERATION_DESTROY, n, &job).await;
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
