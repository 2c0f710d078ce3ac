//! The one integration-test binary (each test binary links kube again, so there is one).
//! Modules read like the situations they prove.

mod alerts;
mod apply_safety;
mod cli;
mod cluster_api;
mod clusterctl;
mod config;
mod control_plane;
mod crds;
mod deletion;
mod disposal;
mod docs;
mod identity;
mod jobs;
mod kube_state_metrics;
mod local_images;
mod machine_deployments;
mod machine_pools;
mod manager;
mod manager_pod;
mod manager_stop;
mod preview;
mod protection;
mod provisioning;
mod runbooks;
mod scripts;
mod state_safety;
mod steps;
mod templates;
mod uninstall;
mod watching;
mod workload_cleanup;

use captf_test_support as support;
