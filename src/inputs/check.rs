//! Reading an inputs Secret's untrusted bytes: the size limit, the versions read, the
//! required fields, a backend that must be the object's own, the module's file names and
//! what a run recorded. What is wrong is an [`InputsError`] that names the Secret and the
//! field.

use super::*;

/// Why inputs are unusable. `origin` names where they came from: the inputs Secret
/// (`inputs Secret <ns>/<name> key inputs.json`) or the object's spec.
#[derive(Debug, thiserror::Error, Clone, PartialEq)]
pub enum InputsError {
    #[error("{origin}: key `{key}` is missing or empty", key = names::INPUTS_KEY)]
    MissingKey { origin: String },
    #[error("{origin}: {size} bytes, larger than the limit of {limit} bytes", limit = INPUTS_MAX_BYTES)]
    TooLarge { origin: String, size: usize },
    #[error("{origin}: not JSON: {message}")]
    NotJson { origin: String, message: String },
    #[error("{origin}: not a JSON object")]
    NotObject { origin: String },
    #[error(
        "{origin}: unsupported version {found} (this CAPTF reads versions 1 to {INPUTS_VERSION_IDENTITY})"
    )]
    UnsupportedVersion { origin: String, found: String },
    #[error("{origin}: missing required field `{field}`")]
    MissingField { origin: String, field: &'static str },
    #[error("{origin}: field `{field}` is invalid: {message}")]
    InvalidField {
        origin: String,
        field: String,
        message: String,
    },
    #[error(
        "{origin}: `backend` points at namespace {namespace:?} / secretSuffix {suffix:?} instead of the object's own {expected_namespace:?} / {expected_suffix:?}"
    )]
    ForeignBackend {
        origin: String,
        namespace: String,
        suffix: String,
        expected_namespace: String,
        expected_suffix: String,
    },
    #[error(
        "{origin}: `module` has more than one of `source`, `files` and `path`; exactly one is allowed"
    )]
    ModuleBoth { origin: String },
    #[error("{origin}: `module` has none of `source`, `files` and `path`; exactly one is required")]
    ModuleNeither { origin: String },
    #[error("{origin}: `module.source` is empty")]
    EmptySource { origin: String },
    #[error("{origin}: module file name {name:?} is not allowed: {why}")]
    BadFileName {
        origin: String,
        name: String,
        why: &'static str,
    },
    #[error(
        "{origin}: variablesFrom {kind:?} {name:?} key {key:?} does not exist (the object or the key is missing)"
    )]
    VariablesSourceMissing {
        origin: String,
        kind: VariablesSourceKind,
        name: String,
        key: String,
    },
    #[error(
        "{origin}: variablesFrom {kind:?} {name:?} key {key:?} is not a JSON object of variables: {message}"
    )]
    VariablesNotObject {
        origin: String,
        kind: VariablesSourceKind,
        name: String,
        key: String,
        message: String,
    },
}

/// How the inputs Secret is named in messages.
pub(super) fn secret_origin(namespace: &str, suffix: &str) -> String {
    format!(
        "inputs Secret {namespace}/{} key {}",
        names::inputs_secret_name(suffix),
        names::INPUTS_KEY
    )
}

