//! The facts of a pass on a live object, for the apply table (`rules::apply`). Pure:
//! everything comes from the [`Observed`] of the pass (the spec's inputs are built from the
//! ConfigMaps and Secrets it read, as the deletion rebuilds them) and what a live object's
//! pass reads beside it ([`ApplyObserved`]).

use k8s_openapi::api::batch::v1::Job;
use kube::api::ObjectMeta;

use super::blockers::{missing_credentials, spec_inputs};
use super::jobs::{attempt_job, pause_cause, unfinished};
use super::meta::annotation;
use super::{Findings, Observed, Settings};
use crate::api::names::{self, Kind};
use crate::inputs::Inputs;
use crate::job::{self, JobOutcome};
use crate::rules::StateFacts;
use crate::rules::apply::{ApplyFacts, LastApply, Prerequisite};
use crate::state::lock::{self, Lock};

/// What a pass on a live object reads beside the [`Observed`] of the deletion.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ApplyObserved {
    /// `status.initialization.provisioned`, as latched.
    pub provisioned: bool,
    /// A base state Secret of the object's suffix exists.
    pub state_exists: bool,
    /// The first of the kind's own gates not met.
    pub prerequisite: Option<Prerequisite>,
    /// The module contract's variables for the object (`contract::values`), or why they
    /// cannot be built now.
    pub contract: Result<serde_json::Map<String, serde_json::Value>, String>,
}

/// The owner Cluster API sets on an infrastructure object once its own object names it:
/// the Cluster of a TerraformCluster, the controlling Machine of a TerraformMachine (a
/// MachineSet's or control plane's reference comes first and does not count), the
/// MachinePool of a TerraformMachinePool.
pub fn capi_owner(kind: Kind, meta: &ObjectMeta) -> Option<String> {
    let owner_kind = owner_kind(kind).unwrap_or("Cluster");
    let controller_only = kind == Kind::TerraformMachine;
    meta.owner_references
        .iter()
        .flatten()
        .find(|r| {
            r.kind == owner_kind
                && r.api_version.split('/').next() == Some(names::CAPI_GROUP)
                && (!controller_only || r.controller == Some(true))
        })
        .map(|r| r.name.clone())
}

/// The Cluster API kind that owns a machine (`Machine`) or a pool (`MachinePool`); none
/// for a TerraformCluster.
pub fn owner_kind(kind: Kind) -> Option<&'static str> {
    match kind {
        Kind::TerraformCluster => None,
        Kind::TerraformMachine => Some("Machine"),
        Kind::TerraformMachinePool => Some("MachinePool"),
    }
}

/// Where a machine's or pool's owner names its bootstrap data Secret.
fn bootstrap_path(kind: Kind) -> &'static str {
    match kind {
        Kind::TerraformMachinePool => "spec.template.spec.bootstrap.dataSecretName",
        _ => "spec.bootstrap.dataSecretName",
    }
}

/// The bootstrap data Secret a machine's or pool's `owner` names, if it names one.
pub fn bootstrap_secret_name(kind: Kind, owner: &serde_json::Value) -> Option<&str> {
    let at = bootstrap_path(kind)
        .split('.')
        .fold(owner, |v, field| &v[field]);
    at.as_str().filter(|n| !n.is_empty())
}

