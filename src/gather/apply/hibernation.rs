//! Hibernation while the Cluster is in disposal: whether it is asked, whether the module
//! says it is, and the condition that shows it.

use super::*;

/// Whether the object's Cluster asks its modules to hibernate: it is marked for disposal
/// with a retention that reads, with `dispose-hibernate: "true"`, and is not being
/// deleted (a deletion wins, and applies nothing).
pub fn hibernation_asked(o: &Observed) -> bool {
    o.cluster.as_ref().is_some_and(|c| {
        c.dispose_hibernate
            && !c.deleting
            && c.dispose_after.as_deref().is_some_and(|m| {
                crate::rules::disposal::retention(m, std::time::Duration::ZERO).is_ok()
            })
    })
}

/// Whether the object's module declares `captf_hibernated`: known for a module given as
/// files, not for one given as a source address or an image's directory.
pub fn declares_hibernated(o: &Observed) -> Option<bool> {
    let files = o.spec.module.files.as_ref()?;
    Some(
        files
            .iter()
            .filter(|(name, _)| name.ends_with(".tf"))
            .any(|(_, text)| {
                crate::contract::hcl::parse(text).is_ok_and(|blocks| {
                    blocks.iter().any(|b| {
                        b.kind == "variable"
                            && b.labels.first().map(String::as_str)
                                == Some(crate::contract::HIBERNATED)
                    })
                })
            }),
    )
}

/// The `Hibernated` condition of a live object, from its observation and the apply
/// table's decision on it; `shown_before`: the object shows the condition already.
pub fn hibernation_condition(
    o: &Observed,
    apply: &crate::rules::apply::ApplyDecision,
    shown_before: bool,
) -> Option<crate::api::conditions::Desired> {
    let inputs_applied = apply
        .conditions
        .iter()
        .find(|c| c.type_ == crate::rules::apply::INPUTS_APPLIED);
    crate::rules::disposal::hibernation(
        hibernation_asked(o),
        declares_hibernated(o),
        inputs_applied.is_some_and(|c| c.status == crate::api::conditions::Status::True),
        inputs_applied.map(|c| c.reason).unwrap_or_default(),
        shown_before,
    )
}

/// `captf_hibernated` in the contract's values: true while hibernation is asked, unless
/// the module is known not to declare it (it would re-apply for nothing); absent
/// otherwise, so that the values are what they were before.
pub(super) fn hibernation(values: &mut serde_json::Map<String, serde_json::Value>, o: &Observed) {
    values.remove(crate::contract::HIBERNATED);
    if hibernation_asked(o) && declares_hibernated(o) != Some(false) {
        values.insert(
            crate::contract::HIBERNATED.to_string(),
            serde_json::Value::Bool(true),
        );
    }
}