/// Parses and checks `inputs.json` for the object whose namespace and state suffix are
/// given. Unknown fields are ignored; a version other than 1 to 3, a missing required field (`runner`,
/// `module`, `backend`), a module with both or neither of `source` and `files`, a bad
/// module file name, or a backend that is not the object's own make the inputs unusable.
pub fn parse(bytes: &[u8], namespace: &str, suffix: &str) -> Result<Inputs, InputsError> {
    let origin = secret_origin(namespace, suffix);
    if bytes.len() > INPUTS_MAX_BYTES {
        return Err(InputsError::TooLarge {
            origin,
            size: bytes.len(),
        });
    }
    let value: Value = serde_json::from_slice(bytes).map_err(|e| InputsError::NotJson {
        origin: origin.clone(),
        message: e.to_string(),
    })?;
    let Value::Object(obj) = &value else {
        return Err(InputsError::NotObject { origin });
    };
    // The version first: a future version may have any other shape.
    match obj.get("version") {
        None => {
            return Err(InputsError::MissingField {
                origin,
                field: "version",
            });
        }
        Some(v)
            if v.as_u64()
                .and_then(|n| u32::try_from(n).ok())
                .is_some_and(|n| INPUTS_VERSIONS_READ.contains(&n)) => {}
        Some(v) => {
            return Err(InputsError::UnsupportedVersion {
                origin,
                found: v.to_string(),
            });
        }
    }
    for field in ["runner", "module", "backend"] {
        if obj.get(field).is_none_or(Value::is_null) {
            return Err(InputsError::MissingField { origin, field });
        }
    }
    if let Some(Value::Object(m)) = obj.get("module") {
        let has = |k: &str| m.get(k).is_some_and(|v| !v.is_null());
        match ["source", "files", "path"]
            .into_iter()
            .filter(|k| has(k))
            .count()
        {
            0 => return Err(InputsError::ModuleNeither { origin }),
            1 => {}
            _ => return Err(InputsError::ModuleBoth { origin }),
        }
    }
    // Each field on its own, so that a wrong type names its field.
    fn field<T: serde::de::DeserializeOwned>(
        obj: &Map<String, Value>,
        name: &str,
        origin: &str,
    ) -> Result<Option<T>, InputsError> {
        match obj.get(name) {
            None | Some(Value::Null) => Ok(None),
            // The error names the value's path inside the field (`env[1].secretKeyRef`).
            Some(v) => serde_path_to_error::deserialize(v).map(Some).map_err(|e| {
                let path = e.path().to_string();
                InputsError::InvalidField {
                    origin: origin.to_string(),
                    field: match path.as_str() {
                        "." => name.to_string(),
                        p if p.starts_with('[') => format!("{name}{p}"),
                        p => format!("{name}.{p}"),
                    },
                    message: e.into_inner().to_string(),
                }
            }),
        }
    }
    let version = obj
        .get("version")
        .and_then(Value::as_u64)
        .and_then(|n| u32::try_from(n).ok())
        .expect("checked above");
    let runner: Runner = field(obj, "runner", &origin)?.expect("checked above");
    let module: Module = field(obj, "module", &origin)?.expect("checked above");
    let backend: Backend = field(obj, "backend", &origin)?.expect("checked above");
    let inputs = Inputs {
        version,
        runner,
        module,
        variables: field(obj, "variables", &origin)?.unwrap_or_default(),
        env: field(obj, "env", &origin)?.unwrap_or_default(),
        backend,
        timeout_seconds: field(obj, "timeoutSeconds", &origin)?,
        lock_file: field(obj, "lockFile", &origin)?,
        contract_variables: field(obj, "contractVariables", &origin)?.unwrap_or_default(),
        ran: field(obj, "ran", &origin)?,
        identity: field(obj, "identity", &origin)?,
    };
    check(&inputs, namespace, suffix, &origin)?;
    Ok(inputs)
}

