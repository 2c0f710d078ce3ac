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

/// The objects of an example file, to change for a case of its own.
fn example_docs(file: &str) -> Vec<Value> {
    let text = std::fs::read_to_string(
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(format!("examples/{file}")),
    )
    .expect("example");
    serde_saphyr::from_multiple(&text).expect("example YAML")
}

/// Writes `docs` as one `List` and explains it at [`NOW`]; the element of `kind`/`name`.
fn explain_docs(case: &str, docs: Vec<Value>, kind: &str, name: &str) -> Value {
    let list = serde_json::json!({"apiVersion": "v1", "kind": "List", "items": docs});
    let path = temp_file(&format!("{case}.json"), &list.to_string());
    let out = json(&captf(&[
        "explain",
        "-f",
        path.to_str().expect("path"),
        "--now",
        NOW,
        "-o",
        "json",
    ]));
    out.as_array()
        .expect("array")
        .iter()
        .find(|e| e["kind"] == kind && e["name"] == name)
        .cloned()
        .unwrap_or_else(|| panic!("no {kind} {name} in {out}"))
}

fn in_namespace(mut docs: Vec<Value>, ns: &str) -> Vec<Value> {
    for d in &mut docs {
        d["metadata"]["namespace"] = Value::from(ns);
    }
    docs
}

/// The cleanup marker lets a pass skip a state the cleanup already began to delete; it
/// never sends to cleanup a state that reads with managed resource instances (restored
/// by an operator mid-cleanup, say): that would delete the only record of live
/// infrastructure.
#[test]
fn a_cleanup_marker_never_cleans_up_a_state_that_lists_instances() {
    let mut docs = example_docs("row8-cleanup-marker.yaml");
    let state = example_docs("row7-destroy.yaml")
        .into_iter()
        .filter(|d| d["kind"] == "Secret")
        .find(|d| {
            d["metadata"]["name"]
                .as_str()
                .is_some_and(|n| n.starts_with("tfstate-"))
        })
        .expect("row 7's state Secret");
    docs.push(state);
    let docs = in_namespace(docs, "row8-cleanup-marker");
    let e = explain_docs("marker-with-instances", docs, "TerraformMachine", "web-1");
    assert_ne!(e["action"], "CleanUp", "{e}");
    assert!(
        matches!(e["row"].as_u64(), Some(7 | 9)),
        "a destroy, not a cleanup: {e}"
    );
}

/// An apply Job killed (OOMKilled) and not yet recorded, on an object being deleted
/// whose state is the empty one `init` wrote: the manager first records the interruption,
/// then holds (what the killed apply made is in no state). `captf explain` says what the
/// manager will do, not CleanUp.
#[test]
fn explain_decides_after_what_the_manager_records_first() {
    let mut docs = example_docs("row8-cleanup.yaml");
    let ns = docs[0]["metadata"]["namespace"]
        .as_str()
        .expect("namespace")
        .to_string();
    let obj = docs
        .iter_mut()
        .find(|d| d["kind"] == "TerraformMachine")
        .expect("machine");
    let uid = obj["metadata"]["uid"].as_str().expect("uid").to_string();
    let ann = obj["metadata"]["annotations"]
        .as_object_mut()
        .expect("annotations");
    ann.retain(|k, _| !k.contains("destroy-attempt") && !k.contains("deletion-uid"));
    ann.insert(
        "terraform.infrastructure.cluster.x-k8s.io/apply-attempt".into(),
        "1".into(),
    );
    docs.retain(|d| d["kind"] != "Job" && d["kind"] != "Pod");
    let labels = serde_json::json!({
        "terraform.infrastructure.cluster.x-k8s.io/attempt": "1",
        "terraform.infrastructure.cluster.x-k8s.io/operation": "apply",
        "terraform.infrastructure.cluster.x-k8s.io/owner-kind": "TerraformMachine",
        "terraform.infrastructure.cluster.x-k8s.io/owner-name": "web-1",
        "terraform.infrastructure.cluster.x-k8s.io/owner-uid": uid,
    });
    docs.push(serde_json::json!({
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": "captf-web-1-tfm-apply-1", "namespace": ns, "uid": "j-1",
            "creationTimestamp": "2026-12-01T10:00:05Z", "labels": labels},
        "spec": {"template": {"metadata": {"labels": labels}, "spec": {"restartPolicy": "Never",
            "containers": [{"name": "terraform", "image": "hashicorp/terraform:1.11.4"}]}}},
        "status": {"failed": 1, "startTime": "2026-12-01T10:00:05Z", "conditions": [
            {"type": "FailureTarget", "status": "True", "reason": "PodFailurePolicy", "lastTransitionTime": "2026-12-01T10:01:00Z"},
            {"type": "Failed", "status": "True", "reason": "PodFailurePolicy", "lastTransitionTime": "2026-12-01T10:01:00Z"}]}
    }));
    let mut pod_labels = labels.clone();
    pod_labels["job-name"] = "captf-web-1-tfm-apply-1".into();
    pod_labels["batch.kubernetes.io/job-name"] = "captf-web-1-tfm-apply-1".into();
    docs.push(serde_json::json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "captf-web-1-tfm-apply-1-x7k2p", "namespace": ns, "labels": pod_labels},
        "spec": {"restartPolicy": "Never", "containers": [{"name": "terraform", "image": "hashicorp/terraform:1.11.4"}]},
        "status": {"phase": "Failed", "containerStatuses": [{"name": "terraform", "image": "x", "imageID": "",
            "ready": false, "restartCount": 0,
            "state": {"terminated": {"exitCode": 137, "reason": "OOMKilled"}}}]}
    }));
    let e = explain_docs("oomkilled-apply", docs, "TerraformMachine", "web-1");
    assert_eq!(e["action"], "Hold", "{e}");
    let readable = e["conditions"]
        .as_array()
        .expect("conditions")
        .iter()
        .find(|c| c["type"] == "StateReadable")
        .expect("StateReadable");
    assert_eq!(readable["reason"], "StateInconsistent", "{e}");
}

