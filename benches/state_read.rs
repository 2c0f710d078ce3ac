//! `cargo bench --bench state_read`: reading states of about 1, 10 and 100 MB of JSON with
//! `captf::state::read_bytes`, against `gzip -dc` on the same bytes (and `terraform show
//! -json` when terraform is installed), with the peak heap memory of the reading.
//!
//! Targets: reading within 1.5x of `igzip -dc` (Intel ISA-L, Debian's `isal` package; issue
//! 37), and so within 2x of `gzip -dc`; peak memory under 64 MiB for the 100 MB state.
//!
//! Beside it, the same facts read with serde (`serde_json::from_reader` on the gunzip
//! stream, a typed visitor that keeps `version`, `lineage`, `serial` and per resource its
//! `mode` and the count of its `instances`, skipping the rest with `IgnoredAny`): the
//! well-kept alternative to the hand-written scanner, timed on the same bytes, so that the
//! scanner stays only while it is the faster.

use std::alloc::{GlobalAlloc, Layout, System};
use std::fmt::Write as _;
use std::io::Write as _;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use captf::state::{DEFAULT_DECOMPRESSION_CAP, StateContent, read_bytes};
use flate2::Compression;
use flate2::write::GzEncoder;

/// Counts live heap bytes and their peak.
struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            let live = LIVE.fetch_add(layout.size(), Ordering::Relaxed) + layout.size();
            PEAK.fetch_max(live, Ordering::Relaxed);
        }
        p
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) };
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            if new_size >= layout.size() {
                let live = LIVE.fetch_add(new_size - layout.size(), Ordering::Relaxed) + new_size
                    - layout.size();
                PEAK.fetch_max(live, Ordering::Relaxed);
            } else {
                LIVE.fetch_sub(layout.size() - new_size, Ordering::Relaxed);
            }
        }
        p
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

#[path = "common/mod.rs"]
mod common;
use common::Rng;

const WORDS: &[&str] = &[
    "subnet",
    "vpc",
    "instance",
    "volume",
    "gp3",
    "eu-west-1a",
    "eu-west-1b",
    "t3.large",
    "m5.xlarge",
    "enabled",
    "disabled",
    "tcp",
    "udp",
    "443",
    "8080",
    "0.0.0.0/0",
    "10.0.0.0/16",
    "owner",
    "team-a",
    "prod",
    "staging",
    "web",
    "worker",
    "db",
    "cache",
    "ami-0abcdef1234567890",
    "true",
    "false",
    "kubernetes.io/cluster",
    "shared",
    "Name",
    "arn:aws:iam::123456789012:role/node",
    "security-group",
    "ingress",
    "egress",
    "tags",
    "monitoring",
    "ebs",
];

/// A version-4 state of about `target` bytes of indented JSON (as Terraform writes it):
/// `terraform_data` resources (`count = 8`) whose string inputs are made of words, ids and
/// numbers, so that it compresses about as well as real states.
fn make_state(target: usize, rng: &mut Rng) -> String {
    let mut s = String::with_capacity(target + 64 * 1024);
    s.push_str("{\n  \"version\": 4,\n  \"terraform_version\": \"1.11.4\",\n  \"serial\": 42,\n  \"lineage\": \"");
    rng.uuid(&mut s);
    s.push_str("\",\n  \"outputs\": {},\n  \"resources\": [\n");
    let mut r = 0usize;
    while s.len() < target {
        if r > 0 {
            s.push_str(",\n");
        }
        let _ = write!(
            s,
            "    {{\n      \"mode\": \"managed\",\n      \"type\": \"terraform_data\",\n      \"name\": \"r{r}\",\n      \
             \"provider\": \"provider[\\\"terraform.io/builtin/terraform\\\"]\",\n      \"instances\": [\n"
        );
        for i in 0..8 {
            if i > 0 {
                s.push_str(",\n");
            }
            let mut value = String::new();
            for w in 0..60 {
                match rng.next() % 8 {
                    0 => rng.uuid(&mut value),
                    1 => {
                        let _ = write!(value, "{}", rng.next() % 100_000);
                    }
                    _ => value.push_str(WORDS[(rng.next() % WORDS.len() as u64) as usize]),
                }
                value.push(if w % 10 == 9 { ',' } else { ' ' });
            }
            let _ = write!(
                s,
                "        {{\n          \"index_key\": {i},\n          \"schema_version\": 0,\n          \"attributes\": {{\n            \
                 \"id\": \""
            );
            rng.uuid(&mut s);
            let _ = write!(
                s,
                "\",\n            \"input\": {{\n              \"value\": \"{value}\",\n              \"type\": \"string\"\n            \
                 }},\n            \"output\": {{\n              \"value\": \"{value}\",\n              \"type\": \"string\"\n            \
                 }},\n            \"triggers_replace\": null\n          }},\n          \"sensitive_attributes\": []\n        }}"
            );
        }
        s.push_str("\n      ]\n    }");
        r += 1;
    }
    s.push_str("\n  ],\n  \"check_results\": null\n}\n");
    s
}

