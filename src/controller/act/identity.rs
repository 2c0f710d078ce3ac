//! The identity an attempt runs with (`TerraformClusterIdentity`), read at its start:
//! which one, whether the object's namespace may use it, its Secret's keys as the
//! runner's environment, and the annotations of the runner's own ServiceAccount it gives. Anything in the way is a refusal ([`Error::Identity`]): nothing is
//! written, the conditions say why the attempt cannot start and what to do, and each pass
//! tries again.
//!
//! Which one: a destroy uses the identity the apply ran with (recorded with the inputs);
//! an apply, and a destroy whose inputs record none, the one the spec names, else (a
//! machine or pool) the one its cluster's TerraformCluster names. Its Secret is read as it
//! is at the attempt's start: a rotated credential is the one the next attempt gets, the
//! destroy's too (the old one may be revoked).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Namespace, Secret};
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::reflector::ObjectRef;
use kube::{Resource, ResourceExt};
use serde_json::json;

use crate::api::TerraformObject;
use crate::api::identity::{IDENTITY_KIND, TerraformClusterIdentity, is_object_name};
use crate::api::names::{self, Kind};
use crate::controller::{Context, Error, Scope};
use crate::gather::Observed;
use crate::inputs::{IdentityUse, Inputs};
use crate::job::IdentityEnv;

/// The most an identity's Secret may hold (keys and values), checked before it is used:
/// credentials are small, and they travel in the attempt's Secret beside the module.
pub const IDENTITY_SECRET_MAX_BYTES: usize = 256 * 1024;

/// An identity as an attempt uses it: its variables, what the inputs record, and the
/// annotations of the runner ServiceAccount of the object's own it gives (workload
/// identity), if it gives one.
pub struct Resolved {
    pub env: IdentityEnv,
    pub used: IdentityUse,
    pub account: Option<BTreeMap<String, String>>,
}

/// The name of the identity attempt `operation` of the object runs with, or none.
async fn identity_name<K: TerraformObject>(
    ctx: &Context,
    scope: &Scope<K>,
    obj: &K,
    o: &Observed,
    operation: &str,
    inputs: &Inputs,
) -> Result<Option<String>, Error> {
    if operation == names::OPERATION_DESTROY
        && let Some(used) = &inputs.identity
    {
        return Ok(Some(used.name.clone()));
    }
    if let Some(r) = &obj.terraform().identity_ref {
        if r.kind != IDENTITY_KIND {
            return Err(Error::Identity(format!(
                "spec.identityRef names kind {:?}, which CAPTF does not know: name a {IDENTITY_KIND}",
                r.kind
            )));
        }
        return Ok(Some(r.name.clone()));
    }
    if K::KIND == Kind::TerraformCluster {
        return Ok(None);
    }
    let Some(cluster) = o.cluster.as_ref().and_then(|c| c.infrastructure.as_deref()) else {
        return Ok(None);
    };
    let cached = ctx
        .caches(Kind::TerraformCluster)
        .and_then(|c| (c.identity_of)(&scope.namespace, cluster));
    Ok(match cached {
        Some(name) => name,
        None => {
            Api::<crate::api::TerraformCluster>::namespaced(ctx.client.clone(), &scope.namespace)
                .get_opt(cluster)
                .await?
                .and_then(|c| c.terraform().identity_ref.as_ref().map(|r| r.name.clone()))
        }
    })
}

