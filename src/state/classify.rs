//! The readability verdict of SPEC section 4 ("State readability"): what was read,
//! checked against the fingerprint the object recorded.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::StateContent;
use crate::api::names::{STATE_LINEAGE, STATE_SERIAL};

/// The state fingerprint an object recorded (annotations `state-lineage`, `state-serial`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fingerprint {
    pub lineage: String,
    pub serial: u64,
}

impl Fingerprint {
    /// Both annotations present → Some; neither → None; only one, an empty lineage or an
    /// unparsable serial → Err naming the annotation.
    pub fn from_annotations(
        annotations: &BTreeMap<String, String>,
    ) -> Result<Option<Fingerprint>, String> {
        match (
            annotations.get(STATE_LINEAGE),
            annotations.get(STATE_SERIAL),
        ) {
            (None, None) => Ok(None),
            (Some(_), None) => Err(format!(
                "annotation {STATE_LINEAGE} is set but {STATE_SERIAL} is not"
            )),
            (None, Some(_)) => Err(format!(
                "annotation {STATE_SERIAL} is set but {STATE_LINEAGE} is not"
            )),
            (Some(lineage), Some(serial)) => {
                if lineage.trim().is_empty() {
                    return Err(format!("annotation {STATE_LINEAGE} is empty"));
                }
                let serial = serial.trim();
                let parsed = if serial.bytes().all(|b| b.is_ascii_digit()) {
                    serial.parse::<u64>().ok()
                } else {
                    None
                };
                match parsed {
                    Some(serial) => Ok(Some(Fingerprint {
                        lineage: lineage.trim().to_string(),
                        serial,
                    })),
                    None => Err(format!(
                        "annotation {STATE_SERIAL} is {serial:?}, not a non-negative integer"
                    )),
                }
            }
        }
    }
}

/// The reason of the `StateReadable` condition.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum StateReason {
    Readable,
    StateLost,
    StateCorrupt,
    StateEncrypted,
    StateInconsistent,
}

impl StateReason {
    pub fn as_str(self) -> &'static str {
        match self {
            StateReason::Readable => "Readable",
            StateReason::StateLost => "StateLost",
            StateReason::StateCorrupt => "StateCorrupt",
            StateReason::StateEncrypted => "StateEncrypted",
            StateReason::StateInconsistent => "StateInconsistent",
        }
    }
}

impl std::fmt::Display for StateReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The verdict on one state: the shape of `captf state inspect -o json` (SPEC section 9).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Verdict {
    pub readable: bool,
    pub reason: StateReason,
    pub managed_instances: Option<u64>,
    pub lineage: Option<String>,
    pub serial: Option<u64>,
    pub message: String,
}

/// Classification of SPEC section 4, in its order. `recorded` is the object's fingerprint
/// annotations if both are set and valid; `apply_interrupted` is whether the object
/// carries apply-interrupted. Messages of a missing or parsed state say "the state
/// Secret"; [`classify_named`] names it.
pub fn classify(
    content: &StateContent,
    recorded: Option<&Fingerprint>,
    apply_interrupted: bool,
) -> Verdict {
    verdict(None, content, recorded, apply_interrupted)
}

/// [`classify`], with messages naming the base state Secret `secret_name`
/// (e.g. `tfstate-default-web-1.tfm`).
pub fn classify_named(
    secret_name: &str,
    content: &StateContent,
    recorded: Option<&Fingerprint>,
    apply_interrupted: bool,
) -> Verdict {
    verdict(Some(secret_name), content, recorded, apply_interrupted)
}

fn verdict(
    secret_name: Option<&str>,
    content: &StateContent,
    recorded: Option<&Fingerprint>,
    apply_interrupted: bool,
) -> Verdict {
    let (secret, state) = match secret_name {
        Some(name) => (format!("state Secret {name}"), format!("state {name}")),
        None => ("the state Secret".to_string(), "the state".to_string()),
    };
    let unreadable = |reason, message| Verdict {
        readable: false,
        reason,
        managed_instances: None,
        lineage: None,
        serial: None,
        message,
    };
    let (lineage, serial, managed) = match content {
        StateContent::Missing => {
            return unreadable(
                StateReason::StateLost,
                format!(
                    "{secret} does not exist: if this object ever applied, what it created is no longer tracked; \
                     restore the state from its backup or a copy (see runbooks/StateLost.md)"
                ),
            );
        }
        StateContent::Corrupt { message } => {
            return unreadable(StateReason::StateCorrupt, message.clone());
        }
        StateContent::Encrypted {
            lineage,
            serial,
            message,
        } => {
            return Verdict {
                lineage: lineage.clone(),
                serial: *serial,
                ..unreadable(StateReason::StateEncrypted, message.clone())
            };
        }
        StateContent::Parsed {
            lineage,
            serial,
            managed_instances,
        } => (lineage, *serial, *managed_instances),
    };
    let inconsistent = |message: String| Verdict {
        readable: false,
        reason: StateReason::StateInconsistent,
        managed_instances: Some(managed),
        lineage: Some(lineage.clone()),
        serial: Some(serial),
        message,
    };
    let accept = "if it is the right state, accept it by setting both fingerprint annotations to its lineage \
                  and serial (see runbooks/StateInconsistent.md)";
    if let Some(rec) = recorded {
        if rec.lineage != *lineage {
            return inconsistent(format!(
                "{state} has lineage {lineage}, but the object recorded lineage {}: it is not the state this object \
                 applied; {accept}",
                rec.lineage
            ));
        }
        if serial < rec.serial {
            return inconsistent(format!(
                "{state} has serial {serial}, lower than the serial {} the object recorded: an older state was \
                 restored over a newer one, and what was created since is not in it; {accept}",
                rec.serial
            ));
        }
    }
    if managed == 0 && apply_interrupted {
        return inconsistent(format!(
            "{state} describes no managed resource instance, but the last apply was interrupted before Terraform \
             saved its state: what it created may still exist; find and import it, or delete it by hand, then \
             remove the apply-interrupted annotation (see runbooks/StateInconsistent.md)"
        ));
    }
    let instances = if managed == 1 {
        "1 managed resource instance".to_string()
    } else {
        format!("{managed} managed resource instances")
    };
    Verdict {
        readable: true,
        reason: StateReason::Readable,
        managed_instances: Some(managed),
        lineage: Some(lineage.clone()),
        serial: Some(serial),
        message: format!("{state} is readable: {instances}, lineage {lineage}, serial {serial}"),
    }
}
