use super::*;
use crate::api::labels::name_label_value;
use crate::api::names::Kind;
use crate::api::types::{ModuleSpec, RunnerSpec, SecretKeyRef, VariablesFrom};
use serde_json::json;

const NS: &str = "team-a";
const SUFFIX: &str = "web-1.tfm";

fn example() -> Value {
    json!({
      "version": 1,
      "runner": { "image": "hashicorp/terraform:1.11.4" },
      "module": { "source": "git::https://example.com/infra.git//vm?ref=v1.4.0" },
      "variables": { "name": "web-1", "replicas": 3 },
      "env": [ { "name": "AWS_ACCESS_KEY_ID", "secretKeyRef": { "name": "aws-creds", "key": "id" } } ],
      "backend": { "namespace": "team-a", "secretSuffix": "web-1.tfm" },
      "timeoutSeconds": 3600,
      "lockFile": "# optional: the .terraform.lock.hcl the apply used"
    })
}

fn parse_value(v: &Value) -> Result<Inputs, InputsError> {
    parse(&serde_json::to_vec(v).unwrap(), NS, SUFFIX)
}

#[test]
fn the_spec_example_parses() {
    let i = parse_value(&example()).unwrap();
    assert_eq!(i.version, 1);
    assert_eq!(i.runner.image, "hashicorp/terraform:1.11.4");
    assert_eq!(
        i.module,
        Module::Source("git::https://example.com/infra.git//vm?ref=v1.4.0".into())
    );
    assert_eq!(i.variables["replicas"], json!(3));
    assert_eq!(
        i.env[0].secret_key_ref,
        SecretKeyRef {
            name: "aws-creds".into(),
            key: "id".into()
        }
    );
    assert_eq!(
        i.backend,
        Backend {
            namespace: NS.into(),
            secret_suffix: SUFFIX.into()
        }
    );
    assert_eq!(i.timeout_seconds, Some(3600));
    assert!(i.lock_file.is_some());
    // What it serializes back to parses to the same inputs.
    assert_eq!(parse(&i.to_json_bytes(), NS, SUFFIX).unwrap(), i);
}

#[test]
fn optional_fields_may_be_absent_and_unknown_fields_are_ignored() {
    let mut v = example();
    let o = v.as_object_mut().unwrap();
    for k in ["variables", "env", "timeoutSeconds", "lockFile"] {
        o.remove(k);
    }
    o.insert("futureField".into(), json!({"x": 1}));
    o["runner"]["pullPolicy"] = json!("Always");
    o["module"]["checksum"] = json!("abc");
    let i = parse_value(&v).unwrap();
    assert!(i.variables.is_empty() && i.env.is_empty());
    assert_eq!(i.timeout_seconds, None);
    assert_eq!(i.timeout_or_default(), 3600);
}

fn unusable(v: Value) -> String {
    parse_value(&v).unwrap_err().to_string()
}

