//! The docs against the product: the overview page's rule table against
//! `captf::rules::Row`, the flowchart of `docs/09-my-object-will-not-delete.md` against
//! what `captf explain` prints for every example in `examples/`, the layout pages against
//! the tree, and the Event tables against the reasons the manager publishes.

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde_json::Value;

use crate::runbooks::{captf_bin, repo};

/// The rows of the first Markdown table whose header starts with `| # |`: the cells of
/// each row, trimmed.
fn overview_table(markdown: &str) -> Vec<Vec<String>> {
    let mut rows = Vec::new();
    let mut in_table = false;
    for line in markdown.lines() {
        let line = line.trim();
        if !in_table {
            in_table = line.starts_with("| # |");
            continue;
        }
        if !line.starts_with('|') {
            break;
        }
        if line.starts_with("|---") {
            continue;
        }
        let cells: Vec<String> = line
            .trim_matches('|')
            .split('|')
            .map(|c| c.trim().to_string())
            .collect();
        rows.push(cells);
    }
    rows
}

#[test]
fn docs_table_matches_the_rule_table() {
    let text = std::fs::read_to_string(repo("docs/01-overview.md")).expect("overview");
    let table = overview_table(&text);
    let documented: Vec<(u8, String, String)> = table
        .iter()
        .map(|cells| {
            assert!(cells.len() >= 4, "a row of the table is short: {cells:?}");
            (
                cells[0]
                    .parse()
                    .unwrap_or_else(|_| panic!("row number {:?}", cells[0])),
                cells[1].clone(),
                cells[3].clone(),
            )
        })
        .collect();
    let product: Vec<(u8, String, String)> = captf::rules::Row::ALL
        .iter()
        .map(|r| {
            (
                r.number(),
                r.situation().to_string(),
                r.reason().to_string(),
            )
        })
        .collect();
    assert_eq!(
        documented, product,
        "docs/01-overview.md's table and rules::Row differ"
    );
}

/// The flowchart of docs/09 as a graph: node id → label, and edges (from, label, to).
struct Flowchart {
    labels: BTreeMap<String, String>,
    edges: Vec<(String, String, String)>,
}

/// Splits `ID["label"]` / `ID{"label"}` / `ID` into the id and the label, if any.
fn node(text: &str) -> (String, Option<String>) {
    let text = text.trim();
    match text.find(['[', '{']) {
        Some(i) => {
            let id = text[..i].trim().to_string();
            let label = text[i + 1..text.len() - 1]
                .trim()
                .trim_matches('"')
                .replace("<br/>", " ");
            (id, Some(label))
        }
        None => (text.to_string(), None),
    }
}

/// Parses the ```mermaid block: each line is `A --> B` or `A -- label --> B`, where A and
/// B are node ids optionally followed by their label. Labels in quotes have their quotes
/// removed.
fn flowchart(markdown: &str) -> Flowchart {
    let start = markdown.find("```mermaid").expect("a mermaid block");
    let body = &markdown[start..];
    let body = &body[body.find('\n').expect("newline") + 1..];
    let body = &body[..body.find("```").expect("end of mermaid")];
    let mut f = Flowchart {
        labels: BTreeMap::new(),
        edges: Vec::new(),
    };
    for line in body.lines().map(str::trim) {
        let Some((left, right)) = line.split_once("-->") else {
            continue;
        };
        let (from, label) = match left.split_once(" -- ") {
            Some((from, label)) => (from, label.trim().trim_matches('"').to_string()),
            None => (left, String::new()),
        };
        let (from_id, from_label) = node(from);
        let (to_id, to_label) = node(right);
        for (id, l) in [(&from_id, from_label), (&to_id, to_label)] {
            if let Some(l) = l {
                f.labels.insert(id.clone(), l);
            }
        }
        f.edges.push((from_id, label, to_id));
    }
    f
}

/// The words after `KEY = ` in a decision label, as alternatives split on ` or `
/// (`DELETING = DestroyFailed or DestroyCannotStart?` → both).
fn alternatives(label: &str, key: &str) -> Option<Vec<String>> {
    let at = label.find(&format!("{key} = "))? + key.len() + 3;
    let mut words = Vec::new();
    let mut it = label[at..].split_whitespace();
    while let Some(w) = it.next() {
        words.push(w.trim_end_matches('?').to_string());
        if w.ends_with('?') || it.clone().next() != Some("or") {
            break;
        }
        it.next();
    }
    Some(words)
}

