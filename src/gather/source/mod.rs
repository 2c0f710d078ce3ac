//! One observation per pass, from one [`Source`]. What is read and in which order is
//! written once: the deletion's [`Observed`] in [`observe_pass`] (`object.rs`), and what
//! the apply table needs beside it (the Cluster API objects the gates and the module
//! contract read, whether a state exists, a provisioned machine's recorded values and its
//! TerraformCluster's hand-off) in [`observe_live`] and [`read_sources`]. Where it is read
//! from is the [`Source`]: the cluster (the manager's caches where it has them, else the
//! API server: the manager's pass and `captf explain`) or a dump ([`Dump`], `captf
//! explain -f`). So the manager and `explain` cannot disagree on what a pass saw, only on
//! what there was to see.

use std::collections::BTreeMap;
use std::future::Future;

use jiff::Timestamp;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Pod, Secret};
use kube::api::ObjectMeta;
use serde_json::{Map, Value};

mod dump;
mod object;

pub use dump::Dump;
pub use object::{StateRead, Subject, observe_object, observe_pass};

use super::apply::{
    ApplySources, ApplyStateSeen, apply_facts_seen, apply_observed, apply_state_seen,
    bootstrap_secret_name, capi_owner, handoff_readable, handoff_state, keeps_recorded_values,
    needs_handoff, no_handoff_state, owner_kind, provisioned, recorded_values,
};
use super::{Observed, Settings, StateWanted};
use crate::api::names::{self, Kind};
use crate::rules::apply::apply_state_needed;

/// Where a pass's observation reads. Each method reads one thing by name; none decides.
pub trait Source: Sync {
    type Error: Send;

    /// Whether Cluster API's Cluster kind is known: why not, when it is not served or its
    /// discovery failed (an object that names a Cluster is then held as paused).
    fn cluster_api(&self) -> Result<(), String>;

    /// The time the observation is made at.
    fn now(&self) -> Timestamp;

    /// The Jobs made for objects of `kind` named as `meta` says in its namespace: this
    /// object's and an earlier namesake's (another uid).
    fn jobs(
        &self,
        kind: Kind,
        meta: &ObjectMeta,
    ) -> impl Future<Output = Result<Vec<Job>, Self::Error>> + Send;

    /// Their Pods, read after the Jobs and from where the Jobs were read.
    fn pods(
        &self,
        kind: Kind,
        meta: &ObjectMeta,
    ) -> impl Future<Output = Result<Vec<Pod>, Self::Error>> + Send;

    /// Whether the CRD of `kind` is being deleted.
    fn crd_deleting(&self, kind: Kind) -> impl Future<Output = Result<bool, Self::Error>> + Send;

    /// Whether namespace `ns` is terminating.
    fn namespace_terminating(
        &self,
        ns: &str,
    ) -> impl Future<Output = Result<bool, Self::Error>> + Send;

    /// The TerraformMachines and TerraformMachinePools of Cluster `cluster` in `ns`, as
    /// `Kind/name`.
    fn dependents(
        &self,
        ns: &str,
        cluster: &str,
    ) -> impl Future<Output = Result<Vec<String>, Self::Error>> + Send;

    /// The uid of Cluster API's `kind` (`Machine`, `MachinePool`) `name` in `ns`, an owner
    /// of an object of kind `of`; none when it does not exist.
    fn owner_uid(
        &self,
        of: Kind,
        kind: &str,
        ns: &str,
        name: &str,
    ) -> impl Future<Output = Result<Option<String>, Self::Error>> + Send;

    /// Of `pods`, those still terminating after their grace period, by name: where they
    /// are stuck (their node and its state).
    fn stuck_pods(
        &self,
        pods: &[&Pod],
        now: Timestamp,
    ) -> impl Future<Output = Result<BTreeMap<String, String>, Self::Error>> + Send;

    /// Why the Pods of the unfinished Jobs of `jobs` that have none could not be made: the
    /// latest `FailedCreate` Event's message, by Job name.
    fn job_refusals(
        &self,
        ns: &str,
        jobs: &[Job],
        pods: &[Pod],
        now: Timestamp,
    ) -> impl Future<Output = Result<BTreeMap<String, String>, Self::Error>> + Send;

