//! Disposal instead of deletion (seeds 002 and 003): an operator marks a Cluster API
//! Cluster for disposal with a retention; the Cluster is deleted by CAPTF when the
//! retention ends, unless the mark is taken back first or a hold keeps the final
//! deletion for a recovery. Everything here happens before a deletion is requested: once
//! the Cluster is being deleted, the deletion's table decides, with no gate.
//!
//! Pure: the TerraformCluster's pass gathers [`DisposalFacts`] from the Cluster (its
//! annotations) and its own record (`disposal-requested-at`), and acts on the decision.

use std::time::Duration;

use jiff::Timestamp;

use super::add;
use crate::api::conditions::{Desired, Status};
use crate::api::names;

/// The retention of a mark without one of its own, unless the manager is told another
/// (`--disposal-retention`); `captf explain` decides with it.
pub const DEFAULT_RETENTION: Duration = Duration::from_secs(72 * 3600);

/// The condition on a TerraformCluster whose Cluster is, or was, marked for disposal.
pub const DISPOSAL: &str = "Disposal";

pub mod reason {
    pub const NOT_MARKED: &str = "NotMarked";
    pub const PENDING: &str = "DisposalPending";
    pub const HELD: &str = "DisposalHeld";
    pub const DUE: &str = "DisposalDue";
    pub const DELETING: &str = "ClusterDeleting";
    pub const INVALID: &str = "DisposalInvalid";
}

/// What the pass knows of a disposal.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DisposalFacts {
    pub namespace: String,
    /// The Cluster API Cluster.
    pub cluster: String,
    /// The Cluster's `dispose-after` annotation, when it has one.
    pub mark: Option<String>,
    /// The Cluster's `disposal-hold` annotation, when it has one.
    pub hold: Option<String>,
    pub cluster_deleting: bool,
    /// Why the TerraformCluster is paused, if it is (its Cluster paused, clusterctl move
    /// under way): nothing is written or deleted until it is not.
    pub paused: Option<String>,
    /// The TerraformCluster's record of when the mark was first seen.
    pub requested_at: Option<Timestamp>,
    /// The retention of a mark without a value (`--disposal-retention`).
    pub default_retention: Duration,
    pub now: Timestamp,
}

/// What the pass does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DisposalAction {
    Nothing,
    /// Record that the mark was first seen now.
    Record(Timestamp),
    /// The mark is gone: the record goes.
    Clear,
    /// The retention is over: delete the Cluster.
    DeleteCluster,
}

/// The decision on a disposal.
#[derive(Clone, Debug, PartialEq)]
pub struct DisposalDecision {
    pub action: DisposalAction,
    /// The `Disposal` condition.
    pub condition: Desired,
    /// When the pass should look again (the end of the retention).
    pub wake_at: Option<Timestamp>,
    /// Counted by `captf_clusters_in_disposal` under this state, when marked.
    pub state: Option<&'static str>,
}

/// The retention a mark asks for: empty means the manager's default.
pub fn retention(mark: &str, default: Duration) -> Result<Duration, String> {
    let v = mark.trim();
    if v.is_empty() {
        return Ok(default);
    }
    crate::cli::parse_duration(v)
}

/// The `Disposal` condition to write: `NotMarked` only on an object that shows the
/// condition already (a disposal taken back); a Cluster never marked gets none.
pub fn shown_condition(d: &DisposalDecision, shown_before: bool) -> Option<Desired> {
    (d.condition.reason != reason::NOT_MARKED || shown_before).then(|| d.condition.clone())
}

pub fn decide_disposal(f: &DisposalFacts) -> DisposalDecision {
    let mut d = decide_unpaused(f);
    if let Some(why) = &f.paused
        && d.action != DisposalAction::Nothing
    {
        d.action = DisposalAction::Nothing;
        d.condition.message = format!(
            "{}; paused because {why}: nothing is recorded or deleted until it is unpaused",
            d.condition.message
        );
        d.wake_at = None;
    }
    d
}

