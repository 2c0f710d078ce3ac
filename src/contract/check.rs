//! `captf module check DIR --role ROLE`: reads a module offline (its `.tf` files: the
//! variables it declares, its outputs, its data sources and destroy-time provisioners)
//! and reports what contract v1 needs of it. Errors make the command fail; warnings do
//! not.

use std::collections::BTreeMap;
use std::path::Path;

use serde::Serialize;

use super::hcl::{self, Block};
use super::{Need, RESERVED_PREFIX, Role, VARIABLES, outputs, variables};

/// The largest `.tf` file read (a module's files are untrusted bytes).
pub const MAX_FILE_BYTES: u64 = 1024 * 1024;
/// The most bytes of `.tf` files read from one module.
pub const MAX_MODULE_BYTES: u64 = 8 * 1024 * 1024;
/// The most `.tf` files read from one module.
pub const MAX_FILES: usize = 500;

/// How bad a finding is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Severity {
    Error,
    Warning,
}

/// One thing the module does against the contract, where, and what to do.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Finding {
    pub severity: Severity,
    /// `file:line`, or the module when it is about something missing.
    pub at: String,
    pub message: String,
}

/// What a check found.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Report {
    pub role: Role,
    /// The contract variables the module declares (it may declare any subset).
    pub contract_variables: Vec<String>,
    /// The module's own variables (given from the object's spec).
    pub own_variables: Vec<String>,
    /// The contract outputs it declares.
    pub outputs: Vec<String>,
    pub findings: Vec<Finding>,
}

impl Report {
    pub fn errors(&self) -> usize {
        self.findings
            .iter()
            .filter(|f| f.severity == Severity::Error)
            .count()
    }

    /// The human-readable form.
    pub fn render_text(&self) -> String {
        let list = |v: &[String]| {
            if v.is_empty() {
                "none".to_string()
            } else {
                v.join(", ")
            }
        };
        let mut out = format!("module contract v1, role {}\n", self.role);
        out.push_str(&format!(
            "  contract variables it uses: {}\n",
            list(&self.contract_variables)
        ));
        out.push_str(&format!(
            "  its own variables: {}\n",
            list(&self.own_variables)
        ));
        out.push_str(&format!("  contract outputs: {}\n", list(&self.outputs)));
        for f in &self.findings {
            let sev = match f.severity {
                Severity::Error => "error",
                Severity::Warning => "warning",
            };
            out.push_str(&format!("  {sev}: {}: {}\n", f.at, f.message));
        }
        let (e, w) = (self.errors(), self.findings.len() - self.errors());
        out.push_str(&match (e, w) {
            (0, 0) => "ok: the module follows the contract\n".to_string(),
            (0, w) => format!("ok, with {w} warning(s)\n"),
            (e, w) => format!("{e} error(s), {w} warning(s)\n"),
        });
        out
    }
}

/// Reads the `.tf` files of `dir` (not its subdirectories: Terraform reads only the
/// module's own directory), within the size limits.
pub fn read_module(dir: &Path) -> Result<BTreeMap<String, String>, String> {
    let entries = std::fs::read_dir(dir)
        .map_err(|e| format!("{}: cannot read the directory: {e}", dir.display()))?;
    let mut files = BTreeMap::new();
    let mut total = 0u64;
    for entry in entries {
        let entry = entry.map_err(|e| format!("{}: {e}", dir.display()))?;
        let name = entry.file_name().to_string_lossy().to_string();
        if !name.ends_with(".tf") {
            continue;
        }
        let path = entry.path();
        let meta = std::fs::metadata(&path).map_err(|e| format!("{}: {e}", path.display()))?;
        if !meta.is_file() {
            continue;
        }
        if meta.len() > MAX_FILE_BYTES {
            return Err(format!(
                "{}: {} bytes, more than the {MAX_FILE_BYTES} a module file may have",
                path.display(),
                meta.len()
            ));
        }
        total += meta.len();
        if total > MAX_MODULE_BYTES || files.len() >= MAX_FILES {
            return Err(format!(
                "{}: more than {MAX_FILES} .tf files or {MAX_MODULE_BYTES} bytes of them",
                dir.display()
            ));
        }
        let text = std::fs::read_to_string(&path)
            .map_err(|e| format!("{}: not UTF-8 text: {e}", path.display()))?;
        files.insert(name, text);
    }
    if files.is_empty() {
        return Err(format!("{}: no .tf file", dir.display()));
    }
    Ok(files)
}

