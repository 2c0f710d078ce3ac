//! PATCH bodies: JSON merge patch (RFC 7386), JSON patch (RFC 6902, including `test`), and a
//! reduced strategic merge patch for built-in kinds (maps merged, `null` deletes, lists of
//! objects with a `name` merged by name, `metadata.finalizers` merged as a set, other lists
//! replaced; `$patch`/`$retainKeys` directives are not supported). Server-side apply is not.

use serde_json::{Map, Value};

/// Patch content types the server understands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PatchType {
    Merge,
    Json,
    StrategicMerge,
    Apply,
}

impl PatchType {
    pub fn from_content_type(ct: &str) -> Option<PatchType> {
        let base = ct.split(';').next().unwrap_or_default().trim();
        match base {
            "application/merge-patch+json" => Some(PatchType::Merge),
            "application/json-patch+json" => Some(PatchType::Json),
            "application/strategic-merge-patch+json" => Some(PatchType::StrategicMerge),
            "application/apply-patch+yaml" | "application/apply-patch+cbor" => {
                Some(PatchType::Apply)
            }
            _ => None,
        }
    }
}

/// Why a patch could not be applied: `BadRequest` (malformed patch, 400) or
/// `Unprocessable` (a JSON-patch operation failed, 422 as the apiserver answers).
#[derive(Clone, Debug, PartialEq)]
pub enum PatchError {
    BadRequest(String),
    Unprocessable(String),
}

/// RFC 7386 merge patch.
pub fn merge_patch(target: &mut Value, patch: &Value) {
    match patch {
        Value::Object(p) => {
            if !target.is_object() {
                *target = Value::Object(Map::new());
            }
            if let Some(t) = target.as_object_mut() {
                for (k, v) in p {
                    if v.is_null() {
                        t.remove(k);
                    } else {
                        merge_patch(t.entry(k.clone()).or_insert(Value::Null), v);
                    }
                }
            }
        }
        other => *target = other.clone(),
    }
}

/// Reduced strategic merge patch (see module docs).
pub fn strategic_merge_patch(target: &mut Value, patch: &Value) {
    smp(target, patch, "")
}

fn smp(target: &mut Value, patch: &Value, path: &str) {
    match patch {
        Value::Object(p) => {
            if !target.is_object() {
                *target = Value::Object(Map::new());
            }
            let Some(t) = target.as_object_mut() else {
                return;
            };
            for (k, v) in p {
                let child = format!("{path}/{k}");
                if v.is_null() {
                    t.remove(k);
                } else if let (Value::Array(pv), Some(Value::Array(tv))) = (v, t.get_mut(k)) {
                    if child == "/metadata/finalizers" {
                        for f in pv {
                            if !tv.contains(f) {
                                tv.push(f.clone());
                            }
                        }
                    } else if pv
                        .iter()
                        .all(|e| e.get("name").is_some_and(Value::is_string))
                        && tv
                            .iter()
                            .all(|e| e.get("name").is_some_and(Value::is_string))
                    {
                        for pe in pv {
                            match tv.iter_mut().find(|te| te.get("name") == pe.get("name")) {
                                Some(te) => smp(te, pe, &child),
                                None => tv.push(pe.clone()),
                            }
                        }
                    } else {
                        *tv = pv.clone();
                    }
                } else {
                    smp(t.entry(k.clone()).or_insert(Value::Null), v, &child);
                }
            }
        }
        other => *target = other.clone(),
    }
}

fn unescape(token: &str) -> String {
    token.replace("~1", "/").replace("~0", "~")
}

fn split_pointer(path: &str) -> Result<Vec<String>, PatchError> {
    if path.is_empty() {
        return Ok(Vec::new());
    }
    let Some(rest) = path.strip_prefix('/') else {
        return Err(PatchError::BadRequest(format!(
            "invalid JSON pointer {path:?}"
        )));
    };
    Ok(rest.split('/').map(unescape).collect())
}

fn parent_mut<'a>(
    doc: &'a mut Value,
    tokens: &[String],
    path: &str,
) -> Result<&'a mut Value, PatchError> {
    let mut cur = doc;
    for t in tokens {
        cur = match cur {
            Value::Object(m) => m.get_mut(t),
            Value::Array(a) => t.parse::<usize>().ok().and_then(|i| a.get_mut(i)),
            _ => None,
        }
        .ok_or_else(|| {
            PatchError::Unprocessable(format!("doc is missing path: \"{path}\": missing value"))
        })?;
    }
    Ok(cur)
}

fn get_at(doc: &Value, path: &str) -> Result<Value, PatchError> {
    doc.pointer(path).cloned().ok_or_else(|| {
        PatchError::Unprocessable(format!("doc is missing path: \"{path}\": missing value"))
    })
}

fn remove_at(doc: &mut Value, path: &str) -> Result<Value, PatchError> {
    let tokens = split_pointer(path)?;
    let Some((last, parents)) = tokens.split_last() else {
        return Err(PatchError::Unprocessable(
            "cannot remove the document root".into(),
        ));
    };
    let parent = parent_mut(doc, parents, path)?;
    let missing = || {
        PatchError::Unprocessable(format!(
            "Unable to remove nonexistent key: {last}: missing value"
        ))
    };
    match parent {
        Value::Object(m) => m.remove(last).ok_or_else(missing),
        Value::Array(a) => match last.parse::<usize>() {
            Ok(i) if i < a.len() => Ok(a.remove(i)),
            _ => Err(missing()),
        },
        _ => Err(missing()),
    }
}

