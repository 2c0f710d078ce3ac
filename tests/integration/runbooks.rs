//! The runbooks, proved by running them. Each test brings an object into the situation
//! of one runbook for real (the manager running, the real `terraform` in the Jobs), then
//! runs the runbook's ```sh blocks, in order, in one `bash` with the real `kubectl` and
//! the built `captf` against the real control plane, and checks that the object ends the
//! way the runbook promises. A runbook whose commands drift from the product fails here.
//! The docs checked against the product without running anything: `docs.rs`.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;

use captf::api::names;
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{Namespace, Secret};
use kube::api::{Api, DeleteParams, PostParams};
use serde_json::{Value, json};

use crate::support::capi::{BOOTSTRAP_GROUP, BOOTSTRAP_KIND};
use crate::support::*;

const LONG: Duration = Duration::from_secs(90);
/// The longest a runbook's commands may take in a test: a hung command fails the test
/// after it. Some runbooks wait for a whole destroy Job (ErroredState's restore, then the
/// deletion): on a loaded machine (six tests at a time, a build beside them) that took
/// over a minute, so this is five.
const RUNBOOK_TIMEOUT: Duration = Duration::from_secs(300);

/// The retry delay of the scenarios whose runbook reads a failed attempt (its log, its
/// count) before the next attempt starts. 4 and 6 s were too short on a loaded machine:
/// with the image's static build beside the suite, the next attempt had started when the
/// runbook's commands ran (`runbook_apply_failed`, `runbook_destroy_failed`).
const READ_BEFORE_RETRY: Duration = Duration::from_secs(20);

/// The `captf` binary the runbooks run: `CAPTF_BIN` when set (a copy taken right after
/// the build, when several checkouts share one target directory), else the one Cargo built.
pub(crate) fn captf_bin() -> PathBuf {
    std::env::var_os("CAPTF_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_captf")))
}

pub(crate) fn repo(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(path)
}

// ---------------------------------------------------------------------------------------
// Markdown

/// The bodies of the ```sh blocks of a Markdown text, in order. A fence is a line that
/// starts with three backticks; the block is `sh` when the info string after them is
/// exactly `sh` (so ```sh-example, ```text and ```mermaid are not). A block ends at the
/// next line that is a bare fence.
pub fn sh_blocks(markdown: &str) -> Vec<String> {
    let mut blocks = Vec::new();
    let mut current: Option<(bool, String)> = None;
    for line in markdown.lines() {
        let trimmed = line.trim_start();
        match &mut current {
            None => {
                if let Some(info) = trimmed.strip_prefix("```") {
                    current = Some((info.trim() == "sh", String::new()));
                }
            }
            Some((is_sh, body)) => {
                if trimmed.trim_end() == "```" {
                    if *is_sh {
                        blocks.push(std::mem::take(body));
                    }
                    current = None;
                } else {
                    body.push_str(line);
                    body.push('\n');
                }
            }
        }
    }
    assert!(current.is_none(), "a code block is not closed");
    blocks
}

#[test]
fn sh_blocks_are_extracted_in_order_and_examples_are_skipped() {
    let md = "intro\n```sh\nA=1\necho $A\n```\n\n```sh-example\nrm -rf /\n```\n```text\nout\n```\n```sh\necho two\n```\n";
    assert_eq!(sh_blocks(md), vec!["A=1\necho $A\n", "echo two\n"]);
}

