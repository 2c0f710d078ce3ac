use super::*;

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

#[test]
fn canonical_images_are_accepted_as_clusterctl_accepts_them() {
    let digest = format!("sha256:{}", "a".repeat(64));
    for image in [
        "ghcr.io/captf/captf:v0.1.0".to_string(),
        "ghcr.io/captf/captf".to_string(),
        "docker.io/library/nginx:1.27".to_string(),
        "docker.io/captf/captf:v0.1.0".to_string(),
        "localhost/captf:dev".to_string(),
        "localhost:5000/team/captf:v1".to_string(),
        "127.0.0.1:5000/captf:v1".to_string(),
        "[::1]:5000/captf:v1".to_string(),
        "registry.example.com/a/b__c/d-e.f:1.0_rc".to_string(),
        format!("ghcr.io/captf/captf@{digest}"),
        format!("ghcr.io/captf/captf:v0.1.0@{digest}"),
    ] {
        assert!(
            check_image(&image).is_ok(),
            "{image}: {:?}",
            check_image(&image)
        );
    }
}

#[test]
fn non_canonical_images_are_refused_saying_why() {
    for (image, why) in [
        ("captf:latest", "names no registry"),
        ("captf", "names no registry"),
        ("captf/captf:v0.1.0", "not a registry"),
        ("docker.io/nginx:1.27", "docker.io/library/NAME"),
        ("index.docker.io/library/nginx", "written docker.io"),
        ("ghcr.io/Captf/captf:v1", "lowercase"),
        ("ghcr.io/captf//captf:v1", "lowercase"),
        ("ghcr.io/captf/captf-:v1", "lowercase"),
        ("ghcr.io/captf/captf:", "tag"),
        ("ghcr.io/captf/captf:-x", "tag"),
        ("ghcr.io/captf/captf@sha256:abc", "digest"),
        ("ghcr.io:port/captf", "registry"),
        ("-bad.io/captf", "registry"),
        ("", "empty"),
    ] {
        let err = check_image(image).expect_err(image).to_string();
        assert!(err.contains(why), "{image}: {err}");
        assert!(
            err.contains("must be canonical") && err.contains("ghcr.io/captf/captf:v0.1.0"),
            "{image}: the message names clusterctl's refusal and an example: {err}"
        );
    }
}

#[test]
fn versions_are_semantic_and_of_a_release_series_of_metadata_yaml() {
    assert_eq!(check_version("v0.1.0").expect("v0.1.0").minor, 1);
    assert!(check_version("v0.1.7-rc.1+build.5").is_ok());
    for bad in ["0.1.0", "v0.1", "v0.1.0.1", "latest", "V0.1.0", ""] {
        let err = check_version(bad).expect_err(bad).to_string();
        assert!(err.contains("semantic version with a leading v"), "{err}");
    }
    let err = check_version("v1.0.0")
        .expect_err("no series 1.0")
        .to_string();
    assert!(
        err.contains("no release series 1.0") && err.contains("0.1 (v1beta2)"),
        "{err}"
    );
}

/// `resources` of a kustomization.yaml, as paths from the repository root.
fn resources(dir: &str) -> Vec<String> {
    #[derive(Deserialize)]
    struct Kustomization {
        resources: Vec<String>,
    }
    let text = std::fs::read_to_string(format!("{ROOT}/{dir}/kustomization.yaml"))
        .unwrap_or_else(|e| panic!("{dir}/kustomization.yaml: {e}"));
    let k: Kustomization = serde_saphyr::from_str(&text).expect("kustomization");
    k.resources
        .into_iter()
        .map(|r| {
            let path = std::path::Path::new(dir).join(&r);
            // ../x from config/default is config/x.
            let mut parts: Vec<String> = Vec::new();
            for c in path.components() {
                match c {
                    std::path::Component::ParentDir => {
                        parts.pop();
                    }
                    c => parts.push(c.as_os_str().to_string_lossy().into_owned()),
                }
            }
            parts.join("/")
        })
        .collect()
}

#[test]
fn the_embedded_manifests_are_config_default_s() {
    let mut files = Vec::new();
    for dir in resources("config/default") {
        if dir == "config/crd" {
            // The CRDs: `captf crds` (tests/integration/config.rs checks the copy).
            assert_eq!(resources(&dir), ["config/crd/bases/captf-crds.yaml"]);
            continue;
        }
        files.extend(resources(&dir));
    }
    let mut embedded: Vec<&str> = CONFIG.iter().map(|(p, _)| *p).collect();
    embedded.sort();
    files.sort();
    assert_eq!(embedded, files, "CONFIG must list config/default's files");
    for (path, text) in CONFIG {
        let on_disk = std::fs::read_to_string(format!("{ROOT}/{path}")).expect(path);
        assert_eq!(text, on_disk, "{path}");
    }
}

/// The defaults of the manager's variables are the manifest's values, which are
/// `captf manager`'s own defaults: a release changes nothing an operator did not set.
#[test]
fn the_manifest_gives_the_manager_flags_their_defaults() {
    use clap::Parser;
    let objects = component_objects().expect("objects");
    let deployment = objects
        .iter()
        .find(|o| o["kind"] == "Deployment")
        .expect("Deployment");
    let args: Vec<String> = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
        .as_array()
        .expect("args")
        .iter()
        .map(|a| a.as_str().expect("string").to_string())
        .collect();
    let manifest =
        crate::cli::Cli::try_parse_from(std::iter::once("captf".to_string()).chain(args))
            .expect("the manifest's arguments parse");
    let defaults = crate::cli::Cli::try_parse_from(["captf", "manager"]).expect("defaults");
    let (crate::cli::Command::Manager(m), crate::cli::Command::Manager(d)) =
        (manifest.command, defaults.command)
    else {
        panic!("not the manager");
    };
    assert_eq!(m.concurrency, d.concurrency);
    assert_eq!(m.max_state_reads, d.max_state_reads);
    assert_eq!(m.destroy_backoff_base, d.destroy_backoff_base);
    assert_eq!(m.destroy_backoff_max, d.destroy_backoff_max);
    assert_eq!(m.provision, d.provision);
}

