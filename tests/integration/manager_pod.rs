//! The manager as an installation runs it: its image, built here without a container
//! engine (`release/build-image`: the static release binary, from scratch, as an OCI
//! archive), given to the local kubelet as its image store, and CAPTF installed from
//! `config/default` with that image. The Pod runs the image itself (its root filesystem,
//! read-only; user 65532), in `captf-system` under the restricted Pod Security Standard,
//! with its ServiceAccount's token and the ClusterRole of `config/rbac`; it becomes ready,
//! leads, and applies a TerraformCluster in a runner Job. Deleted, it gets SIGTERM, exits
//! 0 within its grace period having given up its Lease, and the Deployment's next Pod
//! takes the Lease at once.

use std::collections::BTreeMap;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, ListParams};
use kube::runtime::{WatchStreamExt, watcher};
use serde_json::json;

use captf::api::names::{self, Kind};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::PostParams;

use crate::local_images::scratch_dir;
use crate::manager::{free_port, try_http_get};
use crate::provisioning::wait_condition;
use crate::support::*;
use crate::templates::{VERSION, clusterctl, clusterctl_inventory, local_repository, temp_dir};

const WAIT: Duration = Duration::from_secs(90);
const SYSTEM: &str = "captf-system";
const LEASE: &str = "captf-manager-leader";
/// The Deployment's `terminationGracePeriodSeconds`.
const GRACE: Duration = Duration::from_secs(30);

/// The reference the test image is named by: canonical, in a registry that is not one.
fn image_ref() -> String {
    format!("registry.captf.test/captf:v{}", env!("CARGO_PKG_VERSION"))
}

/// Builds the image archive into `store` with `release/build-image` (the release binary
/// is cached in the target directory); the archive and its manifest's digest.
fn build_image(store: &Path) -> (PathBuf, String) {
    let root = repo_root();
    let mut cmd = Command::new(root.join("release/build-image"));
    // Cargo's variables for this test process are not the build's (see
    // `support::cluster::binaries`): the nested build would compile everything again.
    for (key, _) in std::env::vars_os() {
        let key = key.to_string_lossy();
        if (key.starts_with("CARGO_") && key != "CARGO_HOME" && key != "CARGO_TARGET_DIR")
            || key == "LD_LIBRARY_PATH"
            || key == "OUT_DIR"
        {
            cmd.env_remove(key.as_ref());
        }
    }
    let t = Instant::now();
    let out = cmd
        .args(["--image", &image_ref(), "--out"])
        .arg(store)
        .env("CARGO", env!("CARGO"))
        .stderr(Stdio::inherit())
        .output()
        .expect("run release/build-image");
    assert!(
        out.status.success(),
        "release/build-image failed ({}); run it by hand to see why",
        out.status
    );
    eprintln!("release/build-image took {:.1?}", t.elapsed());
    let archive = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
    // The manifest's digest, from the archive's index.
    let mut tar = tar::Archive::new(std::fs::File::open(&archive).expect("the archive"));
    let mut index = String::new();
    for entry in tar.entries().expect("entries") {
        let mut entry = entry.expect("entry");
        if entry.path().expect("path").as_os_str() == "index.json" {
            entry.read_to_string(&mut index).expect("index.json");
        }
    }
    let index: serde_json::Value = serde_json::from_str(&index).expect("the archive's index");
    let m = &index["manifests"][0];
    assert_eq!(
        m["annotations"]["org.opencontainers.image.ref.name"],
        image_ref()
    );
    (archive, m["digest"].as_str().expect("digest").to_string())
}

