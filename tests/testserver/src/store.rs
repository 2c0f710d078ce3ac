//! The object store: every object as a `serde_json::Value`, one global resourceVersion
//! counter, the served resource types (built-in and from CRDs), and a bounded event history
//! that watches replay from. Models the apiserver registry's create/update/delete semantics
//! (generation, status subresource, finalizers, graceful Pod deletion, propagation policy);
//! the asynchronous controllers (GC, namespace lifecycle, Job runner) live in their own modules.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

use base64::Engine;
use bytes::Bytes;
use serde_json::{Map, Value, json};
use tokio::sync::{broadcast, watch};

use crate::crds;

/// How many watch events are kept for watches that resume from a resourceVersion.
pub const HISTORY_LIMIT: usize = 10_000;

/// Finalizer the garbage collector uses for foreground deletion.
pub const FOREGROUND_FINALIZER: &str = "foregroundDeletion";

/// One served resource in one version (a CRD with two served versions gives two entries).
#[derive(Clone, Debug, PartialEq)]
pub struct ResourceType {
    /// API group, "" for the core group.
    pub group: String,
    pub version: String,
    pub plural: String,
    pub singular: String,
    pub kind: String,
    pub namespaced: bool,
    pub short_names: Vec<String>,
    pub categories: Vec<String>,
    /// Has a `/status` subresource (main-resource writes then ignore `status`).
    pub status_subresource: bool,
    /// Name of the CRD that defines this resource, `None` for built-ins.
    pub crd: Option<String>,
}

impl ResourceType {
    pub fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.clone()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }

    /// `plural` or `plural.group`, as the apiserver names resources in messages.
    pub fn qualified(&self) -> String {
        if self.group.is_empty() {
            self.plural.clone()
        } else {
            format!("{}.{}", self.plural, self.group)
        }
    }

    fn is(&self, group: &str, plural: &str) -> bool {
        self.group == group && self.plural == plural
    }
}

/// An API error, rendered as a `Status` object (`kind: Status`, `status: Failure`).
#[derive(Clone, Debug, PartialEq)]
pub struct ApiError {
    pub code: u16,
    pub reason: String,
    pub message: String,
    pub details: Option<Value>,
}

impl ApiError {
    pub fn new(code: u16, reason: &str, message: impl Into<String>) -> ApiError {
        ApiError {
            code,
            reason: reason.to_string(),
            message: message.into(),
            details: None,
        }
    }

    pub fn with_details(mut self, details: Value) -> ApiError {
        self.details = Some(details);
        self
    }

    pub fn bad_request(message: impl Into<String>) -> ApiError {
        ApiError::new(400, "BadRequest", message)
    }

    pub fn not_found(rt: &ResourceType, name: &str) -> ApiError {
        ApiError::new(
            404,
            "NotFound",
            format!("{} \"{}\" not found", rt.qualified(), name),
        )
        .with_details(details(rt, name))
    }

    pub fn already_exists(rt: &ResourceType, name: &str) -> ApiError {
        ApiError::new(
            409,
            "AlreadyExists",
            format!("{} \"{}\" already exists", rt.qualified(), name),
        )
        .with_details(details(rt, name))
    }

    pub fn conflict(rt: &ResourceType, name: &str, why: &str) -> ApiError {
        ApiError::new(
            409,
            "Conflict",
            format!(
                "Operation cannot be fulfilled on {} \"{}\": {}",
                rt.qualified(),
                name,
                why
            ),
        )
        .with_details(details(rt, name))
    }

    pub fn invalid(rt: &ResourceType, name: &str, field: &str, message: &str) -> ApiError {
        ApiError::new(
            422,
            "Invalid",
            format!(
                "{} \"{}\" is invalid: {}: {}",
                rt.kind, name, field, message
            ),
        )
        .with_details(json!({
            "name": name, "group": rt.group, "kind": rt.kind,
            "causes": [{"reason": "FieldValueInvalid", "message": message, "field": field}]
        }))
    }

    /// The `Status` object the apiserver would send.
    pub fn to_status(&self) -> Value {
        let mut status = json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        });
        if let (Some(d), Some(map)) = (&self.details, status.as_object_mut()) {
            map.insert("details".into(), d.clone());
        }
        status
    }
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}: {}", self.code, self.reason, self.message)
    }
}

impl std::error::Error for ApiError {}

fn details(rt: &ResourceType, name: &str) -> Value {
    let mut d = json!({"name": name, "kind": rt.plural});
    if !rt.group.is_empty() {
        d["group"] = json!(rt.group);
    }
    d
}

/// Propagation policy of a delete.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Propagation {
    Background,
    Foreground,
    Orphan,
}

/// The parts of `DeleteOptions` the server honours.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct DeleteOptions {
    pub propagation: Option<Propagation>,
    pub precondition_uid: Option<String>,
    pub precondition_resource_version: Option<String>,
    pub grace_period_seconds: Option<i64>,
}

impl DeleteOptions {
    /// Parse a `DeleteOptions` body (an empty body is the default options).
    pub fn from_json(v: &Value) -> Result<DeleteOptions, ApiError> {
        let mut o = DeleteOptions::default();
        if v.is_null() {
            return Ok(o);
        }
        let Some(map) = v.as_object() else {
            return Err(ApiError::bad_request("DeleteOptions must be a JSON object"));
        };
        match map.get("propagationPolicy").and_then(Value::as_str) {
            Some("Background") => o.propagation = Some(Propagation::Background),
            Some("Foreground") => o.propagation = Some(Propagation::Foreground),
            Some("Orphan") => o.propagation = Some(Propagation::Orphan),
            Some(other) => {
                return Err(ApiError::bad_request(format!(
                    "unknown propagationPolicy {other:?}"
                )));
            }
            None => {}
        }
        if o.propagation.is_none() {
            match map.get("orphanDependents").and_then(Value::as_bool) {
                Some(true) => o.propagation = Some(Propagation::Orphan),
                Some(false) => o.propagation = Some(Propagation::Background),
                None => {}
            }
        }
        if let Some(p) = map.get("preconditions") {
            o.precondition_uid = p.get("uid").and_then(Value::as_str).map(str::to_string);
            o.precondition_resource_version = p
                .get("resourceVersion")
                .and_then(Value::as_str)
                .map(str::to_string);
        }
        o.grace_period_seconds = map.get("gracePeriodSeconds").and_then(Value::as_i64);
        Ok(o)
    }
}

/// Type of a watch event.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EventType {
    Added,
    Modified,
    Deleted,
}

impl EventType {
    pub fn as_str(self) -> &'static str {
        match self {
            EventType::Added => "ADDED",
            EventType::Modified => "MODIFIED",
            EventType::Deleted => "DELETED",
        }
    }
}

/// One change, as kept in the history and fanned out to watches.
#[derive(Clone, Debug)]
pub struct Event {
    pub rv: u64,
    pub group: String,
    pub plural: String,
    pub namespace: String,
    pub kind: EventType,
    pub object: Value,
    /// The object before the change (for MODIFIED), so watches with selectors can
    /// turn transitions into ADDED/DELETED as the apiserver does.
    pub prev: Option<Value>,
    /// `object` as JSON, made once by the first watch that sends it (see [`Event::json`]).
    json: OnceLock<Bytes>,
}

impl Event {
    /// `object` serialized as JSON, once for every watch that sends it as stored.
    pub fn json(&self) -> Bytes {
        self.json
            .get_or_init(|| Bytes::from(serde_json::to_vec(&self.object).unwrap_or_default()))
            .clone()
    }
}

/// (current resourceVersion, history to replay, live events).
pub(crate) type WatchStart = (u64, Vec<Arc<Event>>, broadcast::Receiver<Arc<Event>>);

/// group, plural, namespace ("" if cluster-scoped), name.
pub(crate) type ObjKey = (String, String, String, String);

struct Inner {
    rv: u64,
    /// Shared with readers ([`Store::types_shared`]); changes copy it.
    types: Arc<Vec<ResourceType>>,
    /// Written only through [`Inner::put`] and [`Inner::take`], which keep the indexes below.
    objects: BTreeMap<ObjKey, Value>,
    /// uid -> whether that object waits for its dependents, for every stored object.
    uids: HashMap<String, bool>,
    /// What the garbage collector reads of each object with `ownerReferences` or waiting for
    /// its dependents (foreground deletion), in key order.
    gc_watched: BTreeMap<ObjKey, GcEntry>,
    /// Bumped whenever `uids` or `gc_watched` changes: what the collector decides from.
    gc_generation: u64,
    /// Label key -> label value -> keys of the objects (of any resource) with that label:
    /// a list whose selector requires a label reads only those.
    labels: HashMap<String, HashMap<String, BTreeSet<ObjKey>>>,
    history: VecDeque<Arc<Event>>,
    /// Watches from a resourceVersion below this get 410 Expired.
    compacted: u64,
}