fn decide_unpaused(f: &DisposalFacts) -> DisposalDecision {
    let undo = format!(
        "to take it back, remove the annotation: kubectl annotate clusters.cluster.x-k8s.io {} -n {} {}-",
        f.cluster,
        f.namespace,
        names::DISPOSE_AFTER
    );
    let Some(mark) = &f.mark else {
        let action = if f.requested_at.is_some() {
            DisposalAction::Clear
        } else {
            DisposalAction::Nothing
        };
        return DisposalDecision {
            action,
            condition: Desired::new(DISPOSAL, Status::False, reason::NOT_MARKED, ""),
            wake_at: None,
            state: None,
        };
    };
    let retention = match retention(mark, f.default_retention) {
        Ok(r) => r,
        Err(why) => {
            return DisposalDecision {
                action: DisposalAction::Nothing,
                condition: Desired::new(
                    DISPOSAL,
                    Status::False,
                    reason::INVALID,
                    format!(
                        "Cluster {}'s annotation {}={mark:?} is not a duration ({why}); nothing is scheduled: give a retention such as 72h, or an empty value for the manager's default",
                        f.cluster,
                        names::DISPOSE_AFTER
                    ),
                ),
                wake_at: None,
                state: None,
            };
        }
    };
    let requested_at = f.requested_at.unwrap_or(f.now);
    let delete_at = add(requested_at, retention);
    let action = match f.requested_at {
        None => DisposalAction::Record(f.now),
        Some(_) => DisposalAction::Nothing,
    };
    let when = format!(
        "disposal of Cluster {} requested at {requested_at} ({}={mark:?}), its deletion at {delete_at}",
        f.cluster,
        names::DISPOSE_AFTER
    );
    if f.cluster_deleting {
        return DisposalDecision {
            action,
            condition: Desired::new(
                DISPOSAL,
                Status::True,
                reason::DELETING,
                format!(
                    "{when}: the Cluster is being deleted, and its deletion runs as any other (see Deleting)"
                ),
            ),
            wake_at: None,
            state: Some("deleting"),
        };
    }
    if delete_at <= f.now {
        if let Some(why) = &f.hold {
            return DisposalDecision {
                action,
                condition: Desired::new(
                    DISPOSAL,
                    Status::True,
                    reason::HELD,
                    format!(
                        "{when}: the retention is over, and the deletion is held by {}={why:?} (a recovery); remove that annotation to let it go, or {undo}",
                        names::DISPOSAL_HOLD
                    ),
                ),
                wake_at: None,
                state: Some("held"),
            };
        }
        return DisposalDecision {
            action: DisposalAction::DeleteCluster,
            condition: Desired::new(
                DISPOSAL,
                Status::True,
                reason::DUE,
                format!(
                    "{when}: the retention is over: the Cluster is deleted, and everything CAPTF made for it destroyed"
                ),
            ),
            wake_at: None,
            state: Some("due"),
        };
    }
    let held = match &f.hold {
        Some(why) => format!(
            "; {}={why:?} will hold the deletion when the retention ends",
            names::DISPOSAL_HOLD
        ),
        None => String::new(),
    };
    DisposalDecision {
        action,
        condition: Desired::new(
            DISPOSAL,
            Status::True,
            reason::PENDING,
            format!(
                "{when}: then everything CAPTF made for it is destroyed{held}; {undo}; see docs/10-before-a-deletion.md"
            ),
        ),
        wake_at: Some(delete_at),
        state: Some("pending"),
    }
}

/// The condition on each object of a Cluster asked to hibernate.
pub const HIBERNATED: &str = "Hibernated";

