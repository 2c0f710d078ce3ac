//! The apply path keeps the deletion's guarantees: no pass waits on itself for a
//! state-read permit, a success CAPTF cannot record is a hold rather than Ready, the
//! destroy runs the inputs that last wrote the state, an errored state holds the apply as
//! it holds the destroy, and what the apply leaves behind is bounded.

use captf::api::names::{self, Kind};
use kube::api::{Patch, PatchParams};
use serde_json::json;

use crate::provisioning::{
    annotation, handoff_cluster_module, recording_machine_module, wait_condition,
};
use crate::steps::FAST;
use crate::support::*;

/// A machine module with no managed resource (only the contract's outputs): what a "bring
/// your own machine" module looks like, whose state holds no instance.
fn data_only_machine_module() -> String {
    r#"variable "name" { type = string }
variable "marker_dir" { type = string }
variable "captf_cluster_outputs" { type = any }
"#
    .to_string()
        + contract_outputs(Kind::TerraformMachine)
}

/// [`handoff_module`] with OpenTofu's state encryption: a security-minded team's module
/// (the machine's state holds its bootstrap data). CAPTF cannot read what such a state
/// describes.
fn encrypted_machine_module() -> String {
    r#"terraform {
  encryption {
    key_provider "pbkdf2" "team" {
      passphrase = "correct-horse-battery-staple"
    }
    method "aes_gcm" "team" {
      keys = key_provider.pbkdf2.team
    }
    state {
      method = method.aes_gcm.team
    }
  }
}
"#
    .to_string()
        + &handoff_module()
}

/// The spec beside the module that runs OpenTofu.
fn tofu() -> serde_json::Value {
    json!({"runner": {"runtime": "tofu"}})
}

/// A machine module that takes its cluster's hand-off and makes one instance.
fn handoff_module() -> String {
    recording_machine_module(
        1,
        r#"variable "captf_cluster_outputs" { type = any }"#,
        "'${jsonencode(var.captf_cluster_outputs)}'",
    )
}

/// The Cluster `prod` ready, its infrastructure the TerraformCluster `prod` (applied, with
/// a hand-off for its machines), and Machine `name` with its bootstrap data owning the
/// TerraformMachine `name` of `module`, created with `annotations`.
async fn machine_of_a_terraform_cluster(
    env: &Env,
    name: &str,
    module: &str,
    extra: serde_json::Value,
    annotations: serde_json::Value,
) {
    if env
        .cluster_api()
        .get_opt("prod")
        .await
        .ok()
        .flatten()
        .is_none()
    {
        let cluster_uid = env.create_cluster_with_infrastructure("prod").await;
        env.mark_cluster_ready("prod").await;
        env.create_owned::<Tfc>(
            "prod",
            "prod",
            &[("Cluster", "prod", &cluster_uid, false)],
            &handoff_cluster_module("s-1"),
            json!({}),
        )
        .await;
        env.wait_provisioned::<Tfc>("prod").await;
    }
    let secret = format!("{name}-bootstrap");
    env.create_bootstrap_secret("prod", &secret, &format!("#cloud-config {name}"))
        .await;
    let uid = env.create_machine(name, "prod", Some(&secret)).await;
    env.create_owned::<Tfm>(
        name,
        "prod",
        &[("Machine", name, &uid, true)],
        module,
        extra,
    )
    .await;
    if annotations.as_object().is_some_and(|a| !a.is_empty()) {
        env.api::<Tfm>()
            .patch(
                name,
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"annotations": annotations}})),
            )
            .await
            .expect("annotate");
    }
}

/// Waits until apply attempt `n` of `kind`/`name` has succeeded.
async fn wait_apply_succeeded(env: &Env, kind: Kind, name: &str, n: u32) {
    let job = names::job_name(&names::state_suffix(kind, name), names::OPERATION_APPLY, n);
    wait_for(&format!("{job} to succeed"), long(), || async {
        kube::Api::<k8s_openapi::api::batch::v1::Job>::namespaced(env.client.clone(), &env.ns)
            .get_opt(&job)
            .await
            .ok()
            .flatten()
            .and_then(|j| j.status?.succeeded)
            == Some(1)
    })
    .await;
}

/// A machine whose apply succeeded but whose state CAPTF cannot record (OpenTofu
/// encrypted it), with its cluster's hand-off not in the manager's memory (a restart) and
/// one state-read permit: its pass reads its state under the permit, then its cluster's
/// outputs. Holding the first while it waited for the second stopped every state read of
/// the manager for good. Another machine's deletion must still go through.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn no_pass_holds_a_state_read_permit_while_it_waits_for_another() {
    if envtest_only("OpenTofu is on PATH in the local kubelet's image only") {
        return;
    }
    let mut env = Env::builder("permits").start().await;
    env.config.provision = true;
    env.config.max_state_reads = 1;
    env.start_manager();
    machine_of_a_terraform_cluster(&env, "web-2", &handoff_module(), json!({}), json!({})).await;
    env.wait_provisioned::<Tfm>("web-2").await;
    machine_of_a_terraform_cluster(
        &env,
        "web-1",
        &encrypted_machine_module(),
        tofu(),
        json!({}),
    )
    .await;
    wait_apply_succeeded(&env, Kind::TerraformMachine, "web-1", 1).await;
    // A restart: the cluster's hand-off is read again, by web-1's passes (every 10 s while
    // it waits). Nothing outside shows a pass stuck on a permit: time for it to happen.
    env.stop_manager().await;
    env.start_manager();
    tokio::time::sleep(std::time::Duration::from_secs(15)).await;

    env.delete::<Tfm>("web-2").await;
    env.wait_gone::<Tfm>("web-2", long()).await;
    env.shutdown().await;
}

