//! The durable inputs Secret (SPEC section 3): everything a destroy needs, written by the
//! apply path before its Job and read back at deletion time, so that a destroy never depends
//! on a live source, template, `variablesFrom` object or bootstrap Secret that may be gone.
//!
//! The bytes of `inputs.json` are untrusted (anyone who can write Secrets in the namespace
//! can change them): they have a size limit, a version, required fields, and a backend that
//! must be the object's own. Anything else makes the inputs unusable, with a message that
//! says what is wrong and names the Secret and field.

use std::collections::BTreeMap;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use kube::api::ObjectMeta;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use sha2::{Digest, Sha256};

use crate::api::labels::Identity;
use crate::api::names;
use crate::api::types::{EnvFromSecret, TerraformSpec, VariablesSourceKind};

mod check;

pub use check::{InputsError, bad_file_name, parse};
use check::{check, secret_origin};

/// `inputs.json` larger than this is refused before it is parsed.
pub const INPUTS_MAX_BYTES: usize = 1024 * 1024;

/// The version this controller writes: 2, the inputs that may record what an apply ran
/// (`ran`, read by no CAPTF before it), so that an older CAPTF, which would fetch the
/// module and pull the image anew, refuses them instead of destroying with other code.
pub const INPUTS_VERSION: u32 = 2;

/// The version of inputs that record an identity (`identity`, read by no CAPTF before it),
/// so that an older CAPTF refuses them instead of destroying without the credentials.
pub const INPUTS_VERSION_IDENTITY: u32 = 3;

/// The versions this controller reads: 1 (SPEC section 3; what an older CAPTF wrote, or
/// another tool), 2 (version 1's fields, and `ran`) and 3 (version 2's, and `identity`).
pub const INPUTS_VERSIONS_READ: std::ops::RangeInclusive<u32> = 1..=INPUTS_VERSION_IDENTITY;

/// The version the hash `A/inputs-sha256` is taken in: the same inputs hash the same in
/// either version, so a new version re-applies nothing.
const HASHED_VERSION: u32 = 1;

/// `inputs.json`, version 1 or 2 (SPEC section 3; docs/provisioning/04-reproducibility.md).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Inputs {
    pub version: u32,
    pub runner: Runner,
    pub module: Module,
    /// The variables, fully resolved to values.
    #[serde(default)]
    pub variables: Map<String, Value>,
    /// Environment variables from Secrets: names of the Secrets and keys, never values.
    #[serde(default)]
    pub env: Vec<EnvFromSecret>,
    pub backend: Backend,
    /// The deadline of one attempt (the Job's `activeDeadlineSeconds`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_seconds: Option<i64>,
    /// The provider lock file (`.terraform.lock.hcl`) captured at apply.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lock_file: Option<String>,
    /// The module contract's variables (`captf_…`), as the apply gave them: rendered into
    /// `captf.auto.tfvars.json` beside `variables`, so a destroy has them when the Cluster
    /// API objects they came from (the bootstrap data) are gone. Absent when none.
    #[serde(default, skip_serializing_if = "Map::is_empty")]
    pub contract_variables: Map<String, Value>,
    /// What the latest successful apply ran (see [`Ran`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ran: Option<Ran>,
    /// The `TerraformClusterIdentity` the apply ran with (see [`IdentityUse`]); its destroy
    /// uses the same one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub identity: Option<IdentityUse>,
}

/// The identity an attempt ran with: its name, and the version of its Secret then. Who
/// runs the module, not what it asks for: not part of the inputs' hash, so neither a new
/// identity nor a rotated Secret re-applies by itself.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct IdentityUse {
    pub name: String,
    /// The `resourceVersion` of the identity's Secret the attempt was given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret_resource_version: Option<String>,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct Runner {
    pub image: String,
    /// `terraform` or `tofu`; absent: the runner's choice (`terraform`, else `tofu`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runtime: Option<crate::api::types::Runtime>,
    /// The providers' directory in the image (`init -plugin-dir`), when given.
    #[serde(default, rename = "pluginDir", skip_serializing_if = "Option::is_none")]
    pub plugin_dir: Option<String>,
}

