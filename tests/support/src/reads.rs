//! What a scenario reads and waits for: states, conditions, Events, what is left of an
//! object, and what the manager did (its writes, its Jobs, the runner's tries).

use super::*;

impl Env {
    /// The lineage and serial of an object's state, read through the product's reader.
    pub async fn fingerprint(&self, kind: Kind, name: &str) -> (String, u64) {
        match self.read_state(kind, name).await {
            StateContent::Parsed {
                lineage, serial, ..
            } => (lineage, serial),
            other => panic!("state of {kind}/{name} is not readable: {other:?}"),
        }
    }

    /// The state Secret of `kind`/`name` and its parts, as read now.
    async fn state_secrets(&self, kind: Kind, name: &str) -> captf::state::StateSecrets {
        let suffix = names::state_suffix(kind, name);
        captf::state::secrets::read(
            &self.secrets(),
            &names::state_secret_name(&suffix),
            Some(&suffix),
        )
        .await
        .expect("read state")
    }

    pub async fn read_state(&self, kind: Kind, name: &str) -> StateContent {
        let secrets = self.state_secrets(kind, name).await;
        state::read(&secrets, state::DEFAULT_DECOMPRESSION_CAP)
    }

    /// The string output `output` of the state of `kind`/`name`, if it has one.
    pub async fn state_output(&self, kind: Kind, name: &str, output: &str) -> Option<String> {
        let secrets = self.state_secrets(kind, name).await;
        captf::state::outputs(&secrets, state::DEFAULT_DECOMPRESSION_CAP)
            .unwrap_or_else(|e| panic!("the outputs of {kind}/{name}: {e}"))
            .get(output)
            .and_then(|v| v.as_str().map(str::to_string))
    }

    pub async fn exists<K: TerraformObject>(&self, name: &str) -> bool {
        self.api::<K>().get_opt(name).await.expect("get").is_some()
    }

    pub async fn object<K: TerraformObject>(&self, name: &str) -> Option<K> {
        self.api::<K>().get_opt(name).await.expect("get")
    }

    /// The reason of a condition of an object, if set.
    pub async fn condition<K: TerraformObject>(
        &self,
        name: &str,
        type_: &str,
    ) -> Option<(String, String, String)> {
        let obj = self.object::<K>(name).await?;
        obj.status()?
            .conditions
            .iter()
            .find(|c| c.type_ == type_)
            .map(|c| (c.status.clone(), c.reason.clone(), c.message.clone()))
    }