/// An apply that succeeded but left a state CAPTF cannot read (OpenTofu's encryption) is
/// not recorded, so nothing tells Cluster API it is provisioned: its Ready must not say
/// True (Cluster API mirrors it and waits for ever behind a green object). It holds with
/// a reason of its own, its runbook and a Warning Event, and applies nothing more.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_success_that_cannot_be_recorded_is_a_hold_not_ready() {
    if envtest_only("OpenTofu is on PATH in the local kubelet's image only") {
        return;
    }
    let env = Env::builder("unrecorded").provisioning().start().await;
    machine_of_a_terraform_cluster(
        &env,
        "web-1",
        &encrypted_machine_module(),
        tofu(),
        json!({}),
    )
    .await;
    wait_apply_succeeded(&env, Kind::TerraformMachine, "web-1", 1).await;
    let msg = wait_condition::<Tfm>(&env, "web-1", "Ready", "False", "ApplyUnrecorded").await;
    assert!(
        msg.contains("StateEncrypted") && msg.contains("runbooks/ApplyUnrecorded.md"),
        "{msg}"
    );
    let (status, reason, _) = env
        .condition::<Tfm>("web-1", "Provisioned")
        .await
        .expect("Provisioned");
    assert_eq!(
        (status.as_str(), reason.as_str()),
        ("False", "ApplyUnrecorded")
    );
    let obj = env.object::<Tfm>("web-1").await.expect("machine");
    assert_eq!(
        obj.status
            .as_ref()
            .and_then(|s| s.initialization.as_ref())
            .and_then(|i| i.provisioned),
        None,
        "provisioned without a recorded success"
    );
    assert!(
        env.event_reasons("web-1")
            .await
            .iter()
            .any(|r| r == "ApplyUnrecorded"),
        "no Warning Event"
    );
    tokio::time::sleep(std::time::Duration::from_secs(5)).await;
    assert_eq!(
        env.object::<Tfm>("web-1")
            .await
            .and_then(|o| annotation(&o, names::APPLY_ATTEMPT))
            .as_deref(),
        Some("1"),
        "applied again"
    );
    env.shutdown().await;
}

/// An apply killed before Terraform saved its state leaves `apply-interrupted` (an empty
/// state is then not trusted). A later apply that completes wrote the whole state: for a
/// module that manages no resource, that state is empty and right, and its success is
/// recorded (the object provisioned, the annotation cleared), not held for ever.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_completed_apply_after_an_interrupted_one_is_recorded_even_when_empty() {
    let env = Env::builder("interrupted-empty")
        .provisioning()
        .start()
        .await;
    let interrupted = json!({ names::APPLY_INTERRUPTED: "2026-12-05T10:00:00Z" });
    machine_of_a_terraform_cluster(
        &env,
        "web-1",
        &data_only_machine_module(),
        json!({}),
        interrupted,
    )
    .await;
    wait_for("web-1 to be provisioned", long(), || async {
        env.object::<Tfm>("web-1").await.is_some_and(|o| {
            o.status
                .as_ref()
                .and_then(|s| s.initialization.as_ref())
                .and_then(|i| i.provisioned)
                == Some(true)
        })
    })
    .await;
    let obj = env.object::<Tfm>("web-1").await.expect("machine");
    assert_eq!(annotation(&obj, names::APPLY_INTERRUPTED), None);
    assert_eq!(
        annotation(&obj, names::APPLIED_ATTEMPT).as_deref(),
        Some("1")
    );
    env.shutdown().await;
}

/// A cluster module of `apply_module(0)` with a `region` variable, as a module whose
/// provider is configured by its inputs.
fn regional_module() -> String {
    apply_module(0) + "variable \"region\" { type = string }\n"
}

/// The spec's variables of the TerraformCluster `prod` with `region`.
fn regional_variables(env: &Env, region: &str) -> serde_json::Value {
    json!({"variables": {"name": "prod", "marker_dir": env.markers().display().to_string(), "region": region}})
}

