//! `captf explain`: for each CAPTF object in a set of objects, the row that decides its
//! next pass, the action, the conditions and the runbook. The objects come from files
//! (`-f`) or from the cluster; either way they become an [`Observed`] and go through the
//! same facts gathering and rule table as the controllers.

mod files;
pub mod inventory;
pub mod live;
pub mod load;

use jiff::Timestamp;
use serde::Serialize;

use crate::api::Kind;
use crate::api::names;
use crate::api::object::AnyObject;
use crate::gather::{self, Observed, Settings};
use crate::rules::apply::{ApplyAction, ApplyDecision};
use crate::rules::{Action, Decision, Row};
use files::decide_live;
pub use files::{dump, observe};
use inventory::Inventory;

/// One element of `captf explain -o json` (SPEC section 9).
#[derive(Clone, Debug, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Explained {
    pub kind: String,
    pub namespace: String,
    pub name: String,
    pub row: Option<Row>,
    pub action: Action,
    pub conditions: Vec<ExplainedCondition>,
    pub runbook: Option<String>,
    pub next_retry_at: Option<String>,
    /// For a live object (not being deleted): the apply table's decision.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub apply: Option<ExplainedApply>,
    /// What a deletion would reach if it were asked now (the `DeletionReady` condition);
    /// for an object being deleted, its deletion's.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub if_deleted: Option<ExplainedIfDeleted>,
    /// The Cluster API Cluster the object belongs to (`--cluster`); not printed.
    #[serde(skip)]
    pub cluster: Option<String>,
}

/// The deletion table's row and action with the deletion assumed, and the
/// `DeletionReady` condition they make.
#[derive(Clone, Debug, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ExplainedIfDeleted {
    pub row: Option<Row>,
    pub action: Option<Action>,
    pub condition: ExplainedCondition,
    pub runbook: Option<String>,
}

impl ExplainedIfDeleted {
    /// The preview of a live object's deletion.
    pub fn of_preview(p: &crate::rules::Preview) -> ExplainedIfDeleted {
        ExplainedIfDeleted {
            row: p.row(),
            action: p.decision.as_ref().map(|d| d.action),
            condition: ExplainedCondition::from(&p.ready),
            runbook: p.runbook().map(str::to_string),
        }
    }

    /// An object being deleted: its deletion's own decision.
    pub fn of_deletion(d: &Decision) -> ExplainedIfDeleted {
        ExplainedIfDeleted {
            row: d.row,
            action: Some(d.action),
            condition: ExplainedCondition::from(&crate::rules::deletion_ready(d)),
            runbook: d.runbook.map(str::to_string),
        }
    }

    /// For `observed` as its pass leaves it, and its deletion's decision.
    pub fn of(observed: &Observed, settings: &Settings, decision: &Decision) -> ExplainedIfDeleted {
        if observed.meta.deletion_timestamp.is_some() {
            return ExplainedIfDeleted::of_deletion(decision);
        }
        let (facts, _) = gather::gather(observed, settings);
        ExplainedIfDeleted::of_preview(&crate::rules::preview(&facts))
    }
}

/// The apply table's row, action and conditions for a live object.
#[derive(Clone, Debug, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ExplainedApply {
    pub row: String,
    pub situation: String,
    pub action: String,
    pub conditions: Vec<ExplainedCondition>,
    pub runbook: Option<String>,
    pub next_retry_at: Option<String>,
}

/// The conditions a live pass writes beside the apply table's: `Disposal` (a
/// TerraformCluster) and `Hibernated` (while hibernation is asked, or once it was:
/// `shown_before`), as the manager decides them.
pub fn live_conditions(
    o: &Observed,
    d: &ApplyDecision,
    shown: &[crate::api::conditions::Condition],
    retention: std::time::Duration,
) -> Vec<crate::api::conditions::Desired> {
    use crate::rules::disposal::{self, DISPOSAL, HIBERNATED};
    let disposal = gather::disposal_facts(o, retention).and_then(|f| {
        disposal::shown_condition(&disposal::decide_disposal(&f), shows(shown, DISPOSAL))
    });
    disposal
        .into_iter()
        .chain(gather::apply::hibernation_condition(
            o,
            d,
            shows(shown, HIBERNATED),
        ))
        .collect()
}

