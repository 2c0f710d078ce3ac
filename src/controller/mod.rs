//! `captf manager`: one controller per kind, all running the same generic reconcile.
//! Each watches its kind, its Jobs and Pods (by owner labels: Jobs carry no
//! ownerReference), the metadata of its Secrets, the owning Clusters, its CRD; for
//! TerraformClusters the machines and pools; for machines and pools their Machines or
//! MachinePools and the bootstrap data Secrets those name.
//!
//! A pass ([`reconcile::reconcile`]) observes ([`observe`]), decides with the rule table,
//! records what Jobs did ([`bookkeeping`]), writes the status ([`status`]) and dispatches
//! to one action ([`act`]); on a live object the apply side ([`apply_pass`]) observes what
//! the apply table needs beside that ([`source`]), decides it, and writes the status of
//! both tables once. The files around it: the manager's run ([`manager`]), each
//! kind's watches and caches ([`wiring`]), what follows a failed pass ([`retry`]), what
//! passes share ([`context`]), the fair pass limit ([`gate`]), what triggers a pass
//! ([`triggers`]), the Events ([`events`]); the guarded writes are [`crate::io::writes`].
//! This file is the module's face only.

pub mod act;
pub mod apply_pass;
pub mod bookkeeping;
pub mod caches;
pub mod context;
pub mod disposal;
pub mod events;
mod gate;
pub mod leader;
pub mod leftovers;
mod manager;
pub mod metrics_auth;
pub mod observe;
pub mod preview;
pub mod rbac;
pub mod reconcile;
mod retry;
pub mod scope;
pub mod server;
pub mod source;
pub mod status;
mod triggers;
mod wiring;
pub mod workload;

pub use crate::io::Error;
pub use caches::Caches;
pub use context::{
    ClusterKind, Context, ManagerConfig, Released, discover_cluster, owner_resource,
};
pub use manager::run;
pub use scope::Scope;
