//! The workload cleanup's pre-terminate hook on a Cluster's Machines: which Machines are
//! the Cluster's (the cache of their metadata), and putting the hook on or taking it off
//! as [`crate::rules::workload::hook_wanted`] says.

use std::sync::Arc;

use kube::ResourceExt;
use kube::api::{Api, DynamicObject, Patch, PatchParams};
use kube::core::PartialObjectMeta;
use serde_json::json;
use tracing::warn;

use super::Shared;
use crate::api::names;
use crate::io::Error;

/// The Machines of Cluster `ns/cluster` in the cache.
pub(super) fn machines_of(
    shared: &Shared,
    ns: &str,
    cluster: &str,
) -> Vec<Arc<PartialObjectMeta<DynamicObject>>> {
    shared.machines.state_filter(|m| {
        m.namespace().as_deref() == Some(ns)
            && m.labels()
                .get(names::CAPI_CLUSTER_NAME_LABEL)
                .map(String::as_str)
                == Some(cluster)
    })
}

/// Whether a Machine of the Cluster is being deleted and carries the hook.
pub(super) fn hooked_and_deleting(shared: &Shared, ns: &str, cluster: &str) -> bool {
    machines_of(shared, ns, cluster).iter().any(|m| {
        m.metadata.deletion_timestamp.is_some()
            && m.annotations().contains_key(names::WORKLOAD_CLEANUP_HOOK)
    })
}

/// Puts the hook on, or takes it off, each Machine of Cluster `ns/cluster` as `wanted`
/// (given whether the Machine is being deleted) says.
pub(super) async fn set_hooks(
    shared: &Shared,
    ns: &str,
    cluster: &str,
    wanted: impl Fn(bool) -> bool,
) -> Result<(), Error> {
    let api =
        Api::<DynamicObject>::namespaced_with(shared.ctx.client.clone(), ns, &shared.machine_ar);
    let machines = machines_of(shared, ns, cluster);
    let mut failed = None;
    for m in machines {
        let has = m.annotations().contains_key(names::WORKLOAD_CLEANUP_HOOK);
        let want = wanted(m.metadata.deletion_timestamp.is_some());
        if has == want {
            continue;
        }
        let value = want.then_some(names::WORKLOAD_CLEANUP_HOOK_OWNER);
        let patch = json!({"metadata": {"annotations": {names::WORKLOAD_CLEANUP_HOOK: value}}});
        match api
            .patch(
                &m.name_any(),
                &PatchParams::default(),
                &Patch::Merge(&patch),
            )
            .await
        {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            // Every Machine is tried; the first failure is the pass's.
            Err(e) => {
                warn!(machine = %m.name_any(), namespace = %ns, error = %e, "cannot set the workload cleanup's hook");
                failed.get_or_insert(e);
            }
        }
    }
    if let Some(e) = failed {
        return Err(e.into());
    }
    Ok(())
}
