//! Terraform's lock (the Lease `lock-tfstate-default-<suffix>`), judged by one rule that
//! the rule table, the cleanup and the abandon all use: a lock may be cleared only when it
//! is free, or when its holder is a runner of this object (any object of this kind and
//! name: a destroy of an earlier one writes the same state) that is provably gone. A lock
//! held by anything else (a person, CI, a runner still running, a runner whose Pod is stuck
//! on a lost node) is never broken.
//!
//! Terraform records the holder in the Lease's lock info as `Who: user@hostname`, and a
//! Pod's hostname is its name. A runner's Pod is recognised by the Pods listed with the
//! object's labels, or, once its Pod is gone, by the name the API server generates for the
//! Pods of the object's Jobs: the Job's name and `-`, cut to 58 characters, then 5 random
//! characters (`generateName`, `names.SimpleNameGenerator`).

use jiff::Timestamp;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Pod;
use serde::Deserialize;

use crate::api::names;

/// What the lock is, for a deletion.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Lock {
    /// No Lease, or a Lease without a holder (Terraform's backend leaves one after
    /// unlocking).
    Free,
    /// Held by a runner of this object whose Pod is gone or has terminated: Terraform was
    /// killed before it could unlock. Clear it.
    StaleOwn { pod: String },
    /// Held by someone else, or by a runner that may still run: never broken.
    Held {
        /// `Who`, the lock ID and Terraform's operation, for the message.
        holder: String,
        /// When the lock was taken, and how long ago.
        age: Option<String>,
        /// Why CAPTF did not judge it stale: whose it is, as far as CAPTF can tell.
        why: String,
    },
}

/// Terraform's lock info, as its kubernetes backend records it in the Lease's
/// [`names::TF_LOCK_INFO`] annotation (the fields CAPTF reads; the others are ignored).
#[derive(Clone, Debug, Default, Deserialize, PartialEq, Eq)]
pub struct LockInfo {
    #[serde(rename = "ID", default)]
    pub id: String,
    /// `user@hostname` of the holder; a runner's hostname is its Pod's name.
    #[serde(rename = "Who", default)]
    pub who: String,
    #[serde(rename = "Operation", default)]
    pub operation: String,
    /// When the lock was taken (RFC 3339), as Terraform wrote it.
    #[serde(rename = "Created", default)]
    pub created: Option<String>,
}

impl LockInfo {
    /// The lock info of `lease`; an absent or unreadable annotation reads as empty.
    pub fn of(lease: &Lease) -> LockInfo {
        lease
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(names::TF_LOCK_INFO))
            .and_then(|v| serde_json::from_str(v).ok())
            .unwrap_or_default()
    }

    /// The holder's hostname (after the last `@` of `Who`), if any.
    pub fn host(&self) -> Option<&str> {
        self.who
            .rsplit_once('@')
            .map(|(_, h)| h)
            .filter(|h| !h.is_empty())
    }

    /// When the lock was taken, if Terraform said so readably.
    pub fn created(&self) -> Option<Timestamp> {
        self.created.as_deref()?.parse().ok()
    }
}

/// The API server's bound on generated names: 63 characters, 5 of them random.
const GENERATED_PREFIX_MAX: usize = 63 - 5;

/// Whether `host` is a name the API server would generate for a Pod of one of the Jobs of
/// the object with this state suffix (any operation, any attempt).
pub fn generated_runner_name(host: &str, suffix: &str) -> bool {
    if host.len() <= 5 || !host.is_ascii() {
        return false;
    }
    let (stem, random) = host.split_at(host.len() - 5);
    if !random
        .bytes()
        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
    {
        return false;
    }
    [names::OPERATION_APPLY, names::OPERATION_DESTROY]
        .iter()
        .any(|op| {
            if stem.len() < GENERATED_PREFIX_MAX {
                // The whole Job name and `-`: read the attempt, then build the name again.
                let Some(job) = stem.strip_suffix('-') else {
                    return false;
                };
                let Some((_, n)) = job.rsplit_once(&format!("-{op}-")[..]) else {
                    return false;
                };
                n.parse::<u32>()
                    .is_ok_and(|n| n > 0 && names::job_name(suffix, op, n) == job)
            } else {
                // Cut to 58 characters: the cut depends only on how many digits the
                // attempt has.
                (0..9).any(|digits| {
                    let n = 10u32.pow(digits);
                    let generated = format!("{}-", names::job_name(suffix, op, n));
                    generated.len() >= GENERATED_PREFIX_MAX
                        && generated[..GENERATED_PREFIX_MAX] == *stem
                })
            }
        })
}

