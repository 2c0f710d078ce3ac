//! Running a `captf` command once its arguments are parsed: each subcommand's run, and
//! how it ends (status 2 for misuse, with a message naming what was wrong).

use super::*;

pub fn main() -> ExitCode {
    use clap::{CommandFactory, FromArgMatches};
    let argv0 = std::env::args_os().next();
    let parsed = Cli::command()
        .bin_name(bin_name(argv0.as_deref()))
        .try_get_matches()
        .and_then(|m| Cli::from_arg_matches(&m));
    let cli = match parsed {
        Ok(cli) => cli,
        Err(e) => {
            let _ = e.print();
            return if e.use_stderr() {
                ExitCode::from(2)
            } else {
                ExitCode::SUCCESS
            };
        }
    };
    let result = match cli.command {
        Command::Manager(args) => run_manager(&args),
        Command::Crds => {
            print!("{}", crds_yaml());
            Ok(())
        }
        Command::Explain(args) => run_explain(&args),
        Command::State(StateCommand::Inspect(args)) => run_inspect(&args),
        Command::State(StateCommand::Restore(args)) => run_restore(&args),
        Command::Orphans(args) => run_orphans(&args),
        Command::Module(ModuleCommand::Check(args)) => return run_module_check(&args),
        Command::ReleaseAssets(args) => run_release_assets(&args),
        Command::StateProxy(args) => run_state_proxy(&args),
        Command::Completions(args) => {
            use clap::CommandFactory;
            let mut cmd = Cli::command();
            clap_complete::generate(args.shell, &mut cmd, "captf", &mut std::io::stdout());
            Ok(())
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(Misuse(message)) => {
            eprintln!("error: {message}");
            ExitCode::from(2)
        }
    }
}

/// `captf module check`: 0 when the module follows the contract (warnings allowed), 1 when
/// it has errors, 2 when it cannot be read.
fn run_module_check(args: &ModuleCheckArgs) -> ExitCode {
    use crate::contract::check;
    let report = check::read_module(&args.dir).and_then(|files| check::check(&files, args.role));
    let report = match report {
        Ok(r) => r,
        Err(message) => {
            eprintln!("error: {message}");
            return ExitCode::from(2);
        }
    };
    match args.output {
        Output::Text => print!("{}", report.render_text()),
        Output::Json => println!(
            "{}",
            serde_json::to_string_pretty(&report).expect("a report always serializes")
        ),
    }
    if report.errors() > 0 {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    }
}

fn bind(flag: &str, text: &str) -> Result<Option<std::net::SocketAddr>, Misuse> {
    if text.is_empty() || text == "0" {
        return Ok(None);
    }
    text.parse().map(Some).map_err(|e| {
        Misuse(format!(
            "{flag} {text:?}: {e}; use HOST:PORT, or an empty value to turn it off"
        ))
    })
}

/// How long the passes under way when `captf manager` is told to stop (SIGTERM or SIGINT)
/// may go on: a pass does not wait inside, so it ends in well under a second, or a few
/// seconds when it reads a large state. This leaves the Lease's release and the exit ten
/// seconds of the Deployment's `terminationGracePeriodSeconds` (30) before the kubelet's
/// SIGKILL.
pub const SHUTDOWN_GRACE: std::time::Duration = std::time::Duration::from_secs(20);

fn run_manager(args: &ManagerArgs) -> Result<(), Misuse> {
    crate::telemetry::init();
    let cfg = crate::controller::ManagerConfig {
        namespace: args.namespace.clone(),
        watch_filter: args.watch_filter.clone(),
        concurrency: args.concurrency.max(1),
        settings: Settings {
            backoff: Backoff {
                base: args.destroy_backoff_base,
                max: args.destroy_backoff_max,
            },
            ..Settings::default()
        },
        templates_dir: args.templates_dir.clone(),
        state_proxy: args.state_proxy,
        state_proxy_image: Some(args.state_proxy_image.trim().to_string())
            .filter(|i| !i.is_empty()),
        leader_elect: args.leader_elect,
        metrics_addr: bind("--metrics-bind-address", &args.metrics_bind_address)?,
        metrics_secure: args.metrics_secure,
        metrics_cert_dir: args.metrics_cert_dir.clone(),
        health_addr: bind(
            "--health-probe-bind-address",
            &args.health_probe_bind_address,
        )?,
        manager_namespace: args.manager_namespace.clone(),
        identity: std::env::var("POD_NAME")
            .or_else(|_| std::env::var("HOSTNAME"))
            .unwrap_or_else(|_| "captf-manager".into()),
        rbac_sweep_every: args.rbac_sweep_interval,
        max_state_reads: usize::from(args.max_state_reads),
        state_read_starved_after: args.state_read_starved_after,
        stalled_after: args.stalled_after,
        metrics_object_info: args.metrics_object_info,
        provision: args.provision,
        disposal_retention: args.disposal_retention,
        workload_cleanup: args.workload_cleanup,
        workload_cleanup_give_up_after: args.workload_cleanup_give_up_after,
        shutdown_grace: SHUTDOWN_GRACE,
        ..Default::default()
    };
    let runtime = tokio::runtime::Runtime::new()
        .map_err(|e| Misuse(format!("cannot start the async runtime: {e}")))?;
    let result = runtime.block_on(async move {
        // Both handlers are installed before anything else: a container's PID 1 ignores
        // the signals it has no handler for, and until then SIGINT or SIGTERM would kill
        // the process where it is.
        let shutdown = stop_signal().map_err(|e| {
            Misuse(format!(
                "cannot install the handlers of SIGTERM and SIGINT: {e}"
            ))
        })?;
        let (client, _) = crate::io::client::connect(crate::io::client::Sender::Manager)
            .await
            .map_err(Misuse)?;
        crate::controller::run(client, cfg, shutdown)
            .await
            .map_err(|e| Misuse(e.to_string()))
    });
    // What is left (the probe server) is dropped, not waited for.
    runtime.shutdown_timeout(std::time::Duration::from_secs(1));
    result
}

/// Resolves at the first SIGTERM (the kubelet stopping the Pod) or SIGINT (Ctrl-C).
fn stop_signal() -> std::io::Result<impl std::future::Future<Output = ()> + Send + 'static> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    Ok(async move {
        let name = tokio::select! {
            _ = term.recv() => "SIGTERM",
            _ = int.recv() => "SIGINT",
        };
        tracing::info!(signal = name, "stopping");
    })
}

