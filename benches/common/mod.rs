//! What the benches share: their settings from the environment, a process's memory and
//! CPU from `/proc`, a client of their own, and deterministic data without a crate.
#![allow(dead_code)]

/// `key` as a positive number, else `default`.
pub fn env_usize(key: &str, default: usize) -> usize {
    std::env::var(key)
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|n| *n > 0)
        .unwrap_or(default)
}

/// A `/proc/<pid>/status` field in KiB (`VmHWM:`, `VmRSS:`).
pub fn proc_kib(pid: u32, field: &str) -> Option<u64> {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()?
        .lines()
        .find(|l| l.starts_with(field))?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

/// xorshift64*.
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// `n` hex digits appended to `out`.
    pub fn hex(&mut self, out: &mut String, n: usize) {
        for _ in 0..n {
            out.push(char::from_digit((self.next() >> 60) as u32, 16).expect("a hex digit"));
        }
    }

    /// A UUID-shaped string appended to `out`.
    pub fn uuid(&mut self, out: &mut String) {
        for (i, n) in [8, 4, 4, 4, 12].into_iter().enumerate() {
            if i > 0 {
                out.push('-');
            }
            self.hex(out, n);
        }
    }

    /// `len` hex digits, sixteen from each number.
    pub fn hex_words(&mut self, len: usize) -> String {
        let mut s = String::with_capacity(len + 16);
        while s.len() < len {
            s.push_str(&format!("{:016x}", self.next()));
        }
        s.truncate(len);
        s
    }
}

/// utime + stime (field `at`, counted after the command name) of a `/proc/*/stat` file, in
/// seconds; `at` 13 gives cutime + cstime (reaped children).
pub fn cpu_seconds(path: &str, at: usize) -> f64 {
    let stat = std::fs::read_to_string(path).unwrap_or_default();
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map(|(_, rest)| rest)
        .unwrap_or_default()
        .split_whitespace()
        .collect();
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|x| x.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    // USER_HZ is 100 on Linux.
    (ticks(at) + ticks(at + 1)) / 100.0
}

/// A client straight to the API server (not through the proxy, so not counted as the
/// manager's), with `User-Agent: captf-bench`.
pub async fn bench_client(kubeconfig: &std::path::Path) -> kube::Client {
    let kc = kube::config::Kubeconfig::read_from(kubeconfig).expect("kubeconfig");
    let mut cfg =
        kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
            .await
            .expect("config");
    cfg.headers.push((
        hyper::header::USER_AGENT,
        hyper::header::HeaderValue::from_static("captf-bench"),
    ));
    kube::Client::try_from(cfg).expect("client")
}

/// Copies the manager's log at `from` to `name` in the temp directory, where it outlives
/// the bench's control plane, and says where.
pub fn keep_manager_log(from: &std::path::Path, name: &str) {
    let kept = std::env::temp_dir().join(name);
    if std::fs::copy(from, &kept).is_ok() {
        println!("\n(the manager's log: {})", kept.display());
    }
}

/// Whether Job `j` has one of the condition types `types` True (`Complete`, `Failed`).
pub fn job_is(j: &k8s_openapi::api::batch::v1::Job, types: &[&str]) -> bool {
    j.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| {
            cs.iter()
                .any(|c| types.contains(&c.type_.as_str()) && c.status == "True")
        })
}
