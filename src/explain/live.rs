//! `captf explain` without `-f`: the objects read from the cluster as a controller's pass
//! reads them, then the same rule table.

use jiff::Timestamp;
use kube::api::{Api, ListParams};
use kube::{Client, ResourceExt};

use super::Explained;
use crate::api::{Kind, TerraformObject};
use crate::controller::observe;
use crate::gather::{self, Settings};
use crate::ops::ToolError;

/// `captf explain` without `-f`: the same verdicts from the live objects.
pub async fn explain(
    client: &Client,
    ns: Option<&str>,
    settings: &Settings,
) -> Result<Vec<Explained>, ToolError> {
    let cluster_api = crate::controller::discover_cluster(client).await;
    let mut out = Vec::new();
    for kind in Kind::ALL {
        crate::with_kind!(kind, K => {
            explain_kind::<K>(client, ns, &cluster_api, settings, &mut out).await?
        });
    }
    Ok(out)
}

async fn explain_kind<K: TerraformObject>(
    client: &Client,
    ns: Option<&str>,
    cluster_api: &crate::controller::ClusterKind,
    settings: &Settings,
    out: &mut Vec<Explained>,
) -> Result<(), ToolError> {
    let api: Api<K> = match ns {
        Some(n) => Api::namespaced(client.clone(), n),
        None => Api::all(client.clone()),
    };
    for obj in api.list(&ListParams::default()).await?.items {
        let mut observed = observe::observe(client, cluster_api, &obj).await?;
        observe::observe_secrets(client, &mut observed).await?;
        observed.now = Timestamp::now();
        let (decision, _, _) = gather::decide(&observed, settings);
        out.push(Explained::new(
            K::KIND,
            &obj.namespace().unwrap_or_default(),
            &obj.name_any(),
            &decision,
        ));
    }
    Ok(())
}
