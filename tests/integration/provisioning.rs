//! The apply path end to end: the manager applies a live object's module in a Job (the
//! real `terraform` through the kubernetes backend), records what the apply left, and
//! the deletion destroys what the product itself made. The manager runs with
//! `provision` on here, as in the deletion scenarios, which start from such an apply
//! (`Env::provision`).

use std::time::Duration;

use captf::api::TerraformObject;
use captf::api::names::{self, Kind};
use kube::ResourceExt;
use kube::api::{Patch, PatchParams};
use serde_json::json;

use crate::support::*;

pub(crate) fn annotation<K: TerraformObject>(obj: &K, key: &str) -> Option<String> {
    obj.annotations().get(key).cloned()
}

/// Waits until `type_` of `K`/`name` has `status` and `reason`; returns its message.
pub(crate) async fn wait_condition<K: TerraformObject>(
    env: &Env,
    name: &str,
    type_: &str,
    status: &str,
    reason: &str,
) -> String {
    env.wait_condition::<K>(name, type_, Some(status), reason, long())
        .await
}

/// What `captf explain` decides of the test namespace's live objects, and what it decides
/// from files `kubectl get -o yaml` saved of the same objects at the same moment, agree on
/// the apply table (situation, row, action, every condition): both run the manager's one
/// observation and decision, only their source differs. The dump is taken before and after
/// the live run, and the comparison made once both dumps are the same (the manager may be
/// writing meanwhile).
pub(crate) fn assert_explain_reads_alike(env: &Env, when: &str) {
    use crate::steps::EnvExt;
    let file = std::env::temp_dir().join(format!(
        "captf-explain-{}-{}.yaml",
        env.ns,
        std::process::id()
    ));
    let dump = || -> String {
        let out = std::process::Command::new("kubectl")
            .arg("--kubeconfig")
            .arg(env.kubeconfig_path())
            .args([
                "get",
                "-n",
                &env.ns,
                "-o",
                "yaml",
                "terraformclusters,terraformmachines,terraformmachinepools,clusters.cluster.x-k8s.io,machines.cluster.x-k8s.io,secrets,configmaps,jobs,pods,leases",
            ])
            .output()
            .expect("kubectl get");
        assert!(
            out.status.success(),
            "kubectl get: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let text = String::from_utf8(out.stdout).expect("UTF-8");
        std::fs::write(&file, &text).expect("write the dump");
        text
    };
    let apply_of =
        |items: serde_json::Value| -> std::collections::BTreeMap<String, serde_json::Value> {
            items
                .as_array()
                .expect("array")
                .iter()
                .map(|i| {
                    (
                        format!(
                            "{}/{}",
                            i["kind"].as_str().unwrap_or_default(),
                            i["name"].as_str().unwrap_or_default()
                        ),
                        i["apply"].clone(),
                    )
                })
                .collect()
        };
    for _ in 0..20 {
        let before = dump();
        let live = apply_of(env.captf_json(&["explain", "-n", &env.ns, "-o", "json"]));
        if dump() != before {
            continue;
        }
        let files =
            apply_of(env.captf_json(&["explain", "-f", &file.to_string_lossy(), "-o", "json"]));
        let _ = std::fs::remove_file(&file);
        assert!(
            live.values().any(|a| a["row"].is_string()),
            "{when}: explain decided the apply table of no object: {live:#?}"
        );
        assert_eq!(
            live, files,
            "{when}: explain of the live objects (left) and of their dump (right) disagree"
        );
        return;
    }
    panic!("{when}: the namespace changed during each of 20 explains");
}

/// Deletes the Cluster `prod` and waits until its TerraformCluster is released.
pub(crate) async fn delete_and_wait_released(env: &Env) {
    env.delete_cluster("prod").await;
    wait_for("the TerraformCluster to be released", long(), || async {
        !env.exists::<Tfc>("prod").await
    })
    .await;
}

/// Names the TerraformCluster `prod` as the Cluster `prod`'s infrastructure, as Cluster
/// API's `spec.infrastructureRef` does (its machines are then given its hand-off).
pub(crate) async fn name_terraform_cluster(env: &Env) {
    env.name_infrastructure("prod", "prod").await;
}

/// The inputs the inputs Secret of `kind`/`name` records.
pub(crate) async fn recorded_inputs(
    env: &Env,
    kind: Kind,
    name: &str,
) -> Option<captf::inputs::Inputs> {
    let suffix = names::state_suffix(kind, name);
    let secret = env
        .secrets()
        .get_opt(&names::inputs_secret_name(&suffix))
        .await
        .ok()??;
    captf::inputs::from_secret(&secret, &env.ns, &suffix).ok()
}

/// What the inputs Secret of `kind`/`name` records of its latest successful apply's run.
pub(crate) async fn recorded_ran(env: &Env, kind: Kind, name: &str) -> Option<captf::inputs::Ran> {
    recorded_inputs(env, kind, name).await?.ran
}

fn created(env: &Env, name: &str) -> bool {
    (0..2).all(|i| env.markers().join(format!("{name}-{i}.created")).exists())
}

/// A TerraformCluster owned by a Cluster: the manager applies it with nothing done by
/// hand, writes ahead what the deletion relies on, records the state the apply left,
/// latches `provisioned`; deleting the Cluster then destroys what the apply made.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_manager_applies_a_cluster_and_destroys_it_when_the_cluster_is_deleted() {
    if envtest_only("it reads the files Terraform leaves on this machine") {
        return;
    }
    let env = Env::builder("apply").provisioning().start().await;
    let uid = env.create_cluster("prod").await;
    env.create_owned::<Tfc>(
        "prod",
        "prod",
        &[("Cluster", "prod", &uid, false)],
        &apply_module(0),
        json!({}),
    )
    .await;

    wait_condition::<Tfc>(&env, "prod", "Provisioned", "True", "Provisioned").await;
    assert!(
        created(&env, "prod"),
        "the apply did not create the instances"
    );
    let obj = env.object::<Tfc>("prod").await.expect("object");
    assert_eq!(
        obj.status()
            .and_then(|s| s.initialization.as_ref())
            .and_then(|i| i.provisioned),
        Some(true),
        "status.initialization.provisioned"
    );
    assert_eq!(annotation(&obj, names::APPLY_ATTEMPT).as_deref(), Some("1"));
    assert_eq!(
        annotation(&obj, names::APPLIED_ATTEMPT).as_deref(),
        Some("1")
    );
    assert!(annotation(&obj, names::APPLIED_AT).is_some(), "applied-at");
    assert_eq!(annotation(&obj, names::APPLY_FAILURES), None);
    // The fingerprint recorded is the state's, which holds what the apply made.
    let (lineage, serial) = env.fingerprint(Kind::TerraformCluster, "prod").await;
    assert_eq!(annotation(&obj, names::STATE_LINEAGE), Some(lineage));
    assert_eq!(
        annotation(&obj, names::STATE_SERIAL),
        Some(serial.to_string())
    );
    match env.read_state(Kind::TerraformCluster, "prod").await {
        captf::state::StateContent::Parsed {
            managed_instances, ..
        } => assert_eq!(managed_instances, 2),
        other => panic!("state: {other:?}"),
    }
    // The inputs Secret the destroy will run from, with the hash on the object.
    let suffix = names::state_suffix(Kind::TerraformCluster, "prod");
    let secret = env
        .secrets()
        .get_opt(&names::inputs_secret_name(&suffix))
        .await
        .expect("get")
        .expect("the inputs Secret");
    let inputs = captf::inputs::from_secret(&secret, &env.ns, &suffix).expect("inputs");
    assert_eq!(
        annotation(&obj, names::INPUTS_SHA256),
        Some(inputs.sha256())
    );
    for t in ["Ready", "InputsApplied"] {
        let (s, _, _) = env.condition::<Tfc>("prod", t).await.expect(t);
        assert_eq!(s, "True", "{t}");
    }
    // block-move goes once the Job finished.
    wait_for("block-move to go", long(), || async {
        env.object::<Tfc>("prod")
            .await
            .is_some_and(|o| annotation(&o, names::CLUSTERCTL_BLOCK_MOVE).is_none())
    })
    .await;
    assert_eq!(env.jobs_created(), 1, "one apply, and nothing after it");
    // One Event per step of it.
    let events: kube::Api<k8s_openapi::api::core::v1::Event> =
        kube::Api::namespaced(env.client.clone(), &env.ns);
    wait_for("the apply's Events", long(), || async {
        let reasons: Vec<String> = events
            .list(&Default::default())
            .await
            .expect("events")
            .items
            .into_iter()
            .filter(|e| e.involved_object.name.as_deref() == Some("prod"))
            .filter_map(|e| e.reason)
            .collect();
        ["ApplyStarted", "ApplySucceeded", "Provisioned"]
            .iter()
            .all(|r| reasons.iter().any(|x| x == r))
    })
    .await;

    // As after clusterctl move, which does not carry the status: provisioned and the
    // conditions come back from the object's record, without a Job.
    env.api::<Tfc>()
        .patch_status(
            "prod",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"initialization": null, "conditions": null}})),
        )
        .await
        .expect("drop the status");
    wait_condition::<Tfc>(&env, "prod", "Provisioned", "True", "Provisioned").await;
    wait_for("provisioned to be rebuilt", long(), || async {
        env.object::<Tfc>("prod").await.is_some_and(|o| {
            o.status()
                .and_then(|s| s.initialization.as_ref())
                .and_then(|i| i.provisioned)
                == Some(true)
        })
    })
    .await;
    assert_eq!(env.jobs_created(), 1, "rebuilt without a Job");

    // The image the apply's Pod ran is recorded by digest (its imageID), for the destroy,
    // and the inputs' hash stays the one on the object.
    let recorded = || async {
        recorded_ran(&env, Kind::TerraformCluster, "prod")
            .await?
            .image_digest
    };
    wait_for("the image digest in the inputs Secret", long(), || async {
        recorded().await.is_some()
    })
    .await;
    let digest = recorded().await.expect("the image digest");
    assert!(
        digest.starts_with("docker.io/hashicorp/terraform@sha256:"),
        "{digest}"
    );
    let obj = env.object::<Tfc>("prod").await.expect("object");
    assert_eq!(
        annotation(&obj, names::INPUTS_SHA256),
        Some(inputs.sha256()),
        "the digest is not an input"
    );

    delete_and_wait_released(&env).await;
    assert!(
        env.destroyed("prod"),
        "Terraform did not destroy the instances"
    );
    assert_eq!(
        env.job_images("prod", names::OPERATION_DESTROY),
        [digest],
        "the destroy ran the image the apply ran, by digest"
    );
    env.assert_nothing_left(Kind::TerraformCluster, "prod")
        .await;
    env.shutdown().await;
}

