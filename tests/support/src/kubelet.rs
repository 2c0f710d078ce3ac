//! The local kubelet's faults, as a scenario asks for them (`KubeletFault`, `Refusal`).

use super::*;

/// A fault of the local kubelet's test control (`tests/kubelet/src/faults.rs`).
#[derive(Clone, Copy, Debug)]
pub enum KubeletFault {
    ImagePullFailure,
    OomKilled,
    Evicted,
    LostNode,
}

impl KubeletFault {
    fn as_str(self) -> &'static str {
        match self {
            KubeletFault::ImagePullFailure => "ImagePullFailure",
            KubeletFault::OomKilled => "OOMKilled",
            KubeletFault::Evicted => "Evicted",
            KubeletFault::LostNode => "LostNode",
        }
    }
}

/// The one Node of `captf-envtest`.
pub const ENVTEST_NODE: &str = "captf-local";
const FAULT_ANNOTATION: &str = "faults.kubelet.captf.test/";

/// A ValidatingAdmissionPolicy and its binding that refuse Pods; remove it when done.
pub struct Refusal {
    name: String,
}

impl Refusal {
    pub async fn remove(self, client: &Client) {
        use k8s_openapi::api::admissionregistration::v1::{
            ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding,
        };
        let _ = Api::<ValidatingAdmissionPolicyBinding>::all(client.clone())
            .delete(&self.name, &DeleteParams::default())
            .await;
        let _ = Api::<ValidatingAdmissionPolicy>::all(client.clone())
            .delete(&self.name, &DeleteParams::default())
            .await;
    }
}

impl Env {
    /// Makes the local kubelet fail the Pods of this test's namespace that carry all of
    /// `labels` with `fault`, `after` seconds after their containers start (the rule is an
    /// annotation of the Node, named `rule`; rule names are this test's own). Only on
    /// `captf-envtest`: an outside cluster's kubelets know no such control.
    pub async fn kubelet_fault(
        &self,
        rule: &str,
        labels: &[(&str, &str)],
        fault: KubeletFault,
        after: f64,
    ) {
        assert!(
            !self.is_external(),
            "the kubelet's test control exists on captf-envtest only"
        );
        let labels: BTreeMap<&str, &str> = labels.iter().copied().collect();
        let value = json!({"namespace": self.ns, "labels": labels, "fault": fault.as_str(), "afterSeconds": after});
        let key = format!("{FAULT_ANNOTATION}{}", self.fault_rule_name(rule));
        Api::<k8s_openapi::api::core::v1::Node>::all(self.client.clone())
            .patch(
                ENVTEST_NODE,
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"annotations": {key: value.to_string()}}})),
            )
            .await
            .expect("annotate the Node");
    }

    /// Removes a rule of [`Env::kubelet_fault`].
    pub async fn clear_kubelet_fault(&self, rule: &str) {
        let key = format!("{FAULT_ANNOTATION}{}", self.fault_rule_name(rule));
        Api::<k8s_openapi::api::core::v1::Node>::all(self.client.clone())
            .patch(
                ENVTEST_NODE,
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"annotations": {key: null}}})),
            )
            .await
            .expect("annotate the Node");
    }

    /// Rule names are unique per namespace: tests share the Node.
    fn fault_rule_name(&self, rule: &str) -> String {
        let mut n = format!("{}.{rule}", self.ns);
        n.truncate(63);
        n
    }

    /// Makes the API server refuse the creation of Pods in this test's namespace that carry
    /// all of `labels`, with `message` (a ValidatingAdmissionPolicy, as a policy engine or
    /// a platform team's rule would).
    pub async fn refuse_pods(&self, labels: &[(&str, &str)], message: &str) -> Refusal {
        let probe = json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "admission-probe", "labels": labels.iter().copied().collect::<BTreeMap<_, _>>()},
            "spec": {"containers": [{"name": "c", "image": "busybox"}]}
        });
        self.refuse(("", "v1", "Pod", "pods"), labels, message, probe)
            .await
    }

    /// As [`Env::refuse_pods`], for Jobs.
    pub async fn refuse_jobs(&self, labels: &[(&str, &str)], message: &str) -> Refusal {
        let meta = json!({"name": "admission-probe", "labels": labels.iter().copied().collect::<BTreeMap<_, _>>()});
        let probe = json!({
            "apiVersion": "batch/v1", "kind": "Job", "metadata": meta,
            "spec": {"template": {"metadata": {"labels": meta["labels"]}, "spec": {
                "restartPolicy": "Never", "containers": [{"name": "c", "image": "busybox"}]}}}
        });
        self.refuse(("batch", "v1", "Job", "jobs"), labels, message, probe)
            .await
    }

    async fn refuse(
        &self,
        (group, version, kind, plural): (&str, &str, &str, &str),
        labels: &[(&str, &str)],
        message: &str,
        probe: serde_json::Value,
    ) -> Refusal {
        use k8s_openapi::api::admissionregistration::v1::{
            ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding,
        };
        let mut name = format!("refuse-{plural}-{}", self.ns);
        name.truncate(63);
        let cond = labels
            .iter()
            .map(|(k, v)| {
                format!("(has(object.metadata.labels) && '{k}' in object.metadata.labels && object.metadata.labels['{k}'] == '{v}')")
            })
            .collect::<Vec<_>>()
            .join(" && ");
        let policy: ValidatingAdmissionPolicy = serde_json::from_value(json!({
            "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicy",
            "metadata": {"name": name},
            "spec": {"failurePolicy": "Fail",
                "matchConstraints": {"resourceRules": [{"apiGroups": [group], "apiVersions": [version],
                    "operations": ["CREATE"], "resources": [plural]}]},
                "validations": [{"expression": format!("!({cond})"), "message": message}]}
        }))
        .expect("policy");
        let binding: ValidatingAdmissionPolicyBinding = serde_json::from_value(json!({
            "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicyBinding",
            "metadata": {"name": name},
            "spec": {"policyName": name, "validationActions": ["Deny"],
                "matchResources": {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": self.ns}}}}
        }))
        .expect("binding");
        Api::<ValidatingAdmissionPolicy>::all(self.client.clone())
            .create(&PostParams::default(), &policy)
            .await
            .expect("create the policy");
        Api::<ValidatingAdmissionPolicyBinding>::all(self.client.clone())
            .create(&PostParams::default(), &binding)
            .await
            .expect("create the binding");
        // The API server applies a policy a moment after it is created: wait until an
        // object of the kind it refuses is refused (a dry run creates nothing).
        let gvk = kube::api::GroupVersionKind::gvk(group, version, kind);
        let ar = kube::api::ApiResource::from_gvk_with_plural(&gvk, plural);
        let api: Api<DynamicObject> = Api::namespaced_with(self.client.clone(), &self.ns, &ar);
        let probe: DynamicObject = serde_json::from_value(probe).expect("probe");
        wait_for("the admission policy to apply", long(), || async {
            let pp = PostParams {
                dry_run: true,
                ..Default::default()
            };
            matches!(api.create(&pp, &probe).await, Err(kube::Error::Api(s)) if s.message.contains(message))
        })
        .await;
        Refusal { name }
    }
}
