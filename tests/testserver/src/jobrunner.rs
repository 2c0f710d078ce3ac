//! The local Job runner: stands in for the Job controller (Pods for Jobs, Job status and
//! conditions as Kubernetes ≥ 1.31 writes them, backoffLimit, activeDeadlineSeconds, suspend)
//! and for the kubelet (runs a Pod's single container as a local process, env and volumes,
//! graceful termination, logs, termination messages).
//!
//! Deviations, because there are no images and no containers:
//! - The container's `command` + `args` run on the host (`path_prefix` dirs prepended to
//!   `PATH`); a container without `command` fails to start (`StartError`, exit code 128).
//! - Volumes (`secret`, `configMap`, `emptyDir`, `downwardAPI`) are materialised under
//!   `work_root/<pod-uid>/volumes/<name>`. Every env value, command, argument and `workingDir`
//!   is rewritten: each occurrence of a mount path (as a whole path component, anywhere in the
//!   string, e.g. `cd /workspace && …`) is replaced by the materialised directory.
//! - `terminationMessagePath` is rewritten the same way; when it is not under a volume (the
//!   default `/dev/termination-log`) it maps to `work_root/<pod-uid>/termination-log`, and the
//!   env var `CAPTF_TERMINATION_LOG` names that file.
//! - The environment is cleared, then: `PATH`, `HOME=work_root/<pod-uid>/home`, `HOSTNAME`,
//!   the spec's env, `KUBE_CONFIG_PATH=<server kubeconfig>`, `CAPTF_API_SERVER=<server url>`,
//!   `CAPTF_TERMINATION_LOG`, then `extra_env` (later entries win).
//! - The entrypoint leads its own process group, like PID 1 in a container: SIGTERM goes to
//!   the entrypoint only, SIGKILL (after the grace period, or when the entrypoint exits) goes
//!   to the whole group.
//! - Only Pods whose `spec.nodeName` is [`NODE_NAME`] run (the runner sets it on the Pods it
//!   creates; there is no scheduler). initContainers, sidecars, probes, restarts of containers
//!   (`restartPolicy: OnFailure` behaves like `Never`), Pod backoff delays, indexed Jobs,
//!   parallelism > 1, podFailurePolicy and successPolicy are not modelled.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};

use base64::Engine;
use serde_json::{Value, json};
use tokio::sync::{broadcast, mpsc};

use crate::TestServer;
use crate::store::{
    self, DeleteOptions, Event, EventType, Propagation, ResourceType, Store, now_rfc3339,
};

/// The node name the runner gives its Pods.
pub const NODE_NAME: &str = "captf-local-runner";

/// Options of the local Job runner.
#[derive(Clone, Debug)]
pub struct JobRunnerOptions {
    /// Extra environment for every container process (applied last).
    pub extra_env: Vec<(String, String)>,
    /// Directories prepended to `PATH` (e.g. where fake or real tools live).
    pub path_prefix: Option<PathBuf>,
    /// Where per-Pod directories (volumes, logs, HOME) are created.
    pub work_root: PathBuf,
    /// Use this grace period instead of the Pod's `terminationGracePeriodSeconds`.
    pub termination_grace_override: Option<Duration>,
    /// At most this many container processes at once; other Pods stay `Pending` (no
    /// status written) until one ends, as on a node without room. Unbounded when `None`.
    pub max_running: Option<usize>,
}

impl Default for JobRunnerOptions {
    fn default() -> Self {
        JobRunnerOptions {
            extra_env: Vec::new(),
            path_prefix: None,
            work_root: std::env::temp_dir().join(format!(
                "captf-jobrunner-{}-{}",
                std::process::id(),
                store::random_suffix()
            )),
            termination_grace_override: None,
            max_running: None,
        }
    }
}

/// A running Job runner. Stop it with [`JobRunner::stop`] (or drop it): every process group
/// still running gets SIGKILL. `work_root` is left in place for inspection; remove it yourself.
pub struct JobRunner {
    stop: tokio::sync::watch::Sender<bool>,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl JobRunner {
    /// Start the runner against `server` (must be called within a Tokio runtime).
    pub fn start(server: &TestServer, options: JobRunnerOptions) -> JobRunner {
        let (stop, stop_rx) = tokio::sync::watch::channel(false);
        let runner = Runner {
            store: server.store(),
            kubeconfig: server.kubeconfig_path().to_path_buf(),
            url: server.url(),
            opts: options,
            procs: HashMap::new(),
            finished: HashSet::new(),
            results: HashMap::new(),
            result_counts: HashMap::new(),
            waiting: HashMap::new(),
            pods: BTreeMap::new(),
            jobs: HashMap::new(),
            dirty: HashSet::new(),
        };
        let task = tokio::spawn(runner.run(stop_rx));
        JobRunner {
            stop,
            task: Some(task),
        }
    }

    /// Stop: SIGKILL every process group still running, and wait for the runner task.
    pub async fn stop(mut self) {
        let _ = self.stop.send(true);
        if let Some(t) = self.task.take() {
            let _ = t.await;
        }
    }
}

impl Drop for JobRunner {
    fn drop(&mut self) {
        let _ = self.stop.send(true);
    }
}

struct Proc {
    pid: i32,
    namespace: String,
    name: String,
    started_at: String,
    term_sent: Option<Instant>,
    grace: Duration,
    killed: bool,
    term_log: PathBuf,
    log: PathBuf,
    message_policy_fallback: bool,
}

struct Runner {
    store: Store,
    kubeconfig: PathBuf,
    url: String,
    opts: JobRunnerOptions,
    procs: HashMap<String, Proc>,
    /// Pods whose process has ended (or that will never run).
    finished: HashSet<String>,
    /// Pod uid -> (job uid, succeeded) for every pod process that ended.
    results: HashMap<String, (String, bool)>,
    /// Job uid -> (succeeded, failed) Pods in `results`.
    result_counts: HashMap<String, (usize, usize)>,
    /// Pod uid -> last waiting reason written, to avoid rewriting the same status.
    waiting: HashMap<String, String>,
    /// What the runner reads of every Pod, by namespace and name, as of the store events
    /// applied so far (an informer's cache: one snapshot, then the events after it).
    pods: BTreeMap<(String, String), PodView>,
    /// What the runner reads of every unfinished Job, by uid, as `pods`.
    jobs: HashMap<String, JobView>,
    /// Uids of the Jobs the next pass reconciles: those whose Job or Pods changed, that got
    /// a result, or whose last write failed.
    dirty: HashSet<String>,
}

/// When the runner goes (stopped, or its runtime shut down), no process group outlives it.
impl Drop for Runner {
    fn drop(&mut self) {
        for p in self.procs.values() {
            send_signal(-p.pid, libc::SIGKILL);
        }
    }
}

fn send_signal(pid: i32, sig: i32) {
    // SAFETY: kill(2) has no memory-safety preconditions; errors (ESRCH) are ignored.
    unsafe {
        libc::kill(pid, sig);
    }
}

fn pods_rt(store: &Store) -> Option<ResourceType> {
    store.any_type("", "pods")
}

fn jobs_rt(store: &Store) -> Option<ResourceType> {
    store.any_type("batch", "jobs")
}

fn condition(type_: &str, reason: &str, message: &str) -> Value {
    let now = now_rfc3339();
    json!({"type": type_, "status": "True", "reason": reason, "message": message,
        "lastProbeTime": now, "lastTransitionTime": now})
}

fn pod_finished(pod: &Value) -> bool {
    matches!(
        pod["status"]["phase"].as_str(),
        Some("Succeeded" | "Failed")
    )
}

/// The condition of this type with status True in a Job's `status`.
fn true_condition<'a>(status: &'a Value, type_: &str) -> Option<&'a Value> {
    status["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == type_ && c["status"] == "True")
}