/// An apply that fails is recorded (its time, the count, a Warning Event's text on the
/// condition) and tried again on the persisted schedule until it succeeds; the count goes
/// with the success.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_failing_apply_is_retried_until_it_succeeds() {
    if envtest_only("it reads the files Terraform leaves on this machine") {
        return;
    }
    // Long enough between attempts for the failure to be read before the retry.
    let env = Env::builder("apply-retry")
        .backoff(
            std::time::Duration::from_secs(4),
            std::time::Duration::from_secs(8),
        )
        .provisioning()
        .start()
        .await;
    // The retry starts 4 s after the failure and clears its time, and its success the
    // count: a loaded machine can look later than that, so every version is recorded.
    let history = AnnotationHistory::start(env.api::<Tfc>(), "prod");
    let uid = env.create_cluster("prod").await;
    env.create_owned::<Tfc>(
        "prod",
        "prod",
        &[("Cluster", "prod", &uid, false)],
        &apply_module(1),
        json!({}),
    )
    .await;

    let message = wait_condition::<Tfc>(&env, "prod", "Provisioned", "False", "ApplyFailed").await;
    assert!(
        message.contains("apply attempt 1 failed: terraform apply failed (exit 1)")
            && message.contains("kubectl logs job/captf-prod-tfc-apply-1"),
        "{message}"
    );
    assert!(message.contains("runbooks/ApplyFailed.md"), "{message}");
    assert!(
        history.any(|a| {
            let get = |k: &str| a.get(k).map(String::as_str);
            get(names::APPLY_ATTEMPT) == Some("1")
                && get(names::APPLY_FAILURES) == Some("1")
                && get(names::APPLY_FAILED_AT).is_some_and(|t| t.parse::<jiff::Timestamp>().is_ok())
        }),
        "no version of the object recorded attempt 1's failure (its count and its time)"
    );

    wait_condition::<Tfc>(&env, "prod", "Provisioned", "True", "Provisioned").await;
    assert!(created(&env, "prod"));
    let obj = env.object::<Tfc>("prod").await.expect("object");
    assert_eq!(
        annotation(&obj, names::APPLIED_ATTEMPT).as_deref(),
        Some("2")
    );
    assert_eq!(annotation(&obj, names::APPLY_FAILURES), None);
    assert_eq!(annotation(&obj, names::APPLY_FAILED_AT), None);

    delete_and_wait_released(&env).await;
    env.assert_nothing_left(Kind::TerraformCluster, "prod")
        .await;
    env.shutdown().await;
}

