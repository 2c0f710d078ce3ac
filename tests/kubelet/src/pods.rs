//! The Pods of the Node: one task per Pod takes it from `ContainerCreating` to a
//! terminal phase and to its final deletion, as the kubelet does:
//!
//! 1. volumes and environment (a missing Secret or ConfigMap keeps the container waiting
//!    with the kubelet's reason and message), then every container is started through the
//!    shim of [`crate::container`], and the Pod reports `Running`;
//! 2. a graceful deletion sends SIGTERM to each container's PID 1, then SIGKILL (to the
//!    whole container) when `deletionGracePeriodSeconds` have passed; a Pod removed from
//!    the API at once (force deletion) has its containers killed at once;
//! 3. when every container has ended, the terminal status (exit codes, reasons, the
//!    termination message) is written through `pods/status`, and a Pod being deleted is
//!    then deleted for good (grace 0, with its uid as a precondition), which its
//!    finalizers may still hold;
//! 4. the faults of [`crate::faults`] change that course when a rule names the Pod.
//!
//! A container runs from its image when the image store has it ([`crate::images`]), else
//! the host's programs; its readiness probe makes it ready ([`crate::probes`]).
//! Containers are never restarted (`restartPolicy` is taken as `Never`). Native sidecars
//! (init containers with `restartPolicy: Always`) start first (without waiting for a
//! startup probe) and get SIGTERM once every other container has ended, a deletion's
//! included; other init containers, liveness and startup probes and a Pod's own
//! `activeDeadlineSeconds` are not modelled.

use std::collections::{HashMap, HashSet};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{ConfigMap, Container, Pod, Secret};
use kube::api::{DeleteParams, Patch, PatchParams, Preconditions};
use kube::runtime::watcher;
use kube::{Api, Client, ResourceExt};
use serde_json::json;
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

use crate::container::{ContainerConfig, Mount, START_ERROR_EXIT};
use crate::faults::{self, Fault, Rule};
use crate::images::{self, Image};
use crate::probes::{Readiness, Results};
use crate::status::{self, PodReport, State};
use crate::volumes::{self, Made};
use crate::{Args, say};

const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// A container's log file, and whether the container has exited.
#[derive(Clone)]
pub struct LogRef {
    pub path: PathBuf,
    pub exited: watch::Receiver<bool>,
    /// The Pod's uid: a Pod of the same name made later has logs of its own.
    pub uid: String,
}

pub struct Kubelet {
    node: String,
    client: Client,
    root: PathBuf,
    api_host: String,
    api_port: u16,
    image_env: Vec<(String, String)>,
    /// `--image-entrypoint`: the host programs standing for images' entrypoints.
    image_entrypoint: HashMap<String, String>,
    image_user: u32,
    /// The local images (`--image-store`), if any.
    images: Option<Arc<images::Store>>,
    faults: watch::Receiver<Vec<Rule>>,
    logs: Mutex<HashMap<(String, String, String), LogRef>>,
    /// Container PID 1s (host PIDs), by `<pod uid>/<container>`.
    pids: Mutex<HashMap<String, i32>>,
    shim: PathBuf,
}

impl Kubelet {
    pub fn new(
        args: &Args,
        client: Client,
        faults: watch::Receiver<Vec<Rule>>,
    ) -> Result<Kubelet, String> {
        let url = args.api_server.trim_end_matches('/');
        let hostport = url
            .strip_prefix("https://")
            .ok_or_else(|| format!("--api-server {url} is not an https:// URL"))?;
        let (host, port) = hostport
            .rsplit_once(':')
            .and_then(|(h, p)| p.parse::<u16>().ok().map(|p| (h.to_string(), p)))
            .unwrap_or((hostport.to_string(), 443));
        let images = match &args.image_store {
            Some(dir) => Some(Arc::new(images::Store::new(
                dir.clone(),
                args.root_dir.join("images"),
            )?)),
            None => None,
        };
        Ok(Kubelet {
            node: args.node_name.clone(),
            client,
            root: args.root_dir.clone(),
            api_host: host
                .trim_start_matches('[')
                .trim_end_matches(']')
                .to_string(),
            api_port: port,
            image_env: args.image_env.clone(),
            image_entrypoint: args.image_entrypoint.iter().cloned().collect(),
            image_user: args.image_user,
            images,
            faults,
            logs: Mutex::new(HashMap::new()),
            pids: Mutex::new(HashMap::new()),
            shim: std::env::current_exe().map_err(|e| format!("this program's path: {e}"))?,
        })
    }

    pub fn log_ref(&self, ns: &str, pod: &str, container: &str) -> Option<LogRef> {
        self.logs
            .lock()
            .expect("logs")
            .get(&(ns.to_string(), pod.to_string(), container.to_string()))
            .cloned()
    }

    /// SIGKILL to every container (the kubelet is stopping: nothing may outlive it here).
    pub fn kill_all(&self) {
        for pid in self.pids.lock().expect("pids").values() {
            signal(*pid, libc::SIGKILL);
        }
    }
}

fn signal(pid: i32, sig: i32) {
    if pid > 0 {
        unsafe {
            libc::kill(pid, sig);
        }
    }
}

