//! A fault proxy for CAPTF's tests: plain HTTP on loopback in front of a real API server
//! (it forwards with the credentials of the upstream kubeconfig). It counts requests by
//! client, verb and resource ([`RequestLog`]), fails the next N requests that match a
//! verb and resource with a chosen status, adds latency and drops open watches
//! ([`Faults`]). A test points only the client under test (the manager) at it, through
//! [`FaultProxy::client`] or [`FaultProxy::kubeconfig_path`], so that the counts and the
//! faults are that client's alone. `CAPTF_PROXY_TRACE=FILE` logs each request's timing
//! (the scale bench's tool for finding where a slow pass spends its time).

pub mod faults;
pub mod requestlog;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body::Frame;
use http_body_util::{BodyExt, Full, combinators::UnsyncBoxBody};
use kube::config::{KubeConfigOptions, Kubeconfig};

pub use faults::Faults;
pub use requestlog::{RequestLog, WRITE_VERBS};

/// `CAPTF_PROXY_TRACE=FILE`: one line per request that is not a watch, appended to FILE
/// when its response headers came back: its start (milliseconds since the Unix epoch),
/// how long the API server took (ms), the status, the method, the path with its query and
/// the User-Agent, and how long the request's body took to arrive (ms). For finding where a slow pass spends its time.
fn trace_line(line: &str) {
    use std::io::Write;
    static TRACE: std::sync::OnceLock<Option<std::sync::Mutex<std::fs::File>>> =
        std::sync::OnceLock::new();
    let file = TRACE.get_or_init(|| {
        let path = std::env::var_os("CAPTF_PROXY_TRACE")?;
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .ok()
            .map(std::sync::Mutex::new)
    });
    if let Some(f) = file
        && let Ok(mut f) = f.lock()
    {
        let _ = writeln!(f, "{line}");
    }
}

/// The largest request body forwarded (kube-apiserver's own limit is 3 MiB).
const MAX_REQUEST_BODY: usize = 8 * 1024 * 1024;

type Body = UnsyncBoxBody<Bytes, std::io::Error>;

/// A running proxy; it stops when dropped.
pub struct FaultProxy {
    addr: SocketAddr,
    kubeconfig: PathBuf,
    faults: Faults,
    log: RequestLog,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.task.abort();
        let _ = std::fs::remove_file(&self.kubeconfig);
    }
}

/// The verb, resource and subresource of an API request, as the API server's
/// authorization sees them; `None` for discovery and other non-resource paths.
pub fn classify(
    method: &http::Method,
    path: &str,
    query: Option<&str>,
) -> Option<(String, String, String)> {
    let segs: Vec<&str> = path.trim_matches('/').split('/').collect();
    let rest: &[&str] = match segs.as_slice() {
        ["api", _version, rest @ ..] => rest,
        ["apis", _group, _version, rest @ ..] => rest,
        _ => return None,
    };
    // namespaces/{ns}/{resource}/... or {resource}/...; namespaces/{name}[/status|finalize].
    let (resource, name, sub) = match rest {
        [] => return None,
        ["namespaces", _ns, res, tail @ ..]
            if !matches!((*res, tail.len()), ("status" | "finalize", 0)) =>
        {
            (*res, tail.first().copied(), tail.get(1).copied())
        }
        [res, tail @ ..] => (*res, tail.first().copied(), tail.get(1).copied()),
    };
    let watch = query
        .unwrap_or_default()
        .split('&')
        .any(|p| p == "watch=true" || p == "watch=1");
    let verb = match (method.as_str(), name.is_some()) {
        ("GET", true) => "get",
        ("GET", false) if watch => "watch",
        ("GET", false) => "list",
        ("POST", _) => "create",
        ("PUT", _) => "update",
        ("PATCH", _) => "patch",
        ("DELETE", true) => "delete",
        ("DELETE", false) => "deletecollection",
        _ => return None,
    };
    Some((verb.into(), resource.into(), sub.unwrap_or_default().into()))
}

