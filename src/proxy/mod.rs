//! `captf state-proxy`: the sidecar of a runner Pod that alone holds the Pod's
//! ServiceAccount token (manager flag `--state-proxy-image`). Terraform's kubernetes
//! backend in the runner container talks to it over the Pod's loopback, without
//! credentials, and it passes on to the API server, with the token, only what
//! [`policy`] allows: the object's own state Secrets and lock Lease. So a module's code,
//! which runs in the runner container, holds no credentials for the API server and
//! reaches no Secret of the namespace but its own state (`docs/tenancy.md`).
//!
//! It listens on `127.0.0.1` on a port the system picks and writes the port to a file
//! in a volume the runner shares (a Pod's containers share its network namespace; a
//! fixed port would be taken on a node whose Pods share the host's, as the test
//! control plane's do), and serves until SIGTERM, which the kubelet sends a native
//! sidecar once the runner container has ended.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::Path;

use http_body_util::{BodyExt, Either, Full, Limited};
use hyper::body::Bytes;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode, header};
use hyper_util::rt::TokioIo;
use serde_json::json;
use tokio::net::TcpListener;

pub mod policy;

pub use policy::Scope;

/// The largest request body passed on: a Secret's data is at most 1 MiB, which base64
/// and JSON make about 1.4 MB; Terraform cuts larger states into parts.
pub const MAX_BODY: usize = 4 * 1024 * 1024;

type ProxyBody = Either<Full<Bytes>, kube::client::Body>;

/// Serves `scope`'s state through `client` until SIGTERM or SIGINT, after writing the
/// port it listens on to `port_file`.
pub async fn run(scope: Scope, port_file: &Path, client: kube::Client) -> Result<(), String> {
    let listener = TcpListener::bind(SocketAddr::from(([127, 0, 0, 1], 0)))
        .await
        .map_err(|e| format!("listening on 127.0.0.1: {e}"))?;
    let port = listener
        .local_addr()
        .map_err(|e| format!("reading the port listened on: {e}"))?
        .port();
    write_port(port_file, port)?;
    eprintln!(
        "captf state-proxy: serving the state {} of namespace {} on 127.0.0.1:{port}",
        scope.suffix, scope.namespace
    );
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .map_err(|e| format!("handling SIGTERM: {e}"))?;
    loop {
        let (stream, _) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    eprintln!("captf state-proxy: accepting a connection: {e}");
                    continue;
                }
            },
            _ = term.recv() => break,
            _ = tokio::signal::ctrl_c() => break,
        };
        let (scope, client) = (scope.clone(), client.clone());
        tokio::spawn(async move {
            let service = service_fn(move |req| {
                let (scope, client) = (scope.clone(), client.clone());
                async move { Ok::<_, Infallible>(handle(&scope, &client, req).await) }
            });
            if let Err(e) = http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await
            {
                eprintln!("captf state-proxy: a connection ended: {e}");
            }
        });
    }
    eprintln!("captf state-proxy: stopping (signalled)");
    Ok(())
}

/// Writes `port` to `path` whole: to a file beside it, then renamed, so that the runner
/// never reads half of it.
fn write_port(path: &Path, port: u16) -> Result<(), String> {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, format!("{port}\n"))
        .and_then(|()| std::fs::rename(&tmp, path))
        .map_err(|e| format!("writing the port to {}: {e}", path.display()))
}

/// One request: refused with a Kubernetes `Status` unless the policy allows it, else
/// passed on with the proxy's credentials and its answer passed back as it streams.
async fn handle<B>(scope: &Scope, client: &kube::Client, req: Request<B>) -> Response<ProxyBody>
where
    B: hyper::body::Body<Data = Bytes>,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let (parts, body) = req.into_parts();
    let method = parts.method.as_str().to_string();
    let path = parts.uri.path().to_string();
    let forward = match policy::route(scope, &method, &path, parts.uri.query()) {
        Ok(f) => f,
        Err(why) => return refused(StatusCode::FORBIDDEN, "Forbidden", &why.0),
    };
    let bytes = match Limited::new(body, MAX_BODY).collect().await {
        Ok(b) => b.to_bytes(),
        Err(e) => {
            let why = format!(
                "{method} {path}: the body could not be read (at most {MAX_BODY} bytes are passed on): {e}"
            );
            return refused(StatusCode::PAYLOAD_TOO_LARGE, "RequestEntityTooLarge", &why);
        }
    };
    if let Some(resource) = forward.create {
        let content_type = parts
            .headers
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok());
        let checked = policy::create_content_type(content_type)
            .and_then(|()| {
                serde_json::from_slice::<serde_json::Value>(&bytes).map_err(|e| {
                    policy::Refusal(format!(
                        "{method} {path}: a create whose body is not JSON: {e}"
                    ))
                })
            })
            .and_then(|v| policy::created_name(scope, resource, &v));
        if let Err(why) = checked {
            return refused(StatusCode::FORBIDDEN, "Forbidden", &why.0);
        }
    }
    let mut out = Request::builder()
        .method(parts.method.clone())
        .uri(&forward.path_and_query);
    for name in [header::CONTENT_TYPE, header::ACCEPT] {
        if let Some(v) = parts.headers.get(&name) {
            out = out.header(name, v.clone());
        }
    }
    let out = match out.body(kube::client::Body::from(bytes)) {
        Ok(r) => r,
        Err(e) => {
            let why = format!("{method} {path}: {e}");
            return refused(StatusCode::BAD_REQUEST, "BadRequest", &why);
        }
    };
    match client.send(out).await {
        Ok(resp) => {
            let (rparts, rbody) = resp.into_parts();
            let mut back = Response::builder().status(rparts.status);
            for name in [
                header::CONTENT_TYPE,
                header::CONTENT_ENCODING,
                header::WARNING,
            ] {
                for v in rparts.headers.get_all(&name) {
                    back = back.header(name.clone(), v.clone());
                }
            }
            back.body(Either::Right(rbody)).unwrap_or_else(|e| {
                local(
                    StatusCode::BAD_GATEWAY,
                    "text/plain",
                    Bytes::from(e.to_string()),
                )
            })
        }
        Err(e) => {
            let why = format!("{method} {path}: the API server could not be reached: {e}");
            eprintln!("captf state-proxy: {why}");
            refused(StatusCode::BAD_GATEWAY, "ServiceUnavailable", &why)
        }
    }
}

fn local(status: StatusCode, content_type: &str, body: Bytes) -> Response<ProxyBody> {
    let mut r = Response::new(Either::Left(Full::new(body)));
    *r.status_mut() = status;
    if let Ok(v) = header::HeaderValue::from_str(content_type) {
        r.headers_mut().insert(header::CONTENT_TYPE, v);
    }
    r
}

/// A refusal as the API server words one (a `Status`), so that Terraform prints it.
fn refused(status: StatusCode, reason: &str, why: &str) -> Response<ProxyBody> {
    eprintln!("captf state-proxy: refused: {why}");
    let body = json!({
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": format!("captf state-proxy: {why}"),
        "reason": reason,
        "code": status.as_u16(),
    });
    local(status, "application/json", Bytes::from(body.to_string()))
}