/// `config/default` as `kubectl kustomize` builds it, with the image set to `image` and the
/// probe and metrics ports moved to `health` and `metrics` (the local kubelet's Pods share
/// this machine's network, where 8443 and 8081 may be taken).
fn install_manifests(image: &str, health: u16, metrics: u16) -> String {
    let out = Command::new("kubectl")
        .arg("kustomize")
        .arg(repo_root().join("config/default"))
        .output()
        .expect("kubectl kustomize");
    assert!(
        out.status.success(),
        "kubectl kustomize config/default: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let yaml = String::from_utf8(out.stdout).expect("UTF-8");
    let from = "image: captf:latest";
    assert_eq!(yaml.matches(from).count(), 1, "{from} in:\n{yaml}");
    on_ports(
        &yaml.replace(from, &format!("image: {image}")),
        health,
        metrics,
    )
}

/// The manager's manifests `yaml` with its probe and metrics ports (8081 and 8443, in its
/// arguments and in the ports its probes name) moved to `health` and `metrics`.
fn on_ports(yaml: &str, health: u16, metrics: u16) -> String {
    let mut edited = yaml.to_string();
    for (from, to) in [
        (
            "--health-probe-bind-address=0.0.0.0:8081",
            format!("--health-probe-bind-address=0.0.0.0:{health}"),
        ),
        (
            "--metrics-bind-address=0.0.0.0:8443",
            format!("--metrics-bind-address=0.0.0.0:{metrics}"),
        ),
        ("containerPort: 8081", format!("containerPort: {health}")),
        ("containerPort: 8443", format!("containerPort: {metrics}")),
    ] {
        assert_eq!(edited.matches(from).count(), 1, "{from} in:\n{yaml}");
        edited = edited.replace(from, &to);
    }
    edited
}

fn kubectl(env: &Env, args: &[&str], stdin: Option<&str>) -> String {
    use std::io::Write;
    let mut child = Command::new("kubectl")
        .arg("--kubeconfig")
        .arg(env.kubeconfig_path())
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("kubectl");
    let mut input = child.stdin.take().expect("stdin");
    input
        .write_all(stdin.unwrap_or_default().as_bytes())
        .expect("kubectl's input");
    drop(input);
    let out = child.wait_with_output().expect("kubectl");
    assert!(
        out.status.success(),
        "kubectl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The manager Pods of the Deployment, by name.
async fn manager_pods(pods: &Api<Pod>) -> Vec<Pod> {
    pods.list(&ListParams::default().labels("control-plane=captf-manager"))
        .await
        .expect("list the manager's Pods")
        .items
}

/// Whether the Pod's `Ready` condition is True.
fn pod_ready(p: &Pod) -> bool {
    p.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

fn running(p: &Pod) -> bool {
    p.metadata.deletion_timestamp.is_none()
        && p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
}

/// The host PID of the container process running `/captf manager` for Pod `pod`.
fn manager_process(pod: &str) -> Option<u32> {
    std::fs::read_dir("/proc").ok()?.flatten().find_map(|e| {
        let pid: u32 = e.file_name().to_str()?.parse().ok()?;
        let cmdline = std::fs::read(e.path().join("cmdline")).ok()?;
        if !cmdline.starts_with(b"/captf\0manager\0") {
            return None;
        }
        let environ = std::fs::read(e.path().join("environ")).ok()?;
        environ
            .split(|b| *b == 0)
            .any(|v| v == format!("POD_NAME={pod}").as_bytes())
            .then_some(pid)
    })
}

/// The fields of `/proc/PID/status` named `key` (e.g. `Uid:`).
fn proc_status(pid: u32, key: &str) -> Vec<String> {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find(|l| l.starts_with(key))
        .map(|l| l.split_whitespace().skip(1).map(str::to_string).collect())
        .unwrap_or_default()
}

/// A task aborted when this is dropped, however the test ends.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

async fn holder(leases: &Api<Lease>) -> Option<String> {
    leases
        .get_opt(LEASE)
        .await
        .ok()
        .flatten()
        .and_then(|l| l.spec)
        .and_then(|s| s.holder_identity)
        .filter(|h| !h.is_empty())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_manager_runs_as_a_pod_from_its_image_and_stops_gracefully() {
    if envtest_only("it gives the local kubelet an image store") {
        return;
    }
    let t0 = Instant::now();
    let store = scratch_dir("manager-image");
    let store_for_build = store.clone();
    let (archive, digest) = tokio::task::spawn_blocking(move || build_image(&store_for_build))
        .await
        .expect("build the image");
    let built = t0.elapsed();
    let env = Env::builder("manager-pod")
        .kubelet_args(&[&format!("--image-store={}", store.display())])
        .start()
        .await;
    let (health, metrics) = (free_port(), free_port());
    let image = image_ref();
    kubectl(
        &env,
        &["apply", "-f", "-"],
        Some(&install_manifests(&image, health, metrics)),
    );
    let installed = Instant::now();
    let pods: Api<Pod> = Api::namespaced(env.client.clone(), SYSTEM);
    let leases: Api<Lease> = Api::namespaced(env.client.clone(), SYSTEM);

    // The Deployment's Pod runs, from the image.
    wait_for("the manager's Pod to run", WAIT, || async {
        manager_pods(&pods).await.iter().any(running)
    })
    .await;
    let first = manager_pods(&pods)
        .await
        .into_iter()
        .find(running)
        .expect("a running Pod");
    let name = first.name_any();
    let uid = first.metadata.uid.clone().expect("uid");
    let status = serde_json::to_value(&first.status).expect("status");
    let c = &status["containerStatuses"][0];
    assert_eq!(c["image"], image, "{c}");
    assert_eq!(
        c["imageID"].as_str(),
        Some(format!("registry.captf.test/captf@{digest}").as_str()),
        "the image's digest: {c}"
    );
    // Ready by its readiness probe (/readyz, after the probe's initial delay of 5 s).
    wait_for("the manager's Pod to be Ready", WAIT, || async {
        pods.get(&name).await.is_ok_and(|p| pod_ready(&p))
    })
    .await;
    let ready = installed.elapsed();
    readyz_answers(&pods, &name, health).await;
    assert_eq!(holder(&leases).await.as_deref(), Some(name.as_str()));

    // The process: the image's root filesystem, read-only, not the host's; user 65532.
    let pid = manager_process(&name).expect("the manager's process");
    let root = PathBuf::from(format!("/proc/{pid}/root"));
    assert!(root.join("captf").is_file(), "/captf of the image");
    assert!(
        !root.join("usr/bin/kubectl").exists() && !root.join("bin/sh").exists(),
        "none of the host's programs"
    );
    assert!(
        std::fs::read_to_string(root.join("etc/passwd"))
            .unwrap_or_default()
            .contains("nonroot:x:65532:65532:")
    );
    let err = std::fs::write(root.join("tmp/written"), "x").expect_err("read-only");
    assert_eq!(
        err.raw_os_error(),
        Some(libc::EROFS),
        "readOnlyRootFilesystem: {err}"
    );
    assert_eq!(proc_status(pid, "Uid:"), ["65532"; 4]);
    assert_eq!(proc_status(pid, "Gid:"), ["65532"; 4]);
    assert_eq!(proc_status(pid, "NoNewPrivs:"), ["1"]);

    // It works, under config/rbac: a TerraformCluster applied in a runner Job.
    let cluster_uid = env.create_cluster("prod").await;
    env.create_owned::<Tfc>(
        "prod",
        "prod",
        &[("Cluster", "prod", &cluster_uid, false)],
        &apply_module(0),
        json!({}),
    )
    .await;
    wait_condition::<Tfc>(&env, "prod", "Provisioned", "True", "Provisioned").await;
    let applied = installed.elapsed();

    // Deleted: SIGTERM; it exits 0 within its grace period, its Lease released, and the
    // Deployment's next Pod takes the Lease at once.
    let seen: Arc<Mutex<BTreeMap<String, Pod>>> = Arc::default();
    // With a backoff: a watch whose API server is gone (the test failed and its control
    // plane stopped) must wait between its retries, or it never yields, and the test's
    // runtime cannot shut down (seen in CI: a failed run hung there). Aborted however the
    // test ends.
    let watch = AbortOnDrop(tokio::spawn({
        let seen = seen.clone();
        let stream = watcher(pods.clone(), watcher::Config::default()).default_backoff();
        async move {
            let mut stream = std::pin::pin!(stream);
            while let Some(ev) = stream.next().await {
                if let Ok(watcher::Event::Apply(p) | watcher::Event::Delete(p)) = ev {
                    let uid = p.metadata.uid.clone().unwrap_or_default();
                    seen.lock().expect("seen").insert(uid, p);
                }
            }
        }
    }));
    let deleted = Instant::now();
    pods.delete(&name, &DeleteParams::default())
        .await
        .expect("delete the Pod");
    let terminated = || {
        let seen = seen.lock().expect("seen");
        seen.get(&uid).and_then(|p| {
            let s = serde_json::to_value(&p.status).ok()?;
            let t = s["containerStatuses"][0]["state"]["terminated"].clone();
            t.is_object().then_some(t)
        })
    };
    wait_for("the old Pod's container to end", GRACE + WAIT, || async {
        terminated().is_some()
    })
    .await;
    let stopped = deleted.elapsed();
    let t = terminated().expect("terminated");
    // Exit 0, "Completed": it stopped by itself on SIGTERM, within its grace period (the
    // kubelet's SIGKILL at the end of it gives 137). No bound on the time: a loaded
    // machine may be slow to deliver the signal; the time is printed below.
    assert_eq!(t["exitCode"], 0, "{t}");
    assert_eq!(t["reason"], "Completed", "{t}");
    // The Lease as the old Pod left it: released (no holder, a duration of one second),
    // so that the next Pod need not wait for it to expire; or already the next Pod's.
    let lease = leases.get(LEASE).await.expect("the Lease");
    let spec = lease.spec.clone().unwrap_or_default();
    let holder_now = spec.holder_identity.clone().unwrap_or_default();
    assert!(
        holder_now != name,
        "the old Pod gave the Lease up: {spec:?}"
    );
    if holder_now.is_empty() {
        assert_eq!(
            spec.lease_duration_seconds,
            Some(1),
            "released as client-go releases it: {spec:?}"
        );
    }
    wait_for("the next Pod to take the Lease", WAIT, || async {
        holder(&leases).await.is_some_and(|h| h != name)
    })
    .await;
    let takeover = deleted.elapsed() - stopped;
    let next = holder(&leases).await.expect("holder");
    assert!(
        manager_pods(&pods)
            .await
            .iter()
            .any(|p| p.name_any() == next && running(p)),
        "the Lease is held by the Deployment's next Pod, {next}"
    );
    drop(watch);

    // A rollout, as `clusterctl upgrade` or a changed flag makes one: the Deployment's
    // new Pod replaces the leading one and leads once that one gave the Lease up.
    wait_for("the leading Pod to be Ready", WAIT, || async {
        pods.get(&next).await.is_ok_and(|p| pod_ready(&p))
    })
    .await;
    let (moved, _) = move_manager_ports(&env).await;
    let rolled = ready_manager_on(&pods, moved, &digest).await;
    wait_for("the rolled-out Pod to lead", WAIT, || async {
        holder(&leases).await.as_deref() == Some(rolled.as_str())
    })
    .await;
    wait_for("the Pod it replaced to go", GRACE + WAIT, || async {
        !manager_pods(&pods)
            .await
            .iter()
            .any(|p| p.name_any() == next)
    })
    .await;
    eprintln!(
        "manager Pod: image built in {built:.1?} ({}), ready {ready:.1?} after the install, \
         applied a TerraformCluster {applied:.1?} after it; SIGTERM to exit {stopped:.1?}, \
         the next Pod leading {takeover:.1?} later; {:.1?} in all",
        archive.display(),
        t0.elapsed()
    );
    env.shutdown().await;
    let _ = std::fs::remove_dir_all(&store);
}

/// Moves the probe and metrics ports of the installed manager's Deployment to free ones:
/// its arguments and the ports its probes name. A new rollout, whose Pod leads once the
/// old one gave the Lease up.
async fn move_manager_ports(env: &Env) -> (u16, u16) {
    let (health, metrics) = (free_port(), free_port());
    let deployments: Api<Deployment> = Api::namespaced(env.client.clone(), SYSTEM);
    // Read and replaced again on a conflict: the Deployment controller writes its status
    // while a rollout goes on.
    for _ in 0..20 {
        let mut d = deployments
            .get("captf-manager")
            .await
            .expect("the manager's Deployment");
        let pod = d
            .spec
            .as_mut()
            .and_then(|s| s.template.spec.as_mut())
            .expect("its Pod template");
        let c = &mut pod.containers[0];
        for arg in c.args.iter_mut().flatten() {
            if arg.starts_with("--health-probe-bind-address=") {
                *arg = format!("--health-probe-bind-address=0.0.0.0:{health}");
            } else if arg.starts_with("--metrics-bind-address=") {
                *arg = format!("--metrics-bind-address=0.0.0.0:{metrics}");
            }
        }
        for p in c.ports.iter_mut().flatten() {
            match p.name.as_deref() {
                Some("healthz") => p.container_port = health.into(),
                Some("metrics") => p.container_port = metrics.into(),
                _ => {}
            }
        }
        match deployments
            .replace("captf-manager", &PostParams::default(), &d)
            .await
        {
            Ok(_) => return (health, metrics),
            Err(kube::Error::Api(e)) if e.code == 409 => continue,
            Err(e) => panic!("move the manager's ports: {e}"),
        }
    }
    panic!("move the manager's ports: 20 conflicts in a row");
}

/// Waits for a Ready manager Pod listening on `health`, running the image `digest`, and for
/// its `/readyz` to answer 200; its name.
async fn ready_manager_on(pods: &Api<Pod>, health: u16, digest: &str) -> String {
    let found = || async {
        manager_pods(pods).await.into_iter().find_map(|p| {
            let on_port = p.spec.as_ref().is_some_and(|s| {
                s.containers[0]
                    .args
                    .iter()
                    .flatten()
                    .any(|a| a.ends_with(&format!(":{health}")))
            });
            (running(&p) && pod_ready(&p) && on_port).then(|| p.name_any())
        })
    };
    let start = Instant::now();
    let name = loop {
        if let Some(name) = found().await {
            break name;
        }
        if start.elapsed() > WAIT {
            // What there is instead: each Pod's ports, phase, conditions and containers,
            // and the log of each.
            let mut shown = String::new();
            for p in manager_pods(pods).await {
                let args = p
                    .spec
                    .as_ref()
                    .map(|s| s.containers[0].args.clone().unwrap_or_default().join(" "))
                    .unwrap_or_default();
                let log = pods
                    .logs(
                        &p.name_any(),
                        &kube::api::LogParams {
                            tail_lines: Some(40),
                            ..Default::default()
                        },
                    )
                    .await
                    .unwrap_or_else(|e| format!("(no log: {e})"));
                shown += &format!(
                    "\n{} (deleting: {}), args {args}\nstatus {}\nlog:\n{log}",
                    p.name_any(),
                    p.metadata.deletion_timestamp.is_some(),
                    serde_json::to_string(&p.status).unwrap_or_default()
                );
            }
            panic!(
                "timed out after {WAIT:?} waiting for a Ready manager Pod on port {health}; the Pods:{shown}"
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let pod = pods.get(&name).await.expect("the manager's Pod");
    let status = serde_json::to_value(&pod.status).expect("status");
    assert_eq!(
        status["containerStatuses"][0]["imageID"].as_str(),
        Some(format!("registry.captf.test/captf@{digest}").as_str()),
        "the Pod runs the image built here: {status}"
    );
    readyz_answers(pods, &name, health).await;
    name
}

/// Waits until the manager of Pod `name` answers `/readyz` on `health` with 200. The
/// kubelet's probe found it ready, but it is not ready again for a moment when its
/// controllers start again (Cluster API's kind found after it began), and a manager that
/// exits (a lost Lease under load; the kubelet restarts it) answers nothing for a moment:
/// both are polled through. What it answered last, its containers and its logs if it
/// never does.
async fn readyz_answers(pods: &Api<Pod>, name: &str, health: u16) {
    let start = Instant::now();
    let answer = || async {
        match try_http_get(health, "/readyz").await {
            Ok((code, _)) => format!("{code}"),
            Err(e) => format!("nothing ({e})"),
        }
    };
    let mut last = answer().await;
    while last != "200" && start.elapsed() < WAIT {
        tokio::time::sleep(Duration::from_millis(200)).await;
        last = answer().await;
    }
    if last != "200" {
        // A Ready Pod that does not answer ready again: its manager stopped or restarted,
        // or its caches never listed. Its log says why.
        let log = |previous: bool| {
            let params = kube::api::LogParams {
                previous,
                tail_lines: Some(60),
                ..Default::default()
            };
            async move {
                pods.logs(name, &params)
                    .await
                    .unwrap_or_else(|e| format!("(no log: {e})"))
            }
        };
        let statuses = pods
            .get(name)
            .await
            .ok()
            .and_then(|p| p.status)
            .map(|s| serde_json::to_string(&s.container_statuses).unwrap_or_default())
            .unwrap_or_default();
        panic!(
            "manager Pod {name} was Ready, but /readyz on port {health} answers {last}; its containers: {statuses}\nits log:\n{}\nits previous container's:\n{}",
            log(false).await,
            log(true).await
        );
    }
}

/// CAPTF installed as a user installs it: the real `clusterctl init --infrastructure
/// terraform` from a local repository of the release assets (`captf release-assets`),
/// with `CAPTF_IMAGE` naming the image built here, on a management cluster where Cluster
/// API was installed before (its inventory says so, as clusterctl wrote it). The Pod
/// clusterctl's Deployment makes runs that image, under the components' RBAC and the
/// restricted Pod Security Standard of their namespace, and applies a TerraformCluster.
/// Then `clusterctl delete --infrastructure terraform` removes the provider and destroys
/// nothing: the object, its finalizer and its state stay, no destroy Job is made. CAPTF
/// installed again picks the object up where it was (no new apply), and deleting the
/// Cluster destroys and releases it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn clusterctl_init_runs_the_image_and_clusterctl_delete_destroys_nothing() {
    if envtest_only("it installs CAPTF with clusterctl on a control plane of its own") {
        return;
    }
    let t0 = Instant::now();
    let mark = |what: &str| eprintln!("clusterctl-image: {what} at {:.1?}", t0.elapsed());
    let store = scratch_dir("clusterctl-image");
    let store_for_build = store.clone();
    let (_archive, digest) = tokio::task::spawn_blocking(move || build_image(&store_for_build))
        .await
        .expect("build the image");
    let env = Env::builder("clusterctl-image")
        .kubelet_args(&[&format!("--image-store={}", store.display())])
        .start()
        .await;

    // A local repository of CAPTF's assets beside Cluster API's core; the image is the
    // one built here. The components' probe and metrics ports are moved to free ones
    // before clusterctl reads them (the local kubelet's Pods share this machine's
    // network, where 8081 and 8443 may be taken), so that the Pod clusterctl's Deployment
    // makes is the one that runs. (A second rollout at once after the install, to move
    // them, brought no Ready Pod within 90 s on a loaded machine in CI and here; why is
    // not known. The rollout of the test above runs with its Pod leading and Ready, and
    // prints the Pods if it fails so.)
    let dir = temp_dir("clusterctl-image");
    let home = dir.join("home");
    // With the state proxy on: its sidecar runs the manager's own image, read from the
    // manager's Pod.
    let config = local_repository(
        &dir,
        &format!(
            "CAPTF_IMAGE: {}\nCAPTF_STATE_PROXY: \"true\"\n",
            image_ref()
        ),
    );
    let (health, metrics) = (free_port(), free_port());
    let components = dir
        .join("repo/infrastructure-terraform")
        .join(VERSION)
        .join("infrastructure-components.yaml");
    let yaml = std::fs::read_to_string(&components).expect("the components");
    std::fs::write(&components, on_ports(&yaml, health, metrics)).expect("the components");
    let kubeconfig = env.kubeconfig_path().to_str().expect("path").to_string();
    let config = config.to_str().expect("path").to_string();
    let init = || {
        let run = || {
            let out = clusterctl(
                &home,
                &[
                    "init",
                    "--kubeconfig",
                    &kubeconfig,
                    "--config",
                    &config,
                    "--infrastructure",
                    &format!("terraform:{VERSION}"),
                ],
                &[],
            );
            let printed = format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
            (out.status.success(), printed)
        };
        // Run again (as a user would) when clusterctl's own wait for cert-manager ran out:
        // on a machine loaded by the whole suite, the second init once failed 20 s in with
        // "Waiting for cert-manager to be available... Error: context deadline exceeded"
        // (CI, cold run of f24c8a5); init is idempotent.
        let (mut ok, mut printed) = run();
        for _ in 0..2 {
            if ok || !printed.contains("context deadline exceeded") {
                break;
            }
            eprintln!("clusterctl init ran out of time; again:\n{printed}");
            (ok, printed) = run();
        }
        assert!(ok, "clusterctl init: {printed}");
        // Cluster API's core was there: clusterctl installs CAPTF beside it.
        assert!(
            printed.contains("Installing provider=\"infrastructure-terraform\"")
                && !printed.contains("Installing provider=\"cluster-api\""),
            "clusterctl init installs CAPTF only: {printed}"
        );
        printed
    };
    let printed = init();
    mark("clusterctl init done");
    eprintln!("clusterctl init printed:\n{printed}");
    let providers = clusterctl_inventory(&env.client, SYSTEM);
    let provider = providers
        .get("infrastructure-terraform")
        .await
        .expect("clusterctl's inventory records CAPTF");
    assert_eq!(provider.data["version"], VERSION);

    // The Deployment clusterctl made runs the image, as its namespace's Pod Security
    // Standard and its RBAC allow.
    let namespace = Api::<Namespace>::all(env.client.clone())
        .get(SYSTEM)
        .await
        .expect("the components' namespace");
    assert_eq!(
        namespace
            .labels()
            .get("pod-security.kubernetes.io/enforce")
            .map(String::as_str),
        Some("restricted")
    );
    let pods: Api<Pod> = Api::namespaced(env.client.clone(), SYSTEM);
    let leases: Api<Lease> = Api::namespaced(env.client.clone(), SYSTEM);
    let leader = ready_manager_on(&pods, health, &digest).await;
    wait_for("the Pod to lead", WAIT, || async {
        holder(&leases).await.as_deref() == Some(leader.as_str())
    })
    .await;
    mark("the Pod leads");
    let pid = manager_process(&leader).expect("the manager's process");
    assert_eq!(proc_status(pid, "Uid:"), ["65532"; 4]);

    let cluster_uid = env.create_cluster("prod").await;
    env.create_owned::<Tfc>(
        "prod",
        "prod",
        &[("Cluster", "prod", &cluster_uid, false)],
        &apply_module(0),
        json!({}),
    )
    .await;
    wait_condition::<Tfc>(&env, "prod", "Provisioned", "True", "Provisioned").await;
    mark("provisioned");
    // The apply ran behind the state proxy, from the image the manager runs.
    let runner_pods = Api::<Pod>::namespaced(env.client.clone(), &env.ns)
        .list(&Default::default())
        .await
        .expect("the runner's Pods");
    let apply = runner_pods
        .items
        .iter()
        .find(|p| p.labels().get(names::LABEL_OPERATION).map(String::as_str) == Some("apply"))
        .expect("the apply's Pod");
    let sidecar = apply
        .spec
        .as_ref()
        .and_then(|s| s.init_containers.as_ref())
        .and_then(|c| c.first())
        .expect("the state proxy's sidecar");
    assert_eq!(sidecar.name, "captf-state-proxy");
    assert_eq!(sidecar.image.as_deref(), Some(image_ref().as_str()));
    let ran = apply
        .status
        .as_ref()
        .and_then(|s| s.init_container_statuses.as_ref())
        .and_then(|c| c.first())
        .map(|c| c.image_id.clone())
        .unwrap_or_default();
    assert!(
        ran.contains(&digest),
        "the sidecar ran the image {digest}: {ran}"
    );
    let fingerprint = env.fingerprint(Kind::TerraformCluster, "prod").await;
    let applies = |tfc: &Tfc| tfc.annotations().get(names::APPLY_ATTEMPT).cloned();
    let applied = applies(&env.object::<Tfc>("prod").await.expect("prod"));

    // `clusterctl delete --infrastructure terraform`: the provider goes, its CRDs, its
    // namespace and every object of its kinds stay, and nothing is destroyed.
    let out = clusterctl(
        &home,
        &[
            "delete",
            "--kubeconfig",
            &kubeconfig,
            "--config",
            &config,
            "--infrastructure",
            "terraform",
        ],
        &[],
    );
    assert!(
        out.status.success(),
        "clusterctl delete: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        providers
            .get_opt("infrastructure-terraform")
            .await
            .expect("inventory")
            .is_none(),
        "clusterctl's inventory no longer lists CAPTF"
    );
    let deployments: Api<Deployment> = Api::namespaced(env.client.clone(), SYSTEM);
    wait_for("the manager's Deployment and Pods to go", WAIT, || async {
        deployments
            .get_opt("captf-manager")
            .await
            .ok()
            .flatten()
            .is_none()
            && manager_pods(&pods).await.is_empty()
    })
    .await;
    mark("the provider is gone");
    let tfc = env
        .object::<Tfc>("prod")
        .await
        .expect("the TerraformCluster stays");
    assert!(tfc.metadata.deletion_timestamp.is_none(), "not deleted");
    assert!(
        tfc.finalizers()
            .iter()
            .any(|f| f == Kind::TerraformCluster.finalizer()),
        "its finalizer stays: {:?}",
        tfc.finalizers()
    );
    assert_eq!(
        env.fingerprint(Kind::TerraformCluster, "prod").await,
        fingerprint,
        "its state stays as the apply left it"
    );
    assert!(env.destroy_jobs().await.is_empty(), "no destroy Job");
    assert!(!env.destroyed("prod"), "terraform destroyed nothing");
    let crds: Api<CustomResourceDefinition> = Api::all(env.client.clone());
    for kind in captf::api::Kind::ALL {
        crds.get(&kind.crd_name()).await.expect("the CRDs stay");
    }

    // Installed again, CAPTF takes the object up where it was: no new apply. Deleting
    // the Cluster then destroys it and releases it.
    init();
    ready_manager_on(&pods, health, &digest).await;
    wait_for("a Pod of the new installation to lead", WAIT, || async {
        holder(&leases).await.is_some()
    })
    .await;
    mark("the new installation leads");
    env.delete_cluster("prod").await;
    let after = applies(&env.object::<Tfc>("prod").await.expect("prod"));
    assert_eq!(after, applied, "no new apply after the reinstall");
    env.wait_gone::<Tfc>("prod", WAIT).await;
    mark("released");
    assert!(env.destroyed("prod"), "terraform destroyed prod");
    assert_eq!(
        env.destroy_jobs().await.len(),
        0,
        "the destroy Job was cleaned up"
    );
    env.assert_nothing_left(Kind::TerraformCluster, "prod")
        .await;
    env.shutdown().await;
    let _ = std::fs::remove_dir_all(&store);
    let _ = std::fs::remove_dir_all(&dir);
}
