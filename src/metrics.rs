//! Prometheus metrics in the text exposition format: a few labelled counters, no
//! registry crate needed.

use std::collections::BTreeMap;
use std::sync::Mutex;

/// A counter with a fixed list of label names.
pub struct Counter {
    name: &'static str,
    help: &'static str,
    labels: &'static [&'static str],
    values: Mutex<BTreeMap<Vec<String>, u64>>,
}

impl Counter {
    pub const fn new(
        name: &'static str,
        help: &'static str,
        labels: &'static [&'static str],
    ) -> Counter {
        Counter {
            name,
            help,
            labels,
            values: Mutex::new(BTreeMap::new()),
        }
    }

    pub fn inc(&self, values: &[&str]) {
        if let Ok(mut m) = self.values.lock() {
            *m.entry(values.iter().map(|v| v.to_string()).collect())
                .or_insert(0) += 1;
        }
    }

    pub fn get(&self, values: &[&str]) -> u64 {
        let key: Vec<String> = values.iter().map(|v| v.to_string()).collect();
        self.values
            .lock()
            .ok()
            .and_then(|m| m.get(&key).copied())
            .unwrap_or(0)
    }

    fn render(&self, out: &mut String) {
        out.push_str(&format!(
            "# HELP {} {}\n# TYPE {} counter\n",
            self.name, self.help, self.name
        ));
        if let Ok(m) = self.values.lock() {
            for (vals, n) in m.iter() {
                let labels: Vec<String> = self
                    .labels
                    .iter()
                    .zip(vals)
                    .map(|(k, v)| {
                        format!("{k}=\"{}\"", v.replace('\\', "\\\\").replace('"', "\\\""))
                    })
                    .collect();
                out.push_str(&format!("{}{{{}}} {n}\n", self.name, labels.join(",")));
            }
        }
    }
}

/// The manager's metrics.
pub struct Metrics {
    pub reconciles: Counter,
    pub reconcile_errors: Counter,
    pub decisions: Counter,
    pub destroy_attempts: Counter,
    pub destroy_failures: Counter,
    pub held: Counter,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics {
            reconciles: Counter::new(
                "captf_reconciles_total",
                "Reconcile passes by kind.",
                &["kind"],
            ),
            reconcile_errors: Counter::new(
                "captf_reconcile_errors_total",
                "Reconcile passes that failed, by kind and error.",
                &["kind", "error"],
            ),
            decisions: Counter::new(
                "captf_deletion_decisions_total",
                "Deletion passes by kind and rule-table row.",
                &["kind", "row"],
            ),
            destroy_attempts: Counter::new(
                "captf_destroy_attempts_total",
                "Destroy Jobs started, by kind.",
                &["kind"],
            ),
            destroy_failures: Counter::new(
                "captf_destroy_failures_total",
                "Destroy attempts that failed, by kind and reason.",
                &["kind", "reason"],
            ),
            held: Counter::new(
                "captf_held_deletions_total",
                "Passes that held a deletion, by kind and reason.",
                &["kind", "reason"],
            ),
        }
    }
}

impl Metrics {
    pub fn render(&self) -> String {
        let mut out = String::new();
        for c in [
            &self.reconciles,
            &self.reconcile_errors,
            &self.decisions,
            &self.destroy_attempts,
            &self.destroy_failures,
            &self.held,
        ] {
            c.render(&mut out);
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_render_in_the_text_format() {
        let m = Metrics::default();
        m.destroy_failures
            .inc(&["TerraformMachine", "BackoffLimitExceeded"]);
        m.destroy_failures
            .inc(&["TerraformMachine", "BackoffLimitExceeded"]);
        let text = m.render();
        assert!(text.contains("captf_destroy_failures_total{kind=\"TerraformMachine\",reason=\"BackoffLimitExceeded\"} 2"), "{text}");
        assert!(text.contains("# TYPE captf_reconciles_total counter"));
        assert_eq!(
            m.destroy_failures
                .get(&["TerraformMachine", "BackoffLimitExceeded"]),
            2
        );
    }
}
