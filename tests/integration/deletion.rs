//! End-to-end deletions: the real manager against the real control plane (or an outside
//! cluster), the real `terraform` doing the apply and, in the destroy Jobs, the destroy.
//! Each test is a scenario a person would recognise.

use std::sync::Arc;
use std::time::Duration;

use captf::api::names::{self, Kind};
use captf::controller::reconcile::reconcile;
use captf::state::permits::Lane;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::ServiceAccount;
use kube::api::{Api, ListParams};

use crate::steps::*;
use crate::support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn scenario_01_clean_teardown_destroys_everything_in_order() {
    // Everything made by the product: the manager applies the cluster, two machines and a
    // pool, each owned as Cluster API owns them, then the Cluster is deleted.
    let env = Env::builder("clean").provisioning().start().await;
    env.create_cluster("prod").await;
    env.provision::<Tfc>("prod", "prod", &module(0)).await;
    env.mark_cluster_ready("prod").await;
    env.provision::<Tfm>("web-1", "prod", &module(0)).await;
    env.provision::<Tfm>("web-2", "prod", &module(0)).await;
    env.provision::<Tfmp>("pool", "prod", &module(0)).await;
    assert_eq!(env.jobs_created(), 4, "one apply each");
    assert!(
        env.object::<Tfmp>("pool")
            .await
            .is_some_and(|p| p.spec.provider_id_list.len() == 2),
        "the pool's providerIDList is set from its apply"
    );

    env.delete_cluster("prod").await;

    // The cluster holds on its dependents first.
    wait_for("the cluster to report its dependents", long(), || async {
        match env.condition::<Tfc>("prod", "DeletionBlocked").await {
            Some((s, r, _)) if s == "True" && r == "DependentsExist" => true,
            _ => !env.exists::<Tfm>("web-1").await, // dependents may already be gone
        }
    })
    .await;
    wait_for("every object to be released", long(), || async {
        !env.exists::<Tfm>("web-1").await
            && !env.exists::<Tfm>("web-2").await
            && !env.exists::<Tfmp>("pool").await
            && !env.exists::<Tfc>("prod").await
    })
    .await;

    // Terraform really destroyed every instance, machines and pool before the cluster.
    for name in ["web-1", "web-2", "pool", "prod"] {
        assert!(env.destroyed(name), "{name} was not destroyed by Terraform");
    }
    let cluster_done = env.destroyed_at("prod").expect("destroyed");
    for name in ["web-1", "web-2", "pool"] {
        let t = env.destroyed_at(name).expect("destroyed");
        assert!(t <= cluster_done, "{name} was destroyed after the cluster");
    }
    // State, inputs, backups, Jobs, the lock Lease and the runner RBAC are gone.
    for (kind, name) in [
        (Kind::TerraformCluster, "prod"),
        (Kind::TerraformMachine, "web-1"),
        (Kind::TerraformMachine, "web-2"),
        (Kind::TerraformMachinePool, "pool"),
    ] {
        env.assert_nothing_left(kind, name).await;
    }
    let jobs: Api<Job> = Api::namespaced(env.client.clone(), &env.ns);
    assert!(
        jobs.list(&ListParams::default())
            .await
            .expect("jobs")
            .items
            .is_empty(),
        "Jobs are left"
    );
    wait_for("the RBAC sweep", long(), || async {
        let sas: Api<ServiceAccount> = Api::namespaced(env.client.clone(), &env.ns);
        sas.get_opt(names::RUNNER_NAME).await.expect("sa").is_none()
    })
    .await;
    assert!(
        env.event_reasons("web-1")
            .await
            .contains(&"DestroyStarted".to_string()),
        "{:?}",
        env.event_reasons("web-1").await
    );
    env.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn scenario_05_never_applied_is_released_at_once_without_a_job() {
    let mut env = Env::builder("never").start().await;
    env.start_manager();
    let uid = env.create_cluster("prod").await;
    env.create_object::<Tfm>("web-1", "prod", &uid, &env.markers())
        .await;
    env.wait_finalizer::<Tfm>("web-1").await;
    env.delete::<Tfm>("web-1").await;
    env.wait_gone::<Tfm>("web-1", long()).await;
    assert_eq!(
        env.jobs_created(),
        0,
        "no Job for an object that never applied"
    );
    env.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn scenario_07_failing_destroy_is_retried_with_backoff_across_a_restart() {
    // The failure is recorded at the Job's finish time, which has whole seconds: with a
    // backoff under about a second the next attempt can start at once, and the failure of
    // attempt 1 is shown for a few milliseconds only.
    let mut env = machine_env("retry", 2, Duration::from_secs(2)).await;
    env.delete::<Tfm>("web-1").await;
    let msg = env
        .wait_deleting::<Tfm>("web-1", "DestroyFailed", long())
        .await;
    assert!(
        msg.contains("Error: local-exec provisioner error")
            && msg.contains("(Terraform's whole output: kubectl logs job/captf-web-1-tfm-destroy-"),
        "a summary of Terraform's error is in the condition, and where to read the rest: {msg}"
    );
    // The first failure seen is attempt 1's, or attempt 2's when the machine is so loaded
    // that the retry ran before this poll.
    assert!(
        (msg.contains("attempt 1 failed") || msg.contains("attempt 2 failed"))
            && msg.contains("runbooks/DestroyFailed.md"),
        "{msg}"
    );
    let attempt = env
        .object::<Tfm>("web-1")
        .await
        .and_then(|o| o.metadata.annotations?.get(names::DESTROY_ATTEMPT).cloned());
    assert!(attempt.is_some(), "the attempt number is on the object");
    // A restart does not reset the attempt count or the schedule.
    env.stop_manager().await;
    env.start_manager();
    env.wait_gone::<Tfm>("web-1", long()).await;
    assert_eq!(
        env.tries("web-1"),
        3,
        "two failures, then success: three attempts"
    );
    assert!(env.destroyed("web-1"));
    // tries == 3 above: Terraform ran exactly three times, so no attempt ran twice.
    env.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn scenario_06_corrupt_state_holds_until_restored_from_the_backup() {
    let env = machine_env("corrupt", 2, Duration::from_secs(4)).await;
    env.delete::<Tfm>("web-1").await;
    env.wait_deleting::<Tfm>("web-1", "DestroyFailed", long())
        .await;
    let backup = names::backup_secret_name("web-1.tfm");
    assert!(
        env.secret_exists(&backup).await,
        "the backup was taken before the first attempt"
    );
    // Damage the state.
    let state = names::state_secret_name("web-1.tfm");
    let mut s = env.secrets().get(&state).await.expect("state");
    s.data = Some(
        [(
            "tfstate".to_string(),
            k8s_openapi::ByteString(b"this is not gzip".to_vec()),
        )]
        .into(),
    );
    env.secrets()
        .replace(&state, &Default::default(), &s)
        .await
        .expect("damage");
    env.wait_deleting::<Tfm>("web-1", "Held", long()).await;
    let (_, reason, msg) = env
        .condition::<Tfm>("web-1", "StateReadable")
        .await
        .expect("StateReadable");
    assert_eq!(reason, "StateCorrupt", "{msg}");
    // The runbook's way out: restore from the backup.
    let out = env.captf(&[
        "state",
        "restore",
        "terraformmachine/web-1",
        "--from-backup",
        "-n",
        &env.ns,
    ]);
    assert!(
        out.status.success(),
        "restore: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    env.wait_gone::<Tfm>("web-1", long()).await;
    assert!(env.destroyed("web-1"));
    assert!(
        !env.secret_exists(&backup).await,
        "cleanup removes the backup after a verified-empty destroy"
    );
    env.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn scenario_06_lost_state_holds_and_abandon_releases_keeping_the_secrets() {
    let env = machine_env("lost", 0, FAST).await;
    let state = names::state_secret_name("web-1.tfm");
    wait_for(
        "the protection finalizer on the state Secret",
        long(),
        || async {
            env.secrets().get(&state).await.is_ok_and(|s| {
                s.metadata
                    .finalizers
                    .unwrap_or_default()
                    .contains(&names::PROTECT_FINALIZER.to_string())
            })
        },
    )
    .await;
    // Lose the state.
    env.lose_secret(&state).await;
    env.delete::<Tfm>("web-1").await;
    env.wait_deleting::<Tfm>("web-1", "Held", long()).await;
    let (_, reason, _) = env
        .condition::<Tfm>("web-1", "StateReadable")
        .await
        .expect("StateReadable");
    assert_eq!(reason, "StateLost");
    assert_eq!(
        env.destroy_jobs_created(),
        0,
        "never a destroy against a missing state"
    );
    // An abandon left over with the value "true" (a GitOps repository, a saved YAML) is
    // not meant for this object: it is ignored, and the condition says so.
    env.annotate::<Tfm>("web-1", &[(names::ABANDON, Some("true".into()))])
        .await;
    let uid = env
        .object::<Tfm>("web-1")
        .await
        .and_then(|o| o.metadata.uid)
        .expect("uid");
    let ignored = format!("is \"true\", not this object's uid {uid}, and is ignored");
    wait_for("the ignored abandon to be named", long(), || async {
        env.condition::<Tfm>("web-1", "Deleting")
            .await
            .is_some_and(|(_, r, m)| r == "Held" && m.contains(&ignored))
    })
    .await;
    assert!(env.exists::<Tfm>("web-1").await);
    env.abandon::<Tfm>("web-1").await;
    env.wait_gone::<Tfm>("web-1", long()).await;
    let inputs = env
        .secrets()
        .get(&names::inputs_secret_name("web-1.tfm"))
        .await
        .expect("inputs kept");
    assert!(
        inputs
            .metadata
            .annotations
            .unwrap_or_default()
            .contains_key(names::ABANDONED_AT)
    );
    assert!(
        !inputs
            .metadata
            .finalizers
            .unwrap_or_default()
            .contains(&names::PROTECT_FINALIZER.to_string())
    );
    assert!(
        env.event_reasons("web-1")
            .await
            .contains(&"Abandoned".to_string())
    );
    assert!(!env.destroyed("web-1"), "abandon never destroys");
    let orphans = env.captf(&["orphans", "-n", &env.ns, "-o", "json"]);
    assert!(
        orphans.status.success(),
        "{}",
        String::from_utf8_lossy(&orphans.stderr)
    );
    assert!(String::from_utf8_lossy(&orphans.stdout).contains("captf-inputs-web-1.tfm"));
    env.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn scenario_02_paused_cluster_starts_nothing_until_unpaused() {
    let env = machine_env("paused", 0, FAST).await;
    env.cluster_api()
        .patch(
            "prod",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(serde_json::json!({"spec": {"paused": true}})),
        )
        .await
        .expect("pause");
    env.delete::<Tfm>("web-1").await;
    let msg = env.wait_deleting::<Tfm>("web-1", "Paused", long()).await;
    assert!(msg.contains("prod"), "{msg}");
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(env.destroy_jobs_created(), 0, "nothing starts while paused");
    assert!(env.exists::<Tfm>("web-1").await);
    env.cluster_api()
        .patch(
            "prod",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(serde_json::json!({"spec": {"paused": false}})),
        )
        .await
        .expect("unpause");
    env.wait_gone::<Tfm>("web-1", long()).await;
    assert!(env.destroyed("web-1"));
    env.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn scenario_09_manager_restarted_after_every_write_loses_and_repeats_nothing() {
    let mut env = machine_env("crash", 0, FAST).await;
    env.stop_manager().await;
    env.delete::<Tfm>("web-1").await;
    let start = std::time::Instant::now();
    let mut restarts = 0;
    while env.exists::<Tfm>("web-1").await {
        assert!(
            start.elapsed() < long(),
            "not released after {restarts} restarts"
        );
        let before = env.total_writes();
        env.start_manager();
        // Stop the manager as soon as it has made one more write.
        let t = std::time::Instant::now();
        while env.total_writes() == before && t.elapsed() < Duration::from_secs(5) {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        env.stop_manager().await;
        restarts += 1;
    }
    assert!(restarts > 3, "the manager was restarted {restarts} times");
    assert_eq!(
        env.tries("web-1"),
        1,
        "Terraform destroyed once: no duplicate Job"
    );
    assert!(env.destroyed("web-1"));
    for secret in [
        names::state_secret_name("web-1.tfm"),
        names::inputs_secret_name("web-1.tfm"),
        names::backup_secret_name("web-1.tfm"),
    ] {
        assert!(!env.secret_exists(&secret).await, "{secret} left");
    }
    env.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn scenario_10_transient_api_errors_and_conflicts_do_not_stop_a_deletion() {
    let env = machine_env("faults", 0, FAST).await;
    env.proxy.faults().fail_next(4, Some("patch"), None, 500);
    env.proxy
        .faults()
        .fail_next(2, Some("create"), Some("jobs"), 503);
    env.proxy
        .faults()
        .fail_next(3, Some("delete"), Some("secrets"), 500);
    env.proxy
        .faults()
        .fail_next(3, Some("patch"), Some("terraformmachines"), 409);
    env.proxy.faults().add_latency(Duration::from_millis(10));
    env.delete::<Tfm>("web-1").await;
    env.wait_gone::<Tfm>("web-1", long()).await;
    assert!(env.destroyed("web-1"));
    assert_eq!(env.tries("web-1"), 1);
    env.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn scenario_12_stripped_finalizer_leaves_orphans_that_only_the_saved_object_adopts() {
    let mut env = machine_env("orphan", 0, FAST).await;
    let saved = env.object::<Tfm>("web-1").await.expect("object");
    // While the manager is down, delete the object and strip its finalizer by hand.
    env.stop_manager().await;
    env.delete_stripping_finalizers::<Tfm>("web-1").await;
    env.start_manager();
    let out = env.captf(&["orphans", "-n", &env.ns, "-o", "json"]);
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    let secrets: Vec<String> = env
        .secrets()
        .list(&Default::default())
        .await
        .expect("secrets")
        .items
        .iter()
        .map(|s| {
            format!(
                "{} {:?}",
                s.metadata.name.as_deref().unwrap_or_default(),
                s.metadata.labels
            )
        })
        .collect();
    assert!(
        text.contains("tfstate-default-web-1.tfm") && text.contains("captf-inputs-web-1.tfm"),
        "{text} {} {secrets:?}",
        String::from_utf8_lossy(&out.stderr)
    );
    // A fresh object of the same name does not adopt the state; deleting it destroys nothing.
    let uid = env
        .cluster_api()
        .get("prod")
        .await
        .expect("cluster")
        .metadata
        .uid
        .unwrap_or_default();
    env.create_object::<Tfm>("web-1", "prod", &uid, &env.markers())
        .await;
    env.wait_finalizer::<Tfm>("web-1").await;
    env.delete::<Tfm>("web-1").await;
    env.wait_gone::<Tfm>("web-1", long()).await;
    assert!(
        !env.destroyed("web-1"),
        "a fresh namesake must not destroy the orphan's infrastructure"
    );
    assert!(
        env.secret_exists(&names::state_secret_name("web-1.tfm"))
            .await
    );
    // Recreated from the saved YAML (same lineage): it adopts, and deleting it destroys.
    let mut again = saved.clone();
    again.metadata.uid = None;
    again.metadata.resource_version = None;
    again.metadata.creation_timestamp = None;
    again.metadata.deletion_timestamp = None;
    again.metadata.finalizers = None;
    again.status = None;
    env.api::<Tfm>()
        .create(&Default::default(), &again)
        .await
        .expect("recreate");
    env.wait_finalizer::<Tfm>("web-1").await;
    env.delete::<Tfm>("web-1").await;
    env.wait_gone::<Tfm>("web-1", long()).await;
    assert!(
        env.destroyed("web-1"),
        "the adopted object runs the destroy"
    );
    assert!(
        !env.secret_exists(&names::state_secret_name("web-1.tfm"))
            .await
    );
    env.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_recreated_object_ignores_the_earlier_deletion_bookkeeping_and_records_what_it_adopts() {
    // The first two destroys fail, so that the new object's deletion can be looked at.
    // Not with the FAST backoff: a failure is recorded at the Job's finish time, in whole
    // seconds, so with a backoff under a second the retry can start at once and
    // `Deleting=DestroyFailed` shows for milliseconds; a poll on a loaded machine missed
    // it, the retry succeeded, and the wait ran out its 90 s. With 2 s, attempt 1's
    // failure shows for at least 1 s and attempt 2's for at least 3 s.
    let mut env = machine_env("rebirth", 2, Duration::from_secs(2)).await;
    let saved = env.object::<Tfm>("web-1").await.expect("object");
    let old_uid = saved.metadata.uid.clone().expect("uid");
    let lineage = match env.read_state(Kind::TerraformMachine, "web-1").await {
        captf::state::StateContent::Parsed { lineage, .. } => lineage,
        other => panic!("the applied state reads as {other:?}"),
    };
    env.stop_manager().await;
    env.delete_stripping_finalizers::<Tfm>("web-1").await;
    // Recreated from a YAML saved while the earlier object's cleanup ran (its bookkeeping
    // written under its uid), adopting the state without a recorded fingerprint.
    let mut again = saved.clone();
    again.metadata.uid = None;
    again.metadata.resource_version = None;
    again.metadata.creation_timestamp = None;
    again.metadata.finalizers = None;
    again.status = None;
    let ann = again
        .metadata
        .annotations
        .get_or_insert_with(Default::default);
    ann.remove(names::STATE_LINEAGE);
    ann.remove(names::STATE_SERIAL);
    for (k, v) in [
        (names::ADOPT, "true"),
        (names::CLEANUP_STARTED, names::CLEANUP_DESTROYED),
        (names::DESTROY_ATTEMPT, "1"),
        (names::DELETION_UID, old_uid.as_str()),
    ] {
        ann.insert(k.to_string(), v.to_string());
    }
    env.api::<Tfm>()
        .create(&Default::default(), &again)
        .await
        .expect("recreate");
    env.start_manager();
    env.wait_finalizer::<Tfm>("web-1").await;
    env.delete::<Tfm>("web-1").await;
    // Not a cleanup of a state that lists instances: the new object's own attempts, the
    // first two of which fail.
    env.wait_deleting::<Tfm>("web-1", "DestroyFailed", long())
        .await;
    let now = env.object::<Tfm>("web-1").await.expect("object");
    let ann = now.metadata.annotations.clone().unwrap_or_default();
    // Its attempts count from 1 (a retry may have started since the failure was seen).
    assert!(
        matches!(
            ann.get(names::DESTROY_ATTEMPT).map(String::as_str),
            Some("1" | "2" | "3")
        ),
        "{ann:?}"
    );
    assert_eq!(ann.get(names::DELETION_UID), now.metadata.uid.as_ref());
    assert_eq!(ann.get(names::CLEANUP_STARTED), None);
    // What it adopted is recorded, and checked from now on.
    assert_eq!(ann.get(names::STATE_LINEAGE), Some(&lineage));
    assert!(ann.contains_key(names::STATE_SERIAL), "{ann:?}");
    env.wait_gone::<Tfm>("web-1", long()).await;
    assert!(
        env.destroyed("web-1"),
        "the adopted state's instances are destroyed"
    );
    // Terraform ran three times: two failures and the success, none for the earlier
    // object's bookkeeping and none twice.
    assert_eq!(env.tries("web-1"), 3);
    env.shutdown().await;
}

/// A deletion finds the Machine that owns its object in the manager's cache of Machines:
/// the Machine is read from the API server once per destroy start (after `block-move` is
/// written, before the Job is made: a cache that has not seen it go must not start a
/// destroy), not at every pass of the deletion.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_deletion_reads_its_machine_live_only_when_a_destroy_starts() {
    let env = machine_env("owner-reads", 2, Duration::from_secs(2)).await;
    let log = env.proxy.request_log();
    log.reset();
    env.delete::<Tfm>("web-1").await;
    env.wait_gone::<Tfm>("web-1", long()).await;
    assert_eq!(env.tries("web-1"), 3, "two failed attempts and the last");
    let gets = log.count("get", "machines", "");
    assert!(
        (1..=3).contains(&gets),
        "the Machine read once per destroy start (3 starts), not once per pass: {gets} reads; {:?}",
        log.snapshot()
    );
    env.shutdown().await;
}

/// A deletion's backup, written where the manager's cache of the object's Secrets shows
/// no earlier, longer backup and the manager wrote none, looks for no surplus part with a
/// read: the cache, which listed before the first pass and brings every write since, is
/// what answers.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_deletion_writes_its_backup_without_reading_parts_the_cache_shows_absent() {
    let env = machine_env("backup-no-probe", 0, FAST).await;
    let backup = names::backup_secret_name(&names::state_suffix(Kind::TerraformMachine, "web-1"));
    let log = env.proxy.request_log();
    log.reset();
    env.delete::<Tfm>("web-1").await;
    env.wait_gone::<Tfm>("web-1", long()).await;
    assert!(
        log.writes_in_order()
            .iter()
            .any(|w| w.verb == "create" && w.resource == "secrets" && w.name == backup),
        "the deletion wrote its backup {backup}: {:?}",
        log.writes_in_order()
    );
    assert_eq!(
        log.gets_of("secrets", &names::part_secret_name(&backup, 1)),
        0,
        "reads of {backup}'s first part, which was never there"
    );
    env.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn orphans_and_restore_work_for_a_ninety_character_name() {
    let name = format!("web-{}", "x".repeat(86));
    assert_eq!(name.len(), 90);
    let mut env = Env::builder("long-name")
        .backoff(FAST, FAST * 4)
        .with_machine(&name, &module(0))
        .start()
        .await;
    let suffix = names::state_suffix(Kind::TerraformMachine, &name);
    let state = names::state_secret_name(&suffix);
    let orphans = |env: &Env| -> Vec<serde_json::Value> {
        let out = env.captf(&["orphans", "-n", &env.ns, "-o", "json"]);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).expect("orphans json")
    };
    // The object exists: none of its Secrets is an orphan.
    assert_eq!(orphans(&env), Vec::<serde_json::Value>::new());
    // Restore writes labels the API server accepts (the owner name cut to a label value).
    let gz = env
        .secrets()
        .get(&state)
        .await
        .expect("state")
        .data
        .and_then(|d| d.get("tfstate").cloned())
        .expect("tfstate")
        .0;
    let file = env.dir.join("state.tfstate.gz");
    std::fs::write(&file, gz).expect("state file");
    env.restore_from_file(&format!("tfm/{name}"), &file);
    // Once the object is gone (its finalizer stripped), they all are.
    env.stop_manager().await;
    env.delete_stripping_finalizers::<Tfm>(&name).await;
    let listed = orphans(&env);
    let roles: Vec<(&str, &str)> = listed
        .iter()
        .map(|o| {
            (
                o["secret"].as_str().unwrap_or_default(),
                o["role"].as_str().unwrap_or_default(),
            )
        })
        .collect();
    let inputs = names::inputs_secret_name(&suffix);
    assert!(roles.contains(&(state.as_str(), "state")), "{roles:?}");
    assert!(roles.contains(&(inputs.as_str(), "inputs")), "{roles:?}");
    assert!(
        listed
            .iter()
            .all(|o| o["kind"] == "TerraformMachine" && o["uid"].is_string())
    );
    env.shutdown().await;
}

/// What Terraform could not save (`errored.tfstate`, kept by the runner in
/// `captf-errored-<suffix>`) may be the only record of resources: the cleanup after a
/// destroy leaves it, and `captf orphans` lists it afterwards.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_cleanup_keeps_the_errored_state() {
    let env = machine_env("errored-kept", 0, FAST).await;
    let uid = env
        .object::<Tfm>("web-1")
        .await
        .and_then(|o| o.metadata.uid)
        .expect("uid");
    // As an earlier runner wrote it: the owner labels only.
    let errored = names::errored_secret_name("web-1.tfm");
    let secret: k8s_openapi::api::core::v1::Secret = serde_json::from_value(serde_json::json!({
        "metadata": {"name": errored, "labels": backend_labels(Kind::TerraformMachine, "web-1", &uid)},
        "stringData": {"errored.tfstate": "{\"version\":4,\"serial\":9,\"lineage\":\"l\",\"resources\":[]}"}
    }))
    .expect("secret");
    env.secrets()
        .create(&Default::default(), &secret)
        .await
        .expect("errored state");
    env.delete::<Tfm>("web-1").await;
    env.wait_gone::<Tfm>("web-1", long()).await;
    assert!(env.destroyed("web-1"));
    assert!(
        !env.secret_exists(&names::state_secret_name("web-1.tfm"))
            .await,
        "the state went with the cleanup"
    );
    assert!(
        env.secret_exists(&errored).await,
        "the errored state is kept"
    );
    let out = env.captf(&["orphans", "-n", &env.ns, "-o", "json"]);
    let listed: Vec<serde_json::Value> = serde_json::from_slice(&out.stdout).expect("json");
    assert!(
        listed
            .iter()
            .any(|o| o["secret"] == errored.as_str() && o["role"] == "errored"),
        "{listed:?}"
    );
    env.shutdown().await;
}

async fn machine_with(tag: &str, module_body: &str) -> Env {
    Env::builder(tag)
        .backoff(FAST, FAST * 4)
        .with_machine("web-1", module_body)
        .start()
        .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn scenario_02b_foreground_deletion_keeps_the_running_destroy_job() {
    let env = machine_with("foreground", &sleepy_module(2)).await;
    env.api::<Tfm>()
        .delete("web-1", &kube::api::DeleteParams::foreground())
        .await
        .expect("foreground delete");
    wait_for("the destroy Job to run", long(), || async {
        !env.destroy_jobs().await.is_empty()
    })
    .await;
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert_eq!(
        env.destroy_jobs().await.len(),
        1,
        "the garbage collector left the destroy Job alone"
    );
    env.wait_gone::<Tfm>("web-1", long()).await;
    assert!(env.destroyed("web-1"));
    assert_eq!(env.tries("web-1"), 1, "the destroy was not interrupted");
    env.shutdown().await;
}

/// The deletion of an object whose re-apply runs waits for that apply (Terraform holds
/// the state), then destroys from what it left.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn scenario_03_a_running_apply_job_is_waited_for() {
    let env = machine_env("applyjob", 0, FAST).await;
    env.reapply_slowly("web-1", 8).await;
    wait_for("the re-apply's Job to run", long(), || {
        env.apply_job_active("web-1", 2)
    })
    .await;
    env.delete::<Tfm>("web-1").await;
    let msg = env
        .wait_deleting::<Tfm>("web-1", "WaitingForJob", long())
        .await;
    assert!(msg.contains("captf-web-1-tfm-apply-2"), "{msg}");
    assert!(
        env.destroy_jobs().await.is_empty(),
        "the destroy waits for the apply Job"
    );
    let block = env.object::<Tfm>("web-1").await.and_then(|o| {
        o.metadata
            .annotations?
            .get(names::CLUSTERCTL_BLOCK_MOVE)
            .cloned()
    });
    assert!(
        block.is_some(),
        "block-move while a Job runs and the object is deleting"
    );
    env.wait_gone::<Tfm>("web-1", long()).await;
    assert!(env.destroyed("web-1"));
    env.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn scenario_08_terminating_namespace_completes_what_needs_no_job_and_abandon_copies_out() {
    let env = machine_env("nsterm", 0, FAST).await;
    let uid = env
        .cluster_api()
        .get("prod")
        .await
        .expect("cluster")
        .metadata
        .uid
        .unwrap_or_default();
    env.create_object::<Tfm>("web-0", "prod", &uid, &env.markers())
        .await;
    let state = names::state_secret_name("web-1.tfm");
    wait_for(
        "finalizers on the object and the state Secret",
        long(),
        || async {
            env.object::<Tfm>("web-0")
                .await
                .is_some_and(|o| o.metadata.finalizers.is_some())
                && env
                    .secrets()
                    .get(&state)
                    .await
                    .is_ok_and(|s| s.metadata.finalizers.is_some())
        },
    )
    .await;
    Api::<k8s_openapi::api::core::v1::Namespace>::all(env.client.clone())
        .delete(&env.ns, &Default::default())
        .await
        .expect("delete namespace");
    env.wait_gone::<Tfm>("web-0", long()).await; // never applied: no Job needed
    let msg = env
        .wait_deleting::<Tfm>("web-1", "DestroyCannotStart", long())
        .await;
    assert!(
        msg.contains("terminating") && msg.contains("runbooks/DestroyCannotStart.md"),
        "{msg}"
    );
    assert!(
        env.secret_exists(&state).await,
        "the protection finalizer keeps the state"
    );
    assert!(
        env.secret_exists(&names::inputs_secret_name("web-1.tfm"))
            .await
    );
    env.abandon::<Tfm>("web-1").await;
    env.wait_gone::<Tfm>("web-1", long()).await;
    let copies: Api<k8s_openapi::api::core::v1::Secret> =
        Api::namespaced(env.client.clone(), &env.manager_ns);
    let copy = copies
        .get(&names::abandoned_copy_name(&env.ns, "web-1.tfm"))
        .await
        .expect("the copy in the manager's namespace");
    assert!(copy.data.unwrap_or_default().contains_key("tfstate"));
    let inputs = copies
        .get(&format!(
            "{}-inputs",
            names::abandoned_copy_name(&env.ns, "web-1.tfm")
        ))
        .await
        .expect("the inputs copy, a Secret of its own");
    assert!(inputs.data.unwrap_or_default().contains_key("inputs.json"));
    assert!(!env.destroyed("web-1"));
    wait_for("the namespace to go", long(), || async {
        Api::<k8s_openapi::api::core::v1::Namespace>::all(env.client.clone())
            .get_opt(&env.ns)
            .await
            .expect("ns")
            .is_none()
    })
    .await;
    env.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_move_that_left_the_objects_to_the_garbage_collector_destroys_nothing() {
    // Installed with kustomize, CAPTF's kinds are not moved by clusterctl: it pauses the
    // Cluster, strips its finalizers and deletes it, and the garbage collector deletes
    // the TerraformMachine it owned. The infrastructure now belongs to the target.
    let env = machine_env("gc-move", 0, FAST).await;
    let jobs_before = env.destroy_jobs_created();
    env.move_cluster_away("prod").await;
    let msg = env
        .wait_deleting::<Tfm>("web-1", "DestroyCannotStart", long())
        .await;
    assert!(
        msg.contains("Machine web-1")
            && msg.contains("no longer exists")
            && msg.contains("runbooks/OwnerGone.md"),
        "{msg}"
    );
    let (status, reason, _) = env
        .condition::<Tfm>("web-1", "DeletionBlocked")
        .await
        .expect("DeletionBlocked");
    assert_eq!((status.as_str(), reason.as_str()), ("True", "OwnerGone"));
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(env.destroy_jobs_created(), jobs_before, "no destroy Job");
    assert!(!env.destroyed("web-1"));
    // An operator who means it names the object, and the destroy runs.
    let uid = env
        .object::<Tfm>("web-1")
        .await
        .and_then(|o| o.metadata.uid)
        .expect("uid");
    env.annotate::<Tfm>("web-1", &[(names::DESTROY_WITHOUT_OWNER, Some(uid))])
        .await;
    env.wait_gone::<Tfm>("web-1", long()).await;
    assert!(env.destroyed("web-1"));
    env.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_machine_owner_taken_first_holds_the_destroy() {
    // A TerraformMachine owned by its Machine (as Cluster API makes it), whose Machine
    // went first (its finalizer stripped): the garbage collector deletes the object.
    let env = machine_env("machine-gone", 0, FAST).await;
    let machines = env.capi_api("Machine");
    let muid = machines
        .get("web-1")
        .await
        .expect("the Machine")
        .metadata
        .uid
        .expect("uid");
    machines
        .patch(
            "web-1",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(serde_json::json!({"metadata": {"finalizers": null}})),
        )
        .await
        .expect("strip the Machine's finalizer");
    let jobs_before = env.destroy_jobs_created();
    machines
        .delete("web-1", &kube::api::DeleteParams::background())
        .await
        .expect("delete machine");
    let msg = env
        .wait_deleting::<Tfm>("web-1", "DestroyCannotStart", long())
        .await;
    assert!(
        msg.contains(&format!("Machine web-1 (uid {muid}) no longer exists")),
        "{msg}"
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(env.destroy_jobs_created(), jobs_before, "no destroy Job");
    env.abandon::<Tfm>("web-1").await;
    env.wait_gone::<Tfm>("web-1", long()).await;
    assert!(!env.destroyed("web-1"));
    env.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_state_restored_without_terraforms_labels_is_destroyed_not_overwritten() {
    // Restored by hand (kubectl create secret generic ... --from-file=tfstate=...), the
    // base lacks a label Terraform's backend selects by: Terraform would find no state,
    // write an empty one over the base and destroy nothing.
    let env = machine_env("tf-labels", 0, FAST).await;
    let state = names::state_secret_name("web-1.tfm");
    env.secrets()
        .patch(
            &state,
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(serde_json::json!({"metadata": {"labels": {
                names::TF_LABEL_MANAGED_BY: null, names::TF_LABEL_WORKSPACE: null
            }}})),
        )
        .await
        .expect("unlabel");
    env.delete::<Tfm>("web-1").await;
    env.wait_gone::<Tfm>("web-1", long()).await;
    assert!(
        env.destroyed("web-1"),
        "the destroy ran against the real state"
    );
    env.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_copy_with_the_states_labels_holds_the_deletion_until_it_is_gone() {
    // An operator's quick copy of the state, with all its labels: Terraform's backend
    // would read it with the base.
    let env = machine_env("tf-copy", 0, FAST).await;
    let state = names::state_secret_name("web-1.tfm");
    let mut copy = env.secrets().get(&state).await.expect("state");
    let copy_name = format!("{state}-bak");
    copy.metadata = kube::api::ObjectMeta {
        name: Some(copy_name.clone()),
        labels: copy.metadata.labels.clone(),
        ..Default::default()
    };
    env.secrets()
        .create(&Default::default(), &copy)
        .await
        .expect("copy");
    let jobs_before = env.destroy_jobs_created();
    env.delete::<Tfm>("web-1").await;
    env.wait_deleting::<Tfm>("web-1", "Held", long()).await;
    let (_, reason, msg) = env
        .condition::<Tfm>("web-1", "StateReadable")
        .await
        .expect("StateReadable");
    assert_eq!(reason, "StateInconsistent");
    assert!(msg.contains(&copy_name), "{msg}");
    assert_eq!(
        env.destroy_jobs_created(),
        jobs_before,
        "no destroy against two states"
    );
    env.secrets()
        .delete(&copy_name, &Default::default())
        .await
        .expect("delete the copy");
    env.wait_gone::<Tfm>("web-1", long()).await;
    assert!(env.destroyed("web-1"));
    env.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn scenario_11_clusterctl_move_runs_no_destroy_in_the_source() {
    let env = machine_env("move", 0, FAST).await;
    let state = names::state_secret_name("web-1.tfm");
    wait_for("the state Secret protected", long(), || async {
        env.secrets()
            .get(&state)
            .await
            .is_ok_and(|s| s.metadata.finalizers.is_some())
    })
    .await;
    let obj = env.object::<Tfm>("web-1").await.expect("object");
    assert!(
        !obj.metadata
            .annotations
            .unwrap_or_default()
            .contains_key(names::CLUSTERCTL_BLOCK_MOVE),
        "an idle object does not block a move"
    );
    // clusterctl: pause, mark delete-for-move, strip finalizers, delete.
    env.cluster_api()
        .patch(
            "prod",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(serde_json::json!({"spec": {"paused": true}})),
        )
        .await
        .expect("pause");
    env.annotate::<Tfm>(
        "web-1",
        &[(names::CLUSTERCTL_DELETE_FOR_MOVE, Some(String::new()))],
    )
    .await;
    env.api::<Tfm>()
        .patch(
            "web-1",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(serde_json::json!({"metadata": {"finalizers": null}})),
        )
        .await
        .expect("strip");
    env.delete::<Tfm>("web-1").await;
    env.wait_gone::<Tfm>("web-1", long()).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        env.destroy_jobs().await.is_empty(),
        "no destroy in the source"
    );
    assert!(!env.destroyed("web-1"));
    for name in [state, names::inputs_secret_name("web-1.tfm")] {
        let s = env
            .secrets()
            .get(&name)
            .await
            .expect("the Secret stays for the move");
        assert!(
            s.metadata
                .labels
                .unwrap_or_default()
                .contains_key(names::CLUSTERCTL_MOVE_LABEL),
            "{name} carries the move label"
        );
    }
    env.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn scenario_13_a_runner_killed_mid_destroy_saves_state_and_the_next_attempt_continues() {
    let env = machine_with("sigterm", &sleepy_module(60)).await;
    env.delete::<Tfm>("web-1").await;
    wait_for(
        "the destroy to be running its provisioner",
        long(),
        || async { env.destroy_provisioner_started("web-1").await },
    )
    .await;
    // Someone deletes the running Job by hand: its Pod gets SIGTERM.
    let job = names::job_name("web-1.tfm", names::OPERATION_DESTROY, 1);
    Api::<Job>::namespaced(env.client.clone(), &env.ns)
        .delete(&job, &kube::api::DeleteParams::background())
        .await
        .expect("delete job");
    env.wait_gone::<Tfm>("web-1", long()).await;
    assert!(env.destroyed("web-1"));
    assert_eq!(
        env.tries("web-1"),
        2,
        "interrupted once, then the next attempt finished it"
    );
    assert!(env.destroy_jobs_created() >= 2);
    assert!(
        env.event_reasons("web-1")
            .await
            .contains(&"DestroyInterrupted".to_string()),
        "{:?}",
        env.event_reasons("web-1").await
    );
    env.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn scenario_09c_a_job_that_does_not_render_cannot_start_until_the_inputs_are_fixed() {
    let env = Env::builder("norender")
        .backoff(FAST, FAST * 4)
        .with_machine_applied_by_hand(&module(0))
        .start()
        .await;
    // Inputs whose Job does not render: an env entry the runner refuses (TF_* variables
    // change what Terraform does), from a Secret that exists.
    let cloud: k8s_openapi::api::core::v1::Secret = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "cloud"}, "stringData": {"args": "-no-color"}
    }))
    .expect("secret");
    env.secrets()
        .create(&Default::default(), &cloud)
        .await
        .expect("the credentials Secret");
    env.write_inputs_edited::<Tfm>("web-1", &module(0), &env.markers(), |inputs| {
        inputs.env.push(captf::api::types::EnvFromSecret {
            name: "TF_CLI_ARGS".into(),
            secret_key_ref: captf::api::types::SecretKeyRef {
                name: "cloud".into(),
                key: "args".into(),
            },
        });
    })
    .await;
    env.delete::<Tfm>("web-1").await;
    let msg = env
        .wait_deleting::<Tfm>("web-1", "DestroyCannotStart", long())
        .await;
    assert!(
        msg.contains("does not render")
            && msg.contains("TF_CLI_ARGS")
            && msg.contains("runbooks/DestroyCannotStart.md"),
        "{msg}"
    );
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(env.jobs_created(), 0, "no Job starts");
    assert!(env.exists::<Tfm>("web-1").await, "nothing is released");
    // The apply side fixes the inputs (the same resources, a module that fits).
    env.write_inputs::<Tfm>("web-1", &module(0), &env.markers())
        .await;
    env.wait_gone::<Tfm>("web-1", long()).await;
    assert!(env.destroyed("web-1"));
    env.shutdown().await;
}

/// The state Secret gets no protection finalizer while a Job of the object runs (Terraform
/// writes the state with the resourceVersion it read, and a finalizer added in between
/// fails that write); it gets it back once the Job has finished.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_state_secret_is_not_written_while_a_job_of_the_object_runs() {
    let env = machine_env("protect-running", 0, FAST).await;
    let state = names::state_secret_name("web-1.tfm");
    env.wait_protected(&state).await;
    env.reapply_slowly("web-1", 6).await;
    let active = || env.apply_job_active("web-1", 2);
    wait_for("the re-apply's Job to run", long(), active).await;
    // As after a restore, or a state Terraform wrote anew: no protection finalizer.
    let protected = || async {
        env.secrets()
            .get_metadata(&state)
            .await
            .expect("state Secret")
            .metadata
            .finalizers
            .unwrap_or_default()
            .contains(&names::PROTECT_FINALIZER.to_string())
    };
    let patch = serde_json::json!({"metadata": {"finalizers": null}});
    env.secrets()
        .patch(
            &state,
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(&patch),
        )
        .await
        .expect("strip the finalizer");
    // The change of the Secret and the Job's own changes trigger passes meanwhile.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(active().await, "the Job still runs");
    assert!(
        !protected().await,
        "no finalizer is added to the state Secret while a Job of the object runs"
    );
    wait_for("the finalizer back after the Job", long(), || async {
        !active().await && protected().await
    })
    .await;
    env.shutdown().await;
}

/// A pass that starts from a copy of the object cached before its release (the release's
/// own writes trigger the object again, and the cache can lag behind them) does nothing:
/// neither a second cleanup nor a hold as `StateLost` because the Secrets are gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_pass_on_a_copy_older_than_the_release_does_nothing() {
    let (env, ctx) = passes_by_hand("stale-copy").await;
    env.delete::<Tfm>("web-1").await;
    let stale = env
        .object::<Tfm>("web-1")
        .await
        .expect("the deleting object");
    let uid = stale.metadata.uid.clone().expect("uid");
    ctx.set_refusal(&uid, "a refusal remembered of the object");
    wait_for("the release, pass by pass", long(), || pass(&env, &ctx)).await;
    assert!(env.destroyed("web-1"));
    // The manager forgot what it remembered of the object: its backup's fingerprint (the
    // passes wrote the backup before the destroy) and its refusal.
    assert_eq!(
        ctx.backed_up(&uid),
        None,
        "the backup's fingerprint is forgotten"
    );
    assert_eq!(ctx.refusal(&uid), None, "the refusal is forgotten");
    let before = env.event_reasons("web-1").await;
    assert!(before.contains(&"CleanedUp".to_string()), "{before:?}");

    reconcile(Arc::new(stale), ctx.clone(), Lane::Ordinary)
        .await
        .expect("the pass on the stale copy");
    assert_eq!(
        env.event_reasons("web-1").await,
        before,
        "the pass on a copy older than the release published nothing"
    );
    env.shutdown().await;
}

/// The cleanup deletes the object's Secrets with one request by their owner labels, and
/// by name whatever that request did not delete: here the state Secret, whose owner labels
/// were removed after the destroy (as a state Secret restored by hand can lack them).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_cleanup_deletes_a_state_secret_without_the_owner_labels() {
    let (env, ctx) = passes_by_hand("unlabelled").await;
    destroy_by_hand(&env, &ctx).await;
    let state = names::state_secret_name("web-1.tfm");
    remove_labels(&env, &state, &[names::LABEL_OWNER_UID]).await;
    wait_for("the release, pass by pass", long(), || pass(&env, &ctx)).await;
    assert!(env.destroyed("web-1"));
    assert!(
        env.secrets().get_opt(&state).await.expect("read").is_none(),
        "the state Secret without the owner labels is deleted too"
    );
    let left: Vec<String> = env
        .secrets()
        .list(&Default::default())
        .await
        .expect("list")
        .items
        .iter()
        .map(|s| s.metadata.name.clone().unwrap_or_default())
        .filter(|n| n.contains("web-1"))
        .collect();
    assert!(left.is_empty(), "no Secret of web-1 is left: {left:?}");
    env.shutdown().await;
}

/// The cleanup pass writes its marker before its status, from a cached copy that can lack
/// the status an earlier pass wrote. That alone does not fail the pass: it cleans up and
/// releases at once. A copy that lacks a change of anything else still fails it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_cleanup_pass_on_a_copy_without_the_latest_status_releases() {
    use captf::io::writes;
    let (env, ctx) = passes_by_hand("past-status").await;
    destroy_by_hand(&env, &ctx).await;
    let api: Api<Tfm> = Api::namespaced(env.client.clone(), &env.ns);
    let stale = env.object::<Tfm>("web-1").await.expect("the object");
    let mark = |meta: &kube::api::ObjectMeta| {
        writes::annotation_ops(meta, &[("example.com/test", Some("x".into()))])
    };

    // Another annotation changed since the copy: the patch fails.
    let other = serde_json::json!({"metadata": {"annotations": {"example.com/other": "y"}}});
    let changed = api
        .patch(
            "web-1",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(&other),
        )
        .await
        .expect("annotate");
    let err = writes::guarded_patch_past_status(&api, &stale, mark)
        .await
        .expect_err("a copy without the annotation change is refused");
    assert!(err.is_conflict(), "{err}");

    // Only the status changed since the copy: the patch goes through, and so does the pass.
    let stale = changed;
    let status = serde_json::json!({"observedGeneration": 0, "conditions": []});
    writes::patch_status(&api, "web-1", status)
        .await
        .expect("a status write");
    reconcile(Arc::new(stale), ctx.clone(), Lane::Ordinary)
        .await
        .expect("the cleanup pass on the copy without the latest status");
    assert!(
        env.object::<Tfm>("web-1").await.is_none(),
        "released by that one pass"
    );
    assert!(env.destroyed("web-1"));
    env.shutdown().await;
}

/// clusterctl move strips the finalizers of an object marked `delete-for-move` before it
/// deletes it: a pass in between puts no finalizer back (it would hold the source copy for
/// ever). An object without the mark gets its finalizer.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn no_finalizer_is_put_back_on_an_object_marked_for_a_move() {
    let env = Env::builder("move-mark").start().await;
    let cluster_uid = env.create_cluster("prod").await;
    env.create_object::<Tfm>("web-1", "prod", &cluster_uid, &env.markers())
        .await;
    env.annotate::<Tfm>(
        "web-1",
        &[(names::CLUSTERCTL_DELETE_FOR_MOVE, Some(String::new()))],
    )
    .await;
    let ctx = hand_context(&env).await;
    let finalizers = || async {
        env.object::<Tfm>("web-1")
            .await
            .expect("the object")
            .metadata
            .finalizers
            .unwrap_or_default()
    };
    pass(&env, &ctx).await;
    assert!(
        finalizers().await.is_empty(),
        "no finalizer on the object being moved"
    );
    env.annotate::<Tfm>("web-1", &[(names::CLUSTERCTL_DELETE_FOR_MOVE, None)])
        .await;
    pass(&env, &ctx).await;
    assert_eq!(
        finalizers().await.len(),
        1,
        "the finalizer once the mark is gone"
    );
    env.shutdown().await;
}

/// A write of the namespace's runner RBAC, not of an object: the sweep removes it once no
/// object is left in the namespace, after the last release, at a moment of its own.
fn runner_rbac(w: &captf_faultproxy::requestlog::Write) -> bool {
    ["rolebindings", "roles", "serviceaccounts"].contains(&w.resource.as_str())
}

/// The write orders the action files state, as the API server carried them out (the
/// manager's requests go through the fault proxy, which logs its writes in order): a
/// destroy start writes the backup, then the attempt number on the object, then the
/// attempt's variables Secret, then its Job; the cleanup writes its marker on the object
/// before its first delete, and the release is the object's last write, after them all.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_manager_writes_in_the_order_its_actions_state() {
    use captf_faultproxy::requestlog::Write;
    let env = machine_env("order", 0, FAST).await;
    env.wait_protected(&names::state_secret_name("web-1.tfm"))
        .await;
    env.proxy.request_log().reset();
    env.delete::<Tfm>("web-1").await;
    env.wait_gone::<Tfm>("web-1", long()).await;
    assert!(env.destroyed("web-1"));
    let writes = writes_through_release(&env).await;
    let shown: Vec<String> = writes
        .iter()
        .map(|w| format!("{} {}/{} {}", w.verb, w.resource, w.subresource, w.name))
        .collect();
    let at = |what: &str, from: usize, test: &dyn Fn(&Write) -> bool| {
        writes
            .iter()
            .enumerate()
            .skip(from)
            .find(|(_, w)| test(w))
            .map(|(i, _)| i)
            .unwrap_or_else(|| panic!("no {what} in {shown:#?}"))
    };
    let object = |w: &Write| {
        w.verb == "patch"
            && w.resource == "terraformmachines"
            && w.subresource.is_empty()
            && w.name == "web-1"
    };
    let job = names::job_name("web-1.tfm", names::OPERATION_DESTROY, 1);
    let backup = names::backup_secret_name("web-1.tfm");
    let backup_at = at("the backup", 0, &|w| {
        w.verb == "create" && w.resource == "secrets" && w.name == backup
    });
    let attempt_at = at("the attempt number", 0, &object);
    let variables_at = at("the attempt's variables", 0, &|w| {
        w.verb == "create" && w.resource == "secrets" && w.name == job
    });
    let job_at = at("the Job", 0, &|w| {
        w.verb == "create" && w.resource == "jobs" && w.name == job
    });
    assert!(
        backup_at < attempt_at && attempt_at < variables_at && variables_at < job_at,
        "backup {backup_at}, attempt {attempt_at}, variables {variables_at}, Job {job_at}: {shown:#?}"
    );
    let marker_at = at("the cleanup marker", job_at + 1, &object);
    let deletes: Vec<usize> = writes
        .iter()
        .enumerate()
        .filter(|(_, w)| (w.verb == "delete" || w.verb == "deletecollection") && !runner_rbac(w))
        .map(|(i, _)| i)
        .collect();
    assert!(!deletes.is_empty(), "{shown:#?}");
    let release_at = writes.iter().rposition(object).expect("the release");
    assert!(
        deletes.iter().all(|d| marker_at < *d && *d < release_at),
        "marker {marker_at}, deletes {deletes:?}, release {release_at}: {shown:#?}"
    );
    env.shutdown().await;
}

/// The writes the proxy logged, once the release of `web-1` is among them: an object
/// patch after every delete. The log keeps the order in which answers passed the proxy,
/// and a reader of the API server can see the object gone before the answer to its
/// release has passed it.
async fn writes_through_release(env: &Env) -> Vec<captf_faultproxy::requestlog::Write> {
    let released = |writes: &[captf_faultproxy::requestlog::Write]| {
        // The runner's RBAC goes after the release, once no object of the namespace needs it.
        let last_delete = writes
            .iter()
            .rposition(|w| (w.verb == "delete" || w.verb == "deletecollection") && !runner_rbac(w));
        let object = |w: &&captf_faultproxy::requestlog::Write| {
            w.verb == "patch"
                && w.resource == "terraformmachines"
                && w.subresource.is_empty()
                && w.name == "web-1"
        };
        let last_object = writes.iter().rposition(|w| object(&w));
        match (last_delete, last_object) {
            (Some(d), Some(o)) => o > d,
            // Nothing deleted: the marker and the release.
            (None, Some(_)) => writes.iter().filter(object).count() >= 2,
            _ => false,
        }
    };
    wait_for("the release in the proxy's log", long(), || async {
        released(&env.proxy.request_log().writes_in_order())
    })
    .await;
    env.proxy.request_log().writes_in_order()
}

/// The abandon's write order (act/abandon.rs), as the API server carried it out: its
/// marker on the object before anything is deleted or let go, each kept Secret marked and
/// unprotected, and the release last.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_abandon_writes_its_marker_first_and_releases_last() {
    use captf_faultproxy::requestlog::Write;
    let env = machine_env("abandon-order", 100, FAST).await;
    env.delete::<Tfm>("web-1").await;
    env.wait_deleting::<Tfm>("web-1", "DestroyFailed", long())
        .await;
    env.proxy.request_log().reset();
    env.abandon::<Tfm>("web-1").await;
    env.wait_gone::<Tfm>("web-1", long()).await;
    let writes = writes_through_release(&env).await;
    let shown: Vec<String> = writes
        .iter()
        .map(|w| format!("{} {}/{} {}", w.verb, w.resource, w.subresource, w.name))
        .collect();
    let object = |w: &Write| {
        w.verb == "patch"
            && w.resource == "terraformmachines"
            && w.subresource.is_empty()
            && w.name == "web-1"
    };
    let marker_at = writes
        .iter()
        .position(object)
        .unwrap_or_else(|| panic!("no marker in {shown:#?}"));
    let release_at = writes
        .iter()
        .rposition(object)
        .unwrap_or_else(|| panic!("no release in {shown:#?}"));
    let state = names::state_secret_name("web-1.tfm");
    let kept_at = writes
        .iter()
        .position(|w| w.verb == "patch" && w.resource == "secrets" && w.name == state)
        .unwrap_or_else(|| panic!("the state Secret not marked abandoned in {shown:#?}"));
    let lets_go: Vec<usize> = writes
        .iter()
        .enumerate()
        .filter(|(_, w)| {
            (w.verb.starts_with("delete") && !runner_rbac(w))
                || (w.verb == "patch" && w.resource == "secrets")
        })
        .map(|(i, _)| i)
        .collect();
    assert!(
        marker_at < release_at
            && lets_go.iter().all(|i| marker_at < *i && *i < release_at)
            && kept_at < release_at,
        "marker {marker_at}, deletes and Secret marks {lets_go:?}, release {release_at}: {shown:#?}"
    );
    assert!(!env.destroyed("web-1"));
    env.shutdown().await;
}

/// With the manager's caches: an inputs Secret that carries no owner label (made by hand)
/// is not in the cache of the object's Secrets, and the cleanup reads it by name and
/// deletes it all the same.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_cleanup_deletes_an_inputs_secret_without_owner_labels() {
    let env = machine_env("unlabelled-inputs", 0, FAST).await;
    let inputs = names::inputs_secret_name("web-1.tfm");
    remove_labels(
        &env,
        &inputs,
        &[
            names::LABEL_OWNER_KIND,
            names::LABEL_OWNER_NAME,
            names::LABEL_OWNER_UID,
        ],
    )
    .await;
    env.delete::<Tfm>("web-1").await;
    env.wait_gone::<Tfm>("web-1", long()).await;
    assert!(env.destroyed("web-1"));
    assert!(
        !env.secret_exists(&inputs).await,
        "the inputs Secret without owner labels is deleted too"
    );
    env.shutdown().await;
}

/// Removes `labels` from Secret `name` (as a Secret made or restored by hand lacks them).
async fn remove_labels(env: &Env, name: &str, labels: &[&str]) {
    let nulls: serde_json::Map<String, serde_json::Value> = labels
        .iter()
        .map(|l| (l.to_string(), serde_json::Value::Null))
        .collect();
    let patch = serde_json::json!({"metadata": {"labels": nulls}});
    env.secrets()
        .patch(
            name,
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(&patch),
        )
        .await
        .unwrap_or_else(|e| panic!("remove {labels:?} from Secret {name}: {e}"));
}

/// What the manager remembers of a TerraformCluster's hand-off goes with the cluster.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_released_clusters_hand_off_is_forgotten() {
    let env = Env::builder("forget-handoff").start().await;
    let ctx = hand_context(&env).await;
    let key = |name: &str| format!("{}/{name}", env.ns);
    for name in ["prod", "other"] {
        ctx.handoffs
            .lock()
            .expect("handoffs")
            .insert(key(name), ("1".into(), serde_json::json!({"subnet": name})));
    }
    ctx.forget(Kind::TerraformMachine, &env.ns, "prod", "uid-of-a-machine");
    assert!(
        ctx.handoffs
            .lock()
            .expect("handoffs")
            .contains_key(&key("prod"))
    );
    ctx.forget(Kind::TerraformCluster, &env.ns, "prod", "uid-of-prod");
    let left = ctx.handoffs.lock().expect("handoffs").clone();
    assert!(!left.contains_key(&key("prod")), "{left:?}");
    assert!(left.contains_key(&key("other")), "{left:?}");
    env.shutdown().await;
}

/// A deletion takes Terraform's lock Lease from the manager's cache of locks, not from the
/// API server: the Lease the apply's Terraform left (free, labelled by its backend) is
/// read by no pass of the manager, and the cleanup still deletes it, as it was read.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_deletion_takes_terraforms_lock_from_the_managers_cache() {
    let (env, lock_requests) = delete_with_the_lock_cached("lock-cache", false).await;
    assert_eq!(
        lock_requests,
        (0, 1),
        "no read of the lock by the manager, one delete"
    );
    env.shutdown().await;
}

/// The cleanup deletes a free lock only as it was read; when the Lease changed since (the
/// cache a version behind Terraform's unlock: here, the API server answers the delete
/// 409), the Lease is read live and judged once more in the same pass.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_lock_that_changed_since_it_was_cached_is_read_again_before_its_delete() {
    let (env, lock_requests) = delete_with_the_lock_cached("lock-stale", true).await;
    assert_eq!(
        lock_requests,
        (1, 2),
        "one read after the refused delete, and the delete again"
    );
    env.shutdown().await;
}

/// A machine applied, then deleted and waited for (with the cleanup's first delete of the
/// lock refused as stale when `stale`): the manager's GETs and DELETEs of Leases during
/// the deletion. Everything of the object is gone, the lock with it.
async fn delete_with_the_lock_cached(tag: &str, stale: bool) -> (Env, (u64, u64)) {
    let env = machine_with(tag, &module(0)).await;
    let lock = names::lock_lease_name("web-1.tfm");
    let leases: Api<k8s_openapi::api::coordination::v1::Lease> =
        Api::namespaced(env.client.clone(), &env.ns);
    assert!(
        leases.get_opt(&lock).await.expect("lease").is_some(),
        "the apply's Terraform left its lock Lease"
    );
    let log = env.proxy.request_log();
    log.reset();
    if stale {
        env.proxy
            .faults()
            .fail_next(1, Some("delete"), Some("leases"), 409);
    }
    env.delete::<Tfm>("web-1").await;
    env.wait_gone::<Tfm>("web-1", long()).await;
    assert!(env.destroyed("web-1"));
    let manager = |verb: &str| -> u64 {
        log.snapshot_by_client()
            .iter()
            .filter(|((client, v, resource, _), _)| {
                // The manager's client here sends no User-Agent; a runner's Terraform
                // would send its own.
                (client == "-" || client.contains("(manager)")) && v == verb && resource == "leases"
            })
            .map(|(_, n)| n)
            .sum()
    };
    let requests = (manager("get"), manager("delete"));
    env.assert_nothing_left(Kind::TerraformMachine, "web-1")
        .await;
    (env, requests)
}