/// A machine waits, saying for what, for its Cluster's infrastructure, then for the
/// control plane (a worker), then for its Machine's bootstrap data (named, then its
/// Secret); no Job starts before all of them, and the apply starts once the last arrives,
/// with the contract's variables. Its destroy needs no bootstrap Secret.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_machine_waits_for_its_cluster_and_bootstrap_data_in_order() {
    if envtest_only("it reads the files Terraform leaves on this machine") {
        return;
    }
    let env = Env::builder("apply-gates").provisioning().start().await;
    // The Cluster names its TerraformCluster before it exists: Cluster API waits for it.
    let cluster_uid = env.create_cluster_with_infrastructure("prod").await;
    let machine_uid = env.create_machine("web-1", "prod", None).await;
    env.create_owned::<Tfm>(
        "web-1",
        "prod",
        &[("Machine", "web-1", &machine_uid, true)],
        &contract_module(),
        json!({}),
    )
    .await;

    let msg = wait_condition::<Tfm>(
        &env,
        "web-1",
        "Provisioned",
        "Unknown",
        "WaitingForClusterInfrastructureReady",
    )
    .await;
    assert!(msg.contains("Cluster prod"), "{msg}");
    assert_explain_reads_alike(&env, "waiting for the cluster's infrastructure");
    // The TerraformCluster is applied; Cluster API says the infrastructure is provisioned.
    env.create_owned::<Tfc>(
        "prod",
        "prod",
        &[("Cluster", "prod", &cluster_uid, false)],
        &format!(
            "{}{}",
            apply_module(0),
            contract_outputs(Kind::TerraformCluster)
        ),
        json!({}),
    )
    .await;
    wait_condition::<Tfm>(
        &env,
        "web-1",
        "Provisioned",
        "Unknown",
        "WaitingForControlPlaneInitialized",
    )
    .await;
    assert_explain_reads_alike(&env, "waiting for the control plane");
    env.mark_cluster_ready("prod").await;
    let msg = wait_condition::<Tfm>(
        &env,
        "web-1",
        "Provisioned",
        "Unknown",
        "WaitingForBootstrapData",
    )
    .await;
    assert!(
        msg.contains("Machine web-1 has no spec.bootstrap.dataSecretName"),
        "{msg}"
    );
    assert_explain_reads_alike(&env, "waiting for the bootstrap data's name");
    let (ready, _, _) = env.condition::<Tfm>("web-1", "Ready").await.expect("Ready");
    assert_eq!(ready, "Unknown", "a gated machine's Ready");
    assert_eq!(
        env.jobs_created(),
        1,
        "no apply of the machine before the gates open"
    );

    // The bootstrap provider says its data Secret is made (before it exists here): Cluster
    // API names it in the Machine.
    env.give_bootstrap_data("web-1", "web-1-bootstrap").await;
    // The same reason, saying what is missing now (looked at again every 10 s).
    wait_for("the gate to name the missing Secret", long(), || async {
        env.condition::<Tfm>("web-1", "Provisioned")
            .await
            .is_some_and(|(_, r, m)| {
                r == "WaitingForBootstrapData"
                    && m.contains("Secret web-1-bootstrap, which Machine web-1's spec.bootstrap.dataSecretName names, does not exist yet")
            })
    })
    .await;
    assert_explain_reads_alike(&env, "waiting for the bootstrap data's Secret");
    env.create_bootstrap_secret("prod", "web-1-bootstrap", "#cloud-config web-1")
        .await;
    wait_condition::<Tfm>(&env, "web-1", "Provisioned", "True", "Provisioned").await;
    assert_explain_reads_alike(&env, "provisioned");
    // The module got the contract's variables: the Machine's name and its bootstrap data.
    for i in 0..2 {
        let created = std::fs::read_to_string(env.markers().join(format!("web-1-{i}.created")))
            .expect("the created marker");
        assert_eq!(created, "web-1 #cloud-config web-1", "web-1-{i}");
    }
    assert_eq!(
        env.jobs_created(),
        2,
        "one apply of the cluster, one of the machine"
    );
    // And its outputs set Cluster API's fields.
    let obj = env.object::<Tfm>("web-1").await.expect("object");
    assert_eq!(obj.spec.provider_id.as_deref(), Some("captf:///web-1"));
    let addresses = &obj.status().expect("status").addresses;
    assert_eq!(addresses.len(), 1);
    assert_eq!(
        (addresses[0].type_.as_str(), addresses[0].address.as_str()),
        ("InternalIP", "10.0.1.1")
    );

    // The bootstrap data goes (as Cluster API may take it away), then the machine: the
    // destroy runs from the inputs the apply recorded, which hold it.
    env.secrets()
        .delete("web-1-bootstrap", &Default::default())
        .await
        .expect("delete the bootstrap Secret");
    env.delete::<Tfm>("web-1").await;
    wait_for("the TerraformMachine to be released", long(), || async {
        !env.exists::<Tfm>("web-1").await
    })
    .await;
    assert!(
        env.destroyed("web-1"),
        "Terraform did not destroy the instances"
    );
    env.assert_nothing_left(Kind::TerraformMachine, "web-1")
        .await;
    env.shutdown().await;
}

/// A machine reads its bootstrap data Secret once while the Secret does not change, not
/// at every pass of its provisioning (redteam-3 L1; issue 37: 20.68 of the 30.10 reads per
/// provisioning were these): an apply that fails twice takes a score of passes.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_machine_reads_its_bootstrap_data_once_while_it_does_not_change() {
    if envtest_only("it reads the files Terraform leaves on this machine") {
        return;
    }
    let env = Env::builder("bootstrap-reads")
        .backoff(Duration::from_millis(300), Duration::from_millis(600))
        .provisioning()
        .start()
        .await;
    ready_cluster(&env).await;
    let log = env.proxy.request_log();
    log.reset();
    env.provision::<Tfm>("web-1", "prod", &apply_module(2))
        .await;
    let statuses = log.count("patch", "terraformmachines", "status");
    let gets = log.gets_of("secrets", "web-1-bootstrap");
    assert!(
        statuses >= 4,
        "three attempts write the status at least four times: {statuses}"
    );
    assert_eq!(
        gets,
        1,
        "the bootstrap data Secret read once, not at every pass; the manager's requests: {:?}",
        log.snapshot()
    );
    env.shutdown().await;
}

/// What a machine of these scenarios waits for: a Cluster `prod`, its TerraformCluster
/// applied by the manager, the Cluster marked ready.
async fn ready_cluster(env: &Env) {
    env.create_cluster("prod").await;
    env.provision::<Tfc>("prod", "prod", &apply_module(0)).await;
    env.mark_cluster_ready("prod").await;
}

/// A machine that never applied starts its first apply without reading its state or its
/// inputs Secret, which the manager's caches show are not there (issue 37: every new
/// object read both, and listed its state's Secrets, to find nothing). Counted until its
/// first apply Job's create, which the proxy holds: every pass counted is then one of the
/// object before anything of it was applied.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_first_apply_reads_no_state_and_no_inputs_the_caches_show_absent() {
    if envtest_only("it reads the files Terraform leaves on this machine") {
        return;
    }
    let env = Env::builder("first-apply-reads")
        .provisioning()
        .start()
        .await;
    ready_cluster(&env).await;
    let log = env.proxy.request_log();
    log.reset();
    env.proxy
        .faults()
        .delay_next(1, Some("create"), Some("jobs"), Duration::from_secs(5));
    let suffix = names::state_suffix(Kind::TerraformMachine, "web-1");
    let (state, inputs) = (
        names::state_secret_name(&suffix),
        names::inputs_secret_name(&suffix),
    );
    let counted = async {
        wait_for(
            "web-1's first apply Job to be asked for",
            long(),
            || async { log.count("create", "jobs", "") >= 1 },
        )
        .await;
        (
            log.gets_of("secrets", &state),
            log.gets_of("secrets", &inputs),
        )
    };
    let module = apply_module(0);
    let ((), before_the_job) =
        tokio::join!(env.provision::<Tfm>("web-1", "prod", &module), counted);
    assert_eq!(
        before_the_job,
        (0, 0),
        "GETs of {state} and {inputs} before web-1's first apply; the manager's requests: {:?}",
        log.snapshot()
    );
    env.shutdown().await;
}

/// A provisioned machine decides from the values its inputs Secret recorded: its passes
/// read that Secret once while it does not change, not at every pass (issue 37: a
/// provisioned machine's passes read it at each one).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_provisioned_machine_reads_its_recorded_values_once_while_they_do_not_change() {
    if envtest_only("it reads the files Terraform leaves on this machine") {
        return;
    }
    let mut env = Env::builder("recorded-reads").provisioning().start().await;
    ready_cluster(&env).await;
    env.provision::<Tfm>("web-1", "prod", &apply_module(0))
        .await;
    // A manager that starts with nothing kept; then five changes of the Cluster, each a
    // pass of web-1 (and of the TerraformCluster) that changes nothing of web-1's own.
    // The restarted manager's first pass of web-1 may read the inputs Secret twice, before
    // the counting or in it: its preview reads the state (with the inputs Secret) once
    // after a start, and its recorded values are read once.
    let port = crate::manager::restart_with_metrics(&mut env).await;
    env.wait_provisioned::<Tfm>("web-1").await;
    wait_for("the restarted manager's first passes", long(), || async {
        crate::manager::passes(port).await >= 2
    })
    .await;
    let log = env.proxy.request_log();
    log.reset();
    let before = crate::manager::passes(port).await;
    for i in 0..5 {
        let seen = crate::manager::passes(port).await;
        env.cluster_api()
            .patch(
                "prod",
                &PatchParams::default(),
                &Patch::Merge(
                    json!({"metadata": {"annotations": {"example.com/touched": i.to_string()}}}),
                ),
            )
            .await
            .expect("annotate the Cluster");
        wait_for("a pass after the Cluster changed", long(), || async {
            crate::manager::passes(port).await >= seen + 2
        })
        .await;
    }
    let passes = crate::manager::passes(port).await - before;
    let inputs = names::inputs_secret_name(&names::state_suffix(Kind::TerraformMachine, "web-1"));
    let gets = log.gets_of("secrets", &inputs);
    assert!(
        passes >= 10,
        "five changes of the Cluster, two objects: {passes} passes"
    );
    assert!(
        gets <= 2,
        "the inputs Secret read at most twice in {passes} passes (see above), not at each: {gets} reads; the manager's requests: {:?}",
        log.snapshot()
    );
    let machine = env.object::<Tfm>("web-1").await.expect("web-1");
    assert!(
        machine.status.as_ref().is_some_and(|s| s
            .conditions
            .iter()
            .any(|c| c.type_ == "Provisioned" && c.status == "True")),
        "still provisioned"
    );
    env.shutdown().await;
}

