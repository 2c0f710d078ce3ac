//! `cargo bench --bench scale`: N TerraformMachines (500 by default, `CAPTF_SCALE_N`;
//! several, `500,1000,5000`, run one after the other and their figures per deletion
//! printed side by side) deleted at once; the `captf manager` binary runs as its own process against a real
//! control plane (`captf-envtest`), through the fault proxy that counts its requests; the
//! destroy Jobs' Pods run on the local kubelet with the real `terraform`, at most
//! `CAPTF_SCALE_JOBS` (4) at a time (the Node's Pod capacity, `--max-pods`).
//!
//! `CAPTF_SCALE_RUNNER=standin` runs the Pods with `benches/standin/terraform` first on
//! their PATH instead: a stand-in that empties the state at once on a destroy, and writes
//! the state the bench's module would leave on an apply (Terraform is the bottleneck on
//! two cores, not the manager), for N in the thousands. Everything else
//! (the Jobs, their Pods, the runner script, the manager) is as with Terraform; the
//! stand-in takes no lock Lease, so there is no Lease for the cleanup to delete.
//!
//! Setup: one machine is applied for real (the harness's `apply`: inputs Secret, annotations,
//! `terraform apply` through the kubernetes backend); the other N-1 get the same inputs
//! Secret and annotations, and a state Secret cloned from the real one (the same format,
//! the instance paths and lineage rewritten per object), so Terraform runs N destroys and
//! one apply.
//!
//! Measured over the deletion (from the delete to the last release): API requests per
//! deletion by the manager (all the proxy sees: the manager is its only client), the time
//! from each destroy Job's completion to the object's release, the manager's peak RSS
//! (VmHWM), and reconcile passes per second (the manager's `decision` log lines). It also
//! prints the three slowest releases by name and the CPU seconds of the manager, the
//! control plane and the Jobs' processes. The manager logs to
//! `captf-scale-manager.log` in the temp directory, at `CAPTF_SCALE_RUST_LOG` (default
//! `info,kube=warn`). `CAPTF_SCALE_MANAGER_WRAP` runs the manager under a profiler.
//! `CAPTF_SCALE_TIMES=FILE` writes each object's Job-Complete and release times, and the
//! fault proxy's `CAPTF_PROXY_TRACE=FILE` each of the manager's requests with its time.
//!
//! `CAPTF_SCALE_PROVISION=1` lets the manager provision the N objects first, as Cluster
//! API asks for them: the Cluster made ready, then for each object its bootstrap data
//! Secret, its Machine (reconciled by Cluster API's own controllers in the control plane)
//! and the TerraformMachine the Machine owns, all at once, with the manager running
//! (`--provision=true`); the N applies run with the real `terraform`. Measured over the
//! provisioning (from the first create to the last `Provisioned=True`): the manager's
//! requests per provisioning by verb and resource, each object's create → `Provisioned`
//! time, the apply Jobs that existed unfinished at once, the manager's CPU per object and
//! its peak RSS. The deletion of the N provisioned objects is then measured as above. With
//! `CAPTF_SCALE_RUNNER=standin` the applies run the stand-in too.

#[path = "common/mod.rs"]
mod common;
use captf_test_support as support;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::io::Read;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use captf::api::names::{self, Kind};
use futures::StreamExt;
use k8s_openapi::ByteString;
use k8s_openapi::api::batch::v1::Job;
use kube::ResourceExt;
use kube::api::{Api, PostParams};
use kube::runtime::watcher;
use serde_json::{Value, json};
use std::sync::{Arc, Mutex};
use support::{Env, Tfm, backend_labels, module};

