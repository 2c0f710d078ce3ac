//! The apply table's one decision on a live object's pass, from one observation (the
//! [`Observed`], its [`ApplySources`] and what the pass read of the state), with what an
//! earlier pass remembers as inputs: a Job that does not render and a refusal of the API
//! server are facts of the decision, not a second decision after the first. The manager's
//! pass and `captf explain` (with and without `-f`) call it alike.

use std::time::Duration;

use super::apply::{
    ApplySources, ApplyStateSeen, apply_facts_seen, apply_observed, spec_inputs_of,
};
use super::{Observed, Settings};
use crate::inputs::Inputs;
use crate::rules::apply::{ApplyDecision, ApplyFacts, decide_apply};

/// How soon a pass whose attempt the API server refused tries again (and how often a pass
/// waiting for something the manager does not watch looks again).
pub const LOOK_AGAIN: Duration = Duration::from_secs(10);

/// What the apply table decided.
pub struct Verdict<T> {
    pub facts: ApplyFacts,
    /// What the pass does, and what its conditions say.
    pub decision: ApplyDecision,
    /// The attempt to start, rendered, with the inputs it runs.
    pub start: Option<(Inputs, T)>,
}

/// Decides the apply table on `o`. Where the table would start attempt `n`, the attempt is
/// rendered first with `render(n, inputs)`: one that does not render keeps it from
/// starting, as inputs that do not resolve (row A8). `refused`: why the API server refused
/// what the pass's last try at an attempt needed, remembered since: the attempt is tried
/// again, and the conditions say why it has not started ([`ApplyFacts::refused`]).
pub fn decide<T>(
    o: &Observed,
    sources: &ApplySources,
    state_seen: &ApplyStateSeen,
    settings: &Settings,
    refused: Option<&str>,
    render: impl FnOnce(u32, &Inputs) -> Result<T, String>,
) -> Verdict<T> {
    let seen = apply_observed(o, sources);
    let mut facts = apply_facts_seen(o, &seen, state_seen, settings);
    let mut start = None;
    if let Some(n) = decide_apply(&facts).action.start_attempt() {
        match spec_inputs_of(o, &seen.contract).and_then(|i| render(n, &i).map(|t| (i, t))) {
            Ok(r) => {
                start = Some(r);
                facts.refused = refused.map(|why| refusal(o, n, why));
            }
            Err(why) => facts.inputs = Err(why),
        }
    }
    Verdict {
        decision: decide_apply(&facts),
        facts,
        start,
    }
}

/// What the manager says when the API server refuses what apply attempt `n` of `o` needs
/// (its Event; the next pass's conditions say the same).
pub fn refused_message(o: &Observed, n: u32, why: &str) -> String {
    crate::rules::apply::refused_message(&refusal(o, n, why))
}

/// What [`ApplyFacts::refused`] says of the refusal `why` of attempt `n` of `o`.
fn refusal(o: &Observed, n: u32, why: &str) -> String {
    let refused = match crate::api::identity::refused_identity(why) {
        Some(why) => format!("the identity apply attempt {n} runs with cannot be used: {why}"),
        None => format!("the API server refused what apply attempt {n} needs: {why}"),
    };
    format!(
        "{} {}/{}: {refused}; tried again every {}s",
        o.kind.as_str(),
        o.meta.namespace.as_deref().unwrap_or_default(),
        o.meta.name.as_deref().unwrap_or_default(),
        LOOK_AGAIN.as_secs()
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::names::Kind;
    use crate::rules::apply::{ApplyAction, ApplyRow};
    use crate::testing::observed;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;

    /// `team-a/prod`, a live TerraformCluster its Cluster owns, never applied.
    fn cluster() -> Observed {
        let mut o = observed(Kind::TerraformCluster, &[]);
        o.meta.deletion_timestamp = None;
        o.meta.owner_references = Some(vec![OwnerReference {
            api_version: "cluster.x-k8s.io/v1beta2".into(),
            kind: "Cluster".into(),
            name: "prod".into(),
            uid: "owner-uid".into(),
            ..Default::default()
        }]);
        o
    }

    fn decided(refused: Option<&str>, render: Result<(), String>) -> Verdict<()> {
        decide(
            &cluster(),
            &ApplySources::default(),
            &ApplyStateSeen::default(),
            &Settings::default(),
            refused,
            |n, _| {
                assert_eq!(n, 1, "the attempt the table would start is rendered");
                render
            },
        )
    }

    #[test]
    fn the_attempt_is_rendered_before_the_one_decision_and_handed_back() {
        let v = decided(None, Ok(()));
        assert_eq!(v.decision.action, ApplyAction::StartApply { attempt: 1 });
        assert!(v.start.is_some());
    }

    #[test]
    fn a_job_that_does_not_render_keeps_the_attempt_from_starting() {
        let v = decided(None, Err("the Job template's field x is not valid".into()));
        assert_eq!(v.decision.row, ApplyRow::InputsUnresolvable);
        assert_eq!(v.decision.action, ApplyAction::Wait);
        assert!(v.start.is_none());
        assert!(
            v.decision.conditions[0]
                .message
                .contains("the Job template's field x is not valid"),
            "{:?}",
            v.decision.conditions
        );
    }

    #[test]
    fn a_remembered_refusal_is_tried_again_and_said() {
        let v = decided(Some("exceeded quota: jobs"), Ok(()));
        assert_eq!(v.decision.action, ApplyAction::StartApply { attempt: 1 });
        assert!(v.start.is_some(), "the pass tries the attempt again");
        let msg = &v.decision.conditions[0].message;
        assert!(
            msg.starts_with(
                "TerraformCluster team-a/prod: the API server refused what apply attempt 1 needs: exceeded quota: jobs; tried again every 10s"
            ),
            "{msg}"
        );
        // A refusal with a Job that does not render: the render's reason is what is said.
        let v = decided(Some("exceeded quota: jobs"), Err("bad template".into()));
        assert!(v.decision.conditions[0].message.contains("bad template"));
    }
}