/// A machine's provisioning never reads its inputs Secret: only the manager writes it, at
/// the record of an apply's end, so the record of the first apply takes it as absent
/// while the cache of the object's Secrets shows none and the manager wrote none, and
/// creates it (a create the API server refuses if one is there after all). The passes
/// after the record (its recorded values, its deletion preview's read of the state) take
/// the Secret as the manager wrote it, whether or not the watch has brought the write yet
/// (issue 37: three GETs per provisioning, then one, the 404 at the first record). And the
/// record takes the inputs the attempt ran from its variables Secret as the manager
/// created it when it started the attempt, without reading it (one GET before).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_provisioning_reads_neither_its_inputs_secret_nor_its_attempts_variables() {
    if envtest_only("it reads the files Terraform leaves on this machine") {
        return;
    }
    let env = Env::builder("inputs-reads").provisioning().start().await;
    ready_cluster(&env).await;
    let log = env.proxy.request_log();
    log.reset();
    provision_until_deletion_ready(&env, "web-1").await;
    let suffix = names::state_suffix(Kind::TerraformMachine, "web-1");
    let inputs = names::inputs_secret_name(&suffix);
    let variables = names::job_name(&suffix, names::OPERATION_APPLY, 1);
    let gets = (
        log.gets_of("secrets", &inputs),
        log.gets_of("secrets", &variables),
    );
    assert!(
        gets == (0, 0),
        "GETs of {inputs} and {variables} from web-1's create to its provisioning: {gets:?}; the manager's requests: {:?}",
        log.snapshot()
    );
    env.shutdown().await;
}

/// Provisions machine `name` of the Cluster `prod` with [`apply_module`], and waits until
/// its `DeletionReady` condition is written: the pass after the record of its apply's end.
async fn provision_until_deletion_ready(env: &Env, name: &str) {
    env.provision::<Tfm>(name, "prod", &apply_module(0)).await;
    wait_for(
        &format!("{name}'s DeletionReady condition"),
        long(),
        || async {
            env.object::<Tfm>(name).await.is_some_and(|m| {
                m.status
                    .is_some_and(|s| s.conditions.iter().any(|c| c.type_ == "DeletionReady"))
            })
        },
    )
    .await;
}

/// A machine's provisioning lists its state Secrets once: at the record of its apply's end,
/// which reads the state the Job left. The pass after the record (the record changed the
/// object, so its deletion preview has nothing remembered) takes that state as the record
/// read it while the cache shows its Secrets at the versions the record read or wrote
/// (issue 37: two lists per provisioning). A machine provisioned first has read its
/// cluster's state for the machine inputs (read again only once that state changes).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_provisioning_lists_its_state_once_its_preview_takes_what_the_record_read() {
    if envtest_only("it reads the files Terraform leaves on this machine") {
        return;
    }
    let env = Env::builder("state-lists").provisioning().start().await;
    ready_cluster(&env).await;
    env.provision::<Tfm>("web-0", "prod", &apply_module(0))
        .await;
    let log = env.proxy.request_log();
    log.reset();
    provision_until_deletion_ready(&env, "web-1").await;
    let lists = log.count("list", "secrets", "");
    assert_eq!(
        lists,
        1,
        "lists of Secrets (the state's) from web-1's create to its provisioning; the requests: {:?}",
        log.snapshot_by_client()
    );
    env.shutdown().await;
}

/// A machine module of `count` instances that declares `variables` and writes `record`
/// (a shell word list of Terraform expressions) into each instance's created marker, with
/// the machine's contract outputs.
pub(crate) fn recording_machine_module(count: u32, variables: &str, record: &str) -> String {
    format!(
        r#"variable "name" {{ type = string }}
variable "marker_dir" {{ type = string }}
{variables}
resource "terraform_data" "vm" {{
  count = {count}
  input = "${{var.marker_dir}}/${{var.name}}-${{count.index}}"
  provisioner "local-exec" {{
    command = "printf '%s' {record} > '${{self.input}}.created'"
  }}
  provisioner "local-exec" {{
    when    = destroy
    command = "touch '${{self.input}}.destroyed'"
  }}
}}
"#
    ) + contract_outputs(Kind::TerraformMachine)
}

/// A machine module that uses the contract's variables: the Machine's name and its
/// bootstrap data, written into each instance's created marker.
fn contract_module() -> String {
    recording_machine_module(
        2,
        r#"variable "captf_machine_name" { type = string }
variable "captf_bootstrap_data" {
  type      = string
  sensitive = true
}"#,
        "'${var.captf_machine_name} ${nonsensitive(base64decode(var.captf_bootstrap_data))}'",
    )
}

/// A cluster's outputs set its endpoint once: a later apply that gives another is refused
/// with a Warning Event, and the endpoint Cluster API copied stays.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_control_plane_endpoint_is_set_once_and_a_change_is_refused() {
    let env = Env::builder("apply-endpoint").provisioning().start().await;
    let uid = env.create_cluster("prod").await;
    let module = endpoint_module();
    let variables = |endpoint: &str| json!({"name": "prod", "marker_dir": env.markers().display().to_string(), "endpoint": endpoint});
    env.create_owned::<Tfc>(
        "prod",
        "prod",
        &[("Cluster", "prod", &uid, false)],
        &module,
        json!({ "variables": variables("10.0.0.1") }),
    )
    .await;
    wait_condition::<Tfc>(&env, "prod", "Provisioned", "True", "Provisioned").await;
    let endpoint = |o: &Tfc| {
        o.spec
            .control_plane_endpoint
            .clone()
            .map(|e| (e.host, e.port))
    };
    let obj = env.object::<Tfc>("prod").await.expect("object");
    assert_eq!(endpoint(&obj), Some(("10.0.0.1".to_string(), 6443)));

    env.api::<Tfc>()
        .patch(
            "prod",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"variables": variables("10.0.0.2")}})),
        )
        .await
        .expect("change the endpoint");
    wait_for("the second apply to be recorded", long(), || async {
        env.object::<Tfc>("prod")
            .await
            .is_some_and(|o| annotation(&o, names::APPLIED_ATTEMPT).as_deref() == Some("2"))
    })
    .await;
    let obj = env.object::<Tfc>("prod").await.expect("object");
    assert_eq!(
        endpoint(&obj),
        Some(("10.0.0.1".to_string(), 6443)),
        "set once"
    );
    // The refusal is on the conditions (the object stays provisioned and Ready).
    let msg = wait_condition::<Tfc>(&env, "prod", "InputsApplied", "False", "ChangeRefused").await;
    assert!(
        msg.contains("apply attempt 2 succeeded, but the outputs give spec.controlPlaneEndpoint")
            && msg.contains("10.0.0.2")
            && msg.contains("runbooks/ChangeRefused.md"),
        "{msg}"
    );
    let (ready, _, _) = env.condition::<Tfc>("prod", "Ready").await.expect("Ready");
    assert_eq!(ready, "True");
    let events: kube::Api<k8s_openapi::api::core::v1::Event> =
        kube::Api::namespaced(env.client.clone(), &env.ns);
    wait_for("the refusal's Warning Event", long(), || async {
        events
            .list(&Default::default())
            .await
            .expect("events")
            .items
            .iter()
            .any(|e| {
                e.reason.as_deref() == Some("ControlPlaneEndpointChangeRefused")
                    && e.message.as_deref().is_some_and(|m| m.contains("10.0.0.2"))
            })
    })
    .await;
    env.shutdown().await;
}