/// The checks shared by [`parse`] and [`build_from_spec`].
pub(super) fn check(
    inputs: &Inputs,
    namespace: &str,
    suffix: &str,
    origin: &str,
) -> Result<(), InputsError> {
    if inputs.backend.namespace != namespace || inputs.backend.secret_suffix != suffix {
        return Err(InputsError::ForeignBackend {
            origin: origin.to_string(),
            namespace: inputs.backend.namespace.clone(),
            suffix: inputs.backend.secret_suffix.clone(),
            expected_namespace: namespace.to_string(),
            expected_suffix: suffix.to_string(),
        });
    }
    // The module contract's variables are CAPTF's alone, and only they.
    if let Some(k) = inputs
        .variables
        .keys()
        .find(|k| k.starts_with(crate::contract::RESERVED_PREFIX))
    {
        return Err(InputsError::InvalidField {
            origin: origin.to_string(),
            field: format!("variables.{k}"),
            message: format!(
                "the prefix {} is reserved for the module contract's variables, which CAPTF gives",
                crate::contract::RESERVED_PREFIX
            ),
        });
    }
    if let Some(k) = inputs
        .contract_variables
        .keys()
        .find(|k| !k.starts_with(crate::contract::RESERVED_PREFIX))
    {
        return Err(InputsError::InvalidField {
            origin: origin.to_string(),
            field: format!("contractVariables.{k}"),
            message: format!(
                "not a contract variable (they start with {})",
                crate::contract::RESERVED_PREFIX
            ),
        });
    }
    if let Some(d) = inputs.ran.as_ref().and_then(|r| r.image_digest.as_ref())
        && image_digest_of(d).as_deref() != Some(d.as_str())
    {
        return Err(InputsError::InvalidField {
            origin: origin.to_string(),
            field: "ran.imageDigest".into(),
            message: format!("{d:?} is not <name>@sha256:<64 hex digits>"),
        });
    }
    if let Some(ran) = &inputs.ran {
        // The fetched files: at least one; the installed modules: with their manifest.
        let sets = [
            (&ran.module_files, "ran.moduleFiles", None),
            (
                &ran.installed_modules,
                "ran.installedModules",
                Some("modules.json"),
            ),
        ];
        for (files, field, required) in sets {
            if let Some(files) = files {
                check_ran_files(files, field, required).map_err(|message| {
                    InputsError::InvalidField {
                        origin: origin.to_string(),
                        field: field.into(),
                        message,
                    }
                })?;
            }
        }
    }
    if inputs.runner.image.trim().is_empty() {
        return Err(InputsError::InvalidField {
            origin: origin.to_string(),
            field: "runner.image".into(),
            message: "empty".into(),
        });
    }
    if let Some(t) = inputs.timeout_seconds
        && t <= 0
    {
        return Err(InputsError::InvalidField {
            origin: origin.to_string(),
            field: "timeoutSeconds".into(),
            message: format!("{t} is not a positive number of seconds"),
        });
    }
    for (field, dir) in [
        (
            "module.path",
            match &inputs.module {
                Module::Path(p) => Some(p),
                _ => None,
            },
        ),
        ("runner.pluginDir", inputs.runner.plugin_dir.as_ref()),
    ] {
        if let Some(dir) = dir
            && let Some(why) = bad_image_dir(dir)
        {
            return Err(InputsError::InvalidField {
                origin: origin.to_string(),
                field: field.into(),
                message: format!("{dir:?}: {why}"),
            });
        }
    }
    match &inputs.module {
        Module::Source(s) if s.trim().is_empty() => Err(InputsError::EmptySource {
            origin: origin.to_string(),
        }),
        Module::Source(_) | Module::Path(_) => Ok(()),
        Module::Files(files) => {
            for name in files.keys() {
                if let Some(why) = bad_file_name(name) {
                    return Err(InputsError::BadFileName {
                        origin: origin.to_string(),
                        name: name.clone(),
                        why,
                    });
                }
            }
            Ok(())
        }
    }
}

/// Why a module file name cannot be materialised under the module directory, if it cannot.
pub fn bad_file_name(name: &str) -> Option<&'static str> {
    if name.is_empty() {
        return Some("it is empty");
    }
    if name.starts_with('/') || name.starts_with('\\') {
        return Some("it is absolute");
    }
    if name.split(['/', '\\']).any(|c| c == "..") {
        return Some("it contains `..`");
    }
    if name.split('/').any(|c| c.is_empty() || c == ".") {
        return Some("it has an empty or `.` path element");
    }
    if name.chars().any(char::is_control) {
        return Some("it contains a control character");
    }
    None
}

/// Why a set of files `ran` recorded is unusable: a bad file name, none, `required`
/// missing, or more than [`RAN_MODULE_MAX_BYTES`].
fn check_ran_files(
    files: &BTreeMap<String, String>,
    field: &str,
    required: Option<&str>,
) -> Result<(), String> {
    if let Some((name, why)) = files.keys().find_map(|k| bad_file_name(k).map(|w| (k, w))) {
        return Err(format!("file name {name:?}: {why}"));
    }
    let size: usize = files.iter().map(|(k, v)| k.len() + v.len()).sum();
    let has_required = required.is_none_or(|r| files.contains_key(r));
    if files.is_empty() || !has_required || size > RAN_MODULE_MAX_BYTES {
        let needs = required.map_or("1 file".to_string(), str::to_string);
        return Err(format!(
            "{field}: {} files of {size} bytes: {needs} at least, and at most {RAN_MODULE_MAX_BYTES} bytes",
            files.len()
        ));
    }
    Ok(())
}

/// Why `dir` cannot name a directory in the runner image: it must be absolute, without
/// `..` or control characters.
fn bad_image_dir(dir: &str) -> Option<&'static str> {
    if !dir.starts_with('/') {
        return Some("not an absolute path");
    }
    if dir.split('/').any(|c| c == "..") {
        return Some("it contains `..`");
    }
    if dir.chars().any(char::is_control) {
        return Some("it contains a control character");
    }
    None
}
