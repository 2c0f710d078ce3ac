//! The runner's RBAC in one namespace: what Terraform's kubernetes backend needs (Secrets:
//! get, list, create, update, delete; Leases: get, create, update, delete), nothing
//! cluster-wide. No ownerReferences: with foreground deletion the garbage collector would
//! delete the RoleBinding a running destroy writes its state with.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::ServiceAccount;
use k8s_openapi::api::rbac::v1::{PolicyRule, Role, RoleBinding, RoleRef, Subject};
use kube::api::ObjectMeta;

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

/// Binds the Role to the ServiceAccount.
pub fn runner_role_binding(namespace: &str) -> RoleBinding {
    RoleBinding {
        metadata: meta(namespace),
        role_ref: RoleRef {
            api_group: "rbac.authorization.k8s.io".to_string(),
            kind: "Role".to_string(),
            name: names::RUNNER_NAME.to_string(),
        },
        subjects: Some(vec![Subject {
            kind: "ServiceAccount".to_string(),
            name: names::RUNNER_NAME.to_string(),
            namespace: Some(namespace.to_string()),
            api_group: None,
        }]),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
        let rb = runner_role_binding("ns");
        for m in [&role.metadata, &sa.metadata, &rb.metadata] {
            assert_eq!(m.name.as_deref(), Some(names::RUNNER_NAME));
            assert_eq!(m.namespace.as_deref(), Some("ns"));
            assert!(m.owner_references.is_none());
            assert_eq!(
                m.labels.as_ref().unwrap()[MANAGED_BY_LABEL],
                MANAGED_BY_VALUE
            );
        }
        assert_eq!(rb.role_ref.name, names::RUNNER_NAME);
        let subject = &rb.subjects.unwrap()[0];
        assert_eq!(
            (subject.kind.as_str(), subject.name.as_str()),
            ("ServiceAccount", names::RUNNER_NAME)
        );
        assert_eq!(subject.namespace.as_deref(), Some("ns"));
    }
}
