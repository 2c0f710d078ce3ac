//! HTTP-level tests of the API server semantics (plain HTTP, no kube).

mod common;

use std::time::Duration;

use captf_testserver::TestServer;
use common::*;
use serde_json::{Value, json};

const S: Duration = Duration::from_secs(3);

fn widget_crd() -> Value {
    json!({"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": "widgets.example.com"},
        "spec": {"group": "example.com", "scope": "Namespaced",
            "names": {"plural": "widgets", "singular": "widget", "kind": "Widget", "listKind": "WidgetList",
                "shortNames": ["wd"], "categories": ["all"]},
            "versions": [{"name": "v1", "served": true, "storage": true, "subresources": {"status": {}},
                "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}}]}})
}

fn cm(name: &str, labels: Value) -> Value {
    json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "labels": labels}, "data": {"k": "v"}})
}

#[tokio::test]
async fn discovery_documents() {
    let srv = TestServer::start().await;
    let u = srv.url();
    let api = get(&u, "/api").await.json();
    assert_eq!(api["kind"], "APIVersions");
    assert_eq!(api["versions"], json!(["v1"]));
    let v1 = get(&u, "/api/v1").await.json();
    let pods = v1["resources"]
        .as_array()
        .expect("resources")
        .iter()
        .find(|r| r["name"] == "pods")
        .cloned()
        .expect("pods");
    assert_eq!(pods["namespaced"], true);
    assert_eq!(pods["kind"], "Pod");
    assert!(
        v1["resources"]
            .as_array()
            .expect("r")
            .iter()
            .any(|r| r["name"] == "pods/log")
    );
    let groups = get(&u, "/apis").await.json();
    assert_eq!(groups["kind"], "APIGroupList");
    assert!(
        groups["groups"]
            .as_array()
            .expect("groups")
            .iter()
            .any(|g| g["name"] == "batch")
    );
    let batch = get(&u, "/apis/batch/v1").await.json();
    assert_eq!(batch["groupVersion"], "batch/v1");
    assert!(
        batch["resources"]
            .as_array()
            .expect("r")
            .iter()
            .any(|r| r["name"] == "jobs/status")
    );
    assert_eq!(get(&u, "/apis/example.com").await.status, 404);
    assert_eq!(
        post(
            &u,
            "/apis/apiextensions.k8s.io/v1/customresourcedefinitions",
            &widget_crd()
        )
        .await
        .status,
        201
    );
    let g = get(&u, "/apis/example.com").await.json();
    assert_eq!(g["preferredVersion"]["groupVersion"], "example.com/v1");
    let w = get(&u, "/apis/example.com/v1").await.json();
    let widgets = w["resources"]
        .as_array()
        .expect("r")
        .iter()
        .find(|r| r["name"] == "widgets")
        .cloned()
        .expect("widgets");
    assert_eq!(widgets["shortNames"], json!(["wd"]));
    assert_eq!(widgets["categories"], json!(["all"]));
    assert_eq!(widgets["singularName"], "widget");
    assert!(
        widgets["verbs"]
            .as_array()
            .expect("verbs")
            .contains(&json!("watch"))
    );
    assert_eq!(get(&u, "/openapi/v3").await.status, 404);
    assert_eq!(get(&u, "/version").await.json()["major"], "1");
    assert_eq!(get(&u, "/healthz").await.text(), "ok");
    // CRD deletion stops serving it once the cleanup finalizer is done (no instances here).
    // The server answers every deletion held by finalizers with 202 (the real one says 200
    // unless orphanDependents=false): either is a success.
    let r = delete(
        &u,
        "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/widgets.example.com",
        None,
    )
    .await;
    assert!(matches!(r.status, 200 | 202), "{}", r.text());
    let store = srv.store();
    assert!(
        eventually(S, || store
            .get(
                "apiextensions.k8s.io/v1",
                "customresourcedefinitions",
                None,
                "widgets.example.com"
            )
            .is_none()
            .then_some(()))
        .await
        .is_some(),
        "the CRD goes"
    );
    assert_eq!(
        get(&u, "/apis/example.com/v1/namespaces/default/widgets")
            .await
            .status,
        404
    );
    srv.shutdown().await;
}

#[tokio::test]
async fn create_update_and_error_statuses() {
    let srv = TestServer::start().await;
    let u = srv.url();
    let p = "/api/v1/namespaces/default/configmaps";
    let r = post(&u, p, &cm("a", json!({}))).await;
    assert_eq!(r.status, 201);
    let a = r.json();
    assert_eq!(a["metadata"]["namespace"], "default");
    let r = post(&u, p, &cm("a", json!({}))).await;
    assert_eq!(r.status, 409);
    assert_eq!(
        r.json(),
        json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": "configmaps \"a\" already exists", "reason": "AlreadyExists",
            "details": {"name": "a", "kind": "configmaps"}, "code": 409})
    );
    let g = post(
        &u,
        p,
        &json!({"metadata": {"generateName": "gen-"}, "data": {}}),
    )
    .await
    .json();
    let gname = g["metadata"]["name"].as_str().expect("name");
    assert!(gname.starts_with("gen-") && gname.len() == 9, "{gname}");
    // update with a stale resourceVersion
    let mut b = a.clone();
    b["data"]["k"] = json!("2");
    assert_eq!(put(&u, &format!("{p}/a"), &b).await.status, 200);
    let r = put(&u, &format!("{p}/a"), &b).await;
    assert_eq!(
        (r.status, r.json()["reason"].clone()),
        (409, json!("Conflict"))
    );
    // not found, bad request, missing namespace
    let r = get(&u, &format!("{p}/nope")).await;
    assert_eq!(
        (r.status, r.json()["message"].clone()),
        (404, json!("configmaps \"nope\" not found"))
    );
    assert_eq!(
        request(&u, "POST", p, "application/json", None)
            .await
            .status,
        400
    );
    let raw = request(
        &u,
        "PUT",
        &format!("{p}/a"),
        "application/json",
        Some(&json!("not an object")),
    )
    .await;
    assert_eq!(raw.status, 400);
    let r = post(
        &u,
        "/api/v1/namespaces/nope/configmaps",
        &cm("x", json!({})),
    )
    .await;
    assert_eq!(
        (r.status, r.json()["message"].clone()),
        (404, json!("namespaces \"nope\" not found"))
    );
    assert_eq!(
        get(&u, "/api/v1/namespaces/default/nothings").await.status,
        404
    );
    srv.shutdown().await;
}

