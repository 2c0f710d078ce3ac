//! The Job templates: `templates/job.yaml` (a batch/v1 Job manifest with placeholders)
//! and `templates/runner.sh` (the runner script, used as is), embedded in the binary and
//! replaceable by a directory given at runtime (`--templates-dir`).
//!
//! Placeholder syntax in `job.yaml`: `{{ name }}` (spaces optional), standing for a whole
//! YAML scalar. It is replaced by the value as a double-quoted JSON string, which is a
//! valid, fully escaped YAML scalar, so no value can inject YAML. A name that is not one
//! of [`PLACEHOLDERS`] is an error, and so is a `{{` without its `}}`. `runner.sh` has no
//! placeholders (it reads its settings from the environment).

use std::collections::BTreeMap;
use std::path::Path;

use k8s_openapi::api::batch::v1::Job;

use super::RenderError;

/// The embedded Job manifest template.
pub const EMBEDDED_JOB: &str = include_str!("../../templates/job.yaml");
/// The embedded runner script.
pub const EMBEDDED_RUNNER: &str = include_str!("../../templates/runner.sh");

/// File names inside a templates directory.
pub const JOB_FILE: &str = "job.yaml";
pub const RUNNER_FILE: &str = "runner.sh";

/// Every placeholder a Job template may use.
pub const PLACEHOLDERS: &[&str] = &[
    "name",
    "namespace",
    "image",
    "operation",
    "attempt",
    "suffix",
    "ownerKind",
    "ownerName",
    "ownerUid",
    "clusterName",
    "serviceAccountName",
];

/// The two templates.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Templates {
    /// The Job manifest, with placeholders.
    pub job: String,
    /// The runner script.
    pub runner: String,
    /// The image of the state proxy to put beside the runner (manager flag
    /// `--state-proxy-image`): `None`, none, and the runner holds the Pod's token.
    pub state_proxy_image: Option<String>,
}

impl Templates {
    /// The templates built into the binary.
    pub fn embedded() -> Templates {
        Templates {
            job: EMBEDDED_JOB.to_string(),
            runner: EMBEDDED_RUNNER.to_string(),
            state_proxy_image: None,
        }
    }

    /// Reads `job.yaml` and `runner.sh` from `dir`; a file the directory does not have is
    /// the embedded one. The Job template is tried once with sample values, so that a
    /// broken template is reported when the manager starts, not at the first deletion.
    pub fn load_dir(dir: &Path) -> Result<Templates, RenderError> {
        let meta = std::fs::metadata(dir).map_err(|e| RenderError::Io {
            path: dir.display().to_string(),
            message: e.to_string(),
        })?;
        if !meta.is_dir() {
            return Err(RenderError::Io {
                path: dir.display().to_string(),
                message: "not a directory".into(),
            });
        }
        let read = |name: &str, embedded: &str| -> Result<String, RenderError> {
            let path = dir.join(name);
            match std::fs::read_to_string(&path) {
                Ok(text) => Ok(text),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(embedded.to_string()),
                Err(e) => Err(RenderError::Io {
                    path: path.display().to_string(),
                    message: e.to_string(),
                }),
            }
        };
        let templates = Templates {
            job: read(JOB_FILE, EMBEDDED_JOB)?,
            runner: read(RUNNER_FILE, EMBEDDED_RUNNER)?,
            state_proxy_image: None,
        };
        let sample: BTreeMap<&str, String> = PLACEHOLDERS
            .iter()
            .map(|p| (*p, format!("sample-{p}")))
            .collect();
        templates.job_with(&sample)?;
        Ok(templates)
    }

    /// The Job template with each placeholder replaced by `values`' value, parsed.
    pub fn job_with(&self, values: &BTreeMap<&str, String>) -> Result<Job, RenderError> {
        serde_saphyr::from_str(&substitute(&self.job, values)?).map_err(|e| RenderError::Yaml {
            message: e.to_string(),
        })
    }
}

/// Replaces each `{{ name }}` in `template` by `values[name]` as a JSON string.
pub fn substitute(template: &str, values: &BTreeMap<&str, String>) -> Result<String, RenderError> {
    let mut out = String::with_capacity(template.len());
    let mut rest = template;
    let line_of = |rest: &str| {
        template[..template.len() - rest.len()]
            .matches('\n')
            .count()
            + 1
    };
    while let Some(start) = rest.find("{{") {
        out.push_str(&rest[..start]);
        let after = &rest[start + 2..];
        let Some(end) = after.find("}}") else {
            return Err(RenderError::Template {
                line: line_of(&rest[start..]),
                message: "`{{` without `}}`".into(),
            });
        };
        let name = after[..end].trim();
        let Some(value) = values.get(name) else {
            return Err(RenderError::Template {
                line: line_of(&rest[start..]),
                message: format!(
                    "unknown placeholder {name:?} (known: {})",
                    PLACEHOLDERS.join(", ")
                ),
            });
        };
        out.push_str(&serde_json::to_string(value).expect("a string serializes"));
        rest = &after[end + 2..];
    }
    out.push_str(rest);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn values() -> BTreeMap<&'static str, String> {
        BTreeMap::from([
            ("name", "a\"b\n: c".to_string()),
            ("image", "x".to_string()),
        ])
    }

    #[test]
    fn placeholders_become_quoted_escaped_strings() {
        let out = substitute("n: {{ name }}\ni: {{image}}\n", &values()).unwrap();
        assert_eq!(out, "n: \"a\\\"b\\n: c\"\ni: \"x\"\n");
        #[derive(serde::Deserialize)]
        struct T {
            n: String,
        }
        let t: T = serde_saphyr::from_str(&out).unwrap();
        assert_eq!(t.n, "a\"b\n: c");
    }

    #[test]
    fn unknown_and_unterminated_placeholders_are_errors() {
        let e = substitute("a: 1\nb: {{ nope }}\n", &values())
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("line 2") && e.contains("unknown placeholder \"nope\""),
            "{e}"
        );
        let e = substitute("a: {{ name\n", &values())
            .unwrap_err()
            .to_string();
        assert!(e.contains("without `}}`"), "{e}");
    }

    #[test]
    fn the_embedded_templates_load_and_a_directory_replaces_them() {
        let dir = crate::job::testutil::TempDir::new("templates");
        // An empty directory: both embedded.
        assert_eq!(
            Templates::load_dir(dir.path()).unwrap(),
            Templates::embedded()
        );
        std::fs::write(dir.path().join(RUNNER_FILE), "#!/bin/sh\nexit 0\n").unwrap();
        let t = Templates::load_dir(dir.path()).unwrap();
        assert_eq!(t.runner, "#!/bin/sh\nexit 0\n");
        assert_eq!(t.job, EMBEDDED_JOB);
        std::fs::write(
            dir.path().join(JOB_FILE),
            "apiVersion: batch/v1\nkind: Job\nmetadata:\n  name: {{ bogus }}\n",
        )
        .unwrap();
        assert!(matches!(
            Templates::load_dir(dir.path()),
            Err(RenderError::Template { .. })
        ));
        std::fs::write(dir.path().join(JOB_FILE), "apiVersion: [\n").unwrap();
        assert!(matches!(
            Templates::load_dir(dir.path()),
            Err(RenderError::Yaml { .. })
        ));
        assert!(Templates::load_dir(&dir.path().join("missing")).is_err());
    }
}
