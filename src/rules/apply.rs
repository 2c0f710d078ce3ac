//! The apply table: the pure decision of a pass on a live object, beside the deletion's
//! rule table. The first row that applies decides; each row says what the pass does and
//! the `Provisioned`, `InputsApplied` and `Ready` conditions it sets. No client and no
//! clock: the time is a fact, as in the deletion's table.
//!
//! `Provisioned` latches: once an apply of the object succeeded it stays True whatever a
//! later apply does (Cluster API stops the cluster's health checks on a False Ready, and
//! a re-apply that fails must not take a running machine away). `InputsApplied` says
//! whether the latest inputs are the ones applied; it never feeds Ready.

use jiff::Timestamp;

use super::{Backoff, PauseCause, UnfinishedJob, add};
use crate::api::Kind;
use crate::api::conditions::{self as cond, Desired, Status};

/// Condition types of the apply side.
pub const PROVISIONED: &str = "Provisioned";
pub const INPUTS_APPLIED: &str = "InputsApplied";

/// Reasons of `Provisioned`, `InputsApplied` and `Ready` on a live object.
pub mod reason {
    pub const WAITING_FOR_OWNER: &str = "WaitingForOwner";
    pub const WAITING_FOR_CLUSTER_INFRASTRUCTURE: &str = "WaitingForClusterInfrastructureReady";
    pub const WAITING_FOR_CONTROL_PLANE: &str = "WaitingForControlPlaneInitialized";
    pub const WAITING_FOR_BOOTSTRAP_DATA: &str = "WaitingForBootstrapData";
    pub const WAITING_FOR_CLUSTER_OUTPUTS: &str = "WaitingForClusterOutputs";
    pub const PAUSED: &str = "Paused";
    pub const APPLY_CANNOT_START: &str = "ApplyCannotStart";
    pub const APPLYING: &str = "Applying";
    pub const APPLY_FAILED: &str = "ApplyFailed";
    pub const OUTPUTS_INVALID: &str = "OutputsInvalid";
    pub const CHANGE_REFUSED: &str = "ChangeRefused";
    pub const PROVISIONED: &str = "Provisioned";
    pub const APPLIED: &str = "Applied";
    pub const READY: &str = "Ready";
}

/// What a machine or a pool waits for before its first apply (the kind's own gates).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Prerequisite {
    /// The Cluster's infrastructure is not provisioned yet.
    ClusterInfrastructure { cluster: String },
    /// A worker waits for the control plane to be initialised before it has bootstrap
    /// data.
    ControlPlaneInitialized { cluster: String },
    /// The owner names no bootstrap data Secret yet, or it lacks its `value`.
    BootstrapData { detail: String },
    /// The TerraformCluster's outputs, which machines and pools are given, cannot be read.
    ClusterOutputs { detail: String },
}

impl Prerequisite {
    fn reason(&self) -> &'static str {
        match self {
            Prerequisite::ClusterInfrastructure { .. } => {
                reason::WAITING_FOR_CLUSTER_INFRASTRUCTURE
            }
            Prerequisite::ControlPlaneInitialized { .. } => reason::WAITING_FOR_CONTROL_PLANE,
            Prerequisite::BootstrapData { .. } => reason::WAITING_FOR_BOOTSTRAP_DATA,
            Prerequisite::ClusterOutputs { .. } => reason::WAITING_FOR_CLUSTER_OUTPUTS,
        }
    }

    fn describe(&self) -> String {
        match self {
            Prerequisite::ClusterInfrastructure { cluster } => format!(
                "waiting for Cluster {cluster}'s infrastructure to be provisioned (status.initialization.infrastructureProvisioned)"
            ),
            Prerequisite::ControlPlaneInitialized { cluster } => format!(
                "waiting for Cluster {cluster}'s control plane to be initialised before a worker's bootstrap data exists"
            ),
            Prerequisite::BootstrapData { detail } => {
                format!("waiting for bootstrap data: {detail}")
            }
            Prerequisite::ClusterOutputs { detail } => {
                format!("waiting for the TerraformCluster's outputs: {detail}")
            }
        }
    }
}

/// How the latest apply attempt ended, from the object's bookkeeping.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LastApply {
    /// No apply attempt finished yet.
    None,
    /// The latest attempt succeeded, with the inputs of `A/inputs-sha256`.
    Succeeded,
    /// The latest `failures` attempts failed, the last at `at`; `message` says how.
    Failed {
        failures: u32,
        at: Timestamp,
        message: String,
    },
}

