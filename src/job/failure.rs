//! What a failed attempt's Pod printed, made readable: a destructive plan the runner
//! stopped before, the error's summary for a condition, and cuts that keep a message short.

/// The first line of the termination message of an apply the plan guard stopped
/// (`templates/runner.sh`), before the plan's hash.
pub const DESTRUCTIVE_PLAN_MARKER: &str = "captf-runner: destructive plan ";

/// An apply the plan guard stopped before it changed anything: the plan's hash, and what
/// the plan would destroy or replace (`replace ADDRESS`, `delete ADDRESS`), from the
/// runner's termination message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DestructivePlan {
    pub hash: String,
    pub changes: Vec<String>,
}

impl DestructivePlan {
    /// Reads the runner's termination message; none unless it is the plan guard's.
    pub fn of(error_tail: &str) -> Option<DestructivePlan> {
        let mut lines = error_tail.lines();
        let hash = lines.next()?.strip_prefix(DESTRUCTIVE_PLAN_MARKER)?.trim();
        if hash.is_empty() || !hash.chars().all(|c| c.is_ascii_hexdigit()) {
            return None;
        }
        let changes = lines
            .map(str::trim)
            .filter(|l| l.starts_with("replace ") || l.starts_with("delete "))
            .map(str::to_string)
            .collect();
        Some(DestructivePlan {
            hash: hash.to_string(),
            changes,
        })
    }

    /// "replace terraform_data.disk, delete terraform_data.old[0]", at most `max` named.
    pub fn list(&self, max: usize) -> String {
        let mut named: Vec<&str> = self.changes.iter().take(max).map(String::as_str).collect();
        let more = self.changes.len().saturating_sub(max);
        let more = format!("and {more} more");
        if self.changes.len() > max {
            named.push(&more);
        }
        if named.is_empty() {
            "resources the runner could not list".to_string()
        } else {
            named.join(", ")
        }
    }
}

/// The longest summary of Terraform's error that goes into a condition or an Event.
pub const SUMMARY_MAX: usize = 400;

/// A short summary of Terraform's error output for status and Events: its first line (the
/// runner's own, "terraform destroy failed (exit 1)") and Terraform's `Error:` headlines,
/// ANSI escapes stripped, at most [`SUMMARY_MAX`] bytes. The rest of the output (a
/// provider's diagnostics can quote resource attributes) stays in the Pod's log, which
/// fewer people can read than an object's status.
pub fn error_summary(output: &str) -> String {
    let clean = strip_ansi(output);
    let lines: Vec<&str> = clean
        .lines()
        .map(|l| l.trim_start_matches(['│', '╷', '╵', ' ']).trim_end())
        .filter(|l| !l.is_empty())
        .collect();
    let mut parts: Vec<&str> = Vec::new();
    if let Some(first) = lines.first() {
        parts.push(first);
    }
    for l in &lines[1.min(lines.len())..] {
        if l.starts_with("Error:") && !parts.contains(l) {
            parts.push(l);
        }
    }
    if parts.len() == 1 && lines.len() > 1 {
        // No headline: the last line says most.
        parts.push(lines[lines.len() - 1]);
    }
    cut(&parts.join("; "), SUMMARY_MAX)
}

/// The failure as the condition and the Event say it: the summary, and where the whole
/// output is.
pub fn failure_text(output: &str, job: &str, namespace: &str) -> String {
    format!(
        "{} (Terraform's whole output: kubectl logs job/{job} -n {namespace})",
        error_summary(output)
    )
}

fn strip_ansi(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            // CSI: ESC [ parameters final-byte; other escapes: ESC and one character.
            if chars.peek() == Some(&'[') {
                chars.next();
                for c in chars.by_ref() {
                    if ('@'..='~').contains(&c) {
                        break;
                    }
                }
            } else {
                chars.next();
            }
        } else if !c.is_control() || c == '\n' {
            out.push(c);
        }
    }
    out
}

/// `s` cut to at most `max` bytes at a character boundary, ending in an ellipsis when cut.
pub fn cut(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_string();
    }
    let mut end = max - '…'.len_utf8();
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &s[..end])
}
