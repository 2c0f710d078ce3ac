//! Local images: `--image-store DIR` holds OCI image layouts (directories with an
//! `index.json`) and OCI archives (`*.tar`: a layout in a tar, as `release/build-image`,
//! `umoci` and `skopeo copy … oci-archive:…` write them). A Pod's image names one of them
//! when a manifest of a layout's index carries that reference in its annotation
//! `org.opencontainers.image.ref.name` (or containerd's `io.containerd.image.name`), both
//! read as Docker reads a reference (`busybox` is `docker.io/library/busybox:latest`); a
//! reference by digest names the manifest of that digest. An index entry that is itself an
//! index (a multi-platform image) gives its manifest for linux and this machine's
//! architecture.
//!
//! A found image is unpacked once per manifest digest under the kubelet's root directory
//! (an archive is first extracted once per file, by path, size and modification time):
//! its layers in order, each blob checked against its digest, with the OCI whiteouts
//! (`.wh.NAME` removes NAME of the layers below, `.wh..wh..opq` empties its directory
//! of them), owners, modes and times kept; device nodes are skipped (the container gets a
//! `/dev` of its own). Layers are tar, gzip or (as Docker names them) gzip again; zstd is
//! refused with a message naming the image. The image's config gives what a container
//! that does not say otherwise runs: its entrypoint and command, environment, user and
//! working directory.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{BufReader, Read};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use serde::Deserialize;
use sha2::Digest;

/// The annotations a layout's index names a manifest's reference with.
const REF_NAME: &str = "org.opencontainers.image.ref.name";
const CONTAINERD_NAME: &str = "io.containerd.image.name";

/// An image reference as Docker reads it: the repository fully qualified, and a tag
/// (`latest` when it names neither tag nor digest) or a digest.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reference {
    pub repository: String,
    pub tag: Option<String>,
    pub digest: Option<String>,
}

impl Reference {
    pub fn parse(reference: &str) -> Reference {
        let (rest, digest) = match reference.split_once('@') {
            Some((name, digest)) => (name, Some(digest.to_string())),
            None => (reference, None),
        };
        // The tag is after the last `:` that follows the last `/` (a registry's port is
        // before it).
        let (name, tag) = match rest.rsplit_once(':') {
            Some((name, tag)) if !tag.contains('/') => (name, Some(tag.to_string())),
            _ => (rest, None),
        };
        let (first, rest) = name.split_once('/').unwrap_or(("", name));
        let domain = first.contains('.') || first.contains(':') || first == "localhost";
        let repository = match (domain, rest.contains('/')) {
            // Docker Hub's official images live under library/, whichever way it is named.
            (true, false) if first == "docker.io" || first == "index.docker.io" => {
                format!("docker.io/library/{rest}")
            }
            (true, _) if first == "index.docker.io" => format!("docker.io/{rest}"),
            (true, _) => name.to_string(),
            (false, _) if name.contains('/') => format!("docker.io/{name}"),
            (false, _) => format!("docker.io/library/{name}"),
        };
        let tag = match (&tag, &digest) {
            (None, None) => Some("latest".to_string()),
            _ => tag,
        };
        Reference {
            repository,
            tag,
            digest,
        }
    }

    /// Whether a manifest annotated with `annotated`, of digest `digest`, is what this
    /// reference names.
    fn names(&self, annotated: &Reference, digest: &str) -> bool {
        self.repository == annotated.repository
            && match &self.digest {
                Some(d) => d == digest,
                None => self.tag == annotated.tag,
            }
    }
}

/// What of an image's config a container runs with (OCI image config, `config` object).
#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(rename_all = "PascalCase")]
pub struct ImageConfig {
    #[serde(default)]
    pub entrypoint: Option<Vec<String>>,
    #[serde(default)]
    pub cmd: Option<Vec<String>>,
    #[serde(default)]
    pub env: Option<Vec<String>>,
    #[serde(default)]
    pub user: Option<String>,
    #[serde(default)]
    pub working_dir: Option<String>,
}