/// What the Job controller reads of an unfinished Job (the whole Job is read only when its
/// status is written or a Pod is made from its template).
struct JobView {
    uid: String,
    namespace: String,
    name: String,
    deleting: bool,
    status: Value,
    suspend: bool,
    backoff_limit: Option<u64>,
    active_deadline: Option<i64>,
    /// When `activeDeadlineSeconds` passes (Unix seconds), once the Job has a `startTime`.
    deadline: Option<i64>,
}

impl JobView {
    /// `None` for a finished Job (`Complete` or `Failed`): it needs nothing.
    fn of(j: &Value) -> Option<JobView> {
        let status = &j["status"];
        let finished = true_condition(status, "Complete").is_some()
            || true_condition(status, "Failed").is_some();
        (!finished).then(|| JobView {
            uid: store::meta_str(j, "uid").unwrap_or_default().to_string(),
            namespace: store::meta_str(j, "namespace")
                .unwrap_or_default()
                .to_string(),
            name: store::meta_str(j, "name").unwrap_or_default().to_string(),
            deleting: store::is_deleting(j),
            status: status.clone(),
            suspend: j["spec"]["suspend"].as_bool() == Some(true),
            backoff_limit: j["spec"]["backoffLimit"].as_u64(),
            active_deadline: j["spec"]["activeDeadlineSeconds"].as_i64(),
            deadline: j["spec"]["activeDeadlineSeconds"].as_i64().and_then(|ads| {
                let start = status["startTime"]
                    .as_str()?
                    .parse::<jiff::Timestamp>()
                    .ok()?;
                Some(start.as_second() + ads)
            }),
        })
    }
}

/// `$(VAR)` expansion as the kubelet does it (`$$` escapes, unknown references stay).
fn expand(s: &str, env: &[(String, String)]) -> String {
    let mut out = String::new();
    let mut rest = s;
    while let Some(i) = rest.find('$') {
        out.push_str(&rest[..i]);
        let after = &rest[i + 1..];
        if let Some(a) = after.strip_prefix('$') {
            out.push('$');
            rest = a;
        } else if let Some(inner) = after.strip_prefix('(') {
            match inner.find(')') {
                Some(end) => {
                    let name = &inner[..end];
                    match env.iter().rev().find(|(k, _)| k == name) {
                        Some((_, v)) => out.push_str(v),
                        None => {
                            out.push_str("$(");
                            out.push_str(name);
                            out.push(')');
                        }
                    }
                    rest = &inner[end + 1..];
                }
                None => {
                    out.push('$');
                    rest = after;
                }
            }
        } else {
            out.push('$');
            rest = after;
        }
    }
    out.push_str(rest);
    out
}

fn path_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.')
}

/// Replace every whole-path occurrence of a mount path with its host directory.
pub fn rewrite_paths(s: &str, mounts: &[(String, PathBuf)]) -> String {
    let mut out = String::new();
    let mut i = 0;
    let bytes = s.as_bytes();
    'outer: while i < s.len() {
        let before_ok = i == 0
            || s[..i]
                .chars()
                .next_back()
                .is_some_and(|c| !path_char(c) && c != '/');
        if before_ok && bytes[i] == b'/' {
            for (mp, host) in mounts {
                if s[i..].starts_with(mp.as_str()) {
                    let end = i + mp.len();
                    let after_ok = s[end..]
                        .chars()
                        .next()
                        .is_none_or(|c| c == '/' || !path_char(c));
                    if after_ok {
                        out.push_str(&host.to_string_lossy());
                        i = end;
                        continue 'outer;
                    }
                }
            }
        }
        let Some(c) = s[i..].chars().next() else {
            break;
        };
        out.push(c);
        i += c.len_utf8();
    }
    out
}

/// What the runner reads of a Pod: the kubelet side, and the Job controller (an unfinished
/// Pod is an active Pod of its Jobs).
#[derive(Clone)]
struct PodView {
    uid: String,
    namespace: String,
    name: String,
    /// `spec.nodeName` is this runner's node.
    on_node: bool,
    deleting: bool,
    deletion_grace: Option<u64>,
    /// Phase `Succeeded` or `Failed`.
    finished: bool,
    /// Phase `Running`.
    running: bool,
    has_finalizers: bool,
    /// The uids of its owners and its `controller-uid` label, sorted, without repeats.
    jobs: Vec<String>,
}

