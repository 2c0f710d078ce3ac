//! HTTP/1.1 front end: routing of `/api`, `/apis`, discovery documents, `/version`, health
//! endpoints, resource paths (cluster-scoped, namespaced, all-namespace lists, `status` and
//! `log` subresources), verbs, query parameters, JSON encoding and `Status` errors.
//! Always answers JSON (never protobuf, never server-side Tables, no `/openapi/*`: 404), and
//! legacy discovery only (clients asking for aggregated discovery fall back, as kubectl does).
//! `pods/log` serves the captured output so far: `follow`, `previous`, `sinceSeconds` and
//! `timestamps` are ignored; `container` is checked and `tailLines` honoured.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode, header};
use http_body_util::{BodyExt, Full, StreamBody, combinators::BoxBody};
use hyper::body::{Frame, Incoming};
use serde_json::{Value, json};
use tokio::net::TcpListener;

use crate::faults::Faults;
use crate::patch::{self, PatchError, PatchType};
use crate::requestlog::RequestLog;
use crate::selectors::{FieldSelector, LabelSelector};
use crate::store::{
    self, ApiError, DeleteOptions, Propagation, ResourceType, Store, version_priority,
};
use crate::watch::{self, WatchParams};

pub(crate) type Body = BoxBody<Bytes, Infallible>;

/// Shared state of the HTTP front end.
pub(crate) struct ServerState {
    pub store: Store,
    pub faults: Faults,
    pub log: RequestLog,
    pub address: String,
}

/// Accept connections until `shutdown` fires, then drop every connection.
pub(crate) async fn serve(
    listener: TcpListener,
    state: Arc<ServerState>,
    mut shutdown: tokio::sync::watch::Receiver<bool>,
) {
    let mut conns = tokio::task::JoinSet::new();
    loop {
        while conns.try_join_next().is_some() {}
        tokio::select! {
            _ = shutdown.changed() => break,
            accepted = listener.accept() => {
                let Ok((stream, _)) = accepted else { continue };
                let _ = stream.set_nodelay(true);
                let st = state.clone();
                conns.spawn(async move {
                    let svc = hyper::service::service_fn(move |req| {
                        let st = st.clone();
                        async move { Ok::<_, Infallible>(handle(st, req).await) }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(hyper_util::rt::TokioIo::new(stream), svc)
                        .await;
                });
            }
        }
    }
    conns.abort_all();
}

fn full(b: impl Into<Bytes>) -> Body {
    Full::new(b.into()).boxed()
}

fn json_response(code: u16, v: &Value) -> Response<Body> {
    let body = serde_json::to_vec(v).unwrap_or_default();
    let mut r = Response::new(full(body));
    *r.status_mut() = StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("application/json"),
    );
    r.headers_mut().insert(
        header::CACHE_CONTROL,
        header::HeaderValue::from_static("no-cache, private"),
    );
    r
}

fn error_response(e: &ApiError) -> Response<Body> {
    json_response(e.code, &e.to_status())
}

fn text_response(code: u16, text: impl Into<Bytes>) -> Response<Body> {
    let mut r = Response::new(full(text));
    *r.status_mut() = StatusCode::from_u16(code).unwrap_or(StatusCode::OK);
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    r
}

fn not_found_path() -> ApiError {
    ApiError::new(
        404,
        "NotFound",
        "the server could not find the requested resource",
    )
    .with_details(json!({}))
}

/// Percent-decoding for query strings (`+` is a space).
fn decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < bytes.len() => {
                match u8::from_str_radix(
                    std::str::from_utf8(&bytes[i + 1..i + 3]).unwrap_or("zz"),
                    16,
                ) {
                    Ok(b) => {
                        out.push(b);
                        i += 2;
                    }
                    Err(_) => out.push(b'%'),
                }
            }
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn parse_query(q: Option<&str>) -> BTreeMap<String, String> {
    q.unwrap_or_default()
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|p| match p.split_once('=') {
            Some((k, v)) => (decode(k), decode(v)),
            None => (decode(p), String::new()),
        })
        .collect()
}

