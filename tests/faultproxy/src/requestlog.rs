//! Counts of served requests by (verb, resource, subresource), for write-count benchmarks.
//! Only resource requests are counted (not discovery); requests failed by the fault switch count.
//! Counted per client too (by `User-Agent`).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};

type Counts = BTreeMap<(String, String, String), u64>;
type ClientCounts = BTreeMap<(String, String, String, String), u64>;

/// One write the API server carried out, in the order the proxy saw the answers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Write {
    pub verb: String,
    pub resource: String,
    pub subresource: String,
    /// The object's name: from the path, or for a create from the body's metadata.
    pub name: String,
}

/// How many writes [`RequestLog::writes_in_order`] keeps (the oldest go first).
const WRITES_KEPT: usize = 100_000;

/// Request counters. Cloning shares the counters.
#[derive(Clone, Debug, Default)]
pub struct RequestLog {
    counts: Arc<Mutex<Counts>>,
    by_client: Arc<Mutex<ClientCounts>>,
    /// Requests the API server answered with a 2xx status.
    succeeded: Arc<Mutex<Counts>>,
    /// The successful writes, in order (at most [`WRITES_KEPT`]).
    in_order: Arc<Mutex<Vec<Write>>>,
    /// GETs of one object, by resource and name.
    gets: Arc<Mutex<BTreeMap<(String, String), u64>>>,
}

/// The client of a request: its `User-Agent` (`captf/0.1.0 (manager)`,
/// `HashiCorp/1.0 Terraform/1.11.4`, `kubectl/v1.34.1 (linux/amd64) …`), cut to 80
/// characters, or `-` without one.
pub fn client_of(user_agent: Option<&str>) -> String {
    match user_agent.map(str::trim) {
        Some(ua) if !ua.is_empty() => ua.chars().take(80).collect(),
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

    /// A GET of the object `name` of `resource` (its main resource).
    pub(crate) fn record_get(&self, resource: &str, name: &str) {
        *self
            .gets
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry((resource.into(), name.into()))
            .or_default() += 1;
    }

    /// GETs of one object, by (resource, name), for a bench to say which objects it read.
    pub fn gets_by_name(&self) -> BTreeMap<(String, String), u64> {
        self.gets.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// GETs of the object `name` of `resource` (in any namespace).
    pub fn gets_of(&self, resource: &str, name: &str) -> u64 {
        self.gets
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&(resource.to_string(), name.to_string()))
            .copied()
            .unwrap_or(0)
    }

    pub(crate) fn record_success(
        &self,
        verb: &str,
        resource: &str,
        subresource: &str,
        name: Option<String>,
    ) {
        if WRITE_VERBS.contains(&verb) {
            let mut in_order = self.in_order.lock().unwrap_or_else(|e| e.into_inner());
            if in_order.len() >= WRITES_KEPT {
                in_order.remove(0);
            }
            in_order.push(Write {
                verb: verb.into(),
                resource: resource.into(),
                subresource: subresource.into(),
                name: name.unwrap_or_default(),
            });
        }
        *self
            .succeeded
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry((verb.into(), resource.into(), subresource.into()))
            .or_default() += 1;
    }

    /// Writes the API server carried out (answered 2xx): a create of something that exists
    /// (409) or an injected failure is not one.
    pub fn writes_done(&self) -> u64 {
        self.succeeded
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .filter(|((verb, _, _), _)| WRITE_VERBS.contains(&verb.as_str()))
            .map(|(_, n)| *n)
            .sum()
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

    /// The writes the API server carried out since the last [`reset`](Self::reset), in
    /// the order their answers passed the proxy.
    pub fn writes_in_order(&self) -> Vec<Write> {
        self.in_order
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Zero every counter.
    pub fn reset(&self) {
        self.lock().clear();
        self.in_order
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clear();
        self.succeeded
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clear();
        self.by_client
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clear();
        self.gets.lock().unwrap_or_else(|e| e.into_inner()).clear();
    }
}
