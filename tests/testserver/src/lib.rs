//! A small, faithful, in-process Kubernetes API server and a local Job runner for CAPTF's
//! tests. The real controller (kube-rs), the real `kubectl` and the real `terraform`
//! (kubernetes backend) talk to it over plain HTTP on 127.0.0.1. Test infrastructure, not
//! product.
//!
//! # What it models
//! - Storage of schemaless JSON objects (`serde_json::Value`) with one global, increasing
//!   `resourceVersion`, `uid`, `creationTimestamp`, `generation` (bumped when anything but
//!   metadata/status changes, and when `deletionTimestamp` is set), the `status` subresource
//!   split, 409 `AlreadyExists`/`Conflict`, 404, 422 and 403 errors as `Status` objects.
//! - Built-in resources: core/v1 namespaces, secrets, configmaps, serviceaccounts, events,
//!   pods (+`status`, +`log`); batch/v1 jobs (+`status`); coordination.k8s.io/v1 leases;
//!   rbac.authorization.k8s.io/v1 roles, rolebindings; apiextensions.k8s.io/v1
//!   customresourcedefinitions; events.k8s.io/v1 events (stored separately from core/v1
//!   events, unlike the real server which shares their storage). Custom resources are served
//!   as soon as their CRD is created (every served version, same objects, no conversion).
//! - A created Job gets the selector and Pod-template labels of its own uid (`job-name`,
//!   `controller-uid` and their `batch.kubernetes.io/` forms) unless `manualSelector` is
//!   true, as the real Job registry generates them.
//! - Legacy discovery (`/api`, `/api/v1`, `/apis`, `/apis/<g>`, `/apis/<g>/<v>`), `/version`,
//!   `/healthz`, `/livez`, `/readyz`.
//! - Verbs get, list (label and field selectors), watch (resume from a resourceVersion, bounded
//!   history of [`store::HISTORY_LIMIT`] events, `410 Expired`, bookmarks, `sendInitialEvents`,
//!   `timeoutSeconds`), create (`generateName`), update, patch (merge, JSON patch, a reduced
//!   strategic merge for built-ins), delete (preconditions, propagation policies, grace period)
//!   and deletecollection.
//! - Deletion: finalizers, `deletionTimestamp`, graceful Pod deletion, a garbage collector
//!   (background, foreground, orphan), namespace termination (403 `NamespaceTerminating`).
//!   Jobs default to Orphan propagation as batch/v1 does; everything else to Background.
//! - CRD deletion as apiextensions-apiserver does it (see [`crds`]): the first DELETE adds
//!   the `customresourcecleanup.apiextensions.k8s.io` finalizer and `Terminating=True`;
//!   creating instances then gets 405 "create not allowed while custom resource definition
//!   is terminating" while every other verb keeps working; the finalizer controller deletes
//!   every instance as a normal DELETE does (finalizers hold them) and, once none is left,
//!   removes its finalizer, and the CRD and its types go. Removing the finalizer by hand
//!   leaves the remaining instances in storage, unserved, until a CRD serves them again.
//! - A fault switch ([`Faults`]) and request counters ([`RequestLog`]); with
//!   `CAPTF_TESTSERVER_TRACE=FILE`, a trace of every request (start, duration, status, method,
//!   URI, client) appended to FILE, for latency investigations.
//! - A local Job runner ([`JobRunner`]) standing in for the Job controller and the kubelet.
//! - The binary `captf-testserver --kubeconfig PATH` runs the server and the Job runner as
//!   a process of their own, for the end-to-end tests' real-cluster mode
//!   (`CAPTF_E2E_KUBECONFIG`) to be exercised without a real cluster.
//!
//! # What it deliberately does not model
//! - Scheduling (the Job runner binds its own Pods), admission (webhooks, quotas; defaulting
//!   only for a few Pod, Job, Namespace and Secret fields), schema validation of any kind,
//!   RBAC enforcement, authentication, TLS.
//! - Server-side apply (`application/apply-patch+yaml` gets 415) and `managedFields`.
//! - Protobuf: responses are always JSON; request bodies in protobuf are decoded only for
//!   `Namespace`, `Secret`, `ConfigMap` and `ServiceAccount` (what `kubectl create namespace|
//!   secret|configmap|serviceaccount` send, see [`protobuf`]); other protobuf bodies (e.g.
//!   `kubectl create job`) get 415: use `kubectl create -f <manifest>` instead.
//! - Server-side Table printing (lists are plain JSON; `kubectl get` prints them client-side),
//!   OpenAPI (`/openapi/v2` and `/openapi/v3` answer 404, so `kubectl create/apply` need
//!   `--validate=false`), aggregated discovery (legacy discovery only; kubectl falls back).
//! - `limit`/`continue` pagination (the full list is returned without `continue`),
//!   `resourceVersion`/`resourceVersionMatch` on lists (always the latest state), watches on
//!   a single named object path (use `fieldSelector=metadata.name=...`), the namespace
//!   `finalize` subresource and namespace status conditions, CRD conversion, `dryRun`.
//! - BOOKMARK events come every [`watch::BOOKMARK_INTERVAL`] (1 s) instead of about a minute.

