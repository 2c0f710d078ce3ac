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

/// A gate of `concurrency` and objects `o-00`, `o-01`, … up to `n`, with their names.
fn numbered(
    concurrency: u16,
    n: usize,
) -> (Arc<Gate<ConfigMap>>, Vec<Arc<ConfigMap>>, Vec<String>) {
    let names: Vec<String> = (0..n).map(|i| format!("o-{i:02}")).collect();
    let refs: Vec<&str> = names.iter().map(String::as_str).collect();
    let (gate, objs) = gate(concurrency, &refs);
    (gate, objs, names)
}

/// The first object's pass holding the lane (until `release`), the others' waiting.
struct Held {
    release: tokio::sync::oneshot::Sender<()>,
    busy: tokio::task::JoinHandle<()>,
    waiting: Vec<tokio::task::JoinHandle<()>>,
}

async fn hold_the_lane(
    gate: &Arc<Gate<ConfigMap>>,
    objs: &[Arc<ConfigMap>],
    order: &Arc<Mutex<Vec<String>>>,
) -> Held {
    let (release, hold) = tokio::sync::oneshot::channel();
    let busy = start(gate, &objs[0], order, Some(hold));
    settle().await;
    let waiting = objs[1..]
        .iter()
        .map(|o| start(gate, o, order, None))
        .collect();
    settle().await;
    Held {
        release,
        busy,
        waiting,
    }
}

#[tokio::test]
async fn passes_run_in_the_order_they_came() {
    let (gate, objs, names) = numbered(1, 30);
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
    let Held {
        release,
        busy,
        waiting,
    } = hold_the_lane(&gate, &objs, &order).await;
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

/// A Job's finish wakes the waiting pass of its object alone: with many passes waiting
/// (a mass deletion), waking each to look for its mark made every finished Job cost as
/// much as the passes waiting.
#[tokio::test]
async fn a_finished_job_wakes_only_the_pass_of_its_object() {
    let (gate, objs, _) = numbered(1, 50);
    let order = Arc::new(Mutex::new(Vec::new()));
    let Held {
        release,
        busy,
        waiting,
    } = hold_the_lane(&gate, &objs, &order).await;
    let before = gate.mark_checks.load(Ordering::Relaxed);
    for name in ["o-10", "o-20", "o-30"] {
        gate.job_finished(&format!("uid-{name}"));
        settle().await;
    }
    let checks = gate.mark_checks.load(Ordering::Relaxed) - before;
    assert_eq!(
        *order.lock().unwrap(),
        ["o-00", "o-10", "o-20", "o-30"],
        "each pass after its Job ran at once"
    );
    assert_eq!(
        checks, 3,
        "the waiting passes looked for their marks {checks} times"
    );
    release.send(()).unwrap();
    busy.await.unwrap();
    for t in waiting {
        t.await.unwrap();
    }
    assert!(gate.waiting.lock().unwrap().is_empty(), "no pass waits");
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

/// A pass waiting at the gate holds a small future whatever the size of the pass's own:
/// kube-runtime spawns a task per triggered pass, and after a mass deletion thousands of
/// them wait here at once.
#[tokio::test]
async fn a_waiting_pass_holds_a_small_future_whatever_the_pass() {
    let (gate, objs) = gate(1, &["a"]);
    let big_pass = |_o: Arc<ConfigMap>| async move {
        let buffer = [7u8; 64 * 1024];
        tokio::task::yield_now().await;
        Ok::<_, Error>(if buffer[0] == 7 {
            Requeue::await_change()
        } else {
            Requeue::requeue(RESYNC_FOR_TEST)
        })
    };
    assert!(std::mem::size_of_val(&big_pass(objs[0].clone())) >= 64 * 1024);
    let waiting = gate.run(objs[0].clone(), big_pass);
    let size = std::mem::size_of_val(&waiting);
    assert!(size < 4096, "a waiting pass holds {size} bytes");
    assert_eq!(waiting.await.unwrap(), Requeue::await_change());
}
