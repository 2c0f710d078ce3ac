//! Starting apply attempt `n` (rows A12 and A13 of the apply table).
//!
//! Write order: the identity it runs with read first (a refusal writes nothing); then what
//! the Job needs (the runner's RBAC; the state's Secrets, if any, labelled for Terraform's
//! backend with the parts' protection off; a lock left by a gone runner of the object
//! cleared, as read); then, in one guarded write on the object, the
//! attempt number, `inputs-sha256`, `applied-at` the first time, block-move, and the last
//! failure's time cleared (write-ahead: the deletion reads `applied-at` as "something may
//! exist", and the attempt number keeps a restarted pass from starting a second Job
//! beside the first); then the attempt's variables Secret, which carries its inputs too;
//! then the Job.
//!
//! The inputs Secret is not written here: it holds the inputs of the latest apply that
//! wrote the state, which the destroy runs. An attempt's inputs become those only once it
//! wrote the state (`bookkeeping`): an apply refused, failed before Terraform touched the
//! state, or never started leaves the destroy the inputs that made the state.

use kube::ResourceExt;
use kube::api::ObjectMeta;

use super::attempt::{self, Attempt, Started, ensure_backend_labels_on};
use crate::api::TerraformObject;
use crate::api::names;
use crate::controller::{Context, Error, Scope};
use crate::gather::Observed;
use crate::inputs::Inputs;
use crate::io::writes::{self, annotation_ops, guarded_patch};

/// Renders apply attempt `n` of the object from the inputs its spec builds to; the error
/// says why it does not render.
pub fn render<K: TerraformObject>(
    ctx: &Context,
    scope: &Scope<K>,
    obj: &K,
    n: u32,
    inputs: &Inputs,
) -> Result<Attempt, String> {
    attempt::render_operation(ctx, scope, obj, names::OPERATION_APPLY, n, inputs)
}

/// Starts `attempt` with `inputs` in the order the file's head states.
pub async fn start_apply<K: TerraformObject>(
    ctx: &Context,
    scope: &Scope<K>,
    obj: &K,
    o: &Observed,
    stale_lock: bool,
    inputs: &Inputs,
    attempt: Attempt,
) -> Result<Started, Error> {
    let (attempt, inputs) =
        attempt::with_identity(ctx, scope, obj, o, names::OPERATION_APPLY, inputs, attempt).await?;
    let inputs = &inputs;
    let Attempt {
        n,
        job,
        secret,
        backend_labels,
        runner_account,
    } = attempt;
    let base = names::state_secret_name(&scope.suffix);
    let metas = state_metas(scope, &base).await?;
    // A runner of the object killed before it could unlock (OOMKilled) left Terraform's
    // lock: every later apply would fail on it. Cleared only as read, and only when its
    // holder is provably gone (`lock::judge`).
    let clear_stale_lock = async {
        if let (true, Some(lease)) = (stale_lock, &o.lock) {
            let leases: kube::Api<k8s_openapi::api::coordination::v1::Lease> = scope.api_of();
            tracing::info!(
                "clearing Terraform's lock held by a runner of this object that is gone"
            );
            writes::delete_as_read(&leases, &lease.metadata).await?;
        }
        Ok::<_, Error>(())
    };
    futures::try_join!(
        crate::controller::rbac::ensure_runner(ctx, scope, runner_account.as_ref()),
        ensure_backend_labels_on(scope, &base, metas, &backend_labels),
        clear_stale_lock,
    )?;
    let applied_at = obj.annotations().get(names::APPLIED_AT).is_none();
    let mut edits = vec![
        (names::APPLY_ATTEMPT, Some(n.to_string())),
        (names::INPUTS_SHA256, Some(inputs.sha256())),
        (names::APPLY_FAILED_AT, None),
        (names::CLUSTERCTL_BLOCK_MOVE, Some("true".to_string())),
    ];
    if applied_at {
        edits.push((names::APPLIED_AT, Some(jiff::Timestamp::now().to_string())));
    }
    let written = guarded_patch(&scope.api, obj.meta(), annotation_ops(obj.meta(), &edits)).await?;
    let current = written.as_ref().map(|o| o.meta()).unwrap_or(obj.meta());
    if attempt::paused_since_read(ctx, scope, current).await? {
        return Ok(Started::ClusterPaused);
    }
    let (started, created) = attempt::create_attempt_job(
        (scope, Some(&ctx.kept_inputs)),
        o,
        &job,
        &secret,
        names::APPLY_ATTEMPT,
        n,
        current,
    )
    .await?;
    if created {
        attempt::announce_start(ctx, obj, names::OPERATION_APPLY, n, &job).await;
    }
    Ok(started)
}

/// The metadata of the object's state Secrets (the base `base` and its parts), from the
/// cache of state Secrets, or listed without it.
async fn state_metas<K: TerraformObject>(
    scope: &Scope<K>,
    base: &str,
) -> Result<Vec<ObjectMeta>, Error> {
    let mut metas = scope.labelled_state_metas().await?;
    // A base restored by hand may lack the label; Terraform would then find no state and
    // write an empty one over it.
    if !metas.iter().any(|m| m.name.as_deref() == Some(base))
        && let Some(m) = scope.secret_meta(base).await?
    {
        metas.push(m);
    }
    Ok(metas)
}
