//! The CustomResourceDefinition lifecycle of apiextensions-apiserver, in one place:
//!
//! - The first DELETE of a CRD does not remove it: it sets `deletionTimestamp`, adds the
//!   `customresourcecleanup.apiextensions.k8s.io` finalizer and sets the condition
//!   `Terminating=True` (`InstanceDeletionPending`), as `registry/customresourcedefinition/
//!   etcd.go` does. The finalizer is added then, not on create.
//! - While `Terminating` is True, creating an instance is refused with 405 `MethodNotAllowed`
//!   "create not allowed while custom resource definition is terminating"
//!   (`apiserver/customresource_handler.go`); get, list, watch, update, patch and delete of
//!   existing instances keep working.
//! - The finalizer controller (`controller/finalizer/crd_finalizer.go`) sets
//!   `Terminating=True` (`InstanceDeletionInProgress`), deletes every instance as a normal
//!   DELETE does (Background propagation: instances with finalizers get `deletionTimestamp`
//!   and stay), and once none is left sets `Terminating=False` (`InstanceDeletionCompleted`)
//!   and removes its finalizer in one `/status` write; the store then removes the CRD and
//!   stops serving its types.
//! - A `/status` write of a CRD also writes `metadata.finalizers` (the real status strategy
//!   resets the object meta from the new object itself); a person can remove the finalizer
//!   by hand through either endpoint. Instances still stored then stay in storage, unserved,
//!   and are served again if a CRD for the same group and plural is created, as etcd keeps
//!   them on a real server.
//!
//! Not modelled: the finalizer controller's one-minute wait, after which the real one reports
//! `InstanceDeletionCheck` and retries (here the condition stays `InstanceDeletionInProgress`
//! until the last instance goes); `NeverEstablished` (CRDs are established on create);
//! `OverlappingBuiltInResource`.

use serde_json::{Value, json};

use crate::store::{self, ApiError, DeleteOptions, Propagation, ResourceType, Store};

/// The finalizer apiextensions-apiserver puts on a CRD when it is deleted.
pub const CLEANUP_FINALIZER: &str = "customresourcecleanup.apiextensions.k8s.io";

pub(crate) const GROUP: &str = "apiextensions.k8s.io";
pub(crate) const PLURAL: &str = "customresourcedefinitions";

const TERMINATING: &str = "Terminating";

/// Whether `rt` is the CustomResourceDefinition resource itself.
pub(crate) fn is_crd_resource(rt: &ResourceType) -> bool {
    rt.crd.is_none() && rt.group == GROUP && rt.plural == PLURAL
}

/// The first DELETE of a CRD: deletionTimestamp (no grace period, no generation bump), the
/// cleanup finalizer and `Terminating=True` (`InstanceDeletionPending`).
pub(crate) fn mark_deleting(crd: &mut Value) {
    crd["metadata"]["deletionTimestamp"] = json!(store::now_rfc3339());
    let mut fins = store::finalizers(crd);
    if !fins.iter().any(|f| f == CLEANUP_FINALIZER) {
        fins.push(CLEANUP_FINALIZER.to_string());
    }
    crd["metadata"]["finalizers"] = json!(fins);
    set_condition(
        crd,
        "True",
        "InstanceDeletionPending",
        "CustomResourceDefinition marked for deletion; CustomResource deletion will begin soon",
    );
}

/// Whether the CRD's `Terminating` condition is True (what the real handler checks).
pub(crate) fn terminating(crd: &Value) -> bool {
    crd["status"]["conditions"].as_array().is_some_and(|cs| {
        cs.iter()
            .any(|c| c["type"] == TERMINATING && c["status"] == "True")
    })
}

/// The refusal of a create of an instance of a terminating CRD.
pub(crate) fn refuse_create(rt: &ResourceType, crd: Option<&Value>) -> Result<(), ApiError> {
    if !crd.is_some_and(terminating) {
        return Ok(());
    }
    Err(ApiError::new(
        405,
        "MethodNotAllowed",
        "create not allowed while custom resource definition is terminating",
    )
    .with_details(json!({"group": rt.group, "kind": rt.plural})))
}

/// A `/status` write of a CRD takes `metadata.finalizers` from the written object too.
pub(crate) fn status_write_metadata(written: &Value, stored: &mut Value) {
    match written["metadata"].get("finalizers") {
        Some(f) if !f.is_null() => stored["metadata"]["finalizers"] = f.clone(),
        _ => {
            if let Some(m) = stored["metadata"].as_object_mut() {
                m.remove("finalizers");
            }
        }
    }
}

