//! `captf-testserver --kubeconfig PATH`: the test API server and the local Job runner as
//! one long-running process, standing in for a real cluster. It lets the end-to-end tests'
//! real-cluster mode (`CAPTF_E2E_KUBECONFIG`) be exercised on a machine without one: the
//! tests then reach this server only through the kubeconfig, as they would a cluster.
//!
//! Writes the kubeconfig to PATH once the server listens (atomically, so a script may wait
//! for the file), prints the server's address, and serves until SIGTERM or SIGINT. Jobs run
//! as local processes with the host's `terraform` (see the crate's documentation).

use std::path::PathBuf;
use std::time::Duration;

use captf_testserver::{JobRunner, JobRunnerOptions, TestServer};

fn usage() -> ! {
    eprintln!("usage: captf-testserver --kubeconfig PATH");
    std::process::exit(2);
}

fn main() {
    let mut args = std::env::args().skip(1);
    let mut target: Option<PathBuf> = None;
    while let Some(a) = args.next() {
        match a.as_str() {
            "--kubeconfig" => {
                target = Some(args.next().map(PathBuf::from).unwrap_or_else(|| usage()))
            }
            _ => usage(),
        }
    }
    let Some(target) = target else { usage() };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    runtime.block_on(async move {
        let server = TestServer::start().await;
        let runner = JobRunner::start(
            &server,
            JobRunnerOptions {
                extra_env: vec![("CHECKPOINT_DISABLE".into(), "1".into())],
                termination_grace_override: Some(Duration::from_secs(10)),
                ..Default::default()
            },
        );
        let tmp = target.with_extension("tmp");
        let written = std::fs::copy(server.kubeconfig_path(), &tmp)
            .and_then(|_| std::fs::rename(&tmp, &target));
        if let Err(e) = written {
            eprintln!(
                "error: cannot write the kubeconfig to {}: {e}",
                target.display()
            );
            std::process::exit(1);
        }
        println!(
            "captf-testserver: serving {}; kubeconfig written to {}",
            server.url(),
            target.display()
        );
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            .expect("SIGTERM handler");
        tokio::select! {
            _ = term.recv() => {}
            _ = tokio::signal::ctrl_c() => {}
        }
        runner.stop().await;
        server.shutdown().await;
    });
}
