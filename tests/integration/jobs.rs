//! Destroy Jobs on a real cluster: one at a time whatever became of earlier objects of the
//! same name, and Terraform's lock cleared only when its holder is provably gone, never
//! when someone else holds it.

use std::time::Duration;

use captf::api::names::{self, Kind};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::coordination::v1::Lease;
use kube::api::{Api, ListParams, PostParams};
use serde_json::json;

use crate::steps::{destroy_by_hand, pass, passes_by_hand};
use crate::support::*;

const FAST: Duration = Duration::from_millis(300);

/// The owner labels of a TerraformMachine `name` with uid `uid`, for a destroy of attempt 1.
fn destroy_labels(name: &str, uid: &str) -> serde_json::Value {
    json!({
        names::LABEL_OWNER_KIND: "TerraformMachine",
        names::LABEL_OWNER_NAME: captf::api::labels::name_label_value(name),
        names::LABEL_OWNER_UID: uid,
        names::LABEL_OPERATION: names::OPERATION_DESTROY,
        names::LABEL_ATTEMPT: "1",
    })
}

/// The docs/08 flow: an object's finalizer was stripped while its destroy ran, and the
/// object was made again from its saved YAML. The earlier object's destroy Job still runs
/// against the same state: the new object's deletion waits for it, naming it, and starts
/// no destroy of its own until it has finished.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_earlier_objects_running_destroy_is_waited_for_not_raced() {
    let env = Env::builder("earlier")
        .backoff(FAST, FAST * 4)
        .with_machine("web-1", &module(0))
        .start()
        .await;
    let uid = env
        .object::<Tfm>("web-1")
        .await
        .and_then(|o| o.metadata.uid)
        .expect("uid");
    let job_name = names::job_name("web-1.tfm", names::OPERATION_DESTROY, 1);
    let labels = destroy_labels("web-1", "uid-of-the-earlier-web-1");
    let job: Job = serde_json::from_value(json!({
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": job_name, "namespace": env.ns, "labels": labels},
        "spec": {"backoffLimit": 0, "template": {"metadata": {"labels": labels}, "spec": {
            "restartPolicy": "Never",
            "containers": [{"name": "terraform", "image": "hashicorp/terraform:1.11.4", "command": ["sleep", "8"]}]}}}
    }))
    .expect("job");
    let jobs: Api<Job> = Api::namespaced(env.client.clone(), &env.ns);
    jobs.create(&PostParams::default(), &job)
        .await
        .expect("the earlier object's destroy Job");
    env.delete::<Tfm>("web-1").await;
    let msg = env
        .wait_deleting::<Tfm>("web-1", "WaitingForJob", long())
        .await;
    assert!(
        msg.contains(&format!(
            "destroy Job {job_name} (of an earlier TerraformMachine web-1)"
        )),
        "{msg}"
    );
    // While it runs, no destroy of this object's starts.
    let own = ListParams::default().labels(&format!(
        "{}={uid},{}={}",
        names::LABEL_OWNER_UID,
        names::LABEL_OPERATION,
        names::OPERATION_DESTROY
    ));
    let earlier_done = || async {
        jobs.get(&job_name).await.ok().is_some_and(|j| {
            j.status
                .and_then(|s| s.conditions)
                .unwrap_or_default()
                .iter()
                .any(|c| c.type_ == "Complete" && c.status == "True")
        })
    };
    while !earlier_done().await {
        assert!(
            jobs.list(&own).await.expect("jobs").items.is_empty(),
            "a destroy of this object started while the earlier one ran"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    env.wait_gone::<Tfm>("web-1", long()).await;
    assert!(env.destroyed("web-1"));
    assert_eq!(env.tries("web-1"), 1, "one destroy ran the provisioners");
    env.shutdown().await;
}

/// A runner killed while it held Terraform's lock (here OOMKilled, as with a memory
/// limit) leaves the lock behind and its Pod `Failed`. With a name long enough that the
/// API server cuts the Pod's name (a 50-character object name, as Cluster API's machine
/// names are), the next attempt still knows the lock as its own runner's, clears it and
/// finishes the destroy.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_lock_of_an_oomkilled_runner_is_cleared_and_the_next_attempt_runs() {
    if envtest_only("it OOM-kills the runner with the local kubelet's test control") {
        return;
    }
    let name = "md-0-workers-5d8f7c9b4f-x2x5k-machine-template-abc1";
    assert_eq!(name.len(), 51);
    let mut env = Env::builder("oom-lock")
        .backoff(Duration::from_secs(1), Duration::from_secs(4))
        .start()
        .await;
    let label_name = captf::api::labels::name_label_value(name);
    env.kubelet_fault(
        "oom",
        &[
            (names::LABEL_OWNER_NAME, &label_name),
            (names::LABEL_OPERATION, names::OPERATION_DESTROY),
            (names::LABEL_ATTEMPT, "1"),
        ],
        KubeletFault::OomKilled,
        5.0,
    )
    .await;
    env.add_machine(name, &sleepy_module(60)).await;
    env.delete::<Tfm>(name).await;
    env.wait_gone::<Tfm>(name, long()).await;
    assert!(env.destroyed(name));
    assert_eq!(
        env.tries(name),
        2,
        "killed once, then the next attempt finished"
    );
    // The lock went with the cleanup, and everything else of the object.
    env.assert_nothing_left(Kind::TerraformMachine, name).await;
    env.clear_kubelet_fault("oom").await;
    env.shutdown().await;
}

