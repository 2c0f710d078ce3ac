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
use kube::runtime::watcher;
use serde_json::json;

use crate::local_images::scratch_dir;
use crate::manager::{free_port, http_get};
use crate::provisioning::wait_condition;
use crate::support::*;

const WAIT: Duration = Duration::from_secs(90);
const SYSTEM: &str = "captf-system";
const LEASE: &str = "captf-manager-leader";
/// The manager's lease duration: a standby that waited for the Lease to expire would
/// take over only this long after the last renewal.
const LEASE_DURATION: Duration = Duration::from_secs(15);
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
/// this machine's network, where 8080 and 8081 may be taken).
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
    let mut edited = yaml.clone();
    for (from, to) in [
        ("image: captf:latest".to_string(), format!("image: {image}")),
        (
            "--health-probe-bind-address=0.0.0.0:8081".into(),
            format!("--health-probe-bind-address=0.0.0.0:{health}"),
        ),
        (
            "--metrics-bind-address=0.0.0.0:8080".into(),
            format!("--metrics-bind-address=0.0.0.0:{metrics}"),
        ),
        // The ports the probes name.
        (
            "containerPort: 8081".into(),
            format!("containerPort: {health}"),
        ),
        (
            "containerPort: 8080".into(),
            format!("containerPort: {metrics}"),
        ),
    ] {
        assert_eq!(edited.matches(&from).count(), 1, "{from} in:\n{yaml}");
        edited = edited.replace(&from, &to);
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
    let env = Env::start_dedicated_with(
        "manager-pod",
        &[&format!("--image-store={}", store.display())],
    )
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
        pods.get(&name).await.is_ok_and(|p| {
            p.status
                .and_then(|s| s.conditions)
                .unwrap_or_default()
                .iter()
                .any(|c| c.type_ == "Ready" && c.status == "True")
        })
    })
    .await;
    let ready = installed.elapsed();
    assert_eq!(http_get(health, "/readyz").await.0, 200);
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
    let watch = tokio::spawn({
        let seen = seen.clone();
        let stream = watcher(pods.clone(), watcher::Config::default());
        async move {
            let mut stream = std::pin::pin!(stream);
            while let Some(ev) = stream.next().await {
                if let Ok(watcher::Event::Apply(p) | watcher::Event::Delete(p)) = ev {
                    let uid = p.metadata.uid.clone().unwrap_or_default();
                    seen.lock().expect("seen").insert(uid, p);
                }
            }
        }
    });
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
    assert_eq!(t["exitCode"], 0, "{t}");
    assert_eq!(t["reason"], "Completed", "{t}");
    assert!(
        stopped < GRACE,
        "it stopped after {stopped:?}, not within its grace period"
    );
    let after = holder(&leases).await;
    assert!(
        after.as_deref() != Some(name.as_str()),
        "the old Pod gave the Lease up: {after:?}"
    );
    wait_for("the next Pod to take the Lease", WAIT, || async {
        holder(&leases).await.is_some_and(|h| h != name)
    })
    .await;
    let takeover = deleted.elapsed() - stopped;
    assert!(
        takeover < LEASE_DURATION,
        "the next Pod took the Lease {takeover:?} after the old one stopped, as if it had to expire"
    );
    let next = holder(&leases).await.expect("holder");
    assert!(
        manager_pods(&pods)
            .await
            .iter()
            .any(|p| p.name_any() == next && running(p)),
        "the Lease is held by the Deployment's next Pod, {next}"
    );
    watch.abort();
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