/// The variables file of the variables Secret of `job` (the attempt's Secret is named
/// after its Job), once it exists.
async fn attempt_variables(env: &Env, job: &str) -> String {
    env.attempt_files(job)
        .await
        .into_iter()
        .filter(|(path, _)| path.ends_with(".tfvars.json"))
        .map(|(path, content)| format!("{path}: {content}"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// A change of inputs whose apply never ran (the API server refuses its Job) must not
/// change what the destroy runs: Terraform never saw region b, and a destroy with it
/// would refresh against another region, find nothing, and "succeed" while region a's
/// infrastructure lives on unrecorded. The destroy runs the inputs of the last apply
/// that wrote the state.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_destroy_runs_the_inputs_that_last_wrote_the_state() {
    if envtest_only("it reads the files Terraform leaves on this machine") {
        return;
    }
    let env = Env::builder("inputs-ran").provisioning().start().await;
    env.provisioned_cluster(&regional_module(), regional_variables(&env, "a"))
        .await;
    let apply_refused = env
        .refuse_jobs(
            &[(names::LABEL_OPERATION, names::OPERATION_APPLY)],
            "no apply Jobs here today",
        )
        .await;
    env.api::<Tfc>()
        .patch(
            "prod",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": regional_variables(&env, "b")})),
        )
        .await
        .expect("change the region");
    wait_condition::<Tfc>(&env, "prod", "InputsApplied", "False", "ApplyCannotStart").await;
    // Held at its Pod, so that the destroy's variables can be read.
    let destroy_held = env
        .refuse_pods(
            &[(names::LABEL_OPERATION, names::OPERATION_DESTROY)],
            "not yet",
        )
        .await;
    env.delete_cluster("prod").await;
    let job = names::job_name(
        &names::state_suffix(Kind::TerraformCluster, "prod"),
        names::OPERATION_DESTROY,
        1,
    );
    let variables = attempt_variables(&env, &job).await;
    assert!(
        variables.contains("\"region\": \"a\""),
        "the destroy does not run the inputs that made the state:\n{variables}"
    );
    destroy_held.remove(&env.client).await;
    apply_refused.remove(&env.client).await;
    env.wait_gone::<Tfc>("prod", long()).await;
    assert!(env.destroyed("prod"), "Terraform destroyed the instances");
    env.shutdown().await;
}

/// The ApplyFailed runbook's way out ("delete the Cluster: a destroy always wins") must
/// work when the failed apply broke the module: the destroy runs the module that made the
/// state, not the broken one that never wrote it, and the Cluster goes.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_broken_module_that_never_ran_does_not_break_the_destroy() {
    if envtest_only("it reads the files Terraform leaves on this machine") {
        return;
    }
    let env = Env::builder("broken-module")
        .backoff(
            std::time::Duration::from_secs(300),
            std::time::Duration::from_secs(600),
        )
        .provisioning()
        .start()
        .await;
    env.provisioned_cluster(&apply_module(0), json!({})).await;
    // A syntax error: init fails, Terraform never touches the state.
    let broken = format!(
        "{}\nresource \"terraform_data\" \"oops\" {{\n",
        apply_module(0)
    );
    env.api::<Tfc>()
        .patch(
            "prod",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"module": {"files": {"main.tf": broken}}}})),
        )
        .await
        .expect("break the module");
    wait_condition::<Tfc>(&env, "prod", "InputsApplied", "False", "ApplyFailed").await;
    env.delete_cluster("prod").await;
    env.wait_gone::<Tfc>("prod", long()).await;
    assert!(env.destroyed("prod"), "Terraform destroyed the instances");
    env.shutdown().await;
}

/// A cluster module whose instance count is the variable `n`.
fn counted_module() -> String {
    apply_module(0).replace("count = 2", "count = var.n") + "variable \"n\" { type = number }\n"
}

fn counted_variables(env: &Env, n: u32) -> serde_json::Value {
    json!({"variables": {"name": "prod", "marker_dir": env.markers().display().to_string(), "n": n}})
}