/// A lock held by someone else (a person running Terraform by hand, a CI job) is never
/// broken, whatever the step: here it is taken after the destroy, and the cleanup that
/// releases the object leaves it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_lock_held_by_a_person_outlives_the_cleanup() {
    let (env, ctx) = passes_by_hand("foreign-lock").await;
    destroy_by_hand(&env, &ctx).await;
    // Alice locks the state by hand.
    let lock_name = names::lock_lease_name("web-1.tfm");
    let leases: Api<Lease> = Api::namespaced(env.client.clone(), &env.ns);
    let info = json!({"ID": "alice-1", "Operation": "OperationTypePlan", "Who": "alice@laptop",
        "Version": "1.11.4", "Created": "2026-12-01T10:00:00Z", "Path": ""});
    env.take_lock("web-1.tfm", "alice-1", &info).await;
    wait_for("the release, pass by pass", long(), || pass(&env, &ctx)).await;
    let lease = leases
        .get_opt(&lock_name)
        .await
        .expect("lease")
        .expect("Alice's lock is still there");
    assert_eq!(
        lease.spec.and_then(|s| s.holder_identity).as_deref(),
        Some("alice-1")
    );
    env.shutdown().await;
}

/// The finalizer stripped by hand while the destroy runs (docs/08): the object is gone at
/// once, its runner still runs and must write its state at the end. The runner RBAC stays
/// until that runner has finished; then the sweep removes it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_rbac_sweep_waits_for_a_runner_whose_object_is_gone() {
    let env = Env::builder("sweep-runner")
        .backoff(FAST, FAST * 4)
        .with_machine("web-1", &sleepy_module(8))
        .start()
        .await;
    env.delete::<Tfm>("web-1").await;
    wait_for("the destroy provisioner", long(), || async {
        env.destroy_provisioner_started("web-1").await
    })
    .await;
    env.api::<Tfm>()
        .patch(
            "web-1",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(json!({"metadata": {"finalizers": null}})),
        )
        .await
        .expect("strip the finalizer");
    env.wait_gone::<Tfm>("web-1", long()).await;
    let sas: Api<k8s_openapi::api::core::v1::ServiceAccount> =
        Api::namespaced(env.client.clone(), &env.ns);
    // The sweep runs every 0.5 s here; the runner has seconds left.
    let job = names::job_name("web-1.tfm", names::OPERATION_DESTROY, 1);
    let jobs: Api<Job> = Api::namespaced(env.client.clone(), &env.ns);
    let finished = || async {
        jobs.get(&job).await.ok().is_some_and(|j| {
            j.status
                .and_then(|s| s.conditions)
                .unwrap_or_default()
                .iter()
                .any(|c| (c.type_ == "Complete" || c.type_ == "Failed") && c.status == "True")
        })
    };
    while !finished().await {
        assert!(
            sas.get_opt(names::RUNNER_NAME)
                .await
                .expect("get")
                .is_some(),
            "the runner RBAC was removed while its runner ran"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let done = jobs.get(&job).await.expect("the Job");
    assert!(
        done.status
            .and_then(|s| s.conditions)
            .unwrap_or_default()
            .iter()
            .any(|c| c.type_ == "Complete" && c.status == "True"),
        "the runner finished its destroy and saved its state"
    );
    assert!(env.destroyed("web-1"));
    wait_for("the sweep to remove the runner RBAC", long(), || async {
        sas.get_opt(names::RUNNER_NAME)
            .await
            .expect("get")
            .is_none()
    })
    .await;
    env.shutdown().await;
}

/// An admission policy refuses the destroy Job (as Kyverno, Gatekeeper or a quota would):
/// within seconds the deletion says so, with the API's message, as row 9
/// `DestroyCannotStart` instead of "attempt 1 is starting", and keeps saying so while the
/// manager tries again; once the policy is gone the destroy runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_refused_destroy_job_is_named_and_started_once_allowed() {
    let (env, refusal) = refused_destroys("refused").await;
    env.delete::<Tfm>("web-1").await;
    let msg = env
        .wait_deleting::<Tfm>("web-1", "DestroyCannotStart", Duration::from_secs(60))
        .await;
    assert!(
        msg.contains("the API server refused what the destroy needs")
            && msg.contains("destroy Jobs need the platform team's approval")
            && msg.contains("runbooks/DestroyCannotStart.md"),
        "{msg}"
    );
    // It stays so across the manager's tries, with no Job.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let (_, reason, _) = env
        .condition::<Tfm>("web-1", "Deleting")
        .await
        .expect("Deleting");
    assert_eq!(reason, "DestroyCannotStart");
    assert!(env.destroy_jobs().await.is_empty());
    assert!(
        env.event_reasons("web-1")
            .await
            .iter()
            .any(|r| r == "DestroyCannotStart"),
        "a Warning Event names the refusal"
    );

    refusal.remove(&env.client).await;
    env.wait_gone::<Tfm>("web-1", long()).await;
    assert!(env.destroyed("web-1"));
    env.shutdown().await;
}

