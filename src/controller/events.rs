//! The Events a pass publishes: their reasons, which the runbooks cite, and one way to
//! publish them (a failure to publish is logged, never fatal).

use kube::runtime::events::{Event, EventType};
use tracing::debug;

use super::Context;
use crate::api::TerraformObject;

/// A destroy attempt's Job was created.
pub const DESTROY_STARTED: &str = "DestroyStarted";
/// A destroy attempt's Job failed (Terraform's error, or its Pod's fate).
pub const DESTROY_FAILED: &str = "DestroyFailed";
/// A destroy attempt's Job was deleted while its Pod still ran.
pub const DESTROY_INTERRUPTED: &str = "DestroyInterrupted";
/// The destroy was verified and everything of the object deleted; it is released.
pub const CLEANED_UP: &str = "CleanedUp";
/// Never applied and no state: released without a destroy.
pub const RELEASED: &str = "Released";
/// Released without a destroy on the operator's word; the Secrets are kept.
pub const ABANDONED: &str = "Abandoned";

/// An apply attempt's Job was created.
pub const APPLY_STARTED: &str = "ApplyStarted";
/// An apply attempt's Job failed (Terraform's error, or its Pod's fate).
pub const APPLY_FAILED: &str = "ApplyFailed";
/// An apply attempt's Job succeeded and the state it left was read.
pub const APPLY_SUCCEEDED: &str = "ApplySucceeded";
/// An apply attempt's Job succeeded, but the state it left cannot be read or trusted:
/// its success cannot be recorded, and the object holds.
pub const APPLY_UNRECORDED: &str = "ApplyUnrecorded";

/// The plan guard stopped an apply attempt before it changed anything: its plan destroys
/// or replaces resources, and its hash is not approved.
pub const DESTRUCTIVE_PLAN_BLOCKED: &str = "DestructivePlanBlocked";
/// The API server refused what an apply needs (its Job, Secrets or runner RBAC).
pub const APPLY_CANNOT_START: &str = "ApplyCannotStart";
/// The object was provisioned for the first time.
pub const PROVISIONED: &str = "Provisioned";
/// An apply succeeded but its outputs break the module contract.
pub const OUTPUTS_INVALID: &str = "OutputsInvalid";
/// The outputs give a TerraformCluster's set `spec.controlPlaneEndpoint` another value.
pub const CONTROL_PLANE_ENDPOINT_CHANGE_REFUSED: &str = "ControlPlaneEndpointChangeRefused";
/// The outputs give a TerraformMachine's set `spec.providerID` another value.
pub const PROVIDER_ID_CHANGE_REFUSED: &str = "ProviderIDChangeRefused";

/// The apply's reasons, as docs/provisioning/01-lifecycle.md lists them (a docs test
/// checks it).
pub const APPLY_REASONS: [&str; 10] = [
    APPLY_STARTED,
    APPLY_CANNOT_START,
    APPLY_FAILED,
    DESTRUCTIVE_PLAN_BLOCKED,
    APPLY_SUCCEEDED,
    APPLY_UNRECORDED,
    PROVISIONED,
    OUTPUTS_INVALID,
    CONTROL_PLANE_ENDPOINT_CHANGE_REFUSED,
    PROVIDER_ID_CHANGE_REFUSED,
];

/// Every reason of a deletion above, as docs/03-destroy-job.md lists them (a docs test checks it).
pub const REASONS: [&str; 6] = [
    DESTROY_STARTED,
    DESTROY_FAILED,
    DESTROY_INTERRUPTED,
    CLEANED_UP,
    RELEASED,
    ABANDONED,
];

/// An Event a pass decided to publish about its object.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Note {
    pub type_: EventType,
    pub reason: &'static str,
    pub action: &'static str,
    pub note: String,
}

impl Note {
    pub fn normal(reason: &'static str, action: &'static str, note: String) -> Self {
        Note {
            type_: EventType::Normal,
            reason,
            action,
            note,
        }
    }

    pub fn warning(reason: &'static str, action: &'static str, note: String) -> Self {
        Note {
            type_: EventType::Warning,
            reason,
            action,
            note,
        }
    }
}

/// Publishes `note` about `obj`.
pub async fn publish_note<K: TerraformObject>(ctx: &Context, obj: &K, note: &Note) {
    publish(ctx, obj, note.type_, note.reason, note.action, &note.note).await;
}
/// Publishes an Event about the object; a failure to publish is logged, never fatal.
pub async fn publish<K: TerraformObject>(
    ctx: &Context,
    obj: &K,
    type_: EventType,
    reason: &str,
    action: &str,
    note: &str,
) {
    publish_ref(ctx, &obj.object_ref(&()), type_, reason, action, note).await;
}

/// Publishes an Event about the object `reference` names; notes are cut to 1,000 bytes.
pub async fn publish_ref(
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