/// What the latest successful apply ran, recorded after it for the destroy (absent until
/// then): the destroy runs the same without reaching a registry or a git host. What a run
/// recorded, not what the spec asked: it is not part of the inputs' hash.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct Ran {
    /// The image its Pod ran, by digest (`<name>@sha256:<hex>`, from the Pod's `imageID`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image_digest: Option<String>,
    /// The module's files as `init` fetched them from the source address (a module given
    /// as files needs none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub module_files: Option<BTreeMap<String, String>>,
    /// The provider lock file `init` wrote, when the inputs gave none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lock_file: Option<String>,
    /// The modules `init` installed for the module's `module` blocks with a remote source
    /// (a git host, a registry), as it left them under its data directory's `modules/`:
    /// their files and its `modules.json` (its own paths written as
    /// [`INSTALLED_MODULES_DIR_PLACEHOLDER`]). Put back before `init`, they are used as
    /// they are, and nothing is fetched.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub installed_modules: Option<BTreeMap<String, String>>,
}

/// How a recorded `modules.json` names the directory the modules were installed in; the
/// runner writes the directory of the run that puts them back.
pub const INSTALLED_MODULES_DIR_PLACEHOLDER: &str = "@CAPTF_MODULES_DIR@";

/// The most the fetched module files of a [`Ran`] may take (they go into the Pod's
/// annotations as inline files do, beside the runner script and the variables).
pub const RAN_MODULE_MAX_BYTES: usize = 160 * 1024;

/// `inputs` with as much of `record` as leaves them readable (within
/// [`INPUTS_MAX_BYTES`]) and renderable (`renders`: the destroy Job renders from them):
/// the installed modules are left out first, then the fetched module files, then the
/// lock file. None when even the rest does not fit: the destroy then runs from the
/// inputs as they were.
pub fn with_ran(
    inputs: &Inputs,
    mut record: Ran,
    renders: impl Fn(&Inputs) -> bool,
) -> Option<Inputs> {
    loop {
        let mut with = inputs.clone();
        with.ran = Some(record.clone());
        // `ran` is version 2's: an older CAPTF refuses the inputs rather than ignore it.
        with.version = with.version.max(INPUTS_VERSION);
        if with.to_json_bytes().len() <= INPUTS_MAX_BYTES && renders(&with) {
            return Some(with);
        }
        if record.installed_modules.take().is_some() {
            tracing::warn!(
                "the modules the apply's init installed are not kept: the destroy would not start with them, and fetches them again"
            );
        } else if record.module_files.take().is_some() {
            tracing::warn!(
                "the apply's fetched module files are not kept: the destroy would not start with them"
            );
        } else if record.lock_file.take().is_some() {
            tracing::warn!(
                "the apply's lock file is not kept: the destroy would not start with it"
            );
        } else {
            return None;
        }
    }
}

/// The image reference a container status's `imageID` names by digest: `<name>@sha256:<64
/// hex>` (Docker's `docker-pullable://` prefix dropped); none when it names no pullable
/// digest (an image ID without a repository, a runtime that reports none).
pub fn image_digest_of(image_id: &str) -> Option<String> {
    let id = image_id.trim();
    let id = id.strip_prefix("docker-pullable://").unwrap_or(id);
    let (name, hex) = id.split_once("@sha256:")?;
    (!name.is_empty()
        && !name.contains("://")
        && hex.len() == 64
        && hex
            .bytes()
            .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase()))
    .then(|| id.to_string())
}

/// Exactly one of a pinned source address or the module's files inline.
/// On the wire: `{"source": "…"}` or `{"files": {"main.tf": "…"}}`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(try_from = "ModuleRepr", into = "ModuleRepr")]
pub enum Module {
    Source(String),
    Files(BTreeMap<String, String>),
    /// A directory in the runner image.
    Path(String),
}

#[derive(Serialize, Deserialize, Default)]
struct ModuleRepr {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    source: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    files: Option<BTreeMap<String, String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    path: Option<String>,
}

impl TryFrom<ModuleRepr> for Module {
    type Error = String;
    fn try_from(r: ModuleRepr) -> Result<Self, String> {
        match (r.source, r.files, r.path) {
            (Some(s), None, None) => Ok(Module::Source(s)),
            (None, Some(f), None) => Ok(Module::Files(f)),
            (None, None, Some(p)) => Ok(Module::Path(p)),
            (None, None, None) => Err("`module` has none of `source`, `files` and `path`".into()),
            _ => Err("`module` has more than one of `source`, `files` and `path`".into()),
        }
    }
}

impl From<Module> for ModuleRepr {
    fn from(m: Module) -> Self {
        match m {
            Module::Source(s) => ModuleRepr {
                source: Some(s),
                ..Default::default()
            },
            Module::Files(f) => ModuleRepr {
                files: Some(f),
                ..Default::default()
            },
            Module::Path(p) => ModuleRepr {
                path: Some(p),
                ..Default::default()
            },
        }
    }
}

