//! The Node: registered once (created, or its status refreshed when it exists), then
//! kept alive as a kubelet does: its Lease in `kube-node-lease` renewed every 10 seconds,
//! its Ready condition's heartbeat every minute.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, Client};
use serde_json::{Value, json};

use crate::{Args, say};

const LEASE_NAMESPACE: &str = "kube-node-lease";
const LEASE_SECONDS: i32 = 40;

fn now() -> String {
    jiff::Timestamp::now()
        .strftime("%Y-%m-%dT%H:%M:%SZ")
        .to_string()
}

fn read_first_line(path: &str) -> String {
    std::fs::read_to_string(path)
        .ok()
        .and_then(|s| s.lines().next().map(|l| l.trim().to_string()))
        .unwrap_or_default()
}

fn memory_kib() -> u64 {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("MemTotal:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|n| n.parse().ok())
        })
        .unwrap_or(0)
}

/// The Node's status as a kubelet reports it.
fn node_status(args: &Args) -> Value {
    let now = now();
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    let resources = json!({
        "cpu": cpus.to_string(),
        "memory": format!("{}Ki", memory_kib()),
        "pods": args.max_pods.to_string(),
        "ephemeral-storage": "100Gi",
    });
    let condition = |type_: &str, status: &str, reason: &str, message: &str| {
        json!({"type": type_, "status": status, "reason": reason, "message": message,
               "lastHeartbeatTime": now, "lastTransitionTime": now})
    };
    json!({
        "capacity": resources,
        "allocatable": resources,
        "conditions": [
            condition("MemoryPressure", "False", "KubeletHasSufficientMemory", "kubelet has sufficient memory available"),
            condition("DiskPressure", "False", "KubeletHasNoDiskPressure", "kubelet has no disk pressure"),
            condition("PIDPressure", "False", "KubeletHasSufficientPID", "kubelet has sufficient PID available"),
            condition("Ready", "True", "KubeletReady", "kubelet is posting ready status (captf-kubelet: Pods run as local processes)"),
        ],
        "addresses": [
            {"type": "InternalIP", "address": args.address},
            {"type": "Hostname", "address": args.node_name},
        ],
        "daemonEndpoints": {"kubeletEndpoint": {"Port": args.port}},
        "nodeInfo": {
            "machineID": read_first_line("/etc/machine-id"),
            "systemUUID": read_first_line("/etc/machine-id"),
            "bootID": read_first_line("/proc/sys/kernel/random/boot_id"),
            "kernelVersion": read_first_line("/proc/sys/kernel/osrelease"),
            "osImage": "captf-kubelet (the host's programs)",
            "containerRuntimeVersion": "captf-kubelet://0.1.0",
            "kubeletVersion": "v1.37.2",
            "kubeProxyVersion": "",
            "operatingSystem": "linux",
            "architecture": "amd64",
        },
    })
}

/// Creates the Node (or takes over the one of this name) and reports it Ready.
pub async fn register(client: &Client, args: &Args) -> Result<(), kube::Error> {
    let api: Api<Node> = Api::all(client.clone());
    if api.get_opt(&args.node_name).await?.is_none() {
        let node: Node = serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Node",
            "metadata": {"name": args.node_name, "labels": {
                "kubernetes.io/hostname": args.node_name,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
            }},
            "spec": {},
        }))
        .expect("node");
        match api.create(&PostParams::default(), &node).await {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 409 => {}
            Err(e) => return Err(e),
        }
    }
    api.patch_status(
        &args.node_name,
        &PatchParams::default(),
        &Patch::Merge(json!({"status": node_status(args)})),
    )
    .await?;
    renew_lease(client, args).await
}

async fn renew_lease(client: &Client, args: &Args) -> Result<(), kube::Error> {
    let api: Api<Lease> = Api::namespaced(client.clone(), LEASE_NAMESPACE);
    let renew = jiff::Timestamp::now()
        .strftime("%Y-%m-%dT%H:%M:%S%.6fZ")
        .to_string();
    let spec = json!({"holderIdentity": args.node_name, "leaseDurationSeconds": LEASE_SECONDS, "renewTime": renew});
    match api.get_opt(&args.node_name).await? {
        Some(_) => {
            api.patch(
                &args.node_name,
                &PatchParams::default(),
                &Patch::Merge(json!({ "spec": spec })),
            )
            .await?;
        }
        None => {
            let node: Node = Api::<Node>::all(client.clone())
                .get(&args.node_name)
                .await?;
            let lease: Lease = serde_json::from_value(json!({
                "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                "metadata": {"name": args.node_name, "namespace": LEASE_NAMESPACE,
                    "ownerReferences": [{"apiVersion": "v1", "kind": "Node", "name": args.node_name,
                        "uid": node.metadata.uid}]},
                "spec": spec,
            }))
            .expect("lease");
            api.create(&PostParams::default(), &lease).await?;
        }
    }
    Ok(())
}

/// Renews the Lease every 10 seconds and the Node's conditions every minute.
pub async fn heartbeat(client: Client, args: Args) {
    let mut n: u64 = 0;
    loop {
        tokio::time::sleep(Duration::from_secs(10)).await;
        n += 1;
        if let Err(e) = renew_lease(&client, &args).await {
            say!("renewing the Node's Lease: {e}");
        }
        if n.is_multiple_of(6) {
            let api: Api<Node> = Api::all(client.clone());
            if let Err(e) = api
                .patch_status(
                    &args.node_name,
                    &PatchParams::default(),
                    &Patch::Merge(json!({"status": node_status(&args)})),
                )
                .await
            {
                say!("updating the Node's status: {e}");
            }
        }
    }
}
