//! The workload cluster cleaned up before the infrastructure goes (docs/14-workload-cleanup.md),
//! with the real Cluster API on the management cluster and a second `captf-envtest` as
//! the workload cluster. The test plays the workload cluster's cloud controller and CSI
//! driver ([`StandIn`]): only a test double can, as nothing here makes load balancers or
//! disks; it removes their finalizers a while after their deletion, as those would once
//! the cloud resource is gone, and never removes `NEVER` (a cloud resource that will not
//! go), which only the cleanup's force removes.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use captf::api::names;
use captf::api::{TerraformCluster as Tfc, TerraformMachine as Tfm};
use captf::controller::workload::{CONDITION, reason};
use k8s_openapi::api::core::v1::{Namespace, PersistentVolumeClaim, Service};
use kube::api::{
    Api, ApiResource, DeleteParams, DynamicObject, GroupVersionKind, ListParams, Patch,
    PatchParams, PostParams,
};
use kube::{Client, ResourceExt};
use serde_json::json;

use crate::manager::{free_port, http_get};
use crate::support::cluster::ControlPlane;
use crate::support::*;

/// A finalizer the stand-in never removes.
const NEVER: &str = "test.captf.io/never";

fn ar(group: &str, version: &str, kind: &str, plural: &str) -> ApiResource {
    ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(group, version, kind), plural)
}

fn webhooks() -> ApiResource {
    ar(
        "admissionregistration.k8s.io",
        "v1",
        "ValidatingWebhookConfiguration",
        "validatingwebhookconfigurations",
    )
}

fn snapshots() -> ApiResource {
    ar(
        "snapshot.storage.k8s.io",
        "v1",
        "VolumeSnapshot",
        "volumesnapshots",
    )
}

/// What the stand-in saw: when it first saw each object deleting, and when it removed
/// its finalizers (`Kind ns/name`).
#[derive(Default)]
struct Seen {
    deleting: BTreeMap<String, SystemTime>,
    released: BTreeMap<String, SystemTime>,
}

/// The workload cluster's cloud controller, CSI driver and webhook owner, played: every
/// 200 ms it looks at the Services, PersistentVolumeClaims, VolumeSnapshots and webhook
/// configurations being deleted and, `after` their first sighting, removes every
/// finalizer but [`NEVER`].
struct StandIn {
    seen: Arc<Mutex<Seen>>,
    task: tokio::task::JoinHandle<()>,
}

