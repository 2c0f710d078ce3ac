//! Machine pools with the real Cluster API: a MachinePool owns its TerraformMachinePool,
//! and its bootstrap provider rewrites the bootstrap data Secret as it rotates the join
//! token.

use captf::api::names::{self, Kind};
use captf::api::{TerraformCluster as Tfc, TerraformMachinePool as Tfmp};
use k8s_openapi::api::batch::v1::Job;
use kube::api::{Api, ListParams, Patch, PatchParams};
use serde_json::json;

use crate::support::*;

/// A pool module in the shape the module contract asks for: two instances (`vm`, from
/// [`apply_module`], whose create counts itself in `<marker>.applies`), and the instance
/// template that holds the bootstrap data, replaced when the data changes (a new template
/// version), which records each bootstrap data it was given in `<marker>.templates`.
fn rotating_pool_module() -> String {
    apply_module(0)
        + r#"variable "captf_bootstrap_data" {
  type      = string
  sensitive = true
}
resource "terraform_data" "template" {
  triggers_replace = sha256(var.captf_bootstrap_data)
  input            = "${var.marker_dir}/${var.name}"
  provisioner "local-exec" {
    command = "echo '${base64decode(var.captf_bootstrap_data)}' >> '${self.input}.templates'"
  }
}
"#
}

/// The bootstrap data each template of the pool `name` was made from, in order.
fn templates(env: &Env, name: &str) -> Vec<String> {
    std::fs::read_to_string(env.markers().join(format!("{name}.templates")))
        .unwrap_or_default()
        .lines()
        .map(str::to_string)
        .collect()
}

/// The apply Jobs of the pool `name` in the namespace now.
async fn apply_jobs(env: &Env, name: &str) -> Vec<Job> {
    let jobs: Api<Job> = Api::namespaced(env.client.clone(), &env.ns);
    let lp = ListParams::default().labels(&format!(
        "{}={},{}={name},{}={}",
        names::LABEL_OWNER_KIND,
        Kind::TerraformMachinePool.as_str(),
        names::LABEL_OWNER_NAME,
        names::LABEL_OPERATION,
        names::OPERATION_APPLY
    ));
    jobs.list(&lp).await.expect("jobs").items
}

/// The kubeadm bootstrap provider rotates a MachinePool's join token before it expires
/// and rewrites the bootstrap data Secret each time. Each rotation reaches the pool's
/// instance template by one apply, started by the Secret's change (not at the next
/// resync, ten minutes on: the token would have expired), the running instances are
/// never replaced, and the finished apply Jobs kept stay at three.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_rotated_bootstrap_token_reaches_the_pools_template_and_leaves_its_instances() {
    if envtest_only("it reads the files Terraform leaves on this machine") {
        return;
    }
    let env = Env::builder("rotation").provisioning().start().await;
    env.create_cluster("prod").await;
    env.provision::<Tfc>("prod", "prod", &apply_module(0)).await;
    env.mark_cluster_ready("prod").await;
    env.provision::<Tfmp>("pool", "prod", &rotating_pool_module())
        .await;
    assert_eq!(templates(&env, "pool"), ["#cloud-config pool"]);
    let before = env.jobs_created();

    let rotations = 5;
    for i in 1..=rotations {
        let data = format!("#cloud-config pool token-{i}");
        env.secrets()
            .patch(
                "pool-bootstrap",
                &PatchParams::default(),
                &Patch::Merge(json!({"stringData": {"value": data}})),
            )
            .await
            .expect("rotate the bootstrap data");
        wait_for(
            &format!("rotation {i} in the pool's template"),
            long(),
            || async { templates(&env, "pool").last() == Some(&data) },
        )
        .await;
        // The rotation's apply is recorded before the next one.
        wait_for(
            &format!("rotation {i}'s apply to be recorded"),
            long(),
            || async {
                let jobs = apply_jobs(&env, "pool").await;
                !jobs.is_empty() && jobs.iter().all(job_finished)
            },
        )
        .await;
    }
    assert_eq!(
        env.jobs_created() - before,
        rotations,
        "one apply per rotation"
    );
    for i in 0..2 {
        let applies = std::fs::read_to_string(env.markers().join(format!("pool-{i}.applies")))
            .expect("the instance's applies");
        assert_eq!(
            applies.trim(),
            "1",
            "instance {i} was created once, never replaced"
        );
    }
    wait_for(
        "the finished apply Jobs to be pruned to three",
        long(),
        || async { apply_jobs(&env, "pool").await.len() <= 3 },
    )
    .await;
    let secrets = env
        .secrets()
        .list(&ListParams::default().labels(&format!(
            "{}={}",
            names::LABEL_OPERATION,
            names::OPERATION_APPLY
        )))
        .await
        .expect("secrets");
    let of_pool = secrets
        .items
        .iter()
        .filter(|s| {
            s.metadata
                .labels
                .as_ref()
                .and_then(|l| l.get(names::LABEL_OWNER_NAME))
                .is_some_and(|n| n == "pool")
        })
        .count();
    assert!(of_pool <= 3, "{of_pool} apply Secrets of the pool are kept");
    env.shutdown().await;
}

/// Whether a Job has finished (`Complete` or `Failed`).
fn job_finished(job: &Job) -> bool {
    job.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| {
            cs.iter()
                .any(|c| (c.type_ == "Complete" || c.type_ == "Failed") && c.status == "True")
        })
}