/// The name of the object a write is about: the path's, or a create's body's.
fn object_name(path: &str, verb: &str, body: &[u8]) -> Option<String> {
    if verb == "create" {
        let v: serde_json::Value = serde_json::from_slice(body).ok()?;
        return v["metadata"]["name"].as_str().map(str::to_string);
    }
    let segs: Vec<&str> = path.trim_matches('/').split('/').collect();
    let rest: &[&str] = match segs.as_slice() {
        ["api", _, rest @ ..] | ["apis", _, _, rest @ ..] => rest,
        _ => return None,
    };
    match rest {
        ["namespaces", _, _res] => None,
        ["namespaces", _, _res, name, ..] => Some((*name).to_string()),
        [_res, name, ..] => Some((*name).to_string()),
        _ => None,
    }
}

fn status_response(code: u16, body: Vec<u8>) -> Response<Body> {
    Response::builder()
        .status(StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR))
        .header("content-type", "application/json")
        .body(
            Full::new(Bytes::from(body))
                .map_err(|e| match e {})
                .boxed_unsync(),
        )
        .expect("response")
}

/// Headers that belong to one connection, not to the request.
fn hop_by_hop(name: &http::HeaderName) -> bool {
    matches!(
        name.as_str(),
        "connection"
            | "keep-alive"
            | "proxy-authenticate"
            | "proxy-authorization"
            | "te"
            | "trailer"
            | "transfer-encoding"
            | "upgrade"
            | "host"
            | "content-length"
            | "authorization"
    )
}

/// A response body that ends when the proxy is told to drop watches.
struct Droppable {
    inner: kube::client::Body,
    drops: tokio::sync::watch::Receiver<u64>,
    changed: Option<Pin<Box<dyn std::future::Future<Output = ()> + Send>>>,
}

impl http_body::Body for Droppable {
    type Data = Bytes;
    type Error = std::io::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, std::io::Error>>> {
        if self.changed.is_none() {
            let mut rx = self.drops.clone();
            self.changed = Some(Box::pin(async move {
                let _ = rx.changed().await;
            }));
        }
        if let Some(f) = self.changed.as_mut()
            && f.as_mut().poll(cx).is_ready()
        {
            return Poll::Ready(None);
        }
        Pin::new(&mut self.inner)
            .poll_frame(cx)
            .map_err(std::io::Error::other)
    }
}

