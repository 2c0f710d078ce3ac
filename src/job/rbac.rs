//! The runner's RBAC in one namespace: what Terraform's kubernetes backend needs (Secrets:
//! get, list, create, update, delete; Leases: get, create, update, delete), nothing
//! cluster-wide. No ownerReference to a CAPTF object: with foreground deletion the garbage
//! collector would delete the RoleBinding a running destroy writes its state with. Each
//! RoleBinding is owned by the ServiceAccount it binds instead (a binding is of no use
//! without its account, whose deletion ends its runners' tokens anyway): the garbage
//! collector deletes it with the account, however the account went, even when a pass
//! still in flight creates the binding just after a sweep removed the account.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::ServiceAccount;
use k8s_openapi::api::rbac::v1::{PolicyRule, Role, RoleBinding, RoleRef, Subject};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::ObjectMeta;

use crate::api::labels::Identity;
use crate::api::names;

/// `app.kubernetes.io/managed-by` on the runner RBAC.
pub const MANAGED_BY_LABEL: &str = "app.kubernetes.io/managed-by";
pub const MANAGED_BY_VALUE: &str = "captf";

fn meta(namespace: &str) -> ObjectMeta {
    ObjectMeta {
        name: Some(names::RUNNER_NAME.to_string()),
        namespace: Some(namespace.to_string()),
        labels: Some(BTreeMap::from([(
            MANAGED_BY_LABEL.to_string(),
            MANAGED_BY_VALUE.to_string(),
        )])),
        ..Default::default()
    }
}

/// The ServiceAccount the runner Pods run as.
pub fn runner_service_account(namespace: &str) -> ServiceAccount {
    ServiceAccount {
        metadata: meta(namespace),
        ..Default::default()
    }
}

fn rule(group: &str, resource: &str, verbs: &[&str]) -> PolicyRule {
    PolicyRule {
        api_groups: Some(vec![group.to_string()]),
        resources: Some(vec![resource.to_string()]),
        verbs: verbs.iter().map(|v| v.to_string()).collect(),
        ..Default::default()
    }
}

/// The Role: Secrets and Leases in this namespace, as the backend uses them.
pub fn runner_role(namespace: &str) -> Role {
    Role {
        metadata: meta(namespace),
        rules: Some(vec![
            rule(
                "",
                "secrets",
                &["get", "list", "create", "update", "delete"],
            ),
            rule(
                "coordination.k8s.io",
                "leases",
                &["get", "create", "update", "delete"],
            ),
        ]),
    }
}

/// Binds the Role to the ServiceAccount, whose uid is `account_uid`.
pub fn runner_role_binding(namespace: &str, account_uid: &str) -> RoleBinding {
    binding(meta(namespace), names::RUNNER_NAME, account_uid)
}

/// A RoleBinding of the namespace's runner Role to ServiceAccount `account` (uid
/// `account_uid`), owned by that account.
fn binding(mut meta: ObjectMeta, account: &str, account_uid: &str) -> RoleBinding {
    let namespace = meta.namespace.clone();
    meta.owner_references = Some(vec![OwnerReference {
        api_version: "v1".to_string(),
        kind: "ServiceAccount".to_string(),
        name: account.to_string(),
        uid: account_uid.to_string(),
        ..Default::default()
    }]);
    RoleBinding {
        metadata: meta,
        role_ref: RoleRef {
            api_group: "rbac.authorization.k8s.io".to_string(),
            kind: "Role".to_string(),
            name: names::RUNNER_NAME.to_string(),
        },
        subjects: Some(vec![Subject {
            kind: "ServiceAccount".to_string(),
            name: account.to_string(),
            namespace,
            api_group: None,
        }]),
    }
}

/// The metadata of the runner ServiceAccount of an object's own and of its RoleBinding:
/// `captf-runner-<suffix>`, labelled as CAPTF's runner RBAC and with the object's owner
/// labels (so that a sweep finds what an object gone left), never its move label (each
/// management cluster makes its own).
fn object_meta(object: &Identity<'_>) -> ObjectMeta {
    let mut labels = object.owner_labels();
    labels.insert(MANAGED_BY_LABEL.to_string(), MANAGED_BY_VALUE.to_string());
    ObjectMeta {
        name: Some(names::object_runner_name(&object.suffix())),
        namespace: Some(object.namespace.to_string()),
        labels: Some(labels),
        ..Default::default()
    }
}

/// The runner ServiceAccount of `object`'s own, with `annotations` (its workload
/// identity).
pub fn object_runner_account(
    object: &Identity<'_>,
    annotations: &BTreeMap<String, String>,
) -> ServiceAccount {
    let mut meta = object_meta(object);
    meta.annotations = Some(annotations.clone());
    ServiceAccount {
        metadata: meta,
        ..Default::default()
    }
}

