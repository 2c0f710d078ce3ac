//! The streaming side of state reading: gunzip under a decompression cap, and a JSON
//! scanner that validates the whole document while keeping only the few facts CAPTF needs
//! (top-level `version`, `lineage`, `serial`, the encryption keys, and per resource its
//! `mode` and the number of its `instances`). Nothing is built of the document: strings are
//! skipped by looking for their end (8 bytes at a time), and memory stays at the buffers.
//!
//! Why by hand, when serde could read the same facts: `cargo bench --bench state_read` times
//! the well-kept alternative (`serde_json::from_reader` on the same gunzip stream, a typed
//! visitor that skips the rest with `IgnoredAny`) at half the speed (292.6 ms against
//! 146.0 ms for a 100 MB state on the 2-core machine, 2026-12-04), and states are read on
//! every pass that needs them. Its correctness is held to serde_json's by property tests in
//! `state/tests.rs` (`scanner_agrees_with_serde_json_on_what_is_json`,
//! `scanner_counts_match_a_serde_json_reference_on_random_states`).
//!
//! A large state (from [`PIPE_FROM`] compressed bytes) is inflated on a thread of its own
//! while this one scans it and checks its CRC-32 (issue 37: within 1.5x of `igzip -dc`,
//! Intel ISA-L's hand-tuned gunzip; zlib-rs's inflate alone takes 1.4x of it here). The
//! gzip member is read in `gzip.rs` as flate2's `GzDecoder` reads it, less its CRC; the
//! tests in `scan/tests.rs` hold the two to the same verdict on every cut and flipped byte.

mod gzip;
mod lexer;
mod source;
mod walk;

use std::io::{self, Read};
use std::sync::mpsc;

use gzip::Inflater;
use source::{Feed, Source};
use walk::Scanner;

/// Size of the decompressed-JSON buffer and of the compressed-input buffer.
const BUF_SIZE: usize = 64 * 1024;
/// Compressed states from this size on (about 6 MB of JSON, some 10 ms of reading) are
/// inflated on a thread of their own while the scanner reads them.
pub(crate) const PIPE_FROM: u64 = 1024 * 1024;
/// The decompressed-JSON buffers passed between the two threads: how many the inflating
/// thread fills ahead, and their size (inflating is some 5% faster into 256 KiB than into
/// 64 KiB).
const PIPE_BUFFERS: usize = 3;
const PIPE_BUF_SIZE: usize = 256 * 1024;
/// Go's `encoding/json` (and so Terraform) refuses documents nested deeper than this.
pub(crate) const MAX_DEPTH: usize = 10_000;
/// Longest lineage accepted (Terraform writes a 36-character UUID).
pub(crate) const MAX_LINEAGE: usize = 1024;
/// Keys longer than this are none of the keys CAPTF looks for.
const MAX_KEY: usize = 32;

/// Why the bytes could not be decompressed (checked before the JSON).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum GzipFailure {
    /// The data does not start with the gzip magic bytes, or its header is invalid.
    NotGzip { head: Vec<u8> },
    /// It starts like gzip, but its header is invalid.
    BadHeader { detail: String },
    /// The gzip stream ends before its end (deflate end and 8-byte trailer).
    Truncated { compressed: u64 },
    /// The deflate data or the trailer (CRC, length) is damaged.
    Damaged { detail: String },
    /// Bytes follow the end of the gzip stream.
    TrailingData { compressed: u64 },
    /// More than `cap` bytes of JSON: reading stopped there.
    OverCap { cap: u64 },
    /// Reading the input itself failed.
    Io { detail: String },
}

/// What is wrong with the JSON text itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct JsonError {
    /// Byte offset in the decompressed document.
    pub offset: u64,
    pub what: String,
}

/// A top-level field: not there, there but unusable (why), or its value. The last
/// occurrence of a key wins, like serde_json and Go.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Field<T> {
    Absent,
    Invalid(String),
    Value(T),
}

