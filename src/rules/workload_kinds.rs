//! The kinds the workload cleanup deletes, step by step (seed 000's lists), as the
//! workload cluster's API serves them.

/// One kind the cleanup deletes in the workload cluster.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Target {
    pub group: &'static str,
    pub version: &'static str,
    pub kind: &'static str,
    pub plural: &'static str,
    pub namespaced: bool,
}

pub(super) const fn target(
    group: &'static str,
    version: &'static str,
    kind: &'static str,
    plural: &'static str,
    namespaced: bool,
) -> Target {
    Target {
        group,
        version,
        kind,
        plural,
        namespaced,
    }
}

pub(super) const WEBHOOKS: [Target; 2] = [
    target(
        "admissionregistration.k8s.io",
        "v1",
        "ValidatingWebhookConfiguration",
        "validatingwebhookconfigurations",
        false,
    ),
    target(
        "admissionregistration.k8s.io",
        "v1",
        "MutatingWebhookConfiguration",
        "mutatingwebhookconfigurations",
        false,
    ),
];

pub(super) const EXTENDED_APIS: [Target; 2] = [
    target(
        "apiregistration.k8s.io",
        "v1",
        "APIService",
        "apiservices",
        false,
    ),
    target(
        "apiextensions.k8s.io",
        "v1",
        "CustomResourceDefinition",
        "customresourcedefinitions",
        false,
    ),
];

pub(super) const SERVICE: Target = target("", "v1", "Service", "services", true);
pub(super) const PVC: Target = target(
    "",
    "v1",
    "PersistentVolumeClaim",
    "persistentvolumeclaims",
    true,
);

pub(super) const RESOURCES: [Target; 11] = [
    target("batch", "v1", "CronJob", "cronjobs", true),
    target("apps", "v1", "DaemonSet", "daemonsets", true),
    target("apps", "v1", "Deployment", "deployments", true),
    target("networking.k8s.io", "v1", "Ingress", "ingresses", true),
    target("batch", "v1", "Job", "jobs", true),
    target("", "v1", "Pod", "pods", true),
    target("apps", "v1", "ReplicaSet", "replicasets", true),
    target(
        "",
        "v1",
        "ReplicationController",
        "replicationcontrollers",
        true,
    ),
    SERVICE,
    target("apps", "v1", "StatefulSet", "statefulsets", true),
    PVC,
];

/// The group of the snapshot kinds: their CRDs are left to the last step.
pub const SNAPSHOT_GROUP: &str = "snapshot.storage.k8s.io";

pub(super) const SNAPSHOTS: [Target; 2] = [
    target(
        SNAPSHOT_GROUP,
        "v1",
        "VolumeSnapshot",
        "volumesnapshots",
        true,
    ),
    target(
        SNAPSHOT_GROUP,
        "v1",
        "VolumeSnapshotContent",
        "volumesnapshotcontents",
        false,
    ),
];
