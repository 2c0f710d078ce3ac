//! Credentials a platform team keeps in the manager's namespace (`TerraformClusterIdentity`):
//! given to the runners of the namespaces an identity allows, machines through their
//! cluster's, recorded with the apply for its destroy, and refused with the reason where
//! they are not allowed.

use captf::api::TerraformClusterIdentity;
use captf::api::names::{self, Kind};
use k8s_openapi::api::core::v1::{Namespace, Secret};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::{Resource, ResourceExt};
use serde_json::{Value, json};

use crate::provisioning::{
    job_accounts, recorded_inputs, recording_machine_module, wait_condition,
};
use crate::support::*;

/// A cluster module that writes the runner's `CLOUD_TOKEN` into `<name>.apply-token` when
/// it creates its one instance, and into `<name>.destroy-token` when it destroys it.
pub(crate) fn token_module() -> String {
    r#"variable "name" { type = string }
variable "marker_dir" { type = string }
resource "terraform_data" "vm" {
  input = "${var.marker_dir}/${var.name}"
  provisioner "local-exec" {
    command = "printf '%s' \"$CLOUD_TOKEN\" > '${self.input}.apply-token'"
  }
  provisioner "local-exec" {
    when    = destroy
    command = "printf '%s' \"$CLOUD_TOKEN\" > '${self.input}.destroy-token'"
  }
}
"#
    .to_string()
}

/// Makes Secret `name` of `string_data` in the test's namespace.
async fn create_secret(env: &Env, name: &str, string_data: Value) {
    let secret: Secret = serde_json::from_value(json!({
        "metadata": {"name": name}, "stringData": string_data
    }))
    .expect("secret");
    env.secrets()
        .create(&PostParams::default(), &secret)
        .await
        .unwrap_or_else(|e| panic!("create {name}: {e}"));
}

/// The test's identity: cluster-scoped, so named after the test's namespace.
pub(crate) fn identity_name(env: &Env) -> String {
    format!("{}-team", env.ns)
}

/// Creates the identity's Secret in the manager's namespace with `token`, and the identity
/// allowing `allowed` (`spec.allowedNamespaces`).
pub(crate) async fn create_identity(env: &Env, token: &str, allowed: Value) {
    let secret: Secret = serde_json::from_value(json!({
        "metadata": {"name": "team-creds", "namespace": env.manager_ns},
        "stringData": {"CLOUD_TOKEN": token}
    }))
    .expect("secret");
    Api::<Secret>::namespaced(env.client.clone(), &env.manager_ns)
        .create(&PostParams::default(), &secret)
        .await
        .expect("create the identity's Secret");
    let identity: TerraformClusterIdentity = serde_json::from_value(json!({
        "apiVersion": names::API_VERSION, "kind": "TerraformClusterIdentity",
        "metadata": {"name": identity_name(env)},
        "spec": {"secretRef": "team-creds", "allowedNamespaces": allowed}
    }))
    .expect("identity");
    identities(env)
        .create(&PostParams::default(), &identity)
        .await
        .expect("create the identity");
}

pub(crate) fn identities(env: &Env) -> Api<TerraformClusterIdentity> {
    Api::all(env.client.clone())
}

pub(crate) fn identity_ref(env: &Env) -> Value {
    json!({"identityRef": {"kind": "TerraformClusterIdentity", "name": identity_name(env)}})
}

pub(crate) fn marker(env: &Env, file: &str) -> Option<String> {
    std::fs::read_to_string(env.markers().join(file)).ok()
}

