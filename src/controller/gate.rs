//! The fair pass limit of one kind (see [`Gate`]).

use std::collections::{BTreeSet, HashMap};
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use tokio::sync::Notify;

use kube::Resource;
use kube::runtime::controller::{Action as Requeue, Config as ControllerConfig};
use kube::runtime::reflector::{ObjectRef, Store};

/// The pass limit of one kind: at most `concurrency` passes at once in each of two lanes,
/// first come, first served in each.
///
/// kube-runtime's own limit (`Config::concurrency`) keeps the triggers it cannot run yet in
/// a hash set and takes whichever it finds first: while triggers keep coming, one object
/// can wait for minutes behind others triggered after it (158 s after its Job completed in
/// the scale bench). So its limit is off, every triggered pass starts at once and waits
/// here on a fair (FIFO) semaphore, then takes the newest copy of the object from the
/// cache, since the one it was handed may have aged while it waited.
///
/// The pass after a destroy or apply Job of the object has finished goes through a lane of
/// its own: it is the one that records a failure or cleans up and releases, and it would
/// otherwise wait behind every other pass triggered before it (after a mass deletion, the
/// passes that start the other destroys). Such passes come at most once per finished Job.
/// A pass already waiting in the first lane when the Job finishes moves to the other: the
/// Job's finish wakes that pass alone (waking every waiting pass to look for its mark cost
/// a mass deletion of N objects N wake-ups per finished Job).
pub(crate) struct Gate<K: Resource + Clone + 'static>
where
    K::DynamicType: Eq + std::hash::Hash + Clone,
{
    lane: Option<Arc<tokio::sync::Semaphore>>,
    after_job: Option<Arc<tokio::sync::Semaphore>>,
    /// uids of objects whose Job was seen finished since their last pass began.
    job_finished: Mutex<BTreeSet<String>>,
    /// What wakes the pass of a uid waiting in the first lane, when the uid is added to
    /// `job_finished`.
    waiting: Mutex<HashMap<String, Arc<Notify>>>,
    /// How many times a waiting pass looked for its mark (the gate's tests count them).
    mark_checks: AtomicU64,
    store: Store<K>,
}

/// A pass's entry in [`Gate::waiting`], removed with the last pass of its uid.
struct Waiting<'a> {
    waiting: &'a Mutex<HashMap<String, Arc<Notify>>>,
    uid: &'a str,
    notify: Arc<Notify>,
}

impl<'a> Waiting<'a> {
    fn new(waiting: &'a Mutex<HashMap<String, Arc<Notify>>>, uid: &'a str) -> Self {
        let notify = waiting
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(uid.to_string())
            .or_default()
            .clone();
        Waiting {
            waiting,
            uid,
            notify,
        }
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        let mut waiting = self.waiting.lock().unwrap_or_else(|e| e.into_inner());
        // The map's and this pass's: no other pass of the uid waits.
        if waiting
            .get(self.uid)
            .is_some_and(|n| Arc::strong_count(n) <= 2)
        {
            waiting.remove(self.uid);
        }
    }
}

impl<K: Resource + Clone + 'static> Gate<K>
where
    K::DynamicType: Eq + std::hash::Hash + Clone + Default,
{
    /// `concurrency` 0: no limit.
    pub(crate) fn new(concurrency: u16, store: Store<K>) -> Self {
        let semaphore =
            || (concurrency > 0).then(|| Arc::new(tokio::sync::Semaphore::new(concurrency.into())));
        Gate {
            lane: semaphore(),
            after_job: semaphore(),
            job_finished: Mutex::new(BTreeSet::new()),
            waiting: Mutex::new(HashMap::new()),
            mark_checks: AtomicU64::new(0),
            store,
        }
    }

    /// The controller configuration that goes with the gate: kube-runtime's limit off.
    pub(crate) fn controller_config() -> ControllerConfig {
        ControllerConfig::default().concurrency(0)
    }

    /// A Job of the object `owner_uid` was seen finished: its next pass takes the other lane.
    pub(crate) fn job_finished(&self, owner_uid: &str) {
        self.job_finished
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(owner_uid.to_string());
        let waiting = self.waiting.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(notify) = waiting.get(owner_uid) {
            notify.notify_waiters();
        }
    }

    fn take_mark(&self, uid: Option<&String>) -> bool {
        self.mark_checks.fetch_add(1, Ordering::Relaxed);
        uid.is_some_and(|uid| {
            self.job_finished
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .remove(uid)
        })
    }

    /// A permit of the first lane, in its order, unless a Job of the object is seen
    /// finished meanwhile: then one of the other lane. `None` without a limit.
    async fn permit(
        &self,
        uid: Option<&String>,
    ) -> (Option<tokio::sync::OwnedSemaphorePermit>, bool) {
        let (Some(lane), Some(after_job)) = (&self.lane, &self.after_job) else {
            return (None, self.take_mark(uid));
        };
        let in_lane = lane.clone().acquire_owned();
        tokio::pin!(in_lane);
        let Some(uid) = uid else {
            return (in_lane.await.ok(), false);
        };
        let waiting = Waiting::new(&self.waiting, uid);
        loop {
            let marked = waiting.notify.notified();
            tokio::pin!(marked);
            marked.as_mut().enable();
            if self.take_mark(Some(uid)) {
                return (after_job.clone().acquire_owned().await.ok(), true);
            }
            tokio::select! {
                // Never closed; were it, the pass would run ungated rather than not at all.
                p = &mut in_lane => return (p.ok(), false),
                _ = marked => {}
            }
        }
    }

    /// Runs `pass` on the newest cached copy of `obj` once its lane has room, in the order
    /// the passes came; an object gone from the cache meanwhile needs no pass.
    pub(crate) async fn run<F, Fut, E>(&self, obj: Arc<K>, pass: F) -> Result<Requeue, E>
    where
        F: FnOnce(Arc<K>) -> Fut,
        Fut: Future<Output = Result<Requeue, E>>,
    {
        let (_permit, after_job) = self.permit(obj.meta().uid.as_ref()).await;
        if after_job {
            tracing::debug!(
                name = obj.meta().name.as_deref().unwrap_or_default(),
                "a Job of the object finished: its pass takes the second lane"
            );
        }
        // The pass's future is boxed: a pass waiting here holds a pointer, not the whole
        // state of a pass (kube-runtime spawns a task per triggered pass, and after a mass
        // deletion thousands wait at once: unboxed, they were most of the manager's heap).
        let result = match self.store.get(&ObjectRef::from_obj(obj.as_ref())) {
            Some(current) => Box::pin(pass(current)).await,
            None => Ok(Requeue::await_change()),
        };
        // The pass after a Job failed (a conflict, an API error): its retry keeps the lane,
        // or it would wait behind every pass triggered meanwhile.
        if after_job
            && result.is_err()
            && let Some(uid) = obj.meta().uid.as_deref()
        {
            self.job_finished(uid);
        }
        result
    }
}

#[cfg(test)]
#[path = "gate_tests.rs"]
mod tests;