fn truthy(q: &BTreeMap<String, String>, key: &str) -> bool {
    matches!(q.get(key).map(String::as_str), Some("true" | "1"))
}

/// A request for a resource.
struct ResourceRequest {
    rt: ResourceType,
    namespace: Option<String>,
    name: Option<String>,
    sub: String,
}

enum Route {
    Doc(Value),
    Text(&'static str),
    Resource(Box<ResourceRequest>),
}

fn resource_entry(rt: &ResourceType) -> Vec<Value> {
    let mut v = vec![json!({
        "name": rt.plural,
        "singularName": rt.singular,
        "namespaced": rt.namespaced,
        "kind": rt.kind,
        "verbs": ["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"],
        "shortNames": rt.short_names,
        "categories": rt.categories,
    })];
    if rt.status_subresource {
        v.push(json!({"name": format!("{}/status", rt.plural), "singularName": "", "namespaced": rt.namespaced,
            "kind": rt.kind, "verbs": ["get", "patch", "update"]}));
    }
    if rt.group.is_empty() && rt.plural == "pods" {
        v.push(json!({"name": "pods/log", "singularName": "", "namespaced": true, "kind": "Pod", "verbs": ["get"]}));
    }
    v
}

fn group_versions(types: &[ResourceType], group: &str) -> Vec<String> {
    let mut vs: Vec<String> = types
        .iter()
        .filter(|t| t.group == group)
        .map(|t| t.version.clone())
        .collect();
    vs.sort_by_key(|v| std::cmp::Reverse(version_priority(v)));
    vs.dedup();
    vs
}

fn group_doc(types: &[ResourceType], group: &str) -> Value {
    let versions: Vec<Value> = group_versions(types, group)
        .iter()
        .map(|v| json!({"groupVersion": format!("{group}/{v}"), "version": v}))
        .collect();
    json!({"name": group, "versions": versions, "preferredVersion": versions.first().cloned().unwrap_or(Value::Null)})
}

fn route(state: &ServerState, path: &str) -> Result<Route, ApiError> {
    let segs: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
    let types = state.store.types_shared();
    let (group, version, rest): (&str, &str, &[&str]) = match segs.as_slice() {
        [] => {
            return Ok(Route::Doc(
                json!({"paths": ["/api", "/api/v1", "/apis", "/healthz", "/livez", "/readyz", "/version"]}),
            ));
        }
        ["healthz" | "livez" | "readyz", ..] => return Ok(Route::Text("ok")),
        ["version"] => {
            return Ok(Route::Doc(
                json!({"major": "1", "minor": "33", "gitVersion": "v1.33.0-captf-testserver",
                "gitCommit": "0000000000000000000000000000000000000000", "gitTreeState": "clean",
                "buildDate": "2025-01-01T00:00:00Z", "goVersion": "go1.24.0", "compiler": "gc", "platform": "linux/amd64"}),
            ));
        }
        ["api"] => {
            return Ok(Route::Doc(
                json!({"kind": "APIVersions", "versions": ["v1"],
                "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": state.address}]}),
            ));
        }
        ["apis"] => {
            let mut groups: Vec<&str> = types
                .iter()
                .filter(|t| !t.group.is_empty())
                .map(|t| t.group.as_str())
                .collect();
            groups.sort();
            groups.dedup();
            let docs: Vec<Value> = groups.iter().map(|g| group_doc(&types, g)).collect();
            return Ok(Route::Doc(
                json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": docs}),
            ));
        }
        ["apis", g] => {
            if !types.iter().any(|t| t.group == *g) {
                return Err(not_found_path());
            }
            let mut d = group_doc(&types, g);
            d["kind"] = json!("APIGroup");
            d["apiVersion"] = json!("v1");
            return Ok(Route::Doc(d));
        }
        ["api", v, rest @ ..] => ("", *v, rest),
        ["apis", g, v, rest @ ..] => (*g, *v, rest),
        _ => return Err(not_found_path()),
    };
    let gv_types: Vec<&ResourceType> = types
        .iter()
        .filter(|t| t.group == group && t.version == version)
        .collect();
    if gv_types.is_empty() {
        return Err(not_found_path());
    }
    let (namespace, plural, name, sub) = match rest {
        [] => {
            let resources: Vec<Value> = gv_types.iter().flat_map(|t| resource_entry(t)).collect();
            let gv = if group.is_empty() {
                version.to_string()
            } else {
                format!("{group}/{version}")
            };
            return Ok(Route::Doc(
                json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": gv, "resources": resources}),
            ));
        }
        ["namespaces", name, sub @ ("status" | "finalize")] if group.is_empty() => {
            (None, "namespaces", Some(*name), *sub)
        }
        ["namespaces", ns, plural, more @ ..] => match more {
            [] => (Some(*ns), *plural, None, ""),
            [name] => (Some(*ns), *plural, Some(*name), ""),
            [name, sub] => (Some(*ns), *plural, Some(*name), *sub),
            _ => return Err(not_found_path()),
        },
        [plural] => (None, *plural, None, ""),
        [plural, name] => (None, *plural, Some(*name), ""),
        [plural, name, sub] => (None, *plural, Some(*name), *sub),
        _ => return Err(not_found_path()),
    };
    let rt = gv_types
        .iter()
        .find(|t| t.plural == plural)
        .map(|t| (*t).clone())
        .ok_or_else(not_found_path)?;
    if namespace.is_some() && !rt.namespaced {
        return Err(not_found_path());
    }
    let sub_ok = match sub {
        "" => true,
        "status" => rt.status_subresource,
        "log" => rt.group.is_empty() && rt.plural == "pods",
        _ => false,
    };
    if !sub_ok {
        return Err(not_found_path());
    }
    Ok(Route::Resource(Box::new(ResourceRequest {
        rt,
        namespace: namespace.map(str::to_string),
        name: name.map(str::to_string),
        sub: sub.to_string(),
    })))
}

