//! The health and readiness probes and the metrics endpoint.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tracing::warn;

use crate::metrics::Metrics;
use crate::state::permits::StateReads;

/// What the probes answer from: readiness (true once the controllers run, after leader
/// election when it is on), and what makes the manager unhealthy.
pub struct Probes {
    pub ready: AtomicBool,
    state_reads: Arc<StateReads>,
    /// A pass waiting this long for a state-read permit means the manager is stuck: a read
    /// takes seconds at most, and the passes that hold permits end.
    starved_after: Duration,
}

impl Probes {
    pub fn new(state_reads: Arc<StateReads>, starved_after: Duration) -> Probes {
        Probes {
            ready: AtomicBool::new(false),
            state_reads,
            starved_after,
        }
    }

    /// Why the manager is unhealthy, if it is.
    pub fn unhealthy(&self) -> Option<String> {
        let waited = self.state_reads.longest_wait()?;
        (waited >= self.starved_after).then(|| {
            format!(
                "a pass has waited {}s for a state-read permit (--max-state-reads {}, unhealthy after {}s): the passes holding the permits do not end",
                waited.as_secs(),
                self.state_reads.max(),
                self.starved_after.as_secs()
            )
        })
    }
}

async fn handle(
    req: Request<Incoming>,
    metrics: Arc<Metrics>,
    probes: Arc<Probes>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let (status, body) = match req.uri().path() {
        "/healthz" | "/livez" => match probes.unhealthy() {
            None => (StatusCode::OK, "ok".to_string()),
            Some(why) => {
                warn!(%why, "the health probe fails");
                (StatusCode::SERVICE_UNAVAILABLE, why)
            }
        },
        "/readyz" if probes.ready.load(Ordering::Relaxed) => (StatusCode::OK, "ok".to_string()),
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
    probes: Arc<Probes>,
) -> std::io::Result<()> {
    let listener = TcpListener::bind(addr).await?;
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            let (metrics, probes) = (metrics.clone(), probes.clone());
            tokio::spawn(async move {
                let svc = service_fn(move |req| handle(req, metrics.clone(), probes.clone()));
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