/// Whether `conditions` holds one of type `type_`.
pub fn shows(conditions: &[crate::api::conditions::Condition], type_: &str) -> bool {
    conditions.iter().any(|c| c.type_ == type_)
}

impl ExplainedApply {
    /// With the other conditions the live pass writes (see [`live_conditions`]).
    pub fn with_live(mut self, extra: &[crate::api::conditions::Desired]) -> ExplainedApply {
        self.conditions
            .extend(extra.iter().map(ExplainedCondition::from));
        self
    }

    pub fn new(d: &ApplyDecision) -> ExplainedApply {
        let conditions: Vec<ExplainedCondition> =
            d.conditions.iter().map(ExplainedCondition::from).collect();
        // The runbook the conditions' messages name.
        let runbook = conditions.iter().find_map(|c| {
            let at = c.message.find("runbooks/")?;
            let rest = &c.message[at..];
            rest.find(".md").map(|end| rest[..end + 3].to_string())
        });
        let (action, next_retry_at) = match d.action {
            ApplyAction::Nothing => (
                "nothing: the cluster's infrastructure is someone else's".to_string(),
                None,
            ),
            ApplyAction::Wait => ("wait".to_string(), None),
            ApplyAction::StartApply { attempt } => (format!("start apply attempt {attempt}"), None),
            ApplyAction::RetryLater { at, start: Some(n) } => {
                (format!("start apply attempt {n}"), Some(at.to_string()))
            }
            ApplyAction::RetryLater { at, start: None } => {
                ("retry later".to_string(), Some(at.to_string()))
            }
        };
        ExplainedApply {
            row: d.row.label(),
            situation: d.row.situation().to_string(),
            action,
            conditions,
            runbook,
            next_retry_at,
        }
    }
}

#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct ExplainedCondition {
    #[serde(rename = "type")]
    pub type_: String,
    pub status: String,
    pub reason: String,
    pub message: String,
}

impl From<&crate::api::conditions::Desired> for ExplainedCondition {
    fn from(c: &crate::api::conditions::Desired) -> Self {
        ExplainedCondition {
            type_: c.type_.to_string(),
            status: c.status.as_str().to_string(),
            reason: c.reason.to_string(),
            message: c.message.clone(),
        }
    }
}

impl Explained {
    /// Adds the apply table's decision of a live object; as the live pass writes them, the
    /// apply table's conditions win (`Ready`).
    pub fn with_apply(&mut self, apply: ExplainedApply) {
        self.conditions
            .retain(|c| !apply.conditions.iter().any(|a| a.type_ == c.type_));
        self.apply = Some(apply);
    }

    pub fn new(kind: Kind, namespace: &str, name: &str, d: &Decision) -> Explained {
        Explained {
            kind: kind.as_str().to_string(),
            namespace: namespace.to_string(),
            name: name.to_string(),
            row: d.row,
            action: d.action,
            conditions: d.conditions().map(ExplainedCondition::from).collect(),
            runbook: d.runbook.map(str::to_string),
            next_retry_at: d.action.next_retry_at().map(|t| t.to_string()),
            apply: None,
            if_deleted: None,
            cluster: None,
        }
    }
}

/// Explains every CAPTF object of the inventory, in the order they were read: the
/// deletion's rule table, and for a live object the apply table too.
pub fn explain(inv: &Inventory, now: Timestamp, settings: &Settings) -> Vec<Explained> {
    let dump = dump(inv, now);
    inv.objects
        .iter()
        .map(|(_, object)| {
            let observed = observe(&dump, object);
            let (observed, decision, _, _) =
                crate::controller::bookkeeping::decide_after_bookkeeping(&observed, settings);
            let meta = object.meta();
            let mut e = Explained::new(
                object.kind(),
                meta.namespace.as_deref().unwrap_or_default(),
                meta.name.as_deref().unwrap_or_default(),
                &decision,
            );
            e.if_deleted = Some(ExplainedIfDeleted::of(&observed, settings, &decision));
            e.cluster = gather::owning_cluster(meta);
            if meta.deletion_timestamp.is_none() {
                let d = decide_live(&dump, object, &observed, settings);
                let shown = object
                    .status()
                    .map(|s| s.conditions.clone())
                    .unwrap_or_default();
                let extra = live_conditions(
                    &observed,
                    &d,
                    &shown,
                    crate::rules::disposal::DEFAULT_RETENTION,
                );
                e.with_apply(ExplainedApply::new(&d).with_live(&extra));
            }
            e
        })
        .collect()
}

