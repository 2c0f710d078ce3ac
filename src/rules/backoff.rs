//! The retry schedule of destroy attempts: ours, deterministic, persisted through the
//! attempt's failure time (no retry crate keeps state across restarts).

use std::time::Duration;

use sha2::{Digest, Sha256};

/// The retry schedule: exponential from `base`, capped at `max`, jittered deterministically.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Backoff {
    pub base: Duration,
    pub max: Duration,
}

impl Default for Backoff {
    fn default() -> Self {
        Backoff {
            base: Duration::from_secs(30),
            max: Duration::from_secs(30 * 60),
        }
    }
}

impl Backoff {
    /// The delay after failed attempt `attempt` (1-based): `base * 2^(attempt-1)`, capped at
    /// `max`, less a jitter of up to 20% derived from the object's uid and the attempt, so
    /// that many objects failing together do not retry together, and a restart computes
    /// the same value again.
    pub fn delay(&self, attempt: u32, uid: &str) -> Duration {
        let exp = attempt.saturating_sub(1).min(32);
        let raw = self.base.saturating_mul(1u32 << exp.min(31));
        let capped = raw.min(self.max);
        let digest = Sha256::digest(format!("{uid}/{attempt}").as_bytes());
        let fraction = f64::from(u16::from_be_bytes([digest[0], digest[1]])) / f64::from(u16::MAX);
        capped.mul_f64(1.0 - 0.2 * fraction)
    }
}
