//! The explain loader (`captf explain -f`, and `captf state inspect --secret-file`, which
//! reads its Secrets with it): YAML (one or more documents) or JSON, objects and `List`s.
//!
//! Properties: a verdict (objects or a refusal) for every file; within the time bound;
//! memory within a multiple of the file plus the YAML parser's budget (alias bombs); what
//! is loaded is Kubernetes objects (a mapping with a `kind` and an `apiVersion`), named
//! `path`, `path#N` or `… item N`; each reads back the same when written as JSON (the `-o json`
//! form); and `captf state inspect` on the same file gives a verdict or a refusal.

use std::path::PathBuf;

use captf::explain::load::{load_file, parse_documents};
use captf::ops::inspect::inspect;
use serde_json::Value;

use crate::{Limits, bounded};

/// Per byte of text: the parser's events and a `serde_json::Value` a node.
const PER_BYTE: usize = 512;
/// What a small document may expand to through aliases within the YAML parser's budget
/// (serde-saphyr's default: 250,000 nodes, 64 MiB of scalar bytes); a billion laughs in
/// 700 bytes peaks at 68 MB before the budget refuses it, 20 KB aliased 125,000 times at
/// about 70 MB.
const OVERHEAD: usize = 160 * 1024 * 1024;

fn scratch() -> PathBuf {
    std::env::temp_dir().join(format!("captf-fuzz-explain-{}.yaml", std::process::id()))
}

pub fn explain(data: &[u8], limits: &Limits) {
    let path = scratch();
    std::fs::write(&path, data).expect("the scratch file is written");
    let bound = PER_BYTE * data.len() + OVERHEAD;
    let loaded = bounded("load::load_file", limits, bound, || load_file(&path));
    let shown = path.display().to_string();
    if let Ok(objects) = &loaded {
        for (i, o) in objects.iter().enumerate() {
            assert!(
                o.value["kind"].as_str().is_some_and(|k| !k.is_empty())
                    && o.value["apiVersion"].is_string(),
                "not a Kubernetes object loaded: {}",
                o.value
            );
            assert!(
                o.source == shown
                    || o.source.starts_with(&format!("{shown}#"))
                    || o.source.starts_with(&format!("{shown} item ")),
                "object {i} is from {:?}",
                o.source
            );
            if o.value["kind"] != "List" {
                let json = serde_json::to_string(&o.value).expect("a value serialises");
                let back = parse_documents(&json);
                assert_eq!(
                    back.as_ref(),
                    Ok(&vec![o.value.clone()]),
                    "an object loaded reads otherwise as JSON"
                );
            }
        }
    }
    // Text the loader reads as JSON is JSON: serde_json and the loader agree on it.
    if let Ok(text) = std::str::from_utf8(data) {
        let trimmed = text.trim_start();
        if trimmed.starts_with('{') || trimmed.starts_with('[') {
            let docs = bounded("load::parse_documents", limits, bound, || {
                parse_documents(text)
            });
            match serde_json::from_str::<Value>(trimmed) {
                Ok(Value::Array(items)) => assert_eq!(docs, Ok(items)),
                Ok(v) => assert_eq!(docs, Ok(vec![v])),
                Err(_) => assert!(docs.is_err()),
            }
        }
    }
    let _ = bounded("inspect::inspect", limits, bound, || {
        inspect(std::slice::from_ref(&path), None)
    });
    let _ = std::fs::remove_file(&path);
}
