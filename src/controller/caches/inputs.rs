//! The inputs Secrets, and the apply attempts' variables Secrets, the manager read or
//! wrote, kept per object while the cache of the object's Secrets shows the version kept
//! (or, after the manager's own write, the version that write replaced: the watch has not
//! brought the write yet).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use k8s_openapi::api::core::v1::Secret;

use super::bootstrap::size_of;
use super::budget::Budgeted;

/// The inputs Secrets of objects, and the variables Secrets of their apply attempts, by
/// object uid and Secret name, each with the resourceVersion it was read or written at. A
/// provisioned machine decides from the values its inputs Secret recorded
/// (`gather::apply::keeps_recorded_values`), and its passes would read that Secret at each
/// one; a deletion's preview reads it with the state; the pass that records an apply's end
/// reads the inputs the attempt ran from its variables Secret, which the manager wrote when
/// it started the attempt. A Secret is served only while the cache of the object's Secrets
/// shows the version kept; it is read again when the cache shows another (a re-apply
/// recorded new inputs) or none. One the manager wrote is also served while the cache still
/// shows what the write replaced (or, for a create, nothing): the watch is one write behind,
/// and this is the write it has not brought yet. At most [`INPUTS_KEPT_BYTES`] are kept:
/// past it, the Secrets of the object whose Secret was kept least lately go first.
pub struct KeptInputs {
    /// By object uid, then Secret name: an object's Secrets go together past the bound.
    inner: Mutex<Budgeted<String, HashMap<String, Kept>>>,
}

impl Default for KeptInputs {
    fn default() -> Self {
        Self {
            inner: Mutex::new(Budgeted::new(INPUTS_KEPT_BYTES, usize::MAX)),
        }
    }
}

struct Kept {
    resource_version: String,
    /// For a Secret the manager wrote: the version its write replaced (`Some(None)`: it
    /// created the Secret).
    replaced: Option<Option<String>>,
    /// An apply attempt's variables Secret.
    attempt: bool,
    secret: Arc<Secret>,
    bytes: usize,
}

/// How many bytes of inputs Secrets (their data, and a kilobyte for the rest of each) are
/// kept at most: a machine's inputs are its variables, its bootstrap data and a few names,
/// some kilobytes with kubeadm.
pub const INPUTS_KEPT_BYTES: usize = 16 << 20;

impl KeptInputs {
    fn lock(&self) -> MutexGuard<'_, Budgeted<String, HashMap<String, Kept>>> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Secret `name` of the object `uid` as kept, when the cache of the object's Secrets
    /// shows it at `shown` (its resourceVersion; `None`: the cache shows no such Secret).
    pub fn get(&self, uid: &str, name: &str, shown: Option<&str>) -> Option<Arc<Secret>> {
        let inner = self.lock();
        let kept = inner.get(&uid.to_string())?.get(name)?;
        let current = shown == Some(kept.resource_version.as_str())
            || kept
                .replaced
                .as_ref()
                .is_some_and(|r| r.as_deref() == shown);
        current.then(|| kept.secret.clone())
    }

    /// Keeps a Secret of the object `uid` as read.
    pub fn keep_read(&self, uid: &str, secret: &Secret) {
        self.keep(uid, secret, None, false);
    }

    /// Keeps a Secret of the object `uid` as the manager's write returned it, with the
    /// version that write replaced (`None`: it created the Secret).
    pub fn keep_written(&self, uid: &str, secret: &Secret, replaced: Option<&str>) {
        self.keep(uid, secret, Some(replaced.map(str::to_string)), false);
    }

    /// Keeps the variables Secret the manager created for an apply attempt of the object
    /// `uid`, in place of an earlier attempt's: one attempt's end is recorded at a time.
    pub fn keep_attempt(&self, uid: &str, secret: &Secret) {
        self.keep(uid, secret, Some(None), true);
    }