#[tokio::test]
async fn patches_and_status_subresource() {
    let srv = TestServer::start().await;
    let u = srv.url();
    post(
        &u,
        "/apis/apiextensions.k8s.io/v1/customresourcedefinitions",
        &widget_crd(),
    )
    .await;
    let p = "/apis/example.com/v1/namespaces/default/widgets";
    let w = post(&u, p, &json!({"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w", "finalizers": ["a/b"]},
        "spec": {"size": 1}, "status": {"ready": true}})).await.json();
    assert!(w.get("status").is_none(), "status dropped on create");
    let wp = format!("{p}/w");
    let r = patch(
        &u,
        &wp,
        "application/merge-patch+json",
        &json!({"spec": {"size": 2}, "status": {"ready": true}}),
    )
    .await
    .json();
    assert_eq!(
        (
            r["spec"]["size"].clone(),
            r["metadata"]["generation"].clone()
        ),
        (json!(2), json!(2))
    );
    assert!(r.get("status").is_none(), "main resource ignores status");
    let r = patch(
        &u,
        &format!("{wp}/status"),
        "application/merge-patch+json",
        &json!({"status": {"ready": true}, "spec": {"size": 9}}),
    )
    .await
    .json();
    assert_eq!(
        (
            r["status"]["ready"].clone(),
            r["spec"]["size"].clone(),
            r["metadata"]["generation"].clone()
        ),
        (json!(true), json!(2), json!(2))
    );
    // JSON patch with a failing test op: 422 Invalid, as the apiserver answers
    let r = patch(
        &u,
        &wp,
        "application/json-patch+json",
        &json!([{"op": "test", "path": "/metadata/finalizers", "value": ["x"]},
        {"op": "remove", "path": "/metadata/finalizers"}]),
    )
    .await;
    assert_eq!(
        (r.status, r.json()["reason"].clone()),
        (422, json!("Invalid"))
    );
    let r = patch(
        &u,
        &wp,
        "application/json-patch+json",
        &json!([{"op": "test", "path": "/metadata/finalizers", "value": ["a/b"]},
        {"op": "remove", "path": "/metadata/finalizers"}]),
    )
    .await;
    assert_eq!(r.status, 200);
    assert!(r.json()["metadata"].get("finalizers").is_none());
    // strategic merge is not for custom resources; apply patches are not modelled
    assert_eq!(
        patch(
            &u,
            &wp,
            "application/strategic-merge-patch+json",
            &json!({})
        )
        .await
        .status,
        415
    );
    assert_eq!(
        patch(&u, &wp, "application/apply-patch+yaml", &json!({}))
            .await
            .status,
        415
    );
    // strategic merge on a built-in
    post(
        &u,
        "/api/v1/namespaces/default/configmaps",
        &cm("c", json!({"a": "1"})),
    )
    .await;
    let r = patch(
        &u,
        "/api/v1/namespaces/default/configmaps/c",
        "application/strategic-merge-patch+json",
        &json!({"metadata": {"labels": {"b": "2"}}}),
    )
    .await
    .json();
    assert_eq!(r["metadata"]["labels"], json!({"a": "1", "b": "2"}));
    // a patch carrying a stale resourceVersion conflicts
    let r = patch(
        &u,
        "/api/v1/namespaces/default/configmaps/c",
        "application/merge-patch+json",
        &json!({"metadata": {"resourceVersion": "1"}, "data": {"x": "y"}}),
    )
    .await;
    assert_eq!(r.status, 409);
    srv.shutdown().await;
}

