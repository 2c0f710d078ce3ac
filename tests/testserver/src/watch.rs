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
    /// `rt.api_version()`.
    api_version: String,
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

    /// The object's JSON as this watch sends it (in the watched version): the event's own
    /// JSON, made once for all watches, when the object is stored in that version.
    fn encode(&self, ev: &Event) -> Bytes {
        if ev.object["apiVersion"] == self.api_version.as_str() && ev.object["kind"] == self.rt.kind
        {
            return ev.json();
        }
        let mut o = ev.object.clone();
        o["apiVersion"] = json!(self.api_version);
        o["kind"] = json!(self.rt.kind);
        Bytes::from(serde_json::to_vec(&o).unwrap_or_default())
    }

    /// The event to send for a store event, if any.
    fn translate(&self, ev: &Event) -> Option<Bytes> {
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
        Some(encoded_line(kind, &self.encode(ev)))
    }
}

/// A watch event line around an object already in JSON: the bytes [`line()`] makes (the
/// keys in serde_json's order).
fn encoded_line(kind: &str, object: &[u8]) -> Bytes {
    let mut v = Vec::with_capacity(object.len() + kind.len() + 24);
    v.extend_from_slice(b"{\"object\":");
    v.extend_from_slice(object);
    v.extend_from_slice(b",\"type\":\"");
    v.extend_from_slice(kind.as_bytes());
    v.extend_from_slice(b"\"}\n");
    Bytes::from(v)
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
        api_version: rt.api_version(),
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
                    if let Some(l) = filter.translate(&ev) {
                        initial.push(l);
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
                            if let Some(l) = filter.translate(&ev)
                                && tx.send(l).await.is_err() { return; }
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
        if let Some(l) = filter.translate(&ev)
            && tx.send(l).await.is_err()
        {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each watch sends the object in the version it watches, whether it gets the JSON made
    /// once per event (the stored version) or its own.
    #[tokio::test]
    async fn watches_get_the_object_in_their_version() {
        let store = Store::new();
        store
            .create(
                json!({"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
                "metadata": {"name": "widgets.example.com"},
                "spec": {"group": "example.com", "scope": "Namespaced",
                    "names": {"plural": "widgets", "singular": "widget", "kind": "Widget"},
                    "versions": [{"name": "v1", "served": true, "storage": true},
                        {"name": "v2", "served": true, "storage": false}]}}),
            )
            .expect("crd");
        let from = store.resource_version().to_string();
        let faults = Faults::default();
        let watch = |version: &str, rv: Option<String>| {
            let rt = store
                .resource_type(&format!("example.com/{version}"), "widgets")
                .expect("served");
            let params = WatchParams {
                resource_version: rv,
                ..Default::default()
            };
            start(&store, &faults, rt, None, params).expect("watch")
        };
        // From the history, and from the current state (ADDED for each object), then live.
        let mut watches = vec![
            ("v1", watch("v1", Some(from.clone()))),
            ("v2", watch("v2", Some(from))),
        ];
        let created = store
            .create(json!({"apiVersion": "example.com/v1", "kind": "Widget",
                "metadata": {"name": "w", "namespace": "default"}, "spec": {"size": 1}}))
            .expect("widget");
        watches.push(("v1", watch("v1", None)));
        watches.push(("v2", watch("v2", None)));
        let mut updated = created.clone();
        updated["spec"]["size"] = json!(2);
        let updated = store.update(updated).expect("update");
        for (i, (version, rx)) in watches.iter_mut().enumerate() {
            for (kind, obj) in [("ADDED", &created), ("MODIFIED", &updated)] {
                let got = tokio::time::timeout(Duration::from_secs(5), rx.recv())
                    .await
                    .expect("in time")
                    .expect("an event");
                let mut o = obj.clone();
                o["apiVersion"] = json!(format!("example.com/{version}"));
                let parse = |b: &[u8]| serde_json::from_slice::<Value>(b).expect("JSON");
                assert!(got.ends_with(b"\n"), "one line");
                assert_eq!(
                    parse(&got),
                    parse(&line(kind, o)),
                    "watch {i} ({version}), {kind}"
                );
            }
        }
    }
}