/// An identity's Secret gives the apply its credentials as environment variables, never
/// in the Pod's spec; a machine uses its cluster's; the apply records the identity and
/// its Secret's version; the destroy after a rotation runs with the rotated credential;
/// and the identity owns its Secret, so that `clusterctl move` carries both.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_identity_gives_the_apply_its_credentials_and_the_destroy_the_rotated_ones() {
    if envtest_only("it reads the files Terraform leaves on this machine") {
        return;
    }
    let env = Env::builder("identity").provisioning().start().await;
    create_identity(&env, "token-1", json!({"list": [env.ns]})).await;
    let cluster_uid = env.create_cluster("prod").await;
    env.mark_cluster_ready("prod").await;
    env.create_owned::<Tfc>(
        "prod",
        "prod",
        &[("Cluster", "prod", &cluster_uid, false)],
        &token_module(),
        identity_ref(&env),
    )
    .await;
    env.wait_provisioned::<Tfc>("prod").await;
    assert_eq!(
        marker(&env, "prod.apply-token").as_deref(),
        Some("token-1"),
        "the apply ran with the identity's credential"
    );
    // A machine of the cluster names no identity: it runs with its cluster's.
    env.create_bootstrap_secret("prod", "web-1-bootstrap", "#cloud-config web-1")
        .await;
    let machine_uid = env
        .create_machine("web-1", "prod", Some("web-1-bootstrap"))
        .await;
    env.create_owned::<Tfm>(
        "web-1",
        "prod",
        &[("Machine", "web-1", &machine_uid, true)],
        &recording_machine_module(1, "", r#"\"$CLOUD_TOKEN\""#),
        json!({}),
    )
    .await;
    wait_condition::<Tfm>(&env, "web-1", "Provisioned", "True", "Provisioned").await;
    assert_eq!(
        marker(&env, "web-1-0.created").as_deref(),
        Some("token-1"),
        "the machine ran with its cluster's identity"
    );

    // What the apply recorded: the identity and its Secret's version (inputs version 3).
    let secrets = Api::<Secret>::namespaced(env.client.clone(), &env.manager_ns);
    let secret = secrets
        .get("team-creds")
        .await
        .expect("the identity's Secret");
    for kind in [Kind::TerraformCluster, Kind::TerraformMachine] {
        let name = if kind == Kind::TerraformCluster {
            "prod"
        } else {
            "web-1"
        };
        let inputs = recorded_inputs(&env, kind, name).await.expect("inputs");
        let used = inputs.identity.expect("the identity is recorded");
        assert_eq!(used.name, identity_name(&env), "{kind:?}");
        assert_eq!(
            used.secret_resource_version, secret.metadata.resource_version,
            "{kind:?}"
        );
        assert_eq!(inputs.version, captf::inputs::INPUTS_VERSION_IDENTITY);
    }
    // The credential is in no Pod's spec: the Jobs name the attempt's Secret.
    let jobs = Api::<k8s_openapi::api::batch::v1::Job>::namespaced(env.client.clone(), &env.ns)
        .list(&Default::default())
        .await
        .expect("jobs")
        .items;
    assert!(!jobs.is_empty());
    for job in &jobs {
        let text = serde_json::to_string(job).expect("job");
        assert!(!text.contains("token-1"), "{text}");
    }
    // The identity owns its Secret: clusterctl move carries a global identity's hierarchy.
    let identity = identities(&env)
        .get(&identity_name(&env))
        .await
        .expect("identity");
    assert!(
        secret
            .owner_references()
            .iter()
            .any(|r| Some(&r.uid) == identity.meta().uid.as_ref()
                && r.kind == "TerraformClusterIdentity"),
        "{:?}",
        secret.owner_references()
    );

    // The credential is rotated; the destroy runs with the new one.
    secrets
        .patch(
            "team-creds",
            &PatchParams::default(),
            &Patch::Merge(json!({"stringData": {"CLOUD_TOKEN": "token-2"}})),
        )
        .await
        .expect("rotate");
    env.delete::<Tfm>("web-1").await;
    env.wait_gone::<Tfm>("web-1", long()).await;
    env.delete::<Tfc>("prod").await;
    env.wait_gone::<Tfc>("prod", long()).await;
    assert_eq!(
        marker(&env, "prod.destroy-token").as_deref(),
        Some("token-2"),
        "the destroy ran with the identity's Secret as it is now"
    );
    let _ = identities(&env)
        .delete(&identity_name(&env), &DeleteParams::default())
        .await;
    env.shutdown().await;
}

