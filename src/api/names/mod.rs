//! Every name that is a contract (SPEC section 2): group, finalizers, annotations, labels,
//! and the derived names of the Secrets, Leases and Jobs that belong to an object.
//! Nothing else in the crate spells these strings.

use sha2::{Digest, Sha256};

mod derived;

pub use derived::{
    LEGACY_ERRORED_KEY, SecretName, SecretRole, abandoned_backup_copy_name, abandoned_copy_name,
    abandoned_inputs_copy_name, backup_secret_name, errored_secret_name, errored_suffix,
    errored_suffix_around_tag, inputs_secret_name, is_errored_suffix_of, job_name, lock_lease_name,
    object_runner_name, parse_secret_name, parse_state_suffix, part_index, part_secret_name,
    short_hash, split_part, state_secret_name, state_suffix,
};

/// The API group of the three kinds.
pub const GROUP: &str = "infrastructure.cluster.x-k8s.io";

/// The served version of the three kinds.
pub const VERSION: &str = "v1alpha1";

/// `apiVersion` of the three kinds.
pub const API_VERSION: &str = "infrastructure.cluster.x-k8s.io/v1alpha1";

/// Prefix `A` of SPEC section 2.
pub const PREFIX: &str = "terraform.infrastructure.cluster.x-k8s.io";

/// Protection finalizer on the inputs, state and backup Secrets.
pub const PROTECT_FINALIZER: &str = "terraform.infrastructure.cluster.x-k8s.io/protect";

pub const ABANDON: &str = "terraform.infrastructure.cluster.x-k8s.io/abandon";

pub const ABANDONED_AT: &str = "terraform.infrastructure.cluster.x-k8s.io/abandoned-at";

pub const APPLIED_AT: &str = "terraform.infrastructure.cluster.x-k8s.io/applied-at";

pub const STATE_LINEAGE: &str = "terraform.infrastructure.cluster.x-k8s.io/state-lineage";

pub const STATE_SERIAL: &str = "terraform.infrastructure.cluster.x-k8s.io/state-serial";

pub const APPLY_INTERRUPTED: &str = "terraform.infrastructure.cluster.x-k8s.io/apply-interrupted";

pub const DESTROY_ATTEMPT: &str = "terraform.infrastructure.cluster.x-k8s.io/destroy-attempt";

pub const DESTROY_FAILED_AT: &str = "terraform.infrastructure.cluster.x-k8s.io/destroy-failed-at";

pub const CLEANUP_STARTED: &str = "terraform.infrastructure.cluster.x-k8s.io/cleanup-started";

/// The uid of the object that wrote the deletion bookkeeping above (destroy-attempt,
/// destroy-failed-at, cleanup-started): bookkeeping under another uid, or none, is an
/// earlier object's (kept in a saved YAML) and is not this object's.
pub const DELETION_UID: &str = "terraform.infrastructure.cluster.x-k8s.io/deletion-uid";

/// Set to the object's uid: destroy although its Cluster API owner is gone (see
/// runbooks/OwnerGone.md).
pub const DESTROY_WITHOUT_OWNER: &str =
    "terraform.infrastructure.cluster.x-k8s.io/destroy-without-owner";

/// On an object abandoned in a terminating namespace: where its kept Secrets were copied
/// (`<manager namespace>/<copy of the state>`), written once the copies read back as their
/// sources and before any protection comes off. A later pass releases on those copies
/// instead of copying from Secrets the namespace may have taken since. Counts only under
/// the object's `deletion-uid`, as the deletion bookkeeping does.
pub const ABANDON_COPIED: &str = "terraform.infrastructure.cluster.x-k8s.io/abandon-copied";

/// On a copy an abandon made: the namespace and name of the Secret it copies.
pub const COPIED_FROM: &str = "terraform.infrastructure.cluster.x-k8s.io/copied-from";

pub const ADOPT: &str = "terraform.infrastructure.cluster.x-k8s.io/adopt";

pub const INPUTS_SHA256: &str = "terraform.infrastructure.cluster.x-k8s.io/inputs-sha256";

/// The number of the latest apply attempt started (write-ahead, as `destroy-attempt`).
pub const APPLY_ATTEMPT: &str = "terraform.infrastructure.cluster.x-k8s.io/apply-attempt";

/// When the latest apply attempt failed; cleared when the next one starts (as
/// `destroy-failed-at`), so that its own failure is recorded again.
pub const APPLY_FAILED_AT: &str = "terraform.infrastructure.cluster.x-k8s.io/apply-failed-at";

