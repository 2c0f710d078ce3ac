//! Guarded writes: JSON patches that carry a `test` of the resourceVersion (and of the
//! value they remove), so that a write made from a stale view fails with 409/422 and the
//! pass is retried on fresh facts. Every delete tolerates "already gone".

use json_patch::jsonptr::PointerBuf;
use json_patch::{
    AddOperation, Patch as JsonPatch, PatchOperation, RemoveOperation, TestOperation,
};
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use kube::core::ObjectMeta;
use kube::{Resource, ResourceExt};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

use super::Error;

/// The field manager of every write.
pub const MANAGER: &str = "captf";

fn pointer(parts: &[&str]) -> PointerBuf {
    PointerBuf::from_tokens(parts.iter().copied())
}

fn test_rv(meta: &ObjectMeta) -> PatchOperation {
    PatchOperation::Test(TestOperation {
        path: pointer(&["metadata", "resourceVersion"]),
        value: json!(meta.resource_version.clone().unwrap_or_default()),
    })
}

/// Annotation edits: `Some(v)` sets, `None` removes.
pub fn annotation_ops(meta: &ObjectMeta, edits: &[(&str, Option<String>)]) -> Vec<PatchOperation> {
    let current = meta.annotations.clone().unwrap_or_default();
    let mut ops = Vec::new();
    let mut map_exists = meta.annotations.is_some();
    for (key, value) in edits {
        match value {
            Some(v) if current.get(*key) == Some(v) => {}
            Some(v) => {
                if !map_exists {
                    ops.push(PatchOperation::Add(AddOperation {
                        path: pointer(&["metadata", "annotations"]),
                        value: json!({}),
                    }));
                    map_exists = true;
                }
                ops.push(PatchOperation::Add(AddOperation {
                    path: pointer(&["metadata", "annotations", key]),
                    value: json!(v),
                }));
            }
            None if current.contains_key(*key) => {
                ops.push(PatchOperation::Remove(RemoveOperation {
                    path: pointer(&["metadata", "annotations", key]),
                }));
            }
            None => {}
        }
    }
    ops
}

/// Adds a finalizer if absent.
pub fn add_finalizer_ops(meta: &ObjectMeta, finalizer: &str) -> Vec<PatchOperation> {
    match &meta.finalizers {
        Some(f) if f.iter().any(|x| x == finalizer) => vec![],
        Some(_) => vec![PatchOperation::Add(AddOperation {
            path: pointer(&["metadata", "finalizers", "-"]),
            value: json!(finalizer),
        })],
        None => vec![PatchOperation::Add(AddOperation {
            path: pointer(&["metadata", "finalizers"]),
            value: json!([finalizer]),
        })],
    }
}

/// Removes a finalizer if present, testing its position first.
pub fn remove_finalizer_ops(meta: &ObjectMeta, finalizer: &str) -> Vec<PatchOperation> {
    let Some(index) = meta
        .finalizers
        .iter()
        .flatten()
        .position(|x| x == finalizer)
    else {
        return vec![];
    };
    let idx = index.to_string();
    vec![
        PatchOperation::Test(TestOperation {
            path: pointer(&["metadata", "finalizers", &idx]),
            value: json!(finalizer),
        }),
        PatchOperation::Remove(RemoveOperation {
            path: pointer(&["metadata", "finalizers", &idx]),
        }),
    ]
}

/// Applies `ops` (if any) with a resourceVersion test. Returns the updated object, or
/// `None` when there was nothing to write.
pub async fn guarded_patch<K>(
    api: &Api<K>,
    obj_meta: &ObjectMeta,
    ops: Vec<PatchOperation>,
) -> Result<Option<K>, Error>
where
    K: Resource + Clone + DeserializeOwned + Serialize + std::fmt::Debug,
{
    if ops.is_empty() {
        return Ok(None);
    }
    let name = obj_meta.name.clone().unwrap_or_default();
    let mut all = vec![test_rv(obj_meta)];
    all.extend(ops);
    let patch: Patch<()> = Patch::Json(JsonPatch(all));
    match api.patch(&name, &PatchParams::default(), &patch).await {
        Ok(out) => Ok(Some(out)),
        Err(kube::Error::Api(s)) if patch_did_not_apply(&s) => Err(Error::Stale(format!(
            "{}/{name}",
            obj_meta.namespace.as_deref().unwrap_or_default()
        ))),
        Err(e) => Err(e.into()),
    }
}

