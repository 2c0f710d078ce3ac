//! Tests of the local Job runner (Job controller + kubelet stand-in), over plain HTTP.

mod common;

use std::time::{Duration, Instant};

use captf_testserver::{JobRunner, JobRunnerOptions, TestServer};
use common::*;
use serde_json::{Value, json};

const T: Duration = Duration::from_secs(10);

fn job(name: &str, script: &str, extra_spec: Value, pod_extra: Value) -> Value {
    let mut j = json!({"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name},
        "spec": {"backoffLimit": 0, "template": {"metadata": {"labels": {"app": "t"}},
            "spec": {"restartPolicy": "Never", "containers": [{"name": "run", "image": "none", "command": ["sh", "-c", script]}]}}}});
    if let Some(m) = extra_spec.as_object() {
        for (k, v) in m {
            j["spec"][k] = v.clone();
        }
    }
    if let Some(m) = pod_extra.as_object() {
        for (k, v) in m {
            j["spec"]["template"]["spec"][k] = v.clone();
        }
    }
    j
}

async fn setup(grace: Option<Duration>) -> (TestServer, JobRunner, std::path::PathBuf) {
    let srv = TestServer::start().await;
    let work = std::env::temp_dir().join(format!(
        "captf-jobs-test-{}-{}",
        std::process::id(),
        srv.url().rsplit(':').next().unwrap_or("0")
    ));
    let runner = JobRunner::start(
        &srv,
        JobRunnerOptions {
            work_root: work.clone(),
            termination_grace_override: grace,
            ..Default::default()
        },
    );
    (srv, runner, work)
}