/// The number of the latest apply attempt, and how it ended: from its Job while the Job
/// is there, else from the bookkeeping on the object.
fn apply_history(o: &Observed) -> (u32, LastApply) {
    let attempt: u32 = annotation(&o.meta, names::APPLY_ATTEMPT)
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0);
    if attempt == 0 {
        return (0, LastApply::None);
    }
    let failures = annotation(&o.meta, names::APPLY_FAILURES)
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0u32);
    let failed_at = annotation(&o.meta, names::APPLY_FAILED_AT).and_then(|v| v.parse().ok());
    let suffix = names::state_suffix(o.kind, o.meta.name.as_deref().unwrap_or_default());
    let job = attempt_job(o, &suffix, names::OPERATION_APPLY, attempt);
    let last = match job.map(|j| (j, job::outcome(j, &o.pods))) {
        Some((_, JobOutcome::Succeeded)) => LastApply::Succeeded,
        Some((
            j,
            JobOutcome::Failed {
                reason, error_tail, ..
            },
        )) => match error_tail.as_deref().and_then(job::DestructivePlan::of) {
            // The plan guard stopped it: nothing was changed, and nothing is retried
            // until its plan is approved or the inputs change.
            Some(plan) => LastApply::PlanBlocked(plan),
            None => LastApply::Failed {
                // Counted once the failure is recorded; until then it is one more.
                failures: if failed_at.is_some() {
                    failures.max(1)
                } else {
                    failures + 1
                },
                at: failed_at.or_else(|| job::finished_at(j)).unwrap_or(o.now),
                message: job::failure_message(&reason, error_tail.as_deref(), j, &o.pods),
            },
        },
        // Row A5 waits for it.
        Some((_, JobOutcome::Unfinished { .. })) => LastApply::None,
        None => match failed_at {
            Some(at) => LastApply::Failed {
                failures: failures.max(1),
                at,
                message: format!(
                    "its Job {} is gone; see the object's Events",
                    names::job_name(&suffix, names::OPERATION_APPLY, attempt)
                ),
            },
            // Its success was recorded (with the state's fingerprint) before the Job went.
            None if names::apply_success_recorded(o.meta.annotations.as_ref(), attempt) => {
                LastApply::Succeeded
            }
            // Never made (a crash after the write-ahead, a Job the API server refused), or
            // deleted while it ran: the attempt ended without a result, and it starts
            // again under its own number (the table starts the one after the latest it is
            // given), rather than a new number on every pass while a refusal lasts.
            None => return (attempt - 1, LastApply::None),
        },
    };
    (attempt, last)
}

/// The first of a machine's or pool's own gates not met before its first apply: the
/// Cluster's infrastructure, then (for a worker) the control plane, then the bootstrap
/// data its owner names. `owner` is the owning Machine or MachinePool as read; a
/// TerraformCluster has none of these gates.
pub fn prerequisite(
    o: &Observed,
    owner: Option<&serde_json::Value>,
    bootstrap: Option<&k8s_openapi::api::core::v1::Secret>,
) -> Option<Prerequisite> {
    if o.kind == Kind::TerraformCluster {
        return None;
    }
    let cluster = super::owning_cluster(&o.meta).unwrap_or_default();
    match &o.cluster {
        Some(c) if c.infrastructure_provisioned => {}
        _ => return Some(Prerequisite::ClusterInfrastructure { cluster }),
    }
    let owner = owner?;
    let owner_kind = owner_kind(o.kind).unwrap_or_default();
    let data_secret = bootstrap_secret_name(o.kind, owner);
    let name = owner["metadata"]["name"].as_str().unwrap_or_default();
    let path = bootstrap_path(o.kind);
    if let Some(secret) = data_secret {
        let has_value = bootstrap
            .and_then(|s| s.data.as_ref())
            .and_then(|d| d.get("value"))
            .is_some_and(|v| !v.0.is_empty());
        return match (bootstrap, has_value) {
            (_, true) => None,
            (None, _) => Some(Prerequisite::BootstrapData {
                detail: format!(
                    "Secret {secret}, which {owner_kind} {name}'s {path} names, does not exist yet"
                ),
            }),
            (Some(_), false) => Some(Prerequisite::BootstrapData {
                detail: format!("Secret {secret} of {owner_kind} {name} has no key value yet"),
            }),
        };
    }
    let control_plane = owner["metadata"]["labels"]
        .get("cluster.x-k8s.io/control-plane")
        .is_some();
    let initialized = o
        .cluster
        .as_ref()
        .is_some_and(|c| c.control_plane_initialized);
    if !control_plane && !initialized {
        return Some(Prerequisite::ControlPlaneInitialized { cluster });
    }
    Some(Prerequisite::BootstrapData {
        detail: format!("{owner_kind} {name} has no {path} yet"),
    })
}

/// The latest apply attempt whose end is not recorded yet: its number, its Job (none
/// when the Job was deleted before a pass saw it end, and its Pod is what is left), and
/// how it ended. A success is recorded with `applied-attempt` once the state is read, a
/// failure with `apply-failed-at`.
#[derive(Clone, Debug, PartialEq)]
pub struct UnrecordedApply<'a> {
    pub attempt: u32,
    pub job: Option<&'a Job>,
    pub outcome: JobOutcome,
}