/// Whether the API server refused a JSON patch because it does not apply to the object
/// as stored (a `test` that failed, a path that is gone): kube-apiserver answers 422 with
/// a fixed message and details that name no object (`NewGenericServerResponse` in
/// apimachinery's `api/errors`), whereas an object the patch made invalid is a 422 whose
/// details name the object and its invalid fields. The message carries nothing to match.
pub fn patch_did_not_apply(s: &kube::core::Status) -> bool {
    s.code == 422
        && s.details
            .as_ref()
            .is_none_or(|d| d.name.is_empty() && d.kind.is_empty() && d.causes.is_empty())
}

/// [`guarded_patch`] of `obj`; when the resourceVersion test fails and the object as it is
/// now differs from `obj` in its status only (a status written by an earlier pass that the
/// cache has not caught up with), once more on the object as it is now: the patch still
/// acts on nothing the pass did not observe. `ops` must depend on the metadata only.
pub async fn guarded_patch_past_status<K>(
    api: &Api<K>,
    obj: &K,
    ops: impl Fn(&ObjectMeta) -> Vec<PatchOperation>,
) -> Result<Option<K>, Error>
where
    K: Resource + Clone + DeserializeOwned + Serialize + std::fmt::Debug,
{
    let conflict = match guarded_patch(api, obj.meta(), ops(obj.meta())).await {
        Err(e) if e.is_conflict() => e,
        done => return done,
    };
    match api
        .get_opt(&obj.meta().name.clone().unwrap_or_default())
        .await?
    {
        Some(now) if only_status_changed(obj, &now) => {
            guarded_patch(api, now.meta(), ops(now.meta())).await
        }
        _ => Err(conflict),
    }
}

/// Deletes with background propagation; "already gone" is success.
pub async fn delete_if_present<K>(api: &Api<K>, name: &str) -> Result<bool, Error>
where
    K: Resource + Clone + DeserializeOwned + std::fmt::Debug,
{
    match api.delete(name, &DeleteParams::background()).await {
        Ok(_) => Ok(true),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(false),
        Err(e) => Err(e.into()),
    }
}

/// Deletes `meta`'s object only as it was read: with its uid and resourceVersion as
/// preconditions, so that an object changed since (a lock Terraform took again) stays.
/// "Already gone" is success; a changed object is [`Error::Stale`].
pub async fn delete_as_read<K>(api: &Api<K>, meta: &ObjectMeta) -> Result<bool, Error>
where
    K: Resource + Clone + DeserializeOwned + std::fmt::Debug,
{
    let name = meta.name.clone().unwrap_or_default();
    let params = DeleteParams {
        preconditions: Some(kube::api::Preconditions {
            uid: meta.uid.clone(),
            resource_version: meta.resource_version.clone(),
        }),
        ..DeleteParams::background()
    };
    match api.delete(&name, &params).await {
        Ok(_) => Ok(true),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(false),
        Err(kube::Error::Api(s)) if s.code == 409 => Err(Error::Stale(format!(
            "{}/{name} changed since it was read",
            meta.namespace.as_deref().unwrap_or_default()
        ))),
        Err(e) => Err(e.into()),
    }
}

/// Creates an object; an existing one of that name is left as it is.
pub async fn create_if_absent<K>(api: &Api<K>, obj: &K) -> Result<bool, Error>
where
    K: Resource + Clone + DeserializeOwned + Serialize + std::fmt::Debug,
{
    Ok(create_unless_present(api, obj).await?.is_some())
}