/// Judges `lease` for the object with state suffix `suffix`, whose Pods (of every object of
/// its kind and name) are `pods`.
pub fn judge(lease: Option<&Lease>, suffix: &str, pods: &[Pod], now: Timestamp) -> Lock {
    let Some(lease) = lease else {
        return Lock::Free;
    };
    let Some(id) = lease
        .spec
        .as_ref()
        .and_then(|s| s.holder_identity.clone())
        .filter(|h| !h.is_empty())
    else {
        return Lock::Free;
    };
    let info = LockInfo::of(lease);
    let why = match info.host() {
        Some(host) => match pods
            .iter()
            .find(|p| p.metadata.name.as_deref() == Some(host))
        {
            Some(p) if crate::job::pod_terminated(p) => return Lock::StaleOwn { pod: host.into() },
            Some(p) => format!(
                "not stale: its holder is runner Pod {host} of this object, which has not terminated ({}); the Terraform in it unlocks when it ends",
                pod_state(p)
            ),
            None if generated_runner_name(host, suffix) => {
                return Lock::StaleOwn { pod: host.into() };
            }
            None => format!(
                "not stale: {host} is not a runner Pod of this object, so a person, CI or another tool holds it; only they may release it (or `terraform force-unlock {id}` once they are known to be gone)"
            ),
        },
        None => "not stale as far as CAPTF can tell: the lock info names no holder host".into(),
    };
    let age = info
        .created()
        .map(|c| format!("{c} ({} ago)", human_age(now.as_second() - c.as_second())));
    let mut about = vec![format!("lock {id}")];
    if !info.operation.is_empty() {
        about.push(format!(
            "operation {}",
            info.operation
                .strip_prefix("OperationType")
                .unwrap_or(&info.operation)
                .to_lowercase()
        ));
    }
    let holder = if info.who.is_empty() {
        about.join(", ")
    } else {
        format!("{} ({})", info.who, about.join(", "))
    };
    Lock::Held { holder, age, why }
}

/// A Pod's phase, and since when it is being deleted, for a message.
fn pod_state(p: &Pod) -> String {
    let phase = p
        .status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .unwrap_or("Pending");
    match &p.metadata.deletion_timestamp {
        Some(at) => format!("phase {phase}, terminating since {}", at.0),
        None => format!("phase {phase}"),
    }
}