fn verb_of(
    method: &Method,
    rr: &ResourceRequest,
    q: &BTreeMap<String, String>,
) -> Option<&'static str> {
    let named = rr.name.is_some();
    match (method, named) {
        (&Method::GET, false) if truthy(q, "watch") => Some("watch"),
        (&Method::GET, false) => Some("list"),
        (&Method::GET, true) => Some("get"),
        (&Method::POST, false) => Some("create"),
        (&Method::PUT, true) => Some("update"),
        (&Method::PATCH, true) => Some("patch"),
        (&Method::DELETE, true) => Some("delete"),
        (&Method::DELETE, false) => Some("deletecollection"),
        _ => None,
    }
}

async fn handle(state: Arc<ServerState>, req: Request<Incoming>) -> Response<Body> {
    if !crate::requestlog::tracing_on() {
        return handle_request(state, req).await;
    }
    let started = std::time::Instant::now();
    let line = format!(
        "{} {} {}",
        req.method(),
        req.uri(),
        crate::requestlog::client_of(
            req.headers()
                .get(header::USER_AGENT)
                .and_then(|v| v.to_str().ok())
        )
    );
    let resp = handle_request(state, req).await;
    crate::requestlog::trace(started, &line, resp.status().as_u16());
    resp
}

async fn handle_request(state: Arc<ServerState>, req: Request<Incoming>) -> Response<Body> {
    let latency = state.faults.latency();
    if !latency.is_zero() {
        tokio::time::sleep(latency).await;
    }
    let path = req.uri().path().to_string();
    let q = parse_query(req.uri().query());
    let rr = match route(&state, &path) {
        Ok(Route::Doc(v)) => return json_response(200, &v),
        Ok(Route::Text(t)) => return text_response(200, t),
        Ok(Route::Resource(rr)) => *rr,
        Err(e) => return error_response(&e),
    };
    let Some(verb) = verb_of(req.method(), &rr, &q) else {
        return error_response(&ApiError::new(
            405,
            "MethodNotAllowed",
            "the server does not allow this method on the requested resource",
        ));
    };
    let client = crate::requestlog::client_of(
        req.headers()
            .get(header::USER_AGENT)
            .and_then(|v| v.to_str().ok()),
    );
    state.log.record(&client, verb, &rr.rt.plural, &rr.sub);
    if let Some(e) = state.faults.take(verb, &rr.rt.plural, &rr.sub) {
        return error_response(&e);
    }
    let content_type = req
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("application/json")
        .to_string();
    let body = match req.into_body().collect().await {
        Ok(b) => b.to_bytes(),
        Err(e) => return error_response(&ApiError::bad_request(format!("reading the body: {e}"))),
    };
    match dispatch(&state, verb, rr, q, &content_type, body).await {
        Ok(r) => r,
        Err(e) => error_response(&e),
    }
}

