//! `captf orphans`: what CAPTF wrote for objects that are gone: the state, inputs, backup
//! and errored-state Secrets and the abandon's copies; and what a gone object left behind
//! that no state explains any more (`gather::leftovers`: finished Jobs, their Pods, the
//! attempts' variables Secrets, the lock Lease of a state that went), which the manager's
//! sweep deletes.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, ListParams, ObjectMeta};
use kube::{Client, ResourceExt};
use serde::Serialize;

use super::ToolError;
use crate::api::labels::{self, labelled_owner};
use crate::api::names::{self, Kind, SecretRole};

/// Something of CAPTF's whose object is gone.
#[derive(Clone, Debug, Serialize, PartialEq, Eq, PartialOrd, Ord)]
#[serde(rename_all = "camelCase")]
pub struct Orphan {
    /// The object's namespace (for an abandoned copy, the namespace it came from).
    pub namespace: String,
    /// `Secret`, `Job`, `Pod` or `Lease`.
    pub resource: String,
    /// Its name.
    pub object: String,
    /// Its name, for a Secret (as before `resource` and `object`).
    #[serde(skip_serializing_if = "String::is_empty")]
    pub secret: String,
    /// The Secret's own namespace, when it is not the object's (an abandoned copy in the
    /// manager's namespace).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub secret_namespace: Option<String>,
    /// `state`, `state-part`, `inputs`, `backup`, `backup-part`, `errored`,
    /// `errored-part`, `abandoned-copy` or `abandoned-copy-part`; for what a gone object
    /// left behind, `job`, `pod`, `variables` (an attempt's variables Secret) or `lock`.
    pub role: String,
    pub kind: String,
    /// The owner-name label: the object's name, cut and hashed when longer than 63.
    pub name: String,
    /// The owner's uid, when the Secret carries it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub uid: Option<String>,
    pub abandoned_at: Option<String>,
}

/// The objects there are, as a Secret's owner is looked for: by uid, and by namespace,
/// kind and owner-name label value (a Secret of an earlier object of that name, which a
/// new one may adopt).
#[derive(Debug, Default)]
pub struct Owners {
    uids: BTreeSet<String>,
    namesakes: BTreeSet<(String, Kind, String)>,
}

impl Owners {
    /// Notes object `meta` of kind `kind`.
    pub fn note(&mut self, meta: &ObjectMeta, kind: Kind) {
        if let Some(uid) = &meta.uid {
            self.uids.insert(uid.clone());
        }
        self.namesakes.insert((
            meta.namespace.clone().unwrap_or_default(),
            kind,
            crate::api::labels::name_label_value(meta.name.as_deref().unwrap_or_default()),
        ));
    }

    /// Secret `meta` as an orphan: a Secret CAPTF writes for an object (state, inputs,
    /// backup, errored state, an abandon's copy) whose object is not among those noted.
    pub fn orphan(&self, meta: &ObjectMeta) -> Option<Orphan> {
        let (role, kind, name) = owner_of_secret(meta)?;
        let label = |key: &str| meta.labels.as_ref().and_then(|l| l.get(key)).cloned();
        let uid = label(names::LABEL_OWNER_UID);
        let secret_ns = meta.namespace.clone().unwrap_or_default();
        let object_ns = label(names::LABEL_SOURCE_NAMESPACE).unwrap_or_else(|| secret_ns.clone());
        let owned = uid.as_ref().is_some_and(|u| self.uids.contains(u))
            || self
                .namesakes
                .contains(&(object_ns.clone(), kind, name.clone()));
        if owned {
            return None;
        }
        let secret = meta.name.clone().unwrap_or_default();
        Some(Orphan {
            secret_namespace: (secret_ns != object_ns).then_some(secret_ns),
            namespace: object_ns,
            resource: "Secret".into(),
            object: secret.clone(),
            secret,
            role,
            kind: kind.as_str().to_string(),
            name,
            uid,
            abandoned_at: meta
                .annotations
                .as_ref()
                .and_then(|a| a.get(names::ABANDONED_AT))
                .cloned(),
        })
    }
}

