//! Observing one object from the API server into an [`Observed`]: the cheap part first
//! (Jobs, Pods, Cluster, CRD, Namespace, dependents), and the Secrets only when the rule
//! table needs the state. Secrets are read on demand, never cached whole.

use std::collections::BTreeMap;

use jiff::Timestamp;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Pod, Secret};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::ResourceExt;
use kube::api::{Api, DynamicObject, ListParams};

use kube::Client;
use kube::api::ApiResource;

use super::Error;
use crate::api::names::{self, Kind};
use crate::api::{TerraformMachine, TerraformMachinePool, TerraformObject, VariablesSourceKind};
use crate::facts::{self, ClusterView, Observed};
use crate::inputs;
use crate::state::StateSecrets;

/// The label selector of everything CAPTF made for one object.
pub fn owner_selector(uid: &str) -> String {
    format!("{}={uid}", names::LABEL_OWNER_UID)
}

/// Observes everything but the Secrets and the lock.
pub async fn observe<K: TerraformObject>(
    client: &Client,
    cluster_api: Option<&ApiResource>,
    obj: &K,
) -> Result<Observed, Error> {
    let meta = obj.meta().clone();
    let ns = obj.namespace().unwrap_or_default();
    let uid = meta.uid.clone().unwrap_or_default();
    let client = client.clone();
    let lp = ListParams::default().labels(&owner_selector(&uid));
    // The Jobs before the Pods (a Pod listed first could belong to a Job created after);
    // the other reads are independent of them and of each other, and run at the same time.
    let jobs_and_pods = async {
        let jobs = Api::<Job>::namespaced(client.clone(), &ns)
            .list(&lp)
            .await?
            .items;
        let pods = Api::<Pod>::namespaced(client.clone(), &ns)
            .list(&lp)
            .await?
            .items;
        Ok::<_, Error>((jobs, pods))
    };
    let cluster_name = facts::owning_cluster(&meta);
    let cluster = async {
        Ok::<_, Error>(match (&cluster_name, cluster_api) {
            (Some(name), Some(ar)) => {
                Api::<DynamicObject>::namespaced_with(client.clone(), &ns, ar)
                    .get_opt(name)
                    .await?
                    .map(|c| ClusterView::from_value(&serde_json::to_value(&c).unwrap_or_default()))
            }
            _ => None,
        })
    };
    let crd_deleting = async {
        Ok::<_, Error>(
            // A failed read fails the pass: it must never count as "the CRD is not being
            // deleted", or a transient error during an uninstall would start a destroy.
            Api::<CustomResourceDefinition>::all(client.clone())
                .get_opt(&K::KIND.crd_name())
                .await?
                .is_some_and(|c| c.metadata.deletion_timestamp.is_some()),
        )
    };
    let namespace_terminating = async {
        Ok::<_, Error>(
            Api::<Namespace>::all(client.clone())
                .get_opt(&ns)
                .await?
                .is_some_and(|n| {
                    n.metadata.deletion_timestamp.is_some()
                        || n.status.and_then(|s| s.phase).as_deref() == Some("Terminating")
                }),
        )
    };
    let dependents = async {
        if K::KIND == Kind::TerraformCluster && meta.deletion_timestamp.is_some() {
            match &cluster_name {
                Some(c) => dependents(&client, &ns, c).await,
                None => Ok(Vec::new()),
            }
        } else {
            Ok(Vec::new())
        }
    };
    let ((jobs, pods), cluster, crd_deleting, namespace_terminating, dependents) = futures::try_join!(
        jobs_and_pods,
        cluster,
        crd_deleting,
        namespace_terminating,
        dependents
    )?;
    Ok(Observed {
        kind: K::KIND,
        meta,
        spec: obj.terraform().clone(),
        cluster,
        crd_deleting,
        namespace_terminating,
        jobs,
        pods,
        dependents,
        state: None,
        inputs_secret: None,
        referenced_secrets: BTreeMap::new(),
        referenced_config_maps: BTreeMap::new(),
        lock: None,
        now: Timestamp::now(),
    })
}

