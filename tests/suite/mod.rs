//! Integration suites. `harness` starts real daemons; the others test them.

mod agent;
mod agentd;
mod attachments;
mod attack_authority;
mod attack_listeners;
mod attack_patch;
mod attack_sandbox;
mod console;
mod console_sessions;
mod crash;
mod device_login;
mod docs;
mod executor;
mod gatewayd;
pub mod harness;
mod laptop;
mod mcp_tools;
mod oauth;
mod oauth_inspector;
mod outbound;
mod ownership;
mod patch_set;
mod quickstart;
mod rmcp_client;
mod sandbox;
mod systemd;
mod workspaced;
