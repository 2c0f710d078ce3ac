//! `captf explain -f`: what a pass over an object would observe, built from the files'
//! inventory, and the apply table's decision from the same observation and decision as
//! the manager's pass, with the files as their source.

use super::*;

/// What a pass over `object` would observe, from the inventory: the manager's
/// observation ([`gather::source::observe_object`]) with the files as its source, the
/// state always read.
pub fn observe(dump: &gather::source::Dump<'_>, object: &AnyObject) -> Observed {
    let subject = gather::source::Subject {
        kind: object.kind(),
        meta: object.meta().clone(),
        spec: object.terraform().clone(),
        control_plane_endpoint: object.control_plane_endpoint().cloned(),
    };
    // A dump's reads are in memory: the future is ready at its first poll.
    let observed = futures::executor::block_on(async {
        let (mut o, read) = gather::source::observe_object(dump, subject, |_| true).await?;
        if let Some(read) = read {
            read.apply(&mut o, dump.now);
        }
        Ok::<_, std::convert::Infallible>(o)
    });
    match observed {
        Ok(o) => o,
        Err(never) => match never {},
    }
}

/// The inventory as the source of a pass's observation, at `now`.
pub fn dump(inv: &Inventory, now: Timestamp) -> gather::source::Dump<'_> {
    gather::source::Dump {
        now,
        secrets: &inv.secrets,
        config_maps: &inv.config_maps,
        leases: &inv.leases,
        jobs: &inv.jobs,
        pods: &inv.pods,
        crds: &inv.crds,
        namespaces: &inv.namespaces,
        clusters: &inv.clusters,
        machines: &inv.machines,
        machines_of_clusters: inv
            .objects
            .iter()
            .map(|(_, o)| o)
            .filter(|o| o.kind() != Kind::TerraformCluster)
            .filter_map(|o| {
                let m = o.meta();
                let cluster = m.labels.as_ref()?.get(names::CAPI_CLUSTER_NAME_LABEL)?;
                Some((
                    m.namespace.clone().unwrap_or_default(),
                    cluster.clone(),
                    format!("{}/{}", o.kind(), m.name.clone().unwrap_or_default()),
                ))
            })
            .collect(),
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
