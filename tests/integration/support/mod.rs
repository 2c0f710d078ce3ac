//! The end-to-end environment: the test API server, the local Job runner (which runs the
//! rendered destroy Jobs with the real `terraform`), the real manager in-process, and an
//! apply path that does what the apply side does before deletion (inputs Secret,
//! `applied-at`, a real `terraform apply` through the kubernetes backend, fingerprint).
//!
//! Shared by `tests/integration`, `examples/sandbox.rs` and `benches/scale.rs` (included
//! with `#[path]`), so nothing here may use `CARGO_BIN_EXE_*` (examples do not get it):
//! `Env::captf` lives in `tests/integration/deletion.rs`.

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use captf::api::names::{self, Kind};
use captf::api::{TerraformCluster, TerraformMachine, TerraformMachinePool, TerraformObject};
use captf::controller::{ManagerConfig, observe};
use captf::facts::Settings;
use captf::inputs::{self, Backend, Inputs, Module, OwnerRef, Runner};
use captf::rules::Backoff;
use captf::state::{self, StateContent};
use captf_testserver::{JobRunner, JobRunnerOptions, TestServer};
use k8s_openapi::api::core::v1::{Namespace, Secret};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{
    Api, ApiResource, DeleteParams, DynamicObject, ObjectMeta, Patch, PatchParams, PostParams,
};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config, ResourceExt};
use serde_json::{Value, json};

pub const NS: &str = "team-a";
pub const MANAGER_NS: &str = "captf-system";

/// A module of two `terraform_data` instances whose destroy leaves a file per instance in
/// `marker_dir`, so a test can see that Terraform really destroyed them. With
/// `fail_destroys` > 0, the destroy provisioner fails that many times first.
pub fn module(fail_destroys: u32) -> String {
    destroy_module(&format!(
        "if [ $n -le {fail_destroys} ]; then echo 'Error: the cloud said no (attempt '$n')' >&2; exit 1; fi"
    ))
}

/// Two `terraform_data` instances whose destroy provisioner counts its runs in
/// `<marker>.tries`, runs `first_runs` (a shell snippet that may test `$n`), then leaves
/// `<marker>.destroyed`.
fn destroy_module(first_runs: &str) -> String {
    format!(
        r#"variable "name" {{ type = string }}
variable "marker_dir" {{ type = string }}
resource "terraform_data" "vm" {{
  count = 2
  input = "${{var.marker_dir}}/${{var.name}}-${{count.index}}"
  provisioner "local-exec" {{
    when    = destroy
    command = "n=$(cat '${{self.input}}.tries' 2>/dev/null || echo 0); n=$((n+1)); echo $n > '${{self.input}}.tries'; {first_runs}; touch '${{self.input}}.destroyed'"
  }}
}}
"#
    )
}

pub struct Env {
    pub server: TestServer,
    pub runner: Option<JobRunner>,
    pub client: Client,
    pub manager: Option<(
        tokio::sync::oneshot::Sender<()>,
        tokio::task::JoinHandle<()>,
    )>,
    pub dir: PathBuf,
    pub config: ManagerConfig,
}

/// Whether `bin` is an executable file on PATH.
pub fn on_path(bin: &str) -> bool {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path).any(|p| p.join(bin).is_file())
}

pub fn require(bin: &str) -> PathBuf {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .map(|p| p.join(bin))
        .find(|p| p.is_file())
        .unwrap_or_else(|| {
            panic!("`{bin}` is not on PATH: the end-to-end tests need the real {bin}; install it")
        })
}

fn temp_dir(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "captf-e2e-{tag}-{}-{}",
        std::process::id(),
        rand_suffix()
    ));
    std::fs::create_dir_all(&dir).expect("temp dir");
    dir
}

fn rand_suffix() -> String {
    let n = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    format!("{n:x}")
}

impl Env {
    /// Starts the server, installs the CRDs (CAPTF's and a minimal CAPI Cluster CRD),
    /// creates the namespaces, and starts the Job runner.
    pub async fn start(tag: &str) -> Env {
        Env::start_with(tag, None).await
    }

