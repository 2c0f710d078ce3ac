//! The runner Job: rendering one attempt's Job from the durable inputs and the templates,
//! the runner's RBAC, and reading what became of a Job.

mod backend;
pub mod env;
mod failure;
pub mod layout;
pub mod outcome;
pub mod rbac;
pub mod render;
pub mod report;
pub mod sidecar;
pub mod template;

#[cfg(test)]
mod render_tests;
#[cfg(test)]
mod runner_tests;
#[cfg(test)]
pub(crate) mod testutil;

pub use backend::secret_labels;
pub use env::{RESERVED_ENV, env_refusal};
pub use failure::{
    DESTRUCTIVE_PLAN_MARKER, DestructivePlan, SUMMARY_MAX, cut, error_summary, failure_text,
};
pub use outcome::{
    JobOutcome, RUNNER_NEVER_STARTED, attempt_of, failure_message, finished_at, operation_of,
    outcome, pod_of_job, pod_outcome, pod_terminated, ran_for, reason_text, suspended,
};
pub use rbac::{
    object_runner_account, object_runner_binding, runner_role, runner_role_binding,
    runner_service_account,
};
pub use render::{attempt_secret, render};
pub use template::Templates;

use crate::api::names::{self, Kind};
use crate::inputs::Inputs;

/// The plan guard of an apply (see `templates/runner.sh`): whether the runner plans first
/// and stops before a plan that destroys or replaces resources, and the plan hash an
/// operator approved.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PlanGuard<'a> {
    pub on: bool,
    pub approved: Option<&'a str>,
}

/// What one attempt's Job is rendered from.
#[derive(Clone, Copy, Debug)]
pub struct JobRequest<'a> {
    pub kind: Kind,
    /// The object's name and uid.
    pub name: &'a str,
    pub uid: &'a str,
    pub namespace: &'a str,
    /// The object's state suffix.
    pub suffix: &'a str,
    /// The owning Cluster's name, when the object has one.
    pub cluster_name: Option<&'a str>,
    /// `names::OPERATION_DESTROY` or `names::OPERATION_APPLY`.
    pub operation: &'a str,
    pub attempt: u32,
    pub inputs: &'a Inputs,
    /// An apply's plan guard (off for a destroy).
    pub plan_guard: PlanGuard<'a>,
    /// The ServiceAccount its Pod runs as: the namespace's `captf-runner`, or the object's
    /// own ([`runner_account_name`]).
    pub service_account: &'a str,
    /// The credentials of the `TerraformClusterIdentity` the attempt runs with, as read
    /// at its start (not [`JobRequest::identity`], the object's).
    pub credentials: Option<&'a IdentityEnv>,
}

/// An identity's credentials for one attempt: each key of its Secret an environment
/// variable of the runner, carried by the attempt's Secret (keys `identity.<NAME>`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IdentityEnv {
    /// The `TerraformClusterIdentity`'s name.
    pub name: String,
    pub values: std::collections::BTreeMap<String, k8s_openapi::ByteString>,
}

/// The key of the attempt's Secret holding identity variable `name`.
pub fn identity_key(name: &str) -> String {
    format!("identity.{name}")
}

/// The ServiceAccount the runner Pods of an object of state suffix `suffix` run as: its
/// own when it has one (`own`: its spec's `runner.serviceAccount` or its identity's
/// `serviceAccount` asks for one), else the namespace's.
pub fn runner_account_name(own: bool, suffix: &str) -> String {
    match own {
        true => names::object_runner_name(suffix),
        false => names::RUNNER_NAME.to_string(),
    }
}

impl JobRequest<'_> {
    /// The object the attempt is for.
    pub fn identity(&self) -> crate::api::labels::Identity<'_> {
        crate::api::labels::Identity {
            kind: self.kind,
            namespace: self.namespace,
            name: self.name,
            uid: self.uid,
        }
    }
}

/// Why a Job could not be rendered, or the templates not loaded.
#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
pub enum RenderError {
    #[error("templates: {path}: {message}")]
    Io { path: String, message: String },
    #[error("Job template line {line}: {message}")]
    Template { line: usize, message: String },
    #[error("Job template: the rendered manifest is not a batch/v1 Job: {message}")]
    Yaml { message: String },
    #[error(
        "the runner's script and backend settings (with module.source) take {size} bytes of Pod annotations, more than Kubernetes' limit of {limit}: shorten module.source"
    )]
    TooLarge { size: usize, limit: usize },
    #[error(
        "the attempt's Secret (the module's files, its variables, and an apply's inputs) takes {size} bytes, more than Kubernetes' limit of {limit} for a Secret: give a large module as `module.source` (a pinned source address) instead of inline `module.files`, and large values another way (a data source)"
    )]
    SecretTooLarge { size: usize, limit: usize },
    #[error(
        "the inputs' backend is namespace {namespace:?} / secretSuffix {suffix:?}, not the object's own {expected_namespace:?} / {expected_suffix:?}"
    )]
    ForeignBackend {
        namespace: String,
        suffix: String,
        expected_namespace: String,
        expected_suffix: String,
    },
    #[error("module file name {name:?} is not allowed: {why}")]
    BadFileName { name: String, why: &'static str },
    #[error(
        "the inputs' env entry {name:?} is refused: {why}; remove it from the spec's env (and from the inputs Secret)"
    )]
    ForbiddenEnv { name: String, why: &'static str },
    #[error(
        "TerraformClusterIdentity {identity}: its Secret's key {name:?} is refused as an environment variable: {why}; remove it from the identity's Secret"
    )]
    ForbiddenIdentityEnv {
        identity: String,
        name: String,
        why: &'static str,
    },
}