/// Refuses every update of the Secret `name` in the test's namespace (Terraform's save of
/// the state then fails); returns what removes the refusal.
async fn refuse_secret_updates(env: &Env, name: &str) -> impl AsyncFnOnce() {
    use k8s_openapi::api::admissionregistration::v1::{
        ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding,
    };
    let policy_name = format!("refuse-save-{}", env.ns);
    let policy: ValidatingAdmissionPolicy = serde_json::from_value(json!({
        "metadata": {"name": policy_name},
        "spec": {"failurePolicy": "Fail",
            "matchConstraints": {"resourceRules": [{"apiGroups": [""], "apiVersions": ["v1"],
                "operations": ["UPDATE"], "resources": ["secrets"]}]},
            "validations": [{"expression": format!("object.metadata.name != '{name}'"),
                "message": "the state may not be saved now"}]}
    }))
    .expect("policy");
    let binding: ValidatingAdmissionPolicyBinding = serde_json::from_value(json!({
        "metadata": {"name": policy_name},
        "spec": {"policyName": policy_name, "validationActions": ["Deny"],
            "matchResources": {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": env.ns}}}}
    }))
    .expect("binding");
    let policies = kube::Api::<ValidatingAdmissionPolicy>::all(env.client.clone());
    let bindings = kube::Api::<ValidatingAdmissionPolicyBinding>::all(env.client.clone());
    policies
        .create(&Default::default(), &policy)
        .await
        .expect("policy");
    bindings
        .create(&Default::default(), &binding)
        .await
        .expect("binding");
    // The API server applies a policy a moment after it is created.
    tokio::time::sleep(std::time::Duration::from_secs(3)).await;
    let client = env.client.clone();
    async move || {
        let _ = kube::Api::<ValidatingAdmissionPolicyBinding>::all(client.clone())
            .delete(&policy_name, &Default::default())
            .await;
        let _ = kube::Api::<ValidatingAdmissionPolicy>::all(client)
            .delete(&policy_name, &Default::default())
            .await;
    }
}

/// An apply whose state Terraform could not save (the runner kept it as an errored state)
/// created resources the state does not record. Retried against that state, it would
/// create them again (and again, while the save keeps failing). The errored state holds
/// the apply as it holds the destroy, until an operator has merged it back.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_errored_state_holds_the_apply() {
    errored_state_holds_the_apply(false).await;
}

/// The same behind the state proxy: the runner saves its errored state through the proxy
/// (the errored state's Secrets and the lock its `init` takes).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_errored_state_saved_through_the_state_proxy_holds_the_apply() {
    errored_state_holds_the_apply(true).await;
}

async fn errored_state_holds_the_apply(state_proxy: bool) {
    if envtest_only("it reads the files Terraform leaves on this machine") {
        return;
    }
    // Retries 2 s apart: a retry would come at once.
    let mut builder = Env::builder("errored-apply").backoff(
        std::time::Duration::from_secs(2),
        std::time::Duration::from_secs(4),
    );
    if state_proxy {
        builder = builder.state_proxy();
    }
    let env = builder.provisioning().start().await;
    env.provisioned_cluster(&counted_module(), counted_variables(&env, 2))
        .await;
    let state = names::state_secret_name(&names::state_suffix(Kind::TerraformCluster, "prod"));
    let allow = refuse_secret_updates(&env, &state).await;
    env.api::<Tfc>()
        .patch(
            "prod",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": counted_variables(&env, 3)})),
        )
        .await
        .expect("one more instance");
    let msg = wait_condition::<Tfc>(&env, "prod", "InputsApplied", "False", "ErroredState").await;
    assert!(msg.contains("runbooks/ErroredState.md"), "{msg}");
    allow().await;
    // Held: no further attempt, however long it waits.
    tokio::time::sleep(std::time::Duration::from_secs(10)).await;
    let obj = env.object::<Tfc>("prod").await.expect("object");
    assert_eq!(annotation(&obj, names::APPLY_ATTEMPT).as_deref(), Some("2"));
    let applies = std::fs::read_to_string(env.markers().join("prod-2.applies")).unwrap_or_default();
    assert_eq!(applies.trim(), "1", "the new instance was created again");
    env.shutdown().await;
}

/// Apply Jobs, their Pods and their variables Secrets are pruned as destroy Jobs are:
/// the last three attempts stay for their logs. A pool whose bootstrap token Cluster API
/// rotates every few minutes re-applies each time, and kept them all (about 144 a day).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn apply_jobs_are_pruned_to_the_last_three() {
    let env = Env::builder("prune-applies").provisioning().start().await;
    env.provisioned_cluster(&counted_module(), counted_variables(&env, 1))
        .await;
    for n in 2..=6u32 {
        env.api::<Tfc>()
            .patch(
                "prod",
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": counted_variables(&env, n)})),
            )
            .await
            .expect("re-apply");
        wait_for(&format!("apply {n} to be recorded"), long(), || async {
            env.object::<Tfc>("prod")
                .await
                .and_then(|o| annotation(&o, names::APPLIED_ATTEMPT))
                == Some(n.to_string())
        })
        .await;
    }
    let suffix = names::state_suffix(Kind::TerraformCluster, "prod");
    let jobs = |list: Vec<String>| {
        list.into_iter()
            .filter(|n| n.contains("-apply-"))
            .collect::<Vec<_>>()
    };
    wait_for("the apply Jobs to be pruned", long(), || async {
        let names: Vec<String> =
            kube::Api::<k8s_openapi::api::batch::v1::Job>::namespaced(env.client.clone(), &env.ns)
                .list(&Default::default())
                .await
                .expect("jobs")
                .items
                .into_iter()
                .filter_map(|j| j.metadata.name)
                .collect();
        jobs(names).len() <= 3
    })
    .await;
    let left: Vec<String> = env
        .secrets()
        .list(&Default::default())
        .await
        .expect("secrets")
        .items
        .into_iter()
        .filter_map(|s| s.metadata.name)
        .collect();
    let variables = jobs(left);
    assert_eq!(
        variables,
        (4..=6)
            .map(|n| names::job_name(&suffix, names::OPERATION_APPLY, n))
            .collect::<Vec<_>>(),
        "the variables Secrets of the pruned attempts are gone, the last three kept"
    );
    env.shutdown().await;
}