impl StandIn {
    fn start(client: Client, after: Duration) -> StandIn {
        let seen = Arc::new(Mutex::new(Seen::default()));
        let s = seen.clone();
        let kinds = [
            ar("", "v1", "Service", "services"),
            ar("", "v1", "PersistentVolumeClaim", "persistentvolumeclaims"),
            snapshots(),
            webhooks(),
        ];
        let task = tokio::spawn(async move {
            loop {
                for k in &kinds {
                    let api = Api::<DynamicObject>::all_with(client.clone(), k);
                    let Ok(list) = api.list(&ListParams::default()).await else {
                        continue;
                    };
                    for o in list.items {
                        if o.metadata.deletion_timestamp.is_none() {
                            continue;
                        }
                        let key = match o.namespace() {
                            Some(ns) => format!("{} {ns}/{}", k.kind, o.name_any()),
                            None => format!("{} {}", k.kind, o.name_any()),
                        };
                        let first = *s
                            .lock()
                            .unwrap()
                            .deleting
                            .entry(key.clone())
                            .or_insert_with(SystemTime::now);
                        let fins = o.finalizers().to_vec();
                        let keep: Vec<&String> = fins.iter().filter(|f| *f == NEVER).collect();
                        if keep.len() == fins.len() || first.elapsed().unwrap_or_default() < after {
                            continue;
                        }
                        let scoped = match o.namespace() {
                            Some(ns) => {
                                Api::<DynamicObject>::namespaced_with(client.clone(), &ns, k)
                            }
                            None => api.clone(),
                        };
                        let patch = json!({"metadata": {"finalizers": keep,
                            "resourceVersion": o.resource_version()}});
                        if scoped
                            .patch(
                                &o.name_any(),
                                &PatchParams::default(),
                                &Patch::Merge(&patch),
                            )
                            .await
                            .is_ok()
                        {
                            s.lock().unwrap().released.insert(key, SystemTime::now());
                        }
                    }
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        });
        StandIn { seen, task }
    }

    fn deleting(&self, key: &str) -> Option<SystemTime> {
        self.seen.lock().unwrap().deleting.get(key).copied()
    }

    fn released(&self, key: &str) -> Option<SystemTime> {
        self.seen.lock().unwrap().released.get(key).copied()
    }
}

impl Drop for StandIn {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn create<T>(api: &Api<T>, value: serde_json::Value)
where
    T: kube::Resource + Clone + serde::de::DeserializeOwned + serde::Serialize + std::fmt::Debug,
{
    let obj: T = serde_json::from_value(value.clone()).expect("object");
    api.create(&PostParams::default(), &obj)
        .await
        .unwrap_or_else(|e| panic!("create {value}: {e}"));
}

/// The Cluster's `<cluster>-kubeconfig` Secret with `kubeconfig`, as a control-plane
/// provider writes it (replaced when there).
async fn give_kubeconfig(env: &Env, cluster: &str, kubeconfig: Vec<u8>) {
    let name = format!("{cluster}-kubeconfig");
    let _ = env.secrets().delete(&name, &DeleteParams::default()).await;
    wait_for("the old kubeconfig Secret gone", long(), || async {
        !env.secret_exists(&name).await
    })
    .await;
    create(
        &env.secrets(),
        json!({
            "metadata": {"name": name,
                "labels": {names::CAPI_CLUSTER_NAME_LABEL: cluster}},
            "type": "cluster.x-k8s.io/secret",
            "data": {"value": k8s_openapi::ByteString(kubeconfig)}
        }),
    )
    .await;
}

async fn annotate_cluster(env: &Env, cluster: &str, annotations: serde_json::Value) {
    env.cluster_api()
        .patch(
            cluster,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": annotations}})),
        )
        .await
        .expect("annotate the Cluster");
}

async fn hooked(env: &Env, machine: &str) -> bool {
    env.capi_api("Machine")
        .get_opt(machine)
        .await
        .expect("get the Machine")
        .is_some_and(|m| {
            m.annotations()
                .get(names::WORKLOAD_CLEANUP_HOOK)
                .map(String::as_str)
                == Some(names::WORKLOAD_CLEANUP_HOOK_OWNER)
        })
}

/// The TerraformCluster's `WorkloadCleanedUp` condition: reason and message.
async fn cleanup_condition(env: &Env, name: &str) -> Option<(String, String)> {
    env.condition::<Tfc>(name, CONDITION)
        .await
        .map(|(_, r, m)| (r, m))
}

/// The manager, the cleanup on for every Cluster when `by_default` (else by the Cluster's
/// annotation), with a short backoff and its metrics on a port of their own (returned).
async fn start(tag: &str, give_up_after: Duration, by_default: bool) -> (Env, u16) {
    let mut env = Env::builder(tag).start().await;
    env.config.workload_cleanup = by_default;
    env.config.provision = true;
    env.config.settings.backoff.base = Duration::from_millis(300);
    env.config.settings.backoff.max = Duration::from_millis(600);
    env.config.workload_cleanup_give_up_after = give_up_after;
    let port = free_port();
    env.config.metrics_addr = Some(format!("127.0.0.1:{port}").parse().expect("addr"));
    env.start_manager();
    (env, port)
}

/// A Cluster opted in, its TerraformCluster provisioned and its control plane ready, and
/// the machines `machines` provisioned, each held by the hook.
async fn cluster_with_machines(env: &Env, annotations: serde_json::Value, machines: &[&str]) {
    env.create_cluster("prod").await;
    annotate_cluster(env, "prod", annotations).await;
    env.provision::<Tfc>("prod", "prod", &apply_module(0)).await;
    env.mark_cluster_ready("prod").await;
    for m in machines {
        env.provision::<Tfm>(m, "prod", &apply_module(0)).await;
    }
    for m in machines {
        wait_for(&format!("the hook on Machine {m}"), long(), || {
            hooked(env, m)
        })
        .await;
    }
}

/// A second control plane as the workload cluster of Cluster `prod` (its kubeconfig in
/// `prod-kubeconfig`), the manager started ([`start`], the cleanup on by default when
/// `by_default`), and the Cluster made with `annotations` and its `machines`
/// ([`cluster_with_machines`]). The plane stops when the returned handle goes.
async fn with_workload_cluster(
    tag: &str,
    by_default: bool,
    annotations: serde_json::Value,
    machines: &[&str],
) -> (Arc<ControlPlane>, Client, Env, u16) {
    let plane = tokio::task::spawn_blocking(|| ControlPlane::dedicated_without_capi("workload"))
        .await
        .expect("the workload cluster");
    let wl = plane.client().await;
    let (env, port) = start(tag, Duration::from_secs(600), by_default).await;
    let kubeconfig = std::fs::read(plane.kubeconfig()).expect("the workload kubeconfig");
    give_kubeconfig(&env, "prod", kubeconfig).await;
    cluster_with_machines(&env, annotations, machines).await;
    (plane, wl, env, port)
}

/// The workload cluster of a deleted Cluster is cleaned up in seed 000's steps before
/// any infrastructure Machine goes: the webhook that refuses deletes first, then the
/// extended APIs, then the workloads, the load balancer and the volumes (one whose cloud
/// resource never goes is finalized by force after its period), then the snapshots;
/// objects in a namespace already gone, objects made after the start plus the period,
/// and what the API server and kube-system need are left alone. A Machine deleted before
/// (a scale-down) is not held. The condition, the Events and the metrics say so.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_deleted_clusters_workload_is_cleaned_up_step_by_step_before_its_machines_go() {
    if envtest_only("it starts a second control plane as the workload cluster") {
        return;
    }
    let (_plane, wl, env, port) = with_workload_cluster(
        "wl-clean",
        false,
        json!({
            names::WORKLOAD_CLEANUP: "true",
            names::WORKLOAD_CLEANUP_WEBHOOKS_SECONDS: "30",
            names::WORKLOAD_CLEANUP_EXTENDED_APIS_SECONDS: "30",
            names::WORKLOAD_CLEANUP_RESOURCES_SECONDS: "8",
            names::WORKLOAD_CLEANUP_SNAPSHOTS_SECONDS: "30",
        }),
        &["web-1", "web-2"],
    )
    .await;

    // A scale-down while the Cluster lives: the hook comes off at once, the machine goes,
    // and no cleanup starts.
    env.capi_api("Machine")
        .delete("web-2", &DeleteParams::default())
        .await
        .expect("delete Machine web-2");
    env.wait_gone::<Tfm>("web-2", long()).await;
    assert!(env.destroyed("web-2"));
    let tfc = env.object::<Tfc>("prod").await.expect("TerraformCluster");
    assert!(
        !tfc.annotations()
            .contains_key(names::WORKLOAD_CLEANUP_STARTED),
        "a scale-down is no cleanup"
    );

    // The workload cluster: what each step deletes, and what it must leave alone.
    let ns_api = Api::<Namespace>::all(wl.clone());
    for ns in ["apps", "ghost"] {
        create(&ns_api, json!({"metadata": {"name": ns}})).await;
    }
    let vwc = Api::<DynamicObject>::all_with(wl.clone(), &webhooks());
    let vwc_obj: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingWebhookConfiguration",
        "metadata": {"name": "refuse-deletes", "finalizers": ["test.captf.io/webhook-owner"]},
        "webhooks": [{"name": "refuse.deletes.test", "sideEffects": "None",
            "admissionReviewVersions": ["v1"], "failurePolicy": "Fail", "timeoutSeconds": 2,
            "clientConfig": {"url": "https://127.0.0.1:1/refuse"},
            "rules": [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["DELETE"],
                "resources": ["services", "persistentvolumeclaims"]}]}]
    }))
    .expect("webhook");
    vwc.create(&PostParams::default(), &vwc_obj)
        .await
        .expect("create the webhook");
    let crds = Api::<DynamicObject>::all_with(
        wl.clone(),
        &ar(
            "apiextensions.k8s.io",
            "v1",
            "CustomResourceDefinition",
            "customresourcedefinitions",
        ),
    );
    for (group, plural, kind) in [
        ("example.com", "widgets", "Widget"),
        (
            "snapshot.storage.k8s.io",
            "volumesnapshots",
            "VolumeSnapshot",
        ),
    ] {
        let crd: DynamicObject = serde_json::from_value(json!({
            "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
            "metadata": {"name": format!("{plural}.{group}"), "annotations": if group.ends_with(".k8s.io") {
                json!({"api-approved.kubernetes.io": "https://github.com/kubernetes-csi/external-snapshotter/pull/863"})
            } else {
                json!({})
            }},
            "spec": {"group": group, "scope": "Namespaced",
                "names": {"plural": plural, "kind": kind, "singular": kind.to_lowercase()},
                "versions": [{"name": "v1", "served": true, "storage": true,
                    "schema": {"openAPIV3Schema": {"type": "object",
                        "x-kubernetes-preserve-unknown-fields": true}}}]}
        }))
        .expect("crd");
        crds.create(&PostParams::default(), &crd)
            .await
            .expect("create a CRD");
    }
    let services = |ns: &str| Api::<Service>::namespaced(wl.clone(), ns);
    let pvcs = |ns: &str| Api::<PersistentVolumeClaim>::namespaced(wl.clone(), ns);
    let pvc = |name: &str, finalizers: Vec<&str>| {
        json!({"metadata": {"name": name, "finalizers": finalizers},
            "spec": {"accessModes": ["ReadWriteOnce"],
                "resources": {"requests": {"storage": "1Gi"}}}})
    };
    create(
        &services("apps"),
        json!({"metadata": {"name": "lb",
            "finalizers": ["service.kubernetes.io/load-balancer-cleanup"]},
            "spec": {"type": "LoadBalancer", "ports": [{"port": 80}]}}),
    )
    .await;
    create(&pvcs("apps"), pvc("data", vec![])).await;
    create(&pvcs("apps"), pvc("stuck", vec![NEVER])).await;
    create(&pvcs("ghost"), pvc("orphan", vec![NEVER])).await;
    create(
        &Api::<k8s_openapi::api::apps::v1::Deployment>::namespaced(wl.clone(), "apps"),
        json!({"metadata": {"name": "web"}, "spec": {"replicas": 0,
            "selector": {"matchLabels": {"app": "web"}},
            "template": {"metadata": {"labels": {"app": "web"}},
                "spec": {"containers": [{"name": "web", "image": "web"}]}}}}),
    )
    .await;
    create(
        &services("kube-system"),
        json!({"metadata": {"name": "cloud-controller"}, "spec": {"ports": [{"port": 443}]}}),
    )
    .await;
    let snaps = Api::<DynamicObject>::namespaced_with(wl.clone(), "apps", &snapshots());
    wait_for("VolumeSnapshots served", long(), || async {
        snaps.list(&ListParams::default()).await.is_ok()
    })
    .await;
    let snap: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "snapshot.storage.k8s.io/v1", "kind": "VolumeSnapshot",
        "metadata": {"name": "nightly",
            "finalizers": ["snapshot.storage.kubernetes.io/volumesnapshot-as-source-protection"]},
        "spec": {"source": {"persistentVolumeClaimName": "data"}}
    }))
    .expect("snapshot");
    snaps
        .create(&PostParams::default(), &snap)
        .await
        .expect("create the snapshot");
    // The webhook refuses deletes while it is there.
    let refused = services("apps")
        .delete("lb", &DeleteParams::default())
        .await
        .expect_err("the webhook refuses");
    assert!(
        refused.to_string().contains("refuse.deletes.test"),
        "{refused}"
    );
    // A namespace finalized while an object in it is held: gone, the object stays.
    ns_api
        .delete("ghost", &DeleteParams::default())
        .await
        .expect("delete the ghost namespace");
    let mut ghost = ns_api.get("ghost").await.expect("ghost");
    ghost.spec = Some(Default::default());
    ns_api
        .replace_subresource("finalize", "ghost", &PostParams::default(), &ghost)
        .await
        .expect("finalize the ghost namespace");
    wait_for("the ghost namespace gone", long(), || async {
        ns_api.get_opt("ghost").await.expect("get").is_none()
    })
    .await;
    assert!(
        pvcs("ghost")
            .get_opt("orphan")
            .await
            .expect("get")
            .is_some()
    );

    let stand_in = StandIn::start(wl.clone(), Duration::from_secs(2));
    env.delete_cluster("prod").await;
    let step1 = wait_for_value("step 1 in the condition", long(), || async {
        cleanup_condition(&env, "prod")
            .await
            .filter(|(r, m)| r == reason::CLEANING && m.starts_with("step 1 of 4"))
    })
    .await;
    assert!(
        step1
            .1
            .contains("ValidatingWebhookConfiguration refuse-deletes"),
        "{step1:?}"
    );
    // Step 3 names what remains and when force applies.
    let step3 = wait_for_value("step 3 in the condition", long(), || async {
        cleanup_condition(&env, "prod").await.filter(|(r, m)| {
            r == reason::CLEANING && m.starts_with("step 3 of 4") && m.contains("by force from")
        })
    })
    .await;
    assert!(
        step3.1.contains("PersistentVolumeClaim apps/stuck"),
        "{step3:?}"
    );
    // Meanwhile Cluster API holds the machine: its Machine is deleted, its infrastructure
    // is not.
    let tfm = env.object::<Tfm>("web-1").await.expect("TerraformMachine");
    assert!(
        tfm.metadata.deletion_timestamp.is_none(),
        "destroyed during the cleanup"
    );
    assert!(hooked(&env, "web-1").await);
    // An object made after the start plus its step's period is left alone.
    let started: jiff::Timestamp = env
        .object::<Tfc>("prod")
        .await
        .expect("TerraformCluster")
        .annotations()[names::WORKLOAD_CLEANUP_STARTED]
        .parse()
        .expect("started");
    let late_at = started + jiff::SignedDuration::from_secs(10);
    if let Ok(wait) = late_at.duration_since(jiff::Timestamp::now()).try_into() {
        tokio::time::sleep(wait).await;
    }
    create(&pvcs("apps"), pvc("late", vec![NEVER])).await;

    let done = wait_for_value("the cleanup done", long(), || async {
        cleanup_condition(&env, "prod")
            .await
            .filter(|(r, _)| r == reason::CLEANED_UP)
    })
    .await;
    assert!(done.1.contains("is cleaned up"), "{done:?}");
    wait_for("everything released", long(), || async {
        !env.exists::<Tfm>("web-1").await && !env.exists::<Tfc>("prod").await
    })
    .await;
    assert!(env.destroyed("web-1") && env.destroyed("prod"));

    // The order of the steps: the webhook gone before any delete of step 3, the
    // snapshot's deletion after the volumes were released, the machine's destroy after
    // everything.
    let webhook_gone = stand_in
        .released("ValidatingWebhookConfiguration refuse-deletes")
        .expect("the webhook released");
    let lb_deleted = stand_in.deleting("Service apps/lb").expect("lb deleted");
    assert!(
        lb_deleted >= webhook_gone,
        "step 3 began before step 1 ended"
    );
    let lb_released = stand_in.released("Service apps/lb").expect("lb released");
    let data_released = stand_in
        .released("PersistentVolumeClaim apps/data")
        .expect("data released");
    let snap_deleted = stand_in
        .deleting("VolumeSnapshot apps/nightly")
        .expect("snapshot deleted");
    assert!(
        snap_deleted >= lb_released.max(data_released),
        "step 4 before step 3 ended"
    );
    let destroyed = env.destroyed_at("web-1").expect("destroyed");
    assert!(
        destroyed
            >= stand_in
                .released("VolumeSnapshot apps/nightly")
                .expect("snapshot released")
    );
    // What each step took: the webhook, the extended API, the workloads, the volumes.
    assert!(vwc.get_opt("refuse-deletes").await.expect("get").is_none());
    assert!(
        crds.get_opt("widgets.example.com")
            .await
            .expect("get")
            .is_none()
    );
    let deployments = Api::<k8s_openapi::api::apps::v1::Deployment>::namespaced(wl.clone(), "apps");
    assert!(deployments.get_opt("web").await.expect("get").is_none());
    for name in ["data", "stuck"] {
        assert!(
            pvcs("apps").get_opt(name).await.expect("get").is_none(),
            "{name}"
        );
    }
    assert!(snaps.get_opt("nightly").await.expect("get").is_none());
    // What it left alone: the orphan of a gone namespace (still held), the late claim
    // (never deleted), the API server's Service, kube-system, the snapshot CRD.
    let orphan = pvcs("ghost")
        .get_opt("orphan")
        .await
        .expect("get")
        .expect("orphan");
    assert!(orphan.finalizers().iter().any(|f| f == NEVER));
    let late = pvcs("apps")
        .get_opt("late")
        .await
        .expect("get")
        .expect("late");
    assert!(
        late.metadata.deletion_timestamp.is_none(),
        "the late claim was deleted"
    );
    assert!(
        services("default")
            .get_opt("kubernetes")
            .await
            .expect("get")
            .is_some()
    );
    assert!(
        services("kube-system")
            .get_opt("cloud-controller")
            .await
            .expect("get")
            .is_some()
    );
    assert!(
        crds.get_opt("volumesnapshots.snapshot.storage.k8s.io")
            .await
            .expect("get")
            .is_some()
    );

    // The Events and the metrics.
    let reasons = env.event_reasons("prod").await;
    for r in [
        "WorkloadCleanupStarted",
        "WorkloadCleanupStep",
        "WorkloadObjectFinalized",
        "WorkloadCleanedUp",
    ] {
        assert!(reasons.iter().any(|x| x == r), "{r} not in {reasons:?}");
    }
    let (_, text) = http_get(port, "/metrics").await;
    assert!(
        text.contains("captf_workload_cleanups_total{outcome=\"CleanedUp\"} 1"),
        "{text}"
    );
    assert!(
        text.contains("captf_workload_objects_forced_total{step=\"Resources\"} 1"),
        "only the stuck claim was forced: {text}"
    );
    drop(stand_in);
    env.shutdown().await;
}