fn parse_body(body: &Bytes) -> Result<Value, ApiError> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(Value::Null);
    }
    serde_json::from_slice(body).map_err(|e| {
        ApiError::bad_request(format!(
            "the body of the request could not be decoded as JSON: {e}"
        ))
    })
}

fn selectors(q: &BTreeMap<String, String>) -> Result<(LabelSelector, FieldSelector), ApiError> {
    let l = LabelSelector::parse(
        q.get("labelSelector")
            .map(String::as_str)
            .unwrap_or_default(),
    )
    .map_err(|e| ApiError::bad_request(format!("unable to parse requirement: {e}")))?;
    let f = FieldSelector::parse(
        q.get("fieldSelector")
            .map(String::as_str)
            .unwrap_or_default(),
    )
    .map_err(|e| ApiError::bad_request(format!("invalid field selector: {e}")))?;
    Ok((l, f))
}

async fn dispatch(
    state: &ServerState,
    verb: &str,
    rr: ResourceRequest,
    q: BTreeMap<String, String>,
    content_type: &str,
    body: Bytes,
) -> Result<Response<Body>, ApiError> {
    let store = &state.store;
    let rt = &rr.rt;
    let ns = rr.namespace.as_deref();
    let name = rr.name.clone().unwrap_or_default();
    match verb {
        "list" => {
            let (l, f) = selectors(&q)?;
            let (rv, items) =
                store.list_rt_where(rt, ns, &l.required(), |o| l.matches(o) && f.matches(o));
            Ok(json_response(200, &list_of(rt, rv, items)))
        }
        "watch" => {
            let (labels, fields) = selectors(&q)?;
            let params = WatchParams {
                resource_version: q.get("resourceVersion").cloned(),
                bookmarks: truthy(&q, "allowWatchBookmarks"),
                send_initial_events: truthy(&q, "sendInitialEvents"),
                timeout: q
                    .get("timeoutSeconds")
                    .and_then(|s| s.parse::<u64>().ok())
                    .map(Duration::from_secs),
                labels,
                fields,
            };
            let rx = watch::start(
                store,
                &state.faults,
                rt.clone(),
                rr.namespace.clone(),
                params,
            )?;
            let stream = futures::stream::unfold(rx, |mut rx| async move {
                rx.recv()
                    .await
                    .map(|b| (Ok::<_, Infallible>(Frame::data(b)), rx))
            });
            let mut r = Response::new(BodyExt::boxed(StreamBody::new(stream)));
            r.headers_mut().insert(
                header::CONTENT_TYPE,
                header::HeaderValue::from_static("application/json"),
            );
            Ok(r)
        }
        "get" if rr.sub == "log" => pod_log(store, rt, ns, &name, &q),
        "get" => Ok(json_response(200, &store.get_rt(rt, ns, &name)?)),
        "create" => {
            let obj = if content_type.starts_with("application/vnd.kubernetes.protobuf") {
                crate::protobuf::decode(&body)
                    .map_err(|m| ApiError::new(415, "UnsupportedMediaType", m))?
            } else {
                parse_body(&body)?
            };
            Ok(json_response(201, &store.create_rt(rt, ns, obj)?))
        }
        "update" => {
            if content_type.starts_with("application/vnd.kubernetes.protobuf") {
                return Err(ApiError::new(
                    415,
                    "UnsupportedMediaType",
                    "protobuf update bodies are not supported by the test server",
                ));
            }
            let obj = parse_body(&body)?;
            Ok(json_response(
                200,
                &store.update_rt(rt, ns, &name, obj, rr.sub == "status")?,
            ))
        }
        "patch" => patch_object(store, rt, ns, &name, &rr.sub, content_type, &body)
            .map(|v| json_response(200, &v)),
        "delete" => {
            let mut opts = DeleteOptions::from_json(&parse_body(&body)?)?;
            apply_delete_query(&mut opts, &q)?;
            let (obj, gone) = store.delete_rt(rt, ns, &name, &opts)?;
            if !gone {
                return Ok(json_response(
                    if is_namespace(rt) { 200 } else { 202 },
                    &obj,
                ));
            }
            if rt.crd.is_some() || (rt.group.is_empty() && rt.plural == "pods") {
                return Ok(json_response(200, &obj));
            }
            let mut details =
                json!({"name": name, "kind": rt.plural, "uid": obj["metadata"]["uid"]});
            if !rt.group.is_empty() {
                details["group"] = json!(rt.group);
            }
            Ok(json_response(
                200,
                &json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "details": details}),
            ))
        }
        "deletecollection" => {
            let (l, f) = selectors(&q)?;
            let mut opts = DeleteOptions::from_json(&parse_body(&body)?)?;
            apply_delete_query(&mut opts, &q)?;
            let (_, items) =
                store.list_rt_where(rt, ns, &l.required(), |o| l.matches(o) && f.matches(o));
            let mut deleted = Vec::new();
            for o in items {
                let n = store::meta_str(&o, "name").unwrap_or_default().to_string();
                let ons = store::meta_str(&o, "namespace").map(str::to_string);
                if let Ok((d, _)) = store.delete_rt(rt, ons.as_deref(), &n, &opts) {
                    deleted.push(d);
                }
            }
            Ok(json_response(
                200,
                &list_of(rt, store.resource_version(), deleted),
            ))
        }
        other => Err(ApiError::new(
            405,
            "MethodNotAllowed",
            format!("verb {other} is not supported"),
        )),
    }
}