impl Flowchart {
    /// Follows the chart for an object with this `Deleting` and `StateReadable` reason:
    /// from the node nothing points to, a node with one unlabelled edge is followed; at a
    /// decision with `yes`/`no` edges, `yes` is taken when the label's `DELETING = …`
    /// (and `STATE = …`, if it says one) hold, and a decision that names neither (`DELETING
    /// empty or not updated?`) is answered `no` (the object is handled); at a decision
    /// with other edge labels, the edge labelled with the state or Deleting reason is
    /// taken, else `no`. Returns the leaf's id and label.
    fn walk(&self, deleting: &str, state: &str) -> (String, String) {
        let mut at = self
            .labels
            .keys()
            .find(|id| !self.edges.iter().any(|(_, _, to)| to == *id))
            .expect("a start node")
            .clone();
        for _ in 0..100 {
            let out: Vec<&(String, String, String)> =
                self.edges.iter().filter(|(f, _, _)| *f == at).collect();
            if out.is_empty() {
                return (at.clone(), self.labels[&at].clone());
            }
            let label = &self.labels[&at];
            let pick = |l: &str| {
                out.iter()
                    .find(|(_, el, _)| el == l)
                    .map(|(_, _, to)| to.clone())
            };
            at = if out.len() == 1 && out[0].1.is_empty() {
                out[0].2.clone()
            } else if pick("yes").is_some() {
                let holds = match alternatives(label, "DELETING") {
                    None => false,
                    Some(d) => {
                        d.iter().any(|x| x == deleting)
                            && alternatives(label, "STATE")
                                .is_none_or(|s| s.iter().any(|x| x == state))
                    }
                };
                pick(if holds { "yes" } else { "no" }).expect("a no edge")
            } else {
                pick(state)
                    .or_else(|| pick(deleting))
                    .or_else(|| pick("no"))
                    .unwrap_or_else(|| panic!("no way out of {at} for {deleting}/{state}"))
            };
        }
        panic!("the flowchart loops");
    }
}

/// The runbook a leaf leads to: the leaf's label when the whole label is a runbook path
/// (`runbooks/X.md`); a leaf that says something else (nothing to do, wait, read the log)
/// leads to no runbook.
fn leaf_runbook(label: &str) -> Option<String> {
    let l = label.trim();
    (l.starts_with("runbooks/") && l.ends_with(".md") && !l.contains(' ')).then(|| l.to_string())
}

#[test]
fn flowchart_walks_to_the_runbooks_it_draws() {
    let text =
        std::fs::read_to_string(repo("docs/09-my-object-will-not-delete.md")).expect("docs/09");
    let f = flowchart(&text);
    for (deleting, state, want) in [
        ("Paused", "Readable", Some("runbooks/Paused.md")),
        ("Held", "StateLost", Some("runbooks/StateLost.md")),
        ("Held", "StateEncrypted", Some("runbooks/StateEncrypted.md")),
        ("DestroyRunning", "Readable", None),
        (
            "DestroyCannotStart",
            "Readable",
            Some("runbooks/DestroyCannotStart.md"),
        ),
        ("Abandoning", "StateLost", Some("runbooks/Abandon.md")),
    ] {
        let (_, leaf) = f.walk(deleting, state);
        assert_eq!(
            leaf_runbook(&leaf).as_deref(),
            want,
            "{deleting}/{state}: {leaf}"
        );
    }
}

