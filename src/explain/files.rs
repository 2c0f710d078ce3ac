//! `captf explain -f`: what a pass over an object would observe, built from the files'
//! inventory, and the apply table's decision from the same observation and decision as
//! the manager's pass, with the files as their source.

use super::*;

/// Builds what a pass over `object` would observe, from the inventory.
pub fn observe(inv: &Inventory, object: &AnyObject, now: Timestamp) -> Observed {
    let kind = object.kind();
    let meta = object.meta().clone();
    let namespace = meta.namespace.clone().unwrap_or_default();
    let name = meta.name.clone().unwrap_or_default();
    let suffix = names::state_suffix(kind, &name);
    let in_ns = |ns: Option<&String>| ns.map(String::as_str) == Some(namespace.as_str());

    let cluster_name = gather::owning_cluster(&meta);
    let cluster = cluster_name.as_ref().and_then(|c| {
        inv.clusters
            .iter()
            .find(|v| {
                v["metadata"]["name"].as_str() == Some(c)
                    && v["metadata"]["namespace"].as_str() == Some(&namespace)
            })
            .map(ClusterView::from_value)
    });
    let crd_deleting = inv.crds.iter().any(|c| {
        c.metadata.name.as_deref() == Some(kind.crd_name().as_str())
            && c.metadata.deletion_timestamp.is_some()
    });
    let namespace_terminating = inv.namespaces.iter().any(|n| {
        n.metadata.name.as_deref() == Some(namespace.as_str())
            && (n.metadata.deletion_timestamp.is_some()
                || n.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Terminating"))
    });
    let jobs = inv
        .jobs
        .iter()
        .filter(|j| {
            in_ns(j.metadata.namespace.as_ref()) && gather::owned_by(kind, &meta, &j.metadata)
        })
        .cloned()
        .collect();
    let pods = inv
        .pods
        .iter()
        .filter(|p| {
            in_ns(p.metadata.namespace.as_ref()) && gather::owned_by(kind, &meta, &p.metadata)
        })
        .cloned()
        .collect();
    let earlier_jobs = inv
        .jobs
        .iter()
        .filter(|j| {
            in_ns(j.metadata.namespace.as_ref())
                && gather::of_earlier_namesake(kind, &meta, &j.metadata)
        })
        .cloned()
        .collect();
    let earlier_pods = inv
        .pods
        .iter()
        .filter(|p| {
            in_ns(p.metadata.namespace.as_ref())
                && gather::of_earlier_namesake(kind, &meta, &p.metadata)
        })
        .cloned()
        .collect();
    let dependents = match (kind, &cluster_name) {
        (Kind::TerraformCluster, Some(c)) => inv
            .objects
            .iter()
            .map(|(_, o)| o)
            .filter(|o| o.kind() != Kind::TerraformCluster && in_ns(o.meta().namespace.as_ref()))
            .filter(|o| {
                o.meta()
                    .labels
                    .as_ref()
                    .and_then(|l| l.get(names::CAPI_CLUSTER_NAME_LABEL))
                    == Some(c)
            })
            .map(|o| format!("{}/{}", o.kind(), o.meta().name.clone().unwrap_or_default()))
            .collect(),
        _ => Vec::new(),
    };
    let secrets: Vec<_> = inv
        .secrets
        .iter()
        .filter(|s| in_ns(s.metadata.namespace.as_ref()))
        .cloned()
        .collect();
    let state = Some(StateSecrets::from_secrets(
        &names::state_secret_name(&suffix),
        &secrets,
    ));
    let errored = crate::state::Errored::find(&suffix, &secrets);
    let inputs_name = names::inputs_secret_name(&suffix);
    let inputs_secret = secrets
        .iter()
        .find(|s| s.metadata.name.as_deref() == Some(inputs_name.as_str()))
        .cloned();
    // The latest apply attempt's variables Secret (named as its Job), as a pass reads it.
    let attempt_secret = meta
        .annotations
        .as_ref()
        .and_then(|a| a.get(names::APPLY_ATTEMPT))
        .and_then(|n| n.trim().parse::<u32>().ok())
        .map(|n| names::job_name(&suffix, names::OPERATION_APPLY, n))
        .and_then(|job| {
            secrets
                .iter()
                .find(|s| s.metadata.name.as_deref() == Some(job.as_str()))
                .cloned()
        });
    let referenced_secrets: BTreeMap<_, _> = secrets
        .iter()
        .map(|s| (s.metadata.name.clone().unwrap_or_default(), s.clone()))
        .collect();
    let referenced_config_maps = inv
        .config_maps
        .iter()
        .filter(|c| in_ns(c.metadata.namespace.as_ref()))
        .map(|c| (c.metadata.name.clone().unwrap_or_default(), c.clone()))
        .collect();
    let lock_name = names::lock_lease_name(&suffix);
    let lock = inv
        .leases
        .iter()
        .find(|l| {
            in_ns(l.metadata.namespace.as_ref())
                && l.metadata.name.as_deref() == Some(lock_name.as_str())
        })
        .cloned();
    // As the controller does: during a deletion, the Cluster API owners the dump does not
    // hold (or holds under another uid) are gone.
    let owners_gone = if meta.deletion_timestamp.is_some() {
        gather::owners_gone(&meta, |kind, name| {
            let pool = if kind == "Cluster" {
                &inv.clusters
            } else {
                &inv.machines
            };
            pool.iter()
                .find(|v| {
                    v["kind"].as_str() == Some(kind)
                        && v["metadata"]["name"].as_str() == Some(name)
                        && v["metadata"]["namespace"].as_str() == Some(&namespace)
                })
                .map(|v| {
                    v["metadata"]["uid"]
                        .as_str()
                        .unwrap_or_default()
                        .to_string()
                })
        })
    } else {
        Vec::new()
    };
    Observed {
        kind,
        meta,
        spec: object.terraform().clone(),
        control_plane_endpoint: object.control_plane_endpoint().cloned(),
        owners_gone,
        // Nodes are not read from dumps: a Pod stuck on a lost node shows as unfinished.
        stuck_pods: BTreeMap::new(),
        cluster,
        cluster_kind_unknown: None,
        job_refusals: Default::default(),
        crd_deleting,
        namespace_terminating,
        jobs,
        pods,
        earlier_jobs,
        earlier_pods,
        dependents,
        state,
        errored,
        state_permit: None,
        inputs_secret,
        attempt_secret,
        referenced_secrets,
        referenced_config_maps,
        lock,
        now,
    }
}

/// The inventory as the source of a live object's apply observation: its Secrets, Cluster
/// API objects, and whether each TerraformCluster in it is provisioned.
pub(super) fn dump(inv: &Inventory) -> gather::source::Dump<'_> {
    gather::source::Dump {
        secrets: &inv.secrets,
        clusters: &inv.clusters,
        machines: &inv.machines,
        terraform_clusters: inv
            .objects
            .iter()
            .filter_map(|(_, o)| match o {
                AnyObject::Cluster(c) => Some((
                    c.metadata.namespace.clone().unwrap_or_default(),
                    c.metadata.name.clone().unwrap_or_default(),
                    gather::apply::object_provisioned(c),
                )),
                _ => None,
            })
            .collect(),
    }
}

/// The apply table's decision for a live object, from what the inventory holds (`dump`):
/// the observation and the decision of the manager's pass
/// ([`gather::source::observe_live`], [`gather::verdict::decide`]), with the files as
/// their source. No Job is rendered (the manager's templates are not in the files).
pub(super) fn decide_live(
    dump: &gather::source::Dump<'_>,
    object: &AnyObject,
    o: &Observed,
    settings: &Settings,
) -> ApplyDecision {
    let latched = object
        .status()
        .and_then(|s| s.initialization.as_ref())
        .and_then(|i| i.provisioned)
        == Some(true);
    let state_seen = gather::apply::apply_state_seen(o, settings);
    // A dump's reads are in memory: the future is ready at its first poll.
    let live = futures::executor::block_on(gather::source::observe_live(
        dump,
        o.clone(),
        state_seen,
        latched,
        settings,
    ));
    let live = match live {
        Ok(l) => l,
        Err(never) => match never {},
    };
    gather::verdict::decide(
        &live.observed,
        &live.sources,
        &live.state_seen,
        settings,
        None,
        |_, _| Ok(()),
    )
    .decision
}