/// A `<Kind>List` of `items` (moved in: `json!` would copy every item through the
/// serializer).
fn list_of(rt: &ResourceType, rv: u64, items: Vec<Value>) -> Value {
    let mut list = json!({"apiVersion": rt.api_version(), "kind": format!("{}List", rt.kind),
        "metadata": {"resourceVersion": rv.to_string()}});
    list["items"] = Value::Array(items);
    list
}

fn is_namespace(rt: &ResourceType) -> bool {
    rt.group.is_empty() && rt.plural == "namespaces"
}

fn apply_delete_query(
    opts: &mut DeleteOptions,
    q: &BTreeMap<String, String>,
) -> Result<(), ApiError> {
    if let Some(p) = q.get("propagationPolicy") {
        opts.propagation = Some(match p.as_str() {
            "Background" => Propagation::Background,
            "Foreground" => Propagation::Foreground,
            "Orphan" => Propagation::Orphan,
            other => {
                return Err(ApiError::bad_request(format!(
                    "unknown propagationPolicy {other:?}"
                )));
            }
        });
    }
    if let Some(g) = q.get("gracePeriodSeconds") {
        opts.grace_period_seconds = Some(
            g.parse()
                .map_err(|_| ApiError::bad_request("gracePeriodSeconds must be an integer"))?,
        );
    }
    Ok(())
}