fn gzip(data: &[u8]) -> Vec<u8> {
    let mut e = GzEncoder::new(Vec::with_capacity(data.len() / 4), Compression::default());
    e.write_all(data).unwrap();
    e.finish().unwrap()
}

fn best_of(runs: usize, mut f: impl FnMut() -> Option<Duration>) -> Option<Duration> {
    (0..runs).filter_map(|_| f()).min()
}

/// flate2 alone (the same decoder, output discarded): the floor under `read_bytes`.
/// The facts CAPTF reads of a state, through serde.
mod with_serde {
    use serde::Deserialize;
    use serde::de::{Deserializer, IgnoredAny, SeqAccess, Visitor};

    #[derive(Deserialize)]
    pub struct State {
        #[allow(dead_code)]
        pub version: Option<u64>,
        #[allow(dead_code)]
        pub lineage: Option<String>,
        #[allow(dead_code)]
        pub serial: Option<u64>,
        #[serde(default)]
        pub resources: Vec<Resource>,
    }

    #[derive(Deserialize)]
    pub struct Resource {
        pub mode: Option<String>,
        #[serde(default, deserialize_with = "count")]
        pub instances: u64,
    }

    fn count<'de, D: Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
        struct Count;
        impl<'de> Visitor<'de> for Count {
            type Value = u64;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a list of instances")
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<u64, A::Error> {
                let mut n = 0;
                while seq.next_element::<IgnoredAny>()?.is_some() {
                    n += 1;
                }
                Ok(n)
            }
        }
        d.deserialize_seq(Count)
    }

    /// The managed resource instances of the gzipped state `gz`, streamed.
    pub fn managed_instances(gz: &[u8]) -> Option<u64> {
        let dec = flate2::bufread::GzDecoder::new(gz);
        let state: State =
            serde_json::from_reader(std::io::BufReader::with_capacity(64 * 1024, dec)).ok()?;
        Some(
            state
                .resources
                .iter()
                .filter(|r| r.mode.as_deref() == Some("managed"))
                .map(|r| r.instances)
                .sum(),
        )
    }
}

fn inflate_only(gz: &[u8]) -> Option<Duration> {
    use std::io::Read as _;
    let start = Instant::now();
    let mut dec = flate2::bufread::GzDecoder::new(gz);
    let mut buf = vec![0u8; 64 * 1024];
    while dec.read(&mut buf).ok()? > 0 {}
    Some(start.elapsed())
}

/// `program -dc path` to /dev/null, timed: `gzip`, or `igzip` (Debian's `isal` package).
fn decompress_with(program: &str, path: &Path) -> Option<Duration> {
    let start = Instant::now();
    let status = Command::new(program)
        .arg("-dc")
        .arg(path)
        .stdout(Stdio::null())
        .status()
        .ok()?;
    status.success().then(|| start.elapsed())
}

fn terraform_show(dir: &Path) -> Result<Duration, String> {
    let start = Instant::now();
    let out = Command::new("terraform")
        .args(["show", "-json", "-no-color", "terraform.tfstate"])
        .current_dir(dir)
        .env("TF_CLI_CONFIG_FILE", "/dev/null")
        .env("CHECKPOINT_DISABLE", "1")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .output()
        .map_err(|e| e.to_string())?;
    let elapsed = start.elapsed();
    if out.status.success() {
        Ok(elapsed)
    } else {
        let err = String::from_utf8_lossy(&out.stderr);
        Err(err
            .lines()
            .find(|l| l.contains("Error"))
            .unwrap_or("failed")
            .trim()
            .chars()
            .take(120)
            .collect())
    }
}

fn mb(bytes: usize) -> f64 {
    bytes as f64 / 1e6
}