/// On the inputs Secret: the apply attempt whose inputs it holds, the latest that wrote
/// the state. An attempt's inputs travel in its own variables Secret (under
/// [`INPUTS_KEY`]) and become the destroy's only once that attempt wrote the state: an
/// apply refused, failed before Terraform touched the state, or never started leaves the
/// destroy the inputs that made the state.
pub const INPUTS_OF_ATTEMPT: &str = "terraform.infrastructure.cluster.x-k8s.io/inputs-of-attempt";

/// On a TerraformCluster: the control-plane endpoint its latest recorded apply was given
/// (`captf_control_plane_endpoint`, `<host>:<port>`), empty when it was given none (its
/// module made the endpoint). Cluster API copies the endpoint the module made into the
/// Cluster: that copy coming back is not a new input (see `contract::values`).
pub const ENDPOINT_GIVEN: &str =
    "terraform.infrastructure.cluster.x-k8s.io/control-plane-endpoint-given";

/// On the object, set by an operator: the runner image a destroy runs, in place of the one
/// the apply ran (recorded by digest). For a registry that no longer serves that digest
/// (a lifecycle rule expired it), where every destroy would otherwise never start.
pub const RUNNER_IMAGE: &str = "terraform.infrastructure.cluster.x-k8s.io/runner-image";

/// On a Cluster API Cluster, set by an operator: dispose of the Cluster after this
/// retention (a duration; empty for the manager's `--disposal-retention`) instead of
/// deleting it now. Removing it before the end takes the disposal back.
pub const DISPOSE_AFTER: &str = "terraform.infrastructure.cluster.x-k8s.io/dispose-after";

/// On a Cluster API Cluster: `"true"` or `"false"`, whether its workload cluster is cleaned
/// up before its infrastructure is destroyed (docs/14-workload-cleanup.md); the manager's
/// `--workload-cleanup` when absent.
pub const WORKLOAD_CLEANUP: &str = "terraform.infrastructure.cluster.x-k8s.io/workload-cleanup";

/// On a Cluster API Cluster, `"true"`: its workload cleanup deletes only Services and
/// PersistentVolumeClaims (what holds load balancers and disks).
pub const WORKLOAD_CLEANUP_SKIP: &str =
    "terraform.infrastructure.cluster.x-k8s.io/workload-cleanup-skip";

/// On a Cluster API Cluster: each cleanup step's finalize period in seconds (`0` removes
/// finalizers at once, without a graceful deletion first).
pub const WORKLOAD_CLEANUP_WEBHOOKS_SECONDS: &str =
    "terraform.infrastructure.cluster.x-k8s.io/workload-cleanup-webhooks-finalize-seconds";

pub const WORKLOAD_CLEANUP_EXTENDED_APIS_SECONDS: &str =
    "terraform.infrastructure.cluster.x-k8s.io/workload-cleanup-extended-apis-finalize-seconds";

pub const WORKLOAD_CLEANUP_RESOURCES_SECONDS: &str =
    "terraform.infrastructure.cluster.x-k8s.io/workload-cleanup-resources-finalize-seconds";

pub const WORKLOAD_CLEANUP_SNAPSHOTS_SECONDS: &str =
    "terraform.infrastructure.cluster.x-k8s.io/workload-cleanup-snapshots-finalize-seconds";

/// A label on an object of a workload cluster, `"true"`: the workload cleanup leaves it
/// alone.
pub const WORKLOAD_CLEANUP_EXCLUDE_LABEL: &str =
    "terraform.infrastructure.cluster.x-k8s.io/workload-cleanup-exclude";

/// On a TerraformCluster: when its Cluster's workload cleanup began (RFC 3339).
pub const WORKLOAD_CLEANUP_STARTED: &str =
    "terraform.infrastructure.cluster.x-k8s.io/workload-cleanup-started";

/// On a TerraformCluster: since when its workload cluster could not be cleaned up (RFC
/// 3339); removed when it can again. The cleanup gives up `--workload-cleanup-give-up-after`
/// on.
pub const WORKLOAD_CLEANUP_FAILING_SINCE: &str =
    "terraform.infrastructure.cluster.x-k8s.io/workload-cleanup-failing-since";

/// On a TerraformCluster: how its workload cleanup ended, `done` or `gave-up`; the
/// Machines' hooks are off from then on.
pub const WORKLOAD_CLEANUP_FINISHED: &str =
    "terraform.infrastructure.cluster.x-k8s.io/workload-cleanup-finished";

