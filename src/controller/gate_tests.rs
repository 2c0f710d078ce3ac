use super::*;
use std::time::Duration;

use crate::controller::Error;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::ResourceExt;
use kube::runtime::reflector;
use kube::runtime::watcher;

type Order = Arc<Mutex<Vec<String>>>;
/// A gate, its objects, and the writer of its cache.
type Setup = (
    Arc<Gate<ConfigMap>>,
    Vec<Arc<ConfigMap>>,
    reflector::store::Writer<ConfigMap>,
);

fn config_map(name: &str) -> ConfigMap {
    ConfigMap {
        metadata: kube::api::ObjectMeta {
            name: Some(name.to_string()),
            namespace: Some("ns".into()),
            uid: Some(format!("uid-{name}")),
            ..Default::default()
        },
        ..Default::default()
    }
}

fn gate(concurrency: u16, objects: &[&str]) -> Setup {
    let (store, mut writer) = reflector::store::<ConfigMap>();
    let objs: Vec<Arc<ConfigMap>> = objects
        .iter()
        .map(|name| {
            let cm = config_map(name);
            writer.apply_watcher_event(&watcher::Event::Apply(cm.clone()));
            Arc::new(cm)
        })
        .collect();
    (Arc::new(Gate::new(concurrency, store)), objs, writer)
}

/// Starts a pass of `obj` through `gate` that records its name (and "after its Job" when
/// the gate gave it that lane), then waits for `hold`.
fn start(
    gate: &Arc<Gate<ConfigMap>>,
    obj: &Arc<ConfigMap>,
    order: &Order,
    hold: Option<tokio::sync::oneshot::Receiver<()>>,
) -> tokio::task::JoinHandle<()> {
    let (gate, obj, order) = (gate.clone(), obj.clone(), order.clone());
    tokio::spawn(async move {
        let _ = gate
            .run(obj, |o, _waited, lane| async move {
                let name = match lane {
                    Lane::AfterJob => format!("{} after its Job", o.name_any()),
                    Lane::Ordinary => o.name_any(),
                };
                order.lock().unwrap().push(name);
                if let Some(h) = hold {
                    let _ = h.await;
                }
                Ok::<_, Error>(Requeue::await_change())
            })
            .await;
    })
}

/// What kube-runtime's controller does with the turns the gate hands back: a pass each.
fn controller(gate: &Arc<Gate<ConfigMap>>, order: &Order) -> tokio::task::JoinHandle<()> {
    let (gate, order) = (gate.clone(), order.clone());
    let turns = gate.turns();
    tokio::spawn(async move {
        tokio::pin!(turns);
        while let Some(obj) = turns.next().await {
            if let Some(current) = gate.store.get(&obj) {
                start(&gate, &current, &order, None);
            }
        }
    })
}

/// Let the spawned passes reach the gate.
async fn settle() {
    for _ in 0..20 {
        tokio::task::yield_now().await;
    }
    tokio::time::sleep(Duration::from_millis(20)).await;
}