/// The machines and pools of a cluster, listed live whatever `--watch-filter` says.
async fn dependents(client: &Client, ns: &str, cluster: &str) -> Result<Vec<String>, Error> {
    let lp = ListParams::default().labels(&format!("{}={cluster}", names::CAPI_CLUSTER_NAME_LABEL));
    let mut out = Vec::new();
    for m in Api::<TerraformMachine>::namespaced(client.clone(), ns)
        .list(&lp)
        .await?
        .items
    {
        out.push(format!("TerraformMachine/{}", m.name_any()));
    }
    for p in Api::<TerraformMachinePool>::namespaced(client.clone(), ns)
        .list(&lp)
        .await?
        .items
    {
        out.push(format!("TerraformMachinePool/{}", p.name_any()));
    }
    Ok(out)
}

/// Reads the state Secrets, the inputs Secret, what they reference, and the lock.
pub async fn observe_secrets(client: &Client, o: &mut Observed) -> Result<(), Error> {
    let ns = o.meta.namespace.clone().unwrap_or_default();
    let name = o.meta.name.clone().unwrap_or_default();
    let suffix = names::state_suffix(o.kind, &name);
    let secrets = Api::<Secret>::namespaced(client.clone(), &ns);
    o.state =
        Some(read_chunked(&secrets, &names::state_secret_name(&suffix), Some(&suffix)).await?);
    o.inputs_secret = secrets.get_opt(&names::inputs_secret_name(&suffix)).await?;

    // Names the inputs (or, without them, the spec) reference.
    let mut secret_names: Vec<String> = o
        .spec
        .env
        .iter()
        .map(|e| e.secret_key_ref.name.clone())
        .collect();
    let mut config_maps = Vec::new();
    for v in &o.spec.variables_from {
        match v.kind {
            VariablesSourceKind::Secret => secret_names.push(v.name.clone()),
            VariablesSourceKind::ConfigMap => config_maps.push(v.name.clone()),
        }
    }
    if let Some(Ok(i)) = o
        .inputs_secret
        .as_ref()
        .map(|s| inputs::from_secret(s, &ns, &suffix))
    {
        secret_names.extend(i.env.iter().map(|e| e.secret_key_ref.name.clone()));
    }
    secret_names.sort();
    secret_names.dedup();
    for s in secret_names {
        if let Some(secret) = secrets.get_opt(&s).await? {
            o.referenced_secrets.insert(s, secret);
        }
    }
    let cms = Api::<ConfigMap>::namespaced(client.clone(), &ns);
    for c in config_maps {
        if let Some(cm) = cms.get_opt(&c).await? {
            o.referenced_config_maps.insert(c, cm);
        }
    }
    o.lock = Api::<Lease>::namespaced(client.clone(), &ns)
        .get_opt(&names::lock_lease_name(&suffix))
        .await?;
    o.now = Timestamp::now();
    Ok(())
}

/// Reads a chunked Secret (a state or a backup) and its parts. Parts are listed by
/// Terraform's suffix label when there is one, and fetched by name up to the first gap.
pub async fn read_chunked(
    secrets: &Api<Secret>,
    base: &str,
    tf_suffix: Option<&str>,
) -> Result<StateSecrets, Error> {
    let mut found: Vec<Secret> = Vec::new();
    if let Some(s) = secrets.get_opt(base).await? {
        found.push(s);
    } else {
        return Ok(StateSecrets::from_secrets(base, &[]));
    }
    if let Some(suffix) = tf_suffix {
        let lp = ListParams::default().labels(&format!("{}={suffix}", names::TF_LABEL_SUFFIX));
        for s in secrets.list(&lp).await?.items {
            if s.metadata
                .name
                .as_deref()
                .is_some_and(|n| names::part_index(base, n).is_some())
            {
                found.push(s);
            }
        }
    } else {
        let mut n = 1;
        while let Some(s) = secrets.get_opt(&names::part_secret_name(base, n)).await? {
            found.push(s);
            n += 1;
        }
    }
    Ok(StateSecrets::from_secrets(base, &found))
}