#[tokio::test]
async fn list_selectors_and_deletecollection() {
    let srv = TestServer::start().await;
    let u = srv.url();
    let p = "/api/v1/namespaces/default/configmaps";
    post(&u, p, &cm("a", json!({"app": "web", "tier": "fe"}))).await;
    post(&u, p, &cm("b", json!({"app": "db"}))).await;
    post(&u, p, &cm("c", json!({}))).await;
    let names = |v: Value| -> Vec<String> {
        v["items"]
            .as_array()
            .expect("items")
            .iter()
            .map(|i| i["metadata"]["name"].as_str().unwrap_or("").to_string())
            .collect()
    };
    let l = get(&u, p).await.json();
    assert_eq!(l["kind"], "ConfigMapList");
    assert!(l["metadata"]["resourceVersion"].as_str().is_some());
    assert_eq!(names(l), ["a", "b", "c"]);
    assert_eq!(
        names(
            get(&u, &format!("{p}?labelSelector=app%3Dweb"))
                .await
                .json()
        ),
        ["a"]
    );
    assert_eq!(
        names(
            get(&u, &format!("{p}?labelSelector=app+in+(web,db)"))
                .await
                .json()
        ),
        ["a", "b"]
    );
    assert_eq!(
        names(
            get(&u, &format!("{p}?labelSelector=app+notin+(web)"))
                .await
                .json()
        ),
        ["b", "c"]
    );
    assert_eq!(
        names(get(&u, &format!("{p}?labelSelector=!app")).await.json()),
        ["c"]
    );
    assert_eq!(
        names(
            get(&u, &format!("{p}?labelSelector=app,tier!%3Dbe"))
                .await
                .json()
        ),
        ["a", "b"],
        "!= matches objects without the label"
    );
    assert_eq!(
        names(
            get(&u, &format!("{p}?fieldSelector=metadata.name%3Db"))
                .await
                .json()
        ),
        ["b"]
    );
    assert_eq!(
        names(
            get(
                &u,
                "/api/v1/configmaps?fieldSelector=metadata.namespace%3Ddefault"
            )
            .await
            .json()
        ),
        ["a", "b", "c"]
    );
    assert_eq!(
        get(&u, &format!("{p}?labelSelector=app+in+web"))
            .await
            .status,
        400
    );
    assert_eq!(
        delete(&u, &format!("{p}?labelSelector=app"), None)
            .await
            .status,
        200
    );
    assert_eq!(names(get(&u, p).await.json()), ["c"]);
    srv.shutdown().await;
}

