//! The control plane the tests run on (`tests/cluster/`): the real kube-apiserver and
//! kube-controller-manager with the local kubelet, and the fault proxy. These tests pin
//! down what the deletion scenarios rely on it for: Pods named and run as a kubelet runs
//! them, termination as a kubelet terminates, logs through the API server, the test
//! control's faults, an admission refusal, and the proxy's counts and faults; and the
//! API server's version and the real Cluster API of `--cluster-api`, with clusterctl.

use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Namespace, Pod};
use kube::api::{
    Api, ApiResource, DeleteParams, DynamicObject, ListParams, LogParams, Patch, PatchParams,
    PostParams,
};
use kube::runtime::watcher;
use kube::{Client, ResourceExt};
use serde_json::json;

use crate::support::cluster;
use crate::support::*;

const WAIT: Duration = Duration::from_secs(60);

fn pod(name: &str, ns: &str, labels: serde_json::Value, grace: i64, script: &str) -> Pod {
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": ns, "labels": labels},
        "spec": {"restartPolicy": "Never", "terminationGracePeriodSeconds": grace,
            "containers": [{"name": "c", "image": "busybox", "command": ["sh", "-c", script]}]}
    }))
    .expect("pod")
}

async fn pod_state(pods: &Api<Pod>, name: &str) -> Option<Pod> {
    pods.get_opt(name).await.expect("get pod")
}

fn phase(p: &Pod) -> &str {
    p.status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .unwrap_or_default()
}

fn container_state(p: &Pod) -> serde_json::Value {
    let s = p
        .status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref())
        .and_then(|c| c.first())
        .and_then(|c| c.state.clone());
    serde_json::to_value(s).unwrap_or_default()
}

/// A Job with a name of 63 characters, as CAPTF's hashed Job names are: its Pod is named
/// by the API server (58 characters of the Job's name, then 5 random ones), the container
/// sees that name as its hostname (what Terraform records as a lock's holder), its log is
/// served through the API server, and the Job fails only once its Pod is terminal, with
/// the last 4096 bytes of the termination message.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_pod_is_named_run_and_reported_as_kubernetes_does() {
    let env = Env::builder("cp-job").start().await;
    let job_name = format!(
        "captf-{}-destroy-1",
        "m".repeat(63 - "captf--destroy-1".len())
    );
    assert_eq!(job_name.len(), 63);
    let tail = "t".repeat(100);
    let script = format!(
        "echo hostname=$(hostname); head -c 5000 /dev/zero | tr '\\0' x > /dev/termination-log; echo {tail} >> /dev/termination-log; exit 3"
    );
    let job: Job = serde_json::from_value(json!({
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": job_name, "namespace": env.ns},
        "spec": {"backoffLimit": 0, "podReplacementPolicy": "Failed", "template": {"spec": {
            "restartPolicy": "Never",
            "containers": [{"name": "c", "image": "busybox", "command": ["sh", "-c", script]}]}}}
    }))
    .expect("job");
    let jobs: Api<Job> = Api::namespaced(env.client.clone(), &env.ns);
    jobs.create(&PostParams::default(), &job)
        .await
        .expect("create job");
    wait_for("the Job to fail", WAIT, || async {
        jobs.get(&job_name).await.ok().is_some_and(|j| {
            j.status
                .and_then(|s| s.conditions)
                .unwrap_or_default()
                .iter()
                .any(|c| c.type_ == "Failed" && c.status == "True")
        })
    })
    .await;
    let pods: Api<Pod> = Api::namespaced(env.client.clone(), &env.ns);
    let list = pods
        .list(&ListParams::default().labels(&format!("job-name={job_name}")))
        .await
        .expect("pods");
    assert_eq!(list.items.len(), 1, "one attempt, one Pod");
    let p = &list.items[0];
    let name = p.name_any();
    assert_eq!(name.len(), 63, "{name}");
    assert_eq!(&name[..58], &format!("{job_name}-")[..58]);
    assert!(!name.contains("-destroy-"), "the tail is cut: {name}");
    assert_eq!(phase(p), "Failed");
    let term = &container_state(p)["terminated"];
    assert_eq!(term["exitCode"], 3, "{term}");
    let message = term["message"].as_str().expect("a termination message");
    assert_eq!(message.len(), 4096, "the last 4096 bytes");
    assert!(message.ends_with(&format!("{tail}\n")), "{message}");
    // `kubectl logs`, through the API server to the kubelet.
    let log = pods
        .logs(&name, &LogParams::default())
        .await
        .expect("pod log");
    assert_eq!(log.trim(), format!("hostname={name}"));
    env.shutdown().await;
}

