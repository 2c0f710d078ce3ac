//! Gathering the facts of a pass from what was observed. The controllers fill an
//! [`Observed`] from the API server, `captf explain -f` from files; both then call
//! [`gather`], so that the rule table sees the same facts either way.

use std::collections::BTreeMap;

use jiff::Timestamp;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Pod, Secret};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::ObjectMeta;
use serde_json::Value;

use crate::api::names::{self, Kind};
use crate::api::{TerraformSpec, VariablesSourceKind};
use crate::inputs::{self, Inputs};
use crate::job::{self, JobOutcome};
use crate::rules::{
    self, AbandonMark, Backoff, Blocker, CleanupMarker, Facts, LastAttempt, PauseCause, StateFacts,
    UnfinishedJob, Unreadable,
};
use crate::state::lock::{self, Lock};
use crate::state::{self, Fingerprint, StateReason, StateSecrets, Verdict};

/// The owning Cluster, as far as pausing goes.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ClusterView {
    pub name: String,
    /// Empty when the dump or the read did not carry it.
    pub uid: String,
    pub spec_paused: bool,
    pub annotation_paused: bool,
}

impl ClusterView {
    /// Reads a `cluster.x-k8s.io` Cluster of any version.
    pub fn from_value(value: &Value) -> ClusterView {
        ClusterView {
            name: value["metadata"]["name"]
                .as_str()
                .unwrap_or_default()
                .to_string(),
            uid: value["metadata"]["uid"]
                .as_str()
                .unwrap_or_default()
                .to_string(),
            spec_paused: value["spec"]["paused"].as_bool().unwrap_or(false),
            annotation_paused: value["metadata"]["annotations"]
                .get(names::CAPI_PAUSED)
                .is_some(),
        }
    }
}

/// Everything a pass looked at, whichever way it was read.
#[derive(Clone, Debug)]
pub struct Observed {
    pub kind: Kind,
    pub meta: ObjectMeta,
    pub spec: TerraformSpec,
    /// The owning Cluster when it exists.
    pub cluster: Option<ClusterView>,
    /// Why Cluster API's Cluster kind is unknown to the manager, when it is and the object
    /// names a Cluster.
    pub cluster_kind_unknown: Option<String>,
    pub crd_deleting: bool,
    pub namespace_terminating: bool,
    /// The Pods of the object (or of an earlier namesake) still terminating after their
    /// grace period, by name: where they are stuck (their node and its state). A node
    /// that is lost never confirms that a Pod stopped, and the Job waits for it.
    pub stuck_pods: BTreeMap<String, String>,
    /// The Cluster API owners (Cluster, Machine, MachinePool, by ownerReference) that no
    /// longer exist or exist with another uid, described for the message; looked at only
    /// during a deletion (see [`owners_gone`]).
    pub owners_gone: Vec<String>,
    /// Why the Pods of an unfinished Job of the object that has none could not be made:
    /// the message of the Job's latest `FailedCreate` Event, by Job name.
    pub job_refusals: BTreeMap<String, String>,
    /// The object's Jobs and Pods (found by the owner labels).
    pub jobs: Vec<Job>,
    pub pods: Vec<Pod>,
    /// The Jobs and Pods of earlier objects of the same kind, namespace and name (another
    /// uid: this one's finalizer was stripped and the object made again). Their Terraform
    /// writes the same state.
    pub earlier_jobs: Vec<Job>,
    pub earlier_pods: Vec<Pod>,
    /// For a TerraformCluster: its machines and pools, as `Kind/name`.
    pub dependents: Vec<String>,
    /// The state Secret and its parts; `None` when not read in this pass.
    pub state: Option<StateSecrets>,
    /// The states Terraform could not save that runners kept for this object (read with
    /// the state).
    pub errored: Vec<state::Errored>,
    /// The manager's permit to hold this pass's state in memory (see
    /// `Context::state_reads`), released with the observation.
    pub state_permit: Option<std::sync::Arc<tokio::sync::OwnedSemaphorePermit>>,
    pub inputs_secret: Option<Secret>,
    /// Secrets and ConfigMaps the inputs or the spec reference (credentials, variablesFrom).
    pub referenced_secrets: BTreeMap<String, Secret>,
    pub referenced_config_maps: BTreeMap<String, ConfigMap>,
    /// Terraform's lock Lease, when it exists.
    pub lock: Option<Lease>,
    pub now: Timestamp,
}

/// What the act step needs beside the decision.
#[derive(Clone, Debug, Default)]
pub struct Extras {
    /// The usable inputs, when they are.
    pub inputs: Option<Inputs>,
    /// The state verdict, when the state was read.
    pub verdict: Option<Verdict>,
    /// The lock Lease is held by a runner of this object (or of an earlier one of its
    /// name) that is provably gone: clear it, as read, before an attempt.
    pub stale_lock: bool,
    /// The state Secret belongs to an earlier object of this name that this one did not
    /// adopt: it is left alone.
    pub foreign_state: bool,
}

/// Settings that are facts of a pass but not of the object.
#[derive(Clone, Copy, Debug)]
pub struct Settings {
    pub backoff: Backoff,
    pub decompression_cap: u64,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            backoff: Backoff::default(),
            decompression_cap: state::DEFAULT_DECOMPRESSION_CAP,
        }
    }
}

fn annotation<'a>(meta: &'a ObjectMeta, key: &str) -> Option<&'a str> {
    meta.annotations
        .as_ref()
        .and_then(|a| a.get(key))
        .map(String::as_str)
}

fn label<'a>(meta: &'a ObjectMeta, key: &str) -> Option<&'a str> {
    meta.labels
        .as_ref()
        .and_then(|a| a.get(key))
        .map(String::as_str)
}

/// A piece of deletion bookkeeping (the destroy attempt, its failure time, the cleanup
/// marker) as this object wrote it. It counts only under `A/deletion-uid` equal to the
/// object's uid, and a failure time only when it is not older than the object: the
/// bookkeeping of an earlier object of this name, carried over in a saved YAML, is not
/// this object's.
pub fn deletion_bookkeeping<'a>(meta: &'a ObjectMeta, key: &str) -> Option<&'a str> {
    let uid = meta.uid.as_deref().filter(|u| !u.is_empty())?;
    if annotation(meta, names::DELETION_UID) != Some(uid) {
        return None;
    }
    let value = annotation(meta, key)?;
    if key == names::DESTROY_FAILED_AT
        && let (Ok(at), Some(created)) = (value.parse::<Timestamp>(), &meta.creation_timestamp)
        && at < created.0
    {
        return None;
    }
    Some(value)
}

/// The name of the owning Cluster: the ownerReference of kind Cluster (group
/// cluster.x-k8s.io), else the cluster-name label.
pub fn owning_cluster(meta: &ObjectMeta) -> Option<String> {
    let by_ref = meta.owner_references.iter().flatten().find(|r| {
        r.kind == "Cluster" && r.api_version.split('/').next() == Some(names::CAPI_GROUP)
    });
    by_ref
        .map(|r| r.name.clone())
        .or_else(|| label(meta, names::CAPI_CLUSTER_NAME_LABEL).map(str::to_string))
}

