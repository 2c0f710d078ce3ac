//! A Pod's volumes, made on the host under the Pod's directory before its containers
//! start: `emptyDir` (mode 0777), `secret`, `configMap`, `downwardAPI` and `projected`
//! (with a service account token from the TokenRequest API, bound to the Pod), files
//! with their `defaultMode` or item `mode`, group `fsGroup` when the Pod sets one. A
//! Secret or ConfigMap that does not exist keeps the Pod in `ContainerCreating`, as the
//! kubelet's failed mount does, unless the volume is optional. Other volume types are
//! refused the same way.

use std::collections::{BTreeMap, HashMap};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use k8s_openapi::api::core::v1::{
    ConfigMap, Container, DownwardAPIVolumeFile, KeyToPath, Pod, Secret, ServiceAccount, Volume,
};
use kube::api::PostParams;
use kube::{Api, Client, ResourceExt};
use serde_json::{Value, json};

/// Why a volume cannot be made yet: the Pod waits in `ContainerCreating` with this message.
pub type Wait = String;

/// A made volume: its directory, and whether the kubelet mounts it read-only whatever
/// the volumeMount says (secret, configMap, downwardAPI and projected volumes).
#[derive(Clone, Debug)]
pub struct Made {
    pub dir: PathBuf,
    pub read_only: bool,
}

fn mode_of(mode: Option<i32>, default: Option<i32>) -> u32 {
    mode.or(default).unwrap_or(0o644) as u32
}

fn write_file(
    dir: &Path,
    rel: &str,
    bytes: &[u8],
    mode: u32,
    fs_group: Option<i64>,
) -> Result<(), Wait> {
    if rel.split('/').any(|c| c == ".." || c.is_empty()) {
        return Err(format!("invalid path {rel:?}"));
    }
    let path = dir.join(rel);
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).map_err(|e| format!("{}: {e}", parent.display()))?;
    }
    std::fs::write(&path, bytes).map_err(|e| format!("{}: {e}", path.display()))?;
    let mut mode = mode;
    if let Some(g) = fs_group {
        chown_group(&path, g as u32)?;
        // The kubelet makes files of volumes with an fsGroup readable by the group.
        mode |= 0o440;
    }
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode))
        .map_err(|e| format!("{}: {e}", path.display()))
}

fn chown_group(path: &Path, gid: u32) -> Result<(), Wait> {
    std::os::unix::fs::chown(path, None, Some(gid)).map_err(|e| format!("{}: {e}", path.display()))
}

/// The data of a Secret or ConfigMap, as bytes per key.
fn secret_data(s: &Secret) -> BTreeMap<String, Vec<u8>> {
    let mut out: BTreeMap<String, Vec<u8>> = BTreeMap::new();
    for (k, v) in s.data.clone().unwrap_or_default() {
        out.insert(k, v.0);
    }
    for (k, v) in s.string_data.clone().unwrap_or_default() {
        out.insert(k, v.into_bytes());
    }
    out
}

fn config_map_data(c: &ConfigMap) -> BTreeMap<String, Vec<u8>> {
    let mut out: BTreeMap<String, Vec<u8>> = BTreeMap::new();
    for (k, v) in c.data.clone().unwrap_or_default() {
        out.insert(k, v.into_bytes());
    }
    for (k, v) in c.binary_data.clone().unwrap_or_default() {
        out.insert(k, v.0);
    }
    out
}

/// Writes `data` as files: every key, or only `items` (a missing item key is an error
/// unless optional).
fn write_keys(
    dir: &Path,
    data: &BTreeMap<String, Vec<u8>>,
    items: Option<&Vec<KeyToPath>>,
    default_mode: Option<i32>,
    fs_group: Option<i64>,
    what: &str,
    optional: bool,
) -> Result<(), Wait> {
    match items {
        None => {
            for (k, v) in data {
                write_file(dir, k, v, mode_of(None, default_mode), fs_group)?;
            }
        }
        Some(items) => {
            for it in items {
                match data.get(&it.key) {
                    Some(v) => {
                        write_file(dir, &it.path, v, mode_of(it.mode, default_mode), fs_group)?
                    }
                    None if optional => {}
                    None => return Err(format!("{what} has no key {:?}", it.key)),
                }
            }
        }
    }
    Ok(())
}

