//! How a scenario's environment is made: [`Env::builder`] and what differs from the usual one.

use super::*;

/// How a scenario's environment is made: [`Env::builder`], what differs from the usual
/// one, then [`EnvBuilder::start`]. The usual one: the control plane this test process
/// shares (or the cluster of `CAPTF_E2E_KUBECONFIG`), two fresh namespaces, the manager
/// configured but not started.
#[must_use = "an EnvBuilder does nothing until it is started"]
pub struct EnvBuilder {
    tag: String,
    plane: Plane,
    names: Option<(String, String)>,
    provision: bool,
    backoff: Option<(Duration, Duration)>,
    sweep_every: Option<Duration>,
    state_proxy: Option<bool>,
    machine: Option<Machine>,
}

/// The control plane of an [`EnvBuilder`].
enum Plane {
    Shared,
    Dedicated {
        kubelet: Vec<String>,
        kcm: Vec<String>,
        cluster_api: bool,
    },
    WithoutClusterApi,
}

/// The machine an [`EnvBuilder`] starts with.
enum Machine {
    Applied { name: String, module_body: String },
    ByHand { module_body: String },
}

impl EnvBuilder {
    /// On a control plane of its own (with the real Cluster API), for a test that changes
    /// what every test shares. Gate it with [`envtest_only`].
    pub fn dedicated(self) -> EnvBuilder {
        self.tuned(&[], &[], true)
    }

    /// On a control plane of its own whose local kubelet gets `kubelet_args`.
    pub fn kubelet_args(self, kubelet_args: &[&str]) -> EnvBuilder {
        self.tuned(kubelet_args, &[], true)
    }

    /// On a control plane of its own, with `kubelet_args` for the local kubelet,
    /// `kcm_args` for kube-controller-manager, and the real Cluster API only when
    /// `cluster_api` (else its Cluster CRD only).
    pub fn tuned(
        mut self,
        kubelet_args: &[&str],
        kcm_args: &[&str],
        cluster_api: bool,
    ) -> EnvBuilder {
        let own = |args: &[&str]| args.iter().map(|a| a.to_string()).collect();
        self.plane = Plane::Dedicated {
            kubelet: own(kubelet_args),
            kcm: own(kcm_args),
            cluster_api,
        };
        self
    }

    /// On a control plane of its own without Cluster API's Cluster CRD.
    pub fn without_cluster_api(mut self) -> EnvBuilder {
        self.plane = Plane::WithoutClusterApi;
        self
    }

    /// With the objects' namespace `ns` and the manager's `manager_ns` (the sandbox's
    /// `team-a` and `captf-system`) instead of two fresh names.
    pub fn in_namespaces(mut self, ns: &str, manager_ns: &str) -> EnvBuilder {
        self.names = Some((ns.to_string(), manager_ns.to_string()));
        self
    }

    /// With the manager started and applying live objects (`provision` on).
    pub fn provisioning(mut self) -> EnvBuilder {
        self.provision = true;
        self
    }

    /// With the manager's RBAC sweep every `every` (500 ms by default): what only a
    /// release removes is seen apart from what the sweep does.
    pub fn sweep_every(mut self, every: Duration) -> EnvBuilder {
        self.sweep_every = Some(every);
        self
    }

    /// With the state proxy in every runner Pod (`--state-proxy-image`
    /// [`STATE_PROXY_IMAGE`], which the local kubelet runs as this build's `captf`).
    pub fn state_proxy(mut self) -> EnvBuilder {
        self.state_proxy = Some(true);
        self
    }

    /// With runners that hold their Pod's token, whatever `CAPTF_TEST_STATE_PROXY` says: for
    /// a scenario about what that token reaches.
    pub fn runner_token(mut self) -> EnvBuilder {
        self.state_proxy = Some(false);
        self
    }

    /// With the manager's retries `base` apart, up to `max`.
    pub fn backoff(mut self, base: Duration, max: Duration) -> EnvBuilder {
        self.backoff = Some((base, max));
        self
    }

