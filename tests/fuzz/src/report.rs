//! The runner's report in a Pod log (`captf::job::report::parse`).
//!
//! Properties: a verdict (a report, none, or a refusal) for every log; within the time
//! bound; memory within a multiple of the log; a report read keeps every limit (the lock
//! file's size, the module files' and installed modules' total size, file names an inline
//! module may have, installed modules with their `modules.json`); and written again as the
//! runner writes it, after any other output, it reads back the same.

use captf::inputs::{RAN_MODULE_MAX_BYTES, bad_file_name};
use captf::job::report::{LOCK_MAX_BYTES, Reported, parse};

use crate::{Limits, bounded};

/// Per byte of the log: the lines' slices (16 bytes for a line of one byte and its end),
/// and base64 decoded through a JSON value.
const PER_BYTE: usize = 32;
const OVERHEAD: usize = 64 * 1024;

pub fn report(data: &[u8], limits: &Limits) {
    // Pod logs are read as text (the API server's bytes, lossily).
    let log = String::from_utf8_lossy(data);
    let read = bounded(
        "report::parse",
        limits,
        PER_BYTE * log.len() + OVERHEAD,
        || parse(&log),
    );
    let Ok(reported) = read else {
        return;
    };
    if let Some(lock) = &reported.lock_file {
        assert!(lock.len() <= LOCK_MAX_BYTES, "a lock file over the limit");
    }
    for set in [&reported.module_files, &reported.installed_modules]
        .into_iter()
        .flatten()
    {
        let size: usize = set.iter().map(|(p, c)| p.len() + c.len()).sum();
        assert!(
            size <= RAN_MODULE_MAX_BYTES,
            "{size} bytes of files read, more than {RAN_MODULE_MAX_BYTES}"
        );
        for path in set.keys() {
            assert_eq!(bad_file_name(path), None, "a file named {path:?} was read");
        }
    }
    if let Some(installed) = &reported.installed_modules {
        assert!(installed.contains_key("modules.json"));
    }
    let again = format!("{log}\n{}", render(&reported));
    assert_eq!(
        parse(&again).as_ref(),
        Ok(&reported),
        "the report written again reads otherwise"
    );
}

/// The report as the runner writes it (templates/runner.sh), at the end of its output.
pub fn render(r: &Reported) -> String {
    let b64 = |s: &str| {
        serde_json::to_value(k8s_openapi::ByteString(s.as_bytes().to_vec()))
            .expect("bytes serialise")
            .as_str()
            .expect("a string")
            .to_string()
    };
    let mut body = Vec::new();
    if let Some(lock) = &r.lock_file {
        body.push(format!("captf-runner: ran lock {}", b64(lock)));
    }
    for (path, text) in r.module_files.iter().flatten() {
        body.push(format!(
            "captf-runner: ran module-file {path} {}",
            b64(text)
        ));
    }
    for (path, text) in r.installed_modules.iter().flatten() {
        body.push(format!(
            "captf-runner: ran installed-module {path} {}",
            b64(text)
        ));
    }
    format!(
        "captf-runner: ran begin\n{}{}captf-runner: ran end {}\n",
        body.join("\n"),
        if body.is_empty() { "" } else { "\n" },
        body.len()
    )
}
