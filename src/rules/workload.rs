//! The workload cluster's cleanup before its infrastructure goes (docs/14-workload-cleanup.md):
//! its four steps, each step's finalize period and what it ignores, as pure functions of
//! what one pass listed in the workload cluster. No client and no clock: the time is an
//! input. The controller ([`crate::controller::workload`]) lists, calls [`plan_step`] step
//! by step, and acts on the first step with work left.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use jiff::{SignedDuration, Timestamp};

use crate::api::names;

#[path = "workload_kinds.rs"]
mod kinds;

use kinds::{EXTENDED_APIS, PVC, RESOURCES, SERVICE, SNAPSHOTS, WEBHOOKS};
pub use kinds::{SNAPSHOT_GROUP, Target};

/// The steps, in their order: each starts when the one before has nothing left.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Step {
    /// Validating and mutating webhook configurations: they could refuse the deletes of
    /// the steps after them.
    Webhooks,
    /// APIServices and CustomResourceDefinitions (the objects they serve go with them).
    ExtendedApis,
    /// Workloads, Services and PersistentVolumeClaims: load balancers and disks.
    Resources,
    /// VolumeSnapshots and VolumeSnapshotContents.
    Snapshots,
}

/// Five minutes and an hour: the finalize periods a step has unless the Cluster says
/// otherwise.
const FIVE_MINUTES: Duration = Duration::from_secs(300);
const ONE_HOUR: Duration = Duration::from_secs(3600);

/// The longest finalize period a Cluster may set (7 days): a cleanup that the workload
/// cluster answers always ends.
pub const MAX_FINALIZE_AFTER: Duration = Duration::from_secs(7 * 24 * 3600);

/// The longest grace period a cleanup's delete asks for (a Pod's time to stop).
pub const DELETE_GRACE: Duration = FIVE_MINUTES;

impl Step {
    pub const ALL: [Step; 4] = [
        Step::Webhooks,
        Step::ExtendedApis,
        Step::Resources,
        Step::Snapshots,
    ];

    /// 1 to 4.
    pub fn number(self) -> usize {
        self as usize + 1
    }

    /// The step's name in conditions, Events and the metric's `step` label.
    pub fn as_str(self) -> &'static str {
        match self {
            Step::Webhooks => "Webhooks",
            Step::ExtendedApis => "ExtendedAPIs",
            Step::Resources => "Resources",
            Step::Snapshots => "Snapshots",
        }
    }

    /// What the step deletes, in words.
    pub fn what(self) -> &'static str {
        match self {
            Step::Webhooks => "webhook configurations",
            Step::ExtendedApis => "APIServices and CustomResourceDefinitions",
            Step::Resources => "workloads, Services and PersistentVolumeClaims",
            Step::Snapshots => "volume snapshots",
        }
    }

    /// How long after its deletion an object of this step keeps its finalizers before
    /// they are removed by force, when the Cluster does not say.
    pub fn default_finalize_after(self) -> Duration {
        match self {
            Step::Webhooks | Step::Resources => FIVE_MINUTES,
            Step::ExtendedApis | Step::Snapshots => ONE_HOUR,
        }
    }

    /// The Cluster annotation that overrides [`Step::default_finalize_after`] (seconds).
    pub fn finalize_annotation(self) -> &'static str {
        match self {
            Step::Webhooks => names::WORKLOAD_CLEANUP_WEBHOOKS_SECONDS,
            Step::ExtendedApis => names::WORKLOAD_CLEANUP_EXTENDED_APIS_SECONDS,
            Step::Resources => names::WORKLOAD_CLEANUP_RESOURCES_SECONDS,
            Step::Snapshots => names::WORKLOAD_CLEANUP_SNAPSHOTS_SECONDS,
        }
    }

    /// The kinds this step deletes; with `only_services_and_volumes` (the Cluster's skip
    /// annotation) only Services and PersistentVolumeClaims, in the Resources step.
    pub fn targets(self, only_services_and_volumes: bool) -> &'static [Target] {
        const LIMITED: [Target; 2] = [SERVICE, PVC];
        match (self, only_services_and_volumes) {
            (Step::Resources, true) => &LIMITED,
            (_, true) => &[],
            (Step::Webhooks, false) => &WEBHOOKS,
            (Step::ExtendedApis, false) => &EXTENDED_APIS,
            (Step::Resources, false) => &RESOURCES,
            (Step::Snapshots, false) => &SNAPSHOTS,
        }
    }
}

/// What a Cluster's annotations ask of its cleanup.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Settings {
    /// Whether the cleanup runs for this Cluster.
    pub enabled: bool,
    /// Only Services and PersistentVolumeClaims ([`names::WORKLOAD_CLEANUP_SKIP`]).
    pub only_services_and_volumes: bool,
    /// Each step's finalize period.
    pub finalize_after: BTreeMap<Step, Duration>,
    /// Annotations that could not be read, each with what was used instead.
    pub problems: Vec<String>,
}