/// A Pod being deleted: SIGTERM reaches its PID 1 (a shell that traps it), and when the
/// grace period is over every process of the container dies, a process that made a
/// session of its own included.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_pod_gets_sigterm_then_its_whole_tree_is_killed() {
    if envtest_only("it looks for the container's processes on this machine") {
        return;
    }
    let env = Env::builder("cp-term").start().await;
    let markers = env.markers();
    let got = markers.join("got-term");
    let stamp = format!("{}.{}", std::process::id(), rand_marker());
    let script = format!(
        "trap 'echo term > {}' TERM; setsid sh -c 'exec sleep 1000.{stamp}' & while :; do sleep 0.2; done",
        got.display()
    );
    let pods: Api<Pod> = Api::namespaced(env.client.clone(), &env.ns);
    pods.create(
        &PostParams::default(),
        &pod("tree", &env.ns, json!({}), 2, &script),
    )
    .await
    .expect("create pod");
    let sleeper = format!("sleep 1000.{stamp}");
    wait_for("the container's processes", WAIT, || async {
        processes_matching(&sleeper) > 0
    })
    .await;
    let t = std::time::Instant::now();
    pods.delete("tree", &DeleteParams::default())
        .await
        .expect("delete");
    wait_for("the Pod to go", WAIT, || async {
        pod_state(&pods, "tree").await.is_none()
    })
    .await;
    assert!(
        t.elapsed() >= Duration::from_secs(2),
        "the grace period was waited"
    );
    assert_eq!(std::fs::read_to_string(&got).unwrap_or_default(), "term\n");
    assert_eq!(processes_matching(&sleeper), 0, "the whole tree is gone");
    env.shutdown().await;
}

