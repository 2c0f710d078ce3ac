//! The test control: a test makes the Pods it chooses fail the way a real node makes
//! them fail, by annotating the Node:
//!
//! ```text
//! faults.kubelet.captf.test/<rule>: {"namespace": "team-a", "labels": {"k": "v"},
//!                                   "fault": "OOMKilled", "afterSeconds": 2}
//! ```
//!
//! A rule applies to every Pod of `namespace` (any namespace when absent) that carries
//! all of `labels`. Faults:
//! - `ImagePullFailure`: the container never starts (`ErrImagePull`, then
//!   `ImagePullBackOff`) while the rule exists;
//! - `OOMKilled`: once the container has run `afterSeconds`, every process of it gets
//!   SIGKILL, and it is reported terminated with reason `OOMKilled`, exit code 137;
//! - `Evicted`: as the kubelet's node-pressure eviction: the containers are killed, the
//!   Pod is `Failed` with reason `Evicted` and a `DisruptionTarget` condition;
//! - `LostNode`: the node is gone for this Pod: its processes die, and nothing about it
//!   is written again, so once deleted it stays terminating until it is force-deleted.
//!
//! (A Pod refused by admission needs no kubelet: the tests create a
//! ValidatingAdmissionPolicy, which the real API server enforces.)

use std::collections::BTreeMap;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::runtime::watcher;
use kube::{Api, Client, ResourceExt};
use serde::Deserialize;

use crate::say;

/// The prefix of the annotation keys that hold rules.
pub const ANNOTATION_PREFIX: &str = "faults.kubelet.captf.test/";

#[derive(Clone, Copy, Debug, Deserialize, PartialEq, Eq)]
pub enum Fault {
    ImagePullFailure,
    #[serde(rename = "OOMKilled")]
    OomKilled,
    Evicted,
    LostNode,
}

#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Rule {
    #[serde(skip)]
    pub name: String,
    #[serde(default)]
    pub namespace: Option<String>,
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    pub fault: Fault,
    #[serde(default)]
    pub after_seconds: f64,
}

impl Rule {
    pub fn matches(&self, pod: &Pod) -> bool {
        if self
            .namespace
            .as_deref()
            .is_some_and(|ns| pod.metadata.namespace.as_deref() != Some(ns))
        {
            return false;
        }
        let labels = pod.labels();
        self.labels.iter().all(|(k, v)| labels.get(k) == Some(v))
    }
}

/// The rules of a Node's annotations; a rule that does not parse is reported and left out.
pub fn rules_of(annotations: &BTreeMap<String, String>) -> Vec<Rule> {
    let mut rules = Vec::new();
    for (key, value) in annotations {
        let Some(name) = key.strip_prefix(ANNOTATION_PREFIX) else {
            continue;
        };
        match serde_json::from_str::<Rule>(value) {
            Ok(mut r) => {
                r.name = name.to_string();
                rules.push(r);
            }
            Err(e) => say!("fault rule {key} is not valid, ignored: {e}"),
        }
    }
    rules
}

/// The first rule that applies to `pod`, if any.
pub fn for_pod<'a>(rules: &'a [Rule], pod: &Pod) -> Option<&'a Rule> {
    rules.iter().find(|r| r.matches(pod))
}

/// Watches the Node's annotations and publishes the rules.
pub async fn watch(client: Client, node: String, tx: tokio::sync::watch::Sender<Vec<Rule>>) {
    let api: Api<Node> = Api::all(client);
    let cfg = watcher::Config::default().fields(&format!("metadata.name={node}"));
    let mut stream = watcher(api, cfg).boxed();
    while let Some(ev) = stream.next().await {
        match ev {
            Ok(watcher::Event::Apply(n) | watcher::Event::InitApply(n)) => {
                let rules = rules_of(n.annotations());
                tx.send_if_modified(|old| {
                    if *old == rules {
                        return false;
                    }
                    *old = rules;
                    true
                });
            }
            Ok(_) => {}
            Err(e) => {
                say!("watching Node {node}: {e}");
                tokio::time::sleep(std::time::Duration::from_secs(1)).await;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(ns: &str, labels: &[(&str, &str)]) -> Pod {
        let mut p = Pod::default();
        p.metadata.namespace = Some(ns.into());
        p.metadata.labels = Some(
            labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        );
        p
    }

    #[test]
    fn rules_parse_from_annotations_and_match_by_namespace_and_labels() {
        let ann: BTreeMap<String, String> = [
            (
                "faults.kubelet.captf.test/oom".to_string(),
                r#"{"namespace":"a","labels":{"x":"1"},"fault":"OOMKilled","afterSeconds":2}"#
                    .to_string(),
            ),
            (
                "faults.kubelet.captf.test/bad".to_string(),
                r#"{"fault":"Sneeze"}"#.to_string(),
            ),
            ("other".to_string(), "{}".to_string()),
        ]
        .into();
        let rules = rules_of(&ann);
        assert_eq!(rules.len(), 1, "{rules:?}");
        let r = &rules[0];
        assert_eq!(
            (r.name.as_str(), r.fault, r.after_seconds),
            ("oom", Fault::OomKilled, 2.0)
        );
        assert!(r.matches(&pod("a", &[("x", "1"), ("y", "2")])));
        assert!(!r.matches(&pod("b", &[("x", "1")])));
        assert!(!r.matches(&pod("a", &[("x", "2")])));
        assert!(!r.matches(&pod("a", &[])));
    }
}
