//! The contract's outputs to Cluster API's fields: what a successful apply's state says,
//! checked against the contract and turned into the spec and status fields it sets. Pure:
//! the outputs come in as read from the state.

use serde_json::{Map, Value, json};

use super::Role;

/// The fields an apply's outputs set: merge patches of the object's spec and status.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Fields {
    pub spec: Map<String, Value>,
    pub status: Map<String, Value>,
}

/// What the outputs of a module of `role` must agree with among the contract's values its
/// apply was given (`given`, as recorded in the inputs): a machine is placed in the
/// failure domain its Machine asks for. Each disagreement, named.
pub fn against_inputs(
    role: Role,
    outputs: &Map<String, Value>,
    given: &Map<String, Value>,
) -> Vec<String> {
    if role != Role::Machine {
        return Vec::new();
    }
    let want = given
        .get("captf_failure_domain")
        .and_then(Value::as_str)
        .filter(|d| !d.is_empty());
    match (want, outputs.get("failure_domain").and_then(Value::as_str)) {
        (Some(want), Some(got)) if want != got => vec![format!(
            "output failure_domain is {got}, but the Machine asks for {want} (captf_failure_domain): the module must place the machine there"
        )],
        _ => Vec::new(),
    }
}

/// Whether `v` is a list of Cluster API machine addresses.
fn addresses_valid(v: &Value) -> bool {
    v.as_array().is_some_and(|l| {
        l.iter().all(|a| {
            a["type"]
                .as_str()
                .is_some_and(|t| ADDRESS_TYPES.contains(&t))
                && a["address"].as_str().is_some_and(|s| !s.is_empty())
        })
    })
}