    /// As [`Env::start`], with at most `max_running` Job Pods running at once (the others
    /// wait as Pending, as on a full node).
    pub async fn start_with(tag: &str, max_running: Option<usize>) -> Env {
        require("terraform");
        // The manager logs on stderr when CAPTF_TEST_LOG is set.
        if std::env::var_os("CAPTF_TEST_LOG").is_some() {
            captf::telemetry::init();
        }
        let server = TestServer::start().await;
        let kubeconfig = Kubeconfig::read_from(server.kubeconfig_path()).expect("kubeconfig");
        let config = Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
            .await
            .expect("config");
        let client = Client::try_from(config).expect("client");
        let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
        for crd in captf::api::crds() {
            crds.create(&PostParams::default(), &crd)
                .await
                .expect("create CRD");
        }
        let cluster_crd: CustomResourceDefinition = serde_json::from_value(json!({
            "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
            "metadata": {"name": "clusters.cluster.x-k8s.io"},
            "spec": {"group": "cluster.x-k8s.io", "scope": "Namespaced",
                "names": {"kind": "Cluster", "plural": "clusters", "singular": "cluster", "listKind": "ClusterList"},
                "versions": [{"name": "v1beta2", "served": true, "storage": true,
                    "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}},
                    "subresources": {"status": {}}}]}
        }))
        .expect("cluster CRD");
        crds.create(&PostParams::default(), &cluster_crd)
            .await
            .expect("create Cluster CRD");
        let namespaces: Api<Namespace> = Api::all(client.clone());
        for ns in [NS, MANAGER_NS] {
            let n = Namespace {
                metadata: ObjectMeta {
                    name: Some(ns.into()),
                    ..Default::default()
                },
                ..Default::default()
            };
            namespaces
                .create(&PostParams::default(), &n)
                .await
                .expect("namespace");
        }
        let dir = temp_dir(tag);
        let runner = JobRunner::start(
            &server,
            JobRunnerOptions {
                extra_env: vec![("CHECKPOINT_DISABLE".into(), "1".into())],
                work_root: dir.join("pods"),
                termination_grace_override: Some(Duration::from_secs(10)),
                max_running,
                ..Default::default()
            },
        );
        let config = ManagerConfig {
            concurrency: 4,
            settings: Settings {
                backoff: Backoff {
                    base: Duration::from_millis(300),
                    max: Duration::from_secs(3),
                },
                ..Settings::default()
            },
            manager_namespace: MANAGER_NS.into(),
            identity: "test-manager".into(),
            rbac_sweep_every: Duration::from_millis(500),
            ..Default::default()
        };
        Env {
            server,
            runner: Some(runner),
            client,
            manager: None,
            dir,
            config,
        }
    }

    pub fn markers(&self) -> PathBuf {
        let d = self.dir.join("markers");
        std::fs::create_dir_all(&d).expect("markers dir");
        d
    }

    /// Starts the real manager in this process.
    pub fn start_manager(&mut self) {
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let client = self.client.clone();
        let cfg = self.config.clone();
        let handle = tokio::spawn(async move {
            let shutdown = async move {
                let _ = rx.await;
            };
            if let Err(e) = captf::controller::run(client, cfg, shutdown).await {
                panic!("manager failed: {e}");
            }
        });
        self.manager = Some((tx, handle));
    }

    /// Stops the manager (as a crash would: nothing is flushed on the way out).
    pub async fn stop_manager(&mut self) {
        if let Some((tx, handle)) = self.manager.take() {
            let _ = tx.send(());
            let _ = tokio::time::timeout(Duration::from_secs(10), handle).await;
        }
    }

    pub async fn shutdown(mut self) {
        self.stop_manager().await;
        if let Some(r) = self.runner.take() {
            r.stop().await;
        }
        self.server.shutdown().await;
        let _ = std::fs::remove_dir_all(&self.dir);
    }