/// A native sidecar (an init container with `restartPolicy: Always`, as CAPTF's state
/// proxy is) runs beside the Pod's container, is reported among the init containers, and
/// is stopped only once the container has ended: when the container exits on its own (the
/// Pod then succeeds by the container's exit alone), and when the Pod is deleted (the
/// container gets SIGTERM first, so that a runner interrupted mid-write still has its
/// proxy).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_native_sidecar_outlives_the_container_it_serves() {
    if envtest_only("it reads the files the containers write on this machine") {
        return;
    }
    let env = Env::builder("cp-sidecar").start().await;
    let pods: Api<Pod> = Api::namespaced(env.client.clone(), &env.ns);
    let with_sidecar = |name: &str, grace: i64, main: &str, log: &std::path::Path| -> Pod {
        let sidecar = format!(
            "trap 'echo sidecar-term >> {l}; exit 0' TERM; echo sidecar-up >> {l}; while :; do sleep 0.1; done",
            l = log.display()
        );
        serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": env.ns},
            "spec": {"restartPolicy": "Never", "terminationGracePeriodSeconds": grace,
                "initContainers": [{"name": "proxy", "image": "busybox", "restartPolicy": "Always",
                    "command": ["sh", "-c", sidecar]}],
                "containers": [{"name": "main", "image": "busybox", "command": ["sh", "-c", main]}]}
        }))
        .expect("pod")
    };
    let read = |log: &std::path::Path| std::fs::read_to_string(log).unwrap_or_default();

    // On its own: the container ends, then the sidecar is stopped; the Pod succeeds.
    let done = env.markers().join("done.log");
    let main = format!(
        "while ! grep -q sidecar-up {l} 2>/dev/null; do sleep 0.1; done; echo main-exit >> {l}; exit 0",
        l = done.display()
    );
    pods.create(
        &PostParams::default(),
        &with_sidecar("done", 30, &main, &done),
    )
    .await
    .expect("create pod");
    wait_for("the Pod to succeed", WAIT, || async {
        pod_state(&pods, "done")
            .await
            .is_some_and(|p| phase(&p) == "Succeeded")
    })
    .await;
    assert_eq!(read(&done), "sidecar-up\nmain-exit\nsidecar-term\n");
    let p = pod_state(&pods, "done").await.expect("pod");
    let status = p.status.expect("status");
    let names = |s: &Option<Vec<k8s_openapi::api::core::v1::ContainerStatus>>| -> Vec<String> {
        s.iter().flatten().map(|c| c.name.clone()).collect()
    };
    assert_eq!(names(&status.container_statuses), ["main"]);
    assert_eq!(names(&status.init_container_statuses), ["proxy"]);
    let sidecar = &status.init_container_statuses.as_ref().expect("init")[0];
    assert!(
        sidecar
            .state
            .as_ref()
            .and_then(|s| s.terminated.as_ref())
            .is_some(),
        "the sidecar ended: {sidecar:?}"
    );

    // Deleted: SIGTERM to the container first; the sidecar serves until it has ended.
    let deleted = env.markers().join("deleted.log");
    let main = format!(
        "trap 'sleep 1; echo main-term >> {l}; exit 0' TERM; while :; do sleep 0.1; done",
        l = deleted.display()
    );
    pods.create(
        &PostParams::default(),
        &with_sidecar("deleted", 10, &main, &deleted),
    )
    .await
    .expect("create pod");
    wait_for("the sidecar to run", WAIT, || async {
        read(&deleted).contains("sidecar-up")
    })
    .await;
    pods.delete("deleted", &DeleteParams::default())
        .await
        .expect("delete");
    wait_for("the Pod to go", WAIT, || async {
        pod_state(&pods, "deleted").await.is_none()
    })
    .await;
    assert_eq!(read(&deleted), "sidecar-up\nmain-term\nsidecar-term\n");
    env.shutdown().await;
}

fn rand_marker() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64 % 1_000_000)
        .unwrap_or(0)
}

/// Processes on this machine whose command line contains `needle`.
fn processes_matching(needle: &str) -> usize {
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| {
            std::fs::read(e.path().join("cmdline"))
                .map(|c| {
                    String::from_utf8_lossy(&c)
                        .replace('\0', " ")
                        .contains(needle)
                })
                .unwrap_or(false)
        })
        .count()
}