/// The RoleBinding of the namespace's runner Role to `object`'s own runner ServiceAccount,
/// whose uid is `account_uid`.
pub fn object_runner_binding(object: &Identity<'_>, account_uid: &str) -> RoleBinding {
    let meta = object_meta(object);
    let account = meta.name.clone().unwrap_or_default();
    binding(meta, &account, account_uid)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A binding's owners: (kind, name, uid), none a controller or blocking its owner's
    /// deletion (which would need rights on the account the manager does not ask for).
    fn owners(rb: &RoleBinding) -> Vec<(&str, &str, &str)> {
        rb.metadata
            .owner_references
            .iter()
            .flatten()
            .inspect(|o| assert!(o.controller.is_none() && o.block_owner_deletion.is_none()))
            .map(|o| (o.kind.as_str(), o.name.as_str(), o.uid.as_str()))
            .collect()
    }

    #[test]
    fn the_runner_rbac_grants_only_what_the_backend_needs() {
        let role = runner_role("ns");
        let rules = role.rules.unwrap();
        assert_eq!(rules.len(), 2);
        assert_eq!(rules[0].api_groups, Some(vec!["".to_string()]));
        assert_eq!(rules[0].resources, Some(vec!["secrets".to_string()]));
        assert_eq!(
            rules[0].verbs,
            ["get", "list", "create", "update", "delete"]
        );
        assert_eq!(
            rules[1].api_groups,
            Some(vec!["coordination.k8s.io".to_string()])
        );
        assert_eq!(rules[1].resources, Some(vec!["leases".to_string()]));
        assert_eq!(rules[1].verbs, ["get", "create", "update", "delete"]);
        assert!(
            rules
                .iter()
                .all(|r| r.resource_names.is_none() && r.non_resource_urls.is_none())
        );
        let sa = runner_service_account("ns");
        let rb = runner_role_binding("ns", "uid-sa");
        assert_eq!(
            owners(&rb),
            [("ServiceAccount", names::RUNNER_NAME, "uid-sa")]
        );
        for m in [&role.metadata, &sa.metadata, &rb.metadata] {
            assert_eq!(m.name.as_deref(), Some(names::RUNNER_NAME));
            assert_eq!(m.namespace.as_deref(), Some("ns"));
            assert_eq!(
                m.labels.as_ref().unwrap()[MANAGED_BY_LABEL],
                MANAGED_BY_VALUE
            );
        }
        assert!(role.metadata.owner_references.is_none() && sa.metadata.owner_references.is_none());
        assert_eq!(rb.role_ref.name, names::RUNNER_NAME);
        let subject = &rb.subjects.unwrap()[0];
        assert_eq!(
            (subject.kind.as_str(), subject.name.as_str()),
            ("ServiceAccount", names::RUNNER_NAME)
        );
        assert_eq!(subject.namespace.as_deref(), Some("ns"));
    }

    /// An object's own runner account: named for it, with the spec's annotations, its
    /// owner labels and CAPTF's, never the move label; its binding gives it the runner Role
    /// and nothing else; which account a Job runs as follows the spec.
    #[test]
    fn an_objects_own_runner_account_carries_its_identity_and_the_runner_role_only() {
        let object = Identity {
            kind: crate::api::names::Kind::TerraformMachine,
            namespace: "team-a",
            name: "web-1",
            uid: "uid-1",
        };
        let annotations = BTreeMap::from([(
            "eks.amazonaws.com/role-arn".to_string(),
            "arn:aws:iam::111122223333:role/team-a".to_string(),
        )]);
        let sa = object_runner_account(&object, &annotations);
        assert_eq!(sa.metadata.name.as_deref(), Some("captf-runner-web-1.tfm"));
        assert_eq!(sa.metadata.namespace.as_deref(), Some("team-a"));
        assert_eq!(sa.metadata.annotations.as_ref(), Some(&annotations));
        let labels = sa.metadata.labels.clone().unwrap();
        assert_eq!(labels[MANAGED_BY_LABEL], MANAGED_BY_VALUE);
        assert_eq!(labels[names::LABEL_OWNER_UID], "uid-1");
        assert!(!labels.contains_key(names::CLUSTERCTL_MOVE_LABEL));
        assert!(sa.metadata.owner_references.is_none());
        let rb = object_runner_binding(&object, "uid-sa");
        assert_eq!(rb.metadata.name, sa.metadata.name);
        assert_eq!(
            owners(&rb),
            [("ServiceAccount", "captf-runner-web-1.tfm", "uid-sa")]
        );
        assert_eq!(rb.role_ref.kind, "Role");
        assert_eq!(rb.role_ref.name, names::RUNNER_NAME);
        let subjects = rb.subjects.unwrap();
        assert_eq!(subjects.len(), 1);
        assert_eq!(
            (
                subjects[0].kind.as_str(),
                subjects[0].name.as_str(),
                subjects[0].namespace.as_deref()
            ),
            ("ServiceAccount", "captf-runner-web-1.tfm", Some("team-a"))
        );
        assert_eq!(
            super::super::runner_account_name(false, "web-1.tfm"),
            names::RUNNER_NAME
        );
        assert_eq!(
            super::super::runner_account_name(true, "web-1.tfm"),
            "captf-runner-web-1.tfm"
        );
    }
}