/// Waits until `n` passes have run.
async fn ran(order: &Order, n: usize) -> Vec<String> {
    for _ in 0..500 {
        if order.lock().unwrap().len() >= n {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    order.lock().unwrap().clone()
}

/// A gate of `concurrency` and objects `o-00`, `o-01`, … up to `n`, and their names.
fn numbered(concurrency: u16, n: usize) -> (Setup, Vec<String>) {
    let names: Vec<String> = (0..n).map(|i| format!("o-{i:02}")).collect();
    let refs: Vec<&str> = names.iter().map(String::as_str).collect();
    (gate(concurrency, &refs), names)
}

/// The first object's pass holding the lane (until `release`), the others' triggered
/// one by one and queued.
struct Held {
    release: tokio::sync::oneshot::Sender<()>,
    triggered: Vec<tokio::task::JoinHandle<()>>,
}

async fn hold_the_lane(
    gate: &Arc<Gate<ConfigMap>>,
    objs: &[Arc<ConfigMap>],
    order: &Order,
) -> Held {
    let (release, hold) = tokio::sync::oneshot::channel();
    start(gate, &objs[0], order, Some(hold));
    settle().await;
    let mut triggered = Vec::new();
    for o in &objs[1..] {
        triggered.push(start(gate, o, order, None));
        tokio::task::yield_now().await;
    }
    settle().await;
    Held { release, triggered }
}

#[tokio::test]
async fn passes_run_in_the_order_they_came() {
    let ((gate, objs, _w), names) = numbered(1, 30);
    let order = Arc::new(Mutex::new(Vec::new()));
    let _controller = controller(&gate, &order);
    let Held { release, .. } = hold_the_lane(&gate, &objs, &order).await;
    // A second trigger of a queued object keeps its place.
    start(&gate, &objs[3], &order, None);
    settle().await;
    release.send(()).unwrap();
    assert_eq!(ran(&order, 30).await, names);
    settle().await;
    assert_eq!(order.lock().unwrap().len(), 30, "no object ran twice");
}

/// A pass that finds the lane full returns at once: kube-runtime polls every running
/// pass at each wake-up, so passes waiting in the gate after a mass deletion made each
/// deletion cost more the more there were.
#[tokio::test]
async fn a_pass_that_finds_the_lane_full_is_not_left_running() {
    let ((gate, objs, _w), names) = numbered(1, 50);
    let order = Arc::new(Mutex::new(Vec::new()));
    let _controller = controller(&gate, &order);
    let Held { release, triggered } = hold_the_lane(&gate, &objs, &order).await;
    let running = triggered.iter().filter(|t| !t.is_finished()).count();
    assert_eq!(
        running, 0,
        "{running} passes are still running while they wait"
    );
    assert_eq!(gate.queued_passes.load(Ordering::Relaxed), 49);
    assert_eq!(*order.lock().unwrap(), ["o-00"]);
    release.send(()).unwrap();
    assert_eq!(
        ran(&order, 50).await,
        names,
        "each queued object got its turn, in order"
    );
}

#[tokio::test]
async fn a_queued_pass_whose_job_finished_takes_the_second_lane() {
    let (gate, objs, _w) = gate(1, &["busy", "a", "b", "job-done"]);
    let order = Arc::new(Mutex::new(Vec::new()));
    let _controller = controller(&gate, &order);
    let Held { release, .. } = hold_the_lane(&gate, &objs, &order).await;
    assert_eq!(*order.lock().unwrap(), ["busy"], "the first lane is full");
    // The Job's event marks the object and triggers its pass.
    gate.job_finished("uid-job-done");
    start(&gate, &objs[3], &order, None);
    settle().await;
    assert_eq!(
        *order.lock().unwrap(),
        ["busy", "job-done after its Job"],
        "the pass after the Job ran while the first lane was still full"
    );
    release.send(()).unwrap();
    assert_eq!(
        ran(&order, 4).await,
        ["busy", "job-done after its Job", "a", "b"]
    );
    settle().await;
    assert_eq!(
        order.lock().unwrap().len(),
        4,
        "the object that took the second lane left the queue"
    );
}

#[tokio::test]
async fn the_retry_of_a_failed_pass_after_a_job_keeps_the_second_lane() {
    let (gate, objs, _w) = gate(1, &["busy", "a", "job-done"]);
    let order = Arc::new(Mutex::new(Vec::new()));
    let _controller = controller(&gate, &order);
    let (release, hold) = tokio::sync::oneshot::channel();
    start(&gate, &objs[0], &order, Some(hold));
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
        .run(objs[2].clone(), |_, _, _| async {
            Err::<Requeue, _>(conflict())
        })
        .await;
    assert!(failed.is_err());
    start(&gate, &objs[1], &order, None);
    settle().await;
    start(&gate, &objs[2], &order, None);
    settle().await;
    assert_eq!(
        *order.lock().unwrap(),
        ["busy", "job-done after its Job"],
        "the retry ran while the first lane was still full"
    );
    // A pass that succeeds leaves no mark behind: the next one waits its turn.
    start(&gate, &objs[2], &order, None);
    settle().await;
    assert_eq!(*order.lock().unwrap(), ["busy", "job-done after its Job"]);
    release.send(()).unwrap();
    assert_eq!(
        ran(&order, 4).await,
        ["busy", "job-done after its Job", "a", "job-done"]
    );
}

/// The pass after a Job that records its end (the attempt's record, the inputs promoted, the
/// status) returns for another pass at once, which decides on what it wrote: the
/// conditions that say provisioned. That next pass keeps the second lane, or it waits
/// behind every pass triggered meanwhile (67 s at the median after the record in the scale
/// bench's provisioning of 500, 155 s at most).
#[tokio::test]
async fn the_pass_after_a_job_that_asks_for_another_at_once_keeps_the_second_lane() {
    let (gate, objs, _w) = gate(1, &["busy", "a", "job-done"]);
    let order = Arc::new(Mutex::new(Vec::new()));
    let _controller = controller(&gate, &order);
    let (release, hold) = tokio::sync::oneshot::channel();
    start(&gate, &objs[0], &order, Some(hold));
    settle().await;
    gate.job_finished("uid-job-done");
    let recorded = gate
        .run(objs[2].clone(), |_, _, lane| async move {
            assert!(matches!(lane, Lane::AfterJob));
            Ok::<_, Error>(Requeue::requeue(Duration::ZERO))
        })
        .await;
    assert!(recorded.is_ok());
    start(&gate, &objs[1], &order, None);
    settle().await;
    start(&gate, &objs[2], &order, None);
    settle().await;
    assert_eq!(
        *order.lock().unwrap(),
        ["busy", "job-done after its Job"],
        "the pass after the record ran while the first lane was still full"
    );
    // A pass after a Job that asks for a later pass (or none) leaves no mark: the next one
    // waits its turn.
    gate.job_finished("uid-job-done");
    let waiting = gate
        .run(objs[2].clone(), |_, _, _| async {
            Ok::<_, Error>(Requeue::requeue(Duration::from_secs(60)))
        })
        .await;
    assert!(waiting.is_ok());
    start(&gate, &objs[2], &order, None);
    settle().await;
    assert_eq!(*order.lock().unwrap(), ["busy", "job-done after its Job"]);
    release.send(()).unwrap();
    assert_eq!(
        ran(&order, 4).await,
        ["busy", "job-done after its Job", "a", "job-done"]
    );
}

#[tokio::test]
async fn a_pass_of_an_object_gone_from_the_cache_does_not_run() {
    let (store, _writer) = reflector::store::<ConfigMap>();
    let gate: Gate<ConfigMap> = Gate::new(1, store);
    let gone = Arc::new(config_map("gone"));
    let ran = gate
        .run(gone, |_, _, _| async {
            Ok::<_, Error>(Requeue::requeue(RESYNC_FOR_TEST))
        })
        .await
        .unwrap();
    assert_eq!(ran, Requeue::await_change());
}

/// An object that left the cache while queued gets no turn: the next one does.
#[tokio::test]
async fn a_queued_object_gone_from_the_cache_gets_no_turn() {
    let (gate, objs, mut writer) = gate(1, &["busy", "gone", "next"]);
    let order = Arc::new(Mutex::new(Vec::new()));
    let _controller = controller(&gate, &order);
    let Held { release, .. } = hold_the_lane(&gate, &objs, &order).await;
    writer.apply_watcher_event(&watcher::Event::Delete(config_map("gone")));
    release.send(()).unwrap();
    assert_eq!(ran(&order, 2).await, ["busy", "next"]);
    settle().await;
    let lane = gate.lane();
    assert_eq!((lane.running, lane.turns.len()), (0, 0), "no place is kept");
}

/// A turn the controller never takes (its object left the cache on the way) is not kept
/// for ever: it goes back to the queue and the place to the next object.
#[tokio::test(start_paused = true)]
async fn a_turn_not_taken_in_time_goes_to_the_next() {
    let (gate, objs, _w) = gate(1, &["busy", "lost", "next"]);
    let order = Arc::new(Mutex::new(Vec::new()));
    // No controller yet: the turns pile up in the channel.
    let turns = gate.turns();
    tokio::pin!(turns);
    let Held { release, .. } = hold_the_lane(&gate, &objs, &order).await;
    release.send(()).unwrap();
    settle().await;
    assert_eq!(turns.next().await.map(|o| o.name), Some("lost".into()));
    // The controller dropped it; after the time a turn is kept, the place comes back.
    tokio::time::advance(TURN_KEPT + Duration::from_secs(1)).await;
    let again = turns.next().await.map(|o| o.name);
    assert_eq!(
        again,
        Some("lost".into()),
        "the lost turn is handed out again first"
    );
    // Its pass comes this time, and then the next object's turn.
    start(&gate, &objs[1], &order, None);
    let next = turns.next().await.map(|o| o.name);
    assert_eq!(next, Some("next".into()));
    assert_eq!(ran(&order, 2).await, ["busy", "lost"]);
}

const RESYNC_FOR_TEST: Duration = Duration::from_secs(1);

/// A pass waiting at the gate holds a small future whatever the size of the pass's own:
/// passes after their Jobs wait in the second lane as running tasks.
#[tokio::test]
async fn a_waiting_pass_holds_a_small_future_whatever_the_pass() {
    let (gate, objs, _w) = gate(1, &["a"]);
    let big_pass = |_o: Arc<ConfigMap>, _: Duration, _: Lane| async move {
        let buffer = [7u8; 64 * 1024];
        tokio::task::yield_now().await;
        Ok::<_, Error>(if buffer[0] == 7 {
            Requeue::await_change()
        } else {
            Requeue::requeue(RESYNC_FOR_TEST)
        })
    };
    assert!(
        std::mem::size_of_val(&big_pass(objs[0].clone(), Duration::ZERO, Lane::Ordinary))
            >= 64 * 1024
    );
    let waiting = gate.run(objs[0].clone(), big_pass);
    let size = std::mem::size_of_val(&waiting);
    assert!(size < 4096, "a waiting pass holds {size} bytes");
    assert_eq!(waiting.await.unwrap(), Requeue::await_change());
}