/// Every `${NAME…}` of a text: clusterctl's variables.
fn variables(text: &str) -> Vec<String> {
    let mut names: Vec<String> = text
        .split("${")
        .skip(1)
        .map(|rest| {
            rest.chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect()
        })
        .collect();
    names.sort();
    names.dedup();
    names
}

#[test]
fn the_components_hold_clusterctl_s_rules_and_only_captf_s_variables() {
    let text = components("ghcr.io/captf/captf:v0.1.0").expect("components");
    let mut expected: Vec<String> = MANAGER_VARIABLES
        .iter()
        .map(|v| v.variable.to_string())
        .chain([IMAGE_VARIABLE.to_string()])
        .collect();
    expected.sort();
    assert_eq!(variables(&text), expected);
    let objects: Vec<Value> = serde_saphyr::from_multiple(&text).expect("YAML");
    assert_eq!(
        objects.iter().filter(|o| o["kind"] == "Namespace").count(),
        1
    );
    assert_eq!(objects[0]["kind"], "Namespace", "the Namespace first");
    assert_eq!(
        objects
            .iter()
            .filter(|o| o["kind"] == "CustomResourceDefinition")
            .count(),
        7
    );
    for o in &objects {
        assert_eq!(
            o["metadata"]["labels"][CAPI_PROVIDER_LABEL], CAPI_PROVIDER_NAME,
            "{o}"
        );
    }
    let deployment = objects
        .iter()
        .find(|o| o["kind"] == "Deployment")
        .expect("Deployment");
    let pod = &deployment["spec"]["template"];
    assert_eq!(
        pod["metadata"]["labels"][CAPI_PROVIDER_LABEL],
        CAPI_PROVIDER_NAME
    );
    let manager = &pod["spec"]["containers"][0];
    assert_eq!(manager["name"], CONTAINER);
    assert_eq!(
        manager["image"],
        "${CAPTF_IMAGE:=ghcr.io/captf/captf:v0.1.0}"
    );
    let args = manager["args"].to_string();
    for arg in [
        "--concurrency=${CAPTF_CONCURRENCY:=10}",
        "--max-state-reads=${CAPTF_MAX_STATE_READS:=4}",
        "--destroy-backoff-base=${CAPTF_DESTROY_BACKOFF_BASE:=30s}",
        "--destroy-backoff-max=${CAPTF_DESTROY_BACKOFF_MAX:=30m}",
        "--provision=${CAPTF_PROVISION:=true}",
        "--state-proxy=${CAPTF_STATE_PROXY:=false}",
    ] {
        assert!(args.contains(arg), "{arg} in {args}");
    }
}

#[test]
fn the_assets_are_the_files_clusterctl_reads() {
    let written = assets("v0.1.0", "ghcr.io/captf/captf:v0.1.0").expect("assets");
    let names: Vec<&str> = written.iter().map(|(n, _)| *n).collect();
    assert_eq!(
        names,
        [
            "infrastructure-components.yaml",
            "metadata.yaml",
            "cluster-template.yaml",
            "cluster-template-machinepool.yaml",
            "cluster-template-topology.yaml",
            "clusterclass-terraform.yaml",
            "cluster-template-offline.yaml",
        ]
    );
    // clusterctl's rule for ClusterClasses: no variable in them.
    let class = &written[5].1;
    assert!(!class.contains('$'), "clusterclass-terraform.yaml");
    assert!(assets("v0.1.0", "captf:latest").is_err());
    assert!(assets("0.1.0", "ghcr.io/captf/captf:v0.1.0").is_err());
}

/// The templates' runner image is the one a spec without one gets.
#[test]
fn the_templates_run_the_default_runner_image() {
    for (name, text) in TEMPLATES {
        for (i, _) in text.match_indices("hashicorp/terraform:") {
            let image: String = text[i..]
                .chars()
                .take_while(|c| !c.is_whitespace() && *c != '}' && *c != '"')
                .collect();
            assert_eq!(image, crate::api::DEFAULT_RUNNER_IMAGE, "{name}");
        }
    }
}

/// The machine policy lists every field of a TerraformMachine's spec: a field it lacked
/// could change after creation unseen.
#[test]
fn the_machine_policy_names_every_field_of_the_machine_spec() {
    let (_, policy) = CONFIG
        .iter()
        .find(|(p, _)| p.ends_with("machine_immutability.yaml"))
        .expect("the machine policy");
    let crd = &crate::api::object_crds()[1];
    assert_eq!(crd.spec.names.kind, "TerraformMachine");
    let spec = crd.spec.versions[0]
        .schema
        .as_ref()
        .and_then(|s| s.open_api_v3_schema.as_ref())
        .and_then(|s| s.properties.as_ref())
        .and_then(|p| p.get("spec"))
        .and_then(|s| s.properties.clone())
        .expect("spec properties");
    for field in spec.keys() {
        assert!(
            policy.contains(&format!("object.spec.?{field} == oldObject.spec.?{field}"))
                && policy.contains(&format!("'spec.{field}'")),
            "config/policy/machine_immutability.yaml does not compare spec.{field}"
        );
    }
}
