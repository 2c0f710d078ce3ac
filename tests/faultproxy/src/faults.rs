//! The fault switch: fail or delay the next N matching requests, add latency to
//! every request, and close every open watch stream. Models API server and etcd trouble
//! and network interruptions as a client sees them: a failed request never reaches the
//! API server, so nothing stored changes.

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::watch;

#[derive(Debug)]
struct Rule {
    remaining: usize,
    verb: Option<String>,
    resource: Option<String>,
    /// Matches only a request whose body holds this text (see
    /// [`Faults::fail_next_with_body`]).
    body: Option<String>,
    status: u16,
}

/// Hold the next `remaining` matching requests for `delay` before they reach the API
/// server.
#[derive(Debug)]
struct Delay {
    remaining: usize,
    verb: Option<String>,
    resource: Option<String>,
    delay: Duration,
}

#[derive(Debug, Default)]
struct State {
    rules: Vec<Rule>,
    delays: Vec<Delay>,
    latency: Duration,
    /// API groups whose discovery fails, with the status.
    discovery: Vec<(String, u16)>,
}

/// Fault injection for the proxy's clients. Cloning shares the switch.
#[derive(Clone, Debug)]
pub struct Faults {
    state: Arc<Mutex<State>>,
    drop_watches: Arc<watch::Sender<u64>>,
}

impl Default for Faults {
    fn default() -> Self {
        Faults {
            state: Arc::default(),
            drop_watches: Arc::new(watch::channel(0).0),
        }
    }
}

/// The answer to a failed request: a `Status` object.
#[derive(Clone, Debug, PartialEq)]
pub struct Injected {
    pub code: u16,
    pub reason: String,
    pub message: String,
}

impl Injected {
    pub(crate) fn body(&self) -> Vec<u8> {
        serde_json::to_vec(&serde_json::json!({
            "kind": "Status", "apiVersion": "v1", "metadata": {},
            "status": "Failure", "message": self.message, "reason": self.reason, "code": self.code,
        }))
        .unwrap_or_default()
    }
}

fn reason_for(status: u16) -> &'static str {
    match status {
        400 => "BadRequest",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "NotFound",
        405 => "MethodNotAllowed",
        409 => "Conflict",
        410 => "Expired",
        422 => "Invalid",
        429 => "TooManyRequests",
        500 => "InternalError",
        503 => "ServiceUnavailable",
        504 => "Timeout",
        _ => "Unknown",
    }
}

