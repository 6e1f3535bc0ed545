//! `agentworksctl`, the operator CLI: what it does beyond parsing flags.
//!
//! - [`cli`]: its command line; [`app`]: each parsed command run and its answer printed.
//! - [`admin`]: agentd's operator endpoints; [`quickstart`]: start the daemons that exist on a
//!   private state root; [`status`]: each daemon's health.
//! - [`deployment`]: which daemons a command administers (the given configuration, the
//!   system install, or a running quickstart of this user) and the record quickstarts leave.
//!
//! It talks to the daemons only through their sockets, found through the same config and
//! `AGENTWORKS_STATE_ROOT` as the daemons use (or a running quickstart's record); it never
//! opens a daemon's state directory.

pub mod admin;
pub mod app;
pub mod cli;
pub mod deployment;
pub mod quickstart;

use agentworks_daemon::config::Config;
use agentworks_support::unix_http::UnixClient;
use serde::Serialize;

/// One daemon's health as `status` reports it.
#[derive(Debug, Clone, Serialize)]
pub struct DaemonStatus {
    pub daemon: String,
    pub socket: String,
    pub healthy: bool,
    pub detail: String,
}

/// Ask every daemon that exists for its health.
pub async fn status(config: &Config) -> Vec<DaemonStatus> {
    let mut report = Vec::new();
    for (daemon, socket) in [
        ("agentworks-workspaced", config.workspaced_socket()),
        ("agentworks-agentd", config.agentd_socket()),
        ("agentworks-gatewayd", config.gatewayd_socket()),
    ] {
        let answer: Result<serde_json::Value, _> = UnixClient::new(&socket).get("/v1/health").await;
        report.push(DaemonStatus {
            daemon: daemon.into(),
            socket: socket.display().to_string(),
            healthy: answer.is_ok(),
            detail: match answer {
                Ok(v) => format!(
                    "{} {}",
                    v["status"].as_str().unwrap_or("?"),
                    v["version"].as_str().unwrap_or("")
                ),
                Err(e) => e.to_string(),
            },
        });
    }
    report
}
