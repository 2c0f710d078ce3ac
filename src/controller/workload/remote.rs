//! The workload cluster, as the cleanup reaches it: a client from the Cluster's
//! `<cluster>-kubeconfig` Secret (inline credentials only), metadata-only lists of each
//! step's kinds, and the deletes and finalizer removals [`crate::rules::workload::Act`]
//! asks for. Failures are data ([`Failure`]): the pass records them and gives up after a
//! bounded time.

use std::collections::BTreeSet;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Namespace, Secret};
use kube::api::{
    Api, ApiResource, DeleteParams, DynamicObject, GroupVersionKind, ListParams, Patch, PatchParams,
};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::core::PartialObjectMeta;
use kube::{Client, Config};
use serde_json::json;

use crate::rules::workload::{Act, Object, SNAPSHOT_GROUP, Target};

/// The largest kubeconfig read from the Secret: a CAPI kubeconfig is a few kilobytes.
pub const MAX_KUBECONFIG_BYTES: usize = 256 * 1024;
/// At most this many objects of one kind that the cleanup acts on are kept in one pass
/// (the rest are reached by the passes after, as those deleted go), from at most
/// [`MAX_PAGES`] pages of 500 (objects left alone are read and dropped).
const MAX_OBJECTS_PER_KIND: usize = 5_000;
const MAX_PAGES: usize = 200;
const PAGE: u32 = 500;

/// Why the workload cluster could not be cleaned up in this pass.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Failure {
    /// Not reached at all (no kubeconfig, no connection, a server error), as against
    /// reached and refused (a missing permission, a webhook).
    pub unreachable: bool,
    pub message: String,
}

impl Failure {
    fn unreachable(message: String) -> Failure {
        Failure {
            unreachable: true,
            message,
        }
    }

    fn of(what: &str, e: kube::Error) -> Failure {
        match &e {
            kube::Error::Api(s) if (400..500).contains(&s.code) && s.code != 429 => Failure {
                unreachable: false,
                message: format!("{what}: {e}"),
            },
            _ => Failure::unreachable(format!("{what}: {e}")),
        }
    }
}

/// A client of the workload cluster of Cluster `cluster` in `ns`, from its kubeconfig
/// Secret, which Cluster API's control-plane providers write.
pub async fn connect(manager: &Client, ns: &str, cluster: &str) -> Result<Client, Failure> {
    let name = format!("{cluster}-kubeconfig");
    let secret = Api::<Secret>::namespaced(manager.clone(), ns)
        .get_opt(&name)
        .await
        .map_err(|e| Failure::unreachable(format!("reading Secret {ns}/{name}: {e}")))?
        .ok_or_else(|| {
            Failure::unreachable(format!(
                "Secret {ns}/{name} (the workload cluster's kubeconfig) does not exist"
            ))
        })?;
    let bytes = secret
        .data
        .as_ref()
        .and_then(|d| d.get("value"))
        .map(|b| b.0.as_slice())
        .ok_or_else(|| Failure::unreachable(format!("Secret {ns}/{name} has no key `value`")))?;
    let config = config_of(bytes).map_err(|why| {
        Failure::unreachable(format!("the kubeconfig in Secret {ns}/{name}: {why}"))
    })?;
    let config = config.await.map_err(|why| {
        Failure::unreachable(format!("the kubeconfig in Secret {ns}/{name}: {why}"))
    })?;
    Client::try_from(config).map_err(|e| {
        Failure::unreachable(format!(
            "a client from the kubeconfig in Secret {ns}/{name}: {e}"
        ))
    })
}

/// The client configuration of a kubeconfig's current context, refused when it is too
/// large or names anything but inline credentials: a kubeconfig that runs a program
/// (`exec`, `auth-provider`) or reads a file of the manager's would run or read it in the
/// manager.
fn config_of(
    bytes: &[u8],
) -> Result<impl std::future::Future<Output = Result<Config, String>>, String> {
    if bytes.len() > MAX_KUBECONFIG_BYTES {
        return Err(format!(
            "{} bytes, more than the {MAX_KUBECONFIG_BYTES} read",
            bytes.len()
        ));
    }
    let text = std::str::from_utf8(bytes).map_err(|_| "not UTF-8".to_string())?;
    let kubeconfig = Kubeconfig::from_yaml(text).map_err(|e| e.to_string())?;
    for a in &kubeconfig.auth_infos {
        if let Some(auth) = &a.auth_info {
            let refused = [
                (auth.exec.is_some(), "exec"),
                (auth.auth_provider.is_some(), "auth-provider"),
                (auth.token_file.is_some(), "tokenFile"),
                (auth.client_certificate.is_some(), "client-certificate"),
                (auth.client_key.is_some(), "client-key"),
            ];
            if let Some((_, field)) = refused.iter().find(|(set, _)| *set) {
                return Err(format!(
                    "user {:?} has `{field}`: only inline credentials are used",
                    a.name
                ));
            }
        }
    }
    for c in &kubeconfig.clusters {
        if c.cluster
            .as_ref()
            .is_some_and(|c| c.certificate_authority.is_some())
        {
            return Err(format!(
                "cluster {:?} has `certificate-authority` (a file): only inline data is used",
                c.name
            ));
        }
    }
    Ok(async move {
        let mut config = Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
            .await
            .map_err(|e| e.to_string())?;
        config.connect_timeout = Some(Duration::from_secs(5));
        config.read_timeout = Some(Duration::from_secs(20));
        config.write_timeout = Some(Duration::from_secs(20));
        Ok(config)
    })
}