    /// Keeps `secret` among the object's (in place of an earlier attempt's, for an
    /// attempt's): the object's Secrets are then the latest kept, and go last.
    fn keep(&self, uid: &str, secret: &Secret, replaced: Option<Option<String>>, attempt: bool) {
        let (Some(name), Some(resource_version)) = (
            secret.metadata.name.clone(),
            secret.metadata.resource_version.clone(),
        ) else {
            return;
        };
        let bytes = size_of(secret);
        if bytes > INPUTS_KEPT_BYTES {
            return;
        }
        let mut secret = secret.clone();
        secret.metadata.managed_fields = None;
        let kept = Kept {
            resource_version,
            replaced,
            attempt,
            secret: Arc::new(secret),
            bytes,
        };
        let mut inner = self.lock();
        let mut of_uid = inner.remove(&uid.to_string()).unwrap_or_default();
        if attempt {
            of_uid.retain(|_, k| !k.attempt);
        }
        of_uid.insert(name.clone(), kept);
        if total(&of_uid) > INPUTS_KEPT_BYTES {
            of_uid.retain(|n, _| *n == name);
        }
        let bytes = total(&of_uid);
        inner.insert(uid.to_string(), of_uid, bytes);
    }

    /// Forgets Secret `name` of the object `uid` (an attempt's variables, once recorded).
    pub fn forget_one(&self, uid: &str, name: &str) {
        let mut inner = self.lock();
        let Some(mut of_uid) = inner.remove(&uid.to_string()) else {
            return;
        };
        of_uid.remove(name);
        if !of_uid.is_empty() {
            let bytes = total(&of_uid);
            inner.insert(uid.to_string(), of_uid, bytes);
        }
    }

    /// Forgets what is kept of the object `uid` (released, or gone).
    pub fn forget(&self, uid: &str) {
        self.lock().remove(&uid.to_string());
    }

    /// How many Secrets are kept.
    #[cfg(test)]
    fn len(&self) -> usize {
        let inner = self.lock();
        inner.values().map(HashMap::len).sum()
    }
}

