//! `cargo bench --bench state_memory`: the manager's peak memory with N deleting objects
//! (500 by default, `CAPTF_MEM_N`) whose states are each about 10 MB of Terraform JSON
//! (`CAPTF_MEM_STATE_MB`), on the real control plane.
//!
//! Every object is held where a destroy cannot start (its inputs Secret is gone), so each
//! of its passes reads its whole state, and is checked again at the retry backoff (300 ms
//! to 3 s here): the manager reads states back to back for as long as the bench runs, the
//! worst case for its memory. The states are one realistic state (instances with ids,
//! ARNs, addresses and tags, random per instance) gzipped once and cut into parts as
//! Terraform cuts them; every object gets a copy.
//!
//! `captf manager` runs as its own process (as in production: its RSS is its own),
//! straight to the API server, with `--max-state-reads` from
//! `CAPTF_MEM_PERMITS` when set (the product default otherwise) and `CAPTF_MEM_BIN` as the
//! binary when set (an older build, to compare). After every object reports
//! `DestroyCannotStart`, it runs `CAPTF_MEM_SECONDS` (60) more; then the bench prints the
//! manager's peak RSS (VmHWM), its RSS at the end, and how many passes it made (each
//! reads a whole state; from its log's `decision` lines).

#[path = "common/mod.rs"]
mod common;
use captf_test_support as support;

use std::io::Write;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use captf::api::names::{self, Kind};
use futures::StreamExt;
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, DeleteParams, PostParams};
use serde_json::{Value, json};
use support::{Env, Tfm, backend_labels};

fn main() {
    let n = common::env_usize("CAPTF_MEM_N", 500);
    let mb = common::env_usize("CAPTF_MEM_STATE_MB", 10);
    let seconds = common::env_usize("CAPTF_MEM_SECONDS", 60);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let code = match runtime.block_on(bench(n, mb, seconds)) {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("error: {e}");
            1
        }
    };
    // At once: the test support's background tasks would retry against the control plane
    // that is gone while the runtime shuts down.
    std::process::exit(code);
}

/// A version-4 state of about `mb` MB: `aws_instance.vm[i]` instances with the attributes
/// a cloud instance has.
fn state_json(mb: usize) -> String {
    let mut rng = common::Rng(0x5eed_cafe_f00d_0001);
    let mut instances = Vec::new();
    let mut size = 0;
    let mut i = 0;
    while size < mb * 1_000_000 {
        let id = format!("i-{}", rng.hex_words(17));
        let instance = json!({
            "index_key": i,
            "schema_version": 1,
            "attributes": {
                "id": id,
                "arn": format!("arn:aws:ec2:eu-west-1:123456789012:instance/{id}"),
                "ami": format!("ami-{}", rng.hex_words(17)),
                "instance_type": "m6i.large",
                "availability_zone": "eu-west-1b",
                "private_ip": format!("10.{}.{}.{}", rng.next() % 256, rng.next() % 256, rng.next() % 256),
                "private_dns": format!("ip-{}.eu-west-1.compute.internal", rng.hex_words(8)),
                "subnet_id": format!("subnet-{}", rng.hex_words(17)),
                "vpc_security_group_ids": [format!("sg-{}", rng.hex_words(17))],
                "root_block_device": [{"volume_id": format!("vol-{}", rng.hex_words(17)), "volume_size": 50, "volume_type": "gp3", "encrypted": true}],
                "tags": {"Name": format!("web-{i}"), "cluster": "prod", "owner": "platform", "cost-center": "1234"},
                "user_data_base64": rng.hex_words(64),
            },
            "sensitive_attributes": [],
            "private": rng.hex_words(48),
        });
        size += instance.to_string().len();
        instances.push(instance);
        i += 1;
    }
    json!({
        "version": 4,
        "terraform_version": "1.11.4",
        "serial": 7,
        "lineage": "5ca1e000-0000-4000-8000-00000000beef",
        "outputs": {},
        "resources": [{
            "mode": "managed",
            "type": "aws_instance",
            "name": "vm",
            "provider": "provider[\"registry.terraform.io/hashicorp/aws\"]",
            "instances": instances,
        }],
        "check_results": null,
    })
    .to_string()
}

