//! Disposal on the TerraformCluster's pass: reads the mark on its Cluster (from the
//! cache, as the pass observed it), decides ([`rules::disposal`], pure), records or
//! clears the time the mark was first seen, and at the end of the retention deletes the
//! Cluster, after which Cluster API and the deletion's table do the rest, as for any
//! deletion.

use std::collections::HashMap;
use std::sync::Mutex;

use jiff::Timestamp;
use kube::api::{Api, DeleteParams, DynamicObject, Preconditions};
use kube::runtime::events::EventType;
use tracing::{info, warn};

use super::events::publish;
use super::{Context, Error, Scope};
use crate::api::TerraformObject;
use crate::api::conditions::Desired;
use crate::api::names;
use crate::gather::Observed;
use crate::io::writes::{annotation_ops, guarded_patch};
use crate::rules::disposal::{self as rule, DisposalAction};

/// A disposal's Events.
pub const DISPOSAL_REQUESTED: &str = "DisposalRequested";
pub const DISPOSAL_CANCELLED: &str = "DisposalCancelled";
pub const DISPOSAL_DELETING_CLUSTER: &str = "DisposalDeletingCluster";

/// What the pass goes on with.
pub enum Disposal {
    /// The object was written: the next pass decides on it as written.
    Written,
    /// The `Disposal` condition to write (none for a Cluster never marked), and when to
    /// look again.
    Decided {
        condition: Option<Desired>,
        wake_at: Option<Timestamp>,
    },
}

/// The TerraformClusters counted by `captf_clusters_in_disposal`, by uid, with the end
/// of a pending one's retention (for `captf_disposal_next_deletion_timestamp_seconds`).
#[derive(Default)]
pub struct Counted(Mutex<HashMap<String, (&'static str, Option<Timestamp>)>>);

impl Counted {
    fn set(&self, ctx: &Context, uid: &str, state: Option<&'static str>, ends: Option<Timestamp>) {
        let mut m = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let before = match state {
            Some(s) => m.insert(uid.to_string(), (s, ends)),
            None => m.remove(uid),
        };
        let next = m.values().filter_map(|(_, e)| *e).min();
        ctx.metrics
            .disposal_next_deletion
            .set(next.map_or(0, |t| t.as_second()));
        let before = before.map(|(s, _)| s);
        if before == state {
            return;
        }
        if let Some(b) = before {
            ctx.metrics
                .clusters_in_disposal
                .dec(&crate::metrics::ByState { state: b });
        }
        if let Some(s) = state {
            ctx.metrics
                .clusters_in_disposal
                .inc(&crate::metrics::ByState { state: s });
        }
    }

    /// Uncounts `uid` (its deletion began).
    pub fn forget(&self, ctx: &Context, uid: &str) {
        self.set(ctx, uid, None, None);
    }
}

/// The disposal part of a TerraformCluster's live pass; nothing for the other kinds.
pub async fn pass<K: TerraformObject>(
    ctx: &Context,
    scope: &Scope<K>,
    obj: &K,
    o: &Observed,
) -> Result<Option<Disposal>, Error> {
    let Some(facts) = crate::gather::disposal_facts(o, ctx.disposal_retention) else {
        return Ok(None);
    };
    let cluster = o.cluster.as_ref();
    let d = rule::decide_disposal(&facts);
    ctx.disposals.set(ctx, &scope.uid, d.state, d.wake_at);
    let record = |value: Option<String>| {
        let ops = annotation_ops(obj.meta(), &[(names::DISPOSAL_REQUESTED_AT, value)]);
        guarded_patch(&scope.api, obj.meta(), ops)
    };
    match d.action {
        DisposalAction::Nothing => {}
        DisposalAction::Record(at) => {
            record(Some(at.to_string())).await?;
            info!(cluster = %facts.cluster, "disposal requested");
            publish(
                ctx,
                obj,
                EventType::Normal,
                DISPOSAL_REQUESTED,
                "Dispose",
                &d.condition.message,
            )
            .await;
            return Ok(Some(Disposal::Written));
        }
        DisposalAction::Clear => {
            record(None).await?;
            info!(cluster = %facts.cluster, "disposal taken back");
            let msg = format!(
                "the disposal of Cluster {} was taken back: its {} annotation is gone",
                facts.cluster,
                names::DISPOSE_AFTER
            );
            publish(
                ctx,
                obj,
                EventType::Normal,
                DISPOSAL_CANCELLED,
                "Dispose",
                &msg,
            )
            .await;
            return Ok(Some(Disposal::Written));
        }
        DisposalAction::DeleteCluster => {
            if let (Some(ar), Some(c)) = (ctx.cluster_api.resource(), cluster) {
                let api: Api<DynamicObject> =
                    Api::namespaced_with(ctx.client.clone(), &scope.namespace, ar);
                // The Cluster that was marked, not a new one of its name.
                let params = DeleteParams {
                    preconditions: (!c.uid.is_empty()).then(|| Preconditions {
                        uid: Some(c.uid.clone()),
                        resource_version: None,
                    }),
                    ..Default::default()
                };
                match api.delete(&c.name, &params).await {
                    Ok(_) => {
                        info!(cluster = %c.name, "disposal over: Cluster deleted");
                        publish(
                            ctx,
                            obj,
                            EventType::Normal,
                            DISPOSAL_DELETING_CLUSTER,
                            "Dispose",
                            &d.condition.message,
                        )
                        .await;
                    }
                    Err(kube::Error::Api(e)) if e.code == 404 => {}
                    Err(kube::Error::Api(e)) => {
                        warn!(cluster = %c.name, why = %e.message, "the disposal's deletion of the Cluster was refused");
                        let condition = Desired::new(
                            rule::DISPOSAL,
                            d.condition.status,
                            d.condition.reason,
                            format!(
                                "{}; the API server refused the deletion: {} (a deletion-protection annotation on the Cluster? remove it to let the disposal end); tried again every {}s",
                                d.condition.message,
                                e.message,
                                REFUSED_RETRY.as_secs()
                            ),
                        );
                        return Ok(Some(Disposal::Decided {
                            condition: Some(condition),
                            wake_at: Some(crate::rules::add(o.now, REFUSED_RETRY)),
                        }));
                    }
                    Err(e) => return Err(e.into()),
                }
            }
        }
    }
    let shown = obj
        .status()
        .is_some_and(|s| s.conditions.iter().any(|c| c.type_ == rule::DISPOSAL));
    Ok(Some(Disposal::Decided {
        condition: rule::shown_condition(&d, shown),
        wake_at: d.wake_at,
    }))
}

const REFUSED_RETRY: std::time::Duration = crate::gather::verdict::LOOK_AGAIN;