/// The ownerReferences of `meta` to a Cluster API Cluster, Machine or MachinePool: the
/// owners Cluster API never lets go before their infrastructure is deleted.
pub fn capi_owners(meta: &ObjectMeta) -> impl Iterator<Item = &OwnerReference> {
    meta.owner_references.iter().flatten().filter(|r| {
        r.api_version.split('/').next() == Some(names::CAPI_GROUP)
            && matches!(r.kind.as_str(), "Cluster" | "Machine" | "MachinePool")
    })
}

/// Which Cluster API owners of `meta` are gone: `found(kind, name)` is the uid of the
/// owner of that kind and name that exists (empty when its uid is unknown), or None.
/// An owner that exists with another uid is a new object of that name, not the owner.
pub fn owners_gone(meta: &ObjectMeta, found: impl Fn(&str, &str) -> Option<String>) -> Vec<String> {
    capi_owners(meta)
        .filter_map(|r| match found(&r.kind, &r.name) {
            None => Some(format!(
                "{} {} (uid {}) no longer exists",
                r.kind, r.name, r.uid
            )),
            Some(uid) if !uid.is_empty() && uid != r.uid => Some(format!(
                "{} {} exists with uid {uid}, not the owner's uid {}",
                r.kind, r.name, r.uid
            )),
            Some(_) => None,
        })
        .collect()
}

/// Whether a Job or Pod carries the owner labels of an object of this kind and name, but
/// another uid: an earlier object of the same name.
pub fn of_earlier_namesake(kind: Kind, meta: &ObjectMeta, candidate: &ObjectMeta) -> bool {
    let name = inputs::name_label_value(meta.name.as_deref().unwrap_or_default());
    label(candidate, names::LABEL_OWNER_KIND) == Some(kind.as_str())
        && label(candidate, names::LABEL_OWNER_NAME) == Some(name.as_str())
        && label(candidate, names::LABEL_OWNER_UID).is_some_and(|u| Some(u) != meta.uid.as_deref())
}

/// Whether a Job or Pod carries this object's owner labels: the uid when both sides have
/// one, else kind and name.
pub fn owned_by(kind: Kind, meta: &ObjectMeta, candidate: &ObjectMeta) -> bool {
    let uid = label(candidate, names::LABEL_OWNER_UID);
    match (uid, meta.uid.as_deref()) {
        (Some(a), Some(b)) => a == b,
        _ => {
            label(candidate, names::LABEL_OWNER_KIND) == Some(kind.as_str())
                && label(candidate, names::LABEL_OWNER_NAME) == meta.name.as_deref()
        }
    }
}

/// Gathers the facts of a pass. Pure: everything comes from `o`.
pub fn gather(o: &Observed, settings: &Settings) -> (Facts, Extras) {
    let name = o.meta.name.clone().unwrap_or_default();
    let suffix = names::state_suffix(o.kind, &name);
    let namespace = o.meta.namespace.clone().unwrap_or_default();
    let mut extras = Extras::default();

    let paused = pause_cause(o);
    let unfinished_jobs = unfinished(o);
    let cleanup = match deletion_bookkeeping(&o.meta, names::CLEANUP_STARTED) {
        Some(names::CLEANUP_DESTROYED) => Some(CleanupMarker::Destroyed),
        Some(names::CLEANUP_ABANDONED) => Some(CleanupMarker::Abandoned),
        _ => None,
    };
    let adopt = annotation(&o.meta, names::ADOPT) == Some("true");
    let own_lineage = annotation(&o.meta, names::STATE_LINEAGE).is_some();
    let applied = annotation(&o.meta, names::APPLIED_AT).is_some() || adopt;

    let state = match &o.state {
        None => StateFacts::NotRead,
        Some(secrets) => {
            let (content, stale_parts) = state::read_noting(secrets, settings.decompression_cap);
            let base = secrets.base_name.clone();
            if !matches!(content, state::StateContent::Missing) && !applied && !own_lineage {
                // An orphaned state of an earlier object with this name, not adopted:
                // this object never applied, so it has no state of its own.
                extras.foreign_state = true;
                StateFacts::Missing
            } else {
                let interrupted = annotation(&o.meta, names::APPLY_INTERRUPTED).is_some();
                // Adopt lets the object take a state while it records no fingerprint;
                // once one is recorded (the adopted state's, written by the bookkeeping),
                // it is checked like any other, so an older backup restored later is not
                // destroyed against.
                let verdict = match Fingerprint::from_annotations(
                    o.meta.annotations.as_ref().unwrap_or(&BTreeMap::new()),
                ) {
                    Ok(recorded) => {
                        state::classify_named(&base, &content, recorded.as_ref(), interrupted)
                    }
                    Err(problem) => bad_fingerprint(&base, &content, problem),
                };
                // Terraform's backend selects the state by labels: another Secret with
                // them all is read by Terraform as part of this state, so the two would
                // not destroy against the same state.
                let selector = inputs::state_selector(
                    o.kind,
                    &name,
                    o.meta.uid.as_deref().unwrap_or_default(),
                );
                let strangers = secrets.strangers(&selector);
                let verdict = if strangers.is_empty() {
                    verdict
                } else {
                    Verdict {
                        readable: false,
                        reason: StateReason::StateInconsistent,
                        message: format!(
                            "Secret(s) {} carry every label Terraform's backend selects state Secret {base} by: Terraform would read them together with it (and fail, or destroy against another state) while CAPTF reads {base} alone; delete them, or remove their tfstate label (see runbooks/StateInconsistent.md)",
                            strangers.join(", ")
                        ),
                        ..verdict
                    }
                };
                let verdict = match stale_parts {
                    Some(note) if verdict.readable => Verdict {
                        message: format!("{}; {note}", verdict.message),
                        ..verdict
                    },
                    _ => verdict,
                };
                let facts = state_facts(&verdict, &names::state_secret_name(&suffix));
                extras.verdict = Some(verdict);
                facts
            }
        }
    };

    let (attempt, last_attempt) = destroy_history(o, &suffix);
    let attempt_unstarted = attempt > 0
        && deletion_bookkeeping(&o.meta, names::DESTROY_FAILED_AT).is_none()
        && !o.jobs.iter().any(|j| {
            job::operation_of(j) == Some(names::OPERATION_DESTROY)
                && job::attempt_of(j) == Some(attempt)
        });
    let errored = errored_uncovered(o, settings.decompression_cap);
    let blocker = blocker(o, &suffix, &namespace, errored.as_deref(), &mut extras);

    let facts = Facts {
        kind: o.kind,
        uid: o.meta.uid.clone().unwrap_or_default(),
        state_secret: names::state_secret_name(&suffix),
        deleting: o.meta.deletion_timestamp.is_some(),
        paused,
        unfinished_jobs,
        dependents: o.dependents.clone(),
        cleanup,
        applied,
        state,
        abandon: AbandonMark::of(
            annotation(&o.meta, names::ABANDON),
            o.meta.uid.as_deref().unwrap_or_default(),
        ),
        attempt,
        last_attempt,
        attempt_unstarted,
        blocker,
        errored_uncovered: errored.is_some(),
        now: o.now,
        backoff: settings.backoff,
    };
    (facts, extras)
}