/// A workload cluster the cleanup cannot reach holds the Machines for a bounded time
/// only: the condition names why and when it gives up; then a Warning, the hooks come
/// off, and the infrastructure is destroyed.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_cleanup_that_cannot_reach_the_workload_cluster_gives_up_and_lets_the_machines_go() {
    if envtest_only("it reads the files Terraform leaves on this machine") {
        return;
    }
    let (env, port) = start("wl-gone", Duration::from_secs(6), false).await;
    cluster_with_machines(&env, json!({names::WORKLOAD_CLEANUP: "true"}), &["web-1"]).await;
    // The workload cluster's address goes nowhere (its API server is gone).
    let kubeconfig = format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: prod\n  cluster:\n    server: https://127.0.0.1:{}\n    insecure-skip-tls-verify: true\nusers:\n- name: admin\n  user:\n    token: x\ncontexts:\n- name: prod\n  context: {{cluster: prod, user: admin}}\ncurrent-context: prod\n",
        free_port()
    );
    give_kubeconfig(&env, "prod", kubeconfig.into_bytes()).await;
    env.delete_cluster("prod").await;
    let (_, msg) = wait_for_value("the cleanup failing", long(), || async {
        cleanup_condition(&env, "prod")
            .await
            .filter(|(r, _)| r == reason::UNREACHABLE)
    })
    .await;
    assert!(
        msg.contains("the cleanup gives up at")
            && msg.contains("listing ValidatingWebhookConfigurations")
            && msg.contains("runbooks/WorkloadClusterUnreachable.md"),
        "{msg}"
    );
    let tfm = env.object::<Tfm>("web-1").await.expect("TerraformMachine");
    assert!(
        tfm.metadata.deletion_timestamp.is_none(),
        "destroyed while failing"
    );
    let (_, gave_up) = wait_for_value("the cleanup given up", long(), || async {
        cleanup_condition(&env, "prod")
            .await
            .filter(|(r, _)| r == reason::GAVE_UP)
    })
    .await;
    assert!(
        gave_up.contains("runbooks/WorkloadClusterUnreachable.md"),
        "{gave_up}"
    );
    wait_for("everything released", long(), || async {
        !env.exists::<Tfm>("web-1").await && !env.exists::<Tfc>("prod").await
    })
    .await;
    assert!(env.destroyed("web-1") && env.destroyed("prod"));
    let reasons = env.event_reasons("prod").await;
    for r in ["WorkloadCleanupFailing", "WorkloadCleanupGaveUp"] {
        assert!(reasons.iter().any(|x| x == r), "{r} not in {reasons:?}");
    }
    let (_, text) = http_get(port, "/metrics").await;
    assert!(
        text.contains("captf_workload_cleanups_total{outcome=\"GaveUp\"} 1"),
        "{text}"
    );
    env.shutdown().await;
}

