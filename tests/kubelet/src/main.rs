//! `captf-kubelet`: the local kubelet of CAPTF's test control plane (`tests/cluster/`).
//!
//! It registers one Node, is the scheduler too (it binds every pending Pod to its
//! Node), and runs each container of a Pod bound to it as a local process tree in
//! namespaces of its own ([`container`]): volumes, environment, hostname, user, signals
//! and termination as a kubelet and a container runtime do, Pod status through the status
//! subresource, container logs served to the API server for `kubectl logs`. A container
//! whose image is in the local image store (`--image-store`, [`images`]) runs from that
//! image; any other runs the host's programs in an overlay of the host's `/`. Tests make
//! Pods fail in chosen ways through annotations on the Node ([`faults`]).
//!
//! `captf-envtest` starts it with the Node's and the scheduler's credentials; it is not
//! meant to be started by hand. `captf-kubelet container CONFIG` is the per-container
//! shim it starts itself.

mod container;
mod faults;
mod images;
mod logs;
mod node;
mod pods;
mod probes;
mod scheduler;
mod status;
mod volumes;

use std::path::PathBuf;
use std::sync::Arc;

use clap::Parser;
use kube::Client;
use kube::config::{KubeConfigOptions, Kubeconfig};

#[derive(Parser, Debug, Clone)]
#[command(
    name = "captf-kubelet",
    about = "The local kubelet of CAPTF's test control plane"
)]
pub struct Args {
    /// The Node's kubeconfig (user system:node:<node-name>).
    #[arg(long)]
    kubeconfig: PathBuf,
    /// The scheduler's kubeconfig (user system:kube-scheduler), for bindings.
    #[arg(long)]
    scheduler_kubeconfig: PathBuf,
    #[arg(long, default_value = "captf-local")]
    node_name: String,
    /// The address of the Node (its InternalIP) and of the log server.
    #[arg(long, default_value = "127.0.0.1")]
    address: String,
    /// The port of the log server (the Node's kubelet endpoint).
    #[arg(long)]
    port: u16,
    #[arg(long)]
    tls_cert_file: PathBuf,
    #[arg(long)]
    tls_private_key_file: PathBuf,
    /// Where the Pods' directories (volumes, logs, root filesystems) go.
    #[arg(long)]
    root_dir: PathBuf,
    /// The API server Pods reach (KUBERNETES_SERVICE_HOST and _PORT are set from it).
    #[arg(long)]
    api_server: String,
    /// The environment of "the image" every container not in the image store starts with
    /// (KEY=VALUE, repeatable), before the container's own `env`.
    #[arg(long = "image-env", value_parser = parse_key_value)]
    image_env: Vec<(String, String)>,
    /// The user "the image" of a container not in the image store runs as when the
    /// security context names none.
    #[arg(long, default_value_t = 0)]
    image_user: u32,
    /// A directory of OCI image layouts and OCI archives (`*.tar`): a container whose
    /// image reference one of them names (its index's `org.opencontainers.image.ref.name`)
    /// runs from that image; any other runs the host's programs.
    #[arg(long)]
    image_store: Option<PathBuf>,
    /// The entrypoint of an image the store does not have (REFERENCE=PROGRAM, repeatable):
    /// a container of that image that gives only `args` runs the host's PROGRAM with
    /// them, as it would run the image's entrypoint.
    #[arg(long = "image-entrypoint", value_parser = parse_key_value)]
    image_entrypoint: Vec<(String, String)>,
    /// The Node's Pod capacity: the scheduler binds no more unfinished Pods than this to
    /// it; the others stay Pending (Unschedulable) until one finishes, as on a full node.
    #[arg(long, default_value_t = 110)]
    max_pods: usize,
}

fn parse_key_value(s: &str) -> Result<(String, String), String> {
    s.split_once('=')
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .ok_or_else(|| format!("{s:?} is not KEY=VALUE"))
}

/// Log a line on stderr with the time.
#[macro_export]
macro_rules! say {
    ($($arg:tt)*) => {
        eprintln!("{} captf-kubelet: {}", jiff::Timestamp::now().strftime("%H:%M:%S%.3f"), format!($($arg)*))
    };
}

fn main() {
    let argv: Vec<String> = std::env::args().collect();
    // The shim runs before any thread exists: it forks into new namespaces.
    if argv.get(1).map(String::as_str) == Some("container") {
        let Some(config) = argv.get(2) else {
            eprintln!("usage: captf-kubelet container CONFIG");
            std::process::exit(2);
        };
        std::process::exit(container::shim_main(std::path::Path::new(config)));
    }
    let args = Args::parse();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime");
    let code = rt.block_on(run(args));
    rt.shutdown_timeout(std::time::Duration::from_secs(2));
    std::process::exit(code);
}

async fn client(path: &std::path::Path, agent: &str) -> Result<Client, String> {
    let kc = Kubeconfig::read_from(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let mut config = kube::Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
        .await
        .map_err(|e| format!("{}: {e}", path.display()))?;
    config.headers.push((
        http::header::USER_AGENT,
        http::HeaderValue::from_str(agent).map_err(|e| e.to_string())?,
    ));
    Client::try_from(config).map_err(|e| e.to_string())
}

async fn run(args: Args) -> i32 {
    if let Err(e) = pods::probe(&args.root_dir).await {
        say!("cannot run containers here: {e}");
        return 1;
    }
    let node_client = match client(&args.kubeconfig, "captf-kubelet").await {
        Ok(c) => c,
        Err(e) => {
            say!("the Node's kubeconfig: {e}");
            return 1;
        }
    };
    let sched_client = match client(&args.scheduler_kubeconfig, "captf-kubelet/scheduler").await {
        Ok(c) => c,
        Err(e) => {
            say!("the scheduler's kubeconfig: {e}");
            return 1;
        }
    };
    let (faults_tx, faults_rx) = tokio::sync::watch::channel(Vec::new());
    let kubelet = match pods::Kubelet::new(&args, node_client.clone(), faults_rx) {
        Ok(k) => Arc::new(k),
        Err(e) => {
            say!("{e}");
            return 1;
        }
    };
    let server = match logs::serve(&args, kubelet.clone()).await {
        Ok(s) => s,
        Err(e) => {
            say!("the log server on {}:{}: {e}", args.address, args.port);
            return 1;
        }
    };
    if let Err(e) = node::register(&node_client, &args).await {
        say!("registering Node {}: {e}", args.node_name);
        return 1;
    }
    let tasks = vec![
        tokio::spawn(node::heartbeat(node_client.clone(), args.clone())),
        tokio::spawn(faults::watch(
            node_client.clone(),
            args.node_name.clone(),
            faults_tx,
        )),
        tokio::spawn(scheduler::run(
            sched_client,
            args.node_name.clone(),
            args.max_pods,
        )),
        tokio::spawn(pods::run(kubelet.clone())),
        server,
    ];
    say!(
        "Node {} registered; serving logs on https://{}:{}",
        args.node_name,
        args.address,
        args.port
    );
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .expect("SIGTERM handler");
    tokio::select! {
        _ = term.recv() => say!("SIGTERM: killing every container and stopping"),
        _ = tokio::signal::ctrl_c() => say!("SIGINT: killing every container and stopping"),
    }
    for t in &tasks {
        t.abort();
    }
    kubelet.kill_all();
    0
}
