//! What the cluster shows of the deletions in one namespace, recorded by watches (`Witness`).

use super::*;

/// What the cluster shows of the deletions in one namespace, recorded by watches from the
/// start of the test (on an outside cluster, in place of the markers Terraform leaves on
/// this machine): every version of every state Secret (so the state Terraform wrote after
/// a destroy is seen even though cleanup deletes it right after), and every Job created.
#[derive(Clone)]
pub struct Witness {
    seen: std::sync::Arc<std::sync::Mutex<Seen>>,
    tasks: std::sync::Arc<Vec<tokio::task::JoinHandle<()>>>,
}

#[derive(Default)]
struct Seen {
    /// The last version of each `tfstate-default-*` Secret (base and parts).
    secrets: BTreeMap<String, Secret>,
    /// State suffixes whose state was seen with a managed resource instance.
    had_instances: std::collections::BTreeSet<String>,
    /// State suffix → when its state, after holding instances, was seen holding none.
    emptied: BTreeMap<String, std::time::SystemTime>,
    /// Job uid → (owner name label, operation label, the runner container's image).
    jobs: BTreeMap<String, (String, String, String)>,
}

const STATE_PREFIX: &str = "tfstate-default-";

impl Witness {
    pub(crate) fn start(client: Client, ns: &str) -> Witness {
        use futures::StreamExt;
        use kube::runtime::{WatchStreamExt, watcher};
        // With a backoff: a watch whose API server is gone (a test failed and its control
        // plane stopped) must wait between retries, or it never yields and the test's
        // runtime cannot shut down: the test hangs instead of failing.
        let seen = std::sync::Arc::new(std::sync::Mutex::new(Seen::default()));
        let secrets: Api<Secret> = Api::namespaced(client.clone(), ns);
        let jobs: Api<Job> = Api::namespaced(client, ns);
        let s = seen.clone();
        let watch_secrets = tokio::spawn(async move {
            let mut stream = watcher(secrets, watcher::Config::default())
                .default_backoff()
                .boxed();
            while let Some(ev) = stream.next().await {
                if let Ok(watcher::Event::Apply(sec) | watcher::Event::InitApply(sec)) = ev {
                    s.lock().expect("witness").record_secret(sec);
                }
            }
        });
        let s = seen.clone();
        let watch_jobs = tokio::spawn(async move {
            let mut stream = watcher(jobs, watcher::Config::default())
                .default_backoff()
                .boxed();
            while let Some(ev) = stream.next().await {
                if let Ok(watcher::Event::Apply(job) | watcher::Event::InitApply(job)) = ev {
                    let label = |k: &str| job.labels().get(k).cloned().unwrap_or_default();
                    let image = captf::job::outcome::runner_container(&job)
                        .and_then(|c| c.image.clone())
                        .unwrap_or_default();
                    let entry = (
                        label(names::LABEL_OWNER_NAME),
                        label(names::LABEL_OPERATION),
                        image,
                    );
                    let uid = job.uid().unwrap_or_default();
                    s.lock().expect("witness").jobs.insert(uid, entry);
                }
            }
        });
        Witness {
            seen,
            tasks: std::sync::Arc::new(vec![watch_secrets, watch_jobs]),
        }
    }

    pub(crate) fn stop(&self) {
        for t in self.tasks.iter() {
            t.abort();
        }
    }

    /// When a state of the object `name` (any kind) was seen emptied.
    pub(crate) fn emptied_at(&self, name: &str) -> Option<std::time::SystemTime> {
        let seen = self.seen.lock().expect("witness");
        seen.emptied
            .iter()
            .find(|(suffix, _)| suffix.rsplit_once('.').is_some_and(|(n, _)| n == name))
            .map(|(_, t)| *t)
    }

    /// Destroy Jobs of the object `name` seen so far.
    pub(crate) fn destroy_jobs(&self, name: &str) -> u32 {
        let seen = self.seen.lock().expect("witness");
        seen.jobs
            .values()
            .filter(|(owner, op, _)| owner == name && op == names::OPERATION_DESTROY)
            .count() as u32
    }