/// A destroy Job that has had no Pod for minutes, with no Event left to say why (Events
/// expire after an hour, and a dump has none): the message names the missing Pod rather
/// than only "waiting for the Job to finish".
#[test]
fn a_job_without_a_pod_is_named_as_such() {
    let mut docs = example_docs("row2-waiting-for-job.yaml");
    docs.retain(|d| d["kind"] != "Pod");
    let e = explain_docs("podless", docs, "TerraformMachine", "web-1");
    assert_eq!(e["row"], 2, "{e}");
    let deleting = e["conditions"]
        .as_array()
        .expect("conditions")
        .iter()
        .find(|c| c["type"] == "Deleting")
        .expect("Deleting");
    let msg = deleting["message"].as_str().expect("message");
    assert!(msg.contains("no Pod"), "{msg}");
}

/// An errored state is its object's only: one that another object's runner kept (its
/// backend suffix ends in the other object's) holds nothing of this one.
#[test]
fn an_errored_state_of_another_object_holds_nothing_else() {
    let mut docs = example_docs("row7-destroy.yaml");
    let ns = docs[0]["metadata"]["namespace"]
        .as_str()
        .expect("namespace")
        .to_string();
    let mut errored = docs
        .iter()
        .find(|d| {
            d["kind"] == "Secret"
                && d["metadata"]["name"]
                    .as_str()
                    .is_some_and(|n| n.starts_with("tfstate-"))
        })
        .cloned()
        .expect("state Secret");
    let suffix = "errored-1-ab1cd.web-2.tfm";
    errored["metadata"]["name"] = format!("tfstate-default-{suffix}").into();
    errored["metadata"]["namespace"] = ns.into();
    errored["metadata"]["labels"]["tfstateSecretSuffix"] = suffix.into();
    errored["metadata"]["labels"]["terraform.infrastructure.cluster.x-k8s.io/errored-state"] =
        "true".into();
    errored["metadata"]["labels"]["terraform.infrastructure.cluster.x-k8s.io/owner-kind"] =
        "TerraformMachine".into();
    errored["metadata"]["labels"]["terraform.infrastructure.cluster.x-k8s.io/owner-name"] =
        "web-2".into();
    errored["metadata"]["labels"]["terraform.infrastructure.cluster.x-k8s.io/owner-uid"] =
        "7e3f0000-0000-4000-8000-0000000000ff".into();
    // It records one more instance than web-1's state: were it web-1's, it would hold it.
    let gz: k8s_openapi::ByteString =
        serde_json::from_value(errored["data"]["tfstate"].clone()).expect("base64");
    let mut json = String::new();
    std::io::Read::read_to_string(&mut flate2::read::GzDecoder::new(&gz.0[..]), &mut json)
        .expect("gunzip");
    let mut state: Value = serde_json::from_str(&json).expect("state");
    let instances = state["resources"][0]["instances"]
        .as_array_mut()
        .expect("instances");
    let mut extra = instances[0].clone();
    extra["index_key"] = 9.into();
    extra["attributes"]["id"] = "0b0e7a11-0000-4000-8000-0000000e77a0".into();
    instances.push(extra);
    let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    std::io::Write::write_all(&mut enc, state.to_string().as_bytes()).expect("gzip");
    errored["data"]["tfstate"] =
        serde_json::to_value(k8s_openapi::ByteString(enc.finish().expect("gzip"))).expect("b64");
    docs.push(errored);
    let e = explain_docs("errored-of-another", docs, "TerraformMachine", "web-1");
    assert_eq!(e["action"], "StartDestroy", "{e}");
}