impl PodView {
    fn of(p: &Value) -> PodView {
        PodView {
            uid: store::meta_str(p, "uid").unwrap_or_default().to_string(),
            namespace: store::meta_str(p, "namespace")
                .unwrap_or_default()
                .to_string(),
            name: store::meta_str(p, "name").unwrap_or_default().to_string(),
            on_node: p["spec"]["nodeName"] == NODE_NAME,
            deleting: store::is_deleting(p),
            deletion_grace: p["metadata"]["deletionGracePeriodSeconds"].as_u64(),
            finished: pod_finished(p),
            running: p["status"]["phase"] == "Running",
            has_finalizers: !store::finalizers(p).is_empty(),
            jobs: {
                let mut jobs: Vec<String> =
                    store::owner_refs(p).into_iter().map(|(u, _)| u).collect();
                if let Some(u) = p["metadata"]["labels"]["controller-uid"].as_str() {
                    jobs.push(u.to_string());
                }
                jobs.sort();
                jobs.dedup();
                jobs
            },
        }
    }
}

enum Prepared {
    Launch(Box<Launch>),
    Wait(String, String),
}

struct Launch {
    argv: Vec<String>,
    env: Vec<(String, String)>,
    working_dir: PathBuf,
    log: PathBuf,
    term_log: PathBuf,
    fallback_to_logs: bool,
}

fn decode_b64(v: &Value) -> Vec<u8> {
    base64::engine::general_purpose::STANDARD
        .decode(v.as_str().unwrap_or_default())
        .unwrap_or_default()
}

impl Runner {
    async fn run(mut self, mut stop: tokio::sync::watch::Receiver<bool>) {
        let (exit_tx, mut exit_rx) = mpsc::unbounded_channel::<(String, i32)>();
        let mut events = self.resync();
        loop {
            // The caches take in every change made so far (the runner's own writes too)
            // before each half of the pass reads them.
            self.catch_up(&mut events);
            self.reconcile_pods(&exit_tx).await;
            self.catch_up(&mut events);
            self.reconcile_jobs();
            tokio::select! {
                _ = stop.changed() => break,
                r = events.recv() => match r {
                    Ok(ev) => self.apply(&ev),
                    Err(broadcast::error::RecvError::Lagged(_)) => events = self.resync(),
                    Err(broadcast::error::RecvError::Closed) => break,
                },
                Some((uid, code)) = exit_rx.recv() => self.on_exit(&uid, code),
                _ = tokio::time::sleep(Duration::from_millis(50)) => {}
            }
        }
    }

    /// Fill the caches from one snapshot of the Pods and Jobs, subscribed to the events after
    /// it; every Job is reconciled in the next pass.
    fn resync(&mut self) -> broadcast::Receiver<Arc<Event>> {
        let (Some(prt), Some(jrt)) = (pods_rt(&self.store), jobs_rt(&self.store)) else {
            return self.store.subscribe_and_read(|_| ()).0;
        };
        let (rx, (pods, jobs)) = self.store.subscribe_and_read(|objects| {
            let pods: BTreeMap<(String, String), PodView> = objects
                .of(&prt)
                .map(|p| {
                    let v = PodView::of(p);
                    ((v.namespace.clone(), v.name.clone()), v)
                })
                .collect();
            let jobs: HashMap<String, JobView> = objects
                .of(&jrt)
                .filter_map(JobView::of)
                .map(|j| (j.uid.clone(), j))
                .collect();
            (pods, jobs)
        });
        self.pods = pods;
        self.jobs = jobs;
        self.dirty.extend(self.jobs.keys().cloned());
        rx
    }

    /// Apply the events received so far.
    fn catch_up(&mut self, events: &mut broadcast::Receiver<Arc<Event>>) {
        loop {
            match events.try_recv() {
                Ok(ev) => self.apply(&ev),
                Err(broadcast::error::TryRecvError::Lagged(_)) => *events = self.resync(),
                Err(_) => return,
            }
        }
    }

    /// Apply one store event to the caches, and mark the Jobs it concerns.
    fn apply(&mut self, ev: &Event) {
        match (ev.group.as_str(), ev.plural.as_str()) {
            ("batch", "jobs") => {
                let uid = store::meta_str(&ev.object, "uid")
                    .unwrap_or_default()
                    .to_string();
                match JobView::of(&ev.object).filter(|_| ev.kind != EventType::Deleted) {
                    Some(j) => self.jobs.insert(uid.clone(), j),
                    None => self.jobs.remove(&uid),
                };
                self.dirty.insert(uid);
            }
            ("", "pods") => {
                let new = PodView::of(&ev.object);
                let key = (new.namespace.clone(), new.name.clone());
                let old = if ev.kind == EventType::Deleted {
                    match self.pods.get(&key) {
                        Some(p) if p.uid == new.uid => self.pods.remove(&key),
                        _ => None,
                    }
                } else {
                    self.pods.insert(key, new.clone())
                };
                for p in old.iter().chain([&new]) {
                    self.dirty.extend(p.jobs.iter().cloned());
                }
            }
            _ => {}
        }
    }

    /// The Pods of this node there is something to do about: running here, being deleted,
    /// or unfinished while there is room to start one. From the cache: the whole Pod is read
    /// only when it is about to start.
    fn pod_snapshot(&self) -> Vec<PodView> {
        let full = self
            .opts
            .max_running
            .is_some_and(|max| self.procs.len() >= max);
        self.pods
            .values()
            .filter(|p| {
                self.procs.contains_key(&p.uid) || p.on_node && (p.deleting || !full && !p.finished)
            })
            .cloned()
            .collect()
    }