#[test]
fn explain_names_the_runbook_the_flowchart_leads_to() {
    let text =
        std::fs::read_to_string(repo("docs/09-my-object-will-not-delete.md")).expect("docs/09");
    let chart = flowchart(&text);
    let mut examples: Vec<PathBuf> = std::fs::read_dir(repo("examples"))
        .expect("examples")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    examples.sort();
    assert!(!examples.is_empty());
    let mut checked = 0;
    for file in &examples {
        let out = std::process::Command::new(captf_bin())
            .args(["explain", "-f"])
            .arg(file)
            .args(["-o", "json", "--now", "2026-12-01T12:00:00Z"])
            .env("KUBECONFIG", "/nonexistent")
            .output()
            .expect("run captf explain");
        assert!(
            out.status.success(),
            "{}: {}",
            file.display(),
            String::from_utf8_lossy(&out.stderr)
        );
        let items: Vec<Value> = serde_json::from_slice(&out.stdout).expect("explain JSON");
        for item in &items {
            if item["row"].is_null() {
                continue; // not being deleted: the chart starts at a deletionTimestamp
            }
            let reason_of = |t: &str| {
                item["conditions"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .find(|c| c["type"] == t)
                    .and_then(|c| c["reason"].as_str())
                    .unwrap_or_default()
                    .to_string()
            };
            let deleting = reason_of("Deleting");
            let state = reason_of("StateReadable");
            let (leaf, label) = chart.walk(&deleting, &state);
            let runbook = item["runbook"].as_str().map(str::to_string);
            assert_eq!(
                runbook,
                leaf_runbook(&label),
                "{} {}/{}: explain says row {} DELETING={deleting} STATE={state} runbook {:?}; the flowchart leads to {leaf} ({label})",
                file.display(),
                item["kind"],
                item["name"],
                item["row"],
                runbook
            );
            checked += 1;
        }
    }
    assert!(
        checked >= 10,
        "only {checked} deleting objects in the examples"
    );
}

/// The README's layout and docs/architecture.md name what is in the tree: every path they
/// name exists, and every module under src/ is in the README's layout.
#[test]
fn the_layout_pages_match_the_tree() {
    let architecture = std::fs::read_to_string(repo("docs/architecture.md")).expect("page");
    let layout = architecture
        .split("\n## The tree\n")
        .nth(1)
        .expect("a section \"The tree\" in docs/architecture.md");
    let block = layout
        .split("```")
        .nth(1)
        .expect("a code block in The tree");
    // Each line: paths separated by single spaces, then two or more spaces and the text.
    let named: Vec<String> = block
        .lines()
        .filter_map(|l| l.split("  ").next())
        .flat_map(|head| head.split_whitespace().map(str::to_string))
        .collect();
    for path in &named {
        assert!(
            repo(path).exists(),
            "docs/architecture.md's tree names {path}, which is not in the tree"
        );
    }
    let unlisted: Vec<String> = std::fs::read_dir(repo("src"))
        .expect("src")
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| !matches!(n.as_str(), "lib.rs" | "testing.rs") && !n.ends_with("_tests.rs"))
        .map(|n| format!("src/{n}"))
        .filter(|p| !named.iter().any(|n| n.trim_end_matches('/') == p))
        .collect();
    assert!(
        unlisted.is_empty(),
        "docs/architecture.md's tree does not name {unlisted:?}"
    );
    let mut cited = 0;
    for quoted in architecture.split('`').skip(1).step_by(2) {
        let path = quoted.split_whitespace().next().unwrap_or_default();
        let path = path.trim_end_matches(['.', ',', ')']);
        if let Some(rest) = path.strip_prefix("src/")
            && !rest.is_empty()
        {
            cited += 1;
            assert!(
                repo(path).exists(),
                "docs/architecture.md names {path}, which is not in the tree"
            );
        } else if path.ends_with(".rs") || path.ends_with('/') {
            let under_src = repo("src").join(path);
            let elsewhere = repo(path);
            let in_controller = repo("src/controller").join(path);
            assert!(
                under_src.exists() || elsewhere.exists() || in_controller.exists(),
                "docs/architecture.md names {path}, which is in neither src/ nor src/controller/"
            );
        }
    }
    assert!(cited > 10, "docs/architecture.md cites {cited} src/ paths");
    // Every path of the repository the contributor pages name, beyond src/, exists too.
    for page in [
        "docs/architecture.md",
        "docs/dependencies.md",
        "docs/testing.md",
    ] {
        let text = std::fs::read_to_string(repo(page)).expect(page);
        let paths = repository_paths(&text);
        assert!(!paths.is_empty(), "{page} names no path");
        let missing: Vec<&String> = paths.iter().filter(|p| !repo(p).exists()).collect();
        assert!(
            missing.is_empty(),
            "{page} names paths that do not exist: {missing:?}"
        );
    }
}