impl UnrecordedApply<'_> {
    pub fn succeeded(&self) -> bool {
        self.outcome == JobOutcome::Succeeded
    }
}

/// See [`UnrecordedApply`].
pub fn unrecorded_apply(o: &Observed) -> Option<UnrecordedApply<'_>> {
    let n: u32 = annotation(&o.meta, names::APPLY_ATTEMPT)?
        .trim()
        .parse()
        .ok()?;
    let success_recorded = names::apply_success_recorded(o.meta.annotations.as_ref(), n);
    let failure_recorded = annotation(&o.meta, names::APPLY_FAILED_AT).is_some();
    let suffix = names::state_suffix(o.kind, o.meta.name.as_deref().unwrap_or_default());
    let (job, outcome) = match attempt_job(o, &suffix, names::OPERATION_APPLY, n) {
        Some(j) => (Some(j), job::outcome(j, &o.pods)),
        // Its Job gone unseen (a cleanup policy, a hand): what its Pod left says how it
        // ended; with neither, nothing is known (it may never have been made).
        None => {
            let pod = o.pods.iter().find(|p| {
                let l = p.metadata.labels.as_ref();
                l.and_then(|l| l.get(names::LABEL_OPERATION))
                    .map(String::as_str)
                    == Some(names::OPERATION_APPLY)
                    && l.and_then(|l| l.get(names::LABEL_ATTEMPT)) == Some(&n.to_string())
            })?;
            (None, job::pod_outcome(pod)?)
        }
    };
    let unrecorded = match &outcome {
        JobOutcome::Succeeded => !success_recorded,
        JobOutcome::Failed { .. } => !failure_recorded && !success_recorded,
        JobOutcome::Unfinished { .. } => false,
    };
    unrecorded.then_some(UnrecordedApply {
        attempt: n,
        job,
        outcome,
    })
}

/// The Pod of a successful apply whose run is recorded with its inputs (what it ran: see
/// [`crate::inputs::Ran`]), and the image digest its runner container names.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ApplyRan {
    pub pod: String,
    pub image_digest: Option<String>,
}

/// The Pod of successful apply attempt `n`, whose report of what it ran is recorded with
/// its inputs, and the image digest its runner container names; none when its Pod is gone.
pub fn apply_ran(o: &Observed, n: u32) -> Option<ApplyRan> {
    let attempt = n.to_string();
    let pod = o.pods.iter().find(|p| {
        let l = p.metadata.labels.as_ref();
        l.and_then(|l| l.get(names::LABEL_OPERATION))
            .map(String::as_str)
            == Some(names::OPERATION_APPLY)
            && l.and_then(|l| l.get(names::LABEL_ATTEMPT)) == Some(&attempt)
            && p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Succeeded")
    })?;
    let image_digest = pod
        .status
        .iter()
        .flat_map(|s| s.container_statuses.iter().flatten())
        .filter(|c| c.name == crate::job::layout::CONTAINER_NAME)
        .find_map(|c| crate::inputs::image_digest_of(&c.image_id));
    Some(ApplyRan {
        pod: pod.metadata.name.clone()?,
        image_digest,
    })
}

/// What the apply table's observation is built from, as a pass (or `captf explain`) read
/// it: see [`apply_observed`].
#[derive(Clone, Debug, Default)]
pub struct ApplySources {
    /// `status.initialization.provisioned` as on the object.
    pub latched: bool,
    /// A base state Secret of the object's suffix exists.
    pub state_exists: bool,
    /// The owning Cluster, as read (any version).
    pub cluster: Option<serde_json::Value>,
    /// A machine's or pool's owning Machine or MachinePool, as read.
    pub owner: Option<serde_json::Value>,
    /// The bootstrap data Secret the owner names, as read.
    pub bootstrap: Option<k8s_openapi::api::core::v1::Secret>,
    /// The `machine_inputs` of the TerraformCluster the Cluster names (`Ok(None)`: its
    /// infrastructure is not a TerraformCluster), or why it cannot be read; `None` when
    /// not read (see [`needs_handoff`]).
    pub handoff: Option<Result<Option<serde_json::Value>, String>>,
    /// The contract's values a provisioned machine's inputs Secret records (it keeps
    /// them: see [`keeps_recorded_values`]).
    pub recorded: Option<serde_json::Map<String, serde_json::Value>>,
}