    async fn reconcile_pods(&mut self, exit_tx: &mpsc::UnboundedSender<(String, i32)>) {
        let Some(rt) = pods_rt(&self.store) else {
            return;
        };
        let pods = self.pod_snapshot();
        let present: HashSet<&str> = pods.iter().map(|p| p.uid.as_str()).collect();
        // Pods removed from the API while running (force deletion): kill at once.
        for (uid, p) in &mut self.procs {
            if !present.contains(uid.as_str()) && !p.killed {
                send_signal(-p.pid, libc::SIGKILL);
                p.killed = true;
            }
        }
        for view in &pods {
            if !view.on_node {
                continue;
            }
            let uid = &view.uid;
            if let Some(p) = self.procs.get_mut(uid) {
                if view.deleting && p.term_sent.is_none() {
                    let grace = self
                        .opts
                        .termination_grace_override
                        .unwrap_or_else(|| Duration::from_secs(view.deletion_grace.unwrap_or(30)));
                    p.grace = grace;
                    p.term_sent = Some(Instant::now());
                    send_signal(p.pid, libc::SIGTERM);
                }
                if let Some(t) = p.term_sent
                    && !p.killed
                    && t.elapsed() >= p.grace
                {
                    send_signal(-p.pid, libc::SIGKILL);
                    p.killed = true;
                }
                continue;
            }
            if self.finished.contains(uid) || view.finished {
                if view.deleting {
                    self.remove_pod(&rt, view);
                }
                continue;
            }
            if view.deleting {
                self.finished.insert(uid.clone());
                self.remove_pod(&rt, view);
                continue;
            }
            if self
                .opts
                .max_running
                .is_some_and(|max| self.procs.len() >= max)
            {
                continue;
            }
            // The whole Pod, as it is now: if it changed since the view (deleted, finished,
            // replaced), that change wakes the next pass, which sees it.
            let Ok(pod) = self.store.get_rt(&rt, Some(&view.namespace), &view.name) else {
                continue;
            };
            if store::meta_str(&pod, "uid") != Some(uid.as_str())
                || store::is_deleting(&pod)
                || pod_finished(&pod)
            {
                continue;
            }
            match self.prepare(&pod) {
                Prepared::Wait(reason, message) => {
                    if self.waiting.get(uid) != Some(&reason) {
                        self.waiting.insert(uid.clone(), reason.clone());
                        let mut st = pod.clone();
                        st["status"]["containerStatuses"] = json!([{
                            "name": pod["spec"]["containers"][0]["name"], "ready": false, "restartCount": 0, "started": false,
                            "image": pod["spec"]["containers"][0]["image"], "imageID": "",
                            "state": {"waiting": {"reason": reason, "message": message}}
                        }]);
                        let _ =
                            self.store
                                .update_rt(&rt, Some(&view.namespace), &view.name, st, true);
                    }
                }
                Prepared::Launch(l) => self.launch(&rt, &pod, *l, exit_tx),
            }
        }
    }

    /// The final removal of a Pod whose process ended or never started (as the kubelet's
    /// final delete), unless finalizers hold it.
    fn remove_pod(&mut self, rt: &ResourceType, pod: &PodView) {
        if !pod.has_finalizers {
            self.store
                .force_remove(rt, Some(&pod.namespace), &pod.name, &pod.uid);
            self.store.set_log_path(&pod.uid, None);
        }
    }

