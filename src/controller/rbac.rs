//! The runner's ServiceAccount, Role and RoleBinding: created in a namespace when its
//! first Job is needed, removed by the periodic sweep once no CAPTF object is left there
//! and no runner of theirs still runs.

use std::time::Duration;

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Pod, ServiceAccount};
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use kube::api::{Api, ListParams, Patch, PatchParams};
use kube::core::PartialObjectMeta;
use kube::runtime::reflector::ObjectRef;
use tracing::{info, warn};

use super::{Context, Error, Scope};
use crate::api::names::RUNNER_NAME;
use crate::api::{TerraformCluster, TerraformMachine, TerraformMachinePool, TerraformObject};
use crate::io::writes::{create_if_absent, create_unless_present, delete_if_present};
use crate::job;

/// The label on the runner RBAC objects.
pub const MANAGED_BY: &str = "app.kubernetes.io/managed-by=captf";

/// Makes sure what the runner Pods of the object of `scope` need exists: the namespace's
/// runner RBAC, and when the attempt runs as a ServiceAccount of the object's own (its
/// spec's `runner.serviceAccount`, or its identity's `serviceAccount`), that
/// ServiceAccount with `own`, the annotations given now, and its RoleBinding to the runner
/// Role. Read at every attempt (only for objects that have one): a change of the
/// annotations reaches the next attempt, a destroy's too, and an account someone deleted
/// is made again.
pub async fn ensure_runner<K: TerraformObject>(
    ctx: &Context,
    scope: &Scope<K>,
    own: Option<&std::collections::BTreeMap<String, String>>,
) -> Result<(), Error> {
    ensure_runner_rbac(ctx, &scope.namespace).await?;
    let Some(own) = own else {
        return Ok(());
    };
    let identity = scope.identity();
    let want = job::object_runner_account(&identity, own);
    let name = want.metadata.name.clone().unwrap_or_default();
    let sas = Api::<ServiceAccount>::namespaced(ctx.client.clone(), &scope.namespace);
    let (account, fresh) = match sas.get_opt(&name).await? {
        None => match create_unless_present(&sas, &want).await? {
            Some(created) => (created, true),
            // Another pass made it since the read.
            None => (sas.get(&name).await?, false),
        },
        Some(have) => {
            let annotations = have.metadata.annotations.clone().unwrap_or_default();
            if &annotations != own {
                // CAPTF's own account: its annotations become the spec's, those it no
                // longer gives removed.
                let mut edits: serde_json::Map<String, serde_json::Value> = annotations
                    .keys()
                    .map(|k| (k.clone(), serde_json::Value::Null))
                    .collect();
                for (k, v) in own {
                    edits.insert(k.clone(), serde_json::Value::String(v.clone()));
                }
                let patch = serde_json::json!({"metadata": {"annotations": edits}});
                sas.patch(&name, &PatchParams::default(), &Patch::Merge(patch))
                    .await?;
            }
            (have, false)
        }
    };
    let uid = account.metadata.uid.unwrap_or_default();
    bind(
        ctx,
        &scope.namespace,
        &job::object_runner_binding(&identity, &uid),
        fresh,
    )
    .await
}

/// Creates the runner RoleBinding `want` (owned by the account it binds) unless one of its
/// name is there. When the account was made just now, one that is there may be owned by
/// the account's predecessor (deleted by hand) and be on its way out with it, or owned by
/// none (made by an earlier version): it is made again, owned by the new account (no
/// runner of an account made just now runs yet).
async fn bind(ctx: &Context, ns: &str, want: &RoleBinding, fresh: bool) -> Result<(), Error> {
    let rbs = Api::<RoleBinding>::namespaced(ctx.client.clone(), ns);
    if create_unless_present(&rbs, want).await?.is_some() || !fresh {
        return Ok(());
    }
    delete_if_present(&rbs, want.metadata.name.as_deref().unwrap_or_default()).await?;
    create_if_absent(&rbs, want).await?;
    Ok(())
}