/// `captf orphans`: every Secret CAPTF writes for an object (state and parts, inputs,
/// backup and parts, errored states, and the copies an abandon made in the manager's
/// namespace) whose object is gone. An object is found by the owner uid the Secret
/// carries, or, for a Secret of an earlier object of the same namespace, kind and name
/// (which the new one may adopt), by those.
pub async fn orphans(
    client: &Client,
    ns: Option<&str>,
    manager_ns: &str,
) -> Result<Vec<Orphan>, ToolError> {
    let mut owners = Owners::default();
    for kind in Kind::ALL {
        let metas = crate::with_kind!(kind, K => {
            let api: Api<K> = match ns {
                Some(n) => Api::namespaced(client.clone(), n),
                None => Api::all(client.clone()),
            };
            let list = api.list_metadata(&ListParams::default()).await?.items;
            list.into_iter().map(|o| o.metadata).collect::<Vec<_>>()
        });
        for meta in metas {
            owners.note(&meta, kind);
        }
    }

    let secrets: Api<Secret> = match ns {
        Some(n) => Api::namespaced(client.clone(), n),
        None => Api::all(client.clone()),
    };
    let mut candidates: BTreeMap<String, ObjectMeta> = BTreeMap::new();
    let mut add = |items: Vec<kube::core::PartialObjectMeta<Secret>>| {
        for s in items {
            let key = format!("{}/{}", s.namespace().unwrap_or_default(), s.name_any());
            candidates.insert(key, s.metadata);
        }
    };
    for selector in [
        labels::any_state_selector(),
        labels::any_owner_selector().to_string(),
    ] {
        add(secrets
            .list_metadata(&ListParams::default().labels(&selector))
            .await?
            .items);
    }
    // The copies an abandon made in the manager's namespace, of this namespace's objects.
    // (Listing every namespace finds them already.)
    if let Some(n) = ns.filter(|n| *n != manager_ns) {
        let selector = labels::abandoned_from_selector(n);
        add(Api::<Secret>::namespaced(client.clone(), manager_ns)
            .list_metadata(&ListParams::default().labels(&selector))
            .await?
            .items);
    }
    let mut out: Vec<Orphan> = candidates
        .values()
        .filter_map(|meta| owners.orphan(meta))
        .collect();
    out.extend(left_behind(client, ns).await?);
    out.sort();
    Ok(out)
}

