//! The garbage collector: deletes dependents whose owners (by `ownerReferences[].uid`) are all
//! gone or being deleted in the foreground, drops dangling references from dependents that still
//! have a live owner, and releases the `foregroundDeletion` finalizer once no dependent with
//! `blockOwnerDeletion: true` remains. Runs asynchronously after every store change, as the
//! real controller does (Orphan propagation is applied synchronously by the store instead).

use serde_json::{Value, json};

use crate::store::{self, DeleteOptions, FOREGROUND_FINALIZER, Propagation, Store};

/// Run the collector until the store's change channel closes or the task is aborted.
pub(crate) async fn run(store: Store) {
    let mut changes = store.subscribe_changes();
    loop {
        pass(&store);
        if changes.changed().await.is_err() {
            return;
        }
        // Let a burst of writes settle before the next pass.
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
}

/// One pass over the objects that have owners or wait for their dependents.
pub(crate) fn pass(store: &Store) {
    let owners = store.uid_states();
    let waiting_for_dependents = |o: &Value| {
        store::is_deleting(o)
            && store::finalizers(o)
                .iter()
                .any(|f| f == FOREGROUND_FINALIZER)
    };
    let relevant = store
        .snapshot_where(|_, _, _, o| !store::owner_refs(o).is_empty() || waiting_for_dependents(o));
    for (group, plural, obj) in &relevant {
        let refs = store::owner_refs(obj);
        if refs.is_empty() {
            continue;
        }
        let Some(rt) = store.any_type(group, plural) else {
            continue;
        };
        let ns = store::meta_str(obj, "namespace").map(str::to_string);
        let name = store::meta_str(obj, "name").unwrap_or_default().to_string();
        // Owners that exist and are not themselves waiting for their dependents.
        let solid = refs
            .iter()
            .filter(|(u, _)| owners.get(u) == Some(&false))
            .count();
        let dangling = refs.iter().any(|(u, _)| !owners.contains_key(u));
        if solid == 0 {
            if !store::is_deleting(obj) {
                let opts = DeleteOptions {
                    propagation: Some(Propagation::Background),
                    ..Default::default()
                };
                let _ = store.delete_rt(&rt, ns.as_deref(), &name, &opts);
            }
        } else if dangling {
            // Some owners are gone for good: drop the dangling references.
            let mut o = obj.clone();
            if let Some(list) = o["metadata"]["ownerReferences"].as_array_mut() {
                list.retain(|r| r["uid"].as_str().is_some_and(|u| owners.contains_key(u)));
            }
            let _ = store.update_rt(&rt, ns.as_deref(), &name, o, false);
        }
    }
    for (group, plural, obj) in &relevant {
        if !waiting_for_dependents(obj) {
            continue;
        }
        let uid = store::meta_str(obj, "uid").unwrap_or_default();
        let blocked = relevant.iter().any(|(_, _, d)| {
            store::owner_refs(d)
                .iter()
                .any(|(u, block)| u == uid && *block)
        });
        if blocked {
            continue;
        }
        let Some(rt) = store.any_type(group, plural) else {
            continue;
        };
        let ns = store::meta_str(obj, "namespace").map(str::to_string);
        let name = store::meta_str(obj, "name").unwrap_or_default().to_string();
        let mut o = obj.clone();
        let rest: Vec<String> = store::finalizers(obj)
            .into_iter()
            .filter(|f| f != FOREGROUND_FINALIZER)
            .collect();
        o["metadata"]["finalizers"] = json!(rest);
        let _ = store.update_rt(&rt, ns.as_deref(), &name, o, false);
    }
}
