//! The scheduler: every Pod without a node that asks for the default scheduler is bound
//! to the one Node, oldest first, unless its `nodeSelector` does not match the Node's
//! labels or the Node already holds `--max-pods` unfinished Pods; then it stays Pending
//! with `PodScheduled=False`, reason `Unschedulable`, as the real scheduler leaves it,
//! and is bound once a Pod of the Node finishes. Resources, taints and affinity are not
//! considered.

use std::collections::BTreeMap;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Patch, PatchParams, PostParams};
use kube::runtime::watcher;
use kube::{Api, Client, ResourceExt};
use serde_json::json;

use crate::say;

/// Whether the pod asks for a scheduler other than the default one.
fn other_scheduler(pod: &Pod) -> bool {
    pod.spec
        .as_ref()
        .and_then(|s| s.scheduler_name.as_deref())
        .is_some_and(|n| n != "default-scheduler")
}

fn selector_matches(pod: &Pod, node_labels: &BTreeMap<String, String>) -> bool {
    pod.spec
        .as_ref()
        .and_then(|s| s.node_selector.as_ref())
        .is_none_or(|sel| sel.iter().all(|(k, v)| node_labels.get(k) == Some(v)))
}

/// Pods the scheduler knows: pending ones (no node) and those bound to the Node.
#[derive(Default)]
struct View {
    pending: BTreeMap<String, Pod>,
    /// Unfinished Pods on the Node, by uid.
    on_node: std::collections::BTreeSet<String>,
}

fn finished(pod: &Pod) -> bool {
    matches!(
        pod.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Succeeded" | "Failed")
    )
}

pub async fn run(client: Client, node: String, max_pods: usize) {
    let pods: Api<Pod> = Api::all(client.clone());
    let mut stream = watcher(pods, watcher::Config::default()).boxed();
    let mut view = View::default();
    let mut unschedulable: std::collections::BTreeSet<String> = Default::default();
    while let Some(ev) = stream.next().await {
        match ev {
            Ok(watcher::Event::Apply(p) | watcher::Event::InitApply(p)) => {
                let uid = p.metadata.uid.clone().unwrap_or_default();
                let bound = p.spec.as_ref().and_then(|s| s.node_name.as_deref());
                view.pending.remove(&uid);
                view.on_node.remove(&uid);
                if bound == Some(node.as_str()) {
                    // A Pod still holds its place until it is terminal (or gone).
                    if !finished(&p) {
                        view.on_node.insert(uid);
                    }
                } else if bound.is_none()
                    && !finished(&p)
                    && p.metadata.deletion_timestamp.is_none()
                    && !other_scheduler(&p)
                {
                    view.pending.insert(uid, p);
                }
            }
            Ok(watcher::Event::Delete(p)) => {
                let uid = p.metadata.uid.clone().unwrap_or_default();
                view.pending.remove(&uid);
                view.on_node.remove(&uid);
                unschedulable.remove(&uid);
            }
            Ok(watcher::Event::Init) => view = View::default(),
            Ok(watcher::Event::InitDone) => {}
            Err(e) => {
                say!("scheduler: watching Pods: {e}");
                tokio::time::sleep(std::time::Duration::from_secs(1)).await;
                continue;
            }
        }
        // Oldest first, while the Node has room.
        let mut queue: Vec<Pod> = view
            .pending
            .values()
            .filter(|p| {
                let reported =
                    unschedulable.contains(p.metadata.uid.as_deref().unwrap_or_default());
                !(reported && view.on_node.len() >= max_pods)
            })
            .cloned()
            .collect();
        if queue.is_empty() {
            continue;
        }
        queue.sort_by_key(|p| p.metadata.creation_timestamp.clone().map(|t| t.0));
        let node_labels = match Api::<Node>::all(client.clone()).get(&node).await {
            Ok(n) => n.metadata.labels.unwrap_or_default(),
            Err(e) => {
                say!("scheduler: reading Node {node}: {e}");
                continue;
            }
        };
        for pod in queue {
            let uid = pod.metadata.uid.clone().unwrap_or_default();
            let full = view.on_node.len() >= max_pods;
            let reported = unschedulable.contains(&uid);
            match schedule(&client, &node, &node_labels, &pod, full, reported).await {
                Ok(true) => {
                    view.pending.remove(&uid);
                    view.on_node.insert(uid.clone());
                    unschedulable.remove(&uid);
                }
                Ok(false) => {
                    unschedulable.insert(uid);
                }
                Err(e) => say!(
                    "scheduler: Pod {}/{}: {e}",
                    pod.namespace().unwrap_or_default(),
                    pod.name_any()
                ),
            }
        }
    }
}

/// Binds the Pod, or reports it Unschedulable (once: `reported`); true when bound.
async fn schedule(
    client: &Client,
    node: &str,
    node_labels: &BTreeMap<String, String>,
    pod: &Pod,
    full: bool,
    reported: bool,
) -> Result<bool, kube::Error> {
    let ns = pod.namespace().unwrap_or_default();
    let name = pod.name_any();
    let api: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let why = if !selector_matches(pod, node_labels) {
        Some("0/1 nodes are available: 1 node(s) didn't match Pod's node affinity/selector.")
    } else if full {
        Some("0/1 nodes are available: 1 Too many pods.")
    } else {
        None
    };
    if let Some(why) = why {
        if !reported {
            let patch = json!({"status": {"conditions": [{
                "type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                "message": why,
                "lastTransitionTime": jiff::Timestamp::now().strftime("%Y-%m-%dT%H:%M:%SZ").to_string(),
            }]}});
            api.patch_status(&name, &PatchParams::default(), &Patch::Strategic(patch))
                .await?;
        }
        return Ok(false);
    }
    let binding = json!({
        "apiVersion": "v1", "kind": "Binding",
        "metadata": {"name": name, "namespace": ns, "uid": pod.metadata.uid},
        "target": {"apiVersion": "v1", "kind": "Node", "name": node},
    });
    match api
        .create_subresource::<_, serde_json::Value>(
            "binding",
            &name,
            &PostParams::default(),
            &binding,
        )
        .await
    {
        Ok(_) => Ok(true),
        // Already bound, or gone: nothing to do.
        Err(kube::Error::Api(s)) if s.code == 409 || s.code == 404 => Ok(true),
        Err(e) => Err(e),
    }
}