/// An apply never starts against a state it cannot trust: one of another lineage than
/// the object recorded (a state restored from elsewhere) would be changed by Terraform as
/// if it were the object's, and what it then made could not be recorded.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn no_apply_starts_against_a_state_of_another_lineage() {
    let env = Env::builder("foreign-lineage")
        .backoff(FAST, FAST * 4)
        .with_machine("web-1", &module(0))
        .start()
        .await;
    env.annotate::<Tfm>(
        "web-1",
        &[(
            names::STATE_LINEAGE,
            Some("00000000-0000-4000-8000-000000000000".to_string()),
        )],
    )
    .await;
    env.reapply_slowly("web-1", 1).await;
    let msg =
        wait_condition::<Tfm>(&env, "web-1", "InputsApplied", "False", "StateInconsistent").await;
    assert!(msg.contains("runbooks/StateInconsistent.md"), "{msg}");
    tokio::time::sleep(std::time::Duration::from_secs(5)).await;
    assert!(
        !env.apply_job_active("web-1", 2).await
            && env
                .object::<Tfm>("web-1")
                .await
                .and_then(|o| annotation(&o, names::APPLY_ATTEMPT))
                .as_deref()
                == Some("1"),
        "an apply started against a state of another lineage"
    );
    env.shutdown().await;
}

/// An apply whose runner was killed (OOMKilled) leaves Terraform's lock held by its gone
/// Pod. The next attempt clears that stale lock of its own runner, as a destroy does,
/// instead of failing on it for ever.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_next_apply_clears_the_lock_its_killed_runner_left() {
    if envtest_only("it kills the runner with the local kubelet's test control") {
        return;
    }
    // Retries a minute apart: the slow module is not tried again before the quick one
    // below replaces it.
    let env = Env::builder("apply-lock")
        .backoff(
            std::time::Duration::from_secs(60),
            std::time::Duration::from_secs(240),
        )
        .with_machine("web-1", &module(0))
        .start()
        .await;
    env.reapply_slowly("web-1", 300).await;
    let lock = names::lock_lease_name(&names::state_suffix(Kind::TerraformMachine, "web-1"));
    wait_for("Terraform to hold its lock", long(), || async {
        kube::Api::<k8s_openapi::api::coordination::v1::Lease>::namespaced(
            env.client.clone(),
            &env.ns,
        )
        .get_opt(&lock)
        .await
        .ok()
        .flatten()
        .and_then(|l| l.spec?.holder_identity)
        .is_some()
    })
    .await;
    env.kubelet_fault(
        "oom-apply",
        &[(names::LABEL_OPERATION, names::OPERATION_APPLY)],
        KubeletFault::OomKilled,
        0.0,
    )
    .await;
    wait_for("the interrupted apply to be recorded", long(), || async {
        env.object::<Tfm>("web-1")
            .await
            .is_some_and(|o| annotation(&o, names::APPLY_INTERRUPTED).is_some())
    })
    .await;
    env.clear_kubelet_fault("oom-apply").await;
    // Back to a quick module: the next attempt must succeed.
    env.api::<Tfm>()
        .patch(
            "web-1",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"module": {"files": {"main.tf":
                module(0) + contract_outputs(Kind::TerraformMachine)}}}})),
        )
        .await
        .expect("quick module");
    let msg = wait_condition::<Tfm>(&env, "web-1", "InputsApplied", "True", "Applied").await;
    assert!(msg.is_empty(), "{msg}");
    env.shutdown().await;
}

/// Cluster API copies the endpoint a TerraformCluster's module gave into the Cluster's
/// `spec.controlPlaneEndpoint`. That is the module's own output coming back, not a new
/// input: the cluster must not be applied again for it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_endpoint_cluster_api_copies_back_does_not_re_apply() {
    let env = Env::builder("endpoint-copy").provisioning().start().await;
    env.provisioned_cluster(
        &(apply_module(0) + contract_outputs(Kind::TerraformCluster)),
        json!({}),
    )
    .await;
    // What Cluster API's Cluster controller does with the infrastructure's endpoint.
    env.cluster_api()
        .patch(
            "prod",
            &PatchParams::default(),
            &Patch::Merge(
                json!({"spec": {"controlPlaneEndpoint": {"host": "10.0.0.1", "port": 6443}}}),
            ),
        )
        .await
        .expect("copy the endpoint");
    tokio::time::sleep(std::time::Duration::from_secs(8)).await;
    let obj = env.object::<Tfc>("prod").await.expect("object");
    assert_eq!(
        annotation(&obj, names::APPLY_ATTEMPT).as_deref(),
        Some("1"),
        "applied again for its own endpoint"
    );
    env.shutdown().await;
}