    /// Asserts that nothing CAPTF made for the object `kind`/`name` is left in the test's
    /// namespace: no state, inputs or backup Secret (or part of one), no Secret, Job or Pod
    /// with its owner labels, and no lock Lease. Errored states are kept by design and are
    /// not looked at.
    pub async fn assert_nothing_left(&self, kind: Kind, name: &str) {
        let suffix = names::state_suffix(kind, name);
        let mine = |labels: Option<&BTreeMap<String, String>>| {
            captf::api::labels::labelled_owner(labels).is_some_and(|o| o.is_named(kind, name))
        };
        let secrets = self
            .secrets()
            .list_metadata(&ListParams::default())
            .await
            .expect("secrets");
        let left: Vec<String> = secrets
            .items
            .iter()
            .filter(|s| {
                let n = s.metadata.name.as_deref().unwrap_or_default();
                let parsed = names::parse_secret_name(n);
                let errored = parsed
                    .as_ref()
                    .is_some_and(|p| p.role == names::SecretRole::Errored);
                let of_suffix = parsed.as_ref().is_some_and(|p| p.rest == suffix);
                !errored && (of_suffix || mine(s.metadata.labels.as_ref()))
            })
            .map(|s| s.name_any())
            .collect();
        assert!(left.is_empty(), "Secrets of {kind} {name} left: {left:?}");
        let jobs: Api<Job> = Api::namespaced(self.client.clone(), &self.ns);
        let left: Vec<String> = jobs
            .list_metadata(&ListParams::default())
            .await
            .expect("jobs")
            .items
            .iter()
            .filter(|j| mine(j.metadata.labels.as_ref()))
            .map(|j| j.name_any())
            .collect();
        assert!(left.is_empty(), "Jobs of {kind} {name} left: {left:?}");
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), &self.ns);
        let left: Vec<String> = pods
            .list_metadata(&ListParams::default())
            .await
            .expect("pods")
            .items
            .iter()
            .filter(|p| mine(p.metadata.labels.as_ref()) && p.metadata.deletion_timestamp.is_none())
            .map(|p| p.name_any())
            .collect();
        assert!(left.is_empty(), "Pods of {kind} {name} left: {left:?}");
        let leases: Api<k8s_openapi::api::coordination::v1::Lease> =
            Api::namespaced(self.client.clone(), &self.ns);
        assert!(
            leases
                .get_opt(&names::lock_lease_name(&suffix))
                .await
                .expect("lease")
                .is_none(),
            "the lock Lease of {kind} {name} is left"
        );
    }

    /// The files of the attempt whose Job is `job` that its Secret holds, by the path the
    /// Job's projected volume gives each key (`file-<index>` → `terraform.tfvars.json`);
    /// waits for the Job and its Secret.
    pub async fn attempt_files(&self, job: &str) -> BTreeMap<String, String> {
        let jobs: Api<Job> = Api::namespaced(self.client.clone(), &self.ns);
        let job_obj = wait_for_value(&format!("the Job {job}"), long(), || async {
            jobs.get_opt(job).await.ok().flatten()
        })
        .await;
        let secret = wait_for_value(&format!("the Secret of {job}"), long(), || async {
            self.secrets().get_opt(job).await.ok().flatten()
        })
        .await;
        let data = secret.data.unwrap_or_default();
        let volumes = job_obj
            .spec
            .and_then(|s| s.template.spec)
            .map(|s| s.volumes.unwrap_or_default())
            .unwrap_or_default();
        volumes
            .iter()
            .filter_map(|v| v.projected.as_ref())
            .flat_map(|p| p.sources.iter().flatten())
            .filter_map(|src| src.secret.as_ref())
            .filter(|s| s.name == job)
            .flat_map(|s| s.items.iter().flatten())
            .filter_map(|item| {
                let content = data.get(&item.key)?;
                Some((
                    item.path.clone(),
                    String::from_utf8_lossy(&content.0).into_owned(),
                ))
            })
            .collect()
    }

    pub async fn secret_exists(&self, name: &str) -> bool {
        self.secrets()
            .get_opt(name)
            .await
            .expect("get secret")
            .is_some()
    }

    /// Event reasons recorded about an object (events.k8s.io/v1).
    pub async fn event_reasons(&self, name: &str) -> Vec<String> {
        self.event_notes(name)
            .await
            .into_iter()
            .map(|(reason, _)| reason)
            .filter(|reason| !reason.is_empty())
            .collect()
    }

    /// The Events recorded about an object (events.k8s.io/v1): reason and note.
    pub async fn event_notes(&self, name: &str) -> Vec<(String, String)> {
        Api::<Event>::namespaced(self.client.clone(), &self.ns)
            .list(&Default::default())
            .await
            .expect("list events")
            .items
            .into_iter()
            .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name))
            .map(|e| (e.reason.unwrap_or_default(), e.note.unwrap_or_default()))
            .collect()
    }

    /// Writes (create, update, patch, delete) of the manager that the API server carried
    /// out so far.
    pub fn total_writes(&self) -> u64 {
        self.proxy.request_log().writes_done()
    }

    /// Waits until the object's Deleting condition has `reason`.
    pub async fn wait_deleting<K: TerraformObject>(
        &self,
        name: &str,
        reason: &str,
        timeout: Duration,
    ) -> String {
        self.wait_condition::<K>(name, "Deleting", None, reason, timeout)
            .await
    }

    /// Waits until `K`/`name`'s condition `type_` has `reason`, and `status` when given;
    /// returns its message. The one wait for a condition the scenarios use: on a timeout
    /// it panics with the condition as it was last seen and the object's other conditions.
    pub async fn wait_condition<K: TerraformObject>(
        &self,
        name: &str,
        type_: &str,
        status: Option<&str>,
        reason: &str,
        timeout: Duration,
    ) -> String {
        let start = std::time::Instant::now();
        loop {
            let conditions = self
                .object::<K>(name)
                .await
                .and_then(|o| o.status().map(|s| s.conditions.clone()))
                .unwrap_or_default();
            if let Some(c) = conditions.iter().find(|c| c.type_ == type_)
                && c.reason == reason
                && status.is_none_or(|s| s == c.status)
            {
                return c.message.clone();
            }
            if start.elapsed() > timeout {
                let seen: Vec<String> = conditions
                    .iter()
                    .map(|c| format!("{}={}/{}: {}", c.type_, c.status, c.reason, c.message))
                    .collect();
                panic!(
                    "timed out after {timeout:?} waiting for {name}'s {type_} to be {}{reason}; its conditions: {seen:#?}",
                    status.map(|s| format!("{s}/")).unwrap_or_default()
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    pub async fn wait_gone<K: TerraformObject>(&self, name: &str, timeout: Duration) {
        wait_for(&format!("{name} to be released"), timeout, || async {
            !self.exists::<K>(name).await
        })
        .await;
    }

    /// How many times Terraform ran the destroy provisioner of an instance of `name` (the
    /// module's `.tries` marker). On an outside cluster, where the markers stay in the
    /// Pods: how many destroy Jobs of `name` were created.
    pub fn tries(&self, name: &str) -> u32 {
        match &self.cluster {
            Cluster::Envtest(_) => {
                std::fs::read_to_string(self.markers().join(format!("{name}-0.tries")))
                    .ok()
                    .and_then(|s| s.trim().parse().ok())
                    .unwrap_or(0)
            }
            Cluster::External(_) => self.witness.destroy_jobs(name),
        }
    }

    /// Whether Terraform destroyed both instances of `name`: their destroy markers; on an
    /// outside cluster, a state of `name` that held instances was seen holding none.
    pub fn destroyed(&self, name: &str) -> bool {
        self.destroyed_at(name).is_some()
    }

    /// When Terraform destroyed `name` (see [`Env::destroyed`]).
    pub fn destroyed_at(&self, name: &str) -> Option<std::time::SystemTime> {
        match &self.cluster {
            Cluster::Envtest(_) => {
                let markers = self.markers();
                let times: Vec<_> = (0..2)
                    .map(|i| {
                        std::fs::metadata(markers.join(format!("{name}-{i}.destroyed")))
                            .and_then(|m| m.modified())
                            .ok()
                    })
                    .collect::<Option<_>>()?;
                times.into_iter().max()
            }
            Cluster::External(_) => self.witness.emptied_at(name),
        }
    }

    /// The runner images of the Jobs of `operation` of the object `name` created so far.
    pub fn job_images(&self, name: &str, operation: &str) -> Vec<String> {
        self.witness.job_images(name, operation)
    }

    /// Jobs created so far in the test's namespace (the witness saw them).
    pub fn jobs_created(&self) -> u64 {
        self.witness.jobs() as u64
    }

    /// Destroy Jobs created so far in the test's namespace (the witness saw them).
    pub fn destroy_jobs_created(&self) -> u64 {
        self.witness.operation_jobs(names::OPERATION_DESTROY) as u64
    }

    /// The destroy Jobs in the namespace now.
    pub async fn destroy_jobs(&self) -> Vec<Job> {
        let lp = ListParams::default().labels(&format!(
            "{}={}",
            names::LABEL_OPERATION,
            names::OPERATION_DESTROY
        ));
        Api::<Job>::namespaced(self.client.clone(), &self.ns)
            .list(&lp)
            .await
            .expect("list jobs")
            .items
    }

    /// Whether a destroy of `name` has reached its destroy provisioner: the `.tries`
    /// marker; on an outside cluster, the log of a destroy Pod of `name`.
    pub async fn destroy_provisioner_started(&self, name: &str) -> bool {
        if !self.is_external() {
            return self.tries(name) >= 1;
        }
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), &self.ns);
        let lp = ListParams::default().labels(&format!(
            "{}={name},{}={}",
            names::LABEL_OWNER_NAME,
            names::LABEL_OPERATION,
            names::OPERATION_DESTROY
        ));
        let Ok(list) = pods.list(&lp).await else {
            return false;
        };
        for pod in list.items {
            if let Ok(log) = pods.logs(&pod.name_any(), &Default::default()).await
                && log.contains("local-exec")
            {
                return true;
            }
        }
        false
    }

    /// Waits until the manager has put its finalizer on the object.
    pub async fn wait_finalizer<K: TerraformObject>(&self, name: &str) {
        wait_for("the finalizer", long(), || async {
            self.object::<K>(name)
                .await
                .is_some_and(|o| o.meta().finalizers.is_some())
        })
        .await;
    }

    /// Waits until a Secret carries the protection finalizer.
    pub async fn wait_protected(&self, secret: &str) {
        wait_for("the protection finalizer", long(), || async {
            self.secrets()
                .get_opt(secret)
                .await
                .ok()
                .flatten()
                .is_some_and(|s| {
                    s.metadata
                        .finalizers
                        .unwrap_or_default()
                        .contains(&names::PROTECT_FINALIZER.to_string())
                })
        })
        .await;
    }
}
