//! The alert rules of config/prometheus/alerts.yaml and the dashboard of config/grafana: the rules pass `promtool check rules` and
//! their unit tests (tests/alerts/, `promtool test rules`, with the real promtool built
//! from the Go module tests/promtool pins), every series they and their tests name is one
//! the manager exports, and, on series recorded from a real manager
//! (tests/integration/watching.rs), they fire as the situation says.

use captf::metrics::Metrics;
use serde_json::Value;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::support::cluster::binaries;

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

/// The PrometheusRule's groups, as a Prometheus rule file (JSON is YAML).
fn rule_file() -> String {
    let text = std::fs::read_to_string(Path::new(ROOT).join("config/prometheus/alerts.yaml"))
        .expect("config/prometheus/alerts.yaml");
    let rule: Value = serde_saphyr::from_str(&text).expect("the PrometheusRule parses");
    assert_eq!(rule["kind"], "PrometheusRule");
    let groups = rule["spec"]["groups"].clone();
    assert!(groups.is_array(), "spec.groups in {rule}");
    serde_json::json!({ "groups": groups }).to_string()
}

/// A fresh folder holding the rule file as `alerts.rules.yaml`.
fn rules_dir(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("captf-alerts-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("a temporary folder");
    std::fs::write(dir.join("alerts.rules.yaml"), rule_file()).expect("the rule file");
    dir
}

/// Runs promtool with `args` in `dir`; panics with its output unless it succeeds.
fn promtool(dir: &Path, args: &[&str]) -> String {
    let bin = binaries().join("promtool");
    let out = Command::new(&bin)
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", bin.display()));
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success(),
        "promtool {} failed ({}):\n{text}",
        args.join(" "),
        out.status
    );
    text
}