/// A machine `web-1` applied, the manager running, and destroy Jobs refused in the
/// test's namespace by an admission policy (remove it with the [`Refusal`]).
async fn refused_destroys(tag: &str) -> (Env, Refusal) {
    let env = Env::builder(tag)
        .backoff(FAST, FAST * 4)
        .with_machine("web-1", &module(0))
        .start()
        .await;
    let refusal = env
        .refuse_jobs(
            &[(names::LABEL_OPERATION, names::OPERATION_DESTROY)],
            "destroy Jobs need the platform team's approval",
        )
        .await;
    (env, refusal)
}

/// A refused destroy start is row 9: the abandon annotation releases the object without
/// a destroy, its state and inputs kept, and no Job is made in the meantime.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_refused_destroy_start_is_released_by_the_abandon_annotation() {
    let (env, refusal) = refused_destroys("refused-abandon").await;
    env.delete::<Tfm>("web-1").await;
    env.wait_deleting::<Tfm>("web-1", "DestroyCannotStart", Duration::from_secs(60))
        .await;
    env.abandon::<Tfm>("web-1").await;
    env.wait_gone::<Tfm>("web-1", long()).await;
    assert!(!env.destroyed("web-1"), "abandoned, not destroyed");
    assert!(
        env.destroy_jobs().await.is_empty(),
        "no destroy Job was made"
    );
    let state = names::state_secret_name(&names::state_suffix(Kind::TerraformMachine, "web-1"));
    assert!(
        env.secrets().get_opt(&state).await.expect("get").is_some(),
        "the state is kept"
    );
    refusal.remove(&env.client).await;
    env.shutdown().await;
}

/// The destroy Job is created but its Pods are refused (PodSecurity, a LimitRange, a quota
/// that needs limits, a policy engine): WaitingForJob says why, from the Job's
/// `FailedCreate` Events, instead of waiting silently until the deadline.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_destroy_job_whose_pods_are_refused_says_why() {
    let env = Env::builder("podrefused")
        .backoff(FAST, FAST * 4)
        .with_machine("web-1", &module(0))
        .start()
        .await;
    let refusal = env
        .refuse_pods(
            &[(names::LABEL_OPERATION, names::OPERATION_DESTROY)],
            "runner Pods need a memory limit",
        )
        .await;
    env.delete::<Tfm>("web-1").await;
    wait_for(
        "WaitingForJob naming the refusal of the Pod",
        Duration::from_secs(60),
        || async {
            env.condition::<Tfm>("web-1", "Deleting")
                .await
                .is_some_and(|(_, r, m)| {
                    r == "WaitingForJob"
                        && m.contains("its Pod cannot be created")
                        && m.contains("runner Pods need a memory limit")
                })
        },
    )
    .await;
    refusal.remove(&env.client).await;
    env.wait_gone::<Tfm>("web-1", long()).await;
    assert!(env.destroyed("web-1"));
    env.shutdown().await;
}

