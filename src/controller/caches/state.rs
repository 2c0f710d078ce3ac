//! The state the record of an apply's end read, kept for the deletion preview of the pass
//! after it, while the cache of state Secrets shows the same Secrets at the same versions.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};

use k8s_openapi::api::core::v1::Secret;
use kube::ResourceExt;
use kube::core::PartialObjectMeta;

use super::budget::Budgeted;
use crate::state::StateSecrets;

/// The states that records of apply ends read, by object uid, each with the version of
/// every Secret of it (the base and its parts; for one the record's own protection wrote,
/// the version written and the one read, which the cache shows until the watch brings the
/// write: a finalizer changes nothing of the state) and the labels of the other Secrets
/// carrying its suffix label. The record reads the
/// state the Job just wrote; the pass after it (the record changed the object, so its
/// `DeletionReady` preview has nothing remembered for it) would list the same Secrets
/// again. Served once, to that preview, when the cache shows exactly those Secrets at
/// those versions (and labels); else, or after, the state is read. A preview starts
/// nothing: what starts an attempt reads the state live. At most [`STATES_KEPT_BYTES`],
/// the oldest dropped first.
pub struct KeptStates {
    inner: Mutex<Budgeted<String, Kept>>,
}

impl Default for KeptStates {
    fn default() -> Self {
        Self {
            inner: Mutex::new(Budgeted::new(STATES_KEPT_BYTES, usize::MAX)),
        }
    }
}

struct Kept {
    state: Arc<StateSecrets>,
    /// The base and its parts: name → the resourceVersions it may be shown at.
    versions: BTreeMap<String, Vec<String>>,
}

/// How many bytes of states (their Secrets' data, and a kilobyte for each Secret) are kept
/// at most. Each is kept from a record to the pass after it only.
pub const STATES_KEPT_BYTES: usize = 8 << 20;

impl KeptStates {
    fn lock(&self) -> MutexGuard<'_, Budgeted<String, Kept>> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Keeps `state` of the object `uid` as its record read it; `written`: the versions
    /// of its Secrets the record's own writes made (name → resourceVersion), served as
    /// well as those read. A state without its base, or one a Secret of which has no
    /// version, is not kept.
    pub fn keep(&self, uid: &str, state: &StateSecrets, written: &BTreeMap<String, String>) {
        if !state.base_present {
            return;
        }
        let mut versions = BTreeMap::new();
        for (name, meta) in &state.metas {
            let Some(read) = meta.resource_version.clone() else {
                return;
            };
            let shown_at = std::iter::once(read).chain(written.get(name).cloned());
            versions.insert(name.clone(), shown_at.collect::<Vec<_>>());
        }
        let bytes = state.base.as_ref().map_or(0, Vec::len)
            + state.parts.values().flatten().map(Vec::len).sum::<usize>()
            + 1024 * (versions.len() + state.labelled_others.len());
        let mut inner = self.lock();
        if bytes > STATES_KEPT_BYTES {
            inner.remove(&uid.to_string());
            return;
        }
        let state = Arc::new(state.clone());
        inner.insert(uid.to_string(), Kept { state, versions }, bytes);
    }

    /// The state kept of the object `uid`, taken (served once), when `shown` (the cache's
    /// Secrets carrying the state's suffix label, and its base) are exactly the Secrets
    /// kept: the base and parts at the versions kept, the others with the labels kept.
    /// Dropped when they are not: the state changed, and it is read.
    pub fn take(
        &self,
        uid: &str,
        shown: &[Arc<PartialObjectMeta<Secret>>],
    ) -> Option<Arc<StateSecrets>> {
        let k = self.lock().remove(&uid.to_string())?;
        // A Secret may be in both caches (the object's Secrets and the states'): each
        // copy must match.
        let mut names = std::collections::BTreeSet::new();
        for m in shown {
            let name = m.name_any();
            let matches = match k.versions.get(&name) {
                Some(at) => m.resource_version().is_some_and(|v| at.contains(&v)),
                None => k.state.labelled_others.get(&name) == Some(m.labels()),
            };
            if !matches {
                return None;
            }
            names.insert(name);
        }
        (names.len() == k.versions.len() + k.state.labelled_others.len()).then_some(k.state)
    }

