//! Running one container: `captf-kubelet container CONFIG` is the shim the kubelet starts
//! per container. It enters new mount, UTS, IPC and PID namespaces, and starts the
//! container's entrypoint as PID 1 of the new PID namespace in a root filesystem of its
//! own: an overlay over the unpacked image ([`crate::images`]) or, for an image the
//! kubelet does not have, over the host's `/`, with the Pod's volumes mounted at their
//! `mountPath`, a fresh `/proc`, `/run` and `/etc/hosts`, the host's `/dev` nodes and
//! `/sys` (and, over the host's `/`, its `/tmp`), the hostname set to the Pod's name,
//! read-only when the container asks, as the user and groups of its security context.
//!
//! What that gives, as a container runtime does: a signal the kubelet sends reaches only
//! PID 1 (which ignores SIGTERM unless it handles it, like a shell), and when PID 1 ends
//! or gets SIGKILL the kernel kills every other process of the container, whatever
//! session or process group it made for itself.
//!
//! The shim writes PID 1's host PID to `pid_file`, waits for it, and exits with its
//! status (128 + the signal when a signal ended it). When it cannot start the entrypoint
//! it writes why to `start_error_file` and exits with [`START_ERROR_EXIT`].

use std::ffi::CString;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use serde::{Deserialize, Serialize};

/// The shim's exit status when the entrypoint could not be started.
pub const START_ERROR_EXIT: i32 = 128;

/// What the shim needs to start one container, written by the kubelet as JSON.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct ContainerConfig {
    /// The hostname (the Pod's name).
    pub hostname: String,
    /// The overlay's lower layer: an unpacked image, or the host's `/` when `None`.
    pub image_root: Option<PathBuf>,
    /// Per-container directories for the overlay: `upper`, `work` and the mount point
    /// `rootfs` (created by the kubelet).
    pub upper: PathBuf,
    pub work: PathBuf,
    pub rootfs: PathBuf,
    /// Host paths bound into the container (source on the host, target inside).
    pub mounts: Vec<Mount>,
    pub read_only_root: bool,
    pub uid: u32,
    pub gid: u32,
    pub groups: Vec<u32>,
    pub no_new_privs: bool,
    /// Inside the container; created when missing, as runtimes do.
    pub working_dir: String,
    pub argv: Vec<String>,
    pub env: Vec<(String, String)>,
    pub pid_file: PathBuf,
    pub start_error_file: PathBuf,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct Mount {
    pub source: PathBuf,
    pub target: String,
    pub read_only: bool,
    /// A single file (the termination log, /etc/hosts) rather than a directory.
    pub file: bool,
}

/// The shim's main: returns the exit status for the process.
pub fn shim_main(config_path: &Path) -> i32 {
    let config: ContainerConfig = match std::fs::read(config_path)
        .map_err(|e| e.to_string())
        .and_then(|b| serde_json::from_slice(&b).map_err(|e| e.to_string()))
    {
        Ok(c) => c,
        Err(e) => {
            eprintln!(
                "captf-kubelet container: cannot read {}: {e}",
                config_path.display()
            );
            return START_ERROR_EXIT;
        }
    };
    let fail = |what: String| {
        let _ = std::fs::write(&config.start_error_file, &what);
        eprintln!("captf-kubelet: {what}");
        START_ERROR_EXIT
    };
    // The shim must not die of the signals meant for the container.
    unsafe {
        libc::signal(libc::SIGTERM, libc::SIG_IGN);
        libc::signal(libc::SIGINT, libc::SIG_IGN);
        libc::signal(libc::SIGHUP, libc::SIG_IGN);
    }
    let flags = libc::CLONE_NEWNS | libc::CLONE_NEWUTS | libc::CLONE_NEWIPC | libc::CLONE_NEWPID;
    if unsafe { libc::unshare(flags) } != 0 {
        return fail(format!(
            "unshare(mount, uts, ipc, pid namespaces): {} (the local kubelet needs root)",
            std::io::Error::last_os_error()
        ));
    }
    let Some((program, args)) = config.argv.split_first() else {
        return fail(
            "the container has no command, and its image none (no entrypoint, no cmd)".into(),
        );
    };
    let mut cmd = Command::new(program);
    cmd.args(args)
        .env_clear()
        .envs(config.env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::null());
    let setup = config.clone();
    unsafe {
        cmd.pre_exec(move || enter(&setup));
    }
    let mut child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => {
            // `enter` wrote the detail to the start-error file; keep it.
            let detail = std::fs::read_to_string(&config.start_error_file).unwrap_or_default();
            let detail = if detail.is_empty() {
                format!("starting {program}: {e}")
            } else {
                detail
            };
            return fail(detail);
        }
    };
    let _ = std::fs::write(&config.pid_file, child.id().to_string());
    match child.wait() {
        Ok(st) => st
            .code()
            .unwrap_or_else(|| 128 + st.signal().unwrap_or(libc::SIGKILL)),
        Err(_) => START_ERROR_EXIT,
    }
}