/// A runner evicted while it ran (a drain, node pressure, a preemption) is not a failed
/// attempt: the Job makes a new Pod once the old one has stopped, that Pod breaks the
/// lock the killed Terraform left (it was this Job's), and the destroy finishes in the
/// same attempt. The eviction's `SIGKILL` leaves the lock held, as a node-pressure
/// eviction does.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_evicted_runner_is_replaced_within_the_same_attempt() {
    if envtest_only("it evicts the runner with the local kubelet's test control") {
        return;
    }
    let mut env = Env::builder("evicted")
        .backoff(Duration::from_millis(300), Duration::from_millis(1200))
        .start()
        .await;
    env.kubelet_fault(
        "evict",
        &[
            (names::LABEL_OWNER_NAME, "web-1"),
            (names::LABEL_OPERATION, "destroy"),
        ],
        KubeletFault::Evicted,
        4.0,
    )
    .await;
    env.add_machine("web-1", &sleepy_module(60)).await;
    env.delete::<Tfm>("web-1").await;
    // The first Pod is evicted; the rule goes before the replacement has run as long.
    let pods: Api<k8s_openapi::api::core::v1::Pod> = Api::namespaced(env.client.clone(), &env.ns);
    wait_for("the runner Pod evicted", long(), || async {
        pods.list(&ListParams::default())
            .await
            .expect("pods")
            .items
            .iter()
            .any(|p| p.status.as_ref().and_then(|s| s.reason.as_deref()) == Some("Evicted"))
    })
    .await;
    env.clear_kubelet_fault("evict").await;
    env.wait_gone::<Tfm>("web-1", long()).await;
    assert!(env.destroyed("web-1"));
    assert_eq!(
        env.tries("web-1"),
        2,
        "the evicted run, then its replacement"
    );
    assert_eq!(env.destroy_jobs_created(), 1, "one attempt, one Job");
    assert!(
        !env.event_reasons("web-1")
            .await
            .contains(&"DestroyFailed".to_string()),
        "an eviction is not a failed attempt"
    );
    env.shutdown().await;
}

/// An OOM-killed runner is named as such in the failure, with its memory limit.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_oom_killed_runner_is_named_in_the_condition() {
    if envtest_only("it OOM-kills the runner with the local kubelet's test control") {
        return;
    }
    let mut env = Env::builder("oom-named")
        .backoff(Duration::from_secs(60), Duration::from_secs(240))
        .start()
        .await;
    // The destroy's first attempt only: the apply's Pod is attempt 1 too, and an apply
    // that ran past 3 s on a loaded machine was killed and waited out the 60 s backoff.
    env.kubelet_fault(
        "oom",
        &[
            (names::LABEL_OWNER_NAME, "web-1"),
            (names::LABEL_OPERATION, names::OPERATION_DESTROY),
            (names::LABEL_ATTEMPT, "1"),
        ],
        KubeletFault::OomKilled,
        3.0,
    )
    .await;
    // A slow backoff, so that the failure stays on show.
    env.add_machine("web-1", &sleepy_module(60)).await;
    env.delete::<Tfm>("web-1").await;
    let msg = env
        .wait_deleting::<Tfm>("web-1", "DestroyFailed", long())
        .await;
    assert!(
        msg.contains("OOMKilled") && msg.contains("raise resources.limits.memory"),
        "{msg}"
    );
    env.clear_kubelet_fault("oom").await;
    env.shutdown().await;
}