/// An identity that does not allow the object's namespace holds its apply with the reason
/// and the fix, starting nothing; labelling the namespace to match the identity's
/// selector lets it start.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_identity_the_namespace_may_not_use_holds_the_apply_with_its_reason() {
    let env = Env::builder("identity-refused")
        .provisioning()
        .start()
        .await;
    create_identity(
        &env,
        "token-1",
        json!({"list": ["another-team"], "selector": {"matchLabels": {"team": env.ns}}}),
    )
    .await;
    env.create_terraform_cluster(&token_module(), identity_ref(&env))
        .await;
    let msg =
        wait_condition::<Tfc>(&env, "prod", "InputsApplied", "False", "ApplyCannotStart").await;
    let identity = identity_name(&env);
    assert!(
        msg.contains(&format!(
            "the identity apply attempt 1 runs with cannot be used: TerraformClusterIdentity {identity} does not allow namespace {}",
            env.ns
        )) && msg.contains("spec.allowedNamespaces")
            && msg.contains("runbooks/ApplyCannotStart.md"),
        "{msg}"
    );
    assert_eq!(env.jobs_created(), 0, "nothing runs without the identity");
    let obj = env.object::<Tfc>("prod").await.expect("object");
    assert!(
        !obj.annotations().contains_key(names::APPLY_ATTEMPT),
        "a refused identity writes nothing of the attempt"
    );
    assert!(
        env.event_reasons("prod")
            .await
            .iter()
            .any(|r| r == "ApplyCannotStart"),
        "a Warning Event names the refusal"
    );

    // The platform team labels the namespace for the team: the apply starts.
    Api::<Namespace>::all(env.client.clone())
        .patch(
            &env.ns,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"team": env.ns}}})),
        )
        .await
        .expect("label the namespace");
    wait_condition::<Tfc>(&env, "prod", "Provisioned", "True", "Provisioned").await;

    // The identity goes: the destroy cannot start, and says why; nothing is released.
    identities(&env)
        .delete(&identity, &DeleteParams::default())
        .await
        .expect("delete the identity");
    env.delete::<Tfc>("prod").await;
    let msg = env
        .wait_deleting::<Tfc>("prod", "DestroyCannotStart", long())
        .await;
    assert!(
        msg.contains(&format!(
            "the identity the destroy runs with cannot be used: TerraformClusterIdentity {identity} does not exist"
        )) && msg.contains("runbooks/DestroyCannotStart.md"),
        "{msg}"
    );
    assert!(
        env.object::<Tfc>("prod").await.is_some(),
        "held, not released"
    );
    // The identity owned its Secret: it went with it (the garbage collector).
    let secrets = Api::<Secret>::namespaced(env.client.clone(), &env.manager_ns);
    wait_for("the identity's Secret to go with it", long(), || async {
        secrets.get_opt("team-creds").await.expect("get").is_none()
    })
    .await;
    // Both made again (the same names), the destroy runs and the object goes.
    create_identity(&env, "token-2", json!({"list": [env.ns]})).await;
    env.wait_gone::<Tfc>("prod", long()).await;
    let _ = identities(&env)
        .delete(&identity, &DeleteParams::default())
        .await;
    env.shutdown().await;
}

/// A module that asks the API server, with its runner's own token, for a Secret of its
/// namespace and for one of another namespace (the identities' Secrets in the manager's
/// namespace): the first is read, the second refused (403), whatever the module does.
fn probing_module() -> String {
    r#"variable "name" { type = string }
variable "marker_dir" { type = string }
variable "own" { type = string }
variable "other" { type = string }
resource "terraform_data" "probe" {
  input = "${var.marker_dir}/${var.name}"
  provisioner "local-exec" {
    command = <<-EOT
      sa=/var/run/secrets/kubernetes.io/serviceaccount
      get() { curl -s -o /dev/null -w '%%{http_code}' --cacert $sa/ca.crt -H "Authorization: Bearer $(cat $sa/token)" "https://$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT/api/v1/$1"; }
      get '${var.own}' > '${self.input}.own'
      get '${var.other}' > '${self.input}.other'
    EOT
  }
}
"#
    .to_string()
}