pub const WORKLOAD_CLEANUP_DONE: &str = "done";

pub const WORKLOAD_CLEANUP_GAVE_UP: &str = "gave-up";

/// The pre-terminate hook on a Cluster's Machines: Cluster API deletes no infrastructure
/// Machine (control-plane ones included) while it is there, and CAPTF removes it once the
/// workload cleanup finished, or at once from a Machine deleted while its Cluster is not.
pub const WORKLOAD_CLEANUP_HOOK: &str =
    "pre-terminate.delete.hook.machine.cluster.x-k8s.io/captf-workload-cleanup";

/// The hook's value: who owns it, as Cluster API asks.
pub const WORKLOAD_CLEANUP_HOOK_OWNER: &str = "infrastructure-terraform";

/// On a Cluster API Cluster marked for disposal, `"true"`: its modules hibernate while the
/// retention runs (they are given `captf_hibernated = true`).
pub const DISPOSE_HIBERNATE: &str = "terraform.infrastructure.cluster.x-k8s.io/dispose-hibernate";

/// On a Cluster API Cluster marked for disposal: the final deletion waits while it is
/// there (a recovery); its value says why.
pub const DISPOSAL_HOLD: &str = "terraform.infrastructure.cluster.x-k8s.io/disposal-hold";

/// On the TerraformCluster: when its Cluster's disposal mark was first seen (RFC 3339).
pub const DISPOSAL_REQUESTED_AT: &str =
    "terraform.infrastructure.cluster.x-k8s.io/disposal-requested-at";

/// On the object, set by an operator: the hash of a plan that destroys or replaces
/// resources, approved to be applied (the plan guard, `docs/10-before-a-deletion.md`). A
/// later plan with another list of destroyed or replaced resources has another hash.
pub const APPROVE_PLAN: &str = "terraform.infrastructure.cluster.x-k8s.io/approve-plan";

/// On the object (or its template), `allow`: its re-applies are not guarded; a plan that
/// destroys or replaces resources is applied like any other.
pub const DESTRUCTIVE_PLANS: &str = "terraform.infrastructure.cluster.x-k8s.io/destructive-plans";

/// The value of [`DESTRUCTIVE_PLANS`] that turns the guard off.
pub const DESTRUCTIVE_PLANS_ALLOW: &str = "allow";

/// The value of [`DESTRUCTIVE_PLANS`] that turns the guard on for a TerraformMachinePool
/// (off by default for pools: their re-applies are bootstrap token rotations).
pub const DESTRUCTIVE_PLANS_GUARD: &str = "guard";

/// How many apply attempts in a row failed (the retry schedule's count).
pub const APPLY_FAILURES: &str = "terraform.infrastructure.cluster.x-k8s.io/apply-failures";

/// The latest apply attempt that succeeded, written with its state's fingerprint once the
/// state was read after it. Its presence means the object is provisioned: after
/// `clusterctl move`, which drops the status, `initialization.provisioned` is rebuilt
/// from it without a Job.
pub const APPLIED_ATTEMPT: &str = "terraform.infrastructure.cluster.x-k8s.io/applied-attempt";

/// An apply attempt that succeeded but whose outputs break the module contract:
/// `<attempt>: <what is wrong>`. Its success is recorded (the state's fingerprint) without
/// `applied-attempt`, and it goes with the next success whose outputs are valid.
pub const OUTPUTS_INVALID: &str = "terraform.infrastructure.cluster.x-k8s.io/outputs-invalid";

/// An apply attempt whose outputs gave a set-once spec field (`controlPlaneEndpoint`,
/// `providerID`) another value than the one it has: `<attempt>: <each field refused>`.
/// The field is kept; this goes with the next success that refuses nothing.
pub const OUTPUTS_REFUSED: &str = "terraform.infrastructure.cluster.x-k8s.io/outputs-refused";

/// Whether the success of apply attempt `n` is recorded on an object with these
/// annotations: `applied-attempt` is `n`, or `outputs-invalid` names attempt `n`.
pub fn apply_success_recorded(
    annotations: Option<&std::collections::BTreeMap<String, String>>,
    n: u32,
) -> bool {
    let get = |k: &str| annotations.and_then(|a| a.get(k)).map(|v| v.trim());
    let n = n.to_string();
    get(APPLIED_ATTEMPT) == Some(n.as_str())
        || get(OUTPUTS_INVALID)
            .and_then(|v| v.split_once(':'))
            .is_some_and(|(a, _)| a.trim() == n)
}

