//! Minimal decoding of Kubernetes protobuf request bodies (`application/vnd.kubernetes.protobuf`):
//! kubectl's generator commands (e.g. `kubectl create namespace`) send built-in objects as
//! protobuf and do not fall back to JSON. Only the `k8s\0` envelope, `TypeMeta` and
//! `Namespace`, `Secret`, `ConfigMap` and `ServiceAccount` (metadata name/generateName/namespace/
//! labels/annotations/finalizers, and the data maps) are decoded; any other protobuf body gets
//! 415. Responses are always JSON (clients accept it).

use base64::Engine;
use serde_json::{Map, Value, json};

/// A protobuf field value: varint or length-delimited bytes (other wire types are skipped).
enum Field<'a> {
    Varint,
    Bytes(&'a [u8]),
}

fn varint(b: &[u8], i: &mut usize) -> Option<u64> {
    let mut v = 0u64;
    for shift in (0..64).step_by(7) {
        let byte = *b.get(*i)?;
        *i += 1;
        v |= u64::from(byte & 0x7f) << shift;
        if byte & 0x80 == 0 {
            return Some(v);
        }
    }
    None
}

fn fields(b: &[u8]) -> Option<Vec<(u64, Field<'_>)>> {
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        let key = varint(b, &mut i)?;
        let (num, wire) = (key >> 3, key & 7);
        match wire {
            0 => {
                varint(b, &mut i)?;
                out.push((num, Field::Varint));
            }
            2 => {
                let len = usize::try_from(varint(b, &mut i)?).ok()?;
                let end = i.checked_add(len)?;
                out.push((num, Field::Bytes(b.get(i..end)?)));
                i = end;
            }
            1 => i += 8,
            5 => i += 4,
            _ => return None,
        }
    }
    Some(out)
}

fn string(f: &Field<'_>) -> Option<String> {
    match f {
        Field::Bytes(b) => Some(String::from_utf8_lossy(b).into_owned()),
        Field::Varint => None,
    }
}

fn map_entries(entries: &[&Field<'_>], value: impl Fn(&Field<'_>) -> Value) -> Option<Value> {
    let mut m = Map::new();
    for e in entries {
        let Field::Bytes(b) = e else { return None };
        let kv = fields(b)?;
        let k = kv
            .iter()
            .find(|(n, _)| *n == 1)
            .and_then(|(_, f)| string(f))
            .unwrap_or_default();
        let v = kv
            .iter()
            .find(|(n, _)| *n == 2)
            .map(|(_, f)| value(f))
            .unwrap_or(json!(""));
        m.insert(k, v);
    }
    Some(Value::Object(m))
}