impl ImageConfig {
    /// The image's environment as pairs (an entry without `=` is a variable set empty).
    pub fn env_pairs(&self) -> Vec<(String, String)> {
        self.env
            .iter()
            .flatten()
            .map(|e| match e.split_once('=') {
                Some((k, v)) => (k.to_string(), v.to_string()),
                None => (e.clone(), String::new()),
            })
            .collect()
    }
}

/// An image of the store, unpacked.
#[derive(Clone, Debug)]
pub struct Image {
    /// The manifest's digest (`sha256:…`).
    pub digest: String,
    /// The repository it was found by, fully qualified.
    pub repository: String,
    pub config: ImageConfig,
    /// The unpacked root filesystem (shared by every container of the image: the overlay's
    /// lower layer, never written).
    pub rootfs: PathBuf,
}

impl Image {
    /// The `imageID` a node reports: the repository by the manifest's digest.
    pub fn id(&self) -> String {
        format!("{}@{}", self.repository, self.digest)
    }

    /// The user the image runs as (its config's `User`: `uid`, `uid:gid`, `name` or
    /// `name:group`, names read from the image's `/etc/passwd` and `/etc/group`): the uid,
    /// and the gid when the image says or its passwd entry gives one. `None` for the uid
    /// when the image names no user (root).
    pub fn user(&self) -> Result<ImageUser, String> {
        let spec = self.config.user.clone().unwrap_or_default();
        let (user, group) = match spec.split_once(':') {
            Some((u, g)) => (u.to_string(), Some(g.to_string())),
            None => (spec.clone(), None),
        };
        let passwd = std::fs::read_to_string(self.rootfs.join("etc/passwd")).unwrap_or_default();
        let groups = std::fs::read_to_string(self.rootfs.join("etc/group")).unwrap_or_default();
        let entries: Vec<Vec<&str>> = passwd
            .lines()
            .map(|l| l.split(':').collect::<Vec<_>>())
            .filter(|f| f.len() >= 7)
            .collect();
        let uid = if user.is_empty() {
            None
        } else if let Ok(n) = user.parse::<u32>() {
            Some(n)
        } else {
            match entries.iter().find(|f| f[0] == user) {
                Some(f) => Some(f[2].parse::<u32>().map_err(|_| {
                    format!(
                        "the image's /etc/passwd gives user {user} the uid {:?}",
                        f[2]
                    )
                })?),
                None => {
                    return Err(format!(
                        "unable to find user {user}: no matching entries in passwd file"
                    ));
                }
            }
        };
        let entry = entries
            .iter()
            .find(|f| f[2].parse::<u32>().ok() == Some(uid.unwrap_or(0)));
        let gid = match group.filter(|g| !g.is_empty()) {
            Some(g) => Some(match g.parse::<u32>() {
                Ok(n) => n,
                Err(_) => groups
                    .lines()
                    .map(|l| l.split(':').collect::<Vec<_>>())
                    .find(|f| f.len() >= 3 && f[0] == g)
                    .and_then(|f| f[2].parse::<u32>().ok())
                    .ok_or_else(|| {
                        format!("unable to find group {g}: no matching entries in group file")
                    })?,
            }),
            None => entry.and_then(|f| f[3].parse::<u32>().ok()),
        };
        Ok(ImageUser {
            uid,
            gid,
            name: (!user.is_empty() && user.parse::<u32>().is_err()).then_some(user),
        })
    }
}

/// [`Image::user`].
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ImageUser {
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    /// The user's name when the image names it so (the kubelet cannot then check
    /// `runAsNonRoot` without a `runAsUser`).
    pub name: Option<String>,
}

impl Image {
    /// The primary group and home directory of `uid` in the image's `/etc/passwd`, as a
    /// runtime gives them to a user the Pod names by uid (`runAsUser`).
    pub fn account(&self, uid: u32) -> Option<(u32, String)> {
        let passwd = std::fs::read_to_string(self.rootfs.join("etc/passwd")).ok()?;
        passwd
            .lines()
            .map(|l| l.split(':').collect::<Vec<_>>())
            .filter(|f| f.len() >= 7)
            .find(|f| f[2].parse::<u32>().ok() == Some(uid))
            .and_then(|f| Some((f[3].parse::<u32>().ok()?, f[5].to_string())))
    }
}

