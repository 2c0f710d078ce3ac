//! What is so now, counted at each scrape from the objects in the manager's caches (no
//! request): live objects by phase, deletions by their `Deleting` reason, deletions held
//! and the oldest of them, destroys and applies failing. Each object is read from the
//! status and annotations its own passes wrote ([`Entry::of`]); [`tally`] counts them.
//! Both are pure, so the families say exactly what the conditions say.

use std::collections::BTreeMap;

use jiff::Timestamp;
use kube::ResourceExt;
use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue, LabelValueEncoder};

pub use super::labels::{ByKind, ByReason, KindValue, Reason};

use crate::api::conditions::{self as cond, Condition, reason};
use crate::api::names::{self, Kind};
use crate::api::object::TerraformObject;
use crate::rules::apply::{INPUTS_APPLIED, PROVISIONED, reason as apply_reason};

/// Where a live object is, as its conditions say.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, PartialOrd, Ord)]
pub enum Phase {
    /// No apply condition yet (a new object, or a manager run with `--provision=false`).
    Unknown,
    /// At a gate: its owner, the cluster's infrastructure or control plane, bootstrap
    /// data, the cluster's outputs.
    Waiting,
    /// Paused (the Cluster, or the object's own annotation).
    Paused,
    /// An apply Job runs or is starting.
    Applying,
    /// The latest apply failed; the next is due on the retry schedule.
    Failing,
    /// An apply that cannot start or whose result was refused (an untrusted state, outputs
    /// that break the contract, a change refused, a destructive plan not approved): it
    /// waits for a person.
    Refused,
    /// The latest inputs are applied.
    Provisioned,
    /// Its deletion was asked.
    Deleting,
}

impl Phase {
    pub const ALL: [Phase; 8] = [
        Phase::Unknown,
        Phase::Waiting,
        Phase::Paused,
        Phase::Applying,
        Phase::Failing,
        Phase::Refused,
        Phase::Provisioned,
        Phase::Deleting,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Phase::Unknown => "unknown",
            Phase::Waiting => "waiting",
            Phase::Paused => "paused",
            Phase::Applying => "applying",
            Phase::Failing => "failing",
            Phase::Refused => "refused",
            Phase::Provisioned => "provisioned",
            Phase::Deleting => "deleting",
        }
    }

    /// The phase an `InputsApplied` reason means on a live object.
    fn of_apply_reason(why: &str) -> Phase {
        match why {
            apply_reason::APPLIED => Phase::Provisioned,
            apply_reason::PAUSED => Phase::Paused,
            apply_reason::APPLYING => Phase::Applying,
            apply_reason::APPLY_FAILED => Phase::Failing,
            w if w.starts_with("WaitingFor") => Phase::Waiting,
            _ => Phase::Refused,
        }
    }
}

impl EncodeLabelValue for Phase {
    fn encode(&self, encoder: &mut LabelValueEncoder) -> Result<(), std::fmt::Error> {
        std::fmt::Write::write_str(encoder, self.as_str())
    }
}

/// `kind`, `phase`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ByPhase {
    pub kind: KindValue,
    pub phase: Phase,
}

/// One object, as the opt-in info series names it (`--metrics-object-info`): the only
/// family with object names in its labels.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ObjectLabels {
    pub kind: KindValue,
    pub namespace: String,
    pub name: String,
    pub cluster: String,
    pub phase: Phase,
}

/// One cached object, as the census reads it.
#[derive(Clone, Debug, PartialEq)]
pub struct Entry {
    pub kind: Kind,
    pub namespace: String,
    pub name: String,
    /// Its Cluster API Cluster (owner reference or label), empty when none.
    pub cluster: String,
    pub phase: Phase,
    /// A deletion: its `Deleting` reason (`Unknown` before its first pass wrote one).
    pub deleting: Option<Reason>,
    /// A deletion held for a person, why (the state's reason, the blocker's own, or why
    /// the destroy cannot start), and when the deletion was asked.
    pub held: Option<(Reason, Timestamp)>,
    /// A deletion whose destroy failed and is retried (its next attempt pending or
    /// running): how many attempts failed in a row.
    pub destroy_failures: Option<u32>,
    /// A live object whose latest inputs are not applied and do not just wait or run: the
    /// reason (`ApplyFailed`, `ApplyCannotStart`, …) and the failures in a row.
    pub apply_blocked: Option<Reason>,
    /// A live object's apply attempts failed in a row (0 when its latest finished apply
    /// succeeded): kept while the next attempt runs, so that a failing apply stays
    /// failing across its retries.
    pub apply_failures: u32,
}

