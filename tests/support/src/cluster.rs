//! The real control plane the end-to-end tests run on: `captf-envtest` (etcd,
//! kube-apiserver and kube-controller-manager from `tests/cluster/`, and the local kubelet
//! of `tests/kubelet/`), built by `tests/cluster/build` and started once per test process
//! ([`ControlPlane::shared`]); a test that changes what every test shares (it deletes a
//! CRD) starts one of its own ([`ControlPlane::dedicated`]). With `--cluster-api` it also
//! runs the real Cluster API core manager, with Cluster API's CRDs and webhooks
//! ([`ControlPlane::shared`], [`ControlPlane::dedicated`], [`ControlPlane::dedicated_with_cluster_api`]);
//! [`clusterctl`] is the clusterctl of the same Cluster API version.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

/// A running `captf-envtest`.
pub struct ControlPlane {
    kubeconfig: PathBuf,
    dir: PathBuf,
    child: Mutex<Option<(Child, ChildStdin)>>,
    /// CAPTF's CRDs and the Cluster CRD are installed once per control plane.
    pub crds: tokio::sync::OnceCell<()>,
    /// Whether the minimal Cluster CRD is installed (a control plane without Cluster API).
    pub cluster_crd: bool,
    /// Whether the real Cluster API runs on it (`captf-envtest --cluster-api`): its CRDs,
    /// webhooks and core manager; then the minimal Cluster CRD is not installed.
    pub cluster_api: bool,
    /// How long `captf-envtest` took until its kubeconfig appeared.
    pub started_in: Duration,
}

/// The profile this program was built with, which the kubelet is built with too.
fn profile() -> &'static str {
    if cfg!(debug_assertions) {
        "debug"
    } else {
        "release"
    }
}

/// The folder `tests/cluster/build` puts `captf-envtest` in (built once per process).
pub fn binaries() -> PathBuf {
    static BUILT: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    BUILT
        .get_or_init(|| {
            let root = crate::repo_root();
            let mut cmd = Command::new("bash");
            // The variables Cargo sets for a test process are not the build's: build
            // scripts that watch them (ring's watches CARGO_MANIFEST_DIR) would make the
            // nested build compile everything again, and then the next `cargo test` too.
            for (key, _) in std::env::vars_os() {
                let key = key.to_string_lossy();
                if (key.starts_with("CARGO_") && key != "CARGO_HOME" && key != "CARGO_TARGET_DIR")
                    || key == "LD_LIBRARY_PATH"
                    || key == "OUT_DIR"
                {
                    cmd.env_remove(key.as_ref());
                }
            }
            let out = cmd
                .arg(root.join("tests/cluster/build"))
                .env("CARGO", env!("CARGO"))
                .env("CAPTF_PROFILE", profile())
                .stderr(Stdio::inherit())
                .output()
                .map_err(|e| format!("running tests/cluster/build: {e}"))?;
            if !out.status.success() {
                return Err(format!(
                    "tests/cluster/build failed ({}); run it by hand to see why",
                    out.status
                ));
            }
            Ok(PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()))
        })
        .clone()
        .unwrap_or_else(|e| panic!("{e}"))
}

/// Cluster API's `clusterctl`, built beside `captf-envtest` (the same Cluster API version
/// as the control plane's `--cluster-api`). Run it with `HOME` set to a directory of the
/// test's and `CLUSTERCTL_DISABLE_VERSIONCHECK=true` (it has no network to check with).
pub fn clusterctl() -> PathBuf {
    binaries().join("clusterctl")
}

impl ControlPlane {
    /// The control plane every test of this process shares, started on first use. It stops
    /// when the process ends (`captf-envtest --exit-on-stdin-close`).
    /// Cluster API runs on it for real (`--cluster-api`: its CRDs, webhooks and core
    /// manager), beside the test control plane kind of [`super::capi`].
    pub fn shared() -> Arc<ControlPlane> {
        static SHARED: OnceLock<Arc<ControlPlane>> = OnceLock::new();
        SHARED
            .get_or_init(|| Arc::new(ControlPlane::start("shared", &[], &[], Capi::Real)))
            .clone()
    }