    pub fn cluster_api(&self) -> Api<DynamicObject> {
        let ar = ApiResource {
            group: "cluster.x-k8s.io".into(),
            version: "v1beta2".into(),
            api_version: "cluster.x-k8s.io/v1beta2".into(),
            kind: "Cluster".into(),
            plural: "clusters".into(),
        };
        Api::namespaced_with(self.client.clone(), NS, &ar)
    }

    /// Creates the CAPI Cluster `name`; returns its uid.
    pub async fn create_cluster(&self, name: &str) -> String {
        let obj: DynamicObject = serde_json::from_value(json!({
            "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Cluster",
            "metadata": {"name": name, "namespace": NS}, "spec": {}
        }))
        .expect("cluster");
        let created = self
            .cluster_api()
            .create(&PostParams::default(), &obj)
            .await
            .expect("create cluster");
        created.metadata.uid.unwrap_or_default()
    }

    pub fn api<K: TerraformObject>(&self) -> Api<K> {
        Api::namespaced(self.client.clone(), NS)
    }

    pub fn secrets(&self) -> Api<Secret> {
        Api::namespaced(self.client.clone(), NS)
    }

    /// Creates a CAPTF object owned by the Cluster `cluster` (uid `cluster_uid`).
    pub async fn create_object<K: TerraformObject>(
        &self,
        name: &str,
        cluster: &str,
        cluster_uid: &str,
        marker_dir: &Path,
    ) -> K {
        let obj: K = serde_json::from_value(json!({
            "apiVersion": names::API_VERSION, "kind": K::KIND.as_str(),
            "metadata": {
                "name": name, "namespace": NS,
                "labels": {names::CAPI_CLUSTER_NAME_LABEL: cluster},
                "ownerReferences": [{"apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Cluster", "name": cluster, "uid": cluster_uid}]
            },
            "spec": {
                "module": {"files": {"main.tf": module(0)}},
                "variables": {"name": name, "marker_dir": marker_dir.display().to_string()}
            }
        }))
        .expect("object");
        self.api::<K>()
            .create(&PostParams::default(), &obj)
            .await
            .expect("create object")
    }

    /// Does what the apply path does before a deletion can find anything: writes the
    /// inputs Secret and `applied-at`, runs the real `terraform apply` through the
    /// kubernetes backend, then records the state's fingerprint on the object.
    pub async fn apply<K: TerraformObject>(
        &self,
        name: &str,
        module_body: &str,
        marker_dir: &Path,
    ) {
        let (inputs, uid, suffix) = self.write_inputs::<K>(name, module_body, marker_dir).await;
        let variables = inputs.variables.clone();
        let work = self
            .dir
            .join(format!("apply-{}-{name}", K::KIND.short_name()));
        std::fs::create_dir_all(&work).expect("work dir");
        std::fs::write(work.join("main.tf"), module_body).expect("main.tf");
        std::fs::write(
            work.join("captf_backend_override.tf"),
            "terraform {\n  backend \"kubernetes\" {}\n}\n",
        )
        .expect("override");
        // The apply path passes the same backend labels as the destroy Job.
        let labels = backend_labels(K::KIND, name, &uid);
        let labels_hcl: Vec<String> = labels
            .iter()
            .map(|(k, v)| format!("    \"{k}\" = \"{v}\""))
            .collect();
        std::fs::write(
            work.join("backend.hcl"),
            format!(
                "namespace = \"{NS}\"\nsecret_suffix = \"{suffix}\"\nconfig_path = \"{}\"\nlabels = {{\n{}\n}}\n",
                self.server.kubeconfig_path().display(),
                labels_hcl.join("\n")
            ),
        )
        .expect("backend.hcl");
        std::fs::write(
            work.join("vars.tfvars.json"),
            serde_json::to_vec(&variables).expect("vars"),
        )
        .expect("vars");
        // `init` creates the state Secret, and the manager puts its protection finalizer
        // on it as soon as it sees it. Terraform's backend writes with the resourceVersion
        // it read, so a write of the manager in between makes it fail with a conflict. The
        // real apply path runs Terraform in a Job, and the manager leaves the state alone
        // while a Job of the object is unfinished; here Terraform runs outside a Job, so
        // run `init` again after a conflict and let the manager protect the Secret before
        // the apply writes it.
        let init = [
            "init",
            "-input=false",
            "-no-color",
            "-backend-config=backend.hcl",
        ];
        if try_terraform(&work, &init).is_err() {
            terraform(&work, &init);
        }
        if self.manager.is_some() {
            self.wait_protected(&names::state_secret_name(&suffix))
                .await;
        }
        terraform(
            &work,
            &[
                "apply",
                "-auto-approve",
                "-input=false",
                "-no-color",
                "-var-file=vars.tfvars.json",
            ],
        );
        let (lineage, serial) = self.fingerprint(K::KIND, name).await;
        self.annotate::<K>(
            name,
            &[
                (names::STATE_LINEAGE, Some(lineage)),
                (names::STATE_SERIAL, Some(serial.to_string())),
            ],
        )
        .await;
    }