/// Values of [`CLEANUP_STARTED`].
pub const CLEANUP_DESTROYED: &str = "destroyed";

pub const CLEANUP_ABANDONED: &str = "abandoned";

/// Labels on Jobs, their Pod templates, and the Secrets CAPTF writes.
pub const LABEL_OWNER_KIND: &str = "terraform.infrastructure.cluster.x-k8s.io/owner-kind";

pub const LABEL_OWNER_NAME: &str = "terraform.infrastructure.cluster.x-k8s.io/owner-name";

pub const LABEL_OWNER_UID: &str = "terraform.infrastructure.cluster.x-k8s.io/owner-uid";

pub const LABEL_OPERATION: &str = "terraform.infrastructure.cluster.x-k8s.io/operation";

/// On a copy an abandon made in the manager's namespace: the object's namespace.
pub const LABEL_SOURCE_NAMESPACE: &str =
    "terraform.infrastructure.cluster.x-k8s.io/source-namespace";

/// On a Secret holding a state Terraform could not save (`errored.tfstate`): a record of
/// resources that may be in no state, which cleanup never deletes.
pub const LABEL_ERRORED_STATE: &str = "terraform.infrastructure.cluster.x-k8s.io/errored-state";

pub const LABEL_ATTEMPT: &str = "terraform.infrastructure.cluster.x-k8s.io/attempt";

pub const OPERATION_APPLY: &str = "apply";

pub const OPERATION_DESTROY: &str = "destroy";

/// Cluster API names.
pub const CAPI_GROUP: &str = "cluster.x-k8s.io";

pub const CAPI_PAUSED: &str = "cluster.x-k8s.io/paused";

/// On an InfraCluster: its infrastructure is managed by someone else (CAPI contract).
pub const CAPI_MANAGED_BY: &str = "cluster.x-k8s.io/managed-by";

pub const CAPI_CLUSTER_NAME_LABEL: &str = "cluster.x-k8s.io/cluster-name";

pub const CAPI_WATCH_FILTER_LABEL: &str = "cluster.x-k8s.io/watch-filter";

pub const CAPI_CONTRACT_LABEL: &str = "cluster.x-k8s.io/v1beta2";

pub const CAPI_CONTRACT_VERSION: &str = "v1alpha1";

pub const CLUSTERCTL_DELETE_FOR_MOVE: &str = "clusterctl.cluster.x-k8s.io/delete-for-move";

pub const CLUSTERCTL_BLOCK_MOVE: &str = "clusterctl.cluster.x-k8s.io/block-move";

pub const CLUSTERCTL_MOVE_LABEL: &str = "clusterctl.cluster.x-k8s.io/move";

/// Terraform's kubernetes backend (workspace `default`).
pub const TF_WORKSPACE: &str = "default";

pub const TF_STATE_KEY: &str = "tfstate";

pub const TF_LABEL_STATE: &str = "tfstate";

pub const TF_LABEL_SUFFIX: &str = "tfstateSecretSuffix";

pub const TF_LABEL_WORKSPACE: &str = "tfstateWorkspace";

pub const TF_LABEL_MANAGED_BY: &str = "app.kubernetes.io/managed-by";

/// Terraform cuts a state whose gzip exceeds this many bytes into part Secrets.
pub const TF_CHUNK_SIZE: usize = 1_048_576;

/// Annotation on Terraform's lock Lease with the lock's JSON.
pub const TF_LOCK_INFO: &str = "app.terraform.io/lock-info";

/// The key of the inputs Secret.
pub const INPUTS_KEY: &str = "inputs.json";

/// The runner's ServiceAccount, Role and RoleBinding name, one per namespace.
pub const RUNNER_NAME: &str = "captf-runner";

const LABEL_VALUE_MAX: usize = 63;

const CUT_LEN: usize = 49;

/// The three kinds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Kind {
    TerraformCluster,
    TerraformMachine,
    TerraformMachinePool,
}

