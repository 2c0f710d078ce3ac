//! The state reader: part joining, streaming gunzip under the cap, the scanner and the
//! classification, on the Secrets of one state.
//!
//! The input's first byte says how to use the rest:
//! - bit 0 clear: the rest is JSON text, gzipped here (so the scanner sees valid gzip);
//!   bit 0 set: the rest is the gzip bytes themselves.
//! - bits 1 to 3: how many part Secrets the gzip bytes are cut into (0 to 7).
//! - bit 4: the base Secret has no `tfstate` key; bit 5: there is no base Secret.
//! - bit 6: one part Secret is missing (a gap); bit 7: a stale part of junk follows.
//!
//! Properties: a verdict for every input; within the time bound; the streaming read holds
//! no more than its buffers above the input, whatever the input decompresses to (a gzip
//! bomb included); joining parts is invisible (the same content as reading the joined
//! bytes); and on JSON, agreement with serde_json (what is JSON, and the facts of a state).

use std::io::Write;

use captf::state::{self, StateContent, StateSecrets};
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde_json::Value;

use crate::{Limits, bounded};

const BASE: &str = "tfstate-default-web-1.tfm";

/// What the streaming read may hold above its input: the scanner's two 64 KiB buffers,
/// the inflate state and window, its container stack (10,000 levels), the messages.
const STREAM_OVERHEAD: usize = 1024 * 1024;

pub fn state(data: &[u8], limits: &Limits) {
    let Some((&flags, rest)) = data.split_first() else {
        return;
    };
    let json_mode = flags & 1 == 0;
    let gzip = if json_mode { gz(rest) } else { rest.to_vec() };
    let parts = usize::from((flags >> 1) & 7);
    let chunks = cut(&gzip, parts);
    let no_key = flags & 0x10 != 0;
    let no_base = flags & 0x20 != 0;
    let gap = flags & 0x40 != 0 && parts >= 2;
    let stale = flags & 0x80 != 0;

    let mut secrets = Vec::new();
    for (i, c) in chunks.iter().enumerate() {
        if i == 0 && no_base {
            continue;
        }
        if gap && i == 1 {
            continue;
        }
        let name = if i == 0 {
            BASE.to_string()
        } else {
            format!("{BASE}-part-{i}")
        };
        secrets.push(secret(&name, (!(i == 0 && no_key)).then_some(c)));
    }
    if stale {
        let name = format!("{BASE}-part-{}", chunks.len());
        secrets.push(secret(&name, Some(&b"left over"[..])));
    }
    let clean = !no_key && !no_base && !gap && !stale;
    let n = data.len();

    let (content, note) = bounded(
        "state::read_noting",
        limits,
        2 * n + STREAM_OVERHEAD,
        || {
            let s = StateSecrets::from_secrets(BASE, &secrets);
            state::read_noting(&s, limits.state_cap)
        },
    );
    // A verdict, for every content and either fingerprint flag.
    for interrupted in [false, true] {
        let v = state::classify_named(BASE, &content, None, interrupted);
        assert!(!v.message.is_empty(), "a verdict without a message: {v:?}");
        if matches!(
            content,
            StateContent::Corrupt { .. } | StateContent::Encrypted { .. }
        ) {
            assert!(!v.readable, "an unreadable state read as readable: {v:?}");
        }
        if let StateContent::Parsed {
            managed_instances, ..
        } = &content
        {
            assert_eq!(
                v.managed_instances,
                Some(*managed_instances),
                "the verdict counts other instances than the read: {v:?}"
            );
        }
    }
    // The instances of the state (what the apply side compares): a list or a reason,
    // within a memory bound of the decompressed bytes (the cap) it may hold.
    bounded(
        "StateSecrets::instances",
        limits,
        4 * n + 8 * limits.state_cap as usize + STREAM_OVERHEAD,
        || {
            let s = StateSecrets::from_secrets(BASE, &secrets);
            let _ = s.instances(limits.state_cap);
        },
    );

    if clean && note.is_none() {
        // Parts are invisible: the same content as the joined bytes read whole.
        let whole = state::read_bytes(&gzip[..], limits.state_cap);
        assert_eq!(
            shape(&content),
            shape(&whole),
            "the parts read otherwise than the joined bytes:\n  parts: {content:?}\n  whole: {whole:?}"
        );
    }
    if json_mode && clean {
        agree_with_serde_json(rest, &content);
    }
}