/// The backticked words of `text` that name a path of the repository: one word that
/// starts with one of its top-level directories.
fn repository_paths(text: &str) -> Vec<String> {
    const ROOTS: &[&str] = &[
        "src/",
        "tests/",
        "docs/",
        "benches/",
        "templates/",
        "config/",
        "release/",
        "examples/",
        "crds/",
        "runbooks/",
        "fuzz/",
    ];
    text.split('`')
        .skip(1)
        .step_by(2)
        .map(|t| t.trim_end_matches(['/', ':', ',']))
        .filter(|t| ROOTS.iter().any(|r| t.starts_with(r)))
        .filter(|t| !t.contains(char::is_whitespace) && !t.contains(['*', '<', '{']))
        .map(str::to_string)
        .collect()
}

#[test]
fn a_repository_path_is_told_from_other_backticked_words() {
    let text = "`src/state/scan/` and `src/a.rs`, not `cargo test`, `src/*.rs` or `kube`";
    assert_eq!(repository_paths(text), ["src/state/scan", "src/a.rs"]);
}

/// Every Event reason the manager publishes is in the destroy Job page's table of Events,
/// and the table names no other.
#[test]
fn the_event_reasons_are_the_documented_ones() {
    let page = std::fs::read_to_string(repo("docs/03-destroy-job.md")).expect("page");
    let table = page
        .split("## The Events of a deletion")
        .nth(1)
        .expect("an Events section");
    let documented: Vec<&str> = table
        .lines()
        .filter_map(|l| l.strip_prefix("| `"))
        .filter_map(|l| l.split('`').next())
        .collect();
    let mut published = captf::controller::events::REASONS.to_vec();
    published.sort_unstable();
    let mut listed = documented.clone();
    listed.sort_unstable();
    assert_eq!(listed, published, "docs/03-destroy-job.md's Events table");
}

/// Every Event reason of the apply path is in the lifecycle page's table of Events, and
/// the table names no other.
#[test]
fn the_apply_event_reasons_are_the_documented_ones() {
    let page = std::fs::read_to_string(repo("docs/provisioning/01-lifecycle.md")).expect("page");
    let table = page
        .split("## The Events of provisioning")
        .nth(1)
        .and_then(|t| t.split("\n## ").next())
        .expect("an Events section");
    let mut listed: Vec<&str> = table
        .lines()
        .filter_map(|l| l.strip_prefix("| `"))
        .filter_map(|l| l.split('`').next())
        .collect();
    listed.sort_unstable();
    let mut published = captf::controller::events::APPLY_REASONS.to_vec();
    published.sort_unstable();
    assert_eq!(
        listed, published,
        "docs/provisioning/01-lifecycle.md's Events table"
    );
}

/// Every `apiVersion` of CAPTF's group that a page shows (docs/, runbooks/, the READMEs)
/// is the version the CRDs serve: an example a reader applies as written must be taken.
#[test]
fn the_pages_show_the_api_version_the_crds_serve() {
    let prefix = format!("{}/", captf::api::names::GROUP);
    let mut pages = vec![repo("README.md"), repo("config/README.md")];
    for dir in ["docs", "docs/provisioning", "runbooks"] {
        for entry in std::fs::read_dir(repo(dir)).expect("a pages directory") {
            let path = entry.expect("entry").path();
            if path.extension().is_some_and(|e| e == "md") {
                pages.push(path);
            }
        }
    }
    let mut wrong = Vec::new();
    for page in &pages {
        let text = std::fs::read_to_string(page).expect("a page");
        for (n, line) in text.lines().enumerate() {
            for (at, _) in line.match_indices(&prefix) {
                let version: String = line[at + prefix.len()..]
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric())
                    .collect();
                if version.starts_with('v') && version != captf::api::names::VERSION {
                    wrong.push(format!("{}:{}: {version}", page.display(), n + 1));
                }
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "pages that show another version than {}: {wrong:?}",
        captf::api::names::VERSION
    );
}
