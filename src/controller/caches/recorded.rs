//! The contract's values a provisioned machine's inputs Secret records, kept per object
//! while the cache of the object's Secrets shows the version they were read from.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, MutexGuard};

/// The values an inputs Secret records (none when it records none).
pub type Values = Option<Arc<serde_json::Map<String, serde_json::Value>>>;

/// What the inputs Secrets of provisioned machines record, by object uid, with the
/// resourceVersion each was read at: a provisioned machine decides from the values its
/// inputs Secret recorded (`gather::apply::keeps_recorded_values`), and its passes would
/// read that Secret at each one. A value is served only while the cache of the object's
/// Secrets shows the version it was read at; the Secret is read again when the cache shows
/// another (a re-apply recorded new values) or none. At most [`RECORDED_KEPT_BYTES`] of
/// values are kept, the oldest dropped first.
#[derive(Default)]
pub struct RecordedValues {
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    by_uid: HashMap<String, Kept>,
    /// The uids by when they were kept, oldest first.
    order: BTreeMap<u64, String>,
    bytes: usize,
    next: u64,
}

impl Inner {
    fn forget(&mut self, uid: &str) {
        if let Some(k) = self.by_uid.remove(uid) {
            self.bytes -= k.bytes;
            self.order.remove(&k.at);
        }
    }
}

struct Kept {
    resource_version: String,
    values: Values,
    bytes: usize,
    at: u64,
}

/// How many bytes of recorded values (as JSON) are kept at most: a machine's are its
/// bootstrap data and a few names, some kilobytes with kubeadm.
pub const RECORDED_KEPT_BYTES: usize = 16 << 20;

impl RecordedValues {
    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The values kept for `uid` when they were read at `resource_version`.
    pub fn get(&self, uid: &str, resource_version: &str) -> Option<Values> {
        let inner = self.lock();
        let kept = inner.by_uid.get(uid)?;
        (kept.resource_version == resource_version).then(|| kept.values.clone())
    }

    /// Keeps the values read for `uid` at `resource_version`.
    pub fn keep(&self, uid: &str, resource_version: &str, values: Values) {
        let bytes = values
            .as_ref()
            .map_or(0, |v| serde_json::to_vec(v.as_ref()).map_or(0, |b| b.len()));
        if bytes > RECORDED_KEPT_BYTES {
            return;
        }
        let mut inner = self.lock();
        let at = inner.next;
        inner.next += 1;
        inner.forget(uid);
        while inner.bytes + bytes > RECORDED_KEPT_BYTES {
            let Some((_, oldest)) = inner.order.pop_first() else {
                break;
            };
            inner.forget(&oldest);
        }
        inner.bytes += bytes;
        inner.order.insert(at, uid.to_string());
        inner.by_uid.insert(
            uid.to_string(),
            Kept {
                resource_version: resource_version.to_string(),
                values,
                bytes,
                at,
            },
        );
    }

    /// Forgets `uid` (released, or gone).
    pub fn forget(&self, uid: &str) {
        self.lock().forget(uid);
    }

    /// How many objects' values are kept.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.lock().by_uid.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn values(bootstrap: &str) -> Values {
        let v = serde_json::json!({"bootstrap_data": bootstrap, "cluster_name": "prod"});
        Some(Arc::new(v.as_object().cloned().expect("an object")))
    }

    #[test]
    fn values_are_served_only_at_the_version_they_were_read_at() {
        let r = RecordedValues::default();
        assert!(r.get("uid-1", "10").is_none(), "nothing kept yet");
        r.keep("uid-1", "10", values("a"));
        assert_eq!(r.get("uid-1", "10"), Some(values("a")));
        // The cache shows another version (a re-apply recorded new values): not served.
        assert!(r.get("uid-1", "11").is_none());
        r.keep("uid-1", "11", values("b"));
        assert_eq!(r.get("uid-1", "11"), Some(values("b")));
        assert!(r.get("uid-1", "10").is_none());
        // A Secret that records nothing is kept as such.
        r.keep("uid-2", "5", None);
        assert_eq!(r.get("uid-2", "5"), Some(None));
        r.forget("uid-1");
        assert!(r.get("uid-1", "11").is_none());
        assert_eq!(r.len(), 1);
    }

    #[test]
    fn the_oldest_values_go_first_beyond_the_bound() {
        let r = RecordedValues::default();
        let big = "x".repeat(RECORDED_KEPT_BYTES / 4);
        for i in 0..6 {
            r.keep(&format!("uid-{i}"), "1", values(&big));
        }
        // Four quarters do not fit with the names around them: three are kept, the last.
        assert_eq!(r.len(), 3);
        assert!(r.get("uid-0", "1").is_none());
        assert!(r.get("uid-5", "1").is_some());
        // Kept again, an object counts once.
        r.keep("uid-5", "2", values("small"));
        assert_eq!(r.len(), 3);
        assert!(r.lock().bytes <= RECORDED_KEPT_BYTES);
        // Values larger than the bound are not kept at all.
        r.keep("uid-9", "1", values(&"y".repeat(RECORDED_KEPT_BYTES + 1)));
        assert!(r.get("uid-9", "1").is_none());
    }
}
