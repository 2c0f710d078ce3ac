//! The fuzz targets' corpora as ordinary tests: every committed input (the seeds in
//! `fuzz/corpus/<target>/` and the findings in `fuzz/regressions/<target>/`) goes through
//! the target's checks, so a finding fixed once stays fixed. No fuzzing engine is needed.
//! Also here: the module reader against `terraform` itself on valid modules.

use std::path::{Path, PathBuf};

use captf_fuzz_checks::{Limits, alloc::Counting};

#[global_allocator]
static ALLOC: Counting = Counting;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The committed inputs of `target`, seeds and regressions.
fn inputs(target: &str) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for dir in ["fuzz/corpus", "fuzz/regressions"] {
        let Ok(entries) = std::fs::read_dir(root().join(dir).join(target)) else {
            continue;
        };
        for e in entries {
            let path = e.expect("a directory entry").path();
            if path.is_file() && path.extension().is_none_or(|x| x != "md") {
                out.push(path);
            }
        }
    }
    out.sort();
    out
}

fn run(target: &str, check: fn(&[u8], &Limits)) {
    let files = inputs(target);
    assert!(!files.is_empty(), "no corpus for {target}");
    let mut failed = Vec::new();
    for path in &files {
        let data = std::fs::read(path).expect("a corpus file reads");
        let outcome = std::panic::catch_unwind(|| check(&data, &Limits::TEST));
        if outcome.is_err() {
            failed.push(path.display().to_string());
        }
    }
    assert!(
        failed.is_empty(),
        "{target}: {} of {} inputs fail its checks: {failed:?}",
        failed.len(),
        files.len()
    );
}

#[test]
fn state_corpus() {
    run("state", captf_fuzz_checks::state);
}

#[test]
fn hcl_corpus() {
    run("hcl", captf_fuzz_checks::hcl);
}

#[test]
fn report_corpus() {
    run("report", captf_fuzz_checks::report);
}

#[test]
fn inputs_corpus() {
    run("inputs", captf_fuzz_checks::inputs);
}

#[test]
fn explain_corpus() {
    run("explain", captf_fuzz_checks::explain);
}

#[test]
fn inputs_over_the_limit_are_refused_before_they_are_parsed() {
    // Beyond the fuzzer's -max_len: a megabyte of nesting over the 1 MiB limit.
    let big = vec![b'['; captf::inputs::INPUTS_MAX_BYTES + 1];
    captf_fuzz_checks::inputs(&big, &Limits::TEST);
}

/// What `terraform` itself declares of a module: its variables and outputs, from
/// `terraform graph -type=plan` (which needs no values), or None when Terraform refuses
/// the module.
fn terraform_reading(module: &Path) -> Option<(Vec<String>, Vec<String>)> {
    let dir = std::env::temp_dir().join(format!(
        "captf-fuzz-terraform-{}-{}",
        std::process::id(),
        module.file_name()?.to_string_lossy()
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("a scratch directory");
    for e in std::fs::read_dir(module).expect("the module's directory") {
        let path = e.expect("an entry").path();
        if path.extension().is_some_and(|x| x == "tf") {
            std::fs::copy(&path, dir.join(path.file_name().expect("a name"))).expect("copied");
        }
    }
    let terraform = |args: &[&str]| {
        std::process::Command::new("terraform")
            .args(args)
            .current_dir(&dir)
            .env("TF_CLI_CONFIG_FILE", "/dev/null")
            .env("TF_IN_AUTOMATION", "1")
            .output()
            .expect("terraform runs (CI has it on PATH)")
    };
    let init = terraform(&["init", "-backend=false", "-input=false", "-no-color"]);
    let graph = terraform(&["graph", "-type=plan"]);
    let _ = std::fs::remove_dir_all(&dir);
    if !init.status.success() || !graph.status.success() {
        return None;
    }
    let text = String::from_utf8_lossy(&graph.stdout);
    let names = |prefix: &str| {
        let mut out: Vec<String> = text
            .match_indices(prefix)
            .map(|(i, _)| {
                text[i + prefix.len()..]
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '_' || *c == '-')
                    .collect::<String>()
            })
            .collect();
        out.sort();
        out.dedup();
        out
    };
    Some((names("[root] var."), names("[root] output.")))
}

/// The module reader declares the variables and outputs `terraform` declares, on a corpus
/// of valid modules: the examples and `tests/fuzz/modules/` (the wrong verdicts found
/// from outside among them).
#[test]
fn variables_and_outputs_agree_with_terraform() {
    use captf::contract::check::{check, read_module};
    use captf::contract::{Role, outputs, variables};
    let mut modules: Vec<(PathBuf, Role)> = Role::ALL
        .into_iter()
        .map(|r| (root().join("examples/modules").join(r.as_str()), r))
        .collect();
    for (name, role) in [
        ("multiline-object-type", Role::Cluster),
        ("destroy-provisioner-comment", Role::Machine),
        ("byte-order-mark", Role::Machine),
        ("syntax-tour", Role::Machine),
        ("other-roles-variables", Role::MachinePool),
    ] {
        modules.push((root().join("tests/fuzz/modules").join(name), role));
    }
    for (dir, role) in modules {
        let (tf_vars, tf_outputs) = terraform_reading(&dir)
            .unwrap_or_else(|| panic!("terraform refuses {}", dir.display()));
        let report = read_module(&dir)
            .and_then(|files| check(&files, role))
            .unwrap_or_else(|e| {
                panic!(
                    "{}: terraform reads it, captf refuses it: {e}",
                    dir.display()
                )
            });
        // Variables of another role's contract are declared, and not in the report's lists.
        let mut ours: Vec<String> = report
            .contract_variables
            .iter()
            .chain(&report.own_variables)
            .cloned()
            .collect();
        ours.sort();
        let theirs: Vec<String> = tf_vars
            .into_iter()
            .filter(|v| !v.starts_with("captf_") || variables(role).any(|c| c.name == v))
            .collect();
        assert_eq!(ours, theirs, "{}: the variables", dir.display());
        let theirs: Vec<String> = tf_outputs
            .into_iter()
            .filter(|o| outputs(role).any(|c| c.name == o))
            .collect();
        assert_eq!(
            report.outputs,
            theirs,
            "{}: the contract outputs",
            dir.display()
        );
    }
}
