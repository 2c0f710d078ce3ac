//! The garbage collector: deletes dependents whose owners (by `ownerReferences[].uid`) are all
//! gone or being deleted in the foreground, drops dangling references from dependents that still
//! have a live owner, and releases the `foregroundDeletion` finalizer once no dependent with
//! `blockOwnerDeletion: true` remains. Runs asynchronously after store changes, as the real
//! controller does (Orphan propagation is applied synchronously by the store instead); a
//! change that cannot alter its decisions (see [`run`]) is no reason for a pass.

use std::collections::HashSet;

use serde_json::{Value, json};

use crate::store::{self, DeleteOptions, FOREGROUND_FINALIZER, Propagation, Store};

/// Run the collector until the store's change channel closes or the task is aborted.
/// A change that leaves what the collector decides from as it was when a pass found nothing
/// to do (most changes: statuses, data, objects without owners) is no reason for a pass.
pub(crate) async fn run(store: Store) {
    let mut idle_at = None;
    store::run_on_changes(store, move |s| {
        if idle_at.is_none() || s.gc_read(|view| Some(view.generation())) != idle_at {
            idle_at = pass_or_idle(s);
        }
    })
    .await
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

/// What a pass does to one object, decided from one snapshot; `meta` is the object's
/// metadata as the snapshot saw it.
enum Action {
    /// No owner left that is not itself waiting for its dependents: delete it.
    Delete { meta: Value },
    /// Some owners are gone for good: keep only the references to the owners in `live`.
    DropDangling { meta: Value, live: Vec<String> },
    /// Waiting for its dependents and no dependent blocks it: remove `foregroundDeletion`.
    Release { meta: Value },
}

/// The pass's decisions, read from one snapshot: read apart, a Job and its Pod created
/// between two reads would show the Pod without its owner, and the Pod would be collected.
/// The store keeps what the collector reads of each object with owners or waiting for its
/// dependents, and every uid's state; only the objects acted on have their metadata cloned.
fn plan(store: &Store) -> (u64, Vec<(String, String, Action)>) {
    store.gc_read(|view| {
        let mut actions = Vec::new();
        let mut any_waiting = false;
        for (key, e) in view.watched() {
            any_waiting |= e.waiting;
            // Owners that exist and are not themselves waiting for their dependents, and
            // owners gone for good.
            let (mut solid, mut dangling) = (0, false);
            for (uid, _) in &e.owners {
                match view.uid_state(uid) {
                    Some(false) => solid += 1,
                    Some(true) => {}
                    None => dangling = true,
                }
            }
            let action = if e.owners.is_empty() {
                None
            } else if solid == 0 {
                if e.deleting {
                    continue;
                }
                view.metadata(key).map(|meta| Action::Delete { meta })
            } else if dangling {
                let live = e
                    .owners
                    .iter()
                    .filter(|(u, _)| view.uid_state(u).is_some())
                    .map(|(u, _)| u.clone())
                    .collect();
                view.metadata(key)
                    .map(|meta| Action::DropDangling { meta, live })
            } else {
                None
            };
            if let Some(a) = action {
                actions.push((key.0.clone(), key.1.clone(), a));
            }
        }
        if !any_waiting {
            return (view.generation(), actions);
        }
        let blocking: HashSet<&str> = view
            .watched()
            .flat_map(|(_, e)| e.owners.iter())
            .filter(|(_, block)| *block)
            .map(|(u, _)| u.as_str())
            .collect();
        for (key, e) in view.watched() {
            if !e.waiting || blocking.contains(e.uid.as_str()) {
                continue;
            }
            if let Some(meta) = view.metadata(key) {
                actions.push((key.0.clone(), key.1.clone(), Action::Release { meta }));
            }
        }
        (view.generation(), actions)
    })
}

/// One pass over the objects that have owners or wait for their dependents.
#[cfg(test)]
pub(crate) fn pass(store: &Store) {
    pass_or_idle(store);
}

/// One pass over the objects that have owners or wait for their dependents;
/// `Some(the generation it decided from)` if it found nothing to do.
fn pass_or_idle(store: &Store) -> Option<u64> {
    let (generation, actions) = plan(store);
    if actions.is_empty() {
        return Some(generation);
    }
    for (group, plural, action) in actions {
        let Some(rt) = store.any_type(&group, &plural) else {
            continue;
        };
        let (Action::Delete { meta: obj }
        | Action::DropDangling { meta: obj, .. }
        | Action::Release { meta: obj }) = &action;
        let ns = store::meta_str(obj, "namespace").map(str::to_string);
        let name = store::meta_str(obj, "name").unwrap_or_default().to_string();
        match &action {
            Action::Delete { .. } => {
                // The uid precondition: never a successor of the same name.
                let opts = DeleteOptions {
                    propagation: Some(Propagation::Background),
                    precondition_uid: store::meta_str(obj, "uid").map(str::to_string),
                    ..Default::default()
                };
                let _ = store.delete_rt(&rt, ns.as_deref(), &name, &opts);
            }
            Action::DropDangling { live, .. } => {
                let Some(mut o) = current(store, &rt, ns.as_deref(), &name, obj) else {
                    continue;
                };
                if let Some(list) = o["metadata"]["ownerReferences"].as_array_mut() {
                    list.retain(|r| {
                        r["uid"]
                            .as_str()
                            .is_some_and(|u| live.iter().any(|l| l == u))
                    });
                }
                let _ = store.update_rt(&rt, ns.as_deref(), &name, o, false);
            }
            Action::Release { .. } => {
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
    }
    None
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

    /// The generation an idle pass reports changes with what the collector decides from,
    /// and only then.
    #[test]
    fn an_idle_pass_reports_what_it_decided_from() {
        let store = Store::new();
        let generation = |s: &Store| s.gc_read(|v| v.generation());
        let owner = store.create(cm("owner", None)).expect("owner");
        let uid = store::meta_str(&owner, "uid").unwrap_or_default();
        store.create(cm("dependent", Some(uid))).expect("dependent");
        let idle = pass_or_idle(&store).expect("nothing to do");
        assert_eq!(idle, generation(&store));
        // Data and status changes of owners and dependents: the same decisions.
        for name in ["owner", "dependent"] {
            let mut o = store
                .get("v1", "configmaps", Some("default"), name)
                .expect(name);
            o["data"]["a"] = json!("2");
            store.update(o).expect("update");
        }
        assert_eq!(generation(&store), idle);
        store
            .delete("v1", "configmaps", Some("default"), "owner")
            .expect("delete");
        assert_ne!(generation(&store), idle);
        assert_eq!(pass_or_idle(&store), None, "the dependent is collected");
        assert!(
            store
                .get("v1", "configmaps", Some("default"), "dependent")
                .is_none()
        );
    }

    /// A dependent created right after its owner, while a pass runs, is never collected: the
    /// pass reads the owners and the dependents in one snapshot.
    #[test]
    fn a_dependent_created_during_a_pass_keeps_its_new_owner() {
        let store = Store::new();
        // Other objects (not ones the collector's index holds).
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
                    // A pass reads under the store's lock throughout: back to back, passes
                    // starve the creating thread (the server's collector runs at most every
                    // 5 ms). Two at once, then a pause as long: the creator waits for the lock
                    // half the time, so it often gets it between two reads, were there two.
                    let t = std::time::Instant::now();
                    pass(&store);
                    pass(&store);
                    std::thread::sleep(t.elapsed());
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
