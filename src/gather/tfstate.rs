//! The state, its errored states and Terraform's lock as the facts read them.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Pod;

use crate::api::names;
use crate::rules::{Blocker, StateFacts, Unreadable};
use crate::state::lock::{self, Lock};
use crate::state::{self, Fingerprint, StateReason, Verdict};

use super::{Findings, Observed, Settings, annotation};

/// The state's facts, from the state Secrets this pass read (`NotRead` without them):
/// an orphaned state of an earlier object of this name is none of this object's; a read
/// state is classified against the recorded fingerprint, and is inconsistent when another
/// Secret carries every label Terraform's backend selects it by.
pub(super) fn state_of(
    o: &Observed,
    settings: &Settings,
    applied: bool,
    own_lineage: bool,
    findings: &mut Findings,
) -> StateFacts {
    let interrupted = annotation(&o.meta, names::APPLY_INTERRUPTED).is_some();
    state_of_after(o, settings, applied, own_lineage, interrupted, findings)
}

/// [`state_of`], with `interrupted` saying whether an interrupted apply is the last to
/// have written the state (an apply that completed since wrote it whole).
pub(super) fn state_of_after(
    o: &Observed,
    settings: &Settings,
    applied: bool,
    own_lineage: bool,
    interrupted: bool,
    findings: &mut Findings,
) -> StateFacts {
    let name = o.meta.name.clone().unwrap_or_default();
    let suffix = names::state_suffix(o.kind, &name);
    match &o.state {
        None => StateFacts::NotRead,
        Some(secrets) => {
            let (content, stale_parts) = state::read_noting(secrets, settings.decompression_cap);
            let base = secrets.base_name.clone();
            if !matches!(content, state::StateContent::Missing) && !applied && !own_lineage {
                // An orphaned state of an earlier object with this name, not adopted:
                // this object never applied, so it has no state of its own.
                findings.foreign_state = true;
                StateFacts::Missing
            } else {
                // Adopt lets the object take a state while it records no fingerprint;
                // once one is recorded (the adopted state's, written by the bookkeeping),
                // it is checked like any other, so an older backup restored later is not
                // destroyed against.
                let verdict = match Fingerprint::from_annotations(
                    o.meta.annotations.as_ref().unwrap_or(&BTreeMap::new()),
                ) {
                    Ok(recorded) => {
                        state::classify_named(&base, &content, recorded.as_ref(), interrupted)
                    }
                    Err(problem) => bad_fingerprint(&base, &content, problem),
                };
                // Terraform's backend selects the state by labels: another Secret with
                // them all is read by Terraform as part of this state, so the two would
                // not destroy against the same state.
                let selector = o.identity().state_labels();
                let strangers = secrets.strangers(&selector);
                let verdict = if strangers.is_empty() {
                    verdict
                } else {
                    Verdict {
                        readable: false,
                        reason: StateReason::StateInconsistent,
                        message: format!(
                            "Secret(s) {} carry every label Terraform's backend selects state Secret {base} by: Terraform would read them together with it (and fail, or destroy against another state) while CAPTF reads {base} alone; delete them, or remove their tfstate label (see runbooks/StateInconsistent.md)",
                            strangers.join(", ")
                        ),
                        ..verdict
                    }
                };
                let verdict = match stale_parts {
                    Some(note) if verdict.readable => Verdict {
                        message: format!("{}; {note}", verdict.message),
                        ..verdict
                    },
                    _ => verdict,
                };
                let facts = state_facts(&verdict, &names::state_secret_name(&suffix));
                findings.verdict = Some(verdict);
                facts
            }
        }
    }
}

/// The errored states (see [`Observed::errored`]) that list a managed resource instance
/// the state does not, or cannot be read, described; None when every one is covered by
/// the state (a destroy whose last save failed leaves a subset of it, for instance).
pub fn errored_uncovered(o: &Observed, cap: u64) -> Option<String> {
    if o.errored.is_empty() {
        return None;
    }
    let state = match o.state.as_ref().map(|s| s.instances(cap)) {
        Some(Ok(i)) => Some(i.managed),
        None => Some(Default::default()),
        Some(Err(_)) => None,
    };
    let mut said = Vec::new();
    for e in &o.errored {
        let name = e.name();
        match (e.instances(cap), &state) {
            (Err(why), _) => said.push(format!(
                "the errored state {name} (what Terraform could not save) cannot be read ({why}), so the resources it records are unknown"
            )),
            (Ok(_), None) => said.push(format!(
                "the errored state {name} (what Terraform could not save) cannot be compared with the state, which cannot be read"
            )),
            (Ok(errored), Some(state)) => {
                let missing: Vec<&String> = errored.managed.difference(state).collect();
                if missing.is_empty() {
                    continue;
                }
                const SHOWN: usize = 3;
                let mut list: Vec<String> =
                    missing.iter().take(SHOWN).map(|m| m.to_string()).collect();
                if missing.len() > SHOWN {
                    list.push(format!("{} more", missing.len() - SHOWN));
                }
                said.push(format!(
                    "the errored state {name} (what Terraform could not save) records {} managed resource instance(s) that the state does not: {}",
                    missing.len(),
                    list.join(", ")
                ));
            }
        }
    }
    (!said.is_empty()).then(|| said.join("; "))
}

/// Terraform's lock, judged by [`lock::judge`]: free, stale (its holder a runner of this
/// object, or of an earlier one of its name, that is provably gone: cleared before the
/// attempt), or held (never broken).
pub(super) fn lock_blocker(o: &Observed, suffix: &str, findings: &mut Findings) -> Option<Blocker> {
    let pods: Vec<Pod> = o.pods.iter().chain(&o.earlier_pods).cloned().collect();
    match lock::judge(o.lock.as_ref(), suffix, &pods, o.now) {
        Lock::Free => None,
        Lock::StaleOwn { .. } => {
            findings.stale_lock = true;
            None
        }
        Lock::Held { holder, age, why } => Some(Blocker::LockHeld { holder, age, why }),
    }
}

pub(super) fn bad_fingerprint(
    base: &str,
    content: &state::StateContent,
    problem: String,
) -> Verdict {
    let mut v = state::classify_named(base, content, None, false);
    if v.readable {
        v.readable = false;
        v.reason = StateReason::StateInconsistent;
        v.message = format!(
            "{problem}: the state cannot be checked against the object's fingerprint; see runbooks/StateInconsistent.md"
        );
    }
    v
}

pub(super) fn state_facts(v: &Verdict, secret: &str) -> StateFacts {
    let unreadable = |why| StateFacts::Unreadable {
        why,
        message: v.message.clone(),
    };
    match v.reason {
        StateReason::Readable => StateFacts::Readable {
            managed_instances: v.managed_instances.unwrap_or(0),
            lineage: v.lineage.clone().unwrap_or_default(),
            serial: v.serial.unwrap_or(0),
            secret: secret.to_string(),
        },
        StateReason::StateLost => StateFacts::Missing,
        StateReason::StateCorrupt => unreadable(Unreadable::Corrupt),
        StateReason::StateEncrypted => unreadable(Unreadable::Encrypted),
        StateReason::StateInconsistent => unreadable(Unreadable::Inconsistent),
    }
}