    /// The state of `o`, with what is read beside it ([`StateRead`]), as `wanted` says.
    fn state(
        &self,
        o: &Observed,
        wanted: StateWanted,
    ) -> impl Future<Output = Result<StateRead, Self::Error>> + Send;

    /// Reads into `o` its inputs Secret and the Secrets and ConfigMaps it and the spec
    /// reference, for a pass that read the state without them.
    fn inputs(&self, o: &mut Observed) -> impl Future<Output = Result<(), Self::Error>> + Send;

    /// Reads into `o` the Secrets and ConfigMaps its spec references (read live by the
    /// manager: an apply acts on them, and no cache holds them).
    fn referenced(&self, o: &mut Observed) -> impl Future<Output = Result<(), Self::Error>> + Send;

    /// The metadata of Secret `name` in `ns`, one of the state Secrets of an object of
    /// `kind` (whose controller's cache holds them).
    fn state_meta(
        &self,
        kind: Kind,
        ns: &str,
        name: &str,
    ) -> impl Future<Output = Result<Option<ObjectMeta>, Self::Error>> + Send;

    /// Cluster API's Cluster `name` in `ns`.
    fn cluster(
        &self,
        ns: &str,
        name: &str,
    ) -> impl Future<Output = Result<Option<Value>, Self::Error>> + Send;

    /// Cluster API's `kind` (`Machine`, `MachinePool`) `name` in `ns`.
    fn owner(
        &self,
        kind: &'static str,
        ns: &str,
        name: &str,
    ) -> impl Future<Output = Result<Option<Value>, Self::Error>> + Send;

    /// The bootstrap data Secret `name` in `ns`.
    fn bootstrap(
        &self,
        ns: &str,
        name: &str,
    ) -> impl Future<Output = Result<Option<Secret>, Self::Error>> + Send;

    /// The contract's values the inputs Secret of the pass's object records, when the
    /// pass did not read that Secret with its state.
    fn recorded(
        &self,
    ) -> impl Future<Output = Result<Option<Map<String, Value>>, Self::Error>> + Send;

    /// Whether TerraformCluster `name` in `ns` is provisioned (none: it does not exist).
    fn terraform_cluster_provisioned(
        &self,
        ns: &str,
        name: &str,
    ) -> impl Future<Output = Result<Option<bool>, Self::Error>> + Send;

    /// The `machine_inputs` output in TerraformCluster `name`'s state (its base Secret
    /// `base`, whose metadata is `meta`), or why it cannot be read.
    fn handoff_outputs(
        &self,
        ns: &str,
        name: &str,
        base: &str,
        meta: &ObjectMeta,
    ) -> impl Future<Output = Result<Result<Value, String>, Self::Error>> + Send;
}

/// A live object's pass's observation: the deletion's, what its pass read of the state,
/// and the apply table's sources.
pub struct LiveObservation {
    pub observed: Observed,
    pub state_seen: ApplyStateSeen,
    pub sources: ApplySources,
}

/// Observes a live object `o` (`state_seen`: what its pass read of the state; `latched`:
/// its status says provisioned): its sources ([`read_sources`]), then, when the table
/// would start an attempt on a state not read yet, the state (no apply starts against a
/// state that was lost or cannot be trusted, beside an errored state, or under another's
/// lock: row A11), and a provisioned machine's recorded values as that read found them
/// (an attempt starts from them, not from what an earlier pass kept).
pub async fn observe_live<S: Source>(
    source: &S,
    mut observed: Observed,
    mut state_seen: ApplyStateSeen,
    latched: bool,
    settings: &Settings,
) -> Result<LiveObservation, S::Error> {
    source.referenced(&mut observed).await?;
    let mut sources = read_sources(source, &observed, latched).await?;
    let seen = apply_observed(&observed, &sources);
    if apply_state_needed(&apply_facts_seen(&observed, &seen, &state_seen, settings)) {
        source
            .state(&observed, StateWanted::before_apply(&observed))
            .await?
            .apply(&mut observed, source.now());
        state_seen = apply_state_seen(&observed, settings);
        if keeps_recorded_values(observed.kind, provisioned(&observed.meta, latched)) {
            let ns = observed.meta.namespace.as_deref().unwrap_or_default();
            let name = observed.meta.name.as_deref().unwrap_or_default();
            sources.recorded = observed
                .inputs_secret
                .as_ref()
                .and_then(|s| recorded_values(s, ns, &names::state_suffix(observed.kind, name)));
        }
    }
    Ok(LiveObservation {
        observed,
        state_seen,
        sources,
    })
}