#[test]
fn the_alert_rules_pass_promtool_and_their_unit_tests() {
    let dir = rules_dir("unit");
    let checked = promtool(&dir, &["check", "rules", "alerts.rules.yaml"]);
    assert!(checked.contains("SUCCESS: 11 rules found"), "{checked}");
    std::fs::copy(
        Path::new(ROOT).join("tests/alerts/alerts.test.yaml"),
        dir.join("alerts.test.yaml"),
    )
    .expect("the tests");
    let tested = promtool(&dir, &["test", "rules", "alerts.test.yaml"]);
    assert!(tested.contains("SUCCESS"), "{tested}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// The families the manager exports.
pub(crate) fn exported_families() -> BTreeSet<String> {
    Metrics::default()
        .families()
        .iter()
        .map(|f| f.to_string())
        .collect()
}

/// Whether `series` (a sample's name) belongs to one of `families`: a counter's samples
/// end in `_total`, a histogram's in `_bucket`, `_sum` and `_count`.
pub(crate) fn is_exported(families: &BTreeSet<String>, series: &str) -> bool {
    families.contains(series)
        || ["_total", "_bucket", "_sum", "_count"]
            .iter()
            .filter_map(|s| series.strip_suffix(s))
            .any(|f| families.contains(f))
}

/// Every `captf_…` name in `text`.
pub(crate) fn captf_names(text: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let mut rest = text;
    while let Some(at) = rest.find("captf_") {
        let name: String = rest[at..]
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect();
        rest = &rest[at + name.len()..];
        out.insert(name);
    }
    out
}

#[test]
fn every_series_the_alerts_name_is_one_the_manager_exports() {
    let families = exported_families();
    for family in [
        "captf_objects",
        "captf_deletions_held",
        "captf_reconciles",
        "captf_orphaned_secrets",
        "captf_state_read_longest_wait_seconds",
    ] {
        assert!(families.contains(family), "{family} in {families:?}");
    }
    let rules = rule_file();
    let tests = std::fs::read_to_string(Path::new(ROOT).join("tests/alerts/alerts.test.yaml"))
        .expect("the tests");
    let exprs: String = serde_json::from_str::<Value>(&rules).expect("rules")["groups"]
        .as_array()
        .expect("groups")
        .iter()
        .flat_map(|g| g["rules"].as_array().cloned().unwrap_or_default())
        .map(|r| r["expr"].as_str().unwrap_or_default().to_string())
        .collect::<Vec<_>>()
        .join("\n");
    let named: BTreeSet<String> = captf_names(&exprs)
        .into_iter()
        .chain(captf_names(&tests))
        .collect();
    assert!(named.len() >= 10, "{named:?}");
    let unknown: Vec<&String> = named
        .iter()
        .filter(|n| !is_exported(&families, n))
        .collect();
    assert!(
        unknown.is_empty(),
        "the alert rules or their tests name {unknown:?}, which the manager does not export ({families:?})"
    );
    // Every runbook a rule links by name is in runbooks/.
    for runbook in captf_runbooks(&rules) {
        assert!(
            Path::new(ROOT).join(&runbook).exists(),
            "an alert links {runbook}, which is not in the tree"
        );
    }
}

/// The runbooks the rules link by a fixed name (not by `{{ $labels.reason }}`).
fn captf_runbooks(rules: &str) -> BTreeSet<String> {
    rules
        .split("runbooks/")
        .skip(1)
        .filter_map(|rest| rest.split(".md").next())
        .filter(|name| !name.contains('{'))
        .map(|name| format!("runbooks/{name}.md"))
        .collect()
}

/// An alert a recorded run must raise, with its labels (besides `alertname` and
/// `severity`, which [`alerts_on_recorded`] adds from the rule).
pub(crate) struct Expected<'a> {
    pub alert: &'a str,
    pub at_minutes: u32,
    /// The labels of each alert expected to fire; empty: none fires.
    pub firing: Vec<Vec<(&'a str, &'a str)>>,
}

/// Runs the alert rules over `metrics` (the text of a real manager's `/metrics`), each
/// sample held at its value for two hours and labelled with the namespace Prometheus adds
/// to a scraped target, and checks `expected` with `promtool test rules` (annotations are
/// not compared: the unit tests do that).
pub(crate) fn alerts_on_recorded(tag: &str, metrics: &str, expected: &[Expected<'_>]) {
    let dir = rules_dir(tag);
    let rules: Value = serde_json::from_str(&rule_file()).expect("rules");
    let severity = |alert: &str| {
        rules["groups"]
            .as_array()
            .into_iter()
            .flatten()
            .flat_map(|g| g["rules"].as_array().cloned().unwrap_or_default())
            .find(|r| r["alert"] == alert)
            .map(|r| {
                r["labels"]["severity"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string()
            })
            .unwrap_or_else(|| panic!("no alert {alert} in config/prometheus/alerts.yaml"))
    };
    let series: Vec<Value> = metrics
        .lines()
        .filter(|l| l.starts_with("captf_"))
        .filter_map(|l| l.rsplit_once(' '))
        .map(|(name, value)| {
            let labelled = match name.split_once('{') {
                Some((n, rest)) => format!("{n}{{namespace=\"captf-system\",{rest}"),
                None => format!("{name}{{namespace=\"captf-system\"}}"),
            };
            serde_json::json!({ "series": labelled, "values": format!("{value}x120") })
        })
        .collect();
    assert!(!series.is_empty(), "no captf_ sample in:\n{metrics}");
    // promtool compares annotations too: the rule's own, rendered, are not known here, so
    // each expected alert is checked with annotations stripped from a copy of the rules.
    let mut bare = rules.clone();
    for g in bare["groups"].as_array_mut().into_iter().flatten() {
        for r in g["rules"].as_array_mut().into_iter().flatten() {
            if let Some(o) = r.as_object_mut() {
                o.remove("annotations");
            }
        }
    }
    std::fs::write(dir.join("alerts.rules.yaml"), bare.to_string()).expect("the rule file");
    let tests: Vec<Value> = expected
        .iter()
        .map(|e| {
            let firing: Vec<Value> = e
                .firing
                .iter()
                .map(|labels| {
                    let mut map: serde_json::Map<String, Value> = labels
                        .iter()
                        .map(|(k, v)| (k.to_string(), Value::from(*v)))
                        .collect();
                    map.insert("severity".into(), severity(e.alert).into());
                    map.insert("namespace".into(), "captf-system".into());
                    serde_json::json!({ "exp_labels": map })
                })
                .collect();
            serde_json::json!({
                "eval_time": format!("{}m", e.at_minutes),
                "alertname": e.alert,
                "exp_alerts": firing,
            })
        })
        .collect();
    let file = serde_json::json!({
        "rule_files": ["alerts.rules.yaml"],
        "evaluation_interval": "1m",
        "tests": [{ "interval": "1m", "input_series": series, "alert_rule_test": tests }],
    });
    std::fs::write(dir.join("recorded.test.yaml"), file.to_string()).expect("the test file");
    promtool(&dir, &["test", "rules", "recorded.test.yaml"]);
    let _ = std::fs::remove_dir_all(&dir);
}

/// The Grafana dashboard (config/grafana/captf-dashboard.json): every query parses as
/// PromQL (promtool checks each as a recording rule, with the dashboard's `$job` variable
/// given a value) and names only series the manager exports; panels have ids of their
/// own.
#[test]
fn every_query_of_the_dashboard_parses_and_names_a_series_the_manager_exports() {
    let text = std::fs::read_to_string(Path::new(ROOT).join("config/grafana/captf-dashboard.json"))
        .expect("the dashboard");
    let dash: Value = serde_json::from_str(&text).expect("the dashboard is JSON");
    let panels = dash["panels"].as_array().expect("panels");
    let ids: BTreeSet<u64> = panels.iter().filter_map(|p| p["id"].as_u64()).collect();
    assert_eq!(ids.len(), panels.len(), "each panel has an id of its own");
    let exprs: Vec<String> = panels
        .iter()
        .flat_map(|p| p["targets"].as_array().cloned().unwrap_or_default())
        .map(|t| t["expr"].as_str().expect("an expr").to_string())
        .collect();
    assert!(exprs.len() >= 15, "{exprs:?}");
    let families = exported_families();
    for e in &exprs {
        let names = captf_names(e);
        assert!(!names.is_empty(), "{e} reads no captf_ series");
        for n in names {
            assert!(is_exported(&families, &n), "{e}: {n} is not exported");
        }
    }
    let rules: Vec<Value> = exprs
        .iter()
        .enumerate()
        .map(|(i, e)| serde_json::json!({"record": format!("captf:panel_{i}"), "expr": e.replace("$job", ".*")}))
        .collect();
    let dir = std::env::temp_dir().join(format!("captf-dashboard-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("a temporary folder");
    std::fs::write(
        dir.join("panels.yaml"),
        serde_json::json!({"groups": [{"name": "panels", "rules": rules}]}).to_string(),
    )
    .expect("the rule file");
    let checked = promtool(&dir, &["check", "rules", "panels.yaml"]);
    assert!(
        checked.contains(&format!("SUCCESS: {} rules found", exprs.len())),
        "{checked}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
