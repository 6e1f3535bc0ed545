//! Integration suites. `harness` starts real daemons; the others test them.

mod agent;
mod agentd;
mod attack_authority;
mod attack_listeners;
mod attack_patch;
mod attack_sandbox;
mod crash;
mod docs;
mod executor;
mod gatewayd;
pub mod harness;
mod laptop;
mod ownership;
mod patch_set;
mod quickstart;
mod sandbox;
mod systemd;
mod workspaced;