    /// The runner images of the Jobs of `operation` of the object `name` seen so far.
    pub(crate) fn job_images(&self, name: &str, operation: &str) -> Vec<String> {
        let seen = self.seen.lock().expect("witness");
        seen.jobs
            .values()
            .filter(|(owner, op, _)| owner == name && op == operation)
            .map(|(_, _, image)| image.clone())
            .collect()
    }

    pub(crate) fn operation_jobs(&self, operation: &str) -> usize {
        let seen = self.seen.lock().expect("witness");
        seen.jobs
            .values()
            .filter(|(_, op, _)| op == operation)
            .count()
    }

    pub(crate) fn jobs(&self) -> usize {
        self.seen.lock().expect("witness").jobs.len()
    }
}

impl Seen {
    fn record_secret(&mut self, secret: Secret) {
        let name = secret.name_any();
        let Some(rest) = name.strip_prefix(STATE_PREFIX) else {
            return;
        };
        // `<suffix>` or `<suffix>-part-<N>`.
        let suffix = match rest.rsplit_once("-part-") {
            Some((base, n)) if n.parse::<u32>().is_ok() => base.to_string(),
            _ => rest.to_string(),
        };
        self.secrets.insert(name, secret);
        let base = names::state_secret_name(&suffix);
        // The base and its parts (named after it), not every state seen: with thousands of
        // states, cloning them all at each event was the bench process's whole CPU.
        let all: Vec<Secret> = self
            .secrets
            .range(base.clone()..)
            .take_while(|(n, _)| n.starts_with(base.as_str()))
            .map(|(_, s)| s.clone())
            .collect();
        let content = state::read(
            &state::StateSecrets::from_secrets(&base, &all),
            state::DEFAULT_DECOMPRESSION_CAP,
        );
        if let StateContent::Parsed {
            managed_instances, ..
        } = content
        {
            if managed_instances > 0 {
                self.had_instances.insert(suffix);
            } else if self.had_instances.contains(&suffix) {
                self.emptied
                    .entry(suffix)
                    .or_insert_with(std::time::SystemTime::now);
            }
        }
    }
}

/// Every version of the watched objects the API server showed, as `take` reads each,
/// recorded by a watch from before they were made: what lasted a moment (a record a later
/// pass takes back, a Job deleted at the release) is still seen, however long the test took
/// to look.
pub struct History<T> {
    seen: std::sync::Arc<std::sync::Mutex<Vec<T>>>,
    task: tokio::task::JoinHandle<()>,
}

impl<T: Send + 'static> History<T> {
    pub fn watch<K>(
        api: Api<K>,
        config: kube::runtime::watcher::Config,
        take: impl Fn(&K) -> T + Send + 'static,
    ) -> History<T>
    where
        K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug + Send + 'static,
    {
        use futures::StreamExt;
        use kube::runtime::{WatchStreamExt, watcher};
        let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let s = seen.clone();
        let task = tokio::spawn(async move {
            // With a backoff, as the witness's watches (a stopped control plane must not
            // spin the test's runtime).
            let mut stream = watcher(api, config).default_backoff().boxed();
            while let Some(ev) = stream.next().await {
                if let Ok(watcher::Event::Apply(o) | watcher::Event::InitApply(o)) = ev {
                    s.lock().expect("history").push(take(&o));
                }
            }
        });
        History { seen, task }
    }

    /// Whether a version seen so far satisfied `check`.
    pub fn any(&self, check: impl Fn(&T) -> bool) -> bool {
        self.seen.lock().expect("history").iter().any(check)
    }
}

impl<T: Clone> History<T> {
    /// Every version seen so far, in the order seen.
    pub fn seen(&self) -> Vec<T> {
        self.seen.lock().expect("history").clone()
    }
}

impl<T> Drop for History<T> {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Every version of one CAPTF object's annotations ([`History`]).
pub struct AnnotationHistory(History<BTreeMap<String, String>>);

impl AnnotationHistory {
    pub fn start<K: TerraformObject>(api: Api<K>, name: &str) -> AnnotationHistory {
        let config =
            kube::runtime::watcher::Config::default().fields(&format!("metadata.name={name}"));
        AnnotationHistory(History::watch(api, config, |o: &K| o.annotations().clone()))
    }

    /// Whether a version seen so far satisfied `check`.
    pub fn any(&self, check: impl Fn(&BTreeMap<String, String>) -> bool) -> bool {
        self.0.any(check)
    }
}