fn condition<'a>(conditions: &'a [Condition], type_: &str) -> Option<&'a Condition> {
    conditions.iter().find(|c| c.type_ == type_)
}

fn number(obj: &impl ResourceExt, key: &str) -> u32 {
    obj.annotations()
        .get(key)
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0)
}

impl Entry {
    pub fn of<K: TerraformObject>(obj: &K) -> Entry {
        let conditions = obj.status().map(|s| s.conditions.as_slice()).unwrap_or(&[]);
        let of = |t: &str| condition(conditions, t);
        let true_reason = |t: &str| {
            of(t)
                .filter(|c| c.status == "True")
                .map(|c| c.reason.as_str())
        };
        let false_reason = |t: &str| {
            of(t)
                .filter(|c| c.status == "False")
                .map(|c| c.reason.as_str())
        };
        let mut e = Entry {
            kind: K::KIND,
            namespace: obj.namespace().unwrap_or_default(),
            name: obj.name_any(),
            cluster: crate::gather::owning_cluster(obj.meta()).unwrap_or_default(),
            phase: Phase::Unknown,
            deleting: None,
            held: None,
            destroy_failures: None,
            apply_blocked: None,
            apply_failures: 0,
        };
        if let Some(asked) = &obj.meta().deletion_timestamp {
            e.phase = Phase::Deleting;
            let deleting = true_reason(cond::DELETING).unwrap_or("Unknown");
            e.deleting = Some(Reason::new(deleting));
            let held = match deleting {
                reason::HELD => Some(false_reason(cond::STATE_READABLE).unwrap_or(reason::HELD)),
                reason::DESTROY_CANNOT_START => Some(
                    true_reason(cond::DELETION_BLOCKED)
                        .filter(|r| *r != reason::DEPENDENTS_EXIST)
                        .unwrap_or(reason::DESTROY_CANNOT_START),
                ),
                _ => None,
            };
            e.held = held.map(|why| (Reason::new(why), asked.0));
            // Failing from the first failure until the release, across the retries (an
            // attempt running again does not end it): attempt N failed, or attempt N runs
            // after N - 1 failures.
            let attempt: u32 =
                crate::gather::deletion_bookkeeping(obj.meta(), names::DESTROY_ATTEMPT)
                    .and_then(|v| v.trim().parse().ok())
                    .unwrap_or(0);
            e.destroy_failures = match deleting {
                reason::DESTROY_FAILED => Some(attempt.max(1)),
                reason::DESTROY_RUNNING | reason::WAITING_FOR_JOB if attempt >= 2 => {
                    Some(attempt - 1)
                }
                _ => None,
            };
            return e;
        }
        e.phase = match of(INPUTS_APPLIED) {
            Some(c) if c.status == "True" => Phase::Provisioned,
            Some(c) => Phase::of_apply_reason(&c.reason),
            None if true_reason(PROVISIONED).is_some() => Phase::Provisioned,
            None => Phase::Unknown,
        };
        if matches!(e.phase, Phase::Failing | Phase::Refused)
            && let Some(c) = of(INPUTS_APPLIED)
        {
            e.apply_blocked = Some(Reason::new(&c.reason));
        }
        e.apply_failures = number(obj, names::APPLY_FAILURES);
        e
    }
}

