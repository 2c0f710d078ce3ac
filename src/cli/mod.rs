//! The `captf` command line (SPEC section 9). Misuse (bad flags, unreadable or malformed
//! files, unknown kinds) exits with status 2 and a message naming the file and object;
//! a verdict, whatever it is, exits 0.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand, ValueEnum};
use jiff::Timestamp;

use crate::explain::{self, inventory::Inventory, load};
use crate::gather::Settings;
use crate::rules::Backoff;

mod run;

pub use run::{SHUTDOWN_GRACE, crds_yaml, main};

#[derive(Parser, Debug)]
#[command(
    name = "captf",
    version,
    about = "CAPTF: Cluster API infrastructure made and destroyed by Terraform modules"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Run the controllers for the three kinds.
    Manager(ManagerArgs),
    /// Print the six CustomResourceDefinitions (the three kinds and their templates) as
    /// YAML.
    Crds,
    /// Show, for each CAPTF object, the rule that decides its next deletion pass.
    Explain(ExplainArgs),
    /// Work with Terraform state Secrets.
    #[command(subcommand)]
    State(StateCommand),
    /// List the Secrets CAPTF wrote for objects that are gone (state, inputs, backup,
    /// errored states, abandoned copies).
    Orphans(OrphansArgs),
    /// Work with Terraform modules.
    #[command(subcommand)]
    Module(ModuleCommand),
    /// Write a release's assets for clusterctl into DIR: infrastructure-components.yaml
    /// (with clusterctl variables), metadata.yaml, the cluster templates and the
    /// ClusterClass.
    ReleaseAssets(ReleaseAssetsArgs),
    /// Print a shell completion script for captf (source it from your shell's profile).
    Completions(CompletionsArgs),
    /// Run beside Terraform in a runner Pod (manager flag --state-proxy): pass on
    /// to the API server, with the Pod's token, only the requests for one object's state
    /// Secrets and lock Lease.
    StateProxy(StateProxyArgs),
}

#[derive(Args, Debug)]
pub struct StateProxyArgs {
    /// The object's namespace (the backend's).
    #[arg(long)]
    pub namespace: String,
    /// The object's backend suffix (the state Secret is tfstate-default-SUFFIX).
    #[arg(long)]
    pub suffix: String,
    /// Where to write the port it listens on (127.0.0.1), for the runner to read.
    #[arg(long)]
    pub port_file: PathBuf,
}

#[derive(Args, Debug)]
pub struct CompletionsArgs {
    /// The shell to complete in.
    pub shell: clap_complete::Shell,
}

/// The name the binary is run by, as its usage shows it: `kubectl captf` when kubectl runs
/// it as a plugin (a file named `kubectl-captf` on the PATH), else `captf`.
fn bin_name(argv0: Option<&std::ffi::OsStr>) -> &'static str {
    let file = argv0
        .map(std::path::Path::new)
        .and_then(|p| p.file_name())
        .and_then(|f| f.to_str())
        .unwrap_or("captf");
    if file.starts_with("kubectl-") {
        "kubectl captf"
    } else {
        "captf"
    }
}

#[derive(Args, Debug)]
pub struct ReleaseAssetsArgs {
    /// The release's version: v and a semantic version (v0.1.0), of a release series in
    /// metadata.yaml.
    #[arg(long)]
    pub version: String,
    /// The manager image, canonical (ghcr.io/captf/captf:v0.1.0): the default of the
    /// clusterctl variable CAPTF_IMAGE.
    #[arg(long)]
    pub image: String,
    /// The directory to write the assets into (made if absent).
    pub dir: PathBuf,
}

#[derive(Subcommand, Debug)]
pub enum ModuleCommand {
    /// Read a module offline and report what module contract v1 needs of it for a role:
    /// the contract variables it declares, the outputs it must have, and what would make
    /// its destroy fail. Exit status 1 when it has errors.
    Check(ModuleCheckArgs),
}

#[derive(Args, Debug)]
pub struct ModuleCheckArgs {
    /// The module's directory (its .tf files are read; subdirectories are not).
    pub dir: PathBuf,
    /// What the module makes.
    #[arg(long, value_enum)]
    pub role: crate::contract::Role,
    /// Output format.
    #[arg(short = 'o', long = "output", value_enum, default_value = "text")]
    pub output: Output,
}

#[derive(Args, Debug)]
pub struct OrphansArgs {
    /// Look in one namespace (all by default).
    #[arg(short = 'n', long)]
    pub namespace: Option<String>,
    /// The manager's namespace, where an abandon in a terminating namespace leaves its
    /// copies (looked at with -n).
    #[arg(long, env = "POD_NAMESPACE", default_value = "captf-system")]
    pub manager_namespace: String,
    /// Output format.
    #[arg(short = 'o', long = "output", value_enum, default_value = "text")]
    pub output: Output,
}