fn owned_cm(name: &str, owner: &Value, block: bool) -> Value {
    json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "ownerReferences": [{
        "apiVersion": "v1", "kind": "ConfigMap", "name": owner["metadata"]["name"], "uid": owner["metadata"]["uid"],
        "blockOwnerDeletion": block}]}})
}

#[tokio::test]
async fn garbage_collection_policies() {
    let srv = TestServer::start().await;
    let u = srv.url();
    let store = srv.store();
    let p = "/api/v1/namespaces/default/configmaps";
    let exists = |n: &str| store.get("v1", "configmaps", Some("default"), n).is_some();
    // Background (the default): owner goes at once, then the dependent
    let o = post(&u, p, &cm("bg", json!({}))).await.json();
    post(&u, p, &owned_cm("bg-dep", &o, false)).await;
    assert_eq!(delete(&u, &format!("{p}/bg"), None).await.status, 200);
    assert!(!exists("bg"));
    assert!(
        eventually(S, || (!exists("bg-dep")).then_some(()))
            .await
            .is_some(),
        "dependent collected"
    );
    // Orphan: dependents lose the reference and stay
    let o = post(&u, p, &cm("or", json!({}))).await.json();
    post(&u, p, &owned_cm("or-dep", &o, true)).await;
    delete(
        &u,
        &format!("{p}/or"),
        Some(&json!({"propagationPolicy": "Orphan"})),
    )
    .await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    let dep = store
        .get("v1", "configmaps", Some("default"), "or-dep")
        .expect("orphan stays");
    assert!(dep["metadata"].get("ownerReferences").is_none());
    // Foreground: owner held by foregroundDeletion until blocking dependents are gone
    let o = post(&u, p, &cm("fg", json!({}))).await.json();
    let mut dep = owned_cm("fg-dep", &o, true);
    dep["metadata"]["finalizers"] = json!(["test/hold"]);
    post(&u, p, &dep).await;
    let r = delete(
        &u,
        &format!("{p}/fg"),
        Some(&json!({"propagationPolicy": "Foreground"})),
    )
    .await;
    assert_eq!(r.status, 202);
    assert_eq!(
        r.json()["metadata"]["finalizers"],
        json!(["foregroundDeletion"])
    );
    let held = eventually(S, || {
        store
            .get("v1", "configmaps", Some("default"), "fg-dep")
            .filter(|d| d["metadata"]["deletionTimestamp"].is_string())
    })
    .await;
    assert!(held.is_some(), "dependent marked for deletion");
    assert!(exists("fg"), "owner waits for its blocking dependent");
    patch(
        &u,
        &format!("{p}/fg-dep"),
        "application/merge-patch+json",
        &json!({"metadata": {"finalizers": null}}),
    )
    .await;
    assert!(
        eventually(S, || (!exists("fg") && !exists("fg-dep")).then_some(()))
            .await
            .is_some()
    );
    // preconditions
    let o = post(&u, p, &cm("pre", json!({}))).await.json();
    let r = delete(
        &u,
        &format!("{p}/pre"),
        Some(&json!({"preconditions": {"uid": "wrong"}})),
    )
    .await;
    assert_eq!(r.status, 409);
    let r = delete(
        &u,
        &format!("{p}/pre"),
        Some(&json!({"preconditions": {"uid": o["metadata"]["uid"]}})),
    )
    .await;
    assert_eq!(r.status, 200);
    srv.shutdown().await;
}