impl Settings {
    /// The settings of a Cluster with these annotations, on a manager whose default is
    /// `enabled_by_default` (`--workload-cleanup`).
    pub fn of(annotations: &BTreeMap<String, String>, enabled_by_default: bool) -> Settings {
        let mut problems = Vec::new();
        let mut flag = |key: &str, default: bool| match annotations.get(key).map(|v| v.trim()) {
            None => default,
            Some("true") => true,
            Some("false") => false,
            Some(other) => {
                problems.push(format!(
                    "annotation {key}: {other:?} is neither \"true\" nor \"false\": {default} is used"
                ));
                default
            }
        };
        let enabled = flag(names::WORKLOAD_CLEANUP, enabled_by_default);
        let only_services_and_volumes = flag(names::WORKLOAD_CLEANUP_SKIP, false);
        let finalize_after = Step::ALL
            .into_iter()
            .map(|step| {
                let default = step.default_finalize_after();
                let key = step.finalize_annotation();
                let period = match annotations.get(key).map(|v| v.trim()) {
                    None => default,
                    Some(v) => match v.parse::<u32>() {
                        Ok(s) if u64::from(s) > MAX_FINALIZE_AFTER.as_secs() => {
                            problems.push(format!(
                                "annotation {key}: {s} s is more than the {} s (7 days) a step may wait: {} s is used",
                                MAX_FINALIZE_AFTER.as_secs(),
                                MAX_FINALIZE_AFTER.as_secs()
                            ));
                            MAX_FINALIZE_AFTER
                        }
                        Ok(s) => Duration::from_secs(u64::from(s)),
                        Err(_) => {
                            problems.push(format!(
                                "annotation {key}: {v:?} is not a whole number of seconds: {} s is used",
                                default.as_secs()
                            ));
                            default
                        }
                    },
                };
                (step, period)
            })
            .collect();
        Settings {
            enabled,
            only_services_and_volumes,
            finalize_after,
            problems,
        }
    }

    pub fn finalize_after(&self, step: Step) -> Duration {
        self.finalize_after
            .get(&step)
            .copied()
            .unwrap_or_else(|| step.default_finalize_after())
    }
}

/// What the cleanup reads of one object of the workload cluster (its metadata).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Object {
    pub target: Target,
    pub namespace: Option<String>,
    pub name: String,
    pub created: Option<Timestamp>,
    pub deleting_since: Option<Timestamp>,
    pub finalizers: Vec<String>,
    pub labels: BTreeMap<String, String>,
}

impl Object {
    /// `Kind namespace/name` (or `Kind name`).
    pub fn describe(&self) -> String {
        match &self.namespace {
            Some(ns) => format!("{} {ns}/{}", self.target.kind, self.name),
            None => format!("{} {}", self.target.kind, self.name),
        }
    }
}

/// Why an object is left alone: it is never deleted and never waited for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Left {
    /// Labelled [`names::WORKLOAD_CLEANUP_EXCLUDE_LABEL`]`: "true"` by its owner.
    Labelled,
    /// In `kube-system`, where the cloud controller and the CSI driver that finish the
    /// cleanup (load balancers, disks) run.
    KubeSystem,
    /// The API server's own: the `default/kubernetes` Service, the APIServices it
    /// registers itself, the snapshot kinds' CRDs (the last step needs them).
    ApiServers,
    /// Its namespace is gone (finalized): nothing can clean it up any more.
    NamespaceGone,
    /// Made after the cleanup began plus its step's finalize period.
    CreatedLater,
}

/// Whether `o` is left alone, given the namespaces that exist (without them, every rule but
/// [`Left::NamespaceGone`]), when the cleanup `started`, and its step's finalize period.
pub fn left_alone(
    o: &Object,
    namespaces: Option<&BTreeSet<String>>,
    started: Timestamp,
    finalize_after: Duration,
) -> Option<Left> {
    if o.labels
        .get(names::WORKLOAD_CLEANUP_EXCLUDE_LABEL)
        .map(String::as_str)
        == Some("true")
    {
        return Some(Left::Labelled);
    }
    if o.namespace.as_deref() == Some("kube-system") {
        return Some(Left::KubeSystem);
    }
    let own = match o.target.kind {
        "Service" => o.namespace.as_deref() == Some("default") && o.name == "kubernetes",
        // kube-apiserver registers an APIService for each group it serves itself.
        "APIService" => o
            .labels
            .contains_key("kube-aggregator.kubernetes.io/automanaged"),
        "CustomResourceDefinition" => o
            .name
            .split_once('.')
            .is_some_and(|(_, group)| group == SNAPSHOT_GROUP),
        _ => false,
    };
    if own {
        return Some(Left::ApiServers);
    }
    if let (Some(ns), Some(existing)) = (&o.namespace, namespaces)
        && !existing.contains(ns)
    {
        return Some(Left::NamespaceGone);
    }
    if let Some(created) = o.created
        && created > add(started, finalize_after)
    {
        return Some(Left::CreatedLater);
    }
    None
}