/// The variables the first ```sh block of a runbook sets (`NS=… KIND=…`).
fn runbook_vars(path: &str) -> BTreeMap<String, String> {
    let text = std::fs::read_to_string(repo(path)).expect("runbook");
    let first = sh_blocks(&text)
        .into_iter()
        .next()
        .expect("a first sh block");
    first
        .split_whitespace()
        .filter_map(|w| w.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

// ---------------------------------------------------------------------------------------
// Running a runbook

/// The output of a runbook run.
pub struct RunbookRun {
    pub stdout: String,
    pub stderr: String,
}

/// Runs every ```sh block of `path`, in order, in one `bash` (`set -euo pipefail`, the
/// blocks joined), with `PATH` = a directory holding `captf` (the built binary), then
/// `/usr/bin` and `/bin`; `KUBECONFIG` = the cluster's; `HOME` and the working
/// directory = fresh temp dirs; and `NS` set to the test's namespace where the first
/// block sets it to the runbook's example. Panics, with the trace, if the script fails.
pub async fn run_runbook(env: &Env, path: &str) -> RunbookRun {
    let text = std::fs::read_to_string(repo(path)).expect("runbook");
    let mut blocks = sh_blocks(&text);
    assert!(!blocks.is_empty(), "{path} has no sh block");
    let example = format!("NS={RUNBOOK_NS} ");
    assert!(
        blocks[0].contains(&example),
        "{path}: the first sh block sets {example}"
    );
    blocks[0] = blocks[0].replacen(&example, &format!("NS={} ", env.ns), 1);
    let root = env.dir.join(format!(
        "runbook-{}",
        Path::new(path)
            .file_stem()
            .and_then(|s| s.to_str())
            .unwrap_or("x")
    ));
    let bin = root.join("bin");
    let home = root.join("home");
    let work = root.join("work");
    for d in [&bin, &home, &work] {
        std::fs::create_dir_all(d).expect("runbook dirs");
    }
    let link = bin.join("captf");
    if !link.exists() {
        std::os::unix::fs::symlink(captf_bin(), &link).expect("captf symlink");
    }
    let mut script = String::from("set -euo pipefail\nset -x\n");
    for b in &blocks {
        script.push_str(b);
        script.push('\n');
    }
    let script_path = root.join("runbook.sh");
    std::fs::write(&script_path, &script).expect("script");
    // Output goes to files, so that a run that hangs still shows how far it got.
    let out_path = root.join("stdout");
    let err_path = root.join("stderr");
    let mut child = tokio::process::Command::new("/bin/bash")
        .arg(&script_path)
        .current_dir(&work)
        .env_clear()
        .env("PATH", format!("{}:/usr/bin:/bin", bin.display()))
        .env("KUBECONFIG", env.kubeconfig_path())
        .env("HOME", &home)
        .env("LANG", "C.UTF-8")
        .stdin(std::process::Stdio::null())
        .stdout(std::fs::File::create(&out_path).expect("stdout file"))
        .stderr(std::fs::File::create(&err_path).expect("stderr file"))
        .kill_on_drop(true)
        .spawn()
        .expect("run bash");
    let status = tokio::time::timeout(RUNBOOK_TIMEOUT, child.wait()).await;
    let run = RunbookRun {
        stdout: std::fs::read_to_string(&out_path).unwrap_or_default(),
        stderr: std::fs::read_to_string(&err_path).unwrap_or_default(),
    };
    let status = match status {
        Ok(s) => s.expect("wait for bash"),
        Err(_) => {
            let _ = child.kill().await;
            panic!(
                "{path}: the runbook's commands did not finish in {RUNBOOK_TIMEOUT:?}:\n--- stdout\n{}\n--- stderr (trace)\n{}",
                run.stdout, run.stderr
            );
        }
    };
    assert!(
        status.success(),
        "{path}: the runbook's commands failed ({status}):\n--- stdout\n{}\n--- stderr (trace)\n{}",
        run.stdout,
        run.stderr
    );
    run
}

// ---------------------------------------------------------------------------------------
// Scenarios

/// The namespace the runbooks' commands name (their reader sets `NS` to their own, and
/// so does [`run_runbook`]: each test has a namespace of its own).
const RUNBOOK_NS: &str = "team-a";

/// The runbook's variables match the names the scenarios use.
fn check_vars(path: &str, kind: &str, name: &str) -> String {
    let vars = runbook_vars(path);
    assert_eq!(
        vars.get("NS").map(String::as_str),
        Some(RUNBOOK_NS),
        "{path}"
    );
    assert_eq!(vars.get("KIND").map(String::as_str), Some(kind), "{path}");
    assert_eq!(vars.get("NAME").map(String::as_str), Some(name), "{path}");
    let suffix = vars.get("SUFFIX").cloned().expect("SUFFIX");
    let k = captf::api::names::Kind::parse(kind).expect("kind");
    assert_eq!(suffix, names::state_suffix(k, name), "{path}: SUFFIX");
    suffix
}

/// A Cluster `prod` with one applied TerraformMachine `web-1`, the manager running (its
/// finalizer is on the object) with the given retry backoff base. With `paused`, the
/// object carries its own `cluster.x-k8s.io/paused` from the start.
async fn machine(tag: &str, fail_destroys: u32, backoff_base: Duration) -> Env {
    Env::builder(tag)
        .backoff(backoff_base, backoff_base * 4)
        .with_machine("web-1", &module(fail_destroys))
        .start()
        .await
}

/// Waits for the state Secret's protection finalizer (set by the manager after apply).
async fn wait_protected(env: &Env, secret: &str) {
    env.wait_protected(secret).await;
}

/// Loses the state Secret: strips its protection finalizer and deletes it, again until
/// it is really gone (the manager may put the finalizer back between the two writes).
async fn lose_state(env: &Env, state: &str) {
    env.lose_secret(state).await;
}

/// Deletes the object and waits for the first failed destroy attempt (so the backup exists).
async fn first_attempt_fails(env: &Env) {
    env.delete::<Tfm>("web-1").await;
    wait_deleting(env, "DestroyFailed").await;
    assert!(
        env.secret_exists(&names::backup_secret_name("web-1.tfm"))
            .await,
        "the backup is taken before the first attempt"
    );
}

/// Replaces the `tfstate` key of the state Secret (labels and finalizers kept).
async fn write_state_bytes(env: &Env, bytes: Vec<u8>) {
    let name = names::state_secret_name("web-1.tfm");
    let mut s = env.secrets().get(&name).await.expect("state");
    s.data = Some([(names::TF_STATE_KEY.to_string(), ByteString(bytes))].into());
    env.secrets()
        .replace(&name, &PostParams::default(), &s)
        .await
        .expect("write state");
}

pub(crate) fn gzip(bytes: &[u8]) -> Vec<u8> {
    let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    enc.write_all(bytes).expect("gzip");
    enc.finish().expect("gzip")
}

pub(crate) fn gunzip(bytes: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    std::io::Read::read_to_end(&mut flate2::read::GzDecoder::new(bytes), &mut out).expect("gunzip");
    out
}

pub(crate) async fn state_json(env: &Env) -> Value {
    let s = env
        .secrets()
        .get(&names::state_secret_name("web-1.tfm"))
        .await
        .expect("state");
    let data = s.data.unwrap_or_default();
    let gz = &data.get(names::TF_STATE_KEY).expect("tfstate key").0;
    serde_json::from_slice(&gunzip(gz)).expect("state JSON")
}

/// Waits until `web-1`'s Deleting reason is `reason`; on a timeout, says what it is.
async fn wait_deleting(env: &Env, reason: &str) -> String {
    env.wait_deleting::<Tfm>("web-1", reason, LONG).await
}

/// Waits until the object is held with `StateReadable` = `reason`.
async fn wait_held(env: &Env, reason: &str) -> String {
    wait_deleting(env, "Held").await;
    let (_, r, msg) = env
        .condition::<Tfm>("web-1", "StateReadable")
        .await
        .expect("StateReadable");
    assert_eq!(r, reason, "{msg}");
    msg
}

/// After a destroy and cleanup: the object is gone and so are its Secrets.
async fn assert_destroyed_and_cleaned(env: &Env, suffix: &str) {
    assert!(!env.exists::<Tfm>("web-1").await, "the object is released");
    assert!(env.destroyed("web-1"), "Terraform destroyed web-1");
    for secret in [
        names::state_secret_name(suffix),
        names::inputs_secret_name(suffix),
        names::backup_secret_name(suffix),
    ] {
        assert!(!env.secret_exists(&secret).await, "{secret} is left");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn runbook_paused() {
    const RB: &str = "runbooks/Paused.md";
    let suffix = check_vars(RB, "terraformmachine", "web-1");
    let env = machine("rb-paused", 0, Duration::from_millis(300)).await;
    env.annotate::<Tfm>("web-1", &[(names::CAPI_PAUSED, Some("true".into()))])
        .await;
    env.delete::<Tfm>("web-1").await;
    let msg = wait_deleting(&env, "Paused").await;
    assert!(
        msg.contains("the object carries cluster.x-k8s.io/paused"),
        "{msg}"
    );
    assert!(msg.contains(RB), "{msg}");
    let run = run_runbook(&env, RB).await;
    assert!(run.stdout.contains("paused=true"), "{}", run.stdout);
    env.wait_gone::<Tfm>("web-1", LONG).await;
    assert_destroyed_and_cleaned(&env, &suffix).await;
    env.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn runbook_waiting_for_job() {
    const RB: &str = "runbooks/WaitingForJob.md";
    let suffix = check_vars(RB, "terraformmachine", "web-1");
    let env = machine("rb-waiting", 0, Duration::from_millis(300)).await;
    // A re-apply still running when the object is deleted.
    env.reapply_slowly("web-1", 4).await;
    wait_for("the re-apply's Job to run", LONG, || {
        env.apply_job_active("web-1", 2)
    })
    .await;
    env.delete::<Tfm>("web-1").await;
    let msg = wait_deleting(&env, "WaitingForJob").await;
    assert!(msg.contains("apply Job captf-web-1-tfm-apply-2"), "{msg}");
    run_runbook(&env, RB).await;
    assert_destroyed_and_cleaned(&env, &suffix).await;
    env.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn runbook_dependents_exist() {
    const RB: &str = "runbooks/DependentsExist.md";
    let suffix = check_vars(RB, "terraformcluster", "prod");
    let env = Env::builder("rb-dependents").provisioning().start().await;
    env.create_cluster("prod").await;
    env.provision::<Tfc>("prod", "prod", &module(0)).await;
    env.mark_cluster_ready("prod").await;
    env.provision::<Tfm>("web-1", "prod", &module(0)).await;
    // The TerraformCluster alone is deleted: its machine was never asked to go.
    env.delete::<Tfc>("prod").await;
    env.wait_deleting::<Tfc>("prod", "WaitingForDependents", LONG)
        .await;
    let (status, reason, msg) = env
        .condition::<Tfc>("prod", "DeletionBlocked")
        .await
        .expect("DeletionBlocked");
    assert_eq!(
        (status.as_str(), reason.as_str()),
        ("True", "DependentsExist")
    );
    assert!(msg.contains("TerraformMachine/web-1"), "{msg}");
    let run = run_runbook(&env, RB).await;
    assert!(
        run.stdout
            .contains("TerraformMachine/web-1 deleting-since= reason="),
        "the dependent was never asked to go: {}",
        run.stdout
    );
    assert!(!env.exists::<Tfc>("prod").await);
    assert!(!env.exists::<Tfm>("web-1").await);
    assert!(env.destroyed("web-1") && env.destroyed("prod"));
    for secret in [
        names::state_secret_name(&suffix),
        names::inputs_secret_name(&suffix),
        names::backup_secret_name(&suffix),
    ] {
        assert!(!env.secret_exists(&secret).await, "{secret} is left");
    }
    env.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn runbook_state_lost() {
    const RB: &str = "runbooks/StateLost.md";
    let suffix = check_vars(RB, "terraformmachine", "web-1");
    // One failed attempt first, so the backup the runbook restores exists; the retry is
    // far enough away to lose the state before it.
    let env = machine("rb-lost", 1, Duration::from_secs(4)).await;
    let state = names::state_secret_name(&suffix);
    wait_protected(&env, &state).await;
    first_attempt_fails(&env).await;
    // Lose the state: strip its protection finalizer and delete it.
    lose_state(&env, &state).await;
    wait_held(&env, "StateLost").await;
    let run = run_runbook(&env, RB).await;
    assert!(run.stdout.contains("restored"), "{}", run.stdout);
    assert_destroyed_and_cleaned(&env, &suffix).await;
    env.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn runbook_state_corrupt() {
    const RB: &str = "runbooks/StateCorrupt.md";
    let suffix = check_vars(RB, "terraformmachine", "web-1");
    let env = machine("rb-corrupt", 1, Duration::from_secs(4)).await;
    first_attempt_fails(&env).await;
    write_state_bytes(&env, b"this is not gzip".to_vec()).await;
    wait_held(&env, "StateCorrupt").await;
    let run = run_runbook(&env, RB).await;
    assert!(run.stdout.contains("StateCorrupt"), "{}", run.stdout);
    env.wait_gone::<Tfm>("web-1", LONG).await;
    assert_destroyed_and_cleaned(&env, &suffix).await;
    env.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn runbook_state_encrypted() {
    const RB: &str = "runbooks/StateEncrypted.md";
    let suffix = check_vars(RB, "terraformmachine", "web-1");
    let env = machine("rb-encrypted", 1, Duration::from_secs(4)).await;
    first_attempt_fails(&env).await;
    let current = state_json(&env).await;
    let encrypted = json!({
        "serial": current["serial"], "lineage": current["lineage"], "meta": {},
        "encrypted_data": "c2VhbGVkIGJ5IGEga2V5IENBUFRGIGRvZXMgbm90IGhvbGQ=",
        "encryption_version": "v0"
    });
    write_state_bytes(&env, gzip(&serde_json::to_vec(&encrypted).expect("json"))).await;
    wait_held(&env, "StateEncrypted").await;
    let run = run_runbook(&env, RB).await;
    assert!(run.stdout.contains("StateEncrypted"), "{}", run.stdout);
    env.wait_gone::<Tfm>("web-1", LONG).await;
    assert_destroyed_and_cleaned(&env, &suffix).await;
    env.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn runbook_state_inconsistent() {
    const RB: &str = "runbooks/StateInconsistent.md";
    let suffix = check_vars(RB, "terraformmachine", "web-1");
    let env = machine("rb-inconsistent", 1, Duration::from_secs(4)).await;
    first_attempt_fails(&env).await;
    // An older copy written over the state: its serial is below the recorded one.
    let recorded: u64 = env
        .object::<Tfm>("web-1")
        .await
        .and_then(|o| o.metadata.annotations?.get(names::STATE_SERIAL).cloned())
        .and_then(|s| s.parse().ok())
        .expect("recorded serial");
    assert!(recorded >= 1, "recorded serial {recorded}");
    let mut older = state_json(&env).await;
    older["serial"] = json!(recorded - 1);
    write_state_bytes(&env, gzip(&serde_json::to_vec(&older).expect("json"))).await;
    wait_held(&env, "StateInconsistent").await;
    let run = run_runbook(&env, RB).await;
    assert!(run.stdout.contains("StateInconsistent"), "{}", run.stdout);
    env.wait_gone::<Tfm>("web-1", LONG).await;
    assert_destroyed_and_cleaned(&env, &suffix).await;
    env.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn runbook_destroy_failed() {
    const RB: &str = "runbooks/DestroyFailed.md";
    let suffix = check_vars(RB, "terraformmachine", "web-1");
    // One failure, and a retry delay long enough for the runbook's reading commands to
    // run against that failed attempt before the next one starts.
    let env = machine("rb-failed", 1, READ_BEFORE_RETRY).await;
    env.delete::<Tfm>("web-1").await;
    let msg = wait_deleting(&env, "DestroyFailed").await;
    assert!(
        msg.contains("Error: local-exec provisioner error") && msg.contains(RB),
        "{msg}"
    );
    let run = run_runbook(&env, RB).await;
    assert!(
        run.stdout.contains("the cloud said no"),
        "the Job's log shows Terraform's error: {}",
        run.stdout
    );
    assert_eq!(env.tries("web-1"), 2, "one failure, then success");
    assert_destroyed_and_cleaned(&env, &suffix).await;
    env.shutdown().await;
}

/// A Cluster `prod` with a TerraformCluster `prod` of `module` (and `extra` spec fields)
/// that the manager applies, with the given retry backoff base.
async fn applied_cluster(tag: &str, module: &str, extra: Value, backoff_base: Duration) -> Env {
    let env = Env::builder(tag)
        .backoff(backoff_base, backoff_base * 2)
        .provisioning()
        .start()
        .await;
    env.create_terraform_cluster(module, extra).await;
    env
}

/// Waits until `K`/`name`'s condition `type_` has `reason`; returns its message.
async fn wait_reason<K: captf::api::TerraformObject>(
    env: &Env,
    name: &str,
    type_: &str,
    reason: &str,
) -> String {
    env.wait_condition::<K>(name, type_, None, reason, LONG)
        .await
}

/// Waits until `prod`'s InputsApplied reason is `reason`; returns its message.
async fn wait_inputs_applied(env: &Env, reason: &str) -> String {
    wait_reason::<Tfc>(env, "prod", "InputsApplied", reason).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn runbook_apply_failed() {
    const RB: &str = "runbooks/ApplyFailed.md";
    check_vars(RB, "terraformcluster", "prod");
    if envtest_only("the module counts its runs in files on this machine") {
        return;
    }
    // One failure, and a retry delay long enough for the runbook's reading commands to
    // run against the failed attempt before the next one starts.
    let env = applied_cluster(
        "rb-apply-failed",
        &apply_module(1),
        json!({}),
        READ_BEFORE_RETRY,
    )
    .await;
    let msg = wait_inputs_applied(&env, "ApplyFailed").await;
    assert!(
        msg.contains("apply attempt 1 failed") && msg.contains(RB),
        "{msg}"
    );
    let run = run_runbook(&env, RB).await;
    assert!(
        run.stdout.contains("attempt 1, 1 failure(s) in a row"),
        "the bookkeeping the runbook reads: {}",
        run.stdout
    );
    assert!(
        run.stdout.contains("the cloud said no"),
        "the Job's log shows Terraform's error: {}",
        run.stdout
    );
    assert!(
        run.stdout.contains("provisioned=true"),
        "the runbook's verification: {}",
        run.stdout
    );
    env.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn runbook_apply_cannot_start() {
    const RB: &str = "runbooks/ApplyCannotStart.md";
    check_vars(RB, "terraformcluster", "prod");
    let from =
        json!({"variablesFrom": [{"kind": "Secret", "name": "prod-vars", "key": "vars.json"}]});
    let env = applied_cluster(
        "rb-apply-cannot",
        &apply_module(0),
        from,
        Duration::from_secs(1),
    )
    .await;
    let msg = wait_inputs_applied(&env, "ApplyCannotStart").await;
    assert!(
        msg.contains(r#"variablesFrom Secret "prod-vars" key "vars.json" does not exist"#)
            && msg.contains(RB),
        "{msg}"
    );
    assert_eq!(
        env.jobs_created(),
        0,
        "no apply while the inputs do not resolve"
    );
    // The fix the runbook gives, made while its commands run (its verification waits for
    // the apply it lets start).
    let secrets = env.secrets();
    let fix = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_secs(2)).await;
        let s: Secret = serde_json::from_value(json!({
            "metadata": {"name": "prod-vars"},
            "stringData": {"vars.json": "{\"name\": \"prod\"}"}
        }))
        .expect("secret");
        secrets
            .create(&PostParams::default(), &s)
            .await
            .expect("create prod-vars");
    });
    let run = run_runbook(&env, RB).await;
    fix.await.expect("the fix");
    assert!(
        run.stdout.contains("Secret prod-vars key vars.json"),
        "the runbook lists what the spec reads: {}",
        run.stdout
    );
    assert!(
        run.stdout.contains("ApplyCannotStart: "),
        "the runbook shows the condition: {}",
        run.stdout
    );
    env.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn runbook_outputs_invalid() {
    const RB: &str = "runbooks/OutputsInvalid.md";
    check_vars(RB, "terraformmachine", "web-1");
    // A machine whose module declares no provider_id, its Cluster ready and its bootstrap
    // data there.
    let env = Env::builder("rb-outputs").provisioning().start().await;
    env.create_cluster("prod").await;
    env.mark_cluster_ready("prod").await;
    let uid = env
        .create_machine("web-1", "prod", Some("web-1-bootstrap"))
        .await;
    env.create_bootstrap_secret("prod", "web-1-bootstrap", "#cloud-config")
        .await;
    env.create_owned::<Tfm>(
        "web-1",
        "prod",
        &[("Machine", "web-1", &uid, true)],
        &apply_module(0),
        json!({}),
    )
    .await;
    let msg = wait_reason::<Tfm>(&env, "web-1", "InputsApplied", "OutputsInvalid").await;
    assert!(
        msg.contains("apply attempt 1 succeeded, but its outputs break module contract v1: output provider_id is required of a machine module and is not declared")
            && msg.contains(RB),
        "{msg}"
    );
    let run = run_runbook(&env, RB).await;
    assert!(
        run.stdout.contains("1: output provider_id is required"),
        "the record on the object: {}",
        run.stdout
    );
    assert!(
        run.stdout.contains("2 managed resource instance"),
        "the state holds what the apply made: {}",
        run.stdout
    );
    // The runbook's fix: the module with its outputs, in the spec; it applies at once.
    let fixed = apply_module(0) + contract_outputs(captf::api::names::Kind::TerraformMachine);
    env.api::<Tfm>()
        .patch(
            "web-1",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(json!({"spec": {"module": {"files": {"main.tf": fixed}}}})),
        )
        .await
        .expect("fix the module");
    wait_reason::<Tfm>(&env, "web-1", "InputsApplied", "Applied").await;
    let obj = env.object::<Tfm>("web-1").await.expect("object");
    assert_eq!(obj.spec.provider_id.as_deref(), Some("captf:///web-1"));
    env.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn runbook_destroy_cannot_start() {
    const RB: &str = "runbooks/DestroyCannotStart.md";
    let suffix = check_vars(RB, "terraformmachine", "web-1");
    let env = machine("rb-cannot-start", 0, Duration::from_millis(300)).await;
    wait_protected(&env, &names::state_secret_name(&suffix)).await;
    // The runbook's main path: the namespace is being deleted with the object in it.
    let namespaces: Api<Namespace> = Api::all(env.client.clone());
    namespaces
        .delete(&env.ns, &DeleteParams::default())
        .await
        .expect("delete the namespace");
    let msg = wait_deleting(&env, "DestroyCannotStart").await;
    assert!(
        msg.contains(&format!("namespace {} is terminating", env.ns)),
        "{msg}"
    );
    let run = run_runbook(&env, RB).await;
    assert!(run.stdout.contains("phase=Terminating"), "{}", run.stdout);
    assert!(!env.exists::<Tfm>("web-1").await, "released");
    assert!(!env.destroyed("web-1"), "abandon never destroys");
    // The copy kept in the manager's namespace.
    let copies: Api<Secret> = Api::namespaced(env.client.clone(), &env.manager_ns);
    let copy = copies
        .get(&names::abandoned_copy_name(&env.ns, &suffix))
        .await
        .expect("the abandoned copy in the manager's namespace");
    assert!(
        run.stdout
            .contains(&names::abandoned_copy_name(&env.ns, &suffix)),
        "the runbook's last command lists the copy: {}",
        run.stdout
    );
    assert!(copy.data.is_some_and(|d| !d.is_empty()));
    env.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn runbook_owner_gone() {
    const RB: &str = "runbooks/OwnerGone.md";
    let suffix = check_vars(RB, "terraformmachine", "web-1");
    let env = machine("rb-owner-gone", 0, Duration::from_millis(300)).await;
    wait_protected(&env, &names::state_secret_name(&suffix)).await;
    // clusterctl move took the Cluster; the garbage collector deletes the object.
    env.move_cluster_away("prod").await;
    let msg = wait_deleting(&env, "DestroyCannotStart").await;
    assert!(msg.contains("runbooks/OwnerGone.md"), "{msg}");
    let run = run_runbook(&env, RB).await;
    assert!(
        run.stdout
            .contains("OwnerGone: its Cluster API owner is gone"),
        "{}",
        run.stdout
    );
    assert!(run.stdout.contains("Machine web-1 uid="), "{}", run.stdout);
    assert!(!env.exists::<Tfm>("web-1").await, "released");
    assert!(!env.destroyed("web-1"), "nothing destroyed");
    assert_eq!(env.destroy_jobs_created(), 0, "no destroy Job");
    assert!(
        run.stdout.contains(&format!(
            "{} abandoned-at=",
            names::state_secret_name(&suffix)
        )),
        "{}",
        run.stdout
    );
    env.shutdown().await;
}

/// The errored-state hold, proved by its runbook: an errored state (as the runner pushes
/// it through Terraform's backend) records an instance the state does not; the deletion
/// holds with DeletionBlocked=ErroredState and destroys nothing; the runbook merges it
/// back with `captf state restore --from-errored`, and the destroy then takes that
/// instance too. Cleanup keeps the errored state; the runbook deletes it at the end.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn runbook_errored_state() {
    const RB: &str = "runbooks/ErroredState.md";
    let suffix = check_vars(RB, "terraformmachine", "web-1");
    let env = machine("rb-errored", 0, Duration::from_millis(300)).await;
    wait_protected(&env, &names::state_secret_name(&suffix)).await;
    // Terraform's last state of a run whose save failed: the state, and one more instance.
    let mut errored = state_json(&env).await;
    errored["serial"] = json!(errored["serial"].as_u64().expect("serial") + 1);
    let resources = errored["resources"].as_array_mut().expect("resources");
    let vm = resources
        .iter_mut()
        .find(|r| r["type"] == "terraform_data")
        .expect("terraform_data");
    let mut extra = vm["instances"][1].clone();
    let marker = env.markers().join("web-1-extra").display().to_string();
    extra["index_key"] = json!(2);
    extra["attributes"]["id"] = json!("0b0e7a11-0000-4000-8000-0000000e77a0");
    extra["attributes"]["input"]["value"] = json!(marker);
    extra["attributes"]["output"]["value"] = json!(marker);
    vm["instances"]
        .as_array_mut()
        .expect("instances")
        .push(extra);
    let errored_name = env
        .keep_errored_state(gzip(&serde_json::to_vec(&errored).expect("json")))
        .await;

    env.delete::<Tfm>("web-1").await;
    let msg = wait_deleting(&env, "DestroyCannotStart").await;
    assert!(
        msg.contains(&format!(
            "the errored state {errored_name} (what Terraform could not save) records 1 managed resource instance(s) that the state does not: terraform_data.vm[2] (id 0b0e7a11-0000-4000-8000-0000000e77a0)"
        )) && msg.contains(RB),
        "{msg}"
    );
    let (status, reason, _) = env
        .condition::<Tfm>("web-1", "DeletionBlocked")
        .await
        .expect("DeletionBlocked");
    assert_eq!((status.as_str(), reason.as_str()), ("True", "ErroredState"));
    assert_eq!(env.destroy_jobs_created(), 0, "no destroy while held");

    let run = run_runbook(&env, RB).await;
    assert!(
        run.stdout.contains("ErroredState: the errored state"),
        "{}",
        run.stdout
    );
    assert!(
        std::path::Path::new(&format!("{marker}.destroyed")).exists(),
        "Terraform destroyed the instance only the errored state recorded"
    );
    assert_destroyed_and_cleaned(&env, &suffix).await;
    assert!(
        !env.secret_exists(&errored_name).await,
        "the runbook's last step deletes the errored state"
    );
    env.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn runbook_abandon() {
    const RB: &str = "runbooks/Abandon.md";
    let suffix = check_vars(RB, "terraformmachine", "web-1");
    // Held as StateLost, as the runbook shows.
    let env = machine("rb-abandon", 0, Duration::from_millis(300)).await;
    let state = names::state_secret_name(&suffix);
    wait_protected(&env, &state).await;
    lose_state(&env, &state).await;
    env.delete::<Tfm>("web-1").await;
    wait_held(&env, "StateLost").await;
    let run = run_runbook(&env, RB).await;
    assert!(!env.exists::<Tfm>("web-1").await, "released");
    assert!(!env.destroyed("web-1"), "abandon never destroys");
    let inputs = env
        .secrets()
        .get(&names::inputs_secret_name(&suffix))
        .await
        .expect("the inputs Secret is kept");
    assert!(
        inputs
            .metadata
            .annotations
            .unwrap_or_default()
            .contains_key(names::ABANDONED_AT),
        "marked abandoned-at"
    );
    assert!(inputs.metadata.finalizers.unwrap_or_default().is_empty());
    assert!(
        run.stdout.contains(&format!(
            "{} abandoned-at=",
            names::inputs_secret_name(&suffix)
        )),
        "{}",
        run.stdout
    );
    assert!(
        run.stdout.contains(&names::inputs_secret_name(&suffix)),
        "captf orphans lists it: {}",
        run.stdout
    );
    env.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn runbook_change_refused() {
    const RB: &str = "runbooks/ChangeRefused.md";
    check_vars(RB, "terraformcluster", "prod");
    let module = endpoint_module();
    let env = Env::builder("rb-change-refused")
        .backoff(Duration::from_secs(1), Duration::from_secs(2))
        .provisioning()
        .start()
        .await;
    let variables = |endpoint: &str| json!({"name": "prod", "marker_dir": env.markers().display().to_string(), "endpoint": endpoint});
    let uid = env.create_cluster("prod").await;
    env.create_owned::<Tfc>(
        "prod",
        "prod",
        &[("Cluster", "prod", &uid, false)],
        &module,
        json!({ "variables": variables("10.0.0.1") }),
    )
    .await;
    wait_reason::<Tfc>(&env, "prod", "InputsApplied", "Applied").await;
    let set = |endpoint: &str| {
        let api = env.api::<Tfc>();
        let vars = variables(endpoint);
        async move {
            api.patch(
                "prod",
                &kube::api::PatchParams::default(),
                &kube::api::Patch::Merge(json!({"spec": {"variables": vars}})),
            )
            .await
            .expect("set the endpoint variable");
        }
    };
    set("10.0.0.2").await;
    let msg = wait_reason::<Tfc>(&env, "prod", "InputsApplied", "ChangeRefused").await;
    assert!(msg.contains("10.0.0.2") && msg.contains(RB), "{msg}");
    let obj = env.object::<Tfc>("prod").await.expect("object");
    let record = obj
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(names::OUTPUTS_REFUSED))
        .cloned()
        .unwrap_or_default();
    assert!(
        record.starts_with("2: the outputs give spec.controlPlaneEndpoint"),
        "{record}"
    );
    // The runbook's first fix, made while its commands run (its verification waits for
    // the apply it starts).
    let fix = set("10.0.0.1");
    let fix = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_secs(2)).await;
        fix.await
    });
    let run = run_runbook(&env, RB).await;
    fix.await.expect("the fix");
    assert!(
        run.stdout.contains("ControlPlaneEndpointChangeRefused"),
        "the Warning Event: {}",
        run.stdout
    );
    assert!(
        run.stdout.contains("outputs-refused=\n"),
        "the verification shows the record gone: {}",
        run.stdout
    );
    let obj = env.object::<Tfc>("prod").await.expect("object");
    assert_eq!(
        obj.spec.control_plane_endpoint.map(|e| e.host).as_deref(),
        Some("10.0.0.1")
    );
    env.shutdown().await;
}

/// The gates' runbooks, in the order a machine meets them with Cluster API's real
/// controllers. Each runs while the machine waits at its gate, with the fix (what Cluster
/// API, a control-plane or bootstrap provider, or the TerraformCluster does) made while
/// its commands run; its verification ends once the machine has moved on to the next
/// gate, which it then prints.
///
/// The first four on one Cluster, whose infrastructure is a TerraformCluster made at the
/// second gate. The fifth needs a Cluster that Cluster API saw provisioned before it named
/// a TerraformCluster without a state yet: a second namespace (the runbooks name the
/// machine `web-1`).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn runbook_waiting_for_the_gates() {
    use kube::api::{Patch, PatchParams};
    const GATES: [(&str, &str); 5] = [
        ("WaitingForOwner", "WaitingForClusterInfrastructureReady"),
        (
            "WaitingForClusterInfrastructureReady",
            "WaitingForControlPlaneInitialized",
        ),
        (
            "WaitingForControlPlaneInitialized",
            "WaitingForBootstrapData",
        ),
        ("WaitingForBootstrapData", ""),
        ("WaitingForClusterOutputs", ""),
    ];
    for (reason, _) in GATES {
        check_vars(
            &format!("runbooks/{reason}.md"),
            "terraformmachine",
            "web-1",
        );
    }
    let merge = |v: Value| Patch::Merge(v);
    let machine_module = apply_module(0) + contract_outputs(names::Kind::TerraformMachine);
    let cluster_module = apply_module(0) + contract_outputs(names::Kind::TerraformCluster);
    // The Cluster names its TerraformCluster `prod` before it exists. As a MachineSet does,
    // the TerraformMachine comes first, then the Machine naming it; the Machine is paused
    // here, so that Cluster API does not own the TerraformMachine before the first
    // runbook runs.
    let env = Env::builder("rb-gates").provisioning().start().await;
    let cluster_uid = env.create_cluster_with_infrastructure("prod").await;
    env.create_owned::<Tfm>("web-1", "prod", &[], &machine_module, json!({}))
        .await;
    let paused_machine: kube::api::DynamicObject = serde_json::from_value(json!({
        "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Machine",
        "metadata": {"name": "web-1",
            "labels": {names::CAPI_CLUSTER_NAME_LABEL: "prod"},
            "annotations": {"cluster.x-k8s.io/paused": "true"}},
        "spec": {"clusterName": "prod",
            "bootstrap": {"configRef": {"apiGroup": BOOTSTRAP_GROUP, "kind": BOOTSTRAP_KIND, "name": "web-1"}},
            "infrastructureRef": {"apiGroup": names::GROUP, "kind": "TerraformMachine", "name": "web-1"}}
    }))
    .expect("machine");
    env.create_bootstrap_config("web-1").await;
    env.capi_api("Machine")
        .create(&PostParams::default(), &paused_machine)
        .await
        .expect("create the paused Machine");
    // The second namespace: a Cluster whose control plane is up, a Machine with its
    // bootstrap data, then a TerraformCluster named and not made yet.
    let env2 = Env::builder("rb-gates-outputs")
        .provisioning()
        .start()
        .await;
    let cluster2_uid = env2.create_cluster("prod").await;
    env2.mark_cluster_ready("prod").await;
    env2.name_infrastructure("prod", "prod").await;
    env2.create_bootstrap_secret("prod", "web-1-bootstrap", "#cloud-config web-1")
        .await;
    let machine2_uid = env2
        .create_machine("web-1", "prod", Some("web-1-bootstrap"))
        .await;
    env2.create_owned::<Tfm>(
        "web-1",
        "prod",
        &[("Machine", "web-1", &machine2_uid, true)],
        &machine_module,
        json!({}),
    )
    .await;

    for (reason, next) in GATES {
        let env = if reason == "WaitingForClusterOutputs" {
            &env2
        } else {
            &env
        };
        let rb = format!("runbooks/{reason}.md");
        let msg = wait_reason::<Tfm>(env, "web-1", "Provisioned", reason).await;
        assert!(msg.ends_with(&format!("see {rb}")), "{msg}");
        let fix = async {
            tokio::time::sleep(Duration::from_secs(3)).await;
            match reason {
                // Cluster API's Machine controller owns the TerraformMachine its Machine
                // names (here once the Machine is no longer paused).
                "WaitingForOwner" => {
                    env.capi_api("Machine")
                        .patch(
                            "web-1",
                            &PatchParams::default(),
                            &merge(json!({"metadata": {"annotations": {
                                "cluster.x-k8s.io/paused": null}}})),
                        )
                        .await
                        .expect("unpause the Machine");
                }
                // The TerraformCluster is made and applied; Cluster API sees it provisioned.
                "WaitingForClusterInfrastructureReady" => {
                    env.create_owned::<Tfc>(
                        "prod",
                        "prod",
                        &[("Cluster", "prod", &cluster_uid, false)],
                        &cluster_module,
                        json!({}),
                    )
                    .await;
                }
                // The control-plane provider initialises the control plane.
                "WaitingForControlPlaneInitialized" => env.mark_cluster_ready("prod").await,
                "WaitingForBootstrapData" => {
                    env.create_bootstrap_secret("prod", "web-1-bootstrap", "#cloud-config web-1")
                        .await;
                    env.give_bootstrap_data("web-1", "web-1-bootstrap").await;
                }
                _ => {
                    env.create_owned::<Tfc>(
                        "prod",
                        "prod",
                        &[("Cluster", "prod", &cluster2_uid, false)],
                        &cluster_module,
                        json!({}),
                    )
                    .await;
                }
            }
        };
        let (run, ()) = tokio::join!(run_runbook(env, &rb), fix);
        assert!(
            run.stdout.contains(&format!("{reason}: ")),
            "{rb} shows the condition: {}",
            run.stdout
        );
        // What its Confirm step shows: the Machine among Cluster API's objects, the
        // Cluster's infrastructure or control plane, the bootstrap data Secret the Machine
        // names.
        let shown = match reason {
            "WaitingForOwner" => "Machine web-1",
            "WaitingForBootstrapData" => "Machine web-1 names the bootstrap data Secret",
            "WaitingForClusterOutputs" => "Cluster prod's infrastructure: TerraformCluster prod",
            "WaitingForControlPlaneInitialized" => "TestControlPlane prod initialized=",
            _ => "TerraformCluster prod provisioned=",
        };
        let squeezed: Vec<String> = run
            .stdout
            .lines()
            .map(|l| l.split_whitespace().collect::<Vec<_>>().join(" "))
            .collect();
        assert!(
            squeezed.iter().any(|l| l.starts_with(shown)),
            "{rb} shows {shown:?}: {}",
            run.stdout
        );
        let left = run
            .stdout
            .lines()
            .rev()
            .find_map(|l| l.strip_prefix("Provisioned: "))
            .unwrap_or_default()
            .to_string();
        if next.is_empty() {
            assert!(
                left == "Applying" || left == "Provisioned",
                "{rb}: the machine's apply goes on: {left:?}"
            );
        } else {
            assert_eq!(left, next, "{rb}: the machine moved on to the next gate");
        }
    }
    for env in [&env, &env2] {
        wait_reason::<Tfm>(env, "web-1", "Provisioned", "Provisioned").await;
    }
    env.shutdown().await;
    env2.shutdown().await;
}

/// A success whose state does not match the fingerprint the object recorded (changed by
/// hand while the apply ran) is held, not recorded, and not Ready; the runbook reads the
/// state's own lineage and serial and accepts them, and the success is recorded.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn runbook_apply_unrecorded() {
    const RB: &str = "runbooks/ApplyUnrecorded.md";
    check_vars(RB, "terraformmachine", "web-1");
    let env = machine("rb-unrecorded", 0, Duration::from_secs(60)).await;
    env.reapply_slowly("web-1", 4).await;
    wait_for("the second apply to run", LONG, || async {
        env.apply_job_active("web-1", 2).await
    })
    .await;
    env.annotate::<Tfm>(
        "web-1",
        &[(
            names::STATE_LINEAGE,
            Some("00000000-0000-4000-8000-000000000000".into()),
        )],
    )
    .await;
    let msg = wait_reason::<Tfm>(&env, "web-1", "InputsApplied", "ApplyUnrecorded").await;
    assert!(
        msg.contains("StateInconsistent") && msg.contains(RB),
        "{msg}"
    );
    let run = run_runbook(&env, RB).await;
    assert!(run.stdout.contains("ApplyUnrecorded: "), "{}", run.stdout);
    assert!(run.stdout.contains("provisioned=true"), "{}", run.stdout);
    let obj = env.object::<Tfm>("web-1").await.expect("machine");
    assert_eq!(
        obj.metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(names::APPLIED_ATTEMPT))
            .map(String::as_str),
        Some("2")
    );
    env.shutdown().await;
}

/// The plan guard end to end with the real Terraform, and its runbook: a re-apply whose
/// plan replaces a resource stops before changing anything (row A14, the resource named,
/// a Warning Event), the runbook's fix approves that plan's hash and the next attempt
/// applies it; a change the module makes in place is applied unguarded, and an object
/// that opts out applies a replacement without an approval.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn runbook_destructive_plan_blocked() {
    const RB: &str = "runbooks/DestructivePlanBlocked.md";
    check_vars(RB, "terraformcluster", "prod");
    let module = format!(
        "{}{}",
        r#"variable "generation" {
  type = string
}
variable "label" {
  type = string
}
resource "terraform_data" "disk" {
  triggers_replace = [var.generation]
}
resource "terraform_data" "tag" {
  input = var.label
}
output "disk" {
  value = terraform_data.disk.id
}
"#,
        contract_outputs(names::Kind::TerraformCluster)
    );
    let env = Env::builder("rb-plan-guard")
        .backoff(Duration::from_secs(1), Duration::from_secs(2))
        .provisioning()
        .start()
        .await;
    let uid = env.create_cluster("prod").await;
    env.create_owned::<Tfc>(
        "prod",
        "prod",
        &[("Cluster", "prod", &uid, false)],
        &module,
        json!({ "variables": {"generation": "1", "label": "a"} }),
    )
    .await;
    wait_inputs_applied(&env, "Applied").await;
    let disk = || async {
        env.state_output(names::Kind::TerraformCluster, "prod", "disk")
            .await
            .expect("the disk output")
    };
    let first_disk = disk().await;
    let set = |vars: Value| {
        let api = env.api::<Tfc>();
        async move {
            api.patch(
                "prod",
                &kube::api::PatchParams::default(),
                &kube::api::Patch::Merge(json!({"spec": {"variables": vars}})),
            )
            .await
            .expect("set the variables");
        }
    };
    let attempt = || async {
        env.object::<Tfc>("prod")
            .await
            .and_then(|o| o.metadata.annotations?.get(names::APPLY_ATTEMPT).cloned())
            .unwrap_or_default()
    };

    // In place: applied without a question.
    set(json!({"generation": "1", "label": "b"})).await;
    wait_for("attempt 2 to be applied", LONG, || async {
        attempt().await == "2"
            && env
                .condition::<Tfc>("prod", "InputsApplied")
                .await
                .is_some_and(|(s, r, _)| s == "True" && r == "Applied")
    })
    .await;
    assert_eq!(disk().await, first_disk, "nothing replaced");

    // A replacement: stopped, named, nothing changed.
    set(json!({"generation": "2", "label": "b"})).await;
    let msg = wait_inputs_applied(&env, "DestructivePlanBlocked").await;
    assert!(
        msg.contains("replace terraform_data.disk")
            && msg.contains(names::APPROVE_PLAN)
            && msg.contains(RB),
        "{msg}"
    );
    assert!(!msg.contains("terraform_data.tag"), "{msg}");
    assert_eq!(
        disk().await,
        first_disk,
        "nothing replaced before the approval"
    );
    let (ready, _, _) = env.condition::<Tfc>("prod", "Ready").await.expect("Ready");
    assert_eq!(ready, "True", "still Ready");
    let blocked_attempt = attempt().await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(attempt().await, blocked_attempt, "not retried by itself");

    // The runbook: what you see, the Event, and its fix (the approval), then its wait.
    let run = run_runbook(&env, RB).await;
    assert!(
        run.stdout.contains("approving plan ")
            && run.stdout.contains("replace terraform_data.disk"),
        "{}",
        run.stdout
    );
    assert!(run.stdout.contains("Applied"), "{}", run.stdout);
    assert_ne!(
        disk().await,
        first_disk,
        "the approved plan replaced the disk"
    );
    let second_disk = disk().await;

    // An object that opts out applies a replacement without an approval.
    env.annotate::<Tfc>(
        "prod",
        &[(names::DESTRUCTIVE_PLANS, Some("allow".to_string()))],
    )
    .await;
    set(json!({"generation": "3", "label": "b"})).await;
    wait_for("the replacement to be applied", LONG, || async {
        disk().await != second_disk
            && env
                .condition::<Tfc>("prod", "InputsApplied")
                .await
                .is_some_and(|(s, r, _)| s == "True" && r == "Applied")
    })
    .await;
    env.shutdown().await;
}