/// The identity attempt `operation` of the object runs with, read now; none when it runs
/// with none. A refusal names the identity and the fix.
pub async fn resolve<K: TerraformObject>(
    ctx: &Context,
    scope: &Scope<K>,
    obj: &K,
    o: &Observed,
    operation: &str,
    inputs: &Inputs,
) -> Result<Option<Resolved>, Error> {
    let Some(name) = identity_name(ctx, scope, obj, o, operation, inputs).await? else {
        return Ok(None);
    };
    // The name may come from the inputs Secret, which anyone who writes Secrets in the
    // namespace can change: it is checked as a name here, and the namespace must still be
    // allowed below, whichever identity it names.
    if !is_object_name(&name) {
        return Err(Error::Identity(format!(
            "{name:?} is not the name of a TerraformClusterIdentity: correct spec.identityRef (or the inputs Secret's identity.name)"
        )));
    }
    let identities: Api<TerraformClusterIdentity> = Api::all(ctx.client.clone());
    let Some(identity) = identities.get_opt(&name).await? else {
        return Err(Error::Identity(format!(
            "TerraformClusterIdentity {name} does not exist: create it (kubectl get terraformclusteridentities lists those that do), or name another"
        )));
    };
    let ns = &scope.namespace;
    let Some(allowed) = &identity.spec.allowed_namespaces else {
        return Err(Error::Identity(format!(
            "TerraformClusterIdentity {name} allows no namespace (its spec.allowedNamespaces is absent): add {ns} to spec.allowedNamespaces.list"
        )));
    };
    let listed = allowed.list.iter().flatten().any(|n| n == ns);
    // The labels from the manager's cache of Namespaces (metadata), else read.
    let labels = if allowed.selector.is_some() && !listed {
        match scope
            .caches
            .as_ref()
            .and_then(|c| c.namespaces.get(&ObjectRef::new(ns)))
        {
            Some(n) => Some(n.labels().clone()),
            None => Api::<Namespace>::all(ctx.client.clone())
                .get_metadata_opt(ns)
                .await?
                .map(|n| n.labels().clone()),
        }
    } else {
        None
    };
    if !allowed.allows(ns, labels.as_ref()) {
        return Err(Error::Identity(format!(
            "TerraformClusterIdentity {name} does not allow namespace {ns}: add it to the identity's spec.allowedNamespaces.list, or label it to match spec.allowedNamespaces.selector"
        )));
    }
    let account = identity
        .spec
        .service_account
        .as_ref()
        .map(|a| a.annotations.clone());
    if account.is_some() && obj.terraform().runner.service_account.is_some() {
        return Err(Error::Identity(format!(
            "TerraformClusterIdentity {name} gives the runner a ServiceAccount (its spec.serviceAccount), and so does the object's spec.runner.serviceAccount: remove the object's, or use another identity"
        )));
    }
    let (values, version) = match &identity.spec.secret_ref {
        Some(secret_name) => credentials(ctx, &identity, &name, secret_name).await?,
        None if account.is_some() => (BTreeMap::new(), None),
        None => {
            return Err(Error::Identity(format!(
                "TerraformClusterIdentity {name} gives no credentials (neither spec.secretRef nor spec.serviceAccount): give one"
            )));
        }
    };
    Ok(Some(Resolved {
        env: IdentityEnv {
            name: name.clone(),
            values,
        },
        used: IdentityUse {
            name,
            secret_resource_version: version,
        },
        account,
    }))
}

/// The identity's Secret `secret_name` (in the manager's namespace), checked: its keys and
/// values, and its resourceVersion once the identity owns it.
async fn credentials(
    ctx: &Context,
    identity: &TerraformClusterIdentity,
    name: &str,
    secret_name: &str,
) -> Result<(BTreeMap<String, k8s_openapi::ByteString>, Option<String>), Error> {
    let manager_ns = &ctx.manager_namespace;
    if !is_object_name(secret_name) {
        return Err(Error::Identity(format!(
            "TerraformClusterIdentity {name}: its spec.secretRef {secret_name:?} is not the name of a Secret: correct it"
        )));
    }
    let secrets: Api<Secret> = Api::namespaced(ctx.client.clone(), manager_ns);
    let Some(secret) = secrets.get_opt(secret_name).await? else {
        return Err(Error::Identity(format!(
            "TerraformClusterIdentity {name}: its Secret {manager_ns}/{secret_name} does not exist: create it, with one key per environment variable the runner needs"
        )));
    };
    let values: BTreeMap<String, k8s_openapi::ByteString> = secret.data.clone().unwrap_or_default();
    let size: usize = values.iter().map(|(k, v)| k.len() + v.0.len()).sum();
    if size > IDENTITY_SECRET_MAX_BYTES {
        return Err(Error::Identity(format!(
            "TerraformClusterIdentity {name}: its Secret {manager_ns}/{secret_name} holds {size} bytes, more than the {IDENTITY_SECRET_MAX_BYTES} an identity may: keep only the credentials in it"
        )));
    }
    let version = own_secret(&secrets, identity, &secret).await?;
    Ok((values, version))
}

/// Makes the identity an owner of its Secret, once: `clusterctl move` carries a global
/// identity's hierarchy, its Secret in the provider's namespace included, by owner
/// references. The Secret's resourceVersion after it.
async fn own_secret(
    secrets: &Api<Secret>,
    identity: &TerraformClusterIdentity,
    secret: &Secret,
) -> Result<Option<String>, Error> {
    let current = secret.metadata.resource_version.clone();
    let Some(uid) = identity.metadata.uid.as_deref() else {
        return Ok(current);
    };
    if secret.owner_references().iter().any(|r| r.uid == uid) {
        return Ok(current);
    }
    let owner = json!({
        "apiVersion": TerraformClusterIdentity::api_version(&()),
        "kind": IDENTITY_KIND,
        "name": identity.name_any(),
        "uid": uid,
    });
    // Strategic merge: owner references merge by uid, the others stay.
    let patched = secrets
        .patch_metadata(
            &secret.name_any(),
            &PatchParams::default(),
            &Patch::Strategic(json!({ "metadata": { "ownerReferences": [owner] } })),
        )
        .await?;
    Ok(patched.metadata.resource_version)
}
