//! Watch streams: replay from a resourceVersion out of the store's bounded history (or a
//! synthetic ADDED per current object), then live fan-out; selector transitions become
//! ADDED/DELETED; periodic BOOKMARKs; `410 Expired` ERROR events for compacted versions;
//! `sendInitialEvents` with the `k8s.io/initial-events-end` bookmark; `timeoutSeconds`.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use serde_json::{Value, json};
use tokio::sync::{broadcast, mpsc};

use crate::faults::Faults;
use crate::selectors::{FieldSelector, LabelSelector};
use crate::store::{ApiError, Event, EventType, ResourceType, Store};

/// Interval between BOOKMARK events when `allowWatchBookmarks=true`. The real server sends
/// them about once a minute; a short interval keeps tests quick.
pub const BOOKMARK_INTERVAL: Duration = Duration::from_secs(1);

/// Default watch length when the client gives no `timeoutSeconds` (the real server picks
/// 30–60 minutes).
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(1800);

/// Parsed watch query parameters.
#[derive(Clone, Debug, Default)]
pub struct WatchParams {
    pub resource_version: Option<String>,
    pub bookmarks: bool,
    pub send_initial_events: bool,
    pub timeout: Option<Duration>,
    pub labels: LabelSelector,
    pub fields: FieldSelector,
}

struct Filter {
    rt: ResourceType,
    namespace: Option<String>,
    labels: LabelSelector,
    fields: FieldSelector,
}

impl Filter {
    fn matches(&self, obj: &Value) -> bool {
        self.labels.matches(obj) && self.fields.matches(obj)
    }

    fn same_resource(&self, ev: &Event) -> bool {
        ev.group == self.rt.group
            && ev.plural == self.rt.plural
            && self
                .namespace
                .as_deref()
                .is_none_or(|ns| !self.rt.namespaced || ev.namespace == ns)
    }

    fn present(&self, obj: &Value) -> Value {
        let mut o = obj.clone();
        o["apiVersion"] = json!(self.rt.api_version());
        o["kind"] = json!(self.rt.kind);
        o
    }

    /// The event to send for a store event, if any.
    fn translate(&self, ev: &Event) -> Option<(&'static str, Value)> {
        if !self.same_resource(ev) {
            return None;
        }
        let now = self.matches(&ev.object);
        let kind = match ev.kind {
            EventType::Added => now.then_some("ADDED"),
            EventType::Deleted => now.then_some("DELETED"),
            EventType::Modified => {
                let before = ev.prev.as_ref().map(|p| self.matches(p)).unwrap_or(now);
                match (before, now) {
                    (true, true) => Some("MODIFIED"),
                    (false, true) => Some("ADDED"),
                    (true, false) => Some("DELETED"),
                    (false, false) => None,
                }
            }
        }?;
        Some((kind, self.present(&ev.object)))
    }
}

fn line(kind: &str, object: Value) -> Bytes {
    // The object is moved in: `json!` would copy it through the serializer.
    let mut event = json!({"type": kind});
    event["object"] = object;
    let mut v = serde_json::to_vec(&event).unwrap_or_default();
    v.push(b'\n');
    Bytes::from(v)
}

/// Start a watch; the returned channel yields newline-delimited JSON watch events and closes
/// when the watch ends.
pub(crate) fn start(
    store: &Store,
    faults: &Faults,
    rt: ResourceType,
    namespace: Option<String>,
    params: WatchParams,
) -> Result<mpsc::Receiver<Bytes>, ApiError> {
    let filter = Filter {
        rt,
        namespace,
        labels: params.labels,
        fields: params.fields,
    };
    let rv = match params.resource_version.as_deref() {
        None | Some("") | Some("0") => None,
        Some(s) => Some(
            s.parse::<u64>()
                .map_err(|_| ApiError::bad_request(format!("invalid resourceVersion {s:?}")))?,
        ),
    };
    let (tx, out) = mpsc::channel::<Bytes>(256);
    let mut initial: Vec<Bytes> = Vec::new();
    let (progress, rx) = if params.send_initial_events || rv.is_none() {
        let (cur, items, rx) = store.watch_snapshot(&filter.rt);
        for o in items {
            if filter
                .namespace
                .as_deref()
                .is_none_or(|ns| !filter.rt.namespaced || o["metadata"]["namespace"] == ns)
                && filter.matches(&o)
            {
                initial.push(line("ADDED", o));
            }
        }
        if params.send_initial_events && params.bookmarks {
            initial.push(line(
                "BOOKMARK",
                json!({"kind": filter.rt.kind, "apiVersion": filter.rt.api_version(),
                    "metadata": {"resourceVersion": cur.to_string(), "annotations": {"k8s.io/initial-events-end": "true"}}}),
            ));
        }
        (cur, rx)
    } else {
        match store.watch_from(rv) {
            Ok((cur, history, rx)) => {
                for ev in history {
                    if let Some((k, o)) = filter.translate(&ev) {
                        initial.push(line(k, o));
                    }
                }
                (cur, rx)
            }
            Err(oldest) => {
                let status = ApiError::new(
                    410,
                    "Expired",
                    format!(
                        "too old resource version: {} ({})",
                        rv.unwrap_or(0),
                        oldest + 1
                    ),
                )
                .to_status();
                let _ = tx.try_send(line("ERROR", status));
                return Ok(out);
            }
        }
    };
    let drops = faults.watch_drops();
    let timeout = params.timeout.unwrap_or(DEFAULT_TIMEOUT);
    tokio::spawn(run(
        tx,
        rx,
        drops,
        filter,
        initial,
        progress,
        params.bookmarks,
        timeout,
    ));
    Ok(out)
}

#[allow(clippy::too_many_arguments)]
async fn run(
    tx: mpsc::Sender<Bytes>,
    mut rx: broadcast::Receiver<Arc<Event>>,
    mut drops: tokio::sync::watch::Receiver<u64>,
    filter: Filter,
    initial: Vec<Bytes>,
    mut progress: u64,
    bookmarks: bool,
    timeout: Duration,
) {
    drops.mark_unchanged();
    for b in initial {
        if tx.send(b).await.is_err() {
            return;
        }
    }
    let deadline = tokio::time::sleep(timeout);
    tokio::pin!(deadline);
    let mut tick = tokio::time::interval(BOOKMARK_INTERVAL);
    tick.tick().await;
    loop {
        let ev = tokio::select! {
            _ = tx.closed() => return,
            _ = &mut deadline => return,
            _ = drops.changed() => return,
            _ = tick.tick(), if bookmarks => {
                // Drain what is already queued so the bookmark never claims more than was sent.
                loop {
                    match rx.try_recv() {
                        Ok(ev) => {
                            progress = ev.rv;
                            if let Some((k, o)) = filter.translate(&ev)
                                && tx.send(line(k, o)).await.is_err() { return; }
                        }
                        Err(broadcast::error::TryRecvError::Empty) => break,
                        Err(_) => return,
                    }
                }
                let bm = json!({"kind": filter.rt.kind, "apiVersion": filter.rt.api_version(),
                    "metadata": {"resourceVersion": progress.to_string()}});
                if tx.send(line("BOOKMARK", bm)).await.is_err() { return; }
                continue;
            }
            r = rx.recv() => match r {
                Ok(ev) => ev,
                // Too slow to keep up: end the watch; the client re-lists or resumes.
                Err(_) => return,
            },
        };
        progress = ev.rv;
        if let Some((k, o)) = filter.translate(&ev)
            && tx.send(line(k, o)).await.is_err()
        {
            return;
        }
    }
}