    /// Forgets the state kept of the object `uid` (released, or gone).
    pub fn forget(&self, uid: &str) {
        self.lock().remove(&uid.to_string());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::api::ObjectMeta;

    fn meta(name: &str, version: &str, labels: &[(&str, &str)]) -> ObjectMeta {
        ObjectMeta {
            name: Some(name.into()),
            resource_version: Some(version.into()),
            labels: Some(
                labels
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
            ),
            ..Default::default()
        }
    }

    fn shown(name: &str, version: &str, labels: &[(&str, &str)]) -> Arc<PartialObjectMeta<Secret>> {
        Arc::new(PartialObjectMeta {
            types: None,
            metadata: meta(name, version, labels),
            _phantom: Default::default(),
        })
    }

    /// A state of a base and one part, and a stranger with the suffix label.
    fn state(bytes: usize) -> StateSecrets {
        StateSecrets {
            base_name: "tfstate-default-web-1".into(),
            base: Some(vec![1; bytes]),
            base_present: true,
            parts: [(1, Some(vec![2; 4]))].into(),
            labelled_others: [(
                "stranger".to_string(),
                [("x".to_string(), "1".to_string())].into(),
            )]
            .into(),
            metas: [
                (
                    "tfstate-default-web-1".to_string(),
                    meta("tfstate-default-web-1", "10", &[]),
                ),
                (
                    "tfstate-default-web-1-part-1".to_string(),
                    meta("tfstate-default-web-1-part-1", "11", &[]),
                ),
            ]
            .into(),
        }
    }

    fn as_shown(
        base: &str,
        part: &str,
        stranger: &[(&str, &str)],
    ) -> Vec<Arc<PartialObjectMeta<Secret>>> {
        vec![
            shown("tfstate-default-web-1", base, &[]),
            shown("tfstate-default-web-1-part-1", part, &[]),
            shown("stranger", "5", stranger),
        ]
    }

    #[test]
    fn a_kept_state_is_served_once_while_the_cache_shows_its_secrets_as_kept() {
        let kept = KeptStates::default();
        // The record protected the base (version 12 now).
        let written = [("tfstate-default-web-1".to_string(), "12".to_string())].into();
        kept.keep("u1", &state(10), &written);
        let served = kept.take("u1", &as_shown("12", "11", &[("x", "1")]));
        assert_eq!(served.expect("served").base, Some(vec![1; 10]));
        // Once.
        assert!(
            kept.take("u1", &as_shown("12", "11", &[("x", "1")]))
                .is_none()
        );
        // Also while the cache shows the version the record's write replaced (the watch
        // has not brought it yet), and when both caches show the base.
        kept.keep("u1", &state(10), &written);
        let both = [
            as_shown("10", "11", &[("x", "1")]),
            vec![shown("tfstate-default-web-1", "12", &[])],
        ]
        .concat();
        assert!(kept.take("u1", &both).is_some());
    }

    #[test]
    fn a_kept_state_is_dropped_when_the_cache_shows_another_version_or_set() {
        let kept = KeptStates::default();
        let none = BTreeMap::new();
        let changed: [Vec<Arc<PartialObjectMeta<Secret>>>; 6] = [
            // The base read at 10 is at 12: written since by someone else.
            as_shown("12", "11", &[("x", "1")]),
            // One cache shows it as read, the other at another version.
            [
                as_shown("10", "11", &[("x", "1")]),
                vec![shown("tfstate-default-web-1", "13", &[])],
            ]
            .concat(),
            // A part written since.
            as_shown("10", "13", &[("x", "1")]),
            // The stranger's labels changed.
            as_shown("10", "11", &[("x", "2")]),
            // A part gone.
            vec![
                shown("tfstate-default-web-1", "10", &[]),
                shown("stranger", "5", &[("x", "1")]),
            ],
            // A new Secret with the suffix label.
            [
                as_shown("10", "11", &[("x", "1")]),
                vec![shown("new", "1", &[])],
            ]
            .concat(),
        ];
        for shown in changed {
            kept.keep("u1", &state(10), &none);
            assert!(kept.take("u1", &shown).is_none(), "{shown:?}");
            // Dropped: not served once the cache shows it as kept again.
            assert!(
                kept.take("u1", &as_shown("10", "11", &[("x", "1")]))
                    .is_none()
            );
        }
        kept.keep("u1", &state(10), &none);
        assert!(
            kept.take("u1", &as_shown("10", "11", &[("x", "1")]))
                .is_some()
        );
    }

    #[test]
    fn states_past_the_budget_drop_the_oldest_and_one_too_big_is_not_kept() {
        let kept = KeptStates::default();
        let none = BTreeMap::new();
        let each = STATES_KEPT_BYTES / 3;
        for uid in ["u1", "u2", "u3"] {
            kept.keep(uid, &state(each), &none);
        }
        let current = as_shown("10", "11", &[("x", "1")]);
        assert!(kept.take("u1", &current).is_none(), "the oldest dropped");
        assert!(kept.take("u2", &current).is_some());
        assert!(kept.take("u3", &current).is_some());
        kept.keep("u4", &state(STATES_KEPT_BYTES + 1), &none);
        assert!(kept.take("u4", &current).is_none());
        // Forgotten at release.
        kept.keep("u5", &state(10), &none);
        kept.forget("u5");
        assert!(kept.take("u5", &current).is_none());
    }
}