/// Whether a pass takes a machine's contract values from its inputs Secret rather than
/// from Cluster API's objects: a provisioned machine keeps the values it was applied with
/// (Cluster API replaces a Machine rather than changing it, and a new hand-off from its
/// cluster re-applies pools, not machines).
pub fn keeps_recorded_values(kind: Kind, provisioned: bool) -> bool {
    provisioned && kind == Kind::TerraformMachine
}

/// The contract's values an inputs Secret records (none when it records none: an apply
/// made by hand, or before the contract).
pub fn recorded_values(
    secret: &k8s_openapi::api::core::v1::Secret,
    namespace: &str,
    suffix: &str,
) -> Option<serde_json::Map<String, serde_json::Value>> {
    crate::inputs::from_secret(secret, namespace, suffix)
        .ok()
        .map(|i| i.contract_variables)
        .filter(|c| !c.is_empty())
}

/// The TerraformCluster whose `machine_inputs` the machines and pools of `cluster` are
/// given, and the name of its base state Secret; none when the Cluster's infrastructure
/// is not a TerraformCluster.
pub fn handoff_state(cluster: Option<&serde_json::Value>) -> Option<(&str, String)> {
    let name = cluster.and_then(crate::contract::values::handoff_source)?;
    let base = names::state_secret_name(&names::state_suffix(Kind::TerraformCluster, name));
    Some((name, base))
}

/// Why the hand-off of TerraformCluster `name` cannot be read yet: it has no state.
pub fn no_handoff_state(name: &str, base: &str) -> String {
    format!("TerraformCluster {name} has no state Secret {base} yet")
}

/// Whether the hand-off of TerraformCluster `name` (state Secret `base`) can be read, from
/// whether its state Secret exists and whether the TerraformCluster is provisioned (none:
/// it does not exist). A state alone is not enough: Terraform writes it when its first
/// apply begins (the kubernetes backend makes the Secret at `init`), before any output
/// is in it, and a machine given that would be applied with a null hand-off for good.
pub fn handoff_readable(
    name: &str,
    base: &str,
    state_exists: bool,
    cluster_provisioned: Option<bool>,
) -> Result<(), String> {
    match (state_exists, cluster_provisioned) {
        (false, _) => Err(no_handoff_state(name, base)),
        (true, None) => Err(format!(
            "TerraformCluster {name} does not exist (its state Secret {base} does)"
        )),
        (true, Some(false)) => Err(format!(
            "TerraformCluster {name} has not finished its first apply yet (its outputs are not in its state before it has)"
        )),
        (true, Some(true)) => Ok(()),
    }
}

/// Whether a CAPTF object is provisioned: its status says so, or a success is recorded.
pub fn object_provisioned<K: crate::api::TerraformObject>(obj: &K) -> bool {
    let latched = obj
        .status()
        .and_then(|s| s.initialization.as_ref())
        .and_then(|i| i.provisioned)
        == Some(true);
    provisioned(obj.meta(), latched)
}

/// The `machine_inputs` output in TerraformCluster `name`'s state (null when it has
/// none), or why its outputs cannot be read.
pub fn handoff_of(
    name: &str,
    state: &crate::state::StateSecrets,
) -> Result<serde_json::Value, String> {
    crate::state::outputs(state, crate::state::DEFAULT_DECOMPRESSION_CAP)
        .map(|o| {
            o.get(crate::contract::HANDOFF_OUTPUT)
                .cloned()
                .unwrap_or_default()
        })
        .map_err(|why| format!("the outputs of TerraformCluster {name} cannot be read: {why}"))
}

/// Whether a pass needs the TerraformCluster's hand-off: a machine or pool whose gates
/// before it are met (or that is provisioned, whose inputs carry it).
pub fn needs_handoff(
    o: &Observed,
    provisioned: bool,
    owner: Option<&serde_json::Value>,
    bootstrap: Option<&k8s_openapi::api::core::v1::Secret>,
) -> bool {
    o.kind != Kind::TerraformCluster && (provisioned || prerequisite(o, owner, bootstrap).is_none())
}

