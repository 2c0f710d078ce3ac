//! What the state proxy passes on (pure): the requests Terraform's kubernetes backend
//! makes for one object's state, and nothing else. In the object's namespace only:
//!
//! - its state Secret and that Secret's parts (`tfstate-default-<suffix>`, `-part-N`),
//!   and the errored states its runner saves (`tfstate-default-errored-<attempt>-<tag>.<suffix>`
//!   and their parts): get, create, update, delete;
//! - a list of Secrets only with a label selector that names one of those backend
//!   suffixes (`tfstateSecretSuffix=`); a list that names none gets the object's own
//!   added, which is what the backend's listing of workspaces keeps of it anyway;
//! - its lock Lease (`lock-tfstate-default-<suffix>`), and its errored states' (the
//!   runner's `init` of one locks it): get, create, update, delete.
//!
//! No watch, patch or collection delete; a create names its object in the body, which
//! [`created_name`] checks.

use std::fmt;

use crate::api::names;

/// The one object whose state the proxy serves.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Scope {
    pub namespace: String,
    /// The object's backend suffix (`names::state_suffix`).
    pub suffix: String,
}

/// The two kinds of object the backend uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Resource {
    Secret,
    Lease,
}

impl Resource {
    fn plural(self) -> &'static str {
        match self {
            Resource::Secret => "secrets",
            Resource::Lease => "leases",
        }
    }
}

/// A request the proxy forwards: the path and query to send (the query possibly
/// rewritten), and, for a create, the kind whose name the body must give.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Forward {
    pub path_and_query: String,
    pub create: Option<Resource>,
}

/// Why a request is refused, said to the runner as a 403.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refusal(pub String);

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

fn refuse(why: impl Into<String>) -> Refusal {
    Refusal(why.into())
}

/// Whether `name` is a Secret of the scope's state: its state Secret, an errored state
/// of its runners, or a part of either.
pub fn secret_allowed(scope: &Scope, name: &str) -> bool {
    let prefix = format!("tfstate-{}-", names::TF_WORKSPACE);
    let whole = match names::split_part(name) {
        Some((base, _)) => base,
        None => name,
    };
    whole
        .strip_prefix(&prefix)
        .is_some_and(|backend_suffix| suffix_allowed(scope, backend_suffix))
}

/// Whether `backend_suffix` is the scope's own or one of its errored states'.
fn suffix_allowed(scope: &Scope, backend_suffix: &str) -> bool {
    backend_suffix == scope.suffix || names::is_errored_suffix_of(backend_suffix, &scope.suffix)
}

/// Whether `name` is the scope's lock Lease, or an errored state's (the runner's `init`
/// of the errored state's suffix makes its empty state under a lock).
pub fn lease_allowed(scope: &Scope, name: &str) -> bool {
    name.strip_prefix(&format!("lock-tfstate-{}-", names::TF_WORKSPACE))
        .is_some_and(|backend_suffix| suffix_allowed(scope, backend_suffix))
}