/// What the garbage collector reads of an object: kept by the store on every write, so that a
/// pass reads no object (looking objects up by their four-string key is what costs).
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct GcEntry {
    pub uid: String,
    /// [`owner_refs`]: owner uid and `blockOwnerDeletion`.
    pub owners: Vec<(String, bool)>,
    pub deleting: bool,
    /// Deleting in the foreground: waits for its dependents.
    pub waiting: bool,
}

impl Inner {
    /// Store `obj` under `key` (new or replacing), keeping the indexes.
    fn put(&mut self, key: &ObjKey, obj: Value) {
        let waiting = waits_for_dependents(&obj);
        let uid = meta_str(&obj, "uid").unwrap_or_default();
        let mut changed = false;
        if !uid.is_empty() && self.uids.get(uid) != Some(&waiting) {
            self.uids.insert(uid.to_string(), waiting);
            changed = true;
        }
        let owners = owner_refs(&obj);
        if owners.is_empty() && !waiting {
            changed |= self.gc_watched.remove(key).is_some();
        } else {
            let entry = GcEntry {
                uid: uid.to_string(),
                owners,
                deleting: is_deleting(&obj),
                waiting,
            };
            match self.gc_watched.get_mut(key) {
                Some(e) if *e == entry => {}
                Some(e) => {
                    *e = entry;
                    changed = true;
                }
                None => {
                    self.gc_watched.insert(key.clone(), entry);
                    changed = true;
                }
            }
        }
        if changed {
            self.gc_generation += 1;
        }
        let old = self.objects.insert(key.clone(), obj);
        reindex_labels(&mut self.labels, key, old.as_ref(), self.objects.get(key));
    }

    /// Remove the object under `key`, keeping the indexes.
    fn take(&mut self, key: &ObjKey) -> Option<Value> {
        let obj = self.objects.remove(key)?;
        if meta_str(&obj, "uid").is_some_and(|uid| self.uids.remove(uid).is_some())
            | self.gc_watched.remove(key).is_some()
        {
            self.gc_generation += 1;
        }
        reindex_labels(&mut self.labels, key, Some(&obj), None);
        Some(obj)
    }

    /// The keys of the objects that have all the labels in `required`, if there is such a
    /// label: the smallest of their label index entries (a superset of the answer).
    fn labelled(&self, required: &[(&str, &str)]) -> Option<&BTreeSet<ObjKey>> {
        static NONE: BTreeSet<ObjKey> = BTreeSet::new();
        required
            .iter()
            .map(|(k, v)| {
                self.labels
                    .get(*k)
                    .and_then(|values| values.get(*v))
                    .unwrap_or(&NONE)
            })
            .min_by_key(|keys| keys.len())
    }
}

/// The labels of an object with string values (what label selectors read).
fn string_labels(obj: Option<&Value>) -> impl Iterator<Item = (&str, &str)> {
    obj.and_then(|o| o["metadata"]["labels"].as_object())
        .into_iter()
        .flatten()
        .filter_map(|(k, v)| Some((k.as_str(), v.as_str()?)))
}

/// Move `key` in the label index from the labels of `old` to those of `new` (either `None`).
fn reindex_labels(
    index: &mut HashMap<String, HashMap<String, BTreeSet<ObjKey>>>,
    key: &ObjKey,
    old: Option<&Value>,
    new: Option<&Value>,
) {
    fn labels(o: Option<&Value>) -> Option<&Value> {
        o.map(|o| &o["metadata"]["labels"])
    }
    if labels(old) == labels(new) {
        return;
    }
    let has = |o: Option<&Value>, k: &str, v: &str| {
        labels(o).and_then(|l| l.get(k)).and_then(Value::as_str) == Some(v)
    };
    for (k, v) in string_labels(old) {
        if has(new, k, v) {
            continue;
        }
        if let Some(values) = index.get_mut(k) {
            if let Some(keys) = values.get_mut(v) {
                keys.remove(key);
                if keys.is_empty() {
                    values.remove(v);
                }
            }
            if values.is_empty() {
                index.remove(k);
            }
        }
    }
    for (k, v) in string_labels(new) {
        if has(old, k, v) {
            continue;
        }
        index
            .entry(k.to_string())
            .or_default()
            .entry(v.to_string())
            .or_default()
            .insert(key.clone());
    }
}

/// The stored objects, read under the store's lock.
pub(crate) struct Objects<'a> {
    inner: &'a Inner,
}

impl Objects<'_> {
    /// The objects of one resource (any version), in key order.
    pub(crate) fn of(&self, rt: &ResourceType) -> impl Iterator<Item = &Value> {
        objects_of(&self.inner.objects, rt, None).map(|(_, o)| o)
    }
}

/// What the garbage collector reads, under the store's lock.
pub(crate) struct GcView<'a> {
    inner: &'a Inner,
}

impl GcView<'_> {
    /// (group, plural, entry) of each object with `ownerReferences` or waiting for its
    /// dependents, in key order.
    pub(crate) fn watched(&self) -> impl Iterator<Item = (&ObjKey, &GcEntry)> {
        self.inner.gc_watched.iter()
    }

    /// `Some(waits for its dependents)` if an object with this uid is stored.
    pub(crate) fn uid_state(&self, uid: &str) -> Option<bool> {
        self.inner.uids.get(uid).copied()
    }

    /// Changes whenever what [`GcView::watched`] and [`GcView::uid_state`] read changes.
    pub(crate) fn generation(&self) -> u64 {
        self.inner.gc_generation
    }

    /// `{"metadata": ...}` of a stored object.
    pub(crate) fn metadata(&self, key: &ObjKey) -> Option<Value> {
        let o = self.inner.objects.get(key)?;
        let mut m = Map::new();
        m.insert("metadata".into(), o["metadata"].clone());
        Some(Value::Object(m))
    }
}

/// Handle to the object store. Cheap to clone; all clones share the same data.
#[derive(Clone)]
pub struct Store {
    inner: Arc<Mutex<Inner>>,
    events: broadcast::Sender<Arc<Event>>,
    changed: watch::Sender<u64>,
    logs: Arc<Mutex<HashMap<String, PathBuf>>>,
}

static UID_COUNTER: AtomicU64 = AtomicU64::new(1);

/// A random-enough 64-bit number (time, counter and address entropy through a mixer):
/// enough for uids and generated names in tests, without a `rand` dependency.
pub(crate) fn random_u64() -> u64 {
    let n = UID_COUNTER.fetch_add(1, Ordering::Relaxed);
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0);
    let mut x = t ^ n.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ ((&n as *const u64 as u64) << 17);
    x ^= x >> 33;
    x = x.wrapping_mul(0xff51_afd7_ed55_8ccd);
    x ^= x >> 33;
    x = x.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    x ^ (x >> 33)
}

fn new_uid() -> String {
    let a = random_u64();
    let b = random_u64();
    format!(
        "{:08x}-{:04x}-4{:03x}-{:04x}-{:012x}",
        a >> 32,
        (a >> 16) & 0xffff,
        a & 0x0fff,
        ((b >> 48) & 0x3fff) | 0x8000,
        b & 0xffff_ffff_ffff
    )
}

/// Five characters from the alphabet the apiserver uses for `generateName`.
pub(crate) fn random_suffix() -> String {
    const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    let mut x = random_u64();
    (0..5)
        .map(|_| {
            let c = ALPHABET[(x % ALPHABET.len() as u64) as usize] as char;
            x /= ALPHABET.len() as u64;
            c
        })
        .collect()
}

/// RFC 3339 "now" with second precision, as Kubernetes writes timestamps.
pub(crate) fn now_rfc3339() -> String {
    let now = jiff::Timestamp::now();
    jiff::Timestamp::from_second(now.as_second())
        .unwrap_or(now)
        .to_string()
}

pub(crate) fn meta(obj: &Value) -> &Value {
    &obj["metadata"]
}

pub(crate) fn meta_str<'a>(obj: &'a Value, field: &str) -> Option<&'a str> {
    obj.get("metadata")
        .and_then(|m| m.get(field))
        .and_then(Value::as_str)
}

fn meta_mut(obj: &mut Value) -> &mut Map<String, Value> {
    if !obj.get("metadata").is_some_and(Value::is_object) {
        obj["metadata"] = json!({});
    }
    match obj.get_mut("metadata").and_then(Value::as_object_mut) {
        Some(m) => m,
        None => unreachable!("metadata was just made an object"),
    }
}

pub(crate) fn finalizers(obj: &Value) -> Vec<String> {
    meta(obj)["finalizers"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|f| f.as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

/// Whether an object is being deleted in the foreground: deleting, with the
/// `foregroundDeletion` finalizer.
pub(crate) fn waits_for_dependents(obj: &Value) -> bool {
    is_deleting(obj)
        && meta(obj)["finalizers"]
            .as_array()
            .is_some_and(|a| a.iter().any(|f| f.as_str() == Some(FOREGROUND_FINALIZER)))
}

pub(crate) fn is_deleting(obj: &Value) -> bool {
    meta(obj)
        .get("deletionTimestamp")
        .is_some_and(|v| !v.is_null())
}

/// The owner uids of an object, with their `blockOwnerDeletion`.
pub(crate) fn owner_refs(obj: &Value) -> Vec<(String, bool)> {
    meta(obj)["ownerReferences"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|r| {
                    let uid = r.get("uid")?.as_str()?.to_string();
                    let block = r
                        .get("blockOwnerDeletion")
                        .and_then(Value::as_bool)
                        .unwrap_or(false);
                    Some((uid, block))
                })
                .collect()
        })
        .unwrap_or_default()
}