/// The value of a downward API `fieldRef` path of `pod`.
pub fn field_value(pod: &Pod, path: &str) -> Result<String, String> {
    let fmt_map = |m: &BTreeMap<String, String>| {
        m.iter()
            .map(|(k, v)| format!("{k}={}", serde_json::to_string(v).unwrap_or_default()))
            .collect::<Vec<_>>()
            .join("\n")
    };
    let spec = pod.spec.clone().unwrap_or_default();
    let status = pod.status.clone().unwrap_or_default();
    let keyed = |prefix: &str| -> Option<String> {
        path.strip_prefix(prefix)
            .and_then(|r| r.strip_prefix("['"))
            .and_then(|r| r.strip_suffix("']"))
            .map(str::to_string)
    };
    Ok(match path {
        "metadata.name" => pod.name_any(),
        "metadata.namespace" => pod.namespace().unwrap_or_default(),
        "metadata.uid" => pod.metadata.uid.clone().unwrap_or_default(),
        "metadata.labels" => fmt_map(pod.labels()),
        "metadata.annotations" => fmt_map(pod.annotations()),
        "spec.nodeName" => spec.node_name.unwrap_or_default(),
        "spec.serviceAccountName" => spec.service_account_name.unwrap_or_default(),
        "status.hostIP" | "status.podIP" => "127.0.0.1".to_string(),
        "status.hostIPs" | "status.podIPs" => "127.0.0.1".to_string(),
        _ => {
            if let Some(k) = keyed("metadata.labels") {
                pod.labels().get(&k).cloned().unwrap_or_default()
            } else if let Some(k) = keyed("metadata.annotations") {
                pod.annotations().get(&k).cloned().unwrap_or_default()
            } else {
                let _ = status;
                return Err(format!("unsupported fieldPath {path:?}"));
            }
        }
    })
}

/// The value of a `resourceFieldRef` (requests and limits of the named container; a
/// missing limit is the Node's capacity).
pub fn resource_value(pod: &Pod, container: Option<&str>, resource: &str) -> String {
    let spec = pod.spec.clone().unwrap_or_default();
    let c: Option<&Container> = match container {
        Some(n) => spec.containers.iter().find(|c| c.name == n),
        None => spec.containers.first(),
    };
    let res = c.and_then(|c| c.resources.clone()).unwrap_or_default();
    let (map, key) = match resource.split_once('.') {
        Some(("requests", k)) => (res.requests.unwrap_or_default(), k.to_string()),
        Some(("limits", k)) => (res.limits.unwrap_or_default(), k.to_string()),
        _ => return String::new(),
    };
    if let Some(q) = map.get(&key) {
        return q.0.clone();
    }
    match (resource.starts_with("limits"), key.as_str()) {
        (true, "cpu") => std::thread::available_parallelism()
            .map_or(1, |n| n.get())
            .to_string(),
        _ => "0".to_string(),
    }
}

fn write_downward(
    dir: &Path,
    pod: &Pod,
    items: &[DownwardAPIVolumeFile],
    default_mode: Option<i32>,
    fs_group: Option<i64>,
) -> Result<(), Wait> {
    for it in items {
        let value = if let Some(f) = &it.field_ref {
            field_value(pod, &f.field_path)?
        } else if let Some(r) = &it.resource_field_ref {
            resource_value(pod, r.container_name.as_deref(), &r.resource)
        } else {
            String::new()
        };
        write_file(
            dir,
            &it.path,
            value.as_bytes(),
            mode_of(it.mode, default_mode),
            fs_group,
        )?;
    }
    Ok(())
}

/// Makes every volume of `pod` under `pod_dir/volumes`.
pub async fn make(
    client: &Client,
    pod: &Pod,
    pod_dir: &Path,
) -> Result<HashMap<String, Made>, Wait> {
    let ns = pod.namespace().unwrap_or_default();
    let spec = pod.spec.clone().unwrap_or_default();
    let fs_group = spec.security_context.as_ref().and_then(|s| s.fs_group);
    let mut made = HashMap::new();
    for v in spec.volumes.clone().unwrap_or_default() {
        let dir = pod_dir.join("volumes").join(&v.name);
        std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let read_only = make_one(client, pod, &ns, &v, &dir, fs_group)
            .await
            .map_err(|e| format!("MountVolume.SetUp failed for volume \"{}\" : {e}", v.name))?;
        if let Some(g) = fs_group {
            chown_group(&dir, g as u32)?;
        }
        made.insert(v.name.clone(), Made { dir, read_only });
    }
    Ok(made)
}

