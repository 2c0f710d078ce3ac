//! The real `kubectl` and `terraform` (kubernetes backend) against the test server.
//! These tests FAIL (not skip) when a binary is missing: CI must provide both.

mod common;

use std::io::Read;
use std::path::{Path, PathBuf};
use std::time::Duration;

use base64::Engine;
use captf_testserver::{JobRunner, JobRunnerOptions, TestServer};
use common::*;
use serde_json::{Value, json};

fn require(bin: &str) -> PathBuf {
    std::env::var_os("PATH")
        .into_iter()
        .flat_map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .map(|d| d.join(bin))
        .find(|p| p.is_file())
        .unwrap_or_else(|| panic!("`{bin}` is not on PATH: these tests need the real {bin} (kubectl v1.32, terraform 1.11); install it, do not skip"))
}

struct Out {
    code: i32,
    stdout: String,
    stderr: String,
}

async fn run(bin: &Path, args: &[&str], env: &[(&str, &str)], dir: Option<&Path>) -> Out {
    let mut cmd = tokio::process::Command::new(bin);
    cmd.args(args).kill_on_drop(true);
    for (k, v) in env {
        cmd.env(k, v);
    }
    if let Some(d) = dir {
        cmd.current_dir(d);
    }
    let out = tokio::time::timeout(Duration::from_secs(30), cmd.output())
        .await
        .expect("command finished in time")
        .expect("spawn");
    Out {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

async fn kubectl(srv: &TestServer, home: &Path, args: &[&str]) -> Out {
    let bin = require("kubectl");
    let kc = srv.kubeconfig_path().to_string_lossy().into_owned();
    let mut all = vec!["--kubeconfig", kc.as_str(), "--request-timeout=10s"];
    all.extend_from_slice(args);
    let home = home.to_string_lossy().into_owned();
    run(
        &bin,
        &all,
        &[
            ("HOME", home.as_str()),
            ("KUBECACHEDIR", &format!("{home}/cache")),
        ],
        None,
    )
    .await
}

fn ok(o: &Out, what: &str) -> String {
    assert_eq!(
        o.code, 0,
        "{what} failed: stdout={} stderr={}",
        o.stdout, o.stderr
    );
    o.stdout.clone()
}

fn temp_dir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!(
        "captf-tools-{tag}-{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0)
    ));
    std::fs::create_dir_all(&d).expect("temp dir");
    d
}

const CRD: &str = r#"apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: tfclusters.infrastructure.example.com
spec:
  group: infrastructure.example.com
  scope: Namespaced
  names:
    plural: tfclusters
    singular: tfcluster
    kind: TFCluster
    shortNames: [tfc]
  versions:
  - name: v1alpha1
    served: true
    storage: true
    subresources:
      status: {}
    schema:
      openAPIV3Schema:
        type: object
        x-kubernetes-preserve-unknown-fields: true
"#;

const OBJ: &str = r#"apiVersion: infrastructure.example.com/v1alpha1
kind: TFCluster
metadata:
  name: web-1
  namespace: x
  finalizers: [infrastructure.example.com/cleanup]
spec:
  module: web
"#;

const JOB: &str = r#"apiVersion: batch/v1
kind: Job
metadata:
  name: hello
  namespace: x