/// The store: where the images are, and where they are unpacked.
pub struct Store {
    dir: PathBuf,
    cache: PathBuf,
    /// One unpacking at a time (two Pods of one image unpack it once).
    unpacking: Mutex<()>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Descriptor {
    #[serde(default)]
    media_type: String,
    digest: String,
    #[serde(default)]
    annotations: BTreeMap<String, String>,
    #[serde(default)]
    platform: Option<Platform>,
}

#[derive(Deserialize)]
struct Platform {
    #[serde(default)]
    architecture: String,
    #[serde(default)]
    os: String,
}

#[derive(Deserialize)]
struct Index {
    #[serde(default)]
    manifests: Vec<Descriptor>,
}

#[derive(Deserialize)]
struct Manifest {
    config: Descriptor,
    #[serde(default)]
    layers: Vec<Descriptor>,
}

#[derive(Deserialize)]
struct ConfigBlob {
    #[serde(default)]
    config: ImageConfig,
}

fn is_index(media_type: &str) -> bool {
    media_type == "application/vnd.oci.image.index.v1+json"
        || media_type == "application/vnd.docker.distribution.manifest.list.v2+json"
}

/// This machine's architecture as OCI names it.
fn architecture() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        other => other,
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

impl Store {
    /// The store in `dir`, unpacking under `cache`.
    pub fn new(dir: PathBuf, cache: PathBuf) -> Result<Store, String> {
        if !dir.is_dir() {
            return Err(format!(
                "--image-store {}: not a directory (it holds OCI image layouts and archives)",
                dir.display()
            ));
        }
        Ok(Store {
            dir,
            cache,
            unpacking: Mutex::new(()),
        })
    }

    /// The image `reference` names, unpacked; `None` when no layout or archive of the store
    /// has it. An image that is there but cannot be read is an error naming its file.
    pub fn find(&self, reference: &str) -> Result<Option<Image>, String> {
        let wanted = Reference::parse(reference);
        let _one = self.unpacking.lock().unwrap_or_else(|e| e.into_inner());
        let mut entries: Vec<PathBuf> = std::fs::read_dir(&self.dir)
            .map_err(|e| format!("--image-store {}: {e}", self.dir.display()))?
            .flatten()
            .map(|e| e.path())
            .collect();
        entries.sort();
        for entry in entries {
            let layout = if entry.join("index.json").is_file() {
                entry.clone()
            } else if entry.is_file() && entry.extension().is_some_and(|e| e == "tar") {
                self.extracted(&entry)?
            } else {
                continue;
            };
            let index: Index = read_json(&layout.join("index.json"))
                .map_err(|e| format!("{}: {e}", entry.display()))?;
            for d in &index.manifests {
                let named = [REF_NAME, CONTAINERD_NAME]
                    .iter()
                    .filter_map(|k| d.annotations.get(*k))
                    .map(|r| Reference::parse(r))
                    .find(|r| wanted.names(r, &d.digest));
                if let Some(named) = named {
                    let image = self
                        .unpack(&layout, d, &named.repository)
                        .map_err(|e| format!("image {reference} in {}: {e}", entry.display()))?;
                    return Ok(Some(image));
                }
            }
        }
        Ok(None)
    }