async fn make_one(
    client: &Client,
    pod: &Pod,
    ns: &str,
    v: &Volume,
    dir: &Path,
    fs_group: Option<i64>,
) -> Result<bool, Wait> {
    if v.empty_dir.is_some() {
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o777))
            .map_err(|e| e.to_string())?;
        return Ok(false);
    }
    if let Some(s) = &v.secret {
        let name = s.secret_name.clone().unwrap_or_default();
        let optional = s.optional == Some(true);
        match Api::<Secret>::namespaced(client.clone(), ns)
            .get_opt(&name)
            .await
        {
            Ok(Some(sec)) => write_keys(
                dir,
                &secret_data(&sec),
                s.items.as_ref(),
                s.default_mode,
                fs_group,
                &format!("secret \"{name}\""),
                optional,
            )?,
            Ok(None) if optional => {}
            Ok(None) => return Err(format!("secret \"{name}\" not found")),
            Err(e) => return Err(format!("secret \"{name}\": {e}")),
        }
        return Ok(true);
    }
    if let Some(c) = &v.config_map {
        let name = c.name.clone();
        let optional = c.optional == Some(true);
        match Api::<ConfigMap>::namespaced(client.clone(), ns)
            .get_opt(&name)
            .await
        {
            Ok(Some(cm)) => write_keys(
                dir,
                &config_map_data(&cm),
                c.items.as_ref(),
                c.default_mode,
                fs_group,
                &format!("configmap \"{name}\""),
                optional,
            )?,
            Ok(None) if optional => {}
            Ok(None) => return Err(format!("configmap \"{name}\" not found")),
            Err(e) => return Err(format!("configmap \"{name}\": {e}")),
        }
        return Ok(true);
    }
    if let Some(d) = &v.downward_api {
        write_downward(
            dir,
            pod,
            d.items.as_deref().unwrap_or_default(),
            d.default_mode,
            fs_group,
        )?;
        return Ok(true);
    }
    if let Some(p) = &v.projected {
        for src in p.sources.clone().unwrap_or_default() {
            if let Some(t) = &src.service_account_token {
                let token =
                    request_token(client, pod, ns, t.audience.clone(), t.expiration_seconds)
                        .await?;
                write_file(
                    dir,
                    &t.path,
                    token.as_bytes(),
                    mode_of(None, p.default_mode),
                    fs_group,
                )?;
            }
            if let Some(c) = &src.config_map {
                let name = c.name.clone();
                let optional = c.optional == Some(true);
                match Api::<ConfigMap>::namespaced(client.clone(), ns)
                    .get_opt(&name)
                    .await
                {
                    Ok(Some(cm)) => write_keys(
                        dir,
                        &config_map_data(&cm),
                        c.items.as_ref(),
                        p.default_mode,
                        fs_group,
                        &format!("configmap \"{name}\""),
                        optional,
                    )?,
                    Ok(None) if optional => {}
                    Ok(None) => return Err(format!("configmap \"{name}\" not found")),
                    Err(e) => return Err(format!("configmap \"{name}\": {e}")),
                }
            }
            if let Some(s) = &src.secret {
                let name = s.name.clone();
                let optional = s.optional == Some(true);
                match Api::<Secret>::namespaced(client.clone(), ns)
                    .get_opt(&name)
                    .await
                {
                    Ok(Some(sec)) => write_keys(
                        dir,
                        &secret_data(&sec),
                        s.items.as_ref(),
                        p.default_mode,
                        fs_group,
                        &format!("secret \"{name}\""),
                        optional,
                    )?,
                    Ok(None) if optional => {}
                    Ok(None) => return Err(format!("secret \"{name}\" not found")),
                    Err(e) => return Err(format!("secret \"{name}\": {e}")),
                }
            }
            if let Some(d) = &src.downward_api {
                write_downward(
                    dir,
                    pod,
                    d.items.as_deref().unwrap_or_default(),
                    p.default_mode,
                    fs_group,
                )?;
            }
        }
        return Ok(true);
    }
    Err("this volume type is not supported by the local kubelet (captf-kubelet)".into())
}

