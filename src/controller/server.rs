//! The health and readiness probes and the metrics endpoint.

use std::collections::{BTreeMap, HashMap};
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tracing::warn;

use super::metrics_auth::{MetricsAuth, Verdict};
use crate::api::names::Kind;
use crate::metrics::Metrics;
use crate::state::permits::StateReads;

/// [`super::ManagerConfig::stalled_after`]'s default: three times the resync, so a
/// controller that has objects and has finished no pass for that long is stuck.
pub const STALLED_AFTER: Duration = Duration::from_secs(1800);

/// Whether a kind's controller has objects to look at (objects carrying its finalizer:
/// each is looked at again at least every resync).
pub type HasWork = Arc<dyn Fn() -> bool + Send + Sync>;

/// What the probes know of one kind's controller.
struct Watched {
    /// Its caches had their first lists.
    synced: bool,
    /// When its latest pass ended (or the controller started).
    last_end: Instant,
    /// The passes under way: when each started, and its object.
    running: HashMap<u64, (Instant, String)>,
    has_work: HasWork,
}

/// What the probes answer from: readiness (once the controllers run, after leader
/// election when it is on, and their caches had their first lists), and what makes the
/// manager unhealthy: a pass starved of a state-read permit, a controller that finishes
/// no pass while it has objects, a pass that does not end.
pub struct Probes {
    running: AtomicBool,
    state_reads: Arc<StateReads>,
    /// A pass waiting this long for a state-read permit means the manager is stuck: a read
    /// takes seconds at most, and the passes that hold permits end.
    starved_after: Duration,
    /// A controller with objects finishing no pass for this long, or a pass running this
    /// long, means the manager is stuck.
    stalled_after: Duration,
    controllers: Mutex<BTreeMap<Kind, Watched>>,
    next_pass: AtomicU64,
}

/// A pass under way, counted by the probes until it is dropped.
pub struct Pass<'a> {
    probes: &'a Probes,
    kind: Kind,
    id: u64,
}

impl Drop for Pass<'_> {
    fn drop(&mut self) {
        let mut all = self.probes.lock();
        if let Some(w) = all.get_mut(&self.kind) {
            w.running.remove(&self.id);
            w.last_end = Instant::now();
        }
    }
}

