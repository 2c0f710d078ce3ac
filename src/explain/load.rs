//! Reading objects as `kubectl get -o yaml` or `-o json` writes them: single objects,
//! multi-document YAML, `List`s, and directories of such files. Untrusted bytes: every
//! file has a size limit, and the YAML parser's own budget guards against alias bombs.

use std::path::{Path, PathBuf};

use serde_json::Value;

/// The largest file read (a state of 100 MB of JSON is about 20 MB of base64 gzip).
pub const MAX_FILE_BYTES: u64 = 128 * 1024 * 1024;

/// One object read from a file, with where it came from.
#[derive(Clone, Debug)]
pub struct Loaded {
    /// `path` or `path#N` (the Nth object of a multi-document file or List, from 1).
    pub source: String,
    pub value: Value,
}

#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("{path}: cannot read: {source}")]
    Read {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "{path}: the file is {size} bytes, more than the limit of {MAX_FILE_BYTES}; split it or pass the objects as separate files"
    )]
    TooLarge { path: String, size: u64 },
    #[error("{path}: not valid YAML or JSON: {message}")]
    Parse { path: String, message: String },
    #[error("{origin}: not a Kubernetes object (a mapping with apiVersion and kind is expected)")]
    NotAnObject { origin: String },
    #[error("{path}: no .yaml, .yml or .json file in this directory")]
    EmptyDir { path: String },
}

/// Reads every path: a file, or a directory (its `.yaml`, `.yml` and `.json` files, sorted,
/// recursively).
pub fn load_paths(paths: &[PathBuf]) -> Result<Vec<Loaded>, LoadError> {
    let mut out = Vec::new();
    for path in paths {
        if path.is_dir() {
            let mut files = Vec::new();
            collect_dir(path, &mut files)?;
            if files.is_empty() {
                return Err(LoadError::EmptyDir {
                    path: path.display().to_string(),
                });
            }
            for file in files {
                out.extend(load_file(&file)?);
            }
        } else {
            out.extend(load_file(path)?);
        }
    }
    Ok(out)
}

fn collect_dir(dir: &Path, files: &mut Vec<PathBuf>) -> Result<(), LoadError> {
    let read_err = |source| LoadError::Read {
        path: dir.display().to_string(),
        source,
    };
    let mut entries: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(read_err)?
        .map(|e| e.map(|e| e.path()))
        .collect::<Result<_, _>>()
        .map_err(read_err)?;
    entries.sort();
    for entry in entries {
        if entry.is_dir() {
            collect_dir(&entry, files)?;
        } else if matches!(
            entry.extension().and_then(|e| e.to_str()),
            Some("yaml" | "yml" | "json")
        ) {
            files.push(entry);
        }
    }
    Ok(())
}

/// Reads one file into its objects, `List`s flattened.
pub fn load_file(path: &Path) -> Result<Vec<Loaded>, LoadError> {
    let shown = path.display().to_string();
    let read_err = |source| LoadError::Read {
        path: shown.clone(),
        source,
    };
    let size = std::fs::metadata(path).map_err(read_err)?.len();
    if size > MAX_FILE_BYTES {
        return Err(LoadError::TooLarge { path: shown, size });
    }
    let text = std::fs::read_to_string(path).map_err(read_err)?;
    let docs = parse_documents(&text).map_err(|message| LoadError::Parse {
        path: shown.clone(),
        message,
    })?;
    let mut out = Vec::new();
    let numbered = docs.len() > 1;
    for (i, doc) in docs.into_iter().enumerate() {
        let source = if numbered {
            format!("{shown}#{}", i + 1)
        } else {
            shown.clone()
        };
        flatten(doc, &source, &mut out)?;
    }
    Ok(out)
}

/// Parses JSON (one value) or YAML (one or more documents; empty documents dropped).
pub fn parse_documents(text: &str) -> Result<Vec<Value>, String> {
    let trimmed = text.trim_start();
    if trimmed.starts_with('{') || trimmed.starts_with('[') {
        // kubectl's -o json; a JSON parse error is reported as such, not as YAML.
        return match serde_json::from_str::<Value>(trimmed) {
            Ok(Value::Array(items)) => Ok(items),
            Ok(v) => Ok(vec![v]),
            Err(e) => Err(format!("JSON: {e}")),
        };
    }
    let docs: Vec<Value> = serde_saphyr::from_multiple(text).map_err(|e| e.to_string())?;
    Ok(docs.into_iter().filter(|d| !d.is_null()).collect())
}