/// The content that decides `generation`: everything but metadata and status.
fn generation_content(obj: &Value) -> Value {
    match obj.as_object() {
        Some(m) => Value::Object(
            m.iter()
                .filter(|(k, _)| {
                    !matches!(k.as_str(), "metadata" | "status" | "apiVersion" | "kind")
                })
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
        ),
        None => Value::Null,
    }
}

fn builtin(
    group: &str,
    version: &str,
    plural: &str,
    kind: &str,
    namespaced: bool,
    short: &[&str],
    status: bool,
) -> ResourceType {
    ResourceType {
        group: group.into(),
        version: version.into(),
        plural: plural.into(),
        singular: kind.to_lowercase(),
        kind: kind.into(),
        namespaced,
        short_names: short.iter().map(|s| s.to_string()).collect(),
        categories: if matches!(plural, "pods" | "jobs") {
            vec!["all".into()]
        } else {
            vec![]
        },
        status_subresource: status,
        crd: None,
    }
}

fn builtin_types() -> Vec<ResourceType> {
    vec![
        builtin("", "v1", "namespaces", "Namespace", false, &["ns"], true),
        builtin("", "v1", "secrets", "Secret", true, &[], false),
        builtin("", "v1", "configmaps", "ConfigMap", true, &["cm"], false),
        builtin(
            "",
            "v1",
            "serviceaccounts",
            "ServiceAccount",
            true,
            &["sa"],
            false,
        ),
        builtin("", "v1", "events", "Event", true, &["ev"], false),
        builtin("", "v1", "pods", "Pod", true, &["po"], true),
        builtin("batch", "v1", "jobs", "Job", true, &[], true),
        builtin(
            "coordination.k8s.io",
            "v1",
            "leases",
            "Lease",
            true,
            &[],
            false,
        ),
        builtin(
            "rbac.authorization.k8s.io",
            "v1",
            "roles",
            "Role",
            true,
            &[],
            false,
        ),
        builtin(
            "rbac.authorization.k8s.io",
            "v1",
            "rolebindings",
            "RoleBinding",
            true,
            &[],
            false,
        ),
        builtin(
            "apiextensions.k8s.io",
            "v1",
            "customresourcedefinitions",
            "CustomResourceDefinition",
            false,
            &["crd", "crds"],
            true,
        ),
        builtin(
            "events.k8s.io",
            "v1",
            "events",
            "Event",
            true,
            &["ev"],
            false,
        ),
    ]
}

/// What the real API server does when it creates a Job whose `spec.manualSelector` is not
/// true (kubernetes `pkg/registry/batch/job/strategy.go`, `generateSelector`): the Pod
/// template gets the `job-name` and `controller-uid` labels, in their legacy and
/// `batch.kubernetes.io/` forms, unless already set, and the selector matches
/// `batch.kubernetes.io/controller-uid`. So `kubectl logs job/NAME` and label selectors
/// find this Job's Pods and no other's.
fn generate_job_selector(job: &mut Value) {
    if job["spec"]["manualSelector"].as_bool() == Some(true) {
        return;
    }
    let name = meta_str(job, "name").unwrap_or_default().to_string();
    let uid = meta_str(job, "uid").unwrap_or_default().to_string();
    let labels = &mut job["spec"]["template"]["metadata"]["labels"];
    if !labels.is_object() {
        *labels = json!({});
    }
    for (key, value) in [
        ("job-name", &name),
        ("batch.kubernetes.io/job-name", &name),
        ("controller-uid", &uid),
        ("batch.kubernetes.io/controller-uid", &uid),
    ] {
        if labels.get(key).is_none() {
            labels[key] = json!(value);
        }
    }
    let match_labels = &mut job["spec"]["selector"]["matchLabels"];
    if !match_labels.is_object() {
        *match_labels = json!({});
    }
    if match_labels
        .get("batch.kubernetes.io/controller-uid")
        .is_none()
    {
        match_labels["batch.kubernetes.io/controller-uid"] = json!(uid);
    }
}

/// Resource types a CRD object declares (one per served version).
fn crd_types(crd: &Value) -> Result<Vec<ResourceType>, String> {
    let spec = &crd["spec"];
    let group = spec["group"].as_str().ok_or("spec.group: Required value")?;
    let names = &spec["names"];
    let plural = names["plural"]
        .as_str()
        .ok_or("spec.names.plural: Required value")?;
    let kind = names["kind"]
        .as_str()
        .ok_or("spec.names.kind: Required value")?;
    let singular = names["singular"]
        .as_str()
        .map(str::to_string)
        .unwrap_or_else(|| kind.to_lowercase());
    let strings = |v: &Value| -> Vec<String> {
        v.as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|s| s.as_str().map(str::to_string))
                    .collect()
            })
            .unwrap_or_default()
    };
    let namespaced = match spec["scope"].as_str() {
        Some("Namespaced") => true,
        Some("Cluster") => false,
        _ => return Err("spec.scope: Unsupported value (Namespaced or Cluster)".into()),
    };
    let versions = spec["versions"]
        .as_array()
        .ok_or("spec.versions: Required value")?;
    let mut out = Vec::new();
    for v in versions {
        let Some(name) = v["name"].as_str() else {
            return Err("spec.versions[].name: Required value".into());
        };
        if v["served"].as_bool() == Some(false) {
            continue;
        }
        out.push(ResourceType {
            group: group.into(),
            version: name.into(),
            plural: plural.into(),
            singular: singular.clone(),
            kind: kind.into(),
            namespaced,
            short_names: strings(&names["shortNames"]),
            categories: strings(&names["categories"]),
            status_subresource: v["subresources"].get("status").is_some(),
            crd: crd["metadata"]["name"].as_str().map(str::to_string),
        });
    }
    Ok(out)
}

/// Kubernetes version priority: GA before beta before alpha, higher numbers first.
pub(crate) fn version_priority(v: &str) -> (u8, i64, i64) {
    let Some(rest) = v.strip_prefix('v') else {
        return (0, 0, 0);
    };
    let digits: String = rest.chars().take_while(|c| c.is_ascii_digit()).collect();
    let major = digits.parse::<i64>().unwrap_or(0);
    let tail = &rest[digits.len()..];
    let (class, minor) = if tail.is_empty() {
        (3, 0)
    } else if let Some(n) = tail.strip_prefix("beta") {
        (2, n.parse().unwrap_or(0))
    } else if let Some(n) = tail.strip_prefix("alpha") {
        (1, n.parse().unwrap_or(0))
    } else {
        (0, 0)
    };
    (class, major, minor)
}

impl Default for Store {
    fn default() -> Self {
        Store::new()
    }
}