    /// The apply path's writes before Terraform runs: the inputs Secret (created, or
    /// replaced), then `applied-at` and `inputs-sha256` on the object. Returns the inputs,
    /// the object's uid and its state suffix.
    pub async fn write_inputs<K: TerraformObject>(
        &self,
        name: &str,
        module_body: &str,
        marker_dir: &Path,
    ) -> (Inputs, String, String) {
        let api = self.api::<K>();
        let obj = api.get(name).await.expect("object");
        let suffix = names::state_suffix(K::KIND, name);
        let uid = obj.meta().uid.clone().unwrap_or_default();
        let variables: serde_json::Map<String, Value> = [
            ("name".to_string(), json!(name)),
            (
                "marker_dir".to_string(),
                json!(marker_dir.display().to_string()),
            ),
        ]
        .into_iter()
        .collect();
        let inputs = Inputs {
            version: 1,
            runner: Runner {
                image: "hashicorp/terraform:1.11.4".into(),
            },
            module: Module::Files([("main.tf".to_string(), module_body.to_string())].into()),
            variables: variables.clone(),
            env: vec![],
            backend: Backend {
                namespace: NS.into(),
                secret_suffix: suffix.clone(),
            },
            timeout_seconds: Some(120),
            lock_file: None,
        };
        let secret = inputs::inputs_secret(
            &inputs,
            &OwnerRef {
                kind: K::KIND,
                name,
                uid: &uid,
                namespace: NS,
                suffix: &suffix,
            },
        );
        match self.secrets().create(&PostParams::default(), &secret).await {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 409 => {
                self.secrets()
                    .replace(&secret.name_any(), &PostParams::default(), &secret)
                    .await
                    .expect("replace inputs");
            }
            Err(e) => panic!("inputs Secret: {e}"),
        }
        self.annotate::<K>(
            name,
            &[
                (names::APPLIED_AT, Some(jiff::Timestamp::now().to_string())),
                (
                    names::INPUTS_SHA256,
                    Some(Inputs::sha256_hex(&inputs.to_json_bytes())),
                ),
            ],
        )
        .await;
        (inputs, uid, suffix)
    }

    /// The lineage and serial of an object's state, read through the product's reader.
    pub async fn fingerprint(&self, kind: Kind, name: &str) -> (String, u64) {
        match self.read_state(kind, name).await {
            StateContent::Parsed {
                lineage, serial, ..
            } => (lineage, serial),
            other => panic!("state of {kind}/{name} is not readable: {other:?}"),
        }
    }

    pub async fn read_state(&self, kind: Kind, name: &str) -> StateContent {
        let suffix = names::state_suffix(kind, name);
        let secrets = observe::read_chunked(
            &self.secrets(),
            &names::state_secret_name(&suffix),
            Some(&suffix),
        )
        .await
        .expect("read state");
        state::read(&secrets, state::DEFAULT_DECOMPRESSION_CAP)
    }

