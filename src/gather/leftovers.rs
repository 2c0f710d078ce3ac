//! What CAPTF made for an object that is gone and is no longer anyone's: the finished
//! Jobs, their Pods and the attempts' variables Secrets of an object that left without a
//! cleanup (`clusterctl move` takes the object and its labelled Secrets, then deletes the
//! source copy with its finalizers stripped), and Terraform's lock Lease of a state that is
//! gone. One rule, pure, for the manager's sweep (which deletes them) and `captf orphans`
//! (which lists them).
//!
//! A thing is left over when its object (by kind and name, whatever the uid) is gone and
//! no state of that name is left either: a state still there may be adopted by an object
//! made again from its YAML (docs/08), whose earlier runners' Jobs the lock rule reads.
//! What has not finished (a Job, a Pod still running Terraform) is never left over.

use std::collections::BTreeSet;

use kube::api::ObjectMeta;

use crate::api::labels::{labelled_owner, name_label_value};
use crate::api::names::{self, Kind};

/// The objects and states of one namespace, as the owner labels name them.
#[derive(Clone, Debug, Default)]
pub struct Present {
    /// Each CAPTF object there: kind and owner-name label value.
    pub objects: BTreeSet<(Kind, String)>,
    /// Each object's state suffix (what its lock Lease is named after).
    pub suffixes: BTreeSet<String>,
    /// The owners (kind, owner-name label value) of the state Secrets there, and the
    /// suffixes of those states.
    pub state_owners: BTreeSet<(Kind, String)>,
    pub state_suffixes: BTreeSet<String>,
}

impl Present {
    /// Notes an object of `kind` named `name`.
    pub fn object(&mut self, kind: Kind, name: &str) {
        self.objects.insert((kind, name_label_value(name)));
        self.suffixes.insert(names::state_suffix(kind, name));
    }

    /// Notes a Secret: a state Secret (not an errored state's) is a state that is left.
    pub fn secret(&mut self, meta: &ObjectMeta) {
        let labels = meta.labels.as_ref();
        let is_state = labels.is_some_and(|l| {
            l.contains_key(names::TF_LABEL_STATE) && !l.contains_key(names::LABEL_ERRORED_STATE)
        });
        if !is_state {
            return;
        }
        if let Some(owner) = labelled_owner(labels) {
            self.state_owners
                .insert((owner.kind, owner.name_label.to_string()));
        }
        if let Some(s) = labels.and_then(|l| l.get(names::TF_LABEL_SUFFIX)) {
            self.state_suffixes.insert(s.clone());
        }
    }

    /// Whether a Job, Pod or variables Secret with `labels` is left over (see the module's
    /// documentation); `finished` says whether it has finished.
    pub fn left_over(&self, meta: &ObjectMeta, finished: bool) -> bool {
        let Some(owner) = labelled_owner(meta.labels.as_ref()) else {
            return false;
        };
        let key = (owner.kind, owner.name_label.to_string());
        finished && !self.objects.contains(&key) && !self.state_owners.contains(&key)
    }

    /// Whether the lock Lease named `lease` is of a state that is gone, whose object is gone.
    pub fn lease_left_over(&self, lease: &str) -> bool {
        let Some(suffix) = lease.strip_prefix(&format!("lock-tfstate-{}-", names::TF_WORKSPACE))
        else {
            return false;
        };
        names::parse_state_suffix(suffix).is_some()
            && !self.suffixes.contains(suffix)
            && !self.state_suffixes.contains(suffix)
    }
}

/// Whether a Secret is an attempt's variables Secret (named as its Job, with its labels).
pub fn is_variables_secret(meta: &ObjectMeta) -> bool {
    meta.labels.as_ref().is_some_and(|l| {
        l.contains_key(names::LABEL_OPERATION) && l.contains_key(names::LABEL_ATTEMPT)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn meta(labels: &[(&str, &str)]) -> ObjectMeta {
        ObjectMeta {
            labels: Some(
                labels
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect::<BTreeMap<_, _>>(),
            ),
            ..Default::default()
        }
    }

    fn owned(name: &str) -> ObjectMeta {
        meta(&[
            (names::LABEL_OWNER_KIND, "TerraformMachine"),
            (names::LABEL_OWNER_NAME, name),
            (names::LABEL_OWNER_UID, "u-1"),
            (names::LABEL_OPERATION, "apply"),
            (names::LABEL_ATTEMPT, "1"),
        ])
    }

    #[test]
    fn what_a_gone_object_left_is_left_over_once_its_state_is_gone_too() {
        let mut here = Present::default();
        assert!(here.left_over(&owned("web-1"), true));
        assert!(
            !here.left_over(&owned("web-1"), false),
            "a runner still runs"
        );
        assert!(here.lease_left_over("lock-tfstate-default-web-1.tfm"));
        // The object is there (under another uid, made again): not left over.
        here.object(Kind::TerraformMachine, "web-1");
        assert!(!here.left_over(&owned("web-1"), true));
        assert!(!here.lease_left_over("lock-tfstate-default-web-1.tfm"));
        // Its state is left, which an object may adopt: not left over.
        let mut states = Present::default();
        states.secret(&meta(&[
            (names::TF_LABEL_STATE, "true"),
            (names::TF_LABEL_SUFFIX, "web-1.tfm"),
            (names::LABEL_OWNER_KIND, "TerraformMachine"),
            (names::LABEL_OWNER_NAME, "web-1"),
        ]));
        assert!(!states.left_over(&owned("web-1"), true));
        assert!(!states.lease_left_over("lock-tfstate-default-web-1.tfm"));
        // An errored state is no state that is left.
        let mut errored = Present::default();
        errored.secret(&meta(&[
            (names::TF_LABEL_STATE, "true"),
            (names::LABEL_ERRORED_STATE, "true"),
            (names::TF_LABEL_SUFFIX, "errored-1-ab1cd.web-1.tfm"),
            (names::LABEL_OWNER_KIND, "TerraformMachine"),
            (names::LABEL_OWNER_NAME, "web-1"),
        ]));
        assert!(errored.left_over(&owned("web-1"), true));
        // Someone else's Lease.
        assert!(!here.lease_left_over("my-leader-election"));
        assert!(is_variables_secret(&owned("web-1")));
    }
}