/// The facts of a pass on a live object, the apply table's whole input.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ApplyFacts {
    pub kind: Kind,
    pub uid: String,
    pub now: Timestamp,
    pub backoff: Backoff,
    /// A TerraformCluster whose Cluster's infrastructure is managed by someone else
    /// (`cluster.x-k8s.io/managed-by`): CAPTF applies nothing and writes nothing for it.
    pub externally_managed: bool,
    pub paused: Option<PauseCause>,
    /// The owner Cluster API sets (a Cluster, the controlling Machine, a MachinePool), if
    /// set yet.
    pub owner: Option<String>,
    /// The first of the kind's own gates that is not met.
    pub prerequisite: Option<Prerequisite>,
    pub unfinished_jobs: Vec<UnfinishedJob>,
    /// A state Secret the object neither created nor adopted: why, if so (SPEC section 7:
    /// an apply never starts against it).
    pub foreign_state: Option<String>,
    /// The SHA-256 of the inputs the spec resolves to now, or why they do not resolve
    /// (a missing Secret or key, an invalid module), naming the object and the key.
    pub inputs: Result<String, String>,
    /// `A/inputs-sha256`: the inputs of the latest apply started.
    pub applied_sha: Option<String>,
    /// The number of the latest apply attempt started (`A/apply-attempt`), 0 if none.
    pub attempt: u32,
    pub last: LastApply,
    /// The latest apply succeeded, but its outputs break the module contract: how.
    pub outputs_invalid: Option<String>,
    /// The latest apply succeeded, and its outputs gave a set-once spec field another
    /// value, which was kept: each field refused.
    pub change_refused: Option<String>,
    /// `status.initialization.provisioned` as latched, or as rebuilt from the state.
    pub provisioned: bool,
}

/// A row of the apply table, in the order they are evaluated.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ApplyRow {
    ExternallyManaged,
    Paused,
    NoOwner,
    Prerequisite,
    JobUnfinished,
    ForeignState,
    InputsUnresolvable,
    OutputsInvalid,
    UpToDate,
    Failed,
    Apply,
}

impl ApplyRow {
    pub const ALL: [ApplyRow; 11] = [
        ApplyRow::ExternallyManaged,
        ApplyRow::Paused,
        ApplyRow::NoOwner,
        ApplyRow::Prerequisite,
        ApplyRow::JobUnfinished,
        ApplyRow::ForeignState,
        ApplyRow::InputsUnresolvable,
        ApplyRow::OutputsInvalid,
        ApplyRow::UpToDate,
        ApplyRow::Failed,
        ApplyRow::Apply,
    ];

