//! Loopback ports for what a test starts itself: the in-process manager's probe and metrics
//! ports, the manager Pod's on the local kubelet (whose Pods share this machine's network).
//!
//! Chosen as `tests/cluster/ports` chooses the control planes' (read its comment): from
//! below the kernel's ephemeral range, where no outgoing connection takes one before it is
//! bound, and recorded as handed out, under the same lock and in the same directory, so
//! that neither a test nor a control plane starting beside it is given the same port in
//! the ten minutes after. A port taken from the ephemeral range (`bind(127.0.0.1:0)`) could
//! be handed out again at once: a manager Pod in CI whose port had gone to another, and
//! the kubelet then probed the other's, was Ready and then answered nothing.

use std::fs::OpenOptions;
use std::hash::{BuildHasher, RandomState};
use std::path::PathBuf;
use std::time::Duration;

/// How long a port handed out is not handed out again (`ports.Claimed`).
const CLAIMED: Duration = Duration::from_secs(10 * 60);
/// The range ports are chosen from (`ports.low`, `ports.span`).
const LOW: u16 = 20000;
const SPAN: u16 = 12000;

/// Where the claims are recorded (`ports.Dir`; Go's `os.TempDir` reads `TMPDIR` too).
fn claims() -> PathBuf {
    std::env::temp_dir().join("captf-envtest-ports")
}

/// A port no process listens on now and that no test or control plane on this machine
/// was given in the last ten minutes, recorded as given.
pub fn free_port() -> u16 {
    try_free_port().unwrap_or_else(|e| panic!("a free port ({}): {e}", claims().display()))
}

fn try_free_port() -> std::io::Result<u16> {
    let dir = claims();
    std::fs::create_dir_all(&dir)?;
    let lock = OpenOptions::new()
        .create(true)
        .truncate(false)
        .read(true)
        .write(true)
        .open(dir.join("lock"))?;
    // Released when `lock` is dropped.
    lock.lock()?;
    let random = RandomState::new();
    for i in 0..1000u32 {
        let port = LOW + (random.hash_one(i) % u64::from(SPAN)) as u16;
        let claim = dir.join(port.to_string());
        let recent = std::fs::metadata(&claim)
            .and_then(|m| m.modified())
            .is_ok_and(|t| t.elapsed().is_ok_and(|age| age < CLAIMED));
        if recent || std::net::TcpListener::bind(("127.0.0.1", port)).is_err() {
            continue;
        }
        std::fs::write(&claim, std::process::id().to_string())?;
        return Ok(port);
    }
    Err(std::io::Error::other(format!(
        "no free port between {LOW} and {} in 1000 tries",
        LOW + SPAN - 1
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The lowest port of the kernel's ephemeral range (the local ports of outgoing
    /// connections), 32768 by default.
    fn ephemeral_low() -> u16 {
        std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
            .ok()
            .and_then(|s| s.split_whitespace().next()?.parse().ok())
            .unwrap_or(32768)
    }

    #[test]
    fn ports_are_never_handed_out_twice_nor_from_the_range_of_outgoing_connections() {
        let low = ephemeral_low();
        let mut seen = std::collections::BTreeSet::new();
        for _ in 0..40 {
            let port = free_port();
            assert!(port < low, "{port} is in the ephemeral range, from {low}");
            assert!(seen.insert(port), "{port} handed out twice");
        }
    }
}