    fn launch(
        &mut self,
        rt: &ResourceType,
        pod: &Value,
        l: Launch,
        exit_tx: &mpsc::UnboundedSender<(String, i32)>,
    ) {
        let uid = store::meta_str(pod, "uid").unwrap_or_default().to_string();
        let ns = store::meta_str(pod, "namespace")
            .unwrap_or_default()
            .to_string();
        let name = store::meta_str(pod, "name").unwrap_or_default().to_string();
        let started_at = now_rfc3339();
        let spawned = (|| -> std::io::Result<(i32, tokio::process::Child)> {
            let log = std::fs::File::create(&l.log)?;
            let Some((prog, args)) = l.argv.split_first() else {
                return Err(std::io::Error::other(
                    "the container has no command (there is no image entrypoint here)",
                ));
            };
            std::fs::create_dir_all(&l.working_dir)?;
            let mut cmd = tokio::process::Command::new(prog);
            cmd.args(args)
                .env_clear()
                .envs(l.env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
                .current_dir(&l.working_dir)
                .stdin(Stdio::null())
                .stdout(Stdio::from(log.try_clone()?))
                .stderr(Stdio::from(log))
                .process_group(0);
            let child = cmd.spawn()?;
            let pid = child
                .id()
                .map(|p| p as i32)
                .ok_or_else(|| std::io::Error::other("no pid"))?;
            Ok((pid, child))
        })();
        self.store.set_log_path(&uid, Some(l.log.clone()));
        let container = &pod["spec"]["containers"][0];
        match spawned {
            Ok((pid, mut child)) => {
                let tx = exit_tx.clone();
                let puid = uid.clone();
                tokio::spawn(async move {
                    let code = match child.wait().await {
                        Ok(st) => st.code().unwrap_or_else(|| 128 + st.signal().unwrap_or(9)),
                        Err(_) => 128,
                    };
                    let _ = tx.send((puid, code));
                });
                self.procs.insert(
                    uid.clone(),
                    Proc {
                        pid,
                        namespace: ns.clone(),
                        name: name.clone(),
                        started_at: started_at.clone(),
                        term_sent: None,
                        grace: Duration::from_secs(30),
                        killed: false,
                        term_log: l.term_log,
                        log: l.log,
                        message_policy_fallback: l.fallback_to_logs,
                    },
                );
                let mut st = pod.clone();
                st["status"] = json!({
                    "phase": "Running", "hostIP": "127.0.0.1", "podIP": "127.0.0.1", "startTime": started_at,
                    "conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": started_at}],
                    "containerStatuses": [{"name": container["name"], "ready": true, "restartCount": 0, "started": true,
                        "image": container["image"], "imageID": "", "containerID": format!("local://{pid}"),
                        "state": {"running": {"startedAt": started_at}}}]
                });
                let _ = self.store.update_rt(rt, Some(&ns), &name, st, true);
            }
            Err(e) => {
                let _ = std::fs::write(&l.log, format!("{e}\n"));
                self.finished.insert(uid.clone());
                if let Some(job_uid) = pod["metadata"]["labels"]["controller-uid"].as_str() {
                    self.record_result(&uid, job_uid, false);
                }
                let mut st = pod.clone();
                st["status"] = json!({
                    "phase": "Failed", "hostIP": "127.0.0.1", "podIP": "127.0.0.1", "startTime": started_at,
                    "containerStatuses": [{"name": container["name"], "ready": false, "restartCount": 0, "started": false,
                        "image": container["image"], "imageID": "",
                        "state": {"terminated": {"exitCode": 128, "reason": "StartError", "message": e.to_string(),
                            "startedAt": started_at, "finishedAt": now_rfc3339()}}}]
                });
                let _ = self.store.update_rt(rt, Some(&ns), &name, st, true);
            }
        }
    }

    /// Record how a Pod's process ended, for its Job's counts.
    fn record_result(&mut self, pod_uid: &str, job_uid: &str, succeeded: bool) {
        let count =
            |counts: &mut HashMap<String, (usize, usize)>, job: &str, ok: bool, n: isize| {
                let c = counts.entry(job.to_string()).or_default();
                let slot = if ok { &mut c.0 } else { &mut c.1 };
                *slot = slot.saturating_add_signed(n);
            };
        if let Some((j, ok)) = self
            .results
            .insert(pod_uid.to_string(), (job_uid.to_string(), succeeded))
        {
            count(&mut self.result_counts, &j, ok, -1);
        }
        count(&mut self.result_counts, job_uid, succeeded, 1);
        self.dirty.insert(job_uid.to_string());
    }

    fn on_exit(&mut self, uid: &str, code: i32) {
        let Some(p) = self.procs.remove(uid) else {
            return;
        };
        // Like a container runtime: when PID 1 ends, everything else in the container goes.
        send_signal(-p.pid, libc::SIGKILL);
        self.finished.insert(uid.to_string());
        let Some(rt) = pods_rt(&self.store) else {
            return;
        };
        let Ok(pod) = self.store.get_rt(&rt, Some(&p.namespace), &p.name) else {
            return;
        };
        if store::meta_str(&pod, "uid") != Some(uid) {
            return;
        }
        if let Some(job_uid) = pod["metadata"]["labels"]["controller-uid"].as_str() {
            self.record_result(uid, job_uid, code == 0);
        }
        let mut message = std::fs::read(&p.term_log).unwrap_or_default();
        message.truncate(4096);
        let mut message = String::from_utf8_lossy(&message).into_owned();
        if message.is_empty() && code != 0 && p.message_policy_fallback {
            let log = std::fs::read(&p.log).unwrap_or_default();
            let start = log.len().saturating_sub(2048);
            message = String::from_utf8_lossy(&log[start..]).into_owned();
        }
        let container = &pod["spec"]["containers"][0];
        let mut terminated = json!({"exitCode": code, "reason": if code == 0 { "Completed" } else { "Error" },
            "startedAt": p.started_at, "finishedAt": now_rfc3339(), "containerID": format!("local://{}", p.pid)});
        if !message.is_empty() {
            terminated["message"] = json!(message);
        }
        let mut st = pod.clone();
        st["status"]["phase"] = json!(if code == 0 { "Succeeded" } else { "Failed" });
        st["status"]["conditions"] = json!([{"type": "Ready", "status": "False", "reason": "PodCompleted", "lastTransitionTime": now_rfc3339()}]);
        st["status"]["containerStatuses"] = json!([{"name": container["name"], "ready": false, "restartCount": 0, "started": false,
            "image": container["image"], "imageID": "", "containerID": format!("local://{}", p.pid),
            "state": {"terminated": terminated}}]);
        let updated = self
            .store
            .update_rt(&rt, Some(&p.namespace), &p.name, st, true)
            .unwrap_or(pod);
        if store::is_deleting(&updated) {
            self.remove_pod(&rt, &PodView::of(&updated));
        }
    }

    /// Resolve volumes, env and paths; `Wait` when the kubelet would keep the Pod waiting.
    fn prepare(&self, pod: &Value) -> Prepared {
        let uid = store::meta_str(pod, "uid").unwrap_or_default();
        let ns = store::meta_str(pod, "namespace").unwrap_or_default();
        let pod_dir = self.opts.work_root.join(uid);
        let spec = &pod["spec"];
        let container = &spec["containers"][0];
        let mut vol_dirs: HashMap<String, PathBuf> = HashMap::new();
        for v in spec["volumes"].as_array().into_iter().flatten() {
            let vname = v["name"].as_str().unwrap_or_default().to_string();
            let dir = pod_dir.join("volumes").join(&vname);
            if let Err((r, m)) = self.materialise(v, &dir, ns, pod) {
                return Prepared::Wait(r, m);
            }
            vol_dirs.insert(vname, dir);
        }
        let mut mounts: Vec<(String, PathBuf)> = Vec::new();
        for m in container["volumeMounts"].as_array().into_iter().flatten() {
            let (Some(mp), Some(vn)) = (m["mountPath"].as_str(), m["name"].as_str()) else {
                continue;
            };
            let Some(dir) = vol_dirs.get(vn) else {
                return Prepared::Wait(
                    "CreateContainerConfigError".into(),
                    format!("volume {vn:?} not found"),
                );
            };
            let host = match m["subPath"].as_str() {
                Some(sp) if !sp.is_empty() => dir.join(sp),
                _ => dir.clone(),
            };
            mounts.push((mp.trim_end_matches('/').to_string(), host));
        }
        let tm_path = container["terminationMessagePath"]
            .as_str()
            .unwrap_or("/dev/termination-log")
            .to_string();
        mounts.sort_by_key(|(mp, _)| std::cmp::Reverse(mp.len()));
        let mapped = rewrite_paths(&tm_path, &mounts);
        let term_log = if mapped != tm_path {
            PathBuf::from(mapped)
        } else {
            let f = pod_dir.join("termination-log");
            mounts.push((tm_path.clone(), f.clone()));
            mounts.sort_by_key(|(mp, _)| std::cmp::Reverse(mp.len()));
            f
        };
        let home = pod_dir.join("home");
        for d in [&home, &pod_dir] {
            if let Err(e) = std::fs::create_dir_all(d) {
                return Prepared::Wait("CreateContainerError".into(), e.to_string());
            }
        }
        if let Some(parent) = term_log.parent() {
            let _ = std::fs::create_dir_all(parent);
        }
        let _ = std::fs::write(&term_log, b"");
        let host_path =
            std::env::var("PATH").unwrap_or_else(|_| "/usr/local/bin:/usr/bin:/bin".into());
        let path = match &self.opts.path_prefix {
            Some(p) => format!("{}:{host_path}", p.display()),
            None => host_path,
        };
        let mut env: Vec<(String, String)> = vec![
            ("PATH".into(), path),
            ("HOME".into(), home.to_string_lossy().into_owned()),
            (
                "HOSTNAME".into(),
                store::meta_str(pod, "name").unwrap_or_default().to_string(),
            ),
        ];
        let mut spec_env: Vec<(String, String)> = Vec::new();
        for from in container["envFrom"].as_array().into_iter().flatten() {
            let prefix = from["prefix"].as_str().unwrap_or_default();
            let (src, plural, is_secret) = if from.get("secretRef").is_some() {
                (&from["secretRef"], "secrets", true)
            } else {
                (&from["configMapRef"], "configmaps", false)
            };
            let sname = src["name"].as_str().unwrap_or_default();
            match self.store.get("v1", plural, Some(ns), sname) {
                Some(o) => {
                    for (k, v) in o["data"].as_object().into_iter().flatten() {
                        let val = if is_secret {
                            String::from_utf8_lossy(&decode_b64(v)).into_owned()
                        } else {
                            v.as_str().unwrap_or_default().to_string()
                        };
                        spec_env.push((format!("{prefix}{k}"), val));
                    }
                }
                None if src["optional"].as_bool() == Some(true) => {}
                None => {
                    let kind = if is_secret { "secret" } else { "configmap" };
                    return Prepared::Wait(
                        "CreateContainerConfigError".into(),
                        format!("{kind} \"{sname}\" not found"),
                    );
                }
            }
        }
        for e in container["env"].as_array().into_iter().flatten() {
            let Some(name) = e["name"].as_str() else {
                continue;
            };
            let value = if let Some(v) = e["value"].as_str() {
                let mut all = env.clone();
                all.extend(spec_env.iter().cloned());
                expand(v, &all)
            } else if let Some(vf) = e.get("valueFrom") {
                match self.value_from(vf, ns, pod) {
                    Ok(Some(v)) => v,
                    Ok(None) => continue,
                    Err(m) => return Prepared::Wait("CreateContainerConfigError".into(), m),
                }
            } else {
                String::new()
            };
            spec_env.push((name.to_string(), value));
        }
        for (k, v) in spec_env {
            env.push((k, rewrite_paths(&v, &mounts)));
        }
        env.push((
            "KUBE_CONFIG_PATH".into(),
            self.kubeconfig.to_string_lossy().into_owned(),
        ));
        env.push(("CAPTF_API_SERVER".into(), self.url.clone()));
        env.push((
            "CAPTF_TERMINATION_LOG".into(),
            term_log.to_string_lossy().into_owned(),
        ));
        env.extend(self.opts.extra_env.iter().cloned());
        let mut dedup: Vec<(String, String)> = Vec::new();
        for (k, v) in env {
            dedup.retain(|(dk, _)| *dk != k);
            dedup.push((k, v));
        }
        let strs = |v: &Value| -> Vec<String> {
            v.as_array()
                .into_iter()
                .flatten()
                .filter_map(|s| s.as_str().map(str::to_string))
                .collect()
        };
        let mut argv = strs(&container["command"]);
        argv.extend(strs(&container["args"]));
        let argv: Vec<String> = argv
            .iter()
            .map(|a| rewrite_paths(&expand(a, &dedup), &mounts))
            .collect();
        let working_dir = match container["workingDir"].as_str() {
            Some(w) if !w.is_empty() => PathBuf::from(rewrite_paths(w, &mounts)),
            _ => pod_dir.clone(),
        };
        Prepared::Launch(Box::new(Launch {
            argv,
            env: dedup,
            working_dir,
            log: pod_dir.join("log"),
            term_log,
            fallback_to_logs: container["terminationMessagePolicy"] == "FallbackToLogsOnError",
        }))
    }

    fn value_from(&self, vf: &Value, ns: &str, pod: &Value) -> Result<Option<String>, String> {
        for (field, plural, kind) in [
            ("secretKeyRef", "secrets", "secret"),
            ("configMapKeyRef", "configmaps", "configmap"),
        ] {
            let Some(r) = vf.get(field) else { continue };
            let n = r["name"].as_str().unwrap_or_default();
            let k = r["key"].as_str().unwrap_or_default();
            let optional = r["optional"].as_bool() == Some(true);
            let Some(o) = self.store.get("v1", plural, Some(ns), n) else {
                return if optional {
                    Ok(None)
                } else {
                    Err(format!("{kind} \"{n}\" not found"))
                };
            };
            let v = if plural == "secrets" {
                o["data"]
                    .get(k)
                    .map(|v| String::from_utf8_lossy(&decode_b64(v)).into_owned())
            } else {
                o["data"].get(k).and_then(Value::as_str).map(str::to_string)
            };
            return match v {
                Some(v) => Ok(Some(v)),
                None if optional => Ok(None),
                None => Err(format!(
                    "couldn't find key {k} in {} {ns}/{n}",
                    if plural == "secrets" {
                        "Secret"
                    } else {
                        "ConfigMap"
                    }
                )),
            };
        }
        if let Some(f) = vf.get("fieldRef") {
            let path = f["fieldPath"].as_str().unwrap_or_default();
            return field_path(pod, path).map(Some);
        }
        Err("unsupported valueFrom".into())
    }

    fn materialise(
        &self,
        v: &Value,
        dir: &Path,
        ns: &str,
        pod: &Value,
    ) -> Result<(), (String, String)> {
        let io = |e: std::io::Error| ("ContainerCreating".to_string(), e.to_string());
        std::fs::create_dir_all(dir).map_err(io)?;
        let vname = v["name"].as_str().unwrap_or_default();
        let write = |rel: &str, bytes: &[u8]| -> Result<(), (String, String)> {
            let p = dir.join(rel);
            if let Some(parent) = p.parent() {
                std::fs::create_dir_all(parent).map_err(io)?;
            }
            std::fs::write(&p, bytes).map_err(io)
        };
        if v.get("emptyDir").is_some() {
            return Ok(());
        }
        for (field, plural, name_field) in [
            ("secret", "secrets", "secretName"),
            ("configMap", "configmaps", "name"),
        ] {
            let Some(src) = v.get(field) else { continue };
            let sname = src[name_field].as_str().unwrap_or_default();
            let Some(obj) = self.store.get("v1", plural, Some(ns), sname) else {
                if src["optional"].as_bool() == Some(true) {
                    return Ok(());
                }
                return Err((
                    "ContainerCreating".into(),
                    format!(
                        "MountVolume.SetUp failed for volume \"{vname}\" : {} \"{sname}\" not found",
                        if plural == "secrets" {
                            "secret"
                        } else {
                            "configmap"
                        }
                    ),
                ));
            };
            let mut data: Vec<(String, Vec<u8>)> = Vec::new();
            for (k, val) in obj["data"].as_object().into_iter().flatten() {
                let bytes = if plural == "secrets" {
                    decode_b64(val)
                } else {
                    val.as_str().unwrap_or_default().as_bytes().to_vec()
                };
                data.push((k.clone(), bytes));
            }
            for (k, val) in obj["binaryData"].as_object().into_iter().flatten() {
                data.push((k.clone(), decode_b64(val)));
            }
            match src["items"].as_array() {
                Some(items) => {
                    for it in items {
                        let k = it["key"].as_str().unwrap_or_default();
                        let p = it["path"].as_str().unwrap_or(k);
                        match data.iter().find(|(dk, _)| dk == k) {
                            Some((_, b)) => write(p, b)?,
                            None => {
                                return Err((
                                    "ContainerCreating".into(),
                                    format!(
                                        "MountVolume.SetUp failed for volume \"{vname}\" : references non-existent key {k}"
                                    ),
                                ));
                            }
                        }
                    }
                }
                None => {
                    for (k, b) in &data {
                        write(k, b)?;
                    }
                }
            }
            return Ok(());
        }
        if let Some(d) = v.get("downwardAPI") {
            for it in d["items"].as_array().into_iter().flatten() {
                let p = it["path"].as_str().unwrap_or_default();
                let fp = it["fieldRef"]["fieldPath"].as_str().unwrap_or_default();
                let val = field_path(pod, fp).map_err(|m| ("ContainerCreating".to_string(), m))?;
                write(p, val.as_bytes())?;
            }
            return Ok(());
        }
        Err((
            "ContainerCreating".into(),
            format!("volume {vname:?}: unsupported volume type in the local Job runner"),
        ))
    }

    // ---------------- the Job controller ----------------

    fn reconcile_jobs(&mut self) {
        let Some(jrt) = jobs_rt(&self.store) else {
            return;
        };
        let Some(prt) = pods_rt(&self.store) else {
            return;
        };
        // Only the Jobs whose inputs changed (their Job, their Pods, their results) and those
        // whose deadline has passed, which time alone changes: the others' status would come
        // out the same. Unfinished Jobs only, in namespace and name order.
        let now = jiff::Timestamp::now().as_second();
        for j in self.jobs.values() {
            if j.deadline.is_some_and(|d| now >= d) {
                self.dirty.insert(j.uid.clone());
            }
        }
        let dirty = std::mem::take(&mut self.dirty);
        let mut jobs: Vec<&JobView> = dirty.iter().filter_map(|u| self.jobs.get(u)).collect();
        if jobs.is_empty() {
            return;
        }
        jobs.sort_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
        // The active (unfinished) Pods of each Job.
        let mut by_job: HashMap<&str, Vec<&PodView>> = HashMap::new();
        for p in self.pods.values().filter(|p| !p.finished) {
            for u in &p.jobs {
                if dirty.contains(u) {
                    by_job.entry(u.as_str()).or_default().push(p);
                }
            }
        }
        // (uid, namespace, name, status to write, Pod to create) per Job to write.
        let mut writes: Vec<(String, String, String, Option<Value>, bool)> = Vec::new();
        let mut deletes: Vec<(String, String)> = Vec::new();
        for job in jobs {
            let juid = job.uid.clone();
            let ns = job.namespace.clone();
            let name = job.name.clone();
            let suspended = job.suspend;
            if suspended && job.status["startTime"].is_null() {
                continue;
            }
            let active: Vec<&PodView> = by_job
                .get(juid.as_str())
                .into_iter()
                .flatten()
                .copied()
                .collect();
            let (succeeded, failed) = self.result_counts.get(&juid).copied().unwrap_or_default();
            let mut status = job.status.clone();
            if !status.is_object() {
                status = json!({});
            }
            if status["startTime"].is_null() {
                status["startTime"] = json!(now_rfc3339());
            }
            status["active"] = json!(active.len());
            if succeeded > 0 {
                status["succeeded"] = json!(succeeded);
            }
            if failed > 0 {
                status["failed"] = json!(failed);
            }
            status["ready"] = json!(active.iter().filter(|p| p.running).count());
            status["terminating"] = json!(active.iter().filter(|p| p.deleting).count());
            let mut conditions: Vec<Value> =
                status["conditions"].as_array().cloned().unwrap_or_default();
            let target = true_condition(&job.status, "FailureTarget");
            let success = true_condition(&job.status, "SuccessCriteriaMet");
            let backoff = job.backoff_limit.unwrap_or(6) as usize;
            let deadline_passed = job.active_deadline.is_some_and(|ads| {
                status["startTime"]
                    .as_str()
                    .and_then(|s| s.parse::<jiff::Timestamp>().ok())
                    .is_some_and(|st| jiff::Timestamp::now().as_second() >= st.as_second() + ads)
            });
            let mut create_pod = false;
            if let Some(t) = target {
                if active.is_empty() {
                    conditions.push(condition(
                        "Failed",
                        t["reason"].as_str().unwrap_or_default(),
                        t["message"].as_str().unwrap_or_default(),
                    ));
                }
            } else if success.is_some() {
                if active.is_empty() {
                    conditions.push(condition(
                        "Complete",
                        "CompletionsReached",
                        "Reached expected number of succeeded pods",
                    ));
                    status["completionTime"] = json!(now_rfc3339());
                }
            } else if succeeded > 0 {
                conditions.push(condition(
                    "SuccessCriteriaMet",
                    "CompletionsReached",
                    "Reached expected number of succeeded pods",
                ));
            } else if failed > backoff {
                conditions.push(condition(
                    "FailureTarget",
                    "BackoffLimitExceeded",
                    "Job has reached the specified backoff limit",
                ));
            } else if deadline_passed {
                conditions.push(condition(
                    "FailureTarget",
                    "DeadlineExceeded",
                    "Job was active longer than specified deadline",
                ));
                for p in &active {
                    deletes.push((ns.clone(), p.name.clone()));
                }
            } else if active.is_empty() && !suspended && !job.deleting {
                create_pod = true;
            }
            let no_conditions = conditions.is_empty();
            status["conditions"] = Value::Array(conditions);
            if no_conditions && let Some(m) = status.as_object_mut() {
                m.remove("conditions");
            }
            if status != job.status || create_pod {
                let status = (status != job.status).then_some(status);
                writes.push((juid, ns, name, status, create_pod));
            }
        }
        for (ns, name) in deletes {
            let opts = DeleteOptions {
                propagation: Some(Propagation::Background),
                ..Default::default()
            };
            let _ = self.store.delete_rt(&prt, Some(&ns), &name, &opts);
        }
        for (juid, ns, name, status, create_pod) in writes {
            let Ok(mut full) = self.store.get_rt(&jrt, Some(&ns), &name) else {
                continue;
            };
            if store::meta_str(&full, "uid") != Some(juid.as_str()) {
                continue;
            }
            if let Some(status) = status {
                full["status"] = status;
                if self
                    .store
                    .update_rt(&jrt, Some(&ns), &name, full.clone(), true)
                    .is_err()
                {
                    // Changed meanwhile (that change marks it again) or not written: retry.
                    self.dirty.insert(juid);
                    continue;
                }
            }
            if create_pod && !self.create_pod(&prt, &full) {
                self.dirty.insert(juid);
            }
        }
    }

    /// Create the Pod of a Job from its template; whether it was created.
    fn create_pod(&self, prt: &ResourceType, job: &Value) -> bool {
        let juid = store::meta_str(job, "uid").unwrap_or_default();
        let jname = store::meta_str(job, "name").unwrap_or_default();
        let ns = store::meta_str(job, "namespace").unwrap_or_default();
        let tmpl = &job["spec"]["template"];
        let mut labels = tmpl["metadata"]["labels"]
            .as_object()
            .cloned()
            .unwrap_or_default();
        labels.insert("batch.kubernetes.io/job-name".into(), json!(jname));
        labels.insert("job-name".into(), json!(jname));
        labels.insert("batch.kubernetes.io/controller-uid".into(), json!(juid));
        labels.insert("controller-uid".into(), json!(juid));
        let mut spec = tmpl["spec"].clone();
        spec["nodeName"] = json!(NODE_NAME);
        let mut pod = json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": format!("{jname}-{}", store::random_suffix()), "namespace": ns, "labels": labels,
                "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": jname, "uid": juid,
                    "controller": true, "blockOwnerDeletion": true}]},
            "spec": spec,
        });
        if let Some(a) = tmpl["metadata"].get("annotations") {
            pod["metadata"]["annotations"] = a.clone();
        }
        self.store.create_rt(prt, Some(ns), pod).is_ok()
    }
}