/// `captf explain` without `-f` reads the live objects as a manager's pass does and shows
/// the apply table for an object not being deleted, as it does from files.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn explain_of_the_live_cluster_shows_the_apply_table() {
    use crate::steps::EnvExt;
    let env = Env::builder("explain-live")
        .backoff(FAST, FAST * 4)
        .with_machine("web-1", &module(0))
        .start()
        .await;
    let items = env.captf_json(&["explain", "-n", &env.ns, "-o", "json"]);
    let web = items
        .as_array()
        .expect("array")
        .iter()
        .find(|e| e["name"] == "web-1")
        .cloned()
        .expect("web-1");
    assert_eq!(web["action"], "NotDeleting", "{web}");
    assert_eq!(
        web["apply"]["situation"], "the latest inputs are applied",
        "{web}"
    );
    let ready = web["apply"]["conditions"]
        .as_array()
        .expect("conditions")
        .iter()
        .find(|c| c["type"] == "Ready")
        .cloned()
        .expect("Ready");
    assert_eq!(ready["status"], "True", "{web}");
    crate::provisioning::assert_explain_reads_alike(&env, "a provisioned machine");
    env.shutdown().await;
}

/// `clusterctl move` takes the objects and the Secrets labelled for it, then deletes the
/// source copies (marked delete-for-move, finalizers stripped). What CAPTF made for them
/// that does not move (apply Jobs and their Pods, variables Secrets, Terraform's lock
/// Lease) must not stay in the source for good, and `captf orphans` lists what is left.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_move_leaves_nothing_of_the_moved_objects_in_the_source() {
    use crate::steps::EnvExt;
    let mut env = Env::builder("move-leftovers")
        .backoff(FAST, FAST * 4)
        .with_machine("web-1", &module(0))
        .start()
        .await;
    env.config.rbac_sweep_every = std::time::Duration::from_secs(2);
    // The move happens while the source's manager is down; then it starts again.
    env.stop_manager().await;
    let suffix = names::state_suffix(Kind::TerraformMachine, "web-1");
    // What clusterctl move does to the source copy once the target has its own: the
    // object marked and deleted, its finalizers stripped; the Secrets it moved deleted.
    env.annotate::<Tfm>(
        "web-1",
        &[(names::CLUSTERCTL_DELETE_FOR_MOVE, Some(String::new()))],
    )
    .await;
    env.delete_stripping_finalizers::<Tfm>("web-1").await;
    for secret in env
        .secrets()
        .list(&kube::api::ListParams::default().labels(names::CLUSTERCTL_MOVE_LABEL))
        .await
        .expect("secrets")
        .items
    {
        let name = secret.metadata.name.clone().unwrap_or_default();
        let _ = env
            .secrets()
            .patch(
                &name,
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"finalizers": null}})),
            )
            .await;
        let _ = env.secrets().delete(&name, &Default::default()).await;
    }
    // What CAPTF made for web-1 and is left in the source: listed as orphans.
    let out = env.captf(&["orphans", "-n", &env.ns, "-o", "json"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let listed: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    let resources: std::collections::BTreeSet<String> = listed
        .as_array()
        .expect("array")
        .iter()
        .filter_map(|o| o["resource"].as_str().map(str::to_string))
        .collect();
    assert!(
        ["Job", "Pod", "Secret", "Lease"]
            .iter()
            .all(|r| resources.contains(*r)),
        "{listed}"
    );
    env.start_manager();
    wait_for("the source to be clean", long(), || async {
        let jobs =
            kube::Api::<k8s_openapi::api::batch::v1::Job>::namespaced(env.client.clone(), &env.ns)
                .list(&Default::default())
                .await
                .map(|l| l.items.len())
                .unwrap_or(1);
        let pods =
            kube::Api::<k8s_openapi::api::core::v1::Pod>::namespaced(env.client.clone(), &env.ns)
                .list(&Default::default())
                .await
                .map(|l| l.items.len())
                .unwrap_or(1);
        let secrets = env
            .secrets()
            .list_metadata(&Default::default())
            .await
            .map(|l| {
                l.items
                    .iter()
                    .filter(|s| {
                        s.metadata
                            .name
                            .as_deref()
                            .is_some_and(|n| n.starts_with("captf-"))
                    })
                    .count()
            })
            .unwrap_or(1);
        let leases = kube::Api::<k8s_openapi::api::coordination::v1::Lease>::namespaced(
            env.client.clone(),
            &env.ns,
        )
        .get_opt(&names::lock_lease_name(&suffix))
        .await
        .ok()
        .flatten()
        .is_some();
        jobs == 0 && pods == 0 && secrets == 0 && !leases
    })
    .await;
    let out = env.captf(&["orphans", "-n", &env.ns, "-o", "json"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let listed: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(listed, json!([]), "nothing is left to list");
    env.shutdown().await;
}

/// Keeps an errored state of `web-1` as its runner would (through Terraform's backend
/// format, labelled with the owner labels of `uid`): the state it has now and one more
/// instance, whose destroy leaves `<marker>.destroyed`. Returns the Secret's name and the
/// marker.
async fn keep_errored_state(env: &Env, uid: &str) -> (String, String) {
    use crate::runbooks::{gzip, state_json};
    let suffix = names::state_suffix(Kind::TerraformMachine, "web-1");
    let mut errored = state_json(env).await;
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
    let errored_suffix = names::errored_suffix(&suffix, 1, "ab1cd");
    let errored_name = names::state_secret_name(&errored_suffix);
    let mut labels = backend_labels(Kind::TerraformMachine, "web-1", uid);
    labels.extend([
        (names::TF_LABEL_STATE.to_string(), "true".to_string()),
        (names::TF_LABEL_SUFFIX.to_string(), errored_suffix.clone()),
        (names::TF_LABEL_WORKSPACE.to_string(), "default".to_string()),
        (
            names::TF_LABEL_MANAGED_BY.to_string(),
            "terraform".to_string(),
        ),
        (names::LABEL_ERRORED_STATE.to_string(), "true".to_string()),
    ]);
    let secret: k8s_openapi::api::core::v1::Secret = serde_json::from_value(json!({
        "metadata": {"name": errored_name, "labels": labels},
        "data": {names::TF_STATE_KEY: k8s_openapi::ByteString(gzip(&serde_json::to_vec(&errored).expect("json")))},
    }))
    .expect("secret");
    env.secrets()
        .create(&Default::default(), &secret)
        .await
        .expect("errored state");
    (errored_name, marker)
}

/// An errored state is the object's whatever its uid: after `clusterctl move` or the
/// recreate of docs/08 the object has a new uid, and its errored state (labelled with the
/// old one) must hold its deletion as before, not be passed over while the destroy and
/// the cleanup release the object and orphan what only the errored state records.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_errored_state_of_the_objects_earlier_uid_still_holds_its_deletion() {
    let mut env = Env::builder("errored-recreated")
        .backoff(FAST, FAST * 4)
        .with_machine("web-1", &module(0))
        .start()
        .await;
    let saved = env.object::<Tfm>("web-1").await.expect("object");
    let old_uid = saved.metadata.uid.clone().expect("uid");
    let (errored, _) = keep_errored_state(&env, &old_uid).await;
    // docs/08: the finalizer stripped, the object made again from its saved YAML.
    env.stop_manager().await;
    env.delete_stripping_finalizers::<Tfm>("web-1").await;
    let mut again = saved.clone();
    again.metadata.uid = None;
    again.metadata.resource_version = None;
    again.metadata.creation_timestamp = None;
    again.metadata.finalizers = None;
    again.status = None;
    env.api::<Tfm>()
        .create(&Default::default(), &again)
        .await
        .expect("recreate");
    env.start_manager();
    env.wait_finalizer::<Tfm>("web-1").await;
    env.delete::<Tfm>("web-1").await;
    let msg = wait_condition::<Tfm>(&env, "web-1", "DeletionBlocked", "True", "ErroredState").await;
    assert!(msg.contains(&errored), "{msg}");
    assert!(env.exists::<Tfm>("web-1").await, "released");
    env.shutdown().await;
}

/// In a namespace deletion an errored state can be the only record of what a failed run
/// made: it is protected like the state, and the abandon in the terminating namespace
/// copies it out with the rest.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_errored_state_survives_a_namespace_deletion_and_is_copied_by_the_abandon() {
    let env = Env::builder("errored-ns")
        .backoff(FAST, FAST * 4)
        .with_machine("web-1", &module(0))
        .start()
        .await;
    let uid = env
        .object::<Tfm>("web-1")
        .await
        .and_then(|o| o.metadata.uid)
        .expect("uid");
    let (errored, _) = keep_errored_state(&env, &uid).await;
    wait_for("the errored state to be protected", long(), || async {
        env.secrets()
            .get_metadata_opt(&errored)
            .await
            .ok()
            .flatten()
            .and_then(|m| m.metadata.finalizers)
            .is_some_and(|f| f.iter().any(|f| f == names::PROTECT_FINALIZER))
    })
    .await;
    kube::Api::<k8s_openapi::api::core::v1::Namespace>::all(env.client.clone())
        .delete(&env.ns, &Default::default())
        .await
        .expect("delete the namespace");
    env.wait_deleting::<Tfm>("web-1", "DestroyCannotStart", long())
        .await;
    assert!(
        env.secret_exists(&errored).await,
        "the errored state went with the namespace"
    );
    env.abandon::<Tfm>("web-1").await;
    env.wait_gone::<Tfm>("web-1", long()).await;
    let there: kube::Api<k8s_openapi::api::core::v1::Secret> =
        kube::Api::namespaced(env.client.clone(), &env.manager_ns);
    let copies: Vec<String> = there
        .list_metadata(&Default::default())
        .await
        .expect("copies")
        .items
        .into_iter()
        .filter_map(|s| s.metadata.name)
        .collect();
    let errored_suffix = names::errored_suffix("web-1.tfm", 1, "ab1cd");
    assert!(
        copies.iter().any(|c| c.contains(&errored_suffix)),
        "no copy of the errored state: {copies:?}"
    );
    env.shutdown().await;
}

/// What a successful apply ran (its image digest, the report in its Pod's log) is
/// recorded for the destroy. A transient error reading the log (a kubelet restarting)
/// is tried again at the next pass, not given up for good.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_transient_error_reading_the_apply_log_does_not_lose_what_it_ran() {
    let env = Env::builder("ran-retry").provisioning().start().await;
    env.proxy
        .faults()
        .fail_next(1, Some("get"), Some("pods/log"), 500);
    env.provisioned_cluster(&apply_module(0), json!({})).await;
    wait_for("what the apply ran to be recorded", long(), || async {
        crate::provisioning::recorded_ran(&env, Kind::TerraformCluster, "prod")
            .await
            .is_some_and(|r| r.image_digest.is_some())
    })
    .await;
    env.shutdown().await;
}