/// Whether rows 1 to 3 or the cleanup marker decide the pass before the state matters;
/// the controller reads the state Secrets only when this is false.
pub fn state_needed(facts: &Facts) -> bool {
    facts.deleting
        && facts.paused.is_none()
        && facts.unfinished_jobs.is_empty()
        && (facts.kind != Kind::TerraformCluster || facts.dependents.is_empty())
        && facts.cleanup.is_none()
}

fn pause_cause(o: &Observed) -> Option<PauseCause> {
    if o.crd_deleting {
        return Some(PauseCause::CrdDeleting);
    }
    if annotation(&o.meta, names::CLUSTERCTL_DELETE_FOR_MOVE).is_some() {
        return Some(PauseCause::DeleteForMove);
    }
    if annotation(&o.meta, names::CAPI_PAUSED).is_some() {
        return Some(PauseCause::ObjectAnnotation);
    }
    if let (Some(why), Some(cluster)) = (&o.cluster_kind_unknown, owning_cluster(&o.meta)) {
        return Some(PauseCause::ClusterUnknown {
            cluster,
            why: why.clone(),
        });
    }
    match &o.cluster {
        Some(c) if c.spec_paused => Some(PauseCause::ClusterSpec(c.name.clone())),
        Some(c) if c.annotation_paused => Some(PauseCause::ClusterAnnotation(c.name.clone())),
        _ => None,
    }
}

fn unfinished(o: &Observed) -> Vec<UnfinishedJob> {
    let mut out = unfinished_of(&o.jobs, &o.pods, &o.job_refusals, &o.stuck_pods, None);
    let earlier = format!(
        "of an earlier {} {}",
        o.kind.as_str(),
        o.meta.name.as_deref().unwrap_or_default()
    );
    out.extend(unfinished_of(
        &o.earlier_jobs,
        &o.earlier_pods,
        &BTreeMap::new(),
        &o.stuck_pods,
        Some(&earlier),
    ));
    out
}

/// The unfinished Jobs of `jobs`, and the Pods of `pods` still running without their Job;
/// `whose` is said of each when they are not this object's.
fn unfinished_of(
    jobs: &[Job],
    pods: &[Pod],
    refusals: &BTreeMap<String, String>,
    stuck: &BTreeMap<String, String>,
    whose: Option<&str>,
) -> Vec<UnfinishedJob> {
    // A Pod stuck terminating: named with its node, whoever's it is.
    let stuck_note = |p: &Pod| {
        let name = p.metadata.name.clone().unwrap_or_default();
        stuck.get(&name).map(|node| {
            let note = format!(
                "its Pod {name} is still terminating past its grace period on {node}: the Job waits until the node confirms the Pod stopped; force-delete the Pod only once that node is confirmed gone (see runbooks/WaitingForJob.md)"
            );
            match whose {
                Some(w) => format!("{w}; {note}"),
                None => note,
            }
        })
    };
    let mut out = Vec::new();
    for j in jobs {
        if let JobOutcome::Unfinished { waiting_reason } = job::outcome(j, pods) {
            let name = j.metadata.name.clone().unwrap_or_default();
            let stuck_pod = pods
                .iter()
                .filter(|p| job::pod_of_job(j, p))
                .find_map(&stuck_note);
            let detail = if let Some(note) = stuck_pod {
                Some(note)
            } else if let Some(whose) = whose {
                Some(whose.to_string())
            } else if job::suspended(j) {
                Some("the Job is suspended (spec.suspend: true; a queue such as Kueue starts it once it admits it)".to_string())
            } else if let Some(w) = waiting_reason {
                Some(format!("its Pod is waiting: {w}"))
            } else {
                refusals
                    .get(&name)
                    .map(|m| format!("its Pod cannot be created: {m}"))
            };
            out.push(UnfinishedJob {
                name,
                operation: job::operation_of(j).unwrap_or("unknown").to_string(),
                detail,
            });
        }
    }
    // A Pod whose Job is gone still runs Terraform until it ends.
    for p in pods {
        let job_name = label(&p.metadata, "job-name")
            .or_else(|| label(&p.metadata, "batch.kubernetes.io/job-name"));
        let has_job =
            job_name.is_some_and(|n| jobs.iter().any(|j| j.metadata.name.as_deref() == Some(n)));
        if !has_job && !lock::pod_terminated(p) {
            out.push(UnfinishedJob {
                name: p.metadata.name.clone().unwrap_or_default(),
                operation: format!(
                    "{} Pod of a deleted",
                    label(&p.metadata, names::LABEL_OPERATION).unwrap_or("unknown")
                ),
                detail: stuck_note(p).or_else(|| whose.map(str::to_string)),
            });
        }
    }
    out
}

fn destroy_history(o: &Observed, suffix: &str) -> (u32, LastAttempt) {
    let attempt: u32 = deletion_bookkeeping(&o.meta, names::DESTROY_ATTEMPT)
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0);
    if attempt == 0 {
        return (0, LastAttempt::NoneFinished);
    }
    let failed_at: Option<Timestamp> =
        deletion_bookkeeping(&o.meta, names::DESTROY_FAILED_AT).and_then(|v| v.parse().ok());
    let job_name = names::job_name(suffix, names::OPERATION_DESTROY, attempt);
    let job = o.jobs.iter().find(|j| {
        j.metadata.name.as_deref() == Some(job_name.as_str())
            || (job::operation_of(j) == Some(names::OPERATION_DESTROY)
                && job::attempt_of(j) == Some(attempt))
    });
    let last = match job.map(|j| job::outcome(j, &o.pods)) {
        Some(JobOutcome::Succeeded) => LastAttempt::Succeeded {
            at: job.and_then(job::finished_at),
        },
        Some(JobOutcome::Failed {
            reason, error_tail, ..
        }) => LastAttempt::Failed {
            at: failed_at.or(Some(o.now)),
            error: match job {
                Some(j) => job::failure_message(&reason, error_tail.as_deref(), j, &o.pods),
                None => reason,
            },
        },
        // An unfinished Job is row 2's business.
        Some(JobOutcome::Unfinished { .. }) => LastAttempt::NoneFinished,
        None => match failed_at {
            // A failure recorded before this deletion began belongs to an earlier object
            // of this name (recreated from saved YAML): it does not count for this one.
            Some(at) if deletion_time(&o.meta).is_some_and(|d| at < d) => LastAttempt::NoneFinished,
            Some(at) => LastAttempt::Failed {
                at: Some(at),
                error: format!(
                    "its Job {job_name} is gone; read the earlier condition message or the errored-state Secret"
                ),
            },
            None => LastAttempt::NoneFinished,
        },
    };
    (attempt, last)
}

