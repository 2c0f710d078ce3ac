//! One case per step, period and rule of the workload cleanup.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use jiff::Timestamp;

use super::*;
use crate::api::names;

fn t(s: &str) -> Timestamp {
    s.parse().expect("timestamp")
}

fn target_of(step: Step, kind: &str) -> Target {
    *step
        .targets(false)
        .iter()
        .find(|t| t.kind == kind)
        .expect("kind of the step")
}

fn obj(step: Step, kind: &str, ns: Option<&str>, name: &str) -> Object {
    Object {
        target: target_of(step, kind),
        namespace: ns.map(str::to_string),
        name: name.into(),
        created: Some(t("2026-12-06T10:00:00Z")),
        deleting_since: None,
        finalizers: Vec::new(),
        labels: BTreeMap::new(),
    }
}

fn namespaces() -> BTreeSet<String> {
    ["default", "apps", "kube-system"]
        .map(String::from)
        .into_iter()
        .collect()
}

fn settings(annotations: &[(&str, &str)]) -> Settings {
    let a: BTreeMap<String, String> = annotations
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    Settings::of(&a, false)
}

const STARTED: &str = "2026-12-06T11:00:00Z";

#[test]
fn the_steps_run_in_the_seeds_order_with_its_kinds() {
    let kinds = |s: Step| -> Vec<&str> { s.targets(false).iter().map(|t| t.kind).collect() };
    assert_eq!(
        Step::ALL.map(Step::number),
        [1, 2, 3, 4],
        "webhooks, extended APIs, resources, snapshots"
    );
    assert_eq!(
        kinds(Step::Webhooks),
        [
            "ValidatingWebhookConfiguration",
            "MutatingWebhookConfiguration"
        ]
    );
    assert_eq!(
        kinds(Step::ExtendedApis),
        ["APIService", "CustomResourceDefinition"]
    );
    assert_eq!(
        kinds(Step::Resources),
        [
            "CronJob",
            "DaemonSet",
            "Deployment",
            "Ingress",
            "Job",
            "Pod",
            "ReplicaSet",
            "ReplicationController",
            "Service",
            "StatefulSet",
            "PersistentVolumeClaim"
        ]
    );
    assert_eq!(
        kinds(Step::Snapshots),
        ["VolumeSnapshot", "VolumeSnapshotContent"]
    );
}

#[test]
fn the_skip_annotation_limits_the_cleanup_to_services_and_volume_claims() {
    let s = settings(&[(names::WORKLOAD_CLEANUP_SKIP, "true")]);
    assert!(s.only_services_and_volumes);
    let kinds: Vec<Vec<&str>> = Step::ALL
        .map(|step| {
            step.targets(s.only_services_and_volumes)
                .iter()
                .map(|t| t.kind)
                .collect()
        })
        .to_vec();
    assert_eq!(
        kinds,
        vec![
            vec![],
            vec![],
            vec!["Service", "PersistentVolumeClaim"],
            vec![]
        ]
    );
}

#[test]
fn the_default_periods_are_five_minutes_and_an_hour() {
    let s = settings(&[]);
    assert!(!s.enabled, "off unless the manager or the Cluster says");
    assert_eq!(
        Step::ALL.map(|st| s.finalize_after(st).as_secs()),
        [300, 3600, 300, 3600]
    );
    assert!(Settings::of(&BTreeMap::new(), true).enabled);
}

#[test]
fn a_cluster_overrides_each_period_and_the_default() {
    let s = settings(&[
        (names::WORKLOAD_CLEANUP, "true"),
        (names::WORKLOAD_CLEANUP_WEBHOOKS_SECONDS, "0"),
        (names::WORKLOAD_CLEANUP_EXTENDED_APIS_SECONDS, "60"),
        (names::WORKLOAD_CLEANUP_RESOURCES_SECONDS, " 30 "),
        (names::WORKLOAD_CLEANUP_SNAPSHOTS_SECONDS, "90"),
    ]);
    assert!(s.enabled);
    assert!(s.problems.is_empty(), "{:?}", s.problems);
    assert_eq!(
        Step::ALL.map(|st| s.finalize_after(st).as_secs()),
        [0, 60, 30, 90]
    );
    let off = Settings::of(
        &[(names::WORKLOAD_CLEANUP.to_string(), "false".to_string())].into(),
        true,
    );
    assert!(
        !off.enabled,
        "the Cluster's false beats the manager's default"
    );
}

#[test]
fn an_unreadable_annotation_keeps_the_default_and_says_so() {
    let s = settings(&[
        (names::WORKLOAD_CLEANUP, "yes"),
        (names::WORKLOAD_CLEANUP_RESOURCES_SECONDS, "5m"),
        (names::WORKLOAD_CLEANUP_SNAPSHOTS_SECONDS, "-1"),
    ]);
    assert!(!s.enabled);
    assert_eq!(s.finalize_after(Step::Resources), Duration::from_secs(300));
    assert_eq!(s.finalize_after(Step::Snapshots), Duration::from_secs(3600));
    assert_eq!(s.problems.len(), 3, "{:?}", s.problems);
    assert!(
        s.problems[1].contains("\"5m\" is not a whole number of seconds: 300 s is used"),
        "{:?}",
        s.problems
    );
}