/// clusterctl move pauses the Cluster, then waits until no object carries `block-move`.
/// A pass that decided from a cache read before the pause (its Cluster watch lagging)
/// must not write `block-move` and start an apply after that check: it reads the Cluster
/// again once `block-move` is written, and starts no Job while the Cluster is paused.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_apply_decided_before_a_pause_starts_no_job_under_it() {
    if envtest_only("it reads the files Terraform leaves on this machine") {
        return;
    }
    let env = Env::builder("pause-race").provisioning().start().await;
    env.provisioned_cluster(&regional_module(), regional_variables(&env, "a"))
        .await;
    let applied = env.jobs_created();
    // The manager's Cluster watch stops seeing changes: its stream ends and every list
    // and watch of Clusters fails.
    let faults = env.proxy.faults();
    faults.fail_next(100_000, Some("list"), Some("clusters"), 500);
    faults.fail_next(100_000, Some("watch"), Some("clusters"), 500);
    faults.drop_watches();
    // clusterctl move pauses the Cluster (not through the manager's proxy).
    env.cluster_api()
        .patch(
            "prod",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"paused": true}})),
        )
        .await
        .expect("pause");
    // A change the manager sees, whose apply its cache says may start.
    env.api::<Tfc>()
        .patch(
            "prod",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": regional_variables(&env, "b")})),
        )
        .await
        .expect("change the region");
    // A pass decides to start attempt 2 (its number is written ahead of its Job).
    wait_for("a pass to start the change's apply", long(), || async {
        env.object::<Tfc>("prod")
            .await
            .and_then(|o| annotation(&o, names::APPLY_ATTEMPT))
            .as_deref()
            == Some("2")
    })
    .await;
    tokio::time::sleep(std::time::Duration::from_secs(5)).await;
    assert_eq!(env.jobs_created(), applied, "an apply Job under the pause");
    let obj = env.object::<Tfc>("prod").await.expect("object");
    assert!(
        annotation(&obj, names::CLUSTERCTL_BLOCK_MOVE).is_none(),
        "block-move left on the paused object"
    );
    // Once the move is over (or called off) and the watch is back, the apply runs.
    faults.clear();
    faults.drop_watches();
    env.cluster_api()
        .patch(
            "prod",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"paused": false}})),
        )
        .await
        .expect("unpause");
    wait_for("the apply after the pause", long(), || async {
        env.jobs_created() > applied
    })
    .await;
    env.shutdown().await;
}

