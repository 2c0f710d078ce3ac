//! Where things are in the runner's Pod: the directories, volumes and files the Job, the
//! runner script and the renderer agree on, and the limits on what is rendered.

/// Kubernetes' limit on the total size of an object's annotations (keys and values).
pub const ANNOTATIONS_MAX_BYTES: usize = 256 * 1024;
/// Kubernetes' limit of a Secret's data (`MaxSecretSize`).
pub const SECRET_MAX_BYTES: usize = 1024 * 1024;
/// Where the rendered files are mounted (read-only).
pub const RENDER_DIR: &str = "/captf/render";
/// The emptyDir holding HOME, TF_DATA_DIR, TMPDIR and the working copy.
pub const WORKSPACE_DIR: &str = "/workspace";
pub const RENDER_VOLUME: &str = "captf-render";
pub const WORKSPACE_VOLUME: &str = "captf-workspace";
/// The runner container's name (the template's container of that name, else its first).
pub const CONTAINER_NAME: &str = "terraform";
/// The non-root user and group the runner runs as.
pub const RUNNER_UID: i64 = 65532;
/// `terminationGracePeriodSeconds` when the template sets none, and the floor under the
/// template's value: Terraform needs time to write its state when interrupted.
pub const DEFAULT_GRACE_SECONDS: i64 = 300;
pub const MIN_GRACE_SECONDS: i64 = 120;
pub const TERMINATION_MESSAGE_PATH: &str = "/dev/termination-log";

/// Files under the render directory.
pub const FILE_RUNNER: &str = "runner.sh";
pub const FILE_BACKEND: &str = "backend.hcl";
pub const FILE_VARIABLES: &str = "terraform.tfvars.json";
/// The module contract's variables, copied into the module's directory, where Terraform
/// reads a `*.auto.tfvars.json` file by itself (`contract::TFVARS_FILE`).
pub const FILE_CONTRACT: &str = "captf.auto.tfvars.json";
pub const FILE_ERRORED_BACKEND: &str = "errored-backend.hcl";
pub const FILE_LOCK: &str = "terraform.lock.hcl";
pub const FILE_MODULE_SOURCE: &str = "module-source";
/// The module's directory in the runner image (`module.path`).
pub const FILE_MODULE_PATH: &str = "module-path";
pub const DIR_MODULE: &str = "module";
/// The modules the apply's `init` installed (`ran.installedModules`), put back under the
/// data directory's `modules/` before `init`.
pub const DIR_INSTALLED_MODULES: &str = "installed-modules";