/// The test control makes Pods fail the ways nodes make them fail.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_test_control_makes_pods_oomkilled_evicted_unpullable_and_lost() {
    if envtest_only("the test control is the local kubelet's") {
        return;
    }
    let env = Env::builder("cp-faults").start().await;
    let pods: Api<Pod> = Api::namespaced(env.client.clone(), &env.ns);
    for (rule, fault) in [
        ("oom", KubeletFault::OomKilled),
        ("evict", KubeletFault::Evicted),
        ("pull", KubeletFault::ImagePullFailure),
        ("lost", KubeletFault::LostNode),
    ] {
        env.kubelet_fault(rule, &[("fault", rule)], fault, 1.0)
            .await;
    }
    for rule in ["oom", "evict", "pull", "lost"] {
        pods.create(
            &PostParams::default(),
            &pod(rule, &env.ns, json!({"fault": rule}), 30, "sleep 1000"),
        )
        .await
        .expect("create pod");
    }
    wait_for("the OOM kill", WAIT, || async {
        pod_state(&pods, "oom")
            .await
            .is_some_and(|p| phase(&p) == "Failed")
    })
    .await;
    let p = pod_state(&pods, "oom").await.expect("oom pod");
    let term = &container_state(&p)["terminated"];
    assert_eq!(
        (term["reason"].as_str(), term["exitCode"].as_i64()),
        (Some("OOMKilled"), Some(137)),
        "{term}"
    );

    wait_for("the eviction", WAIT, || async {
        pod_state(&pods, "evict")
            .await
            .is_some_and(|p| phase(&p) == "Failed")
    })
    .await;
    let p = pod_state(&pods, "evict").await.expect("evicted pod");
    let status = p.status.clone().expect("status");
    assert_eq!(status.reason.as_deref(), Some("Evicted"));
    assert!(
        status
            .conditions
            .unwrap_or_default()
            .iter()
            .any(|c| c.type_ == "DisruptionTarget"
                && c.status == "True"
                && c.reason.as_deref() == Some("TerminationByKubelet")),
        "a DisruptionTarget condition"
    );

    wait_for("the image pull back-off", WAIT, || async {
        pod_state(&pods, "pull")
            .await
            .is_some_and(|p| container_state(&p)["waiting"]["reason"] == "ImagePullBackOff")
    })
    .await;
    let p = pod_state(&pods, "pull").await.expect("pull pod");
    assert_eq!(phase(&p), "Pending");
    // The pull works again once the rule goes.
    env.clear_kubelet_fault("pull").await;
    wait_for("the container to start", WAIT, || async {
        pod_state(&pods, "pull")
            .await
            .is_some_and(|p| phase(&p) == "Running")
    })
    .await;

    // The lost node: the Pod keeps saying Running, and once deleted stays terminating.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let p = pod_state(&pods, "lost").await.expect("lost pod");
    assert_eq!(phase(&p), "Running", "nothing reports its end");
    pods.delete("lost", &DeleteParams::default().grace_period(1))
        .await
        .expect("delete");
    tokio::time::sleep(Duration::from_secs(5)).await;
    let p = pod_state(&pods, "lost").await.expect("still there");
    assert!(p.metadata.deletion_timestamp.is_some(), "terminating");
    // Only a force deletion removes it.
    pods.delete("lost", &DeleteParams::default().grace_period(0))
        .await
        .expect("force delete");
    wait_for("the Pod to go", WAIT, || async {
        pod_state(&pods, "lost").await.is_none()
    })
    .await;
    for rule in ["oom", "evict", "lost"] {
        env.clear_kubelet_fault(rule).await;
    }
    env.shutdown().await;
}

/// A Pod refused by admission: a ValidatingAdmissionPolicy, enforced by the real API
/// server, refuses the Job controller's Pod; the Job records why in a FailedCreate Event.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admission_refuses_the_pods_of_a_job() {
    let env = Env::builder("cp-admission").start().await;
    let guard = env
        .refuse_pods(
            &[("refuse", "yes")],
            "pods labelled refuse=yes are not allowed here",
        )
        .await;
    let job: Job = serde_json::from_value(json!({
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": "refused", "namespace": env.ns},
        "spec": {"backoffLimit": 0, "template": {
            "metadata": {"labels": {"refuse": "yes"}},
            "spec": {"restartPolicy": "Never",
                "containers": [{"name": "c", "image": "busybox", "command": ["true"]}]}}}
    }))
    .expect("job");
    Api::<Job>::namespaced(env.client.clone(), &env.ns)
        .create(&PostParams::default(), &job)
        .await
        .expect("create job");
    let events: Api<k8s_openapi::api::core::v1::Event> =
        Api::namespaced(env.client.clone(), &env.ns);
    wait_for("the Job's FailedCreate Event", WAIT, || async {
        events
            .list(&Default::default())
            .await
            .map(|l| {
                l.items.iter().any(|e| {
                    e.reason.as_deref() == Some("FailedCreate")
                        && e.involved_object.name.as_deref() == Some("refused")
                        && e.message.as_deref().is_some_and(|m| {
                            m.contains("pods labelled refuse=yes are not allowed here")
                        })
                })
            })
            .unwrap_or(false)
    })
    .await;
    let pods: Api<Pod> = Api::namespaced(env.client.clone(), &env.ns);
    assert!(
        pods.list(&Default::default())
            .await
            .expect("pods")
            .items
            .is_empty()
    );
    guard.remove(&env.client).await;
    env.shutdown().await;
}