/// A pool's `instances` output as `status.instances`: each with a provider ID of the
/// pool's `provider_id_list` (`listed`), its addresses and failure domain; or what is
/// wrong with it.
fn instances(v: &Value, listed: &Value) -> Result<Vec<Value>, String> {
    let shape = "output instances must be a list of { provider_id = a string of provider_id_list, addresses = optional(list of addresses), failure_domain = optional(string) }";
    let list = v
        .as_array()
        .ok_or_else(|| format!("{shape}, not {}", described(v)))?;
    let listed: Vec<&str> = listed
        .as_array()
        .map(|l| l.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    list.iter()
        .map(|i| {
            let id = i["provider_id"]
                .as_str()
                .filter(|id| listed.contains(id))
                .ok_or_else(|| format!("{shape}, not {}", described(i)))?;
            let mut out = json!({ "providerID": id });
            match &i["addresses"] {
                Value::Null => {}
                a if addresses_valid(a) => out["addresses"] = a.clone(),
                _ => return Err(format!("{shape}, not {}", described(i))),
            }
            match &i["failure_domain"] {
                Value::Null => {}
                Value::String(d) => out["failureDomain"] = json!(d),
                _ => return Err(format!("{shape}, not {}", described(i))),
            }
            Ok(out)
        })
        .collect()
}

/// The longest provider ID Cluster API takes (its Machine's `spec.providerID` and each
/// item of its MachinePool's `spec.providerIDList`, v1beta2 validation): a longer one
/// would be refused when Cluster API copies it, after CAPTF had set it.
pub const PROVIDER_ID_MAX_CHARS: usize = 512;
/// The most provider IDs a MachinePool's `spec.providerIDList` holds (v1beta2 validation).
pub const PROVIDER_ID_LIST_MAX_ITEMS: usize = 10_000;

fn provider_id_fits(id: &str) -> bool {
    (1..=PROVIDER_ID_MAX_CHARS).contains(&id.chars().count())
}

/// What an output's value is, for a message, without the value: the message goes into
/// the object's annotations and an Event, which whoever may read the object reads, and a
/// module may put a secret where an address belongs.
fn described(v: &Value) -> String {
    match v {
        Value::Null => "null".into(),
        Value::Bool(_) => "a bool".into(),
        Value::Number(_) => "a number".into(),
        Value::String(s) => format!("a string of {} characters", s.chars().count()),
        Value::Array(l) => format!("a list of {} item(s)", l.len()),
        Value::Object(m) => {
            let keys: Vec<&str> = m.keys().map(String::as_str).take(8).collect();
            let more = if m.len() > keys.len() { ", …" } else { "" };
            format!("an object with keys {}{more}", keys.join(", "))
        }
    }
}

/// The spec fields the outputs set once: Cluster API copies them (the endpoint to the
/// Cluster, the provider ID to the Machine and the Node's match) and never reads them
/// again, so a later different value would change nothing but the record.
pub const SET_ONCE: [&str; 2] = ["controlPlaneEndpoint", "providerID"];

/// The outputs' spec fields against the object's `spec` as it is: those to write (each
/// that differs), and the set-once fields refused (already set to another value), each
/// with a sentence saying so.
pub fn spec_changes(
    current: &Value,
    spec: &Map<String, Value>,
) -> (Map<String, Value>, Vec<(String, String)>) {
    let mut write = Map::new();
    let mut refused = Vec::new();
    for (field, value) in spec {
        let now = &current[field];
        if now == value {
            continue;
        }
        let set = match now {
            Value::Null => false,
            Value::String(s) => !s.is_empty(),
            v => v["host"].as_str().is_none_or(|h| !h.is_empty()),
        };
        if set && SET_ONCE.contains(&field.as_str()) {
            refused.push((
                field.clone(),
                format!("the outputs give spec.{field} {value}, and it is {now}: it is set once and kept"),
            ));
            continue;
        }
        write.insert(field.clone(), value.clone());
    }
    (write, refused)
}

/// The address types Cluster API accepts (`MachineAddressType`).
const ADDRESS_TYPES: [&str; 5] = [
    "Hostname",
    "ExternalIP",
    "InternalIP",
    "ExternalDNS",
    "InternalDNS",
];

/// The fields the outputs of a module of `role` set, or every way they break the contract
/// (a required output missing or null, a value of the wrong shape).
pub fn fields(role: Role, outputs: &Map<String, Value>) -> Result<Fields, Vec<String>> {
    let mut errors = Vec::new();
    let mut f = Fields::default();
    let get = |name: &str| outputs.get(name).filter(|v| !v.is_null());
    let required = |name: &str, errors: &mut Vec<String>| {
        let v = get(name);
        if v.is_none() {
            errors.push(format!(
                "output {name} is required of a {role} module and is {}",
                if outputs.contains_key(name) {
                    "null"
                } else {
                    "not declared"
                }
            ));
        }
        v
    };
    match role {
        Role::Cluster => {
            if let Some(v) = get("control_plane_endpoint") {
                let host = v["host"].as_str().filter(|h| !h.is_empty());
                let port = v["port"].as_i64().filter(|p| (1..=65535).contains(p));
                match (host, port) {
                    (Some(h), Some(p)) => {
                        f.spec.insert(
                            "controlPlaneEndpoint".into(),
                            json!({"host": h, "port": p}),
                        );
                    }
                    _ => errors.push(format!(
                        "output control_plane_endpoint must be {{ host = a non-empty string, port = 1 to 65535 }}, not {}",
                        described(v)
                    )),
                }
            }
            if let Some(v) = get("failure_domains") {
                match v.as_array() {
                    Some(list) => {
                        let mut out = Vec::new();
                        for d in list {
                            match d["name"].as_str().filter(|n| !n.is_empty()) {
                                Some(name) => {
                                    let mut fd = json!({
                                        "name": name,
                                        "controlPlane": d["control_plane"].as_bool().unwrap_or(false),
                                    });
                                    match d.get("attributes").filter(|a| !a.is_null()) {
                                        None => {}
                                        Some(Value::Object(a))
                                            if a.values().all(Value::is_string) =>
                                        {
                                            fd["attributes"] = Value::Object(a.clone());
                                        }
                                        Some(a) => errors.push(format!(
                                            "output failure_domains: the attributes of {name} must be a map of strings, not {}",
                                            described(a)
                                        )),
                                    }
                                    out.push(fd);
                                }
                                None => errors.push(format!(
                                    "output failure_domains: every entry needs a non-empty name, not {}",
                                    described(d)
                                )),
                            }
                        }
                        f.status.insert("failureDomains".into(), Value::Array(out));
                    }
                    None => errors.push(format!(
                        "output failure_domains must be a list, not {}",
                        described(v)
                    )),
                }
            }
        }
        Role::Machine => {
            if let Some(v) = required("provider_id", &mut errors) {
                match v.as_str().filter(|s| provider_id_fits(s)) {
                    Some(id) => {
                        f.spec.insert("providerID".into(), json!(id));
                    }
                    None => errors.push(format!(
                        "output provider_id must be a string of 1 to {PROVIDER_ID_MAX_CHARS} characters, not {}",
                        described(v)
                    )),
                }
            }
            if let Some(v) = get("addresses") {
                if addresses_valid(v) {
                    f.status.insert("addresses".into(), v.clone());
                } else {
                    errors.push(format!(
                        "output addresses must be a list of {{ type = one of {}, address = a non-empty string }}, not {}",
                        ADDRESS_TYPES.join(", "),
                        described(v)
                    ));
                }
            }
            if let Some(v) = get("failure_domain") {
                match v.as_str() {
                    Some(d) => {
                        f.status.insert("failureDomain".into(), json!(d));
                    }
                    None => errors.push(format!(
                        "output failure_domain must be a string, not {}",
                        described(v)
                    )),
                }
            }
            if let Some(v) = get("interruptible") {
                match v.as_bool() {
                    Some(b) => {
                        f.status.insert("interruptible".into(), json!(b));
                    }
                    None => errors.push(format!(
                        "output interruptible must be a bool, not {}",
                        described(v)
                    )),
                }
            }
        }
        Role::MachinePool => {
            let mut count = None;
            if let Some(v) = required("provider_id_list", &mut errors) {
                let ids: Option<Vec<&str>> = v
                    .as_array()
                    .filter(|l| l.len() <= PROVIDER_ID_LIST_MAX_ITEMS)
                    .and_then(|l| {
                        l.iter()
                            .map(|i| i.as_str().filter(|s| provider_id_fits(s)))
                            .collect()
                    });
                match ids {
                    Some(ids) => {
                        count = Some(ids.len());
                        f.spec.insert("providerIDList".into(), json!(ids));
                    }
                    None => errors.push(format!(
                        "output provider_id_list must be a list of at most {PROVIDER_ID_LIST_MAX_ITEMS} strings of 1 to {PROVIDER_ID_MAX_CHARS} characters, not {}",
                        described(v)
                    )),
                }
            }
            let replicas = match get("replicas") {
                Some(v) => match v.as_u64().and_then(|n| i32::try_from(n).ok()) {
                    Some(n) => Some(n),
                    None => {
                        errors.push(format!(
                            "output replicas must be a whole number of at least 0, not {}",
                            described(v)
                        ));
                        None
                    }
                },
                None => count.and_then(|c| i32::try_from(c).ok()),
            };
            if let Some(n) = replicas {
                f.status.insert("replicas".into(), json!(n));
            }
            if let Some(v) = get("instances") {
                let listed = f.spec.get("providerIDList").cloned().unwrap_or_default();
                match instances(v, &listed) {
                    Ok(list) => {
                        f.status.insert("instances".into(), Value::Array(list));
                    }
                    Err(e) => errors.push(e),
                }
            }
            // The MachinePool controller still reads `status.ready`.
            f.status.insert("ready".into(), json!(true));
        }
    }
    if errors.is_empty() {
        Ok(f)
    } else {
        Err(errors)
    }
}