/// Decides a request by its method, path and query.
pub fn route(
    scope: &Scope,
    method: &str,
    path: &str,
    query: Option<&str>,
) -> Result<Forward, Refusal> {
    let (resource, rest) = if let Some(rest) = path.strip_prefix("/api/v1/namespaces/") {
        (Resource::Secret, rest)
    } else if let Some(rest) = path.strip_prefix("/apis/coordination.k8s.io/v1/namespaces/") {
        (Resource::Lease, rest)
    } else {
        return Err(refuse(format!(
            "{method} {path}: only the state's Secrets and its lock Lease are served"
        )));
    };
    let mut parts = rest.split('/');
    let (Some(ns), Some(plural)) = (parts.next(), parts.next()) else {
        return Err(refuse(format!(
            "{method} {path}: not a namespaced resource"
        )));
    };
    let name = parts.next();
    if parts.next().is_some() || plural != resource.plural() {
        return Err(refuse(format!(
            "{method} {path}: only the state's Secrets and its lock Lease are served"
        )));
    }
    if ns != scope.namespace {
        return Err(refuse(format!(
            "{method} {path}: namespace {ns} is not the state's ({})",
            scope.namespace
        )));
    }
    let query = query.unwrap_or_default();
    // Names as the API server reads them: percent-decoded, as values are.
    for (k, v) in query_params(query) {
        let Some(key) = decode(k) else {
            return Err(refuse(format!(
                "{method} {path}: a parameter name that is not UTF-8"
            )));
        };
        if key == "watch" && decode(v).is_none_or(|v| v != "false" && v != "0") {
            return Err(refuse(format!("{method} {path}: no watch is served")));
        }
    }
    let forward = |create| Forward {
        path_and_query: with_query(path, query),
        create,
    };
    match (method, name) {
        ("GET" | "PUT" | "DELETE", Some(name)) => {
            let allowed = match resource {
                Resource::Secret => secret_allowed(scope, name),
                Resource::Lease => lease_allowed(scope, name),
            };
            if allowed {
                Ok(forward(None))
            } else {
                Err(refuse(format!(
                    "{method} {path}: {} {name} is not of the state of {} in {}",
                    resource.plural(),
                    scope.suffix,
                    scope.namespace
                )))
            }
        }
        ("POST", None) => Ok(forward(Some(resource))),
        ("GET", None) if resource == Resource::Secret => Ok(Forward {
            path_and_query: with_query(path, &list_query(scope, query, method, path)?),
            create: None,
        }),
        _ => Err(refuse(format!(
            "{method} {path}: not a request Terraform's backend makes for one state"
        ))),
    }
}

/// The query of a list of Secrets, its label selector narrowed to one of the scope's
/// backend suffixes.
fn list_query(scope: &Scope, query: &str, method: &str, path: &str) -> Result<String, Refusal> {
    let mut out = Vec::new();
    let mut selector = None;
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        // `route` refused a name that does not decode.
        if decode(k).as_deref() == Some("labelSelector") {
            if selector.is_some() {
                return Err(refuse(format!("{method} {path}: two label selectors")));
            }
            selector = Some(decode(v).ok_or_else(|| {
                refuse(format!(
                    "{method} {path}: a label selector that is not UTF-8"
                ))
            })?);
        } else {
            out.push(pair.to_string());
        }
    }
    let selector = selector.unwrap_or_default();
    let mut terms: Vec<String> = Vec::new();
    let mut named = false;
    for term in selector.split(',').map(str::trim).filter(|t| !t.is_empty()) {
        if term.contains(names::TF_LABEL_SUFFIX) {
            let value = term
                .strip_prefix(names::TF_LABEL_SUFFIX)
                .and_then(|r| r.strip_prefix("==").or_else(|| r.strip_prefix('=')));
            match value {
                Some(v) if suffix_allowed(scope, v) => named = true,
                _ => {
                    return Err(refuse(format!(
                        "{method} {path}: label selector term {term:?} is not one of the state of {} (give {}={})",
                        scope.suffix,
                        names::TF_LABEL_SUFFIX,
                        scope.suffix
                    )));
                }
            }
        }
        terms.push(term.to_string());
    }
    if !named {
        terms.push(format!("{}={}", names::TF_LABEL_SUFFIX, scope.suffix));
    }
    out.push(format!("labelSelector={}", encode(&terms.join(","))));
    Ok(out.join("&"))
}

/// Whether a create's body is read as the proxy reads it: JSON only (the API server would
/// read YAML or protobuf too, which the proxy does not check).
pub fn create_content_type(content_type: Option<&str>) -> Result<(), Refusal> {
    let media = content_type
        .unwrap_or_default()
        .split(';')
        .next()
        .unwrap_or_default()
        .trim();
    if media.eq_ignore_ascii_case("application/json") {
        Ok(())
    } else {
        Err(refuse(format!(
            "a create of Content-Type {media:?}: only application/json is passed on"
        )))
    }
}

