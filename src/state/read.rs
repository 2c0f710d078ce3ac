//! Streaming a state out of its Secrets: the base and part values chained, gunzipped under
//! the decompression cap, and scanned for what the rule table needs ([`read`]) or for the
//! outputs ([`outputs`]); never held whole.

use super::*;

/// A reader over several byte slices in turn, without joining them.
pub(super) struct Chain<'a> {
    pub(super) chunks: Vec<&'a [u8]>,
    pub(super) index: usize,
}

impl Read for Chain<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        while let Some(chunk) = self.chunks.get_mut(self.index) {
            if chunk.is_empty() {
                self.index += 1;
                continue;
            }
            let n = chunk.len().min(buf.len());
            buf[..n].copy_from_slice(&chunk[..n]);
            *chunk = &chunk[n..];
            return Ok(n);
        }
        Ok(0)
    }
}

/// A reader that counts what it hands on and fails once the `outputs` member it is in
/// has taken more than its budget.
struct Budgeted<R> {
    inner: R,
    read: std::rc::Rc<std::cell::Cell<u64>>,
    until: std::rc::Rc<std::cell::Cell<Option<u64>>>,
}

impl<R: Read> Read for Budgeted<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        let total = self.read.get() + n as u64;
        self.read.set(total);
        if self.until.get().is_some_and(|until| total > until) {
            return Err(io::Error::other(format!(
                "the outputs take more than {OUTPUTS_MAX_RAW_BYTES} bytes of the state"
            )));
        }
        Ok(n)
    }
}

/// The values of the state's top-level `outputs`, by name: streamed through gunzip under
/// the decompression cap with serde_json, everything but `outputs` skipped without being
/// held, and `outputs` read under a budget of its own ([`OUTPUTS_MAX_RAW_BYTES`]), so that
/// an output of hundreds of megabytes (a gzip of a few hundred kilobytes) is refused
/// before it is held whole. Read once after an apply succeeded and for a hand-off, not on
/// every pass, so the scanner's speed is not needed here.
pub fn outputs(
    secrets: &StateSecrets,
    cap: u64,
) -> Result<serde_json::Map<String, serde_json::Value>, String> {
    use serde::de::{Deserializer, IgnoredAny, MapAccess, Visitor};
    #[derive(serde::Deserialize)]
    struct Output {
        #[serde(default)]
        value: serde_json::Value,
    }
    /// The top-level object: `outputs` read under the budget, the rest skipped.
    struct Doc {
        until: std::rc::Rc<std::cell::Cell<Option<u64>>>,
        read: std::rc::Rc<std::cell::Cell<u64>>,
    }
    impl<'de> Visitor<'de> for Doc {
        type Value = BTreeMap<String, Output>;
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("a Terraform state (a JSON object)")
        }
        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
            let mut outputs = BTreeMap::new();
            while let Some(key) = map.next_key::<String>()? {
                if key == "outputs" {
                    self.until
                        .set(Some(self.read.get() + OUTPUTS_MAX_RAW_BYTES));
                    outputs = map
                        .next_value::<Option<BTreeMap<String, Output>>>()?
                        .unwrap_or_default();
                    self.until.set(None);
                } else {
                    map.next_value::<IgnoredAny>()?;
                }
            }
            Ok(outputs)
        }
    }
    let Some(chunks) = secrets.chunks() else {
        return Err(format!(
            "state Secret {} is missing or lacks a part",
            secrets.base_name
        ));
    };
    let read = std::rc::Rc::new(std::cell::Cell::new(0));
    let until = std::rc::Rc::new(std::cell::Cell::new(None));
    let gunzip = flate2::read::GzDecoder::new(Chain { chunks, index: 0 }).take(cap);
    let reader = Budgeted {
        inner: gunzip,
        read: read.clone(),
        until: until.clone(),
    };
    let mut de = serde_json::Deserializer::from_reader(reader);
    let doc = de
        .deserialize_map(Doc { until, read })
        .map_err(|e| format!("state Secret {}: {e}", secrets.base_name))?;
    let out: serde_json::Map<String, serde_json::Value> =
        doc.into_iter().map(|(k, o)| (k, o.value)).collect();
    let size = serde_json::to_vec(&out)
        .map(|v| v.len())
        .unwrap_or(usize::MAX);
    if size > OUTPUTS_MAX_BYTES {
        return Err(format!(
            "the outputs of state Secret {} are {size} bytes, more than the {OUTPUTS_MAX_BYTES} CAPTF reads",
            secrets.base_name
        ));
    }
    Ok(out)
}