/// In the child, PID 1 of the new PID namespace, before `exec`: the root filesystem,
/// the mounts, the hostname, the user. Any error is written to the start-error file.
fn enter(c: &ContainerConfig) -> std::io::Result<()> {
    let step = |what: &str, r: std::io::Result<()>| recorded(&c.start_error_file, what, r);
    // The shim ignores the signals meant for the container; ignored signals are inherited
    // across exec, and a shell cannot trap a signal ignored when it started: give the
    // entrypoint the default dispositions, and an empty signal mask, as a runtime does.
    step("reset the signal dispositions", reset_signals())?;
    // Die with the shim.
    step("prctl(PR_SET_PDEATHSIG)", prctl_pdeathsig())?;
    step(
        "make the mounts private",
        mount(
            None,
            Path::new("/"),
            None,
            libc::MS_REC | libc::MS_PRIVATE,
            None,
        ),
    )?;
    let lower = c.image_root.as_deref().unwrap_or(Path::new("/"));
    let opts = format!(
        "lowerdir={},upperdir={},workdir={}",
        lower.display(),
        c.upper.display(),
        c.work.display()
    );
    step(
        "mount the overlay root",
        mount(Some("overlay"), &c.rootfs, Some("overlay"), 0, Some(&opts)),
    )?;
    // The sources, opened before the root changes, mounted through /proc/self/fd after:
    // a target is then resolved inside the new root (its symlinks, such as /var/run ->
    // /run, point into the container, not into the host).
    let mut sources: Vec<(OwnedFd, &Mount)> = Vec::new();
    for m in &c.mounts {
        let fd = recorded(
            &c.start_error_file,
            &format!("open {}", m.source.display()),
            open_path(&m.source),
        )?;
        sources.push((fd, m));
    }
    let root = &c.rootfs;
    // The host's /tmp is shared with a container of the host's `/` (the tests' marker
    // files); an image's container has the image's /tmp, as under a container runtime.
    let shared: &[&str] = if c.image_root.is_some() {
        &["sys"]
    } else {
        &["sys", "tmp"]
    };
    // An image need not have the mount points: they are made in the overlay's upper layer.
    for dir in ["sys", "dev", "proc", "run"] {
        step(
            &format!("create the mount point /{dir}"),
            std::fs::create_dir_all(root.join(dir)),
        )?;
    }
    for dir in shared {
        step(
            &format!("bind /{dir}"),
            mount(
                Some(&format!("/{dir}")),
                &root.join(dir),
                None,
                libc::MS_BIND | libc::MS_REC,
                None,
            ),
        )?;
    }
    step("make /dev", make_dev(&root.join("dev")))?;
    step("chroot into the container root", chroot(root))?;
    step(
        "mount /proc",
        mount(Some("proc"), Path::new("/proc"), Some("proc"), 0, None),
    )?;
    step(
        "mount /run",
        mount(
            Some("tmpfs"),
            Path::new("/run"),
            Some("tmpfs"),
            0,
            Some("mode=755"),
        ),
    )?;
    for (fd, m) in &sources {
        let target = Path::new(&m.target);
        let made = if m.file {
            target
                .parent()
                .map(std::fs::create_dir_all)
                .unwrap_or(Ok(()))
                .and_then(|_| {
                    std::fs::OpenOptions::new()
                        .create(true)
                        .append(true)
                        .open(target)
                        .map(|_| ())
                })
        } else {
            std::fs::create_dir_all(target)
        };
        step(&format!("create the mount point {}", m.target), made)?;
        let src = format!("/proc/self/fd/{}", fd.as_raw_fd());
        step(
            &format!("mount {} at {}", m.source.display(), m.target),
            mount(Some(&src), target, None, libc::MS_BIND, None),
        )?;
        if m.read_only {
            step(
                &format!("make {} read-only", m.target),
                mount(
                    None,
                    target,
                    None,
                    libc::MS_BIND | libc::MS_REMOUNT | libc::MS_RDONLY,
                    None,
                ),
            )?;
        }
    }
    drop(sources);
    let wd = if c.working_dir.is_empty() {
        "/"
    } else {
        &c.working_dir
    };
    step(
        &format!("create the working directory {wd}"),
        std::fs::create_dir_all(wd),
    )?;
    if c.read_only_root {
        step(
            "make the root filesystem read-only",
            mount(
                None,
                Path::new("/"),
                None,
                libc::MS_BIND | libc::MS_REMOUNT | libc::MS_RDONLY,
                None,
            ),
        )?;
    }
    step("sethostname", sethostname(&c.hostname))?;
    step(&format!("chdir {wd}"), std::env::set_current_dir(wd))?;
    step("set the user", set_user(c.uid, c.gid, &c.groups))?;
    if c.no_new_privs {
        step("prctl(PR_SET_NO_NEW_PRIVS)", no_new_privs())?;
    }
    // A change of user clears the parent-death signal: set it again.
    step("prctl(PR_SET_PDEATHSIG)", prctl_pdeathsig())?;
    Ok(())
}

