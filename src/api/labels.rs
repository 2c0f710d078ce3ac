//! The labels CAPTF puts on what it makes for an object (its Jobs, Pods and Secrets) and
//! the selectors that find them again; Terraform's own state labels. Built here and read
//! here: the label keys are in [`super::names`].

use std::collections::BTreeMap;

use super::names::{self, Kind};

/// One object as what CAPTF and Terraform make for it name it: its kind, namespace, name
/// and uid. The owner labels, the move label and the selectors of its Jobs, Pods and
/// Secrets are built from it, here and nowhere else.
#[derive(Clone, Copy, Debug)]
pub struct Identity<'a> {
    pub kind: Kind,
    pub namespace: &'a str,
    pub name: &'a str,
    /// Empty for an object that is not there (a state restored before its object is made):
    /// its labels then carry no uid.
    pub uid: &'a str,
}

impl Identity<'_> {
    /// Terraform's backend suffix of the object's state (`<name>.<short kind>`).
    pub fn suffix(&self) -> String {
        names::state_suffix(self.kind, self.name)
    }

    /// The owner labels (`A/owner-kind`, `A/owner-name`, `A/owner-uid`), on everything
    /// CAPTF makes for the object.
    pub fn owner_labels(&self) -> BTreeMap<String, String> {
        let mut labels = BTreeMap::from([
            (
                names::LABEL_OWNER_KIND.to_string(),
                self.kind.as_str().to_string(),
            ),
            (
                names::LABEL_OWNER_NAME.to_string(),
                name_label_value(self.name),
            ),
        ]);
        if !self.uid.is_empty() {
            labels.insert(names::LABEL_OWNER_UID.to_string(), self.uid.to_string());
        }
        labels
    }

    /// The owner labels and `clusterctl move`'s label: those of what moves with the object
    /// (its state, inputs and backup Secrets). The runner's backend configuration puts them
    /// on every state Secret it writes (its `labels` setting).
    pub fn moved_labels(&self) -> BTreeMap<String, String> {
        let mut labels = self.owner_labels();
        labels.insert(names::CLUSTERCTL_MOVE_LABEL.to_string(), String::new());
        labels
    }

    /// Everything Terraform's backend selects this object's state Secrets by: its own
    /// labels and the configured ones ([`Identity::moved_labels`]).
    pub fn state_labels(&self) -> BTreeMap<String, String> {
        let mut labels = terraform_state_labels(&self.suffix());
        labels.extend(self.moved_labels());
        labels
    }

    /// The label selector of everything CAPTF made for this object (by its uid).
    pub fn owned_selector(&self) -> String {
        format!("{}={}", names::LABEL_OWNER_UID, self.uid)
    }

    /// [`Identity::owned_selector`] but the errored states a runner kept (a cleanup leaves
    /// them for the operator).
    pub fn owned_but_errored_states_selector(&self) -> String {
        format!("{},!{}", self.owned_selector(), names::LABEL_ERRORED_STATE)
    }

    /// The label selector of the Jobs and Pods of every object of this kind and name, this
    /// one and earlier ones (whose finalizer was stripped, the object made again): their
    /// Terraform writes the same state.
    pub fn namesake_selector(&self) -> String {
        namesake_selector(self.kind, self.name)
    }
}

/// [`Identity::namesake_selector`] of the objects of `kind` named `name`, in any namespace
/// the list is made in.
pub fn namesake_selector(kind: Kind, name: &str) -> String {
    format!(
        "{}={},{}={}",
        names::LABEL_OWNER_KIND,
        kind.as_str(),
        names::LABEL_OWNER_NAME,
        name_label_value(name)
    )
}

/// The label selector of everything CAPTF made for objects of `kind`.
pub fn kind_selector(kind: Kind) -> String {
    format!("{}={}", names::LABEL_OWNER_KIND, kind.as_str())
}

/// The label selector of everything CAPTF made, for any object.
pub fn any_owner_selector() -> &'static str {
    names::LABEL_OWNER_KIND
}

/// The label selector of Terraform's state Secrets of `suffix` (its backend's own label).
pub fn suffix_selector(suffix: &str) -> String {
    format!("{}={suffix}", names::TF_LABEL_SUFFIX)
}

/// The label selector of every state Secret Terraform's backend wrote.
pub fn any_state_selector() -> String {
    format!("{}=true", names::TF_LABEL_STATE)
}

/// The label selector of the lock Leases Terraform's backend makes (it labels them as it
/// labels the state Secrets).
pub fn terraform_lock_selector() -> String {
    format!(
        "{}=true,{}=terraform",
        names::TF_LABEL_STATE,
        names::TF_LABEL_MANAGED_BY
    )
}

