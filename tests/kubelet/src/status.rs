//! Pod status as the kubelet writes it (pure): the phase, the container states and the
//! conditions it owns, for a strategic merge patch of `pods/status` (conditions merge
//! by type, so `PodScheduled` and the conditions of others stay).

use k8s_openapi::api::core::v1::Pod;
use serde_json::{Value, json};

/// The kubelet keeps this many bytes of a termination message (its tail).
pub const MAX_TERMINATION_MESSAGE: usize = 4096;
/// `FallbackToLogsOnError`: at most this many lines and bytes of the log's tail.
pub const FALLBACK_LOG_LINES: usize = 80;
pub const FALLBACK_LOG_BYTES: usize = 2048;

#[derive(Clone, Debug, PartialEq)]
pub enum State {
    Waiting {
        reason: String,
        message: String,
    },
    Running {
        started_at: String,
    },
    Terminated {
        exit_code: i32,
        reason: String,
        message: String,
        started_at: String,
        finished_at: String,
    },
}

#[derive(Clone, Debug, PartialEq)]
pub struct Container {
    pub name: String,
    pub image: String,
    /// The `imageID` of an image the kubelet has (by its manifest's digest); else one is
    /// made up from the reference ([`image_id`]).
    pub image_id: Option<String>,
    pub container_id: Option<String>,
    pub state: State,
    /// What its readiness probe says (`None`: it has none, and is ready while it runs).
    pub probed_ready: Option<bool>,
    /// A native sidecar (an init container with `restartPolicy: Always`): reported among
    /// the init containers, and not counted in the phase.
    pub sidecar: bool,
}

impl Container {
    /// Running, and ready by its readiness probe if it has one.
    pub fn ready(&self) -> bool {
        matches!(self.state, State::Running { .. }) && self.probed_ready.unwrap_or(true)
    }
}

/// What the Pod as a whole reports besides its containers.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PodReport {
    pub start_time: Option<String>,
    /// `Evicted` and its message, for a Pod the kubelet evicted.
    pub reason: Option<(String, String)>,
    /// A `DisruptionTarget` condition: reason and message.
    pub disruption: Option<(String, String)>,
}

pub fn now() -> String {
    jiff::Timestamp::now()
        .strftime("%Y-%m-%dT%H:%M:%SZ")
        .to_string()
}

/// The phase of a Pod with `restartPolicy: Never` (or `OnFailure` treated alike, as
/// containers are never restarted here).
pub fn phase(containers: &[Container], evicted: bool) -> &'static str {
    if evicted {
        return "Failed";
    }
    // A sidecar's own end decides nothing: the kubelet stops it once the others ended.
    let sidecars_running = containers
        .iter()
        .any(|c| c.sidecar && !matches!(c.state, State::Terminated { .. }));
    let containers: Vec<&Container> = containers.iter().filter(|c| !c.sidecar).collect();
    let terminated: Vec<i32> = containers
        .iter()
        .filter_map(|c| match c.state {
            State::Terminated { exit_code, .. } => Some(exit_code),
            _ => None,
        })
        .collect();
    if terminated.len() == containers.len() && !containers.is_empty() {
        if sidecars_running {
            "Running"
        } else if terminated.iter().all(|c| *c == 0) {
            "Succeeded"
        } else {
            "Failed"
        }
    } else if containers
        .iter()
        .any(|c| matches!(c.state, State::Running { .. } | State::Terminated { .. }))
    {
        "Running"
    } else {
        "Pending"
    }
}