    /// A control plane of its own with the real Cluster API (`--cluster-api`): Cluster
    /// API's CRDs and webhooks, and its core manager, ready when this returns.
    pub fn dedicated_with_cluster_api(tag: &str) -> Arc<ControlPlane> {
        Arc::new(ControlPlane::start(tag, &[], &[], Capi::Real))
    }

    /// A control plane of its own with the real Cluster API, stopped when the last handle
    /// goes; `kubelet_args` go to the local kubelet (`--max-pods=4`: at most four
    /// unfinished Pods on the Node).
    pub fn dedicated(tag: &str, kubelet_args: &[&str]) -> Arc<ControlPlane> {
        Arc::new(ControlPlane::start(tag, kubelet_args, &[], Capi::Real))
    }

    /// A control plane of its own with `kcm_args` after kube-controller-manager's own (the
    /// scale bench raises its clients' QPS): with the real Cluster API when `cluster_api`,
    /// else with Cluster API's Cluster CRD only.
    pub fn dedicated_tuned(
        tag: &str,
        kubelet_args: &[&str],
        kcm_args: &[&str],
        cluster_api: bool,
    ) -> Arc<ControlPlane> {
        let capi = if cluster_api {
            Capi::Real
        } else {
            Capi::Minimal
        };
        Arc::new(ControlPlane::start(tag, kubelet_args, kcm_args, capi))
    }

    /// A control plane of its own without Cluster API's Cluster CRD (a test installs it
    /// later, as when Cluster API is installed after CAPTF).
    pub fn dedicated_without_capi(tag: &str) -> Arc<ControlPlane> {
        Arc::new(ControlPlane::start(tag, &[], &[], Capi::None))
    }