impl Kind {
    pub const ALL: [Kind; 3] = [
        Kind::TerraformCluster,
        Kind::TerraformMachine,
        Kind::TerraformMachinePool,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Kind::TerraformCluster => "TerraformCluster",
            Kind::TerraformMachine => "TerraformMachine",
            Kind::TerraformMachinePool => "TerraformMachinePool",
        }
    }

    pub fn short_name(self) -> &'static str {
        match self {
            Kind::TerraformCluster => "tfc",
            Kind::TerraformMachine => "tfm",
            Kind::TerraformMachinePool => "tfmp",
        }
    }

    pub fn plural(self) -> &'static str {
        match self {
            Kind::TerraformCluster => "terraformclusters",
            Kind::TerraformMachine => "terraformmachines",
            Kind::TerraformMachinePool => "terraformmachinepools",
        }
    }

    /// The object finalizer, e.g. `terraformmachine.infrastructure.cluster.x-k8s.io`.
    pub fn finalizer(self) -> &'static str {
        match self {
            Kind::TerraformCluster => "terraformcluster.infrastructure.cluster.x-k8s.io",
            Kind::TerraformMachine => "terraformmachine.infrastructure.cluster.x-k8s.io",
            Kind::TerraformMachinePool => "terraformmachinepool.infrastructure.cluster.x-k8s.io",
        }
    }

    /// The CRD name, `<plural>.<group>`.
    pub fn crd_name(self) -> String {
        format!("{}.{GROUP}", self.plural())
    }

    /// Parses a kind as a person or a file writes it: the kind, its plural or singular
    /// resource name, or its short name, case-insensitively.
    pub fn parse(text: &str) -> Option<Kind> {
        let lower = text.to_ascii_lowercase();
        let lower = lower.split('.').next().unwrap_or_default();
        Kind::ALL.into_iter().find(|k| {
            lower == k.as_str().to_ascii_lowercase()
                || lower == k.plural()
                || lower == k.short_name()
        })
    }
}

impl std::fmt::Display for Kind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The three template kinds (Cluster API's InfraClusterTemplate, InfraMachineTemplate
/// and InfraMachinePoolTemplate). They own no infrastructure: the manager neither
/// watches nor reconciles them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum TemplateKind {
    TerraformClusterTemplate,
    TerraformMachineTemplate,
    TerraformMachinePoolTemplate,
}

impl TemplateKind {
    pub const ALL: [TemplateKind; 3] = [
        TemplateKind::TerraformClusterTemplate,
        TemplateKind::TerraformMachineTemplate,
        TemplateKind::TerraformMachinePoolTemplate,
    ];

    /// The kind of the objects Cluster API makes from this template.
    pub fn object_kind(self) -> Kind {
        match self {
            TemplateKind::TerraformClusterTemplate => Kind::TerraformCluster,
            TemplateKind::TerraformMachineTemplate => Kind::TerraformMachine,
            TemplateKind::TerraformMachinePoolTemplate => Kind::TerraformMachinePool,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            TemplateKind::TerraformClusterTemplate => "TerraformClusterTemplate",
            TemplateKind::TerraformMachineTemplate => "TerraformMachineTemplate",
            TemplateKind::TerraformMachinePoolTemplate => "TerraformMachinePoolTemplate",
        }
    }

    /// The object kind's short name followed by `t`: `tfct`, `tfmt`, `tfmpt`.
    pub fn short_name(self) -> &'static str {
        match self {
            TemplateKind::TerraformClusterTemplate => "tfct",
            TemplateKind::TerraformMachineTemplate => "tfmt",
            TemplateKind::TerraformMachinePoolTemplate => "tfmpt",
        }
    }

    pub fn plural(self) -> &'static str {
        match self {
            TemplateKind::TerraformClusterTemplate => "terraformclustertemplates",
            TemplateKind::TerraformMachineTemplate => "terraformmachinetemplates",
            TemplateKind::TerraformMachinePoolTemplate => "terraformmachinepooltemplates",
        }
    }

    /// The CRD name, `<plural>.<group>`.
    pub fn crd_name(self) -> String {
        format!("{}.{GROUP}", self.plural())
    }
}

impl std::fmt::Display for TemplateKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The annotation Cluster API's topology controller puts on an object in its server-side
/// apply dry-runs (`util/topology`): admission checks of immutability let those through,
/// or every change of a ClusterClass would stop at `TopologyReconciled=False`.
pub const CAPI_TOPOLOGY_DRY_RUN: &str = "topology.cluster.x-k8s.io/dry-run";

/// The label clusterctl and Cluster API's conventions put on every object of a provider's
/// components.
pub const CAPI_PROVIDER_LABEL: &str = "cluster.x-k8s.io/provider";

/// CAPTF's provider name for clusterctl (`<type>-<name>`: infrastructure provider
/// `terraform`).
pub const CAPI_PROVIDER_NAME: &str = "infrastructure-terraform";

#[cfg(test)]
mod tests;
