//! The sweep of what gone objects left behind (see `gather::leftovers`): the finished
//! Jobs, their Pods and the attempts' variables Secrets of an object that left without a
//! cleanup (`clusterctl move`), and the free lock Lease of its state, which moved with it.
//! Run with the RBAC sweep, from the caches; a namespace where the caches show such things
//! is looked at live (its objects, its Leases) before anything there is deleted, and no
//! other is.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Pod, Secret};
use kube::api::{Api, ListParams};
use tracing::info;

use std::sync::Arc;

use super::caches::Caches;
use super::{Context, Error};
use crate::api::names::Kind;
use crate::api::{TerraformCluster, TerraformMachine, TerraformMachinePool};
use crate::gather::leftovers::{Present, is_variables_secret};
use crate::io::writes;
use crate::ops::orphans::Owners;
use crate::state::lock::{self, Lock};

/// What is left over in one namespace, by kind of thing.
#[derive(Default)]
struct Found {
    jobs: BTreeSet<String>,
    pods: BTreeSet<String>,
    secrets: BTreeSet<String>,
}

/// The roles of the Secrets counted by [`orphaned_secrets`] even when none is found, so
/// that a count that was not 0 goes back to 0.
const ORPHAN_ROLES: [&str; 5] = ["state", "inputs", "backup", "errored", "abandoned-copy"];

/// The Secrets CAPTF wrote for objects that are gone (as `captf orphans` finds them), by
/// role, from the caches: the state, inputs, backup and errored-state Secrets the kind's
/// Secrets cache holds, and the state Secrets without owner labels (in every kind's
/// caches alike: counted once). With `--watch-filter` the objects outside the filter are
/// not cached, so their Secrets would look orphaned: nothing is counted then.
pub fn orphaned_secrets(all: &[Arc<Caches>]) -> BTreeMap<String, i64> {
    let mut by_role: BTreeMap<String, i64> =
        ORPHAN_ROLES.iter().map(|r| (r.to_string(), 0)).collect();
    if all.iter().any(|c| !c.unfiltered) {
        return by_role;
    }
    let mut owners = Owners::default();
    for (kind, c) in Kind::ALL.iter().zip(all) {
        (c.members)(&mut |m| owners.note(m, *kind));
    }
    let unlabelled = all.first().map(|c| c.states.state()).unwrap_or_default();
    for s in all.iter().flat_map(|c| c.secrets.state()).chain(unlabelled) {
        if let Some(o) = owners.orphan(&s.metadata) {
            *by_role.entry(o.role).or_default() += 1;
        }
    }
    by_role
}