fn deletion_time(meta: &ObjectMeta) -> Option<Timestamp> {
    meta.deletion_timestamp.as_ref().map(|t| t.0)
}

fn blocker(
    o: &Observed,
    suffix: &str,
    namespace: &str,
    errored: Option<&str>,
    extras: &mut Extras,
) -> Option<Blocker> {
    let uid = o.meta.uid.as_deref().unwrap_or_default();
    if !o.owners_gone.is_empty()
        && (uid.is_empty() || annotation(&o.meta, names::DESTROY_WITHOUT_OWNER) != Some(uid))
    {
        return Some(Blocker::OwnerGone(o.owners_gone.join("; ")));
    }
    if let Some(what) = errored {
        return Some(Blocker::ErroredState(what.to_string()));
    }
    if o.namespace_terminating {
        return Some(Blocker::NamespaceTerminating(namespace.to_string()));
    }
    let inputs = match usable_inputs(o, suffix, namespace) {
        Ok(i) => i,
        Err(message) => return Some(Blocker::Inputs(message)),
    };
    let missing = inputs
        .env
        .iter()
        .map(|e| &e.secret_key_ref)
        .find(|r| {
            !o.referenced_secrets
                .get(&r.name)
                .is_some_and(|s| has_key(s, &r.key))
        })
        .map(|r| Blocker::Credentials {
            secret: r.name.clone(),
            key: r.key.clone(),
        });
    extras.inputs = Some(inputs);
    missing.or_else(|| lock_blocker(o, suffix, extras))
}

fn has_key(secret: &Secret, key: &str) -> bool {
    secret.data.as_ref().is_some_and(|d| d.contains_key(key))
        || secret
            .string_data
            .as_ref()
            .is_some_and(|d| d.contains_key(key))
}

/// The inputs a destroy renders from: the inputs Secret, or for a cluster or pool without
/// one, the current spec when every reference resolves and the result hashes to the
/// recorded `inputs-sha256`.
fn usable_inputs(o: &Observed, suffix: &str, namespace: &str) -> Result<Inputs, String> {
    let secret_name = names::inputs_secret_name(suffix);
    if let Some(secret) = &o.inputs_secret {
        return inputs::from_secret(secret, namespace, suffix)
            .map_err(|e| format!("the inputs Secret {secret_name} is unusable: {e}; restore it from a backup of the apply"));
    }
    if o.kind == Kind::TerraformMachine {
        return Err(format!(
            "the inputs Secret {secret_name} is missing, and a TerraformMachine never rebuilds its inputs at deletion (its bootstrap data is gone by then); restore the Secret"
        ));
    }
    let lookup = |kind: VariablesSourceKind, name: &str, key: &str| -> Option<Vec<u8>> {
        match kind {
            VariablesSourceKind::ConfigMap => {
                let cm = o.referenced_config_maps.get(name)?;
                cm.data
                    .as_ref()
                    .and_then(|d| d.get(key))
                    .map(|v| v.as_bytes().to_vec())
            }
            VariablesSourceKind::Secret => {
                let s = o.referenced_secrets.get(name)?;
                s.data
                    .as_ref()
                    .and_then(|d| d.get(key))
                    .map(|v| v.0.clone())
            }
        }
    };
    let rebuilt = inputs::build_from_spec(&o.spec, namespace, suffix, &lookup).map_err(|e| {
        format!("the inputs Secret {secret_name} is missing and the inputs cannot be rebuilt from the current spec: {e}")
    })?;
    let recorded = annotation(&o.meta, names::INPUTS_SHA256);
    if !inputs::rebuilt_matches(&rebuilt, recorded) {
        return Err(format!(
            "the inputs Secret {secret_name} is missing and the inputs rebuilt from the current spec do not hash to the recorded {} (the spec or a referenced object changed since the apply, and Terraform would forget what it created); restore the inputs Secret",
            names::INPUTS_SHA256
        ));
    }
    Ok(rebuilt)
}

/// Terraform's lock, judged by [`lock::judge`]: free, stale (its holder a runner of this
/// object, or of an earlier one of its name, that is provably gone: cleared before the
/// attempt), or held (never broken).
/// The errored states (see [`Observed::errored`]) that list a managed resource instance
/// the state does not, or cannot be read, described; None when every one is covered by
/// the state (a destroy whose last save failed leaves a subset of it, for instance).
pub fn errored_uncovered(o: &Observed, cap: u64) -> Option<String> {
    if o.errored.is_empty() {
        return None;
    }
    let state = match o.state.as_ref().map(|s| s.instances(cap)) {
        Some(Ok(i)) => Some(i.managed),
        None => Some(Default::default()),
        Some(Err(_)) => None,
    };
    let mut said = Vec::new();
    for e in &o.errored {
        let name = e.name();
        match (e.instances(cap), &state) {
            (Err(why), _) => said.push(format!(
                "the errored state {name} (what Terraform could not save) cannot be read ({why}), so the resources it records are unknown"
            )),
            (Ok(_), None) => said.push(format!(
                "the errored state {name} (what Terraform could not save) cannot be compared with the state, which cannot be read"
            )),
            (Ok(errored), Some(state)) => {
                let missing: Vec<&String> = errored.managed.difference(state).collect();
                if missing.is_empty() {
                    continue;
                }
                const SHOWN: usize = 3;
                let mut list: Vec<String> =
                    missing.iter().take(SHOWN).map(|m| m.to_string()).collect();
                if missing.len() > SHOWN {
                    list.push(format!("{} more", missing.len() - SHOWN));
                }
                said.push(format!(
                    "the errored state {name} (what Terraform could not save) records {} managed resource instance(s) that the state does not: {}",
                    missing.len(),
                    list.join(", ")
                ));
            }
        }
    }
    (!said.is_empty()).then(|| said.join("; "))
}

fn lock_blocker(o: &Observed, suffix: &str, extras: &mut Extras) -> Option<Blocker> {
    let pods: Vec<Pod> = o.pods.iter().chain(&o.earlier_pods).cloned().collect();
    match lock::judge(o.lock.as_ref(), suffix, &pods, o.now) {
        Lock::Free => None,
        Lock::StaleOwn { .. } => {
            extras.stale_lock = true;
            None
        }
        Lock::Held { holder, age } => Some(Blocker::LockHeld { holder, age }),
    }
}

fn bad_fingerprint(base: &str, content: &state::StateContent, problem: String) -> Verdict {
    let mut v = state::classify_named(base, content, None, false);
    if v.readable {
        v.readable = false;
        v.reason = StateReason::StateInconsistent;
        v.message = format!(
            "{problem}: the state cannot be checked against the object's fingerprint; see runbooks/StateInconsistent.md"
        );
    }
    v
}