/// Deletes the runner ServiceAccount of the object of `scope`'s own and its RoleBinding,
/// when it has one (its spec asks for one, or the manager's cache of runner accounts holds
/// it: an identity's `serviceAccount` made it): at its release, once none of its runners
/// runs. One the cache has not seen yet is the sweep's.
pub async fn remove_object_runner<K: TerraformObject>(
    ctx: &Context,
    scope: &Scope<K>,
    obj: &K,
) -> Result<(), Error> {
    let name = crate::api::names::object_runner_name(&scope.suffix);
    let cached = ctx.runner_accounts.get().is_some_and(|store| {
        store
            .get(&ObjectRef::new(&name).within(&scope.namespace))
            .is_some()
    });
    if obj.terraform().runner.service_account.is_none() && !cached {
        return Ok(());
    }
    delete_if_present(
        &Api::<RoleBinding>::namespaced(ctx.client.clone(), &scope.namespace),
        &name,
    )
    .await?;
    delete_if_present(
        &Api::<ServiceAccount>::namespaced(ctx.client.clone(), &scope.namespace),
        &name,
    )
    .await?;
    Ok(())
}

/// Makes sure the runner RBAC exists in `ns` (remembered per namespace).
pub async fn ensure_runner_rbac(ctx: &Context, ns: &str) -> Result<(), Error> {
    let ready = || {
        ctx.rbac_ready
            .lock()
            .map(|s| s.contains(ns))
            .unwrap_or(false)
    };
    let sas = Api::<ServiceAccount>::namespaced(ctx.client.clone(), ns);
    if ready() {
        // Remembered, but someone may have deleted it since: a Job without its
        // ServiceAccount never gets a Pod. The watch of the runner ServiceAccounts says so
        // when there is one.
        // (A cache that lacks it may lag its creation: then it is read.)
        let cached = ctx
            .runner_accounts
            .get()
            .is_some_and(|store| store.get(&ObjectRef::new(RUNNER_NAME).within(ns)).is_some());
        let there = cached || sas.get_metadata_opt(RUNNER_NAME).await?.is_some();
        if there {
            return Ok(());
        }
        if let Ok(mut s) = ctx.rbac_ready.lock() {
            s.remove(ns);
        }
    }
    // One creator at a time: the passes that start many destroys at once would otherwise
    // all create the same three objects.
    let _one = ctx.rbac_creating.lock().await;
    if ready() {
        return Ok(());
    }
    // The account's uid owns its binding: read when the account was there already.
    let (uid, fresh) = match create_unless_present(&sas, &job::runner_service_account(ns)).await? {
        Some(created) => (created.metadata.uid, true),
        None => (sas.get_metadata(RUNNER_NAME).await?.metadata.uid, false),
    };
    create_if_absent(
        &Api::<Role>::namespaced(ctx.client.clone(), ns),
        &job::runner_role(ns),
    )
    .await?;
    bind(
        ctx,
        ns,
        &job::runner_role_binding(ns, &uid.unwrap_or_default()),
        fresh,
    )
    .await?;
    if let Ok(mut s) = ctx.rbac_ready.lock() {
        s.insert(ns.to_string());
    }
    Ok(())
}

/// Whether a Job or Pod CAPTF made in `ns` has not finished: a runner whose object is
/// gone (its finalizer stripped during a destroy) still needs its ServiceAccount and Role
/// to write its state at the end.
async fn runner_unfinished(ctx: &Context, ns: &str) -> Result<bool, Error> {
    let job_running = |j: &Job| !super::triggers::job_finished(j);
    if let Some(all) = ctx.all_caches() {
        let in_ns = |m: &kube::api::ObjectMeta| m.namespace.as_deref() == Some(ns);
        return Ok(all.iter().any(|c| {
            !c.jobs
                .state_filter(|j| in_ns(&j.metadata) && job_running(j))
                .is_empty()
                || !c
                    .pods
                    .state_filter(|p| in_ns(&p.metadata) && !crate::job::pod_terminated(p))
                    .is_empty()
        }));
    }
    let ours = ListParams::default().labels(crate::api::labels::any_owner_selector());
    let jobs = Api::<Job>::namespaced(ctx.client.clone(), ns)
        .list(&ours)
        .await?
        .items;
    if jobs.iter().any(job_running) {
        return Ok(true);
    }
    let pods = Api::<Pod>::namespaced(ctx.client.clone(), ns)
        .list(&ours)
        .await?
        .items;
    Ok(pods.iter().any(|p| !crate::job::pod_terminated(p)))
}

