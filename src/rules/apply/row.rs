//! What the apply table decides: its rows, the action of a pass, and the decision with
//! its conditions.

use super::*;

/// A row of the apply table, in the order they are evaluated.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ApplyRow {
    ExternallyManaged,
    Paused,
    NoOwner,
    Prerequisite,
    JobUnfinished,
    ForeignState,
    Unrecorded,
    InputsUnresolvable,
    OutputsInvalid,
    UpToDate,
    CannotStart,
    Failed,
    Apply,
    PlanBlocked,
}

impl ApplyRow {
    /// In the order they are evaluated; `PlanBlocked` (A14) is numbered last, after the
    /// rows it came after, and excludes A12 and A13 (it is an ending of the latest attempt
    /// of the same inputs, as A12 is, and A13 is for every other ending).
    pub const ALL: [ApplyRow; 14] = [
        ApplyRow::ExternallyManaged,
        ApplyRow::Paused,
        ApplyRow::NoOwner,
        ApplyRow::Prerequisite,
        ApplyRow::JobUnfinished,
        ApplyRow::ForeignState,
        ApplyRow::Unrecorded,
        ApplyRow::InputsUnresolvable,
        ApplyRow::OutputsInvalid,
        ApplyRow::UpToDate,
        ApplyRow::CannotStart,
        ApplyRow::Failed,
        ApplyRow::Apply,
        ApplyRow::PlanBlocked,
    ];

    /// The row's letter and number, `A1` to `A13`, as the docs' table names it.
    pub fn label(self) -> String {
        let n = Self::ALL.iter().position(|r| *r == self).unwrap_or(0) + 1;
        format!("A{n}")
    }

    /// The situation the row stands for, as the docs' table says it.
    pub fn situation(self) -> &'static str {
        match self {
            ApplyRow::ExternallyManaged => {
                "a TerraformCluster whose infrastructure is managed by someone else"
            }
            ApplyRow::Paused => "the object or its Cluster is paused",
            ApplyRow::NoOwner => "Cluster API has not set the object's owner yet",
            ApplyRow::Prerequisite => "a machine or pool waits for its Cluster or bootstrap data",
            ApplyRow::JobUnfinished => "a Job or Pod of the object has not finished",
            ApplyRow::ForeignState => "a state Secret the object neither created nor adopted",
            ApplyRow::Unrecorded => {
                "the latest apply succeeded, but the state it left cannot be read or trusted"
            }
            ApplyRow::InputsUnresolvable => "the spec's inputs do not resolve",
            ApplyRow::OutputsInvalid => {
                "the latest inputs are applied, but the outputs break the module contract"
            }
            ApplyRow::UpToDate => "the latest inputs are applied",
            ApplyRow::CannotStart => {
                "an apply is due, but its state is lost or untrusted, an errored state lists what it does not, or another holds Terraform's lock"
            }
            ApplyRow::Failed => "the latest apply of these inputs failed",
            ApplyRow::Apply => "never applied, or the inputs changed",
            ApplyRow::PlanBlocked => {
                "the latest apply of these inputs stopped before applying: its plan destroys or replaces resources"
            }
        }
    }
}

/// What the pass does on a live object.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ApplyAction {
    /// Nothing is written (an externally managed cluster).
    Nothing,
    /// Nothing to start: wait for a change (or the Job, or the gate's object).
    Wait,
    /// Start apply attempt `attempt`, after the write-ahead (inputs Secret and hash,
    /// `applied-at` the first time, block-move, the attempt number).
    StartApply { attempt: u32 },
    /// The next attempt is due `at`; `start` is the attempt to start now once it is due.
    RetryLater { at: Timestamp, start: Option<u32> },
}

impl ApplyAction {
    /// The attempt whose Job the pass starts now, if any.
    pub fn start_attempt(&self) -> Option<u32> {
        match *self {
            ApplyAction::StartApply { attempt } => Some(attempt),
            ApplyAction::RetryLater { start, .. } => start,
            _ => None,
        }
    }
}

/// The decision of the apply table.
#[derive(Clone, Debug, PartialEq)]
pub struct ApplyDecision {
    pub row: ApplyRow,
    pub action: ApplyAction,
    /// `Provisioned`, `InputsApplied` and `Ready`, in that order; none for an externally
    /// managed cluster.
    pub conditions: Vec<Desired>,
}