/// What a module can reach in the management cluster: its own namespace's Secrets (the
/// state lives there), and no other namespace's: not another team's, not the identities'
/// credentials in the manager's namespace. The module runs `curl` with the Pod's token.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_module_cannot_read_another_namespaces_secrets() {
    if envtest_only("it reads the files Terraform leaves on this machine") {
        return;
    }
    let env = Env::builder("identity-reach")
        .runner_token()
        .provisioning()
        .start()
        .await;
    create_identity(&env, "token-1", json!({"list": [env.ns]})).await;
    create_secret(&env, "own-secret", json!({"k": "v"})).await;
    env.create_terraform_cluster(
        &probing_module(),
        json!({"variables": {
            "name": "prod",
            "marker_dir": env.markers().display().to_string(),
            "own": format!("namespaces/{}/secrets/own-secret", env.ns),
            "other": format!("namespaces/{}/secrets/team-creds", env.manager_ns),
        }}),
    )
    .await;
    env.wait_provisioned::<Tfc>("prod").await;
    assert_eq!(
        marker(&env, "prod.own").as_deref(),
        Some("200"),
        "the runner reads its own namespace's Secrets (its token works)"
    );
    assert_eq!(
        marker(&env, "prod.other").as_deref(),
        Some("403"),
        "the identities' Secret in the manager's namespace is refused to a module"
    );
    let _ = identities(&env)
        .delete(&identity_name(&env), &DeleteParams::default())
        .await;
    env.shutdown().await;
}

/// An identity that gives workload identity instead of a key (`serviceAccount`, no
/// Secret): an object that asks for its own runner account too is refused (one of the two
/// must go); without it, its apply and destroy run as the object's own account with the
/// identity's annotations, and the account goes with the object.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_identity_gives_the_runner_a_workload_identity_of_its_own() {
    use k8s_openapi::api::core::v1::ServiceAccount;
    const ROLE: &str = "eks.amazonaws.com/role-arn";
    // No sweep during the test: the release alone removes the account.
    let env = Env::builder("identity-account")
        .sweep_every(std::time::Duration::from_secs(3600))
        .provisioning()
        .start()
        .await;
    let identity: TerraformClusterIdentity = serde_json::from_value(json!({
        "apiVersion": names::API_VERSION, "kind": "TerraformClusterIdentity",
        "metadata": {"name": identity_name(&env)},
        "spec": {"serviceAccount": {"annotations": {ROLE: "arn:aws:iam::111122223333:role/team"}},
            "allowedNamespaces": {"list": [env.ns]}}
    }))
    .expect("identity");
    identities(&env)
        .create(&PostParams::default(), &identity)
        .await
        .expect("create the identity");
    let account = "captf-runner-prod.tfc";
    let jobs = job_accounts(&env);
    let mut spec = identity_ref(&env);
    spec["runner"] =
        json!({"serviceAccount": {"annotations": {ROLE: "arn:aws:iam::444455556666:role/mine"}}});
    env.create_terraform_cluster(&apply_module(0), spec).await;
    let msg =
        wait_condition::<Tfc>(&env, "prod", "InputsApplied", "False", "ApplyCannotStart").await;
    assert!(
        msg.contains("and so does the object's spec.runner.serviceAccount"),
        "{msg}"
    );
    assert_eq!(env.jobs_created(), 0);

    // The object's own request goes: the identity's account runs the apply.
    env.api::<Tfc>()
        .patch(
            "prod",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"runner": {"serviceAccount": null}}})),
        )
        .await
        .expect("patch");
    env.wait_provisioned::<Tfc>("prod").await;
    let sas: Api<ServiceAccount> = Api::namespaced(env.client.clone(), &env.ns);
    let sa = sas.get(account).await.expect("the object's runner account");
    assert_eq!(
        sa.annotations().get(ROLE).map(String::as_str),
        Some("arn:aws:iam::111122223333:role/team"),
        "the identity's annotations"
    );
    env.delete::<Tfc>("prod").await;
    env.wait_gone::<Tfc>("prod", long()).await;
    for op in [names::OPERATION_APPLY, names::OPERATION_DESTROY] {
        assert!(
            jobs.any(|(o, sa)| o == op && sa == account),
            "the {op} ran as the object's own account: {:?}",
            jobs.seen()
        );
    }
    assert!(
        sas.get_opt(account).await.expect("get").is_none(),
        "the account goes with the object, at its release"
    );
    let _ = identities(&env)
        .delete(&identity_name(&env), &DeleteParams::default())
        .await;
    env.shutdown().await;
}