#[derive(Args, Debug)]
#[command(group = clap::ArgGroup::new("source").required(true).multiple(false).args(["from_backup", "from_file", "from_errored"]))]
pub struct RestoreArgs {
    /// The object whose state to restore, as KIND/NAME (e.g. terraformmachine/web-1).
    pub target: String,
    /// The object's namespace (the kubeconfig's namespace by default).
    #[arg(short = 'n', long)]
    pub namespace: Option<String>,
    /// Restore from the backup Secret taken before the first destroy attempt.
    #[arg(long)]
    pub from_backup: bool,
    /// Restore from a state file (JSON as `terraform state pull` prints it, or gzip).
    #[arg(long)]
    pub from_file: Option<PathBuf>,
    /// Restore from an errored state a runner kept (what Terraform could not save), by
    /// the name of its Secret (`tfstate-errored-…`, or an older `captf-errored-…`).
    #[arg(long, value_name = "SECRET")]
    pub from_errored: Option<String>,
    /// Overwrite a state that is readable.
    #[arg(long)]
    pub force: bool,
}

#[derive(Args, Debug)]
pub struct ManagerArgs {
    /// Watch one namespace (all by default).
    #[arg(long)]
    pub namespace: Option<String>,
    /// Only objects whose cluster.x-k8s.io/watch-filter label has this value.
    #[arg(long)]
    pub watch_filter: Option<String>,
    /// Parallel reconciles per kind, in the order they were triggered (and as many again
    /// for the reconciles that follow a finished Job).
    #[arg(long, default_value_t = 10)]
    pub concurrency: u16,
    /// Base of the destroy retry backoff.
    #[arg(long, default_value = "30s", value_parser = parse_duration)]
    pub destroy_backoff_base: std::time::Duration,
    /// Cap of the destroy retry backoff.
    #[arg(long, default_value = "30m", value_parser = parse_duration)]
    pub destroy_backoff_max: std::time::Duration,
    /// A directory with job.yaml and runner.sh replacing the embedded templates.
    #[arg(long)]
    pub templates_dir: Option<PathBuf>,
    /// Put the state proxy beside Terraform in every runner Pod: the proxy alone holds
    /// the Pod's token and passes on only the object's state Secrets and lock Lease, so a
    /// module's code has no credentials for the API server (docs/tenancy.md). Needs
    /// Kubernetes 1.29 or later (native sidecars).
    #[arg(long, default_value_t = false, action = clap::ArgAction::Set)]
    pub state_proxy: bool,
    /// The state proxy's image (CAPTF's, whose entrypoint is captf); empty: the manager's
    /// own, read from its Pod (POD_NAMESPACE, POD_NAME) when it starts.
    #[arg(long, default_value = "")]
    pub state_proxy_image: String,
    /// Elect a leader on a Lease so that several replicas are safe.
    #[arg(long)]
    pub leader_elect: bool,
    /// Where /metrics is served (e.g. 0.0.0.0:8443); off when empty.
    #[arg(long, default_value = "0.0.0.0:8443")]
    pub metrics_bind_address: String,
    /// Serve /metrics over HTTPS to callers the API server authenticates (TokenReview) and
    /// allows `get` on the non-resource URL /metrics (SubjectAccessReview); with
    /// `--metrics-secure=false`, over plain HTTP to anyone who reaches the port.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    pub metrics_secure: bool,
    /// A directory with `tls.crt` and `tls.key` for the secure metrics port (a
    /// cert-manager Secret mounted there); a self-signed certificate is made when absent.
    #[arg(long)]
    pub metrics_cert_dir: Option<PathBuf>,
    /// Where /healthz and /readyz are served; off when empty.
    #[arg(long, default_value = "0.0.0.0:8081")]
    pub health_probe_bind_address: String,
    /// The manager's own namespace (leader Lease, abandoned copies); from POD_NAMESPACE.
    #[arg(long, env = "POD_NAMESPACE", default_value = "captf-system")]
    pub manager_namespace: String,
    /// How often runner RBAC is swept from namespaces without CAPTF objects.
    #[arg(long, default_value = "5m", value_parser = parse_duration)]
    pub rbac_sweep_interval: std::time::Duration,
    /// How many passes may hold an object's state in memory at once (the others wait;
    /// one is kept for the pass after a Job, which cleans up or records a failure): the
    /// manager's memory grows with this times the largest state, not with the number of
    /// objects.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u16).range(1..))]
    pub max_state_reads: u16,
    /// How long a pass may wait for a state-read permit before /healthz fails: a read
    /// takes seconds, so a wait this long means the manager is stuck (and a restart by
    /// the kubelet frees it).
    #[arg(long, default_value = "10m", value_parser = parse_duration)]
    pub state_read_starved_after: std::time::Duration,
    /// How long a controller that has objects may go without finishing a pass, or one
    /// pass may run, before /healthz fails: every object is looked at again at least
    /// every 10 minutes, so three times that means the controller is stuck.
    #[arg(long, default_value = "30m", value_parser = parse_duration)]
    pub stalled_after: std::time::Duration,
    /// Serve one `captf_object_info` series per object (namespace, name, Cluster, phase)
    /// on /metrics: off by default, as its labels grow with the fleet.
    #[arg(long)]
    pub metrics_object_info: bool,
    /// Apply live objects' modules (`--provision=false`: only delete what someone else
    /// applied).
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    pub provision: bool,
    /// How long a Cluster marked for disposal without a retention of its own
    /// (`terraform.infrastructure.cluster.x-k8s.io/dispose-after: ""`) waits before CAPTF
    /// deletes it.
    #[arg(long, default_value = "72h", value_parser = parse_duration)]
    pub disposal_retention: std::time::Duration,
    /// Clean up each Cluster's workload cluster (webhooks, extended APIs, workloads,
    /// Services, PersistentVolumeClaims, snapshots) before its infrastructure is destroyed,
    /// unless the Cluster says otherwise (`terraform.infrastructure.cluster.x-k8s.io/workload-cleanup`).
    #[arg(long, default_value_t = false, action = clap::ArgAction::Set)]
    pub workload_cleanup: bool,
    /// How long a workload cleanup may fail (the workload cluster unreachable, its
    /// requests refused) before it gives up and lets the Machines' infrastructure go.
    #[arg(long, default_value = "10m", value_parser = parse_duration)]
    pub workload_cleanup_give_up_after: std::time::Duration,
}