/// The API server refuses the apply Job (an admission policy): within seconds the
/// conditions say so, with the API's message, instead of "attempt 1 is starting"; the
/// attempt keeps its number across the manager's tries; once the policy is gone the
/// apply runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_refused_apply_job_is_named_and_started_once_allowed() {
    let env = Env::builder("apply-refused").provisioning().start().await;
    let refusal = env
        .refuse_jobs(
            &[(names::LABEL_OPERATION, names::OPERATION_APPLY)],
            "apply Jobs need the platform team's approval",
        )
        .await;
    let uid = env.create_cluster("prod").await;
    env.create_owned::<Tfc>(
        "prod",
        "prod",
        &[("Cluster", "prod", &uid, false)],
        &apply_module(0),
        json!({}),
    )
    .await;
    let msg =
        wait_condition::<Tfc>(&env, "prod", "InputsApplied", "False", "ApplyCannotStart").await;
    assert!(
        msg.contains("the API server refused what apply attempt 1 needs")
            && msg.contains("apply Jobs need the platform team's approval")
            && msg.contains("runbooks/ApplyCannotStart.md"),
        "{msg}"
    );
    // It stays so across the manager's tries (every 10 s), under the same attempt.
    tokio::time::sleep(std::time::Duration::from_secs(12)).await;
    let obj = env.object::<Tfc>("prod").await.expect("object");
    assert_eq!(
        annotation(&obj, names::APPLY_ATTEMPT).as_deref(),
        Some("1"),
        "the refused attempt keeps its number"
    );
    let (_, reason, message) = env
        .condition::<Tfc>("prod", "InputsApplied")
        .await
        .expect("InputsApplied");
    assert_eq!(reason, "ApplyCannotStart", "{message}");
    assert_eq!(env.jobs_created(), 0);
    assert!(
        env.event_reasons("prod")
            .await
            .iter()
            .any(|r| r == "ApplyCannotStart"),
        "a Warning Event names the refusal"
    );

    refusal.remove(&env.client).await;
    wait_condition::<Tfc>(&env, "prod", "Provisioned", "True", "Provisioned").await;
    let obj = env.object::<Tfc>("prod").await.expect("object");
    assert_eq!(
        annotation(&obj, names::APPLIED_ATTEMPT).as_deref(),
        Some("1")
    );
    env.shutdown().await;
}

/// A module of one `terraform_data` whose create provisioner leaves `<marker>.applies`
/// and then runs for minutes: an apply to kill while Terraform is creating.
fn slow_apply_module() -> String {
    r#"variable "name" { type = string }
variable "marker_dir" { type = string }
resource "terraform_data" "vm" {
  input = "${var.marker_dir}/${var.name}-0"
  provisioner "local-exec" {
    command = "touch '${self.input}.applies'; sleep 300"
  }
}
"#
    .to_string()
}

/// The runner of an apply is killed while Terraform is creating (OOMKilled: Terraform
/// cannot save its state). The object records `apply-interrupted`; deleting the Cluster
/// then holds the object, naming the interrupted apply, instead of destroying from a
/// state that cannot hold what was being created, and it is never released by itself.
/// Once an operator has dealt with what the apply may have made and removes the
/// annotation (the runbook's step), the destroy runs (clearing the dead runner's lock)
/// and the object is released.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_apply_interrupted_then_deleted_is_held_not_released() {
    if envtest_only("it kills the runner with the local kubelet's test control") {
        return;
    }
    // Retries far enough apart that the deletion comes before a second apply.
    let env = Env::builder("apply-killed")
        .backoff(
            std::time::Duration::from_secs(300),
            std::time::Duration::from_secs(600),
        )
        .provisioning()
        .start()
        .await;
    let uid = env.create_cluster("prod").await;
    env.create_owned::<Tfc>(
        "prod",
        "prod",
        &[("Cluster", "prod", &uid, false)],
        &slow_apply_module(),
        json!({}),
    )
    .await;
    wait_for("Terraform to be creating", long(), || async {
        env.markers().join("prod-0.applies").exists()
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
        env.object::<Tfc>("prod")
            .await
            .is_some_and(|o| annotation(&o, names::APPLY_INTERRUPTED).is_some())
    })
    .await;
    env.clear_kubelet_fault("oom-apply").await;

    env.delete_cluster("prod").await;
    env.wait_deleting::<Tfc>("prod", "Held", long()).await;
    let (_, reason, msg) = env
        .condition::<Tfc>("prod", "StateReadable")
        .await
        .expect("StateReadable");
    assert_eq!(reason, "StateInconsistent", "{msg}");
    assert!(
        msg.contains("the last apply was interrupted") && msg.contains("apply-interrupted"),
        "{msg}"
    );
    // Held: no destroy starts, and the object stays, however long it waits.
    tokio::time::sleep(std::time::Duration::from_secs(8)).await;
    assert!(env.exists::<Tfc>("prod").await, "released while held");
    assert!(
        env.destroy_jobs().await.is_empty(),
        "a destroy ran from the interrupted apply's state"
    );
    let (_, reason, _) = env
        .condition::<Tfc>("prod", "Deleting")
        .await
        .expect("Deleting");
    assert_eq!(reason, "Held");

    // The runbook: what the apply made is dealt with by hand, then the annotation goes.
    env.api::<Tfc>()
        .patch(
            "prod",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {names::APPLY_INTERRUPTED: null}}})),
        )
        .await
        .expect("remove apply-interrupted");
    env.wait_gone::<Tfc>("prod", long()).await;
    env.assert_nothing_left(Kind::TerraformCluster, "prod")
        .await;
    env.shutdown().await;
}

/// A cluster module whose `machine_inputs` output hands `subnet` to its machines.
pub(crate) fn handoff_cluster_module(subnet: &str) -> String {
    format!(
        "{}output \"machine_inputs\" {{\n  value = {{ subnet = \"{subnet}\" }}\n}}\n",
        apply_module(0)
    )
}

/// A machine module that writes what its cluster handed it into its created marker.
pub(crate) fn handoff_machine_module() -> String {
    recording_machine_module(
        1,
        r#"variable "captf_cluster_outputs" { type = any }"#,
        "'${jsonencode(var.captf_cluster_outputs)}'",
    )
}

