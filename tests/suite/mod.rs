//! Integration suites. `harness` starts real daemons; the others test them.

mod agentd;
mod crash;
pub mod harness;
mod ownership;
mod quickstart;
mod systemd;
mod workspaced;