/// The downward-API fields the runner supports.
fn field_path(pod: &Value, path: &str) -> Result<String, String> {
    let m = &pod["metadata"];
    let quoted = |p: &str, prefix: &str| -> Option<String> {
        p.strip_prefix(prefix)?
            .strip_suffix("']")
            .map(str::to_string)
    };
    if let Some(k) = quoted(path, "metadata.annotations['") {
        return Ok(m["annotations"][&k]
            .as_str()
            .unwrap_or_default()
            .to_string());
    }
    if let Some(k) = quoted(path, "metadata.labels['") {
        return Ok(m["labels"][&k].as_str().unwrap_or_default().to_string());
    }
    let all = |v: &Value| -> String {
        let mut lines: Vec<String> = v
            .as_object()
            .into_iter()
            .flatten()
            .map(|(k, v)| {
                format!(
                    "{k}={}",
                    serde_json::to_string(v.as_str().unwrap_or_default()).unwrap_or_default()
                )
            })
            .collect();
        lines.sort();
        lines.join("\n")
    };
    match path {
        "metadata.name" => Ok(m["name"].as_str().unwrap_or_default().into()),
        "metadata.namespace" => Ok(m["namespace"].as_str().unwrap_or_default().into()),
        "metadata.uid" => Ok(m["uid"].as_str().unwrap_or_default().into()),
        "metadata.labels" => Ok(all(&m["labels"])),
        "metadata.annotations" => Ok(all(&m["annotations"])),
        "spec.nodeName" => Ok(NODE_NAME.into()),
        "spec.serviceAccountName" => Ok(pod["spec"]["serviceAccountName"]
            .as_str()
            .unwrap_or("default")
            .into()),
        "status.podIP" | "status.hostIP" => Ok("127.0.0.1".into()),
        other => Err(format!("unsupported fieldPath {other:?}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rewriting_whole_path_components() {
        let mounts = vec![
            ("/workspace".to_string(), PathBuf::from("/tmp/p/volumes/ws")),
            (
                "/dev/termination-log".to_string(),
                PathBuf::from("/tmp/p/tl"),
            ),
        ];
        assert_eq!(rewrite_paths("/workspace", &mounts), "/tmp/p/volumes/ws");
        assert_eq!(
            rewrite_paths("/workspace/a/b", &mounts),
            "/tmp/p/volumes/ws/a/b"
        );
        assert_eq!(
            rewrite_paths("cd /workspace && ls /workspace/x", &mounts),
            "cd /tmp/p/volumes/ws && ls /tmp/p/volumes/ws/x"
        );
        assert_eq!(
            rewrite_paths("-chdir=/workspace/m", &mounts),
            "-chdir=/tmp/p/volumes/ws/m"
        );
        assert_eq!(rewrite_paths("/workspaces", &mounts), "/workspaces");
        assert_eq!(rewrite_paths("/x/workspace", &mounts), "/x/workspace");
        assert_eq!(
            rewrite_paths("echo hi > /dev/termination-log", &mounts),
            "echo hi > /tmp/p/tl"
        );
    }

    #[test]
    fn dollar_expansion() {
        let env = vec![("A".to_string(), "x".to_string())];
        assert_eq!(expand("$(A)/$(B)/$$(A)/$x", &env), "x/$(B)/$(A)/$x");
    }
}