fn run_release_assets(args: &ReleaseAssetsArgs) -> Result<(), Misuse> {
    let written = crate::ops::release::write(&args.dir, &args.version, &args.image)
        .map_err(|e| Misuse(e.to_string()))?;
    for path in written {
        println!("{}", path.display());
    }
    Ok(())
}

/// The CRDs as one multi-document YAML stream.
pub fn crds_yaml() -> String {
    let mut out = String::new();
    for crd in crate::api::crds() {
        out.push_str("---\n");
        match serde_saphyr::to_string(&crd) {
            Ok(yaml) => out.push_str(&yaml),
            Err(e) => out.push_str(&format!(
                "# cannot serialize {:?}: {e}\n",
                crd.metadata.name
            )),
        }
    }
    out
}

/// Runs `f` with a client from the current kubeconfig (or in-cluster).
fn with_client<T>(
    f: impl AsyncFnOnce(kube::Client, String) -> Result<T, Misuse>,
) -> Result<T, Misuse> {
    with_client_of(crate::io::client::Sender::Cli, f)
}

/// [`with_client`], its requests sent as `sender`'s.
fn with_client_of<T>(
    sender: crate::io::client::Sender,
    f: impl AsyncFnOnce(kube::Client, String) -> Result<T, Misuse>,
) -> Result<T, Misuse> {
    let runtime = tokio::runtime::Runtime::new()
        .map_err(|e| Misuse(format!("cannot start the async runtime: {e}")))?;
    runtime.block_on(async move {
        let (client, ns) = crate::io::client::connect(sender).await.map_err(Misuse)?;
        f(client, ns).await
    })
}

fn run_state_proxy(args: &StateProxyArgs) -> Result<(), Misuse> {
    let scope = crate::proxy::Scope {
        namespace: args.namespace.clone(),
        suffix: args.suffix.clone(),
    };
    with_client_of(crate::io::client::Sender::StateProxy, async |client, _| {
        crate::proxy::run(scope, &args.port_file, client)
            .await
            .map_err(Misuse)
    })
}

