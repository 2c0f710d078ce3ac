//! Smoke tests: the real kube-rs client and kube-runtime watcher against the test API server.

use std::time::Duration;

use captf_testserver::{JobRunner, JobRunnerOptions, TestServer};
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Secret};
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::runtime::{WatchStreamExt, conditions, watcher};
use kube::{Api, Client, Config};
use serde_json::json;

async fn client(srv: &TestServer) -> Client {
    let kc = Kubeconfig::read_from(srv.kubeconfig_path()).expect("kubeconfig");
    let cfg = Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
        .await
        .expect("config");
    Client::try_from(cfg).expect("client")
}

fn cm(name: &str) -> ConfigMap {
    serde_json::from_value(json!({"metadata": {"name": name}, "data": {"a": "1"}})).expect("cm")
}

#[tokio::test]
async fn kube_client_crud_errors_and_finalizers() {
    let srv = TestServer::start().await;
    let c = client(&srv).await;
    let cms: Api<ConfigMap> = Api::default_namespaced(c.clone());
    let created = cms
        .create(&PostParams::default(), &cm("a"))
        .await
        .expect("create");
    assert!(created.metadata.uid.is_some());
    match cms.create(&PostParams::default(), &cm("a")).await {
        Err(kube::Error::Api(s)) => assert!(s.is_already_exists() && s.code == 409, "{s:?}"),
        other => panic!("expected AlreadyExists, got {other:?}"),
    }
    let mut stale = created.clone();
    cms.patch(
        "a",
        &PatchParams::default(),
        &Patch::Merge(json!({"data": {"a": "2"}})),
    )
    .await
    .expect("merge patch");
    stale.data = Some([("a".to_string(), "3".to_string())].into());
    match cms.replace("a", &PostParams::default(), &stale).await {
        Err(kube::Error::Api(s)) => assert!(s.is_conflict(), "{s:?}"),
        other => panic!("expected Conflict, got {other:?}"),
    }
    // finalizer held deletion until it is removed
    cms.patch(
        "a",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"finalizers": ["x/y"]}})),
    )
    .await
    .expect("add finalizer");
    let deleted = cms
        .delete("a", &DeleteParams::default())
        .await
        .expect("delete");
    assert!(
        deleted
            .left()
            .and_then(|o| o.metadata.deletion_timestamp)
            .is_some(),
        "still there, marked"
    );
    cms.patch(
        "a",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"finalizers": null}})),
    )
    .await
    .expect("remove finalizer");
    assert!(cms.get_opt("a").await.expect("get_opt").is_none());
    // terminating namespace: 403 with the NamespaceTerminating cause
    let nss: Api<Namespace> = Api::all(c.clone());
    nss.create(
        &PostParams::default(),
        &serde_json::from_value(json!({"metadata": {"name": "t"}})).expect("ns"),
    )
    .await
    .expect("ns");
    let in_t: Api<ConfigMap> = Api::namespaced(c.clone(), "t");
    let mut held = cm("held");
    held.metadata.finalizers = Some(vec!["x/y".into()]);
    in_t.create(&PostParams::default(), &held)
        .await
        .expect("held");
    nss.delete("t", &DeleteParams::default())
        .await
        .expect("delete ns");
    match in_t.create(&PostParams::default(), &cm("new")).await {
        Err(kube::Error::Api(s)) => {
            assert!(s.is_forbidden());
            let causes = s.details.map(|d| d.causes).unwrap_or_default();
            assert_eq!(
                causes.first().map(|c| c.reason.as_str()),
                Some("NamespaceTerminating")
            );
        }
        other => panic!("expected Forbidden, got {other:?}"),
    }
    srv.shutdown().await;
}

#[tokio::test]
async fn kube_runtime_watcher_list_watch_and_streaming_list() {
    let srv = TestServer::start().await;
    let c = client(&srv).await;
    let cms: Api<ConfigMap> = Api::default_namespaced(c.clone());
    cms.create(&PostParams::default(), &cm("before"))
        .await
        .expect("create");
    for cfg in [
        watcher::Config::default(),
        watcher::Config::default().streaming_lists(),
    ] {
        let mut objects = watcher(cms.clone(), cfg).touched_objects().boxed();
        let mut next_named = async |want: &str| loop {
            let o = tokio::time::timeout(Duration::from_secs(5), objects.try_next())
                .await
                .expect("in time")
                .expect("no watcher error")
                .expect("stream goes on");
            if o.metadata.name.as_deref() == Some(want) {
                return o;
            }
        };
        next_named("before").await;
        let name = format!("after-{}", srv.store().resource_version());
        cms.create(&PostParams::default(), &cm(&name))
            .await
            .expect("create");
        next_named(&name).await;
        // a dropped watch is resumed transparently
        srv.faults().drop_watches();
        cms.patch(
            "before",
            &PatchParams::default(),
            &Patch::Merge(json!({"data": {"b": name}})),
        )
        .await
        .expect("patch");
        let o = next_named("before").await;
        assert_eq!(o.data.and_then(|d| d.get("b").cloned()), Some(name));
    }
    srv.shutdown().await;
}

#[tokio::test]
async fn kube_job_runs_through_the_local_runner() {
    let srv = TestServer::start().await;
    let c = client(&srv).await;
    let work = std::env::temp_dir().join(format!("captf-smoke-{}", std::process::id()));
    let runner = JobRunner::start(
        &srv,
        JobRunnerOptions {
            work_root: work.clone(),
            ..Default::default()
        },
    );
    let secrets: Api<Secret> = Api::default_namespaced(c.clone());
    secrets
        .create(
            &PostParams::default(),
            &serde_json::from_value(
                json!({"metadata": {"name": "s"}, "stringData": {}, "data": {"v": "aGk="}}),
            )
            .expect("secret"),
        )
        .await
        .expect("secret");
    let jobs: Api<Job> = Api::default_namespaced(c.clone());
    let job: Job = serde_json::from_value(json!({"metadata": {"name": "j"}, "spec": {"backoffLimit": 0, "template": {"spec": {
        "restartPolicy": "Never", "containers": [{"name": "c", "image": "none", "command": ["sh", "-c", "test \"$V\" = hi"],
        "env": [{"name": "V", "valueFrom": {"secretKeyRef": {"name": "s", "key": "v"}}}]}]}}}}))
    .expect("job");
    jobs.create(&PostParams::default(), &job)
        .await
        .expect("create job");
    let done = tokio::time::timeout(
        Duration::from_secs(10),
        kube::runtime::wait::await_condition(jobs.clone(), "j", conditions::is_job_completed()),
    )
    .await
    .expect("in time")
    .expect("watch");
    let conds = done
        .and_then(|j| j.status)
        .and_then(|s| s.conditions)
        .unwrap_or_default();
    assert!(
        conds
            .iter()
            .any(|c| c.type_ == "Complete" && c.status == "True"),
        "{conds:?}"
    );
    runner.stop().await;
    srv.shutdown().await;
    let _ = std::fs::remove_dir_all(work);
}
