//! The CRD YAML under crds/ is the output of `captf crds`.

use std::process::Command;

#[test]
fn committed_crds_are_what_the_binary_prints() {
    let out = Command::new(env!("CARGO_BIN_EXE_captf"))
        .arg("crds")
        .output()
        .expect("run captf crds");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let printed = String::from_utf8(out.stdout).expect("utf-8");
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/crds/captf-crds.yaml");
    let committed = std::fs::read_to_string(path).unwrap_or_default();
    assert!(
        printed == committed,
        "crds/captf-crds.yaml differs from `captf crds`; regenerate it with `cargo run -- crds > crds/captf-crds.yaml`"
    );
    for kind in [
        "TerraformCluster",
        "TerraformMachine",
        "TerraformMachinePool",
    ] {
        assert!(
            printed.contains(&format!("kind: {kind}\n")),
            "{kind} missing"
        );
    }
    assert_eq!(
        printed
            .matches("cluster.x-k8s.io/v1beta2: v1alpha1")
            .count(),
        3,
        "the CAPI contract label on each CRD"
    );
    // clusterctl move discovers only kinds whose CRD carries this label; `clusterctl init`
    // adds it, and a kustomize install must have it too, or a move leaves the objects
    // behind for the garbage collector.
    assert_eq!(
        printed
            .matches("clusterctl.cluster.x-k8s.io: \"\"\n")
            .count(),
        3,
        "the clusterctl label on each CRD"
    );
    for short in ["- tfc\n", "- tfm\n", "- tfmp\n"] {
        assert!(printed.contains(short), "short name {short}");
    }
}