fn run_restore(args: &RestoreArgs) -> Result<(), Misuse> {
    let source = match (&args.from_file, &args.from_errored) {
        (Some(p), _) => crate::ops::RestoreSource::File(p.clone()),
        (None, Some(s)) => crate::ops::RestoreSource::Errored(s.clone()),
        (None, None) => crate::ops::RestoreSource::Backup,
    };
    let out = with_client(async |client, default_ns| {
        let ns = args.namespace.clone().unwrap_or(default_ns);
        crate::ops::restore(&client, &ns, &args.target, source, args.force)
            .await
            .map_err(|e| Misuse(e.to_string()))
    })?;
    println!("{out}");
    Ok(())
}

fn run_orphans(args: &OrphansArgs) -> Result<(), Misuse> {
    let list = with_client(async |client, _| {
        crate::ops::orphans(&client, args.namespace.as_deref(), &args.manager_namespace)
            .await
            .map_err(|e| Misuse(e.to_string()))
    })?;
    match args.output {
        Output::Json => println!("{}", serde_json::to_string_pretty(&list)?),
        Output::Text if list.is_empty() => {
            println!("nothing CAPTF made is left of an object that is gone")
        }
        Output::Text => {
            println!(
                "{:<20} {:<58} {:<19} {:<22} {:<20} ABANDONED-AT",
                "NAMESPACE", "WHAT", "ROLE", "KIND", "NAME"
            );
            for o in &list {
                let what = match &o.secret_namespace {
                    Some(there) => format!("{}/{there}/{}", o.resource, o.object),
                    None => format!("{}/{}", o.resource, o.object),
                };
                println!(
                    "{:<20} {:<58} {:<19} {:<22} {:<20} {}",
                    o.namespace,
                    what,
                    o.role,
                    o.kind,
                    o.name,
                    o.abandoned_at.as_deref().unwrap_or("-")
                );
            }
        }
    }
    Ok(())
}

fn run_explain(args: &ExplainArgs) -> Result<(), Misuse> {
    let settings = Settings {
        backoff: Backoff {
            base: args.destroy_backoff_base,
            max: args.destroy_backoff_max,
        },
        ..Settings::default()
    };
    let items = if args.files.is_empty() {
        with_client(async |client, _| {
            crate::explain::live::explain(&client, args.namespace.as_deref(), &settings)
                .await
                .map_err(|e| Misuse(e.to_string()))
        })?
    } else {
        let loaded = load::load_paths(&args.files)?;
        let inv = Inventory::from_loaded(loaded)?;
        let now = args.now.unwrap_or_else(Timestamp::now);
        let items = explain::explain(&inv, now, &settings);
        match &args.namespace {
            Some(ns) => items.into_iter().filter(|e| &e.namespace == ns).collect(),
            None => items,
        }
    };
    let items = match &args.cluster {
        Some(c) => {
            let kept = explain::of_cluster(items, c);
            if kept.is_empty() {
                return Err(Misuse(format!(
                    "no TerraformCluster, TerraformMachine or TerraformMachinePool of Cluster {c}{} (owned by it, or labelled {}={c})",
                    args.namespace
                        .as_deref()
                        .map(|n| format!(" in namespace {n}"))
                        .unwrap_or_default(),
                    crate::api::names::CAPI_CLUSTER_NAME_LABEL
                )));
            }
            kept
        }
        None => items,
    };
    match (args.output, args.if_deleted) {
        (Output::Json, _) => println!("{}", serde_json::to_string_pretty(&items)?),
        (Output::Text, false) => print!("{}", explain::render_text(&items)),
        (Output::Text, true) => print!("{}", explain::render_if_deleted(&items)),
    }
    Ok(())
}

fn run_inspect(args: &InspectArgs) -> Result<(), Misuse> {
    let verdict = crate::ops::inspect::inspect(&args.secret_files, args.object.as_deref())
        .map_err(|e| Misuse(e.to_string()))?;
    match args.output {
        Output::Json => println!("{}", serde_json::to_string_pretty(&verdict)?),
        Output::Text => {
            println!("{}: {}", verdict.reason.as_str(), verdict.message);
            if let Some(n) = verdict.managed_instances {
                println!("managed resource instances: {n}");
            }
            if let (Some(l), Some(s)) = (&verdict.lineage, verdict.serial) {
                println!("lineage {l}, serial {s}");
            }
        }
    }
    Ok(())
}