fn patch_object(
    store: &Store,
    rt: &ResourceType,
    ns: Option<&str>,
    name: &str,
    sub: &str,
    content_type: &str,
    body: &Bytes,
) -> Result<Value, ApiError> {
    let unsupported = || {
        ApiError::new(
            415,
            "UnsupportedMediaType",
            format!(
                "the body of the request was in an unknown format - accepted media types include: application/json-patch+json, application/merge-patch+json{}",
                if rt.crd.is_none() {
                    ", application/strategic-merge-patch+json"
                } else {
                    ""
                }
            ),
        )
    };
    let kind = PatchType::from_content_type(content_type).ok_or_else(unsupported)?;
    match kind {
        PatchType::Apply => return Err(unsupported()),
        PatchType::StrategicMerge if rt.crd.is_some() => return Err(unsupported()),
        PatchType::Merge | PatchType::Json | PatchType::StrategicMerge => {}
    }
    let patch = parse_body(body)?;
    for _attempt in 0..5 {
        let current = store.get_rt(rt, ns, name)?;
        let mut doc = current.clone();
        match kind {
            PatchType::Merge => {
                if !patch.is_object() {
                    return Err(ApiError::bad_request("merge patch must be a JSON object"));
                }
                patch::merge_patch(&mut doc, &patch)
            }
            PatchType::StrategicMerge => {
                if !patch.is_object() {
                    return Err(ApiError::bad_request(
                        "strategic merge patch must be a JSON object",
                    ));
                }
                patch::strategic_merge_patch(&mut doc, &patch)
            }
            PatchType::Json => patch::json_patch(&mut doc, &patch).map_err(|e| match e {
                PatchError::BadRequest(m) => ApiError::bad_request(m),
                PatchError::Unprocessable(m) => ApiError::new(422, "Invalid", m),
            })?,
            PatchType::Apply => return Err(unsupported()),
        }
        if !doc.is_object() {
            return Err(ApiError::bad_request(
                "the patched object is not a JSON object",
            ));
        }
        let user_rv = doc["metadata"]["resourceVersion"] != current["metadata"]["resourceVersion"];
        match store.update_rt(rt, ns, name, doc, sub == "status") {
            Err(e) if e.code == 409 && e.reason == "Conflict" && !user_rv => continue,
            other => return other,
        }
    }
    Err(ApiError::conflict(
        rt,
        name,
        "the object has been modified; please apply your changes to the latest version and try again",
    ))
}

fn pod_log(
    store: &Store,
    rt: &ResourceType,
    ns: Option<&str>,
    name: &str,
    q: &BTreeMap<String, String>,
) -> Result<Response<Body>, ApiError> {
    let pod = store.get_rt(rt, ns, name)?;
    let container = pod["spec"]["containers"][0]["name"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    if let Some(c) = q.get("container")
        && *c != container
    {
        return Err(ApiError::bad_request(format!(
            "container {c} is not valid for pod {name}"
        )));
    }
    let uid = store::meta_str(&pod, "uid").unwrap_or_default();
    let Some(path) = store.log_path(uid) else {
        return Err(ApiError::bad_request(format!(
            "container \"{container}\" in pod \"{name}\" is waiting to start: ContainerCreating"
        )));
    };
    let text = std::fs::read(&path).unwrap_or_default();
    let text = match q.get("tailLines").and_then(|t| t.parse::<usize>().ok()) {
        Some(n) => {
            let s = String::from_utf8_lossy(&text).into_owned();
            let lines: Vec<&str> = s.split_inclusive('\n').collect();
            lines[lines.len().saturating_sub(n)..].concat().into_bytes()
        }
        None => text,
    };
    Ok(text_response(200, text))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn query_decoding() {
        let q = parse_query(Some(
            "labelSelector=app%3Dweb%2Ctier+in+%28a%2Cb%29&watch=1&x",
        ));
        assert_eq!(
            q.get("labelSelector").map(String::as_str),
            Some("app=web,tier in (a,b)")
        );
        assert!(truthy(&q, "watch"));
        assert_eq!(q.get("x").map(String::as_str), Some(""));
        assert_eq!(decode("%zz%4"), "%zz%4");
    }
}
