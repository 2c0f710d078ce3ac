//! `cargo bench --bench dashboard`: records the manager's `/metrics` through an ordinary
//! afternoon, for the picture of the Grafana dashboard in docs/11-watching-captf.md. Not a
//! measurement: a recording, on the real control plane with the real `terraform`.
//!
//! Eight TerraformMachines are applied by the manager (the first two with a module whose
//! first destroy fails); then all are deleted. The first one's state is lost after its
//! failed destroy, so it is held (`StateLost`) until it is abandoned a minute later; the
//! second's retry succeeds. `/metrics` is read every `CAPTF_DASHBOARD_EVERY_MS` (1000) and
//! written, one JSON line per read (`{"t": unix seconds, "text": …}`), to
//! `target/dashboard/recording.jsonl`; then `docs/dashboard/render.py` draws the dashboard
//! from it:
//!
//! ```text
//! python3 docs/dashboard/render.py target/dashboard/recording.jsonl docs/images/dashboard.png
//! ```

#[path = "common/mod.rs"]
mod common;
use captf_test_support as support;

use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use captf::api::names;
use support::{Env, Tfm, module};

const MACHINES: usize = 8;

fn main() {
    if !support::on_path("terraform") {
        eprintln!(
            "error: `terraform` is not on PATH; the recording runs the real applies and destroys"
        );
        std::process::exit(2);
    }
    let every = Duration::from_millis(common::env_usize("CAPTF_DASHBOARD_EVERY_MS", 1000) as u64);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    runtime.block_on(record(every));
}

async fn scrape(port: u16) -> Option<String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .ok()?;
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .await
        .ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).await.ok()?;
    Some(out.split_once("\r\n\r\n")?.1.to_string())
}

async fn record(every: Duration) {
    let mut env = Env::builder("dashboard").start().await;
    let port = support::ports::free_port();
    env.config.metrics_addr = Some(format!("127.0.0.1:{port}").parse().expect("addr"));
    env.config.health_addr = env.config.metrics_addr;
    env.config.provision = true;
    env.config.settings.backoff.base = Duration::from_secs(20);
    env.config.settings.backoff.max = Duration::from_secs(80);
    env.config.rbac_sweep_every = Duration::from_secs(10);
    env.start_manager();
    let lines = Arc::new(Mutex::new(Vec::<String>::new()));
    let recorder = {
        let lines = lines.clone();
        tokio::spawn(async move {
            loop {
                if let Some(text) = scrape(port).await {
                    let t = jiff::Timestamp::now().as_millisecond() as f64 / 1000.0;
                    let line = serde_json::json!({"t": t, "text": text}).to_string();
                    lines.lock().expect("lines").push(line);
                }
                tokio::time::sleep(every).await;
            }
        })
    };
    env.create_cluster("prod").await;
    env.mark_cluster_ready("prod").await;
    let names: Vec<String> = (1..=MACHINES).map(|i| format!("web-{i}")).collect();
    let provisions = names.iter().enumerate().map(|(i, name)| {
        let env = &env;
        async move {
            let fails = if i < 2 { 1 } else { 0 };
            env.provision::<Tfm>(name, "prod", &module(fails)).await;
        }
    });
    futures::future::join_all(provisions).await;
    eprintln!("dashboard: {MACHINES} machines provisioned; deleting them");
    tokio::time::sleep(Duration::from_secs(20)).await;
    for name in &names {
        env.delete::<Tfm>(name).await;
    }
    // web-1's first destroy fails; its state is lost before the retry: held.
    support::wait_for(
        "web-1's failed destroy",
        Duration::from_secs(300),
        || async {
            env.condition::<Tfm>("web-1", "Deleting")
                .await
                .is_some_and(|(_, r, _)| r == "DestroyFailed")
        },
    )
    .await;
    env.lose_secret(&names::state_secret_name("web-1.tfm"))
        .await;
    for name in names.iter().skip(1) {
        env.wait_gone::<Tfm>(name, Duration::from_secs(600)).await;
    }
    eprintln!("dashboard: all but web-1 released; web-1 held a minute, then abandoned");
    tokio::time::sleep(Duration::from_secs(60)).await;
    env.abandon::<Tfm>("web-1").await;
    env.wait_gone::<Tfm>("web-1", Duration::from_secs(120))
        .await;
    tokio::time::sleep(Duration::from_secs(30)).await;
    recorder.abort();
    let dir = support::repo_root().join("target/dashboard");
    std::fs::create_dir_all(&dir).expect("target/dashboard");
    let path = dir.join("recording.jsonl");
    let mut f = std::fs::File::create(&path).expect("the recording");
    for l in lines.lock().expect("lines").iter() {
        writeln!(f, "{l}").expect("write");
    }
    println!(
        "dashboard: {} reads of /metrics in {}\n  python3 docs/dashboard/render.py {} docs/images/dashboard.png",
        lines.lock().expect("lines").len(),
        path.display(),
        path.display()
    );
    env.shutdown().await;
}
