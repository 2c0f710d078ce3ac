//! The state proxy in a runner Pod (manager flag `--state-proxy-image`): a native sidecar
//! (an init container with `restartPolicy: Always`, Kubernetes 1.29 and later) running
//! `captf state-proxy` for the attempt's object, which alone mounts the Pod's
//! ServiceAccount token. The Pod mounts no token anywhere else
//! (`automountServiceAccountToken: false`), so the runner container, where the module's
//! code runs, has no credentials for the API server; its backend reaches the state
//! through the proxy on the Pod's loopback (`src/proxy/`).

use k8s_openapi::api::core::v1::{
    ConfigMapProjection, Container, DownwardAPIProjection, DownwardAPIVolumeFile,
    EmptyDirVolumeSource, EnvVar, KeyToPath, ObjectFieldSelector, PodSpec, ProjectedVolumeSource,
    ResourceRequirements, SecurityContext, ServiceAccountTokenProjection, Volume, VolumeMount,
    VolumeProjection,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

use super::JobRequest;

/// The sidecar's container name.
pub const PROXY_CONTAINER: &str = "captf-state-proxy";
/// The volume of the port file, shared by the two containers, and where they mount it:
/// not under `/captf`, which is the binary itself in CAPTF's image.
pub const PROXY_VOLUME: &str = "captf-state-proxy";
pub const PROXY_DIR: &str = "/captf-state-proxy";
/// The projected token, CA and namespace, in the sidecar only.
pub const TOKEN_VOLUME: &str = "captf-state-proxy-token";
/// Where a Pod's container finds its ServiceAccount's credentials (and where kube's and
/// client-go's in-cluster configuration reads them).
pub const TOKEN_DIR: &str = "/var/run/secrets/kubernetes.io/serviceaccount";
/// The runner's variable naming the port file.
pub const PORT_FILE_ENV: &str = "CAPTF_STATE_PROXY_PORT_FILE";

fn port_file() -> String {
    format!("{PROXY_DIR}/port")
}

/// Adds the state proxy to `pod`, whose runner container is `runner`: the sidecar, its
/// token volume, the port file's volume in both, the runner's variable, no token mounted
/// by the API server, and the Pod's own network (a template's `hostNetwork` goes).
pub(super) fn add_state_proxy(pod: &mut PodSpec, runner: usize, req: &JobRequest, image: &str) {
    pod.automount_service_account_token = Some(false);
    // The proxy listens on the Pod's loopback, which is the node's with the host's network.
    pod.host_network = None;
    let volumes = pod.volumes.get_or_insert_with(Vec::new);
    volumes.retain(|v| v.name != PROXY_VOLUME && v.name != TOKEN_VOLUME);
    volumes.push(Volume {
        name: PROXY_VOLUME.to_string(),
        empty_dir: Some(EmptyDirVolumeSource {
            size_limit: Some(Quantity("1Mi".to_string())),
            ..Default::default()
        }),
        ..Default::default()
    });
    volumes.push(token_volume());

    let c = &mut pod.containers[runner];
    let mounts = c.volume_mounts.get_or_insert_with(Vec::new);
    mounts.retain(|m| m.name != PROXY_VOLUME && m.mount_path != PROXY_DIR);
    mounts.push(VolumeMount {
        name: PROXY_VOLUME.to_string(),
        mount_path: PROXY_DIR.to_string(),
        read_only: Some(true),
        ..Default::default()
    });
    let env = c.env.get_or_insert_with(Vec::new);
    env.retain(|e| e.name != PORT_FILE_ENV);
    env.push(EnvVar {
        name: PORT_FILE_ENV.to_string(),
        value: Some(port_file()),
        value_from: None,
    });

    let inits = pod.init_containers.get_or_insert_with(Vec::new);
    inits.retain(|c| c.name != PROXY_CONTAINER);
    inits.insert(0, sidecar(req, image));
}

fn sidecar(req: &JobRequest, image: &str) -> Container {
    let quantity = |q: &str| Quantity(q.to_string());
    Container {
        name: PROXY_CONTAINER.to_string(),
        image: Some(image.to_string()),
        image_pull_policy: Some("IfNotPresent".to_string()),
        // A native sidecar: it starts before the runner and runs until the runner ends.
        restart_policy: Some("Always".to_string()),
        args: Some(vec![
            "state-proxy".to_string(),
            "--namespace".to_string(),
            req.namespace.to_string(),
            "--suffix".to_string(),
            req.suffix.to_string(),
            "--port-file".to_string(),
            port_file(),
        ]),
        resources: Some(ResourceRequirements {
            requests: Some(
                [("cpu", "10m"), ("memory", "32Mi")]
                    .into_iter()
                    .map(|(k, v)| (k.to_string(), quantity(v)))
                    .collect(),
            ),
            limits: Some([("memory".to_string(), quantity("128Mi"))].into()),
            ..Default::default()
        }),
        security_context: Some({
            let mut sc = SecurityContext::default();
            super::render::harden(&mut sc);
            sc
        }),
        volume_mounts: Some(vec![
            VolumeMount {
                name: PROXY_VOLUME.to_string(),
                mount_path: PROXY_DIR.to_string(),
                ..Default::default()
            },
            VolumeMount {
                name: TOKEN_VOLUME.to_string(),
                mount_path: TOKEN_DIR.to_string(),
                read_only: Some(true),
                ..Default::default()
            },
        ]),
        termination_message_policy: Some("FallbackToLogsOnError".to_string()),
        ..Default::default()
    }
}

/// What the API server's ServiceAccount admission would mount: a bound token (refreshed
/// by the kubelet), the cluster's CA and the namespace.
fn token_volume() -> Volume {
    Volume {
        name: TOKEN_VOLUME.to_string(),
        projected: Some(ProjectedVolumeSource {
            default_mode: Some(0o444),
            sources: Some(vec![
                VolumeProjection {
                    service_account_token: Some(ServiceAccountTokenProjection {
                        path: "token".to_string(),
                        expiration_seconds: Some(3607),
                        audience: None,
                    }),
                    ..Default::default()
                },
                VolumeProjection {
                    config_map: Some(ConfigMapProjection {
                        name: "kube-root-ca.crt".to_string(),
                        items: Some(vec![KeyToPath {
                            key: "ca.crt".to_string(),
                            path: "ca.crt".to_string(),
                            mode: None,
                        }]),
                        optional: None,
                    }),
                    ..Default::default()
                },
                VolumeProjection {
                    downward_api: Some(DownwardAPIProjection {
                        items: Some(vec![DownwardAPIVolumeFile {
                            path: "namespace".to_string(),
                            field_ref: Some(ObjectFieldSelector {
                                api_version: Some("v1".to_string()),
                                field_path: "metadata.namespace".to_string(),
                            }),
                            ..Default::default()
                        }]),
                    }),
                    ..Default::default()
                },
            ]),
        }),
        ..Default::default()
    }
}
