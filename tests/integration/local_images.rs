//! The local kubelet runs a container from a local OCI image (`--image-store`): an image
//! made here with umoci from this machine's `sh` and the libraries it links, as a
//! release's image is made (`release/build-image`). Its entrypoint and cmd run unless the
//! Pod says otherwise, as its user, with its environment under the Pod's, in its working
//! directory, in its root filesystem (the host's files are not there), read-only when the
//! Pod asks; the Pod reports the image's digest. An image not in the store still runs
//! the host's programs.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;
use std::time::SystemTime;

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, LogParams, PostParams};
use serde_json::json;

use crate::support::*;

const WAIT: Duration = Duration::from_secs(90);
pub(crate) const SHELL_IMAGE: &str = "registry.captf.test/shell:v1";

/// Runs `umoci` with `args`, failing with its output.
fn umoci(args: &[&str]) {
    require("umoci");
    let out = Command::new("umoci")
        .args(args)
        .output()
        .expect("run umoci");
    assert!(
        out.status.success(),
        "umoci {args:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Copies `from` (a host file) to `to` (beneath a root filesystem), with its mode.
fn copy_into(root: &Path, from: &Path, to: &str) {
    let target = root.join(to.trim_start_matches('/'));
    std::fs::create_dir_all(target.parent().expect("parent")).expect("mkdir");
    std::fs::copy(from, &target).unwrap_or_else(|e| panic!("copy {}: {e}", from.display()));
}

/// An OCI image layout in `store` named [`SHELL_IMAGE`]: this machine's `sh` and what it
/// links (from `ldd`), a user `app` (1001, group 1002, home /home/app), a marker file,
/// and a config: entrypoint `/bin/sh -c`, a cmd, an environment, user `app`, working
/// directory `/data` (writable by anyone). Returns the manifest's digest.
pub(crate) fn shell_image(store: &Path) -> String {
    let work = store.with_extension("work");
    let root = work.join("rootfs");
    let _ = std::fs::remove_dir_all(&work);
    std::fs::create_dir_all(root.join("etc")).expect("rootfs");
    let sh = std::fs::canonicalize("/bin/sh").expect("/bin/sh");
    copy_into(&root, &sh, "/bin/sh");
    let ldd = Command::new("ldd").arg(&sh).output().expect("ldd");
    for line in String::from_utf8_lossy(&ldd.stdout).lines() {
        // "libc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x…)" or "/lib64/ld-linux-x86-64.so.2 (0x…)"
        let path = match line.split_once("=>") {
            Some((_, rest)) => rest.split_whitespace().next(),
            None => line
                .split_whitespace()
                .next()
                .filter(|p| p.starts_with('/')),
        };
        if let Some(p) = path.filter(|p| p.starts_with('/')) {
            copy_into(&root, &std::fs::canonicalize(p).expect("library"), p);
        }
    }
    std::fs::write(
        root.join("etc/passwd"),
        "root:x:0:0:root:/root:/bin/sh\napp:x:1001:1002:app:/home/app:/bin/sh\n",
    )
    .expect("passwd");
    std::fs::write(root.join("etc/group"), "root:x:0:\napp:x:1002:\n").expect("group");
    std::fs::write(root.join("image-marker"), "from the image\n").expect("marker");
    for d in ["data", "home/app", "tmp"] {
        std::fs::create_dir_all(root.join(d)).expect("dir");
    }
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(root.join("data"), std::fs::Permissions::from_mode(0o777))
        .expect("chmod");
    let layout = store.join("shell");
    let _ = std::fs::remove_dir_all(&layout);
    let tagged = format!("{}:{SHELL_IMAGE}", layout.display());
    umoci(&["init", "--layout", &layout.to_string_lossy()]);
    umoci(&["new", "--image", &tagged]);
    umoci(&["insert", "--image", &tagged, &root.to_string_lossy(), "/"]);
    umoci(&[
        "config",
        "--image",
        &tagged,
        "--config.entrypoint",
        "/bin/sh",
        "--config.entrypoint",
        "-c",
        "--config.cmd",
        "echo from the cmd of the image",
        "--config.env",
        "FROM_IMAGE=yes",
        "--config.env",
        "OVERRIDDEN=by the image",
        "--config.user",
        "app",
        "--config.workingdir",
        "/data",
    ]);
    let _ = std::fs::remove_dir_all(&work);
    let index: serde_json::Value =
        serde_json::from_slice(&std::fs::read(layout.join("index.json")).expect("index.json"))
            .expect("index");
    index["manifests"][0]["digest"]
        .as_str()
        .expect("digest")
        .to_string()
}

/// A new directory of this test process under the temporary directory.
pub(crate) fn scratch_dir(tag: &str) -> PathBuf {
    let nanos = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    let dir = std::env::temp_dir().join(format!("captf-e2e-{tag}-{}-{nanos}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("scratch directory");
    dir
}

fn pod(name: &str, image: &str, container: serde_json::Value) -> Pod {
    let mut c = json!({"name": "c", "image": image});
    for (k, v) in container.as_object().expect("object") {
        c[k] = v.clone();
    }
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name},
        "spec": {"restartPolicy": "Never", "containers": [c],
            "volumes": [{"name": "scratch", "emptyDir": {}}]}
    }))
    .expect("pod")
}

/// What the Pod `name` printed once it finished, and its status.
async fn finished(pods: &Api<Pod>, name: &str) -> (String, serde_json::Value) {
    wait_for(&format!("Pod {name} to finish"), WAIT, || async {
        pods.get(name).await.is_ok_and(|p| {
            matches!(
                p.status.and_then(|s| s.phase).as_deref(),
                Some("Succeeded" | "Failed")
            )
        })
    })
    .await;
    let p = pods.get(name).await.expect("pod");
    let log = pods
        .logs(name, &LogParams::default())
        .await
        .unwrap_or_default();
    let status = serde_json::to_value(&p.status).expect("status");
    (log, status)
}