/// The resolved variables reach Terraform through the attempt's own Secret: no field of
/// the Job or its Pod (which anyone who may read Pods can read) holds a variable's value.
/// The Secret goes with the cleanup.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn no_job_or_pod_field_holds_a_variables_value() {
    let env = Env::builder("no-vars")
        .backoff(Duration::from_millis(300), Duration::from_millis(1200))
        .with_machine("web-1", &sleepy_module(4))
        .start()
        .await;
    // The module's `marker_dir` variable: a value only the variables carry.
    let value = env.markers().display().to_string();
    env.delete::<Tfm>("web-1").await;
    let pods: Api<k8s_openapi::api::core::v1::Pod> = Api::namespaced(env.client.clone(), &env.ns);
    let jobs: Api<Job> = Api::namespaced(env.client.clone(), &env.ns);
    wait_for("the runner Pod", long(), || async {
        !pods
            .list(&ListParams::default().labels(names::LABEL_OPERATION))
            .await
            .expect("pods")
            .items
            .is_empty()
    })
    .await;
    let job_list = jobs
        .list(&ListParams::default().labels(names::LABEL_OPERATION))
        .await
        .expect("jobs");
    let pod_list = pods
        .list(&ListParams::default().labels(names::LABEL_OPERATION))
        .await
        .expect("pods");
    assert!(!job_list.items.is_empty() && !pod_list.items.is_empty());
    for text in [
        serde_json::to_string(&job_list).expect("json"),
        serde_json::to_string(&pod_list).expect("json"),
    ] {
        assert!(!text.contains(&value), "a variable's value in {text}");
    }
    // The attempt's Secret holds them, and goes with the cleanup.
    let job_name = job_list.items[0].metadata.name.clone().expect("name");
    let files = env.attempt_files(&job_name).await;
    assert!(
        files
            .get("terraform.tfvars.json")
            .is_some_and(|v| v.contains(&value)),
        "the variables are in the attempt's Secret: {files:?}"
    );
    env.wait_gone::<Tfm>("web-1", long()).await;
    assert!(env.destroyed("web-1"), "Terraform had the variables");
    assert!(
        !env.secret_exists(&job_name).await,
        "the variables do not outlive the object"
    );
    env.shutdown().await;
}

/// A runner Pod on a node that is lost stays terminating once deleted (the kubelet never
/// confirms it stopped), and its Job waits for it: the message names the Pod, its node
/// and the node's state, and points to the runbook on when a force delete is safe.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_runner_pod_stuck_on_a_lost_node_is_named() {
    if envtest_only("it loses the runner's node with the local kubelet's test control") {
        return;
    }
    let mut env = Env::builder("lost-node")
        .backoff(Duration::from_millis(300), Duration::from_millis(1200))
        .start()
        .await;
    env.kubelet_fault(
        "lost",
        &[
            (names::LABEL_OWNER_NAME, "web-1"),
            (names::LABEL_OPERATION, "destroy"),
        ],
        KubeletFault::LostNode,
        2.0,
    )
    .await;
    env.add_machine("web-1", &sleepy_module(120)).await;
    env.delete::<Tfm>("web-1").await;
    let pods: Api<k8s_openapi::api::core::v1::Pod> = Api::namespaced(env.client.clone(), &env.ns);
    let lp = ListParams::default().labels(&format!(
        "{}={}",
        names::LABEL_OPERATION,
        names::OPERATION_DESTROY
    ));
    wait_for("the runner Pod", long(), || async {
        !pods.list(&lp).await.expect("pods").items.is_empty()
    })
    .await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    // A drain deletes it; the lost node never confirms.
    let pod = pods.list(&lp).await.expect("pods").items.remove(0);
    let pod_name = pod.metadata.name.clone().expect("name");
    pods.delete(
        &pod_name,
        &kube::api::DeleteParams {
            grace_period_seconds: Some(1),
            ..Default::default()
        },
    )
    .await
    .expect("delete the Pod");
    let expected = format!(
        "its Pod {pod_name} is still terminating past its grace period on node {ENVTEST_NODE} (Ready="
    );
    wait_for("the stuck Pod named", long(), || async {
        env.condition::<Tfm>("web-1", "Deleting")
            .await
            .is_some_and(|(_, r, m)| {
                r == "WaitingForJob"
                    && m.contains(&expected)
                    && m.contains("runbooks/WaitingForJob.md")
            })
    })
    .await;
    // The runbook's last step, once the node is known to be gone.
    pods.delete(
        &pod_name,
        &kube::api::DeleteParams {
            grace_period_seconds: Some(0),
            ..Default::default()
        },
    )
    .await
    .expect("force delete");
    env.clear_kubelet_fault("lost").await;
    env.shutdown().await;
}
