//! `captf explain`, `captf state inspect` and `captf module check` as a user runs them: on
//! the shipped examples, state fixtures and modules, and on bad input.

use std::path::PathBuf;
use std::process::{Command, Output};

use serde_json::Value;

fn captf(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_captf"))
        .args(args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("run captf")
}

fn json(out: &Output) -> Value {
    assert!(
        out.status.success(),
        "exit {:?}: {}",
        out.status.code(),
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("JSON on stdout")
}

const NOW: &str = "2026-12-01T12:00:00Z";

/// Every example file, the row and action explain must print for its TerraformMachine
/// (or, for row 3, its TerraformCluster), and the runbook.
const EXAMPLES: [(&str, Option<u64>, &str, Option<&str>); 16] = [
    (
        "row1-paused.yaml",
        Some(1),
        "BookkeepingOnly",
        Some("runbooks/Paused.md"),
    ),
    (
        "row2-waiting-for-job.yaml",
        Some(2),
        "WaitForJob",
        Some("runbooks/WaitingForJob.md"),
    ),
    (
        "row3-dependents.yaml",
        Some(3),
        "WaitForDependents",
        Some("runbooks/DependentsExist.md"),
    ),
    ("row4-never-applied.yaml", Some(4), "RemoveFinalizer", None),
    (
        "row5-state-lost.yaml",
        Some(5),
        "Hold",
        Some("runbooks/StateLost.md"),
    ),
    (
        "row6-state-corrupt.yaml",
        Some(6),
        "Hold",
        Some("runbooks/StateCorrupt.md"),
    ),
    (
        "row6-state-encrypted.yaml",
        Some(6),
        "Hold",
        Some("runbooks/StateEncrypted.md"),
    ),
    (
        "row6-state-inconsistent.yaml",
        Some(6),
        "Hold",
        Some("runbooks/StateInconsistent.md"),
    ),
    ("row7-destroy.yaml", Some(7), "StartDestroy", None),
    ("row8-cleanup.yaml", Some(8), "CleanUp", None),
    ("row8-cleanup-marker.yaml", Some(8), "CleanUp", None),
    (
        "row9-destroy-failed.yaml",
        Some(9),
        "RetryLater",
        Some("runbooks/DestroyFailed.md"),
    ),
    (
        "row9-cannot-start.yaml",
        Some(9),
        "RetryLater",
        Some("runbooks/DestroyCannotStart.md"),
    ),
    (
        "row9-namespace-terminating.yaml",
        Some(9),
        "RetryLater",
        Some("runbooks/DestroyCannotStart.md"),
    ),
    (
        "abandon-state-lost.yaml",
        Some(5),
        "Abandon",
        Some("runbooks/Abandon.md"),
    ),
    ("not-deleting.yaml", None, "NotDeleting", None),
];

fn first_deciding(items: &Value) -> &Value {
    let items = items.as_array().expect("an array");
    items
        .iter()
        .find(|i| i["kind"] == "TerraformCluster")
        .unwrap_or(&items[0])
}

#[test]
fn explain_prints_the_row_of_every_example() {
    for (file, row, action, runbook) in EXAMPLES {
        let path = format!("examples/{file}");
        let out = json(&captf(&[
            "explain", "-f", &path, "-o", "json", "--now", NOW,
        ]));
        let item = first_deciding(&out);
        assert_eq!(item["row"].as_u64(), row, "{file}: {item:#}");
        assert_eq!(item["action"], action, "{file}: {item:#}");
        assert_eq!(item["runbook"].as_str(), runbook, "{file}: {item:#}");
        for key in [
            "kind",
            "namespace",
            "name",
            "row",
            "action",
            "conditions",
            "runbook",
            "nextRetryAt",
        ] {
            assert!(item.get(key).is_some(), "{file}: {key} missing");
        }
        let deleting = item["conditions"]
            .as_array()
            .expect("conditions")
            .iter()
            .find(|c| c["type"] == "Deleting");
        assert!(deleting.is_some(), "{file}: a Deleting condition");
    }
}

#[test]
fn explain_reads_the_whole_examples_directory() {
    let out = json(&captf(&[
        "explain",
        "-f",
        "examples/",
        "-o",
        "json",
        "--now",
        NOW,
    ]));
    let items = out.as_array().expect("array");
    // One object per example, plus row 3's machine and pool.
    assert!(items.len() >= 18, "{}", items.len());
    let rows: std::collections::BTreeSet<u64> =
        items.iter().filter_map(|i| i["row"].as_u64()).collect();
    assert_eq!(rows, (1..=9).collect(), "every row appears in the examples");
}

#[test]
fn explain_names_the_terraform_error_and_the_next_retry() {
    let out = json(&captf(&[
        "explain",
        "-f",
        "examples/row9-destroy-failed.yaml",
        "-o",
        "json",
        "--now",
        NOW,
    ]));
    let item = first_deciding(&out);
    let msg = item["conditions"][0]["message"].as_str().expect("message");
    assert!(msg.contains("403 Forbidden"), "{msg}");
    assert!(msg.contains("attempt 2"), "{msg}");
    assert!(item["nextRetryAt"].is_string());
}

#[test]
fn explain_text_output_names_row_action_and_runbook() {
    let out = captf(&[
        "explain",
        "-f",
        "examples/row5-state-lost.yaml",
        "--now",
        NOW,
    ]);
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("TerraformMachine row5-state-lost/web-1"),
        "{text}"
    );
    assert!(text.contains("row 5"), "{text}");
    assert!(text.contains("runbooks/StateLost.md"), "{text}");
}

/// An object not being deleted gets the apply table's verdict beside the deletion's: in
/// text, and as `apply` in JSON, from the function the live pass uses. The example's
/// machine is owned by its Cluster, not by a Machine: Cluster API has not named it yet.
#[test]
fn explain_shows_the_apply_table_for_an_object_not_being_deleted() {
    let out = captf(&["explain", "-f", "examples/not-deleting.yaml", "--now", NOW]);
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("  not being deleted\n"), "{text}");
    assert!(
        text.contains("  apply row A3: Cluster API has not set the object's owner yet\n")
            && text.contains("  apply action: wait\n")
            && text.contains("  Provisioned=Unknown WaitingForOwner: waiting for Cluster API to set the owner: the object must be named by a Machine's spec.infrastructureRef; see runbooks/WaitingForOwner.md\n")
            && text.contains("  apply runbook: runbooks/WaitingForOwner.md\n"),
        "{text}"
    );
    assert_eq!(
        text.matches("  Ready=").count(),
        1,
        "one Ready, the apply table's: {text}"
    );

    let out = captf(&[
        "explain",
        "-f",
        "examples/not-deleting.yaml",
        "-o",
        "json",
        "--now",
        NOW,
    ]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    let apply = &v[0]["apply"];
    assert_eq!(apply["row"], "A3", "{v}");
    assert_eq!(apply["action"], "wait");
    assert_eq!(apply["conditions"][0]["reason"], "WaitingForOwner");
    // An object being deleted has none.
    let out = captf(&[
        "explain",
        "-f",
        "examples/row5-state-lost.yaml",
        "-o",
        "json",
        "--now",
        NOW,
    ]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    assert!(v[0].get("apply").is_none(), "{v}");
}

fn misuse(args: &[&str], needle: &str) {
    let out = captf(args);
    assert_eq!(
        out.status.code(),
        Some(2),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(needle),
        "{args:?}: stderr {err:?} lacks {needle:?}"
    );
    assert!(!err.contains("panicked"), "{err}");
}

fn temp_file(name: &str, content: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("captf-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let path = dir.join(name);
    std::fs::write(&path, content).expect("write");
    path
}

#[test]
fn bad_input_is_a_clear_error_with_status_2() {
    misuse(
        &["explain", "-f", "examples/no-such-file.yaml"],
        "no-such-file.yaml",
    );
    let bad = temp_file(
        "bad.yaml",
        "apiVersion: v1\nkind: Secret\nmetadata: {name: [unclosed\n",
    );
    misuse(
        &["explain", "-f", bad.to_str().unwrap_or_default()],
        "bad.yaml",
    );
    let unknown = temp_file(
        "unknown.yaml",
        "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: web, namespace: a}\n",
    );
    misuse(
        &["explain", "-f", unknown.to_str().unwrap_or_default()],
        "Deployment web",
    );
    let no_ns = temp_file(
        "nons.yaml",
        "apiVersion: infrastructure.cluster.x-k8s.io/v1alpha1\nkind: TerraformMachine\nmetadata: {name: web-1}\nspec: {module: {source: x}}\n",
    );
    misuse(
        &["explain", "-f", no_ns.to_str().unwrap_or_default()],
        "no metadata.namespace",
    );
    misuse(
        &[
            "state",
            "inspect",
            "--secret-file",
            "examples/row1-paused.yaml",
        ],
        "is not a Secret",
    );
}

/// Three modules Terraform 1.11.4 validates, that `captf module check` once read wrongly:
/// an object type over several lines (a false warning), a comment in a destroy-time
/// provisioner (a false error, exit 1), a byte order mark (refused, exit 2). Each passes,
/// with no finding, in the documented JSON shape.
#[test]
fn module_check_reads_what_terraform_reads() {
    for (module, role) in [
        ("multiline-object-type", "cluster"),
        ("destroy-provisioner-comment", "machine"),
        ("byte-order-mark", "machine"),
    ] {
        let dir = format!("tests/fuzz/modules/{module}");
        let out = captf(&["module", "check", &dir, "--role", role, "-o", "json"]);
        assert_eq!(
            out.status.code(),
            Some(0),
            "{module}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        let report = json(&out);
        assert_eq!(report["role"], role, "{module}: {report}");
        assert_eq!(
            report["findings"],
            serde_json::json!([]),
            "{module}: {report}"
        );
    }
}

/// The example modules follow the contract, and the module contract page shows what the
/// command prints for the machine example.
#[test]
fn module_check_passes_the_example_modules_as_the_docs_show() {
    for role in ["cluster", "machine", "machine-pool"] {
        let dir = format!("examples/modules/{role}");
        let out = captf(&["module", "check", &dir, "--role", role]);
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{dir}: {text}");
        assert!(
            text.ends_with("ok: the module follows the contract\n"),
            "{dir}: {text}"
        );
    }
    let doc = std::fs::read_to_string(
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("docs/provisioning/02-module-contract.md"),
    )
    .expect("the module contract page");
    let after = doc
        .split("captf module check examples/modules/machine --role machine\n```\n\n```text\n")
        .nth(1)
        .expect("the page shows the machine example's output");
    let shown = &after[..after.find("```").expect("closed")];
    let out = captf(&[
        "module",
        "check",
        "examples/modules/machine",
        "--role",
        "machine",
    ]);
    assert_eq!(String::from_utf8_lossy(&out.stdout), shown);
    // The same module for a pool lacks the pool's required output: exit status 1.
    let out = captf(&[
        "module",
        "check",
        "examples/modules/machine",
        "--role",
        "machine-pool",
        "-o",
        "json",
    ]);
    assert_eq!(out.status.code(), Some(1));
    let report: Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert!(
        report["findings"]
            .as_array()
            .is_some_and(|f| f.iter().any(|f| f["message"]
                .as_str()
                .is_some_and(|m| m.contains("provider_id_list")))),
        "{report}"
    );
    // No module there: exit status 2, naming the directory.
    let out = captf(&[
        "module",
        "check",
        "examples/modules/none",
        "--role",
        "machine",
    ]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("examples/modules/none"), "{err}");
}

/// The example modules are valid Terraform: `terraform validate`, offline (they use only
/// Terraform's built-in provider).
#[test]
fn the_example_modules_are_valid_terraform() {
    for role in ["cluster", "machine", "machine-pool"] {
        let src =
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(format!("examples/modules/{role}"));
        let work = std::env::temp_dir().join(format!("captf-module-{role}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&work);
        std::fs::create_dir_all(&work).expect("work dir");
        std::fs::copy(src.join("main.tf"), work.join("main.tf")).expect("copy");
        for args in [
            &["init", "-backend=false", "-input=false", "-no-color"][..],
            &["validate", "-no-color"],
        ] {
            let out = Command::new("terraform")
                .args(args)
                .current_dir(&work)
                .output()
                .expect("run terraform");
            assert!(
                out.status.success(),
                "{role}: terraform {args:?}: {}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::fs::remove_dir_all(&work).expect("clean");
    }
}