/// Streams gunzip over base+parts (without concatenating), under the decompression cap,
/// and scans the JSON.
pub fn read(secrets: &StateSecrets, cap: u64) -> StateContent {
    read_noting(secrets, cap).0
}

/// [`read`], with a note when the state was read as Terraform reads it past stale parts:
/// when a state shrinks, Terraform writes the lower parts and then deletes the surplus
/// ones, and a delete that failed leaves them behind. Terraform's backend joins every
/// part and stops at the end of the gzip stream, ignoring what follows; so when the
/// stream ends exactly where a part ends, and every part after it is whole, the state is
/// what comes before (tried with Terraform 1.11.4; a gap in the parts crashes it, and
/// stays `StateCorrupt` here).
pub fn read_noting(secrets: &StateSecrets, cap: u64) -> (StateContent, Option<String>) {
    if !secrets.base_present {
        return (StateContent::Missing, None);
    }
    if let Some(message) = secrets.structural_problem() {
        return (StateContent::Corrupt { message }, None);
    }
    let chunks = secrets.chunks().expect("checked just above");
    let subject = |parts: usize| match parts {
        0 => format!("state Secret {}", secrets.base_name),
        1 => format!("state Secret {} (with its part 1)", secrets.base_name),
        n => format!(
            "state Secret {} (with its parts 1 to {n})",
            secrets.base_name
        ),
    };
    let all = chunks.len();
    let length = |chunks: &[&[u8]]| chunks.iter().map(|c| c.len() as u64).sum();
    let scanned = scan::scan(
        Chain {
            chunks: chunks.clone(),
            index: 0,
        },
        cap,
        length(&chunks),
    );
    if let scan::Scanned::Gzip(scan::GzipFailure::TrailingData { compressed }) = &scanned
        && let Some(live) = live_chunks(&chunks, *compressed)
    {
        let rescanned = scan::scan(
            Chain {
                chunks: chunks[..live].to_vec(),
                index: 0,
            },
            cap,
            length(&chunks[..live]),
        );
        if matches!(rescanned, scan::Scanned::Ok(_)) {
            let stale: Vec<u32> = (live as u32..all as u32).collect();
            let note = format!(
                "its part Secret(s) {} are left over from a larger state (a shrink whose delete failed); Terraform reads the state without them, and so does CAPTF; delete them once nothing runs (see runbooks/StateCorrupt.md)",
                list(&stale)
            );
            return (content(&subject(live - 1), rescanned), Some(note));
        }
    }
    (content(&subject(all - 1), scanned), None)
}

/// Where the first gzip member of `bytes` ends, when it decodes to its end within the
/// decompression cap (the output goes nowhere; the cap bounds the time a bomb takes).
pub(super) fn gzip_member_end(bytes: &[u8]) -> Option<u64> {
    use std::io::Read;
    let mut dec = flate2::bufread::GzDecoder::new(bytes);
    let copied = std::io::copy(
        &mut (&mut dec).take(DEFAULT_DECOMPRESSION_CAP + 1),
        &mut std::io::sink(),
    )
    .ok()?;
    if copied > DEFAULT_DECOMPRESSION_CAP {
        return None;
    }
    let rest = dec.into_inner().len();
    Some((bytes.len() - rest) as u64)
}

/// How many leading chunks hold the gzip stream that ended at byte `end` of the joined
/// chunks, when it ended exactly at the end of one that is not the last.
pub(super) fn live_chunks(chunks: &[&[u8]], end: u64) -> Option<usize> {
    let mut at = 0u64;
    for (i, c) in chunks.iter().enumerate() {
        at += c.len() as u64;
        if at == end {
            return (i + 1 < chunks.len()).then_some(i + 1);
        }
        if at > end {
            return None;
        }
    }
    None
}

/// Streams gunzip over `gzip` under the decompression cap and scans the JSON: the core of
/// [`read`], also used by the benchmark.
pub fn read_bytes(gzip: &[u8], cap: u64) -> StateContent {
    content("the state", scan::scan(gzip, cap, gzip.len() as u64))
}