/// The label selector of Terraform's state Secrets that carry no owner labels (written by
/// hand, or before the backend's labels were set).
pub fn unowned_state_selector() -> String {
    format!(
        "{}=true,!{}",
        names::TF_LABEL_STATE,
        names::LABEL_OWNER_KIND
    )
}

/// The label selector of the copies an abandon made of the objects of namespace `ns`.
pub fn abandoned_from_selector(ns: &str) -> String {
    format!("{}={ns}", names::LABEL_SOURCE_NAMESPACE)
}

/// Cluster API's watch filter as a label selector (`--watch-filter`).
pub fn watch_filter_selector(filter: &str) -> String {
    format!("{}={filter}", names::CAPI_WATCH_FILTER_LABEL)
}

/// The label selector of Cluster API's objects of the Cluster `cluster`.
pub fn cluster_selector(cluster: &str) -> String {
    format!("{}={cluster}", names::CAPI_CLUSTER_NAME_LABEL)
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

/// The owner labels read back: what [`Identity::owner_labels`] wrote on a Job, Pod or Secret.
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
                let labels = Identity {
                    kind,
                    namespace: "ns",
                    name,
                    uid: "uid-1",
                }
                .owner_labels();
                let owner = labelled_owner(Some(&labels)).expect("an owner");
                assert_eq!(owner.kind, kind);
                assert_eq!(owner.uid, Some("uid-1"));
                assert!(owner.is_named(kind, name), "{name}");
                assert!(owner.name_label.len() <= 63);
            }
        }
        assert_eq!(labelled_owner(Some(&BTreeMap::new())), None);
    }

    /// Whether `labels` satisfy `selector`'s equality terms (`k=v`), existence terms (`k`)
    /// and absence terms (`!k`), as the API server reads them.
    fn selects(selector: &str, labels: &BTreeMap<String, String>) -> bool {
        selector.split(',').all(|term| match term.split_once('=') {
            Some((k, v)) => labels.get(k).map(String::as_str) == Some(v),
            None => match term.strip_prefix('!') {
                Some(k) => !labels.contains_key(k),
                None => labels.contains_key(term),
            },
        })
    }

    #[test]
    fn an_identity_selects_what_it_labels_and_nothing_of_another() {
        let long = format!("web-{}", "x".repeat(120));
        for name in ["web-1", long.as_str()] {
            let me = Identity {
                kind: Kind::TerraformMachine,
                namespace: "ns",
                name,
                uid: "uid-1",
            };
            let other = Identity {
                kind: Kind::TerraformMachinePool,
                uid: "uid-2",
                ..me
            };
            for labels in [me.owner_labels(), me.moved_labels(), me.state_labels()] {
                assert!(selects(&me.owned_selector(), &labels));
                assert!(selects(&me.owned_but_errored_states_selector(), &labels));
                let mut errored = labels.clone();
                errored.insert(names::LABEL_ERRORED_STATE.to_string(), "true".to_string());
                assert!(!selects(&me.owned_but_errored_states_selector(), &errored));
                assert!(selects(&me.namesake_selector(), &labels));
                assert!(selects(&kind_selector(me.kind), &labels));
                assert!(selects(any_owner_selector(), &labels));
                assert!(!selects(&other.owned_selector(), &labels));
                assert!(!selects(&other.namesake_selector(), &labels));
                assert!(!selects(&unowned_state_selector(), &labels));
            }
            let state = me.state_labels();
            assert!(selects(&suffix_selector(&me.suffix()), &state));
            assert!(selects(&any_state_selector(), &state));
            assert!(!selects(&suffix_selector(&other.suffix()), &state));
            assert_eq!(me.moved_labels()[names::CLUSTERCTL_MOVE_LABEL], "");
            assert!(!me.owner_labels().contains_key(names::CLUSTERCTL_MOVE_LABEL));
            // Terraform's own labels, without the owner's: a state written by hand.
            let by_hand = terraform_state_labels(&me.suffix());
            assert!(selects(&unowned_state_selector(), &by_hand));
            assert!(!selects(any_owner_selector(), &by_hand));
        }
    }

    #[test]
    fn an_object_that_is_not_there_is_labelled_without_a_uid() {
        let gone = Identity {
            kind: Kind::TerraformMachine,
            namespace: "ns",
            name: "web-1",
            uid: "",
        };
        let labels = gone.state_labels();
        assert!(!labels.contains_key(names::LABEL_OWNER_UID));
        assert!(selects(&gone.namesake_selector(), &labels));
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
