//! The install manifests under config/ build with kustomize (`kubectl kustomize`, offline),
//! and carry the CRDs `captf crds` prints.

use std::process::Command;

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

#[test]
fn kustomize_builds_the_install_manifests() {
    // kubectl is required: a missing kubectl fails this test, it does not skip it.
    let kubectl = std::env::var("KUBECTL").unwrap_or_else(|_| "kubectl".to_string());
    let out = Command::new(&kubectl)
        .args(["kustomize", "config/default"])
        .current_dir(ROOT)
        .output()
        .unwrap_or_else(|e| {
            panic!("cannot run `{kubectl} kustomize config/default` ({e}): this test needs kubectl on PATH (or KUBECTL set to it)")
        });
    assert!(
        out.status.success(),
        "`kubectl kustomize config/default` failed ({}):\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let built = String::from_utf8(out.stdout).expect("kustomize output is UTF-8");

    // The seven CRDs.
    for name in [
        "terraformclusters.infrastructure.cluster.x-k8s.io",
        "terraformmachines.infrastructure.cluster.x-k8s.io",
        "terraformmachinepools.infrastructure.cluster.x-k8s.io",
        "terraformclustertemplates.infrastructure.cluster.x-k8s.io",
        "terraformmachinetemplates.infrastructure.cluster.x-k8s.io",
        "terraformmachinepooltemplates.infrastructure.cluster.x-k8s.io",
        "terraformclusteridentities.infrastructure.cluster.x-k8s.io",
    ] {
        assert!(
            built.contains(&format!("  name: {name}\n")),
            "CRD {name} missing from the install manifests"
        );
    }
    assert_eq!(
        built.matches("\nkind: CustomResourceDefinition\n").count(),
        7,
        "seven CRDs"
    );

    // The manager Deployment, its probes and its arguments.
    let deployment = document(&built, "Deployment", "captf-manager");
    for needle in [
        "namespace: captf-system\n",
        "- manager\n",
        "- --leader-elect\n",
        "- --metrics-bind-address=0.0.0.0:8443\n",
        "containerPort: 8443\n",
        "- --health-probe-bind-address=0.0.0.0:8081\n",
        "livenessProbe:\n",
        "path: /healthz\n",
        "readinessProbe:\n",
        "path: /readyz\n",
        "port: healthz\n",
        "containerPort: 8081\n",
        "serviceAccountName: captf-manager\n",
        "readOnlyRootFilesystem: true\n",
        "runAsNonRoot: true\n",
    ] {
        assert!(
            deployment.contains(needle),
            "the Deployment lacks {needle:?}:\n{deployment}"
        );
    }

    // The manager's ClusterRole and its binding; the CAPI aggregation role.
    let role = document(&built, "ClusterRole", "captf-manager");
    for needle in [
        "- terraformclusters\n",
        "- terraformclusters/status\n",
        "- machines\n",
        "- machinepools\n",
        "- pods/log\n",
        "- secrets\n",
        "- leases\n",
        "- roles\n",
        "- rolebindings\n",
    ] {
        assert!(
            role.contains(needle),
            "the ClusterRole lacks {needle:?}:\n{role}"
        );
    }
    assert!(
        !role.contains("- escalate\n") && !role.contains("- bind\n") && !role.contains("- '*'\n"),
        "the ClusterRole must stay least-privilege:\n{role}"
    );
    document(&built, "ClusterRoleBinding", "captf-manager");
    let aggregate = document(&built, "ClusterRole", "captf-capi-aggregate");
    assert!(
        aggregate.contains("cluster.x-k8s.io/aggregate-to-manager: \"true\"\n"),
        "aggregation label:\n{aggregate}"
    );
    // A MachineSet and the topology controller create infrastructure objects and
    // templates.
    for needle in [
        "- create\n",
        "- terraformclustertemplates\n",
        "- terraformmachinetemplates\n",
        "- terraformmachinepooltemplates\n",
    ] {
        assert!(
            aggregate.contains(needle),
            "the aggregated role lacks {needle:?}:\n{aggregate}"
        );
    }

    // The admission policies and their bindings, cluster-scoped.
    for name in [
        "captf-template-spec-immutable",
        "captf-machine-spec-immutable",
    ] {
        for kind in [
            "ValidatingAdmissionPolicy",
            "ValidatingAdmissionPolicyBinding",
        ] {
            let doc = document(&built, kind, name);
            assert!(!doc.contains("  namespace: "), "{kind} {name}:\n{doc}");
        }
    }

    // Every object carries the provider label.
    let objects = built.matches("\nkind: ").count() + usize::from(built.starts_with("kind: "));
    assert_eq!(
        built
            .matches("cluster.x-k8s.io/provider: infrastructure-terraform\n")
            .count(),
        objects + 1, // + the Deployment's Pod template
        "the provider label on every object"
    );

    // The CRDs kustomize reads are the committed output of `captf crds`.
    let read = |p: &str| {
        std::fs::read(format!("{ROOT}/{p}")).unwrap_or_else(|e| panic!("cannot read {p}: {e}"))
    };
    assert!(
        read("config/crd/bases/captf-crds.yaml") == read("crds/captf-crds.yaml"),
        "config/crd/bases/captf-crds.yaml differs from crds/captf-crds.yaml; regenerate both with \
         `cargo run -q -- crds > crds/captf-crds.yaml && cp crds/captf-crds.yaml config/crd/bases/captf-crds.yaml`"
    );
}

/// The one YAML document of `kind` named `name` in a `---`-separated stream.
fn document<'a>(stream: &'a str, kind: &str, name: &str) -> &'a str {
    let found: Vec<&str> = stream
        .split("\n---\n")
        .filter(|d| {
            d.lines().any(|l| l == format!("kind: {kind}"))
                && d.split("\nmetadata:\n").nth(1).is_some_and(|m| {
                    m.lines()
                        .take_while(|l| l.starts_with(' ') || l.is_empty())
                        .any(|l| l == format!("  name: {name}"))
                })
        })
        .collect();
    assert_eq!(
        found.len(),
        1,
        "expected one {kind} {name} in the install manifests, found {}",
        found.len()
    );
    found[0]
}

