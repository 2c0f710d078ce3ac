//! The identity kind: credentials a platform team keeps in the manager's namespace and lets
//! the objects of some namespaces use, as Cluster API's infrastructure providers do
//! (`AWSClusterStaticIdentity`, `AzureClusterIdentity`): cluster-scoped, naming a Secret
//! and the namespaces allowed to use it.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The credentials a TerraformCluster's runners get as environment variables: each key of
/// the Secret `secretRef` (in the manager's namespace) is a variable, its value the
/// variable's. Only the objects of the namespaces `allowedNamespaces` lets in may use it.
#[derive(CustomResource, Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[kube(
    group = "infrastructure.cluster.x-k8s.io",
    version = "v1alpha1",
    kind = "TerraformClusterIdentity",
    shortname = "tfci",
    category = "cluster-api",
    label("cluster.x-k8s.io/v1beta2", "v1alpha1"),
    label("clusterctl.cluster.x-k8s.io", ""),
    label("clusterctl.cluster.x-k8s.io/move-hierarchy", ""),
    doc = "Credentials for the runners of the TerraformClusters (and their machines and pools) that refer to it, for the namespaces it allows: a Secret in the manager's namespace, or the cloud's workload identity (ServiceAccount annotations), or both.",
    printcolumn(name = "Secret", type_ = "string", json_path = ".spec.secretRef"),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct TerraformClusterIdentitySpec {
    /// The name of a Secret in the manager's namespace: each key an environment variable
    /// of the runner (`AWS_ACCESS_KEY_ID`, `ARM_CLIENT_SECRET`, a `TF_VAR_` of a variable
    /// the module does not get otherwise). CAPTF makes the identity the Secret's owner, so
    /// that `clusterctl move` carries it with the identity (and deleting the identity
    /// deletes it). Optional with `serviceAccount`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret_ref: Option<String>,
    /// The cloud's workload identity instead of (or beside) a static key: each object
    /// that uses this identity runs its runners as a ServiceAccount of its own,
    /// `captf-runner-<name>.<tfc|tfm|tfmp>`, with these annotations (EKS IRSA's
    /// `eks.amazonaws.com/role-arn`, GKE's `iam.gke.io/gcp-service-account`, Azure's
    /// `azure.workload.identity/client-id`), set by the platform team for the namespaces
    /// it allows. An object whose own `spec.runner.serviceAccount` is set cannot use it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service_account: Option<crate::api::types::RunnerServiceAccount>,
    /// The namespaces whose objects may use it: those listed, and those the selector
    /// matches. Empty (`{}`): every namespace. Absent: none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allowed_namespaces: Option<AllowedNamespaces>,
}

/// Which namespaces may use an identity (Cluster API's providers' convention).
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct AllowedNamespaces {
    /// Namespaces by name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub list: Option<Vec<String>>,
    /// Namespaces by their labels.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selector: Option<LabelSelector>,
}

/// A reference to a [`TerraformClusterIdentity`], on a TerraformCluster (its machines and
/// pools use their cluster's unless they name one).
#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema, PartialEq, Eq)]
pub struct IdentityRef {
    /// `TerraformClusterIdentity`.
    pub kind: String,
    pub name: String,
}

/// The kind an [`IdentityRef`] may name.
pub const IDENTITY_KIND: &str = "TerraformClusterIdentity";

/// Whether `name` can name an object (a DNS subdomain, RFC 1123: lowercase letters,
/// digits, `-` and `.`, starting and ending with a letter or digit, 253 at most): a name
/// read from an inputs Secret is untrusted, and goes into a request's path.
pub fn is_object_name(name: &str) -> bool {
    let b = name.as_bytes();
    let edge = |c: &u8| c.is_ascii_lowercase() || c.is_ascii_digit();
    !b.is_empty()
        && b.len() <= 253
        && b.first().is_some_and(edge)
        && b.last().is_some_and(edge)
        && b.iter().all(|c| edge(c) || *c == b'-' || *c == b'.')
}

/// How a refusal of the identity is told apart from the API server's among the refusals
/// the manager remembers: the text the conditions show after it differs.
const REFUSAL_MARK: &str = "identity: ";

