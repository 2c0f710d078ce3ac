//! Condition types and reasons (CAPI v1beta2 conventions), and the pure merge that keeps
//! `lastTransitionTime` unless the status flips.

use jiff::Timestamp;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use serde::{Deserialize, Serialize};

pub const READY: &str = "Ready";
pub const PAUSED: &str = "Paused";
pub const DELETING: &str = "Deleting";
pub const DELETION_BLOCKED: &str = "DeletionBlocked";
pub const STATE_READABLE: &str = "StateReadable";
/// On a live object: what its deletion would reach if it were asked now (see
/// `crate::rules::preview`).
pub const DELETION_READY: &str = "DeletionReady";
/// The apply side's, on a live object.
pub const PROVISIONED: &str = "Provisioned";
pub const INPUTS_APPLIED: &str = "InputsApplied";

/// Reasons, of every condition. The Deleting reasons are the rule table's (SPEC section 4);
/// those of `Provisioned`, `InputsApplied` and a live object's `Ready` the apply table's.
pub mod reason {
    // Paused
    pub const PAUSED: &str = "Paused";
    pub const NOT_PAUSED: &str = "NotPaused";
    // Deleting
    pub const NOT_DELETING: &str = "NotDeleting";
    pub const WAITING_FOR_JOB: &str = "WaitingForJob";
    pub const WAITING_FOR_DEPENDENTS: &str = "WaitingForDependents";
    pub const RELEASED: &str = "Released";
    pub const HELD: &str = "Held";
    pub const DESTROY_RUNNING: &str = "DestroyRunning";
    pub const CLEANING_UP: &str = "CleaningUp";
    pub const DESTROY_FAILED: &str = "DestroyFailed";
    pub const DESTROY_CANNOT_START: &str = "DestroyCannotStart";
    pub const ABANDONING: &str = "Abandoning";
    // DeletionBlocked
    pub const DEPENDENTS_EXIST: &str = "DependentsExist";
    pub const OWNER_GONE: &str = "OwnerGone";
    pub const ERRORED_STATE: &str = "ErroredState";
    pub const NOT_BLOCKED: &str = "NotBlocked";
    // StateReadable
    pub const READABLE: &str = "Readable";
    pub const STATE_LOST: &str = "StateLost";
    pub const STATE_CORRUPT: &str = "StateCorrupt";
    pub const STATE_ENCRYPTED: &str = "StateEncrypted";
    pub const STATE_INCONSISTENT: &str = "StateInconsistent";
    pub const NO_STATE: &str = "NoState";
    // DeletionReady (False: the reason of the row a deletion would hold at, as above)
    pub const DESTROY_WOULD_RUN: &str = "DestroyWouldRun";
    pub const NOTHING_TO_DESTROY: &str = "NothingToDestroy";
    pub const WOULD_ABANDON: &str = "WouldAbandon";
    pub const STATE_NOT_READ: &str = "StateNotRead";
    // Ready
    pub const DELETING: &str = "Deleting";
    pub const READY_UNKNOWN: &str = "ReadyUnknown";
    // Provisioned, InputsApplied and Ready on a live object (the apply table; Paused and
    // ErroredState are the ones above)
    pub const WAITING_FOR_OWNER: &str = "WaitingForOwner";
    pub const WAITING_FOR_CLUSTER_INFRASTRUCTURE: &str = "WaitingForClusterInfrastructureReady";
    pub const WAITING_FOR_CONTROL_PLANE: &str = "WaitingForControlPlaneInitialized";
    pub const WAITING_FOR_BOOTSTRAP_DATA: &str = "WaitingForBootstrapData";
    pub const WAITING_FOR_CLUSTER_OUTPUTS: &str = "WaitingForClusterOutputs";
    pub const APPLY_CANNOT_START: &str = "ApplyCannotStart";
    pub const APPLYING: &str = "Applying";
    pub const APPLY_FAILED: &str = "ApplyFailed";
    pub const APPLY_UNRECORDED: &str = "ApplyUnrecorded";
    pub const OUTPUTS_INVALID: &str = "OutputsInvalid";
    pub const CHANGE_REFUSED: &str = "ChangeRefused";
    pub const DESTRUCTIVE_PLAN_BLOCKED: &str = "DestructivePlanBlocked";
    pub const PROVISIONED: &str = "Provisioned";
    pub const APPLIED: &str = "Applied";
    pub const READY: &str = "Ready";
}

/// `metav1.Condition`, as k8s-openapi has it (CAPI v1beta2 conditions are these).
pub use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;

/// `True`, `False` or `Unknown`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Status {
    True,
    False,
    Unknown,
}

impl Status {
    pub fn as_str(self) -> &'static str {
        match self {
            Status::True => "True",
            Status::False => "False",
            Status::Unknown => "Unknown",
        }
    }
}

/// A condition a decision wants set, without timestamps.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Desired {
    #[serde(rename = "type")]
    pub type_: &'static str,
    pub status: Status,
    pub reason: &'static str,
    pub message: String,
}