/// One line per condition, with its message when it has one.
fn push_conditions(out: &mut String, conditions: &[ExplainedCondition]) {
    for c in conditions {
        if c.message.is_empty() {
            out.push_str(&format!("  {}={} {}\n", c.type_, c.status, c.reason));
        } else {
            out.push_str(&format!(
                "  {}={} {}: {}\n",
                c.type_, c.status, c.reason, c.message
            ));
        }
    }
}

/// The human-readable form of `captf explain --if-deleted`: per object, the row its
/// deletion would reach and why.
pub fn render_if_deleted(items: &[Explained]) -> String {
    let mut out = String::new();
    if items.is_empty() {
        out.push_str(
            "no TerraformCluster, TerraformMachine or TerraformMachinePool in the input\n",
        );
    }
    for e in items {
        let Some(p) = &e.if_deleted else { continue };
        out.push_str(&format!("{} {}/{}\n", e.kind, e.namespace, e.name));
        let lead = if e.row.is_some() {
            "being deleted"
        } else {
            "if deleted now"
        };
        match p.row {
            Some(row) => out.push_str(&format!("  {lead}: row {row}: {}\n", row.situation())),
            None => out.push_str(&format!("  {lead}: cannot tell yet\n")),
        }
        if let Some(a) = p.action {
            out.push_str(&format!("  action: {}\n", a.name()));
        }
        push_conditions(&mut out, std::slice::from_ref(&p.condition));
        out.push_str(&format!(
            "  runbook: {}\n\n",
            p.runbook.as_deref().unwrap_or("none needed")
        ));
    }
    out
}

/// Keeps the objects of Cluster API Cluster `cluster` (the TerraformCluster it owns and
/// the machines and pools that carry its name): `captf explain --cluster`.
pub fn of_cluster(items: Vec<Explained>, cluster: &str) -> Vec<Explained> {
    items
        .into_iter()
        .filter(|e| e.cluster.as_deref() == Some(cluster))
        .collect()
}

/// The human-readable form.
pub fn render_text(items: &[Explained]) -> String {
    let mut out = String::new();
    if items.is_empty() {
        out.push_str(
            "no TerraformCluster, TerraformMachine or TerraformMachinePool in the input\n",
        );
    }
    for e in items {
        out.push_str(&format!("{} {}/{}\n", e.kind, e.namespace, e.name));
        match e.row {
            Some(row) => out.push_str(&format!("  row {row}: {}\n", row.situation())),
            None => out.push_str("  not being deleted\n"),
        }
        out.push_str(&format!("  action: {}\n", e.action.name()));
        push_conditions(&mut out, &e.conditions);
        if let Some(at) = &e.next_retry_at {
            out.push_str(&format!("  next retry: {at}\n"));
        }
        if let Some(p) = e.if_deleted.as_ref().filter(|_| e.row.is_none()) {
            push_conditions(&mut out, std::slice::from_ref(&p.condition));
        }
        if let Some(a) = &e.apply {
            out.push_str(&format!("  apply row {}: {}\n", a.row, a.situation));
            out.push_str(&format!("  apply action: {}\n", a.action));
            push_conditions(&mut out, &a.conditions);
            if let Some(at) = &a.next_retry_at {
                out.push_str(&format!("  next apply attempt: {at}\n"));
            }
            if let Some(rb) = &a.runbook {
                out.push_str(&format!("  apply runbook: {rb}\n"));
            }
        }
        out.push_str(&format!(
            "  runbook: {}\n\n",
            e.runbook.as_deref().unwrap_or("none needed")
        ));
    }
    out
}