fn name_of(i: usize) -> String {
    format!("m-{i:04}")
}

async fn bench(n: usize, mb: usize, seconds: usize) -> Result<(), String> {
    let started = Instant::now();
    let text = state_json(mb);
    let gz = {
        let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        enc.write_all(text.as_bytes()).map_err(|e| e.to_string())?;
        enc.finish().map_err(|e| e.to_string())?
    };
    let chunks: Vec<Vec<u8>> = captf::state::chunk(&gz)
        .into_iter()
        .map(<[u8]>::to_vec)
        .collect();
    println!(
        "state memory bench: {n} deleting TerraformMachines, each with a state of {:.1} MB of JSON ({:.2} MiB gzipped, {} Secret(s))",
        text.len() as f64 / 1e6,
        gz.len() as f64 / 1048576.0,
        chunks.len()
    );
    drop(text);

    let mut env = Env::builder("statemem").kubelet_args(&[]).start().await;
    env.job_timeout_seconds = 1800;
    let markers = env.markers();
    let cluster_uid = env.create_cluster("mem").await;
    let names: Vec<String> = (0..n).map(name_of).collect();
    futures::stream::iter(names.iter())
        .for_each_concurrent(8, |name| {
            let (env, cluster_uid, markers, chunks) = (&env, &cluster_uid, &markers, &chunks);
            async move {
                env.create_object::<Tfm>(name, "mem", cluster_uid, markers)
                    .await;
                let uid = env
                    .object::<Tfm>(name)
                    .await
                    .and_then(|o| o.metadata.uid)
                    .expect("uid");
                let suffix = names::state_suffix(Kind::TerraformMachine, name);
                let base = names::state_secret_name(&suffix);
                let mut labels: serde_json::Map<String, Value> =
                    backend_labels(Kind::TerraformMachine, name, &uid)
                        .into_iter()
                        .map(|(k, v)| (k, json!(v)))
                        .collect();
                for (k, v) in captf::api::labels::terraform_state_labels(&suffix) {
                    labels.insert(k, json!(v));
                }
                for (i, chunk) in chunks.iter().enumerate() {
                    let secret_name = if i == 0 {
                        base.clone()
                    } else {
                        names::part_secret_name(&base, i as u32)
                    };
                    let secret: Secret = serde_json::from_value(json!({
                        "metadata": {"name": secret_name, "labels": labels},
                        "data": {names::TF_STATE_KEY: ByteString(chunk.clone())},
                    }))
                    .expect("secret");
                    env.secrets()
                        .create(&PostParams::default(), &secret)
                        .await
                        .expect("state Secret");
                }
                // Applied, with the state's fingerprint recorded; no inputs Secret, so a
                // destroy cannot start and every pass reads the state again.
                env.annotate::<Tfm>(
                    name,
                    &[
                        (names::APPLIED_AT, Some("2026-12-01T10:00:00Z".to_string())),
                        (
                            names::STATE_LINEAGE,
                            Some("5ca1e000-0000-4000-8000-00000000beef".to_string()),
                        ),
                        (names::STATE_SERIAL, Some("7".to_string())),
                    ],
                )
                .await;
            }
        })
        .await;
    println!(
        "  setup: {n} objects and their states ({:.1}s)",
        started.elapsed().as_secs_f64()
    );

    let log_path = env.dir.join("manager.log");
    let log = std::fs::File::create(&log_path).map_err(|e| e.to_string())?;
    let bin = std::env::var("CAPTF_MEM_BIN").unwrap_or_else(|_| env!("CARGO_BIN_EXE_captf").into());
    let mut args: Vec<String> = [
        "manager",
        "--provision=false",
        "--metrics-bind-address=",
        "--health-probe-bind-address=",
        "--destroy-backoff-base",
        "300ms",
        "--destroy-backoff-max",
        "3s",
        "--manager-namespace",
        &env.manager_ns,
        "--namespace",
        &env.ns,
    ]
    .into_iter()
    .map(String::from)
    .collect();
    let permits = std::env::var("CAPTF_MEM_PERMITS").ok();
    if let Some(p) = &permits {
        args.push(format!("--max-state-reads={p}"));
    }
    let mut manager: Child = Command::new(&bin)
        .args(&args)
        // Straight to the API server: the fault proxy would copy every state through
        // this bench's own process.
        .env("KUBECONFIG", env.kubeconfig_path())
        .env("RUST_LOG", "info,kube=warn")
        .env("CAPTF_LOG_FORMAT", "json")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::from(log))
        .spawn()
        .map_err(|e| format!("cannot start the manager {bin}: {e}"))?;
    let pid = manager.id();
    let result = measure(&env, pid, &names, seconds, &log_path).await;
    println!(
        "  manager: {bin}{}",
        permits
            .map(|p| format!(" --max-state-reads={p}"))
            .unwrap_or_default()
    );
    let _ = manager.kill();
    let _ = manager.wait();
    // The objects and their states keep finalizers; stripping them would rewrite a
    // gigabyte of Secrets. The dedicated control plane, and its data, go with `env`.
    let _ = std::fs::remove_dir_all(&env.dir);
    drop(env);
    result
}

