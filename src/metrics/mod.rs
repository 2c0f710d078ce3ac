//! The manager's Prometheus metrics, kept and encoded by `prometheus-client` (the
//! OpenMetrics text format): counters by kind and outcome, histograms of how long a
//! pass takes, how long it waits for the fair gate, and how long a runner Job ran, and
//! gauges of what is so now, counted at each scrape from the manager's caches
//! ([`census`]). docs/operations/metrics.md lists every family.

pub mod census;
pub mod labels;
mod present;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use jiff::Timestamp;
use prometheus_client::encoding::EncodeLabelSet;

use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter as PromCounter;
use prometheus_client::metrics::family::{Family, MetricConstructor};
use prometheus_client::metrics::gauge::Gauge as PromGauge;
use prometheus_client::metrics::histogram::{Histogram as PromHistogram, exponential_buckets};
use prometheus_client::registry::Registry;

pub use self::labels::{ByCause, ByError, ByJob, ByKind, ByRole, ByRow, ByState};
use crate::api::names::Kind;
use crate::state::permits::StateReads;
use present::Present;

/// What a label set of a family must be: typed (`EncodeLabelSet`), and a map key.
pub trait LabelSet:
    EncodeLabelSet + Clone + std::fmt::Debug + std::hash::Hash + Eq + Send + Sync + 'static
{
}

impl<T> LabelSet for T where
    T: EncodeLabelSet + Clone + std::fmt::Debug + std::hash::Hash + Eq + Send + Sync + 'static
{
}

/// A counter family with typed labels (`_total` is added to its name).
pub struct Counter<L: LabelSet> {
    family: Family<L, PromCounter>,
}

impl<L: LabelSet> Counter<L> {
    fn register(registry: &mut Registrar, name: &'static str, help: &str) -> Counter<L> {
        let family = Family::<L, PromCounter>::default();
        registry.add(name, help, family.clone());
        Counter { family }
    }

    pub fn inc(&self, labels: &L) {
        self.family.get_or_create(labels).inc();
    }

    pub fn get(&self, labels: &L) -> u64 {
        self.family.get_or_create(labels).get()
    }
}

/// A gauge family with typed labels, moved up and down by what is counted in it.
pub struct Gauge<L: LabelSet> {
    family: Family<L, PromGauge>,
}

impl<L: LabelSet> Gauge<L> {
    fn register(registry: &mut Registrar, name: &'static str, help: &str) -> Gauge<L> {
        let family = Family::<L, PromGauge>::default();
        registry.add(name, help, family.clone());
        Gauge { family }
    }

    pub fn inc(&self, labels: &L) {
        self.family.get_or_create(labels).inc();
    }

    pub fn dec(&self, labels: &L) {
        self.family.get_or_create(labels).dec();
    }

    pub fn get(&self, labels: &L) -> i64 {
        self.family.get_or_create(labels).get()
    }
}

/// Exponential buckets from `first` seconds, doubling, `count` of them.
#[derive(Clone, Copy)]
struct Buckets {
    first: f64,
    count: u16,
}

impl MetricConstructor<PromHistogram> for Buckets {
    fn new_metric(&self) -> PromHistogram {
        PromHistogram::new(exponential_buckets(self.first, 2.0, self.count))
    }
}

/// A histogram family of seconds with typed labels.
pub struct Histogram<L: LabelSet> {
    family: Family<L, PromHistogram, Buckets>,
}

impl<L: LabelSet> Histogram<L> {
    /// Buckets from `first` seconds, doubling, `count` of them.
    fn register(
        registry: &mut Registrar,
        name: &'static str,
        help: &str,
        first: f64,
        count: u16,
    ) -> Histogram<L> {
        let family = Family::new_with_constructor(Buckets { first, count });
        registry.add(name, help, family.clone());
        Histogram { family }
    }

    pub fn observe(&self, labels: &L, took: Duration) {
        self.family
            .get_or_create(labels)
            .observe(took.as_secs_f64());
    }
}

/// Where the census reads one kind's objects: the controller's cache.
pub type CensusSource = Arc<dyn Fn() -> Vec<census::Entry> + Send + Sync>;

/// The registry, and the names of the families registered in it (which `/metrics` shows
/// only once they have a sample).
#[derive(Default)]
struct Registrar {
    registry: Registry,
    names: Vec<&'static str>,
}