fn container_status(c: &Container) -> Value {
    let (state, ready, started) = match &c.state {
        State::Waiting { reason, message } => {
            let mut w = json!({"reason": reason});
            if !message.is_empty() {
                w["message"] = json!(message);
            }
            (json!({ "waiting": w }), false, false)
        }
        State::Running { started_at } => (
            json!({"running": {"startedAt": started_at}}),
            c.ready(),
            true,
        ),
        State::Terminated {
            exit_code,
            reason,
            message,
            started_at,
            finished_at,
        } => {
            let mut t = json!({"exitCode": exit_code, "reason": reason,
                "startedAt": started_at, "finishedAt": finished_at});
            if let Some(id) = &c.container_id {
                t["containerID"] = json!(id);
            }
            if !message.is_empty() {
                t["message"] = json!(message);
            }
            (json!({ "terminated": t }), false, false)
        }
    };
    // A container that never started has no image pulled: no imageID, as on a node.
    let image_id = if state.get("waiting").is_some() {
        String::new()
    } else {
        c.image_id.clone().unwrap_or_else(|| image_id(&c.image))
    };
    let mut s = json!({"name": c.name, "image": c.image, "imageID": image_id, "ready": ready,
        "started": started, "restartCount": 0, "state": state});
    if let Some(id) = &c.container_id {
        s["containerID"] = json!(id);
    }
    s
}

/// The `imageID` a node reports for a container of `image` not in the image store: the
/// image's repository, fully qualified, by digest. There is no registry here, so the digest
/// is the SHA-256 of the reference (or the digest a reference by digest names).
pub fn image_id(image: &str) -> String {
    use sha2::Digest;
    let reference = crate::images::Reference::parse(image);
    let digest = reference.digest.unwrap_or_else(|| {
        let hex: String = sha2::Sha256::digest(image.as_bytes())
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        format!("sha256:{hex}")
    });
    format!("{}@{digest}", reference.repository)
}

/// The status patch for `pod` (whose current conditions keep their transition times).
pub fn patch(pod: &Pod, containers: &[Container], report: &PodReport) -> Value {
    let evicted = report.reason.is_some();
    let phase = phase(containers, evicted);
    let old = pod
        .status
        .as_ref()
        .and_then(|s| s.conditions.clone())
        .unwrap_or_default();
    let now = now();
    let condition = |type_: &str, status: bool, reason: Option<&str>, message: Option<&str>| {
        let status = if status { "True" } else { "False" };
        let since = old
            .iter()
            .find(|c| c.type_ == type_ && c.status == status)
            .and_then(|c| c.last_transition_time.as_ref())
            .map(|t| t.0.strftime("%Y-%m-%dT%H:%M:%SZ").to_string())
            .unwrap_or_else(|| now.clone());
        let mut c = json!({"type": type_, "status": status, "lastTransitionTime": since,
            "lastProbeTime": null});
        if let Some(r) = reason {
            c["reason"] = json!(r);
        }
        if let Some(m) = message {
            c["message"] = json!(m);
        }
        c
    };
    let all_ready = !containers.is_empty() && containers.iter().all(Container::ready);
    let not_ready: Vec<&str> = containers
        .iter()
        .filter(|c| !c.ready())
        .map(|c| c.name.as_str())
        .collect();
    let (ready_reason, ready_message) = if all_ready {
        (None, None)
    } else if phase == "Succeeded" || phase == "Failed" {
        (Some("PodCompleted"), None)
    } else {
        (
            Some("ContainersNotReady"),
            Some(format!(
                "containers with unready status: [{}]",
                not_ready.join(" ")
            )),
        )
    };
    let sandbox = !matches!(phase, "Succeeded" | "Failed");
    let mut conditions = vec![
        condition("PodReadyToStartContainers", sandbox, None, None),
        condition("Initialized", true, None, None),
        condition(
            "ContainersReady",
            all_ready,
            ready_reason,
            ready_message.as_deref(),
        ),
        condition("Ready", all_ready, ready_reason, ready_message.as_deref()),
    ];
    if let Some((reason, message)) = &report.disruption {
        conditions.push(condition(
            "DisruptionTarget",
            true,
            Some(reason),
            Some(message),
        ));
    }
    let mut status = json!({
        "phase": phase,
        "conditions": conditions,
        "hostIP": "127.0.0.1", "hostIPs": [{"ip": "127.0.0.1"}],
        "podIP": "127.0.0.1", "podIPs": [{"ip": "127.0.0.1"}],
        "containerStatuses": containers.iter().filter(|c| !c.sidecar).map(container_status).collect::<Vec<_>>(),
    });
    if containers.iter().any(|c| c.sidecar) {
        status["initContainerStatuses"] = containers
            .iter()
            .filter(|c| c.sidecar)
            .map(container_status)
            .collect();
    }
    if let Some(t) = &report.start_time {
        status["startTime"] = json!(t);
    }
    if let Some((reason, message)) = &report.reason {
        status["reason"] = json!(reason);
        status["message"] = json!(message);
    }
    json!({ "status": status })
}