/// Whether a create's body (its `metadata`) names an object the scope may make.
pub fn created_name(
    scope: &Scope,
    resource: Resource,
    body: &serde_json::Value,
) -> Result<(), Refusal> {
    let meta = &body["metadata"];
    if meta.get("generateName").is_some_and(|g| !g.is_null()) {
        return Err(refuse(
            "a create with generateName: the state's objects have fixed names",
        ));
    }
    if let Some(ns) = meta["namespace"].as_str()
        && !ns.is_empty()
        && ns != scope.namespace
    {
        return Err(refuse(format!(
            "a create in namespace {ns}: not the state's ({})",
            scope.namespace
        )));
    }
    let Some(name) = meta["name"].as_str() else {
        return Err(refuse("a create whose body names no object"));
    };
    let allowed = match resource {
        Resource::Secret => secret_allowed(scope, name),
        Resource::Lease => lease_allowed(scope, name),
    };
    if allowed {
        Ok(())
    } else {
        Err(refuse(format!(
            "creating {} {name}: not of the state of {} in {}",
            resource.plural(),
            scope.suffix,
            scope.namespace
        )))
    }
}

fn with_query(path: &str, query: &str) -> String {
    if query.is_empty() {
        path.to_string()
    } else {
        format!("{path}?{query}")
    }
}

fn query_params(query: &str) -> impl Iterator<Item = (&str, &str)> {
    query
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|p| p.split_once('=').unwrap_or((p, "")))
}

/// Percent-decoding of a query value (`+` is a space).
fn decode(v: &str) -> Option<String> {
    let bytes = v.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' => {
                let hex = std::str::from_utf8(bytes.get(i + 1..i + 3)?).ok()?;
                out.push(u8::from_str_radix(hex, 16).ok()?);
                i += 3;
            }
            b'+' => {
                out.push(b' ');
                i += 1;
            }
            b => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8(out).ok()
}

