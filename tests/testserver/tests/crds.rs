//! Deleting a CustomResourceDefinition over HTTP, as apiextensions-apiserver does it: the
//! cleanup finalizer, the `Terminating` condition, refused creates, instances deleted as a
//! normal DELETE deletes them, and the CRD gone with its last instance.

mod common;

use std::time::Duration;

use captf_testserver::TestServer;
use captf_testserver::crds::CLEANUP_FINALIZER;
use common::*;
use serde_json::{Value, json};

const S: Duration = Duration::from_secs(3);
const CRD: &str = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions";
const WIDGETS: &str = "/apis/example.com/v1/namespaces/default/widgets";

fn widget_crd() -> Value {
    json!({"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": "widgets.example.com"},
        "spec": {"group": "example.com", "scope": "Namespaced",
            "names": {"plural": "widgets", "singular": "widget", "kind": "Widget", "listKind": "WidgetList"},
            "versions": [{"name": "v1", "served": true, "storage": true, "subresources": {"status": {}},
                "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}}]}})
}

fn widget(name: &str, finalizers: &[&str]) -> Value {
    json!({"apiVersion": "example.com/v1", "kind": "Widget",
        "metadata": {"name": name, "finalizers": finalizers}, "spec": {"size": 1}})
}

fn terminating(crd: &Value) -> (Value, Value) {
    let c = crd["status"]["conditions"]
        .as_array()
        .and_then(|cs| cs.iter().find(|c| c["type"] == "Terminating"))
        .cloned()
        .unwrap_or_default();
    (c["status"].clone(), c["reason"].clone())
}

async fn crd_gone(u: &str) -> bool {
    for _ in 0..150 {
        if get(u, &format!("{CRD}/widgets.example.com")).await.status == 404 {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    false
}

#[tokio::test]
async fn deleting_a_crd_deletes_its_instances_like_a_delete_and_waits_for_their_finalizers() {
    let srv = TestServer::start().await;
    let u = srv.url();
    let created = post(&u, CRD, &widget_crd()).await.json();
    assert_eq!(
        created["metadata"].get("finalizers"),
        None,
        "the cleanup finalizer comes with the first DELETE, not on create"
    );
    let held = post(&u, WIDGETS, &widget("held", &["example.com/cleanup"]))
        .await
        .json();
    let free = post(&u, WIDGETS, &widget("free", &[])).await.json();
    // A dependent of `free`, for the garbage collector.
    let dep = post(
        &u,
        "/api/v1/namespaces/default/configmaps",
        &json!({"metadata": {"name": "dep", "ownerReferences": [{"apiVersion": "example.com/v1",
            "kind": "Widget", "name": "free", "uid": free["metadata"]["uid"]}]}}),
    )
    .await;
    assert_eq!(dep.status, 201);
    let rv = held["metadata"]["resourceVersion"].as_str().expect("rv");
    let mut watch = Watch::open(&u, &format!("{WIDGETS}?watch=true&resourceVersion={rv}")).await;
    assert_eq!(
        watch.next(S).await.expect("free ADDED")["type"],
        "ADDED",
        "replay of the second create"
    );

    let r = delete(&u, &format!("{CRD}/widgets.example.com"), None).await;
    assert!(matches!(r.status, 200 | 202), "{}", r.text());
    let d = r.json();
    assert!(d["metadata"]["deletionTimestamp"].is_string());
    assert_eq!(d["metadata"]["finalizers"], json!([CLEANUP_FINALIZER]));
    assert_eq!(
        terminating(&d),
        (json!("True"), json!("InstanceDeletionPending"))
    );

    // The instances are deleted as a DELETE deletes them, with the usual watch events.
    let mut seen = Vec::new();
    while seen.len() < 2 {
        let e = watch.next(S).await.expect("a watch event");
        seen.push((e["type"].clone(), e["object"]["metadata"]["name"].clone()));
        if e["type"] == "MODIFIED" {
            assert!(e["object"]["metadata"]["deletionTimestamp"].is_string());
        }
    }
    seen.sort_by_key(|(_, n)| n.to_string());
    assert_eq!(
        seen,
        vec![
            (json!("DELETED"), json!("free")),
            (json!("MODIFIED"), json!("held"))
        ]
    );
    let store = srv.store();
    assert!(
        eventually(S, || store
            .get("v1", "configmaps", Some("default"), "dep")
            .is_none()
            .then_some(()))
        .await
        .is_some(),
        "the garbage collector deleted the dependent of the deleted instance"
    );
    let c = get(&u, &format!("{CRD}/widgets.example.com")).await.json();
    assert_eq!(
        terminating(&c),
        (json!("True"), json!("InstanceDeletionInProgress"))
    );
    assert_eq!(c["metadata"]["finalizers"], json!([CLEANUP_FINALIZER]));

    // Creates are refused as the real handler refuses them.
    let r = post(&u, WIDGETS, &widget("new", &[])).await;
    assert_eq!(r.status, 405);
    assert_eq!(
        r.json(),
        json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": "create not allowed while custom resource definition is terminating",
            "reason": "MethodNotAllowed", "details": {"group": "example.com", "kind": "widgets"},
            "code": 405})
    );
    // Every other verb on existing instances keeps working.
    let h = get(&u, &format!("{WIDGETS}/held")).await;
    assert_eq!(h.status, 200);
    let list = get(&u, WIDGETS).await.json();
    assert_eq!(list["items"].as_array().map(Vec::len), Some(1));
    let mut body = h.json();
    body["metadata"]["labels"] = json!({"seen": "yes"});
    assert_eq!(put(&u, &format!("{WIDGETS}/held"), &body).await.status, 200);
    let st = patch(
        &u,
        &format!("{WIDGETS}/held/status"),
        "application/merge-patch+json",
        &json!({"status": {"phase": "Releasing"}}),
    )
    .await;
    assert_eq!(st.status, 200);
    assert_eq!(
        watch.next(S).await.expect("update seen")["type"],
        "MODIFIED"
    );

    // The instance's controller removes its finalizer: the instance goes, then the CRD.
    let p = patch(
        &u,
        &format!("{WIDGETS}/held"),
        "application/merge-patch+json",
        &json!({"metadata": {"finalizers": null}}),
    )
    .await;
    assert_eq!(p.status, 200);
    assert!(crd_gone(&u).await, "the CRD goes with its last instance");
    assert_eq!(get(&u, WIDGETS).await.status, 404, "no longer served");
    assert_eq!(get(&u, "/apis/example.com").await.status, 404);
    srv.shutdown().await;
}

#[tokio::test]
async fn removing_the_cleanup_finalizer_by_hand_leaves_the_instances_in_storage() {
    let srv = TestServer::start().await;
    let u = srv.url();
    post(&u, CRD, &widget_crd()).await;
    post(&u, WIDGETS, &widget("held", &["example.com/cleanup"])).await;
    post(
        &u,
        "/api/v1/namespaces",
        &json!({"metadata": {"name": "x"}}),
    )
    .await;
    let in_x = post(
        &u,
        "/apis/example.com/v1/namespaces/x/widgets",
        &widget("held", &["example.com/cleanup"]),
    )
    .await;
    assert_eq!(in_x.status, 201);
    delete(&u, &format!("{CRD}/widgets.example.com"), None).await;
    let store = srv.store();
    assert!(
        eventually(S, || store
            .get("example.com/v1", "widgets", Some("default"), "held")
            .filter(|w| w["metadata"]["deletionTimestamp"].is_string()))
        .await
        .is_some()
    );
    // As `kubectl patch crd widgets.example.com --type merge -p '{"metadata":{"finalizers":[]}}'`.
    let p = patch(
        &u,
        &format!("{CRD}/widgets.example.com"),
        "application/merge-patch+json",
        &json!({"metadata": {"finalizers": []}}),
    )
    .await;
    assert_eq!(p.status, 200, "{}", p.text());
    assert!(crd_gone(&u).await);
    assert_eq!(get(&u, &format!("{WIDGETS}/held")).await.status, 404);
    // A namespace holding only unserved instances terminates: its controller finds
    // content through discovery, which no longer lists widgets.
    let r = delete(&u, "/api/v1/namespaces/x", None).await;
    assert_eq!(r.status, 200);
    assert!(
        eventually(S, || store
            .get("v1", "namespaces", None, "x")
            .is_none()
            .then_some(()))
        .await
        .is_some(),
        "namespace x goes"
    );
    // A CRD for the same resource serves the instance again, still being deleted.
    assert_eq!(post(&u, CRD, &widget_crd()).await.status, 201);
    let back = get(&u, &format!("{WIDGETS}/held")).await;
    assert_eq!(back.status, 200);
    assert!(back.json()["metadata"]["deletionTimestamp"].is_string());
    srv.shutdown().await;
}