impl Probes {
    pub fn new(
        state_reads: Arc<StateReads>,
        starved_after: Duration,
        stalled_after: Duration,
    ) -> Probes {
        Probes {
            running: AtomicBool::new(false),
            state_reads,
            starved_after,
            stalled_after,
            controllers: Mutex::new(BTreeMap::new()),
            next_pass: AtomicU64::new(0),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<Kind, Watched>> {
        self.controllers.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The state-read permits the probe watches.
    pub fn state_reads(&self) -> Arc<StateReads> {
        self.state_reads.clone()
    }

    /// The controllers run (true) or stop (false, at a shutdown).
    pub fn set_running(&self, on: bool) {
        self.running.store(on, Ordering::Relaxed);
    }

    /// Kind `kind`'s controller starts (again): not synced yet, no pass under way.
    pub fn controller_started(&self, kind: Kind, has_work: HasWork) {
        self.lock().insert(
            kind,
            Watched {
                synced: false,
                last_end: Instant::now(),
                running: HashMap::new(),
                has_work,
            },
        );
    }

    /// Kind `kind`'s caches had their first lists.
    pub fn synced(&self, kind: Kind) {
        if let Some(w) = self.lock().get_mut(&kind) {
            w.synced = true;
        }
    }

    /// Counts a pass of kind `kind` over `object` until the returned guard is dropped.
    pub fn pass(&self, kind: Kind, object: String) -> Pass<'_> {
        let id = self.next_pass.fetch_add(1, Ordering::Relaxed);
        if let Some(w) = self.lock().get_mut(&kind) {
            w.running.insert(id, (Instant::now(), object));
        }
        Pass {
            probes: self,
            kind,
            id,
        }
    }

    /// Why the manager is not ready, if it is not.
    pub fn not_ready(&self) -> Option<String> {
        if !self.running.load(Ordering::Relaxed) {
            return Some(
                "not ready: the controllers do not run (waiting to lead, or shutting down)".into(),
            );
        }
        let all = self.lock();
        let unsynced: Vec<&str> = Kind::ALL
            .iter()
            .filter(|k| !all.get(k).is_some_and(|w| w.synced))
            .map(|k| k.as_str())
            .collect();
        (!unsynced.is_empty()).then(|| {
            format!(
                "not ready: the caches of the {} controller(s) have not had their first lists",
                unsynced.join(", ")
            )
        })
    }

    /// Why the manager is unhealthy, if it is.
    pub fn unhealthy(&self) -> Option<String> {
        self.unhealthy_at(Instant::now())
    }

    fn unhealthy_at(&self, now: Instant) -> Option<String> {
        if let Some(waited) = self.state_reads.longest_wait()
            && waited >= self.starved_after
        {
            return Some(format!(
                "a pass has waited {}s for a state-read permit (--max-state-reads {}, unhealthy after {}s): the passes holding the permits do not end",
                waited.as_secs(),
                self.state_reads.max(),
                self.starved_after.as_secs()
            ));
        }
        let limit = self.stalled_after;
        for (kind, w) in self.lock().iter() {
            if let Some((started, object)) = w
                .running
                .values()
                .min_by_key(|(started, _)| *started)
                .filter(|(started, _)| now.saturating_duration_since(*started) >= limit)
            {
                return Some(format!(
                    "a {kind} pass over {object} has run for {}s (unhealthy after {}s, --stalled-after): it does not end",
                    now.saturating_duration_since(*started).as_secs(),
                    limit.as_secs()
                ));
            }
            let idle = now.saturating_duration_since(w.last_end);
            if idle >= limit && (w.has_work)() {
                return Some(format!(
                    "the {kind} controller has finished no pass for {}s while it has objects, each due again at least every {}s (unhealthy after {}s, --stalled-after): it is stuck",
                    idle.as_secs(),
                    super::reconcile::RESYNC.as_secs(),
                    limit.as_secs()
                ));
            }
        }
        None
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
        "/readyz" => match probes.not_ready() {
            None => (StatusCode::OK, "ok".to_string()),
            Some(why) => (StatusCode::SERVICE_UNAVAILABLE, why),
        },
        "/metrics" => (StatusCode::OK, metrics.render()),
        _ => (StatusCode::NOT_FOUND, "not found".to_string()),
    };
    let content_type = if req.uri().path() == "/metrics" {
        METRICS_TYPE
    } else {
        TEXT_TYPE
    };
    Ok(respond(status, body, content_type))
}

const METRICS_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";
const TEXT_TYPE: &str = "text/plain; charset=utf-8";

fn respond(status: StatusCode, body: String, content_type: &'static str) -> Response<Full<Bytes>> {
    let mut resp = Response::new(Full::new(Bytes::from(body)));
    *resp.status_mut() = status;
    resp.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static(content_type),
    );
    resp
}

/// `/metrics` to a caller the API server authenticates and allows (see
/// [`MetricsAuth`]); nothing else is served on the secure port.
async fn handle_secure(
    req: Request<Incoming>,
    metrics: Arc<Metrics>,
    auth: Arc<MetricsAuth>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    if req.uri().path() != "/metrics" {
        return Ok(respond(
            StatusCode::NOT_FOUND,
            "not found".into(),
            TEXT_TYPE,
        ));
    }
    let header = req
        .headers()
        .get(hyper::header::AUTHORIZATION)
        .and_then(|h| h.to_str().ok());
    Ok(match auth.check(header).await {
        Verdict::Allowed => respond(StatusCode::OK, metrics.render(), METRICS_TYPE),
        Verdict::Unauthenticated(why) => respond(StatusCode::UNAUTHORIZED, why, TEXT_TYPE),
        Verdict::Forbidden(why) => respond(StatusCode::FORBIDDEN, why, TEXT_TYPE),
        Verdict::Unknown(why) => {
            warn!(%why, "a scrape of /metrics could not be authorized");
            respond(StatusCode::INTERNAL_SERVER_ERROR, why, TEXT_TYPE)
        }
    })
}

/// Serves `/metrics` over TLS (`tls`) on `addr`, to callers `auth` allows, until the
/// process ends.
pub async fn serve_metrics_secure(
    addr: SocketAddr,
    tls: tokio_rustls::TlsAcceptor,
    metrics: Arc<Metrics>,
    auth: Arc<MetricsAuth>,
) -> std::io::Result<()> {
    accept_forever(addr, "metrics", move |stream| {
        let (tls, metrics, auth) = (tls.clone(), metrics.clone(), auth.clone());
        async move {
            match tls.accept(stream).await {
                Ok(s) => Some((
                    TokioIo::new(s),
                    service_fn(move |req| handle_secure(req, metrics.clone(), auth.clone())),
                )),
                Err(e) => {
                    tracing::debug!(error = %e, "a metrics connection's TLS handshake failed");
                    None
                }
            }
        }
    })
    .await
}

/// Serves `/healthz`, `/readyz` and `/metrics` on `addr` until the process ends.
pub async fn serve(
    addr: SocketAddr,
    metrics: Arc<Metrics>,
    probes: Arc<Probes>,
) -> std::io::Result<()> {
    accept_forever(addr, "probe", move |stream| {
        let (metrics, probes) = (metrics.clone(), probes.clone());
        async move {
            Some((
                TokioIo::new(stream),
                service_fn(move |req| handle(req, metrics.clone(), probes.clone())),
            ))
        }
    })
    .await
}

/// Binds `addr` and serves each connection, once `open` made it ready (a TLS handshake,
/// or nothing), with the service `open` gives, until the process ends.
async fn accept_forever<F, Fut, I, S>(
    addr: SocketAddr,
    what: &'static str,
    open: F,
) -> std::io::Result<()>
where
    F: Fn(tokio::net::TcpStream) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Option<(I, S)>> + Send + 'static,
    I: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
    S: hyper::service::Service<
            Request<Incoming>,
            Response = Response<Full<Bytes>>,
            Error = Infallible,
        > + Send
        + 'static,
    S::Future: Send + 'static,
{
    let listener = TcpListener::bind(addr).await?;
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            let opened = open(stream);
            tokio::spawn(async move {
                let Some((io, svc)) = opened.await else {
                    return;
                };
                if let Err(e) = http1::Builder::new().serve_connection(io, svc).await {
                    warn!(error = %e, "{what} connection failed");
                }
            });
        }
    });
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIMIT: Duration = Duration::from_secs(1800);

    fn probes(has_work: bool) -> Probes {
        let p = Probes::new(
            Arc::new(StateReads::new(2)),
            Duration::from_secs(600),
            LIMIT,
        );
        for kind in Kind::ALL {
            p.controller_started(kind, Arc::new(move || has_work));
        }
        p
    }

    #[test]
    fn ready_only_once_running_and_every_cache_had_its_first_list() {
        let p = probes(true);
        assert!(p.not_ready().expect("not running").contains("do not run"));
        p.set_running(true);
        let why = p.not_ready().expect("not synced");
        assert!(
            why.contains("TerraformCluster, TerraformMachine, TerraformMachinePool"),
            "{why}"
        );
        p.synced(Kind::TerraformCluster);
        p.synced(Kind::TerraformMachine);
        let why = p.not_ready().expect("one not synced");
        assert!(why.contains("the TerraformMachinePool controller"), "{why}");
        p.synced(Kind::TerraformMachinePool);
        assert_eq!(p.not_ready(), None);
        // Started again (Cluster API's kind appeared): not ready until synced again.
        p.controller_started(Kind::TerraformMachine, Arc::new(|| true));
        assert!(p.not_ready().is_some());
        p.set_running(false);
        assert!(p.not_ready().expect("stopping").contains("do not run"));
    }

    #[test]
    fn a_controller_with_objects_that_finishes_no_pass_is_unhealthy() {
        let p = probes(true);
        let now = Instant::now();
        assert_eq!(p.unhealthy_at(now), None);
        assert_eq!(p.unhealthy_at(now + LIMIT - Duration::from_secs(1)), None);
        let why = p
            .unhealthy_at(now + LIMIT + Duration::from_secs(1))
            .expect("stalled");
        assert!(
            why.contains("controller has finished no pass for 18"),
            "{why}"
        );
        assert!(why.contains("--stalled-after"), "{why}");
        // Without objects nothing is due: idle is fine.
        let idle = probes(false);
        assert_eq!(idle.unhealthy_at(now + LIMIT * 3), None);
        // A pass that ends moves the clock on.
        drop(p.pass(Kind::TerraformMachine, "team-a/web-1".into()));
        let later = Instant::now();
        for kind in [Kind::TerraformCluster, Kind::TerraformMachinePool] {
            drop(p.pass(kind, "team-a/x".into()));
        }
        assert_eq!(p.unhealthy_at(later + LIMIT - Duration::from_secs(1)), None);
    }

    #[test]
    fn a_pass_that_does_not_end_is_unhealthy_and_named() {
        let p = probes(false);
        let pass = p.pass(Kind::TerraformMachine, "team-a/web-1".into());
        let now = Instant::now();
        assert_eq!(p.unhealthy_at(now + LIMIT - Duration::from_secs(1)), None);
        let why = p
            .unhealthy_at(now + LIMIT + Duration::from_secs(1))
            .expect("a pass runs");
        assert!(
            why.contains("a TerraformMachine pass over team-a/web-1 has run for"),
            "{why}"
        );
        drop(pass);
        assert_eq!(p.unhealthy_at(now + LIMIT + Duration::from_secs(1)), None);
    }
}
