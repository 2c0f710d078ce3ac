//! The operator's commands that talk to the cluster: `captf state restore`, `captf orphans`
//! and `captf explain` without `-f`. They use the same names, state reading and facts
//! gathering as the controllers.

use std::collections::BTreeMap;

use flate2::Compression;
use flate2::write::GzEncoder;
use jiff::Timestamp;
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, ListParams, ObjectMeta, PostParams};
use kube::{Client, ResourceExt};
use serde::Serialize;

use crate::api::names::{self, Kind, SecretRole};
use crate::api::{TerraformCluster, TerraformMachine, TerraformMachinePool, TerraformObject};
use crate::controller::observe;
use crate::explain::Explained;
use crate::gather::{self, Settings};
use crate::state::{self, Fingerprint, StateContent};

/// The largest state file `--from-file` reads.
pub const MAX_STATE_FILE_BYTES: u64 = 512 * 1024 * 1024;

#[derive(Debug, thiserror::Error)]
pub enum ToolError {
    #[error("{0}")]
    Refused(String),
    #[error("Kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    #[error("{0}")]
    Controller(#[from] crate::controller::Error),
}

/// Where a restore takes the state from.
pub enum RestoreSource {
    Backup,
    File(std::path::PathBuf),
    /// An errored state a runner kept, by the name of its (base) Secret in the object's
    /// namespace: Terraform's last state of the failed run, to merge back.
    Errored(String),
}

/// `captf state restore KIND/NAME`: writes a state back in Terraform's format (parts
/// included). A readable current state is never overwritten without `force`.
pub async fn restore(
    client: &Client,
    ns: &str,
    target: &str,
    source: RestoreSource,
    force: bool,
) -> Result<String, ToolError> {
    let (kind, name) = parse_target(target)?;
    let obj_meta = object_meta(client, ns, kind, &name).await?;
    let suffix = names::state_suffix(kind, &name);
    let secrets: Api<Secret> = Api::namespaced(client.clone(), ns);
    let state_name = names::state_secret_name(&suffix);

    let gzip = match &source {
        RestoreSource::Backup => {
            let backup =
                observe::read_chunked(&secrets, &names::backup_secret_name(&suffix), None).await?;
            backup.joined().ok_or_else(|| {
                ToolError::Refused(format!(
                    "no complete backup Secret {} (with its parts) in namespace {ns}; restore --from-file instead",
                    names::backup_secret_name(&suffix)
                ))
            })?
        }
        RestoreSource::File(path) => read_state_file(path)?,
        RestoreSource::Errored(name) => {
            let secret = secrets
                .get_opt(name)
                .await?
                .ok_or_else(|| ToolError::Refused(format!("no Secret {name} in namespace {ns}")))?;
            let data = secret.data.unwrap_or_default();
            if let Some(json) = data.get(names::LEGACY_ERRORED_KEY) {
                // An older runner's: plain JSON.
                let mut enc = GzEncoder::new(Vec::new(), Compression::default());
                std::io::copy(&mut &json.0[..], &mut enc)
                    .and_then(|_| enc.finish())
                    .map_err(|e| ToolError::Refused(format!("Secret {name}: {e}")))?
            } else if data.contains_key(names::TF_STATE_KEY) {
                observe::read_chunked(&secrets, name, None)
                    .await?
                    .joined()
                    .ok_or_else(|| {
                        ToolError::Refused(format!(
                            "the errored state {name} is not complete (a part Secret is missing)"
                        ))
                    })?
            } else {
                return Err(ToolError::Refused(format!(
                    "Secret {name} holds no state (neither {} nor {})",
                    names::TF_STATE_KEY,
                    names::LEGACY_ERRORED_KEY
                )));
            }
        }
    };
    // The source itself must be a readable Terraform state.
    match state::read_bytes(&gzip[..], state::DEFAULT_DECOMPRESSION_CAP) {
        StateContent::Parsed { .. } => {}
        StateContent::Encrypted { message, .. } | StateContent::Corrupt { message } => {
            return Err(ToolError::Refused(format!(
                "the state to restore is not usable: {message}"
            )));
        }
        StateContent::Missing => {
            return Err(ToolError::Refused("the state to restore is empty".into()));
        }
    }

    let current = observe::read_chunked(&secrets, &state_name, Some(&suffix)).await?;
    let recorded = obj_meta.as_ref().and_then(|m| {
        Fingerprint::from_annotations(m.annotations.as_ref().unwrap_or(&BTreeMap::new()))
            .ok()
            .flatten()
    });
    let verdict = state::classify(
        &state::read(&current, state::DEFAULT_DECOMPRESSION_CAP),
        recorded.as_ref(),
        false,
    );
    if verdict.readable && !force {
        return Err(ToolError::Refused(format!(
            "the current state {state_name} is readable ({}); restoring would overwrite it: pass --force if that is what you want",
            verdict.message
        )));
    }

    let chunks = state::chunk(&gzip);
    // Every label Terraform's backend selects the state by: its own, and the owner and
    // move labels the runner configures (the owner name as a valid label value, however
    // long the name; the uid when the object exists).
    let mut labels = names::terraform_state_labels(&suffix);
    match obj_meta.as_ref().and_then(|m| m.uid.clone()) {
        Some(uid) => labels.extend(crate::inputs::backend_labels(kind, &name, &uid)),
        None => {
            let mut owner = crate::inputs::backend_labels(kind, &name, "");
            owner.remove(names::LABEL_OWNER_UID);
            labels.extend(owner);
        }
    }
    // Parts first, then the base, then parts the new state no longer has: a reader never
    // sees a base that points past the parts written.
    for (i, chunk) in chunks.iter().enumerate().skip(1) {
        write_chunk(
            &secrets,
            ns,
            &names::part_secret_name(&state_name, i as u32),
            chunk,
            &labels,
            false,
        )
        .await?;
    }
    write_chunk(
        &secrets,
        ns,
        &state_name,
        chunks.first().copied().unwrap_or_default(),
        &labels,
        true,
    )
    .await?;
    let mut n = chunks.len().max(1) as u32;
    while secrets
        .get_metadata_opt(&names::part_secret_name(&state_name, n))
        .await?
        .is_some()
    {
        crate::controller::writes::delete_if_present(
            &secrets,
            &names::part_secret_name(&state_name, n),
        )
        .await?;
        n += 1;
    }
    let after = state::classify(
        &state::read(
            &observe::read_chunked(&secrets, &state_name, Some(&suffix)).await?,
            state::DEFAULT_DECOMPRESSION_CAP,
        ),
        recorded.as_ref(),
        false,
    );
    let mut out = format!(
        "restored {state_name} in {ns} ({} part Secret(s)): {}",
        chunks.len().saturating_sub(1),
        after.message
    );
    if after.reason == state::StateReason::StateInconsistent {
        out.push_str(&format!(
            "\nthe restored state does not match the object's fingerprint; once you have checked it, accept it with:\n  kubectl annotate -n {ns} {}/{name} --overwrite {}={} {}={}",
            kind.as_str().to_lowercase(),
            names::STATE_LINEAGE,
            after.lineage.clone().unwrap_or_default(),
            names::STATE_SERIAL,
            after.serial.unwrap_or(0)
        ));
    }
    Ok(out)
}

async fn write_chunk(
    secrets: &Api<Secret>,
    ns: &str,
    name: &str,
    chunk: &[u8],
    labels: &BTreeMap<String, String>,
    base: bool,
) -> Result<(), ToolError> {
    let data: BTreeMap<String, ByteString> =
        [(names::TF_STATE_KEY.to_string(), ByteString(chunk.to_vec()))].into();
    match secrets.get_opt(name).await? {
        Some(mut existing) => {
            existing.data = Some(data);
            existing.string_data = None;
            let l = existing.metadata.labels.get_or_insert_with(BTreeMap::new);
            l.extend(labels.clone());
            secrets
                .replace(name, &PostParams::default(), &existing)
                .await?;
        }
        None => {
            let secret = Secret {
                metadata: ObjectMeta {
                    name: Some(name.to_string()),
                    namespace: Some(ns.to_string()),
                    labels: Some(labels.clone()),
                    annotations: Some([("encoding".to_string(), "gzip".to_string())].into()),
                    finalizers: base.then(|| vec![names::PROTECT_FINALIZER.to_string()]),
                    ..Default::default()
                },
                data: Some(data),
                ..Default::default()
            };
            secrets.create(&PostParams::default(), &secret).await?;
        }
    }
    Ok(())
}

/// Reads a state file: plain JSON (as `terraform state pull` or `errored.tfstate`) or gzip.
fn read_state_file(path: &std::path::Path) -> Result<Vec<u8>, ToolError> {
    let shown = path.display();
    let meta = std::fs::metadata(path).map_err(|e| ToolError::Refused(format!("{shown}: {e}")))?;
    if meta.len() > MAX_STATE_FILE_BYTES {
        return Err(ToolError::Refused(format!(
            "{shown}: {} bytes, more than the limit of {MAX_STATE_FILE_BYTES}",
            meta.len()
        )));
    }
    let bytes = std::fs::read(path).map_err(|e| ToolError::Refused(format!("{shown}: {e}")))?;
    if bytes.starts_with(&[0x1f, 0x8b]) {
        return Ok(bytes);
    }
    let mut enc = GzEncoder::new(Vec::new(), Compression::default());
    std::io::copy(&mut &bytes[..], &mut enc)
        .map_err(|e| ToolError::Refused(format!("{shown}: {e}")))?;
    enc.finish()
        .map_err(|e| ToolError::Refused(format!("{shown}: {e}")))
}

/// `KIND/NAME` as kubectl writes it (`tfm/web-1`, `terraformmachine/web-1`, …).
pub fn parse_target(target: &str) -> Result<(Kind, String), ToolError> {
    let (kind, name) = target.split_once('/').ok_or_else(|| {
        ToolError::Refused(format!(
            "{target:?}: expected KIND/NAME, e.g. terraformmachine/web-1"
        ))
    })?;
    let kind = Kind::parse(kind).ok_or_else(|| {
        ToolError::Refused(format!("{kind:?} is not a CAPTF kind: use terraformcluster (tfc), terraformmachine (tfm) or terraformmachinepool (tfmp)"))
    })?;
    if name.is_empty() {
        return Err(ToolError::Refused(format!("{target:?}: the name is empty")));
    }
    Ok((kind, name.to_string()))
}

async fn object_meta(
    client: &Client,
    ns: &str,
    kind: Kind,
    name: &str,
) -> Result<Option<ObjectMeta>, ToolError> {
    Ok(match kind {
        Kind::TerraformCluster => Api::<TerraformCluster>::namespaced(client.clone(), ns)
            .get_opt(name)
            .await?
            .map(|o| o.metadata),
        Kind::TerraformMachine => Api::<TerraformMachine>::namespaced(client.clone(), ns)
            .get_opt(name)
            .await?
            .map(|o| o.metadata),
        Kind::TerraformMachinePool => Api::<TerraformMachinePool>::namespaced(client.clone(), ns)
            .get_opt(name)
            .await?
            .map(|o| o.metadata),
    })
}

/// A Secret of CAPTF's whose object is gone.
#[derive(Clone, Debug, Serialize, PartialEq, Eq, PartialOrd, Ord)]
#[serde(rename_all = "camelCase")]
pub struct Orphan {
    /// The object's namespace (for an abandoned copy, the namespace it came from).
    pub namespace: String,
    pub secret: String,
    /// The Secret's own namespace, when it is not the object's (an abandoned copy in the
    /// manager's namespace).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub secret_namespace: Option<String>,
    /// `state`, `state-part`, `inputs`, `backup`, `backup-part`, `errored`,
    /// `errored-part`, `abandoned-copy` or `abandoned-copy-part`.
    pub role: String,
    pub kind: String,
    /// The owner-name label: the object's name, cut and hashed when longer than 63.
    pub name: String,
    /// The owner's uid, when the Secret carries it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub uid: Option<String>,
    pub abandoned_at: Option<String>,
}

/// `captf orphans`: every Secret CAPTF writes for an object (state and parts, inputs,
/// backup and parts, errored states, and the copies an abandon made in the manager's
/// namespace) whose object is gone. An object is found by the owner uid the Secret
/// carries, or, for a Secret of an earlier object of the same namespace, kind and name
/// (which the new one may adopt), by those.
pub async fn orphans(
    client: &Client,
    ns: Option<&str>,
    manager_ns: &str,
) -> Result<Vec<Orphan>, ToolError> {
    // The objects there are: by uid, and by namespace, kind and owner-name label value.
    let mut uids = std::collections::BTreeSet::new();
    let mut namesakes = std::collections::BTreeSet::new();
    let mut note = |meta: &ObjectMeta, kind: Kind| {
        if let Some(uid) = &meta.uid {
            uids.insert(uid.clone());
        }
        namesakes.insert((
            meta.namespace.clone().unwrap_or_default(),
            kind,
            crate::inputs::name_label_value(meta.name.as_deref().unwrap_or_default()),
        ));
    };
    macro_rules! objects_of {
        ($k:ty) => {{
            let api: Api<$k> = match ns {
                Some(n) => Api::namespaced(client.clone(), n),
                None => Api::all(client.clone()),
            };
            for o in api.list_metadata(&ListParams::default()).await?.items {
                note(&o.metadata, <$k as TerraformObject>::KIND);
            }
        }};
    }
    objects_of!(TerraformCluster);
    objects_of!(TerraformMachine);
    objects_of!(TerraformMachinePool);

    let secrets: Api<Secret> = match ns {
        Some(n) => Api::namespaced(client.clone(), n),
        None => Api::all(client.clone()),
    };
    let mut candidates: BTreeMap<String, ObjectMeta> = BTreeMap::new();
    let mut add = |items: Vec<kube::core::PartialObjectMeta<Secret>>| {
        for s in items {
            let key = format!("{}/{}", s.namespace().unwrap_or_default(), s.name_any());
            candidates.insert(key, s.metadata);
        }
    };
    for selector in [
        format!("{}=true", names::TF_LABEL_STATE),
        names::LABEL_OWNER_KIND.to_string(),
    ] {
        add(secrets
            .list_metadata(&ListParams::default().labels(&selector))
            .await?
            .items);
    }
    // The copies an abandon made in the manager's namespace, of this namespace's objects.
    // (Listing every namespace finds them already.)
    if let Some(n) = ns.filter(|n| *n != manager_ns) {
        let selector = format!("{}={n}", names::LABEL_SOURCE_NAMESPACE);
        add(Api::<Secret>::namespaced(client.clone(), manager_ns)
            .list_metadata(&ListParams::default().labels(&selector))
            .await?
            .items);
    }
    let mut out = Vec::new();
    for meta in candidates.values() {
        let Some((role, kind, name)) = owner_of_secret(meta) else {
            continue;
        };
        let labels = meta.labels.clone().unwrap_or_default();
        let uid = labels.get(names::LABEL_OWNER_UID).cloned();
        let secret_ns = meta.namespace.clone().unwrap_or_default();
        let object_ns = labels
            .get(names::LABEL_SOURCE_NAMESPACE)
            .cloned()
            .unwrap_or_else(|| secret_ns.clone());
        let owned = uid.as_ref().is_some_and(|u| uids.contains(u))
            || namesakes.contains(&(object_ns.clone(), kind, name.clone()));
        if !owned {
            out.push(Orphan {
                secret_namespace: (secret_ns != object_ns).then_some(secret_ns),
                namespace: object_ns,
                secret: meta.name.clone().unwrap_or_default(),
                role,
                kind: kind.as_str().to_string(),
                name,
                uid,
                abandoned_at: meta
                    .annotations
                    .as_ref()
                    .and_then(|a| a.get(names::ABANDONED_AT))
                    .cloned(),
            });
        }
    }
    out.sort();
    Ok(out)
}

/// Which object a Secret belongs to (kind and owner-name label value), and its role, from
/// its labels and name.
fn owner_of_secret(meta: &ObjectMeta) -> Option<(String, Kind, String)> {
    let empty = BTreeMap::new();
    let labels = meta.labels.as_ref().unwrap_or(&empty);
    let name = meta.name.as_deref().unwrap_or_default();
    let parsed = names::parse_secret_name(name)?;
    let part = parsed.part.is_some();
    let role = match parsed.role {
        SecretRole::Inputs => "inputs",
        SecretRole::State if part => "state-part",
        SecretRole::State => "state",
        SecretRole::Backup if part => "backup-part",
        SecretRole::Backup => "backup",
        SecretRole::Errored if part => "errored-part",
        SecretRole::Errored => "errored",
        SecretRole::AbandonedState | SecretRole::AbandonedBackup if part => "abandoned-copy-part",
        SecretRole::AbandonedState | SecretRole::AbandonedBackup | SecretRole::AbandonedInputs => {
            "abandoned-copy"
        }
    };
    if let (Some(k), Some(n)) = (
        labels.get(names::LABEL_OWNER_KIND),
        labels.get(names::LABEL_OWNER_NAME),
    ) {
        return Some((role.to_string(), Kind::parse(k)?, n.clone()));
    }
    let suffix = labels.get(names::TF_LABEL_SUFFIX)?;
    let (obj, short) = suffix.rsplit_once('.')?;
    Some((role.to_string(), Kind::parse(short)?, obj.to_string()))
}

/// `captf explain` without `-f`: the same verdicts from the live objects.
pub async fn explain_live(
    client: &Client,
    ns: Option<&str>,
    settings: &Settings,
) -> Result<Vec<Explained>, ToolError> {
    let cluster_api = crate::controller::discover_cluster(client).await;
    let mut out = Vec::new();
    explain_kind::<TerraformCluster>(client, ns, &cluster_api, settings, &mut out).await?;
    explain_kind::<TerraformMachine>(client, ns, &cluster_api, settings, &mut out).await?;
    explain_kind::<TerraformMachinePool>(client, ns, &cluster_api, settings, &mut out).await?;
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