/// The sweep of what gone objects left behind looks at a namespace live only where the
/// caches show something left over: an applied machine's finished Job, Pod and variables
/// Secret, whose object the caches hold, cost no list (issue 37: with the scale bench's
/// 1 s sweep, four lists per object in the namespace's lifetime).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_leftovers_sweep_reads_nothing_live_while_every_owner_is_cached() {
    let env = Env::builder("sweep-reads")
        .backoff(FAST, FAST * 4)
        .with_machine("web-1", &module(0))
        .start()
        .await;
    let jobs =
        kube::Api::<k8s_openapi::api::batch::v1::Job>::namespaced(env.client.clone(), &env.ns);
    let finished = jobs
        .list(&Default::default())
        .await
        .expect("jobs")
        .items
        .iter()
        .filter(|j| {
            j.status
                .as_ref()
                .and_then(|s| s.succeeded)
                .is_some_and(|n| n > 0)
        })
        .count();
    assert!(finished > 0, "the apply's Job is there, finished");
    let log = env.proxy.request_log();
    log.reset();
    // The tests' sweep runs every 500 ms: a few sweeps.
    tokio::time::sleep(std::time::Duration::from_secs(4)).await;
    for resource in [
        "terraformclusters",
        "terraformmachines",
        "terraformmachinepools",
        "leases",
    ] {
        assert_eq!(
            log.count("list", resource, ""),
            0,
            "no live list of {resource}; the manager's requests: {:?}",
            log.snapshot()
        );
    }
    env.shutdown().await;
}