fn main() {
    if !support::on_path("terraform") {
        eprintln!("error: `terraform` is not on PATH; the scale bench runs the real destroys");
        std::process::exit(2);
    }
    // One N, or several (`500,1000,5000`), run one after the other, each on a control
    // plane of its own; the per-deletion figures are printed side by side at the end.
    let series: Vec<usize> = match std::env::var("CAPTF_SCALE_N") {
        Err(_) => vec![500],
        Ok(v) => match v
            .split(',')
            .map(|x| x.trim().parse::<usize>().ok().filter(|n| *n > 0))
            .collect::<Option<Vec<usize>>>()
        {
            Some(ns) if !ns.is_empty() => ns,
            _ => {
                eprintln!(
                    "error: CAPTF_SCALE_N is a number of objects, or several separated by commas (500,1000,5000), not `{v}`"
                );
                std::process::exit(2);
            }
        },
    };
    let jobs = common::env_usize("CAPTF_SCALE_JOBS", 4);
    let standin = match std::env::var("CAPTF_SCALE_RUNNER").as_deref() {
        Ok("standin") => true,
        Ok("terraform") | Err(_) => false,
        Ok(other) => {
            eprintln!(
                "error: CAPTF_SCALE_RUNNER is `terraform` (the default) or `standin`, not `{other}`"
            );
            std::process::exit(2);
        }
    };
    let provision = match std::env::var("CAPTF_SCALE_PROVISION").as_deref() {
        Ok("1") => true,
        Ok("0") | Err(_) => false,
        Ok(other) => {
            eprintln!("error: CAPTF_SCALE_PROVISION is 1 or 0, not `{other}`");
            std::process::exit(2);
        }
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let mut runs = Vec::new();
    for n in series {
        match runtime.block_on(bench(n, jobs, standin, provision)) {
            Ok(figures) => runs.push(figures),
            Err(e) => {
                eprintln!("error: {e}");
                std::process::exit(1);
            }
        }
    }
    if runs.len() > 1 {
        side_by_side(&runs);
    }
}

fn name_of(i: usize) -> String {
    format!("m-{i:04}")
}

fn gunzip(bytes: &[u8]) -> String {
    let mut out = String::new();
    flate2::read::GzDecoder::new(bytes)
        .read_to_string(&mut out)
        .expect("gunzip the template state");
    out
}

fn gzip(text: &str) -> Vec<u8> {
    use std::io::Write;
    let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    enc.write_all(text.as_bytes()).expect("gzip");
    enc.finish().expect("gzip")
}

/// A lineage per object (Terraform's are UUIDs; any unique string is read the same way).
fn lineage(i: usize) -> String {
    format!("5ca1e000-0000-4000-8000-{i:012}")
}

/// One run's figures per deletion, for the side-by-side table.
struct PerDeletion {
    n: usize,
    reads: f64,
    writes: f64,
    status_writes: f64,
    passes: f64,
    cpu_ms: f64,
    p95_ms: u128,
    peak_mib: f64,
    seconds: f64,
}

/// The runs of a series side by side: what must not grow with N.
fn side_by_side(runs: &[PerDeletion]) {
    println!();
    println!("Per deletion, side by side (reads, writes, passes and CPU must not grow with N):");
    print!("{:<34}", "N");
    for r in runs {
        print!("{:>12}", r.n);
    }
    println!();
    let line = |what: &str, f: &dyn Fn(&PerDeletion) -> String| {
        print!("{what:<34}");
        for r in runs {
            print!("{:>12}", f(r));
        }
        println!();
    };
    line("reads", &|r| format!("{:.2}", r.reads));
    line("writes", &|r| format!("{:.2}", r.writes));
    line("status writes", &|r| format!("{:.2}", r.status_writes));
    line("passes", &|r| format!("{:.2}", r.passes));
    line("manager CPU ms", &|r| format!("{:.1}", r.cpu_ms));
    line("release p95 ms", &|r| r.p95_ms.to_string());
    line("manager peak RSS MiB", &|r| format!("{:.1}", r.peak_mib));
    line("all released in s", &|r| format!("{:.1}", r.seconds));
}

async fn bench(
    n: usize,
    jobs: usize,
    standin: bool,
    provision: bool,
) -> Result<PerDeletion, String> {
    let started = Instant::now();
    let runner = if standin {
        "a stand-in that writes or empties the state at once (benches/standin/terraform)"
    } else {
        "the real terraform"
    };
    println!(
        "scale bench: {n} TerraformMachines, Jobs' Pods run by the local kubelet with {runner}, {jobs} at a time; kube-controller-manager at {} requests per second",
        common::env_usize("CAPTF_SCALE_KCM_QPS", 20)
    );
    let max_pods = format!("--max-pods={jobs}");
    let standin_path = format!(
        "--image-env=PATH={}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        support::repo_root().join("benches/standin").display()
    );
    let mut kubelet_args = vec![max_pods.as_str()];
    if standin {
        kubelet_args.push(&standin_path);
    }
    // kube-controller-manager's clients at 20 requests per second (its default) make
    // about three Jobs' Pods a second: the stand-in runs take them faster, and a fleet's
    // control plane is given more. `CAPTF_SCALE_KCM_QPS` (default 20, the default of
    // kube-controller-manager; the stand-in runs set it higher).
    let qps = common::env_usize("CAPTF_SCALE_KCM_QPS", 20);
    let kcm_args = [
        format!("--kube-api-qps={qps}"),
        format!("--kube-api-burst={}", qps * 3 / 2),
    ];
    let kcm_args: Vec<&str> = kcm_args.iter().map(String::as_str).collect();
    // With the real Cluster API when it provisions (its Machine controller reconciles the
    // Machines that own the objects); a deletion-only run needs its Cluster CRD only.
    let mut env = Env::builder("scale")
        .tuned(&kubelet_args, &kcm_args, provision)
        .start()
        .await;
    // The product's default deadline: the N destroy Jobs wait for the runner's few slots,
    // and a Job's deadline counts from its start, waiting included (as in Kubernetes).
    // Thousands of Jobs wait longer than that for their turn.
    env.job_timeout_seconds = 1800.max(n as i64);
    let markers = env.markers();
    let uid = env.create_cluster("scale").await;
    let names: Vec<String> = (0..n).map(name_of).collect();
    if provision {
        env.mark_cluster_ready("scale").await;
    } else {
        set_up_applied(&env, &names, &uid, &markers).await?;
        println!(
            "  setup: {n} objects created, 1 applied by terraform, {} states cloned from it ({:.1}s)",
            n - 1,
            started.elapsed().as_secs_f64()
        );
    }
    // The manager, as its own process.
    let log_path = env.dir.join("manager.log");
    let log = std::fs::File::create(&log_path).map_err(|e| e.to_string())?;
    // `CAPTF_SCALE_MANAGER_WRAP` ("heaptrack -o /tmp/heap", "perf record -g -o /tmp/perf.data")
    // runs the manager under a profiler; its figures are then the profiler's process's.
    // The profiler and the manager run in a process group of their own, interrupted
    // together at the end (the profiler then writes its file).
    let wrap: Vec<String> = std::env::var("CAPTF_SCALE_MANAGER_WRAP")
        .map(|w| w.split_whitespace().map(str::to_string).collect())
        .unwrap_or_default();
    let mut command = match wrap.split_first() {
        Some((program, args)) => {
            let mut c = Command::new(program);
            c.args(args)
                .arg(env!("CARGO_BIN_EXE_captf"))
                .process_group(0);
            c
        }
        None => Command::new(env!("CARGO_BIN_EXE_captf")),
    };
    let mut manager: Child = command
        .args([
            "manager",
            if provision {
                "--provision=true"
            } else {
                "--provision=false"
            },
            "--metrics-bind-address=",
            "--health-probe-bind-address=",
            "--destroy-backoff-base",
            "300ms",
            "--destroy-backoff-max",
            "3s",
            "--rbac-sweep-interval",
            "1s",
            "--manager-namespace",
            &env.manager_ns,
            "--namespace",
            &env.ns,
        ])
        .env("KUBECONFIG", env.proxy.kubeconfig_path())
        .env(
            "RUST_LOG",
            std::env::var("CAPTF_SCALE_RUST_LOG").unwrap_or_else(|_| "info,kube=warn".into()),
        )
        .env("CAPTF_LOG_FORMAT", "json")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::from(log))
        .spawn()
        .map_err(|e| format!("cannot start the manager: {e}"))?;
    let pid = manager.id();
    if provision
        && let Err(e) = provisioning(&env, &mut manager, pid, &names, &log_path, jobs).await
    {
        let _ = manager.kill();
        let _ = manager.wait();
        env.shutdown().await;
        return Err(e);
    }
    let result = measure(
        &env,
        &mut manager,
        pid,
        &names,
        &log_path,
        &markers,
        n,
        jobs,
        standin,
    )
    .await;
    if wrap.is_empty() {
        let _ = manager.kill();
    } else {
        let _ = Command::new("kill")
            .args(["-INT", "--", &format!("-{pid}")])
            .status();
    }
    let _ = manager.wait();
    common::keep_manager_log(&log_path, "captf-scale-manager.log");
    env.shutdown().await;
    result
}

