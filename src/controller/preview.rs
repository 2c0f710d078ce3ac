//! `DeletionReady` on a live object: what its deletion would reach if it were asked now,
//! decided by the deletion's table with the deletion assumed ([`rules::preview`]), from
//! what the pass read.
//!
//! The table needs the state, which a live pass does not read (only an apply that is due
//! and the pass after an apply do). So what the state tells the preview (its verdict,
//! the errored states, what would keep a destroy from starting) is remembered per object
//! with a key of everything it was read from that the manager sees without a request: the
//! resourceVersions of the object's Secrets and of its Terraform state Secrets in the
//! manager's caches, the object's annotations and generation, its namespace's state and
//! the credentials Secrets its spec names (as the live pass reads them). The state is read
//! again only when that key changes; a pass whose key is unchanged costs nothing more.
//! While a Job of the object runs, the remembered verdict stands (the state is rewritten
//! as Terraform goes), and the condition names the Job a deletion would wait for.

use std::collections::HashMap;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::Mutex;

use kube::ResourceExt;

use super::source::Cluster;
use super::{Context, Error, Scope};
use crate::api::TerraformObject;
use crate::api::conditions::{Desired, Status};
use crate::api::names::{self, Kind};
use crate::gather::source::Source;
use crate::gather::{self, Observed, StateWanted};
use crate::metrics::ByCause;
use crate::rules::{self, Blocker, Facts, StateFacts};
use crate::state::permits::Lane;

/// What a read of the state told the preview of one object.
struct Remembered {
    key: Option<u64>,
    state: StateFacts,
    errored_uncovered: bool,
    blocker: Option<Blocker>,
    /// The `(kind, reason)` this object is counted under in `captf_deletion_not_ready`.
    counted: Option<(Kind, &'static str)>,
}

/// The previews' memory, by object uid.
#[derive(Default)]
pub struct Previews {
    by_uid: Mutex<HashMap<String, Remembered>>,
}

impl Previews {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Remembered>> {
        self.by_uid.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The facts remembered for `uid` under `key`, laid over `current` (the facts of the
    /// pass, gathered without the state); none when they must be read again.
    fn recall(&self, uid: &str, key: Option<u64>, current: &Facts) -> Option<Facts> {
        let by_uid = self.lock();
        let r = by_uid.get(uid)?;
        let running = !current.unfinished_jobs.is_empty();
        if !running && (key.is_none() || r.key != key) {
            return None;
        }
        Some(Facts {
            state: r.state.clone(),
            errored_uncovered: r.errored_uncovered,
            blocker: r.blocker.clone(),
            ..current.clone()
        })
    }

    fn remember(&self, uid: &str, key: Option<u64>, f: &Facts) {
        let mut by_uid = self.lock();
        let counted = by_uid.remove(uid).and_then(|r| r.counted);
        by_uid.insert(
            uid.to_string(),
            Remembered {
                key,
                state: f.state.clone(),
                errored_uncovered: f.errored_uncovered,
                blocker: f.blocker.clone(),
                counted,
            },
        );
    }

    /// Counts `uid` under the condition's reason when it is not True.
    fn count(&self, ctx: &Context, uid: &str, kind: Kind, ready: &Desired) {
        let now = (ready.status != Status::True).then_some((kind, ready.reason));
        let mut by_uid = self.lock();
        let Some(r) = by_uid.get_mut(uid) else {
            return;
        };
        if r.counted == now {
            return;
        }
        if let Some((k, why)) = r.counted {
            ctx.metrics.deletion_not_ready.dec(&ByCause::new(k, why));
        }
        if let Some((k, why)) = now {
            ctx.metrics.deletion_not_ready.inc(&ByCause::new(k, why));
        }
        r.counted = now;
    }

    /// Forgets `uid` (its deletion began, or it is gone), uncounting it.
    pub fn forget(&self, ctx: &Context, uid: &str) {
        if let Some(Remembered {
            counted: Some((k, why)),
            ..
        }) = self.lock().remove(uid)
        {
            ctx.metrics.deletion_not_ready.dec(&ByCause::new(k, why));
        }
    }

    /// How many objects are remembered (for the scale bench's memory figures).
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The `DeletionReady` condition of a live object, from `observed` (the pass's
/// observation; with the state when the pass read it). `references_read`: whether the
/// pass read the Secrets the spec references (the live pass does).
pub async fn deletion_ready<K: TerraformObject>(
    ctx: &Context,
    scope: &Scope<K>,
    observed: &Observed,
    references_read: bool,
) -> Result<Desired, Error> {
    let key = key_of(scope, observed, references_read);
    let facts = match &observed.state {
        Some(_) => {
            let (f, _) = gather::gather(observed, &ctx.settings);
            ctx.previews.remember(&scope.uid, key, &f);
            f
        }
        None => {
            let (current, _) = gather::gather(observed, &ctx.settings);
            match ctx.previews.recall(&scope.uid, key, &current) {
                Some(f) => f,
                None => {
                    // Read once for this key: the state, the inputs (as kept, when the
                    // cache shows them unchanged), the lock, the errored states and what
                    // the inputs reference, under a permit.
                    tracing::debug!(
                        "the deletion preview reads the state: nothing read for this key"
                    );
                    let mut o = observed.clone();
                    let source = Cluster::new(ctx, scope, Lane::Ordinary);
                    source
                        .state(&o, StateWanted::Preview)
                        .await?
                        .apply(&mut o, source.now());
                    let (f, _) = gather::gather(&o, &ctx.settings);
                    ctx.previews.remember(&scope.uid, key, &f);
                    f
                }
            }
        }
    };
    let ready = rules::preview(&facts).ready;
    ctx.previews.count(ctx, &scope.uid, K::KIND, &ready);
    Ok(ready)
}

/// The key of what a preview was read from, as the manager sees it without a request;
/// none without the manager's caches (then every pass reads).
fn key_of<K: TerraformObject>(
    scope: &Scope<K>,
    o: &Observed,
    references_read: bool,
) -> Option<u64> {
    let caches = scope.caches.as_ref()?;
    let mut h = DefaultHasher::new();
    let mut secrets: Vec<(String, String)> = caches
        .secrets_by_uid
        .get(&caches.secrets, &scope.uid)
        .into_iter()
        .chain(caches.with_suffix(&scope.namespace, &scope.suffix))
        .map(|m| (m.name_any(), m.resource_version().unwrap_or_default()))
        .collect();
    secrets.sort();
    secrets.dedup();
    secrets.hash(&mut h);
    o.meta.annotations.hash(&mut h);
    o.meta.generation.hash(&mut h);
    o.namespace_terminating.hash(&mut h);
    if references_read {
        for e in &o.spec.env {
            let name = &e.secret_key_ref.name;
            let rv = o
                .referenced_secrets
                .get(name)
                .and_then(|s| s.metadata.resource_version.clone());
            (name, rv).hash(&mut h);
        }
    }
    // The state Secret's name ties the key to this object's state (a rename cannot).
    names::state_secret_name(&scope.suffix).hash(&mut h);
    Some(h.finish())
}