/// The termination message of a container as the kubelet reads it: the last 4096 bytes
/// of the file; when that is empty, the container failed and its policy is
/// `FallbackToLogsOnError`, the last 80 lines of its log, at most 2048 bytes.
pub fn termination_message(file: &[u8], log: &[u8], failed: bool, fallback: bool) -> String {
    if !file.is_empty() {
        let start = file.len().saturating_sub(MAX_TERMINATION_MESSAGE);
        return String::from_utf8_lossy(&file[start..]).into_owned();
    }
    if !(failed && fallback) {
        return String::new();
    }
    let start = log.len().saturating_sub(FALLBACK_LOG_BYTES);
    let tail = &log[start..];
    let text = String::from_utf8_lossy(tail);
    let lines: Vec<&str> = text.split_inclusive('\n').collect();
    let from = lines.len().saturating_sub(FALLBACK_LOG_LINES);
    lines[from..].concat()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn c(name: &str, state: State) -> Container {
        Container {
            name: name.into(),
            image: "img".into(),
            image_id: None,
            container_id: None,
            state,
            probed_ready: None,
            sidecar: false,
        }
    }

    fn term(code: i32) -> State {
        State::Terminated {
            exit_code: code,
            reason: if code == 0 { "Completed" } else { "Error" }.into(),
            message: String::new(),
            started_at: "t0".into(),
            finished_at: "t1".into(),
        }
    }

    #[test]
    fn phases_follow_the_containers() {
        let waiting = State::Waiting {
            reason: "ContainerCreating".into(),
            message: String::new(),
        };
        let running = State::Running {
            started_at: "t".into(),
        };
        assert_eq!(phase(&[c("a", waiting.clone())], false), "Pending");
        assert_eq!(phase(&[c("a", running.clone())], false), "Running");
        assert_eq!(phase(&[c("a", running), c("b", term(0))], false), "Running");
        assert_eq!(
            phase(&[c("a", term(0)), c("b", term(0))], false),
            "Succeeded"
        );
        assert_eq!(phase(&[c("a", term(0)), c("b", term(1))], false), "Failed");
        assert_eq!(phase(&[c("a", waiting)], true), "Failed");
    }

    #[test]
    fn a_sidecar_is_an_init_container_whose_end_decides_nothing() {
        let running = State::Running {
            started_at: "t".into(),
        };
        let sidecar = |state| Container {
            sidecar: true,
            ..c("proxy", state)
        };
        // The main container ended: running until the sidecar is stopped too.
        let both = [sidecar(running), c("main", term(0))];
        assert_eq!(phase(&both, false), "Running");
        // Stopped by SIGTERM (143): the main container's exit decides.
        assert_eq!(
            phase(&[sidecar(term(143)), c("main", term(0))], false),
            "Succeeded"
        );
        assert_eq!(
            phase(&[sidecar(term(0)), c("main", term(2))], false),
            "Failed"
        );
        let p = patch(&Pod::default(), &both, &PodReport::default());
        let names = |key: &str| -> Vec<String> {
            p["status"][key]
                .as_array()
                .unwrap()
                .iter()
                .map(|c| c["name"].as_str().unwrap().to_string())
                .collect()
        };
        assert_eq!(names("containerStatuses"), ["main"]);
        assert_eq!(names("initContainerStatuses"), ["proxy"]);
    }

    #[test]
    fn a_finished_pod_is_not_ready_because_it_completed() {
        let p = patch(&Pod::default(), &[c("a", term(1))], &PodReport::default());
        let conds = p["status"]["conditions"].as_array().unwrap();
        let ready = conds.iter().find(|c| c["type"] == "Ready").unwrap();
        assert_eq!(
            (ready["status"].as_str(), ready["reason"].as_str()),
            (Some("False"), Some("PodCompleted"))
        );
        assert_eq!(p["status"]["phase"], "Failed");
        assert_eq!(
            p["status"]["containerStatuses"][0]["state"]["terminated"]["exitCode"],
            1
        );
    }

    /// A running container whose readiness probe has not succeeded keeps the Pod unready.
    #[test]
    fn a_running_container_is_ready_once_its_probe_says_so() {
        let running = || State::Running {
            started_at: "t".into(),
        };
        let mut probed = c("manager", running());
        probed.probed_ready = Some(false);
        let p = patch(
            &Pod::default(),
            &[probed.clone(), c("plain", running())],
            &PodReport::default(),
        );
        let conds = p["status"]["conditions"].as_array().unwrap();
        let ready = conds.iter().find(|c| c["type"] == "Ready").unwrap();
        assert_eq!(ready["status"], "False");
        assert_eq!(
            ready["message"],
            "containers with unready status: [manager]"
        );
        assert_eq!(p["status"]["containerStatuses"][0]["ready"], false);
        assert_eq!(p["status"]["containerStatuses"][1]["ready"], true);
        probed.probed_ready = Some(true);
        let p = patch(&Pod::default(), &[probed], &PodReport::default());
        let conds = p["status"]["conditions"].as_array().unwrap();
        let ready = conds.iter().find(|c| c["type"] == "Ready").unwrap();
        assert_eq!(ready["status"], "True");
    }

    #[test]
    fn an_evicted_pod_reports_the_reason_and_a_disruption_target() {
        let report = PodReport {
            reason: Some((
                "Evicted".into(),
                "The node was low on resource: memory.".into(),
            )),
            disruption: Some(("TerminationByKubelet".into(), "memory pressure".into())),
            ..Default::default()
        };
        let p = patch(&Pod::default(), &[c("a", term(137))], &report);
        assert_eq!(p["status"]["reason"], "Evicted");
        let conds = p["status"]["conditions"].as_array().unwrap();
        assert!(conds.iter().any(|c| c["type"] == "DisruptionTarget"
            && c["status"] == "True"
            && c["reason"] == "TerminationByKubelet"));
    }

    #[test]
    fn the_termination_message_keeps_the_tail() {
        let long: Vec<u8> = (0..5000).map(|i| b'a' + (i % 26) as u8).collect();
        let m = termination_message(&long, b"", true, true);
        assert_eq!(m.len(), 4096);
        assert!(long.ends_with(m.as_bytes()));
        // Fallback: only for a failed container with the policy, and only the last 80 lines.
        let log: String = (0..100).map(|i| format!("line {i}\n")).collect();
        assert_eq!(termination_message(b"", log.as_bytes(), false, true), "");
        assert_eq!(termination_message(b"", log.as_bytes(), true, false), "");
        let m = termination_message(b"", log.as_bytes(), true, true);
        assert_eq!(m.lines().count(), 80);
        assert!(m.starts_with("line 20\n") && m.ends_with("line 99\n"));
        let wide: String = (0..10)
            .map(|i| format!("{i}{}\n", "x".repeat(500)))
            .collect();
        assert!(termination_message(b"", wide.as_bytes(), true, true).len() <= 2048);
    }
}

#[cfg(test)]
mod image_id_tests {
    use super::image_id;

    #[test]
    fn an_image_is_reported_fully_qualified_by_digest() {
        let id = image_id("hashicorp/terraform:1.11.4");
        assert!(
            id.starts_with("docker.io/hashicorp/terraform@sha256:"),
            "{id}"
        );
        assert_eq!(id.len(), "docker.io/hashicorp/terraform@sha256:".len() + 64);
        assert!(image_id("busybox").starts_with("docker.io/library/busybox@sha256:"));
        assert!(
            image_id("registry.example.com:5000/team/runner:v1")
                .starts_with("registry.example.com:5000/team/runner@sha256:")
        );
        let pinned = format!("ghcr.io/opentofu/opentofu@sha256:{}", "a".repeat(64));
        assert_eq!(image_id(&pinned), pinned);
        assert_ne!(
            image_id("x:1"),
            image_id("x:2"),
            "another tag, another digest"
        );
    }
}
