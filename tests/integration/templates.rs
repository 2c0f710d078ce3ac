//! The template kinds, their immutability, the release assets, the cluster templates and
//! the ClusterClass, checked with Cluster API's own tools: the admission policies of
//! `config/policy` on the real API server; `captf release-assets` against `kubectl
//! kustomize config/default`; every asset with clusterctl v1.14.2's variable rules, and
//! `clusterctl init` from a local repository of them; the templates and the ClusterClass
//! through the real Cluster API's webhooks, and its topology controller patching a
//! Cluster's variables into CAPTF's templates.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use captf::api::{
    TerraformClusterTemplate, TerraformMachine, TerraformMachinePoolTemplate,
    TerraformMachineTemplate,
};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{
    Api, ApiResource, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams,
};
use kube::{Client, ResourceExt};
use serde_json::{Value, json};

use crate::support::cluster::{self, ControlPlane};
use crate::support::*;

const ROOT: &str = env!("CARGO_MANIFEST_DIR");
pub(crate) const VERSION: &str = "v0.1.0";
const IMAGE: &str = "ghcr.io/captf/captf:v0.1.0";
const WAIT: Duration = Duration::from_secs(90);

fn captf(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_captf"))
        .args(args)
        .output()
        .expect("run captf")
}

pub(crate) fn temp_dir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!(
        "captf-e2e-{tag}-{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0)
    ));
    std::fs::create_dir_all(&d).expect("temp dir");
    d
}