async fn forward(
    upstream: kube::Client,
    faults: Faults,
    log: RequestLog,
    req: Request<hyper::body::Incoming>,
) -> Response<Body> {
    let method = req.method().clone();
    let path = req.uri().path().to_string();
    let query = req.uri().query().map(str::to_string);
    let client = requestlog::client_of(
        req.headers()
            .get(http::header::USER_AGENT)
            .and_then(|v| v.to_str().ok()),
    );
    let class = classify(&method, &path, query.as_deref());
    let (started, received) = (std::time::SystemTime::now(), std::time::Instant::now());
    let latency = faults.latency();
    if !latency.is_zero() {
        tokio::time::sleep(latency).await;
    }
    if let Some((verb, resource, sub)) = &class {
        log.record(&client, verb, resource, sub);
        if verb == "get" && sub.is_empty() {
            // `/api/v1/namespaces/NS/secrets/NAME`: the last segment names the object.
            let name = path.rsplit('/').next().unwrap_or_default();
            log.record_get(resource, name);
        }
        if let Some(delay) = faults.take_delay(verb, resource, sub) {
            tokio::time::sleep(delay).await;
        }
        if let Some(injected) = faults.take(verb, resource, sub) {
            return status_response(injected.code, injected.body());
        }
    } else if let Some(injected) = faults.discovery(&path) {
        return status_response(injected.code, injected.body());
    }
    let (parts, body) = req.into_parts();
    let body = match http_body_util::Limited::new(body, MAX_REQUEST_BODY)
        .collect()
        .await
    {
        Ok(b) => b.to_bytes(),
        Err(e) => {
            return status_response(
                413,
                format!("{{\"kind\":\"Status\",\"apiVersion\":\"v1\",\"status\":\"Failure\",\"code\":413,\"message\":\"captf-faultproxy: request body: {e}\"}}").into_bytes(),
            );
        }
    };
    if let Some((verb, resource, sub)) = &class
        && let Some(injected) = faults.take_with_body(verb, resource, sub, &body)
    {
        return status_response(injected.code, injected.body());
    }
    let uri = match &query {
        Some(q) => format!("{path}?{q}"),
        None => path.clone(),
    };
    let mut out = Request::builder().method(method.clone()).uri(&uri);
    for (k, v) in parts.headers.iter() {
        if !hop_by_hop(k) {
            out = out.header(k, v);
        }
    }
    let sent = body.clone();
    let out = match out.body(kube::client::Body::from(body)) {
        Ok(r) => r,
        Err(e) => return status_response(400, format!("{{\"message\":\"{e}\"}}").into_bytes()),
    };
    let watch = class.as_ref().is_some_and(|(v, _, _)| v == "watch");
    // The written object's name, for the ordered log of writes.
    let written = class
        .as_ref()
        .filter(|(v, _, _)| requestlog::WRITE_VERBS.contains(&v.as_str()))
        .and_then(|(verb, _, _)| object_name(&path, verb, &sent));
    let sent_at = std::time::Instant::now();
    let result = upstream.send(out).await;
    if !watch {
        let since = started
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        let status = result.as_ref().map_or(0, |r| r.status().as_u16());
        trace_line(&format!(
            "{} {} {status} {method} {uri} {client} body-ms={}",
            since.as_millis(),
            sent_at.elapsed().as_millis(),
            sent_at.duration_since(received).as_millis(),
        ));
    }
    match result {
        Ok(resp) => {
            if let Some((verb, resource, sub)) = &class
                && resp.status().is_success()
            {
                log.record_success(verb, resource, sub, written.clone());
            }
            let (parts, body) = resp.into_parts();
            let mut r = Response::builder().status(parts.status);
            for (k, v) in parts.headers.iter() {
                if !hop_by_hop(k) {
                    r = r.header(k, v);
                }
            }
            let body: Body = if watch {
                Droppable {
                    inner: body,
                    drops: faults.watch_drops(),
                    changed: None,
                }
                .boxed_unsync()
            } else {
                body.map_err(std::io::Error::other).boxed_unsync()
            };
            r.body(body).expect("response")
        }
        Err(e) => status_response(
            502,
            serde_json::to_vec(&serde_json::json!({
                "kind": "Status", "apiVersion": "v1", "status": "Failure", "code": 502,
                "message": format!("captf-faultproxy: the API server did not answer: {e}"),
            }))
            .unwrap_or_default(),
        ),
    }
}