impl Registrar {
    fn add(
        &mut self,
        name: &'static str,
        help: &str,
        metric: impl prometheus_client::registry::Metric,
    ) {
        self.registry.register(name, help, metric);
        self.names.push(name);
    }
}

/// The manager's metrics.
pub struct Metrics {
    registry: Registry,
    families: Vec<&'static str>,
    present: Present,
    /// Each running controller's cache, read at each scrape.
    census: Mutex<BTreeMap<Kind, CensusSource>>,
    /// The state-read permits, once the manager runs.
    permits: Mutex<Option<Arc<StateReads>>>,
    /// Whether `captf_object_info` is kept (`--metrics-object-info`).
    object_info: AtomicBool,
    /// Secrets CAPTF wrote for objects that are gone, by role, as the last sweep found
    /// them (`captf orphans` lists them).
    pub orphaned_secrets: Family<ByRole, PromGauge>,
    pub reconciles: Counter<ByKind>,
    pub reconcile_errors: Counter<ByError>,
    pub decisions: Counter<ByRow>,
    pub destroy_attempts: Counter<ByKind>,
    pub destroy_failures: Counter<ByCause>,
    pub held: Counter<ByCause>,
    pub apply_attempts: Counter<ByKind>,
    pub apply_failures: Counter<ByCause>,
    /// Live objects whose deletion, asked now, would not finish by itself (their
    /// `DeletionReady` is False or Unknown), by kind and reason.
    pub deletion_not_ready: Gauge<ByCause>,
    /// Clusters marked for disposal, by state (pending, held, due, deleting).
    pub clusters_in_disposal: Gauge<ByState>,
    /// The end of the soonest pending disposal's retention (Unix seconds; 0 when none).
    pub disposal_next_deletion: PromGauge,
    /// How long a pass took, by kind.
    pub pass_seconds: Histogram<ByKind>,
    /// How long a pass waited for the fair gate, by kind.
    pub gate_wait_seconds: Histogram<ByKind>,
    /// How long a runner Job ran, from its start to its end, by kind, operation and
    /// outcome.
    pub job_seconds: Histogram<ByJob>,
    /// From a deletion's request (its deletionTimestamp) to the release of the object
    /// (its finalizer removed), by kind.
    pub release_seconds: Histogram<ByKind>,
    /// Workload cleanups that ended, by outcome (`CleanedUp`, `GaveUp`).
    pub workload_cleanups: Counter<labels::ByOutcome>,
    /// Objects of workload clusters whose finalizers a cleanup removed by force, by step.
    pub workload_objects_forced: Counter<labels::ByStep>,
}

