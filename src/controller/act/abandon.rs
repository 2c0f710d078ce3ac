//! The abandon (SPEC section 7): released without a destroy on the operator's word, the
//! state, inputs and backup Secrets kept and marked.
//!
//! Write order: in a terminating namespace, first the copies of every kept Secret into the
//! manager's namespace, each read back and compared, the state's fingerprint read from the
//! copies as from the original ([`copy_out`]); nothing else happens until they are made
//! (the namespace would take the Secrets with it), and the object records that they are
//! (`abandon-copied`, in the marker's write). Then the abandon marker on the object
//! before the first delete; the Jobs, the attempts' variables and a free lock deleted; each
//! kept Secret marked `abandoned-at` in the same write that takes its protection off; the
//! release last.

use jiff::Timestamp;
use k8s_openapi::api::core::v1::Secret;
use kube::api::Api;
use kube::runtime::events::EventType;
use kube::{Resource, ResourceExt};
use tracing::warn;

use super::{delete_jobs, delete_lock_if_free, release};
use crate::api::TerraformObject;
use crate::api::names;
use crate::controller::events::{self, publish, publish_ref};
use crate::controller::{Context, Error, Scope};
use crate::gather::{self, Findings, Observed};
use crate::io::writes::{self, annotation_ops, guarded_patch, remove_finalizer_ops};
use crate::state;
use crate::state::secrets as chunked;

/// SPEC section 7: releases without a destroy, keeping the Secrets.
pub async fn abandon<K: TerraformObject>(
    ctx: &Context,
    scope: &Scope<K>,
    obj: &K,
    o: &Observed,
    findings: &Findings,
) -> Result<(), Error> {
    let (suffix, secrets) = (&scope.suffix, &scope.secrets);
    let described = findings
        .verdict
        .as_ref()
        .map(|v| v.message.clone())
        .unwrap_or_else(|| "the state was not read".into());

    // The namespace may have begun to terminate since this pass looked at it: the kept
    // Secrets would go with it once their protection comes off. It is read again now, and
    // everything is copied out first if it is.
    // (In a namespace already terminating when the pass looked, the pass copied them
    // before this call, unless an earlier pass had: `copied`.)
    let terminating = o.namespace_terminating || namespace_terminating_now(ctx, scope).await?;
    let copied_before = copied(obj.meta());
    if terminating && !o.namespace_terminating && !copied_before {
        warn!(
            "the namespace began to terminate during the abandon's pass: copying the kept Secrets out first"
        );
        copy_out(ctx, scope, o).await?;
    }
    if terminating && !copied_before {
        announce_copies(ctx, scope, &described).await;
    }
    // The marker, and in a terminating namespace the record that the copies are made,
    // before the first delete and before any protection comes off: a pass interrupted
    // after that releases on the copies it verified.
    let mut current = obj.clone();
    let mut edits = Vec::new();
    if gather::deletion_bookkeeping(obj.meta(), names::CLEANUP_STARTED).is_none() {
        edits.push((
            names::CLEANUP_STARTED,
            Some(names::CLEANUP_ABANDONED.to_string()),
        ));
        edits.push((names::CLUSTERCTL_BLOCK_MOVE, Some("true".into())));
    }
    if terminating && !copied_before {
        let copy = names::abandoned_copy_name(&scope.namespace, &scope.suffix);
        edits.push((
            names::ABANDON_COPIED,
            Some(format!("{}/{copy}", ctx.manager_namespace)),
        ));
    }
    if !edits.is_empty() {
        edits.push((names::DELETION_UID, Some(scope.uid.clone())));
        let ops = annotation_ops(obj.meta(), &edits);
        if let Some(updated) = guarded_patch(&scope.api, obj.meta(), ops).await? {
            current = updated;
        }
    }
    delete_jobs(scope, o).await?;
    // The variables of its attempts (each in a Secret named as its Job) are not kept.
    for j in &o.jobs {
        writes::delete_if_present(secrets, &j.name_any()).await?;
    }
    delete_lock_if_free(scope, o).await?;
    let now = Timestamp::now().to_string();
    let mut kept = Vec::new();
    for base in [
        names::state_secret_name(suffix),
        names::inputs_secret_name(suffix),
        names::backup_secret_name(suffix),
    ] {
        kept.extend(chunked::metas(secrets, &base).await?);
    }
    // The errored states are kept and marked as the rest.
    kept.extend(
        super::errored_metas(scope, o)
            .await?
            .into_iter()
            .map(|metadata| kube::core::PartialObjectMeta {
                metadata,
                ..Default::default()
            }),
    );
    {
        for s in kept {
            let mut ops = if s
                .metadata
                .annotations
                .as_ref()
                .is_some_and(|a| a.contains_key(names::ABANDONED_AT))
            {
                vec![]
            } else {
                annotation_ops(&s.metadata, &[(names::ABANDONED_AT, Some(now.clone()))])
            };
            ops.extend(remove_finalizer_ops(&s.metadata, names::PROTECT_FINALIZER));
            match guarded_patch(secrets, &s.metadata, ops).await {
                Ok(_) => {}
                Err(e) if e.is_not_found() => {}
                Err(e) => return Err(e),
            }
        }
    }
    warn!(what = %described, "abandoned: released without a destroy; the state, inputs and backup Secrets are kept");
    if !terminating {
        publish(ctx, obj, EventType::Warning, events::ABANDONED, "Abandon", &format!("released without a destroy; Secrets kept and marked abandoned; the state described: {described}")).await;
    }
    ctx.metrics.decisions.inc(&crate::metrics::ByRow {
        kind: crate::metrics::labels::KindValue(K::KIND),
        row: "abandon".into(),
    });
    release(ctx, scope, &current).await
}