impl Store {
    /// An empty store with the built-in types and the `default` and `kube-system` namespaces.
    pub fn new() -> Store {
        let (events, _) = broadcast::channel(HISTORY_LIMIT);
        let (changed, _) = watch::channel(0);
        let store = Store {
            inner: Arc::new(Mutex::new(Inner {
                rv: 0,
                types: Arc::new(builtin_types()),
                objects: BTreeMap::new(),
                uids: HashMap::new(),
                gc_watched: BTreeMap::new(),
                gc_generation: 0,
                labels: HashMap::new(),
                history: VecDeque::new(),
                compacted: 0,
            })),
            events,
            changed,
            logs: Arc::new(Mutex::new(HashMap::new())),
        };
        for ns in ["default", "kube-system"] {
            let r = store
                .create(json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}));
            debug_assert!(r.is_ok());
        }
        store
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    // ---------- public convenience API (tests) ----------

    /// Resolve `apiVersion` ("v1", "batch/v1", "example.com/v1alpha1") plus a plural, kind or
    /// singular name to a served resource type.
    pub fn resource_type(&self, api_version: &str, resource: &str) -> Option<ResourceType> {
        let (group, version) = match api_version.split_once('/') {
            Some((g, v)) => (g, v),
            None => ("", api_version),
        };
        self.lock()
            .types
            .iter()
            .find(|t| {
                t.group == group
                    && t.version == version
                    && (t.plural == resource || t.kind == resource || t.singular == resource)
            })
            .cloned()
    }

    fn rt_of(&self, obj: &Value) -> Result<ResourceType, ApiError> {
        let av = obj["apiVersion"]
            .as_str()
            .ok_or_else(|| ApiError::bad_request("apiVersion is required"))?;
        let kind = obj["kind"]
            .as_str()
            .ok_or_else(|| ApiError::bad_request("kind is required"))?;
        self.resource_type(av, kind).ok_or_else(|| {
            ApiError::new(
                404,
                "NotFound",
                format!("the server could not find the requested resource ({av}, {kind})"),
            )
        })
    }

    fn rt_named(&self, api_version: &str, resource: &str) -> Result<ResourceType, ApiError> {
        self.resource_type(api_version, resource).ok_or_else(|| {
            ApiError::new(
                404,
                "NotFound",
                format!(
                    "the server could not find the requested resource ({api_version}, {resource})"
                ),
            )
        })
    }

    /// Get one object.
    pub fn get(
        &self,
        api_version: &str,
        resource: &str,
        namespace: Option<&str>,
        name: &str,
    ) -> Option<Value> {
        let rt = self.resource_type(api_version, resource)?;
        self.get_rt(&rt, namespace, name).ok()
    }

    /// All objects of a resource (in one namespace, or all namespaces with `None`).
    pub fn list(&self, api_version: &str, resource: &str, namespace: Option<&str>) -> Vec<Value> {
        match self.resource_type(api_version, resource) {
            Some(rt) => self.list_rt(&rt, namespace).1,
            None => Vec::new(),
        }
    }

    /// Create an object (its `apiVersion`, `kind` and `metadata.namespace` say where).
    pub fn create(&self, obj: Value) -> Result<Value, ApiError> {
        let rt = self.rt_of(&obj)?;
        let ns = meta_str(&obj, "namespace").map(str::to_string);
        self.create_rt(&rt, ns.as_deref(), obj)
    }

    /// Replace an object (PUT semantics: a `metadata.resourceVersion` is a precondition).
    pub fn update(&self, obj: Value) -> Result<Value, ApiError> {
        let rt = self.rt_of(&obj)?;
        let ns = meta_str(&obj, "namespace").map(str::to_string);
        let name = meta_str(&obj, "name").unwrap_or_default().to_string();
        self.update_rt(&rt, ns.as_deref(), &name, obj, false)
    }

    /// Replace an object's status (PUT on `/status`).
    pub fn update_status(&self, obj: Value) -> Result<Value, ApiError> {
        let rt = self.rt_of(&obj)?;
        let ns = meta_str(&obj, "namespace").map(str::to_string);
        let name = meta_str(&obj, "name").unwrap_or_default().to_string();
        self.update_rt(&rt, ns.as_deref(), &name, obj, true)
    }

    /// Delete with default options. Returns the object as it was last stored
    /// (with `deletionTimestamp` if it is still there).
    pub fn delete(
        &self,
        api_version: &str,
        resource: &str,
        namespace: Option<&str>,
        name: &str,
    ) -> Result<Value, ApiError> {
        self.delete_with(
            api_version,
            resource,
            namespace,
            name,
            DeleteOptions::default(),
        )
    }

    /// Delete with explicit options.
    pub fn delete_with(
        &self,
        api_version: &str,
        resource: &str,
        namespace: Option<&str>,
        name: &str,
        opts: DeleteOptions,
    ) -> Result<Value, ApiError> {
        let rt = self.rt_named(api_version, resource)?;
        self.delete_rt(&rt, namespace, name, &opts).map(|(v, _)| v)
    }

    /// The current (latest) resourceVersion.
    pub fn resource_version(&self) -> u64 {
        self.lock().rv
    }

    /// Drop the whole watch history, as an etcd compaction would: watches from any
    /// earlier resourceVersion then get `410 Expired`.
    pub fn compact(&self) {
        let mut inner = self.lock();
        inner.history.clear();
        inner.compacted = inner.rv;
    }

    /// All served resource types, shared (no copy): what the HTTP front end routes by.
    pub(crate) fn types_shared(&self) -> Arc<Vec<ResourceType>> {
        self.lock().types.clone()
    }

    /// All served resource types.
    pub fn types(&self) -> Vec<ResourceType> {
        self.lock().types.to_vec()
    }

    // ---------- internals used by the HTTP layer and the controllers ----------

    pub(crate) fn subscribe_changes(&self) -> watch::Receiver<u64> {
        self.changed.subscribe()
    }

    pub(crate) fn set_log_path(&self, pod_uid: &str, path: Option<PathBuf>) {
        let mut logs = self.logs.lock().unwrap_or_else(|e| e.into_inner());
        match path {
            Some(p) => logs.insert(pod_uid.to_string(), p),
            None => logs.remove(pod_uid),
        };
    }

    pub(crate) fn log_path(&self, pod_uid: &str) -> Option<PathBuf> {
        self.logs
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(pod_uid)
            .cloned()
    }

    /// Snapshot of the objects (with group and plural) that `keep` selects.
    pub(crate) fn snapshot_where(
        &self,
        keep: impl Fn(&str, &str, &str, &Value) -> bool,
    ) -> Vec<(String, String, Value)> {
        self.lock()
            .objects
            .iter()
            .filter(|((g, p, n, _), v)| keep(g, p, n, v))
            .map(|((g, p, _, _), v)| (g.clone(), p.clone(), v.clone()))
            .collect()
    }

    /// Run `read` on the garbage collector's view, under one lock: the collector must never
    /// see a dependent without the owner that was created before it.
    pub(crate) fn gc_read<T>(&self, read: impl FnOnce(&GcView<'_>) -> T) -> T {
        let inner = self.lock();
        read(&GcView { inner: &inner })
    }

    /// The first served type for a group/plural (used by controllers that hold snapshots).
    pub(crate) fn any_type(&self, group: &str, plural: &str) -> Option<ResourceType> {
        self.lock()
            .types
            .iter()
            .find(|t| t.is(group, plural))
            .cloned()
    }

    fn key(rt: &ResourceType, ns: Option<&str>, name: &str) -> ObjKey {
        let ns = if rt.namespaced {
            ns.unwrap_or_default()
        } else {
            ""
        };
        (
            rt.group.clone(),
            rt.plural.clone(),
            ns.to_string(),
            name.to_string(),
        )
    }

    fn present(rt: &ResourceType, obj: &Value) -> Value {
        let mut o = obj.clone();
        o["apiVersion"] = json!(rt.api_version());
        o["kind"] = json!(rt.kind);
        o
    }

    pub(crate) fn get_rt(
        &self,
        rt: &ResourceType,
        ns: Option<&str>,
        name: &str,
    ) -> Result<Value, ApiError> {
        let inner = self.lock();
        inner
            .objects
            .get(&Self::key(rt, ns, name))
            .map(|o| Self::present(rt, o))
            .ok_or_else(|| ApiError::not_found(rt, name))
    }

    /// (resourceVersion, items) for a resource, optionally in one namespace.
    pub(crate) fn list_rt(&self, rt: &ResourceType, ns: Option<&str>) -> (u64, Vec<Value>) {
        self.list_rt_where(rt, ns, &[], |_| true)
    }

    /// [`Store::list_rt`] of the objects `keep` selects (a selector): only those are cloned.
    /// `keep` selects only objects with every label in `required` (a selector's equalities):
    /// if there is one, only the objects with the rarest of them are read, from the label
    /// index, instead of every object of the resource in the namespace.
    pub(crate) fn list_rt_where(
        &self,
        rt: &ResourceType,
        ns: Option<&str>,
        required: &[(&str, &str)],
        keep: impl Fn(&Value) -> bool,
    ) -> (u64, Vec<Value>) {
        let inner = self.lock();
        let items = match inner.labelled(required) {
            Some(keys) => {
                let ns = ns.filter(|_| rt.namespaced);
                keys.iter()
                    .filter(|(g, p, n, _)| {
                        *g == rt.group && *p == rt.plural && ns.is_none_or(|ns| n == ns)
                    })
                    .filter_map(|k| inner.objects.get(k))
                    .filter(|o| keep(o))
                    .map(|o| Self::present(rt, o))
                    .collect()
            }
            None => objects_of(&inner.objects, rt, ns)
                .filter(|(_, o)| keep(o))
                .map(|(_, o)| Self::present(rt, o))
                .collect(),
        };
        (inner.rv, items)
    }

    /// What `view` takes from each object of a resource (all namespaces), read under the
    /// lock without cloning whole objects: for controllers that look at a few fields of many
    /// objects on every change (a full list would hold the lock, and every API request, for
    /// as long as it takes to clone them all).
    pub(crate) fn view_rt<T>(
        &self,
        rt: &ResourceType,
        view: impl Fn(&Value) -> Option<T>,
    ) -> Vec<T> {
        let inner = self.lock();
        objects_of(&inner.objects, rt, None)
            .filter_map(|(_, o)| view(o))
            .collect()
    }

    /// Subscribe to events and read the history after `rv` atomically.
    /// `Err(current_oldest)` if `rv` is older than the history.
    pub(crate) fn watch_from(&self, rv: Option<u64>) -> Result<WatchStart, u64> {
        let inner = self.lock();
        let rx = self.events.subscribe();
        match rv {
            None => Ok((inner.rv, Vec::new(), rx)),
            Some(rv) if rv < inner.compacted => Err(inner.compacted),
            Some(rv) => Ok((
                inner.rv,
                inner
                    .history
                    .iter()
                    .filter(|e| e.rv > rv)
                    .cloned()
                    .collect(),
                rx,
            )),
        }
    }

    /// Subscribe to the events and `read` the stored objects under one lock, as an informer
    /// lists and watches: the events received are exactly the changes after what `read` saw.
    pub(crate) fn subscribe_and_read<T>(
        &self,
        read: impl FnOnce(&Objects<'_>) -> T,
    ) -> (broadcast::Receiver<Arc<Event>>, T) {
        let inner = self.lock();
        let rx = self.events.subscribe();
        (rx, read(&Objects { inner: &inner }))
    }

    /// Subscribe and take a consistent snapshot of a resource's objects.
    pub(crate) fn watch_snapshot(
        &self,
        rt: &ResourceType,
    ) -> (u64, Vec<Value>, broadcast::Receiver<Arc<Event>>) {
        let inner = self.lock();
        let rx = self.events.subscribe();
        let items = objects_of(&inner.objects, rt, None)
            .map(|(_, o)| Self::present(rt, o))
            .collect();
        (inner.rv, items, rx)
    }

    /// Stores `obj` as a modification of `prev` under a new resourceVersion (written into
    /// `obj`) and tells the watchers.
    fn put_modified_locked(&self, inner: &mut Inner, key: &ObjKey, obj: &mut Value, prev: Value) {
        inner.rv += 1;
        meta_mut(obj).insert("resourceVersion".into(), json!(inner.rv.to_string()));
        inner.put(key, obj.clone());
        self.emit(inner, key, EventType::Modified, obj.clone(), Some(prev));
    }

    fn emit(
        &self,
        inner: &mut Inner,
        key: &ObjKey,
        kind: EventType,
        object: Value,
        prev: Option<Value>,
    ) {
        let ev = Arc::new(Event {
            rv: inner.rv,
            group: key.0.clone(),
            plural: key.1.clone(),
            namespace: key.2.clone(),
            kind,
            object,
            prev,
            json: OnceLock::new(),
        });
        inner.history.push_back(ev.clone());
        while inner.history.len() > HISTORY_LIMIT {
            if let Some(old) = inner.history.pop_front() {
                inner.compacted = old.rv;
            }
        }
        let _ = self.events.send(ev);
        self.changed.send_replace(inner.rv);
    }

    fn namespace_check(
        inner: &Inner,
        rt: &ResourceType,
        ns: &str,
        name: &str,
    ) -> Result<(), ApiError> {
        let ns_rt = ResourceType {
            plural: "namespaces".into(),
            group: String::new(),
            ..rt.clone()
        };
        match inner.objects.get(&(String::new(), "namespaces".into(), String::new(), ns.to_string())) {
            None => Err(ApiError::not_found(&ns_rt, ns)),
            Some(n) if is_deleting(n) => Err(ApiError::new(
                403,
                "Forbidden",
                format!(
                    "{} \"{}\" is forbidden: unable to create new content in namespace {} because it is being terminated",
                    rt.plural, name, ns
                ),
            )
            .with_details(json!({
                "name": name,
                "kind": rt.plural,
                "causes": [{
                    "reason": "NamespaceTerminating",
                    "message": format!("namespace {ns} is being terminated"),
                    "field": "metadata.namespace"
                }]
            }))),
            Some(_) => Ok(()),
        }
    }

    pub(crate) fn create_rt(
        &self,
        rt: &ResourceType,
        ns: Option<&str>,
        mut obj: Value,
    ) -> Result<Value, ApiError> {
        if !obj.is_object() {
            return Err(ApiError::bad_request("the object must be a JSON object"));
        }
        let body_ns = meta_str(&obj, "namespace").map(str::to_string);
        let ns = if rt.namespaced {
            match (ns, body_ns.as_deref()) {
                (Some(p), Some(b)) if p != b => {
                    return Err(ApiError::bad_request(
                        "the namespace of the provided object does not match the namespace sent on the request",
                    ));
                }
                (Some(p), _) => p.to_string(),
                (None, Some(b)) => b.to_string(),
                (None, None) => "default".to_string(),
            }
        } else {
            String::new()
        };
        let mut name = meta_str(&obj, "name").unwrap_or_default().to_string();
        let mut inner = self.lock();
        if let Some(crd) = &rt.crd {
            let key = (
                crds::GROUP.to_string(),
                crds::PLURAL.to_string(),
                String::new(),
                crd.clone(),
            );
            crds::refuse_create(rt, inner.objects.get(&key))?;
        }
        if name.is_empty() {
            match meta_str(&obj, "generateName") {
                Some(g) if !g.is_empty() => {
                    let g = g.to_string();
                    loop {
                        name = format!("{g}{}", random_suffix());
                        if !inner.objects.contains_key(&Self::key(rt, Some(&ns), &name)) {
                            break;
                        }
                    }
                }
                _ => {
                    return Err(ApiError::invalid(
                        rt,
                        "",
                        "metadata.name",
                        "Required value: name or generateName is required",
                    ));
                }
            }
        }
        if rt.namespaced {
            Self::namespace_check(&inner, rt, &ns, &name)?;
        }
        let key = Self::key(rt, Some(&ns), &name);
        if inner.objects.contains_key(&key) {
            return Err(ApiError::already_exists(rt, &name));
        }
        obj["apiVersion"] = json!(rt.api_version());
        obj["kind"] = json!(rt.kind);
        if rt.status_subresource
            && let Some(m) = obj.as_object_mut()
        {
            m.remove("status");
        }
        self.defaults_on_create(rt, &mut obj)?;
        inner.rv += 1;
        let rv = inner.rv;
        {
            let m = meta_mut(&mut obj);
            m.insert("name".into(), json!(name));
            if rt.namespaced {
                m.insert("namespace".into(), json!(ns));
            } else {
                m.remove("namespace");
            }
            m.insert("uid".into(), json!(new_uid()));
            m.insert("resourceVersion".into(), json!(rv.to_string()));
            m.insert("creationTimestamp".into(), json!(now_rfc3339()));
            m.insert("generation".into(), json!(1));
            m.remove("deletionTimestamp");
            m.remove("deletionGracePeriodSeconds");
            m.remove("managedFields");
            m.remove("selfLink");
        }
        if rt.crd.is_none() && rt.group == "batch" && rt.plural == "jobs" {
            generate_job_selector(&mut obj);
        }
        if crds::is_crd_resource(rt) {
            let types = crd_types(&obj).map_err(|e| ApiError::invalid(rt, &name, "spec", &e))?;
            if inner
                .types
                .iter()
                .any(|t| types.iter().any(|n| n.is(&t.group, &t.plural)))
            {
                return Err(ApiError::invalid(
                    rt,
                    &name,
                    "spec.names.plural",
                    "Invalid value: already served",
                ));
            }
            obj["status"] = json!({
                "acceptedNames": obj["spec"]["names"].clone(),
                "conditions": [
                    {"type": "NamesAccepted", "status": "True", "reason": "NoConflicts", "message": "no conflicts found", "lastTransitionTime": now_rfc3339()},
                    {"type": "Established", "status": "True", "reason": "InitialNamesAccepted", "message": "the initial names have been accepted", "lastTransitionTime": now_rfc3339()}
                ],
                "storedVersions": obj["spec"]["versions"].as_array().map(|vs| vs.iter().filter(|v| v["storage"].as_bool() == Some(true)).map(|v| v["name"].clone()).collect::<Vec<_>>()).unwrap_or_default()
            });
            Arc::make_mut(&mut inner.types).extend(types);
        }
        inner.put(&key, obj.clone());
        self.emit(&mut inner, &key, EventType::Added, obj.clone(), None);
        Ok(obj)
    }

    /// API defaulting for the few built-in kinds whose defaults matter here.
    fn defaults_on_create(&self, rt: &ResourceType, obj: &mut Value) -> Result<(), ApiError> {
        match (rt.group.as_str(), rt.plural.as_str()) {
            ("", "namespaces") => {
                obj["spec"] = json!({"finalizers": ["kubernetes"]});
                obj["status"] = json!({"phase": "Active"});
            }
            ("", "secrets") => {
                if obj
                    .get("type")
                    .is_none_or(|t| t.as_str().is_none_or(str::is_empty))
                {
                    obj["type"] = json!("Opaque");
                }
                fold_string_data(obj);
            }
            ("", "pods") => {
                default_pod_spec(&mut obj["spec"]);
                obj["status"] = json!({"phase": "Pending"});
            }
            ("batch", "jobs") => {
                let spec = &mut obj["spec"];
                if !spec.is_object() {
                    return Err(ApiError::invalid(rt, "", "spec", "Required value"));
                }
                for (field, value) in [("backoffLimit", 6), ("completions", 1), ("parallelism", 1)]
                {
                    if spec.get(field).is_none_or(Value::is_null) {
                        spec[field] = json!(value);
                    }
                }
                if spec.get("suspend").is_none() {
                    spec["suspend"] = json!(false);
                }
                default_pod_spec(&mut spec["template"]["spec"]);
            }
            _ => {}
        }
        Ok(())
    }

    pub(crate) fn update_rt(
        &self,
        rt: &ResourceType,
        ns: Option<&str>,
        name: &str,
        obj: Value,
        status_only: bool,
    ) -> Result<Value, ApiError> {
        if !obj.is_object() {
            return Err(ApiError::bad_request("the object must be a JSON object"));
        }
        if let Some(body_name) = meta_str(&obj, "name")
            && body_name != name
        {
            return Err(ApiError::bad_request(format!(
                "the name of the object ({body_name}) does not match the name on the URL ({name})"
            )));
        }
        if rt.namespaced
            && let (Some(b), Some(p)) = (meta_str(&obj, "namespace"), ns)
            && b != p
        {
            return Err(ApiError::bad_request(
                "the namespace of the provided object does not match the namespace sent on the request",
            ));
        }
        let mut inner = self.lock();
        let key = Self::key(rt, ns, name);
        let Some(old) = inner.objects.get(&key).cloned() else {
            return Err(ApiError::not_found(rt, name));
        };
        if let Some(rv) = meta_str(&obj, "resourceVersion")
            && !rv.is_empty()
            && Some(rv) != meta_str(&old, "resourceVersion")
        {
            return Err(ApiError::conflict(
                rt,
                name,
                "the object has been modified; please apply your changes to the latest version and try again",
            ));
        }
        if let Some(uid) = meta_str(&obj, "uid")
            && !uid.is_empty()
            && Some(uid) != meta_str(&old, "uid")
        {
            return Err(ApiError::conflict(
                rt,
                name,
                &format!(
                    "Precondition failed: UID in precondition: {}, UID in object meta: {}",
                    uid,
                    meta_str(&old, "uid").unwrap_or_default()
                ),
            ));
        }
        let mut new = if status_only {
            let mut n = old.clone();
            n["status"] = obj.get("status").cloned().unwrap_or(Value::Null);
            if crds::is_crd_resource(rt) {
                crds::status_write_metadata(&obj, &mut n);
            }
            if n["status"].is_null()
                && let Some(m) = n.as_object_mut()
            {
                m.remove("status");
            }
            n
        } else {
            let mut n = obj;
            if rt.status_subresource {
                match old.get("status") {
                    Some(s) => n["status"] = s.clone(),
                    None => {
                        if let Some(m) = n.as_object_mut() {
                            m.remove("status");
                        }
                    }
                }
            }
            if !n.get("metadata").is_some_and(Value::is_object) {
                n["metadata"] = json!({});
            }
            for field in [
                "name",
                "namespace",
                "uid",
                "creationTimestamp",
                "deletionTimestamp",
                "deletionGracePeriodSeconds",
                "generation",
            ] {
                match old["metadata"].get(field) {
                    Some(v) => {
                        meta_mut(&mut n).insert(field.into(), v.clone());
                    }
                    None => {
                        meta_mut(&mut n).remove(field);
                    }
                }
            }
            meta_mut(&mut n).remove("managedFields");
            if rt.group.is_empty() && rt.plural == "secrets" {
                fold_string_data(&mut n);
            }
            if rt.group.is_empty() && rt.plural == "namespaces" {
                n["spec"] = old["spec"].clone();
            }
            n
        };
        new["apiVersion"] = json!(rt.api_version());
        new["kind"] = json!(rt.kind);
        meta_mut(&mut new).insert(
            "resourceVersion".into(),
            old["metadata"]["resourceVersion"].clone(),
        );
        if is_deleting(&old) {
            let old_f = finalizers(&old);
            let added: Vec<String> = finalizers(&new)
                .into_iter()
                .filter(|f| !old_f.contains(f))
                .collect();
            if !added.is_empty() {
                return Err(ApiError::invalid(
                    rt,
                    name,
                    "metadata.finalizers",
                    &format!(
                        "Forbidden: no new finalizers can be added if the object is being deleted, found new finalizers {added:?}"
                    ),
                ));
            }
        }
        if new == old {
            return Ok(Self::present(rt, &old));
        }
        if !status_only && generation_content(&new) != generation_content(&old) {
            let g = old["metadata"]["generation"].as_i64().unwrap_or(0) + 1;
            meta_mut(&mut new).insert("generation".into(), json!(g));
        }
        if crds::is_crd_resource(rt) && !status_only {
            let types = crd_types(&new).map_err(|e| ApiError::invalid(rt, name, "spec", &e))?;
            let crd_name = name.to_string();
            let served = Arc::make_mut(&mut inner.types);
            served.retain(|t| t.crd.as_deref() != Some(crd_name.as_str()));
            served.extend(types);
        }
        inner.rv += 1;
        let rv = inner.rv;
        meta_mut(&mut new).insert("resourceVersion".into(), json!(rv.to_string()));
        let graceful = new["metadata"]["deletionGracePeriodSeconds"]
            .as_i64()
            .unwrap_or(0)
            > 0;
        if is_deleting(&new) && finalizers(&new).is_empty() && !graceful {
            self.remove_locked(&mut inner, rt, &key, new.clone());
            return Ok(new);
        }
        inner.put(&key, new.clone());
        self.emit(
            &mut inner,
            &key,
            EventType::Modified,
            new.clone(),
            Some(old),
        );
        Ok(Self::present(rt, &new))
    }

    /// Remove an object now (the final step of any deletion), with a DELETED event.
    fn remove_locked(&self, inner: &mut Inner, rt: &ResourceType, key: &ObjKey, mut last: Value) {
        if inner.take(key).is_none() {
            return;
        }
        inner.rv = inner.rv.saturating_add(1);
        let rv = inner.rv;
        meta_mut(&mut last).insert("resourceVersion".into(), json!(rv.to_string()));
        if crds::is_crd_resource(rt) {
            // Its types stop being served. Instances still stored (the cleanup finalizer
            // was removed by hand) stay in storage, unserved, as on a real server.
            Arc::make_mut(&mut inner.types).retain(|t| t.crd.as_deref() != Some(key.3.as_str()));
        }
        self.emit(inner, key, EventType::Deleted, last, None);
    }

    /// Remove an object unconditionally (kubelet's final delete of a terminated Pod).
    pub(crate) fn force_remove(&self, rt: &ResourceType, ns: Option<&str>, name: &str, uid: &str) {
        let mut inner = self.lock();
        let key = Self::key(rt, ns, name);
        if let Some(o) = inner.objects.get(&key).cloned()
            && meta_str(&o, "uid") == Some(uid)
        {
            self.remove_locked(&mut inner, rt, &key, o);
        }
    }

    /// Delete following the registry's rules. Returns the object and whether it is gone.
    pub(crate) fn delete_rt(
        &self,
        rt: &ResourceType,
        ns: Option<&str>,
        name: &str,
        opts: &DeleteOptions,
    ) -> Result<(Value, bool), ApiError> {
        let mut inner = self.lock();
        let key = Self::key(rt, ns, name);
        let Some(mut obj) = inner.objects.get(&key).cloned() else {
            return Err(ApiError::not_found(rt, name));
        };
        if let Some(uid) = &opts.precondition_uid
            && Some(uid.as_str()) != meta_str(&obj, "uid")
        {
            return Err(ApiError::conflict(
                rt,
                name,
                &format!(
                    "Precondition failed: UID in precondition: {}, UID in object meta: {}",
                    uid,
                    meta_str(&obj, "uid").unwrap_or_default()
                ),
            ));
        }
        if let Some(rv) = &opts.precondition_resource_version
            && Some(rv.as_str()) != meta_str(&obj, "resourceVersion")
        {
            return Err(ApiError::conflict(
                rt,
                name,
                &format!(
                    "Precondition failed: ResourceVersion in precondition: {}, ResourceVersion in object meta: {}",
                    rv,
                    meta_str(&obj, "resourceVersion").unwrap_or_default()
                ),
            ));
        }
        let is_ns = rt.group.is_empty() && rt.plural == "namespaces";
        if is_ns && matches!(name, "default" | "kube-system" | "kube-public") {
            return Err(ApiError::new(
                403,
                "Forbidden",
                format!("namespaces \"{name}\" is forbidden: this namespace may not be deleted"),
            )
            .with_details(json!({"name": name, "kind": "namespaces"})));
        }
        if crds::is_crd_resource(rt) && !is_deleting(&obj) {
            let prev = obj.clone();
            crds::mark_deleting(&mut obj);
            self.put_modified_locked(&mut inner, &key, &mut obj, prev);
            return Ok((Self::present(rt, &obj), false));
        }
        let uid = meta_str(&obj, "uid").unwrap_or_default().to_string();
        let default_policy = if rt.group == "batch" && rt.plural == "jobs" {
            Propagation::Orphan
        } else {
            Propagation::Background
        };
        let policy = opts.propagation.unwrap_or(default_policy);
        if policy == Propagation::Orphan {
            self.orphan_dependents_locked(&mut inner, &uid);
        }
        let already = is_deleting(&obj);
        let prev = obj.clone();
        if is_ns {
            if !already {
                Self::mark_deleting(&mut obj, 0);
                obj["status"]["phase"] = json!("Terminating");
                self.put_modified_locked(&mut inner, &key, &mut obj, prev);
            }
            return Ok((obj, false));
        }
        let is_pod = rt.group.is_empty() && rt.plural == "pods";
        if is_pod {
            let running_on_node = obj["spec"]["nodeName"]
                .as_str()
                .is_some_and(|n| !n.is_empty())
                && !matches!(
                    obj["status"]["phase"].as_str(),
                    Some("Succeeded" | "Failed")
                );
            let grace = opts
                .grace_period_seconds
                .or_else(|| obj["spec"]["terminationGracePeriodSeconds"].as_i64())
                .unwrap_or(30);
            if running_on_node && grace > 0 {
                if !already {
                    Self::mark_deleting(&mut obj, grace);
                    self.put_modified_locked(&mut inner, &key, &mut obj, prev);
                }
                return Ok((Self::present(rt, &obj), false));
            }
            if !finalizers(&obj).is_empty() {
                // fall through to the finalizer rule below
            } else {
                self.remove_locked(&mut inner, rt, &key, obj.clone());
                return Ok((Self::present(rt, &obj), true));
            }
        }
        if already {
            return Ok((Self::present(rt, &obj), false));
        }
        let mut fins = finalizers(&obj);
        if policy == Propagation::Foreground && !fins.iter().any(|f| f == FOREGROUND_FINALIZER) {
            fins.push(FOREGROUND_FINALIZER.to_string());
            meta_mut(&mut obj).insert("finalizers".into(), json!(fins));
        }
        if fins.is_empty() {
            self.remove_locked(&mut inner, rt, &key, obj.clone());
            return Ok((Self::present(rt, &obj), true));
        }
        Self::mark_deleting(&mut obj, 0);
        self.put_modified_locked(&mut inner, &key, &mut obj, prev);
        Ok((Self::present(rt, &obj), false))
    }

    /// Set deletionTimestamp (now + grace) and deletionGracePeriodSeconds, and bump
    /// generation, as the registry's BeforeDelete does.
    fn mark_deleting(obj: &mut Value, grace: i64) {
        let ts = jiff::Timestamp::now()
            .checked_add(jiff::SignedDuration::from_secs(grace))
            .unwrap_or_else(|_| jiff::Timestamp::now());
        let ts = jiff::Timestamp::from_second(ts.as_second())
            .unwrap_or(ts)
            .to_string();
        let g = obj["metadata"]["generation"].as_i64().unwrap_or(0);
        let m = meta_mut(obj);
        m.insert("deletionTimestamp".into(), json!(ts));
        m.insert("deletionGracePeriodSeconds".into(), json!(grace));
        if g > 0 {
            m.insert("generation".into(), json!(g + 1));
        }
    }

    /// Remove ownerReferences to `owner_uid` from every object (Orphan propagation).
    fn orphan_dependents_locked(&self, inner: &mut Inner, owner_uid: &str) {
        // Every object with ownerReferences is in the collector's index.
        let keys: Vec<ObjKey> = inner
            .gc_watched
            .iter()
            .filter(|(_, e)| e.owners.iter().any(|(u, _)| u == owner_uid))
            .map(|(k, _)| k.clone())
            .collect();
        for k in keys {
            let Some(prev) = inner.objects.get(&k).cloned() else {
                continue;
            };
            let mut o = prev.clone();
            if let Some(refs) = o["metadata"]["ownerReferences"].as_array_mut() {
                refs.retain(|r| r["uid"].as_str() != Some(owner_uid));
                if refs.is_empty() {
                    meta_mut(&mut o).remove("ownerReferences");
                }
            }
            self.put_modified_locked(inner, &k, &mut o, prev);
        }
    }
}

/// The stored objects of one resource (`rt`'s group and plural, any version), in namespace
/// `ns` if the resource is namespaced and `ns` is given, else in all: one range of the ordered
/// map (keys sort by group, plural, namespace, name), so a scan never touches other
/// resources' or namespaces' objects.
fn objects_of<'a>(
    objects: &'a BTreeMap<ObjKey, Value>,
    rt: &ResourceType,
    ns: Option<&str>,
) -> impl Iterator<Item = (&'a ObjKey, &'a Value)> + use<'a> {
    let ns = ns.filter(|_| rt.namespaced).map(str::to_string);
    let start = (
        rt.group.clone(),
        rt.plural.clone(),
        ns.clone().unwrap_or_default(),
        String::new(),
    );
    let (group, plural) = (rt.group.clone(), rt.plural.clone());
    objects.range(start..).take_while(move |((g, p, n, _), _)| {
        *g == group && *p == plural && ns.as_ref().is_none_or(|ns| n == ns)
    })
}