fn state_facts(v: &Verdict, secret: &str) -> StateFacts {
    let unreadable = |why| StateFacts::Unreadable {
        why,
        message: v.message.clone(),
    };
    match v.reason {
        StateReason::Readable => StateFacts::Readable {
            managed_instances: v.managed_instances.unwrap_or(0),
            lineage: v.lineage.clone().unwrap_or_default(),
            serial: v.serial.unwrap_or(0),
            secret: secret.to_string(),
        },
        StateReason::StateLost => StateFacts::Missing,
        StateReason::StateCorrupt => unreadable(Unreadable::Corrupt),
        StateReason::StateEncrypted => unreadable(Unreadable::Encrypted),
        StateReason::StateInconsistent => unreadable(Unreadable::Inconsistent),
    }
}

/// Gathers the facts and decides, in one call.
pub fn decide(o: &Observed, settings: &Settings) -> (rules::Decision, Facts, Extras) {
    let (facts, extras) = gather(o, settings);
    (rules::decide(&facts), facts, extras)
}

#[cfg(test)]
mod tests {
    //! The facts a pass gathers: the "current inputs when they build" rule, adoption, the
    //! lock, and what counts as paused.

    use std::collections::BTreeMap;

    use k8s_openapi::ByteString;
    use k8s_openapi::api::core::v1::Secret;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    use super::*;
    use crate::rules::{Action, Blocker, Row};
    use crate::testing::{meta, observed, spec};

    fn rebuilt_sha(kind: Kind) -> String {
        let suffix = names::state_suffix(kind, "prod");
        let none = |_: VariablesSourceKind, _: &str, _: &str| None;
        let inputs = inputs::build_from_spec(&spec(), "team-a", &suffix, &none).expect("builds");
        Inputs::sha256_hex(&inputs.to_json_bytes())
    }

    fn blocker(o: &Observed) -> Option<Blocker> {
        gather(o, &Settings::default()).0.blocker
    }

    #[test]
    fn a_cluster_without_inputs_secret_destroys_from_current_inputs_when_they_build_and_match() {
        let sha = rebuilt_sha(Kind::TerraformCluster);
        let o = observed(Kind::TerraformCluster, &[(names::INPUTS_SHA256, &sha)]);
        assert_eq!(blocker(&o), None);
        let (_, extras) = gather(&o, &Settings::default());
        assert!(
            extras.inputs.is_some(),
            "the rebuilt inputs render the destroy"
        );
    }

    #[test]
    fn a_changed_spec_that_no_longer_hashes_to_the_recorded_inputs_cannot_start() {
        let o = observed(
            Kind::TerraformMachinePool,
            &[(names::INPUTS_SHA256, "0000")],
        );
        match blocker(&o) {
            Some(Blocker::Inputs(m)) => assert!(m.contains("do not hash"), "{m}"),
            other => panic!("expected an inputs blocker, got {other:?}"),
        }
    }

    #[test]
    fn a_reference_that_does_not_resolve_cannot_start() {
        let mut o = observed(Kind::TerraformCluster, &[]);
        o.spec.variables_from = vec![crate::api::VariablesFrom {
            kind: VariablesSourceKind::ConfigMap,
            name: "gone".into(),
            key: "vars.json".into(),
        }];
        assert!(matches!(blocker(&o), Some(Blocker::Inputs(m)) if m.contains("cannot be rebuilt")));
    }

    #[test]
    fn a_machine_never_rebuilds_its_inputs() {
        let sha = rebuilt_sha(Kind::TerraformMachine);
        let o = observed(Kind::TerraformMachine, &[(names::INPUTS_SHA256, &sha)]);
        assert!(matches!(blocker(&o), Some(Blocker::Inputs(m)) if m.contains("never rebuilds")));
    }

    #[test]
    fn a_missing_credentials_secret_names_secret_and_key() {
        let mut o = observed(Kind::TerraformCluster, &[]);
        o.spec.env = vec![crate::api::EnvFromSecret {
            name: "TOKEN".into(),
            secret_key_ref: crate::api::SecretKeyRef {
                name: "creds".into(),
                key: "token".into(),
            },
        }];
        assert_eq!(
            blocker(&o),
            Some(Blocker::Credentials {
                secret: "creds".into(),
                key: "token".into()
            })
        );
        let secret = Secret {
            data: Some([("token".to_string(), ByteString(b"x".to_vec()))].into()),
            ..Default::default()
        };
        o.referenced_secrets.insert("creds".into(), secret);
        assert_eq!(blocker(&o), None);
    }

    #[test]
    fn a_crd_being_deleted_and_delete_for_move_count_as_paused() {
        let mut o = observed(Kind::TerraformMachine, &[]);
        o.crd_deleting = true;
        assert_eq!(
            gather(&o, &Settings::default()).0.paused,
            Some(PauseCause::CrdDeleting)
        );
        let o = observed(
            Kind::TerraformMachine,
            &[(names::CLUSTERCTL_DELETE_FOR_MOVE, "")],
        );
        assert_eq!(
            gather(&o, &Settings::default()).0.paused,
            Some(PauseCause::DeleteForMove)
        );
        let mut o = observed(Kind::TerraformMachine, &[]);
        o.cluster = Some(ClusterView {
            name: "prod".into(),
            uid: "c-1".into(),
            spec_paused: true,
            annotation_paused: false,
        });
        assert_eq!(
            gather(&o, &Settings::default()).0.paused,
            Some(PauseCause::ClusterSpec("prod".into()))
        );
    }