/// "256 MiB" or "1000 bytes".
fn size(bytes: u64) -> String {
    const MIB: u64 = 1024 * 1024;
    if bytes >= MIB && bytes.is_multiple_of(MIB) {
        format!("{} MiB", bytes / MIB)
    } else {
        format!("{bytes} bytes")
    }
}

fn content(subject: &str, scanned: Scanned) -> StateContent {
    let fix = "restore the state (see runbooks/StateCorrupt.md)";
    let corrupt = |message: String| StateContent::Corrupt { message };
    match scanned {
        Scanned::Gzip(failure) => corrupt(match failure {
            GzipFailure::NotGzip { head } => {
                let start = if head.is_empty() {
                    "it is empty".to_string()
                } else {
                    let hex: Vec<String> = head.iter().map(|b| format!("{b:02x}")).collect();
                    let json = if head.first() == Some(&b'{') {
                        ", which looks like plain JSON"
                    } else {
                        ""
                    };
                    format!(
                        "it starts with bytes {} instead of 1f 8b{json}",
                        hex.join(" ")
                    )
                };
                format!("{subject} does not hold gzip data ({start}): {fix}")
            }
            GzipFailure::BadHeader { detail } => {
                format!(
                    "{subject} does not hold valid gzip data: its gzip header is invalid ({detail}): {fix}"
                )
            }
            GzipFailure::Truncated { compressed } => format!(
                "{subject} holds truncated gzip data: it ends after {compressed} bytes, before the end of the \
                 compressed stream (a part may be missing or cut short): {fix}"
            ),
            GzipFailure::Damaged { detail } => {
                format!("{subject} holds damaged gzip data ({detail}): {fix}")
            }
            GzipFailure::TrailingData { compressed } => format!(
                "{subject} holds unexpected data after the end of the gzip stream (from byte {compressed} of the \
                 compressed data): {fix}"
            ),
            GzipFailure::OverCap { cap } => format!(
                "{subject} decompresses to more than {} (the decompression cap), so reading stopped there: it is \
                 damaged or not a state CAPTF can read; {fix}",
                size(cap)
            ),
            GzipFailure::Io { detail } => format!("{subject} could not be read ({detail}): {fix}"),
        }),
        Scanned::Json(e) => corrupt(format!(
            "{subject} is not valid JSON: {} at byte {} of the decompressed state: {fix}",
            e.what, e.offset
        )),
        Scanned::Ok(summary) => summary_content(subject, summary),
    }
}

fn summary_content(subject: &str, s: Summary) -> StateContent {
    let not_state = |why: String| StateContent::Corrupt {
        message: format!(
            "{subject} is not a Terraform state: {why}; restore the state (see runbooks/StateCorrupt.md)"
        ),
    };
    if !s.top_is_object {
        return not_state("the document is not a JSON object".into());
    }
    if s.encrypted {
        return StateContent::Encrypted {
            lineage: s.lineage.value().cloned(),
            serial: s.serial.value().copied(),
            message: format!(
                "{subject} is an OpenTofu encrypted state (it has encryption_version or encrypted_data): CAPTF cannot \
                 tell which resources it describes; store the decrypted state in its place (see \
                 runbooks/StateEncrypted.md)"
            ),
        };
    }
    match s.version {
        Field::Value(4) => {}
        Field::Value(v) => {
            return not_state(format!(
                "its version is {v}, and CAPTF reads version 4 (written by Terraform 0.12 and later)"
            ));
        }
        Field::Invalid(why) => return not_state(why),
        Field::Absent => return not_state("it has no version".into()),
    }
    let lineage = match s.lineage {
        Field::Value(l) => l,
        Field::Invalid(why) => return not_state(why),
        Field::Absent => return not_state("it has no lineage".into()),
    };
    let serial = match s.serial {
        Field::Value(n) => n,
        Field::Invalid(why) => return not_state(why),
        Field::Absent => return not_state("it has no serial".into()),
    };
    let managed_instances = match s.resources {
        Field::Value(n) => n,
        Field::Invalid(why) => return not_state(why),
        Field::Absent => return not_state("it has no resources array".into()),
    };
    StateContent::Parsed {
        lineage,
        serial,
        managed_instances,
    }
}
