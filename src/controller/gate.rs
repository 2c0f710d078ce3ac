//! The fair pass limit of one kind (see [`Gate`]).

use std::collections::BTreeSet;
use std::future::Future;
use std::sync::{Arc, Mutex};

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
/// A pass already waiting in the first lane when the Job finishes moves to the other.
pub(crate) struct Gate<K: Resource + Clone + 'static>
where
    K::DynamicType: Eq + std::hash::Hash + Clone,
{
    lane: Option<Arc<tokio::sync::Semaphore>>,
    after_job: Option<Arc<tokio::sync::Semaphore>>,
    /// uids of objects whose Job was seen finished since their last pass began.
    job_finished: Mutex<BTreeSet<String>>,
    /// Wakes the waiting passes when a uid is added to `job_finished`.
    marked: tokio::sync::Notify,
    store: Store<K>,
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
            marked: tokio::sync::Notify::new(),
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
        self.marked.notify_waiters();
    }

    fn take_mark(&self, uid: Option<&String>) -> bool {
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
        loop {
            let marked = self.marked.notified();
            tokio::pin!(marked);
            marked.as_mut().enable();
            if self.take_mark(uid) {
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
        let result = match self.store.get(&ObjectRef::from_obj(obj.as_ref())) {
            Some(current) => pass(current).await,
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
mod tests {
    use super::*;
    use std::time::Duration;

    use crate::controller::Error;
    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::ResourceExt;
    use kube::runtime::reflector;
    use kube::runtime::watcher;

    fn gate(concurrency: u16, objects: &[&str]) -> (Arc<Gate<ConfigMap>>, Vec<Arc<ConfigMap>>) {
        let (store, mut writer) = reflector::store::<ConfigMap>();
        let objs: Vec<Arc<ConfigMap>> = objects
            .iter()
            .map(|name| {
                let cm = ConfigMap {
                    metadata: kube::api::ObjectMeta {
                        name: Some(name.to_string()),
                        namespace: Some("ns".into()),
                        uid: Some(format!("uid-{name}")),
                        ..Default::default()
                    },
                    ..Default::default()
                };
                writer.apply_watcher_event(&watcher::Event::Apply(cm.clone()));
                Arc::new(cm)
            })
            .collect();
        (Arc::new(Gate::new(concurrency, store)), objs)
    }

    /// Starts a pass of `obj` through `gate` that records its name, then waits for `hold`.
    fn start(
        gate: &Arc<Gate<ConfigMap>>,
        obj: &Arc<ConfigMap>,
        order: &Arc<Mutex<Vec<String>>>,
        hold: Option<tokio::sync::oneshot::Receiver<()>>,
    ) -> tokio::task::JoinHandle<()> {
        let (gate, obj, order) = (gate.clone(), obj.clone(), order.clone());
        tokio::spawn(async move {
            let _ = gate
                .run(obj, |o| async move {
                    order.lock().unwrap().push(o.name_any());
                    if let Some(h) = hold {
                        let _ = h.await;
                    }
                    Ok::<_, Error>(Requeue::await_change())
                })
                .await;
        })
    }

    /// Let the spawned passes reach the gate.
    async fn settle() {
        for _ in 0..20 {
            tokio::task::yield_now().await;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    #[tokio::test]
    async fn passes_run_in_the_order_they_came() {
        let names: Vec<String> = (0..30).map(|i| format!("o-{i:02}")).collect();
        let refs: Vec<&str> = names.iter().map(String::as_str).collect();
        let (gate, objs) = gate(1, &refs);
        let order = Arc::new(Mutex::new(Vec::new()));
        let (release, hold) = tokio::sync::oneshot::channel();
        let mut tasks = vec![start(&gate, &objs[0], &order, Some(hold))];
        settle().await;
        for o in &objs[1..] {
            tasks.push(start(&gate, o, &order, None));
            settle().await;
        }
        release.send(()).unwrap();
        for t in tasks {
            t.await.unwrap();
        }
        assert_eq!(*order.lock().unwrap(), names);
    }

    #[tokio::test]
    async fn a_waiting_pass_whose_job_finished_takes_the_second_lane() {
        let (gate, objs) = gate(1, &["busy", "a", "b", "job-done"]);
        let order = Arc::new(Mutex::new(Vec::new()));
        let (release, hold) = tokio::sync::oneshot::channel();
        let busy = start(&gate, &objs[0], &order, Some(hold));
        settle().await;
        let waiting: Vec<_> = objs[1..]
            .iter()
            .map(|o| start(&gate, o, &order, None))
            .collect();
        settle().await;
        assert_eq!(*order.lock().unwrap(), ["busy"], "the first lane is full");
        gate.job_finished("uid-job-done");
        settle().await;
        assert_eq!(
            *order.lock().unwrap(),
            ["busy", "job-done"],
            "the pass after the Job ran while the first lane was still full"
        );
        release.send(()).unwrap();
        busy.await.unwrap();
        for t in waiting {
            t.await.unwrap();
        }
        assert_eq!(*order.lock().unwrap(), ["busy", "job-done", "a", "b"]);
    }

    #[tokio::test]
    async fn the_retry_of_a_failed_pass_after_a_job_keeps_the_second_lane() {
        let (gate, objs) = gate(1, &["busy", "a", "job-done"]);
        let order = Arc::new(Mutex::new(Vec::new()));
        let (release, hold) = tokio::sync::oneshot::channel();
        let busy = start(&gate, &objs[0], &order, Some(hold));
        settle().await;
        gate.job_finished("uid-job-done");
        let conflict = || {
            Error::Kube(kube::Error::Api(
                kube::core::Status::failure("the object has been modified", "Conflict")
                    .with_code(409)
                    .boxed(),
            ))
        };
        let failed = gate
            .run(objs[2].clone(), |_| async { Err::<Requeue, _>(conflict()) })
            .await;
        assert!(failed.is_err());
        let waiting = start(&gate, &objs[1], &order, None);
        settle().await;
        let retry = start(&gate, &objs[2], &order, None);
        settle().await;
        assert_eq!(
            *order.lock().unwrap(),
            ["busy", "job-done"],
            "the retry ran while the first lane was still full"
        );
        // A pass that succeeds leaves no mark behind: the next one waits its turn.
        let next = start(&gate, &objs[2], &order, None);
        settle().await;
        assert_eq!(*order.lock().unwrap(), ["busy", "job-done"]);
        release.send(()).unwrap();
        for t in [busy, waiting, retry, next] {
            t.await.unwrap();
        }
        assert_eq!(
            *order.lock().unwrap(),
            ["busy", "job-done", "a", "job-done"]
        );
    }

    #[tokio::test]
    async fn a_pass_of_an_object_gone_from_the_cache_does_not_run() {
        let (store, _writer) = reflector::store::<ConfigMap>();
        let gate: Gate<ConfigMap> = Gate::new(1, store);
        let gone = Arc::new(ConfigMap {
            metadata: kube::api::ObjectMeta {
                name: Some("gone".into()),
                namespace: Some("ns".into()),
                ..Default::default()
            },
            ..Default::default()
        });
        let ran = gate
            .run(gone, |_| async {
                Ok::<_, Error>(Requeue::requeue(RESYNC_FOR_TEST))
            })
            .await
            .unwrap();
        assert_eq!(ran, Requeue::await_change());
    }

    const RESYNC_FOR_TEST: Duration = Duration::from_secs(1);
}
