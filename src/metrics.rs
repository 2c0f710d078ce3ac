//! The manager's Prometheus metrics, kept and encoded by `prometheus-client` (the
//! OpenMetrics text format): counters by kind and outcome, and histograms of how long a
//! pass takes, how long it waits for the fair gate, and how long a runner Job ran.

use std::time::Duration;

use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter as PromCounter;
use prometheus_client::metrics::family::{Family, MetricConstructor};
use prometheus_client::metrics::gauge::Gauge as PromGauge;
use prometheus_client::metrics::histogram::{Histogram as PromHistogram, exponential_buckets};
use prometheus_client::registry::Registry;

type Labels = Vec<(String, String)>;

fn labels(names: &[&str], values: &[&str]) -> Labels {
    names
        .iter()
        .zip(values)
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// A counter family with a fixed list of label names (`_total` is added to its name).
pub struct Counter {
    labels: &'static [&'static str],
    family: Family<Labels, PromCounter>,
}

impl Counter {
    fn register(
        registry: &mut Registry,
        name: &str,
        help: &str,
        labels: &'static [&'static str],
    ) -> Counter {
        let family = Family::<Labels, PromCounter>::default();
        registry.register(name, help, family.clone());
        Counter { labels, family }
    }

    pub fn inc(&self, values: &[&str]) {
        self.family
            .get_or_create(&labels(self.labels, values))
            .inc();
    }

    pub fn get(&self, values: &[&str]) -> u64 {
        self.family
            .get_or_create(&labels(self.labels, values))
            .get()
    }
}

/// A gauge family with a fixed list of label names: what is so now.
pub struct Gauge {
    labels: &'static [&'static str],
    family: Family<Labels, PromGauge>,
}

impl Gauge {
    fn register(
        registry: &mut Registry,
        name: &str,
        help: &str,
        labels: &'static [&'static str],
    ) -> Gauge {
        let family = Family::<Labels, PromGauge>::default();
        registry.register(name, help, family.clone());
        Gauge { labels, family }
    }

    pub fn inc(&self, values: &[&str]) {
        self.family
            .get_or_create(&labels(self.labels, values))
            .inc();
    }

    pub fn dec(&self, values: &[&str]) {
        self.family
            .get_or_create(&labels(self.labels, values))
            .dec();
    }

    pub fn get(&self, values: &[&str]) -> i64 {
        self.family
            .get_or_create(&labels(self.labels, values))
            .get()
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

/// A histogram family of seconds with a fixed list of label names.
pub struct Histogram {
    labels: &'static [&'static str],
    family: Family<Labels, PromHistogram, Buckets>,
}

impl Histogram {
    /// Buckets from `first` seconds, doubling, `count` of them.
    fn register(
        registry: &mut Registry,
        name: &str,
        help: &str,
        labels: &'static [&'static str],
        first: f64,
        count: u16,
    ) -> Histogram {
        let family = Family::new_with_constructor(Buckets { first, count });
        registry.register(name, help, family.clone());
        Histogram { labels, family }
    }

    pub fn observe(&self, values: &[&str], took: Duration) {
        self.family
            .get_or_create(&labels(self.labels, values))
            .observe(took.as_secs_f64());
    }
}

/// The manager's metrics.
pub struct Metrics {
    registry: Registry,
    pub reconciles: Counter,
    pub reconcile_errors: Counter,
    pub decisions: Counter,
    pub destroy_attempts: Counter,
    pub destroy_failures: Counter,
    pub held: Counter,
    pub apply_attempts: Counter,
    pub apply_failures: Counter,
    /// Live objects whose deletion, asked now, would not finish by itself (their
    /// `DeletionReady` is False or Unknown), by kind and reason.
    pub deletion_not_ready: Gauge,
    /// Clusters marked for disposal, by state (pending, held, due, deleting).
    pub clusters_in_disposal: Gauge,
    /// The end of the soonest pending disposal's retention (Unix seconds; 0 when none).
    pub disposal_next_deletion: PromGauge,
    /// How long a pass took, by kind.
    pub pass_seconds: Histogram,
    /// How long a pass waited for the fair gate, by kind.
    pub gate_wait_seconds: Histogram,
    /// How long a runner Job ran, from its start to its end, by kind, operation and
    /// outcome.
    pub job_seconds: Histogram,
}