/// Set the `Terminating` condition as `SetCRDCondition` does (the transition time changes
/// only with the status). Returns whether anything changed.
fn set_condition(crd: &mut Value, status: &str, reason: &str, message: &str) -> bool {
    if !crd["status"].is_object() {
        crd["status"] = json!({});
    }
    if !crd["status"]["conditions"].is_array() {
        crd["status"]["conditions"] = json!([]);
    }
    let Some(conds) = crd["status"]["conditions"].as_array_mut() else {
        return false;
    };
    match conds.iter_mut().find(|c| c["type"] == TERMINATING) {
        Some(c) => {
            if c["status"] == status && c["reason"] == reason && c["message"] == message {
                return false;
            }
            if c["status"] != status {
                c["lastTransitionTime"] = json!(store::now_rfc3339());
            }
            c["status"] = json!(status);
            c["reason"] = json!(reason);
            c["message"] = json!(message);
        }
        None => conds.push(json!({
            "type": TERMINATING, "status": status, "reason": reason, "message": message,
            "lastTransitionTime": store::now_rfc3339(),
        })),
    }
    true
}

/// The instances' storage, from the CRD's spec (its storage version), whether or not any
/// version is served.
fn instance_type(crd: &Value, name: &str) -> Option<ResourceType> {
    let spec = &crd["spec"];
    let version = spec["versions"]
        .as_array()?
        .iter()
        .find(|v| v["storage"].as_bool() == Some(true))
        .and_then(|v| v["name"].as_str())
        .unwrap_or_default();
    let kind = spec["names"]["kind"].as_str()?;
    Some(ResourceType {
        group: spec["group"].as_str()?.to_string(),
        version: version.to_string(),
        plural: spec["names"]["plural"].as_str()?.to_string(),
        singular: kind.to_lowercase(),
        kind: kind.to_string(),
        namespaced: spec["scope"] == "Namespaced",
        short_names: Vec::new(),
        categories: Vec::new(),
        status_subresource: false,
        crd: Some(name.to_string()),
    })
}

/// Run the finalizer controller until the store's change channel closes or the task is
/// aborted.
pub(crate) async fn run(store: Store) {
    store::run_on_changes(store, pass).await
}

/// One pass over the CRDs being deleted that still carry the cleanup finalizer.
pub(crate) fn pass(store: &Store) {
    let Some(crd_rt) = store.any_type(GROUP, PLURAL) else {
        return;
    };
    let deleting = store.view_rt(&crd_rt, |o| {
        (store::is_deleting(o) && store::finalizers(o).iter().any(|f| f == CLEANUP_FINALIZER))
            .then(|| o.clone())
    });
    for crd in deleting {
        finalize(store, &crd_rt, crd);
    }
}