fn cond_types(job: &Value) -> Vec<String> {
    job["status"]["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|c| c["type"].as_str().unwrap_or("").to_string())
        .collect()
}

async fn wait_job<F: Fn(&Value) -> bool>(srv: &TestServer, name: &str, f: F) -> Value {
    let store = srv.store();
    eventually(T, || {
        store
            .get("batch/v1", "jobs", Some("default"), name)
            .filter(|j| f(j))
    })
    .await
    .unwrap_or_else(|| {
        panic!(
            "job {name} never reached the state; now: {:?}",
            store.get("batch/v1", "jobs", Some("default"), name)
        )
    })
}

fn job_pods(srv: &TestServer, job: &str) -> Vec<Value> {
    srv.store()
        .list("v1", "pods", Some("default"))
        .into_iter()
        .filter(|p| p["metadata"]["labels"]["job-name"] == job)
        .collect()
}

#[tokio::test]
async fn failing_job_gets_failure_conditions_and_log() {
    let (srv, runner, work) = setup(None).await;
    let u = srv.url();
    let mut w = Watch::open(&u, "/apis/batch/v1/namespaces/default/jobs?watch=1").await;
    assert_eq!(
        post(
            &u,
            "/apis/batch/v1/namespaces/default/jobs",
            &job(
                "fail",
                "echo hi; echo oops >&2; exit 3",
                json!({}),
                json!({})
            )
        )
        .await
        .status,
        201
    );
    let j = wait_job(&srv, "fail", |j| {
        cond_types(j).contains(&"Failed".to_string())
    })
    .await;
    assert_eq!(cond_types(&j), ["FailureTarget", "Failed"]);
    let failed = &j["status"]["conditions"][1];
    assert_eq!(
        (failed["reason"].clone(), failed["status"].clone()),
        (json!("BackoffLimitExceeded"), json!("True"))
    );
    assert_eq!(
        (j["status"]["failed"].clone(), j["status"]["active"].clone()),
        (json!(1), json!(0))
    );
    assert!(j["status"]["startTime"].is_string());
    // FailureTarget was written on its own before Failed
    let mut saw_target_only = false;
    while let Some(e) = w.next(Duration::from_millis(300)).await {
        let t = cond_types(&e["object"]);
        saw_target_only |= t == ["FailureTarget"];
    }
    assert!(saw_target_only);
    let pods = job_pods(&srv, "fail");
    assert_eq!(pods.len(), 1);
    let pod = &pods[0];
    let name = pod["metadata"]["name"].as_str().expect("name");
    assert!(name.starts_with("fail-") && name.len() == 10);
    assert_eq!(pod["metadata"]["labels"]["app"], "t");
    assert_eq!(
        pod["metadata"]["labels"]["batch.kubernetes.io/job-name"],
        "fail"
    );
    assert_eq!(
        pod["metadata"]["labels"]["controller-uid"],
        j["metadata"]["uid"]
    );
    assert_eq!(pod["metadata"]["ownerReferences"][0]["controller"], true);
    assert_eq!(
        pod["metadata"]["ownerReferences"][0]["blockOwnerDeletion"],
        true
    );
    assert_eq!(pod["status"]["phase"], "Failed");
    let term = &pod["status"]["containerStatuses"][0]["state"]["terminated"];
    assert_eq!(
        (term["exitCode"].clone(), term["reason"].clone()),
        (json!(3), json!("Error"))
    );
    let log = get(
        &u,
        &format!("/api/v1/namespaces/default/pods/{name}/log?container=run"),
    )
    .await;
    assert_eq!(log.status, 200);
    assert_eq!(log.text(), "hi\noops\n");
    assert_eq!(
        get(
            &u,
            &format!("/api/v1/namespaces/default/pods/{name}/log?tailLines=1")
        )
        .await
        .text(),
        "oops\n"
    );
    runner.stop().await;
    srv.shutdown().await;
    let _ = std::fs::remove_dir_all(work);
}

#[tokio::test]
async fn successful_job_env_volumes_and_termination_message() {
    let (srv, runner, work) = setup(None).await;
    let u = srv.url();
    post(
        &u,
        "/api/v1/namespaces/default/secrets",
        &json!({"metadata": {"name": "creds"},
        "data": {"token": "czNjcjN0", "main.tf": "dGVycmFmb3Jt"}}),
    )
    .await;
    let script = "set -e; test \"$TOKEN\" = s3cr3t; cat /workspace/module/main.tf > /workspace/out; \
        test \"$(cat /info/cluster)\" = c1; test \"$POD\" = \"$HOSTNAME\"; test \"$REF\" = \"x-$TOKEN\"; \
        test \"$(pwd)\" = \"$WS\"; echo -n done > /dev/termination-log; echo \"$KUBE_CONFIG_PATH\"";
    let pod_extra = json!({
        "volumes": [{"name": "mod", "secret": {"secretName": "creds", "items": [{"key": "main.tf", "path": "main.tf"}]}},
            {"name": "ws", "emptyDir": {}},
            {"name": "info", "downwardAPI": {"items": [{"path": "cluster", "fieldRef": {"fieldPath": "metadata.annotations['captf/cluster']"}}]}}],
        "serviceAccountName": "does-not-exist",
    });
    let mut j = job("ok", script, json!({}), pod_extra);
    j["spec"]["template"]["metadata"]["annotations"] = json!({"captf/cluster": "c1"});
    j["spec"]["template"]["spec"]["containers"][0]["volumeMounts"] = json!([
        {"name": "ws", "mountPath": "/workspace"}, {"name": "mod", "mountPath": "/workspace/module"}, {"name": "info", "mountPath": "/info"}]);
    j["spec"]["template"]["spec"]["containers"][0]["workingDir"] = json!("/workspace");
    j["spec"]["template"]["spec"]["containers"][0]["env"] = json!([
        {"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "creds", "key": "token"}}},
        {"name": "POD", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        {"name": "REF", "value": "x-$(TOKEN)"},
        {"name": "WS", "value": "/workspace"}]);
    post(&u, "/apis/batch/v1/namespaces/default/jobs", &j).await;
    let j = wait_job(&srv, "ok", |j| {
        cond_types(j).contains(&"Complete".to_string())
    })
    .await;
    assert_eq!(cond_types(&j), ["SuccessCriteriaMet", "Complete"]);
    assert_eq!(
        (
            j["status"]["succeeded"].clone(),
            j["status"]["active"].clone()
        ),
        (json!(1), json!(0))
    );
    assert!(j["status"]["completionTime"].is_string());
    let pod = job_pods(&srv, "ok").pop().expect("pod");
    assert_eq!(pod["status"]["phase"], "Succeeded");
    let term = &pod["status"]["containerStatuses"][0]["state"]["terminated"];
    assert_eq!(
        (
            term["exitCode"].clone(),
            term["reason"].clone(),
            term["message"].clone()
        ),
        (json!(0), json!("Completed"), json!("done"))
    );
    let log = get(
        &u,
        &format!(
            "/api/v1/namespaces/default/pods/{}/log",
            pod["metadata"]["name"].as_str().unwrap_or("")
        ),
    )
    .await
    .text();
    assert_eq!(log.trim(), srv.kubeconfig_path().to_string_lossy());
    let out = work
        .join(pod["metadata"]["uid"].as_str().unwrap_or(""))
        .join("volumes/ws/out");
    assert_eq!(
        std::fs::read_to_string(out).expect("written through the rewritten mount"),
        "terraform"
    );
    runner.stop().await;
    srv.shutdown().await;
    let _ = std::fs::remove_dir_all(work);
}

#[tokio::test]
async fn deadline_exceeded_terminates_the_process() {
    let (srv, runner, work) = setup(Some(Duration::from_millis(300))).await;
    let u = srv.url();
    let started = Instant::now();
    post(
        &u,
        "/apis/batch/v1/namespaces/default/jobs",
        &job(
            "slow",
            "sleep 30",
            json!({"activeDeadlineSeconds": 1}),
            json!({}),
        ),
    )
    .await;
    let j = wait_job(&srv, "slow", |j| {
        cond_types(j).contains(&"Failed".to_string())
    })
    .await;
    assert!(started.elapsed() < Duration::from_secs(5));
    assert_eq!(cond_types(&j), ["FailureTarget", "Failed"]);
    assert_eq!(j["status"]["conditions"][1]["reason"], "DeadlineExceeded");
    assert_eq!(j["status"]["active"], 0);
    assert!(
        eventually(T, || job_pods(&srv, "slow").is_empty().then_some(()))
            .await
            .is_some(),
        "the deleted pod goes once its process ended"
    );
    runner.stop().await;
    srv.shutdown().await;
    let _ = std::fs::remove_dir_all(work);
}

#[tokio::test]
async fn sigterm_ignoring_script_is_killed_after_grace_and_trap_sees_term() {
    let (srv, runner, work) = setup(Some(Duration::from_millis(700))).await;
    let u = srv.url();
    let marker = work.join("got-term");
    std::fs::create_dir_all(&work).expect("work");
    // 1. ignores SIGTERM (and so does its child): killed with the group after the grace period
    post(
        &u,
        "/apis/batch/v1/namespaces/default/jobs",
        &job(
            "deaf",
            "trap '' TERM; sleep 30; echo never",
            json!({}),
            json!({}),
        ),
    )
    .await;
    let running = eventually(T, || {
        job_pods(&srv, "deaf")
            .pop()
            .filter(|p| p["status"]["phase"] == "Running")
    })
    .await
    .expect("running");
    let t = Instant::now();
    let r = delete(
        &u,
        "/apis/batch/v1/namespaces/default/jobs/deaf",
        Some(&json!({"propagationPolicy": "Background"})),
    )
    .await;
    assert_eq!(r.status, 200);
    let pod_name = running["metadata"]["name"]
        .as_str()
        .unwrap_or("")
        .to_string();
    let deleting = eventually(T, || {
        srv.store()
            .get("v1", "pods", Some("default"), &pod_name)
            .filter(|p| p["metadata"]["deletionTimestamp"].is_string())
    })
    .await;
    assert!(
        deleting.is_some(),
        "the GC marks the pod for graceful deletion"
    );
    assert!(
        eventually(T, || srv
            .store()
            .get("v1", "pods", Some("default"), &pod_name)
            .is_none()
            .then_some(()))
        .await
        .is_some()
    );
    assert!(
        t.elapsed() >= Duration::from_millis(700),
        "killed only after the grace period: {:?}",
        t.elapsed()
    );
    // 2. traps TERM: the entrypoint sees it and exits
    let script = format!(
        "trap 'echo term > {}; exit 0' TERM; while true; do sleep 0.05; done",
        marker.display()
    );
    post(
        &u,
        "/apis/batch/v1/namespaces/default/jobs",
        &job("trap", &script, json!({}), json!({})),
    )
    .await;
    eventually(T, || {
        job_pods(&srv, "trap")
            .pop()
            .filter(|p| p["status"]["phase"] == "Running")
    })
    .await
    .expect("running");
    tokio::time::sleep(Duration::from_millis(100)).await;
    delete(
        &u,
        "/apis/batch/v1/namespaces/default/jobs/trap",
        Some(&json!({"propagationPolicy": "Foreground"})),
    )
    .await;
    assert!(
        eventually(T, || srv
            .store()
            .get("batch/v1", "jobs", Some("default"), "trap")
            .is_none()
            .then_some(()))
        .await
        .is_some(),
        "foreground: job goes after its pod"
    );
    assert_eq!(
        std::fs::read_to_string(&marker).expect("trap ran").trim(),
        "term"
    );
    runner.stop().await;
    srv.shutdown().await;
    let _ = std::fs::remove_dir_all(work);
}

#[tokio::test]
async fn missing_secret_suspend_and_backoff() {
    let (srv, runner, work) = setup(None).await;
    let u = srv.url();
    let mut j = job("waits", "echo \"$X\"", json!({}), json!({}));
    j["spec"]["template"]["spec"]["containers"][0]["env"] =
        json!([{"name": "X", "valueFrom": {"secretKeyRef": {"name": "later", "key": "x"}}}]);
    post(&u, "/apis/batch/v1/namespaces/default/jobs", &j).await;
    let waiting = eventually(T, || {
        job_pods(&srv, "waits")
            .pop()
            .filter(|p| p["status"]["containerStatuses"][0]["state"]["waiting"].is_object())
    })
    .await
    .expect("waiting");
    assert_eq!(
        waiting["status"]["containerStatuses"][0]["state"]["waiting"]["reason"],
        "CreateContainerConfigError"
    );
    assert_eq!(waiting["status"]["phase"], "Pending");
    post(
        &u,
        "/api/v1/namespaces/default/secrets",
        &json!({"metadata": {"name": "later"}, "data": {"x": "eA=="}}),
    )
    .await;
    wait_job(&srv, "waits", |j| {
        cond_types(j).contains(&"Complete".to_string())
    })
    .await;
    // suspend: no pod
    post(
        &u,
        "/apis/batch/v1/namespaces/default/jobs",
        &job("sus", "exit 0", json!({"suspend": true}), json!({})),
    )
    .await;
    // backoffLimit 1: two pods, then failure
    post(
        &u,
        "/apis/batch/v1/namespaces/default/jobs",
        &job("retry", "exit 1", json!({"backoffLimit": 1}), json!({})),
    )
    .await;
    let j = wait_job(&srv, "retry", |j| {
        cond_types(j).contains(&"Failed".to_string())
    })
    .await;
    assert_eq!(j["status"]["failed"], 2);
    assert_eq!(job_pods(&srv, "retry").len(), 2);
    assert!(job_pods(&srv, "sus").is_empty());
    runner.stop().await;
    srv.shutdown().await;
    let _ = std::fs::remove_dir_all(work);
}

#[tokio::test]
async fn deleting_a_running_pod_terminates_it_and_fails_the_job() {
    let (srv, runner, work) = setup(None).await;
    let u = srv.url();
    post(
        &u,
        "/apis/batch/v1/namespaces/default/jobs",
        &job("direct", "exec sleep 30", json!({}), json!({})),
    )
    .await;
    let pod = eventually(T, || {
        job_pods(&srv, "direct")
            .pop()
            .filter(|p| p["status"]["phase"] == "Running")
    })
    .await
    .expect("running");
    let name = pod["metadata"]["name"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let r = delete(&u, &format!("/api/v1/namespaces/default/pods/{name}"), None).await;
    assert_eq!(r.status, 202, "graceful deletion of a running pod");
    assert_eq!(r.json()["metadata"]["deletionGracePeriodSeconds"], 30);
    assert!(
        eventually(T, || srv
            .store()
            .get("v1", "pods", Some("default"), &name)
            .is_none()
            .then_some(()))
        .await
        .is_some()
    );
    let j = wait_job(&srv, "direct", |j| {
        cond_types(j).contains(&"Failed".to_string())
    })
    .await;
    assert_eq!(j["status"]["failed"], 1);
    runner.stop().await;
    srv.shutdown().await;
    let _ = std::fs::remove_dir_all(work);
}
