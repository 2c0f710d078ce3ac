//! A namespace deletion never takes the last readable state: whatever the moment, a
//! complete, readable, protected copy of the latest state survives, and an abandon in the
//! terminating namespace copies everything out before anything is let go. States of
//! three part Secrets, as Terraform cuts a state whose gzip passes 1 MiB.

use std::time::Duration;

use captf::api::TerraformMachine as Tfm;
use captf::api::names::{self, Kind};
use captf::state::{self, StateContent};
use k8s_openapi::api::core::v1::{Namespace, Secret};
use kube::api::{Api, DeleteParams};

use crate::steps::EnvExt;
use crate::support::*;

/// A state of about 4.5 MB of JSON, 3 MB gzipped: a base and two parts. In a resource
/// (`terraform_data` keeps it as its input and its output), not in an output: the
/// manager reads a state's outputs after each apply, and refuses outputs over 1 MiB.
const BLOB: &str = r#"
resource "terraform_data" "blob" {
  input = join("", [for i in range(500) : join("", [for j in range(35) : sha512("${i}-${j}")])])
}
"#;

const FAST: Duration = Duration::from_millis(300);

async fn big_machine(tag: &str, module_body: &str) -> Env {
    let env = Env::builder(tag)
        .backoff(FAST, FAST * 4)
        .with_machine("web-1", &format!("{module_body}{BLOB}"))
        .start()
        .await;
    let base = names::state_secret_name("web-1.tfm");
    assert!(
        state_secrets(&env, &base).await.len() >= 3,
        "the state is cut into a base and at least two parts"
    );
    env
}

/// The Secrets of a chunked set (`base` and `base-part-N`), with whether each carries
/// the protection finalizer.
async fn state_secrets(env: &Env, base: &str) -> Vec<(String, bool)> {
    let mut out: Vec<(String, bool)> = env
        .secrets()
        .list_metadata(&Default::default())
        .await
        .expect("secrets")
        .items
        .into_iter()
        .filter_map(|s| {
            let name = s.metadata.name.clone()?;
            (name == base || names::part_index(base, &name).is_some()).then(|| {
                let protected = s
                    .metadata
                    .finalizers
                    .unwrap_or_default()
                    .iter()
                    .any(|f| f == names::PROTECT_FINALIZER);
                (name, protected)
            })
        })
        .collect();
    out.sort();
    out
}

fn fingerprint(content: StateContent) -> Option<(String, u64)> {
    match content {
        StateContent::Parsed {
            lineage, serial, ..
        } => Some((lineage, serial)),
        _ => None,
    }
}

async fn read_set(api: &Api<Secret>, base: &str) -> Option<(String, u64)> {
    let secrets = captf::state::secrets::read(api, base, None)
        .await
        .expect("read");
    fingerprint(state::read(&secrets, state::DEFAULT_DECOMPRESSION_CAP))
}

async fn wait_all_protected(env: &Env, base: &str) {
    wait_for("the state and all its parts protected", long(), || async {
        let all = state_secrets(env, base).await;
        all.len() >= 3 && all.iter().all(|(_, p)| *p)
    })
    .await;
}

async fn delete_namespace(env: &Env) {
    Api::<Namespace>::all(env.client.clone())
        .delete(&env.ns, &DeleteParams::default())
        .await
        .expect("delete namespace");
}

/// After the namespace deletion: the state still reads, whole, as it did.
async fn assert_state_survived(env: &Env, before: &(String, u64)) {
    // The namespace controller has deleted what it could by the time the object says so.
    env.wait_deleting::<Tfm>("web-1", "DestroyCannotStart", long())
        .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let base = names::state_secret_name("web-1.tfm");
    let left = state_secrets(env, &base).await;
    assert!(left.len() >= 3, "{left:?}");
    assert_eq!(
        read_set(&env.secrets(), &base).await.as_ref(),
        Some(before),
        "the state reads as before"
    );
}

