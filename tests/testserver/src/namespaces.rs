//! The namespace lifecycle controller: for a namespace with `deletionTimestamp` (phase
//! `Terminating`, `spec.finalizers: [kubernetes]`) it deletes every object in it (objects with
//! finalizers stay, marked, until their finalizers are removed) and removes the namespace once
//! it is empty. The 403 for creates in a terminating namespace is enforced by the store.
//! Not modelled: the namespace status conditions (`NamespaceContentRemaining`, ...).

use crate::store::{self, DeleteOptions, Propagation, Store};

/// Run the controller until the store's change channel closes or the task is aborted.
pub(crate) async fn run(store: Store) {
    store::run_on_changes(store, pass).await
}

pub(crate) fn pass(store: &Store) {
    let Some(ns_rt) = store.any_type("", "namespaces") else {
        return;
    };
    let terminating: Vec<(String, String)> = store.view_rt(&ns_rt, |o| {
        if !store::is_deleting(o) {
            return None;
        }
        Some((
            store::meta_str(o, "name")?.to_string(),
            store::meta_str(o, "uid")?.to_string(),
        ))
    });
    if terminating.is_empty() {
        return;
    }
    let names: Vec<&str> = terminating.iter().map(|(n, _)| n.as_str()).collect();
    let snapshot = store.snapshot_where(|_, _, ns, _| names.contains(&ns));
    for (ns, uid) in terminating {
        // What discovery finds: instances left in storage by a CRD that is gone are unseen.
        let content: Vec<&(String, String, serde_json::Value)> = snapshot
            .iter()
            .filter(|(g, p, o)| {
                store::meta_str(o, "namespace") == Some(ns.as_str())
                    && store.any_type(g, p).is_some()
            })
            .collect();
        for (g, p, o) in &content {
            if store::is_deleting(o) {
                continue;
            }
            let Some(rt) = store.any_type(g, p) else {
                continue;
            };
            let name = store::meta_str(o, "name").unwrap_or_default();
            let opts = DeleteOptions {
                propagation: Some(Propagation::Background),
                ..Default::default()
            };
            let _ = store.delete_rt(&rt, Some(&ns), name, &opts);
        }
        if content.is_empty() {
            store.force_remove(&ns_rt, None, &ns, &uid);
        }
    }
}