/// The fault proxy: it counts a client's requests, fails the ones it is told to, and
/// ends open watches.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_fault_proxy_counts_fails_and_drops_watches() {
    let env = Env::builder("cp-proxy").start().await;
    let client: Client = env.proxy.client();
    let namespaces: Api<Namespace> = Api::all(client.clone());
    namespaces
        .get(&env.ns)
        .await
        .expect("get through the proxy");
    assert_eq!(env.proxy.request_log().count("get", "namespaces", ""), 1);
    // (500: kube's client retries a 503 by itself.)
    env.proxy
        .faults()
        .fail_next(1, Some("get"), Some("namespaces"), 500);
    let err = namespaces
        .get(&env.ns)
        .await
        .expect_err("the injected failure");
    assert!(
        matches!(err, kube::Error::Api(ref s) if s.code == 500),
        "{err}"
    );
    namespaces
        .get(&env.ns)
        .await
        .expect("then it answers again");
    assert_eq!(env.proxy.request_log().count("get", "namespaces", ""), 3);

    // A watch, ended by the proxy: kube's watcher starts it again (a second watch request).
    let pods: Api<Pod> = Api::namespaced(client, &env.ns);
    let mut stream = watcher(pods, watcher::Config::default()).boxed();
    let first = tokio::time::timeout(WAIT, stream.next()).await;
    assert!(first.is_ok(), "the watcher started");
    let task = tokio::spawn(async move { while stream.next().await.is_some() {} });
    wait_for("the watch", WAIT, || async {
        env.proxy.request_log().count("watch", "pods", "") >= 1
    })
    .await;
    env.proxy.faults().drop_watches();
    wait_for("the watch to be made again", WAIT, || async {
        env.proxy.request_log().count("watch", "pods", "") >= 2
    })
    .await;
    task.abort();
    env.shutdown().await;
}

/// How long a test waits on the real Cluster API's controllers (the suite's wait).
const CAPI_WAIT: Duration = Duration::from_secs(90);

