//! What a successful apply's runner reports of its run on stdout, for the destroy to run
//! the same offline: the provider lock file `init` wrote, and the module's files when they
//! came from a source address, and the modules `init` installed for the module's remote
//! `module` blocks (under its data directory's `modules/`). Between markers at the end of the Pod's log:
//!
//! ```text
//! captf-runner: ran begin
//! captf-runner: ran lock <base64>
//! captf-runner: ran module-file <path> <base64>
//! captf-runner: ran installed-module <path> <base64>
//! captf-runner: ran end <count of the lines between>
//! ```
//!
//! The log is untrusted (the module's own output is in it): the last complete report is
//! read, with every limit of inline module files, or none.

use std::collections::BTreeMap;

use crate::inputs::{RAN_MODULE_MAX_BYTES, bad_file_name};

const BEGIN: &str = "captf-runner: ran begin";
const LOCK: &str = "captf-runner: ran lock ";
const FILE: &str = "captf-runner: ran module-file ";
const INSTALLED: &str = "captf-runner: ran installed-module ";
const END: &str = "captf-runner: ran end ";

/// The most a lock file may take.
pub const LOCK_MAX_BYTES: usize = 64 * 1024;

/// What a runner reported of its run.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Reported {
    pub lock_file: Option<String>,
    pub module_files: Option<BTreeMap<String, String>>,
    pub installed_modules: Option<BTreeMap<String, String>>,
}

/// The last complete report in `log`; an empty one when the log has none (a runner from
/// before the report, a log cut short); an error naming what is wrong with a report that
/// breaks its form or its limits.
pub fn parse(log: &str) -> Result<Reported, String> {
    let lines: Vec<&str> = log.lines().collect();
    let Some(end) = lines.iter().rposition(|l| l.starts_with(END)) else {
        return Ok(Reported::default());
    };
    let Some(begin) = lines[..end].iter().rposition(|l| *l == BEGIN) else {
        return Err("the report of the run has an end and no beginning".into());
    };
    let body = &lines[begin + 1..end];
    let count: usize = lines[end][END.len()..]
        .trim()
        .parse()
        .map_err(|_| format!("the report's end line is {:?}", lines[end]))?;
    if count != body.len() {
        return Err(format!(
            "the report says {count} lines and has {}: the log is cut or mixed",
            body.len()
        ));
    }
    let decode = |b64: &str, what: &str| -> Result<String, String> {
        let bytes: k8s_openapi::ByteString = serde_json::from_value(serde_json::json!(b64))
            .map_err(|e| format!("{what}: not base64: {e}"))?;
        String::from_utf8(bytes.0).map_err(|_| format!("{what}: not UTF-8 text"))
    };
    let mut out = Reported::default();
    let mut size = 0;
    let mut installed_size = 0;
    let mut installed_unreadable = false;
    for line in body {
        if let Some(b64) = line.strip_prefix(LOCK) {
            let lock = decode(b64.trim(), "the lock file")?;
            if lock.len() > LOCK_MAX_BYTES {
                return Err(format!(
                    "the lock file is {} bytes, more than {LOCK_MAX_BYTES}",
                    lock.len()
                ));
            }
            out.lock_file = Some(lock);
        } else if let Some(rest) = line.strip_prefix(FILE) {
            let (path, content) = file_line(rest, "module file", &decode)?;
            add_file(&mut out.module_files, &mut size, path, content).map_err(|()| {
                format!("the module's files take more than {RAN_MODULE_MAX_BYTES} bytes")
            })?;
        } else if let Some(rest) = line.strip_prefix(INSTALLED) {
            // A file that is not text (an image in a registry module's docs), or a set
            // larger than the limit (a registry module comes with its whole repository),
            // is not kept, and then none of them: the destroy fetches them again, as
            // before the record. The rest of the report stands.
            if installed_unreadable {
                continue;
            }
            let Ok((path, content)) = file_line(rest, "installed module file", &decode) else {
                installed_unreadable = true;
                continue;
            };
            if add_file(
                &mut out.installed_modules,
                &mut installed_size,
                path,
                content,
            )
            .is_err()
            {
                installed_unreadable = true;
            }
        } else {
            return Err(format!("an unknown line in the report: {line:?}"));
        }
    }
    // Installed modules are put back only with the manifest that says where each goes.
    if installed_unreadable
        || out
            .installed_modules
            .as_ref()
            .is_some_and(|m| !m.contains_key("modules.json"))
    {
        out.installed_modules = None;
    }
    Ok(out)
}

/// Adds a file to a set, counting its bytes in `size`; Err when the set would take more
/// than [`RAN_MODULE_MAX_BYTES`].
fn add_file(
    set: &mut Option<BTreeMap<String, String>>,
    size: &mut usize,
    path: &str,
    content: String,
) -> Result<(), ()> {
    *size += path.len() + content.len();
    if *size > RAN_MODULE_MAX_BYTES {
        return Err(());
    }
    set.get_or_insert_default()
        .insert(path.to_string(), content);
    Ok(())
}