fn human_age(seconds: i64) -> String {
    match seconds {
        s if s < 120 => format!("{s}s"),
        s if s < 7200 => format!("{}m", s / 60),
        s if s < 172_800 => format!("{}h", s / 3600),
        s => format!("{}d", s / 86_400),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn lease(who: &str) -> Lease {
        let info = json!({"ID": "abc", "Operation": "OperationTypeApply", "Who": who,
            "Created": "2026-12-01T10:00:00Z"});
        serde_json::from_value(json!({
            "metadata": {"name": "lock-tfstate-default-x", "annotations": {names::TF_LOCK_INFO: info.to_string()}},
            "spec": {"holderIdentity": "abc"}
        }))
        .unwrap()
    }

    fn pod(name: &str, phase: &str, running: bool) -> Pod {
        let state = if running {
            json!({"running": {"startedAt": "2026-12-01T10:00:00Z"}})
        } else {
            json!({"terminated": {"exitCode": 137, "reason": "OOMKilled"}})
        };
        serde_json::from_value(json!({
            "metadata": {"name": name},
            "status": {"phase": phase, "containerStatuses": [{"name": "terraform", "image": "i",
                "imageID": "", "ready": false, "restartCount": 0, "state": state}]}
        }))
        .unwrap()
    }

    fn now() -> Timestamp {
        "2026-12-01T12:00:00Z".parse().unwrap()
    }

    /// The Pod name the API server generates for a Job: 58 characters of `<job>-` and 5
    /// random ones.
    fn generated(job: &str, random: &str) -> String {
        let prefix = format!("{job}-");
        format!("{}{random}", &prefix[..prefix.len().min(58)])
    }

    #[test]
    fn a_runner_pod_that_terminated_holding_the_lock_makes_it_stale() {
        let name = generated(&names::job_name("web-1.tfm", "destroy", 2), "x7k2p");
        let l = lease(&format!("runner@{name}"));
        let oom = pod(&name, "Failed", false);
        assert_eq!(
            judge(Some(&l), "web-1.tfm", std::slice::from_ref(&oom), now()),
            Lock::StaleOwn { pod: name.clone() }
        );
        // Still running (or stuck terminating on a lost node): held, never broken.
        let running = pod(&name, "Running", true);
        assert!(matches!(
            judge(Some(&l), "web-1.tfm", &[running], now()),
            Lock::Held { .. }
        ));
        // A Failed phase with a container still running is not gone either.
        let odd = pod(&name, "Failed", true);
        assert!(matches!(
            judge(Some(&l), "web-1.tfm", &[odd], now()),
            Lock::Held { .. }
        ));
        // The Pod gone: recognised by its generated name.
        assert_eq!(
            judge(Some(&l), "web-1.tfm", &[], now()),
            Lock::StaleOwn { pod: name }
        );
    }

    #[test]
    fn long_names_are_recognised_by_the_name_the_api_server_generates() {
        for len in [40, 43, 44, 46, 50, 63, 120] {
            let obj: String = "m".repeat(len);
            let suffix = names::state_suffix(names::Kind::TerraformMachine, &obj);
            for (op, n) in [
                ("destroy", 1),
                ("destroy", 9),
                ("destroy", 10),
                ("destroy", 123),
                ("apply", 1),
            ] {
                let job = names::job_name(&suffix, op, n);
                let host = generated(&job, "b4z9q");
                assert!(host.len() <= 63, "{host}");
                assert!(
                    generated_runner_name(&host, &suffix),
                    "{len} {op} {n}: {host}"
                );
                let l = lease(&format!("runner@{host}"));
                assert_eq!(
                    judge(Some(&l), &suffix, &[], now()),
                    Lock::StaleOwn { pod: host.clone() },
                    "{len} {op} {n}"
                );
            }
            // Another object's runner is not this one's.
            let other = names::state_suffix(names::Kind::TerraformMachine, &format!("{obj}x"));
            let host = generated(&names::job_name(&other, "destroy", 1), "b4z9q");
            assert!(!generated_runner_name(&host, &suffix), "{len}: {host}");
        }
    }

    #[test]
    fn a_person_or_ci_holding_the_lock_is_never_broken() {
        for who in [
            "alice@laptop",
            "ci@runner-7",
            "captf@captf-web-1-tfm-destroy-1",
            "",
        ] {
            let l = lease(who);
            match judge(Some(&l), "web-1.tfm", &[], now()) {
                Lock::Held { holder, age, why } => {
                    assert!(holder.contains("lock abc, operation apply"), "{holder}");
                    assert_eq!(age.as_deref(), Some("2026-12-01T10:00:00Z (2h ago)"));
                    match who.rsplit_once('@') {
                        Some((_, host)) => assert!(
                            why.contains(&format!("{host} is not a runner Pod of this object"))
                                && why.contains("terraform force-unlock abc"),
                            "{why}"
                        ),
                        None => assert!(why.contains("names no holder host"), "{why}"),
                    }
                }
                other => panic!("{who}: {other:?}"),
            }
        }
    }

    #[test]
    fn a_lock_of_a_runner_still_running_names_the_pod_and_why_it_is_not_stale() {
        let name = generated(&names::job_name("web-1.tfm", "destroy", 2), "x7k2p");
        let l = lease(&format!("runner@{name}"));
        let mut stuck = pod(&name, "Running", true);
        stuck.metadata.deletion_timestamp =
            Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                "2026-12-01T11:00:00Z".parse().unwrap(),
            ));
        match judge(Some(&l), "web-1.tfm", &[stuck], now()) {
            Lock::Held { holder, why, .. } => {
                assert_eq!(holder, format!("runner@{name} (lock abc, operation apply)"));
                assert_eq!(
                    why,
                    format!(
                        "not stale: its holder is runner Pod {name} of this object, which has not terminated (phase Running, terminating since 2026-12-01T11:00:00Z); the Terraform in it unlocks when it ends"
                    )
                );
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_lease_without_a_holder_is_free() {
        let mut l = lease("runner@x");
        l.spec.as_mut().unwrap().holder_identity = None;
        assert_eq!(judge(Some(&l), "web-1.tfm", &[], now()), Lock::Free);
        assert_eq!(judge(None, "web-1.tfm", &[], now()), Lock::Free);
    }

    #[test]
    fn the_lock_info_is_read_typed_and_a_bad_one_reads_as_empty() {
        let info = LockInfo::of(&lease("runner@captf-web-1-tfm-destroy-2-abcde"));
        assert_eq!(info.id, "abc");
        assert_eq!(info.operation, "OperationTypeApply");
        assert_eq!(info.host(), Some("captf-web-1-tfm-destroy-2-abcde"));
        assert_eq!(
            info.created(),
            Some("2026-12-01T10:00:00Z".parse().expect("time"))
        );
        let mut bad = lease("x");
        bad.metadata
            .annotations
            .get_or_insert_default()
            .insert(names::TF_LOCK_INFO.into(), "{not json".into());
        assert_eq!(LockInfo::of(&bad), LockInfo::default());
        assert_eq!(LockInfo::of(&bad).host(), None);
    }
}
