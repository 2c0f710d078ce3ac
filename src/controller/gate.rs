//! The fair pass limit of one kind (see [`Gate`]).

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::{Stream, StreamExt};
use tokio::sync::mpsc;
use tokio::time::Instant;

use kube::Resource;
use kube::runtime::controller::{Action as Requeue, Config as ControllerConfig};
use kube::runtime::reflector::{ObjectRef, Store};

use crate::state::permits::Lane;

/// How long a turn handed back to the controller is kept for its pass. The pass comes
/// within milliseconds; a turn not taken by then (its object left the cache on the way,
/// so the controller dropped it) goes back to the head of the queue.
const TURN_KEPT: Duration = Duration::from_secs(5);

/// The pass limit of one kind: at most `concurrency` passes at once in each of two lanes,
/// first come, first served in each.
///
/// kube-runtime's own limit (`Config::concurrency`) keeps the triggers it cannot run yet in
/// a hash set and takes whichever it finds first: while triggers keep coming, one object
/// can wait for minutes behind others triggered after it (158 s after its Job completed in
/// the scale bench). So its limit is off and the gate keeps the order: a pass that finds
/// the first lane full puts its object in the gate's queue and returns at once; when a
/// pass ends, the next object in the queue gets its turn, kept for it, and is handed back
/// to the controller ([`Gate::turns`], for `Controller::reconcile_on`), whose pass then
/// takes the newest copy of the object from the cache. A queued object is an entry in a
/// queue, not a running pass: kube-runtime polls every running pass at each wake-up, and
/// after a mass deletion of N objects nearly N of them waited here, so each deletion cost
/// more the more there were.
///
/// The pass after a destroy or apply Job of the object has finished goes through a lane of
/// its own: it is the one that records a failure or cleans up and releases, and it would
/// otherwise wait behind every other pass triggered before it (after a mass deletion, the
/// passes that start the other destroys). Such passes come once per finished Job (the
/// Job's event triggers them), with the passes that carry them on at once (the retry of
/// one that failed; the one after it wrote its record, which decides on it), and wait in
/// the second lane as running passes; their object leaves the first lane's queue.
pub(crate) struct Gate<K: Resource + Clone + 'static>
where
    K::DynamicType: Eq + std::hash::Hash + Clone,
{
    concurrency: usize,
    first: Mutex<FirstLane<K>>,
    after_job: Option<Arc<tokio::sync::Semaphore>>,
    /// uids of objects whose Job was seen finished since their last pass began.
    job_finished: Mutex<BTreeSet<String>>,
    /// Where the turns go, and where [`Gate::turns`] takes them from.
    turns_tx: mpsc::UnboundedSender<ObjectRef<K>>,
    turns_rx: Mutex<Option<mpsc::UnboundedReceiver<ObjectRef<K>>>>,
    /// How many passes found the first lane full and returned (the gate's tests count them).
    queued_passes: AtomicU64,
    store: Store<K>,
}

/// The first lane: the passes running, the turns handed back and not yet taken, the queue.
struct FirstLane<K: Resource>
where
    K::DynamicType: Eq + std::hash::Hash + Clone,
{
    running: usize,
    turns: HashMap<ObjectRef<K>, Turn>,
    /// In order of arrival; an entry whose number is no longer the object's in `queued`
    /// left the queue (its pass took the second lane) and is skipped.
    queue: VecDeque<(ObjectRef<K>, u64)>,
    queued: HashMap<ObjectRef<K>, (u64, Instant)>,
    next: u64,
}

struct Turn {
    queued_at: Instant,
    kept_until: Instant,
}

/// Where a pass goes.
enum Entry {
    /// It runs now; `queued_at` is when it first found the lane full, if it did.
    Run {
        queued_at: Option<Instant>,
        after_job: bool,
        /// A place of the first lane (freed by [`Release`]), else the second lane's permit
        /// (none without a limit).
        first: bool,
        second: Option<tokio::sync::OwnedSemaphorePermit>,
    },
    /// It waits in the first lane's queue; its turn comes back through the controller.
    Queued,
}

impl<K: Resource + Clone + 'static> FirstLane<K>
where
    K::DynamicType: Eq + std::hash::Hash + Clone,
{
    fn push_back(&mut self, obj: ObjectRef<K>, queued_at: Instant) {
        self.next += 1;
        self.queue.push_back((obj.clone(), self.next));
        self.queued.insert(obj, (self.next, queued_at));
    }

    fn push_front(&mut self, obj: ObjectRef<K>, queued_at: Instant) {
        self.next += 1;
        self.queue.push_front((obj.clone(), self.next));
        self.queued.insert(obj, (self.next, queued_at));
    }
}