    /// The row's letter and number, `A1` to `A11`, as the docs' table names it.
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
            ApplyRow::InputsUnresolvable => "the spec's inputs do not resolve",
            ApplyRow::OutputsInvalid => {
                "the latest inputs are applied, but the outputs break the module contract"
            }
            ApplyRow::UpToDate => "the latest inputs are applied",
            ApplyRow::Failed => "the latest apply of these inputs failed",
            ApplyRow::Apply => "never applied, or the inputs changed",
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

/// The apply table. Rows are evaluated in order; the first that applies decides.
pub fn decide_apply(f: &ApplyFacts) -> ApplyDecision {
    if f.kind == Kind::TerraformCluster && f.externally_managed {
        return ApplyDecision {
            row: ApplyRow::ExternallyManaged,
            action: ApplyAction::Nothing,
            conditions: Vec::new(),
        };
    }
    if let Some(cause) = &f.paused {
        let msg = format!("paused because {}: no apply starts", cause.describe());
        return gated(f, ApplyRow::Paused, reason::PAUSED, msg);
    }
    if f.owner.is_none() {
        let owner = match f.kind {
            Kind::TerraformCluster => "a Cluster's spec.infrastructureRef",
            Kind::TerraformMachine => "a Machine's spec.infrastructureRef",
            Kind::TerraformMachinePool => "a MachinePool's spec.template.spec.infrastructureRef",
        };
        let msg = format!(
            "waiting for Cluster API to set the owner: the object must be named by {owner}"
        );
        return gated(f, ApplyRow::NoOwner, reason::WAITING_FOR_OWNER, msg);
    }
    if let Some(p) = &f.prerequisite {
        return gated(f, ApplyRow::Prerequisite, p.reason(), p.describe());
    }
    if !f.unfinished_jobs.is_empty() {
        let msg = format!("{} running", UnfinishedJob::list(&f.unfinished_jobs));
        return not_applied(
            f,
            ApplyRow::JobUnfinished,
            reason::APPLYING,
            msg,
            ApplyAction::Wait,
        );
    }
    if let Some(why) = &f.foreign_state {
        let msg = format!(
            "{why}: an apply never starts against a state the object neither created nor adopted; see runbooks/ApplyCannotStart.md"
        );
        return not_applied(
            f,
            ApplyRow::ForeignState,
            reason::APPLY_CANNOT_START,
            msg,
            ApplyAction::Wait,
        );
    }
    let sha = match &f.inputs {
        Ok(sha) => sha,
        Err(why) => {
            let msg = format!("{why}; see runbooks/ApplyCannotStart.md");
            return not_applied(
                f,
                ApplyRow::InputsUnresolvable,
                reason::APPLY_CANNOT_START,
                msg,
                ApplyAction::Wait,
            );
        }
    };
    let same_inputs = f.applied_sha.as_deref() == Some(sha.as_str());
    let next = f.attempt.saturating_add(1);
    match &f.last {
        LastApply::Succeeded if same_inputs && f.outputs_invalid.is_some() => {
            let why = f.outputs_invalid.as_deref().unwrap_or_default();
            let msg = format!(
                "apply attempt {} succeeded, but its outputs break module contract v1: {why}; fix the module, and its next apply (a change of the spec) sets the fields; see runbooks/OutputsInvalid.md",
                f.attempt
            );
            not_applied(
                f,
                ApplyRow::OutputsInvalid,
                reason::OUTPUTS_INVALID,
                msg,
                ApplyAction::Wait,
            )
        }
        LastApply::Succeeded if same_inputs && f.change_refused.is_some() => {
            let why = f.change_refused.as_deref().unwrap_or_default();
            let msg = format!(
                "apply attempt {} succeeded, but {why}; make the module give the value again (a change of the spec applies it), or replace the object; see runbooks/ChangeRefused.md",
                f.attempt
            );
            not_applied(
                f,
                ApplyRow::UpToDate,
                reason::CHANGE_REFUSED,
                msg,
                ApplyAction::Wait,
            )
        }
        LastApply::Succeeded if same_inputs => ApplyDecision {
            row: ApplyRow::UpToDate,
            action: ApplyAction::Wait,
            conditions: vec![
                Desired::new(PROVISIONED, Status::True, reason::PROVISIONED, ""),
                Desired::new(INPUTS_APPLIED, Status::True, reason::APPLIED, ""),
                Desired::new(cond::READY, Status::True, reason::READY, ""),
            ],
        },
        LastApply::Failed {
            failures,
            at,
            message,
        } if same_inputs => {
            let due = add(*at, f.backoff.delay(*failures, &f.uid));
            let start = (due <= f.now).then_some(next);
            let msg = match start {
                Some(n) => format!(
                    "apply attempt {} failed: {message}; attempt {n} is starting; see runbooks/ApplyFailed.md",
                    f.attempt
                ),
                None => format!(
                    "apply attempt {} failed: {message}; the next attempt starts at {due}; see runbooks/ApplyFailed.md",
                    f.attempt
                ),
            };
            not_applied(
                f,
                ApplyRow::Failed,
                reason::APPLY_FAILED,
                msg,
                ApplyAction::RetryLater { at: due, start },
            )
        }
        _ => {
            let why = if f.attempt == 0 {
                "first apply".to_string()
            } else if same_inputs {
                "the last apply ended without a result".to_string()
            } else {
                "the inputs changed".to_string()
            };
            let msg = format!("apply attempt {next} is starting ({why})");
            not_applied(
                f,
                ApplyRow::Apply,
                reason::APPLYING,
                msg,
                ApplyAction::StartApply { attempt: next },
            )
        }
    }
}

/// A gate holds the apply: Unknown, so that no False window starts Cluster API's
/// health-check timeouts; a provisioned object stays provisioned and Ready. Each gate's
/// reason has its runbook, of its name.
fn gated(f: &ApplyFacts, row: ApplyRow, why: &'static str, msg: String) -> ApplyDecision {
    let msg = format!("{msg}; see runbooks/{why}.md");
    decision(f, row, ApplyAction::Wait, Status::Unknown, why, msg)
}

/// The latest inputs are not applied (yet): False, except that a provisioned object
/// stays provisioned and Ready.
fn not_applied(
    f: &ApplyFacts,
    row: ApplyRow,
    why: &'static str,
    msg: String,
    action: ApplyAction,
) -> ApplyDecision {
    decision(f, row, action, Status::False, why, msg)
}

/// `InputsApplied` at `status` with `why`; `Provisioned` and `Ready` the same until the
/// object is provisioned, True from then on.
fn decision(
    f: &ApplyFacts,
    row: ApplyRow,
    action: ApplyAction,
    status: Status,
    why: &'static str,
    msg: String,
) -> ApplyDecision {
    let conditions = if f.provisioned {
        vec![
            Desired::new(PROVISIONED, Status::True, reason::PROVISIONED, ""),
            Desired::new(INPUTS_APPLIED, status, why, msg),
            Desired::new(cond::READY, Status::True, reason::READY, ""),
        ]
    } else {
        vec![
            Desired::new(PROVISIONED, status, why, msg.clone()),
            Desired::new(INPUTS_APPLIED, status, why, msg.clone()),
            Desired::new(cond::READY, status, why, msg),
        ]
    };
    ApplyDecision {
        row,
        action,
        conditions,
    }
}

#[cfg(test)]
#[path = "apply_tests.rs"]
mod tests;
