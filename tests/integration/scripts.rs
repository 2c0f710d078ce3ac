//! The repository's shell: scripts run with `set -o pipefail` (CI, the builds, the fuzz
//! runner) and the docs' `sh` blocks (the runbook tests run them the same way).

use std::path::{Path, PathBuf};

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// Every file of the tree (but `target/`, `.git/` and Go's vendored caches) whose text
/// passes `keep`.
fn files(dir: &Path, keep: &dyn Fn(&Path, &str) -> bool, out: &mut Vec<(PathBuf, String)>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        let name = entry.file_name();
        let name = name.to_string_lossy();
        if path.is_dir() {
            if !matches!(name.as_ref(), "target" | ".git" | "node_modules")
                && !name.starts_with("target-")
            {
                files(&path, keep, out);
            }
            continue;
        }
        // Scripts and pages are small; a large file is neither.
        if entry.metadata().map(|m| m.len() > 1 << 20).unwrap_or(true) {
            continue;
        }
        if let Ok(text) = std::fs::read_to_string(&path)
            && keep(&path, &text)
        {
            out.push((path, text));
        }
    }
}

/// The commands a line pipes into, each trimmed (`a | b || c` gives `b`; `||` is not a pipe).
fn piped_into(line: &str) -> Vec<&str> {
    let code = line.split(" #").next().unwrap_or(line);
    let mut out = Vec::new();
    let bytes = code.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'|' {
            if bytes.get(i + 1) == Some(&b'|') {
                i += 2;
                continue;
            }
            let rest = &code[i + 1..];
            let end = rest.find("||").unwrap_or(rest.len());
            let next = rest[..end].split('|').next().unwrap_or("");
            out.push(next.trim());
        }
        i += 1;
    }
    out
}

/// A reader that may stop before its writer is done: the writer's next write then dies
/// of SIGPIPE, and under pipefail the pipeline fails (exit 141) when the timing falls so.
fn stops_early(command: &str) -> bool {
    let word = |w: &str| command == w || command.starts_with(&format!("{w} "));
    word("head") || word("grep -q") || word("grep -m1") || command.starts_with("grep -m ")
}

#[test]
fn a_pipefail_script_never_pipes_into_a_reader_that_stops_early() {
    let mut scripts = Vec::new();
    files(
        repo(),
        &|_, text| text.starts_with("#!") && text.contains("pipefail"),
        &mut scripts,
    );
    let mut pages = Vec::new();
    files(
        &repo().join("docs"),
        &|path, _| path.extension().is_some_and(|e| e == "md"),
        &mut pages,
    );
    assert!(
        scripts.iter().any(|(p, _)| p.ends_with(".ci/run")),
        "the walk finds .ci/run"
    );

    let mut found = Vec::new();
    for (path, text) in &scripts {
        for (n, line) in text.lines().enumerate() {
            if line.trim_start().starts_with('#') {
                continue;
            }
            if piped_into(line).into_iter().any(stops_early) {
                found.push(format!("{}:{}: {}", path.display(), n + 1, line.trim()));
            }
        }
    }
    for (path, text) in &pages {
        let mut in_sh = false;
        for (n, line) in text.lines().enumerate() {
            let t = line.trim_start();
            if t.starts_with("```") {
                in_sh = !in_sh && t == "```sh";
                continue;
            }
            if in_sh && !t.starts_with('#') && piped_into(line).into_iter().any(stops_early) {
                found.push(format!("{}:{}: {}", path.display(), n + 1, line.trim()));
            }
        }
    }
    assert!(
        found.is_empty(),
        "under `set -o pipefail` a pipe into `head` or `grep -q` fails (SIGPIPE, exit 141) when \
         the writer writes after the reader stopped; read the whole input instead (`sed -n 1p`, \
         `grep ... >/dev/null`):\n{}",
        found.join("\n")
    );
}

#[test]
fn the_pipe_reader_tells_pipes_from_or() {
    assert_eq!(piped_into("terraform version | head -n 1"), ["head -n 1"]);
    assert_eq!(piped_into("a || b"), Vec::<&str>::new());
    assert_eq!(piped_into("a | grep -q x || true"), ["grep -q x"]);
    assert_eq!(piped_into("a | sed -n 1p | head"), ["sed -n 1p", "head"]);
    assert!(stops_early("head -n 1") && stops_early("grep -q x") && !stops_early("sed -n 1p"));
}