/// Checks a module's files (file name to text) against the contract for `role`.
pub fn check(files: &BTreeMap<String, String>, role: Role) -> Result<Report, String> {
    let mut blocks: Vec<(String, Block)> = Vec::new();
    for (name, text) in files {
        let parsed = hcl::parse(text).map_err(|e| format!("{name}: {e}"))?;
        blocks.extend(parsed.into_iter().map(|b| (name.clone(), b)));
    }
    let at = |file: &str, b: &Block| format!("{file}:{}", b.line);
    let mut findings = Vec::new();
    let mut contract_variables = Vec::new();
    let mut own_variables = Vec::new();
    let mut declared_outputs = Vec::new();
    for (file, b) in &blocks {
        let label = b.labels.first().cloned().unwrap_or_default();
        match b.kind.as_str() {
            "variable" if label.starts_with(RESERVED_PREFIX) => {
                match variables(role).find(|v| v.name == label) {
                    Some(v) => {
                        contract_variables.push(label.clone());
                        if super::CONDITIONAL.iter().any(|c| c.name == v.name)
                            && b.attribute("default").is_none()
                        {
                            findings.push(Finding {
                                severity: Severity::Warning,
                                at: at(file, b),
                                message: format!("declare {label} with `default = false`: CAPTF gives it only while it is true, and Terraform asks for a variable without a default"),
                            });
                        }
                        if v.sensitive && b.attribute("sensitive") != Some("true") {
                            findings.push(Finding {
                                severity: Severity::Warning,
                                at: at(file, b),
                                message: format!("declare {label} with `sensitive = true`: its value would show in plans and logs"),
                            });
                        }
                        if let Some(t) = b.attribute("type")
                            && type_form(t) != type_form(v.type_)
                            && type_form(t) != "any"
                        {
                            findings.push(Finding {
                                severity: Severity::Warning,
                                at: at(file, b),
                                message: format!(
                                    "{label} is declared as {t}; the contract gives {}",
                                    v.type_
                                ),
                            });
                        }
                        if !v.nullable && b.attribute("nullable") == Some("true") {
                            findings.push(Finding {
                                severity: Severity::Warning,
                                at: at(file, b),
                                message: format!(
                                    "{label} is never null; `nullable = true` is not needed"
                                ),
                            });
                        }
                    }
                    None => {
                        let other: Vec<String> = VARIABLES
                            .iter()
                            .filter(|v| v.name == label)
                            .flat_map(|v| v.roles.iter().map(|r| r.to_string()))
                            .collect();
                        let message = if other.is_empty() {
                            format!(
                                "variable {label} uses the reserved prefix {RESERVED_PREFIX} and is not in contract v1: rename it (CAPTF would never set it)"
                            )
                        } else {
                            format!(
                                "variable {label} is given to a {} module, not to a {role} module: it will stay at its default",
                                other.join(" or ")
                            )
                        };
                        findings.push(Finding {
                            severity: if other.is_empty() {
                                Severity::Error
                            } else {
                                Severity::Warning
                            },
                            at: at(file, b),
                            message,
                        });
                    }
                }
            }
            "variable" => {
                own_variables.push(label.clone());
            }
            "output" if outputs(role).any(|o| o.name == label) => {
                declared_outputs.push(label.clone());
            }
            "terraform" => {
                for backend in b.blocks.iter().filter(|x| x.kind == "backend") {
                    findings.push(Finding {
                        severity: Severity::Warning,
                        at: at(file, backend),
                        message: format!(
                            "a backend ({}) is declared: CAPTF overrides it with the kubernetes backend of the object's namespace; remove it so the module reads the same everywhere",
                            backend.labels.first().map(String::as_str).unwrap_or("?")
                        ),
                    });
                }
            }
            "data" => {
                let t = label.as_str();
                let kube = t.starts_with("kubernetes_");
                findings.push(Finding {
                    severity: if kube { Severity::Error } else { Severity::Warning },
                    at: at(file, b),
                    message: if kube {
                        format!("data source {t} \"{}\" reads the management cluster, and Terraform reads data sources again at destroy: once what it reads is gone (the bootstrap Secret goes with its Machine), every destroy fails; take the value from a contract variable instead", b.labels.get(1).map(String::as_str).unwrap_or("?"))
                    } else {
                        format!("data source {t} \"{}\" is read again at every destroy: make sure it still reads once the resources it looks up are gone, or the destroy fails", b.labels.get(1).map(String::as_str).unwrap_or("?"))
                    },
                });
            }
            _ => {}
        }
        // `prevent_destroy`: every destroy of the module fails, and the deletion with it.
        if b.kind == "resource"
            && b.blocks
                .iter()
                .filter(|x| x.kind == "lifecycle")
                .any(|l| l.attribute("prevent_destroy").map(str::trim) == Some("true"))
        {
            findings.push(Finding {
                severity: Severity::Error,
                at: at(file, b),
                message: format!(
                    "resource {label} \"{}\" has lifecycle prevent_destroy = true: every destroy fails, and the object is never released; remove it (CAPTF destroys only when the Cluster is deleted)",
                    b.labels.get(1).map(String::as_str).unwrap_or("?")
                ),
            });
        }
        // Destroy-time provisioners: Terraform lets them refer to `self` only; one that
        // reaches the bootstrap data would fail every destroy.
        for p in b
            .descendants()
            .into_iter()
            .filter(|x| x.kind == "provisioner")
        {
            if p.attribute("when") == Some("destroy")
                && mentions(&hcl::code_only(&p.body), "captf_bootstrap_data")
            {
                findings.push(Finding {
                    severity: Severity::Error,
                    at: at(file, p),
                    message: "a destroy-time provisioner refers to captf_bootstrap_data: a destroy must not depend on the bootstrap data".into(),
                });
            }
        }
    }
    for o in outputs(role) {
        if o.need == Need::Required && !declared_outputs.iter().any(|d| d == o.name) {
            findings.push(Finding {
                severity: Severity::Error,
                at: "module".into(),
                message: format!(
                    "output {} ({}) is missing: a {role} module must declare it; it sets {}",
                    o.name, o.type_, o.sets
                ),
            });
        }
    }
    findings.sort_by(|a, b| a.severity.cmp(&b.severity).then(a.at.cmp(&b.at)));
    contract_variables.sort();
    own_variables.sort();
    declared_outputs.sort();
    Ok(Report {
        role,
        contract_variables,
        own_variables,
        outputs: declared_outputs,
        findings,
    })
}

/// A type expression in one form, to compare: without comments and whitespace, its
/// elements separated by one comma whether the source separates them by commas or by
/// newlines (`terraform fmt` writes an object type one attribute a line, without commas),
/// without a comma before a closing bracket.
fn type_form(t: &str) -> String {
    let mut out = String::new();
    for c in hcl::code_only(t).chars() {
        match c {
            '\n' | ',' => {
                if !out.is_empty() && !out.ends_with([',', '{', '(', '[']) {
                    out.push(',');
                }
            }
            c if c.is_whitespace() => {}
            '}' | ')' | ']' => {
                if out.ends_with(',') {
                    out.pop();
                }
                out.push(c);
            }
            c => out.push(c),
        }
    }
    if out.ends_with(',') {
        out.pop();
    }
    out
}

/// Whether `text` names `word` as a whole identifier.
fn mentions(text: &str, word: &str) -> bool {
    text.match_indices(word).any(|(i, _)| {
        let before = text[..i].chars().next_back();
        let after = text[i + word.len()..].chars().next();
        let ident = |c: Option<char>| c.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_');
        !ident(before) && !ident(after)
    })
}