#[tokio::test]
async fn namespace_termination() {
    let srv = TestServer::start().await;
    let u = srv.url();
    let store = srv.store();
    let ns = post(
        &u,
        "/api/v1/namespaces",
        &json!({"metadata": {"name": "team-a"}}),
    )
    .await
    .json();
    assert_eq!(ns["status"]["phase"], "Active");
    assert_eq!(ns["spec"]["finalizers"], json!(["kubernetes"]));
    let p = "/api/v1/namespaces/team-a/configmaps";
    let mut held = cm("held", json!({}));
    held["metadata"]["finalizers"] = json!(["x/y"]);
    post(&u, p, &held).await;
    post(&u, p, &cm("plain", json!({}))).await;
    post(
        &u,
        "/apis/coordination.k8s.io/v1/namespaces/team-a/leases",
        &json!({"metadata": {"name": "l"}, "spec": {}}),
    )
    .await;
    let r = delete(&u, "/api/v1/namespaces/team-a", None).await.json();
    assert_eq!(r["status"]["phase"], "Terminating");
    assert!(r["metadata"]["deletionTimestamp"].is_string());
    let r = post(
        &u,
        "/apis/coordination.k8s.io/v1/namespaces/team-a/leases",
        &json!({"metadata": {"name": "lock-x"}}),
    )
    .await;
    assert_eq!(r.status, 403);
    assert_eq!(
        r.json(),
        json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": "leases \"lock-x\" is forbidden: unable to create new content in namespace team-a because it is being terminated",
            "reason": "Forbidden",
            "details": {"name": "lock-x", "kind": "leases", "causes": [{"reason": "NamespaceTerminating",
                "message": "namespace team-a is being terminated", "field": "metadata.namespace"}]},
            "code": 403})
    );
    assert!(
        eventually(S, || store
            .get("v1", "configmaps", Some("team-a"), "plain")
            .is_none()
            .then_some(()))
        .await
        .is_some()
    );
    assert!(
        store
            .get("coordination.k8s.io/v1", "leases", Some("team-a"), "l")
            .is_none()
    );
    let h = store
        .get("v1", "configmaps", Some("team-a"), "held")
        .expect("held by its finalizer");
    assert!(h["metadata"]["deletionTimestamp"].is_string());
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(
        store.get("v1", "namespaces", None, "team-a").is_some(),
        "namespace waits for content"
    );
    // updates still work in a terminating namespace
    let r = patch(
        &u,
        &format!("{p}/held"),
        "application/json-patch+json",
        &json!([{"op": "remove", "path": "/metadata/finalizers"}]),
    )
    .await;
    assert_eq!(r.status, 200);
    assert!(
        eventually(S, || store
            .get("v1", "namespaces", None, "team-a")
            .is_none()
            .then_some(()))
        .await
        .is_some()
    );
    assert_eq!(
        delete(&u, "/api/v1/namespaces/default", None).await.status,
        403
    );
    srv.shutdown().await;
}