/// A token of the Pod's service account, bound to the Pod, from the TokenRequest API.
async fn request_token(
    client: &Client,
    pod: &Pod,
    ns: &str,
    audience: Option<String>,
    expiration: Option<i64>,
) -> Result<String, Wait> {
    let sa = pod
        .spec
        .as_ref()
        .and_then(|s| s.service_account_name.clone())
        .unwrap_or_else(|| "default".into());
    let mut spec = json!({
        "boundObjectRef": {"apiVersion": "v1", "kind": "Pod", "name": pod.name_any(), "uid": pod.metadata.uid},
        "expirationSeconds": expiration.unwrap_or(3607),
    });
    if let Some(a) = audience.filter(|a| !a.is_empty()) {
        spec["audiences"] = json!([a]);
    }
    let body =
        json!({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": spec});
    let answer: Value = Api::<ServiceAccount>::namespaced(client.clone(), ns)
        .create_subresource("token", &sa, &PostParams::default(), &body)
        .await
        .map_err(|e| format!("failed to fetch token: {e}"))?;
    answer["status"]["token"]
        .as_str()
        .map(str::to_string)
        .ok_or_else(|| "failed to fetch token: no token in the answer".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod() -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": "p", "namespace": "n", "uid": "u",
                "labels": {"b": "2", "a": "1"}, "annotations": {"x": "y\"z"}},
            "spec": {"nodeName": "captf-local", "containers": [{"name": "c",
                "resources": {"requests": {"memory": "256Mi"}}}]}
        }))
        .unwrap()
    }

    #[test]
    fn downward_api_fields() {
        let p = pod();
        assert_eq!(field_value(&p, "metadata.name").unwrap(), "p");
        assert_eq!(field_value(&p, "metadata.namespace").unwrap(), "n");
        assert_eq!(
            field_value(&p, "metadata.labels").unwrap(),
            "a=\"1\"\nb=\"2\""
        );
        assert_eq!(
            field_value(&p, "metadata.annotations").unwrap(),
            "x=\"y\\\"z\""
        );
        assert_eq!(field_value(&p, "metadata.labels['b']").unwrap(), "2");
        assert_eq!(field_value(&p, "spec.nodeName").unwrap(), "captf-local");
        assert!(field_value(&p, "spec.nope").is_err());
        assert_eq!(resource_value(&p, Some("c"), "requests.memory"), "256Mi");
        assert_eq!(resource_value(&p, None, "requests.cpu"), "0");
    }

    #[test]
    fn files_get_their_mode_and_no_path_escapes() {
        let dir = std::env::temp_dir().join(format!("captf-kubelet-vol-{}", std::process::id()));
        let data: BTreeMap<String, Vec<u8>> = [("k".to_string(), b"v".to_vec())].into();
        write_keys(&dir, &data, None, Some(0o444), None, "s", false).unwrap();
        let meta = std::fs::metadata(dir.join("k")).unwrap();
        assert_eq!(meta.permissions().mode() & 0o777, 0o444);
        let items = vec![KeyToPath {
            key: "k".into(),
            path: "sub/f".into(),
            mode: Some(0o600),
        }];
        write_keys(&dir, &data, Some(&items), Some(0o444), None, "s", false).unwrap();
        let meta = std::fs::metadata(dir.join("sub/f")).unwrap();
        assert_eq!(meta.permissions().mode() & 0o777, 0o600);
        let missing = vec![KeyToPath {
            key: "nope".into(),
            path: "f".into(),
            mode: None,
        }];
        assert!(write_keys(&dir, &data, Some(&missing), None, None, "s", false).is_err());
        assert!(write_keys(&dir, &data, Some(&missing), None, None, "s", true).is_ok());
        assert!(write_file(&dir, "../escape", b"x", 0o644, None).is_err());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
