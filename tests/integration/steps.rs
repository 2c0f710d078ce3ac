//! What more than one scenario file does to an [`Env`]: run the `captf` binary
//! ([`EnvExt`]), make the usual environment (a Cluster with one applied machine), and run
//! reconcile passes by hand instead of a manager.

use std::sync::Arc;
use std::time::Duration;

use captf::controller::{Context, discover_cluster, reconcile::reconcile};
use captf::state::permits::Lane;

use crate::support::*;

/// What only integration tests can do with an [`Env`]: run the `captf` binary (only they
/// get `CARGO_BIN_EXE_captf`).
pub trait EnvExt {
    fn captf(&self, args: &[&str]) -> std::process::Output;
    fn captf_json(&self, args: &[&str]) -> serde_json::Value;
    fn restore_from_file(&self, target: &str, file: &std::path::Path);
}

impl EnvExt for Env {
    /// Runs the `captf` binary against the cluster.
    fn captf(&self, args: &[&str]) -> std::process::Output {
        std::process::Command::new(env!("CARGO_BIN_EXE_captf"))
            .args(args)
            .env("KUBECONFIG", self.kubeconfig_path())
            .output()
            .expect("run captf")
    }

    /// Runs the `captf` binary against the cluster, asserts it succeeded, and reads what
    /// it printed as JSON (a command given `-o json`).
    fn captf_json(&self, args: &[&str]) -> serde_json::Value {
        let out = self.captf(args);
        assert!(
            out.status.success(),
            "captf {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout)
            .unwrap_or_else(|e| panic!("captf {args:?} printed no JSON: {e}"))
    }

    /// `captf state restore TARGET --from-file FILE --force` in the test's namespace,
    /// asserted to succeed.
    fn restore_from_file(&self, target: &str, file: &std::path::Path) {
        let out = self.captf(&[
            "state",
            "restore",
            target,
            "--from-file",
            file.to_str().expect("path"),
            "--force",
            "-n",
            &self.ns,
        ]);
        assert!(
            out.status.success(),
            "restore: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// A Cluster `prod` with one applied TerraformMachine `web-1`, the manager running.
pub(crate) async fn machine_env(tag: &str, fail_destroys: u32, backoff_base: Duration) -> Env {
    Env::builder(tag)
        .backoff(backoff_base, backoff_base * 4)
        .with_machine("web-1", &module(fail_destroys))
        .start()
        .await
}

pub(crate) const FAST: Duration = Duration::from_millis(300);

/// A Cluster `prod` with a TerraformMachine `web-1` (its finalizer on, applied by
/// Terraform), and the manager's context to run reconcile passes one by one instead of a
/// manager.
pub(crate) async fn passes_by_hand(tag: &str) -> (Env, Arc<Context>) {
    let env = Env::builder(tag).start().await;
    let markers = env.markers();
    let cluster_uid = env.create_cluster("prod").await;
    env.create_object::<Tfm>("web-1", "prod", &cluster_uid, &markers)
        .await;
    let ctx = hand_context(&env).await;
    pass(&env, &ctx).await; // the finalizer
    env.apply::<Tfm>("web-1", &module(0), &markers).await;
    (env, ctx)
}

/// The manager's context, for passes run by hand.
pub(crate) async fn hand_context(env: &Env) -> Arc<Context> {
    Arc::new(Context::new(
        env.client.clone(),
        &env.config,
        captf::job::Templates::embedded(),
        Arc::default(),
        discover_cluster(&env.client).await,
    ))
}

/// One reconcile pass on `web-1` as it is now; true when it is gone.
pub(crate) async fn pass(env: &Env, ctx: &Arc<Context>) -> bool {
    match env.object::<Tfm>("web-1").await {
        Some(o) => {
            reconcile(Arc::new(o), ctx.clone(), Lane::Ordinary)
                .await
                .expect("a pass");
            false
        }
        None => true,
    }
}

/// Deletes `web-1` and runs passes until its destroy Job exists, then none while the Job
/// runs (so that no pass cleans up before the test is ready), until the Job completed.
pub(crate) async fn destroy_by_hand(env: &Env, ctx: &Arc<Context>) {
    env.delete::<Tfm>("web-1").await;
    wait_for("the destroy Job, pass by pass", long(), || async {
        !env.destroy_jobs().await.is_empty() || pass(env, ctx).await
    })
    .await;
    wait_for("the destroy Job to complete", long(), || async {
        env.destroy_jobs().await.iter().any(|j| {
            j.status
                .as_ref()
                .and_then(|s| s.conditions.as_ref())
                .is_some_and(|cs| {
                    cs.iter()
                        .any(|c| c.type_ == "Complete" && c.status == "True")
                })
        })
    })
    .await;
}
