//! Making and changing the scenario's objects: Cluster API's owners and bootstrap data,
//! CAPTF's objects and their inputs, applies by hand, annotations, deletions and moves.

use super::*;

impl Env {
    /// Creates Cluster API's Machine `name` of the Cluster `cluster`, naming its bootstrap
    /// data Secret `data_secret` when given (else a bootstrap config of the tests' own
    /// that has none yet: [`Env::give_bootstrap_data`]) and the TerraformMachine `name` as its
    /// infrastructure; returns its uid. Cluster API's Machine controller puts its finalizer
    /// on it, owns the TerraformMachine, and deletes it before it lets the Machine go.
    pub async fn create_machine(
        &self,
        name: &str,
        cluster: &str,
        data_secret: Option<&str>,
    ) -> String {
        let bootstrap = match data_secret {
            Some(s) => json!({ "dataSecretName": s }),
            None => {
                self.create_bootstrap_config(name).await;
                json!({"configRef": {"apiGroup": capi::BOOTSTRAP_GROUP,
                    "kind": capi::BOOTSTRAP_KIND, "name": name}})
            }
        };
        let machine: DynamicObject = serde_json::from_value(json!({
            "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Machine",
            "metadata": {"name": name, "namespace": self.ns,
                "labels": {names::CAPI_CLUSTER_NAME_LABEL: cluster}},
            "spec": {"clusterName": cluster, "bootstrap": bootstrap,
                "infrastructureRef": {"apiGroup": names::GROUP, "kind": "TerraformMachine", "name": name}}
        }))
        .expect("machine");
        self.capi_api("Machine")
            .create(&PostParams::default(), &machine)
            .await
            .expect("create the Machine")
            .metadata
            .uid
            .unwrap_or_default()
    }

    /// Creates Cluster API's MachinePool `name` of the Cluster `cluster` with `replicas`,
    /// its template naming the bootstrap data Secret `data_secret` and the
    /// TerraformMachinePool `name` as its infrastructure;
    /// returns its uid.
    pub async fn create_machine_pool(
        &self,
        name: &str,
        cluster: &str,
        replicas: u32,
        data_secret: &str,
    ) -> String {
        let pool: DynamicObject = serde_json::from_value(json!({
            "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "MachinePool",
            "metadata": {"name": name, "namespace": self.ns,
                "labels": {names::CAPI_CLUSTER_NAME_LABEL: cluster}},
            "spec": {"clusterName": cluster, "replicas": replicas, "template": {"spec": {
                "clusterName": cluster,
                "bootstrap": {"dataSecretName": data_secret},
                "infrastructureRef": {"apiGroup": names::GROUP, "kind": "TerraformMachinePool", "name": name}}}}
        }))
        .expect("machine pool");
        self.capi_api("MachinePool")
            .create(&PostParams::default(), &pool)
            .await
            .expect("create the MachinePool")
            .metadata
            .uid
            .unwrap_or_default()
    }

    /// What Cluster API and a bootstrap provider make before CAPTF applies a machine or
    /// pool of the Cluster `cluster` (already created and marked ready): the bootstrap
    /// data Secret `<name>-bootstrap`, then the Machine or MachinePool `name` naming it;
    /// then the CAPTF object `name` of `module_body` (with the contract's outputs of its
    /// kind) owned by it. For a TerraformCluster, the object owned by the Cluster. Waits
    /// until the manager has applied it (`Provisioned` True).
    pub async fn provision<K: TerraformObject>(
        &self,
        name: &str,
        cluster: &str,
        module_body: &str,
    ) {
        let secret = format!("{name}-bootstrap");
        if K::KIND != Kind::TerraformCluster {
            self.create_bootstrap_secret(cluster, &secret, &format!("#cloud-config {name}"))
                .await;
        }
        let (owner_kind, owner_name, owner_uid) = match K::KIND {
            Kind::TerraformCluster => {
                let c = self.cluster_api().get(cluster).await.expect("the Cluster");
                ("Cluster", cluster, c.metadata.uid.unwrap_or_default())
            }
            Kind::TerraformMachine => (
                "Machine",
                name,
                self.create_machine(name, cluster, Some(&secret)).await,
            ),
            Kind::TerraformMachinePool => (
                "MachinePool",
                name,
                self.create_machine_pool(name, cluster, 2, &secret).await,
            ),
        };
        let owner = (owner_kind, owner_name, owner_uid.as_str(), true);
        let module = format!("{module_body}{}", contract_outputs(K::KIND));
        self.create_owned::<K>(name, cluster, &[owner], &module, json!({}))
            .await;
        self.wait_provisioned::<K>(name).await;
    }