#[test]
fn an_object_is_deleted_gracefully_then_finalized_by_force_after_its_period() {
    let period = Duration::from_secs(300);
    let mut o = obj(Step::Resources, "Service", Some("apps"), "lb");
    let now = t("2026-12-06T11:00:10Z");
    assert_eq!(act(&o, now, period), Act::Delete { grace_seconds: 300 });
    o.deleting_since = Some(t("2026-12-06T11:00:10Z"));
    assert_eq!(
        act(&o, t("2026-12-06T11:04:59Z"), period),
        Act::Wait {
            force_at: t("2026-12-06T11:05:10Z")
        }
    );
    assert_eq!(act(&o, t("2026-12-06T11:05:10Z"), period), Act::Force);
    // A short period asks for a grace no longer than itself; the delete grace is at most
    // five minutes, whatever the period.
    o.deleting_since = None;
    assert_eq!(
        act(&o, now, Duration::from_secs(20)),
        Act::Delete { grace_seconds: 20 }
    );
    assert_eq!(
        act(&o, now, Duration::from_secs(3600)),
        Act::Delete { grace_seconds: 300 }
    );
}

#[test]
fn a_period_of_zero_forces_at_once_without_a_graceful_deletion() {
    let o = obj(Step::Webhooks, "ValidatingWebhookConfiguration", None, "w");
    assert_eq!(act(&o, t(STARTED), Duration::ZERO), Act::Force);
}

#[test]
fn objects_in_a_namespace_already_gone_are_ignored() {
    let o = obj(
        Step::Resources,
        "PersistentVolumeClaim",
        Some("gone"),
        "data",
    );
    assert_eq!(
        left_alone(
            &o,
            Some(&namespaces()),
            t(STARTED),
            Duration::from_secs(300)
        ),
        Some(Left::NamespaceGone)
    );
    let there = obj(
        Step::Resources,
        "PersistentVolumeClaim",
        Some("apps"),
        "data",
    );
    assert_eq!(
        left_alone(
            &there,
            Some(&namespaces()),
            t(STARTED),
            Duration::from_secs(300)
        ),
        None
    );
}

#[test]
fn objects_made_after_the_start_plus_the_period_are_ignored() {
    let period = Duration::from_secs(300);
    let mut o = obj(Step::Resources, "Service", Some("apps"), "late");
    o.created = Some(t("2026-12-06T11:05:00Z"));
    assert_eq!(
        left_alone(&o, Some(&namespaces()), t(STARTED), period),
        None,
        "made within the period: cleaned up"
    );
    o.created = Some(t("2026-12-06T11:05:01Z"));
    assert_eq!(
        left_alone(&o, Some(&namespaces()), t(STARTED), period),
        Some(Left::CreatedLater)
    );
}

#[test]
fn what_the_api_server_and_kube_system_need_is_left_alone() {
    let p = Duration::from_secs(300);
    let s = t(STARTED);
    let namespaces = namespaces();
    let ns = Some(&namespaces);
    let kubernetes = obj(Step::Resources, "Service", Some("default"), "kubernetes");
    assert_eq!(left_alone(&kubernetes, ns, s, p), Some(Left::ApiServers));
    let ccm = obj(Step::Resources, "Deployment", Some("kube-system"), "ccm");
    assert_eq!(left_alone(&ccm, ns, s, p), Some(Left::KubeSystem));
    let mut local = obj(Step::ExtendedApis, "APIService", None, "v1.apps");
    local.labels.insert(
        "kube-aggregator.kubernetes.io/automanaged".into(),
        "onstart".into(),
    );
    assert_eq!(left_alone(&local, ns, s, p), Some(Left::ApiServers));
    let metrics = obj(
        Step::ExtendedApis,
        "APIService",
        None,
        "v1beta1.metrics.k8s.io",
    );
    assert_eq!(left_alone(&metrics, ns, s, p), None);
    let snap = obj(
        Step::ExtendedApis,
        "CustomResourceDefinition",
        None,
        "volumesnapshots.snapshot.storage.k8s.io",
    );
    assert_eq!(left_alone(&snap, ns, s, p), Some(Left::ApiServers));
    let widgets = obj(
        Step::ExtendedApis,
        "CustomResourceDefinition",
        None,
        "widgets.example.com",
    );
    assert_eq!(left_alone(&widgets, ns, s, p), None);
    let mut kept = obj(Step::Resources, "Service", Some("apps"), "kept");
    kept.labels
        .insert(names::WORKLOAD_CLEANUP_EXCLUDE_LABEL.into(), "true".into());
    assert_eq!(left_alone(&kept, ns, s, p), Some(Left::Labelled));
}