/// A machine of a Cluster whose infrastructure is a TerraformCluster waits for that
/// TerraformCluster's state (`WaitingForClusterOutputs`), then is given its
/// `machine_inputs` output as `captf_cluster_outputs`. A later change of that output
/// re-applies the cluster but not the machine, which keeps what it was applied with.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_machine_is_given_its_clusters_machine_inputs_once_they_exist() {
    if envtest_only("it reads the files Terraform leaves on this machine") {
        return;
    }
    let env = Env::builder("apply-handoff").provisioning().start().await;
    // Cluster API's side is ready: the Cluster says its infrastructure is provisioned
    // (a Cluster that names none is, for Cluster API), then names a TerraformCluster
    // that does not exist yet; the Machine has its bootstrap data.
    let cluster_uid = env.create_cluster("prod").await;
    env.mark_cluster_ready("prod").await;
    name_terraform_cluster(&env).await;
    env.create_bootstrap_secret("prod", "web-1-bootstrap", "#cloud-config web-1")
        .await;
    let machine_uid = env
        .create_machine("web-1", "prod", Some("web-1-bootstrap"))
        .await;
    env.create_owned::<Tfm>(
        "web-1",
        "prod",
        &[("Machine", "web-1", &machine_uid, true)],
        &handoff_machine_module(),
        json!({}),
    )
    .await;
    let msg = wait_condition::<Tfm>(
        &env,
        "web-1",
        "Provisioned",
        "Unknown",
        "WaitingForClusterOutputs",
    )
    .await;
    assert!(
        msg.contains("TerraformCluster prod has no state Secret tfstate-default-prod.tfc yet"),
        "{msg}"
    );
    assert_eq!(env.jobs_created(), 0, "no apply before the hand-off exists");

    env.create_owned::<Tfc>(
        "prod",
        "prod",
        &[("Cluster", "prod", &cluster_uid, false)],
        &handoff_cluster_module("s-1"),
        json!({}),
    )
    .await;
    wait_condition::<Tfm>(&env, "web-1", "Provisioned", "True", "Provisioned").await;
    let handed = std::fs::read_to_string(env.markers().join("web-1-0.created"))
        .expect("the machine's created marker");
    assert_eq!(handed, r#"{"subnet":"s-1"}"#);

    // The cluster's hand-off changes: the cluster re-applies, the machine does not.
    env.api::<Tfc>()
        .patch(
            "prod",
            &PatchParams::default(),
            &Patch::Merge(
                json!({"spec": {"module": {"files": {"main.tf": handoff_cluster_module("s-2")}}}}),
            ),
        )
        .await
        .expect("change the cluster's module");
    wait_for("the cluster's second apply", long(), || async {
        env.object::<Tfc>("prod")
            .await
            .and_then(|o| annotation(&o, names::APPLIED_ATTEMPT))
            .as_deref()
            == Some("2")
    })
    .await;
    // A pass on the machine after it (any change of the object starts one).
    env.api::<Tfm>()
        .patch(
            "web-1",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {"example.com/poke": "1"}}})),
        )
        .await
        .expect("poke");
    tokio::time::sleep(std::time::Duration::from_secs(5)).await;
    let obj = env.object::<Tfm>("web-1").await.expect("machine");
    assert_eq!(annotation(&obj, names::APPLY_ATTEMPT).as_deref(), Some("1"));
    let (status, reason, message) = env
        .condition::<Tfm>("web-1", "InputsApplied")
        .await
        .expect("InputsApplied");
    assert_eq!(
        (status.as_str(), reason.as_str()),
        ("True", "Applied"),
        "{message}"
    );

    // Cluster API deletes the Machine's infrastructure before the Cluster's.
    env.delete::<Tfm>("web-1").await;
    env.wait_gone::<Tfm>("web-1", long()).await;
    assert!(env.markers().join("web-1-0.destroyed").exists());
    delete_and_wait_released(&env).await;
    assert!(env.destroyed("prod"));
    env.shutdown().await;
}

/// OpenTofu as the runtime (`spec.runner.runtime: tofu`): the manager's apply and the
/// deletion's destroy both run `tofu` through the same kubernetes backend, the state
/// says OpenTofu wrote it, and the object is released with nothing left.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn opentofu_applies_and_destroys_as_terraform_does() {
    if envtest_only("OpenTofu is on PATH in the local kubelet's image only") {
        return;
    }
    let env = Env::builder("apply-tofu").provisioning().start().await;
    let uid = env.create_cluster("prod").await;
    env.create_owned::<Tfc>(
        "prod",
        "prod",
        &[("Cluster", "prod", &uid, false)],
        &apply_module(0),
        json!({"runner": {"runtime": "tofu"}}),
    )
    .await;
    wait_condition::<Tfc>(&env, "prod", "Provisioned", "True", "Provisioned").await;
    assert!(created(&env, "prod"));
    // OpenTofu wrote the state (its version, not Terraform's 1.11).
    let suffix = names::state_suffix(Kind::TerraformCluster, "prod");
    let secret = env
        .secrets()
        .get(&names::state_secret_name(&suffix))
        .await
        .expect("the state Secret");
    let gz = secret.data.expect("data")["tfstate"].0.clone();
    let mut json = String::new();
    std::io::Read::read_to_string(&mut flate2::read::GzDecoder::new(gz.as_slice()), &mut json)
        .expect("gunzip");
    let state: serde_json::Value = serde_json::from_str(&json).expect("state JSON");
    assert_eq!(state["terraform_version"], "1.10.6", "{json}");
    // The inputs the destroy runs from name the runtime.
    let inputs = env
        .secrets()
        .get(&names::inputs_secret_name(&suffix))
        .await
        .expect("the inputs Secret");
    let inputs = captf::inputs::from_secret(&inputs, &env.ns, &suffix).expect("inputs");
    assert_eq!(
        inputs.runner.runtime,
        Some(captf::api::types::Runtime::Tofu)
    );

    delete_and_wait_released(&env).await;
    assert!(env.destroyed("prod"), "tofu destroyed the instances");
    env.assert_nothing_left(Kind::TerraformCluster, "prod")
        .await;
    env.shutdown().await;
}