/// `captf release-assets --version VERSION --image IMAGE DIR`, which must succeed.
pub(crate) fn release_assets(dir: &Path) {
    let out = captf(&[
        "release-assets",
        "--version",
        VERSION,
        "--image",
        IMAGE,
        dir.to_str().expect("path"),
    ]);
    assert!(
        out.status.success(),
        "captf release-assets: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

const ASSETS: [&str; 7] = [
    "infrastructure-components.yaml",
    "metadata.yaml",
    "cluster-template.yaml",
    "cluster-template-machinepool.yaml",
    "cluster-template-topology.yaml",
    "clusterclass-terraform.yaml",
    "cluster-template-offline.yaml",
];

fn yaml_docs(text: &str) -> Vec<Value> {
    serde_saphyr::from_multiple::<Value>(text)
        .expect("YAML")
        .into_iter()
        .filter(|d| !d.is_null())
        .collect()
}

#[test]
fn release_assets_writes_clusterctl_s_files_and_refuses_what_clusterctl_would() {
    let dir = temp_dir("release-assets").join("not-yet-made");
    release_assets(&dir);
    for name in ASSETS {
        assert!(dir.join(name).is_file(), "{name} written");
    }
    let read = |p: &Path| std::fs::read_to_string(p).expect("read");
    assert_eq!(
        read(&dir.join("metadata.yaml")),
        read(&Path::new(ROOT).join("metadata.yaml"))
    );
    for name in &ASSETS[2..] {
        assert_eq!(
            read(&dir.join(name)),
            read(&Path::new(ROOT).join("release").join(name)),
            "{name} is release/{name}"
        );
    }
    // Refusals: exit status 2, a message saying what to write, nothing written.
    let refused = temp_dir("release-assets-refused");
    for (version, image, says) in [
        (VERSION, "captf:latest", "repository name must be canonical"),
        (VERSION, "captf/captf:v0.1.0", "ghcr.io/captf/captf:v0.1.0"),
        ("0.1.0", IMAGE, "semantic version with a leading v"),
        ("v0.1", IMAGE, "semantic version with a leading v"),
        ("v9.0.0", IMAGE, "no release series 9.0"),
    ] {
        let out = captf(&[
            "release-assets",
            "--version",
            version,
            "--image",
            image,
            refused.to_str().expect("path"),
        ]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{version} {image}: {stderr}");
        assert!(stderr.contains(says), "{version} {image}: {stderr}");
    }
    assert_eq!(
        std::fs::read_dir(&refused).expect("dir").count(),
        0,
        "a refusal writes nothing"
    );
    // DIR is a file.
    let file = refused.join("a-file");
    std::fs::write(&file, "x").expect("file");
    let out = captf(&[
        "release-assets",
        "--version",
        VERSION,
        "--image",
        IMAGE,
        file.to_str().expect("path"),
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("a-file"), "names the path: {stderr}");
    let _ = std::fs::remove_dir_all(dir.parent().expect("parent"));
    let _ = std::fs::remove_dir_all(&refused);
}

/// Replaces every `${NAME:=default}` in the strings of `v` by its default.
fn defaults(v: &mut Value) {
    match v {
        Value::String(s) => {
            while let Some(start) = s.find("${") {
                let end = start + s[start..].find('}').expect("closing brace");
                let inner = &s[start + 2..end];
                let (_, default) = inner.split_once(":=").expect("a default");
                *s = format!("{}{}{}", &s[..start], default, &s[end + 1..]);
            }
        }
        Value::Array(a) => a.iter_mut().for_each(defaults),
        Value::Object(o) => o.values_mut().for_each(defaults),
        _ => {}
    }
}

fn sorted_by_identity(mut objects: Vec<Value>) -> Vec<Value> {
    objects.sort_by_key(|o| {
        (
            o["kind"].as_str().unwrap_or_default().to_string(),
            o["metadata"]["name"]
                .as_str()
                .unwrap_or_default()
                .to_string(),
        )
    });
    objects
}

/// The components are `kubectl kustomize config/default`, but for the variables: with
/// each variable at its default, and the image kustomize's, they are the same objects.
#[test]
fn the_components_are_config_default_built_by_kustomize_but_for_the_variables() {
    let kubectl = std::env::var("KUBECTL").unwrap_or_else(|_| "kubectl".to_string());
    let out = Command::new(&kubectl)
        .args(["kustomize", "config/default"])
        .current_dir(ROOT)
        .output()
        .unwrap_or_else(|e| panic!("cannot run `{kubectl} kustomize config/default` ({e})"));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let built = sorted_by_identity(yaml_docs(&String::from_utf8_lossy(&out.stdout)));

    let dir = temp_dir("components");
    release_assets(&dir);
    let text = std::fs::read_to_string(dir.join("infrastructure-components.yaml")).expect("read");
    let mut released = yaml_docs(&text);
    for o in &mut released {
        defaults(o);
    }
    let mut released = sorted_by_identity(released);
    for o in &mut released {
        if o["kind"] == "Deployment" {
            let image = &mut o["spec"]["template"]["spec"]["containers"][0]["image"];
            assert_eq!(*image, IMAGE, "the image's default is --image");
            *image = json!("captf:latest");
        }
    }
    assert_eq!(released.len(), built.len());
    for (r, b) in released.iter().zip(&built) {
        assert_eq!(r, b, "{} {}", b["kind"], b["metadata"]["name"]);
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// The table of docs/provisioning/05-clusterctl.md: variable -> (the files that use it,
/// its default or None when required).
fn documented_variables() -> BTreeMap<String, (Vec<&'static str>, Option<String>)> {
    let doc = std::fs::read_to_string(format!("{ROOT}/docs/provisioning/05-clusterctl.md"))
        .expect("docs/provisioning/05-clusterctl.md");
    let file_of = |short: &str| match short {
        "components" => "infrastructure-components.yaml",
        "default" => "cluster-template.yaml",
        "machinepool" => "cluster-template-machinepool.yaml",
        "topology" => "cluster-template-topology.yaml",
        "offline" => "cluster-template-offline.yaml",
        other => panic!("05-clusterctl.md names a file {other:?}"),
    };
    let mut table = BTreeMap::new();
    for line in doc
        .lines()
        .skip_while(|l| !l.starts_with("| variable | in |"))
    {
        if !line.starts_with("| `") {
            if table.is_empty() {
                continue;
            }
            break;
        }
        let cells: Vec<&str> = line.split(" | ").collect();
        let name = cells[0]
            .trim_start_matches("| ")
            .trim_matches('`')
            .to_string();
        let files = cells[1].split(", ").map(file_of).collect();
        let default = match cells[2] {
            "required" => None,
            d => Some(d.to_string()),
        };
        table.insert(name, (files, default));
    }
    assert!(table.len() > 10, "the variables table of 05-clusterctl.md");
    table
}

pub(crate) fn clusterctl(home: &Path, args: &[&str], env: &[(&str, &str)]) -> Output {
    Command::new(cluster::clusterctl())
        .args(args)
        .env("HOME", home)
        .env("XDG_CONFIG_HOME", home.join(".config"))
        .env("CLUSTERCTL_DISABLE_VERSIONCHECK", "true")
        .envs(env.iter().copied())
        .output()
        .expect("run clusterctl")
}

/// `clusterctl generate cluster --list-variables` of a file: each variable, with the
/// default the file gives it. (clusterctl prints a template's default quoted, and the
/// value of one of its flags for a common variable unquoted: those count as required by
/// the file.)
fn listed_variables(home: &Path, file: &Path) -> BTreeMap<String, Option<String>> {
    let out = clusterctl(
        home,
        &[
            "generate",
            "cluster",
            "prod",
            "--target-namespace",
            "team-a",
            "--from",
            file.to_str().expect("path"),
            "--list-variables",
        ],
        &[],
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "clusterctl --list-variables {}: {stdout}{}",
        file.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    let mut listed = BTreeMap::new();
    for line in stdout.lines() {
        if let Some(rest) = line.strip_prefix("  - ") {
            let (name, rest) = rest.split_once(' ').unwrap_or((rest, ""));
            let default = rest
                .trim()
                .strip_prefix("(defaults to \"")
                .and_then(|d| d.strip_suffix("\")"))
                .map(String::from);
            listed.insert(name.to_string(), default);
        }
    }
    listed
}

/// What a user sets for `clusterctl generate cluster`.
const TEMPLATE_ENV: [(&str, &str); 3] = [
    (
        "CAPTF_CLUSTER_MODULE",
        "git::https://example.com/infra.git//cluster?ref=v1.4.0",
    ),
    (
        "CAPTF_MACHINE_MODULE",
        "git::https://example.com/infra.git//vm?ref=v1.4.0",
    ),
    (
        "CAPTF_MACHINE_POOL_MODULE",
        "git::https://example.com/infra.git//pool?ref=v1.4.0",
    ),
];

/// `clusterctl generate cluster prod --from FILE` with the common variables given as
/// flags and CAPTF's through the environment: the rendered objects.
fn generate_cluster(home: &Path, file: &Path, ns: &str) -> Vec<Value> {
    let out = clusterctl(
        home,
        &[
            "generate",
            "cluster",
            "prod",
            "--from",
            file.to_str().expect("path"),
            "--target-namespace",
            ns,
            "--kubernetes-version",
            "v1.33.0",
            "--control-plane-machine-count",
            "1",
            "--worker-machine-count",
            "2",
        ],
        &TEMPLATE_ENV,
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "clusterctl generate cluster --from {}: {}",
        file.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        !stdout.contains("${"),
        "a variable left in {}",
        file.display()
    );
    yaml_docs(&stdout)
}

/// Every asset uses exactly the variables docs/provisioning/05-clusterctl.md lists for
/// it, required and optional as the table says, and every template renders with them;
/// the offline template's modules, rendered, follow the module contract.
#[test]
fn clusterctl_lists_exactly_the_documented_variables_and_renders_every_template() {
    let dir = temp_dir("clusterctl-variables");
    let home = dir.join("home");
    std::fs::create_dir_all(&home).expect("home");
    let assets = dir.join("assets");
    release_assets(&assets);
    let documented = documented_variables();
    for name in ASSETS {
        let listed = listed_variables(&home, &assets.join(name));
        let expected: BTreeMap<String, Option<String>> = documented
            .iter()
            .filter(|(_, (files, _))| files.contains(&name))
            .map(|(var, (_, default))| {
                let default = match (var.as_str(), default) {
                    ("CAPTF_IMAGE", _) => Some(IMAGE.to_string()),
                    (_, d) => d.as_ref().map(|d| d.trim_matches('`').to_string()),
                };
                (var.clone(), default)
            })
            .collect();
        assert_eq!(
            listed, expected,
            "{name}: the variables clusterctl finds (left) and 05-clusterctl.md documents (right)"
        );
    }

    for name in [
        "cluster-template.yaml",
        "cluster-template-machinepool.yaml",
        "cluster-template-offline.yaml",
    ] {
        let objects = generate_cluster(&home, &assets.join(name), "team-a");
        for o in &objects {
            assert_eq!(o["metadata"]["namespace"], "team-a", "{name}: {o}");
        }
        let kinds: Vec<&str> = objects.iter().filter_map(|o| o["kind"].as_str()).collect();
        assert!(kinds.contains(&"Cluster"), "{name}: {kinds:?}");
        assert!(kinds.contains(&"TerraformCluster"), "{name}: {kinds:?}");
        let cluster = objects
            .iter()
            .find(|o| o["kind"] == "TerraformCluster")
            .expect("tfc");
        assert_eq!(
            cluster["spec"]["runner"]["image"],
            captf::api::DEFAULT_RUNNER_IMAGE
        );
        if name == "cluster-template-offline.yaml" {
            offline_modules_follow_the_contract(&dir, &objects);
        } else {
            assert_eq!(cluster["spec"]["module"]["source"], TEMPLATE_ENV[0].1);
        }
    }
    // The topology template, with the ClusterClass beside it: clusterctl adds the class
    // only from a repository (below, in the `init` test), so both are rendered here.
    let objects = generate_cluster(
        &home,
        &assets.join("cluster-template-topology.yaml"),
        "team-a",
    );
    let topology = &objects[0]["spec"]["topology"];
    assert_eq!(topology["classRef"]["name"], "terraform");
    assert_eq!(topology["variables"][0]["value"], TEMPLATE_ENV[0].1);
    let _ = std::fs::remove_dir_all(&dir);
}

/// The offline template's inline modules pass `captf module check` for their role and
/// `terraform validate` (terraform_data needs no provider: no registry is reached).
fn offline_modules_follow_the_contract(dir: &Path, objects: &[Value]) {
    for (kind, role, files) in [
        (
            "TerraformCluster",
            "cluster",
            &objects
                .iter()
                .find(|o| o["kind"] == "TerraformCluster")
                .expect("tfc")["spec"]["module"]["files"],
        ),
        (
            "TerraformMachineTemplate",
            "machine",
            &objects
                .iter()
                .find(|o| o["kind"] == "TerraformMachineTemplate")
                .expect("tfmt")["spec"]["template"]["spec"]["module"]["files"],
        ),
    ] {
        let module = dir.join(format!("offline-{role}"));
        std::fs::create_dir_all(&module).expect("module dir");
        let files = files.as_object().expect("inline files");
        assert!(!files.is_empty(), "{kind}");
        for (file, text) in files {
            std::fs::write(module.join(file), text.as_str().expect("text")).expect("write");
        }
        let out = captf(&[
            "module",
            "check",
            module.to_str().expect("path"),
            "--role",
            role,
        ]);
        assert!(
            out.status.success(),
            "{kind}'s offline module: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        terraform(&module, &["init", "-backend=false", "-input=false"]);
        terraform(&module, &["validate"]);
    }
}

pub(crate) fn api_resource(api_version: &str, kind: &str, plural: &str) -> ApiResource {
    let (group, version) = api_version.split_once('/').unwrap_or(("", api_version));
    ApiResource {
        group: group.into(),
        version: version.into(),
        api_version: api_version.into(),
        kind: kind.into(),
        plural: plural.into(),
    }
}

async fn create_namespace(client: &Client, ns: &str) {
    let namespace: Namespace =
        serde_json::from_value(json!({"metadata": {"name": ns}})).expect("namespace");
    Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &namespace)
        .await
        .expect("create namespace");
}

fn kubectl(kubeconfig: &Path, args: &[&str]) -> Output {
    let kubectl = std::env::var("KUBECTL").unwrap_or_else(|_| "kubectl".to_string());
    Command::new(&kubectl)
        .args(args)
        .env("KUBECONFIG", kubeconfig)
        .current_dir(ROOT)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {kubectl}: {e}"))
}

/// `config/policy` applied with kubectl, and the API server enforcing it (a policy is
/// enforced a moment after it and its binding are created).
async fn install_policies(plane: &ControlPlane, client: &Client, ns: &str) {
    let out = kubectl(
        plane.kubeconfig(),
        &["apply", "--server-side", "-k", "config/policy"],
    );
    assert!(
        out.status.success(),
        "kubectl apply -k config/policy: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    // A probe template, changed until the change is refused.
    let probes: Api<TerraformMachineTemplate> = Api::namespaced(client.clone(), ns);
    let probe = machine_template("policy-probe", "a");
    probes
        .create(&PostParams::default(), &probe)
        .await
        .expect("probe");
    let mut n = 0;
    wait_for("the template policy to be enforced", WAIT, || {
        n += 1;
        let probes = probes.clone();
        async move {
            let patch = json!({"spec": {"template": {"spec": {"variables": {"n": n}}}}});
            probes
                .patch(
                    "policy-probe",
                    &PatchParams::default(),
                    &Patch::Merge(&patch),
                )
                .await
                .is_err()
        }
    })
    .await;
    let machines: Api<TerraformMachine> = Api::namespaced(client.clone(), ns);
    machines
        .create(&PostParams::default(), &machine("policy-probe"))
        .await
        .expect("probe machine");
    let mut n = 0;
    wait_for("the machine policy to be enforced", WAIT, || {
        n += 1;
        let machines = machines.clone();
        async move {
            let patch = json!({"spec": {"variables": {"n": n}}});
            machines
                .patch(
                    "policy-probe",
                    &PatchParams::default(),
                    &Patch::Merge(&patch),
                )
                .await
                .is_err()
        }
    })
    .await;
}

fn machine_template(name: &str, size: &str) -> TerraformMachineTemplate {
    serde_json::from_value(json!({
        "apiVersion": "infrastructure.cluster.x-k8s.io/v1alpha1",
        "kind": "TerraformMachineTemplate",
        "metadata": {"name": name},
        "spec": {"template": {
            "metadata": {"labels": {"tier": "web"}},
            "spec": {"module": {"source": "git::https://example.com/infra.git//vm?ref=v1"},
                "variables": {"size": size}}
        }}
    }))
    .expect("template")
}

fn machine(name: &str) -> TerraformMachine {
    serde_json::from_value(json!({
        "apiVersion": "infrastructure.cluster.x-k8s.io/v1alpha1",
        "kind": "TerraformMachine",
        "metadata": {"name": name},
        "spec": {"module": {"source": "git::https://example.com/infra.git//vm?ref=v1"},
            "variables": {"size": "small"}}
    }))
    .expect("machine")
}

fn refusal(err: kube::Error) -> String {
    match err {
        kube::Error::Api(s) => {
            assert_eq!(s.code, 422, "{s:?}");
            s.message.clone()
        }
        other => panic!("not a refusal by the API server: {other}"),
    }
}

/// The admission policies on the real API server: a template's `spec.template.spec` and
/// a machine's spec are refused with a message naming the object, the fields and what
/// to do; what Cluster API and the manager write goes through: the topology
/// controller's dry-run, a providerID set once by the manager's JSON patch, metadata,
/// status, a deletion.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_policies_refuse_changes_clearly_and_let_cluster_api_and_the_manager_through() {
    if envtest_only("it installs cluster-wide admission policies on a control plane of its own") {
        return;
    }
    let plane = ControlPlane::dedicated("templates-policy", &[]);
    let client = plane.client().await;
    let ns = "team-a";
    create_namespace(&client, ns).await;
    install_policies(&plane, &client, ns).await;

    // Templates: creating is allowed; the spec refused; metadata allowed.
    let templates: Api<TerraformMachineTemplate> = Api::namespaced(client.clone(), ns);
    templates
        .create(&PostParams::default(), &machine_template("web", "small"))
        .await
        .expect("creating a template is allowed");
    let change = json!({"spec": {"template": {"spec": {"variables": {"size": "large"}}}}});
    let message = refusal(
        templates
            .patch("web", &PatchParams::default(), &Patch::Merge(&change))
            .await
            .expect_err("spec.template.spec refused"),
    );
    for says in [
        "TerraformMachineTemplate team-a/web",
        "spec.template.spec cannot change",
        "Create a new TerraformMachineTemplate",
        "Cluster API rolls the change out",
    ] {
        assert!(message.contains(says), "{says:?} in {message}");
    }
    eprintln!("the refusal, as a user sees it: {message}");
    let labels = json!({"metadata": {"labels": {"team": "a"}},
        "spec": {"template": {"metadata": {"labels": {"tier": "api"}}}}});
    templates
        .patch("web", &PatchParams::default(), &Patch::Merge(&labels))
        .await
        .expect("metadata and spec.template.metadata may change");

    // The topology controller's server-side apply dry-run, with its annotation, passes
    // and stores nothing; the same without the annotation, or not a dry-run, is refused.
    let mut desired = machine_template("web", "large");
    desired.metadata.annotations = Some(BTreeMap::from([(
        "topology.cluster.x-k8s.io/dry-run".to_string(),
        String::new(),
    )]));
    let ssa = PatchParams::apply("capi-topology").force();
    let dry = templates
        .patch("web", &ssa.clone().dry_run(), &Patch::Apply(&desired))
        .await
        .expect("the topology dry-run passes");
    assert_eq!(
        dry.spec
            .template
            .spec
            .variables
            .as_ref()
            .expect("variables")["size"],
        "large"
    );
    let stored = templates.get("web").await.expect("template");
    assert_eq!(
        stored
            .spec
            .template
            .spec
            .variables
            .as_ref()
            .expect("variables")["size"],
        "small",
        "a dry-run stores nothing"
    );
    let err = templates
        .patch("web", &ssa, &Patch::Apply(&desired))
        .await
        .expect_err("the annotation alone lets nothing through");
    assert!(refusal(err).contains("cannot change"));
    let mut plain = machine_template("web", "large");
    plain.metadata.annotations = None;
    let err = templates
        .patch("web", &ssa.clone().dry_run(), &Patch::Apply(&plain))
        .await
        .expect_err("a dry-run without the annotation is checked");
    assert!(refusal(err).contains("cannot change"));

    // The cluster and pool templates too; their message points at what refers to them.
    let cluster_templates: Api<TerraformClusterTemplate> = Api::namespaced(client.clone(), ns);
    let tfct: TerraformClusterTemplate = serde_json::from_value(json!({
        "apiVersion": "infrastructure.cluster.x-k8s.io/v1alpha1",
        "kind": "TerraformClusterTemplate", "metadata": {"name": "prod"},
        "spec": {"template": {"spec": {"module": {"source": "git::https://example.com/c.git?ref=v1"}}}}
    }))
    .expect("tfct");
    cluster_templates
        .create(&PostParams::default(), &tfct)
        .await
        .expect("create tfct");
    let change = json!({"spec": {"template": {"spec": {"module": {"source": "git::https://example.com/c.git?ref=v2"}}}}});
    let message = refusal(
        cluster_templates
            .patch("prod", &PatchParams::default(), &Patch::Merge(&change))
            .await
            .expect_err("refused"),
    );
    assert!(
        message.contains("TerraformClusterTemplate team-a/prod")
            && message.contains("the ClusterClass (spec.infrastructure.templateRef)"),
        "{message}"
    );
    let pool_templates: Api<TerraformMachinePoolTemplate> = Api::namespaced(client.clone(), ns);
    let tfmpt: TerraformMachinePoolTemplate = serde_json::from_value(json!({
        "apiVersion": "infrastructure.cluster.x-k8s.io/v1alpha1",
        "kind": "TerraformMachinePoolTemplate", "metadata": {"name": "pool"},
        "spec": {"template": {"spec": {"module": {"source": "git::https://example.com/p.git?ref=v1"}}}}
    }))
    .expect("tfmpt");
    pool_templates
        .create(&PostParams::default(), &tfmpt)
        .await
        .expect("create tfmpt");
    let change = json!({"spec": {"template": {"spec": {"runner": {"image": "hashicorp/terraform:1.12.0"}}}}});
    let message = refusal(
        pool_templates
            .patch("pool", &PatchParams::default(), &Patch::Merge(&change))
            .await
            .expect_err("refused"),
    );
    assert!(
        message.contains("TerraformMachinePoolTemplate team-a/pool"),
        "{message}"
    );

    // A machine: created; its providerID set once by the manager's JSON patch (with the
    // annotation it writes beside it and the resourceVersion test it guards with).
    let machines: Api<TerraformMachine> = Api::namespaced(client.clone(), ns);
    let created = machines
        .create(&PostParams::default(), &machine("web-1"))
        .await
        .expect("creating a machine is allowed");
    let rv = created.resource_version().expect("resourceVersion");
    let set_once: json_patch::Patch = serde_json::from_value(json!([
        {"op": "test", "path": "/metadata/resourceVersion", "value": rv},
        {"op": "add", "path": "/metadata/annotations", "value": {
            "terraform.infrastructure.cluster.x-k8s.io/applied-attempt": "1"}},
        {"op": "add", "path": "/spec/providerID", "value": "aws:///eu-west-1a/i-0abc"}
    ]))
    .expect("patch");
    machines
        .patch(
            "web-1",
            &PatchParams::default(),
            &Patch::<()>::Json(set_once),
        )
        .await
        .expect("the manager sets providerID once");
    let same = json!({"spec": {"providerID": "aws:///eu-west-1a/i-0abc"}});
    machines
        .patch("web-1", &PatchParams::default(), &Patch::Merge(&same))
        .await
        .expect("the same providerID again changes nothing");
    let message = refusal(
        machines
            .patch(
                "web-1",
                &PatchParams::default(),
                &Patch::Merge(&json!({"spec": {"providerID": "aws:///eu-west-1a/i-0def"}})),
            )
            .await
            .expect_err("a set providerID never changes"),
    );
    assert!(message.contains("spec.providerID"), "{message}");
    let message = refusal(
        machines
            .patch(
                "web-1",
                &PatchParams::default(),
                &Patch::Merge(&json!({"spec": {
                    "variables": {"size": "large"},
                    "module": {"source": "git::https://example.com/infra.git//vm?ref=v2"}
                }})),
            )
            .await
            .expect_err("the spec cannot change"),
    );
    for says in [
        "TerraformMachine team-a/web-1: spec.module, spec.variables cannot change after creation",
        "new TerraformMachineTemplate",
        "delete the Machine",
    ] {
        assert!(message.contains(says), "{says:?} in {message}");
    }
    eprintln!("the refusal, as a user sees it: {message}");
    // Metadata, status and a deletion go through (the finalizer holds the object until
    // it is removed, which is an update too).
    let finalizer = json!({"metadata": {
        "finalizers": ["terraformmachine.infrastructure.cluster.x-k8s.io"],
        "labels": {"cluster.x-k8s.io/cluster-name": "prod"}}});
    machines
        .patch("web-1", &PatchParams::default(), &Patch::Merge(&finalizer))
        .await
        .expect("metadata may change");
    let status = json!({"status": {"initialization": {"provisioned": true}}});
    machines
        .patch_status("web-1", &PatchParams::default(), &Patch::Merge(&status))
        .await
        .expect("the status may change");
    machines
        .delete("web-1", &DeleteParams::default())
        .await
        .expect("a deletion is allowed");
    machines
        .patch(
            "web-1",
            &PatchParams::default(),
            &Patch::Merge(&json!({"metadata": {"finalizers": null}})),
        )
        .await
        .expect("the finalizer comes off");
    wait_for("the machine to go", WAIT, || async {
        machines.get_opt("web-1").await.expect("get").is_none()
    })
    .await;
}

/// The Cluster API CRDs of the kubeadm bootstrap and control plane providers (bases from
/// the pinned module, with the contract labels their kustomization adds; no webhooks or
/// controllers: the objects are only stored), which the templates name.
async fn install_kubeadm_crds(client: &Client) {
    let out = Command::new("go")
        .args([
            "list",
            "-mod=readonly",
            "-m",
            "-f",
            "{{.Dir}}",
            "sigs.k8s.io/cluster-api",
        ])
        .current_dir(format!("{ROOT}/tests/capi"))
        .output()
        .expect("go list");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let capi = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    for file in [
        "bootstrap/kubeadm/config/crd/bases/bootstrap.cluster.x-k8s.io_kubeadmconfigs.yaml",
        "bootstrap/kubeadm/config/crd/bases/bootstrap.cluster.x-k8s.io_kubeadmconfigtemplates.yaml",
        "controlplane/kubeadm/config/crd/bases/controlplane.cluster.x-k8s.io_kubeadmcontrolplanes.yaml",
        "controlplane/kubeadm/config/crd/bases/controlplane.cluster.x-k8s.io_kubeadmcontrolplanetemplates.yaml",
    ] {
        let text = std::fs::read_to_string(capi.join(file)).expect(file);
        let mut crd: CustomResourceDefinition = serde_saphyr::from_str(&text).expect(file);
        let labels = crd.metadata.labels.get_or_insert_default();
        labels.insert("cluster.x-k8s.io/v1beta1".into(), "v1beta1".into());
        labels.insert("cluster.x-k8s.io/v1beta2".into(), "v1beta2".into());
        crds.create(&PostParams::default(), &crd)
            .await
            .unwrap_or_else(|e| panic!("{file}: {e}"));
    }
    for plural in [
        "kubeadmconfigs.bootstrap.cluster.x-k8s.io",
        "kubeadmconfigtemplates.bootstrap.cluster.x-k8s.io",
        "kubeadmcontrolplanes.controlplane.cluster.x-k8s.io",
        "kubeadmcontrolplanetemplates.controlplane.cluster.x-k8s.io",
    ] {
        wait_for(&format!("{plural} established"), WAIT, || async {
            crds.get(plural).await.is_ok_and(|c| {
                c.status.and_then(|s| s.conditions).is_some_and(|c| {
                    c.iter()
                        .any(|c| c.type_ == "Established" && c.status == "True")
                })
            })
        })
        .await;
    }
}

fn condition(o: &DynamicObject, type_: &str) -> Option<(String, String)> {
    o.data["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == type_)
        .map(|c| {
            (
                c["status"].as_str().unwrap_or_default().to_string(),
                c["message"].as_str().unwrap_or_default().to_string(),
            )
        })
}

/// The real Cluster API accepts every cluster template and the ClusterClass (its
/// webhooks, its ClusterClass reconciler), and its topology controller makes a Cluster
/// of the class with the Cluster's variables patched into CAPTF's templates; a changed
/// variable is patched into the TerraformCluster in place and rotates the machine
/// template, through the admission policies (the topology dry-run passes them).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_api_accepts_the_templates_and_patches_a_clusters_variables_into_them() {
    if envtest_only("it starts a control plane of its own with Cluster API") {
        return;
    }
    let plane = ControlPlane::dedicated_with_cluster_api("templates-capi");
    let client = plane.client().await;
    install_kubeadm_crds(&client).await;
    create_namespace(&client, "policy-probe").await;
    install_policies(&plane, &client, "policy-probe").await;

    let dir = temp_dir("templates-capi");
    let home = dir.join("home");
    std::fs::create_dir_all(&home).expect("home");
    let assets = dir.join("assets");
    release_assets(&assets);

    // Each flavor, rendered by clusterctl into a namespace of its own and applied
    // server-side: the API server, Cluster API's webhooks and the CRDs' schemas accept
    // every object.
    for (flavor, file) in [
        ("default", "cluster-template.yaml"),
        ("machinepool", "cluster-template-machinepool.yaml"),
        ("offline", "cluster-template-offline.yaml"),
        ("topology", "cluster-template-topology.yaml"),
    ] {
        let ns = format!("flavor-{flavor}");
        create_namespace(&client, &ns).await;
        let mut objects = generate_cluster(&home, &assets.join(file), &ns);
        if flavor == "topology" {
            // The ClusterClass, in the namespace as clusterctl puts it there.
            let text =
                std::fs::read_to_string(assets.join("clusterclass-terraform.yaml")).expect("read");
            let mut class = yaml_docs(&text);
            for o in &mut class {
                o["metadata"]["namespace"] = json!(ns);
            }
            class.extend(objects);
            objects = class;
        }
        let rendered = dir.join(format!("{flavor}.json"));
        let list = json!({"apiVersion": "v1", "kind": "List", "items": objects});
        std::fs::write(&rendered, list.to_string()).expect("write");
        let out = kubectl(
            plane.kubeconfig(),
            &[
                "apply",
                "--server-side",
                "-f",
                rendered.to_str().expect("path"),
            ],
        );
        assert!(
            out.status.success(),
            "{file}, applied: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }

    // The ClusterClass: its reconciler found every template and took its variables.
    let ns = "flavor-topology";
    let classes: Api<DynamicObject> = Api::namespaced_with(
        client.clone(),
        ns,
        &api_resource("cluster.x-k8s.io/v1beta2", "ClusterClass", "clusterclasses"),
    );
    wait_for(
        "the ClusterClass's variables to be reconciled",
        WAIT,
        || async {
            classes
                .get("terraform")
                .await
                .is_ok_and(|c| condition(&c, "VariablesReady").is_some_and(|(s, _)| s == "True"))
        },
    )
    .await;

    // The topology controller made the TerraformCluster and the control plane's machine
    // template from the class, with the Cluster's variables in their specs.
    let tfcs: Api<DynamicObject> = Api::namespaced_with(
        client.clone(),
        ns,
        &ApiResource::erase::<captf::api::TerraformCluster>(&()),
    );
    let tfmts: Api<TerraformMachineTemplate> = Api::namespaced(client.clone(), ns);
    let clusters: Api<DynamicObject> = Api::namespaced_with(
        client.clone(),
        ns,
        &api_resource("cluster.x-k8s.io/v1beta2", "Cluster", "clusters"),
    );
    let cluster_infra = || async {
        let cluster = clusters.get("prod").await.ok()?;
        let name = cluster.data["spec"]["infrastructureRef"]["name"]
            .as_str()?
            .to_string();
        tfcs.get(&name).await.ok()
    };
    wait_for("the topology's TerraformCluster", WAIT, || async {
        cluster_infra().await.is_some()
    })
    .await;
    let tfc = cluster_infra().await.expect("TerraformCluster");
    assert_eq!(tfc.data["spec"]["module"]["source"], TEMPLATE_ENV[0].1);
    assert_eq!(
        tfc.data["spec"]["runner"]["image"],
        captf::api::DEFAULT_RUNNER_IMAGE
    );
    let machine_templates = || async {
        tfmts
            .list(&ListParams::default().labels("cluster.x-k8s.io/cluster-name=prod"))
            .await
            .map(|l| l.items)
            .unwrap_or_default()
    };
    wait_for(
        "the control plane's TerraformMachineTemplate",
        WAIT,
        || async { !machine_templates().await.is_empty() },
    )
    .await;
    let before = machine_templates().await;
    assert!(
        before
            .iter()
            .all(|t| t.spec.template.spec.module.source.as_deref() == Some(TEMPLATE_ENV[1].1)),
        "{before:?}"
    );

    // A change of the Cluster's variables: the TerraformCluster is patched in place (the
    // same object, its spec.variables changed) and the machine template is rotated (a
    // new one, through the template policy: the dry-run the topology controller checks
    // the change with passes it).
    let cluster = clusters.get("prod").await.expect("Cluster");
    let mut variables = cluster.data["spec"]["topology"]["variables"]
        .as_array()
        .cloned()
        .expect("variables");
    // (Cluster API's defaulting webhook wrote the class's defaults, `{}`, for both.)
    for (name, value) in [
        ("clusterVariables", json!({"region": "eu-west-1"})),
        ("machineVariables", json!({"size": "large"})),
    ] {
        variables.retain(|v| v["name"] != name);
        variables.push(json!({"name": name, "value": value}));
    }
    let patch = json!({"spec": {"topology": {"variables": variables}}});
    clusters
        .patch("prod", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .expect("change the Cluster's variables");
    wait_for("the TerraformCluster patched in place", WAIT, || async {
        cluster_infra().await.is_some_and(|t| {
            t.uid() == tfc.uid() && t.data["spec"]["variables"]["region"] == "eu-west-1"
        })
    })
    .await;
    let old_names: Vec<String> = before.iter().map(|t| t.name_any()).collect();
    wait_for("a rotated TerraformMachineTemplate", WAIT, || async {
        machine_templates().await.iter().any(|t| {
            !old_names.contains(&t.name_any())
                && t.spec
                    .template
                    .spec
                    .variables
                    .as_ref()
                    .is_some_and(|v| v.get("size").is_some_and(|s| s == "large"))
        })
    })
    .await;
    let cluster = clusters.get("prod").await.expect("Cluster");
    let reconciled = condition(&cluster, "TopologyReconciled");
    assert!(
        reconciled
            .as_ref()
            .is_none_or(|(_, m)| !m.contains("denied")),
        "{reconciled:?}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// The cert-manager clusterctl checks for: its two kinds, without schema, no controller
/// (clusterctl only creates and deletes a test Issuer and Certificate).
fn fake_cert_manager() -> String {
    let crd = |plural: &str, kind: &str| {
        json!({
            "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
            "metadata": {"name": format!("{plural}.cert-manager.io")},
            "spec": {"group": "cert-manager.io", "scope": "Namespaced",
                "names": {"plural": plural, "kind": kind, "singular": kind.to_lowercase()},
                "versions": [{"name": "v1", "served": true, "storage": true,
                    "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}}]}
        })
        .to_string()
    };
    format!(
        "{}\n---\n{}\n",
        crd("issuers", "Issuer"),
        crd("certificates", "Certificate")
    )
}

/// clusterctl's inventory (its `Provider` objects) in the namespace `ns`.
pub(crate) fn clusterctl_inventory(client: &Client, ns: &str) -> Api<DynamicObject> {
    Api::namespaced_with(
        client.clone(),
        ns,
        &api_resource(
            "clusterctl.cluster.x-k8s.io/v1alpha3",
            "Provider",
            "providers",
        ),
    )
}

/// A local clusterctl repository in `dir` and its `clusterctl.yaml`, whose path it
/// returns: CAPTF's assets (`captf release-assets`), Cluster API's core (its components
/// and metadata, which clusterctl reads), and the cert-manager clusterctl checks for
/// (waited for up to 5 minutes: under the whole suite's load its CRDs took longer than
/// clusterctl's 60 s once, "Waiting for cert-manager to be available... Error: context
/// deadline exceeded"); `variables` (YAML lines) are added to the configuration.
pub(crate) fn local_repository(dir: &Path, variables: &str) -> PathBuf {
    let repo = dir.join("repo");
    let captf_dir = repo.join("infrastructure-terraform").join(VERSION);
    release_assets(&captf_dir);
    let core = repo.join("cluster-api").join("v1.14.2");
    std::fs::create_dir_all(&core).expect("core dir");
    let capi_files = cluster::binaries().join("capi");
    for file in ["core-components.yaml", "metadata.yaml"] {
        std::fs::copy(capi_files.join(file), core.join(file)).expect(file);
    }
    let cert_manager = repo.join("cert-manager").join("v1.21.1");
    std::fs::create_dir_all(&cert_manager).expect("cert-manager dir");
    std::fs::write(cert_manager.join("cert-manager.yaml"), fake_cert_manager())
        .expect("cert-manager");
    let config = dir.join("clusterctl.yaml");
    std::fs::write(
        &config,
        format!(
            "providers:\n\
             - name: cluster-api\n  type: CoreProvider\n  url: file://{}\n\
             - name: terraform\n  type: InfrastructureProvider\n  url: file://{}\n\
             cert-manager:\n  url: file://{}\n  version: v1.21.1\n  timeout: 5m\n\
             {variables}",
            core.join("core-components.yaml").display(),
            captf_dir.join("infrastructure-components.yaml").display(),
            cert_manager.join("cert-manager.yaml").display(),
        ),
    )
    .expect("clusterctl.yaml");
    config
}

/// `clusterctl init --infrastructure terraform:v0.1.0` from a local repository that
/// `captf release-assets` wrote (beside Cluster API's core from its module): clusterctl
/// accepts the components, records the provider, and installs the manager with the
/// image; and `clusterctl generate cluster` reads the templates from that repository,
/// the ClusterClass with the topology flavor. The manager's Pod does not run here (no
/// image); nothing below depends on it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clusterctl_init_installs_captf_from_a_local_repository() {
    if envtest_only("it installs Cluster API with clusterctl on a control plane of its own") {
        return;
    }
    let plane = ControlPlane::dedicated_without_capi("templates-init");
    let client = plane.client().await;
    let dir = temp_dir("clusterctl-init");
    let home = dir.join("home");
    let config = local_repository(&dir, "CAPTF_CONCURRENCY: \"7\"\n");
    let kubeconfig = plane.kubeconfig().to_str().expect("path").to_string();
    let config = config.to_str().expect("path").to_string();
    let out = clusterctl(
        &home,
        &[
            "init",
            "--kubeconfig",
            &kubeconfig,
            "--config",
            &config,
            "--core",
            "cluster-api:v1.14.2",
            "--bootstrap",
            "-",
            "--control-plane",
            "-",
            "--infrastructure",
            &format!("terraform:{VERSION}"),
        ],
        &[],
    );
    assert!(
        out.status.success(),
        "clusterctl init: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );

    // The inventory records CAPTF.
    let providers = clusterctl_inventory(&client, "captf-system");
    let provider = providers
        .get("infrastructure-terraform")
        .await
        .expect("Provider infrastructure-terraform");
    assert_eq!(provider.data["version"], VERSION);
    assert_eq!(provider.data["type"], "InfrastructureProvider");
    // The manager, with the image and the variable set in clusterctl.yaml; scaled to
    // nothing (its image does not run here).
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), "captf-system");
    let manager = deployments.get("captf-manager").await.expect("Deployment");
    let container = &manager
        .spec
        .as_ref()
        .expect("spec")
        .template
        .spec
        .as_ref()
        .expect("pod")
        .containers[0];
    assert_eq!(container.name, "manager");
    assert_eq!(container.image.as_deref(), Some(IMAGE));
    let args = container.args.clone().unwrap_or_default();
    assert!(args.contains(&"--concurrency=7".to_string()), "{args:?}");
    assert!(
        args.contains(&"--max-state-reads=4".to_string()),
        "{args:?}"
    );
    for name in [
        "captf-system/captf-manager",
        "capi-system/capi-controller-manager",
    ] {
        let (ns, name) = name.split_once('/').expect("name");
        let _ = Api::<Deployment>::namespaced(client.clone(), ns)
            .patch(
                name,
                &PatchParams::default(),
                &Patch::Merge(&json!({"spec": {"replicas": 0}})),
            )
            .await;
    }
    // The CRDs, labelled by clusterctl, and the admission policies, cluster-scoped.
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    for kind in captf::api::Kind::ALL {
        let crd = crds.get(&kind.crd_name()).await.expect("CRD");
        assert_eq!(
            crd.labels()
                .get("cluster.x-k8s.io/provider")
                .map(String::as_str),
            Some("infrastructure-terraform")
        );
    }
    for kind in captf::api::TemplateKind::ALL {
        crds.get(&kind.crd_name()).await.expect("template CRD");
    }
    let policies: Api<DynamicObject> = Api::all_with(
        client.clone(),
        &api_resource(
            "admissionregistration.k8s.io/v1",
            "ValidatingAdmissionPolicy",
            "validatingadmissionpolicies",
        ),
    );
    for name in [
        "captf-template-spec-immutable",
        "captf-machine-spec-immutable",
    ] {
        let p = policies.get(name).await.expect("policy");
        assert!(p.metadata.namespace.is_none(), "{name} is cluster-scoped");
    }

    // `clusterctl generate cluster` reads the templates from the repository: the offline
    // flavor, and the topology flavor with the ClusterClass (the namespace has none),
    // whose kubeadm templates clusterctl looks up in the cluster: their CRDs stand for the
    // kubeadm providers a user installs beside (`clusterctl init`'s default).
    install_kubeadm_crds(&client).await;
    for (flavor, has_class) in [("offline", false), ("topology", true)] {
        let out = clusterctl(
            &home,
            &[
                "generate",
                "cluster",
                "prod",
                "--kubeconfig",
                &kubeconfig,
                "--config",
                &config,
                "--infrastructure",
                &format!("terraform:{VERSION}"),
                "--flavor",
                flavor,
                "--target-namespace",
                "team-a",
                "--kubernetes-version",
                "v1.33.0",
                "--control-plane-machine-count",
                "1",
                "--worker-machine-count",
                "2",
            ],
            &TEMPLATE_ENV,
        );
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "clusterctl generate cluster --flavor {flavor}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let objects = yaml_docs(&stdout);
        assert_eq!(
            objects.iter().any(|o| o["kind"] == "ClusterClass"),
            has_class,
            "{flavor}: {stdout}"
        );
        assert!(
            objects
                .iter()
                .any(|o| o["kind"] == "TerraformMachineTemplate")
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// Kills a process this test started however the test ends.
struct Killed(std::process::Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The offline template tried as a user tries it: rendered by clusterctl, applied to a
/// management cluster running the real Cluster API, `captf manager` (a process, as
/// installed) and the admission policies. CAPTF applies the cluster's and every
/// machine's `terraform_data` module, its providerIDs pass the machine policy and reach
/// the Machines; deleting the Cluster destroys and releases everything.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_offline_template_is_provisioned_and_torn_down_on_any_cluster() {
    if envtest_only("it starts a control plane of its own with Cluster API") {
        return;
    }
    let plane = ControlPlane::dedicated_with_cluster_api("templates-offline");
    let client = plane.client().await;
    create_namespace(&client, "policy-probe").await;
    install_policies(&plane, &client, "policy-probe").await;
    let dir = temp_dir("templates-offline");
    let log = std::fs::File::create(dir.join("manager.log")).expect("log");
    let _manager = Command::new(env!("CARGO_BIN_EXE_captf"))
        .args([
            "manager",
            "--metrics-bind-address=",
            "--health-probe-bind-address=",
            "--manager-namespace",
            "default",
        ])
        .env("KUBECONFIG", plane.kubeconfig())
        .stdout(log.try_clone().expect("log"))
        .stderr(log)
        .spawn()
        .map(Killed)
        .expect("start captf manager");

    let ns = "team-a";
    create_namespace(&client, ns).await;
    let home = dir.join("home");
    std::fs::create_dir_all(&home).expect("home");
    let assets = dir.join("assets");
    release_assets(&assets);
    let objects = generate_cluster(&home, &assets.join("cluster-template-offline.yaml"), ns);
    let rendered = dir.join("offline.json");
    let list = json!({"apiVersion": "v1", "kind": "List", "items": objects});
    std::fs::write(&rendered, list.to_string()).expect("write");
    let out = kubectl(
        plane.kubeconfig(),
        &["apply", "-f", rendered.to_str().expect("path")],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    let tfcs: Api<captf::api::TerraformCluster> = Api::namespaced(client.clone(), ns);
    let tfms: Api<TerraformMachine> = Api::namespaced(client.clone(), ns);
    let machines: Api<DynamicObject> = Api::namespaced_with(
        client.clone(),
        ns,
        &api_resource("cluster.x-k8s.io/v1beta2", "Machine", "machines"),
    );
    let provisioned = |s: Option<&captf::api::TerraformStatus>| {
        s.and_then(|s| s.initialization.as_ref())
            .and_then(|i| i.provisioned)
            == Some(true)
    };
    wait_for("the TerraformCluster applied", WAIT, || async {
        tfcs.get("prod")
            .await
            .is_ok_and(|t| provisioned(t.status.as_ref()))
    })
    .await;
    let tfc = tfcs.get("prod").await.expect("TerraformCluster");
    assert_eq!(
        tfc.spec
            .control_plane_endpoint
            .as_ref()
            .map(|e| e.host.as_str()),
        Some("prod.captf.invalid"),
        "the module's endpoint"
    );
    wait_for(
        "two Machines with the providerIDs CAPTF set",
        WAIT,
        || async {
            let Ok(list) = machines.list(&ListParams::default()).await else {
                return false;
            };
            list.items.len() == 2
                && list.items.iter().all(|m| {
                    m.data["spec"]["providerID"]
                        .as_str()
                        .is_some_and(|p| p.starts_with("captf-offline:///team-a/"))
                })
        },
    )
    .await;
    for m in tfms.list(&ListParams::default()).await.expect("list").items {
        assert!(provisioned(m.status.as_ref()), "{}", m.name_any());
    }

    let clusters: Api<DynamicObject> = Api::namespaced_with(
        client.clone(),
        ns,
        &api_resource("cluster.x-k8s.io/v1beta2", "Cluster", "clusters"),
    );
    clusters
        .delete("prod", &DeleteParams::background())
        .await
        .expect("delete the Cluster");
    wait_for("the Cluster and its infrastructure gone", WAIT, || async {
        clusters.get_opt("prod").await.is_ok_and(|c| c.is_none())
            && tfcs
                .list(&ListParams::default())
                .await
                .is_ok_and(|l| l.items.is_empty())
            && tfms
                .list(&ListParams::default())
                .await
                .is_ok_and(|l| l.items.is_empty())
    })
    .await;
    let states = Api::<k8s_openapi::api::core::v1::Secret>::namespaced(client.clone(), ns)
        .list(&ListParams::default().labels("tfstate=true"))
        .await
        .expect("list Secrets");
    assert!(
        states.items.is_empty(),
        "every state destroyed and cleaned up"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// A Cluster of the shipped ClusterClass `terraform`, with the manager running: the
/// topology controller makes its TerraformCluster from the class with the Cluster's
/// variables, CAPTF applies it; a changed variable is patched into it in place and CAPTF
/// applies it again (once, nothing replaced by this module); deleting the Cluster
/// destroys it. (The kubeadm control plane's kinds are installed without their
/// controllers: no control-plane machine is made, which is not CAPTF's part.)
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_cluster_of_the_cluster_class_is_applied_reapplied_on_a_variable_change_and_destroyed() {
    if envtest_only("it reads the files Terraform leaves on this machine") {
        return;
    }
    let mut env = Env::builder("clusterclass").kubelet_args(&[]).start().await;
    env.config.provision = true;
    env.start_manager();
    install_kubeadm_crds(&env.client).await;
    // The cluster's module, given by source (the class takes module sources): two
    // terraform_data instances and the contract's outputs, with an input `size`.
    let module = env.dir.join("cluster-module");
    std::fs::create_dir_all(&module).expect("module dir");
    std::fs::write(
        module.join("main.tf"),
        apply_module(0)
            + contract_outputs(captf::api::names::Kind::TerraformCluster)
            + "variable \"size\" { type = string }\n",
    )
    .expect("main.tf");
    let module = module.display().to_string();

    // The ClusterClass and its templates, as shipped, in the test's namespace.
    let text = std::fs::read_to_string(format!("{ROOT}/release/clusterclass-terraform.yaml"))
        .expect("read");
    let mut objects = yaml_docs(&text);
    for o in &mut objects {
        o["metadata"]["namespace"] = json!(env.ns);
    }
    let cluster_variables = |size: &str| json!({"name": "prod", "marker_dir": env.markers().display().to_string(), "size": size});
    objects.push(json!({
        "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Cluster",
        "metadata": {"name": "prod", "namespace": env.ns},
        "spec": {"topology": {
            "classRef": {"name": "terraform"},
            "version": "v1.37.2",
            "controlPlane": {"replicas": 1},
            "variables": [
                {"name": "clusterModule", "value": module},
                {"name": "machineModule", "value": module},
                {"name": "clusterVariables", "value": cluster_variables("small")}
            ]
        }}
    }));
    let rendered = env.dir.join("clusterclass.json");
    let list = json!({"apiVersion": "v1", "kind": "List", "items": objects});
    std::fs::write(&rendered, list.to_string()).expect("write");
    let out = kubectl(
        env.kubeconfig_path(),
        &[
            "apply",
            "--server-side",
            "-f",
            rendered.to_str().expect("path"),
        ],
    );
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );

    // The topology's TerraformCluster, applied by the manager.
    let infra = wait_for_value("the topology's TerraformCluster", long(), || async {
        let c = env.cluster_api().get("prod").await.ok()?;
        c.data["spec"]["infrastructureRef"]["name"]
            .as_str()
            .map(str::to_string)
    })
    .await;
    env.wait_provisioned::<captf::api::TerraformCluster>(&infra)
        .await;
    assert_eq!(env.jobs_created(), 1, "one apply");
    let uid = env
        .object::<captf::api::TerraformCluster>(&infra)
        .await
        .expect("TerraformCluster")
        .uid();

    // A variable changes: the same TerraformCluster, patched, applied again once.
    let cluster = env.cluster_api().get("prod").await.expect("Cluster");
    let mut variables = cluster.data["spec"]["topology"]["variables"]
        .as_array()
        .cloned()
        .expect("variables");
    variables.retain(|v| v["name"] != "clusterVariables");
    variables.push(json!({"name": "clusterVariables", "value": cluster_variables("large")}));
    env.cluster_api()
        .patch(
            "prod",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"topology": {"variables": variables}}})),
        )
        .await
        .expect("change the Cluster's variables");
    wait_for("the re-apply of the changed variables", long(), || async {
        env.object::<captf::api::TerraformCluster>(&infra)
            .await
            .is_some_and(|t| {
                t.uid() == uid
                    && t.spec
                        .terraform
                        .variables
                        .as_ref()
                        .is_some_and(|v| v.get("size").is_some_and(|s| s == "large"))
                    && t.metadata
                        .annotations
                        .as_ref()
                        .and_then(|a| a.get(captf::api::names::APPLIED_ATTEMPT))
                        .is_some_and(|n| n == "2")
            })
    })
    .await;
    assert_eq!(env.jobs_created(), 2, "one re-apply");
    assert!(
        !env.destroyed("prod"),
        "the re-apply replaced the cluster's instances"
    );

    // The Cluster goes, and its infrastructure is destroyed.
    env.delete_cluster("prod").await;
    wait_for(
        "the Cluster and its TerraformCluster gone",
        long(),
        || async {
            env.cluster_api()
                .get_opt("prod")
                .await
                .is_ok_and(|c| c.is_none())
                && !env.exists::<captf::api::TerraformCluster>(&infra).await
        },
    )
    .await;
    assert!(
        env.destroyed("prod"),
        "the cluster's instances were not destroyed"
    );
    env.assert_nothing_left(captf::api::names::Kind::TerraformCluster, &infra)
        .await;
    env.shutdown().await;
}
