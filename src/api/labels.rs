//! The labels CAPTF puts on what it makes for an object (its Jobs, Pods and Secrets) and
//! the selectors that find them again; Terraform's own state labels. Built here and read
//! here: the label keys are in [`super::names`].

use std::collections::BTreeMap;

use super::names::{self, Kind};

/// The object that owns a Secret or Job, as its labels name it.
#[derive(Clone, Copy, Debug)]
pub struct OwnerRef<'a> {
    pub kind: Kind,
    pub name: &'a str,
    pub uid: &'a str,
    pub namespace: &'a str,
    pub suffix: &'a str,
}

/// A label value for an object name: the name itself when it fits in 63 characters,
/// otherwise cut and hashed like the state suffix (object names may have 253 characters;
/// label values may not). The uid label is what identifies the owner exactly.
pub fn name_label_value(name: &str) -> String {
    if name.len() <= 63 {
        name.to_string()
    } else {
        let cut: String = name.chars().take(49).collect();
        format!(
            "{}-{}",
            cut.trim_end_matches(['-', '.', '_']),
            names::short_hash(name)
        )
    }
}

/// The owner labels (`A/owner-kind`, `A/owner-name`, `A/owner-uid`).
pub fn owner_labels(kind: Kind, name: &str, uid: &str) -> BTreeMap<String, String> {
    BTreeMap::from([
        (
            names::LABEL_OWNER_KIND.to_string(),
            kind.as_str().to_string(),
        ),
        (names::LABEL_OWNER_NAME.to_string(), name_label_value(name)),
        (names::LABEL_OWNER_UID.to_string(), uid.to_string()),
    ])
}

/// The owner labels read back: what [`owner_labels`] wrote on a Job, Pod or Secret.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LabelledOwner<'a> {
    pub kind: Kind,
    /// The owner-name label: the name, or for a long one its cut-and-hashed stand-in.
    pub name_label: &'a str,
    pub uid: Option<&'a str>,
}

impl LabelledOwner<'_> {
    /// Whether the labels name the object `kind`/`name` (by its name label value).
    pub fn is_named(&self, kind: Kind, name: &str) -> bool {
        self.kind == kind && self.name_label == name_label_value(name)
    }
}

/// The owner the labels of `meta` name, when they carry the owner kind and name labels.
pub fn labelled_owner(labels: Option<&BTreeMap<String, String>>) -> Option<LabelledOwner<'_>> {
    let labels = labels?;
    Some(LabelledOwner {
        kind: Kind::parse(labels.get(names::LABEL_OWNER_KIND)?)?,
        name_label: labels.get(names::LABEL_OWNER_NAME)?,
        uid: labels.get(names::LABEL_OWNER_UID).map(String::as_str),
    })
}

/// The labels the runner's backend configuration adds to every state Secret it writes
/// (its `labels` setting): the owner labels and the move label.
pub fn backend_labels(kind: Kind, name: &str, uid: &str) -> BTreeMap<String, String> {
    let mut labels = owner_labels(kind, name, uid);
    labels.insert(names::CLUSTERCTL_MOVE_LABEL.to_string(), String::new());
    labels
}

/// Everything Terraform's backend selects this object's state Secrets by: its own labels
/// and the configured ones ([`backend_labels`]).
pub fn state_selector(kind: Kind, name: &str, uid: &str) -> BTreeMap<String, String> {
    let mut labels = terraform_state_labels(&names::state_suffix(kind, name));
    labels.extend(backend_labels(kind, name, uid));
    labels
}

/// The labels Terraform's backend puts on a state Secret of `suffix`, and selects the
/// state by (with its configured `labels` besides).
pub fn terraform_state_labels(suffix: &str) -> BTreeMap<String, String> {
    [
        (names::TF_LABEL_STATE, "true"),
        (names::TF_LABEL_SUFFIX, suffix),
        (names::TF_LABEL_WORKSPACE, names::TF_WORKSPACE),
        (names::TF_LABEL_MANAGED_BY, "terraform"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect()
}
/// The label selector of everything CAPTF made for one object.
pub fn owner_selector(uid: &str) -> String {
    format!("{}={uid}", names::LABEL_OWNER_UID)
}

/// The label selector of the Jobs and Pods of every object of this kind and name, this one
/// and earlier ones (whose finalizer was stripped, the object made again): their Terraform
/// writes the same state.
pub fn namesake_selector(kind: Kind, name: &str) -> String {
    format!(
        "{}={},{}={}",
        names::LABEL_OWNER_KIND,
        kind.as_str(),
        names::LABEL_OWNER_NAME,
        name_label_value(name)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn owner_labels_read_back_as_written_for_short_and_long_names() {
        let long = format!("web-{}", "x".repeat(120));
        for name in ["web-1", long.as_str()] {
            for kind in [
                Kind::TerraformCluster,
                Kind::TerraformMachine,
                Kind::TerraformMachinePool,
            ] {
                let labels = owner_labels(kind, name, "uid-1");
                let owner = labelled_owner(Some(&labels)).expect("an owner");
                assert_eq!(owner.kind, kind);
                assert_eq!(owner.uid, Some("uid-1"));
                assert!(owner.is_named(kind, name), "{name}");
                assert!(owner.name_label.len() <= 63);
            }
        }
        assert_eq!(labelled_owner(Some(&BTreeMap::new())), None);
    }

    #[test]
    fn a_state_suffix_reads_back_as_its_kind_and_name() {
        for kind in [
            Kind::TerraformCluster,
            Kind::TerraformMachine,
            Kind::TerraformMachinePool,
        ] {
            let suffix = names::state_suffix(kind, "web-1.prod");
            assert_eq!(
                names::parse_state_suffix(&suffix),
                Some((kind, "web-1.prod"))
            );
        }
        assert_eq!(names::parse_state_suffix("web-1.xyz"), None);
        assert_eq!(names::parse_state_suffix(".tfm"), None);
    }
}