/// The manager's default turns the cleanup on without a Cluster annotation; the skip
/// annotation limits it to Services and PersistentVolumeClaims (the webhook and the
/// Deployment stay); a period of 0 finalizes them at once, with nothing to remove their
/// finalizers; a paused Cluster's deletion starts no cleanup until it is unpaused; what an
/// earlier object of the same name recorded of its cleanup is not this one's.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_skip_annotation_and_a_period_of_zero_clean_up_only_services_and_claims_at_once() {
    if envtest_only("it starts a second control plane as the workload cluster") {
        return;
    }
    let (_plane, wl, env, port) = with_workload_cluster(
        "wl-skip",
        true,
        json!({
            names::WORKLOAD_CLEANUP_SKIP: "true",
            names::WORKLOAD_CLEANUP_RESOURCES_SECONDS: "0",
        }),
        &["web-1"],
    )
    .await;
    create(
        &Api::<Namespace>::all(wl.clone()),
        json!({"metadata": {"name": "apps"}}),
    )
    .await;
    let vwc = Api::<DynamicObject>::all_with(wl.clone(), &webhooks());
    let keep: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingWebhookConfiguration",
        "metadata": {"name": "keep-me"},
        "webhooks": [{"name": "keep.me.test", "sideEffects": "None",
            "admissionReviewVersions": ["v1"], "failurePolicy": "Ignore", "timeoutSeconds": 1,
            "clientConfig": {"url": "https://127.0.0.1:1/keep"},
            "rules": [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["DELETE"],
                "resources": ["configmaps"]}]}]
    }))
    .expect("webhook");
    vwc.create(&PostParams::default(), &keep)
        .await
        .expect("create the webhook");
    let deployments = Api::<k8s_openapi::api::apps::v1::Deployment>::namespaced(wl.clone(), "apps");
    create(
        &deployments,
        json!({"metadata": {"name": "web"}, "spec": {"replicas": 0,
            "selector": {"matchLabels": {"app": "web"}},
            "template": {"metadata": {"labels": {"app": "web"}},
                "spec": {"containers": [{"name": "web", "image": "web"}]}}}}),
    )
    .await;
    let services = Api::<Service>::namespaced(wl.clone(), "apps");
    create(
        &services,
        json!({"metadata": {"name": "lb", "finalizers": [NEVER]},
            "spec": {"type": "LoadBalancer", "ports": [{"port": 80}]}}),
    )
    .await;
    let pvcs = Api::<PersistentVolumeClaim>::namespaced(wl.clone(), "apps");
    create(
        &pvcs,
        json!({"metadata": {"name": "data", "finalizers": [NEVER]},
            "spec": {"accessModes": ["ReadWriteOnce"],
                "resources": {"requests": {"storage": "1Gi"}}}}),
    )
    .await;

    // What an earlier TerraformCluster of the same name recorded of its cleanup, come back
    // with its saved YAML: it does not stand for this deletion's.
    env.annotate::<Tfc>(
        "prod",
        &[
            (
                names::WORKLOAD_CLEANUP_STARTED,
                Some("2026-01-01T00:00:00Z".into()),
            ),
            (
                names::WORKLOAD_CLEANUP_FINISHED,
                Some(names::WORKLOAD_CLEANUP_DONE.into()),
            ),
        ],
    )
    .await;
    // Paused, its deletion starts nothing.
    env.set_cluster_paused("prod", true).await;
    env.delete_cluster("prod").await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let tfc = env.object::<Tfc>("prod").await.expect("TerraformCluster");
    assert_eq!(
        tfc.annotations()
            .get(names::WORKLOAD_CLEANUP_STARTED)
            .map(String::as_str),
        Some("2026-01-01T00:00:00Z"),
        "a paused Cluster's cleanup started"
    );
    assert!(
        services
            .get("lb")
            .await
            .expect("lb")
            .metadata
            .deletion_timestamp
            .is_none()
    );
    env.set_cluster_paused("prod", false).await;

    wait_for_value("the cleanup done", long(), || async {
        cleanup_condition(&env, "prod")
            .await
            .filter(|(r, _)| r == reason::CLEANED_UP)
    })
    .await;
    wait_for("everything released", long(), || async {
        !env.exists::<Tfm>("web-1").await && !env.exists::<Tfc>("prod").await
    })
    .await;
    assert!(env.destroyed("web-1") && env.destroyed("prod"));
    for (what, gone) in [
        (
            "Service apps/lb",
            services.get_opt("lb").await.expect("get").is_none(),
        ),
        (
            "PersistentVolumeClaim apps/data",
            pvcs.get_opt("data").await.expect("get").is_none(),
        ),
    ] {
        assert!(gone, "{what} is still there");
    }
    assert!(
        vwc.get_opt("keep-me").await.expect("get").is_some(),
        "the webhook was deleted"
    );
    assert!(
        deployments.get_opt("web").await.expect("get").is_some(),
        "the Deployment was deleted"
    );
    let (_, text) = http_get(port, "/metrics").await;
    assert!(
        text.contains("captf_workload_objects_forced_total{step=\"Resources\"} 2"),
        "{text}"
    );
    env.shutdown().await;
}