    /// An archive's layout, extracted once per file (path, size, modification time).
    fn extracted(&self, archive: &Path) -> Result<PathBuf, String> {
        let meta = std::fs::metadata(archive).map_err(|e| format!("{}: {e}", archive.display()))?;
        let mtime = meta
            .modified()
            .ok()
            .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
            .map_or(0, |d| d.as_nanos());
        let key = hex(&sha2::Sha256::digest(
            format!("{}\n{}\n{mtime}", archive.display(), meta.len()).as_bytes(),
        ));
        let dir = self.cache.join("layouts").join(&key[..32]);
        if dir.join("index.json").is_file() {
            return Ok(dir);
        }
        let tmp = dir.with_extension("tmp");
        let _ = std::fs::remove_dir_all(&tmp);
        std::fs::create_dir_all(&tmp).map_err(|e| format!("{}: {e}", tmp.display()))?;
        let file = File::open(archive).map_err(|e| format!("{}: {e}", archive.display()))?;
        tar::Archive::new(BufReader::new(file))
            .unpack(&tmp)
            .map_err(|e| format!("{}: not a readable OCI archive: {e}", archive.display()))?;
        if !tmp.join("index.json").is_file() {
            return Err(format!(
                "{}: not an OCI archive (no index.json at its root)",
                archive.display()
            ));
        }
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::rename(&tmp, &dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        Ok(dir)
    }

    /// The image of the index entry `d` of `layout`: its manifest (for this platform when
    /// `d` is an index), its config, its layers unpacked once per manifest digest.
    fn unpack(&self, layout: &Path, d: &Descriptor, repository: &str) -> Result<Image, String> {
        let mut digest = d.digest.clone();
        if is_index(&d.media_type) {
            let inner: Index = serde_json::from_slice(&blob(layout, &digest)?)
                .map_err(|e| format!("the index {digest}: {e}"))?;
            let arch = architecture();
            digest = inner
                .manifests
                .iter()
                .find(|m| {
                    m.platform
                        .as_ref()
                        .is_some_and(|p| p.os == "linux" && p.architecture == arch)
                })
                .map(|m| m.digest.clone())
                .ok_or_else(|| format!("the index {digest} has no manifest for linux/{arch}"))?;
        }
        let manifest: Manifest = serde_json::from_slice(&blob(layout, &digest)?)
            .map_err(|e| format!("the manifest {digest}: {e}"))?;
        let config: ConfigBlob = serde_json::from_slice(&blob(layout, &manifest.config.digest)?)
            .map_err(|e| format!("the config {}: {e}", manifest.config.digest))?;
        let hexdigest = digest.trim_start_matches("sha256:");
        let rootfs = self.cache.join("rootfs").join(hexdigest);
        if !rootfs.is_dir() {
            let tmp = self.cache.join("rootfs").join(format!("{hexdigest}.tmp"));
            let _ = std::fs::remove_dir_all(&tmp);
            std::fs::create_dir_all(&tmp).map_err(|e| format!("{}: {e}", tmp.display()))?;
            for layer in &manifest.layers {
                unpack_layer(layout, layer, &tmp)
                    .map_err(|e| format!("the layer {}: {e}", layer.digest))?;
            }
            std::fs::rename(&tmp, &rootfs).map_err(|e| format!("{}: {e}", rootfs.display()))?;
        }
        Ok(Image {
            digest,
            repository: repository.to_string(),
            config: config.config,
            rootfs,
        })
    }
}

fn read_json<T: serde::de::DeserializeOwned>(path: &Path) -> Result<T, String> {
    let bytes = std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?;
    serde_json::from_slice(&bytes).map_err(|e| format!("{}: {e}", path.display()))
}

fn blob_path(layout: &Path, digest: &str) -> Result<PathBuf, String> {
    let (algorithm, hex) = digest
        .split_once(':')
        .ok_or_else(|| format!("{digest:?} is not a digest"))?;
    if algorithm != "sha256" || hex.len() != 64 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(format!("{digest:?} is not a sha256 digest"));
    }
    Ok(layout.join("blobs").join(algorithm).join(hex))
}

/// A small blob (index, manifest, config), checked against its digest.
fn blob(layout: &Path, digest: &str) -> Result<Vec<u8>, String> {
    let path = blob_path(layout, digest)?;
    let bytes = std::fs::read(&path).map_err(|e| format!("{}: {e}", path.display()))?;
    let got = format!("sha256:{}", hex(&sha2::Sha256::digest(&bytes)));
    if got != digest {
        return Err(format!("{} holds {got}, not {digest}", path.display()));
    }
    Ok(bytes)
}

/// Reads through, hashing what it read.
struct Hashing<R> {
    inner: R,
    hash: sha2::Sha256,
}

impl<R: Read> Read for Hashing<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.hash.update(&buf[..n]);
        Ok(n)
    }
}