spec:
  backoffLimit: 0
  template:
    spec:
      restartPolicy: Never
      containers:
      - name: main
        image: none
        command: [sh, -c, "echo hello from the job"]
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_against_the_server() {
    let srv = TestServer::start().await;
    let dir = temp_dir("kubectl");
    ok(
        &kubectl(&srv, &dir, &["create", "namespace", "x"]).await,
        "create namespace",
    );
    std::fs::write(dir.join("crd.yaml"), CRD).expect("write");
    std::fs::write(dir.join("obj.yaml"), OBJ).expect("write");
    let crd = dir.join("crd.yaml").to_string_lossy().into_owned();
    let obj = dir.join("obj.yaml").to_string_lossy().into_owned();
    ok(
        &kubectl(
            &srv,
            &dir,
            &[
                "create",
                "secret",
                "generic",
                "-n",
                "x",
                "creds",
                "--from-literal=token=s3cr3t",
            ],
        )
        .await,
        "create secret",
    );
    ok(
        &kubectl(
            &srv,
            &dir,
            &[
                "create",
                "configmap",
                "-n",
                "x",
                "cfg",
                "--from-literal=k=v",
            ],
        )
        .await,
        "create configmap",
    );
    let sec = srv
        .store()
        .get("v1", "secrets", Some("x"), "creds")
        .expect("secret");
    assert_eq!(
        (sec["data"]["token"].clone(), sec["type"].clone()),
        (json!("czNjcjN0"), json!("Opaque"))
    );
    ok(
        &kubectl(&srv, &dir, &["create", "-f", &crd, "--validate=false"]).await,
        "create crd",
    );
    ok(
        &kubectl(&srv, &dir, &["create", "-f", &obj, "--validate=false"]).await,
        "create object",
    );
    let y = ok(
        &kubectl(
            &srv,
            &dir,
            &["get", "tfclusters", "web-1", "-n", "x", "-o", "yaml"],
        )
        .await,
        "get -o yaml",
    );
    assert!(
        y.contains("module: web") && y.contains("kind: TFCluster"),
        "{y}"
    );
    let short = ok(
        &kubectl(&srv, &dir, &["get", "tfc", "-n", "x", "-o", "name"]).await,
        "get by short name",
    );
    assert_eq!(short.trim(), "tfcluster.infrastructure.example.com/web-1");
    ok(
        &kubectl(
            &srv,
            &dir,
            &["annotate", "-n", "x", "tfcluster", "web-1", "note=hello"],
        )
        .await,
        "annotate",
    );
    ok(
        &kubectl(
            &srv,
            &dir,
            &["label", "-n", "x", "tfcluster", "web-1", "tier=gold"],
        )
        .await,
        "label",
    );
    ok(
        &kubectl(
            &srv,
            &dir,
            &[
                "patch",
                "-n",
                "x",
                "tfcluster",
                "web-1",
                "--type",
                "merge",
                "-p",
                r#"{"spec":{"size":3}}"#,
            ],
        )
        .await,
        "patch merge",
    );
    ok(
        &kubectl(
            &srv,
            &dir,
            &[
                "patch",
                "-n",
                "x",
                "tfcluster",
                "web-1",
                "--type",
                "json",
                "-p",
                r#"[{"op":"add","path":"/spec/zone","value":"z1"}]"#,
            ],
        )
        .await,
        "patch json",
    );
    let store = srv.store();
    let o = store
        .get(
            "infrastructure.example.com/v1alpha1",
            "tfclusters",
            Some("x"),
            "web-1",
        )
        .expect("object");
    assert_eq!(o["metadata"]["annotations"]["note"], "hello");
    assert_eq!(o["metadata"]["labels"]["tier"], "gold");
    assert_eq!(
        (o["spec"]["size"].clone(), o["spec"]["zone"].clone()),
        (json!(3), json!("z1"))
    );
    let jp = ok(
        &kubectl(
            &srv,
            &dir,
            &[
                "get",
                "-n",
                "x",
                "tfcluster",
                "web-1",
                "-o",
                "jsonpath={.metadata.generation}",
            ],
        )
        .await,
        "jsonpath",
    );
    assert_eq!(jp, "3");
    // delete with a finalizer: the object stays, marked
    ok(
        &kubectl(
            &srv,
            &dir,
            &["delete", "-n", "x", "tfcluster", "web-1", "--wait=false"],
        )
        .await,
        "delete",
    );
    let o = store
        .get(
            "infrastructure.example.com/v1alpha1",
            "tfclusters",
            Some("x"),
            "web-1",
        )
        .expect("still there");
    assert!(o["metadata"]["deletionTimestamp"].is_string());
    let waiter = {
        let kc = srv.kubeconfig_path().to_path_buf();
        let home = dir.clone();
        tokio::spawn(async move {
            let bin = require("kubectl");
            let kc = kc.to_string_lossy().into_owned();
            let h = home.to_string_lossy().into_owned();
            run(
                &bin,
                &[
                    "--kubeconfig",
                    &kc,
                    "wait",
                    "--for=delete",
                    "-n",
                    "x",
                    "tfcluster/web-1",
                    "--timeout=10s",
                ],
                &[("HOME", h.as_str())],
                None,
            )
            .await
        })
    };
    tokio::time::sleep(Duration::from_millis(500)).await;
    ok(
        &kubectl(
            &srv,
            &dir,
            &[
                "patch",
                "-n",
                "x",
                "tfcluster",
                "web-1",
                "--type",
                "json",
                "-p",
                r#"[{"op":"remove","path":"/metadata/finalizers"}]"#,
            ],
        )
        .await,
        "remove finalizer",
    );
    let w = waiter.await.expect("join");
    ok(&w, "wait --for=delete");
    assert!(
        store
            .get(
                "infrastructure.example.com/v1alpha1",
                "tfclusters",
                Some("x"),
                "web-1"
            )
            .is_none()
    );
    // kubectl logs of a Job's pod
    let runner = JobRunner::start(
        &srv,
        JobRunnerOptions {
            work_root: dir.join("work"),
            ..Default::default()
        },
    );
    // `kubectl create job` sends protobuf, which the server does not decode: use a manifest.
    std::fs::write(dir.join("job.yaml"), JOB).expect("write");
    let job = dir.join("job.yaml").to_string_lossy().into_owned();
    ok(
        &kubectl(&srv, &dir, &["create", "-f", &job, "--validate=false"]).await,
        "create job",
    );
    let pod = eventually(Duration::from_secs(10), || {
        store
            .list("v1", "pods", Some("x"))
            .into_iter()
            .find(|p| p["status"]["phase"] == "Succeeded")
    })
    .await
    .expect("the job's pod succeeded");
    let name = pod["metadata"]["name"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let logs = ok(
        &kubectl(&srv, &dir, &["logs", "-n", "x", &name]).await,
        "logs",
    );
    assert_eq!(logs, "hello from the job\n");
    // A second Job: `kubectl logs job/NAME` finds the Pods through the selector the server
    // generated for each Job, so it reads this Job's Pod, not the first one's.
    let second = JOB
        .replace("name: hello", "name: second")
        .replace("hello from the job", "second job speaking");
    std::fs::write(dir.join("job2.yaml"), second).expect("write");
    let job2 = dir.join("job2.yaml").to_string_lossy().into_owned();
    ok(
        &kubectl(&srv, &dir, &["create", "-f", &job2, "--validate=false"]).await,
        "create the second job",
    );
    eventually(Duration::from_secs(10), || {
        store
            .get("batch/v1", "jobs", Some("x"), "second")
            .filter(|j| j["status"]["succeeded"] == 1)
    })
    .await
    .expect("the second job completed");
    let logs = ok(
        &kubectl(&srv, &dir, &["logs", "-n", "x", "job/second"]).await,
        "logs job/second",
    );
    assert_eq!(logs, "second job speaking\n");
    let plain = ok(
        &kubectl(&srv, &dir, &["get", "pods", "-n", "x"]).await,
        "get without -o (no server-side table)",
    );
    assert!(plain.contains(&name), "{plain}");
    // client-side apply (create, then a computed patch)
    std::fs::write(dir.join("apply.yaml"), APPLY).expect("write");
    let apply = dir.join("apply.yaml").to_string_lossy().into_owned();
    ok(
        &kubectl(&srv, &dir, &["apply", "-f", &apply, "--validate=false"]).await,
        "apply (create)",
    );
    std::fs::write(
        dir.join("apply.yaml"),
        APPLY.replace("module: api", "module: api2"),
    )
    .expect("write");
    ok(
        &kubectl(&srv, &dir, &["apply", "-f", &apply, "--validate=false"]).await,
        "apply (patch)",
    );
    let o = store
        .get(
            "infrastructure.example.com/v1alpha1",
            "tfclusters",
            Some("x"),
            "api-1",
        )
        .expect("applied");
    assert_eq!(o["spec"]["module"], "api2");
    // deleting the namespace empties it; kubectl waits for it to go
    ok(
        &kubectl(&srv, &dir, &["delete", "namespace", "x", "--timeout=10s"]).await,
        "delete namespace",
    );
    assert!(store.get("v1", "namespaces", None, "x").is_none());
    runner.stop().await;
    srv.shutdown().await;
    let _ = std::fs::remove_dir_all(dir);
}

const APPLY: &str = r#"apiVersion: infrastructure.example.com/v1alpha1
kind: TFCluster
metadata:
  name: api-1
  namespace: x
spec:
  module: api
"#;

fn module(dir: &Path, body: &str) {
    std::fs::write(
        dir.join("main.tf"),
        format!("terraform {{\n  backend \"kubernetes\" {{}}\n}}\n{body}"),
    )
    .expect("write module");
}

async fn terraform(dir: &Path, args: &[&str]) -> Out {
    let bin = require("terraform");
    let home = dir.join("home");
    std::fs::create_dir_all(&home).expect("home");
    let h = home.to_string_lossy().into_owned();
    let data = dir.join(".tfdata").to_string_lossy().into_owned();
    run(
        &bin,
        args,
        &[
            ("TF_IN_AUTOMATION", "1"),
            ("HOME", h.as_str()),
            ("TF_DATA_DIR", data.as_str()),
            ("TF_INPUT", "0"),
            ("CHECKPOINT_DISABLE", "1"),
        ],
        Some(dir),
    )
    .await
}

async fn tf_init(srv: &TestServer, dir: &Path) {
    let kc = format!(
        "-backend-config=config_path={}",
        srv.kubeconfig_path().display()
    );
    ok(
        &terraform(
            dir,
            &[
                "init",
                "-input=false",
                "-backend-config=secret_suffix=web-1.tfm",
                "-backend-config=namespace=team-a",
                &kc,
            ],
        )
        .await,
        "terraform init",
    );
}

fn gunzip(b64: &Value) -> Vec<u8> {
    let raw = base64::engine::general_purpose::STANDARD
        .decode(b64.as_str().unwrap_or_default())
        .expect("base64");
    let mut out = Vec::new();
    flate2::read::GzDecoder::new(&raw[..])
        .read_to_end(&mut out)
        .expect("gunzip");
    out
}

fn state(srv: &TestServer) -> Value {
    let store = srv.store();
    let base = store
        .get("v1", "secrets", Some("team-a"), "tfstate-default-web-1.tfm")
        .expect("state secret");
    let mut gz_parts = vec![base];
    let mut n = 1;
    while let Some(p) = store.get(
        "v1",
        "secrets",
        Some("team-a"),
        &format!("tfstate-default-web-1.tfm-part-{n}"),
    ) {
        gz_parts.push(p);
        n += 1;
    }
    let mut all = Vec::new();
    for p in &gz_parts {
        all.extend(
            base64::engine::general_purpose::STANDARD
                .decode(p["data"]["tfstate"].as_str().unwrap_or_default())
                .expect("b64"),
        );
    }
    let mut out = Vec::new();
    flate2::read::GzDecoder::new(&all[..])
        .read_to_end(&mut out)
        .expect("gunzip");
    serde_json::from_slice(&out).expect("state json")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn terraform_kubernetes_backend() {
    let srv = TestServer::start().await;
    let store = srv.store();
    store
        .create(json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "team-a"}}))
        .expect("ns");
    let dir = temp_dir("terraform");
    module(
        &dir,
        "resource \"terraform_data\" \"a\" {\n  input = \"one\"\n}\nresource \"terraform_data\" \"b\" {\n  input = \"two\"\n}\n",
    );
    tf_init(&srv, &dir).await;
    ok(
        &terraform(&dir, &["apply", "-auto-approve", "-input=false"]).await,
        "apply",
    );
    let secret = store
        .get("v1", "secrets", Some("team-a"), "tfstate-default-web-1.tfm")
        .expect("state secret");
    let labels = &secret["metadata"]["labels"];
    assert_eq!(
        (
            labels["tfstate"].clone(),
            labels["tfstateSecretSuffix"].clone(),
            labels["tfstateWorkspace"].clone()
        ),
        (json!("true"), json!("web-1.tfm"), json!("default"))
    );
    let st: Value = serde_json::from_slice(&gunzip(&secret["data"]["tfstate"])).expect("json");
    assert_eq!(st["resources"].as_array().map(Vec::len), Some(2));
    let lease = store
        .get(
            "coordination.k8s.io/v1",
            "leases",
            Some("team-a"),
            "lock-tfstate-default-web-1.tfm",
        )
        .expect("lock lease");
    assert!(
        lease["spec"]["holderIdentity"]
            .as_str()
            .unwrap_or_default()
            .is_empty(),
        "unlocked: {lease}"
    );
    // a held lock makes a second run fail
    let mut held = lease.clone();
    held["spec"]["holderIdentity"] = json!("someone-else");
    held["metadata"]["annotations"] = json!({"app.terraform.io/lock-info": "{\"ID\":\"someone-else\",\"Operation\":\"OperationTypeApply\",\"Who\":\"x@y\",\"Version\":\"1.11.4\",\"Created\":\"2026-01-01T00:00:00Z\",\"Path\":\"\"}"});
    store.update(held).expect("take the lock");
    let o = terraform(
        &dir,
        &["apply", "-auto-approve", "-input=false", "-lock-timeout=0s"],
    )
    .await;
    assert_ne!(o.code, 0);
    assert!(
        o.stderr.to_lowercase().contains("lock"),
        "lock error expected: {}",
        o.stderr
    );
    let mut free = store
        .get(
            "coordination.k8s.io/v1",
            "leases",
            Some("team-a"),
            "lock-tfstate-default-web-1.tfm",
        )
        .expect("lease");
    free["spec"] = json!({});
    free["metadata"]["annotations"] = json!({});
    store.update(free).expect("release");
    // a state whose gzip exceeds 1 MiB is chunked
    module(
        &dir,
        "variable \"blob\" {\n  type = string\n}\nresource \"terraform_data\" \"big\" {\n  count = 3\n  input = \"${var.blob}-${count.index}\"\n}\n",
    );
    let mut seed: u64 = 0x2545_f491_4f6c_dd1d;
    let random: Vec<u8> = (0..450_000)
        .map(|_| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            (seed & 0xff) as u8
        })
        .collect();
    let blob = base64::engine::general_purpose::STANDARD.encode(random);
    std::fs::write(
        dir.join("terraform.tfvars.json"),
        serde_json::to_vec(&json!({"blob": blob})).expect("json"),
    )
    .expect("tfvars");
    ok(
        &terraform(&dir, &["apply", "-auto-approve", "-input=false"]).await,
        "big apply",
    );
    assert!(
        store
            .get(
                "v1",
                "secrets",
                Some("team-a"),
                "tfstate-default-web-1.tfm-part-1"
            )
            .is_some(),
        "chunked state"
    );
    assert_eq!(state(&srv)["resources"].as_array().map(Vec::len), Some(1));
    ok(
        &terraform(&dir, &["destroy", "-auto-approve", "-input=false"]).await,
        "destroy",
    );
    let st = state(&srv);
    assert_eq!(st["resources"], json!([]));
    srv.shutdown().await;
    let _ = std::fs::remove_dir_all(dir);
}
