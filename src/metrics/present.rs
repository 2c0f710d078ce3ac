//! The gauges of the present: registered once, set from a [`census::Tally`] at each
//! scrape.

use super::*;

pub(super) type GaugeF64 = PromGauge<f64, AtomicU64>;

/// The gauges of the present, set from a [`census::Tally`] at each scrape.
pub(super) struct Present {
    objects: Family<census::ByPhase, PromGauge>,
    deletions: Family<census::ByReason, PromGauge>,
    held: Family<census::ByReason, PromGauge>,
    held_oldest: Family<census::ByReason, GaugeF64>,
    destroys_failing: Family<census::ByKind, PromGauge>,
    destroy_failures_max: Family<census::ByKind, PromGauge>,
    applies_blocked: Family<census::ByReason, PromGauge>,
    applies_failing: Family<census::ByKind, PromGauge>,
    apply_failures_max: Family<census::ByKind, PromGauge>,
    object_info: Family<census::ObjectLabels, PromGauge>,
    permits_in_use: PromGauge,
    permits_waiting: PromGauge,
    permit_longest_wait: GaugeF64,
}

impl Present {
    pub(super) fn register(r: &mut Registrar) -> Present {
        let p = Present {
            objects: Family::default(),
            deletions: Family::default(),
            held: Family::default(),
            held_oldest: Family::default(),
            destroys_failing: Family::default(),
            destroy_failures_max: Family::default(),
            applies_blocked: Family::default(),
            applies_failing: Family::default(),
            apply_failures_max: Family::default(),
            object_info: Family::default(),
            permits_in_use: PromGauge::default(),
            permits_waiting: PromGauge::default(),
            permit_longest_wait: GaugeF64::default(),
        };
        r.add("captf_objects", "Objects in the manager's caches, by kind and phase (unknown, waiting, paused, applying, failing, refused, provisioned, deleting)", p.objects.clone());
        r.add("captf_deletions", "Objects being deleted, by kind and the reason of their Deleting condition (DestroyRunning, WaitingForJob, DestroyFailed, Held, …; Unknown before their first deletion pass)", p.deletions.clone());
        r.add("captf_deletions_held", "Deletions held until a person acts, by kind and why (StateLost, StateCorrupt, StateEncrypted, StateInconsistent, OwnerGone, ErroredState, DestroyCannotStart)", p.held.clone());
        r.add(
            "captf_deletion_held_oldest_seconds",
            "How long ago the oldest held deletion was asked, by kind and why it is held",
            p.held_oldest.clone(),
        );
        r.add(
            "captf_destroys_failing",
            "Deletions whose destroy failed and is retried on the backoff schedule (the next attempt pending or running), by kind",
            p.destroys_failing.clone(),
        );
        r.add("captf_destroy_failures_in_a_row_max", "The most destroy attempts failed in a row among the deletions whose destroy fails, by kind", p.destroy_failures_max.clone());
        r.add("captf_applies_blocked", "Live objects whose latest inputs are not applied and do not merely wait or run (ApplyFailed, ApplyCannotStart, DestructivePlanBlocked, OutputsInvalid, ChangeRefused, …), by kind and reason", p.applies_blocked.clone());
        r.add(
            "captf_applies_failing",
            "Live objects whose latest apply attempts failed and are retried (their next attempt pending or running), by kind",
            p.applies_failing.clone(),
        );
        r.add(
            "captf_apply_failures_in_a_row_max",
            "The most apply attempts failed in a row among the objects whose apply fails, by kind",
            p.apply_failures_max.clone(),
        );
        r.add("captf_object_info", "One series per object with its namespace, name, Cluster and phase (only with --metrics-object-info: its labels grow with the fleet)", p.object_info.clone());
        r.add(
            "captf_state_read_permits_in_use",
            "State-read permits held by passes now (at most --max-state-reads)",
            p.permits_in_use.clone(),
        );
        r.add(
            "captf_state_read_permits_waiting",
            "Passes waiting for a state-read permit now",
            p.permits_waiting.clone(),
        );
        r.add("captf_state_read_longest_wait_seconds", "How long the pass that has waited longest for a state-read permit, still waiting, has waited (0 when none waits); /healthz fails past --state-read-starved-after", p.permit_longest_wait.clone());
        p
    }

    pub(super) fn set_permits(&self, permits: &StateReads) {
        self.permits_in_use.set(
            i64::try_from(permits.max().saturating_sub(permits.available())).unwrap_or(i64::MAX),
        );
        self.permits_waiting
            .set(i64::try_from(permits.waiting()).unwrap_or(i64::MAX));
        self.permit_longest_wait
            .set(permits.longest_wait().map_or(0.0, |d| d.as_secs_f64()));
    }

    pub(super) fn set(
        &self,
        kinds: &[Kind],
        entries: &[census::Entry],
        now: Timestamp,
        info: bool,
    ) {
        use census::{ByKind, ByPhase, ByReason, KindValue};
        let t = census::tally(kinds, entries);
        for f in [&self.deletions, &self.held, &self.applies_blocked] {
            f.clear();
        }
        self.held_oldest.clear();
        self.object_info.clear();
        for ((kind, phase), n) in t.objects {
            self.objects
                .get_or_create(&ByPhase {
                    kind: KindValue(kind),
                    phase,
                })
                .set(n);
        }
        for ((kind, reason), n) in t.deletions {
            self.deletions
                .get_or_create(&ByReason {
                    kind: KindValue(kind),
                    reason,
                })
                .set(n);
        }
        for ((kind, reason), (n, oldest)) in t.held {
            let labels = ByReason {
                kind: KindValue(kind),
                reason,
            };
            self.held.get_or_create(&labels).set(n);
            let age = now.duration_since(oldest).as_secs_f64().max(0.0);
            self.held_oldest.get_or_create(&labels).set(age);
        }
        for (kind, (n, max)) in t.destroys_failing {
            let labels = ByKind {
                kind: KindValue(kind),
            };
            self.destroys_failing.get_or_create(&labels).set(n);
            self.destroy_failures_max
                .get_or_create(&labels)
                .set(i64::from(max));
        }
        for ((kind, reason), n) in t.applies_blocked {
            self.applies_blocked
                .get_or_create(&ByReason {
                    kind: KindValue(kind),
                    reason,
                })
                .set(n);
        }
        for (kind, (n, max)) in t.applies_failing {
            let labels = ByKind {
                kind: KindValue(kind),
            };
            self.applies_failing.get_or_create(&labels).set(n);
            self.apply_failures_max
                .get_or_create(&labels)
                .set(i64::from(max));
        }
        if info {
            for e in entries {
                self.object_info
                    .get_or_create(&census::ObjectLabels {
                        kind: KindValue(e.kind),
                        namespace: e.namespace.clone(),
                        name: e.name.clone(),
                        cluster: e.cluster.clone(),
                        phase: e.phase,
                    })
                    .set(1);
            }
        }
    }
}