/// Secret `stringData` is write-only: merged into `data` (base64) on every write, as the
/// apiserver does.
fn fold_string_data(obj: &mut Value) {
    if let Some(sd) = obj.get("stringData").and_then(Value::as_object).cloned() {
        if !obj.get("data").is_some_and(Value::is_object) {
            obj["data"] = json!({});
        }
        for (k, v) in sd {
            let enc =
                base64::engine::general_purpose::STANDARD.encode(v.as_str().unwrap_or_default());
            obj["data"][k] = json!(enc);
        }
    }
    if let Some(m) = obj.as_object_mut() {
        m.remove("stringData");
    }
}

/// Pod spec defaults that the Job runner relies on.
fn default_pod_spec(spec: &mut Value) {
    if !spec.is_object() {
        return;
    }
    if spec
        .get("terminationGracePeriodSeconds")
        .is_none_or(Value::is_null)
    {
        spec["terminationGracePeriodSeconds"] = json!(30);
    }
    if spec.get("restartPolicy").is_none_or(Value::is_null) {
        spec["restartPolicy"] = json!("Always");
    }
    if let Some(containers) = spec.get_mut("containers").and_then(Value::as_array_mut) {
        for c in containers {
            if c.get("terminationMessagePath").is_none_or(Value::is_null) {
                c["terminationMessagePath"] = json!("/dev/termination-log");
            }
            if c.get("terminationMessagePolicy").is_none_or(Value::is_null) {
                c["terminationMessagePolicy"] = json!("File");
            }
        }
    }
}