#[test]
fn the_runtime_is_terraform_or_tofu_and_absent_leaves_the_bytes_as_before() {
    let mut v = example();
    v["runner"]["runtime"] = json!("tofu");
    let i = parse_value(&v).unwrap();
    assert_eq!(i.runner.runtime, Some(crate::api::types::Runtime::Tofu));
    assert!(
        String::from_utf8(i.to_json_bytes())
            .unwrap()
            .contains(r#""runtime":"tofu""#)
    );
    // Absent: not written, so inputs recorded before the field hash the same.
    let i = parse_value(&example()).unwrap();
    assert_eq!(i.runner.runtime, None);
    assert!(
        !String::from_utf8(i.to_json_bytes())
            .unwrap()
            .contains("runtime")
    );
    let mut v = example();
    v["runner"]["runtime"] = json!("opentofu");
    let msg = unusable(v);
    assert!(msg.contains("runner") && msg.contains("opentofu"), "{msg}");
}

#[test]
fn versions_1_and_2_are_read_and_hash_the_same() {
    let v1 = parse_value(&example()).unwrap();
    let mut doc = example();
    doc["version"] = json!(2);
    let v2 = parse_value(&doc).unwrap();
    assert_eq!((v1.version, v2.version), (1, 2));
    // An upgrade that writes version 2 re-applies nothing: the hash is the same.
    assert_eq!(v1.sha256(), v2.sha256());
    assert_eq!(v1.sha256(), Inputs::sha256_hex(&v1.to_json_bytes()));
    assert_ne!(v2.sha256(), Inputs::sha256_hex(&v2.to_json_bytes()));
}

#[test]
fn recording_what_ran_writes_version_2() {
    let v1 = parse_value(&example()).unwrap();
    let ran = Ran {
        image_digest: Some(format!(
            "docker.io/hashicorp/terraform@sha256:{}",
            "a".repeat(64)
        )),
        ..Default::default()
    };
    let with = with_ran(&v1, ran, |_| true).expect("fits");
    assert_eq!(with.version, INPUTS_VERSION);
    assert_eq!(INPUTS_VERSION, 2);
    assert_eq!(with.sha256(), v1.sha256(), "what ran is not in the hash");
    let again = parse(&with.to_json_bytes(), NS, SUFFIX).expect("version 2 is read");
    assert_eq!(again, with);
}

#[test]
fn recording_an_identity_writes_version_3_and_leaves_the_hash() {
    let v1 = parse_value(&example()).unwrap();
    let used = IdentityUse {
        name: "team-a".into(),
        secret_resource_version: Some("42".into()),
    };
    let with = v1.with_identity(Some(used.clone()));
    assert_eq!(with.version, INPUTS_VERSION_IDENTITY);
    assert_eq!(with.identity.as_ref(), Some(&used));
    assert_eq!(
        with.sha256(),
        v1.sha256(),
        "who runs the module is not in the hash"
    );
    let again = parse(&with.to_json_bytes(), NS, SUFFIX).expect("version 3 is read");
    assert_eq!(again, with);
    // Recording what ran after it keeps version 3: an older CAPTF still refuses them.
    let ran = with_ran(&with, Ran::default(), |_| true).expect("fits");
    assert_eq!(ran.version, INPUTS_VERSION_IDENTITY);
    assert_eq!(ran.identity.as_ref(), Some(&used));
    // None: as they were.
    assert_eq!(v1.with_identity(None), v1);
}

#[test]
fn another_version_is_unusable() {
    let mut v = example();
    v["version"] = json!(4);
    let msg = unusable(v);
    assert!(msg.contains("unsupported version 4"), "{msg}");
    assert!(msg.contains("versions 1 to 3"), "{msg}");
    assert!(msg.contains("captf-inputs-web-1.tfm"), "{msg}");
    let mut v = example();
    v["version"] = json!(0);
    assert!(unusable(v).contains("unsupported version 0"));
    let mut v = example();
    v["version"] = json!("1");
    assert!(unusable(v).contains("unsupported version \"1\""));
    let mut v = example();
    v.as_object_mut().unwrap().remove("version");
    assert!(unusable(v).contains("missing required field `version`"));
}

#[test]
fn a_missing_required_field_is_unusable() {
    for field in ["runner", "module", "backend"] {
        let mut v = example();
        v.as_object_mut().unwrap().remove(field);
        let msg = unusable(v);
        assert!(
            msg.contains(&format!("missing required field `{field}`")),
            "{msg}"
        );
        assert!(msg.contains("team-a/captf-inputs-web-1.tfm"), "{msg}");
    }
}

#[test]
fn a_foreign_backend_is_unusable() {
    let mut v = example();
    v["backend"]["namespace"] = json!("team-b");
    let msg = unusable(v);
    assert!(
        msg.contains("\"team-b\"") && msg.contains("instead of the object's own \"team-a\""),
        "{msg}"
    );
    let mut v = example();
    v["backend"]["secretSuffix"] = json!("web-2.tfm");
    let msg = unusable(v);
    assert!(
        msg.contains("\"web-2.tfm\"") && msg.contains("\"web-1.tfm\""),
        "{msg}"
    );
    let mut v = example();
    v["backend"] = json!({ "namespace": "team-a" });
    let msg = unusable(v);
    assert!(
        msg.contains("field `backend`") && msg.contains("secretSuffix"),
        "{msg}"
    );
}

#[test]
fn a_module_needs_exactly_one_of_source_files_and_path() {
    let mut v = example();
    v["module"]["files"] = json!({"main.tf": ""});
    assert!(unusable(v).contains("more than one of `source`, `files` and `path`"));
    let mut v = example();
    v["module"] = json!({});
    assert!(unusable(v).contains("none of `source`, `files` and `path`"));
    let mut v = example();
    v["module"] = json!({"source": ""});
    assert!(unusable(v).contains("`module.source` is empty"));
}

#[test]
fn too_large_and_not_json_are_unusable() {
    let big = vec![b' '; INPUTS_MAX_BYTES + 1];
    let msg = parse(&big, NS, SUFFIX).unwrap_err().to_string();
    assert!(msg.contains("larger than the limit"), "{msg}");
    let msg = parse(b"{not json", NS, SUFFIX).unwrap_err().to_string();
    assert!(msg.contains("not JSON"), "{msg}");
    let msg = parse(b"[1]", NS, SUFFIX).unwrap_err().to_string();
    assert!(msg.contains("not a JSON object"), "{msg}");
    let mut v = example();
    v["variables"] = json!([1, 2]);
    assert!(unusable(v).contains("field `variables` is invalid"));
}

#[test]
fn bad_module_file_names_are_unusable() {
    for (name, why) in [
        ("", "empty"),
        ("/etc/passwd", "absolute"),
        ("../x.tf", "`..`"),
        ("a/../../x.tf", "`..`"),
        ("a//b.tf", "empty or `.`"),
        ("./a.tf", "empty or `.`"),
    ] {
        let mut v = example();
        v["module"] = json!({ "files": { name: "x" } });
        let msg = unusable(v);
        assert!(
            msg.contains("module file name") && msg.contains(why),
            "{name}: {msg}"
        );
    }
    let mut v = example();
    v["module"] = json!({ "files": { "main.tf": "", "sub/vars.tf": "", "a..b.tf": "" } });
    assert!(parse_value(&v).is_ok());
}

#[test]
fn from_secret_reads_the_inputs_key() {
    let i = parse_value(&example()).unwrap();
    let owner = crate::api::labels::Identity {
        kind: Kind::TerraformMachine,
        name: "web-1",
        uid: "u-1",
        namespace: NS,
    };
    let s = inputs_secret(&i, &owner);
    assert_eq!(from_secret(&s, NS, SUFFIX).unwrap(), i);
    let empty = Secret::default();
    assert!(
        from_secret(&empty, NS, SUFFIX)
            .unwrap_err()
            .to_string()
            .contains("`inputs.json` is missing")
    );
}

#[test]
fn the_inputs_secret_carries_finalizer_move_and_owner_labels_and_no_owner_reference() {
    let i = parse_value(&example()).unwrap();
    let owner = crate::api::labels::Identity {
        kind: Kind::TerraformMachine,
        name: "web-1",
        uid: "u-1",
        namespace: NS,
    };
    let s = inputs_secret(&i, &owner);
    assert_eq!(s.metadata.name.as_deref(), Some("captf-inputs-web-1.tfm"));
    assert_eq!(s.metadata.namespace.as_deref(), Some(NS));
    assert_eq!(
        s.metadata.finalizers,
        Some(vec![names::PROTECT_FINALIZER.to_string()])
    );
    assert!(s.metadata.owner_references.is_none());
    let labels = s.metadata.labels.unwrap();
    assert_eq!(labels[names::CLUSTERCTL_MOVE_LABEL], "");
    assert_eq!(labels[names::LABEL_OWNER_KIND], "TerraformMachine");
    assert_eq!(labels[names::LABEL_OWNER_NAME], "web-1");
    assert_eq!(labels[names::LABEL_OWNER_UID], "u-1");
}

fn spec() -> TerraformSpec {
    TerraformSpec {
        module: ModuleSpec {
            source: None,
            files: Some(BTreeMap::from([("main.tf".into(), "# main".into())])),
            path: None,
        },
        variables: Some(
            json!({"b": "spec", "d": "spec"})
                .as_object()
                .unwrap()
                .clone(),
        ),
        variables_from: vec![
            VariablesFrom {
                kind: VariablesSourceKind::ConfigMap,
                name: "base".into(),
                key: "vars.json".into(),
            },
            VariablesFrom {
                kind: VariablesSourceKind::Secret,
                name: "secret-vars".into(),
                key: "v".into(),
            },
        ],
        env: vec![EnvFromSecret {
            name: "TOKEN".into(),
            secret_key_ref: SecretKeyRef {
                name: "creds".into(),
                key: "token".into(),
            },
        }],
        runner: RunnerSpec {
            image: "example/terraform:1".into(),
            timeout_seconds: 120,
            plugin_dir: None,
            runtime: None,
            service_account: None,
        },
        identity_ref: None,
        lock_file: Some("# lock".into()),
    }
}

fn lookup(kind: VariablesSourceKind, name: &str, key: &str) -> Option<Vec<u8>> {
    match (kind, name, key) {
        (VariablesSourceKind::ConfigMap, "base", "vars.json") => {
            Some(br#"{"a":"cm","b":"cm","c":"cm"}"#.to_vec())
        }
        (VariablesSourceKind::Secret, "secret-vars", "v") => {
            Some(br#"{"c":"secret","d":"secret"}"#.to_vec())
        }
        (VariablesSourceKind::ConfigMap, "list", "v") => Some(b"[1]".to_vec()),
        _ => None,
    }
}

#[test]
fn build_from_spec_merges_variables_from_in_order_then_variables() {
    let i = build_from_spec(&spec(), NS, SUFFIX, &lookup).unwrap();
    assert_eq!(
        Value::Object(i.variables.clone()),
        json!({"a": "cm", "b": "spec", "c": "secret", "d": "spec"})
    );
    assert_eq!(i.runner.image, "example/terraform:1");
    assert_eq!(i.timeout_seconds, Some(120));
    assert_eq!(i.lock_file.as_deref(), Some("# lock"));
    assert_eq!(i.env, spec().env);
    assert_eq!(
        i.backend,
        Backend {
            namespace: NS.into(),
            secret_suffix: SUFFIX.into()
        }
    );
    assert_eq!(
        i.module,
        Module::Files(BTreeMap::from([("main.tf".into(), "# main".into())]))
    );
    // And what it builds is usable as parsed inputs.
    assert_eq!(parse(&i.to_json_bytes(), NS, SUFFIX).unwrap(), i);
}

#[test]
fn build_from_spec_names_a_missing_source_or_a_non_object_value() {
    let mut s = spec();
    s.variables_from[1].key = "other".into();
    let msg = build_from_spec(&s, NS, SUFFIX, &lookup)
        .unwrap_err()
        .to_string();
    assert!(
        msg.contains("Secret") && msg.contains("\"secret-vars\"") && msg.contains("\"other\""),
        "{msg}"
    );
    let mut s = spec();
    s.variables_from[0].name = "gone".into();
    let msg = build_from_spec(&s, NS, SUFFIX, &lookup)
        .unwrap_err()
        .to_string();
    assert!(
        msg.contains("ConfigMap") && msg.contains("\"gone\"") && msg.contains("does not exist"),
        "{msg}"
    );
    let mut s = spec();
    s.variables_from[0] = VariablesFrom {
        kind: VariablesSourceKind::ConfigMap,
        name: "list".into(),
        key: "v".into(),
    };
    let msg = build_from_spec(&s, NS, SUFFIX, &lookup)
        .unwrap_err()
        .to_string();
    assert!(
        msg.contains("not a JSON object") && msg.contains("an array"),
        "{msg}"
    );
    let mut s = spec();
    s.module.source = Some("x".into());
    assert!(matches!(
        build_from_spec(&s, NS, SUFFIX, &lookup),
        Err(InputsError::ModuleBoth { .. })
    ));
}

#[test]
fn the_rebuilt_hash_matches_what_the_inputs_secret_holds_and_a_changed_variable_does_not() {
    let i = build_from_spec(&spec(), NS, SUFFIX, &lookup).unwrap();
    let owner = crate::api::labels::Identity {
        kind: Kind::TerraformCluster,
        name: "c",
        uid: "u",
        namespace: NS,
    };
    let written = inputs_secret(&i, &owner);
    let bytes = &written.data.unwrap()[names::INPUTS_KEY].0;
    let recorded = parse(bytes, NS, SUFFIX).unwrap().sha256();
    let rebuilt = build_from_spec(&spec(), NS, SUFFIX, &lookup).unwrap();
    assert!(rebuilt_matches(&rebuilt, Some(&recorded)));
    assert!(rebuilt_matches(&rebuilt, None));
    let mut changed = spec();
    changed
        .variables
        .as_mut()
        .unwrap()
        .insert("region".into(), json!("eu-west-1"));
    let changed = build_from_spec(&changed, NS, SUFFIX, &lookup).unwrap();
    assert!(!rebuilt_matches(&changed, Some(&recorded)));
    assert_eq!(recorded.len(), 64);
}

#[test]
fn canonical_bytes_sort_map_keys_whatever_the_insertion_order() {
    let mut a = parse_value(&example()).unwrap();
    let mut b = a.clone();
    a.variables = Map::new();
    b.variables = Map::new();
    for k in ["z", "a", "m"] {
        a.variables.insert(k.into(), json!({"y": 1, "b": 2}));
    }
    for k in ["m", "a", "z"] {
        b.variables.insert(k.into(), json!({"b": 2, "y": 1}));
    }
    assert_eq!(a.to_json_bytes(), b.to_json_bytes());
    let text = String::from_utf8(a.to_json_bytes()).unwrap();
    assert!(text.find("\"a\"").unwrap() < text.find("\"m\"").unwrap());
    assert!(text.find("\"m\"").unwrap() < text.find("\"z\"").unwrap());
}

#[test]
fn long_owner_names_give_valid_label_values() {
    let long = "n".repeat(200);
    let v = name_label_value(&long);
    assert!(v.len() <= 63, "{v}");
    assert_eq!(name_label_value("web-1"), "web-1");
}

#[test]
fn an_invalid_value_deep_in_a_field_is_named_by_its_path() {
    let mut v = example();
    v["env"] = json!([
        { "name": "A", "secretKeyRef": { "name": "aws-creds", "key": "id" } },
        { "name": "B", "secretKeyRef": { "name": "aws-creds", "key": 7 } }
    ]);
    let e = parse_value(&v).expect_err("a number for a key");
    let InputsError::InvalidField { field, .. } = &e else {
        panic!("{e}");
    };
    assert_eq!(field, "env[1].secretKeyRef.key", "{e}");
    let mut v = example();
    v["timeoutSeconds"] = json!("an hour");
    let e = parse_value(&v).expect_err("a string for a number");
    assert!(
        matches!(&e, InputsError::InvalidField { field, .. } if field == "timeoutSeconds"),
        "{e}"
    );
}

#[test]
fn the_contract_prefix_is_reserved_for_the_contract_variables() {
    let mut spec = spec();
    spec.variables
        .get_or_insert_default()
        .insert("captf_tags".into(), serde_json::json!({"a": "b"}));
    let err = build_from_spec(&spec, NS, SUFFIX, &lookup).unwrap_err();
    assert!(
        err.to_string()
            .contains("field `variables.captf_tags` is invalid: the prefix captf_ is reserved"),
        "{err}"
    );
    // Read back from a Secret, the contract's are kept apart and checked.
    let mut inputs = build_from_spec(&self::spec(), NS, SUFFIX, &lookup).unwrap();
    inputs
        .contract_variables
        .insert("captf_contract".into(), serde_json::json!("v1"));
    let back = parse(&inputs.to_json_bytes(), NS, SUFFIX).unwrap();
    assert_eq!(back, inputs);
    inputs
        .contract_variables
        .insert("region".into(), serde_json::json!("x"));
    let err = parse(&inputs.to_json_bytes(), NS, SUFFIX).unwrap_err();
    assert!(
        err.to_string().contains("contractVariables.region"),
        "{err}"
    );
}

#[test]
fn what_an_apply_ran_is_what_the_jobs_run_and_is_checked() {
    let hex = "ab".repeat(32);
    let digest = format!("docker.io/hashicorp/terraform@sha256:{hex}");
    let mut v = example();
    v["lockFile"] = json!(null);
    v["ran"] = json!({
        "imageDigest": digest,
        "moduleFiles": {"main.tf": "# fetched\n"},
        "lockFile": "# the lock init wrote\n"
    });
    let i = parse_value(&v).unwrap();
    assert_eq!(i.run_image(), digest);
    assert_eq!(
        i.run_module().as_ref(),
        &Module::Files([("main.tf".to_string(), "# fetched\n".to_string())].into())
    );
    assert_eq!(i.run_lock_file(), Some("# the lock init wrote\n"));
    assert_eq!(i.run_installed_modules(), None);
    let mut asked = example();
    asked["lockFile"] = json!(null);
    assert_eq!(
        i.sha256(),
        parse_value(&asked).unwrap().sha256(),
        "not part of the hash"
    );
    // Nothing recorded: the inputs as given.
    let plain = parse_value(&example()).unwrap();
    assert_eq!(plain.run_image(), "hashicorp/terraform:1.11.4");
    assert!(matches!(plain.run_module().as_ref(), Module::Source(_)));
    for (field, bad) in [
        ("imageDigest", json!("hashicorp/terraform:1.11.4")),
        ("imageDigest", json!("x@sha256:ABC")),
        ("moduleFiles", json!({"../main.tf": ""})),
        ("moduleFiles", json!({})),
        (
            "installedModules",
            json!({"inner/main.tf": "# no manifest\n"}),
        ),
        (
            "installedModules",
            json!({"modules.json": "{}", "/etc/passwd": ""}),
        ),
    ] {
        let mut v = example();
        v["ran"] = json!({ field: bad });
        let msg = unusable(v);
        assert!(msg.contains(&format!("ran.{field}")), "{msg}");
    }
}

#[test]
fn what_ran_is_kept_only_as_far_as_the_destroy_can_still_read_and_render_it() {
    let digest = format!("docker.io/hashicorp/terraform@sha256:{}", "cd".repeat(32));
    let record = Ran {
        image_digest: Some(digest.clone()),
        module_files: Some([("main.tf".to_string(), "# fetched\n".to_string())].into()),
        lock_file: Some("# lock\n".into()),
        installed_modules: Some(
            [
                ("modules.json".to_string(), "{}".to_string()),
                ("inner/main.tf".to_string(), "# inner\n".to_string()),
            ]
            .into(),
        ),
    };
    let mut v = example();
    v["lockFile"] = json!(null);
    let inputs = parse_value(&v).unwrap();
    // Everything fits.
    let all = with_ran(&inputs, record.clone(), |_| true).unwrap();
    assert_eq!(all.ran.as_ref(), Some(&record));
    // The installed modules would not render: left out first, the rest kept.
    let no_installed = with_ran(&inputs, record.clone(), |i| {
        i.ran
            .as_ref()
            .is_some_and(|r| r.installed_modules.is_none())
    })
    .unwrap();
    let kept = no_installed.ran.unwrap();
    assert!(kept.installed_modules.is_none() && kept.module_files.is_some());
    // The files would not render (too large for the Pod's annotations): left out next.
    let no_files = with_ran(&inputs, record.clone(), |i| {
        i.ran.as_ref().is_some_and(|r| r.module_files.is_none())
    })
    .unwrap();
    let kept = no_files.ran.unwrap();
    assert_eq!(
        (
            kept.module_files,
            kept.installed_modules,
            kept.lock_file.as_deref()
        ),
        (None, None, Some("# lock\n"))
    );
    // Inputs already near their size limit: nothing large is added.
    let mut big = example();
    big["lockFile"] = json!(null);
    big["variables"]["blob"] = json!("x".repeat(INPUTS_MAX_BYTES - 2_000));
    let big = parse_value(&big).unwrap();
    let huge = Ran {
        module_files: Some([("main.tf".to_string(), "y".repeat(10_000))].into()),
        ..record.clone()
    };
    let fitted = with_ran(&big, huge, |_| true).unwrap();
    let kept = fitted.ran.clone().unwrap();
    assert!(kept.module_files.is_none() && kept.image_digest.is_some());
    assert!(fitted.to_json_bytes().len() <= INPUTS_MAX_BYTES);
    // Nothing renders: no record at all.
    assert_eq!(with_ran(&inputs, record, |_| false), None);
}

#[test]
fn a_module_in_the_runner_image_and_its_providers_are_absolute_directories() {
    let mut v = example();
    v["module"] = json!({"path": "/modules/vm"});
    v["runner"]["pluginDir"] = json!("/providers");
    let i = parse_value(&v).unwrap();
    assert_eq!(i.module, Module::Path("/modules/vm".into()));
    assert_eq!(i.runner.plugin_dir.as_deref(), Some("/providers"));
    for (field, bad) in [
        ("module.path", json!({"module": {"path": "modules/vm"}})),
        (
            "module.path",
            json!({"module": {"path": "/modules/../etc"}}),
        ),
        (
            "runner.pluginDir",
            json!({"runner": {"image": "x", "pluginDir": "providers"}}),
        ),
    ] {
        let mut v = example();
        for (k, val) in bad.as_object().unwrap() {
            v[k] = val.clone();
        }
        let msg = unusable(v);
        assert!(msg.contains(field), "{msg}");
    }
    let mut v = example();
    v["module"] = json!({"source": "x", "path": "/m"});
    assert!(unusable(v).contains("more than one of `source`, `files` and `path`"));
}

#[test]
fn an_operators_runner_image_replaces_the_digest_the_apply_ran() {
    let mut i = parse(
        br#"{"version":2,"runner":{"image":"hashicorp/terraform:1.11.4"},"module":{"source":"git::https://example.com/m.git"},"backend":{"namespace":"team-a","secretSuffix":"web-1.tfm"},
            "ran":{"imageDigest":"docker.io/hashicorp/terraform@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"}}"#,
        "team-a",
        "web-1.tfm",
    )
    .unwrap();
    assert!(
        i.run_image().contains("@sha256:"),
        "the digest the apply ran"
    );
    let replaced = i.with_runner_image(" registry.example.com/terraform:1.11.4 ");
    assert_eq!(
        replaced.run_image(),
        "registry.example.com/terraform:1.11.4"
    );
    assert_eq!(i.with_runner_image("  ").run_image(), i.run_image());
    i.ran = None;
    assert_eq!(i.with_runner_image("x:1").run_image(), "x:1");
}
