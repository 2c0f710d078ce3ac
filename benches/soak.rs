//! `cargo bench --bench soak`: a simulated week of a fleet's ordinary life, to see whether
//! the manager's memory and what it keeps stay flat. `CAPTF_SOAK_MACHINES` (100)
//! TerraformMachines and `CAPTF_SOAK_POOLS` (10) TerraformMachinePools, each owned by its
//! Cluster API Machine or MachinePool (reconciled by Cluster API's own controllers in the
//! control plane) with its bootstrap data Secret, are provisioned by `captf manager`
//! (its own process, through the fault proxy that counts its requests); the Jobs' Pods
//! run on the local kubelet, `CAPTF_SOAK_JOBS` (8) at a time, with the stand-in runner
//! (`benches/standin/terraform`, which writes the state an apply leaves at once).
//!
//! Then every simulated 10 minutes (`CAPTF_SOAK_TICK_MS`, 1,000 ms of real time) for
//! `CAPTF_SOAK_DAYS` (7) simulated days, every pool's bootstrap data Secret is rewritten
//! with a new token, as a bootstrap provider rotating its join tokens does: a pool's
//! bootstrap data is an input of its module, so each rotation is a re-apply, and rotations
//! that come while a pool's apply runs are taken by its next one. The manager's own
//! resyncs come at their real period (every object looked at again within 10 minutes),
//! not at the simulated one. At the end of each simulated day it prints the manager's
//! RSS and peak RSS, its CPU, its reads and writes that day, and what its caches hold of
//! the namespace (the Jobs, Pods, Secrets, Events and Leases there, alive now); at the
//! end, whether the last rotation's applies all ended, and the growth from the first day
//! to the last. The manager logs to `captf-soak-manager.log` in the temp directory.

#[path = "common/mod.rs"]
mod common;
use captf_test_support as support;

use std::collections::{BTreeMap, BTreeSet};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use captf::api::names::{self, Kind};
use captf::api::{TerraformMachinePool, TerraformObject};
use futures::StreamExt;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Event, Pod, Secret};
use kube::ResourceExt;
use kube::api::{Api, ListParams, Patch, PatchParams};
use kube::runtime::watcher;
use serde_json::json;
use support::{Env, Tfm, module};

const CLUSTER: &str = "soak";
const TICKS_PER_DAY: usize = 24 * 6;

fn main() {
    let machines = common::env_usize("CAPTF_SOAK_MACHINES", 100);
    let pools = common::env_usize("CAPTF_SOAK_POOLS", 10);
    let jobs = common::env_usize("CAPTF_SOAK_JOBS", 8);
    let days = common::env_usize("CAPTF_SOAK_DAYS", 7);
    let tick = Duration::from_millis(common::env_usize("CAPTF_SOAK_TICK_MS", 1000) as u64);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    if let Err(e) = runtime.block_on(soak(machines, pools, jobs, days, tick)) {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}

/// One simulated day's figures.
struct Day {
    rss_kib: u64,
    hwm_kib: u64,
    cpu: f64,
    reads: u64,
    writes: u64,
    alive: Alive,
    applies: usize,
}

/// What the manager's caches hold of the namespace: what is alive there.
#[derive(Default)]
struct Alive {
    jobs: usize,
    unfinished: usize,
    pods: usize,
    secrets: usize,
    events: usize,
    leases: usize,
}

async fn soak(
    machines: usize,
    pools: usize,
    jobs: usize,
    days: usize,
    tick: Duration,
) -> Result<(), String> {
    println!(
        "soak bench: {machines} TerraformMachines and {pools} TerraformMachinePools, the stand-in runner, {jobs} Pods at a time; every pool's bootstrap data rotated every simulated 10 minutes ({} ms) for {days} simulated days",
        tick.as_millis()
    );
    let max_pods = format!("--max-pods={jobs}");
    let standin_path = format!(
        "--image-env=PATH={}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        support::repo_root().join("benches/standin").display()
    );
    let kubelet_args = [max_pods.as_str(), standin_path.as_str()];
    let kcm_args = ["--kube-api-qps=100", "--kube-api-burst=150"];
    let env = Env::builder("soak")
        .tuned(&kubelet_args, &kcm_args, true)
        .start()
        .await;
    env.create_cluster(CLUSTER).await;
    env.mark_cluster_ready(CLUSTER).await;

    let log_path = env.dir.join("manager.log");
    let log = std::fs::File::create(&log_path).map_err(|e| e.to_string())?;
    let mut manager: Child = Command::new(env!("CARGO_BIN_EXE_captf"))
        .args([
            "manager",
            "--metrics-bind-address=",
            "--health-probe-bind-address=",
            "--manager-namespace",
            &env.manager_ns,
            "--namespace",
            &env.ns,
        ])
        .env("KUBECONFIG", env.proxy.kubeconfig_path())
        .env("RUST_LOG", "info,kube=warn")
        .env("CAPTF_LOG_FORMAT", "json")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::from(log))
        .spawn()
        .map_err(|e| format!("cannot start the manager: {e}"))?;
    let result = run(&env, &mut manager, (machines, pools), days, tick).await;
    let _ = manager.kill();
    let _ = manager.wait();
    common::keep_manager_log(&log_path, "captf-soak-manager.log");
    env.shutdown().await;
    result
}