/// Whether an earlier pass of this object's abandon made and verified the copies of its
/// kept Secrets (see [`names::ABANDON_COPIED`]).
pub fn copied(meta: &kube::api::ObjectMeta) -> bool {
    gather::deletion_bookkeeping(meta, names::ABANDON_COPIED).is_some()
}

/// In a terminating namespace the kept Secrets would go with the namespace: before any
/// protection comes off, each of them (the state and its parts, the inputs, the backup
/// and its parts) is copied as it is, Secret for Secret, into the manager's namespace
/// (`captf-abandoned-<namespace>-<suffix>`, `…-part-N`, `…-inputs`, `…-backup`,
/// `…-backup-part-N`), and every copy is read back and compared with its source. Any
/// failure is returned, and the abandon does not go on.
pub async fn copy_out<K: TerraformObject>(
    ctx: &Context,
    scope: &Scope<K>,
    o: &Observed,
) -> Result<(), Error> {
    let (ns, suffix, here) = (&scope.namespace, &scope.suffix, &scope.secrets);
    let there: Api<Secret> = Api::namespaced(ctx.client.clone(), &ctx.manager_namespace);
    let base = names::abandoned_copy_name(ns, suffix);
    let mut labels = scope.identity().owner_labels();
    labels.insert(names::LABEL_SOURCE_NAMESPACE.into(), ns.clone());
    // Source → copy, by name.
    let mut pairs = Vec::new();
    for (source, copy) in [
        (names::state_secret_name(suffix), base.clone()),
        (
            names::backup_secret_name(suffix),
            names::abandoned_backup_copy_name(ns, suffix),
        ),
    ] {
        for name in chunked::names_of(here, &source).await? {
            let target = match names::part_index(&source, &name) {
                Some(n) => names::part_secret_name(&copy, n),
                None => copy.clone(),
            };
            pairs.push((name, target));
        }
    }
    pairs.push((
        names::inputs_secret_name(suffix),
        names::abandoned_inputs_copy_name(ns, suffix),
    ));
    // The errored states (each a chunked set of its own backend suffix), as
    // `captf-abandoned-<namespace>-<its suffix>`.
    for m in super::errored_metas(scope, o).await? {
        let Some(name) = m.name else { continue };
        // A pushed one is `tfstate-default-<its suffix>` (and parts); an older runner's
        // `captf-errored-<suffix>`, copied under its own name.
        let target = match names::parse_secret_name(&name) {
            Some(p) if name.starts_with("tfstate-") => {
                let copy = names::abandoned_copy_name(ns, &p.rest);
                match p.part {
                    Some(n) => names::part_secret_name(&copy, n),
                    None => copy,
                }
            }
            _ => names::abandoned_copy_name(ns, &name),
        };
        pairs.push((name, target));
    }
    let now = Timestamp::now().to_string();
    for (source, target) in &pairs {
        let Some(original) = here.get_opt(source).await? else {
            continue;
        };
        let mut annotations = original.metadata.annotations.clone().unwrap_or_default();
        annotations.retain(|k, _| {
            k == "encoding" || k == names::STATE_LINEAGE || k == names::STATE_SERIAL
        });
        annotations.insert(names::ABANDONED_AT.into(), now.clone());
        annotations.insert(names::COPIED_FROM.into(), format!("{ns}/{source}"));
        let copy = Secret {
            metadata: kube::api::ObjectMeta {
                name: Some(target.clone()),
                namespace: Some(ctx.manager_namespace.clone()),
                labels: Some(labels.clone()),
                annotations: Some(annotations),
                ..Default::default()
            },
            data: original.data.clone(),
            ..Default::default()
        };
        // Made by an earlier pass: the same bytes, or made again from these.
        let same =
            |s: &Option<Secret>| s.as_ref().and_then(|s| s.data.as_ref()) == original.data.as_ref();
        let mut back = None;
        if !writes::create_if_absent(&there, &copy).await? {
            back = there.get_opt(target).await?;
            if !same(&back) {
                writes::create_or_replace(&there, &copy).await?;
                back = None;
            }
        }
        // Read back what is there now.
        if back.is_none() {
            back = there.get_opt(target).await?;
        }
        if !same(&back) {
            return Err(Error::Stale(format!(
                "the copy {}/{target} of {ns}/{source} does not read back as written",
                ctx.manager_namespace
            )));
        }
    }
    // The state, joined from the copies, reads as the original did.
    let original = chunked::read(here, &names::state_secret_name(suffix), Some(suffix)).await?;
    let copied = chunked::read(&there, &base, None).await?;
    let cap = ctx.settings.decompression_cap;
    let fingerprint = |c: state::StateContent| match c {
        state::StateContent::Parsed {
            lineage, serial, ..
        } => Some((lineage, serial)),
        _ => None,
    };
    let (a, b) = (
        fingerprint(state::read(&original, cap)),
        fingerprint(state::read(&copied, cap)),
    );
    if a != b {
        return Err(Error::Stale(format!(
            "the copied state {}/{base} reads as {b:?}, the state in {ns} as {a:?} (lineage, serial)",
            ctx.manager_namespace
        )));
    }
    Ok(())
}