impl FaultProxy {
    /// Starts a proxy in front of the API server of `upstream` (a kubeconfig), and writes
    /// a kubeconfig for the proxy beside it. Must be called within a Tokio runtime.
    pub async fn start(upstream: &Path) -> Result<FaultProxy, String> {
        let kc =
            Kubeconfig::read_from(upstream).map_err(|e| format!("{}: {e}", upstream.display()))?;
        let config = kube::Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
            .await
            .map_err(|e| format!("{}: {e}", upstream.display()))?;
        let upstream_client = kube::Client::try_from(config).map_err(|e| e.to_string())?;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .map_err(|e| e.to_string())?;
        let addr = listener.local_addr().map_err(|e| e.to_string())?;
        let faults = Faults::default();
        let log = RequestLog::default();
        let kubeconfig = std::env::temp_dir().join(format!(
            "captf-faultproxy-{}-{}.kubeconfig",
            std::process::id(),
            addr.port()
        ));
        std::fs::write(
            &kubeconfig,
            format!(
                "apiVersion: v1\nkind: Config\nclusters:\n- name: proxy\n  cluster:\n    server: http://{addr}\nusers:\n- name: proxy\n  user: {{}}\ncontexts:\n- name: proxy\n  context:\n    cluster: proxy\n    user: proxy\ncurrent-context: proxy\n"
            ),
        )
        .map_err(|e| e.to_string())?;
        let (f, l) = (faults.clone(), log.clone());
        let task = tokio::spawn(async move {
            loop {
                let Ok((tcp, _)) = listener.accept().await else {
                    continue;
                };
                // As kube-apiserver's Go server has on every connection: without it, a
                // response the proxy passes on in pieces (its head, then its body as it
                // comes from upstream) waited for the client's delayed ACK, about 40 ms.
                let _ = tcp.set_nodelay(true);
                let (upstream, faults, log) = (upstream_client.clone(), f.clone(), l.clone());
                tokio::spawn(async move {
                    let svc = hyper::service::service_fn(move |req| {
                        let (u, f, l) = (upstream.clone(), faults.clone(), log.clone());
                        async move { Ok::<_, Infallible>(forward(u, f, l, req).await) }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(hyper_util::rt::TokioIo::new(tcp), svc)
                        .await;
                });
            }
        });
        Ok(FaultProxy {
            addr,
            kubeconfig,
            faults,
            log,
            task,
        })
    }

    /// `http://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// A kubeconfig that names the proxy (no credentials: the proxy adds the upstream's).
    pub fn kubeconfig_path(&self) -> &Path {
        &self.kubeconfig
    }

    /// A client whose requests go through the proxy.
    pub fn client(&self) -> kube::Client {
        let config = kube::Config::new(self.url().parse().expect("proxy url"));
        kube::Client::try_from(config).expect("proxy client")
    }

    /// A client whose requests go through the proxy as `user`: they carry
    /// `Impersonate-User`, which the proxy forwards with the upstream's (admin)
    /// credentials, so the API server authorises each as `user` (a ServiceAccount's
    /// name gets its groups).
    pub fn client_as(&self, user: &str) -> kube::Client {
        let mut config = kube::Config::new(self.url().parse().expect("proxy url"));
        config.headers.push((
            http::HeaderName::from_static("impersonate-user"),
            http::HeaderValue::from_str(user).expect("a user name"),
        ));
        kube::Client::try_from(config).expect("proxy client")
    }

    pub fn faults(&self) -> &Faults {
        &self.faults
    }

    pub fn request_log(&self) -> &RequestLog {
        &self.log
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn c(m: &str, p: &str, q: Option<&str>) -> Option<(String, String, String)> {
        classify(&m.parse().unwrap(), p, q)
    }

    fn t(v: &str, r: &str, s: &str) -> Option<(String, String, String)> {
        Some((v.into(), r.into(), s.into()))
    }

    #[test]
    fn requests_are_classified_as_authorization_sees_them() {
        assert_eq!(
            c("GET", "/api/v1/namespaces/a/secrets/s", None),
            t("get", "secrets", "")
        );
        assert_eq!(
            c("GET", "/api/v1/namespaces/a/secrets", None),
            t("list", "secrets", "")
        );
        assert_eq!(
            c("GET", "/api/v1/secrets", Some("watch=true&labelSelector=x")),
            t("watch", "secrets", "")
        );
        assert_eq!(
            c("GET", "/api/v1/namespaces/a", None),
            t("get", "namespaces", "")
        );
        assert_eq!(
            c("PUT", "/api/v1/namespaces/a/finalize", None),
            t("update", "namespaces", "finalize")
        );
        assert_eq!(
            c(
                "PATCH",
                "/apis/infrastructure.cluster.x-k8s.io/v1alpha1/namespaces/a/terraformmachines/w/status",
                None
            ),
            t("patch", "terraformmachines", "status")
        );
        assert_eq!(
            c("POST", "/apis/batch/v1/namespaces/a/jobs", None),
            t("create", "jobs", "")
        );
        assert_eq!(
            c("DELETE", "/api/v1/namespaces/a/secrets", None),
            t("deletecollection", "secrets", "")
        );
        assert_eq!(
            c("DELETE", "/api/v1/namespaces/a/pods/p", None),
            t("delete", "pods", "")
        );
        assert_eq!(
            c(
                "GET",
                "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/x",
                None
            ),
            t("get", "customresourcedefinitions", "")
        );
        assert_eq!(c("GET", "/api", None), None);
        assert_eq!(c("GET", "/apis/batch/v1", None), None);
        assert_eq!(c("GET", "/version", None), None);
    }
}
