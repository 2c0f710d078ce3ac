//! The label sets of the families, typed (`EncodeLabelSet`): a label's name is a field's,
//! its values are the field's type's, and a family cannot be given a label it does not
//! have.

use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue, LabelValueEncoder};

use crate::api::names::Kind;

/// A condition's reason as a label value: the manager writes reasons from its own
/// constants (CamelCase words); anything else (a status edited by hand) counts as
/// `Other`, so that the label stays bounded.
#[derive(Clone, Debug, Hash, PartialEq, Eq, PartialOrd, Ord)]
pub struct Reason(String);

impl Reason {
    pub fn new(why: &str) -> Reason {
        let word = !why.is_empty()
            && why.len() <= 64
            && why.starts_with(|c: char| c.is_ascii_uppercase())
            && why.chars().all(|c| c.is_ascii_alphanumeric());
        Reason(if word { why } else { "Other" }.to_string())
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl EncodeLabelValue for Reason {
    fn encode(&self, encoder: &mut LabelValueEncoder) -> Result<(), std::fmt::Error> {
        std::fmt::Write::write_str(encoder, &self.0)
    }
}

/// The object's kind as a label value (`TerraformMachine`).
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, PartialOrd, Ord)]
pub struct KindValue(pub Kind);

impl EncodeLabelValue for KindValue {
    fn encode(&self, encoder: &mut LabelValueEncoder) -> Result<(), std::fmt::Error> {
        std::fmt::Write::write_str(encoder, self.0.as_str())
    }
}

/// `kind`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ByKind {
    pub kind: KindValue,
}

/// `kind`, `reason`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ByReason {
    pub kind: KindValue,
    pub reason: Reason,
}

/// `kind`, `reason`, for the counters, whose reasons are the manager's own constants.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ByCause {
    pub kind: KindValue,
    pub reason: String,
}

impl ByCause {
    pub fn new(kind: Kind, reason: &str) -> ByCause {
        ByCause {
            kind: KindValue(kind),
            reason: reason.to_string(),
        }
    }
}

/// `kind`, `error` (what made a pass fail: `conflict`, `api`, `setup`, …).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ByError {
    pub kind: KindValue,
    pub error: String,
}

/// `kind`, `row` (a deletion's rule-table row, `abandon`, or `none`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ByRow {
    pub kind: KindValue,
    pub row: String,
}

/// `state` (of a Cluster's disposal).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ByState {
    pub state: &'static str,
}

/// `kind`, `operation` (`apply`, `destroy`), `outcome` (`succeeded`, `failed`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ByJob {
    pub kind: KindValue,
    pub operation: &'static str,
    pub outcome: &'static str,
}

/// `role` (of an orphaned Secret: `state`, `inputs`, `backup`, …).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ByRole {
    pub role: String,
}

impl ByKind {
    pub fn of(kind: Kind) -> ByKind {
        ByKind {
            kind: KindValue(kind),
        }
    }
}

/// `outcome`: how a workload cleanup ended (`CleanedUp`, `GaveUp`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ByOutcome {
    pub outcome: Reason,
}

/// `step`: a workload cleanup's step (`Webhooks`, `ExtendedAPIs`, `Resources`,
/// `Snapshots`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ByStep {
    pub step: Reason,
}