    fn start(tag: &str, kubelet_args: &[&str], kcm_args: &[&str], capi: Capi) -> ControlPlane {
        let cluster_crd = capi == Capi::Minimal;
        let cluster_api = capi == Capi::Real;
        let dir_of = binaries();
        let bin = dir_of.join("captf-envtest");
        let kubelet = dir_of
            .parent()
            .expect("target directory")
            .join(profile())
            .join("examples/captf-kubelet");
        let dir = std::env::temp_dir().join(format!(
            "captf-e2e-plane-{tag}-{}-{}",
            std::process::id(),
            super::rand_suffix()
        ));
        std::fs::create_dir_all(&dir).expect("control plane dir");
        let kubeconfig = dir.join("kubeconfig");
        // The CRDs exist before the controllers start, as on a management cluster: the
        // garbage collector watches their objects from the start (it would find CRDs made
        // later only at its next discovery sync, up to 30 s on).
        let crds = dir.join("crds.json");
        let mut docs = Vec::new();
        let minimal = cluster_crd.then(super::cluster_crd);
        let fixtures = if cluster_api {
            super::capi::fixture_crds()
        } else {
            Vec::new()
        };
        for crd in captf::api::crds()
            .into_iter()
            .chain(minimal)
            .chain(fixtures)
        {
            docs.push(serde_json::to_string(&crd).expect("CRD"));
        }
        std::fs::write(&crds, docs.join("\n")).expect("CRDs file");
        // The fixtures' ClusterRole, there before Cluster API's manager starts.
        let objects = dir.join("objects.json");
        let fixture_objects: Vec<serde_json::Value> = if cluster_api {
            vec![super::capi::fixture_role()]
        } else {
            Vec::new()
        };
        std::fs::write(
            &objects,
            fixture_objects
                .iter()
                .map(|o| o.to_string())
                .collect::<Vec<_>>()
                .join("\n"),
        )
        .expect("objects file");
        let log_path = dir.join("captf-envtest.log");
        let log = std::fs::File::create(&log_path).expect("log file");
        let t = Instant::now();
        let mut child = Command::new(&bin)
            .arg("--kubeconfig")
            .arg(&kubeconfig)
            .arg("--exit-on-stdin-close")
            .arg("--kubelet")
            .arg(&kubelet)
            .arg("--crds")
            .arg(&crds)
            .arg("--objects")
            .arg(&objects)
            // Terraform's update check has no network to reach here.
            .arg("--kubelet-arg=--image-env=CHECKPOINT_DISABLE=1")
            // "The image" has OpenTofu too, after the machine's terraform.
            .arg(format!(
                "--kubelet-arg=--image-env=PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin:{}",
                dir_of.join("bin").display()
            ))
            // The state proxy's image: this build's captf (the integration tests built it).
            .arg(format!(
                "--kubelet-arg=--image-entrypoint={}={}",
                super::STATE_PROXY_IMAGE,
                dir_of
                    .parent()
                    .expect("target directory")
                    .join(profile())
                    .join("captf")
                    .display()
            ))
            .args(kubelet_args.iter().map(|a| format!("--kubelet-arg={a}")))
            .args(kcm_args.iter().map(|a| format!("--kcm-arg={a}")))
            // Its manager and components are found beside captf-envtest.
            .args(cluster_api.then_some("--cluster-api"))
            .stdin(Stdio::piped())
            .stdout(log.try_clone().expect("log"))
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("starting {}: {e}", bin.display()));
        let stdin = child.stdin.take().expect("stdin");
        loop {
            if kubeconfig.exists() {
                break;
            }
            if let Ok(Some(st)) = child.try_wait() {
                panic!(
                    "captf-envtest exited ({st}) before the cluster was ready:\n{}",
                    tail(&log_path)
                );
            }
            if t.elapsed() > Duration::from_secs(300) {
                let _ = child.kill();
                panic!(
                    "captf-envtest was not ready within 300 s:\n{}",
                    tail(&log_path)
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        ControlPlane {
            kubeconfig,
            dir,
            child: Mutex::new(Some((child, stdin))),
            crds: tokio::sync::OnceCell::new(),
            cluster_crd,
            cluster_api,
            started_in: t.elapsed(),
        }
    }

    /// The admin kubeconfig.
    pub fn kubeconfig(&self) -> &Path {
        &self.kubeconfig
    }

    /// A client with the admin's credentials.
    pub async fn client(&self) -> kube::Client {
        super::client_for(&self.kubeconfig).await
    }

    /// The process id of `captf-envtest` (its children are kube-apiserver,
    /// kube-controller-manager and the kubelet).
    pub fn pid(&self) -> Option<u32> {
        self.child
            .lock()
            .expect("child")
            .as_ref()
            .map(|(c, _)| c.id())
    }

    /// `captf-envtest`'s output (and where its components' logs are).
    pub fn log(&self) -> PathBuf {
        self.dir.join("captf-envtest.log")
    }
}

impl Drop for ControlPlane {
    fn drop(&mut self) {
        if let Some((mut child, stdin)) = self.child.lock().expect("child").take() {
            // Closing its standard input stops it cleanly.
            drop(stdin);
            let t = Instant::now();
            while t.elapsed() < Duration::from_secs(60) {
                if let Ok(Some(_)) = child.try_wait() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// What of Cluster API a control plane has.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Capi {
    /// Nothing (a test installs the minimal Cluster CRD later).
    None,
    /// The minimal, schema-less Cluster CRD (`super::cluster_crd`), with no controller:
    /// the benches, which measure CAPTF alone.
    Minimal,
    /// The real Cluster API (`captf-envtest --cluster-api`).
    Real,
}

fn tail(path: &Path) -> String {
    let mut s = String::new();
    if let Ok(mut f) = std::fs::File::open(path) {
        let _ = f.read_to_string(&mut s);
    }
    let lines: Vec<&str> = s.lines().collect();
    let from = lines.len().saturating_sub(40);
    lines[from..].join("\n")
}