/// A state whose output holds a value of `mib` MiB (gzip makes it a few hundred KB: what
/// anyone who may write a state Secret or a module can make), as the Secret of
/// TerraformCluster `prod`'s state.
fn state_secret_with_a_huge_output(ns: &str, mib: usize) -> Value {
    use std::io::Write;
    let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    enc.write_all(br#"{"version":4,"terraform_version":"1.11.4","serial":2,"lineage":"3710895b-6d6b-79b4-f8f4-2a15c7fe3d2f","outputs":{"machine_inputs":{"value":""#)
        .unwrap();
    let block = vec![b'a'; 1024 * 1024];
    for _ in 0..mib {
        enc.write_all(&block).unwrap();
    }
    enc.write_all(br#"","type":"string"}},"resources":[],"check_results":null}"#)
        .unwrap();
    let gz = enc.finish().unwrap();
    serde_json::json!({
        "apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": "tfstate-default-prod.tfc", "namespace": ns,
            "labels": {"tfstate": "true", "tfstateSecretSuffix": "prod.tfc", "tfstateWorkspace": "default",
                "app.kubernetes.io/managed-by": "terraform"}},
        "data": {"tfstate": k8s_openapi::ByteString(gz)}
    })
}

/// An output of 200 MiB in a TerraformCluster's state (a gzip of a few hundred KB), read
/// for the hand-off its machines are given: the reader stops at its limit before it holds
/// the value whole, instead of building it (three times over) and being killed for its
/// memory. Run here under an address-space limit of 256 MiB.
#[test]
fn a_huge_output_is_refused_before_it_is_held_whole() {
    use std::os::unix::process::CommandExt;
    let ns = "huge-output";
    let docs = vec![
        serde_json::json!({"apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Cluster",
            "metadata": {"name": "prod", "namespace": ns, "uid": "c-1"},
            "spec": {"infrastructureRef": {"apiGroup": "infrastructure.cluster.x-k8s.io", "kind": "TerraformCluster", "name": "prod"}},
            "status": {"initialization": {"infrastructureProvisioned": true, "controlPlaneInitialized": true}}}),
        serde_json::json!({"apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Machine",
            "metadata": {"name": "web-1", "namespace": ns, "uid": "m-1", "labels": {"cluster.x-k8s.io/cluster-name": "prod"}},
            "spec": {"clusterName": "prod", "bootstrap": {"dataSecretName": "web-1-bootstrap"}}}),
        serde_json::json!({"apiVersion": "v1", "kind": "Secret",
            "metadata": {"name": "web-1-bootstrap", "namespace": ns},
            "data": {"value": "I2Nsb3VkLWNvbmZpZwo="}}),
        serde_json::json!({"apiVersion": "infrastructure.cluster.x-k8s.io/v1alpha1", "kind": "TerraformMachine",
            "metadata": {"name": "web-1", "namespace": ns, "uid": "t-1",
                "labels": {"cluster.x-k8s.io/cluster-name": "prod"},
                "finalizers": ["terraformmachine.infrastructure.cluster.x-k8s.io"],
                "ownerReferences": [{"apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Machine", "name": "web-1", "uid": "m-1", "controller": true}]},
            "spec": {"module": {"files": {"main.tf": "variable \"captf_cluster_outputs\" {\n  type = any\n}\n"}}}}),
        state_secret_with_a_huge_output(ns, 200),
    ];
    let list = serde_json::json!({"apiVersion": "v1", "kind": "List", "items": docs});
    let path = temp_file("huge-output.json", &list.to_string());
    let limit = 256 * 1024 * 1024;
    let out = unsafe {
        Command::new(env!("CARGO_BIN_EXE_captf"))
            .args([
                "explain",
                "-f",
                path.to_str().unwrap(),
                "--now",
                NOW,
                "-o",
                "json",
            ])
            .pre_exec(move || {
                let l = libc::rlimit {
                    rlim_cur: limit,
                    rlim_max: limit,
                };
                if libc::setrlimit(libc::RLIMIT_AS, &l) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            })
            .output()
            .expect("run captf")
    };
    let items = json(&out);
    let web = items
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["name"] == "web-1")
        .expect("web-1");
    let provisioned = web["apply"]["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["type"] == "Provisioned")
        .expect("Provisioned");
    assert_eq!(provisioned["reason"], "WaitingForClusterOutputs", "{web}");
    assert!(
        provisioned["message"]
            .as_str()
            .is_some_and(|m| m.contains("more than")),
        "{web}"
    );
}

/// `captf completions SHELL` prints a completion script that names every command, and
/// bash reads the bash one without a syntax error.
#[test]
fn completions_name_every_command_and_bash_reads_them() {
    for (shell, marker) in [
        ("bash", "_captf()"),
        ("zsh", "#compdef captf"),
        ("fish", "complete -c captf"),
    ] {
        let out = captf(&["completions", shell]);
        assert!(
            out.status.success(),
            "{shell}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let script = String::from_utf8_lossy(&out.stdout);
        assert!(script.contains(marker), "{shell}: {script}");
        for command in [
            "manager",
            "explain",
            "orphans",
            "release-assets",
            "completions",
        ] {
            assert!(script.contains(command), "{shell} lacks {command}");
        }
        if shell == "bash" {
            let file = temp_file("captf.bash", &script);
            let check = Command::new("bash")
                .arg("-n")
                .arg(&file)
                .output()
                .expect("bash");
            assert!(
                check.status.success(),
                "bash -n: {}",
                String::from_utf8_lossy(&check.stderr)
            );
        }
    }
    misuse(&["completions", "tcsh"], "invalid value 'tcsh'");
}

/// Installed as `kubectl-captf` on the PATH, the binary is a kubectl plugin: the real
/// kubectl lists it and runs it, and its usage says `kubectl captf`.
#[test]
fn the_binary_is_a_kubectl_plugin_named_kubectl_captf() {
    let dir = std::env::temp_dir().join(format!("captf-plugin-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let plugin = dir.join("kubectl-captf");
    let _ = std::fs::remove_file(&plugin);
    std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_captf"), &plugin).expect("symlink");
    let path = format!(
        "{}:{}",
        dir.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let kubectl = |args: &[&str]| {
        Command::new("kubectl")
            .args(args)
            .env("PATH", &path)
            .output()
            .expect("kubectl")
    };
    let listed = kubectl(&["plugin", "list"]);
    assert!(
        String::from_utf8_lossy(&listed.stdout).contains(&plugin.display().to_string()),
        "kubectl plugin list: {}{}",
        String::from_utf8_lossy(&listed.stdout),
        String::from_utf8_lossy(&listed.stderr)
    );
    let help = kubectl(&["captf", "--help"]);
    assert!(help.status.success());
    assert!(
        String::from_utf8_lossy(&help.stdout).contains("Usage: kubectl captf <COMMAND>"),
        "{}",
        String::from_utf8_lossy(&help.stdout)
    );
    let through_kubectl = kubectl(&["captf", "crds"]);
    assert!(through_kubectl.status.success());
    assert_eq!(through_kubectl.stdout, captf(&["crds"]).stdout);
    // Plain `captf` keeps its own name.
    assert!(String::from_utf8_lossy(&captf(&["--help"]).stdout).contains("Usage: captf <COMMAND>"));
    let _ = std::fs::remove_dir_all(&dir);
}
