//! The properties the fuzz targets check on CAPTF's readers of untrusted bytes: one
//! function per target, taking the raw input. The fuzzer (`fuzz/`, libFuzzer) calls them
//! on generated inputs; `tests/corpus.rs` calls them on the committed corpora, so a
//! finding fixed once stays fixed in `cargo test --workspace` (docs/fuzzing.md).
//!
//! Every target checks, beyond "no panic": a verdict for every input, a time bound per
//! input, a bound on the memory the reader allocates (with [`alloc::Counting`] as the
//! global allocator), and, where a second implementation exists, agreement with it.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

pub mod alloc;
mod explain;
mod hcl;
mod inputs;
mod report;
mod state;

pub use explain::explain;
pub use hcl::hcl;
pub use inputs::inputs;
pub use report::{render as render_report, report};
pub use state::{reference as state_reference, state};

/// The bounds a check holds a reader to.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// The longest one call of a reader may take.
    pub time: Duration,
    /// The decompression cap given to the state reader.
    pub state_cap: u64,
}

impl Limits {
    /// Under the fuzzer (an optimised build).
    pub const FUZZ: Limits = Limits {
        time: Duration::from_secs(2),
        state_cap: 1024 * 1024,
    };
    /// In `cargo test` (an unoptimised build of CAPTF on a busy machine).
    pub const TEST: Limits = Limits {
        time: Duration::from_secs(20),
        state_cap: 1024 * 1024,
    };
}

/// Runs `f`, asserting that it ends within the time bound and allocates at most `bound`
/// bytes above what was live when it started (the peak, on this thread).
pub fn bounded<T>(what: &str, limits: &Limits, bound: usize, f: impl FnOnce() -> T) -> T {
    let start = Instant::now();
    let (out, peak) = alloc::peak_during(f);
    let took = start.elapsed();
    assert!(
        took <= limits.time,
        "{what}: took {took:?}, more than the bound of {:?}",
        limits.time
    );
    if alloc::counting() {
        assert!(
            peak <= bound,
            "{what}: allocated {peak} bytes at its peak, more than the bound of {bound}"
        );
    }
    out
}

/// Module files as `captf module check` reads them: `name.tf` to text.
pub type Files = BTreeMap<String, String>;
