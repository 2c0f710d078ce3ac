//! The apply table's facts: what a pass on a live object knows when it decides.

use super::*;

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
    pub(super) fn reason(&self) -> &'static str {
        match self {
            Prerequisite::ClusterInfrastructure { .. } => {
                reason::WAITING_FOR_CLUSTER_INFRASTRUCTURE
            }
            Prerequisite::ControlPlaneInitialized { .. } => reason::WAITING_FOR_CONTROL_PLANE,
            Prerequisite::BootstrapData { .. } => reason::WAITING_FOR_BOOTSTRAP_DATA,
            Prerequisite::ClusterOutputs { .. } => reason::WAITING_FOR_CLUSTER_OUTPUTS,
        }
    }

    pub(super) fn describe(&self) -> String {
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
