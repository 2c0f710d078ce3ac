//! Reading a Terraform state from its Secret(s) in the kubernetes-backend format: joining
//! part Secrets, streaming gunzip under a decompression cap, and classifying the result
//! (SPEC section 4, "State readability").
//!
//! The state is never built in memory: [`read`] streams the base and part values through
//! gunzip into a scanner that keeps only what the rule table needs (lineage, serial and
//! whether managed resource instances exist).

mod classify;
mod errored;
pub mod instances;
pub mod lock;
pub mod permits;
mod scan;
pub mod secrets;

use std::collections::BTreeMap;
use std::io::{self, Read};

use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use crate::api::names::{
    TF_CHUNK_SIZE, TF_LABEL_SUFFIX, TF_STATE_KEY, part_index, part_secret_name,
};

pub use classify::{Fingerprint, StateReason, Verdict, classify, classify_named};
pub use errored::Errored;
use scan::{Field, GzipFailure, Scanned, Summary};

/// Default decompression cap: more decompressed JSON than this is a corrupt state.
pub const DEFAULT_DECOMPRESSION_CAP: u64 = 256 * 1024 * 1024;

/// The Secrets of one state (or of a backup, which has the same chunking): the base and
/// its parts.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct StateSecrets {
    pub base_name: String,
    /// Value of key `tfstate` of the base Secret; None = key missing (or no base Secret).
    pub base: Option<Vec<u8>>,
    /// Whether the base Secret exists.
    pub base_present: bool,
    /// Part N → value of its key `tfstate` (None = key missing).
    pub parts: BTreeMap<u32, Option<Vec<u8>>>,
    /// The other Secrets that were looked at and carry this state's `tfstateSecretSuffix`
    /// label: name → labels. Terraform's backend selects the state by labels, not by
    /// name, so one of these with the full set of its labels is read by Terraform as a
    /// part of this state (see [`StateSecrets::strangers`]).
    pub labelled_others: BTreeMap<String, BTreeMap<String, String>>,
    /// The metadata of the base and its parts, by name (for their protection finalizer).
    pub metas: BTreeMap<String, k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta>,
}

fn state_value(secret: &Secret) -> Option<Vec<u8>> {
    secret
        .data
        .as_ref()
        .and_then(|d| d.get(TF_STATE_KEY))
        .map(|v| v.0.clone())
}

impl StateSecrets {
    /// Picks the base Secret (named `base_name`) and its `-part-N` Secrets out of any set
    /// of Secrets (others ignored).
    pub fn from_secrets(base_name: &str, secrets: &[Secret]) -> StateSecrets {
        let mut out = StateSecrets::empty(base_name);
        for secret in secrets {
            out.add(&secret.metadata, || state_value(secret));
        }
        out
    }

    /// [`StateSecrets::from_secrets`], taking the Secrets: their values move, so a state
    /// read is in memory once, not twice.
    pub fn from_owned(base_name: &str, secrets: Vec<Secret>) -> StateSecrets {
        let mut out = StateSecrets::empty(base_name);
        for mut secret in secrets {
            let value = secret
                .data
                .as_mut()
                .and_then(|d| d.remove(TF_STATE_KEY))
                .map(|v| v.0);
            out.add(&secret.metadata, || value);
        }
        out
    }

    fn empty(base_name: &str) -> StateSecrets {
        StateSecrets {
            base_name: base_name.to_string(),
            ..StateSecrets::default()
        }
    }

    /// Takes in one Secret: the base, a part, or another with this state's suffix label.
    fn add(&mut self, meta: &ObjectMeta, value: impl FnOnce() -> Option<Vec<u8>>) {
        let Some(name) = meta.name.as_deref() else {
            return;
        };
        let suffix = self
            .base_name
            .strip_prefix(&format!("tfstate-{}-", crate::api::names::TF_WORKSPACE));
        if name == self.base_name {
            self.base_present = true;
            self.base = value();
            self.metas.insert(name.to_string(), meta.clone());
        } else if let Some(n) = part_index(&self.base_name, name) {
            self.parts.insert(n, value());
            self.metas.insert(name.to_string(), meta.clone());
        } else if let Some(labels) = &meta.labels
            && suffix.is_some()
            && labels.get(TF_LABEL_SUFFIX).map(String::as_str) == suffix
        {
            self.labelled_others
                .insert(name.to_string(), labels.clone());
        }
    }

    /// The Secrets, other than the base and its parts, that Terraform's backend would
    /// select with `selector` (its own labels and its configured ones): it reads them as
    /// chunks of this state, so Terraform and CAPTF would not read the same state.
    pub fn strangers(&self, selector: &BTreeMap<String, String>) -> Vec<String> {
        self.labelled_others
            .iter()
            .filter(|(_, labels)| selector.iter().all(|(k, v)| labels.get(k) == Some(v)))
            .map(|(name, _)| name.clone())
            .collect()
    }