/// The apply table's observation of `o` from what was read (one function for the
/// controllers and `captf explain`): provisioned (latched, or an apply's success
/// recorded), the first gate not met (until provisioned; the hand-off last), and the
/// contract's values (recorded ones for a provisioned machine).
pub fn apply_observed(o: &Observed, s: &ApplySources) -> ApplyObserved {
    let provisioned = provisioned(&o.meta, s.latched);
    if let Some(mut values) = s
        .recorded
        .clone()
        .filter(|_| keeps_recorded_values(o.kind, provisioned))
    {
        hibernation(&mut values, o);
        return ApplyObserved {
            provisioned,
            state_exists: s.state_exists,
            prerequisite: None,
            contract: Ok(values),
        };
    }
    let handoff = s.handoff.clone().unwrap_or(Ok(None));
    let prerequisite = if provisioned {
        None
    } else {
        prerequisite(o, s.owner.as_ref(), s.bootstrap.as_ref()).or_else(|| {
            handoff
                .as_ref()
                .err()
                .map(|detail| Prerequisite::ClusterOutputs {
                    detail: detail.clone(),
                })
        })
    };
    let contract = handoff
        .and_then(|h| contract_values(o, s, h.as_ref()))
        .map(|mut values| {
            hibernation(&mut values, o);
            values
        });
    ApplyObserved {
        provisioned,
        state_exists: s.state_exists,
        prerequisite,
        contract,
    }
}

/// Whether the object's Cluster asks its modules to hibernate: it is marked for disposal
/// with a retention that reads, with `dispose-hibernate: "true"`, and is not being
/// deleted (a deletion wins, and applies nothing).
pub fn hibernation_asked(o: &Observed) -> bool {
    o.cluster.as_ref().is_some_and(|c| {
        c.dispose_hibernate
            && !c.deleting
            && c.dispose_after.as_deref().is_some_and(|m| {
                crate::rules::disposal::retention(m, std::time::Duration::ZERO).is_ok()
            })
    })
}

/// Whether the object's module declares `captf_hibernated`: known for a module given as
/// files, not for one given as a source address or an image's directory.
pub fn declares_hibernated(o: &Observed) -> Option<bool> {
    let files = o.spec.module.files.as_ref()?;
    Some(
        files
            .iter()
            .filter(|(name, _)| name.ends_with(".tf"))
            .any(|(_, text)| {
                crate::contract::hcl::parse(text).is_ok_and(|blocks| {
                    blocks.iter().any(|b| {
                        b.kind == "variable"
                            && b.labels.first().map(String::as_str)
                                == Some(crate::contract::HIBERNATED)
                    })
                })
            }),
    )
}

/// The `Hibernated` condition of a live object, from its observation and the apply
/// table's decision on it; `shown_before`: the object shows the condition already.
pub fn hibernation_condition(
    o: &Observed,
    apply: &crate::rules::apply::ApplyDecision,
    shown_before: bool,
) -> Option<crate::api::conditions::Desired> {
    let inputs_applied = apply
        .conditions
        .iter()
        .find(|c| c.type_ == crate::rules::apply::INPUTS_APPLIED);
    crate::rules::disposal::hibernation(
        hibernation_asked(o),
        declares_hibernated(o),
        inputs_applied.is_some_and(|c| c.status == crate::api::conditions::Status::True),
        inputs_applied.map(|c| c.reason).unwrap_or_default(),
        shown_before,
    )
}

/// `captf_hibernated` in the contract's values: true while hibernation is asked, unless
/// the module is known not to declare it (it would re-apply for nothing); absent
/// otherwise, so that the values are what they were before.
fn hibernation(values: &mut serde_json::Map<String, serde_json::Value>, o: &Observed) {
    values.remove(crate::contract::HIBERNATED);
    if hibernation_asked(o) && declares_hibernated(o) != Some(false) {
        values.insert(
            crate::contract::HIBERNATED.to_string(),
            serde_json::Value::Bool(true),
        );
    }
}