    /// Provisioning, with a Cluster `prod` and a TerraformMachine `name` of `module_body`
    /// the manager applied ([`Env::add_machine`]).
    pub fn with_machine(mut self, name: &str, module_body: &str) -> EnvBuilder {
        self.machine = Some(Machine::Applied {
            name: name.to_string(),
            module_body: module_body.to_string(),
        });
        self.provisioning()
    }

    /// With the manager started (deleting only) and a TerraformMachine `web-1` of a Cluster
    /// `prod` applied by hand ([`Env::apply`]): for a scenario whose inputs the product
    /// itself would refuse to apply (an inline module too large to render), as an older
    /// CAPTF may have written them.
    pub fn with_machine_applied_by_hand(mut self, module_body: &str) -> EnvBuilder {
        self.machine = Some(Machine::ByHand {
            module_body: module_body.to_string(),
        });
        self
    }

    /// Makes the environment.
    pub async fn start(self) -> Env {
        let began = std::time::Instant::now();
        let tag = self.tag.as_str();
        let cluster = match (&self.plane, external_cluster()) {
            (Plane::Shared, Some(kubeconfig)) => Cluster::External(kubeconfig),
            (Plane::Shared, None) => Cluster::Envtest(ControlPlane::shared()),
            (
                Plane::Dedicated {
                    kubelet,
                    kcm,
                    cluster_api,
                },
                _,
            ) => {
                let kubelet: Vec<&str> = kubelet.iter().map(String::as_str).collect();
                let kcm: Vec<&str> = kcm.iter().map(String::as_str).collect();
                Cluster::Envtest(ControlPlane::dedicated_tuned(
                    tag,
                    &kubelet,
                    &kcm,
                    *cluster_api,
                ))
            }
            (Plane::WithoutClusterApi, _) => {
                Cluster::Envtest(ControlPlane::dedicated_without_capi(tag))
            }
        };
        let mut env = Env::start_on(tag, cluster, self.names).await;
        env.started = began;
        if let Some((base, max)) = self.backoff {
            env.config.settings.backoff.base = base;
            env.config.settings.backoff.max = max;
        }
        if let Some(every) = self.sweep_every {
            env.config.rbac_sweep_every = every;
        }
        // `CAPTF_TEST_STATE_PROXY=1`: every scenario's runners behind the state proxy, on
        // the local control plane (docs/testing.md).
        let every = std::env::var_os("CAPTF_TEST_STATE_PROXY").is_some_and(|v| v == "1")
            && external_cluster().is_none();
        if self.state_proxy.unwrap_or(every) {
            env.config.state_proxy = true;
            env.config.state_proxy_image = Some(STATE_PROXY_IMAGE.to_string());
        }
        match self.machine {
            Some(Machine::Applied { name, module_body }) => {
                env.config.provision = true;
                env.start_manager();
                env.add_machine(&name, &module_body).await;
            }
            Some(Machine::ByHand { module_body }) => {
                env.start_manager();
                let markers = env.markers();
                let uid = env.create_cluster("prod").await;
                env.create_object::<TerraformMachine>("web-1", "prod", &uid, &markers)
                    .await;
                env.wait_finalizer::<TerraformMachine>("web-1").await;
                env.apply::<TerraformMachine>("web-1", &module_body, &markers)
                    .await;
            }
            None if self.provision => {
                env.config.provision = true;
                env.start_manager();
            }
            None => {}
        }
        env
    }
}

impl Env {
    /// The environment of one scenario, made as [`EnvBuilder`] says.
    pub fn builder(tag: &str) -> EnvBuilder {
        EnvBuilder {
            tag: tag.to_string(),
            plane: Plane::Shared,
            names: None,
            provision: false,
            backoff: None,
            sweep_every: None,
            state_proxy: None,
            machine: None,
        }
    }
}