/// `kubectl version -o json` against `kubeconfig`: the server's `gitVersion`.
fn kubectl_server_version(kubeconfig: &std::path::Path) -> String {
    let out = std::process::Command::new("kubectl")
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .args(["version", "-o", "json"])
        .output()
        .expect("kubectl");
    assert!(
        out.status.success(),
        "kubectl version: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("kubectl's JSON");
    v["serverVersion"]["gitVersion"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

/// The API server says which Kubernetes it is (`/version`), as a release does: Cluster
/// API refuses to run on a server whose version does not parse, and kubectl cannot parse
/// it either.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_api_server_reports_its_kubernetes_version() {
    if envtest_only("it checks the local control plane's build") {
        return;
    }
    let plane = cluster::ControlPlane::shared();
    let info = plane
        .client()
        .await
        .apiserver_version()
        .await
        .expect("/version");
    assert_eq!(
        (
            info.git_version.as_str(),
            info.major.as_str(),
            info.minor.as_str()
        ),
        ("v1.37.2", "1", "37"),
        "{info:?}"
    );
    assert_eq!(info.git_tree_state, "clean", "{info:?}");
    assert_eq!(kubectl_server_version(plane.kubeconfig()), "v1.37.2");
}

/// `clusterctl` beside `captf-envtest` is the Cluster API release the control plane runs.
#[test]
fn clusterctl_is_the_cluster_api_release_of_the_control_plane() {
    let home = tempfile_dir("clusterctl-version");
    let out = std::process::Command::new(cluster::clusterctl())
        .args(["version", "-o", "short"])
        .env("HOME", &home)
        .env("CLUSTERCTL_DISABLE_VERSIONCHECK", "true")
        .output()
        .expect("clusterctl");
    let _ = std::fs::remove_dir_all(&home);
    assert!(
        out.status.success(),
        "clusterctl version: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "v1.14.2");
}

fn tempfile_dir(tag: &str) -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!(
        "captf-e2e-{tag}-{}-{}",
        std::process::id(),
        rand_marker()
    ));
    std::fs::create_dir_all(&d).expect("temp dir");
    d
}

fn capi_resource(version: &str, kind: &str) -> ApiResource {
    ApiResource {
        group: "cluster.x-k8s.io".into(),
        version: version.into(),
        api_version: format!("cluster.x-k8s.io/{version}"),
        kind: kind.into(),
        plural: format!("{}s", kind.to_lowercase()),
    }
}

fn has_finalizer(o: &DynamicObject, finalizer: &str) -> bool {
    o.metadata
        .finalizers
        .iter()
        .flatten()
        .any(|f| f == finalizer)
}

/// The real Cluster API on `captf-envtest --cluster-api`: its Cluster controller adopts a
/// TerraformCluster (no CAPTF manager runs here: only CAPTF's CRDs are installed) as it
/// adopts any infrastructure provider's object, its webhooks default, validate and
/// convert, clusterctl describes the Cluster, and deleting the Cluster deletes its
/// infrastructure first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_real_cluster_api_adopts_and_deletes_a_terraform_cluster() {
    if envtest_only("it starts a control plane of its own with Cluster API") {
        return;
    }
    let plane = cluster::ControlPlane::dedicated_with_cluster_api("cp-capi");
    let client = plane.client().await;
    let info = client.apiserver_version().await.expect("/version");
    assert_eq!(info.git_version, "v1.37.2", "{info:?}");

    let ns = "capi-smoke";
    let namespace: Namespace =
        serde_json::from_value(json!({"metadata": {"name": ns}})).expect("namespace");
    Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &namespace)
        .await
        .expect("create namespace");
    let tfc_resource = ApiResource::erase::<captf::api::TerraformCluster>(&());
    let tfcs: Api<DynamicObject> = Api::namespaced_with(client.clone(), ns, &tfc_resource);
    let tfc: DynamicObject = serde_json::from_value(json!({
        "apiVersion": tfc_resource.api_version, "kind": "TerraformCluster",
        "metadata": {"name": "prod", "namespace": ns},
        "spec": {"module": {"files": {"main.tf": "# nothing: no CAPTF manager runs here\n"}}}
    }))
    .expect("TerraformCluster");
    tfcs.create(&PostParams::default(), &tfc)
        .await
        .expect("create TerraformCluster");
    let clusters: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), ns, &capi_resource("v1beta2", "Cluster"));
    let c: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Cluster",
        "metadata": {"name": "prod", "namespace": ns},
        "spec": {"infrastructureRef": {"apiGroup": tfc_resource.group, "kind": "TerraformCluster", "name": "prod"}}
    }))
    .expect("Cluster");
    let created = clusters
        .create(&PostParams::default(), &c)
        .await
        .expect("create Cluster (through Cluster API's webhooks)");
    let uid = created.metadata.uid.clone().expect("uid");

    // The Cluster controller's finalizer on the Cluster, its ownerReference and label on
    // the TerraformCluster.
    wait_for("the Cluster controller's finalizer", CAPI_WAIT, || async {
        clusters
            .get("prod")
            .await
            .is_ok_and(|c| has_finalizer(&c, "cluster.cluster.x-k8s.io"))
    })
    .await;
    wait_for(
        "the Cluster's ownerReference on the TerraformCluster",
        CAPI_WAIT,
        || async {
            tfcs.get("prod").await.is_ok_and(|t| {
                t.metadata.owner_references.iter().flatten().any(|r| {
                    r.api_version == "cluster.x-k8s.io/v1beta2"
                        && r.kind == "Cluster"
                        && r.name == "prod"
                        && r.uid == uid
                })
            })
        },
    )
    .await;
    let t = tfcs.get("prod").await.expect("TerraformCluster");
    assert_eq!(
        t.labels()
            .get("cluster.x-k8s.io/cluster-name")
            .map(String::as_str),
        Some("prod")
    );

    // The defaulting webhook: a Machine (dry run) gets its cluster-name label, a "v" before
    // its version and its node deletion timeout.
    let machines: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), ns, &capi_resource("v1beta2", "Machine"));
    let m: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Machine",
        "metadata": {"name": "web-1", "namespace": ns},
        "spec": {"clusterName": "prod", "version": "1.37.2",
            "bootstrap": {"dataSecretName": "web-1-bootstrap"},
            "infrastructureRef": {"apiGroup": tfc_resource.group, "kind": "TerraformMachine", "name": "web-1"}}
    }))
    .expect("Machine");
    let dry_run = PostParams {
        dry_run: true,
        ..Default::default()
    };
    let defaulted = machines
        .create(&dry_run, &m)
        .await
        .expect("dry-run create Machine");
    assert_eq!(
        defaulted
            .labels()
            .get("cluster.x-k8s.io/cluster-name")
            .map(String::as_str),
        Some("prod"),
        "{defaulted:?}"
    );
    assert_eq!(defaulted.data["spec"]["version"], "v1.37.2");
    assert_eq!(
        defaulted.data["spec"]["deletion"]["nodeDeletionTimeoutSeconds"],
        10
    );
    // The validating webhook: a Machine of no Cluster is refused.
    let mut orphan = m.clone();
    orphan.data["spec"]["clusterName"] = json!("");
    let err = machines
        .create(&dry_run, &orphan)
        .await
        .expect_err("a Machine without a Cluster is refused");
    assert!(
        matches!(err, kube::Error::Api(ref s) if s.code == 422),
        "{err}"
    );
    // The conversion webhook: the Cluster read as v1beta1.
    let old: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), ns, &capi_resource("v1beta1", "Cluster"));
    let as_v1beta1 = old.get("prod").await.expect("the Cluster as v1beta1");
    assert_eq!(
        as_v1beta1.data["spec"]["infrastructureRef"]["kind"], "TerraformCluster",
        "{as_v1beta1:?}"
    );
    assert_eq!(
        as_v1beta1.data["spec"]["infrastructureRef"]["apiVersion"], tfc_resource.api_version,
        "{as_v1beta1:?}"
    );

    // clusterctl describes it.
    let home = tempfile_dir("clusterctl-home");
    let out = std::process::Command::new(cluster::clusterctl())
        .args(["describe", "cluster", "prod", "-n", ns, "--kubeconfig"])
        .arg(plane.kubeconfig())
        .env("HOME", &home)
        .env("CLUSTERCTL_DISABLE_VERSIONCHECK", "true")
        .output()
        .expect("clusterctl");
    let _ = std::fs::remove_dir_all(&home);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "clusterctl describe cluster: {stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // The Cluster, with its infrastructure beneath it.
    let lines: Vec<&str> = stdout.lines().collect();
    let cluster_line = lines
        .iter()
        .position(|l| l.starts_with(&format!("Cluster {ns}/prod ")));
    let infra_line = lines
        .iter()
        .position(|l| l.contains(&format!("TerraformCluster {ns}/prod")));
    assert!(
        matches!((cluster_line, infra_line), (Some(c), Some(i)) if c < i),
        "{stdout}"
    );

    // Deleting the Cluster deletes the TerraformCluster, then the Cluster goes. (Without
    // CAPTF's manager nothing puts CAPTF's finalizer on the TerraformCluster; strip one
    // if it is there all the same.)
    clusters
        .delete("prod", &DeleteParams::background())
        .await
        .expect("delete Cluster");
    wait_for("the TerraformCluster to be deleted", CAPI_WAIT, || async {
        match tfcs.get_opt("prod").await.expect("get TerraformCluster") {
            None => true,
            Some(t) => {
                if t.metadata.deletion_timestamp.is_some()
                    && t.metadata
                        .finalizers
                        .as_ref()
                        .is_some_and(|f| !f.is_empty())
                {
                    let patch = Patch::Merge(json!({"metadata": {"finalizers": null}}));
                    let _ = tfcs.patch("prod", &PatchParams::default(), &patch).await;
                }
                false
            }
        }
    })
    .await;
    wait_for("the Cluster to go", CAPI_WAIT, || async {
        clusters
            .get_opt("prod")
            .await
            .expect("get Cluster")
            .is_none()
    })
    .await;
}