/// Unpacks one layer over `root`, with the whiteouts, and checks its digest.
fn unpack_layer(layout: &Path, layer: &Descriptor, root: &Path) -> Result<(), String> {
    let path = blob_path(layout, &layer.digest)?;
    let file = File::open(&path).map_err(|e| format!("{}: {e}", path.display()))?;
    let mut hashing = Hashing {
        inner: BufReader::new(file),
        hash: sha2::Sha256::new(),
    };
    let mt = layer.media_type.as_str();
    if mt.ends_with("+zstd") || mt.ends_with(".zstd") {
        return Err(format!(
            "{mt}: zstd layers are not supported by the local kubelet (captf-kubelet); use gzip"
        ));
    }
    let gzip = mt.ends_with("+gzip") || mt.ends_with(".gzip");
    {
        let reader: Box<dyn Read + '_> = if gzip {
            Box::new(flate2::read::MultiGzDecoder::new(&mut hashing))
        } else {
            Box::new(&mut hashing)
        };
        let mut archive = tar::Archive::new(reader);
        archive.set_preserve_permissions(true);
        archive.set_preserve_ownerships(true);
        archive.set_preserve_mtime(true);
        archive.set_unpack_xattrs(false);
        apply_layer(&mut archive, root)?;
        // The rest of the blob (the tar's end and padding, the gzip trailer) counts too.
        std::io::copy(&mut archive.into_inner(), &mut std::io::sink())
            .map_err(|e| e.to_string())?;
    }
    std::io::copy(&mut hashing.inner, &mut std::io::sink()).map_err(|e| e.to_string())?;
    let got = format!("sha256:{}", hex(&hashing.hash.finalize()));
    if got != layer.digest {
        return Err(format!(
            "{} holds {got}, not {}",
            path.display(),
            layer.digest
        ));
    }
    Ok(())
}

/// The entries of one layer over `root`: whiteouts remove what the layers below made,
/// anything else replaces it.
fn apply_layer<R: Read>(archive: &mut tar::Archive<R>, root: &Path) -> Result<(), String> {
    for entry in archive.entries().map_err(|e| e.to_string())? {
        let mut entry = entry.map_err(|e| e.to_string())?;
        let path = entry.path().map_err(|e| e.to_string())?.into_owned();
        // Relative to the root, as tar reads it (umoci writes the root itself as `/`).
        let mut rel = PathBuf::new();
        for c in path.components() {
            match c {
                std::path::Component::Normal(n) => rel.push(n),
                std::path::Component::RootDir | std::path::Component::CurDir => {}
                _ => return Err(format!("{}: a path out of the layer", path.display())),
            }
        }
        if rel.as_os_str().is_empty() {
            continue;
        }
        let name = rel
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let parent = root.join(rel.parent().unwrap_or(Path::new("")));
        if name == ".wh..wh..opq" {
            if let Ok(children) = std::fs::read_dir(&parent) {
                for child in children.flatten() {
                    remove(&child.path())?;
                }
            }
            continue;
        }
        if let Some(hidden) = name.strip_prefix(".wh.") {
            remove(&parent.join(hidden))?;
            continue;
        }
        let kind = entry.header().entry_type();
        if matches!(
            kind,
            tar::EntryType::Char | tar::EntryType::Block | tar::EntryType::Fifo
        ) {
            continue;
        }
        let target = root.join(&rel);
        // What a lower layer made there gives way, but a directory stays a directory.
        if let Ok(meta) = std::fs::symlink_metadata(&target)
            && !(meta.is_dir() && kind == tar::EntryType::Directory)
        {
            remove(&target)?;
        }
        entry
            .unpack_in(root)
            .map_err(|e| format!("{}: {e}", rel.display()))?;
    }
    Ok(())
}

fn remove(path: &Path) -> Result<(), String> {
    let r = match std::fs::symlink_metadata(path) {
        Err(_) => return Ok(()),
        Ok(m) if m.is_dir() => std::fs::remove_dir_all(path),
        Ok(_) => std::fs::remove_file(path),
    };
    r.map_err(|e| format!("{}: {e}", path.display()))
}

#[cfg(test)]
#[path = "images_tests.rs"]
mod tests;