/// A module given by source address, with a `module` block of its own from a git
/// repository: the apply fetches both, and its runner reports the files it fetched and
/// the module `init` installed, which the manager records with the inputs. Both sources
/// then go (a git host retired, a path removed) and the destroy still runs, from the
/// recorded files, its `init` using the installed module as it was.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_module_fetched_by_the_apply_is_kept_and_the_destroy_needs_no_source() {
    if envtest_only("the module's source is a path on this machine") {
        return;
    }
    let env = Env::builder("apply-fetched").provisioning().start().await;
    // The inner module, in a git repository.
    let repo = env.dir.join("inner-repo");
    std::fs::create_dir_all(&repo).expect("repo dir");
    std::fs::write(
        repo.join("main.tf"),
        r#"variable "marker" { type = string }
resource "terraform_data" "inner" {
  input = var.marker
  provisioner "local-exec" {
    when    = destroy
    command = "touch '${self.input}.destroyed'"
  }
}
"#,
    )
    .expect("inner main.tf");
    // The repository is owned by the runner's user, or its git refuses it ("dubious
    // ownership").
    let owner = format!("{0}:{0}", 65532);
    for (program, args) in [
        ("git", &["init", "-q"][..]),
        ("git", &["add", "main.tf"]),
        (
            "git",
            &[
                "-c",
                "user.email=t@captf.dev",
                "-c",
                "user.name=t",
                "commit",
                "-qm",
                "inner",
            ],
        ),
        ("chown", &["-R", &owner, "."]),
    ] {
        let out = std::process::Command::new(program)
            .args(args)
            .current_dir(&repo)
            .output()
            .expect(program);
        assert!(
            out.status.success(),
            "{program} {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let source = env.dir.join("module-source");
    std::fs::create_dir_all(source.join("modules/extra")).expect("module dir");
    let root = format!(
        "{}module \"inner\" {{\n  source = \"git::file://{}\"\n  marker = \"${{var.marker_dir}}/${{var.name}}-inner\"\n}}\n",
        apply_module(0),
        repo.display()
    );
    std::fs::write(source.join("main.tf"), &root).expect("main.tf");
    std::fs::write(
        source.join("modules/extra/README"),
        "not Terraform, kept all the same\n",
    )
    .expect("README");
    let uid = env.create_cluster("prod").await;
    env.create_owned::<Tfc>(
        "prod",
        "prod",
        &[("Cluster", "prod", &uid, false)],
        "",
        json!({"module": {"source": source.display().to_string()}}),
    )
    .await;
    wait_condition::<Tfc>(&env, "prod", "Provisioned", "True", "Provisioned").await;
    assert!(created(&env, "prod"));
    let ran = || recorded_ran(&env, Kind::TerraformCluster, "prod");
    wait_for("the apply's run to be recorded", long(), || async {
        ran().await.is_some()
    })
    .await;
    let files = ran()
        .await
        .and_then(|r| r.module_files)
        .expect("the fetched files");
    assert_eq!(
        files.keys().map(String::as_str).collect::<Vec<_>>(),
        ["main.tf", "modules/extra/README"]
    );
    assert_eq!(files["main.tf"], root);
    let installed = ran()
        .await
        .and_then(|r| r.installed_modules)
        .expect("the installed module");
    assert!(
        installed
            .get("inner/main.tf")
            .is_some_and(|f| f.contains("terraform_data")),
        "{installed:?}"
    );
    let manifest = &installed["modules.json"];
    assert!(
        manifest.contains("@CAPTF_MODULES_DIR@/inner") && !manifest.contains(".terraform-data"),
        "the manifest names the modules' directory by its placeholder: {manifest}"
    );
    assert!(
        !installed.keys().any(|k| k.contains(".git/")),
        "{installed:?}"
    );

    // Both sources are gone for good; the destroy runs from what the apply fetched.
    std::fs::remove_dir_all(&source).expect("remove the source");
    std::fs::remove_dir_all(&repo).expect("remove the inner module's repository");
    delete_and_wait_released(&env).await;
    assert!(env.destroyed("prod"), "Terraform destroyed the instances");
    assert!(
        env.markers().join("prod-inner.destroyed").exists(),
        "Terraform destroyed the inner module's instance"
    );
    env.assert_nothing_left(Kind::TerraformCluster, "prod")
        .await;
    env.shutdown().await;
}

/// The manager as an installation from `config/` runs it: as its ServiceAccount under the
/// ClusterRole of `config/rbac/role.yaml`, not with the admin's credentials every other
/// scenario gives it. A cluster from a module source and a machine with bootstrap data
/// and the cluster's hand-off are applied (the apply's run recorded from its Pod's log),
/// then destroyed and released: every read and write of the apply and the deletion is one
/// the ClusterRole allows.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_manager_applies_and_destroys_under_its_own_cluster_role() {
    if envtest_only("the module's source is a path on this machine") {
        return;
    }
    let mut env = Env::builder("apply-rbac").start().await;
    let binding = env.run_manager_as_installed().await;
    env.config.provision = true;
    env.start_manager();

    let source = env.dir.join("cluster-module");
    std::fs::create_dir_all(&source).expect("module dir");
    std::fs::write(
        source.join("main.tf"),
        format!(
            "{}output \"machine_inputs\" {{\n  value = {{ subnet = \"s-1\" }}\n}}\n",
            apply_module(0)
        ),
    )
    .expect("main.tf");
    let cluster_uid = env.create_cluster("prod").await;
    env.create_owned::<Tfc>(
        "prod",
        "prod",
        &[("Cluster", "prod", &cluster_uid, false)],
        "",
        json!({"module": {"source": source.display().to_string()}}),
    )
    .await;
    wait_condition::<Tfc>(&env, "prod", "Provisioned", "True", "Provisioned").await;
    // Cluster API's part: the Cluster's infrastructure and control plane are ready.
    env.mark_cluster_ready("prod").await;
    // The run of the cluster's apply is recorded, from its Pod's log (pods/log).
    wait_for("the apply's run to be recorded", long(), || async {
        recorded_ran(&env, Kind::TerraformCluster, "prod")
            .await
            .is_some_and(|r| r.module_files.is_some() && r.image_digest.is_some())
    })
    .await;

    env.create_bootstrap_secret("prod", "web-1-bootstrap", "#cloud-config web-1")
        .await;
    let machine_uid = env
        .create_machine("web-1", "prod", Some("web-1-bootstrap"))
        .await;
    env.create_owned::<Tfm>(
        "web-1",
        "prod",
        &[("Machine", "web-1", &machine_uid, true)],
        &handoff_machine_module(),
        json!({}),
    )
    .await;
    wait_condition::<Tfm>(&env, "web-1", "Provisioned", "True", "Provisioned").await;
    let handed = std::fs::read_to_string(env.markers().join("web-1-0.created"))
        .expect("the machine's created marker");
    assert_eq!(handed, r#"{"subnet":"s-1"}"#);

    env.delete::<Tfm>("web-1").await;
    env.wait_gone::<Tfm>("web-1", long()).await;
    assert!(env.markers().join("web-1-0.destroyed").exists());
    delete_and_wait_released(&env).await;
    assert!(env.destroyed("prod"));
    env.assert_nothing_left(Kind::TerraformCluster, "prod")
        .await;
    env.assert_nothing_left(Kind::TerraformMachine, "web-1")
        .await;
    env.remove_manager_binding(&binding).await;
    env.shutdown().await;
}

/// A module image: the module is a directory of the runner image (`module.path`) and its
/// providers another (`runner.pluginDir`, `init -plugin-dir`), so neither the apply nor the
/// destroy reaches a git host or a registry. (The local kubelet's "image" is this
/// machine's root.)
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_module_image_with_its_providers_applies_and_destroys() {
    if envtest_only("the module image is a directory of this machine") {
        return;
    }
    let env = Env::builder("apply-module-image")
        .provisioning()
        .start()
        .await;
    let image = env.dir.join("image");
    std::fs::create_dir_all(image.join("modules/cluster")).expect("module dir");
    std::fs::create_dir_all(image.join("providers")).expect("providers dir");
    std::fs::write(image.join("modules/cluster/main.tf"), apply_module(0)).expect("main.tf");
    let uid = env.create_cluster("prod").await;
    env.create_owned::<Tfc>(
        "prod",
        "prod",
        &[("Cluster", "prod", &uid, false)],
        "",
        json!({
            "module": {"path": image.join("modules/cluster").display().to_string()},
            "runner": {"pluginDir": image.join("providers").display().to_string()}
        }),
    )
    .await;
    wait_condition::<Tfc>(&env, "prod", "Provisioned", "True", "Provisioned").await;
    assert!(created(&env, "prod"));
    // The destroy will run the same image, by digest, with the module and providers in it.
    wait_for("the apply's run to be recorded", long(), || async {
        recorded_ran(&env, Kind::TerraformCluster, "prod")
            .await
            .is_some()
    })
    .await;
    let inputs = recorded_inputs(&env, Kind::TerraformCluster, "prod")
        .await
        .expect("the inputs");
    assert!(
        matches!(&inputs.module, captf::inputs::Module::Path(p) if p.ends_with("modules/cluster"))
    );
    assert!(inputs.run_image().contains("@sha256:"), "run by digest");
    delete_and_wait_released(&env).await;
    assert!(env.destroyed("prod"));
    env.assert_nothing_left(Kind::TerraformCluster, "prod")
        .await;
    env.shutdown().await;
}

/// A TerraformCluster whose spec asks for a runner ServiceAccount of its own (a cloud's
/// workload identity): its apply and its destroy run as `captf-runner-prod.tfc`, which
/// carries the annotations the spec gives at each attempt (changed between the apply and
/// the destroy, the destroy's account has the new ones) and can use the state through
/// its RoleBinding to the runner Role; at the release, the account and its binding go.
/// Every Job of the test's namespace as it is seen: its operation and the ServiceAccount
/// its Pod runs as.
pub(crate) fn job_accounts(env: &Env) -> History<(String, String)> {
    use k8s_openapi::api::batch::v1::Job;
    use kube::runtime::watcher;
    History::watch(
        kube::Api::<Job>::namespaced(env.client.clone(), &env.ns),
        watcher::Config::default(),
        |j: &Job| {
            (
                j.labels()
                    .get(names::LABEL_OPERATION)
                    .cloned()
                    .unwrap_or_default(),
                j.spec
                    .as_ref()
                    .and_then(|s| s.template.spec.as_ref())
                    .and_then(|p| p.service_account_name.clone())
                    .unwrap_or_default(),
            )
        },
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_objects_own_runner_account_runs_its_attempts_and_goes_with_it() {
    use k8s_openapi::api::core::v1::ServiceAccount;
    use k8s_openapi::api::rbac::v1::RoleBinding;
    use kube::Api;
    use kube::runtime::watcher;
    const ROLE: &str = "eks.amazonaws.com/role-arn";
    let env = Env::builder("runner-account").provisioning().start().await;
    let account = "captf-runner-prod.tfc";
    let jobs = job_accounts(&env);
    let accounts = History::watch(
        Api::<ServiceAccount>::namespaced(env.client.clone(), &env.ns),
        watcher::Config::default().fields(&format!("metadata.name={account}")),
        |a: &ServiceAccount| a.annotations().get(ROLE).cloned(),
    );
    env.provisioned_cluster(
        &apply_module(0),
        json!({"runner": {"serviceAccount": {"annotations": {ROLE: "arn:aws:iam::111122223333:role/a"}}}}),
    )
    .await;
    assert!(
        jobs.any(|(op, sa)| op == names::OPERATION_APPLY && sa == account),
        "the apply ran as the object's own account: {:?}",
        jobs.seen()
    );
    let sas: Api<ServiceAccount> = Api::namespaced(env.client.clone(), &env.ns);
    let sa = sas.get(account).await.expect("the object's runner account");
    assert_eq!(
        sa.annotations().get(ROLE).map(String::as_str),
        Some("arn:aws:iam::111122223333:role/a")
    );
    assert!(
        !sa.labels().contains_key(names::CLUSTERCTL_MOVE_LABEL),
        "each management cluster makes its own"
    );
    let rbs: Api<RoleBinding> = Api::namespaced(env.client.clone(), &env.ns);
    let rb = rbs.get(account).await.expect("its binding");
    assert_eq!(rb.role_ref.name, names::RUNNER_NAME);

    // The identity changes (a role rotated); the destroy runs under the new one.
    env.api::<Tfc>()
        .patch(
            "prod",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"runner": {"serviceAccount": {"annotations": {ROLE: "arn:aws:iam::111122223333:role/b"}}}}})),
        )
        .await
        .expect("patch");
    env.delete::<Tfc>("prod").await;
    env.wait_gone::<Tfc>("prod", long()).await;
    assert!(
        jobs.any(|(op, sa)| op == names::OPERATION_DESTROY && sa == account),
        "the destroy ran as the object's own account: {:?}",
        jobs.seen()
    );
    assert!(
        accounts.any(|role| role.as_deref() == Some("arn:aws:iam::111122223333:role/b")),
        "the destroy's attempt gave the account the annotations the spec gives now: {:?}",
        accounts.seen()
    );
    assert!(
        sas.get_opt(account).await.expect("get").is_none()
            && rbs.get_opt(account).await.expect("get").is_none(),
        "the account and its binding go with the object"
    );
    env.shutdown().await;
}

