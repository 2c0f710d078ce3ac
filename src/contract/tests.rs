use std::collections::{BTreeMap, BTreeSet};

use super::check::{Severity, check};
use super::hcl;
use super::*;

fn schema(role: Role, which: &str) -> serde_json::Value {
    let path = format!(
        "{}/docs/provisioning/schemas/{role}.{which}.schema.json",
        env!("CARGO_MANIFEST_DIR")
    );
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{path}: {e}"))
}

fn keys(v: &serde_json::Value, field: &str) -> BTreeSet<String> {
    match &v[field] {
        serde_json::Value::Object(m) => m.keys().cloned().collect(),
        serde_json::Value::Array(a) => a
            .iter()
            .filter_map(|x| x.as_str().map(str::to_string))
            .collect(),
        _ => BTreeSet::new(),
    }
}

/// The JSON Schemas of docs/provisioning/schemas/ say what the contract table says.
#[test]
fn the_schemas_follow_the_contract_table() {
    for role in Role::ALL {
        let inputs = schema(role, "inputs");
        let names: BTreeSet<String> = variables(role).map(|v| v.name.to_string()).collect();
        assert_eq!(keys(&inputs, "properties"), names, "{role} inputs");
        let always: BTreeSet<String> = super::given(role).map(|v| v.name.to_string()).collect();
        assert_eq!(
            keys(&inputs, "required"),
            always,
            "{role}: every variable but the conditional ones is written"
        );
        assert_eq!(
            inputs["additionalProperties"], false,
            "{role}: the inputs are closed"
        );
        for v in variables(role) {
            let p = &inputs["properties"][v.name];
            let nullable = p["anyOf"]
                .as_array()
                .is_some_and(|a| a.iter().any(|x| x["type"] == "null"))
                || p.as_object().is_some_and(|o| o.is_empty());
            assert_eq!(nullable, v.nullable, "{role}: {} nullable", v.name);
        }
        let out = schema(role, "outputs");
        let names: BTreeSet<String> = outputs(role).map(|o| o.name.to_string()).collect();
        assert_eq!(keys(&out, "properties"), names, "{role} outputs");
        let required: BTreeSet<String> = outputs(role)
            .filter(|o| o.need == Need::Required)
            .map(|o| o.name.to_string())
            .collect();
        assert_eq!(keys(&out, "required"), required, "{role} required outputs");
    }
}

#[test]
fn every_contract_name_is_reserved_and_unique() {
    let mut seen = BTreeSet::new();
    for v in VARIABLES {
        assert!(v.name.starts_with(RESERVED_PREFIX), "{}", v.name);
        assert!(seen.insert(v.name), "{} twice", v.name);
        assert!(!v.roles.is_empty());
    }
    for o in OUTPUTS {
        assert!(!o.name.starts_with(RESERVED_PREFIX), "{}", o.name);
    }
}

#[test]
fn the_reader_skips_strings_heredocs_and_comments() {
    let src = r#"
# a comment with { a brace
variable "captf_tags" { type = map(string) }
/* a block comment
   variable "hidden" {} */
resource "terraform_data" "vm" {
  input = "${var.captf_object_name}-${join("}", ["a"])}"
  tags  = { for k, v in var.captf_tags : k => v if v != "}" }
  user_data = <<-EOT
    #cloud-config
    variable "not_a_block" {
  EOT
  provisioner "local-exec" {
    when    = destroy
    command = "echo ${self.output}"
  }
}
output "provider_id" {
  value = "fake://${terraform_data.vm.id}"
}
"#;
    let blocks = hcl::parse(src).expect("parses");
    let kinds: Vec<(String, Vec<String>)> = blocks
        .iter()
        .map(|b| (b.kind.clone(), b.labels.clone()))
        .collect();
    assert_eq!(
        kinds,
        [
            ("variable".to_string(), vec!["captf_tags".to_string()]),
            (
                "resource".to_string(),
                vec!["terraform_data".to_string(), "vm".to_string()]
            ),
            ("output".to_string(), vec!["provider_id".to_string()]),
        ]
    );
    assert_eq!(blocks[0].attribute("type"), Some("map(string)"));
    assert_eq!(blocks[0].line, 3);
    let vm = &blocks[1];
    assert_eq!(
        vm.attributes
            .iter()
            .map(|(n, _)| n.as_str())
            .collect::<Vec<_>>(),
        ["input", "tags", "user_data"]
    );
    assert_eq!(vm.blocks.len(), 1);
    assert_eq!(vm.blocks[0].attribute("when"), Some("destroy"));
    assert_eq!(blocks[2].line, 18);
}

