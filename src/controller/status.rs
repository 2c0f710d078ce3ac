//! The object's status: the decision's conditions merged in, written only when they
//! changed.

use std::sync::Arc;

use jiff::Timestamp;
use kube::ResourceExt;
use kube::api::Api;
use serde_json::json;

use super::Error;
use crate::api::TerraformObject;
use crate::api::conditions::{self, Condition, Desired};
use crate::io::writes;
use crate::rules::Decision;

/// [`write_status`], then the object to go on with: the written one when only its status
/// changed (so that the guarded writes after it test the new resourceVersion), else the
/// one read.
pub async fn write_status_keeping<K: TerraformObject>(
    api: &Api<K>,
    obj: Arc<K>,
    decision: &Decision,
) -> Result<Arc<K>, Error> {
    write_status_keeping_with(api, obj, decision, &[]).await
}

/// [`write_status_keeping`] with `extra` conditions beside the decision's (the apply
/// table's on a live object).
pub async fn write_status_keeping_with<K: TerraformObject>(
    api: &Api<K>,
    obj: Arc<K>,
    decision: &Decision,
    extra: &[Desired],
) -> Result<Arc<K>, Error> {
    Ok(
        match write_status_with(api, obj.as_ref(), decision, extra).await? {
            Some(written) if writes::only_status_changed(obj.as_ref(), &written) => {
                Arc::new(written)
            }
            _ => obj,
        },
    )
}

/// Merges the decision's conditions into the status; unchanged status is not rewritten.
/// Returns the object as written, if it was.
pub async fn write_status<K: TerraformObject>(
    api: &Api<K>,
    obj: &K,
    decision: &Decision,
) -> Result<Option<K>, Error> {
    write_status_with(api, obj, decision, &[]).await
}

async fn write_status_with<K: TerraformObject>(
    api: &Api<K>,
    obj: &K,
    decision: &Decision,
    extra: &[Desired],
) -> Result<Option<K>, Error> {
    let existing: Vec<Condition> = obj
        .status()
        .map(|s| s.conditions.clone())
        .unwrap_or_default();
    let generation = obj.meta().generation;
    let merged = conditions::merge(
        &existing,
        &decision
            .conditions()
            .chain(extra.iter())
            .cloned()
            .collect::<Vec<_>>(),
        generation,
        Timestamp::now(),
    );
    let same_generation = obj.status().and_then(|s| s.observed_generation) == generation;
    if !conditions::differ_ignoring_time(&existing, &merged) && same_generation {
        return Ok(None);
    }
    if tracing::enabled!(tracing::Level::DEBUG) {
        let changed: Vec<String> = merged
            .iter()
            .filter(|m| {
                !existing.iter().any(|e| {
                    e.type_ == m.type_
                        && e.status == m.status
                        && e.reason == m.reason
                        && e.message == m.message
                })
            })
            .map(|m| format!("{}={}/{}", m.type_, m.status, m.reason))
            .collect();
        tracing::debug!(changed = %changed.join(" "), same_generation, "writing the status");
    }
    let status = json!({ "conditions": merged, "observedGeneration": generation });
    match writes::patch_status(api, &obj.name_any(), status).await {
        Ok(written) => Ok(Some(written)),
        Err(e) if e.is_not_found() => Ok(None),
        Err(e) => Err(e),
    }
}

/// Latches `status.initialization.provisioned` with the status fields an apply's outputs
/// set (`fields`), merged into the object's status; returns whether it was written.
pub async fn write_provisioned<K: TerraformObject>(
    api: &Api<K>,
    obj: &K,
    mut fields: serde_json::Map<String, serde_json::Value>,
) -> Result<bool, Error> {
    fields.insert(
        "initialization".into(),
        serde_json::json!({ "provisioned": true }),
    );
    match writes::patch_status(api, &obj.name_any(), serde_json::Value::Object(fields)).await {
        Ok(_) => Ok(true),
        Err(e) if e.is_not_found() => Ok(false),
        Err(e) => Err(e),
    }
}