/// [`create_if_absent`], returning the object created (`None`: one of that name exists).
pub async fn create_unless_present<K>(api: &Api<K>, obj: &K) -> Result<Option<K>, Error>
where
    K: Resource + Clone + DeserializeOwned + Serialize + std::fmt::Debug,
{
    match api
        .create(
            &kube::api::PostParams {
                field_manager: Some(MANAGER.into()),
                ..Default::default()
            },
            obj,
        )
        .await
    {
        Ok(created) => Ok(Some(created)),
        Err(kube::Error::Api(s)) if s.code == 409 && s.reason == "AlreadyExists" => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// Creates an object, or replaces the one of that name (its resourceVersion taken from a
/// fresh read, so the replace fails rather than overwrite a change made in between).
pub async fn create_or_replace<K>(api: &Api<K>, obj: &K) -> Result<(), Error>
where
    K: Resource + Clone + DeserializeOwned + Serialize + std::fmt::Debug,
{
    if create_if_absent(api, obj).await? {
        return Ok(());
    }
    let name = obj.meta().name.clone().unwrap_or_default();
    let Some(current) = api.get_metadata_opt(&name).await? else {
        return Err(Error::Stale(format!(
            "{name} went while it was being replaced"
        )));
    };
    let mut replacement = obj.clone();
    replacement.meta_mut().resource_version = current.metadata.resource_version;
    api.replace(
        &name,
        &kube::api::PostParams {
            field_manager: Some(MANAGER.into()),
            ..Default::default()
        },
        &replacement,
    )
    .await?;
    Ok(())
}

/// A merge patch of the status subresource; returns the object as written.
pub async fn patch_status<K>(api: &Api<K>, name: &str, status: Value) -> Result<K, Error>
where
    K: Resource + Clone + DeserializeOwned + std::fmt::Debug,
{
    Ok(api
        .patch_status(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({ "status": status })),
        )
        .await?)
}

/// Whether `after` is `before` with only its status and resourceVersion changed (as after
/// our own status write): then a guarded write may test `after`'s resourceVersion without
/// acting on anything the pass did not observe.
pub fn only_status_changed<K: Serialize>(before: &K, after: &K) -> bool {
    let strip = |o: &K| -> Option<Value> {
        let mut v = serde_json::to_value(o).ok()?;
        let map = v.as_object_mut()?;
        map.remove("status");
        if let Some(meta) = map.get_mut("metadata").and_then(Value::as_object_mut) {
            meta.remove("resourceVersion");
            meta.remove("managedFields");
        }
        Some(v)
    };
    matches!((strip(before), strip(after)), (Some(a), Some(b)) if a == b)
}

/// Name of an object for messages.
pub fn display<K: ResourceExt>(obj: &K) -> String {
    format!("{}/{}", obj.namespace().unwrap_or_default(), obj.name_any())
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::Secret;

    fn secret(rv: &str, annotation: &str, phase: Option<&str>) -> Secret {
        let mut s: Secret = serde_json::from_value(json!({
            "metadata": {"name": "s", "resourceVersion": rv, "annotations": {"a": annotation}},
            "data": {}
        }))
        .expect("secret");
        // Secrets have no status; stand in with a type change only where asked.
        if let Some(p) = phase {
            s.type_ = Some(p.into());
        }
        s
    }

    /// The bodies kube-apiserver sends: a JSON patch whose `test` failed, and an object made
    /// invalid by a patch (whose message happens to contain "test").
    #[test]
    fn a_patch_that_did_not_apply_is_told_from_an_invalid_object_by_its_details() {
        let status =
            |body: Value| -> kube::core::Status { serde_json::from_value(body).expect("status") };
        let not_applied = status(json!({"kind": "Status", "apiVersion": "v1", "metadata": {},
            "status": "Failure", "reason": "Invalid", "details": {}, "code": 422,
            "message": "the server rejected our request due to an error in our request"}));
        assert!(patch_did_not_apply(&not_applied));
        let invalid = status(json!({"kind": "Status", "apiVersion": "v1", "metadata": {},
            "status": "Failure", "reason": "Invalid", "code": 422,
            "message": "TerraformMachine.infrastructure.cluster.x-k8s.io \"test-1\" is invalid: metadata.annotations: Too long: may not be more than 262144 bytes",
            "details": {"name": "test-1", "group": "infrastructure.cluster.x-k8s.io", "kind": "TerraformMachine",
                "causes": [{"reason": "FieldValueTooLong", "message": "Too long", "field": "metadata.annotations"}]}}));
        assert!(!patch_did_not_apply(&invalid));
        let conflict = status(
            json!({"kind": "Status", "status": "Failure", "reason": "Conflict", "code": 409,
            "message": "Operation cannot be fulfilled", "details": {}}),
        );
        assert!(!patch_did_not_apply(&conflict));
        assert!(!Error::Kube(kube::Error::Api(Box::new(invalid))).is_conflict());
        assert!(Error::Kube(kube::Error::Api(Box::new(conflict))).is_conflict());
    }

    #[test]
    fn only_status_changed_ignores_the_resource_version_only() {
        assert!(only_status_changed(
            &secret("1", "x", None),
            &secret("2", "x", None)
        ));
        assert!(!only_status_changed(
            &secret("1", "x", None),
            &secret("2", "y", None)
        ));
        assert!(!only_status_changed(
            &secret("1", "x", None),
            &secret("2", "x", Some("Opaque"))
        ));
    }
}