async fn run(
    env: &Env,
    manager: &mut Child,
    (machines, pools): (usize, usize),
    days: usize,
    tick: Duration,
) -> Result<(), String> {
    let pid = manager.id();
    let client = common::bench_client(env.kubeconfig_path()).await;
    let machine_names: Vec<String> = (0..machines).map(|i| format!("m-{i:05}")).collect();
    let pool_names: Vec<String> = (0..pools).map(|i| format!("p-{i:03}")).collect();
    let applies = Arc::new(Mutex::new(BTreeSet::<String>::new()));
    let watch = tokio::spawn(count_apply_jobs(
        client.clone(),
        env.ns.clone(),
        applies.clone(),
    ));

    // Provision everything at once, as Cluster API asks.
    let t0 = Instant::now();
    let machine_module = format!(
        "{}{}",
        module(0),
        support::contract_outputs(Kind::TerraformMachine)
    );
    let pool_module = format!(
        "{}{}",
        module(0),
        support::contract_outputs(Kind::TerraformMachinePool)
    );
    futures::stream::iter(machine_names.iter())
        .for_each_concurrent(16, |name| {
            let module = &machine_module;
            async move {
                let secret = format!("{name}-bootstrap");
                env.create_bootstrap_secret(CLUSTER, &secret, &format!("#cloud-config {name}"))
                    .await;
                let uid = env.create_machine(name, CLUSTER, Some(&secret)).await;
                env.create_owned::<Tfm>(
                    name,
                    CLUSTER,
                    &[("Machine", name, &uid, true)],
                    module,
                    json!({}),
                )
                .await;
            }
        })
        .await;
    futures::stream::iter(pool_names.iter())
        .for_each_concurrent(16, |name| {
            let module = &pool_module;
            async move {
                let secret = format!("{name}-bootstrap");
                env.create_bootstrap_secret(CLUSTER, &secret, &token(name, 0))
                    .await;
                let uid = env.create_machine_pool(name, CLUSTER, 2, &secret).await;
                env.create_owned::<TerraformMachinePool>(
                    name,
                    CLUSTER,
                    &[("MachinePool", name, &uid, true)],
                    module,
                    json!({}),
                )
                .await;
            }
        })
        .await;
    let all = machines + pools;
    loop {
        let done = provisioned::<Tfm>(&client, &env.ns).await
            + provisioned::<TerraformMachinePool>(&client, &env.ns).await;
        if done >= all {
            break;
        }
        if let Ok(Some(st)) = manager.try_wait() {
            return Err(format!("the manager exited ({st})"));
        }
        if t0.elapsed() > Duration::from_secs(600 + all as u64 * 3) {
            return Err(format!(
                "{done} of {all} objects provisioned after {:?}",
                t0.elapsed()
            ));
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    println!(
        "  provisioned {all} objects in {:.1}s",
        t0.elapsed().as_secs_f64()
    );

    let requests = env.proxy.request_log();
    let mut before = counted(&requests.snapshot_by_client());
    let mut cpu_before = common::cpu_seconds(&format!("/proc/{pid}/stat"), 11);
    let day0 = day(
        env,
        &client,
        pid,
        (0, 0),
        0.0,
        applies.lock().map(|a| a.len()).unwrap_or(0),
    )
    .await;
    print_header();
    print_day(0, &day0);
    let mut figures = vec![day0];
    let mut next = Instant::now();
    for d in 1..=days {
        for t in 0..TICKS_PER_DAY {
            next += tick;
            let n = (d - 1) * TICKS_PER_DAY + t + 1;
            futures::stream::iter(pool_names.iter())
                .for_each_concurrent(16, |name| {
                    let secrets: Api<Secret> = Api::namespaced(client.clone(), &env.ns);
                    async move {
                        let patch = json!({"stringData": {"value": token(name, n)}});
                        if let Err(e) = secrets
                            .patch(
                                &format!("{name}-bootstrap"),
                                &PatchParams::default(),
                                &Patch::Merge(&patch),
                            )
                            .await
                        {
                            eprintln!("  rotation {n} of {name}: {e}");
                        }
                    }
                })
                .await;
            if let Ok(Some(st)) = manager.try_wait() {
                return Err(format!("the manager exited ({st}) on simulated day {d}"));
            }
            tokio::time::sleep_until(next.into()).await;
        }
        let now = counted(&requests.snapshot_by_client());
        let cpu = common::cpu_seconds(&format!("/proc/{pid}/stat"), 11);
        let made = applies.lock().map(|a| a.len()).unwrap_or(0);
        let f = day(
            env,
            &client,
            pid,
            (now.0 - before.0, now.1 - before.1),
            cpu - cpu_before,
            made,
        )
        .await;
        print_day(d, &f);
        figures.push(f);
        before = now;
        cpu_before = cpu;
    }

    // The last rotation's applies: every pool applied with its last bootstrap data.
    let t1 = Instant::now();
    let settled = loop {
        let a = alive(&client, &env.ns).await;
        if a.unfinished == 0 {
            break true;
        }
        if t1.elapsed() > Duration::from_secs(600) {
            break false;
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
    };
    let last_ok = provisioned::<TerraformMachinePool>(&client, &env.ns).await;
    watch.abort();
    println!();
    println!(
        "After the last rotation: apply Jobs all ended: {}; {last_ok} of {pools} pools Provisioned; {} apply Jobs made in the week ({:.2} per pool per simulated day)",
        if settled { "yes" } else { "NO (after 10 min)" },
        figures.last().map(|f| f.applies).unwrap_or(0) - figures[0].applies,
        (figures.last().map(|f| f.applies).unwrap_or(0) - figures[0].applies) as f64
            / (pools.max(1) * days.max(1)) as f64
    );
    if let (Some(first), Some(last)) = (figures.get(1), figures.last()) {
        let mib = |k: u64| k as f64 / 1024.0;
        println!(
            "From the first simulated day to the last: RSS {:.1} -> {:.1} MiB ({:+.1} %); Jobs alive {} -> {}; Secrets {} -> {}; Events {} -> {}",
            mib(first.rss_kib),
            mib(last.rss_kib),
            (last.rss_kib as f64 / first.rss_kib.max(1) as f64 - 1.0) * 100.0,
            first.alive.jobs,
            last.alive.jobs,
            first.alive.secrets,
            last.alive.secrets,
            first.alive.events,
            last.alive.events
        );
    }
    Ok(())
}

/// The bootstrap data of the pool `name` at rotation `n`: a join token of its own.
fn token(name: &str, n: usize) -> String {
    format!("#cloud-config {name}\n# join token {n:06}")
}

/// The manager's reads and writes so far, from the proxy's counts.
fn counted(by_client: &BTreeMap<(String, String, String, String), u64>) -> (u64, u64) {
    let mut out = (0, 0);
    for ((_, verb, _, _), count) in by_client {
        if captf_faultproxy::WRITE_VERBS.contains(&verb.as_str()) {
            out.1 += count;
        } else {
            out.0 += count;
        }
    }
    out
}

async fn day(
    env: &Env,
    client: &kube::Client,
    pid: u32,
    (reads, writes): (u64, u64),
    cpu: f64,
    applies: usize,
) -> Day {
    Day {
        rss_kib: common::proc_kib(pid, "VmRSS:").unwrap_or(0),
        hwm_kib: common::proc_kib(pid, "VmHWM:").unwrap_or(0),
        cpu,
        reads,
        writes,
        alive: alive(client, &env.ns).await,
        applies,
    }
}

fn print_header() {
    println!();
    println!(
        "{:>4} {:>9} {:>9} {:>8} {:>8} {:>8} {:>6} {:>11} {:>6} {:>8} {:>7} {:>7} {:>9}",
        "day",
        "RSS MiB",
        "peak MiB",
        "CPU s",
        "reads",
        "writes",
        "Jobs",
        "unfinished",
        "Pods",
        "Secrets",
        "Events",
        "Leases",
        "applies"
    );
}

fn print_day(d: usize, f: &Day) {
    println!(
        "{d:>4} {:>9.1} {:>9.1} {:>8.1} {:>8} {:>8} {:>6} {:>11} {:>6} {:>8} {:>7} {:>7} {:>9}",
        f.rss_kib as f64 / 1024.0,
        f.hwm_kib as f64 / 1024.0,
        f.cpu,
        f.reads,
        f.writes,
        f.alive.jobs,
        f.alive.unfinished,
        f.alive.pods,
        f.alive.secrets,
        f.alive.events,
        f.alive.leases,
        f.applies
    );
}

/// The objects of the kinds the manager caches that are alive in the namespace.
async fn alive(client: &kube::Client, ns: &str) -> Alive {
    let lp = ListParams::default();
    let jobs = Api::<Job>::namespaced(client.clone(), ns)
        .list(&lp)
        .await
        .map(|l| l.items)
        .unwrap_or_default();
    let unfinished = jobs
        .iter()
        .filter(|j| !common::job_is(j, &["Complete", "Failed"]))
        .count();
    Alive {
        jobs: jobs.len(),
        unfinished,
        pods: count::<Pod>(client, ns).await,
        secrets: count::<Secret>(client, ns).await,
        events: count::<Event>(client, ns).await,
        leases: count::<Lease>(client, ns).await,
    }
}

/// How many objects of kind `K` the namespace holds (0 when the list fails).
async fn count<K>(client: &kube::Client, ns: &str) -> usize
where
    K: kube::Resource<Scope = kube::core::NamespaceResourceScope, DynamicType = ()>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug,
{
    Api::<K>::namespaced(client.clone(), ns)
        .list_metadata(&ListParams::default())
        .await
        .map_or(0, |l| l.items.len())
}

/// How many objects of kind `K` are `Provisioned=True`.
async fn provisioned<K: TerraformObject>(client: &kube::Client, ns: &str) -> usize {
    let Ok(list) = Api::<K>::namespaced(client.clone(), ns)
        .list(&ListParams::default())
        .await
    else {
        return 0;
    };
    list.items
        .iter()
        .filter(|o| {
            o.status().is_some_and(|s| {
                s.conditions
                    .iter()
                    .any(|c| c.type_ == "Provisioned" && c.status == "True")
            })
        })
        .count()
}

/// Counts the apply Jobs the manager makes (their names, once each).
async fn count_apply_jobs(client: kube::Client, ns: String, seen: Arc<Mutex<BTreeSet<String>>>) {
    let api: Api<Job> = Api::namespaced(client, &ns);
    let stream = watcher(api, watcher::Config::default());
    futures::pin_mut!(stream);
    while let Some(ev) = stream.next().await {
        let (Ok(watcher::Event::Apply(j)) | Ok(watcher::Event::InitApply(j))) = ev else {
            continue;
        };
        if j.labels().get(names::LABEL_OPERATION).map(String::as_str)
            == Some(names::OPERATION_APPLY)
        {
            seen.lock()
                .unwrap_or_else(|e| e.into_inner())
                .insert(j.name_any());
        }
    }
}