impl Desired {
    pub fn new(
        type_: &'static str,
        status: Status,
        reason: &'static str,
        message: impl Into<String>,
    ) -> Self {
        Desired {
            type_,
            status,
            reason,
            message: message.into(),
        }
    }
}

/// Merges `desired` into `existing`: a condition whose status is unchanged keeps its
/// `lastTransitionTime`; reason, message and observedGeneration follow the desired value.
/// Conditions not named in `desired` are kept as they are. The result is ordered by type
/// as first seen, new types appended.
pub fn merge(
    existing: &[Condition],
    desired: &[Desired],
    generation: Option<i64>,
    now: Timestamp,
) -> Vec<Condition> {
    let mut out: Vec<Condition> = existing.to_vec();
    for d in desired {
        let status = d.status.as_str();
        match out.iter_mut().find(|c| c.type_ == d.type_) {
            Some(c) => {
                if c.status != status {
                    c.last_transition_time = Time(now);
                    c.status = status.to_string();
                }
                c.reason = d.reason.to_string();
                c.message = d.message.clone();
                c.observed_generation = generation;
            }
            None => out.push(Condition {
                type_: d.type_.to_string(),
                status: status.to_string(),
                reason: d.reason.to_string(),
                message: d.message.clone(),
                last_transition_time: Time(now),
                observed_generation: generation,
            }),
        }
    }
    out
}

/// Whether two condition lists differ in anything but timestamps; an unchanged status is
/// not rewritten.
pub fn differ_ignoring_time(a: &[Condition], b: &[Condition]) -> bool {
    let key = |c: &Condition| {
        (
            c.type_.clone(),
            c.status.clone(),
            c.reason.clone(),
            c.message.clone(),
            c.observed_generation,
        )
    };
    a.len() != b.len() || a.iter().zip(b).any(|(x, y)| key(x) != key(y))
}

/// Finds a condition by type.
pub fn find<'a>(conditions: &'a [Condition], type_: &str) -> Option<&'a Condition> {
    conditions.iter().find(|c| c.type_ == type_)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(s: &str) -> Timestamp {
        s.parse().expect("timestamp")
    }

    #[test]
    fn a_new_condition_gets_the_current_time() {
        let out = merge(
            &[],
            &[Desired::new(PAUSED, Status::False, reason::NOT_PAUSED, "")],
            Some(3),
            t("2026-01-01T00:00:00Z"),
        );
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].last_transition_time, Time(t("2026-01-01T00:00:00Z")));
        assert_eq!(out[0].observed_generation, Some(3));
        assert_eq!(out[0].reason, "NotPaused");
    }

    #[test]
    fn merging_keeps_last_transition_time_unless_the_status_flips() {
        let first = merge(
            &[],
            &[Desired::new(
                DELETING,
                Status::True,
                reason::WAITING_FOR_JOB,
                "a",
            )],
            Some(1),
            t("2026-01-01T00:00:00Z"),
        );
        let same_status = merge(
            &first,
            &[Desired::new(
                DELETING,
                Status::True,
                reason::DESTROY_RUNNING,
                "b",
            )],
            Some(2),
            t("2026-01-02T00:00:00Z"),
        );
        assert_eq!(
            same_status[0].last_transition_time,
            Time(t("2026-01-01T00:00:00Z"))
        );
        assert_eq!(same_status[0].reason, "DestroyRunning");
        assert_eq!(same_status[0].message, "b");
        assert_eq!(same_status[0].observed_generation, Some(2));
        let flipped = merge(
            &same_status,
            &[Desired::new(
                DELETING,
                Status::False,
                reason::NOT_DELETING,
                "",
            )],
            Some(2),
            t("2026-01-03T00:00:00Z"),
        );
        assert_eq!(
            flipped[0].last_transition_time,
            Time(t("2026-01-03T00:00:00Z"))
        );
    }

    #[test]
    fn conditions_not_named_are_kept() {
        let first = merge(
            &[],
            &[Desired::new(READY, Status::True, "Provisioned", "")],
            None,
            t("2026-01-01T00:00:00Z"),
        );
        let out = merge(
            &first,
            &[Desired::new(PAUSED, Status::True, reason::PAUSED, "")],
            None,
            t("2026-01-02T00:00:00Z"),
        );
        assert_eq!(out.len(), 2);
        assert_eq!(out[0], first[0]);
    }

    #[test]
    fn differ_ignores_only_timestamps() {
        let a = merge(
            &[],
            &[Desired::new(PAUSED, Status::True, reason::PAUSED, "x")],
            None,
            t("2026-01-01T00:00:00Z"),
        );
        let mut b = a.clone();
        b[0].last_transition_time = Time(t("2027-01-01T00:00:00Z"));
        assert!(!differ_ignoring_time(&a, &b));
        b[0].message = "y".into();
        assert!(differ_ignoring_time(&a, &b));
    }
}