/// What the apply table needs of a live object `o` (`latched`: its status says
/// provisioned), read from `source` in one order: whether its state exists, its Cluster;
/// for a provisioned machine the values it recorded; else its owner, the bootstrap data
/// the owner names, and, once the gates before it are met, its TerraformCluster's
/// hand-off.
pub async fn read_sources<S: Source>(
    source: &S,
    o: &Observed,
    latched: bool,
) -> Result<ApplySources, S::Error> {
    let ns = o.meta.namespace.clone().unwrap_or_default();
    let name = o.meta.name.clone().unwrap_or_default();
    let suffix = names::state_suffix(o.kind, &name);
    let provisioned = provisioned(&o.meta, latched);
    let state_exists = source
        .state_meta(o.kind, &ns, &names::state_secret_name(&suffix))
        .await?
        .is_some();
    let cluster = match super::owning_cluster(&o.meta) {
        Some(c) => source.cluster(&ns, &c).await?,
        None => None,
    };
    let mut sources = ApplySources {
        latched,
        state_exists,
        cluster,
        ..Default::default()
    };
    if keeps_recorded_values(o.kind, provisioned) {
        sources.recorded = match &o.inputs_secret {
            // The pass read it already, with the state.
            Some(s) => recorded_values(s, &ns, &suffix),
            None => source.recorded().await?,
        };
    }
    if sources.recorded.is_some() {
        return Ok(sources);
    }
    if let Some((kind, owner)) = owner_kind(o.kind).zip(capi_owner(o.kind, &o.meta)) {
        sources.owner = source.owner(kind, &ns, &owner).await?;
    }
    let bootstrap = sources
        .owner
        .as_ref()
        .and_then(|v| bootstrap_secret_name(o.kind, v))
        .filter(|_| o.kind != Kind::TerraformCluster)
        .map(str::to_string);
    if let Some(b) = bootstrap {
        sources.bootstrap = source.bootstrap(&ns, &b).await?;
    }
    if needs_handoff(
        o,
        provisioned,
        sources.owner.as_ref(),
        sources.bootstrap.as_ref(),
    ) {
        sources.handoff = Some(handoff(source, &ns, sources.cluster.as_ref()).await?);
    }
    Ok(sources)
}