/// What the cleanup does to one object now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Act {
    /// Delete it, asking for this grace period (seconds).
    Delete { grace_seconds: i64 },
    /// Remove its finalizers (its period has passed), then delete it at once.
    Force,
    /// Deleted already: wait; its finalizers go by force at `force_at`.
    Wait { force_at: Timestamp },
}

/// [`Act`] for an object not left alone: a finalize period of zero forces at once,
/// without a graceful deletion first.
pub fn act(o: &Object, now: Timestamp, finalize_after: Duration) -> Act {
    match o.deleting_since {
        _ if finalize_after.is_zero() => Act::Force,
        None => Act::Delete {
            grace_seconds: finalize_after.min(DELETE_GRACE).as_secs() as i64,
        },
        Some(since) => {
            let force_at = add(since, finalize_after);
            if now >= force_at {
                Act::Force
            } else {
                Act::Wait { force_at }
            }
        }
    }
}

fn add(t: Timestamp, d: Duration) -> Timestamp {
    SignedDuration::try_from(d)
        .ok()
        .and_then(|d| t.checked_add(d).ok())
        .unwrap_or(Timestamp::MAX)
}

/// One step's plan for this pass.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StepPlan {
    pub step: Step,
    /// The objects still there and not left alone, with what is done to each now.
    pub remaining: Vec<(Object, Act)>,
}

impl StepPlan {
    /// Whether the step has nothing left: the next step may start.
    pub fn done(&self) -> bool {
        self.remaining.is_empty()
    }

    /// The soonest time a finalizer of this step goes by force, if any waits for it.
    pub fn next_force(&self) -> Option<Timestamp> {
        self.remaining
            .iter()
            .filter_map(|(_, a)| match a {
                Act::Wait { force_at } => Some(*force_at),
                _ => None,
            })
            .min()
    }

    /// What a condition says of the step: its number and name, what remains (the first
    /// few by name), and when force applies.
    pub fn message(&self) -> String {
        let n = self.remaining.len();
        let mut names: Vec<String> = self
            .remaining
            .iter()
            .take(5)
            .map(|(o, _)| o.describe())
            .collect();
        if n > names.len() {
            names.push(format!("and {} more", n - names.len()));
        }
        let force = match self.next_force() {
            Some(t) => format!("; finalizers are removed by force from {t} on"),
            None => String::new(),
        };
        format!(
            "step {} of 4 ({}): {n} remaining: {}{force}",
            self.step.number(),
            self.step.what(),
            names.join(", ")
        )
    }
}

/// The plan of `step` for the objects listed of its kinds.
pub fn plan_step(
    step: Step,
    objects: Vec<Object>,
    namespaces: &BTreeSet<String>,
    started: Timestamp,
    settings: &Settings,
    now: Timestamp,
) -> StepPlan {
    let period = settings.finalize_after(step);
    let remaining = objects
        .into_iter()
        .filter(|o| left_alone(o, Some(namespaces), started, period).is_none())
        .map(|o| {
            let a = act(&o, now, period);
            (o, a)
        })
        .collect();
    StepPlan { step, remaining }
}

/// Whether a Machine of a Cluster carries the cleanup's pre-terminate hook
/// ([`names::WORKLOAD_CLEANUP_HOOK`]): on every Machine of a Cluster whose cleanup is on,
/// so that it is there before the Cluster's deletion reaches the Machine; off a Machine
/// deleted while its Cluster is not (a scale-down, a rollout: the workload cluster
/// stays); on every Machine, deleted ones too, while the Cluster's cleanup runs; off all
/// once it `finished` (done or given up), or when the cleanup is off.
pub fn hook_wanted(
    enabled: bool,
    cluster_deleting: bool,
    finished: bool,
    machine_deleting: bool,
) -> bool {
    match (enabled, cluster_deleting) {
        (false, _) => false,
        (true, true) => !finished,
        (true, false) => !machine_deleting,
    }
}

/// The start a TerraformCluster records (`workload-cleanup-started`), if it belongs to this
/// deletion of the Cluster: a start older than the Cluster's `deletionTimestamp` came with
/// YAML saved from an earlier object of the same name, and with it its end and failures,
/// which must not stand for this deletion's (a `finished` copied along would let the
/// Machines go with no cleanup at all). The deletionTimestamp has whole seconds, the start
/// is written after it was seen.
pub fn started_for(
    recorded: Option<Timestamp>,
    cluster_deleted_at: Timestamp,
) -> Option<Timestamp> {
    recorded.filter(|t| t.as_second() >= cluster_deleted_at.as_second())
}

/// When a cleanup that has failed since `since` gives up.
pub fn give_up_at(since: Timestamp, give_up_after: Duration) -> Timestamp {
    add(since, give_up_after)
}

#[cfg(test)]
#[path = "workload_tests.rs"]
mod tests;