/// A file line's path and text: `<path> <base64>`, a path an inline module file may have.
fn file_line<'a>(
    rest: &'a str,
    what: &str,
    decode: &dyn Fn(&str, &str) -> Result<String, String>,
) -> Result<(&'a str, String), String> {
    let (path, b64) = rest
        .split_once(' ')
        .ok_or_else(|| format!("a {what} line without content: {rest:?}"))?;
    if let Some(why) = bad_file_name(path) {
        return Err(format!("{what} {path:?}: {why}"));
    }
    Ok((path, decode(b64.trim(), &format!("{what} {path}"))?))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn b64(s: &str) -> String {
        serde_json::to_value(k8s_openapi::ByteString(s.as_bytes().to_vec()))
            .unwrap()
            .as_str()
            .unwrap()
            .to_string()
    }

    #[test]
    fn the_last_complete_report_is_read() {
        let log = format!(
            "Apply complete!\ncaptf-runner: ran begin\ncaptf-runner: ran end 0\n\
             captf-runner: ran begin\ncaptf-runner: ran lock {}\n\
             captf-runner: ran module-file main.tf {}\ncaptf-runner: ran module-file modules/net/main.tf {}\n\
             captf-runner: ran end 3\n",
            b64("# lock\n"),
            b64("resource \"terraform_data\" \"x\" {}\n"),
            b64("# net\n")
        );
        let r = parse(&log).unwrap();
        assert_eq!(r.lock_file.as_deref(), Some("# lock\n"));
        let files = r.module_files.unwrap();
        assert_eq!(files.len(), 2);
        assert_eq!(files["modules/net/main.tf"], "# net\n");
        assert_eq!(parse("no report here\n").unwrap(), Reported::default());
    }

    #[test]
    fn a_report_that_breaks_its_form_or_limits_is_refused_naming_why() {
        let cases = [
            (
                "captf-runner: ran begin\ncaptf-runner: ran lock eA==\ncaptf-runner: ran end 2\n"
                    .to_string(),
                "says 2 lines and has 1",
            ),
            (
                format!(
                    "captf-runner: ran begin\ncaptf-runner: ran module-file ../x.tf {}\ncaptf-runner: ran end 1\n",
                    b64("x")
                ),
                "contains `..`",
            ),
            (
                "captf-runner: ran begin\ncaptf-runner: ran lock !!!\ncaptf-runner: ran end 1\n"
                    .to_string(),
                "not base64",
            ),
            (
                format!(
                    "captf-runner: ran begin\ncaptf-runner: ran module-file big.tf {}\ncaptf-runner: ran end 1\n",
                    b64(&"x".repeat(RAN_MODULE_MAX_BYTES + 1))
                ),
                "more than",
            ),
            ("captf-runner: ran end 0\n".to_string(), "no beginning"),
        ];
        for (log, want) in cases {
            let err = parse(&log).unwrap_err();
            assert!(err.contains(want), "{err} (wanted {want})");
        }
    }

    #[test]
    fn the_installed_modules_are_read_with_their_manifest_or_not_at_all() {
        let manifest = r#"{"Modules":[{"Key":"inner","Source":"git::https://example.com/inner.git","Dir":"@CAPTF_MODULES_DIR@/inner"}]}"#;
        let log = format!(
            "captf-runner: ran begin\ncaptf-runner: ran installed-module inner/main.tf {}\n\
             captf-runner: ran installed-module modules.json {}\ncaptf-runner: ran end 2\n",
            b64("resource \"terraform_data\" \"y\" {}\n"),
            b64(manifest)
        );
        let r = parse(&log).unwrap();
        let installed = r.installed_modules.unwrap();
        assert_eq!(installed["modules.json"], manifest);
        assert!(installed.contains_key("inner/main.tf"));
        assert_eq!(r.module_files, None);

        let without = format!(
            "captf-runner: ran begin\ncaptf-runner: ran installed-module inner/main.tf {}\ncaptf-runner: ran end 1\n",
            b64("x")
        );
        assert_eq!(
            parse(&without).unwrap().installed_modules,
            None,
            "installed modules without their modules.json are not kept"
        );
        // A set over the limit (a registry module with its docs and examples) is left
        // out as one that is not text is: the lock file and the module's files stand.
        let big = format!(
            "captf-runner: ran begin\ncaptf-runner: ran lock {}\n\
             captf-runner: ran module-file main.tf {}\n\
             captf-runner: ran installed-module modules.json {}\n\
             captf-runner: ran installed-module inner/big.tf {}\ncaptf-runner: ran end 4\n",
            b64("# lock\n"),
            b64("module \"inner\" {}\n"),
            b64(manifest),
            b64(&"x".repeat(RAN_MODULE_MAX_BYTES + 1))
        );
        let r = parse(&big).expect("the rest of the report stands");
        assert_eq!(r.lock_file.as_deref(), Some("# lock\n"));
        assert!(r.module_files.is_some_and(|f| f.contains_key("main.tf")));
        assert_eq!(r.installed_modules, None);
        // A file that is not text: the rest of the report stands, without the modules.
        let binary = format!(
            "captf-runner: ran begin\ncaptf-runner: ran lock {}\n\
             captf-runner: ran installed-module modules.json {}\n\
             captf-runner: ran installed-module inner/logo.png /w==\ncaptf-runner: ran end 3\n",
            b64("# lock\n"),
            b64(manifest)
        );
        let r = parse(&binary).unwrap();
        assert_eq!(r.lock_file.as_deref(), Some("# lock\n"));
        assert_eq!(r.installed_modules, None);
    }
}