/// The abandon copies the state, Secret for Secret, and the inputs into the manager's
/// namespace, verified, then releases.
async fn abandon_and_check_copies(env: &Env, before: &(String, u64), with_backup: bool) {
    env.abandon::<Tfm>("web-1").await;
    env.wait_gone::<Tfm>("web-1", long()).await;
    let there: Api<Secret> = Api::namespaced(env.client.clone(), &env.manager_ns);
    let copy = names::abandoned_copy_name(&env.ns, "web-1.tfm");
    assert_eq!(read_set(&there, &copy).await.as_ref(), Some(before));
    let inputs = there
        .get(&names::abandoned_inputs_copy_name(&env.ns, "web-1.tfm"))
        .await
        .expect("the inputs copy");
    assert!(
        inputs
            .data
            .unwrap_or_default()
            .contains_key(names::INPUTS_KEY)
    );
    if with_backup {
        assert!(
            read_set(
                &there,
                &names::abandoned_backup_copy_name(&env.ns, "web-1.tfm")
            )
            .await
            .is_some(),
            "the backup copied too"
        );
    }
    assert!(!env.destroyed("web-1"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_namespace_deletion_with_no_job_running_keeps_the_whole_state() {
    let env = big_machine("ns-idle", &module(0)).await;
    let base = names::state_secret_name("web-1.tfm");
    // No Job of the object runs: the base and every part are protected.
    wait_all_protected(&env, &base).await;
    let before =
        fingerprint(env.read_state(Kind::TerraformMachine, "web-1").await).expect("readable");
    delete_namespace(&env).await;
    assert_state_survived(&env, &before).await;
    abandon_and_check_copies(&env, &before, false).await;
    env.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_namespace_deletion_just_after_the_objects_deletion_began_keeps_the_whole_state() {
    let env = big_machine("ns-began", &module(0)).await;
    let base = names::state_secret_name("web-1.tfm");
    // The object's deletion has begun, and stops (paused) before any Job.
    env.annotate::<Tfm>("web-1", &[(names::CAPI_PAUSED, Some("true".into()))])
        .await;
    env.delete::<Tfm>("web-1").await;
    env.wait_deleting::<Tfm>("web-1", "Paused", long()).await;
    wait_all_protected(&env, &base).await;
    let before =
        fingerprint(env.read_state(Kind::TerraformMachine, "web-1").await).expect("readable");
    delete_namespace(&env).await;
    env.annotate::<Tfm>("web-1", &[(names::CAPI_PAUSED, None)])
        .await;
    assert_state_survived(&env, &before).await;
    abandon_and_check_copies(&env, &before, false).await;
    env.shutdown().await;
}

/// An abandon in a terminating namespace whose release is interrupted after the kept
/// Secrets lost their protection (the release's write conflicts, as a concurrent change
/// makes it): the namespace then takes the state's parts, and the next pass must release
/// on the copies it verified before, not hold for ever comparing them with what is gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_abandon_interrupted_after_its_copies_releases_on_the_next_pass() {
    let env = big_machine("ns-interrupted", &module(0)).await;
    let base = names::state_secret_name("web-1.tfm");
    wait_all_protected(&env, &base).await;
    let before =
        fingerprint(env.read_state(Kind::TerraformMachine, "web-1").await).expect("readable");
    delete_namespace(&env).await;
    assert_state_survived(&env, &before).await;
    // The release (the patch that takes the finalizer off) conflicts once.
    env.proxy.faults().fail_next_with_body(
        1,
        Some("patch"),
        Some("terraformmachines"),
        "/metadata/finalizers",
        409,
    );
    abandon_and_check_copies(&env, &before, false).await;
    env.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_namespace_deletion_while_the_destroy_job_runs_keeps_a_whole_protected_backup() {
    // The first destroy sleeps long enough for the namespace to go under it.
    let env = big_machine("ns-job", &sleepy_module(20)).await;
    let before =
        fingerprint(env.read_state(Kind::TerraformMachine, "web-1").await).expect("readable");
    env.delete::<Tfm>("web-1").await;
    env.wait_deleting::<Tfm>("web-1", "WaitingForJob", long())
        .await;
    // The parts are off protection while the Job runs (Terraform deletes the parts a
    // shrinking state no longer has); the backup holds the state, protected, whole.
    let backup = names::backup_secret_name("web-1.tfm");
    let held = state_secrets(&env, &backup).await;
    assert!(held.len() >= 3 && held.iter().all(|(_, p)| *p), "{held:?}");
    delete_namespace(&env).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let held = state_secrets(&env, &backup).await;
    assert!(held.len() >= 3, "{held:?}");
    assert_eq!(
        read_set(&env.secrets(), &backup).await.as_ref(),
        Some(&before),
        "the backup reads as the state did before the Job"
    );
    env.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_abandon_whose_copies_are_refused_holds_and_says_why() {
    let env = big_machine("ns-refused", &module(0)).await;
    let base = names::state_secret_name("web-1.tfm");
    wait_all_protected(&env, &base).await;
    let before =
        fingerprint(env.read_state(Kind::TerraformMachine, "web-1").await).expect("readable");
    delete_namespace(&env).await;
    env.wait_deleting::<Tfm>("web-1", "DestroyCannotStart", long())
        .await;
    // The manager's namespace refuses the copies for a while.
    env.proxy
        .faults()
        .fail_next(10_000, Some("create"), Some("secrets"), 403);
    env.abandon::<Tfm>("web-1").await;
    let msg = env.wait_deleting::<Tfm>("web-1", "Held", long()).await;
    assert!(
        msg.contains("the abandon cannot finish") && msg.contains("runbooks/Abandon.md"),
        "{msg}"
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    let (_, reason, _) = env
        .condition::<Tfm>("web-1", "Deleting")
        .await
        .expect("Deleting");
    assert_eq!(reason, "Held", "never Abandoning while the copies fail");
    assert!(
        state_secrets(&env, &base).await.iter().all(|(_, p)| *p),
        "nothing unprotected"
    );
    env.proxy.faults().clear();
    abandon_and_check_copies(&env, &before, false).await;
    env.shutdown().await;
}

/// Two `terraform_data` instances: `gone` destroys; `kept` (4.5 MB of attributes, so what
/// a destroy leaves of the state still needs parts) fails to destroy while
/// `<markers>/web-1-kept.fail` exists, and leaves `web-1-kept.destroyed` when it succeeds.
const ONE_FAILS: &str = r#"
variable "name" { type = string }
variable "marker_dir" { type = string }
resource "terraform_data" "gone" {
  input = "${var.marker_dir}/${var.name}-gone"
}
resource "terraform_data" "kept" {
  input = {
    marker = "${var.marker_dir}/${var.name}-kept"
    blob   = join("", [for i in range(500) : join("", [for j in range(35) : sha512("kept-${i}-${j}")])])
  }
  provisioner "local-exec" {
    when    = destroy
    command = "if [ -e '${self.input.marker}.fail' ]; then echo 'Error: the cloud said no' >&2; exit 1; fi; touch '${self.input.marker}.destroyed'"
  }
}
"#;

/// A ValidatingAdmissionPolicy (the API server's own admission) that refuses the runner's
/// writes of `web-1`'s state Secrets in the test's namespace, as a quota or a policy would.
fn refuse_state_saves(env: &Env, apply: bool) {
    let ns = &env.ns;
    let manifest = format!(
        r#"apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicy
metadata:
  name: refuse-state-saves-{ns}
spec:
  failurePolicy: Fail
  matchConstraints:
    resourceRules:
    - apiGroups: [""]
      apiVersions: ["v1"]
      operations: ["CREATE", "UPDATE"]
      resources: ["secrets"]
  validations:
  - expression: "!((object.metadata.name == 'tfstate-default-web-1.tfm' || object.metadata.name.startsWith('tfstate-default-web-1.tfm-part-')) && request.userInfo.username in ['system:serviceaccount:{ns}:{runner}', 'captf-test-probe'])"
    message: "the state Secrets are read-only for the runner in this test"
---
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicyBinding
metadata:
  name: refuse-state-saves-{ns}
spec:
  policyName: refuse-state-saves-{ns}
  validationActions: [Deny]
  matchResources:
    namespaceSelector:
      matchLabels:
        kubernetes.io/metadata.name: {ns}
"#,
        runner = names::RUNNER_NAME
    );
    let mut child = std::process::Command::new("kubectl")
        .args([if apply { "apply" } else { "delete" }, "-f", "-"])
        .env("KUBECONFIG", env.kubeconfig_path())
        .stdin(std::process::Stdio::piped())
        .spawn()
        .expect("kubectl");
    use std::io::Write;
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(manifest.as_bytes())
        .expect("manifest");
    assert!(child.wait().expect("kubectl").success(), "kubectl failed");
}

/// Whether the policy is in force: a probe user the policy names too (impersonated, with
/// every permission, in a dry run) is refused a state Secret.
fn state_saves_refused(env: &Env) -> bool {
    let out = std::process::Command::new("kubectl")
        .args([
            "create",
            "secret",
            "generic",
            "tfstate-default-web-1.tfm-part-9",
            "-n",
            &env.ns,
            "--dry-run=server",
            "--as=captf-test-probe",
            "--as-group=system:masters",
        ])
        .env("KUBECONFIG", env.kubeconfig_path())
        .output()
        .expect("kubectl");
    String::from_utf8_lossy(&out.stderr).contains("read-only for the runner")
}

/// The errored states of `web-1` by workspace: the names of each one's Secrets.
async fn errored_sets(env: &Env) -> std::collections::BTreeMap<String, Vec<Secret>> {
    let lp = kube::api::ListParams::default().labels(names::LABEL_ERRORED_STATE);
    let mut out = std::collections::BTreeMap::<String, Vec<Secret>>::new();
    for s in env.secrets().list(&lp).await.expect("secrets").items {
        let suffix = s.metadata.labels.as_ref().expect("labels")[names::TF_LABEL_SUFFIX].clone();
        out.entry(suffix).or_default().push(s);
    }
    out
}

/// The errored states of `web-1` by workspace: how many Secrets each has (their metadata
/// only).
async fn errored_set_sizes(env: &Env) -> std::collections::BTreeMap<String, usize> {
    let lp = kube::api::ListParams::default().labels(names::LABEL_ERRORED_STATE);
    let mut out = std::collections::BTreeMap::<String, usize>::new();
    for s in env
        .secrets()
        .list_metadata(&lp)
        .await
        .expect("secrets")
        .items
    {
        let labels = s.metadata.labels.unwrap_or_default();
        *out.entry(
            labels
                .get(names::TF_LABEL_SUFFIX)
                .cloned()
                .unwrap_or_default(),
        )
        .or_default() += 1;
    }
    out
}

/// What Terraform could not save is kept whole, whatever its size, once per attempt: the
/// API server refuses the runner's state writes, so Terraform's destroy (one instance
/// gone, one failing) ends with an `errored.tfstate` of about 3 MB gzipped (a base and two parts); the runner
/// pushes it through Terraform's own backend, over the Pod's verified in-cluster TLS, into
/// a state of its own per attempt and Pod: gzip-compressed, in Secrets of at most 1 MiB,
/// readable, with the state's lineage. The retries go on (the errored state holds nothing
/// the state does not), and once the refusal is lifted the destroy finishes; cleanup
/// keeps the errored states.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_errored_state_is_kept_whole_under_a_name_of_its_own_per_attempt() {
    let env = Env::builder("errored-saved")
        .backoff(Duration::from_secs(1), Duration::from_secs(4))
        .with_machine("web-1", ONE_FAILS)
        .start()
        .await;
    let base = names::state_secret_name("web-1.tfm");
    wait_all_protected(&env, &base).await;
    let (lineage, _) = read_set(&env.secrets(), &base).await.expect("readable");
    let fail = env.markers().join("web-1-kept.fail");
    std::fs::write(&fail, "").expect("fail marker");
    refuse_state_saves(&env, true);
    wait_for("the policy in force", long(), || async {
        state_saves_refused(&env)
    })
    .await;

    env.delete::<Tfm>("web-1").await;
    let start = std::time::Instant::now();
    loop {
        // The Secrets' names first, and their data (megabytes) only once both attempts'
        // sets have three or more: a loop that lists the data five times a second loads
        // the API server and the machine as much as the Terraform runs it waits for.
        let names = errored_set_sizes(&env).await;
        let chunked = |prefix: &str| {
            names
                .iter()
                .any(|(ws, n)| ws.starts_with(prefix) && *n >= 3)
        };
        if !(chunked("errored-1-") && chunked("errored-2-")) {
            if start.elapsed() > Duration::from_secs(300) {
                panic!(
                    "timed out waiting for the errored states of two attempts: {names:?}; Deleting is {:?}",
                    env.condition::<Tfm>("web-1", "Deleting").await
                );
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
            continue;
        }
        let sets = errored_sets(&env).await;
        // Both there, and whole: the runner's init first makes an empty state there, and
        // the push then writes the base and the parts.
        let whole = |prefix: &str| {
            sets.iter().any(|(suffix, secrets)| {
                suffix.starts_with(prefix)
                    && matches!(
                        state::read(
                            &state::StateSecrets::from_secrets(
                                &names::state_secret_name(suffix),
                                secrets
                            ),
                            state::DEFAULT_DECOMPRESSION_CAP
                        ),
                        StateContent::Parsed {
                            managed_instances: 1,
                            ..
                        }
                    )
            })
        };
        if whole("errored-1-") && whole("errored-2-") {
            break;
        }
        // Two destroy attempts of a 3 MB state, each pushing what it could not save: about
        // a minute on a quiet machine, and 150 s were not enough while the image's static
        // build ran beside the suite. The wait ends as soon as both are there.
        if start.elapsed() > Duration::from_secs(300) {
            panic!(
                "timed out waiting for the errored states of two attempts: {:?}; Deleting is {:?}",
                sets.keys().collect::<Vec<_>>(),
                env.condition::<Tfm>("web-1", "Deleting").await
            );
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    // Said in the failed attempt's Event, which stays (its Deleting message lasts only
    // until the next attempt starts, which may be within the same second).
    let saved = format!(
        "terraform could not save its state: errored.tfstate saved in Secret {}/tfstate-default-errored-",
        env.ns
    );
    let notes = env.event_notes("web-1").await;
    assert!(
        notes
            .iter()
            .any(|(reason, note)| reason == "DestroyFailed" && note.contains(&saved)),
        "a failed attempt said where the errored state went: {notes:?}"
    );
    for (ws, secrets) in errored_sets(&env).await {
        assert!(ws.ends_with(".web-1.tfm"), "{ws}");
        let errored_base = names::state_secret_name(&ws);
        assert!(
            secrets.len() >= 3,
            "{ws}: chunked as Terraform chunks a state: {:?}",
            secrets
                .iter()
                .map(|s| s.metadata.name.clone())
                .collect::<Vec<_>>()
        );
        for s in &secrets {
            let size: usize = s.data.iter().flatten().map(|(_, v)| v.0.len()).sum();
            assert!(size <= 1024 * 1024, "{:?}: {size} bytes", s.metadata.name);
        }
        let set = state::StateSecrets::from_secrets(&errored_base, &secrets);
        match state::read(&set, state::DEFAULT_DECOMPRESSION_CAP) {
            StateContent::Parsed {
                lineage: l,
                managed_instances,
                ..
            } => {
                assert_eq!(l, lineage, "{ws}: the state's lineage");
                assert_eq!(managed_instances, 1, "{ws}: what the destroy left");
            }
            other => panic!("{ws}: {other:?}"),
        }
    }

    refuse_state_saves(&env, false);
    std::fs::remove_file(&fail).expect("fail marker");
    // The next attempts destroy the 3 MB state: as the errored states' wait above, 90 s
    // were not enough while the image's static build ran beside the suite.
    env.wait_gone::<Tfm>("web-1", Duration::from_secs(300))
        .await;
    assert!(env.markers().join("web-1-kept.destroyed").exists());
    assert!(
        errored_sets(&env).await.len() >= 2,
        "cleanup keeps the errored states"
    );
    env.shutdown().await;
}

/// The manager's memory does not grow with the number of deleting objects, nor with a
/// second copy of a state: a pass that needs the state takes one of the manager's
/// state-read permits first, and holds it for the pass (with none free, it waits; with
/// one, it reads), and it reads each Secret of the state once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_pass_reads_the_state_once_and_only_with_a_permit() {
    use captf::controller::{ClusterKind, discover_cluster};
    let env = Env::builder("state-permits").start().await;
    let uid = env.create_cluster("prod").await;
    env.create_object::<Tfm>("web-1", "prod", &uid, &env.markers())
        .await;
    // No manager here: a finalizer of the test's own keeps the deleted object.
    let objects: Api<Tfm> = Api::namespaced(env.client.clone(), &env.ns);
    objects
        .patch(
            "web-1",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(
                serde_json::json!({"metadata": {"finalizers": ["captf.test/hold"]}}),
            ),
        )
        .await
        .expect("finalizer");
    objects
        .delete("web-1", &DeleteParams::default())
        .await
        .expect("delete");
    let obj = objects.get("web-1").await.expect("the deleting object");
    // A state of a base and a part, labelled as Terraform's backend labels it.
    let suffix = "web-1.tfm";
    let base = names::state_secret_name(suffix);
    let labels = serde_json::json!({
        names::TF_LABEL_STATE: "true", names::TF_LABEL_SUFFIX: suffix,
        names::TF_LABEL_WORKSPACE: "default", names::TF_LABEL_MANAGED_BY: "terraform",
    });
    let gz = {
        use std::io::Write;
        let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        e.write_all(br#"{"version":4,"serial":3,"lineage":"l-1","resources":[]}"#)
            .expect("gzip");
        e.finish().expect("gzip")
    };
    let (first, second) = gz.split_at(gz.len() / 2);
    for (name, bytes) in [
        (base.clone(), first),
        (names::part_secret_name(&base, 1), second),
    ] {
        let secret: Secret = serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "labels": labels},
            "data": {names::TF_STATE_KEY: k8s_openapi::ByteString(bytes.to_vec())},
        }))
        .expect("secret");
        env.secrets()
            .create(&Default::default(), &secret)
            .await
            .expect("state Secret");
    }
    env.proxy.request_log().reset();
    let cluster_api = discover_cluster(&env.client).await;
    assert!(matches!(cluster_api, ClusterKind::Known(_)));
    let settings = captf::gather::Settings::default();
    // The manager's context as a pass has it, with one state-read permit, no caches.
    let ctx = captf::controller::Context::new(
        env.proxy.client(),
        &captf::controller::ManagerConfig {
            max_state_reads: 1,
            ..Default::default()
        },
        captf::job::Templates::embedded(),
        Default::default(),
        cluster_api,
    );
    let permits = &ctx.state_reads;
    let held = permits.acquire(captf::state::permits::Lane::AfterJob).await;
    let scope = captf::controller::Scope::new(&ctx.client, &obj).expect("scope");
    let source = captf::controller::source::Cluster::new(
        &ctx,
        &scope,
        captf::state::permits::Lane::Ordinary,
    );
    let (observed, state_meta) = {
        let pass = captf::gather::source::observe_pass(
            &source,
            captf::gather::source::Subject::of(&obj),
            &settings,
        );
        tokio::pin!(pass);
        assert!(
            tokio::time::timeout(Duration::from_secs(2), &mut pass)
                .await
                .is_err(),
            "with no permit free, the pass waits before reading the state"
        );
        drop(held);
        tokio::time::timeout(Duration::from_secs(20), pass)
            .await
            .expect("with a permit, the pass reads")
            .expect("observe")
    };
    assert!(state_meta.is_some(), "the state was read");
    assert!(
        matches!(
            state::read(
                observed.state.as_ref().expect("state"),
                state::DEFAULT_DECOMPRESSION_CAP
            ),
            StateContent::Parsed { serial: 3, .. }
        ),
        "{:?}",
        observed.state
    );
    // Each Secret of the state once: one list by Terraform's suffix label holds the base
    // and its part; the one read by name is the inputs Secret's.
    let log = env.proxy.request_log();
    assert_eq!(
        (
            log.count("get", "secrets", ""),
            log.count("list", "secrets", "")
        ),
        (1, 2),
        "the inputs by name; the state's list and the errored states' (metadata) list: {:?}",
        log.snapshot()
    );
    assert_eq!(
        permits.available(),
        0,
        "the pass holds its permit while its observation lives"
    );
    drop(observed);
    assert_eq!(permits.available(), 1, "and gives it back after");
    objects
        .patch(
            "web-1",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(serde_json::json!({"metadata": {"finalizers": null}})),
        )
        .await
        .expect("finalizer off");
    env.shutdown().await;
}

/// A restore of a shorter state over a protected state of three Secrets leaves only what
/// the new state has: the parts it no longer has lose their protection and go, instead of
/// lingering held in deletion beside it until the object's cleanup.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_restore_over_a_longer_protected_state_leaves_no_part_held_in_deletion() {
    let env = big_machine("restore-shrinks", &module(0)).await;
    let base = names::state_secret_name("web-1.tfm");
    wait_all_protected(&env, &base).await;
    let file = env.dir.join("small.tfstate");
    std::fs::write(
        &file,
        r#"{"version":4,"terraform_version":"1.11.4","serial":1,"lineage":"a-restored-lineage","outputs":{},"resources":[],"check_results":null}"#,
    )
    .expect("state file");
    env.restore_from_file("terraformmachine/web-1", &file);
    assert_eq!(
        state_secrets(&env, &base).await,
        vec![(base.clone(), true)],
        "only the base is left, protected"
    );
    assert_eq!(
        read_set(&env.secrets(), &base).await,
        Some(("a-restored-lineage".to_string(), 1))
    );
    env.shutdown().await;
}

/// A destroy that fails after Terraform destroyed the big resource leaves a one-Secret
/// state at a newer serial, and the backup follows it: the parts of the longer backup go
/// (the backup is read up to its first missing part, so one left would be read as the
/// tail of the shorter stream). The longer backup was written by this manager (`restart`
/// false: its parts are read, since the cache may not show its own write yet) or by the
/// one before it (`restart`: the cache, listed at the start, shows them).
async fn a_backup_that_shrinks_leaves_no_part_of_the_longer_one(tag: &str, restart: bool) {
    let mut env = Env::builder(tag)
        .backoff(Duration::from_secs(5), Duration::from_secs(20))
        .with_machine("web-1", &format!("{}{BLOB}", module(u32::MAX)))
        .start()
        .await;
    let (base, backup) = (
        names::state_secret_name("web-1.tfm"),
        names::backup_secret_name("web-1.tfm"),
    );
    assert!(state_secrets(&env, &base).await.len() >= 3);
    // The record of the apply backed the state up: three Secrets too.
    wait_for("the apply's backup, whole", long(), || async {
        state_secrets(&env, &backup).await.len() >= 3
    })
    .await;
    if restart {
        env.stop_manager().await;
        env.start_manager();
    }
    env.delete::<Tfm>("web-1").await;
    env.wait_deleting::<Tfm>("web-1", "DestroyFailed", long())
        .await;
    let shrunk = fingerprint(env.read_state(Kind::TerraformMachine, "web-1").await)
        .expect("the failed destroy's state is readable");
    assert_eq!(
        state_secrets(&env, &base).await.len(),
        1,
        "the big resource is destroyed: one Secret"
    );
    wait_for("the backup to follow the shorter state", long(), || async {
        state_secrets(&env, &backup).await.len() == 1
    })
    .await;
    assert_eq!(
        state_secrets(&env, &backup)
            .await
            .into_iter()
            .map(|(name, protected)| (name == backup, protected))
            .collect::<Vec<_>>(),
        [(true, true)],
        "the backup's base alone, protected"
    );
    assert_eq!(read_set(&env.secrets(), &backup).await, Some(shrunk));
    env.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_backup_that_shrinks_after_this_managers_longer_one_leaves_none_of_its_parts() {
    a_backup_that_shrinks_leaves_no_part_of_the_longer_one("backup-shrinks", false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_backup_that_shrinks_after_an_earlier_managers_longer_one_leaves_none_of_its_parts() {
    a_backup_that_shrinks_leaves_no_part_of_the_longer_one("backup-shrinks-restart", true).await;
}

/// Writing a one-Secret set where no longer set was (a deletion's backup, a first
/// restore) looks for a surplus part with a read and deletes nothing: a deletion's writes
/// are what the scale bench counts.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_set_written_where_none_was_looks_for_surplus_parts_without_a_write() {
    use captf::state::secrets::{self as chunked, Over};
    let env = Env::builder("set-no-surplus").start().await;
    let secrets: Api<Secret> = Api::namespaced(env.proxy.client(), &env.ns);
    let base = names::backup_secret_name("web-1.tfm");
    env.proxy.request_log().reset();
    let gz = {
        use std::io::Write;
        let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        e.write_all(br#"{"version":4,"serial":1,"lineage":"l-1","resources":[]}"#)
            .expect("gzip");
        e.finish().expect("gzip")
    };
    let parts = chunked::write(
        &secrets,
        &base,
        &gz,
        (Over::Replace, chunked::Earlier::Read),
        |name, _, chunk| {
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": name},
                "data": {names::TF_STATE_KEY: k8s_openapi::ByteString(chunk.to_vec())},
            }))
            .expect("secret")
        },
    )
    .await
    .expect("written");
    assert_eq!(parts, 0);
    let log = env.proxy.request_log();
    assert_eq!(
        (
            log.writes("secrets", ""),
            log.count("delete", "secrets", "")
        ),
        (1, 0),
        "one create, no delete: {:?}",
        log.snapshot()
    );
    env.shutdown().await;
}

/// The namespace is deleted a moment after the apply wrote a three-part state: the parts
/// are too new for their protection finalizer (Terraform may still be writing them), and
/// the namespace deletion takes them. A protected, readable copy of that state must be
/// left: the backup, made as the parts appear.
async fn namespace_deleted_just_after_the_apply(env: Env) {
    let base = names::state_secret_name("web-1.tfm");
    let backup = names::backup_secret_name("web-1.tfm");
    let before =
        fingerprint(env.read_state(Kind::TerraformMachine, "web-1").await).expect("readable");
    delete_namespace(&env).await;
    // The namespace controller deletes everything it may within seconds.
    wait_for("the namespace's Secrets to be deleted", long(), || async {
        let left: Vec<String> = env
            .secrets()
            .list_metadata(&Default::default())
            .await
            .map(|l| {
                l.items
                    .into_iter()
                    .filter_map(|s| s.metadata.name)
                    .collect()
            })
            .unwrap_or_default();
        left.iter().all(|n| {
            n == &base
                || n.starts_with(&backup)
                || n.starts_with(&names::inputs_secret_name("web-1.tfm"))
                || names::part_index(&base, n).is_some()
        })
    })
    .await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let state = read_set(&env.secrets(), &base).await;
    let copy = read_set(&env.secrets(), &backup).await;
    assert!(
        state.as_ref() == Some(&before) || copy.as_ref() == Some(&before),
        "no readable copy of the state is left: state {state:?}, backup {copy:?}, Secrets {:?}",
        state_secrets(&env, &base).await
    );
    env.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_namespace_deleted_just_after_the_managers_apply_keeps_a_readable_copy() {
    let env = big_machine("ns-after-apply", &module(0)).await;
    namespace_deleted_just_after_the_apply(env).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_namespace_deleted_just_after_an_apply_by_hand_keeps_a_readable_copy() {
    let env = Env::builder("ns-after-hand")
        .backoff(FAST, FAST * 4)
        .with_machine_applied_by_hand(&format!("{}{BLOB}", module(0)))
        .start()
        .await;
    namespace_deleted_just_after_the_apply(env).await;
}

/// An abandon decided while the namespace was live, and the namespace deleted while that
/// pass was still on its way (its write held up here): the Secrets it keeps must not go
/// with the namespace. The abandon looks at the namespace again before it takes any
/// protection off, and copies everything out first when it is terminating by then.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_abandon_racing_a_namespace_deletion_still_copies_what_it_keeps() {
    let env = Env::builder("abandon-race")
        .backoff(FAST, FAST * 4)
        .with_machine("web-1", &module(0))
        .start()
        .await;
    let state = names::state_secret_name("web-1.tfm");
    env.wait_protected(&state).await;
    env.lose_secret(&state).await;
    env.delete::<Tfm>("web-1").await;
    env.wait_deleting::<Tfm>("web-1", "Held", long()).await;
    // The next write of the object by the manager (the abandon's pass) waits 5 s.
    env.proxy.faults().delay_next(
        1,
        Some("patch"),
        Some("terraformmachines"),
        Duration::from_secs(5),
    );
    env.abandon::<Tfm>("web-1").await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    delete_namespace(&env).await;
    env.wait_gone::<Tfm>("web-1", long()).await;
    let there: Api<Secret> = Api::namespaced(env.client.clone(), &env.manager_ns);
    assert!(
        there
            .get_opt(&names::abandoned_inputs_copy_name(&env.ns, "web-1.tfm"))
            .await
            .expect("read")
            .is_some(),
        "the inputs went with the namespace, not copied"
    );
    env.shutdown().await;
}

/// The cleanup keeps the errored states with their protection taken off, even one that its
/// own pass protected first. An errored state the manager has not protected yet (it
/// appeared while the manager was stopped, and no pass between could: the destroy's Job
/// ran) is protected by the bookkeeping of the pass that cleans up, after that pass read
/// it: the cleanup must not take the finalizer off by what it read, or the errored state
/// keeps it for ever once the object is gone (and `kubectl delete`, as the ErroredState
/// runbook's last step does it, waits for ever).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_cleanup_leaves_no_errored_state_protected_even_one_its_own_pass_protected() {
    let mut env = Env::builder("errored-unprotected")
        .backoff(FAST, FAST * 4)
        .with_machine("web-1", &module(0))
        .start()
        .await;
    let suffix = names::state_suffix(Kind::TerraformMachine, "web-1");
    env.wait_protected(&names::state_secret_name(&suffix)).await;
    env.stop_manager().await;
    // Terraform's last state of a run whose save failed, recording nothing the state does
    // not (so nothing holds the deletion), kept as a runner keeps it.
    let state = env
        .secrets()
        .get(&names::state_secret_name(&suffix))
        .await
        .expect("the state Secret");
    let tfstate = state
        .data
        .as_ref()
        .and_then(|d| d.get(names::TF_STATE_KEY))
        .expect("the state's tfstate key")
        .0
        .clone();
    let errored_name = env.keep_errored_state(tfstate).await;
    // Older than a part may be and still be left unprotected for being new (10 s).
    tokio::time::sleep(Duration::from_secs(11)).await;
    env.delete::<Tfm>("web-1").await;
    env.start_manager();
    env.wait_gone::<Tfm>("web-1", long()).await;
    let kept = env
        .secrets()
        .get(&errored_name)
        .await
        .expect("cleanup keeps the errored state");
    assert!(
        !kept
            .metadata
            .finalizers
            .iter()
            .flatten()
            .any(|f| f == names::PROTECT_FINALIZER),
        "the errored state {errored_name} still has the protection finalizer after its object was released: {:?}",
        kept.metadata.finalizers
    );
    env.shutdown().await;
}