    /// The first problem with the set of Secrets before any byte is read, as the message
    /// of a corrupt state (None = the chunks are all there).
    fn structural_problem(&self) -> Option<String> {
        let base = &self.base_name;
        let fix = "restore the state (see runbooks/StateCorrupt.md)";
        match &self.base {
            None => {
                return Some(format!(
                    "state Secret {base} has no key {TF_STATE_KEY}: {fix}"
                ));
            }
            Some(v) if v.is_empty() => {
                return Some(format!(
                    "state Secret {base} has an empty key {TF_STATE_KEY}: {fix}"
                ));
            }
            Some(_) => {}
        }
        let last = self.parts.keys().next_back().copied().unwrap_or(0);
        for n in 1..=last {
            match self.parts.get(&n) {
                None => {
                    let have: Vec<u32> = self.parts.keys().copied().collect();
                    let have = if have.len() == 1 {
                        format!("part {}", have[0])
                    } else {
                        format!("parts {}", list(&have))
                    };
                    return Some(format!(
                        "state Secret {} is missing: the state has {have}; {fix}",
                        part_secret_name(base, n)
                    ));
                }
                Some(None) => {
                    return Some(format!(
                        "state Secret {} has no key {TF_STATE_KEY}: {fix}",
                        part_secret_name(base, n)
                    ));
                }
                Some(Some(_)) => {}
            }
        }
        None
    }

    /// The chunks in order (base, then parts 1..N), when all are there.
    fn chunks(&self) -> Option<Vec<&[u8]>> {
        if !self.base_present {
            return None;
        }
        let mut out = vec![self.base.as_deref()?];
        for (i, (n, part)) in self.parts.iter().enumerate() {
            if *n as usize != i + 1 {
                return None;
            }
            out.push(part.as_deref()?);
        }
        Some(out)
    }

    /// The joined gzip bytes (base then parts 1..N), or None when absent/incomplete.
    /// (Used for the backup.) Parts left over past the end of the gzip stream (see
    /// [`read_noting`]) are not part of it.
    pub fn joined(&self) -> Option<Vec<u8>> {
        let chunks = self.chunks()?;
        let all = chunks.concat();
        let end = gzip_member_end(&all);
        match end.and_then(|e| live_chunks(&chunks, e)) {
            Some(live) => Some(chunks[..live].concat()),
            None => Some(all),
        }
    }
}

impl StateSecrets {
    /// The managed resource instances of this state, by identity (see
    /// [`instances::read`]); an error says why they cannot be told.
    pub fn instances(&self, cap: u64) -> Result<instances::Instances, String> {
        if !self.base_present {
            return Ok(instances::Instances {
                lineage: None,
                serial: None,
                managed: Default::default(),
            });
        }
        if let Some(message) = self.structural_problem() {
            return Err(message);
        }
        let chunks = self.chunks().expect("checked just above");
        instances::read(Chain { chunks, index: 0 }, true, cap)
    }
}

/// "1, 3 and 4".
fn list(items: &[u32]) -> String {
    match items {
        [] => String::new(),
        [one] => one.to_string(),
        [init @ .., last] => {
            let init: Vec<String> = init.iter().map(u32::to_string).collect();
            format!("{} and {last}", init.join(", "))
        }
    }
}

/// What a state's bytes turned out to be.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StateContent {
    /// No base Secret.
    Missing,
    /// Unreadable; the message says why and what to do.
    Corrupt { message: String },
    /// An OpenTofu encrypted state.
    Encrypted {
        lineage: Option<String>,
        serial: Option<u64>,
        message: String,
    },
    /// A version-4 Terraform state.
    Parsed {
        lineage: String,
        serial: u64,
        managed_instances: u64,
    },
}

/// A reader over several byte slices in turn, without joining them.
struct Chain<'a> {
    chunks: Vec<&'a [u8]>,
    index: usize,
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

/// The largest top-level `outputs` CAPTF reads (its JSON, as serde_json writes it back).
pub const OUTPUTS_MAX_BYTES: usize = 1024 * 1024;

/// How many bytes of the state the `outputs` member may take where it stands (its values
/// with their types and `sensitive` flags): read past this, it is refused before any of it
/// is held whole.
const OUTPUTS_MAX_RAW_BYTES: u64 = 4 * OUTPUTS_MAX_BYTES as u64;

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
fn gzip_member_end(bytes: &[u8]) -> Option<u64> {
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
fn live_chunks(chunks: &[&[u8]], end: u64) -> Option<usize> {
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

/// Splits gzip bytes into chunks of TF_CHUNK_SIZE exactly as Terraform does (first chunk
/// in the base Secret, chunk N in part N): used to write backups and `captf state restore`.
pub fn chunk(gzip: &[u8]) -> Vec<&[u8]> {
    if gzip.is_empty() {
        return vec![gzip];
    }
    gzip.chunks(TF_CHUNK_SIZE).collect()
}

#[cfg(test)]
mod tests;