impl<K: Resource + Clone + 'static> Gate<K>
where
    K::DynamicType: Eq + std::hash::Hash + Clone + Default,
{
    /// `concurrency` 0: no limit.
    pub(crate) fn new(concurrency: u16, store: Store<K>) -> Self {
        let (turns_tx, turns_rx) = mpsc::unbounded_channel();
        Gate {
            concurrency: concurrency.into(),
            first: Mutex::new(FirstLane {
                running: 0,
                turns: HashMap::new(),
                queue: VecDeque::new(),
                queued: HashMap::new(),
                next: 0,
            }),
            after_job: (concurrency > 0)
                .then(|| Arc::new(tokio::sync::Semaphore::new(concurrency.into()))),
            job_finished: Mutex::new(BTreeSet::new()),
            turns_tx,
            turns_rx: Mutex::new(Some(turns_rx)),
            queued_passes: AtomicU64::new(0),
            store,
        }
    }

    /// The controller configuration that goes with the gate: kube-runtime's limit off.
    pub(crate) fn controller_config() -> ControllerConfig {
        ControllerConfig::default().concurrency(0)
    }

    /// The objects whose turn has come, for `Controller::reconcile_on` (taken once). Once a
    /// second it also takes back the turns not taken in time.
    pub(crate) fn turns(self: &Arc<Self>) -> impl Stream<Item = ObjectRef<K>> + Send + 'static
    where
        K: Send + Sync,
        K::DynamicType: Send + Sync,
    {
        let rx = self
            .turns_rx
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        let turns = futures::stream::unfold(rx, |rx| async move {
            let mut rx = rx?;
            let next = rx.recv().await?;
            Some((next, Some(rx)))
        });
        let gate = Arc::downgrade(self);
        let overdue = futures::stream::unfold((), |()| async {
            tokio::time::sleep(Duration::from_secs(1)).await;
            Some(((), ()))
        })
        .take_while(move |()| {
            futures::future::ready(match gate.upgrade() {
                Some(gate) => {
                    gate.hand_out(&mut gate.lane());
                    true
                }
                None => false,
            })
        })
        .filter_map(|()| futures::future::ready(None));
        futures::stream::select(turns, overdue)
    }

    fn lane(&self) -> std::sync::MutexGuard<'_, FirstLane<K>> {
        self.first.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A Job of the object `owner_uid` was seen finished: its next pass takes the other lane.
    pub(crate) fn job_finished(&self, owner_uid: &str) {
        self.job_finished
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(owner_uid.to_string());
    }

    fn take_mark(&self, uid: Option<&String>) -> bool {
        uid.is_some_and(|uid| {
            self.job_finished
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .remove(uid)
        })
    }

    /// Gives the free places of the first lane to the objects at the head of its queue:
    /// each gets its turn, kept for it, and goes to the controller. A turn not taken in
    /// time goes back to the head of the queue first.
    fn hand_out(&self, lane: &mut FirstLane<K>) {
        let now = Instant::now();
        let overdue: Vec<ObjectRef<K>> = lane
            .turns
            .iter()
            .filter(|(_, t)| t.kept_until <= now)
            .map(|(o, _)| o.clone())
            .collect();
        for obj in overdue {
            if let Some(turn) = lane.turns.remove(&obj) {
                lane.push_front(obj, turn.queued_at);
            }
        }
        while lane.running + lane.turns.len() < self.concurrency {
            let Some((obj, number)) = lane.queue.pop_front() else {
                break;
            };
            let queued_at = match lane.queued.get(&obj) {
                Some(&(n, at)) if n == number => at,
                _ => continue,
            };
            lane.queued.remove(&obj);
            // An object gone from the cache meanwhile needs no pass.
            if self.store.get(&obj).is_none() {
                continue;
            }
            lane.turns.insert(
                obj.clone(),
                Turn {
                    queued_at,
                    kept_until: now + TURN_KEPT,
                },
            );
            // The receiver lives as long as the controller; without it there is no pass
            // to hand the turn to.
            let _ = self.turns_tx.send(obj);
        }
    }

    /// Where the pass of `obj` goes: its kept turn, the second lane after its Job
    /// finished, a free place of the first lane if nothing is queued, or the queue.
    async fn enter(&self, obj: &K) -> Entry {
        if self.concurrency == 0 {
            return Entry::Run {
                queued_at: None,
                after_job: self.take_mark(obj.meta().uid.as_ref()),
                first: false,
                second: None,
            };
        }
        let key = ObjectRef::from_obj(obj);
        let after_job = {
            let mut lane = self.lane();
            self.hand_out(&mut lane);
            let after_job = self.take_mark(obj.meta().uid.as_ref());
            if let Some(turn) = lane.turns.remove(&key) {
                lane.running += 1;
                return Entry::Run {
                    queued_at: Some(turn.queued_at),
                    after_job,
                    first: true,
                    second: None,
                };
            }
            if after_job {
                lane.queued.remove(&key);
            } else if lane.queued.contains_key(&key) {
                return Entry::Queued;
            } else if lane.queued.is_empty() && lane.running + lane.turns.len() < self.concurrency {
                lane.running += 1;
                return Entry::Run {
                    queued_at: None,
                    after_job,
                    first: true,
                    second: None,
                };
            } else {
                lane.push_back(key, Instant::now());
                return Entry::Queued;
            }
            after_job
        };
        // Never closed; were it, the pass would run ungated rather than not at all.
        let second = match self.after_job.clone() {
            Some(lane) => lane.acquire_owned().await.ok(),
            None => None,
        };
        Entry::Run {
            queued_at: None,
            after_job,
            first: false,
            second,
        }
    }

    /// Runs `pass` on the newest cached copy of `obj` with how long it waited and whether
    /// it is the pass after a Job ([`Lane`], which its state read keeps), once its lane
    /// has room, in the order the passes came; an object gone from the cache meanwhile
    /// needs no pass. A pass that finds the first lane full returns at once; its object's
    /// turn comes back through [`Gate::turns`].
    pub(crate) async fn run<F, Fut, E>(&self, obj: Arc<K>, pass: F) -> Result<Requeue, E>
    where
        F: FnOnce(Arc<K>, Duration, Lane) -> Fut,
        Fut: Future<Output = Result<Requeue, E>>,
    {
        let arrived = Instant::now();
        let (queued_at, after_job, _first, _second) = match self.enter(obj.as_ref()).await {
            Entry::Queued => {
                self.queued_passes.fetch_add(1, Ordering::Relaxed);
                return Ok(Requeue::await_change());
            }
            Entry::Run {
                queued_at,
                after_job,
                first,
                second,
            } => (queued_at, after_job, Release { gate: self, first }, second),
        };
        if after_job {
            tracing::debug!(
                name = obj.meta().name.as_deref().unwrap_or_default(),
                "a Job of the object finished: its pass takes the second lane"
            );
        }
        let waited = queued_at.unwrap_or(arrived).elapsed();
        // The pass's future is boxed: a pass waiting in the second lane holds a pointer,
        // not the whole state of a pass.
        let result = match self.store.get(&ObjectRef::from_obj(obj.as_ref())) {
            Some(current) => {
                let lane = if after_job {
                    Lane::AfterJob
                } else {
                    Lane::Ordinary
                };
                Box::pin(pass(current, waited, lane)).await
            }
            None => Ok(Requeue::await_change()),
        };
        // The pass after a Job failed (a conflict, an API error), or wrote its record and
        // asks for the next pass at once (which decides on what it wrote, the conditions
        // that say provisioned among it): that pass keeps the lane, or it would wait behind
        // every pass triggered meanwhile.
        let again_at_once = match &result {
            Err(_) => true,
            Ok(requeue) => *requeue == Requeue::requeue(Duration::ZERO),
        };
        if after_job
            && again_at_once
            && let Some(uid) = obj.meta().uid.as_deref()
        {
            self.job_finished(uid);
        }
        result
    }
}

/// Frees a place of the first lane when its pass ends (or is dropped), and hands it on.
struct Release<'a, K: Resource + Clone + 'static>
where
    K::DynamicType: Eq + std::hash::Hash + Clone + Default,
{
    gate: &'a Gate<K>,
    first: bool,
}

impl<K: Resource + Clone + 'static> Drop for Release<'_, K>
where
    K::DynamicType: Eq + std::hash::Hash + Clone + Default,
{
    fn drop(&mut self) {
        if self.first {
            let mut lane = self.gate.lane();
            lane.running -= 1;
            self.gate.hand_out(&mut lane);
        }
    }
}

#[cfg(test)]
#[path = "gate_tests.rs"]
mod tests;
