//! The rows of the rule table, by name, and the runbooks the table points to.

use std::fmt;

use serde::{Serialize, Serializer};

use crate::api::conditions::reason;

/// A row of the rule table (SPEC section 4). Rows are evaluated in this order; the first
/// that applies decides. Its number is the one the docs and the Events use.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Row {
    /// 1: the object or its Cluster is paused.
    Paused = 1,
    /// 2: a Job or Pod of the object has not finished.
    JobUnfinished = 2,
    /// 3: a TerraformCluster whose machines or pools still exist.
    DependentsExist = 3,
    /// 4: no state Secret, and the object never applied: released without a destroy.
    NeverApplied = 4,
    /// 5: no state Secret, and the object applied before: held.
    StateMissing = 5,
    /// 6: a state that cannot be read, or cannot be trusted: held.
    StateUntrusted = 6,
    /// 7: a readable state with managed resource instances, and a destroy can start.
    Destroy = 7,
    /// 8: a readable state with no managed resource instance, or cleanup already started.
    CleanUp = 8,
    /// 9: a finished destroy attempt left instances, or a destroy cannot start.
    FailedOrBlocked = 9,
}

impl Row {
    /// Every row, in the order they are evaluated.
    pub const ALL: [Row; 9] = [
        Row::Paused,
        Row::JobUnfinished,
        Row::DependentsExist,
        Row::NeverApplied,
        Row::StateMissing,
        Row::StateUntrusted,
        Row::Destroy,
        Row::CleanUp,
        Row::FailedOrBlocked,
    ];

    /// The row's number, 1 to 9.
    pub fn number(self) -> u8 {
        self as u8
    }

    /// The situation the row stands for, as the docs' table says it (the docs test
    /// checks that the overview page's table matches).
    pub fn situation(self) -> &'static str {
        match self {
            Row::Paused => "the object or its Cluster is paused",
            Row::JobUnfinished => "a Job or Pod of the object has not finished",
            Row::DependentsExist => "a TerraformCluster whose machines or pools still exist",
            Row::NeverApplied => "no state Secret, and the object never applied",
            Row::StateMissing => "no state Secret, and the object applied before",
            Row::StateUntrusted => "a state that cannot be read, or cannot be trusted",
            Row::Destroy => {
                "a readable state with managed resource instances, no finished destroy attempt, and a destroy can start"
            }
            Row::CleanUp => {
                "a readable state with no managed resource instance, or cleanup already started"
            }
            Row::FailedOrBlocked => {
                "a finished destroy attempt left instances, or a destroy cannot start"
            }
        }
    }

    /// The Deleting condition's reason (or reasons) the row sets.
    pub fn reason(self) -> &'static str {
        match self {
            Row::Paused => reason::PAUSED,
            Row::JobUnfinished => reason::WAITING_FOR_JOB,
            Row::DependentsExist => reason::WAITING_FOR_DEPENDENTS,
            Row::NeverApplied => reason::RELEASED,
            Row::StateMissing | Row::StateUntrusted => reason::HELD,
            Row::Destroy => reason::DESTROY_RUNNING,
            Row::CleanUp => reason::CLEANING_UP,
            Row::FailedOrBlocked => "DestroyFailed or DestroyCannotStart",
        }
    }
}

impl fmt::Display for Row {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.number())
    }
}

/// As its number, as `captf explain --output json` has always printed it.
impl Serialize for Row {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_u8(self.number())
    }
}

pub const RUNBOOK_PAUSED: &str = "runbooks/Paused.md";
pub const RUNBOOK_WAITING_FOR_JOB: &str = "runbooks/WaitingForJob.md";
pub const RUNBOOK_DEPENDENTS_EXIST: &str = "runbooks/DependentsExist.md";
pub const RUNBOOK_STATE_LOST: &str = "runbooks/StateLost.md";
pub const RUNBOOK_STATE_CORRUPT: &str = "runbooks/StateCorrupt.md";
pub const RUNBOOK_STATE_ENCRYPTED: &str = "runbooks/StateEncrypted.md";
pub const RUNBOOK_STATE_INCONSISTENT: &str = "runbooks/StateInconsistent.md";
pub const RUNBOOK_DESTROY_FAILED: &str = "runbooks/DestroyFailed.md";
pub const RUNBOOK_DESTROY_CANNOT_START: &str = "runbooks/DestroyCannotStart.md";
pub const RUNBOOK_ABANDON: &str = "runbooks/Abandon.md";
pub const RUNBOOK_OWNER_GONE: &str = "runbooks/OwnerGone.md";
pub const RUNBOOK_ERRORED_STATE: &str = "runbooks/ErroredState.md";