/// Percent-encoding of a query value: everything but unreserved characters.
fn encode(v: &str) -> String {
    let mut out = String::with_capacity(v.len());
    for b in v.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn scope() -> Scope {
        Scope {
            namespace: "team-a".into(),
            suffix: "prod.tfc".into(),
        }
    }

    const SECRETS: &str = "/api/v1/namespaces/team-a/secrets";
    const LEASES: &str = "/apis/coordination.k8s.io/v1/namespaces/team-a/leases";

    fn ok(method: &str, path: &str) -> bool {
        route(&scope(), method, path, None).is_ok()
    }

    #[test]
    fn the_state_its_parts_its_errored_states_and_its_lock_pass() {
        for name in [
            "tfstate-default-prod.tfc",
            "tfstate-default-prod.tfc-part-2",
            "tfstate-default-errored-1-ab3cd.prod.tfc",
            "tfstate-default-errored-12-ab3cd.prod.tfc-part-1",
        ] {
            for method in ["GET", "PUT", "DELETE"] {
                assert!(ok(method, &format!("{SECRETS}/{name}")), "{method} {name}");
            }
        }
        for method in ["GET", "PUT", "DELETE"] {
            assert!(ok(
                method,
                &format!("{LEASES}/lock-tfstate-default-prod.tfc")
            ));
            assert!(ok(
                method,
                &format!("{LEASES}/lock-tfstate-default-errored-2-ab3cd.prod.tfc")
            ));
        }
        let create = route(&scope(), "POST", SECRETS, None).unwrap();
        assert_eq!(create.create, Some(Resource::Secret));
        assert_eq!(
            route(&scope(), "POST", LEASES, None).unwrap().create,
            Some(Resource::Lease)
        );
    }

    #[test]
    fn every_other_secret_lease_namespace_kind_and_verb_is_refused() {
        for name in [
            // Cluster API's kubeconfig, bootstrap data, the object's own inputs and backup.
            "prod-kubeconfig",
            "prod-md-0-abcde",
            "captf-inputs-prod.tfc",
            "captf-backup-prod.tfc",
            // Another object's state, one whose suffix ends like this one's, its errored
            // states, and a part number Terraform never writes.
            "tfstate-default-web.tfm",
            "tfstate-default-x.prod.tfc",
            "tfstate-default-errored-1-ab3cd.x.prod.tfc",
            "tfstate-default-prod.tfc-part-01",
            "tfstate-default-prod.tfcx",
        ] {
            for method in ["GET", "PUT", "DELETE"] {
                let r = route(&scope(), method, &format!("{SECRETS}/{name}"), None);
                assert!(r.is_err(), "{method} {name} passed");
            }
        }
        let refused = [
            (
                "GET",
                "/api/v1/namespaces/team-b/secrets/tfstate-default-prod.tfc",
            ),
            ("GET", "/api/v1/secrets"),
            ("GET", "/api/v1/namespaces/team-a/configmaps/x"),
            ("GET", "/api/v1/namespaces/team-a/pods"),
            (
                "GET",
                "/apis/coordination.k8s.io/v1/namespaces/team-a/leases/lock-tfstate-default-web.tfm",
            ),
            (
                "GET",
                "/apis/coordination.k8s.io/v1/namespaces/team-a/leases/lock-tfstate-default-errored-2-ab3cd.x.prod.tfc",
            ),
            (
                "GET",
                "/apis/coordination.k8s.io/v1/namespaces/team-a/leases/lock-tfstate-default-prod.tfc-part-1",
            ),
            ("GET", LEASES),
            (
                "PATCH",
                "/api/v1/namespaces/team-a/secrets/tfstate-default-prod.tfc",
            ),
            ("DELETE", SECRETS),
            (
                "POST",
                "/api/v1/namespaces/team-a/secrets/tfstate-default-prod.tfc",
            ),
            (
                "GET",
                "/api/v1/namespaces/team-a/secrets/tfstate-default-prod.tfc/status",
            ),
            ("GET", "/api"),
            ("GET", "/version"),
            ("GET", "/apis/apps/v1/namespaces/team-a/deployments"),
        ];
        for (method, path) in refused {
            assert!(
                route(&scope(), method, path, None).is_err(),
                "{method} {path} passed"
            );
        }
        let watch = route(
            &scope(),
            "GET",
            SECRETS,
            Some("watch=true&labelSelector=tfstate%3Dtrue"),
        );
        assert!(watch.unwrap_err().0.contains("no watch"));
    }

    #[test]
    fn a_list_is_narrowed_to_the_state_or_refused() {
        let list = |q: &str| route(&scope(), "GET", SECRETS, Some(q));
        // The backend's listing of workspaces: the object's suffix is added.
        assert_eq!(
            list("labelSelector=tfstate%3Dtrue").unwrap().path_and_query,
            format!("{SECRETS}?labelSelector=tfstate%3Dtrue%2CtfstateSecretSuffix%3Dprod.tfc")
        );
        // No selector at all: the same narrowing.
        assert_eq!(
            route(&scope(), "GET", SECRETS, None)
                .unwrap()
                .path_and_query,
            format!("{SECRETS}?labelSelector=tfstateSecretSuffix%3Dprod.tfc")
        );
        // Its own suffix, or an errored state's, pass as they are (other parameters kept).
        assert_eq!(
            list("limit=500&labelSelector=tfstateSecretSuffix%3Derrored-1-ab3cd.prod.tfc")
                .unwrap()
                .path_and_query,
            format!(
                "{SECRETS}?limit=500&labelSelector=tfstateSecretSuffix%3Derrored-1-ab3cd.prod.tfc"
            )
        );
        assert!(list("labelSelector=tfstateSecretSuffix%3D%3Dprod.tfc").is_ok());
        // Another suffix, a set, a negation, a bare key: refused.
        for q in [
            "labelSelector=tfstateSecretSuffix%3Dweb.tfm",
            "labelSelector=tfstateSecretSuffix+in+%28prod.tfc%2Cweb.tfm%29",
            "labelSelector=tfstateSecretSuffix%21%3Dweb.tfm",
            "labelSelector=tfstateSecretSuffix",
            "labelSelector=%21tfstateSecretSuffix",
            "labelSelector=a&labelSelector=b",
            "labelSelector=%ff",
        ] {
            assert!(list(q).is_err(), "{q} passed");
        }
    }

    /// A parameter name is percent-decoded by the API server as a value is: an encoded
    /// `labelSelector` or `watch` is the same parameter, and is treated as one.
    #[test]
    fn an_encoded_parameter_name_is_read_as_the_api_server_reads_it() {
        let list = |q: &str| route(&scope(), "GET", SECRETS, Some(q));
        for q in [
            "labelSelecto%72=",
            "labelSelecto%72=&labelSelector=tfstate%3Dtrue",
            "label%53elector=tfstate%3Dtrue",
        ] {
            match list(q) {
                Err(_) => {}
                Ok(f) => {
                    let query = f
                        .path_and_query
                        .split_once('?')
                        .map(|(_, q)| q)
                        .unwrap_or("");
                    let selectors: Vec<String> = query_params(query)
                        .filter(|(k, _)| decode(k).as_deref() == Some("labelSelector"))
                        .map(|(_, v)| decode(v).unwrap())
                        .collect();
                    assert_eq!(selectors.len(), 1, "{q}: {selectors:?}");
                    assert!(
                        selectors[0].contains("tfstateSecretSuffix=prod.tfc"),
                        "{q}: {selectors:?}"
                    );
                }
            }
        }
        assert!(list("wat%63h=true").is_err());
        assert!(
            list("watch%3Dtrue").is_ok(),
            "a parameter named watch=true, not watch"
        );
    }

    #[test]
    fn a_create_is_json_or_refused() {
        assert!(create_content_type(Some("application/json")).is_ok());
        assert!(create_content_type(Some("application/json; charset=utf-8")).is_ok());
        for ct in [
            None,
            Some("application/yaml"),
            Some("application/vnd.kubernetes.protobuf"),
            Some("text/plain"),
        ] {
            assert!(create_content_type(ct).is_err(), "{ct:?}");
        }
    }

    #[test]
    fn a_create_must_name_the_states_own_objects() {
        let s = scope();
        let ok = |r, body| created_name(&s, r, &body).is_ok();
        assert!(ok(
            Resource::Secret,
            json!({"metadata": {"name": "tfstate-default-prod.tfc", "namespace": "team-a"}})
        ));
        assert!(ok(
            Resource::Secret,
            json!({"metadata": {"name": "tfstate-default-prod.tfc-part-1"}})
        ));
        assert!(ok(
            Resource::Lease,
            json!({"metadata": {"name": "lock-tfstate-default-prod.tfc"}})
        ));
        assert!(!ok(
            Resource::Secret,
            json!({"metadata": {"name": "prod-kubeconfig"}})
        ));
        assert!(!ok(
            Resource::Secret,
            json!({"metadata": {"name": "tfstate-default-prod.tfc", "namespace": "team-b"}})
        ));
        assert!(!ok(
            Resource::Secret,
            json!({"metadata": {"generateName": "tfstate-default-prod.tfc"}})
        ));
        assert!(!ok(
            Resource::Secret,
            json!({"metadata": {"name": "tfstate-default-prod.tfc", "generateName": "x"}})
        ));
        assert!(!ok(
            Resource::Lease,
            json!({"metadata": {"name": "lock-tfstate-default-web.tfm"}})
        ));
        assert!(!ok(
            Resource::Lease,
            json!({"metadata": {"name": "tfstate-default-prod.tfc"}})
        ));
        assert!(!ok(Resource::Secret, json!({})));
        assert!(!ok(Resource::Secret, json!("not an object")));
    }
}