fn main() {
    let tmp = std::env::temp_dir().join(format!("captf-state-bench-{}", std::process::id()));
    std::fs::create_dir_all(&tmp).unwrap();
    let has_terraform = Command::new("terraform")
        .arg("version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok();
    let mut rng = Rng(0x243f_6a88_85a3_08d3);

    println!("state_read: captf::state::read_bytes vs gzip -dc (best of several runs)");
    println!(
        "targets: read within 1.5x of igzip -dc (2x of gzip -dc); peak memory < 64 MiB for the 100 MB state\n"
    );
    println!(
        "{:>8} {:>8} {:>6} {:>10} {:>10} {:>9} {:>11} {:>10} {:>7} {:>9} {:>8} {:>11} {:>14}",
        "JSON MB",
        "gzip MB",
        "ratio",
        "read ms",
        "MB/s JSON",
        "serde ms",
        "inflate ms",
        "gzip ms",
        "x gzip",
        "igzip ms",
        "x igzip",
        "peak MiB",
        "terraform ms"
    );
    for (target, runs) in [(1_000_000usize, 20), (10_000_000, 5), (100_000_000, 2)] {
        let json = make_state(target, &mut rng);
        let gz = gzip(json.as_bytes());
        let expected = json.matches("\"index_key\"").count() as u64;

        // Reading, with the peak heap above what is live before (the input gzip).
        let mut peak = 0usize;
        let read = best_of(runs, || {
            let before = LIVE.load(Ordering::Relaxed);
            PEAK.store(before, Ordering::Relaxed);
            let start = Instant::now();
            let content = read_bytes(&gz[..], DEFAULT_DECOMPRESSION_CAP);
            let elapsed = start.elapsed();
            peak = peak.max(PEAK.load(Ordering::Relaxed) - before);
            match content {
                StateContent::Parsed {
                    managed_instances, ..
                } if managed_instances == expected => Some(elapsed),
                other => panic!("unexpected result: {other:?}"),
            }
        })
        .unwrap();

        let inflate = best_of(runs, || inflate_only(&gz)).unwrap();
        let serde = best_of(runs, || {
            let start = Instant::now();
            let n = with_serde::managed_instances(&gz);
            assert_eq!(n, Some(expected), "serde read the same instances");
            Some(start.elapsed())
        })
        .unwrap();
        let gz_path = tmp.join("state.json.gz");
        std::fs::write(&gz_path, &gz).unwrap();
        let gzip_time = best_of(runs.min(5), || decompress_with("gzip", &gz_path));
        let igzip_time = best_of(runs.min(5), || decompress_with("igzip", &gz_path));

        let terraform = if has_terraform {
            std::fs::write(tmp.join("terraform.tfstate"), &json).unwrap();
            Some(terraform_show(&tmp))
        } else {
            None
        };

        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        let (gzip_ms, ratio) = match gzip_time {
            Some(g) => (
                format!("{:.1}", ms(g)),
                format!("{:.2}", read.as_secs_f64() / g.as_secs_f64()),
            ),
            None => ("n/a".into(), "n/a".into()),
        };
        let (igzip_ms, iratio) = match igzip_time {
            Some(g) => (
                format!("{:.1}", ms(g)),
                format!("{:.2}", read.as_secs_f64() / g.as_secs_f64()),
            ),
            None => ("absent".into(), "n/a".into()),
        };
        let tf = match &terraform {
            Some(Ok(d)) => format!("{:.0}", ms(*d)),
            Some(Err(_)) => "error".into(),
            None => "absent".into(),
        };
        println!(
            "{:>8.1} {:>8.2} {:>6.1} {:>10.1} {:>10.0} {:>9.1} {:>11.1} {:>10} {:>7} {:>9} {:>8} {:>11.2} {:>14}",
            mb(json.len()),
            mb(gz.len()),
            json.len() as f64 / gz.len() as f64,
            ms(read),
            mb(json.len()) / read.as_secs_f64(),
            ms(serde),
            ms(inflate),
            gzip_ms,
            ratio,
            igzip_ms,
            iratio,
            peak as f64 / (1024.0 * 1024.0),
            tf
        );
        if let Some(Err(e)) = terraform {
            println!("         terraform show -json failed: {e}");
        }
    }
    println!(
        "\n(read: gunzip + scan; serde: gunzip + serde_json::from_reader with a typed visitor;\n inflate: flate2 alone on the same bytes; gzip, igzip: the gzip -dc, igzip -dc process;"
    );
    println!(
        " x gzip, x igzip: read / gzip, read / igzip; peak MiB: heap allocated during read_bytes beyond the input gzip buffer;"
    );
    println!(" terraform: terraform show -json on the plain state file)");
    let _ = std::fs::remove_dir_all(&tmp);
}
