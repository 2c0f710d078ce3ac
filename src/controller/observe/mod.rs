//! What the cluster as a pass's [`Source`](crate::gather::source::Source) reads that takes
//! more than one call: the Secrets read with the state (`secrets.rs`), what is read around
//! the Jobs (`jobs.rs`: Pods stuck on a lost node, the `FailedCreate` Events), the
//! machines and pools of a cluster. What a pass reads, and in which order, is
//! [`crate::gather::source`]'s; from where, `controller/source.rs`.

use std::collections::BTreeMap;

use jiff::Timestamp;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Event as CoreEvent, Node, Pod, Secret};
use kube::ResourceExt;
use kube::api::{Api, ListParams};
use kube::core::ObjectMeta;

use kube::Client;

use super::caches;
use super::{Caches, Error};
use crate::api::labels::namesake_selector;
use crate::api::names::{self, Kind};
use crate::api::{TerraformMachine, TerraformMachinePool, VariablesSourceKind};
use crate::gather::source::StateRead;
use crate::gather::{self, Observed, POD_EXPECTED_WITHIN, StateWanted};
use crate::inputs;
use crate::job::{self, JobOutcome};
use crate::state;
use crate::state::permits::{Lane, StateReads};
use crate::state::secrets as chunked;

mod jobs;
mod secrets;

pub(crate) use jobs::{cached_refusals, job_refusals, podless, stuck_pods};
pub use secrets::{Kept, read_inputs, read_referenced};
pub(crate) use secrets::{lock_of, read_secrets};

/// The base state Secret's metadata as a pass read it: `None` when the pass did not read
/// the state, `Some(None)` when that Secret does not exist.
pub type StateMeta = Option<Option<ObjectMeta>>;

/// [`dependents`] from the TerraformCluster controller's caches of machines and pools.
pub(crate) fn cached_dependents(caches: &Caches, ns: &str, cluster: &str) -> Vec<String> {
    let in_ns = |m: &ObjectMeta| m.namespace.as_deref() == Some(ns);
    let machines = caches
        .machines
        .iter()
        .flat_map(|s| caches.machines_by_cluster.get(s, cluster))
        .filter(|m| in_ns(&m.metadata))
        .map(|m| format!("TerraformMachine/{}", m.name_any()));
    let pools = caches
        .pools
        .iter()
        .flat_map(|s| caches.pools_by_cluster.get(s, cluster))
        .filter(|p| in_ns(&p.metadata))
        .map(|p| format!("TerraformMachinePool/{}", p.name_any()));
    let mut out: Vec<String> = machines.chain(pools).collect();
    out.sort();
    out
}

/// The machines and pools of a cluster, listed live whatever `--watch-filter` says.
pub(crate) async fn dependents(
    client: &Client,
    ns: &str,
    cluster: &str,
) -> Result<Vec<String>, Error> {
    let lp = ListParams::default().labels(&crate::api::labels::cluster_selector(cluster));
    let mut out = Vec::new();
    for m in Api::<TerraformMachine>::namespaced(client.clone(), ns)
        .list(&lp)
        .await?
        .items
    {
        out.push(format!("TerraformMachine/{}", m.name_any()));
    }
    for p in Api::<TerraformMachinePool>::namespaced(client.clone(), ns)
        .list(&lp)
        .await?
        .items
    {
        out.push(format!("TerraformMachinePool/{}", p.name_any()));
    }
    Ok(out)
}