fn add_at(doc: &mut Value, path: &str, value: Value, replace: bool) -> Result<(), PatchError> {
    let tokens = split_pointer(path)?;
    let Some((last, parents)) = tokens.split_last() else {
        *doc = value;
        return Ok(());
    };
    let parent = parent_mut(doc, parents, path)?;
    match parent {
        Value::Object(m) => {
            if replace && !m.contains_key(last) {
                return Err(PatchError::Unprocessable(format!(
                    "replace operation does not apply: doc is missing key: {path}: missing value"
                )));
            }
            m.insert(last.clone(), value);
            Ok(())
        }
        Value::Array(a) => {
            if last == "-" && !replace {
                a.push(value);
                return Ok(());
            }
            match last.parse::<usize>() {
                Ok(i) if replace && i < a.len() => {
                    a[i] = value;
                    Ok(())
                }
                Ok(i) if !replace && i <= a.len() => {
                    a.insert(i, value);
                    Ok(())
                }
                _ => Err(PatchError::Unprocessable(format!(
                    "index out of bounds in {path:?}"
                ))),
            }
        }
        _ => Err(PatchError::Unprocessable(format!(
            "doc is missing path: \"{path}\""
        ))),
    }
}

/// RFC 6902 JSON patch. The operations apply in order; any failure leaves `doc` unspecified.
pub fn json_patch(doc: &mut Value, patch: &Value) -> Result<(), PatchError> {
    let Some(ops) = patch.as_array() else {
        return Err(PatchError::BadRequest(
            "json patch must be an array of operations".into(),
        ));
    };
    for op in ops {
        let kind = op["op"]
            .as_str()
            .ok_or_else(|| PatchError::BadRequest("operation without \"op\"".into()))?;
        let path = op["path"]
            .as_str()
            .ok_or_else(|| PatchError::BadRequest("operation without \"path\"".into()))?;
        let value = || {
            op.get("value").cloned().ok_or_else(|| {
                PatchError::BadRequest(format!("{kind} operation without \"value\""))
            })
        };
        let from = || {
            op["from"]
                .as_str()
                .ok_or_else(|| PatchError::BadRequest(format!("{kind} operation without \"from\"")))
        };
        match kind {
            "add" => add_at(doc, path, value()?, false)?,
            "replace" => add_at(doc, path, value()?, true)?,
            "remove" => {
                remove_at(doc, path)?;
            }
            "move" => {
                let v = remove_at(doc, from()?)?;
                add_at(doc, path, v, false)?;
            }
            "copy" => {
                let v = get_at(doc, from()?)?;
                add_at(doc, path, v, false)?;
            }
            "test" => {
                let want = value()?;
                let have = doc.pointer(path);
                if have != Some(&want) {
                    return Err(PatchError::Unprocessable(format!(
                        "testing value {path} failed: test failed"
                    )));
                }
            }
            other => return Err(PatchError::BadRequest(format!("Unexpected kind: {other}"))),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn merge_patch_rfc7386() {
        let mut d = json!({"a": "b", "c": {"d": "e", "f": "g"}, "l": [1, 2]});
        merge_patch(&mut d, &json!({"a": "z", "c": {"f": null}, "l": [3]}));
        assert_eq!(d, json!({"a": "z", "c": {"d": "e"}, "l": [3]}));
    }

    #[test]
    fn json_patch_ops_and_test() {
        let mut d = json!({"metadata": {"finalizers": ["a", "b"]}, "spec": {"x": 1}});
        json_patch(
            &mut d,
            &json!([
                {"op": "test", "path": "/metadata/finalizers", "value": ["a", "b"]},
                {"op": "remove", "path": "/metadata/finalizers/0"},
                {"op": "add", "path": "/spec/y", "value": 2},
                {"op": "replace", "path": "/spec/x", "value": 3},
                {"op": "copy", "from": "/spec/x", "path": "/spec/z"},
                {"op": "move", "from": "/spec/z", "path": "/spec/w"},
                {"op": "add", "path": "/metadata/finalizers/-", "value": "c"}
            ]),
        )
        .expect("patch");
        assert_eq!(
            d,
            json!({"metadata": {"finalizers": ["b", "c"]}, "spec": {"x": 3, "y": 2, "w": 3}})
        );
        let err = json_patch(
            &mut d,
            &json!([{"op": "test", "path": "/spec/x", "value": 4}]),
        )
        .expect_err("test op");
        assert!(matches!(err, PatchError::Unprocessable(_)));
        let err =
            json_patch(&mut d, &json!([{"op": "remove", "path": "/nope"}])).expect_err("missing");
        assert!(matches!(err, PatchError::Unprocessable(_)));
        assert!(matches!(
            json_patch(&mut d, &json!({"op": "x"})),
            Err(PatchError::BadRequest(_))
        ));
    }

    #[test]
    fn strategic_merge_lists() {
        let mut d = json!({"metadata": {"finalizers": ["a"], "labels": {"x": "1"}},
            "spec": {"containers": [{"name": "c", "image": "i"}], "args": ["1"]}});
        strategic_merge_patch(
            &mut d,
            &json!({"metadata": {"finalizers": ["b"], "labels": {"x": null, "y": "2"}},
                "spec": {"containers": [{"name": "c", "image": "j"}, {"name": "d"}], "args": ["2"]}}),
        );
        assert_eq!(
            d,
            json!({"metadata": {"finalizers": ["a", "b"], "labels": {"y": "2"}},
                "spec": {"containers": [{"name": "c", "image": "j"}, {"name": "d"}], "args": ["2"]}})
        );
    }
}
