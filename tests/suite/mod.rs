//! Integration suites. `harness` starts real daemons; the others test them.

mod agentd;
mod crash;
mod executor;
mod gatewayd;
pub mod harness;
mod ownership;
mod quickstart;
mod sandbox;
mod systemd;
mod workspaced;