/// Deletes what gone objects left behind; returns how many things it deleted.
pub async fn sweep(ctx: &Context) -> Result<usize, Error> {
    let Some(all) = ctx.all_caches() else {
        return Ok(0);
    };
    // Candidates from the caches: what carries the owner labels, has finished, and whose
    // object and state the caches do not hold. Only their namespaces are looked at live:
    // a cache that lags only delays a sweep (an object it still holds) or costs a live look
    // that finds the object there (one it does not hold yet, or one outside
    // `--watch-filter`).
    let mut by_ns: BTreeMap<String, Found> = BTreeMap::new();
    let ns_of = |m: &kube::api::ObjectMeta| m.namespace.clone().unwrap_or_default();
    let cached = present_in_caches(&all);
    let none = Present::default();
    let cached_in = |m: &kube::api::ObjectMeta| {
        m.namespace
            .as_deref()
            .and_then(|ns| cached.get(ns))
            .unwrap_or(&none)
    };
    for c in &all {
        for j in c.jobs.state() {
            if cached_in(&j.metadata).left_over(&j.metadata, super::triggers::job_finished(&j)) {
                by_ns.entry(ns_of(&j.metadata)).or_default();
            }
        }
        for s in c.secrets.state() {
            if is_variables_secret(&s.metadata)
                && cached_in(&s.metadata).left_over(&s.metadata, true)
            {
                by_ns.entry(ns_of(&s.metadata)).or_default();
            }
        }
    }
    let mut deleted = 0;
    for (ns, mut found) in by_ns {
        let present = present_in(ctx, &all, &ns).await?;
        for c in &all {
            for j in c.jobs.state() {
                if ns_of(&j.metadata) == ns
                    && present.left_over(&j.metadata, super::triggers::job_finished(&j))
                {
                    found.jobs.extend(j.metadata.name.clone());
                }
            }
            for p in c.pods.state() {
                if ns_of(&p.metadata) == ns
                    && present.left_over(&p.metadata, crate::job::pod_terminated(&p))
                {
                    found.pods.extend(p.metadata.name.clone());
                }
            }
            for s in c.secrets.state() {
                if ns_of(&s.metadata) == ns
                    && is_variables_secret(&s.metadata)
                    && present.left_over(&s.metadata, true)
                {
                    found.secrets.extend(s.metadata.name.clone());
                }
            }
        }
        let (jobs, pods, secrets, leases): (Api<Job>, Api<Pod>, Api<Secret>, Api<Lease>) = (
            Api::namespaced(ctx.client.clone(), &ns),
            Api::namespaced(ctx.client.clone(), &ns),
            Api::namespaced(ctx.client.clone(), &ns),
            Api::namespaced(ctx.client.clone(), &ns),
        );
        for name in &found.jobs {
            deleted += usize::from(writes::delete_if_present(&jobs, name).await?);
        }
        for name in &found.pods {
            deleted += usize::from(writes::delete_if_present(&pods, name).await?);
        }
        for name in &found.secrets {
            deleted += usize::from(writes::delete_if_present(&secrets, name).await?);
        }
        // Terraform's lock of a state that went: deleted only as read, free or held by a
        // Pod that is gone (none of this object's runners is left to hold it).
        for lease in leases.list(&ListParams::default()).await?.items {
            let name = lease.metadata.name.clone().unwrap_or_default();
            if !present.lease_left_over(&name) {
                continue;
            }
            let suffix = name
                .strip_prefix(&format!(
                    "lock-tfstate-{}-",
                    crate::api::names::TF_WORKSPACE
                ))
                .unwrap_or_default();
            match lock::judge(Some(&lease), suffix, &[], jiff::Timestamp::now()) {
                Lock::Free | Lock::StaleOwn { .. } => {
                    deleted += usize::from(writes::delete_as_read(&leases, &lease.metadata).await?);
                }
                Lock::Held { .. } => {}
            }
        }
        let total = found.jobs.len() + found.pods.len() + found.secrets.len();
        if total > 0 {
            info!(
                namespace = %ns,
                jobs = found.jobs.len(),
                pods = found.pods.len(),
                secrets = found.secrets.len(),
                "deleted what objects that are gone (moved away) left behind"
            );
        }
    }
    Ok(deleted)
}

/// The objects and states of every namespace as the caches hold them: the objects of the
/// three kinds' caches (all of them unless `--watch-filter` is set), the states of the
/// caches of Secrets.
fn present_in_caches(all: &[Arc<Caches>]) -> BTreeMap<String, Present> {
    let mut by_ns: BTreeMap<String, Present> = BTreeMap::new();
    for (kind, c) in Kind::ALL.iter().zip(all) {
        (c.members)(&mut |m| {
            by_ns
                .entry(m.namespace.clone().unwrap_or_default())
                .or_default()
                .object(*kind, m.name.as_deref().unwrap_or_default());
        });
    }
    cached_states(all, |m| {
        by_ns
            .entry(m.namespace.clone().unwrap_or_default())
            .or_default()
            .secret(m)
    });
    by_ns
}

/// Hands `note` each state Secret of the caches of Secrets (labelled or not).
fn cached_states(all: &[Arc<Caches>], mut note: impl FnMut(&kube::api::ObjectMeta)) {
    for c in all {
        for s in c.secrets.state().iter().chain(c.states.state().iter()) {
            note(&s.metadata);
        }
    }
}

/// The objects and states of `ns`: the objects listed live (whatever `--watch-filter`
/// says: another manager's object is no leftover), the states from the caches of Secrets.
async fn present_in(
    ctx: &Context,
    all: &[std::sync::Arc<super::Caches>],
    ns: &str,
) -> Result<Present, Error> {
    let mut present = Present::default();
    let lp = ListParams::default();
    for m in Api::<TerraformCluster>::namespaced(ctx.client.clone(), ns)
        .list_metadata(&lp)
        .await?
        .items
    {
        present.object(
            Kind::TerraformCluster,
            m.metadata.name.as_deref().unwrap_or_default(),
        );
    }
    for m in Api::<TerraformMachine>::namespaced(ctx.client.clone(), ns)
        .list_metadata(&lp)
        .await?
        .items
    {
        present.object(
            Kind::TerraformMachine,
            m.metadata.name.as_deref().unwrap_or_default(),
        );
    }
    for m in Api::<TerraformMachinePool>::namespaced(ctx.client.clone(), ns)
        .list_metadata(&lp)
        .await?
        .items
    {
        present.object(
            Kind::TerraformMachinePool,
            m.metadata.name.as_deref().unwrap_or_default(),
        );
    }
    cached_states(all, |m| {
        if m.namespace.as_deref() == Some(ns) {
            present.secret(m);
        }
    });
    Ok(present)
}
