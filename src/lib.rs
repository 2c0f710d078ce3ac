//! CAPTF: a Cluster API infrastructure provider whose infrastructure is whatever a
//! Terraform module creates, applied and destroyed by Terraform in Kubernetes Jobs. Two
//! pure tables decide (`rules`: the deletion; `rules::apply`: the apply), from what
//! `gather` makes of one observation; the controllers (`controller`) observe, decide, write
//! the status once and run one action; `captf explain` runs the same observation and
//! decision on the live cluster or on files.

pub mod api;
pub mod cli;
pub mod contract;
pub mod controller;
pub mod explain;
pub mod gather;
pub mod inputs;
pub mod io;
pub mod job;
pub mod metrics;
pub mod ops;
pub mod proxy;
pub mod rules;
pub mod state;
pub mod telemetry;
#[cfg(test)]
mod testing;