    pub async fn annotate<K: TerraformObject>(&self, name: &str, edits: &[(&str, Option<String>)]) {
        let map: serde_json::Map<String, Value> = edits
            .iter()
            .map(|(k, v)| {
                (
                    k.to_string(),
                    v.clone().map(Value::String).unwrap_or(Value::Null),
                )
            })
            .collect();
        self.api::<K>()
            .patch(
                name,
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"annotations": map}})),
            )
            .await
            .expect("annotate");
    }

    /// Deletes the CAPI Cluster; the garbage collector deletes the objects it owns.
    pub async fn delete_cluster(&self, name: &str) {
        self.cluster_api()
            .delete(name, &DeleteParams::background())
            .await
            .expect("delete cluster");
    }

    pub async fn exists<K: TerraformObject>(&self, name: &str) -> bool {
        self.api::<K>().get_opt(name).await.expect("get").is_some()
    }

    pub async fn object<K: TerraformObject>(&self, name: &str) -> Option<K> {
        self.api::<K>().get_opt(name).await.expect("get")
    }

    /// The reason of a condition of an object, if set.
    pub async fn condition<K: TerraformObject>(
        &self,
        name: &str,
        type_: &str,
    ) -> Option<(String, String, String)> {
        let obj = self.object::<K>(name).await?;
        obj.status()?
            .conditions
            .iter()
            .find(|c| c.type_ == type_)
            .map(|c| (c.status.clone(), c.reason.clone(), c.message.clone()))
    }

    pub async fn secret_exists(&self, name: &str) -> bool {
        self.secrets()
            .get_opt(name)
            .await
            .expect("get secret")
            .is_some()
    }

    /// Event reasons recorded about an object (events.k8s.io/v1).
    pub fn event_reasons(&self, name: &str) -> Vec<String> {
        self.server
            .store()
            .list("events.k8s.io/v1", "events", Some(NS))
            .into_iter()
            .filter(|e| e["regarding"]["name"] == name)
            .map(|e| e["reason"].as_str().unwrap_or_default().to_string())
            .collect()
    }
}

/// The labels the apply path (and the destroy Job) give Terraform's backend: the owner
/// labels and clusterctl's move label.
pub fn backend_labels(kind: Kind, name: &str, uid: &str) -> BTreeMap<String, String> {
    let mut labels: BTreeMap<String, String> = inputs::owner_labels(kind, name, uid);
    labels.insert(names::CLUSTERCTL_MOVE_LABEL.into(), String::new());
    labels
}

pub fn terraform(dir: &Path, args: &[&str]) {
    if let Err(e) = try_terraform(dir, args) {
        panic!("{e}");
    }
}