/// The objects of a deletion-only run: created, one applied by the real `terraform`, and
/// its state cloned for the others (see the top of this file).
async fn set_up_applied(
    env: &Env,
    objects: &[String],
    uid: &str,
    markers: &Path,
) -> Result<(), String> {
    futures::stream::iter(objects.iter())
        .for_each_concurrent(16, |name| async move {
            env.create_object::<Tfm>(name, "scale", uid, markers).await;
        })
        .await;

    // One real apply; its state Secret is the template of the others.
    let body = module(0);
    env.apply::<Tfm>(&objects[0], &body, markers).await;
    let template_name =
        names::state_secret_name(&names::state_suffix(Kind::TerraformMachine, &objects[0]));
    let template = env
        .secrets()
        .get(&template_name)
        .await
        .map_err(|e| format!("the real apply left no state Secret: {e}"))?;
    let template_state = gunzip(
        &template
            .data
            .as_ref()
            .and_then(|d| d.get(names::TF_STATE_KEY))
            .ok_or("the template state Secret has no tfstate")?
            .0,
    );
    let first_path = format!("{}/{}-", markers.display(), objects[0]);
    futures::stream::iter(objects.iter().enumerate().skip(1))
        .for_each_concurrent(16, |(i, name)| {
            let template = &template;
            let template_state = &template_state;
            let first_path = &first_path;
            let body = &body;
            async move {
                let (_, uid, suffix) = env.write_inputs::<Tfm>(name, body, markers).await;
                let text =
                    template_state.replace(first_path, &format!("{}/{name}-", markers.display()));
                let mut state: Value = serde_json::from_str(&text).expect("state JSON");
                state["lineage"] = json!(lineage(i));
                let serial = state["serial"].as_u64().unwrap_or(1);
                let mut secret = template.clone();
                let meta = &mut secret.metadata;
                meta.uid = None;
                meta.resource_version = None;
                meta.creation_timestamp = None;
                meta.managed_fields = None;
                meta.finalizers = None;
                meta.name = Some(names::state_secret_name(&suffix));
                let labels = meta.labels.get_or_insert_with(Default::default);
                labels.extend(backend_labels(Kind::TerraformMachine, name, &uid));
                labels.insert(names::TF_LABEL_SUFFIX.into(), suffix.clone());
                secret.data = Some(
                    [(
                        names::TF_STATE_KEY.to_string(),
                        ByteString(gzip(&state.to_string())),
                    )]
                    .into(),
                );
                env.secrets()
                    .create(&PostParams::default(), &secret)
                    .await
                    .expect("create a state Secret");
                env.annotate::<Tfm>(
                    name,
                    &[
                        (names::STATE_LINEAGE, Some(lineage(i))),
                        (names::STATE_SERIAL, Some(serial.to_string())),
                    ],
                )
                .await;
            }
        })
        .await;
    Ok(())
}

