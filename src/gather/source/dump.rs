//! A dump as a [`Source`] (`captf explain -f`): what the files hold, and nothing else.

use std::collections::BTreeMap;

use jiff::Timestamp;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Pod, Secret};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::ObjectMeta;
use serde_json::{Map, Value};

use super::{Source, StateRead};
use crate::api::names::{self, Kind};
use crate::gather::apply::handoff_of;
use crate::gather::{self, Observed, StateWanted};
use crate::state::{Errored, StateSecrets};

/// What the files hold, by kind. A TerraformCluster the files do not hold is taken as
/// provisioned when its state is there (the files say nothing of its apply; its state
/// alone decides). Nodes and Events are not read from dumps: a Pod stuck on a lost node
/// shows as unfinished, and a Job's refused Pods say nothing.
#[derive(Default)]
pub struct Dump<'a> {
    /// The time the files are explained at.
    pub now: Timestamp,
    pub secrets: &'a [Secret],
    pub config_maps: &'a [ConfigMap],
    pub leases: &'a [Lease],
    pub jobs: &'a [Job],
    pub pods: &'a [Pod],
    pub crds: &'a [CustomResourceDefinition],
    pub namespaces: &'a [Namespace],
    pub clusters: &'a [Value],
    pub machines: &'a [Value],
    /// Whether each TerraformCluster of the files is provisioned: (namespace, name, it).
    pub terraform_clusters: Vec<(String, String, bool)>,
    /// The TerraformMachines and TerraformMachinePools of the files: (namespace, the
    /// Cluster their label names, `Kind/name`).
    pub machines_of_clusters: Vec<(String, String, String)>,
}

impl Dump<'_> {
    fn secret(&self, ns: &str, name: &str) -> Option<&Secret> {
        self.secrets.iter().find(|s| {
            s.metadata.namespace.as_deref() == Some(ns) && s.metadata.name.as_deref() == Some(name)
        })
    }

    fn secrets_in(&self, ns: &str) -> impl Iterator<Item = &Secret> {
        self.secrets
            .iter()
            .filter(move |s| s.metadata.namespace.as_deref() == Some(ns))
    }
}

fn named<'v>(items: &'v [Value], kind: Option<&str>, ns: &str, name: &str) -> Option<&'v Value> {
    items.iter().find(|v| {
        kind.is_none_or(|k| v["kind"].as_str() == Some(k))
            && v["metadata"]["name"].as_str() == Some(name)
            && v["metadata"]["namespace"].as_str() == Some(ns)
    })
}

/// The items of `items` in the object's namespace made for it or an earlier namesake.
fn namesakes<T: kube::Resource + Clone>(items: &[T], kind: Kind, meta: &ObjectMeta) -> Vec<T> {
    items
        .iter()
        .filter(|i| {
            let m = i.meta();
            m.namespace == meta.namespace
                && (gather::owned_by(kind, meta, m) || gather::of_earlier_namesake(kind, meta, m))
        })
        .cloned()
        .collect()
}

impl Dump<'_> {
    /// The files' inputs Secret of `o` and, as what the spec references, every Secret and
    /// ConfigMap of the namespace (found by name).
    fn inputs_of(&self, o: &Observed) -> (Option<Secret>, ByName<Secret>, ByName<ConfigMap>) {
        let ns = o.meta.namespace.clone().unwrap_or_default();
        let suffix = names::state_suffix(o.kind, o.meta.name.as_deref().unwrap_or_default());
        let by_name = |s: &Secret| (s.metadata.name.clone().unwrap_or_default(), s.clone());
        (
            self.secret(&ns, &names::inputs_secret_name(&suffix))
                .cloned(),
            self.secrets_in(&ns).map(by_name).collect(),
            self.config_maps
                .iter()
                .filter(|c| c.metadata.namespace.as_deref() == Some(ns.as_str()))
                .map(|c| (c.metadata.name.clone().unwrap_or_default(), c.clone()))
                .collect(),
        )
    }
}

type ByName<T> = BTreeMap<String, T>;

