//! Tests of `templates/runner.sh`, run for real with `sh` and a fake `terraform` on PATH
//! (the same fake as `tofu` for OpenTofu).
//!
//! The render directory is materialised from the rendered Job's annotations, as the
//! kubelet projects them, and the container's env is used with its paths moved into a
//! temp directory. The fake records its arguments, working directory and environment, and
//! can be told through env vars to fail with a given stderr, to write `errored.tfstate`,
//! or to sleep while trapping TERM and recording each TERM it gets.

use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Secret;

use super::render::CONTAINER_NAME;
use super::render_tests::{inline_inputs, projected_files, rendered, request};
use super::testutil::TempDir;
use super::*;
use crate::api::names;
use crate::inputs::Module;

const FAKE_TERRAFORM: &str = r#"#!/bin/sh
rec="$FAKE_TF_RECORD"
echo "BIN ${0##*/}" >> "$rec"
echo "ARGS $*" >> "$rec"
echo "CWD $(pwd)" >> "$rec"
echo "ENV HOME=${HOME:-} TF_DATA_DIR=${TF_DATA_DIR:-} TF_IN_AUTOMATION=${TF_IN_AUTOMATION:-} TF_INPUT=${TF_INPUT:-} AWS=${AWS_ACCESS_KEY_ID:-}" >> "$rec"
case "$1" in
init)
    for a in "$@"; do
        case "$a" in
            -from-module=*)
                echo "FROM_MODULE ${a#-from-module=} [$(ls -A)]" >> "$rec"
                printf 'resource "terraform_data" "x" {}\n' > main.tf
                if [ -n "${FAKE_TF_SYMLINK:-}" ]; then
                    # As Terraform's copy keeps them: a file of the module that is a
                    # link to another of its files.
                    mkdir -p shared
                    printf 'variable "region" {}\n' > shared/common.tf
                    ln -s shared/common.tf common.tf
                    # And one that leads out of it.
                    ln -s /etc/hostname outside.txt
                fi
                ;;
            -backend-config=*)
                echo "BACKEND_CONFIG_BEGIN" >> "$rec"
                cat "${a#-backend-config=}" >> "$rec"
                echo "BACKEND_CONFIG_END" >> "$rec"
                ;;
        esac
    done
    if [ -f captf_backend_override.tf ]; then
        echo "OVERRIDE $(tr '\n' ' ' < captf_backend_override.tf)" >> "$rec"
        if [ -n "${FAKE_TF_LOCK:-}" ]; then
            printf '%s\n' "$FAKE_TF_LOCK" > .terraform.lock.hcl
        fi
    fi
    echo "FILES $(find . -type f | sort | tr '\n' ' ')" >> "$rec"
    if [ -n "${FAKE_TF_FAIL_INIT:-}" ]; then
        printf '%s\n' "$FAKE_TF_FAIL_INIT" >&2
        exit 1
    fi
    exit 0
    ;;
force-unlock)
    touch "$rec.unlocked"
    exit 0
    ;;
state)
    echo "STATE $* WORKSPACE=${TF_WORKSPACE:-} DATA=${TF_DATA_DIR:-} CWD=$(pwd)" >> "$rec"
    shift 2
    for a in "$@"; do
        case "$a" in
            -*) ;;
            *) echo "PUSHED $(cat "$a")" >> "$rec" ;;
        esac
    done
    if [ -n "${FAKE_TF_FAIL_PUSH:-}" ]; then
        printf '%s\n' "$FAKE_TF_FAIL_PUSH" >&2
        exit 1
    fi
    exit 0
    ;;
plan)
    for a in "$@"; do
        case "$a" in
            -out=*) echo "PLANNED" > "${a#-out=}" ;;
        esac
    done
    exit "${FAKE_TF_PLAN_EXIT:-0}"
    ;;
show)
    printf '%s' "${FAKE_TF_PLAN_SHOW:-}"
    exit 0
    ;;
destroy | apply)
    if [ -n "${FAKE_TF_LOCKED_BY:-}" ] && [ ! -f "$rec.unlocked" ]; then
        printf '\nError: Error acquiring the state lock\n\nError message: the state is already locked by another terraform client\nLock Info:\n  ID:        lock-1234\n  Path:      \n  Operation: OperationTypeApply\n  Who:       %s\n  Version:   1.11.4\n  Created:   2026-12-01 10:00:00 +0000 UTC\n  Info:      \n\n' "$FAKE_TF_LOCKED_BY" >&2
        exit 1
    fi
    for a in "$@"; do
        case "$a" in
            -var-file=*) echo "VARS $(cat "${a#-var-file=}" | tr -d ' \n')" >> "$rec" ;;
        esac
    done
    if [ -n "${FAKE_TF_ERRORED:-}" ]; then
        printf '%s' "$FAKE_TF_ERRORED" > errored.tfstate
    fi
    if [ -n "${FAKE_TF_SLEEP:-}" ]; then
        got=""
        trap 'echo "SIGNAL TERM" >> "$rec"; got=1' TERM
        read -r _ _ _ _ pgrp _ < /proc/$$/stat
        echo "PGRP $pgrp" >> "$rec"
        echo "SLEEPING $$" >> "$rec"
        i=0
        while [ -z "$got" ] && [ "$i" -lt "$FAKE_TF_SLEEP" ]; do
            sleep 0.1
            i=$((i + 1))
        done
        # Like Terraform: stop gracefully, taking a moment (a second signal would be
        # recorded too).
        sleep 0.5
        printf 'Error: interrupted\n' >&2
        exit 1
    fi
    if [ -n "${FAKE_TF_STDERR:-}" ]; then
        printf '%s' "$FAKE_TF_STDERR" >&2
    fi
    exit "${FAKE_TF_EXIT:-0}"
    ;;
esac
exit 3
"#;

/// One run's directories: the render dir (from the Job), the workspace, the fake's bin.
struct Runner {
    _dir: TempDir,
    root: PathBuf,
    job: Job,
    shell: Shell,
}

/// The shell the script runs under: the system's `sh` (dash here), or busybox with only
/// its applets on PATH, as in the stock hashicorp/terraform image.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Shell {
    System,
    Busybox,
}