fn flatten(doc: Value, source: &str, out: &mut Vec<Loaded>) -> Result<(), LoadError> {
    let Some(map) = doc.as_object() else {
        return Err(LoadError::NotAnObject {
            origin: source.to_string(),
        });
    };
    let kind = map.get("kind").and_then(Value::as_str).unwrap_or_default();
    let is_list =
        kind == "List" || (kind.ends_with("List") && map.get("items").is_some_and(Value::is_array));
    if is_list {
        let items = match doc {
            Value::Object(mut m) => m.remove("items"),
            _ => None,
        };
        for (i, item) in items
            .and_then(|v| v.as_array().cloned())
            .unwrap_or_default()
            .into_iter()
            .enumerate()
        {
            flatten(item, &format!("{source} item {}", i + 1), out)?;
        }
        return Ok(());
    }
    if kind.is_empty() || !map.get("apiVersion").is_some_and(Value::is_string) {
        return Err(LoadError::NotAnObject {
            origin: source.to_string(),
        });
    }
    out.push(Loaded {
        source: source.to_string(),
        value: doc,
    });
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn multi_document_yaml_and_lists_are_flattened() {
        let text = "---\napiVersion: v1\nkind: Secret\nmetadata: {name: a, namespace: x}\n---\n---\napiVersion: v1\nkind: List\nitems:\n- apiVersion: v1\n  kind: Namespace\n  metadata: {name: x}\n- apiVersion: v1\n  kind: Secret\n  metadata: {name: b, namespace: x}\n";
        let docs = parse_documents(text).expect("parses");
        let mut out = Vec::new();
        for d in docs {
            flatten(d, "f", &mut out).expect("objects");
        }
        let kinds: Vec<_> = out
            .iter()
            .map(|l| l.value["kind"].as_str().unwrap_or_default().to_string())
            .collect();
        assert_eq!(kinds, ["Secret", "Namespace", "Secret"]);
    }

    #[test]
    fn json_lists_parse() {
        let docs = parse_documents(r#"{"apiVersion":"v1","kind":"SecretList","items":[{"apiVersion":"v1","kind":"Secret","metadata":{"name":"a"}}]}"#)
            .expect("parses");
        let mut out = Vec::new();
        flatten(docs[0].clone(), "f", &mut out).expect("objects");
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].source, "f item 1");
    }

    #[test]
    fn malformed_input_is_an_error_not_a_panic() {
        assert!(parse_documents("a: [unclosed").is_err());
        assert!(parse_documents("{\"a\": ").is_err());
        let mut out = Vec::new();
        let docs = parse_documents("- just\n- a list\n").expect("valid yaml");
        assert!(matches!(
            flatten(docs[0].clone(), "f", &mut out),
            Err(LoadError::NotAnObject { .. })
        ));
        let docs = parse_documents("kind: Secret\n").expect("valid yaml");
        assert!(matches!(
            flatten(docs[0].clone(), "f", &mut out),
            Err(LoadError::NotAnObject { .. })
        ));
    }

    #[test]
    fn alias_bombs_are_refused() {
        let mut bomb = String::from("a: &a [x,x,x,x,x,x,x,x,x,x]\n");
        for i in 1..12 {
            bomb.push_str(&format!(
                "{}: &{} [*{},*{},*{},*{},*{},*{},*{},*{},*{},*{}]\n",
                (b'a' + i) as char,
                (b'a' + i) as char,
                (b'a' + i - 1) as char,
                (b'a' + i - 1) as char,
                (b'a' + i - 1) as char,
                (b'a' + i - 1) as char,
                (b'a' + i - 1) as char,
                (b'a' + i - 1) as char,
                (b'a' + i - 1) as char,
                (b'a' + i - 1) as char,
                (b'a' + i - 1) as char,
                (b'a' + i - 1) as char
            ));
        }
        assert!(parse_documents(&bomb).is_err());
    }
}
