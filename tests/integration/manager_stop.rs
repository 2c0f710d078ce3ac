//! `captf manager` stopped as a kubelet or an operator stops it: SIGTERM or SIGINT, and
//! it stops starting passes, gives its leader Lease up and exits 0, so that a standby
//! replica takes over at its next try instead of a lease duration later. Run as the
//! binary, with leader election on, against the test control plane.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::Lease;
use kube::api::Api;

use crate::manager::{free_port, http_get};
use crate::support::*;

const LEASE: &str = "captf-manager-leader";
const WAIT: Duration = Duration::from_secs(90);

/// A `captf manager` process with leader election, killed however the test ends.
pub(crate) struct Replica {
    pub name: String,
    child: Child,
    pub health_port: u16,
    log: PathBuf,
}

impl Replica {
    fn start(env: &Env, name: &str) -> Replica {
        let health_port = free_port();
        let log = env.dir.join(format!("{name}.log"));
        std::fs::create_dir_all(&env.dir).expect("test dir");
        let out = std::fs::File::create(&log).expect("log file");
        let child = Command::new(env!("CARGO_BIN_EXE_captf"))
            .args([
                "manager",
                "--leader-elect",
                "--provision=false",
                "--metrics-bind-address=",
                &format!("--health-probe-bind-address=127.0.0.1:{health_port}"),
                "--namespace",
                &env.ns,
                "--manager-namespace",
                &env.manager_ns,
            ])
            .env("KUBECONFIG", env.kubeconfig_path())
            .env("POD_NAME", name)
            .stdin(Stdio::null())
            .stdout(out.try_clone().expect("log"))
            .stderr(out)
            .spawn()
            .expect("start captf manager");
        Replica {
            name: name.into(),
            child,
            health_port,
            log,
        }
    }

    fn signal(&self, signal: i32) {
        let pid = libc::pid_t::try_from(self.child.id()).expect("pid");
        assert_eq!(unsafe { libc::kill(pid, signal) }, 0, "kill {pid}");
    }

    /// Waits for the process to exit; its exit code and how long that took.
    async fn exited(&mut self, within: Duration) -> (Option<i32>, Duration) {
        let t = Instant::now();
        loop {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                return (status.code(), t.elapsed());
            }
            assert!(
                t.elapsed() < within,
                "{} did not exit within {within:?}:\n{}",
                self.name,
                tail(&self.log)
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    async fn ready(&self) -> bool {
        tokio::net::TcpStream::connect(("127.0.0.1", self.health_port))
            .await
            .is_ok()
            && http_get(self.health_port, "/readyz").await.0 == 200
    }
}

impl Drop for Replica {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn tail(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(30)..].join("\n")
}

async fn holder(leases: &Api<Lease>) -> Option<String> {
    leases
        .get_opt(LEASE)
        .await
        .expect("get the Lease")
        .and_then(|l| l.spec)
        .and_then(|s| s.holder_identity)
        .filter(|h| !h.is_empty())
}

/// The leader gets SIGTERM: it exits 0 having given the Lease up (no holder), and the
/// standby takes it at its next try, well within the lease duration; a standby told to
/// stop before it leads exits 0 and leaves the Lease alone; the new leader, given SIGINT,
/// stops the same way.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_and_sigint_stop_the_manager_and_release_its_lease() {
    let env = Env::builder("stop").start().await;
    let leases: Api<Lease> = Api::namespaced(env.client.clone(), &env.manager_ns);
    let markers = env.markers();
    let uid = env.create_cluster("prod").await;
    env.create_object::<Tfm>("web-1", "prod", &uid, &markers)
        .await;

    let mut a = Replica::start(&env, "replica-a");
    wait_for("replica-a to lead and be ready", WAIT, || async {
        holder(&leases).await.as_deref() == Some("replica-a") && a.ready().await
    })
    .await;
    // It works: its passes put the finalizer on.
    env.wait_finalizer::<Tfm>("web-1").await;
    let mut b = Replica::start(&env, "replica-b");
    wait_for("replica-b's probes", WAIT, || async {
        tokio::net::TcpStream::connect(("127.0.0.1", b.health_port))
            .await
            .is_ok()
    })
    .await;
    assert!(!b.ready().await, "a standby is not ready");
    let transitions = leases
        .get(LEASE)
        .await
        .expect("Lease")
        .spec
        .and_then(|s| s.lease_transitions)
        .unwrap_or(0);

    // SIGTERM to the leader.
    a.signal(libc::SIGTERM);
    let (code, took) = a.exited(WAIT).await;
    eprintln!("replica-a exited {code:?} {took:?} after SIGTERM");
    // Exit 0: it stopped by itself (no bound on the time: a loaded machine is slow; the
    // time is printed above).
    assert_eq!(code, Some(0), "exit status:\n{}", tail(&a.log));
    let exited_at = Instant::now();
    let released = leases.get(LEASE).await.expect("Lease").spec.expect("spec");
    assert!(
        released.holder_identity.is_none()
            || released.holder_identity.as_deref() == Some("replica-b"),
        "the Lease is given up, not held by replica-a: {released:?}"
    );
    if released.holder_identity.is_none() {
        // Released as client-go releases it, so that the standby need not wait for it
        // to expire: a duration of one second.
        assert_eq!(released.lease_duration_seconds, Some(1), "{released:?}");
    }
    wait_for("replica-b to take the Lease", WAIT, || async {
        holder(&leases).await.as_deref() == Some("replica-b")
    })
    .await;
    let takeover = exited_at.elapsed();
    eprintln!("replica-b took the Lease {takeover:?} after replica-a exited");
    let lease = leases.get(LEASE).await.expect("Lease").spec.expect("spec");
    assert_eq!(lease.lease_transitions, Some(transitions + 1));
    wait_for("replica-b to be ready", WAIT, || b.ready()).await;

    // A standby stopped before it leads exits 0 and leaves the Lease to the leader.
    let mut c = Replica::start(&env, "replica-c");
    wait_for("replica-c's probes", WAIT, || async {
        tokio::net::TcpStream::connect(("127.0.0.1", c.health_port))
            .await
            .is_ok()
    })
    .await;
    c.signal(libc::SIGTERM);
    let (code, _) = c.exited(WAIT).await;
    assert_eq!(code, Some(0), "exit status:\n{}", tail(&c.log));
    assert_eq!(holder(&leases).await.as_deref(), Some("replica-b"));

    // SIGINT (Ctrl-C) to the new leader.
    b.signal(libc::SIGINT);
    let (code, took) = b.exited(WAIT).await;
    eprintln!("replica-b exited {code:?} {took:?} after SIGINT");
    assert_eq!(code, Some(0), "exit status:\n{}", tail(&b.log));
    assert_eq!(holder(&leases).await, None, "the Lease is given up");
    let log = std::fs::read_to_string(&b.log).unwrap_or_default();
    assert!(log.contains("released the Lease"), "{log}");
    env.shutdown().await;
}