fn finalize(store: &Store, crd_rt: &ResourceType, mut crd: Value) {
    let name = store::meta_str(&crd, "name")
        .unwrap_or_default()
        .to_string();
    if set_condition(
        &mut crd,
        "True",
        "InstanceDeletionInProgress",
        "CustomResource deletion is in progress",
    ) {
        match store.update_rt(crd_rt, None, &name, crd, true) {
            Ok(c) => crd = c,
            // Deleted or changed in the meantime: the next pass sees the change.
            Err(_) => return,
        }
    }
    let Some(rt) = instance_type(&crd, &name) else {
        return;
    };
    let stored = |store: &Store| store.view_rt(&rt, |o| Some(o.clone()));
    for o in stored(store) {
        if store::is_deleting(&o) {
            continue;
        }
        let opts = DeleteOptions {
            propagation: Some(Propagation::Background),
            ..Default::default()
        };
        let ns = store::meta_str(&o, "namespace");
        let _ = store.delete_rt(
            &rt,
            ns,
            store::meta_str(&o, "name").unwrap_or_default(),
            &opts,
        );
    }
    // Instances with finalizers stay; the pass after the last one goes finishes.
    if !stored(store).is_empty() {
        return;
    }
    set_condition(
        &mut crd,
        "False",
        "InstanceDeletionCompleted",
        "removed all instances",
    );
    let rest: Vec<String> = store::finalizers(&crd)
        .into_iter()
        .filter(|f| f != CLEANUP_FINALIZER)
        .collect();
    crd["metadata"]["finalizers"] = json!(rest);
    let _ = store.update_rt(crd_rt, None, &name, crd, true);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn widget_crd() -> Value {
        json!({"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
            "metadata": {"name": "widgets.example.com"},
            "spec": {"group": "example.com", "scope": "Namespaced",
                "names": {"plural": "widgets", "singular": "widget", "kind": "Widget"},
                "versions": [{"name": "v1", "served": true, "storage": true, "subresources": {"status": {}}}]}})
    }

    fn widget(name: &str, finalizers: &[&str]) -> Value {
        json!({"apiVersion": "example.com/v1", "kind": "Widget",
            "metadata": {"name": name, "namespace": "default", "finalizers": finalizers}})
    }

    fn crd(s: &Store) -> Option<Value> {
        s.get(
            "apiextensions.k8s.io/v1",
            PLURAL,
            None,
            "widgets.example.com",
        )
    }

    fn condition(crd: &Value) -> (String, String) {
        let c = crd["status"]["conditions"]
            .as_array()
            .and_then(|cs| cs.iter().find(|c| c["type"] == TERMINATING))
            .cloned()
            .unwrap_or_default();
        (
            c["status"].as_str().unwrap_or_default().to_string(),
            c["reason"].as_str().unwrap_or_default().to_string(),
        )
    }

    #[test]
    fn the_finalizer_is_added_by_the_first_delete_not_on_create() {
        let s = Store::new();
        let created = s.create(widget_crd()).expect("crd");
        assert!(store::finalizers(&created).is_empty());
        assert_eq!(condition(&created), (String::new(), String::new()));
        let d = s
            .delete(
                "apiextensions.k8s.io/v1",
                PLURAL,
                None,
                "widgets.example.com",
            )
            .expect("delete");
        assert!(store::is_deleting(&d));
        assert_eq!(store::finalizers(&d), vec![CLEANUP_FINALIZER.to_string()]);
        assert_eq!(
            condition(&d),
            ("True".into(), "InstanceDeletionPending".into())
        );
        assert!(
            d["metadata"].get("deletionGracePeriodSeconds").is_none(),
            "the CRD registry sets the timestamp only"
        );
        assert_eq!(d["metadata"]["generation"], 1);
        // A second DELETE changes nothing.
        let again = s
            .delete(
                "apiextensions.k8s.io/v1",
                PLURAL,
                None,
                "widgets.example.com",
            )
            .expect("delete again");
        assert_eq!(
            again["metadata"]["resourceVersion"],
            d["metadata"]["resourceVersion"]
        );
    }

    #[test]
    fn instances_with_finalizers_hold_the_crd_and_creates_are_refused() {
        let s = Store::new();
        s.create(widget_crd()).expect("crd");
        s.create(widget("held", &["example.com/cleanup"]))
            .expect("held");
        s.create(widget("free", &[])).expect("free");
        s.delete(
            "apiextensions.k8s.io/v1",
            PLURAL,
            None,
            "widgets.example.com",
        )
        .expect("delete");
        let err = s.create(widget("new", &[])).expect_err("refused");
        assert_eq!(
            err.to_status(),
            json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                "message": "create not allowed while custom resource definition is terminating",
                "reason": "MethodNotAllowed", "code": 405,
                "details": {"group": "example.com", "kind": "widgets"}})
        );
        pass(&s);
        pass(&s);
        assert!(
            s.get("example.com/v1", "widgets", Some("default"), "free")
                .is_none()
        );
        let held = s
            .get("example.com/v1", "widgets", Some("default"), "held")
            .expect("held stays");
        assert!(store::is_deleting(&held));
        let c = crd(&s).expect("the CRD stays");
        assert_eq!(
            condition(&c),
            ("True".into(), "InstanceDeletionInProgress".into())
        );
        // Updates of existing instances keep working: the controller drops its finalizer.
        let mut h = held.clone();
        h["metadata"]["finalizers"] = json!([]);
        s.update(h).expect("remove the instance's finalizer");
        pass(&s);
        assert!(crd(&s).is_none(), "the CRD goes with its last instance");
        assert!(s.resource_type("example.com/v1", "widgets").is_none());
    }

    #[test]
    fn a_status_write_can_remove_the_finalizer_and_leftovers_come_back_with_the_crd() {
        let s = Store::new();
        s.create(widget_crd()).expect("crd");
        s.create(widget("held", &["example.com/cleanup"]))
            .expect("held");
        let mut d = s
            .delete(
                "apiextensions.k8s.io/v1",
                PLURAL,
                None,
                "widgets.example.com",
            )
            .expect("delete");
        pass(&s);
        d = crd(&s).unwrap_or(d);
        d["metadata"]["finalizers"] = json!([]);
        s.update_status(d).expect("status write");
        assert!(crd(&s).is_none());
        assert!(s.resource_type("example.com/v1", "widgets").is_none());
        // The instance stayed in storage: a new CRD for the same resource serves it again.
        s.create(widget_crd()).expect("crd again");
        let back = s
            .get("example.com/v1", "widgets", Some("default"), "held")
            .expect("served again");
        assert!(store::is_deleting(&back));
    }

    #[test]
    fn the_transition_time_moves_only_with_the_status() {
        let mut c = json!({});
        assert!(set_condition(&mut c, "True", "A", "a"));
        c["status"]["conditions"][0]["lastTransitionTime"] = json!("2000-01-01T00:00:00Z");
        assert!(!set_condition(&mut c, "True", "A", "a"));
        assert!(set_condition(&mut c, "True", "B", "b"));
        assert_eq!(
            c["status"]["conditions"][0]["lastTransitionTime"],
            "2000-01-01T00:00:00Z"
        );
        assert!(set_condition(&mut c, "False", "C", "c"));
        assert_ne!(
            c["status"]["conditions"][0]["lastTransitionTime"],
            "2000-01-01T00:00:00Z"
        );
    }
}