#[test]
fn a_broken_file_is_an_error_with_its_line() {
    for (src, line) in [
        ("variable \"a\" {\n  type = string\n", "line 1"),
        ("output \"a\" {\n  value = \"open\n}\n", "line 2"),
        ("locals {\n}\n}\n", "line 3"),
        ("/* never closed\n", "line 1"),
    ] {
        let e = hcl::parse(src).expect_err(src);
        assert!(e.contains(line), "{src:?}: {e}");
    }
}

/// Untrusted bytes: nesting past the limit is an error, not a stack overflow.
#[test]
fn deep_nesting_is_an_error_not_a_crash() {
    let blocks = "a {\n".repeat(200_000);
    let e = hcl::parse(&blocks).expect_err("too deep");
    assert!(
        e.contains("nest more than"),
        "{}",
        &e[e.len().saturating_sub(200)..]
    );
    let strings = format!("x = {}", "\"${".repeat(100_000));
    let e = hcl::parse(&strings).expect_err("too deep");
    assert!(e.contains("nest more than"), "{e}");
}

fn module(files: &[(&str, &str)]) -> BTreeMap<String, String> {
    files
        .iter()
        .map(|(n, t)| (n.to_string(), t.to_string()))
        .collect()
}

const GOOD_MACHINE: &str = r#"
variable "captf_object_name" { type = string }
variable "captf_bootstrap_data" {
  type      = string
  sensitive = true
}
variable "size" { default = "small" }
resource "terraform_data" "vm" { input = var.captf_object_name }
output "provider_id" { value = "fake://${terraform_data.vm.id}" }
output "addresses" { value = [] }
"#;

#[test]
fn a_machine_module_that_follows_the_contract_passes() {
    let r = check(&module(&[("main.tf", GOOD_MACHINE)]), Role::Machine).expect("reads");
    assert_eq!(r.findings, vec![], "{}", r.render_text());
    assert_eq!(
        r.contract_variables,
        ["captf_bootstrap_data", "captf_object_name"]
    );
    assert_eq!(r.own_variables, ["size"]);
    assert_eq!(r.outputs, ["addresses", "provider_id"]);
    assert!(
        r.render_text()
            .ends_with("ok: the module follows the contract\n")
    );
}