/// The content without its message (messages name the Secrets or "the state").
fn shape(c: &StateContent) -> String {
    match c {
        StateContent::Corrupt { .. } => "corrupt".into(),
        StateContent::Encrypted {
            lineage, serial, ..
        } => format!("encrypted {lineage:?} {serial:?}"),
        other => format!("{other:?}"),
    }
}

fn secret(name: &str, value: Option<&[u8]>) -> Secret {
    Secret {
        metadata: ObjectMeta {
            name: Some(name.to_string()),
            ..Default::default()
        },
        data: value.map(|v| {
            [("tfstate".to_string(), ByteString(v.to_vec()))]
                .into_iter()
                .collect()
        }),
        ..Default::default()
    }
}

fn gz(bytes: &[u8]) -> Vec<u8> {
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    e.write_all(bytes).expect("in memory");
    e.finish().expect("in memory")
}

/// `bytes` cut into `parts + 1` pieces (the base and its parts), none empty when it can
/// be helped.
fn cut(bytes: &[u8], parts: usize) -> Vec<&[u8]> {
    let pieces = parts + 1;
    let size = bytes.len().div_ceil(pieces).max(1);
    let mut out: Vec<&[u8]> = bytes.chunks(size).collect();
    while out.len() < pieces {
        out.push(&[]);
    }
    if out.is_empty() {
        out.push(bytes);
    }
    out
}

/// The scanner against serde_json on the same text.
fn agree_with_serde_json(text: &[u8], content: &StateContent) {
    let not_json = matches!(content, StateContent::Corrupt { message } if message.contains("is not valid JSON"));
    let syntax = serde_json::from_slice::<serde::de::IgnoredAny>(text);
    match &syntax {
        Ok(_) => assert!(
            !not_json,
            "the scanner refuses JSON that serde_json reads: {content:?}"
        ),
        Err(e) => {
            // serde_json stops at 128 levels (Go at 10,000), insists on UTF-8 and on
            // paired surrogates, where Go (and so Terraform and the scanner) does not.
            let ours = e.to_string();
            let comparable = text.is_ascii()
                && !ours.contains("recursion limit")
                && !ours.contains("surrogate")
                && !ours.contains("unicode");
            if comparable {
                assert!(
                    not_json,
                    "serde_json refuses ({ours}) what the scanner reads: {content:?}"
                );
            }
        }
    }
    if let Ok(doc) = serde_json::from_slice::<Value>(text)
        && syntax.is_ok()
    {
        let expected = reference(&doc);
        assert_eq!(
            shape(content),
            shape(&expected),
            "the scanner and serde_json read different facts: scanner {content:?}, serde_json {expected:?}"
        );
    }
}

/// What a state's facts are, read with serde_json (SPEC section 4): the second
/// implementation the scanner is held to.
pub fn reference(doc: &Value) -> StateContent {
    let corrupt = || StateContent::Corrupt {
        message: String::new(),
    };
    let Value::Object(top) = doc else {
        return corrupt();
    };
    let unsigned = |v: Option<&Value>| v.and_then(integer);
    let lineage = match top.get("lineage") {
        Some(Value::String(s)) if !s.is_empty() && s.len() <= 1024 => Some(s.clone()),
        _ => None,
    };
    if top.contains_key("encryption_version") || top.contains_key("encrypted_data") {
        return StateContent::Encrypted {
            lineage,
            serial: unsigned(top.get("serial")),
            message: String::new(),
        };
    }
    if unsigned(top.get("version")) != Some(4) {
        return corrupt();
    }
    let (Some(lineage), Some(serial)) = (lineage, unsigned(top.get("serial"))) else {
        return corrupt();
    };
    let Some(Value::Array(resources)) = top.get("resources") else {
        return corrupt();
    };
    let mut managed = 0u64;
    for r in resources {
        let Value::Object(r) = r else {
            return corrupt();
        };
        let count = match r.get("instances") {
            None | Some(Value::Null) => 0,
            Some(Value::Array(items)) if items.iter().all(Value::is_object) => items.len() as u64,
            Some(_) => return corrupt(),
        };
        match r.get("mode") {
            Some(Value::String(m)) if m == "managed" => managed += count,
            Some(Value::String(m)) if m == "data" => {}
            _ => return corrupt(),
        }
    }
    StateContent::Parsed {
        lineage,
        serial,
        managed_instances: managed,
    }
}

/// A non-negative integer written without fraction, exponent or sign (as Go reads a
/// `uint64`; serde_json turns `4.0` and `-0` into floats).
fn integer(v: &Value) -> Option<u64> {
    match v {
        Value::Number(n) if n.is_u64() => n.as_u64(),
        _ => None,
    }
}