/// Creates each object as Cluster API would have it made (its bootstrap data Secret, its
/// Machine, the TerraformMachine the Machine owns) with the manager running, waits until
/// every one is `Provisioned`, and prints what the provisioning cost.
async fn provisioning(
    env: &Env,
    manager: &mut Child,
    pid: u32,
    objects: &[String],
    log_path: &Path,
    jobs: usize,
) -> Result<(), String> {
    let n = objects.len();
    let client = common::bench_client(env.kubeconfig_path()).await;
    let log = env.proxy.request_log();
    // The manager's start (its first lists and watches) is not the provisioning's.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let provisioned: Arc<Mutex<HashMap<String, Instant>>> = Arc::default();
    let unfinished: Arc<Mutex<(BTreeSet<String>, usize)>> = Arc::default();
    // When each object's apply Job was first seen Complete (by its owner-name label).
    let completed: Arc<Mutex<HashMap<String, Instant>>> = Arc::default();
    let watchers = [
        tokio::spawn({
            let api: Api<Tfm> = Api::namespaced(client.clone(), &env.ns);
            let provisioned = provisioned.clone();
            async move {
                let stream = watcher(api, watcher::Config::default());
                futures::pin_mut!(stream);
                while let Some(ev) = stream.next().await {
                    let (Ok(watcher::Event::Apply(o)) | Ok(watcher::Event::InitApply(o))) = ev
                    else {
                        continue;
                    };
                    let done = o.status.as_ref().is_some_and(|s| {
                        s.conditions
                            .iter()
                            .any(|c| c.type_ == "Provisioned" && c.status == "True")
                    });
                    if done {
                        let mut p = provisioned.lock().unwrap_or_else(|e| e.into_inner());
                        p.entry(o.name_any()).or_insert_with(Instant::now);
                    }
                }
            }
        }),
        tokio::spawn({
            let api: Api<Job> = Api::namespaced(client.clone(), &env.ns);
            let unfinished = unfinished.clone();
            let completed = completed.clone();
            async move {
                let stream = watcher(api, watcher::Config::default());
                futures::pin_mut!(stream);
                while let Some(ev) = stream.next().await {
                    let mut u = unfinished.lock().unwrap_or_else(|e| e.into_inner());
                    match ev {
                        Ok(watcher::Event::Apply(j) | watcher::Event::InitApply(j)) => {
                            let finished = common::job_is(&j, &["Complete", "Failed"]);
                            let complete = common::job_is(&j, &["Complete"]);
                            if complete && let Some(owner) = j.labels().get(names::LABEL_OWNER_NAME)
                            {
                                completed
                                    .lock()
                                    .unwrap_or_else(|e| e.into_inner())
                                    .entry(owner.clone())
                                    .or_insert_with(Instant::now);
                            }
                            if finished {
                                u.0.remove(&j.name_any());
                            } else {
                                u.0.insert(j.name_any());
                            }
                        }
                        Ok(watcher::Event::Delete(j)) => {
                            u.0.remove(&j.name_any());
                        }
                        _ => {}
                    }
                    u.1 = u.1.max(u.0.len());
                }
            }
        }),
    ];
    tokio::time::sleep(Duration::from_secs(1)).await;
    log.reset();
    let cpu_before = common::cpu_seconds(&format!("/proc/{pid}/stat"), 11);
    let hwm_before = common::proc_kib(pid, "VmHWM:").unwrap_or(0);
    let t0 = Instant::now();
    let module = format!(
        "{}{}",
        module(0),
        support::contract_outputs(Kind::TerraformMachine)
    );
    let created: HashMap<String, Instant> = futures::stream::iter(objects.iter())
        .map(|name| {
            let module = &module;
            async move {
                let secret = format!("{name}-bootstrap");
                env.create_bootstrap_secret("scale", &secret, &format!("#cloud-config {name}"))
                    .await;
                let uid = env.create_machine(name, "scale", Some(&secret)).await;
                env.create_owned::<Tfm>(
                    name,
                    "scale",
                    &[("Machine", name, &uid, true)],
                    module,
                    json!({}),
                )
                .await;
                (name.clone(), Instant::now())
            }
        })
        .buffer_unordered(16)
        .collect()
        .await;
    println!(
        "  created {n} bootstrap Secrets, Machines and TerraformMachines ({:.1}s); waiting for Provisioned",
        t0.elapsed().as_secs_f64()
    );
    wait_for_all(
        manager,
        log_path,
        (n, "provisioned"),
        (t0, Duration::from_secs(300 + n as u64 * 3)),
        || provisioned.lock().unwrap_or_else(|e| e.into_inner()).len(),
        || {
            let at_once = unfinished.lock().unwrap_or_else(|e| e.into_inner()).0.len();
            format!("{at_once} apply Jobs unfinished")
        },
    )
    .await?;
    let window = t0.elapsed();
    let cpu = common::cpu_seconds(&format!("/proc/{pid}/stat"), 11) - cpu_before;
    let hwm = common::proc_kib(pid, "VmHWM:").unwrap_or(0);
    let by_client = log.snapshot_by_client();
    let gets = log.gets_by_name();
    for w in watchers {
        w.abort();
    }
    let provisioned = std::mem::take(&mut *provisioned.lock().unwrap_or_else(|e| e.into_inner()));
    let at_once = unfinished.lock().unwrap_or_else(|e| e.into_inner()).1;
    let mut lat: Vec<Duration> = objects
        .iter()
        .filter_map(|name| {
            Some(
                provisioned
                    .get(name)?
                    .saturating_duration_since(*created.get(name)?),
            )
        })
        .collect();
    lat.sort();
    let completed = std::mem::take(&mut *completed.lock().unwrap_or_else(|e| e.into_inner()));
    let mut after_job: Vec<Duration> = objects
        .iter()
        .filter_map(|name| {
            Some(
                provisioned
                    .get(name)?
                    .saturating_duration_since(*completed.get(name)?),
            )
        })
        .collect();
    after_job.sort();
    let mut per: BTreeMap<(String, String), u64> = BTreeMap::new();
    for ((_, verb, resource, sub), count) in &by_client {
        let res = if sub.is_empty() {
            resource.clone()
        } else {
            format!("{resource}/{sub}")
        };
        *per.entry((verb.to_string(), res)).or_default() += count;
    }
    let is_write = |v: &str| captf_faultproxy::WRITE_VERBS.contains(&v);
    let total = |write: bool| -> u64 {
        per.iter()
            .filter(|((v, _), _)| is_write(v) == write)
            .map(|(_, c)| *c)
            .sum()
    };
    let per_object = |x: u64| x as f64 / n as f64;
    let ms = |d: Duration| format!("{:.0} ms", d.as_secs_f64() * 1000.0);
    println!();
    println!(
        "Provisioned {n} TerraformMachines in {:.1}s (apply Jobs' Pods {jobs} at a time)",
        window.as_secs_f64()
    );
    println!(
        "  reads (get/list/watch) per provisioning {:.2} (target <= 4); writes per provisioning {:.2} (target <= 10)",
        per_object(total(false)),
        per_object(total(true))
    );
    println!(
        "  create -> Provisioned: p50 {} / p95 {} / max {}",
        ms(percentile(&lat, 0.50)),
        ms(percentile(&lat, 0.95)),
        ms(lat.last().copied().unwrap_or_default())
    );
    // The manager's own share: from its apply Job's end to the object's Provisioned
    // condition (the record of the Job, the inputs promoted, the status).
    println!(
        "  apply Job Complete -> Provisioned: p50 {} / p95 {} / max {} ({} of {n} Jobs seen Complete)",
        ms(percentile(&after_job, 0.50)),
        ms(percentile(&after_job, 0.95)),
        ms(after_job.last().copied().unwrap_or_default()),
        after_job.len()
    );
    println!("  apply Jobs unfinished at once, at most: {at_once}");
    println!(
        "  manager CPU {:.1} ms per object; peak RSS {:.1} MiB (before the creates {:.1} MiB)",
        cpu * 1000.0 / n as f64,
        hwm as f64 / 1024.0,
        hwm_before as f64 / 1024.0
    );
    println!(
        "  the manager's requests during the provisioning (verb resource: total / per provisioning):"
    );
    for ((verb, res), count) in &per {
        println!(
            "    {verb:<8} {res:<36} {count:>7}  {:>6.2}",
            per_object(*count)
        );
    }
    println!("  GETs of Secrets by what they are (total / per provisioning):");
    for (what, count) in secret_gets(&gets) {
        println!("    {what:<45} {count:>7}  {:>6.2}", per_object(count));
    }
    println!();
    Ok(())
}

