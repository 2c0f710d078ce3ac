//! Readiness probes, as the kubelet runs them for a running container: `httpGet` (plain
//! HTTP, a status from 200 to 399 is a success) and `tcpSocket` (a connection), on the
//! Pod's address (127.0.0.1: every Pod has this machine's network), the port by number or
//! by the name of one of the container's ports; first after `initialDelaySeconds`, then
//! every `periodSeconds` (10), each given `timeoutSeconds` (1). The container is not ready
//! until a probe succeeds `successThreshold` times in a row (1), and no longer ready after
//! `failureThreshold` failures in a row (3). A container without a readiness probe is ready
//! while it runs. `exec` and `grpc` probes are not run (the container counts as having
//! none), and neither are liveness and startup probes: containers are never restarted here.

use std::time::Duration;

use k8s_openapi::api::core::v1::{Container, Probe};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

#[derive(Clone, Debug, PartialEq)]
enum Check {
    Http { port: u16, path: String },
    Tcp { port: u16 },
}

/// A container's readiness probe.
#[derive(Clone, Debug, PartialEq)]
pub struct Readiness {
    check: Check,
    pub initial_delay: Duration,
    pub period: Duration,
    timeout: Duration,
    success_threshold: u32,
    failure_threshold: u32,
}

fn seconds(v: Option<i32>, default: i32) -> Duration {
    Duration::from_secs(u64::try_from(v.unwrap_or(default).max(0)).unwrap_or(0))
}

fn port(c: &Container, port: &IntOrString) -> Result<u16, String> {
    match port {
        IntOrString::Int(n) => u16::try_from(*n).map_err(|_| format!("port {n} is out of range")),
        IntOrString::String(name) => c
            .ports
            .iter()
            .flatten()
            .find(|p| p.name.as_deref() == Some(name.as_str()))
            .and_then(|p| u16::try_from(p.container_port).ok())
            .ok_or_else(|| format!("the container has no port named {name:?}")),
    }
}

impl Readiness {
    /// The readiness probe of `c` the kubelet runs; `None` when it has none it runs.
    pub fn of(c: &Container) -> Result<Option<Readiness>, String> {
        let Some(p): Option<&Probe> = c.readiness_probe.as_ref() else {
            return Ok(None);
        };
        let check = if let Some(h) = &p.http_get {
            if h.scheme.as_deref().is_some_and(|s| s != "HTTP") {
                return Err(format!(
                    "the readiness probe's scheme {:?} is not supported by the local kubelet (HTTP only)",
                    h.scheme
                ));
            }
            Check::Http {
                port: port(c, &h.port)?,
                path: h
                    .path
                    .clone()
                    .filter(|p| !p.is_empty())
                    .unwrap_or("/".into()),
            }
        } else if let Some(t) = &p.tcp_socket {
            Check::Tcp {
                port: port(c, &t.port)?,
            }
        } else {
            return Ok(None);
        };
        Ok(Some(Readiness {
            check,
            initial_delay: seconds(p.initial_delay_seconds, 0),
            period: seconds(p.period_seconds, 10).max(Duration::from_secs(1)),
            timeout: seconds(p.timeout_seconds, 1).max(Duration::from_secs(1)),
            success_threshold: p.success_threshold.unwrap_or(1).max(1) as u32,
            failure_threshold: p.failure_threshold.unwrap_or(3).max(1) as u32,
        }))
    }

    /// Probes once.
    pub async fn check(&self) -> bool {
        tokio::time::timeout(self.timeout, self.try_once())
            .await
            .unwrap_or(false)
    }

    async fn try_once(&self) -> bool {
        match &self.check {
            Check::Tcp { port } => TcpStream::connect(("127.0.0.1", *port)).await.is_ok(),
            Check::Http { port, path } => {
                let Ok(mut s) = TcpStream::connect(("127.0.0.1", *port)).await else {
                    return false;
                };
                let request = format!(
                    "GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nUser-Agent: kube-probe/1.37\r\nAccept: */*\r\nConnection: close\r\n\r\n"
                );
                if s.write_all(request.as_bytes()).await.is_err() {
                    return false;
                }
                // The status line is all that is read.
                let mut head = [0u8; 64];
                let mut n = 0;
                while n < 12 {
                    match s.read(&mut head[n..]).await {
                        Ok(0) | Err(_) => break,
                        Ok(m) => n += m,
                    }
                }
                status_ok(&head[..n])
            }
        }
    }
}

/// Whether an HTTP response beginning with `head` has a status from 200 to 399.
fn status_ok(head: &[u8]) -> bool {
    let text = String::from_utf8_lossy(head);
    text.split_whitespace()
        .nth(1)
        .and_then(|c| c.parse::<u16>().ok())
        .is_some_and(|c| (200..400).contains(&c))
}

/// The results of one container's probes so far: whether it is ready.
#[derive(Clone, Debug, Default)]
pub struct Results {
    successes: u32,
    failures: u32,
    pub ready: bool,
}

impl Results {
    /// Records one probe's result; whether readiness changed.
    pub fn record(&mut self, probe: &Readiness, ok: bool) -> bool {
        let before = self.ready;
        if ok {
            self.successes += 1;
            self.failures = 0;
            if self.successes >= probe.success_threshold {
                self.ready = true;
            }
        } else {
            self.failures += 1;
            self.successes = 0;
            if self.failures >= probe.failure_threshold {
                self.ready = false;
            }
        }
        before != self.ready
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn container(probe: serde_json::Value) -> Container {
        serde_json::from_value(json!({"name": "c",
            "ports": [{"name": "healthz", "containerPort": 8081}],
            "readinessProbe": probe}))
        .unwrap()
    }

    #[test]
    fn the_probe_of_a_container() {
        let p = Readiness::of(&container(
            json!({"httpGet": {"path": "/readyz", "port": "healthz"},
            "initialDelaySeconds": 5, "periodSeconds": 10}),
        ))
        .unwrap()
        .unwrap();
        assert_eq!(
            p.check,
            Check::Http {
                port: 8081,
                path: "/readyz".into()
            }
        );
        assert_eq!(p.initial_delay, Duration::from_secs(5));
        assert_eq!((p.success_threshold, p.failure_threshold), (1, 3));
        let tcp = Readiness::of(&container(json!({"tcpSocket": {"port": 9000}})))
            .unwrap()
            .unwrap();
        assert_eq!(tcp.check, Check::Tcp { port: 9000 });
        assert_eq!(tcp.period, Duration::from_secs(10));
        assert_eq!(
            Readiness::of(&container(json!({"exec": {"command": ["true"]}}))).unwrap(),
            None
        );
        assert!(
            Readiness::of(&container(json!({"httpGet": {"port": "nope"}})))
                .unwrap_err()
                .contains("no port named \"nope\"")
        );
    }

    #[test]
    fn statuses_and_thresholds() {
        assert!(status_ok(b"HTTP/1.1 200 OK\r\n"));
        assert!(status_ok(b"HTTP/1.1 302 Found\r\n"));
        assert!(!status_ok(b"HTTP/1.1 503 Service Unavailable\r\n"));
        assert!(!status_ok(b""));
        let p = Readiness::of(&container(json!({"tcpSocket": {"port": 1},
            "failureThreshold": 2})))
        .unwrap()
        .unwrap();
        let mut r = Results::default();
        assert!(!r.record(&p, false), "not ready before a success");
        assert!(r.record(&p, true), "ready at the first success");
        assert!(!r.record(&p, false), "one failure is not enough");
        assert!(r.record(&p, false), "two in a row are");
        assert!(!r.ready);
    }
}
