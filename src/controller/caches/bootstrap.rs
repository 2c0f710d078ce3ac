//! The bootstrap data Secrets a machine's or pool's passes read, kept while the watch of
//! the Secrets labelled with a cluster's name says they have not changed.

use std::collections::HashMap;
use std::sync::Arc;

use k8s_openapi::api::core::v1::Secret;
use kube::core::PartialObjectMeta;
use kube::runtime::watcher;

use super::budget::Budgeted;

/// The bootstrap data Secrets passes read, kept while the watch of the Secrets labelled
/// with a cluster's name says they have not changed: a machine or pool reads its
/// bootstrap data at every pass until it has recorded its values (the contract's inputs),
/// and a provisioning takes a score of passes. Only the resourceVersions the watch saw
/// are kept for every Secret (the watch is of metadata); at most [`BOOTSTRAP_KEPT`]
/// Secrets, and [`BOOTSTRAP_KEPT_BYTES`] of their data, are kept whole, and past either the
/// one read least lately goes first: a machine that provisioned reads its recorded values
/// instead, so its bootstrap data goes before that of one still provisioning.
#[derive(Default)]
pub struct BootstrapSecrets {
    inner: std::sync::Mutex<BootstrapInner>,
}

struct BootstrapInner {
    /// The resourceVersion the watch last saw, by `namespace/name`.
    seen: HashMap<String, String>,
    /// While the watch lists again (after a start or a lost watch): what it saw so far.
    /// Nothing is served from the kept Secrets meanwhile.
    relisting: Option<HashMap<String, String>>,
    /// The Secrets as read, by `namespace/name`, the one served or kept least lately going
    /// first past the bounds.
    kept: Budgeted<String, Arc<Secret>>,
}

impl Default for BootstrapInner {
    fn default() -> Self {
        Self {
            seen: HashMap::new(),
            relisting: None,
            kept: Budgeted::new(BOOTSTRAP_KEPT_BYTES, BOOTSTRAP_KEPT),
        }
    }
}

/// What a kept Secret is counted as: its data, and a kilobyte for the rest (the inputs
/// kept count theirs so too).
pub(super) fn size_of(secret: &Secret) -> usize {
    let data: usize = secret
        .data
        .iter()
        .flatten()
        .map(|(k, v)| k.len() + v.0.len())
        .sum();
    data + 1024
}

/// How many bootstrap data Secrets are kept whole at most.
pub const BOOTSTRAP_KEPT: usize = 4096;

/// How many bytes of bootstrap data are kept whole at most (a kubeadm bootstrap's data is
/// a few to some tens of kilobytes: a few hundred machines provisioning at once).
pub const BOOTSTRAP_KEPT_BYTES: usize = 8 << 20;

fn key_of(meta: &kube::api::ObjectMeta) -> Option<String> {
    Some(format!(
        "{}/{}",
        meta.namespace.as_deref()?,
        meta.name.as_deref()?
    ))
}

impl BootstrapSecrets {
    fn lock(&self) -> std::sync::MutexGuard<'_, BootstrapInner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// What the watch of the labelled Secrets saw.
    pub fn saw(&self, event: &watcher::Event<PartialObjectMeta<Secret>>) {
        let mut inner = self.lock();
        let rv = |m: &PartialObjectMeta<Secret>| m.metadata.resource_version.clone();
        match event {
            watcher::Event::Init => inner.relisting = Some(HashMap::new()),
            watcher::Event::InitApply(m) => {
                if let (Some(k), Some(v), Some(r)) =
                    (key_of(&m.metadata), rv(m), inner.relisting.as_mut())
                {
                    r.insert(k, v);
                }
            }
            watcher::Event::InitDone => {
                let seen = inner.relisting.take().unwrap_or_default();
                let BootstrapInner { kept, .. } = &mut *inner;
                kept.retain(|k, s| seen.get(k) == s.metadata.resource_version.as_ref());
                inner.seen = seen;
            }
            watcher::Event::Apply(m) => {
                if let (Some(k), Some(v)) = (key_of(&m.metadata), rv(m)) {
                    if let Some(r) = inner.relisting.as_mut() {
                        r.insert(k.clone(), v.clone());
                    }
                    inner.seen.insert(k, v);
                }
            }
            watcher::Event::Delete(m) => {
                if let Some(k) = key_of(&m.metadata) {
                    if let Some(r) = inner.relisting.as_mut() {
                        r.remove(&k);
                    }
                    inner.seen.remove(&k);
                    inner.kept.remove(&k);
                }
            }
        }
    }