impl Default for Metrics {
    fn default() -> Self {
        let mut r = Registrar::default();
        let reconciles = Counter::register(&mut r, "captf_reconciles", "Reconcile passes by kind");
        let reconcile_errors = Counter::register(
            &mut r,
            "captf_reconcile_errors",
            "Reconcile passes that failed, by kind and error",
        );
        let decisions = Counter::register(
            &mut r,
            "captf_deletion_decisions",
            "Deletion passes by kind and rule-table row",
        );
        let destroy_attempts = Counter::register(
            &mut r,
            "captf_destroy_attempts",
            "Destroy Jobs started, by kind",
        );
        let destroy_failures = Counter::register(
            &mut r,
            "captf_destroy_failures",
            "Destroy attempts that failed, by kind and reason",
        );
        let apply_attempts = Counter::register(
            &mut r,
            "captf_apply_attempts",
            "Apply Jobs started, by kind",
        );
        let apply_failures = Counter::register(
            &mut r,
            "captf_apply_failures",
            "Apply attempts that failed, by kind and reason",
        );
        let held = Counter::register(
            &mut r,
            "captf_held_deletions",
            "Passes that held a deletion, by kind and reason",
        );
        let deletion_not_ready = Gauge::register(
            &mut r,
            "captf_deletion_not_ready",
            "Live objects whose deletion would not finish by itself if it were asked now (DeletionReady False or Unknown), by kind and reason",
        );
        let clusters_in_disposal = Gauge::register(
            &mut r,
            "captf_clusters_in_disposal",
            "Cluster API Clusters marked for disposal, by state (pending: the retention runs; held: over, held by disposal-hold; due: being deleted by CAPTF; deleting)",
        );
        let disposal_next_deletion = PromGauge::default();
        r.add(
            "captf_disposal_next_deletion_timestamp_seconds",
            "When the soonest pending disposal deletes its Cluster (Unix seconds; 0 when no disposal is pending); time() subtracted from it is the time left",
            disposal_next_deletion.clone(),
        );
        let pass_seconds = Histogram::register(
            &mut r,
            "captf_pass_duration_seconds",
            "How long a reconcile pass took, by kind",
            0.005,
            14,
        );
        let gate_wait_seconds = Histogram::register(
            &mut r,
            "captf_gate_wait_seconds",
            "How long a pass waited for its turn (the fair pass limit), by kind",
            0.005,
            16,
        );
        let job_seconds = Histogram::register(
            &mut r,
            "captf_job_duration_seconds",
            "How long a runner Job ran, by kind, operation and outcome",
            1.0,
            16,
        );
        let release_seconds = Histogram::register(
            &mut r,
            "captf_release_duration_seconds",
            "From a deletion's request to the release of the object (the destroy, or an abandon, and the cleanup), by kind",
            0.25,
            20,
        );
        let workload_cleanups = Counter::register(
            &mut r,
            "captf_workload_cleanups",
            "Workload cleanups that ended before a Cluster's infrastructure went, by outcome (CleanedUp, GaveUp)",
        );
        let workload_objects_forced = Counter::register(
            &mut r,
            "captf_workload_objects_forced",
            "Objects of workload clusters whose finalizers a workload cleanup removed by force after their step's period, by step",
        );
        let present = Present::register(&mut r);
        let orphaned_secrets = Family::<ByRole, PromGauge>::default();
        r.add(
            "captf_orphaned_secrets",
            "Secrets CAPTF wrote for objects that are gone (state, inputs, backup, errored, abandoned-copy), by role, as the manager's last sweep found them; `captf orphans` lists them",
            orphaned_secrets.clone(),
        );
        Metrics {
            registry: r.registry,
            families: r.names,
            present,
            census: Mutex::new(BTreeMap::new()),
            permits: Mutex::new(None),
            object_info: AtomicBool::new(false),
            orphaned_secrets,
            reconciles,
            reconcile_errors,
            decisions,
            destroy_attempts,
            destroy_failures,
            held,
            apply_attempts,
            apply_failures,
            deletion_not_ready,
            clusters_in_disposal,
            disposal_next_deletion,
            pass_seconds,
            gate_wait_seconds,
            job_seconds,
            release_seconds,
            workload_cleanups,
            workload_objects_forced,
        }
    }
}

impl Metrics {
    /// The name of every family the manager exports (a counter's samples add `_total`, a
    /// histogram's `_bucket`, `_sum` and `_count`).
    pub fn families(&self) -> &[&'static str] {
        &self.families
    }

    /// Counts kind `kind`'s objects from `source` at each scrape (replacing the source of
    /// a controller that ran before).
    pub fn count_from(&self, kind: Kind, source: CensusSource) {
        self.census
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(kind, source);
    }

    /// Shows how the state-read permits are used at each scrape.
    pub fn watch_permits(&self, permits: Arc<StateReads>) {
        *self.permits.lock().unwrap_or_else(|e| e.into_inner()) = Some(permits);
    }

    /// Keeps one `captf_object_info` series per object.
    pub fn keep_object_info(&self, on: bool) {
        self.object_info.store(on, Ordering::Relaxed);
    }

    /// Sets the orphaned Secrets the sweep found, by role (every role it knows, at 0 when
    /// none).
    pub fn set_orphaned_secrets(&self, by_role: &BTreeMap<String, i64>) {
        self.orphaned_secrets.clear();
        for (role, n) in by_role {
            self.orphaned_secrets
                .get_or_create(&ByRole { role: role.clone() })
                .set(*n);
        }
    }

    /// The metrics in the OpenMetrics text format, the gauges of the present counted now.
    pub fn render(&self) -> String {
        self.render_at(Timestamp::now())
    }