fn string_map(entries: &[&Field<'_>]) -> Option<Value> {
    map_entries(entries, |f| json!(string(f).unwrap_or_default()))
}

fn bytes_map(entries: &[&Field<'_>]) -> Option<Value> {
    map_entries(entries, |f| match f {
        Field::Bytes(b) => json!(base64::engine::general_purpose::STANDARD.encode(b)),
        Field::Varint => json!(""),
    })
}

fn object_meta(b: &[u8]) -> Option<Value> {
    let fs = fields(b)?;
    let mut meta = Map::new();
    let all = |n: u64| -> Vec<&Field<'_>> {
        fs.iter().filter(|(k, _)| *k == n).map(|(_, f)| f).collect()
    };
    for (num, key) in [(1, "name"), (2, "generateName"), (3, "namespace")] {
        if let Some(s) = all(num)
            .first()
            .and_then(|f| string(f))
            .filter(|s| !s.is_empty())
        {
            meta.insert(key.into(), json!(s));
        }
    }
    for (num, key) in [(11, "labels"), (12, "annotations")] {
        let entries = all(num);
        if !entries.is_empty() {
            meta.insert(key.into(), string_map(&entries)?);
        }
    }
    let fins: Vec<String> = all(14).iter().filter_map(|f| string(f)).collect();
    if !fins.is_empty() {
        meta.insert("finalizers".into(), json!(fins));
    }
    Some(Value::Object(meta))
}

/// Decode a protobuf body into JSON, or `Err(reason)` if it is not something we understand.
pub fn decode(body: &[u8]) -> Result<Value, String> {
    let inner = body
        .strip_prefix(b"k8s\x00")
        .ok_or("missing the k8s protobuf envelope")?;
    let unknown = fields(inner).ok_or("malformed protobuf")?;
    let type_meta = unknown.iter().find(|(n, _)| *n == 1).map(|(_, f)| f);
    let Some(Field::Bytes(tm)) = type_meta else {
        return Err("missing TypeMeta".into());
    };
    let tm = fields(tm).ok_or("malformed TypeMeta")?;
    let api_version = tm
        .iter()
        .find(|(n, _)| *n == 1)
        .and_then(|(_, f)| string(f))
        .unwrap_or_default();
    let kind = tm
        .iter()
        .find(|(n, _)| *n == 2)
        .and_then(|(_, f)| string(f))
        .unwrap_or_default();
    let Some((_, Field::Bytes(raw))) = unknown.iter().find(|(n, _)| *n == 2) else {
        return Err("missing raw".into());
    };
    let fs = fields(raw).ok_or("malformed object")?;
    let all = |n: u64| -> Vec<&Field<'_>> {
        fs.iter().filter(|(k, _)| *k == n).map(|(_, f)| f).collect()
    };
    let meta = match all(1).first() {
        Some(Field::Bytes(m)) => object_meta(m).ok_or("malformed ObjectMeta")?,
        _ => json!({}),
    };
    let mut obj = json!({"apiVersion": api_version, "kind": kind, "metadata": meta});
    // (field number, JSON name, bytes-valued map?) of the data maps per kind
    let maps: &[(u64, &str, bool)] = match (api_version.as_str(), kind.as_str()) {
        ("v1", "Namespace" | "ServiceAccount") => &[],
        ("v1", "Secret") => &[(2, "data", true), (4, "stringData", false)],
        ("v1", "ConfigMap") => &[(2, "data", false), (3, "binaryData", true)],
        (av, k) => {
            return Err(format!(
                "protobuf bodies for {av} {k} are not supported by the test server; send JSON (e.g. kubectl create -f)"
            ));
        }
    };
    for (num, name, is_bytes) in maps {
        let entries = all(*num);
        if !entries.is_empty() {
            obj[*name] = if *is_bytes {
                bytes_map(&entries)
            } else {
                string_map(&entries)
            }
            .ok_or("malformed map")?;
        }
    }
    if kind == "Secret"
        && let Some(t) = all(3)
            .first()
            .and_then(|f| string(f))
            .filter(|t| !t.is_empty())
    {
        obj["type"] = json!(t);
    }
    Ok(obj)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kubectl_create_namespace_body() {
        // Bytes kubectl v1.32 sends for `kubectl create namespace x`.
        let body = b"k8s\x00\n\x0f\n\x02v1\x12\tNamespace\x12\x19\n\x11\n\x01x\x12\x00\x1a\x00\"\x00*\x002\x008\x00\x12\x00\x1a\x00\x1a\x00\"\x00";
        let v = decode(body).expect("decode");
        assert_eq!(
            v,
            json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "x"}})
        );
        assert!(decode(b"nope").is_err());
        let secret = b"k8s\x00\n\x0c\n\x02v1\x12\x06Secret\x12\x1e\n\x12\n\x02s1\x12\x00\x1a\x00\"\x00*\x002\x008\x00B\x00\x12\x06\n\x01a\x12\x01b\x1a\x00\x1a\x00\"\x00";
        assert_eq!(
            decode(secret).expect("secret"),
            json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "s1"}, "data": {"a": "Yg=="}})
        );
        let cm = b"k8s\x00\n\x0f\n\x02v1\x12\tConfigMap\x12\x1c\n\x12\n\x02c1\x12\x00\x1a\x00\"\x00*\x002\x008\x00B\x00\x12\x06\n\x01k\x12\x01v\x1a\x00\"\x00";
        assert_eq!(
            decode(cm).expect("configmap"),
            json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c1"}, "data": {"k": "v"}})
        );
    }
}
