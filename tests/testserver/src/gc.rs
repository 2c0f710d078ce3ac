//! The garbage collector: deletes dependents whose owners (by `ownerReferences[].uid`) are all
//! gone or being deleted in the foreground, drops dangling references from dependents that still
//! have a live owner, and releases the `foregroundDeletion` finalizer once no dependent with
//! `blockOwnerDeletion: true` remains. Runs asynchronously after every store change, as the
//! real controller does (Orphan propagation is applied synchronously by the store instead).

use serde_json::{Value, json};

use crate::store::{self, DeleteOptions, FOREGROUND_FINALIZER, Propagation, Store};

/// Run the collector until the store's change channel closes or the task is aborted.
pub(crate) async fn run(store: Store) {
    store::run_on_changes(store, pass).await
}

/// The whole object the snapshot's metadata `seen` describes, if it has not changed since
/// (the update that follows then tests the same resourceVersion).
fn current(
    store: &Store,
    rt: &store::ResourceType,
    ns: Option<&str>,
    name: &str,
    seen: &Value,
) -> Option<Value> {
    let o = store.get_rt(rt, ns, name).ok()?;
    (o["metadata"]["uid"] == seen["metadata"]["uid"]
        && o["metadata"]["resourceVersion"] == seen["metadata"]["resourceVersion"])
        .then_some(o)
}

/// One pass over the objects that have owners or wait for their dependents.
pub(crate) fn pass(store: &Store) {
    let waiting_for_dependents = |o: &Value| {
        store::is_deleting(o)
            && store::finalizers(o)
                .iter()
                .any(|f| f == FOREGROUND_FINALIZER)
    };
    // One snapshot: read apart, a Job and its Pod created between the two reads would show
    // the Pod without its owner, and the Pod would be collected.
    let (owners, relevant) = store.uid_states_and_snapshot(|_, _, _, o| {
        !store::owner_refs(o).is_empty() || waiting_for_dependents(o)
    });
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
                // The uid precondition: never a successor of the same name.
                let opts = DeleteOptions {
                    propagation: Some(Propagation::Background),
                    precondition_uid: store::meta_str(obj, "uid").map(str::to_string),
                    ..Default::default()
                };
                let _ = store.delete_rt(&rt, ns.as_deref(), &name, &opts);
            }
        } else if dangling {
            // Some owners are gone for good: drop the dangling references.
            let Some(mut o) = current(store, &rt, ns.as_deref(), &name, obj) else {
                continue;
            };
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
        let Some(mut o) = current(store, &rt, ns.as_deref(), &name, obj) else {
            continue;
        };
        let rest: Vec<String> = store::finalizers(obj)
            .into_iter()
            .filter(|f| f != FOREGROUND_FINALIZER)
            .collect();
        o["metadata"]["finalizers"] = json!(rest);
        let _ = store.update_rt(&rt, ns.as_deref(), &name, o, false);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};

    fn cm(name: &str, owner_uid: Option<&str>) -> Value {
        let mut o = json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": name, "namespace": "default"}, "data": {"a": "1"}});
        if let Some(uid) = owner_uid {
            o["metadata"]["ownerReferences"] = json!([{"apiVersion": "v1", "kind": "ConfigMap",
                "name": "owner", "uid": uid, "blockOwnerDeletion": true}]);
        }
        o
    }

    /// A dependent created right after its owner, while a pass runs, is never collected: the
    /// pass reads the owners and the dependents in one snapshot.
    #[test]
    fn a_dependent_created_during_a_pass_keeps_its_new_owner() {
        let store = Store::new();
        // Objects that make each pass take a while.
        for i in 0..400 {
            store
                .create(cm(&format!("filler-{i}"), None))
                .expect("filler");
        }
        let stop = Arc::new(AtomicBool::new(false));
        let gc = {
            let (store, stop) = (store.clone(), stop.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    pass(&store);
                }
            })
        };
        let pairs = 3000;
        for i in 0..pairs {
            let owner = store
                .create(cm(&format!("owner-{i}"), None))
                .expect("owner");
            let uid = store::meta_str(&owner, "uid")
                .unwrap_or_default()
                .to_string();
            store
                .create(cm(&format!("dependent-{i}"), Some(&uid)))
                .expect("dependent");
        }
        stop.store(true, Ordering::Relaxed);
        gc.join().expect("gc thread");
        let collected: Vec<String> = (0..pairs)
            .map(|i| format!("dependent-{i}"))
            .filter(|n| {
                store
                    .get("v1", "configmaps", Some("default"), n)
                    .is_none_or(|o| store::is_deleting(&o))
            })
            .collect();
        assert!(
            collected.is_empty(),
            "{} dependents of live owners were collected, e.g. {:?}",
            collected.len(),
            collected.first()
        );
    }
}