/// The `machine_inputs` of the TerraformCluster the Cluster names (`Ok(None)`: its
/// infrastructure is not a TerraformCluster), or why it cannot be read yet.
async fn handoff<S: Source>(
    source: &S,
    ns: &str,
    cluster: Option<&Value>,
) -> Result<Result<Option<Value>, String>, S::Error> {
    let Some((name, base)) = handoff_state(cluster) else {
        return Ok(Ok(None));
    };
    let meta = source.state_meta(Kind::TerraformCluster, ns, &base).await?;
    let cluster_provisioned = source.terraform_cluster_provisioned(ns, name).await?;
    if let Err(why) = handoff_readable(name, &base, meta.is_some(), cluster_provisioned) {
        return Ok(Err(why));
    }
    let Some(meta) = meta else {
        return Ok(Err(no_handoff_state(name, &base)));
    };
    Ok(source
        .handoff_outputs(ns, name, &base, &meta)
        .await?
        .map(Some))
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
    use serde_json::json;

    /// `team-a/prod`, a live TerraformMachine its Machine `web-1` controls, in Cluster
    /// `prod`.
    fn machine() -> Observed {
        let mut o = crate::testing::observed(Kind::TerraformMachine, &[]);
        o.meta.deletion_timestamp = None;
        o.meta.owner_references = Some(vec![OwnerReference {
            api_version: "cluster.x-k8s.io/v1beta2".into(),
            kind: "Machine".into(),
            name: "web-1".into(),
            uid: "machine-uid".into(),
            controller: Some(true),
            ..Default::default()
        }]);
        o.meta.labels = Some(
            [(
                names::CAPI_CLUSTER_NAME_LABEL.to_string(),
                "prod".to_string(),
            )]
            .into(),
        );
        o
    }

    fn capi(kind: &str, ns: &str, name: &str, spec: Value) -> Value {
        json!({"apiVersion": "cluster.x-k8s.io/v1beta2", "kind": kind,
               "metadata": {"namespace": ns, "name": name}, "spec": spec})
    }

    fn secret(ns: &str, name: &str) -> Secret {
        Secret {
            metadata: ObjectMeta {
                namespace: Some(ns.into()),
                name: Some(name.into()),
                ..Default::default()
            },
            ..Default::default()
        }
    }

    fn read(dump: &Dump) -> ApplySources {
        match futures::executor::block_on(read_sources(dump, &machine(), false)) {
            Ok(s) => s,
            Err(never) => match never {},
        }
    }

    /// The owner, then the bootstrap data it names, each found by kind, namespace and
    /// name; the same names in another namespace are not the object's.
    #[test]
    fn a_dump_gives_the_machine_its_cluster_owner_and_bootstrap_data_by_namespace() {
        let bootstrap = json!({"bootstrap": {"dataSecretName": "web-1-bootstrap"}});
        let clusters = [capi("Cluster", "team-a", "prod", json!({}))];
        let machines = [
            capi("Machine", "team-b", "web-1", bootstrap.clone()),
            capi("Machine", "team-a", "web-1", bootstrap),
        ];
        let secrets = [
            secret("team-b", "web-1-bootstrap"),
            secret("team-a", "web-1-bootstrap"),
        ];
        let dump = Dump {
            secrets: &secrets,
            clusters: &clusters,
            machines: &machines,
            ..Default::default()
        };
        let s = read(&dump);
        assert_eq!(s.cluster.as_ref(), Some(&clusters[0]));
        assert_eq!(s.owner.as_ref(), Some(&machines[1]));
        assert_eq!(
            s.bootstrap
                .as_ref()
                .and_then(|b| b.metadata.namespace.as_deref()),
            Some("team-a")
        );
        // Another namespace's only: none of them is read.
        let dump = Dump {
            secrets: &secrets[..1],
            clusters: &[],
            machines: &machines[..1],
            ..Default::default()
        };
        let s = read(&dump);
        assert!(s.cluster.is_none() && s.owner.is_none() && s.bootstrap.is_none());
    }

    /// State Secret `tfstate-default-<suffix>` of `team-a` holding a state of `resources`,
    /// gzipped as Terraform writes it.
    fn state_secret(suffix: &str, resources: Value) -> Secret {
        use std::io::Write;
        let state = json!({"version": 4, "serial": 2, "lineage": "lin-1", "resources": resources});
        let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        e.write_all(state.to_string().as_bytes()).expect("gzip");
        let mut s = secret("team-a", &names::state_secret_name(suffix));
        s.data = Some(
            [(
                names::TF_STATE_KEY.to_string(),
                k8s_openapi::ByteString(e.finish().expect("gzip")),
            )]
            .into(),
        );
        s
    }

    /// Once a destroy of this deletion succeeded, the pass reads the state without the
    /// inputs Secret (a state that lists nothing is cleaned up whatever the inputs say);
    /// a state that still lists an instance is followed by the inputs' read, so that what
    /// is decided on it has them; before any destroy succeeded they are read with the
    /// state.
    #[test]
    fn after_a_successful_destroy_the_inputs_are_read_only_for_a_state_that_lists_something() {
        let suffix = names::state_suffix(Kind::TerraformCluster, "prod");
        let complete = [("Complete", "True", "", "2026-12-01T11:00:00Z")];
        let observe = |attempt: &str, resources: Value| {
            let jobs = [crate::testing::job(
                Kind::TerraformCluster,
                "destroy",
                1,
                &complete,
            )];
            let secrets = [
                state_secret(&suffix, resources),
                secret("team-a", &names::inputs_secret_name(&suffix)),
            ];
            let dump = Dump {
                now: "2026-12-01T12:00:00Z".parse().expect("time"),
                jobs: &jobs,
                secrets: &secrets,
                ..Default::default()
            };
            let meta = crate::testing::meta(&[
                (names::APPLIED_AT, "2026-12-01T09:00:00Z"),
                (names::DELETION_UID, "uid-1"),
                (names::DESTROY_ATTEMPT, attempt),
            ]);
            let subject = Subject {
                kind: Kind::TerraformCluster,
                meta,
                spec: crate::testing::spec(),
                control_plane_endpoint: None,
            };
            match futures::executor::block_on(observe_pass(&dump, subject, &Settings::default())) {
                Ok((o, meta)) => {
                    assert!(meta.is_some_and(|m| m.is_some()), "the state was read");
                    o.inputs_secret.is_some()
                }
                Err(never) => match never {},
            }
        };
        let instance = json!([{"mode": "managed", "type": "terraform_data", "name": "vm",
            "instances": [{}]}]);
        assert!(!observe("1", json!([])), "an empty state after a destroy");
        assert!(
            observe("1", instance.clone()),
            "a state still listing an instance"
        );
        assert!(observe("0", json!([])), "no destroy of this deletion yet");
        assert!(observe("0", instance), "no destroy of this deletion yet");
    }

    /// The deletion's observation of a deleting TerraformCluster `team-a/prod` from a dump:
    /// its Jobs and an earlier namesake's apart, its machines as dependents, its Machine
    /// owner gone when the files hold it under another uid, the files' state read.
    #[test]
    fn a_dump_observes_a_deleting_object_as_the_manager_does() {
        let mut earlier = crate::testing::job(Kind::TerraformCluster, "destroy", 1, &[]);
        if let Some(l) = earlier.metadata.labels.as_mut() {
            l.insert(names::LABEL_OWNER_UID.into(), "uid-0".into());
        }
        let jobs = [
            crate::testing::job(Kind::TerraformCluster, "destroy", 2, &[]),
            earlier,
            // Another namespace's, of the same name: not the object's.
            {
                let mut j = crate::testing::job(Kind::TerraformCluster, "destroy", 3, &[]);
                j.metadata.namespace = Some("team-b".into());
                j
            },
        ];
        let mut meta = crate::testing::observed(Kind::TerraformCluster, &[]).meta;
        meta.labels = Some(
            [(
                names::CAPI_CLUSTER_NAME_LABEL.to_string(),
                "prod".to_string(),
            )]
            .into(),
        );
        meta.owner_references = Some(vec![OwnerReference {
            api_version: "cluster.x-k8s.io/v1beta2".into(),
            kind: "Machine".into(),
            name: "m-1".into(),
            uid: "machine-uid".into(),
            ..Default::default()
        }]);
        let mut machine = capi("Machine", "team-a", "m-1", json!({}));
        machine["metadata"]["uid"] = json!("another-uid");
        let machines = [machine];
        let state = secret("team-a", &names::state_secret_name("prod.tfc"));
        let secrets = [state];
        let dump = Dump {
            now: "2026-12-01T12:00:00Z".parse().expect("time"),
            jobs: &jobs,
            machines: &machines,
            secrets: &secrets,
            machines_of_clusters: vec![
                (
                    "team-a".into(),
                    "prod".into(),
                    "TerraformMachine/web-1".into(),
                ),
                (
                    "team-b".into(),
                    "prod".into(),
                    "TerraformMachine/web-9".into(),
                ),
            ],
            ..Default::default()
        };
        let subject = Subject {
            kind: Kind::TerraformCluster,
            meta,
            spec: crate::testing::spec(),
            control_plane_endpoint: None,
        };
        let (o, read) = match futures::executor::block_on(observe_object(&dump, subject, |_| true))
        {
            Ok(r) => r,
            Err(never) => match never {},
        };
        let names_of = |jobs: &[k8s_openapi::api::batch::v1::Job]| -> Vec<String> {
            jobs.iter()
                .filter_map(|j| j.metadata.name.clone())
                .collect()
        };
        assert_eq!(names_of(&o.jobs), ["captf-prod-tfc-destroy-2"]);
        assert_eq!(names_of(&o.earlier_jobs), ["captf-prod-tfc-destroy-1"]);
        assert_eq!(o.dependents, ["TerraformMachine/web-1"]);
        assert_eq!(o.owners_gone.len(), 1, "{:?}", o.owners_gone);
        assert!(o.owners_gone[0].contains("m-1"), "{:?}", o.owners_gone);
        assert!(!o.crd_deleting && !o.namespace_terminating);
        let read = read.expect("the state, read as asked");
        assert!(read.state_meta.is_some() && read.permit.is_none());
    }
}