#[tokio::test]
async fn watch_from_resource_version_and_gone() {
    let srv = TestServer::start().await;
    let u = srv.url();
    let p = "/api/v1/namespaces/default/configmaps";
    let a = post(&u, p, &cm("a", json!({}))).await.json();
    let rv = a["metadata"]["resourceVersion"]
        .as_str()
        .expect("rv")
        .to_string();
    patch(
        &u,
        &format!("{p}/a"),
        "application/merge-patch+json",
        &json!({"data": {"k": "2"}}),
    )
    .await;
    post(
        &u,
        "/api/v1/namespaces/default/secrets",
        &json!({"metadata": {"name": "s"}}),
    )
    .await;
    delete(&u, &format!("{p}/a"), None).await;
    let mut w = Watch::open(&u, &format!("{p}?watch=true&resourceVersion={rv}")).await;
    let e1 = w.next(S).await.expect("modified");
    assert_eq!(
        (e1["type"].clone(), e1["object"]["data"]["k"].clone()),
        (json!("MODIFIED"), json!("2"))
    );
    let e2 = w.next(S).await.expect("deleted");
    assert_eq!(e2["type"], "DELETED");
    let drv: u64 = e2["object"]["metadata"]["resourceVersion"]
        .as_str()
        .and_then(|s| s.parse().ok())
        .expect("rv");
    let mrv: u64 = e1["object"]["metadata"]["resourceVersion"]
        .as_str()
        .and_then(|s| s.parse().ok())
        .expect("rv");
    assert!(drv > mrv, "DELETED carries a new resourceVersion");
    post(&u, p, &cm("b", json!({}))).await;
    assert_eq!(w.next(S).await.expect("added")["type"], "ADDED");
    // without resourceVersion: synthetic ADDED for existing objects
    let mut w0 = Watch::open(&u, &format!("{p}?watch=1")).await;
    let e = w0.next(S).await.expect("initial");
    assert_eq!(
        (e["type"].clone(), e["object"]["metadata"]["name"].clone()),
        (json!("ADDED"), json!("b"))
    );
    // selector transitions
    let mut ws = Watch::open(&u, &format!("{p}?watch=1&labelSelector=x%3D1")).await;
    patch(
        &u,
        &format!("{p}/b"),
        "application/merge-patch+json",
        &json!({"metadata": {"labels": {"x": "1"}}}),
    )
    .await;
    assert_eq!(ws.next(S).await.expect("enters")["type"], "ADDED");
    patch(
        &u,
        &format!("{p}/b"),
        "application/merge-patch+json",
        &json!({"metadata": {"labels": {"x": "2"}}}),
    )
    .await;
    assert_eq!(ws.next(S).await.expect("leaves")["type"], "DELETED");
    // 410 after compaction
    srv.store().compact();
    let mut wg = Watch::open(&u, &format!("{p}?watch=true&resourceVersion={rv}")).await;
    let e = wg.next(S).await.expect("error event");
    assert_eq!(e["type"], "ERROR");
    assert_eq!(
        (e["object"]["code"].clone(), e["object"]["reason"].clone()),
        (json!(410), json!("Expired"))
    );
    srv.shutdown().await;
}

#[tokio::test]
async fn watch_bookmarks_initial_events_and_timeout() {
    let srv = TestServer::start().await;
    let u = srv.url();
    let p = "/api/v1/namespaces/default/configmaps";
    post(&u, p, &cm("a", json!({}))).await;
    let rv = srv.store().resource_version();
    let mut w = Watch::open(
        &u,
        &format!("{p}?watch=true&resourceVersion={rv}&allowWatchBookmarks=true"),
    )
    .await;
    let b = w.next(Duration::from_secs(3)).await.expect("bookmark");
    assert_eq!(b["type"], "BOOKMARK");
    assert_eq!(b["object"]["metadata"]["resourceVersion"], rv.to_string());
    let mut wi = Watch::open(&u, &format!("{p}?watch=true&sendInitialEvents=true&resourceVersionMatch=NotOlderThan&allowWatchBookmarks=true")).await;
    assert_eq!(wi.next(S).await.expect("initial")["type"], "ADDED");
    let end = wi.next(S).await.expect("end bookmark");
    assert_eq!(end["type"], "BOOKMARK");
    assert_eq!(
        end["object"]["metadata"]["annotations"]["k8s.io/initial-events-end"],
        "true"
    );
    let mut wt = Watch::open(
        &u,
        &format!("{p}?watch=true&resourceVersion={rv}&timeoutSeconds=1"),
    )
    .await;
    let started = std::time::Instant::now();
    assert!(wt.next(Duration::from_secs(4)).await.is_none());
    assert!(
        wt.closed && started.elapsed() < Duration::from_secs(3),
        "timeoutSeconds ends the stream"
    );
    srv.shutdown().await;
}