/// What the families show, counted from the entries.
#[derive(Debug, Default, PartialEq)]
pub struct Tally {
    pub objects: BTreeMap<(Kind, Phase), i64>,
    pub deletions: BTreeMap<(Kind, Reason), i64>,
    /// Per kind and reason: how many, and when the oldest of them was asked.
    pub held: BTreeMap<(Kind, Reason), (i64, Timestamp)>,
    /// Per kind: how many deletions' destroys are failing, and the most failures in a row.
    pub destroys_failing: BTreeMap<Kind, (i64, u32)>,
    pub applies_blocked: BTreeMap<(Kind, Reason), i64>,
    /// Per kind: how many live objects' applies are failing (retried), and the most
    /// failures in a row.
    pub applies_failing: BTreeMap<Kind, (i64, u32)>,
}

/// Counts `entries`. Every kind and phase is present (at 0), so that a series that was
/// non-zero goes back to 0 instead of vanishing.
pub fn tally<'a>(kinds: &[Kind], entries: impl IntoIterator<Item = &'a Entry>) -> Tally {
    let mut t = Tally::default();
    for &k in kinds {
        for p in Phase::ALL {
            t.objects.insert((k, p), 0);
        }
        t.destroys_failing.insert(k, (0, 0));
        t.applies_failing.insert(k, (0, 0));
    }
    for e in entries {
        *t.objects.entry((e.kind, e.phase)).or_default() += 1;
        if let Some(r) = &e.deleting {
            *t.deletions.entry((e.kind, r.clone())).or_default() += 1;
        }
        if let Some((r, asked)) = &e.held {
            let slot = t.held.entry((e.kind, r.clone())).or_insert((0, *asked));
            slot.0 += 1;
            slot.1 = slot.1.min(*asked);
        }
        if let Some(n) = e.destroy_failures {
            let slot = t.destroys_failing.entry(e.kind).or_default();
            slot.0 += 1;
            slot.1 = slot.1.max(n);
        }
        if let Some(r) = &e.apply_blocked {
            *t.applies_blocked.entry((e.kind, r.clone())).or_default() += 1;
        }
        if e.apply_failures > 0 {
            let slot = t.applies_failing.entry(e.kind).or_default();
            slot.0 += 1;
            slot.1 = slot.1.max(e.apply_failures);
        }
    }
    t
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::TerraformMachine;

    fn machine(
        conditions: &[(&str, &str, &str)],
        annotations: &[(&str, &str)],
    ) -> TerraformMachine {
        let mut m: TerraformMachine = serde_json::from_value(serde_json::json!({
            "apiVersion": names::API_VERSION, "kind": "TerraformMachine",
            "metadata": {"name": "web-1", "namespace": "team-a", "uid": "uid-1",
                "labels": {names::CAPI_CLUSTER_NAME_LABEL: "prod"}},
            "spec": {"module": {"source": "./m"}},
        }))
        .expect("a machine");
        m.metadata.annotations = Some(
            annotations
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        );
        let conditions = conditions
            .iter()
            .map(|(t, s, r)| Condition {
                type_: t.to_string(),
                status: s.to_string(),
                reason: r.to_string(),
                message: String::new(),
                last_transition_time: k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                    Timestamp::UNIX_EPOCH,
                ),
                observed_generation: None,
            })
            .collect();
        m.status = Some(crate::api::TerraformStatus {
            conditions,
            ..Default::default()
        });
        m
    }

    fn deleting(mut m: TerraformMachine, at: i64) -> TerraformMachine {
        m.metadata.deletion_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
            Timestamp::from_second(at).expect("a time"),
        ));
        m
    }

    #[test]
    fn a_live_object_is_in_the_phase_its_apply_condition_says() {
        let cases = [
            (vec![], Phase::Unknown),
            (
                vec![(INPUTS_APPLIED, "Unknown", "WaitingForBootstrapData")],
                Phase::Waiting,
            ),
            (vec![(INPUTS_APPLIED, "Unknown", "Paused")], Phase::Paused),
            (vec![(INPUTS_APPLIED, "False", "Applying")], Phase::Applying),
            (
                vec![(INPUTS_APPLIED, "False", "ApplyFailed")],
                Phase::Failing,
            ),
            (
                vec![(INPUTS_APPLIED, "False", "DestructivePlanBlocked")],
                Phase::Refused,
            ),
            (
                vec![(INPUTS_APPLIED, "False", "ApplyCannotStart")],
                Phase::Refused,
            ),
            (
                vec![
                    (PROVISIONED, "True", "Provisioned"),
                    (INPUTS_APPLIED, "True", "Applied"),
                ],
                Phase::Provisioned,
            ),
            // A provisioned object re-applying is applying.
            (
                vec![
                    (PROVISIONED, "True", "Provisioned"),
                    (INPUTS_APPLIED, "False", "Applying"),
                ],
                Phase::Applying,
            ),
        ];
        for (conditions, phase) in cases {
            let e = Entry::of(&machine(&conditions, &[]));
            assert_eq!(e.phase, phase, "{conditions:?}");
            assert_eq!(e.cluster, "prod");
            assert!(e.deleting.is_none() && e.held.is_none());
        }
        let failing = Entry::of(&machine(
            &[(INPUTS_APPLIED, "False", "ApplyFailed")],
            &[(names::APPLY_FAILURES, "3")],
        ));
        assert_eq!(failing.apply_blocked, Some(Reason::new("ApplyFailed")));
        assert_eq!(failing.apply_failures, 3);
        // Its next attempt runs: still failing, no longer blocked.
        let retrying = Entry::of(&machine(
            &[(INPUTS_APPLIED, "False", "Applying")],
            &[(names::APPLY_FAILURES, "3")],
        ));
        assert_eq!(
            (
                retrying.phase,
                retrying.apply_blocked.clone(),
                retrying.apply_failures
            ),
            (Phase::Applying, None, 3)
        );
        let t = tally(&[Kind::TerraformMachine], [&failing, &retrying]);
        assert_eq!(t.applies_failing[&Kind::TerraformMachine], (2, 3));
    }

    #[test]
    fn a_deletion_is_held_for_the_reason_a_person_must_act_on() {
        let lost = Entry::of(&deleting(
            machine(
                &[
                    (cond::DELETING, "True", reason::HELD),
                    (cond::STATE_READABLE, "False", reason::STATE_LOST),
                ],
                &[],
            ),
            1_000,
        ));
        assert_eq!(lost.phase, Phase::Deleting);
        assert_eq!(lost.deleting, Some(Reason::new("Held")));
        assert_eq!(
            lost.held,
            Some((
                Reason::new("StateLost"),
                Timestamp::from_second(1_000).unwrap()
            ))
        );

        let owner_gone = Entry::of(&deleting(
            machine(
                &[
                    (cond::DELETING, "True", reason::DESTROY_CANNOT_START),
                    (cond::DELETION_BLOCKED, "True", reason::OWNER_GONE),
                ],
                &[],
            ),
            1_000,
        ));
        assert_eq!(owner_gone.held.map(|h| h.0), Some(Reason::new("OwnerGone")));

        let cannot_start = Entry::of(&deleting(
            machine(
                &[
                    (cond::DELETING, "True", reason::DESTROY_CANNOT_START),
                    (cond::DELETION_BLOCKED, "False", reason::NOT_BLOCKED),
                ],
                &[],
            ),
            1_000,
        ));
        assert_eq!(
            cannot_start.held.map(|h| h.0),
            Some(Reason::new("DestroyCannotStart"))
        );

        // A destroy that failed is retried by itself: failing, not held, and still
        // failing while its next attempt runs.
        let bookkeeping = |attempt: &'static str| {
            [
                (names::DELETION_UID, "uid-1"),
                (names::DESTROY_ATTEMPT, attempt),
            ]
        };
        let failed = Entry::of(&deleting(
            machine(
                &[(cond::DELETING, "True", reason::DESTROY_FAILED)],
                &bookkeeping("4"),
            ),
            1_000,
        ));
        assert_eq!(failed.held, None);
        assert_eq!(failed.destroy_failures, Some(4));
        let retrying = Entry::of(&deleting(
            machine(
                &[(cond::DELETING, "True", reason::DESTROY_RUNNING)],
                &bookkeeping("5"),
            ),
            1_000,
        ));
        assert_eq!(retrying.destroy_failures, Some(4));
        // The bookkeeping of an earlier object of this name is not this one's.
        let mut earlier = deleting(
            machine(
                &[(cond::DELETING, "True", reason::DESTROY_RUNNING)],
                &bookkeeping("5"),
            ),
            1_000,
        );
        earlier.metadata.uid = Some("uid-2".into());
        assert_eq!(Entry::of(&earlier).destroy_failures, None);

        // A first attempt running, waiting for a Job or for dependents: in flight, not held.
        for why in [
            reason::DESTROY_RUNNING,
            reason::WAITING_FOR_JOB,
            reason::WAITING_FOR_DEPENDENTS,
            reason::CLEANING_UP,
        ] {
            let e = Entry::of(&deleting(
                machine(&[(cond::DELETING, "True", why)], &bookkeeping("1")),
                1_000,
            ));
            assert_eq!((e.held, e.destroy_failures), (None, None), "{why}");
            assert_eq!(e.deleting, Some(Reason::new(why)));
        }
        // Before its first deletion pass.
        let fresh = Entry::of(&deleting(machine(&[], &[]), 1_000));
        assert_eq!(fresh.deleting, Some(Reason::new("Unknown")));
    }

    #[test]
    fn a_tally_counts_every_phase_keeps_the_oldest_held_and_the_longest_run_of_failures() {
        let at = |s| Timestamp::from_second(s).unwrap();
        let entries = [
            Entry::of(&deleting(
                machine(
                    &[
                        (cond::DELETING, "True", reason::HELD),
                        (cond::STATE_READABLE, "False", reason::STATE_LOST),
                    ],
                    &[],
                ),
                2_000,
            )),
            Entry::of(&deleting(
                machine(
                    &[
                        (cond::DELETING, "True", reason::HELD),
                        (cond::STATE_READABLE, "False", reason::STATE_LOST),
                    ],
                    &[],
                ),
                1_000,
            )),
            Entry::of(&deleting(
                machine(
                    &[(cond::DELETING, "True", reason::DESTROY_FAILED)],
                    &[
                        (names::DELETION_UID, "uid-1"),
                        (names::DESTROY_ATTEMPT, "2"),
                    ],
                ),
                1_000,
            )),
            Entry::of(&deleting(
                machine(
                    &[(cond::DELETING, "True", reason::DESTROY_FAILED)],
                    &[
                        (names::DELETION_UID, "uid-1"),
                        (names::DESTROY_ATTEMPT, "7"),
                    ],
                ),
                1_000,
            )),
            Entry::of(&machine(&[(INPUTS_APPLIED, "True", "Applied")], &[])),
        ];
        let t = tally(&Kind::ALL, &entries);
        let m = Kind::TerraformMachine;
        assert_eq!(t.objects[&(m, Phase::Deleting)], 4);
        assert_eq!(t.objects[&(m, Phase::Provisioned)], 1);
        assert_eq!(t.objects[&(m, Phase::Failing)], 0);
        assert_eq!(t.objects[&(Kind::TerraformCluster, Phase::Waiting)], 0);
        assert_eq!(t.held[&(m, Reason::new("StateLost"))], (2, at(1_000)));
        assert_eq!(t.destroys_failing[&m], (2, 7));
        assert_eq!(t.deletions[&(m, Reason::new("Held"))], 2);
        assert_eq!(t.deletions[&(m, Reason::new("DestroyFailed"))], 2);
    }

    #[test]
    fn a_reason_that_is_not_a_word_is_counted_as_other() {
        assert_eq!(Reason::new("StateLost").as_str(), "StateLost");
        for odd in ["", "state lost", "a\"b", "lower", &"X".repeat(65)] {
            assert_eq!(Reason::new(odd).as_str(), "Other", "{odd:?}");
        }
    }
}
