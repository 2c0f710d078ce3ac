//! What a controller does after a failed pass. The failures themselves are
//! [`crate::io::Error`]'s.

use std::sync::Arc;
use std::time::Duration;

use kube::ResourceExt;
use kube::runtime::controller::Action as Requeue;
use tracing::warn;

use super::{Context, Error};
use crate::api::TerraformObject;
use crate::gather::verdict::LOOK_AGAIN;

/// When a pass whose attempt the API server refused looks again: at once when its
/// conditions did not say a refusal yet (`shown`: the next pass decides with it and says
/// it), else after [`LOOK_AGAIN`], so that a refusal whose message changes on every try
/// cannot spin.
pub(super) fn after_refusal(shown: bool) -> Duration {
    if shown { LOOK_AGAIN } else { Duration::ZERO }
}

/// After a failed pass: a conflict is decided again at once, anything else is counted
/// and retried after the backoff's base.
pub(super) fn error_policy<K: TerraformObject>(
    obj: Arc<K>,
    err: &Error,
    ctx: Arc<Context>,
) -> Requeue {
    if err.is_conflict() {
        tracing::debug!(kind = %K::KIND, name = %obj.name_any(), "the object changed under this pass; deciding again");
        return Requeue::requeue(Duration::from_millis(20));
    }
    warn!(kind = %K::KIND, name = %obj.name_any(), namespace = obj.namespace().unwrap_or_default(), error = %err, "reconcile failed; retrying");
    ctx.metrics.reconcile_errors.inc(&crate::metrics::ByError {
        kind: crate::metrics::labels::KindValue(K::KIND),
        error: err.label(),
    });
    Requeue::requeue(
        ctx.settings
            .backoff
            .base
            .clamp(Duration::from_millis(50), Duration::from_secs(5)),
    )
}