/// The module contract's variables for the object, or why they cannot be built: a
/// machine or pool without its bootstrap data (its gate keeps a first apply from
/// starting; a provisioned pool keeps what it applied rather than re-apply without it).
fn contract_values(
    o: &Observed,
    s: &ApplySources,
    cluster_outputs: Option<&serde_json::Value>,
) -> Result<serde_json::Map<String, serde_json::Value>, String> {
    use crate::contract::Role;
    use crate::contract::values::{Sources, values};
    let role = Role::from(o.kind);
    let data = s.bootstrap.as_ref().and_then(|b| b.data.as_ref());
    let value = data.and_then(|d| d.get("value")).map(|v| v.0.as_slice());
    let format = data
        .and_then(|d| d.get("format"))
        .and_then(|v| std::str::from_utf8(&v.0).ok());
    if role != Role::Cluster && value.is_none() {
        return Err(match &s.owner {
            None => "the owning Machine or MachinePool cannot be read".to_string(),
            Some(_) => "the bootstrap data Secret or its key value is missing".to_string(),
        });
    }
    let cluster_name = super::owning_cluster(&o.meta).unwrap_or_default();
    Ok(values(&Sources {
        role,
        namespace: o.meta.namespace.as_deref().unwrap_or_default(),
        object_name: o.meta.name.as_deref().unwrap_or_default(),
        object_kind: o.kind.as_str(),
        cluster_name: &cluster_name,
        cluster: s.cluster.as_ref(),
        owner: s.owner.as_ref(),
        bootstrap: value.map(|v| (v, format)),
        cluster_outputs,
        own_endpoint: o
            .control_plane_endpoint
            .as_ref()
            .map(|e| (e.host.as_str(), i64::from(e.port))),
        // Empty: none was given (an older CAPTF recorded nothing: unknown).
        endpoint_given_before: annotation(&o.meta, names::ENDPOINT_GIVEN).map(|v| !v.is_empty()),
    }))
}

/// Whether the object is provisioned: `status.initialization.provisioned` as latched, or
/// an apply's success recorded on the object (what survives a move).
pub fn provisioned(meta: &ObjectMeta, latched: bool) -> bool {
    latched || annotation(meta, names::APPLIED_ATTEMPT).is_some()
}

/// The inputs the spec builds to, or why it does not (naming the object, the Secret or
/// ConfigMap and the key).
pub fn spec_inputs_of(
    o: &Observed,
    contract: &Result<serde_json::Map<String, serde_json::Value>, String>,
) -> Result<Inputs, String> {
    let name = o.meta.name.as_deref().unwrap_or_default();
    let namespace = o.meta.namespace.as_deref().unwrap_or_default();
    let suffix = names::state_suffix(o.kind, name);
    let what = format!("{} {namespace}/{name}", o.kind.as_str());
    let mut inputs = spec_inputs(o, namespace, &suffix).map_err(|e| format!("{what}: {e}"))?;
    inputs.contract_variables = contract
        .clone()
        .map_err(|e| format!("{what}: the module contract's variables: {e}"))?;
    if let Some((secret, key)) = missing_credentials(o, &inputs) {
        return Err(format!(
            "{what}: the credentials Secret {secret} or its key {key} (spec.env) is missing"
        ));
    }
    Ok(inputs)
}

/// The SHA-256 of the inputs the spec builds to, or why it does not (naming the object,
/// the Secret or ConfigMap and the key).
fn inputs_sha(o: &Observed, a: &ApplyObserved) -> Result<String, String> {
    spec_inputs_of(o, &a.contract).map(|i| i.sha256())
}

/// What a pass read of the state, in the apply table's terms: `NotRead` (and nothing
/// else) when it did not read it.
#[derive(Clone, Debug, Default)]
pub struct ApplyStateSeen {
    pub state: StateFacts,
    /// Why the state cannot be recorded (the verdict's message), when it is not readable.
    pub not_recordable: Option<String>,
    pub errored: Option<String>,
    pub lock_held: Option<String>,
    /// Terraform's lock is held by a runner of the object that is gone: cleared before
    /// the attempt, as a destroy clears it.
    pub stale_lock: bool,
}