#[tokio::test]
async fn faults_and_request_log() {
    let srv = TestServer::start().await;
    let u = srv.url();
    let p = "/api/v1/namespaces/default/secrets";
    srv.faults()
        .fail_next(2, Some("create"), Some("secrets"), 503);
    let r = post(&u, p, &json!({"metadata": {"name": "s"}})).await;
    assert_eq!(
        (r.status, r.json()["kind"].clone(), r.json()["code"].clone()),
        (503, json!("Status"), json!(503))
    );
    assert_eq!(
        post(&u, p, &json!({"metadata": {"name": "s"}}))
            .await
            .status,
        503
    );
    assert_eq!(
        post(&u, p, &json!({"metadata": {"name": "s"}}))
            .await
            .status,
        201
    );
    let log = srv.request_log();
    assert_eq!(log.count("create", "secrets", ""), 3);
    assert_eq!(log.writes("secrets", ""), 3);
    log.reset();
    assert_eq!(log.count("create", "secrets", ""), 0);
    srv.faults().add_latency(Duration::from_millis(200));
    let t = std::time::Instant::now();
    get(&u, &format!("{p}/s")).await;
    assert!(t.elapsed() >= Duration::from_millis(200));
    srv.faults().clear();
    let mut w = Watch::open(&u, &format!("{p}?watch=1")).await;
    assert_eq!(w.next(S).await.expect("added")["type"], "ADDED");
    srv.faults().drop_watches();
    assert!(w.next(S).await.is_none());
    assert!(w.closed, "the stream was closed");
    srv.shutdown().await;
}

#[tokio::test]
async fn jobs_default_to_orphan_and_events_are_plain_objects() {
    let srv = TestServer::start().await;
    let u = srv.url();
    let store = srv.store();
    let job = post(&u, "/apis/batch/v1/namespaces/default/jobs", &json!({"metadata": {"name": "j"},
        "spec": {"template": {"spec": {"restartPolicy": "Never", "containers": [{"name": "c", "image": "i"}]}}}})).await.json();
    assert_eq!(job["spec"]["backoffLimit"], 6, "API default");
    let pod = post(&u, "/api/v1/namespaces/default/pods", &json!({"metadata": {"name": "p", "ownerReferences": [{
        "apiVersion": "batch/v1", "kind": "Job", "name": "j", "uid": job["metadata"]["uid"], "controller": true}]},
        "spec": {"containers": [{"name": "c", "image": "i"}]}})).await;
    assert_eq!(pod.status, 201);
    // batch/v1 Jobs default to Orphan propagation (what the apiserver does for backwards compatibility)
    delete(&u, "/apis/batch/v1/namespaces/default/jobs/j", None).await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    let p = store
        .get("v1", "pods", Some("default"), "p")
        .expect("orphaned pod stays");
    assert!(p["metadata"].get("ownerReferences").is_none());
    // an unscheduled pod is deleted at once
    assert_eq!(
        delete(&u, "/api/v1/namespaces/default/pods/p", None)
            .await
            .status,
        200
    );
    // core/v1 and events.k8s.io/v1 events
    let e = post(&u, "/api/v1/namespaces/default/events", &json!({"metadata": {"generateName": "x."},
        "involvedObject": {"kind": "Pod", "name": "p"}, "reason": "Test", "message": "m", "type": "Normal"})).await;
    assert_eq!(e.status, 201);
    let e = post(&u, "/apis/events.k8s.io/v1/namespaces/default/events", &json!({"metadata": {"name": "y"},
        "regarding": {"kind": "Pod", "name": "p"}, "reason": "Test", "note": "n", "type": "Normal", "action": "A",
        "reportingController": "t", "reportingInstance": "t", "eventTime": "2026-01-01T00:00:00.000000Z"})).await;
    assert_eq!(e.status, 201);
    assert_eq!(srv.request_log().count("create", "events", ""), 2);
    srv.shutdown().await;
}