/// Terraform's kubernetes backend settings: always the object's own namespace and suffix.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct Backend {
    pub namespace: String,
    pub secret_suffix: String,
}

/// Reads `inputs.json` from the inputs Secret and parses it (see [`parse`]).
pub fn from_secret(secret: &Secret, namespace: &str, suffix: &str) -> Result<Inputs, InputsError> {
    let origin = secret_origin(namespace, suffix);
    let bytes = secret
        .data
        .as_ref()
        .and_then(|d| d.get(names::INPUTS_KEY))
        .map(|b| b.0.as_slice())
        .or_else(|| {
            secret
                .string_data
                .as_ref()
                .and_then(|d| d.get(names::INPUTS_KEY))
                .map(|s| s.as_bytes())
        })
        .filter(|b| !b.is_empty())
        .ok_or(InputsError::MissingKey { origin })?;
    parse(bytes, namespace, suffix)
}

/// Reads one `variablesFrom` value: `(kind, name, key)` to the key's bytes, `None` when
/// the object or the key does not exist.
pub type VariablesLookup<'a> = dyn Fn(VariablesSourceKind, &str, &str) -> Option<Vec<u8>> + 'a;

/// "The current inputs when they build" (SPEC section 3): builds the inputs from an object's
/// spec. `variablesFrom` entries are resolved in order through `lookup(kind, name, key)`
/// (each value must be a JSON object; a missing object or key is an error naming it), later
/// entries win, and `variables` wins over all of them. Only the names of credentials
/// Secrets are copied. The backend is the object's own namespace and suffix.
pub fn build_from_spec(
    spec: &TerraformSpec,
    namespace: &str,
    suffix: &str,
    lookup: &VariablesLookup,
) -> Result<Inputs, InputsError> {
    let origin = "spec".to_string();
    let module = match (&spec.module.source, &spec.module.files, &spec.module.path) {
        (Some(s), None, None) => Module::Source(s.clone()),
        (None, Some(f), None) => Module::Files(f.clone()),
        (None, None, Some(p)) => Module::Path(p.clone()),
        (None, None, None) => return Err(InputsError::ModuleNeither { origin }),
        _ => return Err(InputsError::ModuleBoth { origin }),
    };
    let mut variables = Map::new();
    for from in &spec.variables_from {
        let missing = || InputsError::VariablesSourceMissing {
            origin: origin.clone(),
            kind: from.kind,
            name: from.name.clone(),
            key: from.key.clone(),
        };
        let bytes = lookup(from.kind, &from.name, &from.key).ok_or_else(missing)?;
        let not_object = |message: String| InputsError::VariablesNotObject {
            origin: origin.clone(),
            kind: from.kind,
            name: from.name.clone(),
            key: from.key.clone(),
            message,
        };
        match serde_json::from_slice::<Value>(&bytes) {
            Ok(Value::Object(m)) => variables.extend(m),
            Ok(other) => return Err(not_object(format!("found {}", json_type(&other)))),
            Err(e) => return Err(not_object(e.to_string())),
        }
    }
    if let Some(v) = &spec.variables {
        variables.extend(v.clone());
    }
    let inputs = Inputs {
        version: INPUTS_VERSION,
        runner: Runner {
            image: spec.runner.image.clone(),
            runtime: spec.runner.runtime,
            plugin_dir: spec.runner.plugin_dir.clone(),
        },
        module,
        variables,
        env: spec.env.clone(),
        backend: Backend {
            namespace: namespace.to_string(),
            secret_suffix: suffix.to_string(),
        },
        timeout_seconds: Some(spec.runner.timeout_seconds),
        lock_file: spec.lock_file.clone(),
        contract_variables: Map::new(),
        ran: None,
        identity: None,
    };
    check(&inputs, namespace, suffix, "spec")?;
    let bytes = inputs.to_json_bytes();
    if bytes.len() > INPUTS_MAX_BYTES {
        return Err(InputsError::TooLarge {
            origin: "spec".into(),
            size: bytes.len(),
        });
    }
    Ok(inputs)
}