/// Starts a container that does nothing, to fail at once with a clear reason where the
/// kernel refuses what the shim needs (namespaces, overlayfs, root).
pub async fn probe(root: &Path) -> Result<(), String> {
    let dir = root.join("probe");
    let _ = std::fs::remove_dir_all(&dir);
    let config = ContainerConfig {
        hostname: "probe".into(),
        upper: dir.join("upper"),
        work: dir.join("work"),
        rootfs: dir.join("rootfs"),
        argv: vec!["true".into()],
        env: vec![("PATH".into(), DEFAULT_PATH.into())],
        pid_file: dir.join("pid"),
        start_error_file: dir.join("start-error"),
        working_dir: "/".into(),
        ..Default::default()
    };
    for d in [&config.upper, &config.work, &config.rootfs] {
        std::fs::create_dir_all(d).map_err(|e| format!("{}: {e}", d.display()))?;
    }
    let cfg = dir.join("config.json");
    std::fs::write(&cfg, serde_json::to_vec(&config).expect("config"))
        .map_err(|e| e.to_string())?;
    let shim = std::env::current_exe().map_err(|e| e.to_string())?;
    let out = tokio::process::Command::new(shim)
        .arg("container")
        .arg(&cfg)
        .output()
        .await
        .map_err(|e| e.to_string())?;
    let _ = std::fs::remove_dir_all(&dir);
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "a test container failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

type Workers = Arc<Mutex<HashMap<String, mpsc::UnboundedSender<Option<Pod>>>>>;

/// Watches the Pods bound to the Node and gives each to its task.
pub async fn run(k: Arc<Kubelet>) {
    let api: Api<Pod> = Api::all(k.client.clone());
    let cfg = watcher::Config::default().fields(&format!("spec.nodeName={}", k.node));
    let mut stream = watcher(api, cfg).boxed();
    let workers: Workers = Arc::new(Mutex::new(HashMap::new()));
    let mut relisted: Option<HashSet<String>> = None;
    while let Some(ev) = stream.next().await {
        match ev {
            Ok(watcher::Event::Init) => relisted = Some(HashSet::new()),
            Ok(watcher::Event::InitApply(p)) => {
                if let Some(seen) = relisted.as_mut() {
                    seen.insert(p.metadata.uid.clone().unwrap_or_default());
                }
                deliver(&k, &workers, p);
            }
            Ok(watcher::Event::InitDone) => {
                if let Some(seen) = relisted.take() {
                    for (uid, tx) in workers.lock().expect("workers").iter() {
                        if !seen.contains(uid) {
                            let _ = tx.send(None);
                        }
                    }
                }
            }
            Ok(watcher::Event::Apply(p)) => deliver(&k, &workers, p),
            Ok(watcher::Event::Delete(p)) => {
                let uid = p.metadata.uid.clone().unwrap_or_default();
                if let Some(tx) = workers.lock().expect("workers").get(&uid) {
                    let _ = tx.send(None);
                }
            }
            Err(e) => {
                say!("watching the Node's Pods: {e}");
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        }
    }
}

fn deliver(k: &Arc<Kubelet>, workers: &Workers, pod: Pod) {
    let uid = pod.metadata.uid.clone().unwrap_or_default();
    let mut map = workers.lock().expect("workers");
    if let Some(tx) = map.get(&uid) {
        let _ = tx.send(Some(pod));
        return;
    }
    let (tx, rx) = mpsc::unbounded_channel();
    map.insert(uid.clone(), tx);
    let k = k.clone();
    let workers = workers.clone();
    tokio::spawn(async move {
        Worker::new(k, pod, rx).run().await;
        workers.lock().expect("workers").remove(&uid);
    });
}

fn deleting(pod: &Pod) -> bool {
    pod.metadata.deletion_timestamp.is_some()
}

fn terminal(pod: &Pod) -> bool {
    matches!(
        pod.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Succeeded" | "Failed")
    )
}

/// `$(VAR)` references in `s` expanded from `env`; `$$` is a literal `$`; an undefined
/// reference stays as written (Kubernetes' rules).
pub fn expand(s: &str, env: &[(String, String)]) -> String {
    let mut out = String::new();
    let mut rest = s;
    while let Some(i) = rest.find('$') {
        out.push_str(&rest[..i]);
        let after = &rest[i + 1..];
        if let Some(a) = after.strip_prefix('$') {
            out.push('$');
            rest = a;
        } else if let Some(body) = after.strip_prefix('(') {
            match body.find(')') {
                Some(j) => {
                    let name = &body[..j];
                    match env.iter().rev().find(|(k, _)| k == name) {
                        Some((_, v)) => out.push_str(v),
                        None => {
                            out.push_str("$(");
                            out.push_str(name);
                            out.push(')');
                        }
                    }
                    rest = &body[j + 1..];
                }
                None => {
                    out.push_str("$(");
                    rest = body;
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

/// What a container runs, as Kubernetes decides it from its `command` and `args` and its
/// image's entrypoint and cmd: `command` replaces the entrypoint and drops the cmd; `args`
/// replaces the cmd. `$(VAR)` references of the container's own are expanded from `env`,
/// not the image's. A container not in the image store has no image config: its
/// `command` and `args` are all there is.
pub fn argv(
    c: &Container,
    image: Option<&images::ImageConfig>,
    env: &[(String, String)],
) -> Vec<String> {
    let own = |v: &Option<Vec<String>>| -> Option<Vec<String>> {
        v.clone()
            .filter(|v| !v.is_empty())
            .map(|v| v.iter().map(|a| expand(a, env)).collect())
    };
    let (command, args) = (own(&c.command), own(&c.args));
    let entrypoint = image.and_then(|i| i.entrypoint.clone()).unwrap_or_default();
    let cmd = image.and_then(|i| i.cmd.clone()).unwrap_or_default();
    match (command, args) {
        (Some(command), args) => [command, args.unwrap_or_default()].concat(),
        (None, Some(args)) => [entrypoint, args].concat(),
        (None, None) => [entrypoint, cmd].concat(),
    }
}

/// What the kubelet runs of `pod`: its native sidecars (init containers with
/// `restartPolicy: Always`), then its containers; each with whether it is a sidecar.
/// Other init containers are not run.
fn pod_containers(pod: &Pod) -> Vec<(Container, bool)> {
    let Some(spec) = pod.spec.as_ref() else {
        return Vec::new();
    };
    let sidecars = spec
        .init_containers
        .iter()
        .flatten()
        .filter(|c| c.restart_policy.as_deref() == Some("Always"))
        .map(|c| (c.clone(), true));
    sidecars
        .chain(spec.containers.iter().map(|c| (c.clone(), false)))
        .collect()
}

/// One container's run.
struct Run {
    pid: i32,
    oom: bool,
    started_at: String,
    exited_tx: watch::Sender<bool>,
}

struct Worker {
    k: Arc<Kubelet>,
    pod: Pod,
    rx: mpsc::UnboundedReceiver<Option<Pod>>,
    uid: String,
    ns: String,
    name: String,
    dir: PathBuf,
    api: Api<Pod>,
    containers: Vec<status::Container>,
    report: PodReport,
    last_written: Option<serde_json::Value>,
    gone: bool,
    exits: Option<mpsc::UnboundedReceiver<(usize, i32)>>,
}

/// What a wait between steps ended with.
enum Woke {
    Updated,
    Gone,
    Timer,
    Faults,
}

impl Worker {
    fn new(k: Arc<Kubelet>, pod: Pod, rx: mpsc::UnboundedReceiver<Option<Pod>>) -> Worker {
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        let ns = pod.namespace().unwrap_or_default();
        let name = pod.name_any();
        let containers = pod_containers(&pod)
            .iter()
            .map(|(c, sidecar)| status::Container {
                sidecar: *sidecar,
                name: c.name.clone(),
                image: c.image.clone().unwrap_or_default(),
                image_id: None,
                container_id: None,
                state: State::Waiting {
                    reason: "ContainerCreating".into(),
                    message: String::new(),
                },
                probed_ready: None,
            })
            .collect();
        Worker {
            dir: k.root.join("pods").join(&uid),
            api: Api::namespaced(k.client.clone(), &ns),
            k,
            pod,
            rx,
            uid,
            ns,
            name,
            containers,
            report: PodReport::default(),
            last_written: None,
            gone: false,
            exits: None,
        }
    }

    /// The Pod's native sidecars, then its containers, in the order of
    /// [`Worker::containers`].
    fn spec_containers(&self) -> Vec<Container> {
        pod_containers(&self.pod)
            .into_iter()
            .map(|(c, _)| c)
            .collect()
    }

    /// Waits for a change of the Pod, of the fault rules, or for `until`.
    async fn wait(&mut self, until: Option<Instant>) -> Woke {
        let mut faults = self.k.faults.clone();
        let sleep = async {
            match until {
                Some(t) => tokio::time::sleep_until(t).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            ev = self.rx.recv() => match ev {
                Some(Some(p)) => { self.pod = p; Woke::Updated }
                _ => { self.gone = true; Woke::Gone }
            },
            _ = faults.changed() => Woke::Faults,
            _ = sleep => Woke::Timer,
        }
    }

    fn rule(&self) -> Option<Rule> {
        faults::for_pod(&self.k.faults.borrow(), &self.pod).cloned()
    }

    /// Writes the status unless it is what was last written (a few tries).
    async fn write_status(&mut self) {
        if self.gone {
            return;
        }
        let mut patch = status::patch(&self.pod, &self.containers, &self.report);
        let key = {
            let mut k = patch.clone();
            // Transition times move on their own: compare without them.
            if let Some(cs) = k["status"]["conditions"].as_array_mut() {
                for c in cs {
                    c["lastTransitionTime"] = serde_json::Value::Null;
                }
            }
            k
        };
        if self.last_written.as_ref() == Some(&key) {
            return;
        }
        patch["metadata"] = json!({"uid": self.uid});
        for attempt in 0..5 {
            match self
                .api
                .patch_status(
                    &self.name,
                    &PatchParams::default(),
                    &Patch::Strategic(&patch),
                )
                .await
            {
                Ok(p) => {
                    self.pod = p;
                    self.last_written = Some(key);
                    return;
                }
                Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => return,
                Err(e) => {
                    say!(
                        "Pod {}/{}: writing its status (try {}): {e}",
                        self.ns,
                        self.name,
                        attempt + 1
                    );
                    tokio::time::sleep(Duration::from_millis(200 << attempt)).await;
                }
            }
        }
    }

    /// The final deletion of a terminated Pod that is being deleted.
    async fn final_delete(&mut self) {
        let dp = DeleteParams {
            grace_period_seconds: Some(0),
            preconditions: Some(Preconditions {
                uid: Some(self.uid.clone()),
                resource_version: None,
            }),
            ..Default::default()
        };
        for attempt in 0..5 {
            match self.api.delete(&self.name, &dp).await {
                Ok(_) => return,
                Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => return,
                Err(e) => {
                    say!(
                        "Pod {}/{}: final deletion (try {}): {e}",
                        self.ns,
                        self.name,
                        attempt + 1
                    );
                    tokio::time::sleep(Duration::from_millis(200 << attempt)).await;
                }
            }
        }
    }

    async fn run(mut self) {
        if terminal(&self.pod) {
            // Finished before this kubelet saw it (a restart): only the final deletion.
            return self.after_end(false).await;
        }
        self.report.start_time = Some(status::now());
        self.write_status().await;
        let started = match self.prepare_and_start().await {
            Some(s) => s,
            None => return self.after_end(false).await,
        };
        let lost = self.supervise(started).await;
        self.after_end(lost).await;
    }

    /// Volumes, environment, faults before the start; then the containers start.
    /// `None` when the Pod went (or was deleted) before anything started.
    async fn prepare_and_start(&mut self) -> Option<Vec<Run>> {
        let mut pull_failures = 0u32;
        loop {
            if self.gone {
                return None;
            }
            if deleting(&self.pod) {
                // Deleted before it ran: its containers end without having started.
                let now = status::now();
                for c in &mut self.containers {
                    c.state = State::Terminated {
                        exit_code: 137,
                        reason: "ContainerStatusUnknown".into(),
                        message: "The container could not be located when the pod was terminated"
                            .into(),
                        started_at: now.clone(),
                        finished_at: now.clone(),
                    };
                }
                self.write_status().await;
                return None;
            }
            let wait_reason = if self
                .rule()
                .is_some_and(|r| r.fault == Fault::ImagePullFailure)
            {
                pull_failures += 1;
                let image = self
                    .containers
                    .first()
                    .map(|c| c.image.clone())
                    .unwrap_or_default();
                Some(if pull_failures == 1 {
                    (
                        "ErrImagePull".to_string(),
                        format!(
                            "failed to pull and unpack image \"{image}\": the test control made the pull fail"
                        ),
                    )
                } else {
                    (
                        "ImagePullBackOff".to_string(),
                        format!("Back-off pulling image \"{image}\""),
                    )
                })
            } else {
                match self.prepare().await {
                    Ok(configs) => return Some(self.start(configs).await),
                    Err(w) => Some(w),
                }
            };
            if let Some((reason, message)) = wait_reason {
                for c in &mut self.containers {
                    c.state = State::Waiting {
                        reason: reason.clone(),
                        message: message.clone(),
                    };
                }
                self.write_status().await;
            }
            self.wait(Some(Instant::now() + Duration::from_secs(1)))
                .await;
        }
    }

    /// Everything each container needs; `Err((reason, message))` keeps it waiting.
    async fn prepare(&mut self) -> Result<Vec<(ContainerConfig, PathBuf)>, (String, String)> {
        std::fs::create_dir_all(&self.dir).map_err(|e| {
            (
                "ContainerCreating".to_string(),
                format!("{}: {e}", self.dir.display()),
            )
        })?;
        let made = volumes::make(&self.k.client, &self.pod, &self.dir)
            .await
            .map_err(|m| ("ContainerCreating".to_string(), m))?;
        let hosts = self.dir.join("etc-hosts");
        let hostname = self.dir.join("etc-hostname");
        let io = |e: std::io::Error| ("ContainerCreating".to_string(), e.to_string());
        std::fs::write(
            &hosts,
            format!(
                "# Kubernetes-managed hosts file (captf-kubelet).\n127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n127.0.0.1\t{}\n",
                self.name
            ),
        )
        .map_err(io)?;
        std::fs::write(&hostname, format!("{}\n", self.name)).map_err(io)?;
        let mut out = Vec::new();
        for (i, c) in self.spec_containers().iter().enumerate() {
            let image = self
                .local_image(c)
                .await
                .map_err(|m| ("ErrImagePull".to_string(), m))?;
            let cfg = self
                .container_config(c, image.as_ref(), &made, &hosts, &hostname)
                .await
                .map_err(|m| ("CreateContainerConfigError".to_string(), m))?;
            self.containers[i].image_id = image.as_ref().map(Image::id);
            out.push(cfg);
        }
        Ok(out)
    }

    /// The container's image from the image store, unpacked; `None` when the store does
    /// not have it (the container runs the host's programs).
    async fn local_image(&self, c: &Container) -> Result<Option<Image>, String> {
        let (Some(store), Some(reference)) = (self.k.images.clone(), c.image.clone()) else {
            return Ok(None);
        };
        tokio::task::spawn_blocking(move || store.find(&reference))
            .await
            .map_err(|e| format!("looking the image up: {e}"))?
    }

    /// The container's environment: the image's (the image store's, or `--image-env` for
    /// the host's programs), then the kubelet's, then the container's own.
    async fn env(
        &self,
        c: &Container,
        image: Option<&Image>,
    ) -> Result<Vec<(String, String)>, String> {
        let mut env: Vec<(String, String)> = Vec::new();
        let set = |env: &mut Vec<(String, String)>, k: String, v: String| {
            env.retain(|(ek, _)| *ek != k);
            env.push((k, v));
        };
        set(&mut env, "PATH".into(), DEFAULT_PATH.into());
        let image_env = match image {
            Some(i) => i.config.env_pairs(),
            None => self.k.image_env.clone(),
        };
        for (k, v) in image_env {
            set(&mut env, k, v);
        }
        set(&mut env, "HOSTNAME".into(), self.name.clone());
        let host = &self.k.api_host;
        let port = self.k.api_port;
        for (k, v) in [
            ("KUBERNETES_SERVICE_HOST", host.clone()),
            ("KUBERNETES_SERVICE_PORT", port.to_string()),
            ("KUBERNETES_SERVICE_PORT_HTTPS", port.to_string()),
            ("KUBERNETES_PORT", format!("tcp://{host}:{port}")),
            (
                &format!("KUBERNETES_PORT_{port}_TCP"),
                format!("tcp://{host}:{port}"),
            ),
            (&format!("KUBERNETES_PORT_{port}_TCP_PROTO"), "tcp".into()),
            (
                &format!("KUBERNETES_PORT_{port}_TCP_PORT"),
                port.to_string(),
            ),
            (&format!("KUBERNETES_PORT_{port}_TCP_ADDR"), host.clone()),
        ] {
            set(&mut env, k.to_string(), v);
        }
        let secrets: Api<Secret> = Api::namespaced(self.k.client.clone(), &self.ns);
        let maps: Api<ConfigMap> = Api::namespaced(self.k.client.clone(), &self.ns);
        for from in c.env_from.clone().unwrap_or_default() {
            let prefix = from.prefix.unwrap_or_default();
            if let Some(r) = from.secret_ref {
                match secrets.get_opt(&r.name).await.map_err(|e| e.to_string())? {
                    Some(s) => {
                        for (k, v) in s.data.unwrap_or_default() {
                            set(
                                &mut env,
                                format!("{prefix}{k}"),
                                String::from_utf8_lossy(&v.0).into_owned(),
                            );
                        }
                    }
                    None if r.optional == Some(true) => {}
                    None => return Err(format!("secret \"{}\" not found", r.name)),
                }
            }
            if let Some(r) = from.config_map_ref {
                match maps.get_opt(&r.name).await.map_err(|e| e.to_string())? {
                    Some(m) => {
                        for (k, v) in m.data.unwrap_or_default() {
                            set(&mut env, format!("{prefix}{k}"), v);
                        }
                    }
                    None if r.optional == Some(true) => {}
                    None => return Err(format!("configmap \"{}\" not found", r.name)),
                }
            }
        }
        for e in c.env.clone().unwrap_or_default() {
            let value = if let Some(vf) = e.value_from {
                if let Some(r) = vf.secret_key_ref {
                    let optional = r.optional == Some(true);
                    match secrets.get_opt(&r.name).await.map_err(|e| e.to_string())? {
                        Some(s) => match s.data.unwrap_or_default().get(&r.key) {
                            Some(v) => String::from_utf8_lossy(&v.0).into_owned(),
                            None if optional => continue,
                            None => {
                                return Err(format!(
                                    "couldn't find key {} in Secret {}/{}",
                                    r.key, self.ns, r.name
                                ));
                            }
                        },
                        None if optional => continue,
                        None => return Err(format!("secret \"{}\" not found", r.name)),
                    }
                } else if let Some(r) = vf.config_map_key_ref {
                    let optional = r.optional == Some(true);
                    match maps.get_opt(&r.name).await.map_err(|e| e.to_string())? {
                        Some(m) => match m.data.unwrap_or_default().get(&r.key) {
                            Some(v) => v.clone(),
                            None if optional => continue,
                            None => {
                                return Err(format!(
                                    "couldn't find key {} in ConfigMap {}/{}",
                                    r.key, self.ns, r.name
                                ));
                            }
                        },
                        None if optional => continue,
                        None => return Err(format!("configmap \"{}\" not found", r.name)),
                    }
                } else if let Some(f) = vf.field_ref {
                    volumes::field_value(&self.pod, &f.field_path)?
                } else if let Some(r) = vf.resource_field_ref {
                    volumes::resource_value(
                        &self.pod,
                        Some(r.container_name.as_deref().unwrap_or(&c.name)),
                        &r.resource,
                    )
                } else {
                    String::new()
                }
            } else {
                expand(e.value.as_deref().unwrap_or_default(), &env)
            };
            set(&mut env, e.name, value);
        }
        Ok(env)
    }

    async fn container_config(
        &self,
        c: &Container,
        image: Option<&Image>,
        made: &HashMap<String, Made>,
        hosts: &Path,
        hostname: &Path,
    ) -> Result<(ContainerConfig, PathBuf), String> {
        let spec = self.pod.spec.clone().unwrap_or_default();
        let psc = spec.security_context.clone().unwrap_or_default();
        let csc = c.security_context.clone().unwrap_or_default();
        let run_as_user = csc.run_as_user.or(psc.run_as_user).map(|u| u as u32);
        let run_as_group = csc.run_as_group.or(psc.run_as_group).map(|g| g as u32);
        let non_root = csc.run_as_non_root.or(psc.run_as_non_root) == Some(true);
        let pod_ref = format!("\"{}_{}({})\"", self.name, self.ns, self.uid);
        // The image's user, its primary group and home (the store's image), or
        // `--image-user` (the host's programs).
        let image_user = match image {
            Some(i) => i.user()?,
            None => images::ImageUser {
                uid: Some(self.k.image_user),
                ..Default::default()
            },
        };
        if non_root
            && run_as_user.is_none()
            && let Some(name) = &image_user.name
        {
            return Err(format!(
                "container has runAsNonRoot and image has non-numeric user ({name}), cannot verify user is non-root (pod: {pod_ref}, container: {})",
                c.name
            ));
        }
        let uid = run_as_user.or(image_user.uid).unwrap_or(0);
        // As a runtime does: the image's group goes with the image's user; a user the Pod
        // names by uid gets that uid's group in the image's passwd, else 0.
        let account = image.and_then(|i| i.account(uid));
        let gid = match (run_as_group, run_as_user) {
            (Some(g), _) => g,
            (None, None) if image.is_some() => image_user.gid.unwrap_or(0),
            (None, _) => account.as_ref().map_or(0, |(g, _)| *g),
        };
        if non_root && uid == 0 {
            return Err(format!(
                "container has runAsNonRoot and image will run as root (pod: {pod_ref}, container: {})",
                c.name
            ));
        }
        let mut groups: Vec<u32> = psc
            .supplemental_groups
            .unwrap_or_default()
            .iter()
            .map(|g| *g as u32)
            .collect();
        if let Some(g) = psc.fs_group {
            groups.push(g as u32);
        }
        let cdir = self.dir.join("containers").join(&c.name);
        let _ = std::fs::remove_dir_all(&cdir);
        for d in ["upper", "work", "rootfs"] {
            std::fs::create_dir_all(cdir.join(d)).map_err(|e| e.to_string())?;
        }
        let term_log = cdir.join("termination-log");
        std::fs::write(&term_log, b"").map_err(|e| e.to_string())?;
        // The container's user writes its termination message.
        let _ = std::os::unix::fs::chown(&term_log, Some(uid), Some(gid));
        let mut mounts = Vec::new();
        for m in c.volume_mounts.clone().unwrap_or_default() {
            let Some(v) = made.get(&m.name) else {
                return Err(format!(
                    "unable to find volume \"{}\" for container {}",
                    m.name, c.name
                ));
            };
            let mut source = v.dir.clone();
            if let Some(sp) = m.sub_path.filter(|s| !s.is_empty()) {
                if sp.split('/').any(|p| p == "..") || sp.starts_with('/') {
                    return Err(format!("invalid subPath {sp:?}"));
                }
                source = source.join(&sp);
                if !source.exists() {
                    std::fs::create_dir_all(&source).map_err(|e| e.to_string())?;
                }
            }
            mounts.push(Mount {
                file: source.is_file(),
                source,
                target: m.mount_path.clone(),
                read_only: m.read_only == Some(true) || v.read_only,
            });
        }
        let term_path = c
            .termination_message_path
            .clone()
            .unwrap_or_else(|| "/dev/termination-log".into());
        let mut files = vec![
            (term_log.clone(), term_path),
            (hosts.to_path_buf(), "/etc/hosts".to_string()),
            (hostname.to_path_buf(), "/etc/hostname".to_string()),
        ];
        // An image has no resolver configuration of the node's: the kubelet gives it the
        // node's (dnsPolicy Default; the host's programs see it anyway).
        let resolv = Path::new("/etc/resolv.conf");
        if image.is_some() && resolv.exists() {
            files.push((resolv.to_path_buf(), "/etc/resolv.conf".to_string()));
        }
        for (source, target) in files {
            mounts.push(Mount {
                source,
                target,
                read_only: false,
                file: true,
            });
        }
        // Deeper paths after their parents.
        mounts.sort_by_key(|m| m.target.matches('/').count());
        let mut env = self.env(c, image).await?;
        if !env.iter().any(|(k, _)| k == "HOME") {
            // A runtime's: the home of the user's passwd entry in the image, else `/`.
            let home = match (image, &account) {
                (Some(_), Some((_, home))) if !home.is_empty() => home.clone(),
                (Some(_), _) => "/".into(),
                (None, _) if uid == 0 => "/root".into(),
                (None, _) => "/".into(),
            };
            env.push(("HOME".into(), home));
        }
        // An image the store lacks: its entrypoint, when `--image-entrypoint` names one.
        let host_entrypoint = c
            .image
            .as_ref()
            .and_then(|i| self.k.image_entrypoint.get(i))
            .map(|program| images::ImageConfig {
                entrypoint: Some(vec![program.clone()]),
                ..Default::default()
            });
        let config = image.map(|i| &i.config).or(host_entrypoint.as_ref());
        let argv = argv(c, config, &env);
        let working_dir = c
            .working_dir
            .clone()
            .filter(|d| !d.is_empty())
            .or_else(|| image.and_then(|i| i.config.working_dir.clone()))
            .unwrap_or_default();
        let config = ContainerConfig {
            hostname: self.name.clone(),
            image_root: image.map(|i| i.rootfs.clone()),
            upper: cdir.join("upper"),
            work: cdir.join("work"),
            rootfs: cdir.join("rootfs"),
            mounts,
            read_only_root: csc.read_only_root_filesystem == Some(true),
            uid,
            gid,
            groups,
            no_new_privs: csc.allow_privilege_escalation == Some(false),
            working_dir,
            argv,
            env,
            pid_file: cdir.join("pid"),
            start_error_file: cdir.join("start-error"),
        };
        Ok((config, cdir))
    }

    /// Starts every container through the shim; a container that could not start is
    /// reported terminated with `StartError`.
    async fn start(&mut self, configs: Vec<(ContainerConfig, PathBuf)>) -> Vec<Run> {
        let mut runs = Vec::new();
        let (exit_tx, exit_rx) = mpsc::unbounded_channel::<(usize, i32)>();
        self.exits = Some(exit_rx);
        for (i, (config, cdir)) in configs.into_iter().enumerate() {
            let name = self.containers[i].name.clone();
            let log = cdir.join("log");
            let (exited_tx, exited_rx) = watch::channel(false);
            self.k.logs.lock().expect("logs").insert(
                (self.ns.clone(), self.name.clone(), name.clone()),
                LogRef {
                    path: log.clone(),
                    exited: exited_rx,
                    uid: self.uid.clone(),
                },
            );
            let started_at = status::now();
            let id = format!("captf://{}/{}", self.uid, name);
            self.containers[i].container_id = Some(id);
            let pid = match spawn_shim(&self.k.shim, &cdir, &config, &log) {
                Ok(mut child) => {
                    let pid = wait_pid(&config.pid_file, &mut child).await;
                    let tx = exit_tx.clone();
                    tokio::spawn(async move {
                        let code = match child.wait().await {
                            Ok(st) => st.code().unwrap_or(START_ERROR_EXIT),
                            Err(_) => START_ERROR_EXIT,
                        };
                        let _ = tx.send((i, code));
                    });
                    pid
                }
                Err(e) => {
                    let _ =
                        std::fs::write(&config.start_error_file, format!("starting the shim: {e}"));
                    let _ = exit_tx.send((i, START_ERROR_EXIT));
                    0
                }
            };
            if pid > 0 {
                self.k
                    .pids
                    .lock()
                    .expect("pids")
                    .insert(format!("{}/{name}", self.uid), pid);
            }
            self.containers[i].state = State::Running {
                started_at: started_at.clone(),
            };
            runs.push(Run {
                pid,
                oom: false,
                started_at,
                exited_tx,
            });
        }
        self.write_status().await;
        runs
    }
}

impl Worker {
    /// Runs the containers to their end: deletion, faults, exits. Returns whether the
    /// node was "lost" for this Pod (nothing more may be written about it).
    async fn supervise(&mut self, mut runs: Vec<Run>) -> bool {
        let Some(mut exits) = self.exits.take() else {
            return false;
        };
        let mut exited = vec![false; runs.len()];
        let mut running = runs.len();
        let started = Instant::now();
        // Readiness probes: each container's, when it is due, whether one is under way.
        let probes: Vec<Option<Readiness>> = self
            .spec_containers()
            .iter()
            .map(|c| {
                Readiness::of(c).unwrap_or_else(|e| {
                    say!(
                        "Pod {}/{}: container {}: {e}; it is not probed",
                        self.ns,
                        self.name,
                        c.name
                    );
                    None
                })
            })
            .collect();
        let mut results = vec![Results::default(); runs.len()];
        let mut next_probe: Vec<Option<Instant>> = probes
            .iter()
            .map(|p| p.as_ref().map(|p| started + p.initial_delay))
            .collect();
        let mut probing = vec![false; runs.len()];
        for (i, p) in probes.iter().enumerate() {
            if p.is_some()
                && let Some(c) = self.containers.get_mut(i)
            {
                c.probed_ready = Some(false);
            }
        }
        if probes.iter().any(Option::is_some) {
            self.write_status().await;
        }
        let (probe_tx, mut probe_rx) = mpsc::unbounded_channel::<(usize, bool)>();
        let mut kill_at: Option<Instant> = None;
        let mut term_sent = false;
        let mut sidecars_stopped = false;
        let mut fault_done = false;
        let mut lost = false;
        let sidecar: Vec<bool> = self.containers.iter().map(|c| c.sidecar).collect();
        while running > 0 {
            if deleting(&self.pod) && !term_sent && !lost {
                term_sent = true;
                let grace = self
                    .pod
                    .metadata
                    .deletion_grace_period_seconds
                    .unwrap_or(30)
                    .max(0);
                // The containers first; the sidecars once they have ended (below).
                for (i, r) in runs.iter().enumerate() {
                    if !exited[i] && !sidecar[i] {
                        signal(r.pid, libc::SIGTERM);
                    }
                }
                kill_at = Some(Instant::now() + Duration::from_secs(grace as u64));
            }
            // Every container ended: the sidecars are stopped, as the kubelet stops them,
            // within the grace a deletion left, else the Pod's termination grace period.
            if !sidecars_stopped && !lost && (0..runs.len()).all(|i| sidecar[i] || exited[i]) {
                sidecars_stopped = true;
                for (i, r) in runs.iter().enumerate() {
                    if !exited[i] && sidecar[i] {
                        signal(r.pid, libc::SIGTERM);
                    }
                }
                if kill_at.is_none() {
                    let grace = self
                        .pod
                        .spec
                        .as_ref()
                        .and_then(|s| s.termination_grace_period_seconds)
                        .unwrap_or(30)
                        .max(0);
                    kill_at = Some(Instant::now() + Duration::from_secs(grace as u64));
                }
            }
            let fault = if fault_done {
                None
            } else {
                self.rule().filter(|r| r.fault != Fault::ImagePullFailure)
            };
            let fault_at = fault
                .as_ref()
                .map(|r| started + Duration::from_secs_f64(r.after_seconds.max(0.0)));
            let now = Instant::now();
            if let (Some(rule), Some(at)) = (&fault, fault_at)
                && now >= at
            {
                fault_done = true;
                say!(
                    "Pod {}/{}: fault {:?} of rule {}",
                    self.ns,
                    self.name,
                    rule.fault,
                    rule.name
                );
                match rule.fault {
                    Fault::OomKilled => {
                        for r in runs.iter_mut() {
                            r.oom = true;
                        }
                    }
                    Fault::Evicted => {
                        let msg = format!(
                            "The node was low on resource: memory. Threshold quantity: 100Mi, available: 10Mi. (test control: rule {})",
                            rule.name
                        );
                        self.report.reason = Some(("Evicted".into(), msg.clone()));
                        self.report.disruption = Some(("TerminationByKubelet".into(), msg));
                    }
                    Fault::LostNode => lost = true,
                    Fault::ImagePullFailure => {}
                }
                for (i, r) in runs.iter().enumerate() {
                    if !exited[i] {
                        signal(r.pid, libc::SIGKILL);
                    }
                }
                continue;
            }
            if kill_at.is_some_and(|t| now >= t) {
                for (i, r) in runs.iter().enumerate() {
                    if !exited[i] {
                        signal(r.pid, libc::SIGKILL);
                    }
                }
                kill_at = None;
            }
            for (i, probe) in probes.iter().enumerate() {
                let (Some(probe), Some(due)) = (probe, next_probe[i]) else {
                    continue;
                };
                if exited[i] || lost {
                    next_probe[i] = None;
                } else if now >= due && !probing[i] {
                    probing[i] = true;
                    next_probe[i] = Some(now + probe.period);
                    let (probe, tx) = (probe.clone(), probe_tx.clone());
                    tokio::spawn(async move {
                        let _ = tx.send((i, probe.check().await));
                    });
                }
            }
            // A probe under way is waited for through its result, not its next time.
            let probes_due = next_probe
                .iter()
                .zip(&probing)
                .filter(|(_, under_way)| !**under_way)
                .map(|(due, _)| *due);
            let until = [kill_at, fault_at]
                .into_iter()
                .chain(probes_due)
                .flatten()
                .min();
            tokio::select! {
                Some((i, ok)) = probe_rx.recv() => {
                    probing[i] = false;
                    if let Some(probe) = &probes[i]
                        && !exited[i]
                        && results[i].record(probe, ok)
                    {
                        self.containers[i].probed_ready = Some(results[i].ready);
                        if !lost {
                            self.write_status().await;
                        }
                    }
                }
                ev = exits.recv() => {
                    let Some((i, code)) = ev else { break };
                    if exited[i] {
                        continue;
                    }
                    exited[i] = true;
                    running -= 1;
                    self.container_exited(&runs[i], i, code);
                    let _ = runs[i].exited_tx.send(true);
                    if running > 0 && !lost {
                        self.write_status().await;
                    }
                }
                woke = self.wait(until) => {
                    if let Woke::Gone = woke {
                        // Removed from the API at once: nothing is waited for.
                        for (i, r) in runs.iter().enumerate() {
                            if !exited[i] {
                                signal(r.pid, libc::SIGKILL);
                            }
                        }
                    }
                }
            }
        }
        if !lost {
            self.write_status().await;
        }
        lost
    }

    fn container_exited(&mut self, run: &Run, i: usize, code: i32) {
        let name = self.containers[i].name.clone();
        self.k
            .pids
            .lock()
            .expect("pids")
            .remove(&format!("{}/{name}", self.uid));
        let cdir = self.dir.join("containers").join(&name);
        let finished_at = status::now();
        let start_error = std::fs::read_to_string(cdir.join("start-error")).unwrap_or_default();
        let state = if code == START_ERROR_EXIT && !start_error.is_empty() {
            State::Terminated {
                exit_code: 128,
                reason: "StartError".into(),
                message: start_error,
                started_at: run.started_at.clone(),
                finished_at,
            }
        } else {
            let fallback = self
                .spec_containers()
                .get(i)
                .and_then(|c| c.termination_message_policy.clone())
                .as_deref()
                == Some("FallbackToLogsOnError");
            let file = std::fs::read(cdir.join("termination-log")).unwrap_or_default();
            let log = std::fs::read(cdir.join("log")).unwrap_or_default();
            State::Terminated {
                exit_code: code,
                reason: if run.oom {
                    "OOMKilled"
                } else if code == 0 {
                    "Completed"
                } else {
                    "Error"
                }
                .into(),
                message: status::termination_message(&file, &log, code != 0, fallback),
                started_at: run.started_at.clone(),
                finished_at,
            }
        };
        self.containers[i].state = state;
    }

    /// After the containers: the final deletion once the Pod is being deleted, then
    /// waiting for it to leave the API; then its directory goes.
    async fn after_end(mut self, lost: bool) {
        let mut deleted = false;
        while !self.gone {
            if !lost && !deleted && deleting(&self.pod) {
                deleted = true;
                self.final_delete().await;
            }
            self.wait(None).await;
        }
        self.k
            .logs
            .lock()
            .expect("logs")
            .retain(|(ns, pod, _), l| !(ns == &self.ns && pod == &self.name && l.uid == self.uid));
        let prefix = format!("{}/", self.uid);
        self.k
            .pids
            .lock()
            .expect("pids")
            .retain(|k, _| !k.starts_with(&prefix));
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn spawn_shim(
    shim: &Path,
    cdir: &Path,
    config: &ContainerConfig,
    log: &Path,
) -> std::io::Result<tokio::process::Child> {
    let cfg = cdir.join("config.json");
    std::fs::write(
        &cfg,
        serde_json::to_vec(config).map_err(std::io::Error::other)?,
    )?;
    let out = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)?;
    let mut cmd = std::process::Command::new(shim);
    cmd.arg("container")
        .arg(&cfg)
        .stdin(std::process::Stdio::null())
        .stdout(out.try_clone()?)
        .stderr(out);
    unsafe {
        cmd.pre_exec(|| {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    tokio::process::Command::from(cmd).spawn()
}

/// The host PID of the container's PID 1, once the shim has written it (0 when the shim
/// ended without starting it).
async fn wait_pid(pid_file: &Path, child: &mut tokio::process::Child) -> i32 {
    for _ in 0..1000 {
        if let Some(pid) = std::fs::read_to_string(pid_file)
            .ok()
            .and_then(|s| s.trim().parse::<i32>().ok())
        {
            return pid;
        }
        if let Ok(Some(_)) = child.try_wait() {
            return 0;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    0
}

#[cfg(test)]
mod tests {
    use super::*;

    fn container(command: Option<&[&str]>, args: Option<&[&str]>) -> Container {
        let list = |v: Option<&[&str]>| v.map(|v| v.iter().map(|s| s.to_string()).collect());
        Container {
            name: "c".into(),
            command: list(command),
            args: list(args),
            ..Default::default()
        }
    }

    /// Kubernetes' table (the Container's `command` field): the entrypoint and cmd of the
    /// image unless the container says otherwise.
    #[test]
    fn command_and_args_over_the_image_entrypoint_and_cmd() {
        let image = images::ImageConfig {
            entrypoint: Some(vec!["/captf".into()]),
            cmd: Some(vec!["manager".into()]),
            ..Default::default()
        };
        let env = vec![("NS".to_string(), "captf-system".to_string())];
        let run = |command, args| argv(&container(command, args), Some(&image), &env);
        assert_eq!(run(None, None), ["/captf", "manager"]);
        assert_eq!(
            run(None, Some(&["manager", "--namespace=$(NS)"])),
            ["/captf", "manager", "--namespace=captf-system"]
        );
        assert_eq!(run(Some(&["/bin/sh"]), None), ["/bin/sh"]);
        assert_eq!(
            run(Some(&["/bin/sh"]), Some(&["-c", "x"])),
            ["/bin/sh", "-c", "x"]
        );
        // An empty list is no list (the API server drops it).
        assert_eq!(run(Some(&[]), Some(&[])), ["/captf", "manager"]);
        // The image's own words are not expanded.
        let literal = images::ImageConfig {
            cmd: Some(vec!["$(NS)".into()]),
            ..Default::default()
        };
        assert_eq!(
            argv(&container(None, None), Some(&literal), &env),
            ["$(NS)"]
        );
        // Without an image: only the container's.
        assert_eq!(
            argv(
                &container(Some(&["sh"]), Some(&["-c", "$(NS)"])),
                None,
                &env
            ),
            ["sh", "-c", "captf-system"]
        );
        assert!(argv(&container(None, None), None, &env).is_empty());
    }
}