/// What an object's kept Secrets count as.
fn total(of_uid: &HashMap<String, Kept>) -> usize {
    of_uid.values().map(|k| k.bytes).sum()
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::ByteString;
    use kube::api::ObjectMeta;

    fn secret(version: &str, data: &str) -> Secret {
        named("web-1-inputs", version, data)
    }

    fn named(name: &str, version: &str, data: &str) -> Secret {
        Secret {
            metadata: ObjectMeta {
                name: Some(name.into()),
                resource_version: Some(version.into()),
                ..Default::default()
            },
            data: Some([("inputs.json".to_string(), ByteString(data.into()))].into()),
            ..Default::default()
        }
    }

    fn data(s: Option<Arc<Secret>>) -> Option<Vec<u8>> {
        s.and_then(|s| s.data.clone())
            .and_then(|d| d.get("inputs.json").map(|v| v.0.clone()))
    }

    #[test]
    fn a_secret_read_is_served_only_at_the_version_the_cache_shows() {
        let k = KeptInputs::default();
        assert!(
            k.get("uid-1", "web-1-inputs", Some("10")).is_none(),
            "nothing kept yet"
        );
        k.keep_read("uid-1", &secret("10", "a"));
        assert_eq!(
            data(k.get("uid-1", "web-1-inputs", Some("10"))),
            Some(b"a".to_vec())
        );
        // The cache shows another version (a re-apply recorded new inputs), or none.
        assert!(k.get("uid-1", "web-1-inputs", Some("11")).is_none());
        assert!(k.get("uid-1", "web-1-inputs", None).is_none());
        k.keep_read("uid-1", &secret("11", "b"));
        assert_eq!(
            data(k.get("uid-1", "web-1-inputs", Some("11"))),
            Some(b"b".to_vec())
        );
        assert!(k.get("uid-1", "web-1-inputs", Some("10")).is_none());
        k.forget("uid-1");
        assert!(k.get("uid-1", "web-1-inputs", Some("11")).is_none());
        assert_eq!(k.len(), 0);
    }

    #[test]
    fn an_objects_secrets_are_kept_by_name_and_forgotten_one_or_all() {
        let k = KeptInputs::default();
        k.keep_read("uid-1", &secret("10", "inputs"));
        k.keep_attempt("uid-1", &named("web-1-apply-1", "12", "attempt 1"));
        k.keep_attempt("uid-2", &named("web-2-apply-1", "13", "other"));
        assert_eq!(k.len(), 3);
        assert_eq!(
            data(k.get("uid-1", "web-1-apply-1", None)),
            Some(b"attempt 1".to_vec())
        );
        assert!(
            k.get("uid-1", "web-2-apply-1", None).is_none(),
            "another object's"
        );
        // A later attempt's takes the place of the earlier one's.
        k.keep_attempt("uid-1", &named("web-1-apply-2", "14", "attempt 2"));
        assert_eq!(k.len(), 3);
        assert!(k.get("uid-1", "web-1-apply-1", None).is_none());
        assert!(k.get("uid-1", "web-1-apply-2", Some("14")).is_some());
        k.forget_one("uid-1", "web-1-apply-2");
        assert!(k.get("uid-1", "web-1-apply-2", None).is_none());
        assert!(k.get("uid-1", "web-1-inputs", Some("10")).is_some());
        k.forget("uid-1");
        assert_eq!(k.len(), 1);
        let bytes = k.lock().bytes();
        k.forget("uid-2");
        assert_eq!((k.len(), k.lock().bytes()), (0, 0), "{bytes} bytes before");
    }

    #[test]
    fn a_secret_written_is_served_while_the_cache_shows_what_the_write_replaced() {
        let k = KeptInputs::default();
        // Created: served while the cache shows no Secret, and at its own version.
        k.keep_written("uid-1", &secret("20", "a"), None);
        assert_eq!(
            data(k.get("uid-1", "web-1-inputs", None)),
            Some(b"a".to_vec())
        );
        assert_eq!(
            data(k.get("uid-1", "web-1-inputs", Some("20"))),
            Some(b"a".to_vec())
        );
        assert!(
            k.get("uid-1", "web-1-inputs", Some("19")).is_none(),
            "a version not known"
        );
        // Replaced: served at the version replaced, not while the cache shows none (the
        // Secret was deleted since) nor at another version.
        k.keep_written("uid-1", &secret("30", "b"), Some("20"));
        assert_eq!(
            data(k.get("uid-1", "web-1-inputs", Some("20"))),
            Some(b"b".to_vec())
        );
        assert_eq!(
            data(k.get("uid-1", "web-1-inputs", Some("30"))),
            Some(b"b".to_vec())
        );
        assert!(k.get("uid-1", "web-1-inputs", None).is_none());
        assert!(k.get("uid-1", "web-1-inputs", Some("31")).is_none());
        // Read again: only at the version read.
        k.keep_read("uid-1", &secret("31", "c"));
        assert!(k.get("uid-1", "web-1-inputs", Some("30")).is_none());
        assert_eq!(
            data(k.get("uid-1", "web-1-inputs", Some("31"))),
            Some(b"c".to_vec())
        );
    }

    #[test]
    fn the_oldest_go_first_beyond_the_bound() {
        let k = KeptInputs::default();
        let big = "x".repeat(INPUTS_KEPT_BYTES / 4);
        for i in 0..6 {
            k.keep_read(&format!("uid-{i}"), &secret("1", &big));
        }
        // Four quarters do not fit with the kilobyte counted for the rest of each.
        assert_eq!(k.len(), 3);
        assert!(k.get("uid-0", "web-1-inputs", Some("1")).is_none());
        assert!(k.get("uid-5", "web-1-inputs", Some("1")).is_some());
        // Kept again, an object counts once.
        k.keep_read("uid-5", &secret("2", "small"));
        assert_eq!(k.len(), 3);
        assert!(k.lock().bytes() <= INPUTS_KEPT_BYTES);
        // A Secret larger than the bound is not kept at all.
        k.keep_read("uid-9", &secret("1", &"y".repeat(INPUTS_KEPT_BYTES + 1)));
        assert!(k.get("uid-9", "web-1-inputs", Some("1")).is_none());
        // Nor one without a resourceVersion.
        let mut unversioned = secret("1", "z");
        unversioned.metadata.resource_version = None;
        k.keep_read("uid-10", &unversioned);
        assert!(k.get("uid-10", "web-1-inputs", None).is_none());
    }
}