/// What gone objects left behind (see `gather::leftovers`), in `ns` or everywhere.
async fn left_behind(client: &Client, ns: Option<&str>) -> Result<Vec<Orphan>, ToolError> {
    use crate::gather::leftovers::{Present, is_variables_secret};
    use k8s_openapi::api::batch::v1::Job;
    use k8s_openapi::api::coordination::v1::Lease;
    use k8s_openapi::api::core::v1::Pod;
    fn api<K>(client: &Client, ns: Option<&str>) -> Api<K>
    where
        K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>,
    {
        match ns {
            Some(n) => Api::namespaced(client.clone(), n),
            None => Api::all(client.clone()),
        }
    }
    let ours = ListParams::default().labels(labels::any_owner_selector());
    let jobs = api::<Job>(client, ns).list(&ours).await?.items;
    let pods = api::<Pod>(client, ns).list(&ours).await?.items;
    let secrets = api::<Secret>(client, ns).list_metadata(&ours).await?.items;
    let states = api::<Secret>(client, ns)
        .list_metadata(&ListParams::default().labels(names::TF_LABEL_STATE))
        .await?
        .items;
    let leases = api::<Lease>(client, ns)
        .list_metadata(&ListParams::default())
        .await?
        .items;
    let mut present: BTreeMap<String, Present> = BTreeMap::new();
    for kind in Kind::ALL {
        let metas = crate::with_kind!(kind, K => {
            api::<K>(client, ns)
                .list_metadata(&ListParams::default())
                .await?
                .items
                .into_iter()
                .map(|o| o.metadata)
                .collect::<Vec<_>>()
        });
        for m in metas {
            present
                .entry(m.namespace.clone().unwrap_or_default())
                .or_default()
                .object(kind, m.name.as_deref().unwrap_or_default());
        }
    }
    for s in &states {
        present
            .entry(s.metadata.namespace.clone().unwrap_or_default())
            .or_default()
            .secret(&s.metadata);
    }
    let at = |m: &ObjectMeta| present.get(m.namespace.as_deref().unwrap_or_default());
    let none = Present::default();
    let mut out = Vec::new();
    let mut push = |m: &ObjectMeta, resource: &str, role: &str| {
        let owner = labelled_owner(m.labels.as_ref());
        out.push(Orphan {
            namespace: m.namespace.clone().unwrap_or_default(),
            resource: resource.into(),
            object: m.name.clone().unwrap_or_default(),
            secret: if resource == "Secret" {
                m.name.clone().unwrap_or_default()
            } else {
                String::new()
            },
            secret_namespace: None,
            role: role.into(),
            kind: owner
                .map(|o| o.kind.as_str().to_string())
                .unwrap_or_default(),
            name: owner.map(|o| o.name_label.to_string()).unwrap_or_default(),
            uid: owner.and_then(|o| o.uid.map(str::to_string)),
            abandoned_at: None,
        });
    };
    for j in &jobs {
        let finished = !matches!(
            crate::job::outcome(j, &pods),
            crate::job::JobOutcome::Unfinished { .. }
        );
        if at(&j.metadata)
            .unwrap_or(&none)
            .left_over(&j.metadata, finished)
        {
            push(&j.metadata, "Job", "job");
        }
    }
    for p in &pods {
        let finished = crate::job::pod_terminated(p);
        if at(&p.metadata)
            .unwrap_or(&none)
            .left_over(&p.metadata, finished)
        {
            push(&p.metadata, "Pod", "pod");
        }
    }
    for s in &secrets {
        if is_variables_secret(&s.metadata)
            && at(&s.metadata)
                .unwrap_or(&none)
                .left_over(&s.metadata, true)
        {
            push(&s.metadata, "Secret", "variables");
        }
    }
    for l in &leases {
        let name = l.metadata.name.as_deref().unwrap_or_default();
        if at(&l.metadata).unwrap_or(&none).lease_left_over(name) {
            let (kind, object) = name
                .strip_prefix(&format!("lock-tfstate-{}-", names::TF_WORKSPACE))
                .and_then(names::parse_state_suffix)
                .map(|(k, n)| (k.as_str().to_string(), n.to_string()))
                .unwrap_or_default();
            out.push(Orphan {
                namespace: l.metadata.namespace.clone().unwrap_or_default(),
                resource: "Lease".into(),
                object: name.to_string(),
                secret: String::new(),
                secret_namespace: None,
                role: "lock".into(),
                kind,
                name: object,
                uid: None,
                abandoned_at: None,
            });
        }
    }
    Ok(out)
}

/// Which object a Secret belongs to (kind and owner-name label value), and its role, from
/// its labels and name.
fn owner_of_secret(meta: &ObjectMeta) -> Option<(String, Kind, String)> {
    let empty = BTreeMap::new();
    let labels = meta.labels.as_ref().unwrap_or(&empty);
    let name = meta.name.as_deref().unwrap_or_default();
    let parsed = names::parse_secret_name(name)?;
    let part = parsed.part.is_some();
    let role = match parsed.role {
        SecretRole::Inputs => "inputs",
        SecretRole::State if part => "state-part",
        SecretRole::State => "state",
        SecretRole::Backup if part => "backup-part",
        SecretRole::Backup => "backup",
        SecretRole::Errored if part => "errored-part",
        SecretRole::Errored => "errored",
        SecretRole::AbandonedState | SecretRole::AbandonedBackup if part => "abandoned-copy-part",
        SecretRole::AbandonedState | SecretRole::AbandonedBackup | SecretRole::AbandonedInputs => {
            "abandoned-copy"
        }
    };
    if let Some(owner) = labelled_owner(Some(labels)) {
        return Some((role.to_string(), owner.kind, owner.name_label.to_string()));
    }
    let (kind, name) = names::parse_state_suffix(labels.get(names::TF_LABEL_SUFFIX)?)?;
    Some((role.to_string(), kind, name.to_string()))
}