/// How many of the listed objects are as a wait wants them.
type Count = dyn Fn(&[Tfm]) -> usize + Send + Sync;

fn passes(log_path: &std::path::Path) -> usize {
    std::fs::read_to_string(log_path)
        .map(|l| l.lines().filter(|l| l.contains("\"decision\"")).count())
        .unwrap_or(0)
}

async fn measure(
    env: &Env,
    pid: u32,
    names: &[String],
    seconds: usize,
    log_path: &std::path::Path,
) -> Result<(), String> {
    let objects: Api<Tfm> = Api::namespaced(env.client.clone(), &env.ns);
    let wait = |what: &'static str, check: Box<Count>| {
        let objects = objects.clone();
        async move {
            let start = Instant::now();
            loop {
                let items = objects
                    .list(&Default::default())
                    .await
                    .map_err(|e| e.to_string())?
                    .items;
                let done = check(&items);
                if done >= names.len() {
                    return Ok::<f64, String>(start.elapsed().as_secs_f64());
                }
                if start.elapsed() > Duration::from_secs(900) {
                    return Err(format!(
                        "{what}: only {done} of {} after 900 s",
                        names.len()
                    ));
                }
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        }
    };
    let t = wait(
        "the manager's finalizer on every object",
        Box::new(|items| {
            items
                .iter()
                .filter(|o| o.metadata.finalizers.is_some())
                .count()
        }),
    )
    .await?;
    println!("  the manager took every object in {t:.1}s");
    objects
        .delete_collection(&DeleteParams::default(), &Default::default())
        .await
        .map_err(|e| e.to_string())?;
    let deleted = Instant::now();
    let passes_before = passes(log_path);
    let t = wait(
        "every object held at DestroyCannotStart",
        Box::new(|items| {
            items
                .iter()
                .filter(|o| {
                    o.status.as_ref().is_some_and(|s| {
                        s.conditions
                            .iter()
                            .any(|c| c.type_ == "Deleting" && c.reason == "DestroyCannotStart")
                    })
                })
                .count()
        }),
    )
    .await?;
    println!("  every object held at DestroyCannotStart {t:.1}s after the delete");
    let mut peak_seen = 0;
    let until = Instant::now() + Duration::from_secs(seconds as u64);
    while Instant::now() < until {
        peak_seen = peak_seen.max(common::proc_kib(pid, "VmRSS:").unwrap_or(0));
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let hwm = common::proc_kib(pid, "VmHWM:").ok_or("the manager is gone")?;
    let rss = common::proc_kib(pid, "VmRSS:").unwrap_or(0);
    let elapsed = deleted.elapsed().as_secs_f64();
    let made = passes(log_path) - passes_before;
    println!(
        "  over {elapsed:.0}s from the delete: {made} passes, each reading a whole state ({:.1}/s)",
        made as f64 / elapsed
    );
    println!(
        "  manager peak RSS (VmHWM): {:.1} MiB; RSS at the end {:.1} MiB (highest sampled {:.1} MiB)",
        hwm as f64 / 1024.0,
        rss as f64 / 1024.0,
        peak_seen as f64 / 1024.0
    );
    Ok(())
}