impl Faults {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Fail the next `n` requests whose verb (`get`, `list`, `watch`, `create`, `update`,
    /// `patch`, `delete`, `deletecollection`) and resource (plural, or `plural/subresource`)
    /// match (`None` matches anything) with `status`, answered as a `Status` object.
    pub fn fail_next(&self, n: usize, verb: Option<&str>, resource: Option<&str>, status: u16) {
        self.lock().rules.push(Rule {
            remaining: n,
            verb: verb.map(str::to_string),
            resource: resource.map(str::to_string),
            body: None,
            status,
        });
    }

    /// As [`Faults::fail_next`], for requests whose body holds `needle` only (one write of
    /// several to the same resource: the patch that removes a finalizer, say).
    pub fn fail_next_with_body(
        &self,
        n: usize,
        verb: Option<&str>,
        resource: Option<&str>,
        needle: &str,
        status: u16,
    ) {
        self.lock().rules.push(Rule {
            remaining: n,
            verb: verb.map(str::to_string),
            resource: resource.map(str::to_string),
            body: Some(needle.to_string()),
            status,
        });
    }

    /// Hold the next `n` requests whose verb and resource match (as for
    /// [`Faults::fail_next`]) for `delay` before they go on to the API server: a slow
    /// request, during which the test changes the world under the client's feet.
    pub fn delay_next(
        &self,
        n: usize,
        verb: Option<&str>,
        resource: Option<&str>,
        delay: Duration,
    ) {
        self.lock().delays.push(Delay {
            remaining: n,
            verb: verb.map(str::to_string),
            resource: resource.map(str::to_string),
            delay,
        });
    }

    /// Add `latency` before every request is answered (replaces any earlier latency).
    pub fn add_latency(&self, latency: Duration) {
        self.lock().latency = latency;
    }

    /// Close every watch stream that is open now (clients see the stream end).
    pub fn drop_watches(&self) {
        self.drop_watches.send_modify(|n| *n += 1);
    }

    /// Fail every discovery request for API group `group` (`/apis/{group}` and
    /// `/apis/{group}/{version}`) with `status` until [`Faults::clear`]: a flaky API
    /// server or aggregation layer, as a client discovering that group sees it.
    pub fn fail_discovery(&self, group: &str, status: u16) {
        self.lock().discovery.push((group.to_string(), status));
    }

    /// Remove all pending failures and the latency.
    pub fn clear(&self) {
        let mut s = self.lock();
        s.rules.clear();
        s.delays.clear();
        s.discovery.clear();
        s.latency = Duration::ZERO;
    }

    pub(crate) fn latency(&self) -> Duration {
        self.lock().latency
    }

    pub(crate) fn watch_drops(&self) -> watch::Receiver<u64> {
        self.drop_watches.subscribe()
    }

    /// The failure for a discovery request of `path`, if its group's discovery fails.
    pub(crate) fn discovery(&self, path: &str) -> Option<Injected> {
        let segs: Vec<&str> = path.trim_matches('/').split('/').collect();
        let group = match segs.as_slice() {
            ["apis", group] | ["apis", group, _] => *group,
            _ => return None,
        };
        let s = self.lock();
        let status = s.discovery.iter().find(|(g, _)| g == group)?.1;
        Some(Injected {
            code: status,
            reason: reason_for(status).to_string(),
            message: format!("injected fault: discovery of {group} failed with {status}"),
        })
    }

    /// Consume one matching delay, if any.
    pub(crate) fn take_delay(
        &self,
        verb: &str,
        resource: &str,
        subresource: &str,
    ) -> Option<Duration> {
        let mut s = self.lock();
        let full = format!("{resource}/{subresource}");
        let idx = s.delays.iter().position(|r| {
            r.remaining > 0
                && r.verb.as_deref().is_none_or(|v| v == verb)
                && r.resource
                    .as_deref()
                    .is_none_or(|x| x == resource || x == full)
        })?;
        let rule = &mut s.delays[idx];
        rule.remaining -= 1;
        let delay = rule.delay;
        if rule.remaining == 0 {
            s.delays.remove(idx);
        }
        Some(delay)
    }

    /// Consume one matching failure, if any (of the rules that do not look at the body).
    pub(crate) fn take(&self, verb: &str, resource: &str, subresource: &str) -> Option<Injected> {
        self.take_matching(verb, resource, subresource, None)
    }

    /// Consume one matching failure of the rules that look at the body, if any.
    pub(crate) fn take_with_body(
        &self,
        verb: &str,
        resource: &str,
        subresource: &str,
        body: &[u8],
    ) -> Option<Injected> {
        self.take_matching(verb, resource, subresource, Some(body))
    }

    fn take_matching(
        &self,
        verb: &str,
        resource: &str,
        subresource: &str,
        body: Option<&[u8]>,
    ) -> Option<Injected> {
        let mut s = self.lock();
        let full = if subresource.is_empty() {
            resource.to_string()
        } else {
            format!("{resource}/{subresource}")
        };
        let body_matches = |r: &Rule| match (&r.body, body) {
            (None, None) => true,
            (Some(needle), Some(b)) => String::from_utf8_lossy(b).contains(needle.as_str()),
            _ => false,
        };
        let idx = s.rules.iter().position(|r| {
            r.remaining > 0
                && r.verb.as_deref().is_none_or(|v| v == verb)
                && r.resource
                    .as_deref()
                    .is_none_or(|x| x == resource || x == full)
                && body_matches(r)
        })?;
        let rule = &mut s.rules[idx];
        rule.remaining -= 1;
        let status = rule.status;
        if rule.remaining == 0 {
            s.rules.remove(idx);
        }
        Some(Injected {
            code: status,
            reason: reason_for(status).to_string(),
            message: format!("injected fault: {verb} {full} failed with {status}"),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_body_rule_fails_only_the_request_whose_body_holds_its_text() {
        let f = Faults::default();
        f.fail_next_with_body(1, Some("patch"), Some("things"), "finalizers", 409);
        assert!(
            f.take("patch", "things", "").is_none(),
            "not without the body"
        );
        assert!(
            f.take_with_body("patch", "things", "", b"{\"status\":{}}")
                .is_none()
        );
        assert_eq!(
            f.take_with_body(
                "patch",
                "things",
                "",
                b"[{\"path\":\"/metadata/finalizers\"}]"
            )
            .map(|e| e.code),
            Some(409)
        );
        assert!(
            f.take_with_body("patch", "things", "", b"/metadata/finalizers")
                .is_none(),
            "once"
        );
    }

    #[test]
    fn fail_next_counts_and_matches() {
        let f = Faults::default();
        f.fail_next(2, Some("create"), Some("secrets"), 500);
        assert!(f.take("get", "secrets", "").is_none());
        assert!(f.take("create", "leases", "").is_none());
        assert_eq!(f.take("create", "secrets", "").map(|e| e.code), Some(500));
        assert_eq!(
            f.take("create", "secrets", "").map(|e| e.reason),
            Some("InternalError".into())
        );
        assert!(f.take("create", "secrets", "").is_none());
        f.fail_next(1, None, Some("jobs/status"), 409);
        assert!(f.take("update", "jobs", "").is_none());
        assert_eq!(
            f.take("update", "jobs", "status").map(|e| e.code),
            Some(409)
        );
        f.delay_next(1, Some("patch"), Some("secrets"), Duration::from_secs(3));
        assert_eq!(f.take_delay("patch", "leases", ""), None);
        assert_eq!(
            f.take_delay("patch", "secrets", ""),
            Some(Duration::from_secs(3))
        );
        assert_eq!(f.take_delay("patch", "secrets", ""), None);
        f.fail_discovery("cluster.x-k8s.io", 503);
        assert_eq!(
            f.discovery("/apis/cluster.x-k8s.io/v1beta2")
                .map(|e| e.code),
            Some(503)
        );
        assert!(f.discovery("/apis/cluster.x-k8s.io").is_some());
        assert!(f.discovery("/apis/batch/v1").is_none());
        assert!(
            f.discovery("/apis/cluster.x-k8s.io/v1beta2/clusters")
                .is_none()
        );
        f.add_latency(Duration::from_millis(5));
        f.clear();
        assert_eq!(f.latency(), Duration::ZERO);
        assert!(f.discovery("/apis/cluster.x-k8s.io").is_none());
    }
}