    /// The watch failed: until it lists again or resumes, a change may go unseen, so
    /// nothing kept so far is served (what is read from now on is compared with what the
    /// watch reports next).
    pub fn lost(&self) {
        self.lock().kept.clear();
    }

    /// The Secret `ns/name` as kept, when the watch saw no other version of it since.
    pub fn get(&self, ns: &str, name: &str) -> Option<Arc<Secret>> {
        let mut inner = self.lock();
        if inner.relisting.is_some() {
            return None;
        }
        let key = format!("{ns}/{name}");
        let BootstrapInner { seen, kept, .. } = &mut *inner;
        if seen.get(&key) != kept.get(&key)?.metadata.resource_version.as_ref() {
            return None;
        }
        kept.touch(&key).cloned()
    }

    /// Keeps a Secret as read, without its managed fields. Past [`BOOTSTRAP_KEPT`] Secrets
    /// or [`BOOTSTRAP_KEPT_BYTES`], the one served or kept least lately goes.
    pub fn keep(&self, mut secret: Secret) {
        let Some(key) = key_of(&secret.metadata) else {
            return;
        };
        secret.metadata.managed_fields = None;
        let bytes = size_of(&secret);
        self.lock().kept.insert(key, Arc::new(secret), bytes);
    }

    /// How many Secrets are kept whole.
    #[cfg(test)]
    pub fn kept(&self) -> usize {
        self.lock().kept.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta(name: &str, rv: &str) -> PartialObjectMeta<Secret> {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "v1", "kind": "Secret",
            "metadata": {"name": name, "namespace": "team-a", "resourceVersion": rv}
        }))
        .expect("metadata")
    }

    fn secret(name: &str, rv: &str) -> Secret {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "namespace": "team-a", "resourceVersion": rv},
            "data": {"value": "I2Nsb3VkLWNvbmZpZw=="}
        }))
        .expect("secret")
    }

    fn listed(b: &BootstrapSecrets, items: &[(&str, &str)]) {
        b.saw(&watcher::Event::Init);
        for (n, rv) in items {
            b.saw(&watcher::Event::InitApply(meta(n, rv)));
        }
        b.saw(&watcher::Event::InitDone);
    }

    #[test]
    fn a_kept_secret_is_served_only_while_the_watch_saw_no_other_version() {
        let b = BootstrapSecrets::default();
        listed(&b, &[("web-1-bootstrap", "10")]);
        assert!(
            b.get("team-a", "web-1-bootstrap").is_none(),
            "nothing kept yet"
        );
        b.keep(secret("web-1-bootstrap", "10"));
        assert_eq!(
            b.get("team-a", "web-1-bootstrap")
                .and_then(|s| s.metadata.resource_version.clone())
                .as_deref(),
            Some("10")
        );
        // A rotation: the watch sees version 11; the kept 10 is not served.
        b.saw(&watcher::Event::Apply(meta("web-1-bootstrap", "11")));
        assert!(b.get("team-a", "web-1-bootstrap").is_none());
        // Read again at 11 and kept: served.
        b.keep(secret("web-1-bootstrap", "11"));
        assert!(b.get("team-a", "web-1-bootstrap").is_some());
        // Deleted: gone.
        b.saw(&watcher::Event::Delete(meta("web-1-bootstrap", "12")));
        assert!(b.get("team-a", "web-1-bootstrap").is_none());
        assert_eq!(b.kept(), 0);
    }

    #[test]
    fn a_read_older_than_the_watch_is_not_served() {
        // The watch saw 11 before the pass's read of 10 came back and was kept.
        let b = BootstrapSecrets::default();
        listed(&b, &[]);
        b.saw(&watcher::Event::Apply(meta("web-1-bootstrap", "11")));
        b.keep(secret("web-1-bootstrap", "10"));
        assert!(b.get("team-a", "web-1-bootstrap").is_none());
    }

    #[test]
    fn nothing_is_served_while_the_watch_lists_again_and_what_went_meanwhile_is_dropped() {
        let b = BootstrapSecrets::default();
        listed(&b, &[("a", "1"), ("b", "1")]);
        b.keep(secret("a", "1"));
        b.keep(secret("b", "1"));
        b.saw(&watcher::Event::Init);
        b.saw(&watcher::Event::InitApply(meta("a", "1")));
        assert!(b.get("team-a", "a").is_none(), "served during a relist");
        // `b` was deleted while the watch was lost: the relist does not show it.
        b.saw(&watcher::Event::InitDone);
        assert!(b.get("team-a", "a").is_some());
        assert!(b.get("team-a", "b").is_none());
        assert_eq!(b.kept(), 1);
    }

    #[test]
    fn a_failed_watch_drops_what_was_kept() {
        let b = BootstrapSecrets::default();
        listed(&b, &[("a", "1")]);
        b.keep(secret("a", "1"));
        b.lost();
        assert!(b.get("team-a", "a").is_none());
    }

    /// More machines provisioning at once than 256 (355 to 430 in runs of the scale bench)
    /// each read their bootstrap data once, not at every pass: the Secrets that are read
    /// are the ones kept.
    #[test]
    fn each_of_many_machines_provisioning_at_once_reads_its_bootstrap_data_once() {
        let b = BootstrapSecrets::default();
        listed(&b, &[]);
        let n = 400;
        let mut reads = 0;
        for _pass in 0..5 {
            for i in 0..n {
                let name = format!("m-{i}-bootstrap");
                if b.get("team-a", &name).is_none() {
                    reads += 1;
                    b.saw(&watcher::Event::Apply(meta(&name, "1")));
                    b.keep(secret(&name, "1"));
                }
            }
        }
        assert_eq!(
            reads, n,
            "reads of {n} machines' bootstrap data over 5 passes each"
        );
    }

    /// Past the budget, the Secret read least lately goes first: that of a machine that
    /// provisioned (its passes read its recorded values instead), not one that waits.
    #[test]
    fn past_the_budget_the_secret_read_least_lately_goes_first() {
        let b = BootstrapSecrets::default();
        listed(&b, &[]);
        let big = |name: &str| {
            let mut s = secret(name, "1");
            s.data = Some(
                [(
                    "value".to_string(),
                    k8s_openapi::ByteString(vec![b'x'; BOOTSTRAP_KEPT_BYTES / 4]),
                )]
                .into(),
            );
            s
        };
        for name in ["done", "waiting-1", "waiting-2"] {
            b.saw(&watcher::Event::Apply(meta(name, "1")));
            b.keep(big(name));
        }
        // The two waiting machines' passes read theirs again; the provisioned one's do not.
        assert!(b.get("team-a", "waiting-1").is_some());
        assert!(b.get("team-a", "waiting-2").is_some());
        // A fourth is more than the budget holds.
        b.saw(&watcher::Event::Apply(meta("new", "1")));
        b.keep(big("new"));
        assert!(
            b.get("team-a", "done").is_none(),
            "the provisioned one's went"
        );
        for name in ["waiting-1", "waiting-2", "new"] {
            assert!(b.get("team-a", name).is_some(), "{name} kept");
        }
        assert_eq!(b.kept(), 3);
    }

    #[test]
    fn at_most_so_many_secrets_are_kept_whole() {
        let b = BootstrapSecrets::default();
        listed(&b, &[]);
        for i in 0..BOOTSTRAP_KEPT + 10 {
            b.keep(secret(&format!("s{i}"), "1"));
        }
        assert_eq!(b.kept(), BOOTSTRAP_KEPT);
    }
}
