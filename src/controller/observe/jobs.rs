//! What a pass reads around its Jobs: Pods stuck on a lost node, Jobs without a Pod and
//! the `FailedCreate` Events that say why.

use super::*;

/// The Pods still terminating after their grace period (their `deletionTimestamp` has
/// passed and a container has not stopped), with their node and the node's state: a lost
/// node never confirms that a Pod stopped, and its Job waits. Nodes are read only for such
/// Pods.
pub(crate) async fn stuck_pods<'a>(
    client: &Client,
    pods: impl Iterator<Item = &'a Pod>,
    now: Timestamp,
) -> Result<BTreeMap<String, String>, Error> {
    let mut out = BTreeMap::new();
    for p in pods {
        let Some(deleted) = &p.metadata.deletion_timestamp else {
            continue;
        };
        if deleted.0 > now || crate::job::pod_terminated(p) {
            continue;
        }
        let name = p.metadata.name.clone().unwrap_or_default();
        let node = p.spec.as_ref().and_then(|s| s.node_name.clone());
        let text = match node {
            None => "no node (it was never scheduled)".to_string(),
            Some(n) => match Api::<Node>::all(client.clone()).get_opt(&n).await {
                Ok(None) => format!("node {n}, which no longer exists"),
                Ok(Some(node)) => {
                    let ready = node
                        .status
                        .and_then(|s| s.conditions)
                        .unwrap_or_default()
                        .into_iter()
                        .find(|c| c.type_ == "Ready");
                    match ready {
                        Some(c) => format!(
                            "node {n} (Ready={}{}{})",
                            c.status,
                            c.reason.map(|r| format!(" {r}")).unwrap_or_default(),
                            c.last_transition_time
                                .map(|t| format!(" since {}", t.0))
                                .unwrap_or_default()
                        ),
                        None => format!("node {n} (it reports no Ready condition)"),
                    }
                }
                Err(e) => format!("node {n} (its state cannot be read: {e})"),
            },
        };
        out.insert(name, text);
    }
    Ok(out)
}

/// The unfinished Jobs that have no Pod (none made yet, or each refused).
pub fn podless<'a>(jobs: &'a [Job], pods: &'a [Pod]) -> impl Iterator<Item = &'a Job> {
    jobs.iter().filter(|j| {
        matches!(job::outcome(j, pods), JobOutcome::Unfinished { .. })
            && !pods.iter().any(|p| job::pod_of_job(j, p))
    })
}

/// The unfinished Jobs without a Pod for [`POD_EXPECTED_WITHIN`] seconds.
pub(super) fn refused_jobs<'a>(
    jobs: &'a [Job],
    pods: &'a [Pod],
    now: Timestamp,
) -> impl Iterator<Item = &'a Job> {
    podless(jobs, pods).filter(move |j| {
        j.metadata
            .creation_timestamp
            .as_ref()
            .is_none_or(|t| now.as_second() - t.0.as_second() >= POD_EXPECTED_WITHIN)
    })
}

/// The latest message of `events`.
pub(super) fn latest_message(events: impl Iterator<Item = CoreEvent>) -> Option<String> {
    events
        .max_by_key(|e| {
            e.last_timestamp
                .as_ref()
                .map(|t| t.0)
                .or(e.event_time.as_ref().map(|t| t.0))
        })
        .and_then(|e| e.message)
}

/// The latest `FailedCreate` Event message of each unfinished Job that has had no Pod for
/// [`POD_EXPECTED_WITHIN`] seconds (its Pods are refused: admission, a quota, a missing
/// ServiceAccount). Read only for such Jobs, so a pass whose Jobs have Pods, or were just
/// made, reads no Event.
pub(crate) async fn job_refusals(
    client: &Client,
    ns: &str,
    jobs: &[Job],
    pods: &[Pod],
    now: Timestamp,
) -> Result<BTreeMap<String, String>, Error> {
    let mut out = BTreeMap::new();
    for j in refused_jobs(jobs, pods, now) {
        let name = j.metadata.name.clone().unwrap_or_default();
        let lp = ListParams::default().fields(&format!(
            "involvedObject.kind=Job,involvedObject.name={name},reason=FailedCreate"
        ));
        let events = Api::<CoreEvent>::namespaced(client.clone(), ns)
            .list(&lp)
            .await?
            .items;
        if let Some(message) = latest_message(events.into_iter()) {
            out.insert(name, message);
        }
    }
    Ok(out)
}

/// [`job_refusals`] from the cache of `FailedCreate` Events.
pub(crate) fn cached_refusals(
    caches: &Caches,
    ns: &str,
    jobs: &[Job],
    pods: &[Pod],
    now: Timestamp,
) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for j in refused_jobs(jobs, pods, now) {
        let name = j.metadata.name.clone().unwrap_or_default();
        let events = caches.refusals.state_filter(|e| {
            e.involved_object.namespace.as_deref() == Some(ns)
                && e.involved_object.name.as_deref() == Some(name.as_str())
        });
        if let Some(message) = latest_message(events.iter().map(|e| e.as_ref().clone())) {
            out.insert(name, message);
        }
    }
    out
}