    /// Changes the spec of the TerraformMachine `name` (made by [`EnvBuilder::with_machine`] of
    /// [`module`]`(0)`) so that the manager re-applies it: the same module, with one more
    /// instance whose create sleeps `seconds`.
    pub async fn reapply_slowly(&self, name: &str, seconds: u32) {
        let body = format!(
            r#"{}{}
resource "terraform_data" "slow" {{
  provisioner "local-exec" {{
    command = "sleep {seconds}"
  }}
}}
"#,
            module(0),
            contract_outputs(Kind::TerraformMachine)
        );
        self.api::<TerraformMachine>()
            .patch(
                name,
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"module": {"files": {"main.tf": body}}}})),
            )
            .await
            .expect("change the module");
    }

    /// Whether the manager's apply Job of attempt `n` of the TerraformMachine `name` runs.
    pub async fn apply_job_active(&self, name: &str, n: u32) -> bool {
        let suffix = names::state_suffix(Kind::TerraformMachine, name);
        let job = names::job_name(&suffix, names::OPERATION_APPLY, n);
        Api::<Job>::namespaced(self.client.clone(), &self.ns)
            .get_opt(&job)
            .await
            .ok()
            .flatten()
            .and_then(|j| j.status?.active)
            == Some(1)
    }

    /// Waits until the manager has applied `K`/`name` (`Provisioned` True).
    pub async fn wait_provisioned<K: TerraformObject>(&self, name: &str) {
        wait_for(&format!("{name} to be provisioned"), long(), || async {
            self.condition::<K>(name, "Provisioned")
                .await
                .is_some_and(|(s, _, _)| s == "True")
        })
        .await;
    }

    /// Creates the bootstrap data Secret `name` of the Cluster `cluster` with `value`, as a
    /// bootstrap provider does (labelled with the cluster's name).
    pub async fn create_bootstrap_secret(&self, cluster: &str, name: &str, value: &str) {
        let secret: Secret = serde_json::from_value(json!({
            "metadata": {"name": name, "labels": {names::CAPI_CLUSTER_NAME_LABEL: cluster}},
            "type": "cluster.x-k8s.io/secret",
            "stringData": {"value": value, "format": "cloud-config"}
        }))
        .expect("secret");
        self.secrets()
            .create(&PostParams::default(), &secret)
            .await
            .expect("create the bootstrap Secret");
    }

    /// Creates a CAPTF object owned by the Cluster `cluster` (uid `cluster_uid`).
    pub async fn create_object<K: TerraformObject>(
        &self,
        name: &str,
        cluster: &str,
        cluster_uid: &str,
        marker_dir: &Path,
    ) -> K {
        let obj: K = serde_json::from_value(json!({
            "apiVersion": names::API_VERSION, "kind": K::KIND.as_str(),
            "metadata": {
                "name": name, "namespace": self.ns,
                "labels": {names::CAPI_CLUSTER_NAME_LABEL: cluster},
                "ownerReferences": [{"apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Cluster", "name": cluster, "uid": cluster_uid}]
            },
            "spec": {
                "module": {"files": {"main.tf": module(0)}},
                "variables": {"name": name, "marker_dir": marker_dir.display().to_string()}
            }
        }))
        .expect("object");
        self.api::<K>()
            .create(&PostParams::default(), &obj)
            .await
            .expect("create object")
    }

    /// Creates a CAPTF object of kind `K` with `module` (and the spec fields of `extra`
    /// beside it), labelled with the Cluster `cluster` and owned by `owners` (kind, name,
    /// uid, controller), for the manager to apply.
    pub async fn create_owned<K: TerraformObject>(
        &self,
        name: &str,
        cluster: &str,
        owners: &[(&str, &str, &str, bool)],
        module: &str,
        extra: Value,
    ) {
        let owner_refs: Vec<Value> = owners
            .iter()
            .map(|(kind, owner_name, uid, controller)| {
                json!({"apiVersion": "cluster.x-k8s.io/v1beta2", "kind": kind,
                    "name": owner_name, "uid": uid, "controller": controller})
            })
            .collect();
        let mut spec = json!({
            "module": {"files": {"main.tf": module}},
            "variables": {"name": name, "marker_dir": self.markers().display().to_string()}
        });
        if let (Some(spec), Value::Object(extra)) = (spec.as_object_mut(), extra) {
            spec.extend(extra);
        }
        let obj: K = serde_json::from_value(json!({
            "apiVersion": names::API_VERSION, "kind": K::KIND.as_str(),
            "metadata": {
                "name": name, "namespace": self.ns,
                "labels": {names::CAPI_CLUSTER_NAME_LABEL: cluster},
                "ownerReferences": owner_refs
            },
            "spec": spec
        }))
        .expect("object");
        self.api::<K>()
            .create(&PostParams::default(), &obj)
            .await
            .expect("create object");
        // A TerraformCluster of a Cluster is its infrastructure: named by the Cluster, as
        // a user's manifests (or a ClusterClass) name it. Cluster API then owns it and
        // deletes it after the Cluster's machines.
        if K::KIND == Kind::TerraformCluster && owners.iter().any(|(kind, ..)| *kind == "Cluster") {
            self.name_infrastructure(cluster, name).await;
        }
    }

    /// The Cluster `prod` with its TerraformCluster `prod` of `module` and `extra` (beside
    /// it in the spec), for the manager to apply.
    pub async fn create_terraform_cluster(&self, module: &str, extra: Value) {
        let uid = self.create_cluster("prod").await;
        self.create_owned::<TerraformCluster>(
            "prod",
            "prod",
            &[("Cluster", "prod", &uid, false)],
            module,
            extra,
        )
        .await;
    }

    /// [`Env::create_terraform_cluster`], once the manager applied it.
    pub async fn provisioned_cluster(&self, module: &str, extra: Value) {
        self.create_terraform_cluster(module, extra).await;
        self.wait_provisioned::<TerraformCluster>("prod").await;
    }

    /// Does what the apply path does before a deletion can find anything: writes the
    /// inputs Secret and `applied-at`, runs the real `terraform apply` through the
    /// kubernetes backend, then records the state's fingerprint on the object.
    pub async fn apply<K: TerraformObject>(
        &self,
        name: &str,
        module_body: &str,
        marker_dir: &Path,
    ) {
        let (inputs, uid, suffix) = self.write_inputs::<K>(name, module_body, marker_dir).await;
        let variables = inputs.variables.clone();
        let work = self
            .dir
            .join(format!("apply-{}-{name}", K::KIND.short_name()));
        std::fs::create_dir_all(&work).expect("work dir");
        std::fs::write(work.join("main.tf"), module_body).expect("main.tf");
        std::fs::write(
            work.join("captf_backend_override.tf"),
            "terraform {\n  backend \"kubernetes\" {}\n}\n",
        )
        .expect("override");
        // The apply path passes the same backend labels as the destroy Job.
        let labels = backend_labels(K::KIND, name, &uid);
        let ns = &self.ns;
        let labels_hcl: Vec<String> = labels
            .iter()
            .map(|(k, v)| format!("    \"{k}\" = \"{v}\""))
            .collect();
        std::fs::write(
            work.join("backend.hcl"),
            format!(
                "namespace = \"{ns}\"\nsecret_suffix = \"{suffix}\"\nconfig_path = \"{}\"\nlabels = {{\n{}\n}}\n",
                self.kubeconfig_path().display(),
                labels_hcl.join("\n")
            ),
        )
        .expect("backend.hcl");
        std::fs::write(
            work.join("vars.tfvars.json"),
            serde_json::to_vec(&variables).expect("vars"),
        )
        .expect("vars");
        // `init` creates the state Secret, and the manager puts its protection finalizer
        // on it as soon as it sees it. Terraform's backend writes with the resourceVersion
        // it read, so a write of the manager in between makes it fail with a conflict. The
        // real apply path runs Terraform in a Job, and the manager leaves the state alone
        // while a Job of the object is unfinished; here Terraform runs outside a Job, so
        // run `init` again after a conflict and let the manager protect the Secret before
        // the apply writes it.
        let init = [
            "init",
            "-input=false",
            "-no-color",
            "-backend-config=backend.hcl",
        ];
        if try_terraform(&work, &init).is_err() {
            terraform(&work, &init);
        }
        if self.manager.is_some() {
            self.wait_protected(&names::state_secret_name(&suffix))
                .await;
        }
        terraform(
            &work,
            &[
                "apply",
                "-auto-approve",
                "-input=false",
                "-no-color",
                "-var-file=vars.tfvars.json",
            ],
        );
        let (lineage, serial) = self.fingerprint(K::KIND, name).await;
        self.annotate::<K>(
            name,
            &[
                (names::STATE_LINEAGE, Some(lineage)),
                (names::STATE_SERIAL, Some(serial.to_string())),
            ],
        )
        .await;
    }

    /// The apply path's writes before Terraform runs: the inputs Secret (created, or
    /// replaced), then `applied-at` and `inputs-sha256` on the object. Returns the inputs,
    /// the object's uid and its state suffix.
    pub async fn write_inputs<K: TerraformObject>(
        &self,
        name: &str,
        module_body: &str,
        marker_dir: &Path,
    ) -> (Inputs, String, String) {
        self.write_inputs_edited::<K>(name, module_body, marker_dir, |_| {})
            .await
    }

    /// As [`Env::write_inputs`], with `edit` applied to the inputs before they are written
    /// (an env entry, a runner image).
    pub async fn write_inputs_edited<K: TerraformObject>(
        &self,
        name: &str,
        module_body: &str,
        marker_dir: &Path,
        edit: impl FnOnce(&mut Inputs),
    ) -> (Inputs, String, String) {
        let api = self.api::<K>();
        let obj = api.get(name).await.expect("object");
        let suffix = names::state_suffix(K::KIND, name);
        let uid = obj.meta().uid.clone().unwrap_or_default();
        let variables: serde_json::Map<String, Value> = [
            ("name".to_string(), json!(name)),
            (
                "marker_dir".to_string(),
                json!(marker_dir.display().to_string()),
            ),
        ]
        .into_iter()
        .collect();
        let inputs = Inputs {
            version: 1,
            runner: Runner {
                image: runner_image(),
                runtime: None,
                plugin_dir: None,
            },
            module: Module::Files([("main.tf".to_string(), module_body.to_string())].into()),
            variables: variables.clone(),
            env: vec![],
            backend: Backend {
                namespace: self.ns.clone(),
                secret_suffix: suffix.clone(),
            },
            timeout_seconds: Some(self.job_timeout_seconds),
            lock_file: None,
            contract_variables: Default::default(),
            ran: None,
            identity: None,
        };
        let mut inputs = inputs;
        edit(&mut inputs);
        let secret = inputs::inputs_secret(
            &inputs,
            &Identity {
                kind: K::KIND,
                name,
                uid: &uid,
                namespace: &self.ns,
            },
        );
        match self.secrets().create(&PostParams::default(), &secret).await {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 409 => {
                self.secrets()
                    .replace(&secret.name_any(), &PostParams::default(), &secret)
                    .await
                    .expect("replace inputs");
            }
            Err(e) => panic!("inputs Secret: {e}"),
        }
        self.annotate::<K>(
            name,
            &[
                (names::APPLIED_AT, Some(jiff::Timestamp::now().to_string())),
                (names::INPUTS_SHA256, Some(inputs.sha256())),
            ],
        )
        .await;
        (inputs, uid, suffix)
    }

    pub async fn annotate<K: TerraformObject>(&self, name: &str, edits: &[(&str, Option<String>)]) {
        let map: serde_json::Map<String, Value> = edits
            .iter()
            .map(|(k, v)| {
                (
                    k.to_string(),
                    v.clone().map(Value::String).unwrap_or(Value::Null),
                )
            })
            .collect();
        self.api::<K>()
            .patch(
                name,
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"annotations": map}})),
            )
            .await
            .expect("annotate");
    }

    /// Deletes the object and strips its finalizers by hand (docs/08), and waits until it
    /// is gone: no destroy, no cleanup.
    pub async fn delete_stripping_finalizers<K: TerraformObject>(&self, name: &str) {
        self.delete::<K>(name).await;
        self.api::<K>()
            .patch(
                name,
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"finalizers": null}})),
            )
            .await
            .expect("strip the finalizers");
        self.wait_gone::<K>(name, long()).await;
    }

    /// Sets the abandon annotation as the runbook does: to the object's uid.
    pub async fn abandon<K: TerraformObject>(&self, name: &str) {
        let uid = self
            .object::<K>(name)
            .await
            .and_then(|o| o.meta().uid.clone())
            .expect("uid");
        self.annotate::<K>(name, &[(names::ABANDON, Some(uid))])
            .await;
    }

    /// What `clusterctl move` does to the source Cluster when CAPTF's kinds were not moved
    /// (a kustomize install without the clusterctl label on the CRDs): pauses it, strips
    /// its finalizers and deletes it, and its Machines and MachinePools the same way; the
    /// garbage collector then deletes the CAPTF objects they owned.
    pub async fn move_cluster_away(&self, name: &str) {
        let clusters = self.cluster_api();
        for patch in [
            json!({"spec": {"paused": true}}),
            json!({"metadata": {"finalizers": null}}),
        ] {
            clusters
                .patch(name, &PatchParams::default(), &Patch::Merge(patch))
                .await
                .expect("patch cluster");
        }
        clusters
            .delete(name, &DeleteParams::background())
            .await
            .expect("delete cluster");
        // And so it does with the Cluster's Machines and MachinePools.
        let of_cluster =
            ListParams::default().labels(&format!("{}={name}", names::CAPI_CLUSTER_NAME_LABEL));
        for kind in ["Machine", "MachinePool"] {
            let api = self.capi_api(kind);
            let Ok(list) = api.list(&of_cluster).await else {
                continue;
            };
            for o in list.items {
                let o_name = o.metadata.name.clone().unwrap_or_default();
                let strip = Patch::Merge(json!({"metadata": {"finalizers": null}}));
                let _ = api.patch(&o_name, &PatchParams::default(), &strip).await;
                let _ = api.delete(&o_name, &DeleteParams::background()).await;
            }
        }
    }

    /// Deletes the CAPI Cluster. Cluster API's controllers keep it while they delete
    /// its machines, control plane and infrastructure, in that order.
    pub async fn delete_cluster(&self, name: &str) {
        self.cluster_api()
            .delete(name, &DeleteParams::background())
            .await
            .expect("delete cluster");
    }

    /// Deletes one CAPTF object.
    pub async fn delete<K: TerraformObject>(&self, name: &str) {
        self.api::<K>()
            .delete(name, &DeleteParams::background())
            .await
            .expect("delete");
    }

    /// Keeps an errored state of `web-1` (attempt 1) as a runner keeps one through
    /// Terraform's backend: a Secret of `tfstate` (gzipped state JSON) with Terraform's
    /// labels under an errored suffix of its own, the owner and move labels, and the
    /// errored-state label; no finalizer. Returns its name.
    pub async fn keep_errored_state(&self, tfstate: Vec<u8>) -> String {
        let suffix = names::state_suffix(Kind::TerraformMachine, "web-1");
        let errored_suffix = names::errored_suffix(&suffix, 1, "ab1cd");
        let name = names::state_secret_name(&errored_suffix);
        let uid = self
            .object::<TerraformMachine>("web-1")
            .await
            .and_then(|o| o.metadata.uid)
            .expect("uid");
        let mut labels = backend_labels(Kind::TerraformMachine, "web-1", &uid);
        labels.extend(captf::api::labels::terraform_state_labels(&errored_suffix));
        labels.insert(names::LABEL_ERRORED_STATE.to_string(), "true".to_string());
        let secret = Secret {
            metadata: ObjectMeta {
                name: Some(name.clone()),
                labels: Some(labels),
                ..Default::default()
            },
            data: Some(BTreeMap::from([(
                names::TF_STATE_KEY.to_string(),
                k8s_openapi::ByteString(tfstate),
            )])),
            ..Default::default()
        };
        self.secrets()
            .create(&PostParams::default(), &secret)
            .await
            .expect("the errored state");
        name
    }

    /// Loses a state Secret for real: strips its finalizers and deletes it until it is gone
    /// (the manager may put its protection finalizer back in between).
    pub async fn lose_secret(&self, name: &str) {
        wait_for("the Secret to be gone", long(), || async {
            let strip = Patch::Merge(json!({"metadata": {"finalizers": null}}));
            let _ = self
                .secrets()
                .patch(name, &PatchParams::default(), &strip)
                .await;
            let _ = self.secrets().delete(name, &DeleteParams::default()).await;
            !self.secret_exists(name).await
        })
        .await;
    }

    /// Starts the manager applying live objects (`provision` on), then makes a Cluster
    /// `prod`, ready, and a TerraformMachine `name` of `module_body` that the manager
    /// applies ([`Env::provision`]); for a scenario that sets something up (a fault of
    /// the local kubelet) before the machine.
    pub async fn add_machine(&mut self, name: &str, module_body: &str) {
        if self.manager.is_none() {
            self.config.provision = true;
            self.start_manager();
        }
        self.create_cluster("prod").await;
        self.mark_cluster_ready("prod").await;
        self.provision::<TerraformMachine>(name, "prod", module_body)
            .await;
    }
}

/// The labels the apply path (and the destroy Job) give Terraform's backend: the owner
/// labels and clusterctl's move label.
pub fn backend_labels(kind: Kind, name: &str, uid: &str) -> BTreeMap<String, String> {
    Identity {
        kind,
        namespace: "",
        name,
        uid,
    }
    .moved_labels()
}