    #[test]
    fn a_namesake_that_neither_applied_nor_adopted_leaves_the_orphaned_state_alone() {
        let mut o = observed(Kind::TerraformMachine, &[]);
        let gz = {
            use std::io::Write;
            let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
            let _ = e.write_all(br#"{"version":4,"serial":3,"lineage":"l-1","resources":[{"mode":"managed","type":"terraform_data","name":"a","instances":[{}]}]}"#);
            e.finish().expect("gzip")
        };
        let base = names::state_secret_name("prod.tfm");
        let secret = Secret {
            metadata: ObjectMeta {
                name: Some(base.clone()),
                ..Default::default()
            },
            data: Some([("tfstate".to_string(), ByteString(gz))].into()),
            ..Default::default()
        };
        o.state = Some(StateSecrets::from_secrets(&base, &[secret]));
        let (d, _, extras) = decide(&o, &Settings::default());
        assert!(extras.foreign_state);
        assert_eq!(
            (d.row, d.action),
            (Some(Row::NeverApplied), Action::RemoveFinalizer)
        );
        // With the adopt annotation, it is this object's state: a destroy starts.
        o.meta = meta(&[(names::ADOPT, "true")]);
        let (d, _, _) = decide(&o, &Settings::default());
        assert_eq!(
            d.row,
            Some(Row::FailedOrBlocked),
            "adopted: its inputs are missing, so the destroy cannot start yet"
        );
    }

    #[test]
    fn a_lock_of_a_gone_pod_of_this_object_is_stale_and_any_other_lock_holds() {
        let sha = rebuilt_sha(Kind::TerraformCluster);
        let lease = |who: &str| -> Lease {
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": "lock-tfstate-default-prod.tfc", "annotations": {
                    names::TF_LOCK_INFO: format!("{{\"ID\":\"abc\",\"Who\":\"{who}\",\"Created\":\"2026-12-01T09:00:00Z\"}}")
                }},
                "spec": {"holderIdentity": "abc"}
            }))
            .expect("lease")
        };
        let mut o = observed(Kind::TerraformCluster, &[(names::INPUTS_SHA256, &sha)]);
        o.lock = Some(lease("root@captf-prod-tfc-destroy-1-x7k2p"));
        let (f, extras) = gather(&o, &Settings::default());
        assert_eq!(f.blocker, None);
        assert!(extras.stale_lock);
        o.lock = Some(lease("alice@laptop"));
        match gather(&o, &Settings::default()).0.blocker {
            Some(Blocker::LockHeld { holder, age }) => {
                assert!(holder.contains("alice@laptop"));
                assert!(age.is_some_and(|a| a.contains("3h")));
            }
            other => panic!("expected LockHeld, got {other:?}"),
        }
    }

    #[test]
    fn an_earlier_objects_unfinished_job_holds_the_deletion_and_its_runner_keeps_the_lock() {
        let sha = rebuilt_sha(Kind::TerraformCluster);
        let mut o = observed(Kind::TerraformCluster, &[(names::INPUTS_SHA256, &sha)]);
        let job_name = names::job_name("prod.tfc", names::OPERATION_DESTROY, 1);
        let pod_name = format!("{job_name}-x7k2p");
        let labels = serde_json::json!({
            names::LABEL_OWNER_KIND: "TerraformCluster", names::LABEL_OWNER_NAME: "prod",
            names::LABEL_OWNER_UID: "uid-of-the-earlier-prod",
            names::LABEL_OPERATION: names::OPERATION_DESTROY, "job-name": job_name,
        });
        let job: Job = serde_json::from_value(serde_json::json!({
            "metadata": {"name": job_name, "labels": labels}, "status": {"active": 1}
        }))
        .expect("job");
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": pod_name, "labels": labels},
            "status": {"phase": "Running"}
        }))
        .expect("pod");
        assert!(of_earlier_namesake(
            Kind::TerraformCluster,
            &o.meta,
            &job.metadata
        ));
        o.earlier_jobs = vec![job];
        o.earlier_pods = vec![pod.clone()];
        let (d, f, _) = decide(&o, &Settings::default());
        assert_eq!(d.row, Some(Row::JobUnfinished));
        assert_eq!(
            f.unfinished_jobs[0].detail.as_deref(),
            Some("of an earlier TerraformCluster prod")
        );
        // Its Job gone (deleted with orphan propagation), its Pod still runs Terraform, and
        // holds the lock: held, not stale.
        o.earlier_jobs.clear();
        o.lock = Some(
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": "lock-tfstate-default-prod.tfc", "annotations": {
                    names::TF_LOCK_INFO: format!("{{\"ID\":\"abc\",\"Who\":\"runner@{pod_name}\"}}")
                }},
                "spec": {"holderIdentity": "abc"}
            }))
            .expect("lease"),
        );
        let (d, f, extras) = decide(&o, &Settings::default());
        assert_eq!(d.row, Some(Row::JobUnfinished), "{:?}", f.unfinished_jobs);
        assert!(!extras.stale_lock);
        // The Pod terminated: the lock it left is stale, and the deletion goes on.
        let mut done = pod;
        done.status.as_mut().expect("status").phase = Some("Failed".into());
        o.earlier_pods = vec![done];
        let (f, extras) = gather(&o, &Settings::default());
        assert!(f.unfinished_jobs.is_empty());
        assert!(extras.stale_lock);
        assert_eq!(f.blocker, None);
    }

    #[test]
    fn a_suspended_or_podless_job_says_why_it_has_no_pod() {
        let sha = rebuilt_sha(Kind::TerraformCluster);
        let mut o = observed(Kind::TerraformCluster, &[(names::INPUTS_SHA256, &sha)]);
        let job_name = names::job_name("prod.tfc", names::OPERATION_DESTROY, 1);
        let job = |suspend: bool| -> Job {
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": job_name, "labels": {names::LABEL_OPERATION: names::OPERATION_DESTROY}},
                "spec": {"suspend": suspend, "template": {}}
            }))
            .expect("job")
        };
        let detail = |o: &Observed| unfinished(o)[0].detail.clone();
        o.jobs = vec![job(false)];
        assert_eq!(detail(&o), None, "nothing known yet");
        o.job_refusals.insert(
            job_name.clone(),
            "Error creating: pods is forbidden: quota".into(),
        );
        assert_eq!(
            detail(&o).as_deref(),
            Some("its Pod cannot be created: Error creating: pods is forbidden: quota")
        );
        o.jobs = vec![job(true)];
        assert!(
            detail(&o).is_some_and(|d| d.starts_with("the Job is suspended")),
            "{:?}",
            detail(&o)
        );
        let (d, _, _) = decide(&o, &Settings::default());
        assert_eq!(d.row, Some(Row::JobUnfinished));
        assert!(
            d.deleting().message.contains("the Job is suspended"),
            "{}",
            d.deleting().message
        );
    }

    #[test]
    fn an_unknown_cluster_kind_holds_an_object_that_names_a_cluster_as_paused() {
        let mut o = observed(Kind::TerraformMachine, &[]);
        o.cluster_kind_unknown = Some("no Cluster kind is served".into());
        // Naming no Cluster: nothing to miss.
        assert_eq!(gather(&o, &Settings::default()).0.paused, None);
        o.meta.labels = Some(BTreeMap::from([(
            names::CAPI_CLUSTER_NAME_LABEL.to_string(),
            "prod".to_string(),
        )]));
        let (d, f, _) = decide(&o, &Settings::default());
        assert_eq!(
            f.paused,
            Some(PauseCause::ClusterUnknown {
                cluster: "prod".into(),
                why: "no Cluster kind is served".into()
            })
        );
        assert_eq!(d.row, Some(Row::Paused));
        assert!(
            d.deleting()
                .message
                .contains("it names Cluster prod, and whether that Cluster is paused cannot be seen: no Cluster kind is served"),
            "{}",
            d.deleting().message
        );
    }

    /// The state Secrets of `prod` (a TerraformMachine) holding one gzip-compressed state
    /// of `instances` managed instances, with lineage `lineage` and serial `serial`.
    fn machine_state(lineage: &str, serial: u64, instances: usize) -> StateSecrets {
        use std::io::Write;
        let state = serde_json::json!({
            "version": 4, "serial": serial, "lineage": lineage,
            "resources": [{"mode": "managed", "type": "terraform_data", "name": "a",
                "instances": vec![serde_json::json!({}); instances]}]
        });
        let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        e.write_all(state.to_string().as_bytes()).expect("gzip");
        let base = names::state_secret_name("prod.tfm");
        let secret = Secret {
            metadata: ObjectMeta {
                name: Some(base.clone()),
                ..Default::default()
            },
            data: Some([("tfstate".to_string(), ByteString(e.finish().expect("gzip")))].into()),
            ..Default::default()
        };
        StateSecrets::from_secrets(&base, &[secret])
    }

    /// Secrets holding `state` gzip-compressed as Terraform's backend stores it, under base
    /// `base`, with `labels`.
    fn state_secrets_of(base: &str, state: &serde_json::Value, labels: &[(&str, &str)]) -> Secret {
        use std::io::Write;
        let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        e.write_all(state.to_string().as_bytes()).expect("gzip");
        Secret {
            metadata: ObjectMeta {
                name: Some(base.to_string()),
                labels: Some(
                    labels
                        .iter()
                        .map(|(k, v)| (k.to_string(), v.to_string()))
                        .collect(),
                ),
                ..Default::default()
            },
            data: Some([("tfstate".to_string(), ByteString(e.finish().expect("gzip")))].into()),
            ..Default::default()
        }
    }

    #[test]
    fn an_errored_state_with_instances_the_state_lacks_holds_the_destroy() {
        let applied = (names::APPLIED_AT, "2026-11-30T10:00:00Z");
        let sha = rebuilt_sha(Kind::TerraformCluster);
        let mut o = observed(
            Kind::TerraformCluster,
            &[applied, (names::INPUTS_SHA256, &sha)],
        );
        o.meta.deletion_timestamp = Some(Time("2026-12-01T11:00:00Z".parse().expect("time")));
        let instance = |id: &str| serde_json::json!({"index_key": 0, "attributes": {"id": id}});
        let state = |ids: &[&str]| {
            serde_json::json!({"version": 4, "serial": 5, "lineage": "l-1", "resources": [
                {"mode": "managed", "type": "terraform_data", "name": "vm",
                 "instances": ids.iter().map(|i| instance(i)).collect::<Vec<_>>()}]})
        };
        let base = names::state_secret_name("prod.tfc");
        o.state = Some(StateSecrets::from_secrets(
            &base,
            &[state_secrets_of(&base, &state(&["a"]), &[])],
        ));
        let errored_suffix = names::errored_suffix("prod.tfc", 1, "ab1cd");
        let errored_base = names::state_secret_name(&errored_suffix);
        let errored = |ids: &[&str]| {
            state::Errored::find(
                "prod.tfc",
                &[state_secrets_of(
                    &errored_base,
                    &state(ids),
                    &[
                        (names::LABEL_ERRORED_STATE, "true"),
                        (names::TF_LABEL_SUFFIX, &errored_suffix),
                    ],
                )],
            )
        };
        // Covered by the state (a destroy whose save failed leaves a subset): no hold.
        o.errored = errored(&["a"]);
        assert_eq!(o.errored.len(), 1);
        assert_eq!(blocker(&o), None);
        let (d, _, _) = decide(&o, &Settings::default());
        assert_eq!(
            (d.row, d.action),
            (Some(Row::Destroy), Action::StartDestroy)
        );
        // An instance the state does not hold (another id): held, named, its own runbook.
        o.errored = errored(&["a", "b"]);
        let (d, _, _) = decide(&o, &Settings::default());
        assert_eq!(
            d.row,
            Some(Row::FailedOrBlocked),
            "{}",
            d.deleting().message
        );
        assert_ne!(d.action, Action::StartDestroy);
        assert_eq!(d.runbook, Some(crate::rules::RUNBOOK_ERRORED_STATE));
        let msg = &d.deleting().message;
        assert!(
            msg.contains(&format!(
                "the errored state {errored_base} (what Terraform could not save) records 1 managed resource instance(s) that the state does not: terraform_data.vm[0] (id b)"
            )),
            "{msg}"
        );
        let blocked = d
            .conditions
            .iter()
            .find(|c| c.type_ == crate::api::conditions::DELETION_BLOCKED)
            .expect("DeletionBlocked");
        assert_eq!(
            (blocked.status, blocked.reason),
            (crate::api::conditions::Status::True, "ErroredState")
        );
        // One that cannot be read holds too.
        let mut unreadable = errored(&["a"]);
        if let state::Errored::Pushed(s) = &mut unreadable[0] {
            s.base = Some(b"not gzip".to_vec());
        }
        o.errored = unreadable;
        assert!(
            matches!(blocker(&o), Some(Blocker::ErroredState(m)) if m.contains("cannot be read")),
            "{:?}",
            blocker(&o)
        );
        // An empty state (an apply that could not save left only the errored state):
        // held, not cleaned up and released.
        let empty =
            serde_json::json!({"version": 4, "serial": 1, "lineage": "l-1", "resources": []});
        o.state = Some(StateSecrets::from_secrets(
            &base,
            &[state_secrets_of(&base, &empty, &[])],
        ));
        o.errored = errored(&["b"]);
        let (d, _, _) = decide(&o, &Settings::default());
        assert_eq!(
            (d.row, d.runbook),
            (
                Some(Row::FailedOrBlocked),
                Some(crate::rules::RUNBOOK_ERRORED_STATE)
            ),
            "{}",
            d.deleting().message
        );
        // Abandon still releases.
        o.errored = errored(&["b"]);
        o.meta
            .annotations
            .get_or_insert_default()
            .insert(names::ABANDON.to_string(), "uid-1".to_string());
        let (d, _, _) = decide(&o, &Settings::default());
        assert_eq!(d.action, Action::Abandon);
    }

    #[test]
    fn an_abandon_releases_only_the_object_whose_uid_it_names() {
        let applied = (names::APPLIED_AT, "2026-11-30T10:00:00Z");
        let decide_with = |value: &str| {
            let mut o = observed(Kind::TerraformMachine, &[applied, (names::ABANDON, value)]);
            o.state = Some(StateSecrets::from_secrets(
                &names::state_secret_name("prod.tfm"),
                &[],
            ));
            decide(&o, &Settings::default()).0
        };
        // The uid of this object: released without a destroy.
        let d = decide_with("uid-1");
        assert_eq!(
            (d.row, d.action),
            (Some(Row::StateMissing), Action::Abandon)
        );
        // "true" (left in a GitOps repository) or an earlier object's uid: held, saying so.
        for other in ["true", "uid-0"] {
            let d = decide_with(other);
            assert_eq!(
                (d.row, d.action),
                (Some(Row::StateMissing), Action::Hold),
                "{other}"
            );
            let msg = &d.deleting().message;
            assert!(
                msg.contains(&format!("is \"{other}\", not this object's uid uid-1"))
                    && msg.contains("runbooks/Abandon.md"),
                "{msg}"
            );
        }
    }

    #[test]
    fn deletion_bookkeeping_of_an_earlier_object_is_not_this_objects() {
        // Recreated from a YAML saved during an earlier object's cleanup: its markers were
        // written under the earlier uid, and its state still lists 2 instances.
        let earlier = [
            (names::APPLIED_AT, "2026-11-30T10:00:00Z"),
            (names::CLEANUP_STARTED, names::CLEANUP_DESTROYED),
            (names::DESTROY_ATTEMPT, "3"),
            (names::DESTROY_FAILED_AT, "2026-11-30T11:00:00Z"),
            (names::DELETION_UID, "uid-0"),
        ];
        let mut o = observed(Kind::TerraformMachine, &earlier);
        o.state = Some(machine_state("l-1", 4, 2));
        let (f, _) = gather(&o, &Settings::default());
        assert_eq!(f.cleanup, None);
        assert_eq!(
            (f.attempt, &f.last_attempt),
            (0, &LastAttempt::NoneFinished)
        );
        // The same bookkeeping under this object's uid is its own: cleanup goes on.
        let mut own = earlier;
        own[4] = (names::DELETION_UID, "uid-1");
        o.meta = meta(&own);
        let (f, _) = gather(&o, &Settings::default());
        assert_eq!(f.cleanup, Some(CleanupMarker::Destroyed));
        assert_eq!(f.attempt, 3);
        // A failure time older than the object is not this object's.
        o.meta.creation_timestamp = Some(Time("2026-12-01T09:00:00Z".parse().expect("time")));
        assert_eq!(
            deletion_bookkeeping(&o.meta, names::DESTROY_FAILED_AT),
            None
        );
        assert_eq!(
            deletion_bookkeeping(&o.meta, names::DESTROY_ATTEMPT),
            Some("3")
        );
    }

    #[test]
    fn adopt_does_not_turn_off_the_fingerprint_check() {
        // Adopted earlier (its fingerprint recorded at serial 10), then an older backup of
        // the same lineage was restored over the state: held, not destroyed against.
        let mut o = observed(
            Kind::TerraformMachine,
            &[
                (names::ADOPT, "true"),
                (names::STATE_LINEAGE, "l-1"),
                (names::STATE_SERIAL, "10"),
            ],
        );
        o.state = Some(machine_state("l-1", 3, 2));
        let (d, f, _) = decide(&o, &Settings::default());
        assert_eq!((d.row, d.action), (Some(Row::StateUntrusted), Action::Hold));
        assert!(
            matches!(
                f.state,
                StateFacts::Unreadable {
                    why: Unreadable::Inconsistent,
                    ..
                }
            ),
            "{:?}",
            f.state
        );
        // With no fingerprint recorded yet, adopt takes the state as it is.
        o.meta = meta(&[(names::ADOPT, "true")]);
        let (_, f, _) = decide(&o, &Settings::default());
        assert!(
            matches!(f.state, StateFacts::Readable { serial: 3, .. }),
            "{:?}",
            f.state
        );
    }

    #[test]
    fn a_gone_owner_blocks_the_destroy_unless_the_operator_names_this_object() {
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
        let sha = rebuilt_sha(Kind::TerraformCluster);
        let mut o = observed(Kind::TerraformCluster, &[(names::INPUTS_SHA256, &sha)]);
        o.meta.owner_references = Some(vec![OwnerReference {
            api_version: "cluster.x-k8s.io/v1beta2".into(),
            kind: "Cluster".into(),
            name: "prod".into(),
            uid: "c-1".into(),
            ..Default::default()
        }]);
        // The Cluster exists with the owner's uid: nothing gone.
        let found = |uid: Option<&str>| {
            let uid = uid.map(str::to_string);
            move |kind: &str, name: &str| {
                (kind == "Cluster" && name == "prod")
                    .then(|| uid.clone())
                    .flatten()
            }
        };
        assert!(owners_gone(&o.meta, found(Some("c-1"))).is_empty());
        assert!(
            owners_gone(&o.meta, found(Some(""))).is_empty(),
            "uid unknown"
        );
        let other = owners_gone(&o.meta, found(Some("c-2")));
        assert_eq!(
            other,
            ["Cluster prod exists with uid c-2, not the owner's uid c-1"]
        );
        o.owners_gone = owners_gone(&o.meta, found(None));
        assert_eq!(o.owners_gone, ["Cluster prod (uid c-1) no longer exists"]);
        assert!(matches!(blocker(&o), Some(Blocker::OwnerGone(_))));
        // Set to this object's uid, the operator's annotation lets the destroy start.
        o.meta
            .annotations
            .get_or_insert_with(Default::default)
            .insert(names::DESTROY_WITHOUT_OWNER.into(), "uid-1".into());
        assert_eq!(blocker(&o), None);
        // Set to anything else, it does not.
        o.meta
            .annotations
            .get_or_insert_with(Default::default)
            .insert(names::DESTROY_WITHOUT_OWNER.into(), "true".into());
        assert!(matches!(blocker(&o), Some(Blocker::OwnerGone(_))));
    }

    #[test]
    fn a_secret_terraform_would_select_with_the_state_makes_it_inconsistent() {
        let mut o = observed(
            Kind::TerraformMachine,
            &[(names::APPLIED_AT, "2026-11-30T10:00:00Z")],
        );
        let secrets = machine_state("l-1", 4, 2);
        let selector = inputs::state_selector(Kind::TerraformMachine, "prod", "uid-1");
        let base = names::state_secret_name("prod.tfm");
        let copy = |labels: &BTreeMap<String, String>| Secret {
            metadata: ObjectMeta {
                name: Some(format!("{base}-bak")),
                labels: Some(labels.clone()),
                ..Default::default()
            },
            ..Default::default()
        };
        // A copy under an earlier object's uid is not selected by this object's runner.
        let mut earlier = selector.clone();
        earlier.insert(names::LABEL_OWNER_UID.into(), "uid-0".into());
        let with = |c: Secret| {
            let mut all = vec![c];
            all.push(Secret {
                metadata: ObjectMeta {
                    name: Some(base.clone()),
                    ..Default::default()
                },
                data: Some(
                    [(
                        "tfstate".to_string(),
                        ByteString(secrets.base.clone().expect("base")),
                    )]
                    .into(),
                ),
                ..Default::default()
            });
            StateSecrets::from_secrets(&base, &all)
        };
        o.state = Some(with(copy(&earlier)));
        let (d, _, _) = decide(&o, &Settings::default());
        assert_eq!(
            d.row,
            Some(Row::FailedOrBlocked),
            "readable: its inputs are missing"
        );
        // With every label Terraform selects by: held, naming the copy.
        o.state = Some(with(copy(&selector)));
        let (d, f, _) = decide(&o, &Settings::default());
        assert_eq!((d.row, d.action), (Some(Row::StateUntrusted), Action::Hold));
        match f.state {
            StateFacts::Unreadable {
                why: Unreadable::Inconsistent,
                message,
            } => assert!(message.contains(&format!("{base}-bak")), "{message}"),
            other => panic!("{other:?}"),
        }
    }
}