#[test]
fn what_the_contract_forbids_is_an_error_and_what_it_advises_a_warning() {
    let bad = r#"
terraform {
  backend "s3" {}
}
variable "captf_bootstrap_data" { type = string }
variable "captf_secret_sauce" { type = string }
variable "captf_replicas" { type = number }
variable "captf_control_plane" { type = string }
variable "captf_tags" { type = map( string ) }
data "kubernetes_secret_v1" "bootstrap" {
  metadata { name = "web-1-bootstrap" }
}
data "aws_ami" "ubuntu" {}
resource "terraform_data" "vm" {
  provisioner "local-exec" {
    when    = destroy
    command = "echo ${var.captf_bootstrap_data}"
  }
}
resource "terraform_data" "disk" {
  lifecycle {
    prevent_destroy = true
  }
}
"#;
    let r = check(&module(&[("main.tf", bad)]), Role::Machine).expect("reads");
    let errors: Vec<&str> = r
        .findings
        .iter()
        .filter(|f| f.severity == Severity::Error)
        .map(|f| f.message.as_str())
        .collect();
    let warnings: Vec<&str> = r
        .findings
        .iter()
        .filter(|f| f.severity == Severity::Warning)
        .map(|f| f.message.as_str())
        .collect();
    let has = |list: &[&str], text: &str| list.iter().any(|m| m.contains(text));
    assert!(
        has(&errors, "captf_secret_sauce uses the reserved prefix"),
        "{errors:?}"
    );
    assert!(has(&errors, "kubernetes_secret_v1"), "{errors:?}");
    assert!(
        has(
            &errors,
            "resource terraform_data \"disk\" has lifecycle prevent_destroy = true"
        ),
        "{errors:?}"
    );
    assert!(
        has(
            &errors,
            "destroy-time provisioner refers to captf_bootstrap_data"
        ),
        "{errors:?}"
    );
    assert!(
        has(&errors, "output provider_id (string) is missing"),
        "{errors:?}"
    );
    assert_eq!(errors.len(), 5, "{errors:?}");
    assert!(
        has(
            &warnings,
            "captf_replicas is given to a machine-pool module"
        ),
        "{warnings:?}"
    );
    assert!(has(&warnings, "sensitive = true"), "{warnings:?}");
    assert!(has(&warnings, "a backend (s3)"), "{warnings:?}");
    assert!(has(&warnings, "aws_ami"), "{warnings:?}");
    assert!(
        has(
            &warnings,
            "captf_control_plane is declared as string; the contract gives bool"
        ),
        "{warnings:?}"
    );
    assert!(
        !has(&warnings, "captf_tags"),
        "spacing in a type is no difference: {warnings:?}"
    );
    assert_eq!(r.errors(), 5);
    assert!(
        r.render_text().ends_with("5 error(s), 5 warning(s)\n"),
        "{}",
        r.render_text()
    );
    // Findings name the file and line.
    assert!(
        r.findings.iter().any(|f| f.at == "main.tf:6"),
        "{:?}",
        r.findings
    );
}

#[test]
fn a_pool_needs_its_provider_id_list_and_a_cluster_no_output() {
    let r = check(&module(&[("main.tf", GOOD_MACHINE)]), Role::MachinePool).expect("reads");
    assert!(
        r.findings.iter().any(|f| f
            .message
            .contains("output provider_id_list (list(string)) is missing")),
        "{}",
        r.render_text()
    );
    let r = check(
        &module(&[("main.tf", "resource \"terraform_data\" \"lb\" {}\n")]),
        Role::Cluster,
    )
    .expect("reads");
    assert_eq!(r.errors(), 0, "{}", r.render_text());
}