#[test]
fn a_step_is_done_when_nothing_but_what_is_ignored_remains() {
    let s = settings(&[(names::WORKLOAD_CLEANUP_RESOURCES_SECONDS, "60")]);
    let now = t("2026-12-06T11:00:30Z");
    let mut deleting = obj(Step::Resources, "PersistentVolumeClaim", Some("apps"), "a");
    deleting.deleting_since = Some(t("2026-12-06T11:00:20Z"));
    let fresh = obj(Step::Resources, "Service", Some("apps"), "lb");
    let gone_ns = obj(Step::Resources, "Service", Some("gone"), "x");
    let plan = plan_step(
        Step::Resources,
        vec![deleting.clone(), fresh.clone(), gone_ns.clone()],
        &namespaces(),
        t(STARTED),
        &s,
        now,
    );
    assert!(!plan.done());
    assert_eq!(
        plan.remaining,
        vec![
            (
                deleting,
                Act::Wait {
                    force_at: t("2026-12-06T11:01:20Z")
                }
            ),
            (fresh, Act::Delete { grace_seconds: 60 }),
        ]
    );
    assert_eq!(plan.next_force(), Some(t("2026-12-06T11:01:20Z")));
    assert_eq!(
        plan.message(),
        "step 3 of 4 (workloads, Services and PersistentVolumeClaims): 2 remaining: PersistentVolumeClaim apps/a, Service apps/lb; finalizers are removed by force from 2026-12-06T11:01:20Z on"
    );
    let only_ignored = plan_step(
        Step::Resources,
        vec![gone_ns],
        &namespaces(),
        t(STARTED),
        &s,
        now,
    );
    assert!(only_ignored.done());
}

#[test]
fn a_long_list_is_named_in_part() {
    let s = settings(&[]);
    let objects = (0..8)
        .map(|i| obj(Step::Resources, "Pod", Some("apps"), &format!("p{i}")))
        .collect();
    let plan = plan_step(
        Step::Resources,
        objects,
        &namespaces(),
        t(STARTED),
        &s,
        t(STARTED),
    );
    let m = plan.message();
    assert!(
        m.contains("8 remaining: Pod apps/p0, Pod apps/p1, Pod apps/p2, Pod apps/p3, Pod apps/p4, and 3 more"),
        "{m}"
    );
}

#[test]
fn the_hook_holds_machines_only_while_the_clusters_cleanup_may_run() {
    // (enabled, cluster deleting, finished, machine deleting) -> wanted
    let cases = [
        ((false, false, false, false), false),
        ((false, true, false, true), false),
        ((true, false, false, false), true),
        ((true, false, false, true), false),
        ((true, true, false, false), true),
        ((true, true, false, true), true),
        ((true, true, true, true), false),
    ];
    for ((e, c, f, m), want) in cases {
        assert_eq!(hook_wanted(e, c, f, m), want, "{:?}", (e, c, f, m));
    }
    assert_eq!(
        give_up_at(t(STARTED), Duration::from_secs(600)),
        t("2026-12-06T11:10:00Z")
    );
}

#[test]
fn every_annotation_and_label_is_a_valid_key() {
    // The API server refuses a key whose name part is over 63 bytes (a Cluster annotated
    // with one cannot be saved at all).
    let keys = [
        names::WORKLOAD_CLEANUP,
        names::WORKLOAD_CLEANUP_SKIP,
        names::WORKLOAD_CLEANUP_EXCLUDE_LABEL,
        names::WORKLOAD_CLEANUP_STARTED,
        names::WORKLOAD_CLEANUP_FAILING_SINCE,
        names::WORKLOAD_CLEANUP_FINISHED,
        names::WORKLOAD_CLEANUP_HOOK,
    ]
    .into_iter()
    .chain(Step::ALL.map(Step::finalize_annotation));
    for key in keys {
        let (prefix, name) = key.split_once('/').expect("prefixed");
        assert!(prefix.len() <= 253 && !name.is_empty(), "{key}");
        assert!(name.len() <= 63, "{key}: name part of {} bytes", name.len());
    }
}

#[test]
fn a_start_recorded_before_this_deletion_belongs_to_an_earlier_object() {
    let deleted = t("2026-12-06T11:00:00Z");
    assert_eq!(started_for(None, deleted), None);
    assert_eq!(
        started_for(Some(t("2026-12-06T10:59:59.900Z")), deleted),
        None,
        "saved with an earlier object's YAML"
    );
    let same_second = t("2026-12-06T11:00:00.400Z");
    assert_eq!(started_for(Some(same_second), deleted), Some(same_second));
    let later = t("2026-12-06T11:05:00Z");
    assert_eq!(started_for(Some(later), deleted), Some(later));
}

#[test]
fn a_period_is_at_most_seven_days() {
    let s = settings(&[(names::WORKLOAD_CLEANUP_SNAPSHOTS_SECONDS, "4000000000")]);
    assert_eq!(s.finalize_after(Step::Snapshots), MAX_FINALIZE_AFTER);
    assert!(s.problems[0].contains("7 days"), "{:?}", s.problems);
}