/// `r`, with a failure written to the start-error file as "what: error".
fn recorded<T>(file: &Path, what: &str, r: std::io::Result<T>) -> std::io::Result<T> {
    r.map_err(|e| {
        let msg = format!("{what}: {e}");
        let _ = std::fs::write(file, &msg);
        std::io::Error::new(e.kind(), msg)
    })
}

fn cstr(s: &str) -> std::io::Result<CString> {
    CString::new(s).map_err(|_| std::io::Error::other(format!("{s:?} contains a NUL byte")))
}

fn check(r: libc::c_int) -> std::io::Result<()> {
    if r == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

fn mount(
    source: Option<&str>,
    target: &Path,
    fstype: Option<&str>,
    flags: libc::c_ulong,
    data: Option<&str>,
) -> std::io::Result<()> {
    let source = source.map(cstr).transpose()?;
    let target = cstr(&target.to_string_lossy())?;
    let fstype = fstype.map(cstr).transpose()?;
    let data = data.map(cstr).transpose()?;
    let ptr = |c: &Option<CString>| c.as_ref().map_or(std::ptr::null(), |c| c.as_ptr());
    check(unsafe {
        libc::mount(
            ptr(&source),
            target.as_ptr(),
            ptr(&fstype),
            flags,
            ptr(&data).cast(),
        )
    })
}

/// A /dev of the container's own (a tmpfs, so that files made there, such as the
/// termination log, stay in the container) with the host's basic device nodes.
fn make_dev(dev: &Path) -> std::io::Result<()> {
    mount(
        Some("tmpfs"),
        dev,
        Some("tmpfs"),
        libc::MS_NOSUID,
        Some("mode=755"),
    )?;
    for node in ["null", "zero", "full", "random", "urandom", "tty"] {
        let target = dev.join(node);
        std::fs::File::create(&target)?;
        mount(
            Some(&format!("/dev/{node}")),
            &target,
            None,
            libc::MS_BIND,
            None,
        )?;
    }
    std::fs::create_dir(dev.join("shm"))?;
    mount(
        Some("tmpfs"),
        &dev.join("shm"),
        Some("tmpfs"),
        libc::MS_NOSUID | libc::MS_NODEV,
        Some("mode=1777"),
    )?;
    for (link, to) in [
        ("fd", "/proc/self/fd"),
        ("stdin", "/proc/self/fd/0"),
        ("stdout", "/proc/self/fd/1"),
        ("stderr", "/proc/self/fd/2"),
    ] {
        std::os::unix::fs::symlink(to, dev.join(link))?;
    }
    Ok(())
}

fn open_path(p: &Path) -> std::io::Result<OwnedFd> {
    use std::os::fd::FromRawFd;
    let c = cstr(&p.to_string_lossy())?;
    let fd = unsafe { libc::open(c.as_ptr(), libc::O_PATH | libc::O_CLOEXEC) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn chroot(root: &Path) -> std::io::Result<()> {
    std::env::set_current_dir(root)?;
    let dot = cstr(".")?;
    check(unsafe { libc::chroot(dot.as_ptr()) })?;
    std::env::set_current_dir("/")
}

fn sethostname(name: &str) -> std::io::Result<()> {
    check(unsafe { libc::sethostname(name.as_ptr().cast(), name.len()) })
}

fn set_user(uid: u32, gid: u32, groups: &[u32]) -> std::io::Result<()> {
    check(unsafe { libc::setgroups(groups.len(), groups.as_ptr()) })?;
    check(unsafe { libc::setgid(gid) })?;
    check(unsafe { libc::setuid(uid) })
}

fn no_new_privs() -> std::io::Result<()> {
    check(unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) })
}

fn reset_signals() -> std::io::Result<()> {
    for sig in [libc::SIGTERM, libc::SIGINT, libc::SIGHUP] {
        if unsafe { libc::signal(sig, libc::SIG_DFL) } == libc::SIG_ERR {
            return Err(std::io::Error::last_os_error());
        }
    }
    let mut set: libc::sigset_t = unsafe { std::mem::zeroed() };
    check(unsafe { libc::sigemptyset(&mut set) })?;
    check(unsafe { libc::sigprocmask(libc::SIG_SETMASK, &set, std::ptr::null_mut()) })
}

fn prctl_pdeathsig() -> std::io::Result<()> {
    check(unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0) })
}
