//! CAPTF: a Cluster API infrastructure provider whose infrastructure is whatever a
//! Terraform module creates. The deletion side: the rule table, state reading, the destroy
//! Job, and the controllers that tie them together; the apply side as it is built: the
//! apply table (`rules::apply`) and the module contract (`contract`).

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
pub mod rules;
pub mod state;
pub mod telemetry;
#[cfg(test)]
mod testing;
