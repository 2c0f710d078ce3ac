//! Label and field selectors for list, watch and deletecollection.
//! Label selectors: `=`, `==`, `!=`, `in`, `notin`, `key` (exists), `!key` (does not exist).
//! Field selectors: `metadata.name`, `metadata.namespace` and any other dotted path compared
//! as a string (the real server only allows a per-kind whitelist; we are more permissive).

use serde_json::Value;

#[derive(Clone, Debug, PartialEq)]
enum Req {
    Eq(String, String),
    NotEq(String, String),
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
    Exists(String),
    NotExists(String),
}

/// A parsed label selector (all requirements must hold).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct LabelSelector(Vec<Req>);

/// Split on commas that are not inside parentheses.
fn split_top(s: &str) -> Vec<String> {
    let mut parts = Vec::new();
    let mut depth = 0i32;
    let mut cur = String::new();
    for c in s.chars() {
        match c {
            '(' => {
                depth += 1;
                cur.push(c);
            }
            ')' => {
                depth -= 1;
                cur.push(c);
            }
            ',' if depth == 0 => parts.push(std::mem::take(&mut cur)),
            _ => cur.push(c),
        }
    }
    parts.push(cur);
    parts
        .into_iter()
        .map(|p| p.trim().to_string())
        .filter(|p| !p.is_empty())
        .collect()
}

fn set_values(s: &str) -> Result<Vec<String>, String> {
    let s = s.trim();
    let inner = s
        .strip_prefix('(')
        .and_then(|r| r.strip_suffix(')'))
        .ok_or_else(|| format!("expected a parenthesised set, found {s:?}"))?;
    Ok(inner
        .split(',')
        .map(|v| v.trim().to_string())
        .filter(|v| !v.is_empty())
        .collect())
}

impl LabelSelector {
    pub fn parse(s: &str) -> Result<LabelSelector, String> {
        let mut reqs = Vec::new();
        for part in split_top(s) {
            let req = if let Some(k) = part.strip_prefix('!') {
                Req::NotExists(k.trim().to_string())
            } else if let Some((k, v)) = part.split_once("!=") {
                Req::NotEq(k.trim().into(), v.trim().into())
            } else if let Some((k, v)) = part.split_once("==") {
                Req::Eq(k.trim().into(), v.trim().into())
            } else if let Some((k, v)) = part.split_once('=') {
                Req::Eq(k.trim().into(), v.trim().into())
            } else if let Some((k, v)) = part.split_once(" notin ") {
                Req::NotIn(k.trim().into(), set_values(v)?)
            } else if let Some((k, v)) = part.split_once(" in ") {
                Req::In(k.trim().into(), set_values(v)?)
            } else if part.contains(' ') || part.contains('(') {
                return Err(format!("unable to parse requirement: {part:?}"));
            } else {
                Req::Exists(part)
            };
            reqs.push(req);
        }
        Ok(LabelSelector(reqs))
    }

    /// The (key, value) labels every matching object has (from `=`, `==` and `in` with one
    /// value).
    pub fn required(&self) -> Vec<(&str, &str)> {
        self.0
            .iter()
            .filter_map(|r| match r {
                Req::Eq(k, v) => Some((k.as_str(), v.as_str())),
                Req::In(k, vs) if vs.len() == 1 => Some((k.as_str(), vs[0].as_str())),
                _ => None,
            })
            .collect()
    }

    pub fn matches(&self, obj: &Value) -> bool {
        let labels = &obj["metadata"]["labels"];
        let get = |k: &str| labels.get(k).and_then(Value::as_str);
        self.0.iter().all(|r| match r {
            Req::Eq(k, v) => get(k) == Some(v.as_str()),
            Req::NotEq(k, v) => get(k) != Some(v.as_str()),
            Req::In(k, vs) => get(k).is_some_and(|l| vs.iter().any(|v| v == l)),
            Req::NotIn(k, vs) => get(k).is_none_or(|l| !vs.iter().any(|v| v == l)),
            Req::Exists(k) => get(k).is_some(),
            Req::NotExists(k) => get(k).is_none(),
        })
    }
}

/// A parsed field selector (`a.b=x`, `a.b==x`, `a.b!=x`, comma separated).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct FieldSelector(Vec<(String, bool, String)>);

impl FieldSelector {
    pub fn parse(s: &str) -> Result<FieldSelector, String> {
        let mut out = Vec::new();
        for part in split_top(s) {
            let (k, eq, v) = if let Some((k, v)) = part.split_once("!=") {
                (k, false, v)
            } else if let Some((k, v)) = part.split_once("==") {
                (k, true, v)
            } else if let Some((k, v)) = part.split_once('=') {
                (k, true, v)
            } else {
                return Err(format!("invalid field selector requirement: {part:?}"));
            };
            out.push((k.trim().to_string(), eq, v.trim().to_string()));
        }
        Ok(FieldSelector(out))
    }

    pub fn matches(&self, obj: &Value) -> bool {
        self.0.iter().all(|(path, eq, want)| {
            let mut cur = obj;
            for seg in path.split('.') {
                cur = &cur[seg];
            }
            let have = match cur {
                Value::String(s) => s.clone(),
                Value::Null => String::new(),
                other => other.to_string(),
            };
            (have == *want) == *eq
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn label_selector_operators() {
        let o = json!({"metadata": {"name": "n", "namespace": "ns", "labels": {"app": "web", "tier": "fe"}}});
        for (sel, want) in [
            ("app=web", true),
            ("app==web", true),
            ("app!=web", false),
            ("app in (web,db)", true),
            ("app notin (web,db)", false),
            ("tier", true),
            ("!tier", false),
            ("!missing", true),
            ("missing!=x", true),
            ("app=web,tier in (fe),!gone", true),
            ("", true),
        ] {
            assert_eq!(
                LabelSelector::parse(sel).expect(sel).matches(&o),
                want,
                "{sel}"
            );
        }
        assert!(LabelSelector::parse("app in web").is_err());
    }

    #[test]
    fn field_selector() {
        let o =
            json!({"metadata": {"name": "n", "namespace": "ns"}, "status": {"phase": "Running"}});
        assert!(
            FieldSelector::parse("metadata.name=n")
                .expect("p")
                .matches(&o)
        );
        assert!(
            FieldSelector::parse("metadata.namespace==ns,metadata.name!=x")
                .expect("p")
                .matches(&o)
        );
        assert!(
            !FieldSelector::parse("metadata.name=x")
                .expect("p")
                .matches(&o)
        );
        assert!(
            FieldSelector::parse("status.phase=Running")
                .expect("p")
                .matches(&o)
        );
        assert!(FieldSelector::parse("nonsense").is_err());
    }
}