/// The `Hibernated` condition of an object: `asked` (its Cluster is in disposal with
/// hibernation), whether its module declares `captf_hibernated` (`None`: not known), whether
/// its latest inputs are applied (`applied`, with `inputs_reason` otherwise), and whether
/// the object shows the condition already (it is only ever shown once hibernation was
/// asked).
pub fn hibernation(
    asked: bool,
    declares: Option<bool>,
    applied: bool,
    inputs_reason: &str,
    shown_before: bool,
) -> Option<Desired> {
    let var = crate::contract::HIBERNATED;
    let d = |status, why, msg: String| Some(Desired::new(HIBERNATED, status, why, msg));
    if !asked {
        return shown_before.then(|| Desired::new(HIBERNATED, Status::False, "NotHibernated", ""));
    }
    match (declares, applied) {
        (Some(false), _) => d(
            Status::False,
            "NotHibernatable",
            format!(
                "the Cluster is in disposal with hibernation asked, but this module does not declare {var}: it is left running until the deletion"
            ),
        ),
        (Some(true), true) => d(
            Status::True,
            "Hibernated",
            format!("applied with {var} = true"),
        ),
        (None, true) => d(
            Status::Unknown,
            "HibernationUnknown",
            format!(
                "applied with {var} = true; whether the module (a source address or an image's directory) declares it is not known here: check the module"
            ),
        ),
        (_, false) => d(
            Status::False,
            "Hibernating",
            format!(
                "the apply with {var} = true has not succeeded yet (InputsApplied: {inputs_reason})"
            ),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(s: &str) -> Timestamp {
        s.parse().unwrap()
    }

    fn marked(mark: &str) -> DisposalFacts {
        DisposalFacts {
            namespace: "team-a".into(),
            cluster: "prod".into(),
            mark: Some(mark.into()),
            hold: None,
            cluster_deleting: false,
            paused: None,
            requested_at: Some(t("2026-12-01T12:00:00Z")),
            default_retention: Duration::from_secs(72 * 3600),
            now: t("2026-12-02T12:00:00Z"),
        }
    }

    #[test]
    fn a_first_seen_mark_is_recorded_and_its_deletion_time_named() {
        let d = decide_disposal(&DisposalFacts {
            requested_at: None,
            ..marked("")
        });
        assert_eq!(d.action, DisposalAction::Record(t("2026-12-02T12:00:00Z")));
        assert_eq!(d.condition.reason, reason::PENDING);
        assert_eq!(
            d.wake_at,
            Some(t("2026-12-05T12:00:00Z")),
            "the default, 72h"
        );
        for said in [
            "requested at 2026-12-02T12:00:00Z",
            "its deletion at 2026-12-05T12:00:00Z",
            "kubectl annotate clusters.cluster.x-k8s.io prod -n team-a terraform.infrastructure.cluster.x-k8s.io/dispose-after-",
        ] {
            assert!(
                d.condition.message.contains(said),
                "{said}: {}",
                d.condition.message
            );
        }
    }

    #[test]
    fn a_pending_disposal_waits_for_its_time_and_names_a_hold() {
        let d = decide_disposal(&DisposalFacts {
            hold: Some("ticket 42".into()),
            ..marked("48h")
        });
        assert_eq!(d.action, DisposalAction::Nothing);
        assert_eq!(d.wake_at, Some(t("2026-12-03T12:00:00Z")));
        assert_eq!(d.state, Some("pending"));
        assert!(
            d.condition.message.contains("ticket 42"),
            "{}",
            d.condition.message
        );
    }

    #[test]
    fn at_its_end_the_cluster_is_deleted_unless_held() {
        let d = decide_disposal(&marked("24h"));
        assert_eq!(d.action, DisposalAction::DeleteCluster);
        assert_eq!(d.condition.reason, reason::DUE);
        let d = decide_disposal(&DisposalFacts {
            hold: Some("recovering a volume".into()),
            ..marked("24h")
        });
        assert_eq!(d.action, DisposalAction::Nothing);
        assert_eq!(d.condition.reason, reason::HELD);
        assert!(
            d.condition.message.contains("disposal-hold"),
            "{}",
            d.condition.message
        );
    }

    #[test]
    fn a_mark_taken_back_clears_the_record_and_a_bad_value_schedules_nothing() {
        let d = decide_disposal(&DisposalFacts {
            mark: None,
            ..marked("")
        });
        assert_eq!(d.action, DisposalAction::Clear);
        assert_eq!(
            (d.condition.status, d.condition.reason),
            (Status::False, reason::NOT_MARKED)
        );
        let d = decide_disposal(&DisposalFacts {
            mark: None,
            requested_at: None,
            ..marked("")
        });
        assert_eq!(d.action, DisposalAction::Nothing);
        let d = decide_disposal(&marked("soon"));
        assert_eq!(
            d.action,
            DisposalAction::Nothing,
            "never a deletion on a value nobody can read"
        );
        assert_eq!(d.condition.reason, reason::INVALID);
        assert!(
            d.condition.message.contains("\"soon\""),
            "{}",
            d.condition.message
        );
    }

    #[test]
    fn hibernation_says_what_each_module_does() {
        assert_eq!(hibernation(false, Some(true), true, "Applied", false), None);
        let c = hibernation(false, Some(true), true, "Applied", true).unwrap();
        assert_eq!((c.status, c.reason), (Status::False, "NotHibernated"));
        let c = hibernation(true, Some(false), true, "Applied", false).unwrap();
        assert_eq!((c.status, c.reason), (Status::False, "NotHibernatable"));
        assert!(c.message.contains("left running"), "{}", c.message);
        let c = hibernation(true, Some(true), false, "Applying", false).unwrap();
        assert_eq!((c.status, c.reason), (Status::False, "Hibernating"));
        let c = hibernation(true, Some(true), true, "Applied", false).unwrap();
        assert_eq!((c.status, c.reason), (Status::True, "Hibernated"));
        let c = hibernation(true, None, true, "Applied", false).unwrap();
        assert_eq!(c.status, Status::Unknown);
    }

    #[test]
    fn a_paused_cluster_is_neither_recorded_nor_deleted() {
        // A move pauses the Cluster: its source copy must not be deleted under it.
        let paused = || Some("its Cluster prod has spec.paused: true".to_string());
        let d = decide_disposal(&DisposalFacts {
            paused: paused(),
            ..marked("24h")
        });
        assert_eq!(d.action, DisposalAction::Nothing);
        assert_eq!(d.condition.reason, reason::DUE);
        assert!(
            d.condition.message.contains("paused because"),
            "{}",
            d.condition.message
        );
        let d = decide_disposal(&DisposalFacts {
            paused: paused(),
            requested_at: None,
            ..marked("24h")
        });
        assert_eq!(
            d.action,
            DisposalAction::Nothing,
            "not recorded while paused"
        );
    }

    #[test]
    fn a_cluster_already_being_deleted_is_left_to_its_deletion() {
        let d = decide_disposal(&DisposalFacts {
            cluster_deleting: true,
            ..marked("24h")
        });
        assert_eq!(d.action, DisposalAction::Nothing);
        assert_eq!(d.condition.reason, reason::DELETING);
    }
}