/// The state an apply that ended left, as its record reads it: the pass's read of the
/// state, classified as if no apply had been interrupted, since this one wrote the state
/// after any that was (`NotRead` when the pass did not read it).
pub fn state_left_by_apply(o: &Observed, settings: &Settings) -> StateFacts {
    if o.state.is_none() {
        return StateFacts::NotRead;
    }
    let adopt = annotation(&o.meta, names::ADOPT) == Some("true");
    let own_lineage = annotation(&o.meta, names::STATE_LINEAGE).is_some();
    let applied = annotation(&o.meta, names::APPLIED_AT).is_some() || adopt;
    super::tfstate::state_of_after(
        o,
        settings,
        applied,
        own_lineage,
        false,
        &mut Findings::default(),
    )
}

/// The fingerprint of the state an apply that ended left, when that apply wrote it: it
/// reads, and it is not the one the object recorded before (another lineage or a higher
/// serial; any, when none is recorded). Its inputs are then the destroy's.
pub fn written_by_apply(o: &Observed, left: &StateFacts) -> Option<(String, u64)> {
    let StateFacts::Readable {
        lineage, serial, ..
    } = left
    else {
        return None;
    };
    let recorded_lineage = annotation(&o.meta, names::STATE_LINEAGE);
    let recorded_serial: Option<u64> =
        annotation(&o.meta, names::STATE_SERIAL).and_then(|v| v.trim().parse().ok());
    let written =
        recorded_lineage != Some(lineage.as_str()) || recorded_serial.is_none_or(|r| *serial > r);
    written.then(|| (lineage.clone(), *serial))
}

/// The inputs apply attempt `n` ran: those its variables Secret carries (as the pass read
/// it), or, for an attempt an older CAPTF started (it wrote them into the inputs Secret
/// before the Job), the inputs Secret's when they hash as the object says.
pub fn inputs_of_attempt(o: &Observed, n: u32) -> Option<Inputs> {
    let namespace = o.meta.namespace.as_deref().unwrap_or_default();
    let suffix = names::state_suffix(o.kind, o.meta.name.as_deref().unwrap_or_default());
    let own = o.attempt_secret.as_ref().filter(|s| {
        s.metadata.name.as_deref()
            == Some(names::job_name(&suffix, names::OPERATION_APPLY, n).as_str())
    });
    if let Some(secret) = own {
        return secret
            .data
            .as_ref()
            .and_then(|d| d.get(names::INPUTS_KEY))
            .and_then(|b| crate::inputs::parse(&b.0, namespace, &suffix).ok());
    }
    let legacy = crate::inputs::from_secret(o.inputs_secret.as_ref()?, namespace, &suffix).ok()?;
    (annotation(&o.meta, names::INPUTS_SHA256) == Some(legacy.sha256().as_str())).then_some(legacy)
}

/// The attempt whose inputs the object's inputs Secret (as the pass read it) holds: what
/// the Secret's `inputs-of-attempt` annotation says.
pub fn inputs_secret_attempt(o: &Observed) -> Option<u32> {
    o.inputs_secret
        .as_ref()?
        .metadata
        .annotations
        .as_ref()?
        .get(names::INPUTS_OF_ATTEMPT)?
        .trim()
        .parse()
        .ok()
}

/// [`ApplyStateSeen`] of the state the pass read (see [`Observed::state`]).
pub fn apply_state_seen(o: &Observed, settings: &Settings) -> ApplyStateSeen {
    if o.state.is_none() {
        return ApplyStateSeen::default();
    }
    let mut findings = Findings::default();
    let adopt = annotation(&o.meta, names::ADOPT) == Some("true");
    let own_lineage = annotation(&o.meta, names::STATE_LINEAGE).is_some();
    let applied = annotation(&o.meta, names::APPLIED_AT).is_some() || adopt;
    let state = super::tfstate::state_of(o, settings, applied, own_lineage, &mut findings);
    let not_recordable = match &state {
        StateFacts::Readable { .. } => None,
        StateFacts::Missing => Some(format!(
            "its state Secret {} is missing",
            names::state_secret_name(&names::state_suffix(
                o.kind,
                o.meta.name.as_deref().unwrap_or_default()
            ))
        )),
        StateFacts::Unreadable { why, message } => Some(format!("{}: {message}", why.reason())),
        StateFacts::NotRead => None,
    };
    let suffix = names::state_suffix(o.kind, o.meta.name.as_deref().unwrap_or_default());
    let pods: Vec<_> = o.pods.iter().chain(&o.earlier_pods).cloned().collect();
    let (lock_held, stale_lock) = match lock::judge(o.lock.as_ref(), &suffix, &pods, o.now) {
        Lock::Free => (None, false),
        Lock::StaleOwn { .. } => (None, true),
        Lock::Held { holder, age, why } => (
            Some(match age {
                Some(age) => format!("{holder} since {age}; {why}"),
                None => format!("{holder}; {why}"),
            }),
            false,
        ),
    };
    ApplyStateSeen {
        state,
        not_recordable,
        errored: super::errored_uncovered(o, settings.decompression_cap),
        lock_held,
        stale_lock,
    }
}

