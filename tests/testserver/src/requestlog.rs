//! Counts of served requests by (verb, resource, subresource), for write-count benchmarks.
//! Only resource requests are counted (not discovery); requests failed by the fault switch count.

use std::collections::BTreeMap;
use std::io::Write;
use std::sync::{Arc, LazyLock, Mutex, MutexGuard};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

type Counts = BTreeMap<(String, String, String), u64>;
type ClientCounts = BTreeMap<(String, String, String, String), u64>;

/// Request counters. Cloning shares the counters.
#[derive(Clone, Debug, Default)]
pub struct RequestLog {
    counts: Arc<Mutex<Counts>>,
    by_client: Arc<Mutex<ClientCounts>>,
}

/// The client of a request: its `User-Agent` up to the first `/` or space (`kube-rs`,
/// `kubectl`, `HashiCorp`, `curl`, …), or `-` without one.
pub fn client_of(user_agent: Option<&str>) -> String {
    match user_agent.map(str::trim) {
        Some(ua) if !ua.is_empty() => ua.split(['/', ' ']).next().unwrap_or_default().to_string(),
        _ => "-".into(),
    }
}

/// Verbs that write.
pub const WRITE_VERBS: [&str; 5] = ["create", "update", "patch", "delete", "deletecollection"];

impl RequestLog {
    fn lock(&self) -> MutexGuard<'_, Counts> {
        self.counts.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn record(&self, client: &str, verb: &str, resource: &str, subresource: &str) {
        *self
            .lock()
            .entry((verb.into(), resource.into(), subresource.into()))
            .or_default() += 1;
        *self
            .by_client
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry((
                client.into(),
                verb.into(),
                resource.into(),
                subresource.into(),
            ))
            .or_default() += 1;
    }

    /// All counters by client (see [`client_of`]): (client, verb, resource, subresource)
    /// -> count.
    pub fn snapshot_by_client(&self) -> BTreeMap<(String, String, String, String), u64> {
        self.by_client
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Requests with this verb, resource (plural) and subresource ("" for the main resource).
    pub fn count(&self, verb: &str, resource: &str, subresource: &str) -> u64 {
        self.lock()
            .get(&(verb.into(), resource.into(), subresource.into()))
            .copied()
            .unwrap_or(0)
    }

    /// Write requests (create, update, patch, delete, deletecollection) on a resource's main
    /// resource (`subresource == ""`) or on one subresource.
    pub fn writes(&self, resource: &str, subresource: &str) -> u64 {
        WRITE_VERBS
            .iter()
            .map(|v| self.count(v, resource, subresource))
            .sum()
    }

    /// All counters: (verb, resource, subresource) -> count.
    pub fn snapshot(&self) -> BTreeMap<(String, String, String), u64> {
        self.lock().clone()
    }

    /// Zero every counter.
    pub fn reset(&self) {
        self.lock().clear();
        self.by_client
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clear();
    }
}

/// The request trace, for investigations: with `CAPTF_TESTSERVER_TRACE=FILE` set, every
/// request is appended to FILE as one line when its response head is ready:
/// `<unix start, µs> <µs to the response head> <status> <method> <uri> <client>`. A watch's
/// line is written when the watch starts streaming. Off (and free) without the variable.
static TRACE: LazyLock<Option<Mutex<std::io::BufWriter<std::fs::File>>>> = LazyLock::new(|| {
    let path = std::env::var_os("CAPTF_TESTSERVER_TRACE")?;
    let file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
        .inspect_err(|e| eprintln!("captf-testserver: CAPTF_TESTSERVER_TRACE {path:?}: {e}"))
        .ok()?;
    Some(Mutex::new(std::io::BufWriter::new(file)))
});

pub(crate) fn tracing_on() -> bool {
    TRACE.is_some()
}

pub(crate) fn trace(started: Instant, line: &str, status: u16) {
    let Some(trace) = TRACE.as_ref() else { return };
    let took = started.elapsed();
    let start = SystemTime::now()
        .checked_sub(took)
        .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
        .unwrap_or_default();
    let mut w = trace.lock().unwrap_or_else(|e| e.into_inner());
    // The buffer is flushed per line so that a trace read while the server runs is whole.
    let _ = writeln!(
        w,
        "{} {} {status} {line}",
        start.as_micros(),
        took.as_micros()
    );
    let _ = w.flush();
}