/// Whether any CAPTF object is left in `ns`: from the controllers' caches when they hold
/// every object (no `--watch-filter`), else listed.
async fn objects_left(ctx: &Context, ns: &str) -> Result<bool, Error> {
    if let Some(all) = ctx.all_caches()
        && all.iter().all(|c| c.unfiltered)
    {
        return Ok(all.iter().any(|c| (c.objects_in)(ns) > 0));
    }
    let one = ListParams::default().limit(1);
    let c = Api::<TerraformCluster>::namespaced(ctx.client.clone(), ns)
        .list(&one)
        .await?
        .items
        .len();
    let m = Api::<TerraformMachine>::namespaced(ctx.client.clone(), ns)
        .list(&one)
        .await?
        .items
        .len();
    let p = Api::<TerraformMachinePool>::namespaced(ctx.client.clone(), ns)
        .list(&one)
        .await?
        .items
        .len();
    Ok(c + m + p > 0)
}

/// Removes runner RBAC from namespaces with no CAPTF object left and no runner of theirs
/// still running.
pub async fn sweep(ctx: &Context) -> Result<usize, Error> {
    let sas: Api<PartialObjectMeta<ServiceAccount>> = match &ctx.watch_namespace {
        Some(ns) => Api::namespaced(ctx.client.clone(), ns),
        None => Api::all(ctx.client.clone()),
    };
    let mut removed = 0;
    let accounts: Vec<PartialObjectMeta<ServiceAccount>> = match ctx.runner_accounts.get() {
        Some(store) => store.state().iter().map(|a| a.as_ref().clone()).collect(),
        None => {
            sas.list(&ListParams::default().labels(MANAGED_BY))
                .await?
                .items
        }
    };
    let (shared, own): (Vec<_>, Vec<_>) = accounts
        .into_iter()
        .partition(|a| a.metadata.name.as_deref() == Some(RUNNER_NAME));
    // The objects of each namespace and kind: from the controllers' caches when they hold
    // every object, else listed once per namespace and kind that has such an account.
    let mut objects = ObjectsOf::default();
    if let Some(all) = ctx.all_caches()
        && all.iter().all(|c| c.unfiltered)
    {
        for (kind, c) in crate::api::names::Kind::ALL.iter().zip(&all) {
            (c.members)(&mut |m| objects.note(*kind, m));
        }
        objects.complete = true;
    }
    for sa in own {
        if sweep_object_runner(ctx, &sa, &mut objects).await? {
            removed += 1;
        }
    }
    for sa in shared {
        let Some(ns) = sa.metadata.namespace.clone() else {
            continue;
        };
        if objects_left(ctx, &ns).await? || runner_unfinished(ctx, &ns).await? {
            continue;
        }
        if let Ok(mut s) = ctx.rbac_ready.lock() {
            s.remove(&ns);
        }
        delete_if_present(
            &Api::<RoleBinding>::namespaced(ctx.client.clone(), &ns),
            RUNNER_NAME,
        )
        .await?;
        delete_if_present(
            &Api::<Role>::namespaced(ctx.client.clone(), &ns),
            RUNNER_NAME,
        )
        .await?;
        delete_if_present(
            &Api::<ServiceAccount>::namespaced(ctx.client.clone(), &ns),
            RUNNER_NAME,
        )
        .await?;
        info!(namespace = %ns, "removed the runner RBAC: no CAPTF object is left in the namespace");
        removed += 1;
    }
    Ok(removed)
}