fn json_type(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

impl Inputs {
    /// The canonical bytes: struct fields in declaration order, every map with sorted keys
    /// (serde_json's `Map` is a `BTreeMap` here: the crate does not enable `preserve_order`;
    /// a test guards that), no whitespace. What the apply path writes and hashes.
    pub fn to_json_bytes(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("inputs always serialize")
    }

    /// Lowercase hex SHA-256 of `bytes` (the `A/inputs-sha256` annotation).
    pub fn sha256_hex(bytes: &[u8]) -> String {
        Sha256::digest(bytes)
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect()
    }

    /// The hash of [`Inputs::to_json_bytes`] in version 1, without what a run recorded
    /// (`ran`) and the identity it ran with: the hash is of what the spec asked for, so
    /// neither recording what ran, nor an identity, nor a new version of the format makes
    /// the inputs look changed.
    pub fn sha256(&self) -> String {
        if self.ran.is_none() && self.identity.is_none() && self.version == HASHED_VERSION {
            return Self::sha256_hex(&self.to_json_bytes());
        }
        let mut asked = self.clone();
        asked.ran = None;
        asked.identity = None;
        asked.version = HASHED_VERSION;
        Self::sha256_hex(&asked.to_json_bytes())
    }

    /// These inputs recording that they run with `identity` (version 3, which an older
    /// CAPTF refuses rather than run without the credentials); None: as they are.
    pub fn with_identity(&self, identity: Option<IdentityUse>) -> Inputs {
        let mut i = self.clone();
        if identity.is_some() {
            i.version = i.version.max(INPUTS_VERSION_IDENTITY);
        }
        i.identity = identity;
        i
    }

    /// These inputs with the runner image `image` in place of what the apply ran (an
    /// operator's word: see [`names::RUNNER_IMAGE`]); an empty one changes nothing.
    pub fn with_runner_image(&self, image: &str) -> Inputs {
        let mut i = self.clone();
        let image = image.trim();
        if image.is_empty() {
            return i;
        }
        i.runner.image = image.to_string();
        if let Some(ran) = i.ran.as_mut() {
            ran.image_digest = None;
        }
        i
    }

    /// The image a Job runs: the digest the apply ran, else the image as given.
    pub fn run_image(&self) -> &str {
        self.ran
            .as_ref()
            .and_then(|r| r.image_digest.as_deref())
            .unwrap_or(&self.runner.image)
    }

    /// The module a Job runs: the files the apply fetched from its source address, else
    /// the module as given.
    pub fn run_module(&self) -> std::borrow::Cow<'_, Module> {
        match (
            &self.module,
            self.ran.as_ref().and_then(|r| r.module_files.as_ref()),
        ) {
            (Module::Source(_), Some(files)) => {
                std::borrow::Cow::Owned(Module::Files(files.clone()))
            }
            (m, _) => std::borrow::Cow::Borrowed(m),
        }
    }

    /// The modules a Job puts back before `init`: those the apply's `init` installed.
    pub fn run_installed_modules(&self) -> Option<&BTreeMap<String, String>> {
        self.ran.as_ref().and_then(|r| r.installed_modules.as_ref())
    }

    /// The provider lock file a Job uses: the one given, else the one the apply's `init`
    /// wrote.
    pub fn run_lock_file(&self) -> Option<&str> {
        self.lock_file
            .as_deref()
            .or_else(|| self.ran.as_ref().and_then(|r| r.lock_file.as_deref()))
    }

    /// The per-attempt deadline, with the default when the inputs name none.
    pub fn timeout_or_default(&self) -> i64 {
        self.timeout_seconds
            .unwrap_or(crate::api::types::DEFAULT_TIMEOUT_SECONDS)
    }
}

/// Whether rebuilt inputs may be used: true when the object records no hash, else when the
/// hash of the rebuilt inputs' canonical bytes equals the recorded one (a changed region or
/// credential would make Terraform's refresh forget every resource and "succeed").
pub fn rebuilt_matches(inputs: &Inputs, recorded_sha: Option<&str>) -> bool {
    match recorded_sha {
        None => true,
        Some(sha) => inputs.sha256().eq_ignore_ascii_case(sha.trim()),
    }
}

/// The inputs Secret as the apply path writes it: `captf-inputs-<suffix>` with key
/// `inputs.json` (canonical bytes), the protection finalizer, the move label and the owner
/// labels, and no ownerReference (garbage collection must not take it while the object is
/// held). The caller records [`Inputs::sha256`] in `A/inputs-sha256`.
pub fn inputs_secret(inputs: &Inputs, owner: &Identity) -> Secret {
    let labels = owner.moved_labels();
    Secret {
        metadata: ObjectMeta {
            name: Some(names::inputs_secret_name(&owner.suffix())),
            namespace: Some(owner.namespace.to_string()),
            labels: Some(labels),
            finalizers: Some(vec![names::PROTECT_FINALIZER.to_string()]),
            ..Default::default()
        },
        type_: Some("Opaque".to_string()),
        data: Some(BTreeMap::from([(
            names::INPUTS_KEY.to_string(),
            ByteString(inputs.to_json_bytes()),
        )])),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests;