/// Runs a controller's `pass` once, then again after each change of the store (letting a
/// burst of writes settle for 5 ms first), until the change channel closes or the task is
/// aborted.
pub(crate) async fn run_on_changes(store: Store, mut pass: impl FnMut(&Store)) {
    let mut changes = store.subscribe_changes();
    loop {
        pass(&store);
        if changes.changed().await.is_err() {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cm(name: &str) -> Value {
        json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "namespace": "default"}, "data": {"a": "1"}})
    }

    #[test]
    fn versions_uids_and_generation() {
        let s = Store::new();
        let a = s.create(cm("a")).expect("create");
        let rv_a: u64 = a["metadata"]["resourceVersion"]
            .as_str()
            .and_then(|r| r.parse().ok())
            .expect("rv");
        assert_eq!(a["metadata"]["generation"], 1);
        assert_eq!(a["metadata"]["uid"].as_str().map(str::len), Some(36));
        let mut b = a.clone();
        b["metadata"]["labels"] = json!({"x": "y"});
        let b = s.update(b).expect("update");
        assert_eq!(
            b["metadata"]["generation"], 1,
            "metadata change does not bump generation"
        );
        let rv_b: u64 = b["metadata"]["resourceVersion"]
            .as_str()
            .and_then(|r| r.parse().ok())
            .expect("rv");
        assert!(rv_b > rv_a);
        let mut c = b.clone();
        c["data"]["a"] = json!("2");
        let c = s.update(c).expect("update");
        assert_eq!(c["metadata"]["generation"], 2);
        // stale resourceVersion
        let err = s.update(b).expect_err("stale");
        assert_eq!((err.code, err.reason.as_str()), (409, "Conflict"));
        // no-op update does not bump the resourceVersion
        let same = s.update(c.clone()).expect("noop");
        assert_eq!(
            same["metadata"]["resourceVersion"],
            c["metadata"]["resourceVersion"]
        );
        let err = s.create(cm("a")).expect_err("exists");
        assert_eq!(err.to_status()["reason"], "AlreadyExists");
        assert_eq!(
            err.to_status()["details"],
            json!({"name": "a", "kind": "configmaps"})
        );
    }

    #[test]
    fn a_job_gets_a_selector_of_its_own_uid_unless_manual() {
        let s = Store::new();
        let job = s
            .create(json!({"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "j", "namespace": "default"},
                "spec": {"template": {"metadata": {"labels": {"app": "x", "job-name": "mine"}},
                    "spec": {"containers": [{"name": "c"}], "restartPolicy": "Never"}}}}))
            .expect("create");
        let uid = job["metadata"]["uid"].as_str().expect("uid");
        assert_eq!(
            job["spec"]["selector"],
            json!({"matchLabels": {"batch.kubernetes.io/controller-uid": uid}})
        );
        assert_eq!(
            job["spec"]["template"]["metadata"]["labels"],
            json!({"app": "x", "job-name": "mine", "batch.kubernetes.io/job-name": "j",
                "controller-uid": uid, "batch.kubernetes.io/controller-uid": uid}),
            "labels already set are kept"
        );
        let manual = s
            .create(json!({"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "m", "namespace": "default"},
                "spec": {"manualSelector": true, "selector": {"matchLabels": {"app": "m"}},
                    "template": {"metadata": {"labels": {"app": "m"}},
                    "spec": {"containers": [{"name": "c"}], "restartPolicy": "Never"}}}}))
            .expect("create");
        assert_eq!(
            manual["spec"]["selector"],
            json!({"matchLabels": {"app": "m"}})
        );
        assert_eq!(
            manual["spec"]["template"]["metadata"]["labels"],
            json!({"app": "m"})
        );
    }

    #[test]
    fn status_subresource_separation() {
        let s = Store::new();
        let job = s
            .create(json!({"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "j", "namespace": "default"},
                "spec": {"template": {"spec": {"containers": [{"name": "c"}], "restartPolicy": "Never"}}},
                "status": {"active": 5}}))
            .expect("create");
        assert!(job.get("status").is_none(), "status dropped on create");
        let mut st = job.clone();
        st["status"] = json!({"active": 1});
        st["spec"]["parallelism"] = json!(9);
        let after = s.update_status(st).expect("status");
        assert_eq!(after["status"]["active"], 1);
        assert_eq!(after["spec"]["parallelism"], 1, "status write ignores spec");
        assert_eq!(
            after["metadata"]["generation"], 1,
            "status writes never bump generation"
        );
        let mut main = after.clone();
        main["status"] = json!({"active": 7});
        let after2 = s.update(main).expect("update");
        assert_eq!(after2["status"]["active"], 1, "main write ignores status");
    }

    #[test]
    fn finalizers_hold_deletion() {
        let s = Store::new();
        let mut o = cm("f");
        o["metadata"]["finalizers"] = json!(["x/y"]);
        s.create(o).expect("create");
        let d = s
            .delete("v1", "configmaps", Some("default"), "f")
            .expect("delete");
        assert!(is_deleting(&d));
        assert_eq!(d["metadata"]["deletionGracePeriodSeconds"], 0);
        let mut cur = s
            .get("v1", "configmaps", Some("default"), "f")
            .expect("still there");
        cur["metadata"]["finalizers"] = json!(["x/y", "new"]);
        let err = s.update(cur.clone()).expect_err("no new finalizers");
        assert_eq!(err.code, 422);
        cur["metadata"]["finalizers"] = json!(["x/y"]);
        cur["metadata"]["deletionTimestamp"] = Value::Null;
        let kept = s.update(cur.clone()).expect("update");
        assert!(
            is_deleting(&kept),
            "an update never clears deletionTimestamp"
        );
        assert_eq!(
            kept["metadata"]["generation"], 2,
            "setting deletionTimestamp bumped generation"
        );
        cur["metadata"]["finalizers"] = json!([]);
        s.update(cur).expect("remove finalizer");
        assert!(s.get("v1", "configmaps", Some("default"), "f").is_none());
    }

    #[test]
    fn crd_registers_types_and_its_finalizer_deletes_objects() {
        let s = Store::new();
        s.create(json!({"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
            "metadata": {"name": "widgets.example.com"},
            "spec": {"group": "example.com", "scope": "Namespaced",
                "names": {"plural": "widgets", "singular": "widget", "kind": "Widget", "shortNames": ["wd"]},
                "versions": [{"name": "v1", "served": true, "storage": true, "subresources": {"status": {}}}]}}))
        .expect("crd");
        let rt = s.resource_type("example.com/v1", "Widget").expect("served");
        assert!(rt.status_subresource);
        s.create(json!({"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w", "namespace": "default"}}))
            .expect("cr");
        let crd = s
            .delete(
                "apiextensions.k8s.io/v1",
                "customresourcedefinitions",
                None,
                "widgets.example.com",
            )
            .expect("delete");
        assert!(is_deleting(&crd));
        assert_eq!(finalizers(&crd), vec![crds::CLEANUP_FINALIZER.to_string()]);
        assert!(
            s.get("example.com/v1", "widgets", Some("default"), "w")
                .is_some()
        );
        // The finalizer controller (not running in a bare Store) deletes the instances,
        // then releases the CRD.
        crds::pass(&s);
        assert!(
            s.get("example.com/v1", "widgets", Some("default"), "w")
                .is_none()
        );
        assert!(
            s.get(
                "apiextensions.k8s.io/v1",
                "customresourcedefinitions",
                None,
                "widgets.example.com"
            )
            .is_none()
        );
        assert!(s.resource_type("example.com/v1", "Widget").is_none());
    }

    #[test]
    fn lists_take_only_the_resource_and_namespace_asked_for() {
        let s = Store::new();
        for ns in ["a", "ab"] {
            s.create(json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}))
                .expect("namespace");
        }
        for (ns, name) in [("a", "x"), ("ab", "y"), ("default", "z")] {
            s.create(json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "namespace": ns}}))
                .expect("configmap");
            s.create(json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": name, "namespace": ns}}))
                .expect("secret");
        }
        let names = |items: Vec<Value>| -> Vec<String> {
            items
                .iter()
                .map(|o| {
                    format!(
                        "{}/{}",
                        o["kind"].as_str().unwrap_or_default(),
                        meta_str(o, "name").unwrap_or_default()
                    )
                })
                .collect()
        };
        assert_eq!(
            names(s.list("v1", "configmaps", Some("a"))),
            ["ConfigMap/x"]
        );
        assert_eq!(
            names(s.list("v1", "configmaps", None)),
            ["ConfigMap/x", "ConfigMap/y", "ConfigMap/z"]
        );
        assert_eq!(names(s.list("v1", "secrets", Some("ab"))), ["Secret/y"]);
        assert!(s.list("v1", "configmaps", Some("nowhere")).is_empty());
        // A cluster-scoped resource ignores the namespace.
        assert_eq!(
            names(s.list("v1", "namespaces", Some("a"))),
            [
                "Namespace/a",
                "Namespace/ab",
                "Namespace/default",
                "Namespace/kube-system"
            ]
        );
    }

    /// Lists that read the label index give what a scan of every object gives, through
    /// creates, relabels, label removals and deletes.
    #[test]
    fn label_index_lists_match_a_full_scan() {
        use crate::selectors::LabelSelector;
        let s = Store::new();
        s.create(json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "other"}}))
            .expect("namespace");
        let cm_rt = s.resource_type("v1", "configmaps").expect("type");
        let secret_rt = s.resource_type("v1", "secrets").expect("type");
        let check = |when: &str| {
            for sel in ["a=1", "a=1,b=x", "b in (x)", "a==2,b!=x", "a=3", "b=x,a"] {
                let l = LabelSelector::parse(sel).expect(sel);
                for rt in [&cm_rt, &secret_rt] {
                    for ns in [None, Some("default"), Some("other")] {
                        let indexed = s.list_rt_where(rt, ns, &l.required(), |o| l.matches(o)).1;
                        let scanned = s.list_rt_where(rt, ns, &[], |o| l.matches(o)).1;
                        assert_eq!(indexed, scanned, "{when}: {sel} {} {ns:?}", rt.plural);
                    }
                }
            }
        };
        for (i, ns) in ["default", "other", "default", "other", "default"]
            .iter()
            .enumerate()
        {
            let labels = json!({"a": (i % 2 + 1).to_string(), "b": if i < 3 { "x" } else { "y" }});
            for kind in ["ConfigMap", "Secret"] {
                s.create(json!({"apiVersion": "v1", "kind": kind,
                    "metadata": {"name": format!("o{i}"), "namespace": ns, "labels": labels}}))
                    .expect("create");
            }
        }
        check("created");
        let mut o = s
            .get("v1", "configmaps", Some("default"), "o0")
            .expect("o0");
        o["metadata"]["labels"] = json!({"a": "3", "b": "x"});
        s.update(o).expect("relabel");
        let mut o = s.get("v1", "secrets", Some("other"), "o1").expect("o1");
        o["metadata"]["labels"] = Value::Null;
        s.update(o).expect("unlabel");
        check("relabelled");
        s.delete("v1", "configmaps", Some("default"), "o2")
            .expect("delete");
        s.delete("v1", "secrets", Some("default"), "o4")
            .expect("delete");
        check("deleted");
        let l = LabelSelector::parse("a=3").expect("parse");
        assert_eq!(
            s.list_rt_where(&cm_rt, None, &l.required(), |o| l.matches(o))
                .1
                .len(),
            1
        );
    }

    #[test]
    fn version_priority_order() {
        let mut v = vec!["v1alpha1", "v1", "v2beta1", "v1beta2", "v2"];
        v.sort_by_key(|x| std::cmp::Reverse(version_priority(x)));
        assert_eq!(v, vec!["v2", "v1", "v2beta1", "v1beta2", "v1alpha1"]);
    }
}