    fn render_at(&self, now: Timestamp) -> String {
        // One scrape at a time counts and encodes (the families are cleared and set).
        let census = self.census.lock().unwrap_or_else(|e| e.into_inner());
        let kinds: Vec<Kind> = census.keys().copied().collect();
        let entries: Vec<census::Entry> = census.values().flat_map(|source| source()).collect();
        self.present.set(
            &kinds,
            &entries,
            now,
            self.object_info.load(Ordering::Relaxed),
        );
        if let Some(p) = self
            .permits
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_deref()
        {
            self.present.set_permits(p);
        }
        let mut out = String::new();
        if let Err(e) = encode(&mut out, &self.registry) {
            out = format!("# the metrics could not be encoded: {e}\n");
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_and_histograms_render_in_the_text_format() {
        let m = Metrics::default();
        let failed = ByCause::new(Kind::TerraformMachine, "BackoffLimitExceeded");
        m.destroy_failures.inc(&failed);
        m.destroy_failures.inc(&failed);
        m.pass_seconds.observe(
            &ByKind::of(Kind::TerraformMachine),
            Duration::from_millis(30),
        );
        let text = m.render();
        assert!(text.contains("captf_destroy_failures_total{kind=\"TerraformMachine\",reason=\"BackoffLimitExceeded\"} 2"), "{text}");
        assert!(
            text.contains("# TYPE captf_destroy_failures counter"),
            "{text}"
        );
        assert!(
            text.contains(
                "captf_pass_duration_seconds_bucket{le=\"0.04\",kind=\"TerraformMachine\"} 1"
            ),
            "{text}"
        );
        assert!(
            text.contains(
                "captf_pass_duration_seconds_bucket{le=\"0.02\",kind=\"TerraformMachine\"} 0"
            ),
            "{text}"
        );
        assert_eq!(m.destroy_failures.get(&failed), 2);
    }

    #[tokio::test]
    async fn the_gauges_of_the_present_are_counted_at_each_scrape_from_the_caches() {
        use census::{Entry, Phase, Reason};
        let m = Metrics::default();
        let asked = Timestamp::from_second(1_000).expect("a time");
        let entry = |name: &str, phase, held: Option<&str>| Entry {
            kind: Kind::TerraformMachine,
            namespace: "team-a".into(),
            name: name.into(),
            cluster: "prod".into(),
            phase,
            deleting: held.map(|_| Reason::new("Held")),
            held: held.map(|why| (Reason::new(why), asked)),
            destroy_failures: None,
            apply_blocked: None,
            apply_failures: 0,
        };
        let entries = Arc::new(Mutex::new(vec![
            entry("web-1", Phase::Provisioned, None),
            entry("web-2", Phase::Deleting, Some("StateLost")),
        ]));
        let source = entries.clone();
        m.count_from(
            Kind::TerraformMachine,
            Arc::new(move || source.lock().expect("entries").clone()),
        );
        let permits = Arc::new(StateReads::new(3));
        m.watch_permits(permits.clone());
        let _held = permits.acquire(crate::state::permits::Lane::Ordinary).await;
        let text = m.render_at(Timestamp::from_second(1_090).expect("a time"));
        for line in [
            "captf_state_read_permits_in_use 1",
            "captf_state_read_permits_waiting 0",
            "captf_state_read_longest_wait_seconds 0.0",
            "captf_objects{kind=\"TerraformMachine\",phase=\"provisioned\"} 1",
            "captf_objects{kind=\"TerraformMachine\",phase=\"deleting\"} 1",
            "captf_objects{kind=\"TerraformMachine\",phase=\"failing\"} 0",
            "captf_deletions_held{kind=\"TerraformMachine\",reason=\"StateLost\"} 1",
            "captf_deletion_held_oldest_seconds{kind=\"TerraformMachine\",reason=\"StateLost\"} 90.0",
            "captf_destroys_failing{kind=\"TerraformMachine\"} 0",
        ] {
            assert!(text.contains(line), "{line} in:\n{text}");
        }
        assert!(!text.contains("captf_object_info{"), "{text}");
        // The held deletion is released: its series go, the phase counts follow.
        entries.lock().expect("entries").pop();
        m.keep_object_info(true);
        let text = m.render_at(Timestamp::from_second(1_100).expect("a time"));
        assert!(!text.contains("captf_deletions_held{"), "{text}");
        assert!(
            text.contains("captf_objects{kind=\"TerraformMachine\",phase=\"deleting\"} 0"),
            "{text}"
        );
        assert!(text.contains("captf_object_info{kind=\"TerraformMachine\",namespace=\"team-a\",name=\"web-1\",cluster=\"prod\",phase=\"provisioned\"} 1"), "{text}");
    }
}