pub mod crds;
pub mod faults;
mod gc;
mod http;
pub mod jobrunner;
pub mod kubeconfig;
mod namespaces;
pub mod patch;
pub mod protobuf;
pub mod requestlog;
pub mod selectors;
pub mod store;
pub mod watch;

use std::path::{Path, PathBuf};
use std::sync::Arc;

pub use faults::Faults;
pub use jobrunner::{JobRunner, JobRunnerOptions};
pub use requestlog::RequestLog;
pub use store::{ApiError, DeleteOptions, Propagation, Store};

/// The running test API server. Dropping it stops it too; [`TestServer::shutdown`] waits.
pub struct TestServer {
    url: String,
    dir: PathBuf,
    kubeconfig: PathBuf,
    store: Store,
    faults: Faults,
    log: RequestLog,
    shutdown: tokio::sync::watch::Sender<bool>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

static SERVER_COUNTER: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

impl TestServer {
    /// Start a server on `127.0.0.1:<free port>` (plain HTTP) with the `default` and
    /// `kube-system` namespaces, the garbage collector, the namespace controller and the
    /// CRD finalizer controller.
    /// Panics if it cannot bind or write its kubeconfig (test setup failure).
    pub async fn start() -> TestServer {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind 127.0.0.1:0");
        let addr = listener.local_addr().expect("local address");
        let url = format!("http://{addr}");
        let n = SERVER_COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!(
            "captf-testserver-{}-{}-{}",
            std::process::id(),
            n,
            store::random_suffix()
        ));
        std::fs::create_dir_all(&dir).expect("create the server's temp dir");
        let kubeconfig = kubeconfig::write(&dir, &url).expect("write kubeconfig");
        let store = Store::new();
        let faults = Faults::default();
        let log = RequestLog::default();
        let (shutdown, shutdown_rx) = tokio::sync::watch::channel(false);
        let state = Arc::new(http::ServerState {
            store: store.clone(),
            faults: faults.clone(),
            log: log.clone(),
            address: addr.to_string(),
        });
        let tasks = vec![
            tokio::spawn(http::serve(listener, state, shutdown_rx)),
            tokio::spawn(gc::run(store.clone())),
            tokio::spawn(namespaces::run(store.clone())),
            tokio::spawn(crds::run(store.clone())),
        ];
        TestServer {
            url,
            dir,
            kubeconfig,
            store,
            faults,
            log,
            shutdown,
            tasks,
        }
    }

    /// `http://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        self.url.clone()
    }

    /// A kubeconfig for this server (context namespace `default`, no credentials), in a temp
    /// directory the server owns and removes on shutdown.
    pub fn kubeconfig_path(&self) -> &Path {
        &self.kubeconfig
    }

    /// The fault switch.
    pub fn faults(&self) -> &Faults {
        &self.faults
    }

    /// Direct in-process access to the objects.
    pub fn store(&self) -> Store {
        self.store.clone()
    }

    /// Request counters.
    pub fn request_log(&self) -> RequestLog {
        self.log.clone()
    }

    /// Stop serving, end every connection and watch, and remove the temp directory.
    pub async fn shutdown(mut self) {
        let _ = self.shutdown.send(true);
        for t in self.tasks.drain(..) {
            t.abort();
            let _ = t.await;
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        let _ = self.shutdown.send(true);
        for t in &self.tasks {
            t.abort();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