const BUSYBOX: &str = "/usr/bin/busybox";
const BUSYBOX_APPLETS: &[&str] = &[
    "sh",
    "cp",
    "mkdir",
    "rm",
    "cat",
    "tee",
    "mkfifo",
    "sed",
    "tail",
    "tr",
    "date",
    "setsid",
    "kill",
    "sleep",
    "printf",
    "find",
    "ls",
    "sort",
    "pwd",
    "env",
    "head",
    "cut",
    "hostname",
    "base64",
    "wc",
    "sha256sum",
];

/// The shells to run each test under: busybox too when it is installed.
fn shells() -> Vec<Shell> {
    let mut shells = vec![Shell::System];
    if Path::new(BUSYBOX).exists() {
        shells.push(Shell::Busybox);
    } else if std::env::var_os("CAPTF_REQUIRE_BUSYBOX").is_some() {
        // CI installs busybox (.ci/run): there, its absence is a failure, not a skip.
        panic!(
            "{BUSYBOX} is not installed but CAPTF_REQUIRE_BUSYBOX is set; install the busybox package"
        );
    } else {
        eprintln!(
            "{BUSYBOX} is not installed: the runner script is tested with the system sh only"
        );
    }
    shells
}

impl Runner {
    fn new((job, secret): (Job, Secret), shell: Shell) -> Runner {
        let dir = TempDir::new("runner");
        let root = dir.path().to_path_buf();
        // The kubelet's layout of a downwardAPI volume: the files in a timestamped
        // directory, `..data` pointing at it, and each top-level entry a symlink into
        // `..data`.
        let render = root.join("render");
        let mut top = std::collections::BTreeSet::new();
        for (path, content) in projected_files(&job, &secret) {
            let target = render.join("..2026_12_01_10_00_00.000000001").join(&path);
            std::fs::create_dir_all(target.parent().unwrap()).unwrap();
            std::fs::write(&target, content).unwrap();
            top.insert(path.split('/').next().unwrap().to_string());
        }
        std::os::unix::fs::symlink("..2026_12_01_10_00_00.000000001", render.join("..data"))
            .unwrap();
        for entry in top {
            std::os::unix::fs::symlink(format!("..data/{entry}"), render.join(&entry)).unwrap();
        }
        std::fs::create_dir_all(root.join("workspace")).unwrap();
        std::fs::create_dir_all(root.join("bin")).unwrap();
        let fake = root.join("bin/terraform");
        std::fs::write(&fake, FAKE_TERRAFORM).unwrap();
        std::fs::set_permissions(&fake, std::fs::Permissions::from_mode(0o755)).unwrap();
        if shell == Shell::Busybox {
            for applet in BUSYBOX_APPLETS {
                std::os::unix::fs::symlink(BUSYBOX, root.join("bin").join(applet)).unwrap();
            }
        }
        Runner {
            _dir: dir,
            root,
            job,
            shell,
        }
    }

    fn destroy(shell: Shell) -> Runner {
        let inputs = inline_inputs();
        Runner::new(rendered(&Templates::embedded(), &request(&inputs)), shell)
    }

    fn path(&self, p: &str) -> PathBuf {
        self.root.join(p)
    }

    /// `sh runner.sh` with the container's env, its paths moved under the temp dir.
    fn command(&self) -> Command {
        let pod = self
            .job
            .spec
            .as_ref()
            .unwrap()
            .template
            .spec
            .as_ref()
            .unwrap();
        let c = pod
            .containers
            .iter()
            .find(|c| c.name == CONTAINER_NAME)
            .unwrap();
        let cmd = c.command.as_ref().unwrap();
        assert_eq!(cmd[0], "/bin/sh");
        let script = cmd[1].replace(
            render::RENDER_DIR,
            &self.path("render").display().to_string(),
        );
        let mut command = match self.shell {
            Shell::System => Command::new("sh"),
            Shell::Busybox => Command::new(self.path("bin/sh")),
        };
        command.arg(script).env_clear();
        for e in c.env.iter().flatten() {
            let value = match (&e.value, &e.value_from) {
                (Some(v), _) => v
                    .replace(
                        render::RENDER_DIR,
                        &self.path("render").display().to_string(),
                    )
                    .replace(
                        render::WORKSPACE_DIR,
                        &self.path("workspace").display().to_string(),
                    ),
                (None, Some(_)) => format!("from-secret-{}", e.name),
                (None, None) => String::new(),
            };
            command.env(&e.name, value);
        }
        command
            .env(
                "PATH",
                format!(
                    "{}:/usr/local/bin:/usr/bin:/bin",
                    self.path("bin").display()
                ),
            )
            .env("CAPTF_TERMINATION_LOG", self.path("termination-log"))
            .env("FAKE_TF_RECORD", self.path("record"))
            .current_dir(self.path("workspace"));
        command
    }