impl Source for Dump<'_> {
    type Error = std::convert::Infallible;

    fn cluster_api(&self) -> Result<(), String> {
        Ok(())
    }

    fn now(&self) -> Timestamp {
        self.now
    }

    async fn jobs(&self, kind: Kind, meta: &ObjectMeta) -> Result<Vec<Job>, Self::Error> {
        Ok(namesakes(self.jobs, kind, meta))
    }

    async fn pods(&self, kind: Kind, meta: &ObjectMeta) -> Result<Vec<Pod>, Self::Error> {
        Ok(namesakes(self.pods, kind, meta))
    }

    async fn crd_deleting(&self, kind: Kind) -> Result<bool, Self::Error> {
        Ok(self.crds.iter().any(|c| {
            c.metadata.name.as_deref() == Some(kind.crd_name().as_str())
                && c.metadata.deletion_timestamp.is_some()
        }))
    }

    async fn namespace_terminating(&self, ns: &str) -> Result<bool, Self::Error> {
        Ok(self.namespaces.iter().any(|n| {
            n.metadata.name.as_deref() == Some(ns)
                && (n.metadata.deletion_timestamp.is_some()
                    || n.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Terminating"))
        }))
    }

    async fn dependents(&self, ns: &str, cluster: &str) -> Result<Vec<String>, Self::Error> {
        Ok(self
            .machines_of_clusters
            .iter()
            .filter(|(n, c, _)| n == ns && c == cluster)
            .map(|(_, _, m)| m.clone())
            .collect())
    }

    async fn owner_uid(
        &self,
        _of: Kind,
        kind: &str,
        ns: &str,
        name: &str,
    ) -> Result<Option<String>, Self::Error> {
        Ok(named(self.machines, Some(kind), ns, name).map(|v| {
            v["metadata"]["uid"]
                .as_str()
                .unwrap_or_default()
                .to_string()
        }))
    }

    async fn stuck_pods(
        &self,
        _pods: &[&Pod],
        _now: Timestamp,
    ) -> Result<BTreeMap<String, String>, Self::Error> {
        Ok(BTreeMap::new())
    }

    async fn job_refusals(
        &self,
        _ns: &str,
        _jobs: &[Job],
        _pods: &[Pod],
        _now: Timestamp,
    ) -> Result<BTreeMap<String, String>, Self::Error> {
        Ok(BTreeMap::new())
    }

    /// The files' state of `o`, its errored states, the variables of an apply whose end
    /// is to be recorded, the lock, and with `inputs` its inputs Secret and, as what the
    /// spec references, every Secret and ConfigMap of the namespace (found by name).
    /// A dump holds what there is: read whatever `wanted` says (a state
    /// [`StateWanted::FirstApply`] could take as absent is absent from the dump too).
    async fn state(&self, o: &Observed, wanted: StateWanted) -> Result<StateRead, Self::Error> {
        let inputs = wanted.inputs();
        let ns = o.meta.namespace.clone().unwrap_or_default();
        let name = o.meta.name.clone().unwrap_or_default();
        let suffix = names::state_suffix(o.kind, &name);
        let in_ns: Vec<Secret> = self.secrets_in(&ns).cloned().collect();
        let base = names::state_secret_name(&suffix);
        let attempt_secret = gather::apply::unrecorded_apply(o)
            .map(|u| names::job_name(&suffix, names::OPERATION_APPLY, u.attempt))
            .and_then(|job| self.secret(&ns, &job).cloned());
        let lock_name = names::lock_lease_name(&suffix);
        let (inputs_secret, referenced_secrets, referenced_config_maps) = match inputs {
            true => self.inputs_of(o),
            false => Default::default(),
        };
        Ok(StateRead {
            inputs_read: inputs,
            permit: None,
            state: StateSecrets::from_secrets(&base, &in_ns),
            errored: Errored::find(&suffix, &in_ns),
            state_meta: self.secret(&ns, &base).map(|s| s.metadata.clone()),
            inputs_secret,
            attempt_secret,
            referenced_secrets,
            referenced_config_maps,
            lock: self
                .leases
                .iter()
                .find(|l| {
                    l.metadata.namespace.as_deref() == Some(ns.as_str())
                        && l.metadata.name.as_deref() == Some(lock_name.as_str())
                })
                .cloned(),
        })
    }

    async fn inputs(&self, o: &mut Observed) -> Result<(), Self::Error> {
        (
            o.inputs_secret,
            o.referenced_secrets,
            o.referenced_config_maps,
        ) = self.inputs_of(o);
        Ok(())
    }

    async fn referenced(&self, _o: &mut Observed) -> Result<(), Self::Error> {
        // Read with the state: a dump's observation always reads it.
        Ok(())
    }

    async fn state_meta(
        &self,
        _kind: Kind,
        ns: &str,
        name: &str,
    ) -> Result<Option<ObjectMeta>, Self::Error> {
        Ok(self.secret(ns, name).map(|s| s.metadata.clone()))
    }

    async fn cluster(&self, ns: &str, name: &str) -> Result<Option<Value>, Self::Error> {
        Ok(named(self.clusters, None, ns, name).cloned())
    }

    async fn owner(
        &self,
        kind: &'static str,
        ns: &str,
        name: &str,
    ) -> Result<Option<Value>, Self::Error> {
        Ok(named(self.machines, Some(kind), ns, name).cloned())
    }

    async fn bootstrap(&self, ns: &str, name: &str) -> Result<Option<Secret>, Self::Error> {
        Ok(self.secret(ns, name).cloned())
    }

    async fn recorded(&self) -> Result<Option<Map<String, Value>>, Self::Error> {
        // A dump's inputs Secret is in the observation already, or not in the files.
        Ok(None)
    }

    async fn terraform_cluster_provisioned(
        &self,
        ns: &str,
        name: &str,
    ) -> Result<Option<bool>, Self::Error> {
        let known = self
            .terraform_clusters
            .iter()
            .find(|(n, c, _)| n == ns && c == name)
            .map(|(_, _, p)| *p);
        Ok(known.or(Some(true)))
    }

    async fn handoff_outputs(
        &self,
        ns: &str,
        name: &str,
        base: &str,
        _meta: &ObjectMeta,
    ) -> Result<Result<Value, String>, Self::Error> {
        let in_ns: Vec<Secret> = self.secrets_in(ns).cloned().collect();
        Ok(handoff_of(name, &StateSecrets::from_secrets(base, &in_ns)))
    }
}
