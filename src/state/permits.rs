//! The permits to hold a state in memory: the manager's memory grows with their number
//! times the largest state, not with the number of objects.
//!
//! One permit is kept for the pass after a Job of the object finished. That pass cleans
//! up and releases, or records a failure: its object is waiting on it alone. Behind one
//! FIFO queue it waited for every pass queued before it, and after a mass deletion those
//! are the passes starting the other destroys, each holding its permit over several
//! writes (the backup, the Job): at N = 500 in the scale bench the release waited about a
//! second there, the largest share of its latency. The number of states in memory stays
//! at most `max`.
//!
//! A pass never holds a permit while it waits for another (the live pass gives its own up
//! before it reads a TerraformCluster's outputs): two such passes could each hold one and
//! wait for the other's for ever. Should a pass still wait far longer than any read takes,
//! [`StateReads::longest_wait`] says so, and the health probe fails on it.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;

/// Which pass asks for a permit (the gate's two lanes of passes).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Lane {
    /// Any pass but the next one below.
    Ordinary,
    /// The pass after a Job of the object finished: it queues only behind others like it.
    AfterJob,
}

/// `max` permits, of which ordinary passes hold at most `max - 1` (all of them when
/// `max` is 1).
#[derive(Debug)]
pub struct StateReads {
    all: Arc<Semaphore>,
    ordinary: Arc<Semaphore>,
    max: usize,
    /// When each pass waiting for a permit now began to wait, by a number of its own.
    waiting: Mutex<BTreeMap<u64, Instant>>,
    next_waiter: AtomicU64,
}

/// A pass's place among the waiters, given up when it has its permit or gives up waiting
/// (a pass's future dropped mid-wait).
struct Waiting<'a> {
    reads: &'a StateReads,
    id: u64,
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.reads
            .waiting
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&self.id);
    }
}

/// A held permit; the state it covers is to be dropped with it.
#[derive(Debug)]
pub struct StatePermit {
    _all: OwnedSemaphorePermit,
    _ordinary: Option<OwnedSemaphorePermit>,
}

impl StateReads {
    pub fn new(max: usize) -> Self {
        let max = max.max(1);
        StateReads {
            all: Arc::new(Semaphore::new(max)),
            ordinary: Arc::new(Semaphore::new((max - 1).max(1))),
            max,
            waiting: Mutex::default(),
            next_waiter: AtomicU64::new(0),
        }
    }

    /// How many permits there are in all (`--max-state-reads`).
    pub fn max(&self) -> usize {
        self.max
    }

    /// How long the pass that has waited longest for a permit, and is still waiting, has
    /// waited so far; none when no pass waits.
    pub fn longest_wait(&self) -> Option<Duration> {
        let waiting = self.waiting.lock().unwrap_or_else(|e| e.into_inner());
        waiting.values().min().map(|since| since.elapsed())
    }

    /// How many passes wait for a permit now.
    pub fn waiting(&self) -> usize {
        self.waiting.lock().unwrap_or_else(|e| e.into_inner()).len()
    }

    fn start_waiting(&self) -> Waiting<'_> {
        let id = self.next_waiter.fetch_add(1, Ordering::Relaxed);
        self.waiting
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(id, Instant::now());
        Waiting { reads: self, id }
    }

    /// Waits for a permit: an ordinary pass first for its share, then for one of all.
    /// An ordinary pass waiting for one of all holds its share meanwhile, so at most
    /// `max - 1` ordinary passes are ever ahead of a pass after a Job.
    pub async fn acquire(&self, lane: Lane) -> StatePermit {
        let waiting = self.start_waiting();
        let ordinary = match lane {
            Lane::Ordinary => Some(
                self.ordinary
                    .clone()
                    .acquire_owned()
                    .await
                    .expect("the state-read semaphores are never closed"),
            ),
            Lane::AfterJob => None,
        };
        let all = self
            .all
            .clone()
            .acquire_owned()
            .await
            .expect("the state-read semaphores are never closed");
        drop(waiting);
        StatePermit {
            _all: all,
            _ordinary: ordinary,
        }
    }

    /// How many permits are free now.
    pub fn available(&self) -> usize {
        self.all.available_permits()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    async fn within<T>(f: impl Future<Output = T>) -> Option<T> {
        tokio::time::timeout(Duration::from_millis(200), f)
            .await
            .ok()
    }

    #[tokio::test]
    async fn the_pass_after_a_job_does_not_wait_behind_ordinary_passes() {
        let reads = Arc::new(StateReads::new(4));
        let mut held = Vec::new();
        for _ in 0..3 {
            held.push(within(reads.acquire(Lane::Ordinary)).await.expect("free"));
        }
        // Ordinary passes queue for their share: the fourth permit is not theirs.
        let queued: Vec<_> = (0..5)
            .map(|_| {
                let r = reads.clone();
                tokio::spawn(async move { r.acquire(Lane::Ordinary).await })
            })
            .collect();
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert_eq!(
            reads.available(),
            1,
            "one permit kept while ordinary passes wait"
        );
        let after_job = within(reads.acquire(Lane::AfterJob))
            .await
            .expect("the pass after a Job takes the kept permit at once");
        assert_eq!(reads.available(), 0, "never more than 4 states in memory");
        // A second pass after a Job waits for the first, not for the queue.
        let second = tokio::spawn({
            let r = reads.clone();
            async move { r.acquire(Lane::AfterJob).await }
        });
        tokio::time::sleep(Duration::from_millis(50)).await;
        drop(after_job);
        let second = within(second).await.expect("next in line").expect("task");
        drop(second);
        // The ordinary passes get theirs as the others end.
        drop(held);
        for q in queued.into_iter().take(3) {
            within(q)
                .await
                .expect("an ordinary pass goes on")
                .expect("task");
        }
    }

    #[tokio::test(start_paused = true)]
    async fn the_longest_wait_is_that_of_the_pass_still_waiting_longest() {
        let reads = Arc::new(StateReads::new(1));
        assert_eq!(reads.longest_wait(), None, "nobody waits");
        let held = reads.acquire(Lane::Ordinary).await;
        assert_eq!(
            reads.longest_wait(),
            None,
            "a pass that got its permit waits no more"
        );
        let first = tokio::spawn({
            let r = reads.clone();
            async move { r.acquire(Lane::Ordinary).await }
        });
        tokio::time::sleep(Duration::from_secs(60)).await;
        let second = tokio::spawn({
            let r = reads.clone();
            async move { r.acquire(Lane::AfterJob).await }
        });
        tokio::time::sleep(Duration::from_secs(30)).await;
        assert_eq!(reads.longest_wait(), Some(Duration::from_secs(90)));
        // A pass that stops waiting (its future dropped) is no longer counted.
        first.abort();
        let _ = first.await;
        assert_eq!(reads.longest_wait(), Some(Duration::from_secs(30)));
        drop(held);
        let got = second.await.expect("task");
        assert_eq!(reads.longest_wait(), None);
        drop(got);
    }

    #[tokio::test]
    async fn one_permit_serves_everyone_in_turn() {
        let reads = StateReads::new(1);
        let first = within(reads.acquire(Lane::Ordinary)).await.expect("free");
        assert!(within(reads.acquire(Lane::AfterJob)).await.is_none());
        drop(first);
        let after_job = within(reads.acquire(Lane::AfterJob)).await.expect("free");
        assert!(within(reads.acquire(Lane::Ordinary)).await.is_none());
        drop(after_job);
        assert!(within(reads.acquire(Lane::Ordinary)).await.is_some());
    }
}