/// A refusal of the identity an attempt runs with, `why`, as the manager remembers it.
pub fn refusal(why: &str) -> String {
    format!("{REFUSAL_MARK}{why}")
}

/// Why the identity cannot be used, when the remembered refusal `refused` is one.
pub fn refused_identity(refused: &str) -> Option<&str> {
    refused.strip_prefix(REFUSAL_MARK)
}

impl AllowedNamespaces {
    /// Whether a namespace of name `namespace` and labels `labels` may use the identity:
    /// named by the list, or matched by the selector; every namespace when neither is
    /// given. `labels` is None when they were not read (the selector then matches
    /// nothing).
    pub fn allows(&self, namespace: &str, labels: Option<&BTreeMap<String, String>>) -> bool {
        if self.list.is_none() && self.selector.is_none() {
            return true;
        }
        if self
            .list
            .as_ref()
            .is_some_and(|l| l.iter().any(|n| n == namespace))
        {
            return true;
        }
        match (&self.selector, labels) {
            (Some(s), Some(labels)) => selector_matches(s, labels),
            _ => false,
        }
    }
}

/// Whether `labels` match a label selector (`matchLabels` and every `matchExpressions`
/// entry; an operator it does not know matches nothing). An empty selector matches all.
pub fn selector_matches(s: &LabelSelector, labels: &BTreeMap<String, String>) -> bool {
    let by_labels = s
        .match_labels
        .iter()
        .flatten()
        .all(|(k, v)| labels.get(k) == Some(v));
    let by_expressions = s.match_expressions.iter().flatten().all(|e| {
        let values = e.values.as_deref().unwrap_or_default();
        let have = labels.get(&e.key);
        match e.operator.as_str() {
            "In" => have.is_some_and(|v| values.contains(v)),
            "NotIn" => have.is_none_or(|v| !values.contains(v)),
            "Exists" => have.is_some(),
            "DoesNotExist" => have.is_none(),
            _ => false,
        }
    });
    by_labels && by_expressions
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelectorRequirement;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn only_an_object_name_is_taken_for_an_identitys_or_secrets_name() {
        for ok in ["team-a", "a", "team.a-1", &"a".repeat(253)] {
            assert!(is_object_name(ok), "{ok}");
        }
        for bad in [
            "",
            "Team-A",
            "-a",
            "a-",
            "a/b",
            "../secrets/x",
            "a b",
            &"a".repeat(254),
        ] {
            assert!(!is_object_name(bad), "{bad}");
        }
    }

    #[test]
    fn an_identity_allows_the_namespaces_listed_or_selected_and_every_one_when_empty() {
        let empty = AllowedNamespaces::default();
        assert!(empty.allows("anything", None));
        let listed = AllowedNamespaces {
            list: Some(vec!["team-a".into()]),
            selector: None,
        };
        assert!(listed.allows("team-a", None));
        assert!(!listed.allows("team-b", Some(&labels(&[("team", "a")]))));
        let selected = AllowedNamespaces {
            list: Some(vec![]),
            selector: Some(LabelSelector {
                match_labels: Some(labels(&[("team", "a")])),
                match_expressions: Some(vec![LabelSelectorRequirement {
                    key: "tier".into(),
                    operator: "NotIn".into(),
                    values: Some(vec!["sandbox".into()]),
                }]),
            }),
        };
        assert!(selected.allows("x", Some(&labels(&[("team", "a")]))));
        assert!(!selected.allows("x", Some(&labels(&[("team", "a"), ("tier", "sandbox")]))));
        assert!(!selected.allows("x", Some(&labels(&[("team", "b")]))));
        assert!(
            !selected.allows("x", None),
            "labels not read match no selector"
        );
        let unknown = LabelSelector {
            match_labels: None,
            match_expressions: Some(vec![LabelSelectorRequirement {
                key: "team".into(),
                operator: "Near".into(),
                values: None,
            }]),
        };
        assert!(!selector_matches(&unknown, &labels(&[("team", "a")])));
    }
}
