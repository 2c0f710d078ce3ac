//! What triggers a pass of which object: the watch mappers from a Job, Pod, Secret or
//! Cluster to the objects it concerns, found in the controller's cache of its kind.

use std::sync::Arc;

use k8s_openapi::api::batch::v1::Job;
use kube::api::Api;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Client, Resource, ResourceExt};

use crate::api::TerraformObject;
use crate::api::labels::labelled_owner;
use crate::api::names;
use crate::gather;

/// The API of `T` in the watched namespace, or in all.
pub(super) fn scoped<T>(client: &Client, ns: &Option<String>) -> Api<T>
where
    T: Resource<DynamicType = ()> + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
    T: Resource<Scope = k8s_openapi::NamespaceResourceScope>,
{
    match ns {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    }
}

/// The object a Job, Pod or Secret belongs to, from its owner labels. The name label of
/// a name longer than a label value is cut and hashed, so the uid label is looked up in the
/// store first.
pub(super) fn owner_of<K: TerraformObject>(
    store: &Store<K>,
    meta: &kube::api::ObjectMeta,
) -> Option<ObjectRef<K>> {
    if let Some(obj) = cached_owner(store, meta) {
        return Some(ObjectRef::from_obj(obj.as_ref()));
    }
    let owner = labelled_owner(meta.labels.as_ref()).filter(|o| o.kind == K::KIND)?;
    Some(ObjectRef::new(owner.name_label).within(meta.namespace.as_deref().unwrap_or_default()))
}

/// The cached object of kind `K` whose uid the owner labels of `meta` carry.
pub(super) fn cached_owner<K: TerraformObject>(
    store: &Store<K>,
    meta: &kube::api::ObjectMeta,
) -> Option<Arc<K>> {
    let owner = labelled_owner(meta.labels.as_ref()).filter(|o| o.kind == K::KIND)?;
    let uid = owner.uid?;
    let has_uid = |o: &K| o.meta().uid.as_deref() == Some(uid);
    // By name (the name label is the name up to 63 characters), else by a scan.
    let ns = meta.namespace.as_deref().unwrap_or_default();
    store
        .get(&ObjectRef::new(owner.name_label).within(ns))
        .filter(|o| has_uid(o))
        .or_else(|| store.find(|o| has_uid(o)))
}

/// The object a state Secret belongs to, from Terraform's suffix label.
pub(super) fn state_owner<K: TerraformObject>(
    store: &Store<K>,
    meta: &kube::api::ObjectMeta,
) -> Option<ObjectRef<K>> {
    if let Some(r) = owner_of::<K>(store, meta) {
        return Some(r);
    }
    let suffix = meta.labels.as_ref()?.get(names::TF_LABEL_SUFFIX)?;
    let (_, name) = names::parse_state_suffix(suffix).filter(|(k, _)| *k == K::KIND)?;
    Some(ObjectRef::new(name).within(meta.namespace.as_deref().unwrap_or_default()))
}

/// The cached objects of kind `K` that Cluster `ns/cluster` owns.
pub(super) fn objects_of_cluster<K: TerraformObject>(
    store: &Store<K>,
    ns: &str,
    cluster: &str,
) -> Vec<ObjectRef<K>> {
    store
        .state_filter(|o| {
            o.namespace().as_deref() == Some(ns)
                && gather::owning_cluster(o.meta()).as_deref() == Some(cluster)
        })
        .iter()
        .map(|o| ObjectRef::from_obj(o.as_ref()))
        .collect()
}

/// Whether a Job has finished (its `Complete` or `Failed` condition is true).
pub(super) fn job_finished(job: &Job) -> bool {
    job.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| {
            cs.iter()
                .any(|c| (c.type_ == "Complete" || c.type_ == "Failed") && c.status == "True")
        })
}

/// Where a Machine (`spec`) or a MachinePool (`spec.template.spec`) names its
/// infrastructure object.
fn infrastructure_ref<K: TerraformObject>(owner: &serde_json::Value) -> &serde_json::Value {
    match K::KIND {
        names::Kind::TerraformMachinePool => {
            &owner["spec"]["template"]["spec"]["infrastructureRef"]
        }
        _ => &owner["spec"]["infrastructureRef"],
    }
}

/// The object of kind `K` a Machine or MachinePool names as its infrastructure.
pub(super) fn infrastructure_of<K: TerraformObject>(
    owner: &kube::api::DynamicObject,
) -> Option<ObjectRef<K>> {
    let r = infrastructure_ref::<K>(&owner.data);
    let group = r["apiGroup"].as_str().unwrap_or_default();
    (r["kind"] == K::KIND.as_str() && group == names::GROUP)
        .then(|| r["name"].as_str())
        .flatten()
        .map(|name| ObjectRef::new(name).within(owner.namespace().as_deref().unwrap_or_default()))
}

/// The objects of kind `K` whose Machine or MachinePool (in `owners`, the cache) names the
/// Secret `meta` as its bootstrap data.
pub(super) fn objects_of_bootstrap<K: TerraformObject>(
    owners: &Store<kube::api::DynamicObject>,
    meta: &kube::api::ObjectMeta,
) -> Vec<ObjectRef<K>> {
    let (ns, name) = (meta.namespace.as_deref(), meta.name.as_deref());
    owners
        .state_filter(|o| {
            o.namespace().as_deref() == ns
                && gather::apply::bootstrap_secret_name(K::KIND, &o.data) == name
        })
        .iter()
        .filter_map(|o| infrastructure_of::<K>(o))
        .collect()
}