fn resource(t: &Target) -> ApiResource {
    ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(t.group, t.version, t.kind), t.plural)
}

/// The metadata of `api`'s objects, page by page (at most [`MAX_PAGES`]), each page's
/// items handed to `take`, until it says it has enough; `Ok(false)` when the kind is not
/// served (404) and `missing_ok`.
async fn pages<K>(
    api: &Api<K>,
    what: &str,
    missing_ok: bool,
    mut take: impl FnMut(Vec<PartialObjectMeta<K>>) -> bool,
) -> Result<(), Failure>
where
    K: Clone + serde::de::DeserializeOwned + std::fmt::Debug + kube::Resource,
{
    let mut token: Option<String> = None;
    for _ in 0..MAX_PAGES {
        let mut lp = ListParams::default().limit(PAGE);
        if let Some(tok) = token.take() {
            lp = lp.continue_token(&tok);
        }
        let page = match api.list_metadata(&lp).await {
            Ok(p) => p,
            Err(kube::Error::Api(s)) if s.code == 404 && missing_ok => return Ok(()),
            Err(e) => return Err(Failure::of(&format!("listing {what}"), e)),
        };
        let enough = take(page.items);
        match page.metadata.continue_ {
            Some(tok) if !tok.is_empty() && !enough => token = Some(tok),
            _ => return Ok(()),
        }
    }
    Ok(())
}

/// The namespaces of the workload cluster (their names).
pub async fn namespaces(client: &Client) -> Result<BTreeSet<String>, Failure> {
    let api = Api::<Namespace>::all(client.clone());
    let mut out = BTreeSet::new();
    pages(&api, "the workload cluster's Namespaces", false, |items| {
        out.extend(items.into_iter().filter_map(|n| n.metadata.name));
        false
    })
    .await?;
    Ok(out)
}

/// The objects of kind `t` in the workload cluster that `wanted` keeps (metadata only);
/// none when a snapshot kind is not served there (their CRDs are optional). Any other
/// kind not found is a failure: every API server serves them.
pub async fn list(
    client: &Client,
    t: &Target,
    wanted: impl Fn(&Object) -> bool,
) -> Result<Vec<Object>, Failure> {
    let api = Api::<DynamicObject>::all_with(client.clone(), &resource(t));
    let mut out = Vec::new();
    let what = format!("{}s", t.kind);
    pages(&api, &what, t.group == SNAPSHOT_GROUP, |items| {
        out.extend(
            items
                .into_iter()
                .map(|o| {
                    let m = o.metadata;
                    Object {
                        target: *t,
                        namespace: m.namespace,
                        name: m.name.unwrap_or_default(),
                        created: m.creation_timestamp.map(|c| c.0),
                        deleting_since: m.deletion_timestamp.map(|d| d.0),
                        finalizers: m.finalizers.unwrap_or_default(),
                        labels: m.labels.unwrap_or_default(),
                    }
                })
                .filter(|o| wanted(o)),
        );
        out.len() >= MAX_OBJECTS_PER_KIND
    })
    .await?;
    Ok(out)
}

/// Does what `act` says to `o`; an object already gone is fine. Returns whether its
/// finalizers were removed by force.
pub async fn act(client: &Client, o: &Object, act: Act) -> Result<bool, Failure> {
    let ar = resource(&o.target);
    let api: Api<DynamicObject> = match &o.namespace {
        Some(ns) => Api::namespaced_with(client.clone(), ns, &ar),
        None => Api::all_with(client.clone(), &ar),
    };
    let gone = |r: Result<(), kube::Error>, what: &str| match r {
        Ok(()) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
        Err(e) => Err(Failure::of(&format!("{what} {}", o.describe()), e)),
    };
    let delete = |grace: i64| {
        let api = api.clone();
        let name = o.name.clone();
        async move {
            let dp = DeleteParams {
                grace_period_seconds: Some(grace.max(0) as u32),
                propagation_policy: Some(kube::api::PropagationPolicy::Background),
                ..DeleteParams::default()
            };
            api.delete(&name, &dp).await.map(|_| ())
        }
    };
    match act {
        Act::Wait { .. } => Ok(false),
        Act::Delete { grace_seconds } => {
            gone(delete(grace_seconds).await, "deleting")?;
            Ok(false)
        }
        Act::Force => {
            if !o.finalizers.is_empty() {
                let patch = json!({"metadata": {"finalizers": null}});
                let r = api
                    .patch(&o.name, &PatchParams::default(), &Patch::Merge(&patch))
                    .await
                    .map(|_| ());
                gone(r, "removing the finalizers of")?;
            }
            gone(delete(0).await, "deleting")?;
            Ok(!o.finalizers.is_empty())
        }
    }
}