/// The API priority and fairness example of config/apf is accepted by kube-apiserver (a
/// server-side dry run: the objects are validated, nothing is stored).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_flowschema_example_is_accepted_by_the_api_server() {
    let env = crate::support::Env::builder("apf").start().await;
    let kubectl = std::env::var("KUBECTL").unwrap_or_else(|_| "kubectl".to_string());
    let out = Command::new(&kubectl)
        .args([
            "apply",
            "--dry-run=server",
            "-f",
            "config/apf/captf-flowschema.yaml",
        ])
        .env("KUBECONFIG", env.kubeconfig_path())
        .current_dir(ROOT)
        .output()
        .unwrap_or_else(|e| panic!("cannot run `{kubectl}` ({e})"));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "the API server refused config/apf/captf-flowschema.yaml:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for object in [
        "prioritylevelconfiguration.flowcontrol.apiserver.k8s.io/captf",
        "flowschema.flowcontrol.apiserver.k8s.io/captf-manager",
        "flowschema.flowcontrol.apiserver.k8s.io/captf-runner",
    ] {
        assert!(stdout.contains(object), "{object} in {stdout}");
    }
    env.shutdown().await;
}

/// The monitoring manifests build with kustomize: the alert rules (config/prometheus) and
/// kube-state-metrics' configuration for the three kinds (config/metrics).
#[test]
fn kustomize_builds_the_monitoring_manifests() {
    let kubectl = std::env::var("KUBECTL").unwrap_or_else(|_| "kubectl".to_string());
    for (dir, kinds) in [
        (
            "config/prometheus",
            &["PrometheusRule", "ServiceMonitor"][..],
        ),
        ("config/metrics", &["ClusterRole", "ConfigMap"][..]),
    ] {
        let out = Command::new(&kubectl)
            .args(["kustomize", dir])
            .current_dir(ROOT)
            .output()
            .unwrap_or_else(|e| panic!("cannot run `{kubectl} kustomize {dir}` ({e})"));
        assert!(
            out.status.success(),
            "`kubectl kustomize {dir}` failed ({}):\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        let built = String::from_utf8_lossy(&out.stdout);
        for kind in kinds {
            assert!(
                built.contains(&format!("kind: {kind}\n")),
                "{dir}: {kind} in:\n{built}"
            );
        }
    }
}

/// The per-tenant RBAC of config/tenant, applied to the API server as a platform team
/// would, and the runner's RBAC of a namespace: a team's user may manage CAPTF objects in
/// its namespace only and read no Secret (the identities' Secrets in the manager's
/// namespace included); a runner may read its own namespace's Secrets (the state) and no
/// other namespace's (another team's, or the identities'). Each checked by the API
/// server's own authorizer (SubjectAccessReview).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_reaches_its_own_namespace_and_a_runner_no_other_teams_secrets() {
    use crate::support::{Env, apply_module};
    use k8s_openapi::api::authorization::v1::{
        ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
    };
    use kube::api::{Api, PostParams};

    let env = Env::builder("tenant").provisioning().start().await;
    let kubectl = std::env::var("KUBECTL").unwrap_or_else(|_| "kubectl".to_string());
    let built = Command::new(&kubectl)
        .args(["kustomize", "config/tenant/example"])
        .current_dir(ROOT)
        .output()
        .unwrap_or_else(|e| panic!("cannot run `{kubectl}` ({e})"));
    assert!(
        built.status.success(),
        "`kubectl kustomize config/tenant/example`: {}",
        String::from_utf8_lossy(&built.stderr)
    );
    let manifests = env.dir.join("tenant.yaml");
    std::fs::write(&manifests, &built.stdout).expect("write the manifests");
    let applied = Command::new(&kubectl)
        .args(["apply", "-f"])
        .arg(&manifests)
        .env("KUBECONFIG", env.kubeconfig_path())
        .output()
        .unwrap_or_else(|e| panic!("cannot run `{kubectl}` ({e})"));
    assert!(
        applied.status.success(),
        "the API server refused config/tenant/example: {}",
        String::from_utf8_lossy(&applied.stderr)
    );
    // A runner of the test's namespace: the manager makes its RBAC at the first attempt.
    env.provisioned_cluster(&apply_module(0), serde_json::json!({}))
        .await;

    let reviews: Api<SubjectAccessReview> = Api::all(env.client.clone());
    let allowed = |user: &str, groups: &[&str], verb: &str, resource: &str, ns: &str| {
        let review = SubjectAccessReview {
            spec: SubjectAccessReviewSpec {
                user: Some(user.to_string()),
                groups: Some(groups.iter().map(|g| g.to_string()).collect()),
                resource_attributes: Some(ResourceAttributes {
                    group: Some(
                        if resource == "secrets" {
                            ""
                        } else {
                            "infrastructure.cluster.x-k8s.io"
                        }
                        .to_string(),
                    ),
                    resource: Some(resource.to_string()),
                    verb: Some(verb.to_string()),
                    namespace: Some(ns.to_string()),
                    ..Default::default()
                }),
                ..Default::default()
            },
            ..Default::default()
        };
        let reviews = reviews.clone();
        async move {
            reviews
                .create(&PostParams::default(), &review)
                .await
                .expect("SubjectAccessReview")
                .status
                .is_some_and(|s| s.allowed)
        }
    };
    let team = ["team-a", "system:authenticated"];
    let ns = env.ns.as_str();
    let manager_ns = env.manager_ns.as_str();
    for (verb, resource, in_ns, expected) in [
        ("create", "terraformclusters", "team-a", true),
        ("delete", "terraformmachinetemplates", "team-a", true),
        ("create", "terraformclusters", ns, false),
        ("get", "secrets", "team-a", false),
        ("get", "secrets", manager_ns, false),
    ] {
        assert_eq!(
            allowed("alice", &team, verb, resource, in_ns).await,
            expected,
            "a user of group team-a: {verb} {resource} in {in_ns}"
        );
    }
    let runner = format!(
        "system:serviceaccount:{ns}:{}",
        captf::api::names::RUNNER_NAME
    );
    let runner_groups = [
        "system:serviceaccounts",
        &format!("system:serviceaccounts:{ns}"),
        "system:authenticated",
    ]
    .map(|g| g.to_string());
    let runner_groups: Vec<&str> = runner_groups.iter().map(String::as_str).collect();
    for (verb, in_ns, expected) in [
        ("list", ns, true),
        ("get", ns, true),
        ("get", "team-a", false),
        ("list", "team-a", false),
        ("get", manager_ns, false),
        ("list", manager_ns, false),
    ] {
        assert_eq!(
            allowed(&runner, &runner_groups, verb, "secrets", in_ns).await,
            expected,
            "the runner of {ns}: {verb} secrets in {in_ns}"
        );
    }
    let _ = Api::<captf::api::TerraformClusterIdentity>::all(env.client.clone())
        .delete("team-a", &Default::default())
        .await;
    env.shutdown().await;
}
