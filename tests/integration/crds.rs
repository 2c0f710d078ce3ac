//! The CRD YAML under crds/ is the output of `captf crds`: the three kinds, their three
//! templates and the identity kind.

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
        "TerraformClusterTemplate",
        "TerraformMachineTemplate",
        "TerraformMachinePoolTemplate",
        "TerraformClusterIdentity",
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
        7,
        "the CAPI contract label on each CRD"
    );
    // clusterctl move discovers only kinds whose CRD carries this label; `clusterctl init`
    // adds it, and a kustomize install must have it too, or a move leaves the objects
    // behind for the garbage collector.
    assert_eq!(
        printed
            .matches("clusterctl.cluster.x-k8s.io: \"\"\n")
            .count(),
        7,
        "the clusterctl label on each CRD"
    );
    // The identity kind also carries clusterctl's move-hierarchy label: a move copies each
    // identity with the Secret it owns.
    assert_eq!(
        printed
            .matches("clusterctl.cluster.x-k8s.io/move-hierarchy: \"\"\n")
            .count(),
        1,
        "the move-hierarchy label on the identity's CRD"
    );
    for short in [
        "- tfc\n",
        "- tfm\n",
        "- tfmp\n",
        "- tfct\n",
        "- tfmt\n",
        "- tfmpt\n",
        "- tfci\n",
    ] {
        assert!(printed.contains(short), "short name {short}");
    }
}

/// Each kind's CRD serves its own status fields: the API server prunes another kind's
/// (a cluster's `failureDomains` written on a machine), and keeps the kind's own.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_api_server_prunes_a_status_field_of_another_kind() {
    use captf::api::{TerraformCluster, TerraformMachine};
    use kube::api::{Patch, PatchParams};
    use serde_json::json;

    let env = crate::support::Env::builder("status-per-kind")
        .start()
        .await;
    let uid = env.create_cluster("prod").await;
    env.create_object::<TerraformMachine>("web-1", "prod", &uid, &env.markers())
        .await;
    env.create_object::<TerraformCluster>("prod", "prod", &uid, &env.markers())
        .await;
    let both = json!({"status": {
        "failureDomains": [{"name": "az-1", "controlPlane": true}],
        "addresses": [{"type": "InternalIP", "address": "10.0.1.1"}]
    }});
    let machine = env
        .api::<TerraformMachine>()
        .patch_status("web-1", &PatchParams::default(), &Patch::Merge(&both))
        .await
        .expect("the machine's status");
    let status = machine.status.expect("status");
    assert_eq!(status.addresses.len(), 1, "a machine's own field is kept");
    assert!(
        status.failure_domains.is_empty(),
        "a cluster's field is pruned from a machine"
    );
    let cluster = env
        .api::<TerraformCluster>()
        .patch_status("prod", &PatchParams::default(), &Patch::Merge(&both))
        .await
        .expect("the cluster's status");
    let status = cluster.status.expect("status");
    assert_eq!(
        status.failure_domains.len(),
        1,
        "a cluster's own field is kept"
    );
    assert!(
        status.addresses.is_empty(),
        "a machine's field is pruned from a cluster"
    );
    env.shutdown().await;
}

/// The columns of `kubectl get` (the CRDs' printer columns), on the real API server with
/// objects the manager applied: what is provisioned, a pool's replicas, and in `-o wide`
/// whether an object is paused.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn kubectl_get_shows_provisioning_replicas_and_pause() {
    use captf::api::{TerraformCluster as Tfc, TerraformMachinePool as Tfmp};

    use crate::support::*;

    let env = Env::builder("printer-columns").provisioning().start().await;
    env.create_cluster("prod").await;
    env.provision::<Tfc>("prod", "prod", &apply_module(0)).await;
    env.mark_cluster_ready("prod").await;
    env.provision::<Tfmp>("pool", "prod", &apply_module(0))
        .await;
    let get = |args: &[&str]| {
        let out = Command::new("kubectl")
            .arg("--kubeconfig")
            .arg(env.kubeconfig_path())
            .args(["get", "-n", &env.ns])
            .args(args)
            .output()
            .expect("kubectl");
        assert!(
            out.status.success(),
            "kubectl get {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        // The header's names, and each row's values cut at the header's columns (kubectl
        // aligns them; an empty value is blank).
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let mut lines = text.lines();
        let header = lines.next().expect("a header").to_string();
        let starts: Vec<usize> = header
            .char_indices()
            .filter(|&(i, c)| c != ' ' && (i == 0 || header.as_bytes()[i - 1] == b' '))
            .map(|(i, _)| i)
            .collect();
        let cut = |line: &str| -> Vec<String> {
            starts
                .iter()
                .enumerate()
                .map(|(k, &s)| {
                    let e = starts
                        .get(k + 1)
                        .copied()
                        .unwrap_or(line.len())
                        .min(line.len());
                    line.get(s.min(line.len())..e)
                        .unwrap_or("")
                        .trim()
                        .to_string()
                })
                .collect()
        };
        let mut table = vec![cut(&header)];
        table.extend(lines.map(cut));
        table
    };
    let column = |table: &[Vec<String>], name: &str| -> String {
        let i = table[0]
            .iter()
            .position(|h| h == name)
            .unwrap_or_else(|| panic!("no column {name}: {:?}", table[0]));
        table[1][i].clone()
    };
    // The pool's replicas come from the status the manager writes.
    wait_for("the pool's replicas in its status", long(), || async {
        env.object::<Tfmp>("pool")
            .await
            .and_then(|p| p.status)
            .and_then(|s| s.replicas)
            == Some(2)
    })
    .await;
    let pools = get(&["terraformmachinepools"]);
    assert_eq!(
        pools[0],
        [
            "NAME",
            "CLUSTER",
            "READY",
            "PROVISIONED",
            "REPLICAS",
            "DELETING",
            "STATE",
            "AGE"
        ],
        "{pools:?}"
    );
    assert_eq!(column(&pools, "PROVISIONED"), "Provisioned", "{pools:?}");
    assert_eq!(column(&pools, "REPLICAS"), "2", "{pools:?}");
    assert_eq!(column(&pools, "READY"), "True", "{pools:?}");
    let wide = get(&["terraformclusters", "-o", "wide"]);
    assert_eq!(
        wide[0],
        [
            "NAME",
            "CLUSTER",
            "READY",
            "PROVISIONED",
            "DELETING",
            "STATE",
            "PAUSED",
            "ENDPOINT",
            "AGE"
        ],
        "{wide:?}"
    );
    assert_eq!(column(&wide, "CLUSTER"), "prod", "{wide:?}");
    assert_eq!(column(&wide, "PROVISIONED"), "Provisioned", "{wide:?}");
    assert_eq!(column(&wide, "PAUSED"), "False", "{wide:?}");
    assert_eq!(column(&wide, "DELETING"), "NotDeleting", "{wide:?}");
    assert_eq!(
        column(&wide, "STATE"),
        "",
        "a live object's state is not read: {wide:?}"
    );
    assert_eq!(column(&wide, "ENDPOINT"), "10.0.0.1", "{wide:?}");
    env.shutdown().await;
}