/// The live objects' (name, uid) by namespace and kind, as a sweep found them.
#[derive(Default)]
struct ObjectsOf {
    by: std::collections::BTreeMap<(String, crate::api::names::Kind), Vec<(String, String)>>,
    /// Whether every object is noted (from the caches): a namespace and kind with none
    /// noted has none.
    complete: bool,
}

impl ObjectsOf {
    fn note(&mut self, kind: crate::api::names::Kind, m: &kube::api::ObjectMeta) {
        self.by
            .entry((m.namespace.clone().unwrap_or_default(), kind))
            .or_default()
            .push((
                m.name.clone().unwrap_or_default(),
                m.uid.clone().unwrap_or_default(),
            ));
    }

    async fn of(
        &mut self,
        ctx: &Context,
        ns: &str,
        kind: crate::api::names::Kind,
    ) -> Result<&[(String, String)], Error> {
        let key = (ns.to_string(), kind);
        if !self.complete && !self.by.contains_key(&key) {
            let listed: Vec<kube::api::ObjectMeta> = crate::with_kind!(kind, K => {
                Api::<K>::namespaced(ctx.client.clone(), ns)
                    .list_metadata(&ListParams::default())
                    .await?
                    .items
                    .into_iter()
                    .map(|o| o.metadata)
                    .collect()
            });
            self.by.insert(key.clone(), Vec::new());
            for m in &listed {
                self.note(kind, m);
            }
        }
        Ok(self.by.get(&key).map(Vec::as_slice).unwrap_or_default())
    }
}

/// Removes the runner ServiceAccount of an object's own, and its RoleBinding, when that
/// object is gone (it left without its release: `clusterctl move`, a stripped finalizer)
/// and no runner in its namespace still runs. Whether it is gone: among the objects of its
/// kind (from the account's name) in its namespace ([`ObjectsOf`]), none is its owner by
/// the uid label (or, without one, by the state suffix: a long name's is cut and hashed,
/// so the name alone does not find the object).
async fn sweep_object_runner(
    ctx: &Context,
    sa: &PartialObjectMeta<ServiceAccount>,
    objects: &mut ObjectsOf,
) -> Result<bool, Error> {
    let (Some(ns), Some(name)) = (&sa.metadata.namespace, &sa.metadata.name) else {
        return Ok(false);
    };
    let Some(suffix) = name
        .strip_prefix(RUNNER_NAME)
        .and_then(|s| s.strip_prefix('-'))
    else {
        return Ok(false);
    };
    let Some((kind, _)) = crate::api::names::parse_state_suffix(suffix) else {
        return Ok(false);
    };
    let uid = sa
        .metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(crate::api::names::LABEL_OWNER_UID))
        .cloned();
    let alive = objects
        .of(ctx, ns, kind)
        .await?
        .iter()
        .any(|(name, live_uid)| match &uid {
            Some(uid) => live_uid == uid,
            None => crate::api::names::state_suffix(kind, name) == suffix,
        });
    if alive || runner_unfinished(ctx, ns).await? {
        return Ok(false);
    }
    delete_if_present(
        &Api::<RoleBinding>::namespaced(ctx.client.clone(), ns),
        name,
    )
    .await?;
    delete_if_present(
        &Api::<ServiceAccount>::namespaced(ctx.client.clone(), ns),
        name,
    )
    .await?;
    info!(namespace = %ns, account = %name, "removed the runner ServiceAccount of an object that is gone");
    Ok(true)
}

/// Runs the sweeps every `every`: what gone objects left behind first (their Jobs may be
/// what keeps the runner RBAC), then the runner RBAC.
pub async fn sweep_forever(ctx: std::sync::Arc<Context>, every: Duration) {
    loop {
        tokio::time::sleep(every).await;
        if let Err(e) = super::leftovers::sweep(&ctx).await {
            warn!(error = %e, "the sweep of what gone objects left behind failed; trying again later");
        }
        if let Err(e) = sweep(&ctx).await {
            warn!(error = %e, "RBAC sweep failed; trying again later");
        }
        if let Some(all) = ctx.all_caches() {
            ctx.metrics
                .set_orphaned_secrets(&super::leftovers::orphaned_secrets(&all));
        }
    }
}
