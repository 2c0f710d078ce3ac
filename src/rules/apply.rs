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

use super::{Backoff, PauseCause, StateFacts, UnfinishedJob, add};
use crate::api::Kind;
use crate::api::conditions::{self as cond, Desired, Status};

/// The apply side's condition types and reasons live with the others.
pub use crate::api::conditions::{INPUTS_APPLIED, PROVISIONED, reason};

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
    /// The plan guard stopped the latest attempt before it changed anything: its plan
    /// destroys or replaces resources, and its hash was not approved.
    PlanBlocked(crate::job::DestructivePlan),
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
    /// The latest apply succeeded, and its success is not recorded (the pass that would
    /// record it cannot read or trust the state it left): why.
    pub unrecorded: Option<String>,
    /// What the pass knows of the state, in the deletion's words: `NotRead` unless an
    /// apply is due (or a success is to be recorded), when it is read before anything
    /// starts.
    pub state: StateFacts,
    /// An apply of the object wrote its state before (a fingerprint is recorded): a state
    /// that is missing now was lost.
    pub state_expected: bool,
    /// An errored state of the object lists managed resource instances the state does not
    /// (or cannot be read): which, for the message.
    pub errored: Option<String>,
    /// Terraform's lock is held by something else than a gone runner of the object: by
    /// whom and since when.
    pub lock_held: Option<String>,
    /// `A/approve-plan`: the hash of a destructive plan an operator approved.
    pub approved_plan: Option<String>,
    /// The API server refused what the last try at starting an attempt needed (an
    /// admission policy, a quota, a permission), remembered since: the object, the
    /// attempt and its message. The attempt is tried again; the conditions say why it
    /// has not started.
    pub refused: Option<String>,
}

/// Whether the apply table needs the state read to decide: it would start an attempt,
/// and the state was not read (it is, before anything starts, as the deletion's table
/// reads it before a destroy).
pub fn apply_state_needed(f: &ApplyFacts) -> bool {
    f.state == StateFacts::NotRead && decide_apply(f).action.start_attempt().is_some()
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

/// The apply table. Rows are evaluated in order; the first that applies decides. A row
/// that starts an attempt the API server refused last time ([`ApplyFacts::refused`]) still
/// starts it, and its conditions say the refusal instead of "starting".
pub fn decide_apply(f: &ApplyFacts) -> ApplyDecision {
    let d = decide_rows(f);
    match (&f.refused, d.action.start_attempt()) {
        (Some(why), Some(_)) => {
            let msg = format!("{why}; see runbooks/ApplyCannotStart.md");
            ApplyDecision {
                conditions: not_applied(f, d.row, reason::APPLY_CANNOT_START, msg, d.action)
                    .conditions,
                ..d
            }
        }
        _ => d,
    }
}

fn decide_rows(f: &ApplyFacts) -> ApplyDecision {
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
    if let Some(why) = &f.unrecorded {
        let msg = format!(
            "apply attempt {} succeeded, but its state cannot be recorded: {why}; nothing more is applied, and Cluster API is not told the object is provisioned, until the state reads; see runbooks/ApplyUnrecorded.md",
            f.attempt
        );
        return not_applied(
            f,
            ApplyRow::Unrecorded,
            reason::APPLY_UNRECORDED,
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
            if start.is_some()
                && let Some(held) = cannot_start(f)
            {
                return held;
            }
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
        LastApply::PlanBlocked(plan) if same_inputs => {
            if f.approved_plan.as_deref().map(str::trim) == Some(plan.hash.as_str()) {
                if let Some(held) = cannot_start(f) {
                    return held;
                }
                let msg = format!(
                    "apply attempt {next} is starting: plan {} is approved ({})",
                    plan.hash,
                    plan.list(10)
                );
                return not_applied(
                    f,
                    ApplyRow::PlanBlocked,
                    reason::APPLYING,
                    msg,
                    ApplyAction::StartApply { attempt: next },
                );
            }
            let msg = format!(
                "apply attempt {} stopped before changing anything: its plan would {}; to apply it, approve this plan: annotate the object {}={} (a later plan that destroys or replaces anything else needs its own approval), or change the inputs; see runbooks/DestructivePlanBlocked.md",
                f.attempt,
                plan.list(10),
                crate::api::names::APPROVE_PLAN,
                plan.hash
            );
            not_applied(
                f,
                ApplyRow::PlanBlocked,
                reason::DESTRUCTIVE_PLAN_BLOCKED,
                msg,
                ApplyAction::Wait,
            )
        }
        _ => {
            if let Some(held) = cannot_start(f) {
                return held;
            }
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

/// Row A11: an apply is due, and what keeps it from starting, if anything: a state that
/// was lost or cannot be trusted (an apply would make a fresh one and create everything
/// again, or change another state as if it were the object's), an errored state that
/// records what the state does not (an apply would create it again), another holder of
/// Terraform's lock. Nothing when the state was not read: it is, before a start.
fn cannot_start(f: &ApplyFacts) -> Option<ApplyDecision> {
    let (why, msg): (&'static str, String) = match &f.state {
        StateFacts::NotRead | StateFacts::Readable { .. } => (reason::APPLY_CANNOT_START, String::new()),
        StateFacts::Missing if f.state_expected => (
            crate::api::conditions::reason::STATE_LOST,
            "the state Secret is missing although an apply of the object wrote it (its fingerprint is recorded): an apply now would make a fresh state and create everything again; restore the state; see runbooks/StateLost.md".to_string(),
        ),
        StateFacts::Missing => (reason::APPLY_CANNOT_START, String::new()),
        StateFacts::Unreadable { why, message } => {
            let runbook = format!("runbooks/{}.md", why.reason());
            let said = if message.contains(&runbook) {
                message.clone()
            } else {
                format!("{message}; see {runbook}")
            };
            (
                why.reason(),
                format!("no apply starts against a state CAPTF cannot read or trust: {said}"),
            )
        }
    };
    if !msg.is_empty() {
        return Some(not_applied(
            f,
            ApplyRow::CannotStart,
            why,
            msg,
            ApplyAction::Wait,
        ));
    }
    if let Some(what) = &f.errored {
        let msg = format!(
            "{what}; an apply against the state would create them again: merge the errored state into the state with captf state restore --from-errored, or delete it once they are confirmed gone; see runbooks/ErroredState.md"
        );
        return Some(not_applied(
            f,
            ApplyRow::CannotStart,
            reason::ERRORED_STATE,
            msg,
            ApplyAction::Wait,
        ));
    }
    if let Some(holder) = &f.lock_held {
        let msg = format!(
            "Terraform's state lock is held by {holder}, and CAPTF never breaks it; the apply starts once it is free; see runbooks/ApplyCannotStart.md"
        );
        return Some(not_applied(
            f,
            ApplyRow::CannotStart,
            reason::APPLY_CANNOT_START,
            msg,
            ApplyAction::Wait,
        ));
    }
    None
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