    fn run(&self, mut command: Command) -> (ExitStatus, String) {
        let output = command.output().unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr).to_string();
        (output.status, stderr)
    }

    fn record(&self) -> String {
        std::fs::read_to_string(self.path("record")).unwrap_or_default()
    }

    fn termination_log(&self) -> String {
        std::fs::read_to_string(self.path("termination-log")).unwrap_or_default()
    }

    /// Asserts that the runner stopped before running anything: with `code`, and
    /// `message` in its termination log.
    fn assert_stopped_before_running(&self, status: ExitStatus, code: i32, message: &str) {
        assert_eq!(status.code(), Some(code));
        assert!(
            self.termination_log().contains(message),
            "{}",
            self.termination_log()
        );
        assert_eq!(self.record(), "", "nothing ran");
    }

    /// Waits until the fake terraform sleeps.
    fn wait_for_sleep(&self) {
        let start = Instant::now();
        while !self.record().contains("SLEEPING") {
            assert!(
                start.elapsed() < Duration::from_secs(20),
                "the fake terraform never started: {}",
                self.record()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

fn wait_timeout(child: &mut Child, limit: Duration) -> ExitStatus {
    let start = Instant::now();
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            panic!("the runner did not exit within {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn kill(signal: &str, target: &str) {
    let status = Command::new("kill")
        .args([format!("-{signal}"), "--".to_string(), target.to_string()])
        .status()
        .unwrap();
    assert!(status.success(), "kill -{signal} {target}");
}

#[test]
fn a_destroy_runs_init_with_the_backend_config_then_destroy() {
    for shell in shells() {
        eprintln!("shell: {shell:?}");
        let r = Runner::destroy(shell);
        let (status, stderr) = r.run(r.command());
        let record = r.record();
        assert!(status.success(), "{status:?}\n{stderr}\n{record}");
        let ws = r.path("workspace").display().to_string();
        let args: Vec<&str> = record.lines().filter(|l| l.starts_with("ARGS ")).collect();
        assert_eq!(
            args,
            [
                format!("ARGS init -input=false -no-color -backend-config={ws}/backend.hcl"),
                format!(
                    "ARGS destroy -auto-approve -input=false -no-color -var-file={ws}/captf.tfvars.json"
                ),
            ]
        );
        assert!(record.contains(&format!("CWD {ws}/work")), "{record}");
        assert!(
            record.contains("OVERRIDE terraform {   backend \"kubernetes\" {} }"),
            "{record}"
        );
        assert!(record.contains("namespace     = \"team-a\""), "{record}");
        assert!(record.contains("secret_suffix = \"web-1.tfm\""), "{record}");
        assert!(record.contains("in_cluster_config = true"), "{record}");
        assert!(
            record.contains("FILES ./.terraform.lock.hcl ./captf_backend_override.tf ./main.tf ./modules/net/main.tf ./variables.tf"),
            "{record}"
        );
        assert!(record.contains(&format!("ENV HOME={ws}/home TF_DATA_DIR={ws}/.terraform-data TF_IN_AUTOMATION=1 TF_INPUT=0 AWS=from-secret-AWS_ACCESS_KEY_ID")), "{record}");
        assert!(
            record.contains(r#"VARS {"name":"web-1","quote":"a\"b\"${c}","replicas":3}"#),
            "{record}"
        );
        assert!(r.path("workspace/home").is_dir() && r.path("workspace/tmp").is_dir());
        assert_eq!(r.termination_log(), "");
    }
}

#[test]
fn with_a_kubeconfig_the_backend_is_not_in_cluster() {
    for shell in shells() {
        eprintln!("shell: {shell:?}");
        let r = Runner::destroy(shell);
        let mut command = r.command();
        command.env("KUBE_CONFIG_PATH", r.path("kubeconfig"));
        let (status, stderr) = r.run(command);
        assert!(status.success(), "{stderr}");
        assert!(!r.record().contains("in_cluster_config"), "{}", r.record());
    }
}

/// With a state proxy beside it, the backend reaches the API server through the proxy's
/// port, with a kubeconfig of no credentials, and never in-cluster.
#[test]
fn with_a_state_proxy_the_backend_goes_through_its_port() {
    for shell in shells() {
        eprintln!("shell: {shell:?}");
        let r = Runner::destroy(shell);
        let port_file = r.path("proxy-port");
        std::fs::write(&port_file, "45609\n").unwrap();
        let mut command = r.command();
        command.env("CAPTF_STATE_PROXY_PORT_FILE", &port_file);
        let (status, stderr) = r.run(command);
        assert!(status.success(), "{stderr}");
        let record = r.record();
        let kubeconfig = r.path("workspace/state-proxy.kubeconfig");
        assert!(
            record.contains(&format!("config_path = \"{}\"", kubeconfig.display())),
            "{record}"
        );
        assert!(!record.contains("in_cluster_config"), "{record}");
        let config = std::fs::read_to_string(&kubeconfig).unwrap();
        assert!(
            config.contains("server: \"http://127.0.0.1:45609\""),
            "{config}"
        );
        assert!(config.contains("user: {}"), "no credentials: {config}");
    }
}

#[test]
fn a_source_module_is_fetched_into_an_empty_directory_first() {
    for shell in shells() {
        eprintln!("shell: {shell:?}");
        let mut inputs = inline_inputs();
        inputs.module = Module::Source("git::https://example.com/infra.git//vm?ref=v1.4.0".into());
        inputs.lock_file = None;
        let mut req = request(&inputs);
        req.operation = names::OPERATION_APPLY;
        let r = Runner::new(rendered(&Templates::embedded(), &req), shell);
        let (status, stderr) = r.run(r.command());
        let record = r.record();
        assert!(status.success(), "{stderr}\n{record}");
        let args: Vec<&str> = record.lines().filter(|l| l.starts_with("ARGS ")).collect();
        assert_eq!(args.len(), 3, "{record}");
        assert_eq!(
            args[0],
            "ARGS init -input=false -no-color -backend=false -from-module=git::https://example.com/infra.git//vm?ref=v1.4.0"
        );
        assert!(
            record.contains("FROM_MODULE git::https://example.com/infra.git//vm?ref=v1.4.0 []"),
            "{record}"
        );
        assert!(
            args[1].starts_with("ARGS init -input=false -no-color -backend-config="),
            "{record}"
        );
        assert!(
            args[2].starts_with("ARGS apply -auto-approve -input=false -no-color -var-file="),
            "{record}"
        );
    }
}

#[test]
fn a_failure_writes_the_stderr_tail_without_colours_to_the_termination_log() {
    for shell in shells() {
        eprintln!("shell: {shell:?}");
        let r = Runner::destroy(shell);
        let mut command = r.command();
        let filler: String = (0..200)
            .map(|i| format!("\x1b[33mWarning\x1b[0m: line {i} of noise\n"))
            .collect();
        command.env(
            "FAKE_TF_STDERR",
            format!("{filler}\x1b[31m\x1b[1mError:\x1b[0m deleting vm-1: boom\n"),
        );
        command.env("FAKE_TF_EXIT", "1");
        let (status, stderr) = r.run(command);
        assert_eq!(status.code(), Some(1), "{stderr}");
        let log = r.termination_log();
        assert!(log.len() <= 3000, "{}", log.len());
        assert!(
            log.starts_with("terraform destroy failed (exit 1)\n"),
            "{log}"
        );
        assert!(log.ends_with("Error: deleting vm-1: boom\n"), "{log}");
        assert!(!log.contains('\x1b'), "{log:?}");
        // The log (Pod logs) got Terraform's stderr too.
        assert!(stderr.contains("deleting vm-1: boom"), "{stderr}");
    }
}

#[test]
fn a_failed_init_stops_before_the_destroy() {
    for shell in shells() {
        eprintln!("shell: {shell:?}");
        let r = Runner::destroy(shell);
        let mut command = r.command();
        command.env(
            "FAKE_TF_FAIL_INIT",
            "Error: Failed to get existing workspaces: forbidden",
        );
        let (status, _) = r.run(command);
        assert_eq!(status.code(), Some(1));
        assert!(!r.record().contains("ARGS destroy"), "{}", r.record());
        let log = r.termination_log();
        assert!(
            log.starts_with("terraform init failed (exit 1)\n") && log.contains("forbidden"),
            "{log}"
        );
    }
}

#[test]
fn sigterm_to_the_shell_alone_reaches_terraform_and_the_runner_exits_143() {
    for shell in shells() {
        eprintln!("shell: {shell:?}");
        let r = Runner::destroy(shell);
        let mut command = r.command();
        command.env("FAKE_TF_SLEEP", "300").stderr(Stdio::null());
        let mut child = command.spawn().unwrap();
        r.wait_for_sleep();
        kill("TERM", &child.id().to_string());
        let status = wait_timeout(&mut child, Duration::from_secs(20));
        let record = r.record();
        assert_eq!(status.code(), Some(143), "{record}");
        assert_eq!(record.matches("SIGNAL TERM").count(), 1, "{record}");
        let log = r.termination_log();
        assert!(
            log.starts_with("terraform destroy interrupted by SIGTERM (terraform exited 1)"),
            "{log}"
        );
        assert!(log.contains("Error: interrupted"), "{log}");
    }
}

#[test]
fn sigterm_to_the_whole_process_group_reaches_terraform_once() {
    for shell in shells() {
        eprintln!("shell: {shell:?}");
        let r = Runner::destroy(shell);
        let mut command = r.command();
        command
            .env("FAKE_TF_SLEEP", "300")
            .stderr(Stdio::null())
            .process_group(0);
        let mut child = command.spawn().unwrap();
        r.wait_for_sleep();
        kill("TERM", &format!("-{}", child.id()));
        let status = wait_timeout(&mut child, Duration::from_secs(20));
        let record = r.record();
        assert_eq!(status.code(), Some(143), "{record}");
        // Twice would make real Terraform exit at once without saving its state. Two
        // TERMs close together may merge into one, so check the cause as well:
        // Terraform does not run in the runner's process group.
        assert_eq!(record.matches("SIGNAL TERM").count(), 1, "{record}");
        let pgrp = record
            .lines()
            .find_map(|l| l.strip_prefix("PGRP "))
            .unwrap();
        assert_ne!(pgrp, child.id().to_string(), "{record}");
        // tee survived: Terraform's last words reached the termination log.
        assert!(
            r.termination_log().contains("Error: interrupted"),
            "{}",
            r.termination_log()
        );
    }
}

const ERRORED: &str = "{\"version\":4,\"lineage\":\"l-1\",\"serial\":7}";

/// A destroy whose Terraform leaves an errored.tfstate, in a Pod named as attempt 2's.
fn errored_run(shell: Shell, fail_push: Option<&str>) -> (Runner, ExitStatus, String) {
    let r = Runner::destroy(shell);
    let mut command = r.command();
    command
        .env("HOSTNAME", "captf-web-1-tfm-destroy-2-ab1cd")
        .env("FAKE_TF_ERRORED", ERRORED)
        .env(
            "FAKE_TF_STDERR",
            "Error: Failed to persist state to backend\n",
        );
    if let Some(why) = fail_push {
        command.env("FAKE_TF_FAIL_PUSH", why);
    }
    let (status, stderr) = r.run(command);
    (r, status, stderr)
}

#[test]
fn an_errored_state_is_pushed_as_a_state_of_its_own_and_the_runner_fails_loudly() {
    for shell in shells() {
        let (r, status, stderr) = errored_run(shell, None);
        // Terraform exited 0 here, but an errored state is a failure.
        assert_eq!(status.code(), Some(1), "{shell:?}: {stderr}");
        let record = r.record();
        // Terraform's own backend, in a directory of its own, with the errored backend
        // settings (the state's namespace, suffix and labels, and the errored label), in
        // the workspace of this attempt and this Pod.
        let ws = r.path("workspace").display().to_string();
        let push = format!(
            "STATE state push -lock=false {ws}/work/errored.tfstate WORKSPACE= DATA={ws}/errored/.terraform CWD={ws}/errored\n"
        );
        assert!(record.contains(&push), "{shell:?}: {record}");
        assert!(
            record.contains(&format!("PUSHED {ERRORED}")),
            "{shell:?}: {record}"
        );
        // Its init: the errored backend settings (the state's namespace and labels, and
        // the errored label) and a suffix of its own, of this attempt and this Pod.
        let init = record
            .split("ARGS init")
            .last()
            .expect("the errored directory's init");
        assert!(
            init.contains(&format!("\"{}\" = \"true\"", names::LABEL_ERRORED_STATE))
                && init.contains("secret_suffix = \"errored-2-ab1cd.web-1.tfm\"")
                && init.contains("in_cluster_config = true")
                && init.contains(&format!("CWD {ws}/errored")),
            "{shell:?}: {init}"
        );
        let log = r.termination_log();
        assert!(
            log.starts_with(
                "terraform could not save its state: errored.tfstate saved in Secret team-a/tfstate-default-errored-2-ab1cd.web-1.tfm"
            ),
            "{shell:?}: {log}"
        );
        // The tail is the failed destroy's, not the push's.
        assert!(log.contains("Failed to persist state"), "{shell:?}: {log}");
    }
}

#[test]
fn an_errored_state_that_cannot_be_pushed_is_said_not_saved() {
    for shell in shells() {
        let (r, status, stderr) = errored_run(shell, Some("Error: secrets is forbidden"));
        assert_eq!(status.code(), Some(1), "{shell:?}: {stderr}");
        let log = r.termination_log();
        assert!(
            log.starts_with("terraform could not save its state: errored.tfstate NOT saved"),
            "{shell:?}: {log}"
        );
        assert!(
            stderr.contains("secrets is forbidden"),
            "{shell:?}: {stderr}"
        );
    }
}

#[test]
fn an_unknown_operation_is_refused() {
    for shell in shells() {
        eprintln!("shell: {shell:?}");
        let r = Runner::destroy(shell);
        let mut command = r.command();
        command.env("CAPTF_OPERATION", "plan");
        let (status, _) = r.run(command);
        assert_eq!(status.code(), Some(2));
        assert!(r.termination_log().contains("must be apply or destroy"));
        assert_eq!(r.record(), "");
    }
}

impl Runner {
    /// Puts the fake on PATH as `tofu` too; with `only`, as `tofu` alone.
    fn with_tofu(self, only: bool) -> Runner {
        let tofu = self.path("bin/tofu");
        std::fs::copy(self.path("bin/terraform"), &tofu).unwrap();
        if only {
            std::fs::remove_file(self.path("bin/terraform")).unwrap();
        }
        self
    }

    /// Which binaries ran, in order.
    fn bins(&self) -> Vec<String> {
        self.record()
            .lines()
            .filter_map(|l| l.strip_prefix("BIN "))
            .map(str::to_string)
            .collect()
    }
}

/// PATH without the machine's own `terraform` (in /usr/local/bin): an image with only
/// what the test puts in `bin`.
fn without_host_terraform(r: &Runner, command: &mut Command) {
    command.env("PATH", format!("{}:/usr/bin:/bin", r.path("bin").display()));
}

#[test]
fn inputs_that_name_tofu_run_tofu_for_every_step() {
    for shell in shells() {
        eprintln!("shell: {shell:?}");
        let mut inputs = inline_inputs();
        inputs.runner.runtime = Some(crate::api::types::Runtime::Tofu);
        let r = Runner::new(rendered(&Templates::embedded(), &request(&inputs)), shell)
            .with_tofu(false);
        let (status, stderr) = r.run(r.command());
        assert!(status.success(), "{status:?}\n{stderr}\n{}", r.record());
        assert_eq!(r.bins(), ["tofu", "tofu"], "init and destroy, both by tofu");
        assert!(stderr.contains("running: tofu destroy"), "{stderr}");
    }
}

#[test]
fn an_image_with_only_tofu_runs_tofu_and_one_with_neither_fails_naming_both() {
    for shell in shells() {
        eprintln!("shell: {shell:?}");
        let r = Runner::destroy(shell).with_tofu(true);
        let mut command = r.command();
        without_host_terraform(&r, &mut command);
        let (status, stderr) = r.run(command);
        assert!(status.success(), "{status:?}\n{stderr}\n{}", r.record());
        assert_eq!(r.bins(), ["tofu", "tofu"]);

        // Both: terraform, unless the inputs say otherwise.
        let r = Runner::destroy(shell).with_tofu(false);
        let (status, _) = r.run(r.command());
        assert!(status.success());
        assert_eq!(r.bins(), ["terraform", "terraform"]);

        // Neither.
        let r = Runner::destroy(shell);
        std::fs::remove_file(r.path("bin/terraform")).unwrap();
        let mut command = r.command();
        without_host_terraform(&r, &mut command);
        let (status, _) = r.run(command);
        assert_eq!(status.code(), Some(127));
        assert!(
            r.termination_log()
                .contains("neither terraform nor tofu is on PATH in the runner image"),
            "{}",
            r.termination_log()
        );
    }
}

#[test]
fn a_runtime_the_image_lacks_fails_naming_it() {
    for shell in shells() {
        eprintln!("shell: {shell:?}");
        let mut inputs = inline_inputs();
        inputs.runner.runtime = Some(crate::api::types::Runtime::Tofu);
        let r = Runner::new(rendered(&Templates::embedded(), &request(&inputs)), shell);
        let mut command = r.command();
        without_host_terraform(&r, &mut command);
        let (status, _) = r.run(command);
        r.assert_stopped_before_running(
            status,
            127,
            "tofu is not on PATH in the runner image (the inputs' runner.runtime names it)",
        );
    }
}

/// With `CAPTF_SAVE_RUNNER_LOGS=DIR`, a run's output is kept there: the reports the runner
/// writes are seeds of the report fuzz target (`fuzz/seed`, docs/fuzzing.md).
fn save_log(name: &str, shell: &Shell, stdout: &str) {
    if let Some(dir) = std::env::var_os("CAPTF_SAVE_RUNNER_LOGS") {
        let path = Path::new(&dir).join(format!("runner-{name}-{shell:?}").to_lowercase());
        std::fs::write(path, stdout).expect("the log is saved");
    }
}

#[test]
fn an_apply_reports_the_lock_file_init_wrote_and_the_files_it_fetched() {
    for shell in shells() {
        eprintln!("shell: {shell:?}");
        let mut inputs = inline_inputs();
        inputs.module = Module::Source("git::https://example.com/infra.git//vm?ref=v1.4.0".into());
        inputs.lock_file = None;
        let mut req = request(&inputs);
        req.operation = names::OPERATION_APPLY;
        let r = Runner::new(rendered(&Templates::embedded(), &req), shell);
        let mut command = r.command();
        command.env(
            "FAKE_TF_LOCK",
            "provider \"registry.terraform.io/hashicorp/null\" {}",
        );
        let out = command.output().unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        save_log("apply-source", &shell, &stdout);
        assert!(
            out.status.success(),
            "{}\n{}",
            String::from_utf8_lossy(&out.stderr),
            r.record()
        );
        let report = super::report::parse(&stdout).expect("a report");
        assert_eq!(
            report.lock_file.as_deref(),
            Some("provider \"registry.terraform.io/hashicorp/null\" {}\n")
        );
        let files = report.module_files.expect("the fetched files");
        assert_eq!(
            files.keys().collect::<Vec<_>>(),
            ["main.tf"],
            "the module's files, not CAPTF's own nor the lock file"
        );
        assert_eq!(files["main.tf"], "resource \"terraform_data\" \"x\" {}\n");

        // A destroy reports nothing; nor does an apply of inline files with a lock file.
        let r = Runner::destroy(shell);
        let out = r.command().output().unwrap();
        assert!(out.status.success());
        assert!(!String::from_utf8_lossy(&out.stdout).contains("captf-runner: ran"));
        let inputs = inline_inputs();
        let mut req = request(&inputs);
        req.operation = names::OPERATION_APPLY;
        let r = Runner::new(rendered(&Templates::embedded(), &req), shell);
        let out = r.command().output().unwrap();
        assert!(out.status.success());
        save_log(
            "apply-inline",
            &shell,
            &String::from_utf8_lossy(&out.stdout),
        );
        let report = super::report::parse(&String::from_utf8_lossy(&out.stdout)).unwrap();
        assert_eq!(
            report,
            super::report::Reported::default(),
            "an empty report"
        );
        assert!(String::from_utf8_lossy(&out.stdout).contains("captf-runner: ran end 0"));
    }
}

/// A module file that is a symbolic link (Terraform's `init -from-module` keeps them) is
/// reported with the content Terraform read through it: the destroy must run the same
/// files (redteam-3 L2). A link that leads out of the module is not reported (what it
/// names is the runner's, not the module's).
#[test]
fn a_symlinked_module_file_is_reported_with_what_it_points_to() {
    for shell in shells() {
        eprintln!("shell: {shell:?}");
        let mut inputs = inline_inputs();
        inputs.module = Module::Source("git::https://example.com/infra.git//vm?ref=v1.4.0".into());
        let mut req = request(&inputs);
        req.operation = names::OPERATION_APPLY;
        let r = Runner::new(rendered(&Templates::embedded(), &req), shell);
        let mut command = r.command();
        command.env("FAKE_TF_SYMLINK", "1");
        let out = command.output().unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{}\n{}",
            String::from_utf8_lossy(&out.stderr),
            r.record()
        );
        let report = super::report::parse(&stdout).expect("a report");
        let files = report.module_files.expect("the fetched files");
        assert_eq!(
            files.keys().collect::<Vec<_>>(),
            ["common.tf", "main.tf", "shared/common.tf"],
            "the link is reported as the file Terraform read"
        );
        assert_eq!(files["common.tf"], "variable \"region\" {}\n");
        assert!(
            String::from_utf8_lossy(&out.stderr)
                .contains("not reported: outside.txt links outside its module"),
            "a link out of the module is named, not reported"
        );
    }
}

#[test]
fn a_module_image_runs_from_its_directory_with_its_providers() {
    for shell in shells() {
        eprintln!("shell: {shell:?}");
        let mut inputs = inline_inputs();
        inputs.lock_file = None;
        let r0 = TempDir::new("module-image");
        let module_dir = r0.path().join("modules/vm");
        std::fs::create_dir_all(module_dir.join("sub")).unwrap();
        std::fs::write(module_dir.join("main.tf"), "# from the image\n").unwrap();
        std::fs::write(module_dir.join("sub/x.tf"), "# nested\n").unwrap();
        let plugins = r0.path().join("providers");
        std::fs::create_dir_all(&plugins).unwrap();
        inputs.module = Module::Path(module_dir.display().to_string());
        inputs.runner.plugin_dir = Some(plugins.display().to_string());
        let r = Runner::new(rendered(&Templates::embedded(), &request(&inputs)), shell);
        let (status, stderr) = r.run(r.command());
        let record = r.record();
        assert!(status.success(), "{status:?}\n{stderr}\n{record}");
        let ws = r.path("workspace").display().to_string();
        let args: Vec<&str> = record.lines().filter(|l| l.starts_with("ARGS ")).collect();
        assert_eq!(
            args[0],
            format!(
                "ARGS init -input=false -no-color -plugin-dir={} -backend-config={ws}/backend.hcl",
                plugins.display()
            )
        );
        assert!(
            record.contains("FILES ./captf_backend_override.tf ./main.tf ./sub/x.tf"),
            "{record}"
        );

        // A directory the image does not have: named, and nothing runs.
        let mut missing = inputs.clone();
        missing.module = Module::Path("/no/such/module".into());
        let r = Runner::new(rendered(&Templates::embedded(), &request(&missing)), shell);
        let (status, _) = r.run(r.command());
        r.assert_stopped_before_running(
            status,
            1,
            "the module's directory /no/such/module (module.path) is not in the runner image",
        );
    }
}

#[test]
fn the_script_is_valid_posix_sh() {
    // `sh -n` parses without running (dash here: stricter than busybox ash).
    let dir = TempDir::new("syntax");
    let path: &Path = &dir.path().join("runner.sh");
    std::fs::write(path, template::EMBEDDED_RUNNER).unwrap();
    let status = Command::new("sh").arg("-n").arg(path).status().unwrap();
    assert!(status.success());
}

#[test]
fn a_lock_left_by_an_earlier_pod_of_the_same_job_is_broken_and_any_other_is_not() {
    for shell in shells() {
        eprintln!("shell: {shell:?}");
        let r = Runner::destroy(shell);
        let job_name = r.job.metadata.name.clone().unwrap_or_default();
        // The Pod a disruption stopped: the Job's Pod prefix and five characters.
        let earlier = format!(
            "root@{}abcde",
            format!("{job_name}-").chars().take(58).collect::<String>()
        );
        let mut c = r.command();
        c.env("FAKE_TF_LOCKED_BY", &earlier);
        let (status, stderr) = r.run(c);
        let record = r.record();
        assert!(status.success(), "{status:?}\n{stderr}\n{record}");
        assert!(stderr.contains("breaking it"), "{stderr}");
        assert!(r.path("record.unlocked").exists());
        let ops = record
            .lines()
            .filter(|l| l.starts_with("ARGS destroy"))
            .count();
        assert_eq!(ops, 2, "{record}");

        // Anybody else's lock (a person, another Job) is never broken.
        for who in ["alice@laptop", "root@captf-web-1-tfm-destroy-7-abcde"] {
            let r = Runner::destroy(shell);
            let mut c = r.command();
            c.env("FAKE_TF_LOCKED_BY", who);
            let (status, stderr) = r.run(c);
            assert!(!status.success(), "{who}: {stderr}");
            assert!(!r.path("record.unlocked").exists(), "{who}");
            assert!(
                r.termination_log()
                    .contains("Error acquiring the state lock")
            );
        }
    }
}

/// `terraform show` of a plan that replaces two resources (one of them tainted), deletes
/// one and updates one in place, as Terraform renders it.
const DESTRUCTIVE_SHOW: &str = "Terraform will perform the following actions:\n\n  # terraform_data.disk must be replaced\n-/+ resource \"terraform_data\" \"disk\" {\n    }\n\n  # terraform_data.old[0] will be destroyed\n  # (because index [0] is out of range for count)\n  - resource \"terraform_data\" \"old\" {\n    }\n\n  # terraform_data.tag will be updated in-place\n  # aws_instance.x[\"a b\"] is tainted, so must be replaced\n\nPlan: 2 to add, 1 to change, 3 to destroy.\n";

const DESTRUCTIVE_LIST: &str =
    "delete terraform_data.old[0]\nreplace aws_instance.x[\"a b\"]\nreplace terraform_data.disk\n";

fn plan_hash(list: &str) -> String {
    use sha2::Digest;
    let digest = sha2::Sha256::digest(list.as_bytes());
    digest
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect::<String>()[..16]
        .to_string()
}

fn guarded(shell: Shell, approved: Option<&str>) -> Runner {
    let inputs = inline_inputs();
    let mut req = request(&inputs);
    req.operation = names::OPERATION_APPLY;
    req.plan_guard = PlanGuard { on: true, approved };
    Runner::new(rendered(&Templates::embedded(), &req), shell)
}

fn args(record: &str) -> Vec<String> {
    record
        .lines()
        .filter_map(|l| l.strip_prefix("ARGS "))
        .map(str::to_string)
        .collect()
}

#[test]
fn a_guarded_apply_whose_plan_destroys_stops_before_applying_and_names_what_it_would() {
    for shell in shells() {
        eprintln!("shell: {shell:?}");
        let r = guarded(shell, Some("0000000000000000"));
        let mut command = r.command();
        command.env("FAKE_TF_PLAN_SHOW", DESTRUCTIVE_SHOW);
        let (status, stderr) = r.run(command);
        let record = r.record();
        assert_eq!(status.code(), Some(3), "{stderr}\n{record}");
        let ws = r.path("workspace").display().to_string();
        assert_eq!(
            args(&record)[1..],
            [
                format!(
                    "plan -input=false -no-color -out={ws}/captf.tfplan -var-file={ws}/captf.tfvars.json"
                ),
                format!("show -no-color {ws}/captf.tfplan"),
            ],
            "planned and shown, never applied"
        );
        let hash = plan_hash(DESTRUCTIVE_LIST);
        assert_eq!(
            r.termination_log(),
            format!("captf-runner: destructive plan {hash}\n{DESTRUCTIVE_LIST}")
        );
        assert!(
            stderr.contains("captf-runner: would replace terraform_data.disk"),
            "{stderr}"
        );
        let plan = DestructivePlan::of(&r.termination_log()).expect("the guard's message");
        assert_eq!(plan.hash, hash);
        assert_eq!(plan.changes.len(), 3, "{plan:?}");
    }
}

#[test]
fn an_approved_plan_is_the_plan_applied_and_a_plan_that_destroys_nothing_needs_no_approval() {
    for shell in shells() {
        eprintln!("shell: {shell:?}");
        let hash = plan_hash(DESTRUCTIVE_LIST);
        for (approved, show) in [
            (Some(hash.as_str()), DESTRUCTIVE_SHOW),
            (
                None,
                "  # terraform_data.tag will be updated in-place\n  # terraform_data.new will be created\n",
            ),
        ] {
            let r = guarded(shell, approved);
            let mut command = r.command();
            command.env("FAKE_TF_PLAN_SHOW", show);
            let (status, stderr) = r.run(command);
            let record = r.record();
            assert!(status.success(), "{stderr}\n{record}");
            let ws = r.path("workspace").display().to_string();
            assert_eq!(
                args(&record).last().map(String::as_str),
                Some(
                    format!("apply -auto-approve -input=false -no-color {ws}/captf.tfplan")
                        .as_str()
                ),
                "{record}"
            );
            assert_eq!(r.termination_log(), "");
        }
    }
}

#[test]
fn the_guard_is_an_applys_only() {
    let inputs = inline_inputs();
    let mut req = request(&inputs);
    req.plan_guard = PlanGuard {
        on: true,
        approved: Some("abc"),
    };
    let env_of = |req: &JobRequest| -> Vec<String> {
        let (job, _) = rendered(&Templates::embedded(), req);
        job.spec.unwrap().template.spec.unwrap().containers[0]
            .env
            .clone()
            .unwrap_or_default()
            .into_iter()
            .map(|e| e.name)
            .collect()
    };
    assert!(
        !env_of(&req).iter().any(|n| n.starts_with("CAPTF_PLAN")),
        "a destroy is never guarded"
    );
    req.operation = names::OPERATION_APPLY;
    let names = env_of(&req);
    assert!(names.contains(&"CAPTF_PLAN_GUARD".to_string()), "{names:?}");
    assert!(
        names.contains(&"CAPTF_PLAN_APPROVED".to_string()),
        "{names:?}"
    );
}