impl<T> Field<T> {
    pub fn value(&self) -> Option<&T> {
        match self {
            Field::Value(v) => Some(v),
            _ => None,
        }
    }
}

/// The facts kept of a syntactically valid document.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Summary {
    /// The document is a JSON object (otherwise nothing else is set).
    pub top_is_object: bool,
    pub version: Field<u64>,
    pub lineage: Field<String>,
    pub serial: Field<u64>,
    /// `encryption_version` or `encrypted_data` is a top-level key.
    pub encrypted: bool,
    /// Managed resource instances in `resources`.
    pub resources: Field<u64>,
}

/// The outcome of scanning one gzip stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Scanned {
    Gzip(GzipFailure),
    Json(JsonError),
    Ok(Summary),
}

/// Gunzips `gzip` (one gzip member, nothing after it; `compressed` bytes long), at most
/// `cap` bytes of output, and scans the JSON. Decompression failures take precedence over
/// JSON errors: the stream is read to its end even after the JSON turned out to be bad.
/// From [`PIPE_FROM`] compressed bytes on, a thread of its own inflates while this one
/// scans and checks the CRC-32 (on one thread if that thread cannot be started).
pub(crate) fn scan<R: Read + Send>(gzip: R, cap: u64, compressed: u64) -> Scanned {
    scan_with(gzip, cap, compressed >= PIPE_FROM)
}

/// [`scan`], on one thread or two.
pub(crate) fn scan_with<R: Read + Send>(gzip: R, cap: u64, piped: bool) -> Scanned {
    if !piped {
        return scan_from(Source::new(
            Feed::Here(Box::new(Inflater::new(gzip, cap, BUF_SIZE))),
            BUF_SIZE,
        ));
    }
    let inflater = Inflater::new(gzip, cap, BUF_SIZE);
    std::thread::scope(|s| {
        let (filled_in, filled) = mpsc::channel();
        let (empty, empty_out) = mpsc::channel();
        let (give, take) = mpsc::channel();
        let started = std::thread::Builder::new()
            .name("state-inflate".into())
            .spawn_scoped(s, move || {
                if let Ok(inflater) = take.recv() {
                    source::pump(inflater, filled_in, empty_out);
                }
            });
        let inflater = match started {
            Ok(_) => match give.send(inflater) {
                Ok(()) => {
                    for _ in 0..PIPE_BUFFERS {
                        let _ = empty.send(vec![0; PIPE_BUF_SIZE].into_boxed_slice());
                    }
                    return scan_from(Source::<R>::new(
                        Feed::Piped { filled, empty },
                        PIPE_BUF_SIZE,
                    ));
                }
                Err(mpsc::SendError(inflater)) => inflater,
            },
            // No thread to inflate it: it is read here.
            Err(_) => inflater,
        };
        scan_from(Source::new(Feed::Here(Box::new(inflater)), BUF_SIZE))
    })
}

/// Scans what `src` holds, then reads it to its end.
fn scan_from<R: Read>(src: Source<R>) -> Scanned {
    let mut scanner = Scanner {
        src,
        stack: Vec::new(),
        key: Vec::with_capacity(MAX_KEY),
    };
    let result = scanner.document();
    // Drain the rest: truncation, trailing data and the cap are decided on the whole stream.
    scanner.src.pos = scanner.src.len;
    while scanner.src.fill() {
        scanner.src.pos = scanner.src.len;
    }
    if let Some(f) = scanner.src.failure.take() {
        return Scanned::Gzip(f);
    }
    match result {
        Ok(summary) => Scanned::Ok(summary),
        Err(e) => Scanned::Json(e),
    }
}

/// Passes compressed bytes through, remembering the first two and counting them.
struct Sniff<R> {
    inner: R,
    head: Vec<u8>,
    consumed: u64,
}

impl<R: Read> Read for Sniff<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        if self.head.len() < 2 {
            let take = (2 - self.head.len()).min(n);
            self.head.extend_from_slice(&buf[..take]);
        }
        self.consumed += n as u64;
        Ok(n)
    }
}

#[cfg(test)]
mod tests;