/// The runner ServiceAccount of [`own_account_cluster`]'s TerraformCluster `prod`.
const OWN_ACCOUNT: &str = "captf-runner-prod.tfc";

/// A TerraformCluster `prod` provisioned with a runner ServiceAccount of its own
/// ([`OWN_ACCOUNT`]), with the Api of the test namespace's ServiceAccounts and
/// RoleBindings.
async fn own_account_cluster(
    tag: &str,
) -> (
    Env,
    kube::Api<k8s_openapi::api::core::v1::ServiceAccount>,
    kube::Api<k8s_openapi::api::rbac::v1::RoleBinding>,
) {
    let env = Env::builder(tag).provisioning().start().await;
    env.provisioned_cluster(
        &apply_module(0),
        json!({"runner": {"serviceAccount": {"annotations": {}}}}),
    )
    .await;
    let sas = kube::Api::namespaced(env.client.clone(), &env.ns);
    let rbs = kube::Api::namespaced(env.client.clone(), &env.ns);
    (env, sas, rbs)
}

/// Each runner RoleBinding is owned by the ServiceAccount it binds, so that the garbage
/// collector deletes it with that account, whoever deleted the account: a pass still in
/// flight for an object whose finalizer was stripped can create the object's binding just
/// after the sweep removed its account (CI saw it: the account swept, its binding left,
/// and no later sweep found it, as sweeps start from the accounts). Here the object's own
/// account and the namespace's shared one are deleted by hand: their bindings go, and the
/// Role they bind to stays (another account's binding may use it).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_runner_binding_goes_with_the_account_it_binds() {
    use k8s_openapi::api::rbac::v1::Role;
    use kube::Api;
    let (env, sas, rbs) = own_account_cluster("runner-binding-owned").await;
    let own = OWN_ACCOUNT;
    for account in [own, names::RUNNER_NAME] {
        let sa = sas.get(account).await.expect("the runner account");
        let rb = rbs.get(account).await.expect("its binding");
        let owners: Vec<_> = rb
            .metadata
            .owner_references
            .iter()
            .flatten()
            .map(|o| {
                (
                    o.kind.as_str(),
                    o.name.as_str(),
                    Some(&o.uid) == sa.metadata.uid.as_ref(),
                )
            })
            .collect();
        assert_eq!(
            owners,
            [("ServiceAccount", account, true)],
            "{account}'s binding"
        );
        sas.delete(account, &Default::default())
            .await
            .expect("delete the account");
        let start = std::time::Instant::now();
        while rbs.get_opt(account).await.expect("get").is_some() {
            assert!(
                start.elapsed() < long(),
                "{account}'s binding is still there {:?} after its account was deleted",
                long()
            );
            tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        }
    }
    assert!(
        Api::<Role>::namespaced(env.client.clone(), &env.ns)
            .get_opt(names::RUNNER_NAME)
            .await
            .expect("get")
            .is_some(),
        "the runner Role stays"
    );
    env.shutdown().await;
}

/// The sweep keeps a live object's own runner account, and removes one whose object left
/// without its release (its finalizer stripped), once no runner there runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_sweep_removes_the_runner_account_of_an_object_gone_without_its_release() {
    use kube::Api;
    let (env, sas, rbs) = own_account_cluster("runner-account-swept").await;
    let account = OWN_ACCOUNT;
    // The sweep runs every 500 ms here: four of them leave a live object's account alone.
    tokio::time::sleep(std::time::Duration::from_secs(2)).await;
    assert!(sas.get_opt(account).await.expect("get").is_some());
    env.delete_stripping_finalizers::<Tfc>("prod").await;
    let swept = || async {
        sas.get_opt(account).await.expect("get").is_none()
            && rbs.get_opt(account).await.expect("get").is_none()
    };
    let start = std::time::Instant::now();
    while !swept().await {
        // On a timeout, what the sweep decides from: it waits for every runner of the
        // namespace to finish, and for the object to be gone from the caches.
        if start.elapsed() > long() {
            use k8s_openapi::api::batch::v1::Job;
            use k8s_openapi::api::core::v1::Pod;
            let jobs: Vec<String> = Api::<Job>::namespaced(env.client.clone(), &env.ns)
                .list(&Default::default())
                .await
                .map(|l| {
                    l.items
                        .iter()
                        .map(|j| {
                            format!(
                                "{} {:?}",
                                j.name_any(),
                                j.status
                                    .as_ref()
                                    .and_then(|s| s.conditions.clone())
                                    .unwrap_or_default()
                                    .iter()
                                    .map(|c| (c.type_.clone(), c.status.clone()))
                                    .collect::<Vec<_>>()
                            )
                        })
                        .collect()
                })
                .unwrap_or_default();
            let pods: Vec<String> = Api::<Pod>::namespaced(env.client.clone(), &env.ns)
                .list(&Default::default())
                .await
                .map(|l| {
                    l.items
                        .iter()
                        .map(|p| {
                            format!(
                                "{} {:?} deleting={}",
                                p.name_any(),
                                p.status.as_ref().and_then(|s| s.phase.clone()),
                                p.metadata.deletion_timestamp.is_some()
                            )
                        })
                        .collect()
                })
                .unwrap_or_default();
            panic!(
                "timed out after {:?} waiting for the gone object's runner account and binding to be swept: account {}, binding {}, object {}; Jobs {jobs:?}; Pods {pods:?}",
                long(),
                sas.get_opt(account).await.ok().flatten().is_some(),
                rbs.get_opt(account).await.ok().flatten().is_some(),
                env.exists::<Tfc>("prod").await,
            );
        }
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    env.shutdown().await;
}
