//! The one integration-test binary (each test binary links kube again, so there is one).
//! Modules read like the situations they prove.

mod cli;
mod config;
mod crds;
mod deletion;
mod manager;
mod runbooks;
mod support;
mod testserver_smoke;
mod uninstall;
