//! `captf explain` without `-f`: the objects read from the cluster as a controller's pass
//! reads them, decided by the manager's own code: the deletion's rule table on the object
//! as the pass's bookkeeping leaves it, and for a live object the apply table, through the
//! live pass's own reads and decision ([`crate::controller::apply_pass::decide_live`]).

use std::sync::Arc;

use jiff::Timestamp;
use kube::api::{Api, ListParams};
use kube::{Client, ResourceExt};

use super::{Explained, ExplainedApply};
use crate::api::{Kind, TerraformObject};
use crate::controller::apply_pass::{Live, decide_live};
use crate::controller::source::Cluster;
use crate::controller::{Context, ManagerConfig, Scope, bookkeeping};
use crate::gather::source::{Subject, observe_object};
use crate::gather::{self, Settings};
use crate::ops::ToolError;
use crate::state::permits::Lane;

/// `captf explain` without `-f`: the same verdicts from the live objects.
pub async fn explain(
    client: &Client,
    ns: Option<&str>,
    settings: &Settings,
) -> Result<Vec<Explained>, ToolError> {
    let cluster_api = crate::controller::discover_cluster(client).await;
    // The manager's context, as a pass has it (its templates the embedded ones: `explain`
    // has no say over the manager's).
    let ctx = Arc::new(Context::new(
        client.clone(),
        &ManagerConfig {
            settings: *settings,
            ..Default::default()
        },
        crate::job::Templates::embedded(),
        Arc::default(),
        cluster_api,
    ));
    let mut out = Vec::new();
    for kind in Kind::ALL {
        crate::with_kind!(kind, K => {
            explain_kind::<K>(&ctx, ns, &mut out).await?
        });
    }
    Ok(out)
}

async fn explain_kind<K: TerraformObject>(
    ctx: &Context,
    ns: Option<&str>,
    out: &mut Vec<Explained>,
) -> Result<(), ToolError> {
    let client = &ctx.client;
    let api: Api<K> = match ns {
        Some(n) => Api::namespaced(client.clone(), n),
        None => Api::all(client.clone()),
    };
    for obj in api.list(&ListParams::default()).await?.items {
        // The manager's observation, from the API server (no caches), the state always.
        let scope = Scope::new(client, &obj)?;
        let source = Cluster::new(ctx, &scope, Lane::Ordinary);
        let (mut observed, read) = observe_object(&source, Subject::of(&obj), |_| true).await?;
        if let Some(read) = read {
            read.apply(&mut observed, Timestamp::now());
        }
        let (observed, decision, _, _) =
            bookkeeping::decide_after_bookkeeping(&observed, &ctx.settings);
        let mut e = Explained::new(
            K::KIND,
            &obj.namespace().unwrap_or_default(),
            &obj.name_any(),
            &decision,
        );
        e.if_deleted = Some(super::ExplainedIfDeleted::of(
            &observed,
            &ctx.settings,
            &decision,
        ));
        e.cluster = gather::owning_cluster(obj.meta());
        if obj.meta().deletion_timestamp.is_none() {
            let state_seen = gather::apply::apply_state_seen(&observed, &ctx.settings);
            let live = decide_live(ctx, &scope, &obj, observed, state_seen, false).await?;
            if let Live::Decided(d) = live {
                let shown = obj
                    .status()
                    .map(|s| s.conditions.clone())
                    .unwrap_or_default();
                let extra = super::live_conditions(
                    &d.observed,
                    &d.verdict.decision,
                    &shown,
                    ctx.disposal_retention,
                );
                e.with_apply(ExplainedApply::new(&d.verdict.decision).with_live(&extra));
            }
        }
        out.push(e);
    }
    Ok(())
}