#[derive(Clone, Copy, Debug, ValueEnum, PartialEq, Eq)]
pub enum Output {
    Text,
    Json,
}

#[derive(Args, Debug)]
pub struct ExplainArgs {
    /// Files or directories of objects as `kubectl get -o yaml|json` writes them.
    /// Without it, the objects are read from the cluster of the current kubeconfig.
    #[arg(short = 'f', long = "filename")]
    pub files: Vec<PathBuf>,
    /// With the cluster: one namespace (all by default).
    #[arg(short = 'n', long)]
    pub namespace: Option<String>,
    /// Output format.
    #[arg(short = 'o', long = "output", value_enum, default_value = "text")]
    pub output: Output,
    /// The time to decide at (RFC 3339); now by default. Makes retry times reproducible.
    #[arg(long)]
    pub now: Option<Timestamp>,
    /// Base of the destroy retry backoff, as the manager's flag.
    #[arg(long, default_value = "30s", value_parser = parse_duration)]
    pub destroy_backoff_base: std::time::Duration,
    /// Cap of the destroy retry backoff, as the manager's flag.
    #[arg(long, default_value = "30m", value_parser = parse_duration)]
    pub destroy_backoff_max: std::time::Duration,
    /// For each object, what its deletion would reach if it were asked now (the row, the
    /// action and the DeletionReady condition), instead of its next pass.
    #[arg(long)]
    pub if_deleted: bool,
    /// Only the objects of this Cluster API Cluster: its TerraformCluster and the
    /// machines and pools that carry its name (with -n, in that namespace).
    #[arg(long)]
    pub cluster: Option<String>,
}

#[derive(Subcommand, Debug)]
pub enum StateCommand {
    /// The readability verdict of one state (its Secret and part Secrets).
    Inspect(InspectArgs),
    /// Write a state back in Terraform's format (parts included).
    Restore(RestoreArgs),
}

#[derive(Args, Debug)]
pub struct InspectArgs {
    /// The state Secret and its part Secrets (YAML or JSON, single objects or a List).
    #[arg(long = "secret-file", required = true)]
    pub secret_files: Vec<PathBuf>,
    /// The object whose state this is: its fingerprint annotations are checked.
    #[arg(long = "object")]
    pub object: Option<PathBuf>,
    /// Output format.
    #[arg(short = 'o', long = "output", value_enum, default_value = "text")]
    pub output: Output,
}

/// Parses a duration with jiff (`30s`, `5m`, `1h30m`, `250ms`, ISO 8601 `PT30S`), or plain seconds.
pub fn parse_duration(text: &str) -> Result<std::time::Duration, String> {
    let text = text.trim();
    // A bare number is seconds, as before durations were jiff's.
    if !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit()) {
        return text
            .parse()
            .map(std::time::Duration::from_secs)
            .map_err(|e| format!("{text:?}: {e}"));
    }
    let d: jiff::SignedDuration = text.parse().map_err(|e| {
        format!("{text:?} is not a duration like 30s, 5m, 1h30m, 250ms or PT30S: {e}")
    })?;
    std::time::Duration::try_from(d).map_err(|_| format!("{text:?} is negative"))
}

/// A failure of the command itself: printed on stderr, exit status 2.
#[derive(Debug)]
pub struct Misuse(pub String);

impl<E: std::error::Error> From<E> for Misuse {
    fn from(e: E) -> Self {
        Misuse(e.to_string())
    }
}

#[cfg(test)]
mod tests;