/// Whether the object's namespace is terminating, as read now (not from a cache).
async fn namespace_terminating_now<K: TerraformObject>(
    ctx: &Context,
    scope: &Scope<K>,
) -> Result<bool, Error> {
    Ok(
        Api::<k8s_openapi::api::core::v1::Namespace>::all(ctx.client.clone())
            .get_opt(&scope.namespace)
            .await?
            .is_none_or(|n| {
                n.metadata.deletion_timestamp.is_some()
                    || n.status.and_then(|s| s.phase).as_deref() == Some("Terminating")
            }),
    )
}

/// The Warning Event of an abandon in a terminating namespace, on the copy in the
/// manager's namespace (none can be made in a terminating one).
async fn announce_copies<K: TerraformObject>(ctx: &Context, scope: &Scope<K>, described: &str) {
    let (ns, suffix) = (&scope.namespace, &scope.suffix);
    let there: Api<Secret> = Api::namespaced(ctx.client.clone(), &ctx.manager_namespace);
    let base = names::abandoned_copy_name(ns, suffix);
    let copy = match there.get_metadata_opt(&base).await {
        Ok(Some(m)) => Some(m),
        _ => there
            .get_metadata_opt(&names::abandoned_inputs_copy_name(ns, suffix))
            .await
            .ok()
            .flatten(),
    };
    if let Some(copy) = copy {
        let msg = format!(
            "{}/{} abandoned while namespace {ns} terminates: its state, inputs and backup Secrets were copied here as {base}…; the state described: {described}",
            K::KIND,
            scope.name
        );
        publish_ref(
            ctx,
            &copy.object_ref(&()),
            EventType::Warning,
            events::ABANDONED,
            "Abandon",
            &msg,
        )
        .await;
    }
}