/// A module behind the state proxy (`--state-proxy`): the runner container has no
/// token; the API server refuses it as anonymous; the proxy beside it refuses a Secret of
/// its own namespace that is not its state, and lists none but its state's; and the
/// apply and the destroy still read and write the state through the proxy.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_module_behind_the_state_proxy_reaches_only_its_state() {
    if envtest_only("the local kubelet runs the proxy's image as this build's captf") {
        return;
    }
    let env = Env::builder("state-proxy")
        .state_proxy()
        .provisioning()
        .start()
        .await;
    create_secret(
        &env,
        "prod-kubeconfig",
        json!({"value": "a workload cluster's"}),
    )
    .await;
    let module = r#"variable "name" { type = string }
variable "marker_dir" { type = string }
variable "namespace" { type = string }
resource "terraform_data" "probe" {
  input = "${var.marker_dir}/${var.name}"
  provisioner "local-exec" {
    command = <<-EOT
      sa=/var/run/secrets/kubernetes.io/serviceaccount
      if [ -e $sa/token ]; then echo present; else echo absent; fi > '${self.input}.token'
      curl -sk -o /dev/null -w '%%{http_code}' "https://$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT/api/v1/namespaces/${var.namespace}/secrets/prod-kubeconfig" > '${self.input}.direct'
      proxy="http://127.0.0.1:$(cat "$CAPTF_STATE_PROXY_PORT_FILE")/api/v1/namespaces/${var.namespace}/secrets"
      curl -s -o '${self.input}.refusal' -w '%%{http_code}' "$proxy/prod-kubeconfig" > '${self.input}.proxied'
      curl -s -o '${self.input}.list' "$proxy"
    EOT
  }
}
"#;
    env.create_terraform_cluster(
        module,
        json!({"variables": {
            "name": "prod",
            "marker_dir": env.markers().display().to_string(),
            "namespace": env.ns,
        }}),
    )
    .await;
    env.wait_provisioned::<Tfc>("prod").await;
    assert_eq!(
        marker(&env, "prod.token").as_deref().map(str::trim),
        Some("absent"),
        "the runner container mounts no token"
    );
    let direct = marker(&env, "prod.direct").unwrap_or_default();
    assert!(
        direct == "401" || direct == "403",
        "the API server refuses the runner without credentials: {direct}"
    );
    assert_eq!(
        marker(&env, "prod.proxied").as_deref(),
        Some("403"),
        "the proxy refuses a Secret of the namespace that is not the state's: {:?}",
        marker(&env, "prod.refusal")
    );
    let refusal = marker(&env, "prod.refusal").unwrap_or_default();
    assert!(refusal.contains("captf state-proxy"), "{refusal}");
    let list: Value = serde_json::from_str(&marker(&env, "prod.list").unwrap_or_default())
        .expect("the proxy's list is the API server's");
    let listed: Vec<&str> = list["items"]
        .as_array()
        .expect("items")
        .iter()
        .filter_map(|i| i["metadata"]["name"].as_str())
        .collect();
    assert!(
        listed
            .iter()
            .all(|n| n.starts_with("tfstate-default-prod.tfc")),
        "only the state's own Secrets are listed: {listed:?}"
    );
    // The state was written through the proxy, with the owner labels the backend sets.
    let state = env
        .secrets()
        .get(&names::state_secret_name("prod.tfc"))
        .await
        .expect("the state Secret");
    assert_eq!(
        state
            .labels()
            .get(names::TF_LABEL_SUFFIX)
            .map(String::as_str),
        Some("prod.tfc")
    );

    env.delete::<Tfc>("prod").await;
    env.wait_gone::<Tfc>("prod", long()).await;
    assert!(
        env.secrets()
            .get_opt(&names::state_secret_name("prod.tfc"))
            .await
            .expect("read")
            .is_none(),
        "the destroy ran through the proxy and the state went with the release"
    );
    env.shutdown().await;
}
