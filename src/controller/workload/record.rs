//! What the workload cleanup records on the TerraformCluster: its start, failures and end
//! as annotations, the `WorkloadCleanedUp` condition (merged with a resourceVersion
//! guard), the Events and the metrics.

use jiff::Timestamp;
use k8s_openapi::api::core::v1::ObjectReference;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::events::EventType;
use kube::{Resource, ResourceExt};
use serde_json::json;

use super::{CONDITION, Shared, reason};
use crate::api::TerraformCluster;
use crate::api::conditions::{self, Desired, Status};
use crate::api::names;
use crate::controller::events;
use crate::io::Error;
use crate::metrics::labels::{ByOutcome, Reason};

/// An annotation of the TerraformCluster read as a time.
pub(super) fn stamp(tfc: &TerraformCluster, key: &str) -> Option<Timestamp> {
    tfc.annotations()
        .get(key)
        .and_then(|v| v.trim().parse().ok())
}

/// Removes the record of failures, when there is one (a success resets the clock).
pub(super) async fn clear_failing(
    api: &Api<TerraformCluster>,
    tfc: TerraformCluster,
) -> Result<TerraformCluster, Error> {
    if !tfc
        .annotations()
        .contains_key(names::WORKLOAD_CLEANUP_FAILING_SINCE)
    {
        return Ok(tfc);
    }
    annotate(
        api,
        &tfc.name_any(),
        &[(names::WORKLOAD_CLEANUP_FAILING_SINCE, None)],
    )
    .await
}

/// Removes what an earlier object of the same name recorded of its cleanup.
pub(super) async fn forget_earlier(
    api: &Api<TerraformCluster>,
    name: &str,
) -> Result<TerraformCluster, Error> {
    let keys = [
        names::WORKLOAD_CLEANUP_STARTED,
        names::WORKLOAD_CLEANUP_FAILING_SINCE,
        names::WORKLOAD_CLEANUP_FINISHED,
    ];
    annotate(api, name, &keys.map(|k| (k, None))).await
}

/// Sets (or, with `None`, removes) annotations of the TerraformCluster; returns it as
/// written.
pub(super) async fn annotate(
    api: &Api<TerraformCluster>,
    name: &str,
    edits: &[(&str, Option<String>)],
) -> Result<TerraformCluster, Error> {
    let annotations: serde_json::Map<String, serde_json::Value> = edits
        .iter()
        .map(|(k, v)| (k.to_string(), json!(v)))
        .collect();
    let patch = json!({"metadata": {"annotations": annotations}});
    Ok(api
        .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await?)
}

/// Writes the end of a finished cleanup into the condition again when it is not there (the
/// Events and the log keep the details).
pub(super) async fn restore_end(
    api: &Api<TerraformCluster>,
    tfc: &TerraformCluster,
    cluster: &str,
) -> Result<(), Error> {
    let ended = current(tfc).is_some_and(|(r, _)| r == reason::CLEANED_UP || r == reason::GAVE_UP);
    if ended {
        return Ok(());
    }
    let gave_up = tfc
        .annotations()
        .get(names::WORKLOAD_CLEANUP_FINISHED)
        .is_some_and(|v| v == names::WORKLOAD_CLEANUP_GAVE_UP);
    let (status, why, msg) = if gave_up {
        (
            Status::False,
            reason::GAVE_UP,
            format!(
                "gave up cleaning up the workload cluster of Cluster {cluster}: see the Warning Event WorkloadCleanupGaveUp (runbooks/WorkloadClusterUnreachable.md)"
            ),
        )
    } else {
        (
            Status::True,
            reason::CLEANED_UP,
            format!(
                "the workload cluster of Cluster {cluster} is cleaned up: its Machines' infrastructure may go"
            ),
        )
    };
    write_condition(api, tfc, status, why, msg).await
}

/// The condition's reason and message now, if it is there.
pub(super) fn current(tfc: &TerraformCluster) -> Option<(String, String)> {
    tfc.status
        .as_ref()?
        .conditions
        .iter()
        .find(|c| c.type_ == CONDITION)
        .map(|c| (c.reason.clone(), c.message.clone()))
}

/// Merges the condition into the TerraformCluster's status, guarded by the
/// resourceVersion read (the TerraformCluster's own passes write its other conditions);
/// on a conflict it reads the object again and merges again.
pub(super) async fn write_condition(
    api: &Api<TerraformCluster>,
    tfc: &TerraformCluster,
    status: Status,
    why: &'static str,
    message: String,
) -> Result<(), Error> {
    let desired = Desired::new(CONDITION, status, why, message);
    let mut tfc = tfc.clone();
    for _ in 0..3 {
        let existing = tfc
            .status
            .as_ref()
            .map(|s| s.conditions.clone())
            .unwrap_or_default();
        let merged = conditions::merge(
            &existing,
            std::slice::from_ref(&desired),
            tfc.meta().generation,
            Timestamp::now(),
        );
        if !conditions::differ_ignoring_time(&existing, &merged) {
            return Ok(());
        }
        let patch = json!({
            "metadata": {"resourceVersion": tfc.resource_version()},
            "status": {"conditions": merged}
        });
        match api
            .patch_status(
                &tfc.name_any(),
                &PatchParams::default(),
                &Patch::Merge(&patch),
            )
            .await
        {
            Ok(_) => return Ok(()),
            Err(kube::Error::Api(s)) if s.code == 404 => return Ok(()),
            Err(kube::Error::Api(s)) if s.code == 409 => {
                match api.get_opt(&tfc.name_any()).await? {
                    Some(fresh) => tfc = fresh,
                    None => return Ok(()),
                }
            }
            Err(e) => return Err(e.into()),
        }
    }
    Err(Error::Stale(format!("TerraformCluster {}", tfc.name_any())))
}

pub(super) async fn publish(
    shared: &Shared,
    tfc: &TerraformCluster,
    type_: EventType,
    why: &str,
    note: &str,
) {
    let reference: ObjectReference = tfc.object_ref(&());
    events::publish_ref(&shared.ctx, &reference, type_, why, "WorkloadCleanup", note).await;
}

pub(super) fn outcome(shared: &Shared, why: &str) {
    shared.ctx.metrics.workload_cleanups.inc(&ByOutcome {
        outcome: Reason::new(why),
    });
}