/// Runs `terraform` with `args` in `dir`; the error carries its output.
pub fn try_terraform(dir: &Path, args: &[&str]) -> Result<(), String> {
    let out = Command::new(require("terraform"))
        .args(args)
        .current_dir(dir)
        .env("TF_IN_AUTOMATION", "1")
        .env("CHECKPOINT_DISABLE", "1")
        .env("HOME", dir)
        .env("TF_DATA_DIR", dir.join(".terraform-data"))
        .output()
        .expect("run terraform");
    if out.status.success() {
        return Ok(());
    }
    Err(format!(
        "terraform {args:?} failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    ))
}

/// Polls `check` every 100 ms until it returns true or `timeout` passes.
pub async fn wait_for<F, Fut>(what: &str, timeout: Duration, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let start = Instant::now();
    loop {
        if check().await {
            return;
        }
        if start.elapsed() > timeout {
            panic!("timed out after {timeout:?} waiting for {what}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Typed aliases for brevity in scenarios.
pub type Tfc = TerraformCluster;
pub type Tfm = TerraformMachine;
pub type Tfmp = TerraformMachinePool;

impl Env {
    /// Writes (create, update, patch, delete) the server has answered so far.
    pub fn total_writes(&self) -> u64 {
        self.server
            .request_log()
            .snapshot()
            .iter()
            .filter(|((verb, _, _), _)| {
                matches!(
                    verb.as_str(),
                    "create" | "update" | "patch" | "delete" | "deletecollection"
                )
            })
            .map(|(_, n)| *n)
            .sum()
    }

    /// Deletes one CAPTF object.
    pub async fn delete<K: TerraformObject>(&self, name: &str) {
        self.api::<K>()
            .delete(name, &DeleteParams::background())
            .await
            .expect("delete");
    }

    /// Waits until the object's Deleting condition has `reason`.
    pub async fn wait_deleting<K: TerraformObject>(
        &self,
        name: &str,
        reason: &str,
        timeout: Duration,
    ) -> String {
        wait_for(
            &format!("{name} to report Deleting={reason}"),
            timeout,
            || async {
                self.condition::<K>(name, "Deleting")
                    .await
                    .is_some_and(|(_, r, _)| r == reason)
            },
        )
        .await;
        self.condition::<K>(name, "Deleting")
            .await
            .map(|(_, _, m)| m)
            .unwrap_or_default()
    }

    pub async fn wait_gone<K: TerraformObject>(&self, name: &str, timeout: Duration) {
        wait_for(&format!("{name} to be released"), timeout, || async {
            !self.exists::<K>(name).await
        })
        .await;
    }

    /// How many times Terraform ran the destroy provisioner of an instance.
    pub fn tries(&self, markers: &Path, name: &str) -> u32 {
        std::fs::read_to_string(markers.join(format!("{name}-0.tries")))
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(0)
    }
}

/// A module whose destroy provisioner sleeps `seconds` on its first run (to be
/// interrupted, or to be seen running) and succeeds afterwards.
pub fn sleepy_module(seconds: u32) -> String {
    destroy_module(&format!("if [ $n -le 1 ]; then sleep {seconds}; fi"))
}

impl Env {
    /// Loses a state Secret for real: strips its finalizers and deletes it until it is gone
    /// (the manager may put its protection finalizer back in between).
    pub async fn lose_secret(&self, name: &str) {
        wait_for("the Secret to be gone", Duration::from_secs(60), || async {
            let strip = Patch::Merge(json!({"metadata": {"finalizers": null}}));
            let _ = self
                .secrets()
                .patch(name, &PatchParams::default(), &strip)
                .await;
            let _ = self.secrets().delete(name, &DeleteParams::default()).await;
            !self.secret_exists(name).await
        })
        .await;
    }
}

impl Env {
    /// A Cluster `prod` with one applied TerraformMachine `web-1` of `module_body`, the
    /// manager running (its finalizer is on the object) with the given retry backoff base
    /// (capped at four times it).
    pub async fn with_machine(
        tag: &str,
        module_body: &str,
        backoff_base: Duration,
    ) -> (Env, PathBuf) {
        let mut env = Env::start(tag).await;
        env.config.settings.backoff.base = backoff_base;
        env.config.settings.backoff.max = backoff_base * 4;
        env.start_manager();
        let markers = env.markers();
        let uid = env.create_cluster("prod").await;
        env.create_object::<TerraformMachine>("web-1", "prod", &uid, &markers)
            .await;
        env.wait_finalizer::<TerraformMachine>("web-1").await;
        env.apply::<TerraformMachine>("web-1", module_body, &markers)
            .await;
        (env, markers)
    }

    /// Waits until the manager has put its finalizer on the object.
    pub async fn wait_finalizer<K: TerraformObject>(&self, name: &str) {
        wait_for("the finalizer", Duration::from_secs(60), || async {
            self.object::<K>(name)
                .await
                .is_some_and(|o| o.meta().finalizers.is_some())
        })
        .await;
    }

    /// Waits until a Secret carries the protection finalizer.
    pub async fn wait_protected(&self, secret: &str) {
        wait_for(
            "the protection finalizer",
            Duration::from_secs(60),
            || async {
                self.secrets()
                    .get_opt(secret)
                    .await
                    .ok()
                    .flatten()
                    .is_some_and(|s| {
                        s.metadata
                            .finalizers
                            .unwrap_or_default()
                            .contains(&names::PROTECT_FINALIZER.to_string())
                    })
            },
        )
        .await;
    }
}
