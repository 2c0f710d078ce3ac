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

mod gates;
mod handoff;
mod hibernation;
mod record;

pub use gates::{bootstrap_secret_name, capi_owner, owner_kind, prerequisite};
pub use handoff::{
    handoff_of, handoff_readable, handoff_state, needs_handoff, no_handoff_state,
    object_provisioned,
};
use hibernation::hibernation;
pub use hibernation::{declares_hibernated, hibernation_asked, hibernation_condition};
use record::apply_history;
pub use record::{
    ApplyRan, UnrecordedApply, apply_ran, inputs_of_attempt, inputs_secret_attempt,
    state_left_by_apply, unrecorded_apply, written_by_apply,
};

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

/// Whether the object never started an apply, nor recorded or adopted a state: no
/// `applied-at` (written with the first attempt's number, before its Job), no
/// `apply-attempt`, no `state-lineage`, no `adopt`.
pub fn never_applied(meta: &ObjectMeta) -> bool {
    annotation(meta, names::APPLIED_AT).is_none()
        && annotation(meta, names::APPLY_ATTEMPT).is_none()
        && annotation(meta, names::STATE_LINEAGE).is_none()
        && annotation(meta, names::ADOPT) != Some("true")
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
mod tests;
