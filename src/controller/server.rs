//! The health and readiness probes and the metrics endpoint.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tracing::warn;

use crate::metrics::Metrics;

/// Readiness: true once the controllers run (after leader election when it is on).
#[derive(Default)]
pub struct Ready(pub AtomicBool);

async fn handle(
    req: Request<Incoming>,
    metrics: Arc<Metrics>,
    ready: Arc<Ready>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let (status, body) = match req.uri().path() {
        "/healthz" | "/livez" => (StatusCode::OK, "ok".to_string()),
        "/readyz" if ready.0.load(Ordering::Relaxed) => (StatusCode::OK, "ok".to_string()),
        "/readyz" => (StatusCode::SERVICE_UNAVAILABLE, "not ready".to_string()),
        "/metrics" => (StatusCode::OK, metrics.render()),
        _ => (StatusCode::NOT_FOUND, "not found".to_string()),
    };
    let content_type = if req.uri().path() == "/metrics" {
        "application/openmetrics-text; version=1.0.0; charset=utf-8"
    } else {
        "text/plain; charset=utf-8"
    };
    let mut resp = Response::new(Full::new(Bytes::from(body)));
    *resp.status_mut() = status;
    resp.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static(content_type),
    );
    Ok(resp)
}

/// Serves `/healthz`, `/readyz` and `/metrics` on `addr` until the process ends.
pub async fn serve(
    addr: SocketAddr,
    metrics: Arc<Metrics>,
    ready: Arc<Ready>,
) -> std::io::Result<()> {
    let listener = TcpListener::bind(addr).await?;
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            let (metrics, ready) = (metrics.clone(), ready.clone());
            tokio::spawn(async move {
                let svc = service_fn(move |req| handle(req, metrics.clone(), ready.clone()));
                if let Err(e) = http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), svc)
                    .await
                {
                    warn!(error = %e, "probe connection failed");
                }
            });
        }
    });
    Ok(())
}