#[test]
fn a_module_directory_is_read_within_its_limits() {
    let dir = std::env::temp_dir().join(format!("captf-module-check-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("modules/sub")).expect("dir");
    std::fs::write(dir.join("main.tf"), GOOD_MACHINE).expect("write");
    std::fs::write(dir.join("README.md"), "not read").expect("write");
    std::fs::write(dir.join("modules/sub/x.tf"), "not { read").expect("write");
    let files = check::read_module(&dir).expect("reads");
    assert_eq!(files.keys().collect::<Vec<_>>(), ["main.tf"]);
    let big = "#".repeat(usize::try_from(check::MAX_FILE_BYTES).unwrap() + 1);
    std::fs::write(dir.join("big.tf"), big).expect("write");
    let e = check::read_module(&dir).expect_err("too big");
    assert!(e.contains("big.tf") && e.contains("more than"), "{e}");
    std::fs::remove_dir_all(&dir).expect("clean");
    let e = check::read_module(&dir).expect_err("gone");
    assert!(e.contains("cannot read the directory"), "{e}");
}

/// The values given for each role are exactly the contract's variables of that role, and
/// null only where the contract allows it.
#[test]
fn the_values_given_are_the_roles_variables_from_the_cluster_api_objects() {
    use super::values::{Sources, values};
    let cluster = serde_json::json!({"spec": {
        "topology": {"version": "v1.33.1"},
        "controlPlaneEndpoint": {"host": "10.0.0.1", "port": 6443},
        "clusterNetwork": {"pods": {"cidrBlocks": ["192.168.0.0/16"]}, "services": {"cidrBlocks": ["10.96.0.0/12"]}}
    }});
    let machine = serde_json::json!({"metadata": {"name": "cp-1", "labels": {"cluster.x-k8s.io/control-plane": ""}},
        "spec": {"version": "v1.33.1", "failureDomain": "az-1"}});
    let pool = serde_json::json!({"metadata": {"name": "pool"},
        "spec": {"replicas": 3, "failureDomains": ["az-1", "az-2"],
            "template": {"metadata": {"labels": {"role": "worker"}}, "spec": {"version": "v1.33.1"}}}});
    for role in Role::ALL {
        let owner = match role {
            Role::Cluster => None,
            Role::Machine => Some(&machine),
            Role::MachinePool => Some(&pool),
        };
        let s = Sources {
            role,
            namespace: "team-a",
            object_name: "x",
            object_kind: "TerraformMachine",
            cluster_name: "prod",
            cluster: Some(&cluster),
            owner,
            bootstrap: Some((b"#cloud-config\n", None)),
            cluster_outputs: None,
            own_endpoint: None,
            endpoint_given_before: None,
        };
        let got = values(&s);
        let mut names: Vec<&str> = got.keys().map(String::as_str).collect();
        names.sort_unstable();
        let mut want: Vec<&str> = super::given(role).map(|v| v.name).collect();
        want.sort_unstable();
        assert_eq!(names, want, "{role}");
        for v in super::given(role) {
            assert!(
                v.nullable || !got[v.name].is_null(),
                "{role}: {} is null",
                v.name
            );
        }
    }
    let s = Sources {
        role: Role::Machine,
        namespace: "team-a",
        object_name: "cp-1",
        object_kind: "TerraformMachine",
        cluster_name: "prod",
        cluster: Some(&cluster),
        owner: Some(&machine),
        bootstrap: Some((b"#cloud-config\n", Some("ignition"))),
        cluster_outputs: None,
        own_endpoint: None,
        endpoint_given_before: None,
    };
    let got = values(&s);
    assert_eq!(got["captf_bootstrap_data"], "I2Nsb3VkLWNvbmZpZwo=");
    assert_eq!(got["captf_bootstrap_format"], "ignition");
    assert_eq!(got["captf_control_plane"], true);
    assert_eq!(got["captf_failure_domain"], "az-1");
    assert_eq!(got["captf_tags"]["captf-name"], "cp-1");
    let c = values(&Sources {
        role: Role::Cluster,
        owner: None,
        bootstrap: None,
        ..s
    });
    assert_eq!(c["captf_control_plane_endpoint"]["host"], "10.0.0.1");
    assert_eq!(
        c["captf_cluster_network"]["service_domain"],
        "cluster.local"
    );
    assert_eq!(c["captf_kubernetes_version"], "v1.33.1");
    let p = values(&Sources {
        role: Role::MachinePool,
        owner: Some(&pool),
        ..s
    });
    assert_eq!(p["captf_replicas"], 3);
    assert_eq!(p["captf_node_labels"]["role"], "worker");
    assert_eq!(p["captf_cluster_outputs"], serde_json::Value::Null);
    let handed = serde_json::json!({"subnet": "s-1"});
    let p = values(&Sources {
        role: Role::MachinePool,
        owner: Some(&pool),
        cluster_outputs: Some(&handed),
        ..s
    });
    assert_eq!(p["captf_cluster_outputs"], handed);

    // The endpoint the module made, copied into the Cluster by Cluster API, comes back: no
    // new input. One given before the module ran, or changed since, stays an input.
    let cluster_role = |own, before| {
        values(&Sources {
            role: Role::Cluster,
            owner: None,
            bootstrap: None,
            own_endpoint: own,
            endpoint_given_before: before,
            ..s
        })["captf_control_plane_endpoint"]
            .clone()
    };
    let copied = Some(("10.0.0.1", 6443));
    assert_eq!(cluster_role(copied, Some(false)), serde_json::Value::Null);
    assert_eq!(cluster_role(copied, Some(true))["host"], "10.0.0.1");
    assert_eq!(
        cluster_role(Some(("10.9.9.9", 6443)), Some(false))["host"],
        "10.0.0.1"
    );
    assert_eq!(
        cluster_role(copied, None)["host"],
        "10.0.0.1",
        "nothing recorded yet"
    );
}

#[test]
fn machines_are_given_the_outputs_of_the_terraform_cluster_their_cluster_names() {
    use super::values::handoff_source;
    let v1beta2 = serde_json::json!({"spec": {"infrastructureRef": {
        "apiGroup": "infrastructure.cluster.x-k8s.io", "kind": "TerraformCluster", "name": "prod-infra"}}});
    assert_eq!(handoff_source(&v1beta2), Some("prod-infra"));
    let v1beta1 = serde_json::json!({"spec": {"infrastructureRef": {
        "apiVersion": "infrastructure.cluster.x-k8s.io/v1alpha1", "kind": "TerraformCluster", "name": "prod"}}});
    assert_eq!(handoff_source(&v1beta1), Some("prod"));
    for other in [
        serde_json::json!({"spec": {"infrastructureRef": {
            "apiGroup": "infrastructure.cluster.x-k8s.io", "kind": "AWSCluster", "name": "prod"}}}),
        serde_json::json!({"spec": {"infrastructureRef": {
            "apiGroup": "example.com", "kind": "TerraformCluster", "name": "prod"}}}),
        serde_json::json!({"spec": {"infrastructureRef": {
            "apiGroup": "infrastructure.cluster.x-k8s.io", "kind": "TerraformCluster", "name": ""}}}),
        serde_json::json!({"spec": {}}),
    ] {
        assert_eq!(handoff_source(&other), None, "{other}");
    }
}

#[test]
fn the_outputs_set_the_fields_of_their_role_and_every_breach_is_named() {
    use super::outputs::fields;
    let out = |v: serde_json::Value| v.as_object().cloned().unwrap_or_default();
    let c = fields(
        Role::Cluster,
        &out(serde_json::json!({
            "control_plane_endpoint": {"host": "lb.example", "port": 6443},
            "failure_domains": [{"name": "az-1", "control_plane": true, "attributes": {"zone": "a"}}, {"name": "az-2"}],
            "machine_inputs": {"subnet": "s-1"}
        })),
    )
    .expect("valid");
    assert_eq!(
        c.spec["controlPlaneEndpoint"],
        serde_json::json!({"host": "lb.example", "port": 6443})
    );
    assert_eq!(
        c.status["failureDomains"],
        serde_json::json!([{"name": "az-1", "controlPlane": true, "attributes": {"zone": "a"}}, {"name": "az-2", "controlPlane": false}])
    );
    // Optional and null: nothing set, no error (not known yet).
    let c = fields(
        Role::Cluster,
        &out(serde_json::json!({"control_plane_endpoint": null})),
    )
    .expect("valid");
    assert!(c.spec.is_empty() && c.status.is_empty());

    let p = fields(
        Role::MachinePool,
        &out(serde_json::json!({"provider_id_list": ["a:///1", "a:///2"]})),
    )
    .expect("valid");
    assert_eq!(
        p.spec["providerIDList"],
        serde_json::json!(["a:///1", "a:///2"])
    );
    assert_eq!(
        p.status["replicas"], 2,
        "the list's length when replicas is not given"
    );
    assert_eq!(p.status["ready"], true);

    let errors = fields(
        Role::Cluster,
        &out(serde_json::json!({
            "control_plane_endpoint": {"host": "", "port": 70000},
            "failure_domains": [{"name": "az-1", "attributes": {"n": 1}}]
        })),
    )
    .unwrap_err();
    assert_eq!(errors.len(), 2, "{errors:?}");
    assert!(
        errors[0].starts_with("output control_plane_endpoint must be"),
        "{errors:?}"
    );
    assert!(
        errors[1].contains("the attributes of az-1 must be a map of strings"),
        "{errors:?}"
    );
    let errors = fields(
        Role::Machine,
        &out(serde_json::json!({"provider_id": null})),
    )
    .unwrap_err();
    assert_eq!(
        errors,
        vec!["output provider_id is required of a machine module and is null".to_string()]
    );
    let errors = fields(
        Role::MachinePool,
        &out(serde_json::json!({"provider_id_list": ["a", ""], "replicas": -1})),
    )
    .unwrap_err();
    assert_eq!(errors.len(), 2, "{errors:?}");
}

#[test]
fn the_outputs_are_read_from_the_state_as_terraform_wrote_them() {
    let st = crate::testing::state_with_outputs(
        "prod.tfc",
        serde_json::json!({"control_plane_endpoint": {"host": "h", "port": 1}}),
    );
    let out = crate::state::outputs(&st, crate::state::DEFAULT_DECOMPRESSION_CAP).expect("read");
    assert_eq!(out["control_plane_endpoint"]["host"], "h");
    // Past the decompression cap: an error, not a partial read.
    let err = crate::state::outputs(&st, 10).unwrap_err();
    assert!(err.contains("tfstate-default-prod.tfc"), "{err}");
    // A missing state is an error naming it.
    let none = crate::state::StateSecrets::from_secrets("tfstate-default-x.tfc", &[]);
    assert!(crate::state::outputs(&none, 1 << 20).is_err());
}

#[test]
fn a_set_once_field_set_to_another_value_is_refused_and_the_rest_written() {
    use super::outputs::spec_changes;
    let out = |v: serde_json::Value| v.as_object().cloned().unwrap_or_default();
    let endpoint = serde_json::json!({"host": "10.0.0.1", "port": 6443});
    // Unset (absent, or CAPI's empty endpoint): written.
    for current in [
        serde_json::json!({}),
        serde_json::json!({"controlPlaneEndpoint": {"host": "", "port": 0}}),
    ] {
        let (write, refused) = spec_changes(
            &current,
            &out(serde_json::json!({"controlPlaneEndpoint": endpoint})),
        );
        assert_eq!(
            write.get("controlPlaneEndpoint"),
            Some(&endpoint),
            "{current}"
        );
        assert!(refused.is_empty());
    }
    // The same value: nothing to write.
    let current = serde_json::json!({"controlPlaneEndpoint": endpoint, "providerID": "captf:///a"});
    let (write, refused) = spec_changes(
        &current,
        &out(serde_json::json!({"controlPlaneEndpoint": endpoint})),
    );
    assert!(write.is_empty() && refused.is_empty());
    // Another value: refused, named; a field that is not set once is written beside it.
    let (write, refused) = spec_changes(
        &current,
        &out(serde_json::json!({"providerID": "captf:///b", "providerIDList": ["captf:///b"]})),
    );
    assert_eq!(write.keys().collect::<Vec<_>>(), ["providerIDList"]);
    assert_eq!(refused.len(), 1);
    assert_eq!(refused[0].0, "providerID");
    assert_eq!(
        refused[0].1,
        "the outputs give spec.providerID \"captf:///b\", and it is \"captf:///a\": it is set once and kept"
    );
}

#[test]
fn a_machine_placed_in_another_failure_domain_than_its_machine_asks_for_breaks_the_contract() {
    use super::outputs::against_inputs;
    let m = |v: serde_json::Value| v.as_object().cloned().unwrap_or_default();
    let given = m(serde_json::json!({"captf_failure_domain": "az-1"}));
    let out = m(serde_json::json!({"provider_id": "p", "failure_domain": "az-2"}));
    assert_eq!(
        against_inputs(Role::Machine, &out, &given),
        [
            "output failure_domain is az-2, but the Machine asks for az-1 (captf_failure_domain): the module must place the machine there"
        ]
    );
    let same = m(serde_json::json!({"provider_id": "p", "failure_domain": "az-1"}));
    assert!(against_inputs(Role::Machine, &same, &given).is_empty());
    // The Machine asks for none, or the module says nothing: nothing to compare.
    assert!(
        against_inputs(
            Role::Machine,
            &out,
            &m(serde_json::json!({"captf_failure_domain": null}))
        )
        .is_empty()
    );
    assert!(
        against_inputs(
            Role::Machine,
            &m(serde_json::json!({"provider_id": "p"})),
            &given
        )
        .is_empty()
    );
    // Not a machine: pools place their instances across captf_failure_domains.
    assert!(against_inputs(Role::MachinePool, &out, &given).is_empty());
}

#[test]
fn a_pools_instances_are_shown_in_its_status_each_one_of_its_provider_ids() {
    use super::outputs::fields;
    let out = |v: serde_json::Value| v.as_object().cloned().unwrap_or_default();
    let f = fields(
        Role::MachinePool,
        &out(serde_json::json!({
            "provider_id_list": ["captf:///p-0", "captf:///p-1"],
            "instances": [
                {"provider_id": "captf:///p-0", "addresses": [{"type": "InternalIP", "address": "10.0.2.1"}], "failure_domain": "az-1"},
                {"provider_id": "captf:///p-1"}
            ]
        })),
    )
    .expect("valid");
    assert_eq!(
        f.status["instances"],
        serde_json::json!([
            {"providerID": "captf:///p-0", "addresses": [{"type": "InternalIP", "address": "10.0.2.1"}], "failureDomain": "az-1"},
            {"providerID": "captf:///p-1"}
        ])
    );
    // Its status deserializes into the kind's status type.
    let status: crate::api::TerraformStatus =
        serde_json::from_value(serde_json::Value::Object(f.status.clone())).expect("status");
    assert_eq!(status.instances.len(), 2);
    assert_eq!(status.instances[0].failure_domain.as_deref(), Some("az-1"));

    // An instance the list does not have, or of another shape: named.
    for bad in [
        serde_json::json!([{"provider_id": "captf:///p-9"}]),
        serde_json::json!([{"provider_id": "captf:///p-0", "addresses": [{"type": "Carrier", "address": "x"}]}]),
        serde_json::json!({"provider_id": "captf:///p-0"}),
    ] {
        let errors = fields(
            Role::MachinePool,
            &out(serde_json::json!({"provider_id_list": ["captf:///p-0"], "instances": bad})),
        )
        .expect_err("invalid");
        assert!(
            errors[0].starts_with("output instances must be a list of"),
            "{errors:?}"
        );
    }
}

#[test]
fn provider_ids_within_cluster_apis_limits_and_none_beyond() {
    use super::outputs::{PROVIDER_ID_LIST_MAX_ITEMS, PROVIDER_ID_MAX_CHARS, fields};
    let out = |v: serde_json::Value| v.as_object().cloned().unwrap_or_default();
    let longest = format!("captf:///{}", "x".repeat(PROVIDER_ID_MAX_CHARS - 9));
    let f = fields(
        Role::Machine,
        &out(serde_json::json!({"provider_id": longest})),
    )
    .expect("512 characters fit");
    assert_eq!(f.spec["providerID"], serde_json::json!(longest));
    let too_long = format!("{longest}x");
    let e = fields(
        Role::Machine,
        &out(serde_json::json!({"provider_id": too_long})),
    )
    .expect_err("513 characters do not");
    assert!(
        e[0].contains("1 to 512 characters") && e[0].contains("not a string of 513 characters"),
        "{e:?}"
    );
    // The value itself is never in the message (it goes into an annotation and an
    // Event): only what it is.
    let e = fields(
        Role::Machine,
        &out(serde_json::json!({"provider_id": "aws:///x", "addresses": [{"type": "Carrier", "address": "hunter2-secret"}]})),
    )
    .expect_err("an address of an unknown type");
    assert!(!e.join(" ").contains("hunter2-secret"), "{e:?}");
    assert!(e.join(" ").contains("a list of 1 item(s)"), "{e:?}");

    let many: Vec<String> = (0..PROVIDER_ID_LIST_MAX_ITEMS)
        .map(|i| format!("captf:///p-{i}"))
        .collect();
    let f = fields(
        Role::MachinePool,
        &out(serde_json::json!({"provider_id_list": many})),
    )
    .expect("10000 fit");
    assert_eq!(
        f.status["replicas"],
        serde_json::json!(PROVIDER_ID_LIST_MAX_ITEMS)
    );
    let mut more = many.clone();
    more.push("captf:///p-last".into());
    let e = fields(
        Role::MachinePool,
        &out(serde_json::json!({"provider_id_list": more})),
    )
    .expect_err("10001 do not");
    assert!(e[0].contains("at most 10000 strings"), "{e:?}");
    // Nothing of an invalid list is set: the pool's list is never shrunk by it.
    let e = fields(
        Role::MachinePool,
        &out(serde_json::json!({"provider_id_list": ["captf:///p-0", null]})),
    )
    .expect_err("a null item");
    assert!(e[0].starts_with("output provider_id_list must be"), "{e:?}");
}

/// The three modules of `tests/fuzz/modules/` that Terraform 1.11.4 validates and that
/// were read wrongly: each is read as Terraform reads it.
fn fuzz_module(name: &str) -> BTreeMap<String, String> {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fuzz/modules")
        .join(name);
    check::read_module(&dir).expect("the module is read")
}

#[test]
fn an_object_type_over_several_lines_without_commas_is_the_contracts_type() {
    let r = check(&fuzz_module("multiline-object-type"), Role::Cluster).expect("reads");
    assert_eq!(
        r.findings,
        [],
        "`terraform fmt` lays an object type out one attribute a line, without commas:\n{}",
        r.render_text()
    );
}

#[test]
fn a_comment_in_a_destroy_provisioner_is_no_reference() {
    let r = check(&fuzz_module("destroy-provisioner-comment"), Role::Machine).expect("reads");
    assert_eq!(r.errors(), 0, "{}", r.render_text());
    // A reference in an interpolation, after a `#` in a string or in a heredoc, is still
    // one (Terraform 1.11.4 refuses both modules).
    for command in [
        r#""echo # ${var.captf_bootstrap_data}""#,
        "<<EOT\necho ${md5(var.captf_bootstrap_data)}\nEOT",
    ] {
        let real = format!(
            "resource \"terraform_data\" \"i\" {{\n  provisioner \"local-exec\" {{\n    when    = destroy\n    command = {command}\n  }}\n}}\n"
        );
        let r = check(&module(&[("main.tf", &real)]), Role::Machine).expect("reads");
        assert!(
            r.findings
                .iter()
                .any(|f| f.message.contains("destroy-time provisioner")),
            "{real}\n{}",
            r.render_text()
        );
    }
}

#[test]
fn a_file_that_starts_with_a_byte_order_mark_is_read() {
    let r = check(&fuzz_module("byte-order-mark"), Role::Machine);
    let r = r.expect("Terraform reads a file after its UTF-8 byte order mark");
    assert_eq!(r.own_variables, Vec::<String>::new());
    assert_eq!(r.contract_variables, ["captf_object_name"]);
    assert_eq!(r.outputs, ["provider_id"]);
}

#[test]
fn captf_hibernated_is_a_contract_variable_declared_with_a_default() {
    let with = format!(
        "{GOOD_MACHINE}variable \"captf_hibernated\" {{\n  type    = bool\n  default = false\n}}\n"
    );
    let r = check(&module(&[("main.tf", &with)]), Role::Machine).expect("reads");
    assert_eq!(r.findings, vec![], "{}", r.render_text());
    assert!(
        r.contract_variables
            .contains(&"captf_hibernated".to_string())
    );
    let without = format!("{GOOD_MACHINE}variable \"captf_hibernated\" {{ type = bool }}\n");
    let r = check(&module(&[("main.tf", &without)]), Role::Machine).expect("reads");
    assert_eq!(r.errors(), 0, "{}", r.render_text());
    assert!(
        r.findings
            .iter()
            .any(|f| f.message.contains("default = false")),
        "{}",
        r.render_text()
    );
}
