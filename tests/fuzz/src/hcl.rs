//! The module reader (`captf module check`, the contract's HCL reader) on one `.tf` file.
//!
//! Properties: a verdict (a report or a refusal) for every role; within the time bound;
//! memory within a multiple of the file (the reader tokenises it and keeps each block's
//! body); a report that keeps to the contract (sorted lists, contract variables of the
//! role only); and readings Terraform treats alike give the same report: a comment line
//! added at the end, CRLF line ends, a UTF-8 byte order mark. (Agreement with `terraform`
//! itself on valid modules is `tests/corpus.rs`'s `variables_and_outputs_agree_with_terraform`.)

use captf::contract::check::{self, Report};
use captf::contract::{Role, variables};

use crate::{Files, Limits, bounded};

/// Per byte of the file: the tokens (one a byte at worst, 56 bytes each, in a vector
/// that doubles) and the bodies of nested blocks (one copy a level).
const PER_BYTE: usize = 256;
const OVERHEAD: usize = 256 * 1024;

pub fn hcl(data: &[u8], limits: &Limits) {
    // `captf module check` refuses a file that is not UTF-8 before reading it.
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if data.len() as u64 > check::MAX_FILE_BYTES {
        return;
    }
    for role in Role::ALL {
        let plain = run(text, role, limits);
        if let Ok(report) = &plain {
            invariants(report, role);
        }
        let same = |variant: &str, what: &str| {
            let other = run(variant, role, limits);
            assert_eq!(
                plain.as_ref().map(without_lines),
                other.as_ref().map(without_lines),
                "{what} changes the reading of {text:?}"
            );
        };
        same(
            &format!("{text}\n# a comment\n"),
            "a comment line at the end",
        );
        if !text.contains('\r') {
            same(&text.replace('\n', "\r\n"), "CRLF line ends");
        }
        if !text.starts_with('\u{feff}') {
            same(&format!("\u{feff}{text}"), "a byte order mark");
        }
    }
}

fn run(text: &str, role: Role, limits: &Limits) -> Result<Report, ()> {
    let files: Files = [("main.tf".to_string(), text.to_string())].into();
    bounded(
        "contract::check",
        limits,
        PER_BYTE * text.len() + OVERHEAD,
        || check::check(&files, role),
    )
    .map_err(|_| ())
}

/// A report without its findings' lines, and without CRs (a comment or a CR moves neither
/// what is declared nor what is wrong; a CR shows in the text a report quotes, and in a
/// label with a newline, which Terraform refuses and the reader takes as it is).
fn without_lines(r: &Report) -> Report {
    let mut r = r.clone();
    for f in &mut r.findings {
        f.at = f.at.split(':').next().unwrap_or_default().to_string();
        f.message = f.message.replace('\r', "");
    }
    for list in [
        &mut r.contract_variables,
        &mut r.own_variables,
        &mut r.outputs,
    ] {
        for name in list.iter_mut() {
            *name = name.replace('\r', "");
        }
        list.sort();
    }
    r.findings
        .sort_by(|a, b| (a.severity, &a.at, &a.message).cmp(&(b.severity, &b.at, &b.message)));
    r
}

fn invariants(r: &Report, role: Role) {
    assert_eq!(r.role, role);
    for list in [&r.contract_variables, &r.own_variables, &r.outputs] {
        assert!(list.is_sorted(), "a report's list is not sorted: {r:?}");
    }
    for v in &r.contract_variables {
        assert!(
            variables(role).any(|c| c.name == v),
            "{v} is reported as a contract variable of a {role} module: {r:?}"
        );
    }
    assert!(r.errors() <= r.findings.len());
}