/// Gathers the apply table's facts. Pure: everything comes from `o` and `a`.
pub fn apply_facts(o: &Observed, a: &ApplyObserved, settings: &Settings) -> ApplyFacts {
    apply_facts_seen(o, a, &apply_state_seen(o, settings), settings)
}

/// [`apply_facts`] with what the pass read of the state already told apart (`seen`, see
/// [`apply_state_seen`]), which reads the state's bytes.
pub fn apply_facts_seen(
    o: &Observed,
    a: &ApplyObserved,
    seen: &ApplyStateSeen,
    settings: &Settings,
) -> ApplyFacts {
    let name = o.meta.name.clone().unwrap_or_default();
    let adopted = annotation(&o.meta, names::ADOPT) == Some("true");
    let applied = annotation(&o.meta, names::APPLIED_AT).is_some()
        || annotation(&o.meta, names::STATE_LINEAGE).is_some();
    let foreign_state = (a.state_exists && !applied && !adopted).then(|| {
        format!(
            "state Secret {} exists, and {} {name} neither applied it (no applied-at, no state-lineage) nor adopted it",
            names::state_secret_name(&names::state_suffix(o.kind, &name)),
            o.kind.as_str()
        )
    });
    let (attempt, last) = apply_history(o);
    let outputs_invalid = annotation(&o.meta, names::OUTPUTS_INVALID)
        .and_then(|v| v.split_once(':'))
        .filter(|(n, _)| n.trim() == attempt.to_string())
        .map(|(_, why)| why.trim().to_string());
    let change_refused = annotation(&o.meta, names::OUTPUTS_REFUSED)
        .and_then(|v| v.split_once(':'))
        .filter(|(n, _)| n.trim() == attempt.to_string())
        .map(|(_, why)| why.trim().to_string());
    // A success the pass that read its state did not record (outputs that break the
    // contract are recorded as such): the state it left cannot be read or trusted.
    let unrecorded = (last == LastApply::Succeeded
        && outputs_invalid.is_none()
        && !names::apply_success_recorded(o.meta.annotations.as_ref(), attempt))
    .then(|| {
        seen.not_recordable
            .clone()
            .unwrap_or_else(|| "its state has not been read yet".to_string())
    });
    ApplyFacts {
        kind: o.kind,
        uid: o.meta.uid.clone().unwrap_or_default(),
        now: o.now,
        backoff: settings.backoff,
        externally_managed: annotation(&o.meta, names::CAPI_MANAGED_BY).is_some(),
        paused: pause_cause(o),
        owner: capi_owner(o.kind, &o.meta),
        prerequisite: a.prerequisite.clone(),
        unfinished_jobs: unfinished(o),
        foreign_state,
        inputs: inputs_sha(o, a),
        applied_sha: annotation(&o.meta, names::INPUTS_SHA256).map(str::to_string),
        attempt,
        last,
        outputs_invalid,
        change_refused,
        provisioned: a.provisioned,
        unrecorded,
        state_expected: annotation(&o.meta, names::STATE_LINEAGE).is_some(),
        state: seen.state.clone(),
        errored: seen.errored.clone(),
        lock_held: seen.lock_held.clone(),
        approved_plan: annotation(&o.meta, names::APPROVE_PLAN).map(str::to_string),
        refused: None,
    }
}

#[cfg(test)]
#[path = "apply_tests.rs"]
mod tests;
