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

mod lexer;
mod source;
mod walk;

use std::io::{self, BufRead, BufReader, Read};

use flate2::bufread::GzDecoder;

use source::Source;
use walk::Scanner;

/// Size of the decompressed-JSON buffer and of the compressed-input buffer.
const BUF_SIZE: usize = 64 * 1024;
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

/// Gunzips `gzip` (one gzip member, nothing after it), at most `cap` bytes of output, and
/// scans the JSON. Decompression failures take precedence over JSON errors: the stream is
/// read to its end even after the JSON turned out to be bad.
pub(crate) fn scan<R: Read>(gzip: R, cap: u64) -> Scanned {
    let sniff = Sniff {
        inner: gzip,
        head: Vec::with_capacity(2),
        consumed: 0,
    };
    let dec = GzDecoder::new(BufReader::with_capacity(BUF_SIZE, sniff));
    let mut scanner = Scanner {
        src: Source {
            dec,
            buf: vec![0; BUF_SIZE].into_boxed_slice(),
            pos: 0,
            len: 0,
            total: 0,
            cap,
            done: false,
            failure: None,
        },
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