impl Default for Metrics {
    fn default() -> Self {
        let mut r = Registry::default();
        let reconciles = Counter::register(
            &mut r,
            "captf_reconciles",
            "Reconcile passes by kind",
            &["kind"],
        );
        let reconcile_errors = Counter::register(
            &mut r,
            "captf_reconcile_errors",
            "Reconcile passes that failed, by kind and error",
            &["kind", "error"],
        );
        let decisions = Counter::register(
            &mut r,
            "captf_deletion_decisions",
            "Deletion passes by kind and rule-table row",
            &["kind", "row"],
        );
        let destroy_attempts = Counter::register(
            &mut r,
            "captf_destroy_attempts",
            "Destroy Jobs started, by kind",
            &["kind"],
        );
        let destroy_failures = Counter::register(
            &mut r,
            "captf_destroy_failures",
            "Destroy attempts that failed, by kind and reason",
            &["kind", "reason"],
        );
        let apply_attempts = Counter::register(
            &mut r,
            "captf_apply_attempts",
            "Apply Jobs started, by kind",
            &["kind"],
        );
        let apply_failures = Counter::register(
            &mut r,
            "captf_apply_failures",
            "Apply attempts that failed, by kind and reason",
            &["kind", "reason"],
        );
        let held = Counter::register(
            &mut r,
            "captf_held_deletions",
            "Passes that held a deletion, by kind and reason",
            &["kind", "reason"],
        );
        let deletion_not_ready = Gauge::register(
            &mut r,
            "captf_deletion_not_ready",
            "Live objects whose deletion would not finish by itself if it were asked now (DeletionReady False or Unknown), by kind and reason",
            &["kind", "reason"],
        );
        let clusters_in_disposal = Gauge::register(
            &mut r,
            "captf_clusters_in_disposal",
            "Cluster API Clusters marked for disposal, by state (pending: the retention runs; held: over, held by disposal-hold; due: being deleted by CAPTF; deleting)",
            &["state"],
        );
        let disposal_next_deletion = PromGauge::default();
        r.register(
            "captf_disposal_next_deletion_timestamp_seconds",
            "When the soonest pending disposal deletes its Cluster (Unix seconds; 0 when no disposal is pending); time() subtracted from it is the time left",
            disposal_next_deletion.clone(),
        );
        let pass_seconds = Histogram::register(
            &mut r,
            "captf_pass_duration_seconds",
            "How long a reconcile pass took, by kind",
            &["kind"],
            0.005,
            14,
        );
        let gate_wait_seconds = Histogram::register(
            &mut r,
            "captf_gate_wait_seconds",
            "How long a pass waited for its turn (the fair pass limit), by kind",
            &["kind"],
            0.005,
            16,
        );
        let job_seconds = Histogram::register(
            &mut r,
            "captf_job_duration_seconds",
            "How long a runner Job ran, by kind, operation and outcome",
            &["kind", "operation", "outcome"],
            1.0,
            16,
        );
        Metrics {
            registry: r,
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
        }
    }
}

impl Metrics {
    /// The metrics in the OpenMetrics text format.
    pub fn render(&self) -> String {
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
        m.destroy_failures
            .inc(&["TerraformMachine", "BackoffLimitExceeded"]);
        m.destroy_failures
            .inc(&["TerraformMachine", "BackoffLimitExceeded"]);
        m.pass_seconds
            .observe(&["TerraformMachine"], Duration::from_millis(30));
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
        assert_eq!(
            m.destroy_failures
                .get(&["TerraformMachine", "BackoffLimitExceeded"]),
            2
        );
    }
}