/// The GETs of Secrets in `gets` (by resource and name), by what the Secret is: the
/// names CAPTF and the bench give them.
fn secret_gets(gets: &BTreeMap<(String, String), u64>) -> BTreeMap<&'static str, u64> {
    let mut by = BTreeMap::new();
    for ((resource, name), count) in gets {
        if resource != "secrets" {
            continue;
        }
        let what = if name.ends_with("-bootstrap") {
            "bootstrap data"
        } else if name.starts_with("captf-inputs-") {
            "inputs Secret"
        } else if name.starts_with("tfstate-") {
            "state (base or part)"
        } else if name.starts_with("captf-") && name.contains("-apply-") {
            "an apply attempt's variables"
        } else if name.starts_with("captf-") && name.contains("-destroy-") {
            "a destroy attempt's variables"
        } else {
            "other"
        };
        *by.entry(what).or_default() += count;
    }
    by
}

/// Waits until `done()` counts all `n` objects `what` (provisioned, released), from `t0`
/// for at most `timeout`; fails when the manager exits or the time is up. Prints the count
/// and `progress()` every 10 s.
async fn wait_for_all(
    manager: &mut Child,
    log_path: &Path,
    (n, what): (usize, &str),
    (t0, timeout): (Instant, Duration),
    done: impl Fn() -> usize,
    progress: impl Fn() -> String,
) -> Result<(), String> {
    let mut last_report = Instant::now();
    loop {
        let count = done();
        if count >= n {
            return Ok(());
        }
        if let Ok(Some(st)) = manager.try_wait() {
            return Err(format!(
                "the manager exited ({st}); its log: {}",
                log_path.display()
            ));
        }
        if t0.elapsed() > timeout {
            return Err(format!("{count} of {n} objects {what} after {timeout:?}"));
        }
        if last_report.elapsed() > Duration::from_secs(10) {
            println!(
                "  … {:>4.0}s: {count} {what}, {}",
                t0.elapsed().as_secs_f64(),
                progress()
            );
            last_report = Instant::now();
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Objects with the manager's finalizer, a status, and a protected state Secret.
async fn settled(client: &kube::Client, ns: &str, names: &[String]) -> usize {
    let Ok(objs) = Api::<Tfm>::namespaced(client.clone(), ns)
        .list(&Default::default())
        .await
    else {
        return 0;
    };
    let Ok(secrets) = Api::<k8s_openapi::api::core::v1::Secret>::namespaced(client.clone(), ns)
        .list_metadata(&Default::default())
        .await
    else {
        return 0;
    };
    let protected: BTreeSet<String> = secrets
        .items
        .iter()
        .filter(|s| s.finalizers().iter().any(|f| f == names::PROTECT_FINALIZER))
        .map(|s| s.name_any())
        .collect();
    objs.items
        .iter()
        .filter(|o| {
            let name = o.name_any();
            names.contains(&name)
                && !o.finalizers().is_empty()
                && o.status
                    .as_ref()
                    .is_some_and(|s| s.observed_generation.is_some())
                && protected.contains(&names::state_secret_name(&names::state_suffix(
                    Kind::TerraformMachine,
                    &name,
                )))
        })
        .count()
}

/// What the bench's watches saw, with the moment they saw it.
#[derive(Clone, Default)]
struct Seen(Arc<Mutex<SeenInner>>);

#[derive(Default)]
struct SeenInner {
    jobs: BTreeSet<String>,
    complete: HashMap<String, Instant>,
    released: HashMap<String, Instant>,
}

impl Seen {
    fn lock(&self) -> std::sync::MutexGuard<'_, SeenInner> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn counts(&self) -> (usize, usize, usize) {
        let s = self.lock();
        (s.jobs.len(), s.complete.len(), s.released.len())
    }

    #[allow(clippy::type_complexity)]
    fn take(
        &self,
    ) -> (
        HashMap<String, Instant>,
        HashMap<String, Instant>,
        BTreeSet<String>,
    ) {
        let mut s = self.lock();
        (
            std::mem::take(&mut s.complete),
            std::mem::take(&mut s.released),
            std::mem::take(&mut s.jobs),
        )
    }
}

/// Records when each object's destroy Job is first seen Complete.
async fn watch_jobs(kubeconfig: std::path::PathBuf, ns: String, seen: Seen) {
    let api: Api<Job> = Api::namespaced(common::bench_client(&kubeconfig).await, &ns);
    let stream = watcher(api, watcher::Config::default());
    futures::pin_mut!(stream);
    while let Some(ev) = stream.next().await {
        let (watcher::Event::Apply(j) | watcher::Event::InitApply(j)) = (match ev {
            Ok(e) => e,
            Err(_) => continue,
        }) else {
            continue;
        };
        // Destroy Jobs only (with CAPTF_SCALE_PROVISION, the apply Jobs are there too).
        if j.labels().get(names::LABEL_OPERATION).map(String::as_str)
            != Some(names::OPERATION_DESTROY)
        {
            continue;
        }
        let Some(owner) = j.labels().get(names::LABEL_OWNER_NAME).cloned() else {
            continue;
        };
        let complete = common::job_is(&j, &["Complete"]);
        let mut s = seen.lock();
        s.jobs.insert(j.name_any());
        if complete {
            s.complete.entry(owner).or_insert_with(Instant::now);
        }
    }
}

/// Records when each object goes (its finalizer removed).
async fn watch_releases(kubeconfig: std::path::PathBuf, ns: String, seen: Seen) {
    let api: Api<Tfm> = Api::namespaced(common::bench_client(&kubeconfig).await, &ns);
    let stream = watcher(api, watcher::Config::default());
    futures::pin_mut!(stream);
    while let Some(ev) = stream.next().await {
        if let Ok(watcher::Event::Delete(o)) = ev {
            seen.lock()
                .released
                .entry(o.name_any())
                .or_insert_with(Instant::now);
        }
    }
}

/// The CPU seconds of the control plane (captf-envtest and its children) and of the Jobs'
/// processes (the kubelet's reaped children).
fn control_plane_cpu(env: &Env) -> (f64, f64) {
    let support::Cluster::Envtest(plane) = &env.cluster else {
        return (0.0, 0.0);
    };
    let Some(root) = plane.pid() else {
        return (0.0, 0.0);
    };
    let mut plane_cpu = common::cpu_seconds(&format!("/proc/{root}/stat"), 11);
    let mut jobs = 0.0;
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let path = entry.path().join("stat");
        let stat = std::fs::read_to_string(&path).unwrap_or_default();
        let Some((head, rest)) = stat.rsplit_once(')') else {
            continue;
        };
        let ppid: u32 = rest
            .split_whitespace()
            .nth(1)
            .and_then(|p| p.parse().ok())
            .unwrap_or(0);
        if ppid != root {
            continue;
        }
        let path = path.display().to_string();
        plane_cpu += common::cpu_seconds(&path, 11);
        if head.contains("captf-kubelet") {
            jobs += common::cpu_seconds(&path, 13);
        }
    }
    (plane_cpu, jobs)
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

#[allow(clippy::too_many_arguments)]
async fn measure(
    env: &Env,
    manager: &mut Child,
    pid: u32,
    names: &[String],
    log_path: &Path,
    markers: &Path,
    n: usize,
    jobs: usize,
    standin: bool,
) -> Result<PerDeletion, String> {
    let client = common::bench_client(env.kubeconfig_path()).await;
    let log = env.proxy.request_log();
    // Let the manager take the objects in (finalizer, first status, protected state) and
    // go quiet, so that what follows is the deletion only.
    let t = Instant::now();
    loop {
        if let Ok(Some(st)) = manager.try_wait() {
            return Err(format!(
                "the manager exited ({st}); its log: {}",
                log_path.display()
            ));
        }
        if settled(&client, &env.ns, names).await == n {
            break;
        }
        if t.elapsed() > Duration::from_secs(120 + n as u64 / 10) {
            return Err(format!(
                "only {} of {n} objects were taken in by the manager in {:?}",
                settled(&client, &env.ns, names).await,
                t.elapsed()
            ));
        }
        // Each look lists every object and Secret: less often with thousands.
        tokio::time::sleep(Duration::from_millis(200.max(n as u64 / 5))).await;
    }
    let mut last = log.snapshot().values().sum::<u64>();
    loop {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let now = log.snapshot().values().sum::<u64>();
        // Only watch bookmarks and the RBAC sweep's reads remain.
        if now - last < 20 {
            break;
        }
        last = now;
    }
    println!(
        "  the manager took the {n} objects in ({:.1}s); RSS before the deletion: {:.1} MiB",
        t.elapsed().as_secs_f64(),
        common::proc_kib(pid, "VmRSS:").unwrap_or(0) as f64 / 1024.0
    );

    // The bench's watches start before the deletion (they do not go through the proxy).
    let seen = Seen::default();
    let watchers = [
        tokio::spawn(watch_jobs(
            env.kubeconfig_path().to_path_buf(),
            env.ns.clone(),
            seen.clone(),
        )),
        tokio::spawn(watch_releases(
            env.kubeconfig_path().to_path_buf(),
            env.ns.clone(),
            seen.clone(),
        )),
    ];
    tokio::time::sleep(Duration::from_secs(1)).await;
    // Delete all at once (the bench's own client: not counted as the manager's).
    log.reset();
    let cpu_before = common::cpu_seconds(&format!("/proc/{pid}/stat"), 11);
    let log_offset = std::fs::metadata(log_path).map(|m| m.len()).unwrap_or(0);
    let t0 = Instant::now();
    let wall0 = jiff::Timestamp::now();
    let api: Api<Tfm> = Api::namespaced(client.clone(), &env.ns);
    let deleted: Vec<Result<(), String>> = futures::stream::iter(names.iter())
        .map(|name| {
            let api = api.clone();
            async move {
                api.delete(name, &Default::default())
                    .await
                    .map(|_| ())
                    .map_err(|e| format!("delete {name}: {e}"))
            }
        })
        .buffer_unordered(32)
        .collect()
        .await;
    deleted.into_iter().collect::<Result<Vec<()>, String>>()?;
    println!(
        "  deleted {n} objects at once ({:.1}s); waiting for the releases",
        t0.elapsed().as_secs_f64()
    );

    wait_for_all(
        manager,
        log_path,
        (n, "released"),
        (t0, Duration::from_secs(120 + n as u64 * 2)),
        || seen.counts().2,
        || {
            let (created, complete, _) = seen.counts();
            format!("{created} destroy Jobs created, {complete} complete")
        },
    )
    .await?;
    for w in watchers {
        w.abort();
    }
    let (complete_seen, gone, jobs_created) = seen.take();
    let window = t0.elapsed();
    let wall1 = jiff::Timestamp::now();
    // The runner RBAC goes with the sweep once nothing is left: part of the deletions' cost.
    let sas: Api<k8s_openapi::api::core::v1::ServiceAccount> =
        Api::namespaced(client.clone(), &env.ns);
    let swept = tokio::time::timeout(Duration::from_secs(10), async {
        while !matches!(sas.get_opt(names::RUNNER_NAME).await, Ok(None)) {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await
    .is_ok();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let peak_kib = common::proc_kib(pid, "VmHWM:").unwrap_or(0);
    // CPU seconds since each process started: the manager's; the control plane's
    // (captf-envtest with etcd, and its children kube-apiserver, kube-controller-manager
    // and the kubelet); the Jobs' processes (reaped children of the kubelet).
    let cpu_manager = common::cpu_seconds(&format!("/proc/{pid}/stat"), 11);
    let (cpu_plane, cpu_jobs) = control_plane_cpu(env);
    let by_client = log.snapshot_by_client();

    // (a) requests per deletion.
    let mut per: BTreeMap<(String, String), u64> = BTreeMap::new();
    let mut clients: BTreeMap<String, (u64, u64)> = BTreeMap::new();
    let is_write = |v: &str| captf_faultproxy::WRITE_VERBS.contains(&v);
    for ((client, verb, resource, sub), count) in &by_client {
        let e = clients.entry(client.clone()).or_default();
        if is_write(verb) {
            e.0 += count;
        } else {
            e.1 += count;
        }
        {
            let res = if sub.is_empty() {
                resource.clone()
            } else {
                format!("{resource}/{sub}")
            };
            *per.entry((verb.to_string(), res)).or_default() += count;
        }
    }
    let sum = |f: &dyn Fn(&str, &str) -> bool| -> u64 {
        per.iter()
            .filter(|((v, r), _)| f(v, r))
            .map(|(_, c)| *c)
            .sum()
    };
    let object_resources = [
        "terraformmachines",
        "secrets",
        "jobs",
        "pods",
        "leases",
        "serviceaccounts",
        "roles",
        "rolebindings",
    ];
    let object_writes = sum(&|v, r| is_write(v) && object_resources.contains(&r));
    let status_writes = sum(&|v, r| is_write(v) && r.ends_with("/status"));
    let event_writes = sum(&|v, r| is_write(v) && r == "events");
    let reads = sum(&|v, _| !is_write(v));
    let per_del = |x: u64| x as f64 / n as f64;

    // (b) Job completion -> release.
    let mut lat: Vec<Duration> = names
        .iter()
        .filter_map(|name| {
            let c = complete_seen.get(name)?;
            let g = gone.get(name)?;
            Some(g.saturating_duration_since(*c))
        })
        .collect();
    lat.sort();
    // The slowest releases by name, with when (from the delete): where to look in the log.
    let mut slowest: Vec<(Duration, &String)> = names
        .iter()
        .filter_map(|name| {
            let c = complete_seen.get(name)?;
            let g = gone.get(name)?;
            Some((g.saturating_duration_since(*c), name))
        })
        .collect();
    slowest.sort();
    slowest.reverse();
    // `CAPTF_SCALE_TIMES=FILE`: each object's name, when its Job was seen Complete and
    // when it went, in milliseconds since the Unix epoch (beside the fault proxy's
    // `CAPTF_PROXY_TRACE`, to see where a slow release spent its time).
    if let Some(path) = std::env::var_os("CAPTF_SCALE_TIMES") {
        let (now, wall) = (Instant::now(), std::time::SystemTime::now());
        let unix_ms = |t: Instant| {
            (wall - now.saturating_duration_since(t))
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap_or_default()
                .as_millis()
        };
        let lines: String = names
            .iter()
            .filter_map(|name| {
                let (c, g) = (complete_seen.get(name)?, gone.get(name)?);
                Some(format!("{name} {} {}\n", unix_ms(*c), unix_ms(*g)))
            })
            .collect();
        if let Err(e) = std::fs::write(&path, lines) {
            eprintln!("CAPTF_SCALE_TIMES: {}: {e}", path.to_string_lossy());
        }
    }
    slowest.truncate(3);

    // (d) reconcile passes: the manager's `decision` lines during the deletion.
    let text = std::fs::read_to_string(log_path).unwrap_or_default();
    let mut buckets: BTreeMap<i64, u64> = BTreeMap::new();
    let mut passes = 0u64;
    for l in text.get(log_offset as usize..).unwrap_or_default().lines() {
        let Ok(v) = serde_json::from_str::<Value>(l) else {
            continue;
        };
        // The `decision` line of each pass (its `message` field is the decision's).
        if !v["fields"]["action"].is_string() {
            continue;
        }
        let Some(ts) = v["timestamp"]
            .as_str()
            .and_then(|t| t.parse::<jiff::Timestamp>().ok())
        else {
            continue;
        };
        if ts < wall0 || ts > wall1 {
            continue;
        }
        passes += 1;
        *buckets.entry(ts.as_second()).or_default() += 1;
    }
    let peak_rate = buckets.values().copied().max().unwrap_or(0);
    let destroyed = (0..n)
        .filter(|i| {
            (0..2).all(|k| {
                markers
                    .join(format!("{}-{k}.destroyed", name_of(*i)))
                    .exists()
            })
        })
        .count();

    let destroyed = if standin {
        "the states emptied by the stand-in".to_string()
    } else {
        format!("{destroyed}/{n} objects' instances destroyed by terraform")
    };
    println!();
    println!(
        "Deleted {n} TerraformMachines in {:.1}s ({} destroy Jobs, {} at a time; {destroyed}; runner RBAC swept: {})",
        window.as_secs_f64(),
        jobs_created.len(),
        jobs,
        if swept { "yes" } else { "NO" }
    );
    println!();
    println!("{:<58} {:>12}   target", "measure", "figure");
    println!("{}", "-".repeat(96));
    let row = |what: &str, figure: String, target: &str, ok: Option<bool>| {
        let mark = match ok {
            Some(true) => "met",
            Some(false) => "MISSED",
            None => "",
        };
        println!("{what:<58} {figure:>12}   {target:<12} {mark}");
    };
    let ow = per_del(object_writes);
    row(
        "(a) writes of objects/Secrets/Jobs/Pods/Leases/RBAC per deletion",
        format!("{ow:.2}"),
        "<= 12",
        Some(ow <= 12.0),
    );
    row(
        "    status writes per deletion",
        format!("{:.2}", per_del(status_writes)),
        "",
        None,
    );
    row(
        "    Event writes per deletion",
        format!("{:.2}", per_del(event_writes)),
        "",
        None,
    );
    row(
        "    reads (get/list/watch) per deletion",
        format!("{:.2}", per_del(reads)),
        "",
        None,
    );
    let ms = |d: Duration| format!("{:.0} ms", d.as_secs_f64() * 1000.0);
    let p50 = percentile(&lat, 0.50);
    let p95 = percentile(&lat, 0.95);
    let max = lat.last().copied().unwrap_or_default();
    row(
        "(b) destroy Job Complete -> object released, p50",
        ms(p50),
        "< 1 s",
        Some(p50 < Duration::from_secs(1)),
    );
    row(
        "                                              p95",
        ms(p95),
        "< 1 s",
        Some(p95 < Duration::from_secs(1)),
    );
    row(
        "                                              max",
        ms(max),
        "< 1 s",
        Some(max < Duration::from_secs(1)),
    );
    let mib = peak_kib as f64 / 1024.0;
    // 100 MiB up to a thousand objects, 200 MiB at thousands.
    let rss_target = if n > 1000 { 200.0 } else { 100.0 };
    row(
        "(c) manager peak RSS (VmHWM)",
        format!("{mib:.1} MiB"),
        &format!("< {rss_target:.0} MiB"),
        Some(mib < rss_target),
    );
    row(
        "(d) reconcile passes per second, mean over the deletion",
        format!("{:.1}", passes as f64 / window.as_secs_f64()),
        "",
        None,
    );
    row(
        "                                   peak (1 s buckets)",
        format!("{peak_rate}"),
        "",
        None,
    );
    row(
        "    reconcile passes per deletion",
        format!("{:.2}", per_del(passes)),
        "",
        None,
    );
    println!();
    println!(
        "(b) from the bench's own watches (User-Agent captf-bench, not counted as the manager's); {} of {n} objects had their Job seen Complete.",
        lat.len()
    );
    for (d, name) in &slowest {
        println!(
            "    slowest: {name} {:.0} ms (its Job seen Complete {:.1} s after the delete)",
            d.as_secs_f64() * 1000.0,
            complete_seen[*name]
                .saturating_duration_since(t0)
                .as_secs_f64()
        );
    }
    println!(
        "CPU seconds since start: manager {cpu_manager:.1}, control plane {cpu_plane:.1}, Job processes {cpu_jobs:.1}"
    );
    // One line to set runs of several N side by side.
    println!(
        "per deletion (N = {n}, {}): reads {:.2}, writes {:.2}, status writes {:.2}, Event writes {:.2}, passes {:.2}, manager CPU ms {:.1} (over the deletion); release p95 {} ms; peak RSS {mib:.1} MiB",
        if standin { "stand-in" } else { "terraform" },
        per_del(reads),
        ow,
        per_del(status_writes),
        per_del(event_writes),
        per_del(passes),
        (cpu_manager - cpu_before) * 1000.0 / n as f64,
        p95.as_millis(),
    );
    println!();
    println!(
        "Manager requests during the deletion, per deletion (verb resource: total / per deletion):"
    );
    for ((verb, res), count) in &per {
        println!("  {verb:<8} {res:<28} {count:>7}  {:>6.2}", per_del(*count));
    }
    println!();
    println!("The proxy's clients (by User-Agent; the manager is the only one): writes / reads");
    for (client, (w, r)) in &clients {
        println!("  {client:<12} {w:>7} / {r:>7}");
    }
    Ok(PerDeletion {
        n,
        reads: per_del(reads),
        writes: ow,
        status_writes: per_del(status_writes),
        passes: per_del(passes),
        cpu_ms: (cpu_manager - cpu_before) * 1000.0 / n as f64,
        p95_ms: p95.as_millis(),
        peak_mib: mib,
        seconds: window.as_secs_f64(),
    })
}