/// Reads what a shell can read without programs: the process's uid and gid.
const WHO: &str = "while read k a b rest; do case $k in Uid:|Gid:) echo \"$k $a $b\";; esac; done < /proc/self/status";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_local_kubelet_runs_a_container_from_a_local_oci_image() {
    if envtest_only("it runs the local kubelet with an image store") {
        return;
    }
    let store = scratch_dir("image-store");
    let digest = shell_image(&store);
    let env = Env::builder("kubelet-images")
        .kubelet_args(&[&format!("--image-store={}", store.display())])
        .start()
        .await;
    let pods: Api<Pod> = Api::namespaced(env.client.clone(), &env.ns);

    // The image's cmd, as its user, in its directory, with its environment under the Pod's.
    pods.create(
        &PostParams::default(),
        &pod(
            "defaults",
            SHELL_IMAGE,
            json!({"env": [{"name": "OVERRIDDEN", "value": "by the Pod"}]}),
        ),
    )
    .await
    .expect("create");
    let (log, status) = finished(&pods, "defaults").await;
    assert_eq!(log.trim(), "from the cmd of the image", "{status}");
    let c = &status["containerStatuses"][0];
    assert_eq!(
        c["imageID"].as_str(),
        Some(format!("registry.captf.test/shell@{digest}").as_str()),
        "{c}"
    );
    assert_eq!(c["state"]["terminated"]["exitCode"], 0, "{c}");

    // Args replace the cmd; the entrypoint stays.
    let script = format!(
        "{WHO}; echo pwd=$(pwd) home=$HOME image=$FROM_IMAGE overridden=$OVERRIDDEN; \
         read m < /image-marker; echo marker=$m; \
         if [ -e /usr/bin/kubectl ]; then echo host files; else echo no host files; fi; \
         if (echo x > /data/written) 2>/dev/null; then echo root writable; else echo root read-only; fi; \
         echo x > /scratch/ok && echo volume writable"
    );
    pods.create(
        &PostParams::default(),
        &pod(
            "args",
            SHELL_IMAGE,
            json!({"args": [script],
                "env": [{"name": "OVERRIDDEN", "value": "by the Pod"}],
                "volumeMounts": [{"name": "scratch", "mountPath": "/scratch"}]}),
        ),
    )
    .await
    .expect("create");
    let (log, status) = finished(&pods, "args").await;
    let lines: Vec<&str> = log.lines().collect();
    assert_eq!(
        lines,
        [
            "Uid: 1001 1001",
            "Gid: 1002 1002",
            "pwd=/data home=/home/app image=yes overridden=by the Pod",
            "marker=from the image",
            "no host files",
            "root writable",
            "volume writable",
        ],
        "{status}"
    );

    // The Pod's user and a read-only root filesystem.
    pods.create(
        &PostParams::default(),
        &pod(
            "read-only",
            SHELL_IMAGE,
            json!({"args": [script],
                "volumeMounts": [{"name": "scratch", "mountPath": "/scratch"}],
                "securityContext": {"runAsUser": 2000, "runAsGroup": 3000, "runAsNonRoot": true,
                    "readOnlyRootFilesystem": true, "allowPrivilegeEscalation": false}}),
        ),
    )
    .await
    .expect("create");
    let (log, status) = finished(&pods, "read-only").await;
    let lines: Vec<&str> = log.lines().collect();
    assert_eq!(lines[..2], ["Uid: 2000 2000", "Gid: 3000 3000"], "{status}");
    assert!(lines.contains(&"root read-only"), "{log}");
    assert!(lines.contains(&"volume writable"), "{log}");

    // A command replaces the entrypoint and the cmd.
    pods.create(
        &PostParams::default(),
        &pod(
            "command",
            SHELL_IMAGE,
            json!({"command": ["/bin/sh", "-c", "echo own command; exit 3"]}),
        ),
    )
    .await
    .expect("create");
    let (log, status) = finished(&pods, "command").await;
    assert_eq!(log.trim(), "own command");
    assert_eq!(
        status["containerStatuses"][0]["state"]["terminated"]["exitCode"],
        3
    );

    // runAsNonRoot with a user the image names only by name: the kubelet cannot check it.
    pods.create(
        &PostParams::default(),
        &pod(
            "by-name",
            SHELL_IMAGE,
            json!({"securityContext": {"runAsNonRoot": true}}),
        ),
    )
    .await
    .expect("create");
    wait_for("the container config error", WAIT, || async {
        pods.get("by-name").await.is_ok_and(|p| {
            let s = serde_json::to_value(&p.status).unwrap_or_default();
            let w = &s["containerStatuses"][0]["state"]["waiting"];
            w["reason"] == "CreateContainerConfigError"
                && w["message"].as_str().is_some_and(|m| {
                    m.contains("image has non-numeric user (app), cannot verify user is non-root")
                })
        })
    })
    .await;

    // An image the store does not have: the host's programs, as before.
    pods.create(
        &PostParams::default(),
        &pod(
            "host",
            "busybox",
            json!({"command": ["sh", "-c", "if [ -e /usr/bin/kubectl ]; then echo host files; fi"]}),
        ),
    )
    .await
    .expect("create");
    let (log, _) = finished(&pods, "host").await;
    assert_eq!(log.trim(), "host files");
    env.shutdown().await;
    let _ = std::fs::remove_dir_all(&store);
}
