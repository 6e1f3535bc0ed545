//! `agentworksctl`, the operator CLI: what it does beyond parsing flags.
//!
//! - [`cli`]: its command line; [`app`]: each parsed command run and its answer printed.
//! - [`admin`]: agentd's operator endpoints; [`quickstart`]: start the daemons that exist on a
//!   private state root; [`status`]: each daemon's health (and runnerd's providers).
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

use agentworks_contract::runnerd::{ProviderInfo, ProvidersAnswer};
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
    /// runnerd's providers as it answers them (each with its executable, or why it is
    /// unavailable); absent for the other daemons and when runnerd does not answer.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub providers: Option<Vec<ProviderInfo>>,
}

/// The daemon whose status lists providers.
pub const RUNNERD: &str = "agentworks-runnerd";

/// Ask every daemon that exists for its health, and runnerd for its providers.
pub async fn status(config: &Config) -> Vec<DaemonStatus> {
    let mut report = Vec::new();
    for (daemon, socket) in [
        ("agentworks-workspaced", config.workspaced_socket()),
        ("agentworks-agentd", config.agentd_socket()),
        ("agentworks-gatewayd", config.gatewayd_socket()),
        (RUNNERD, config.runnerd_socket()),
    ] {
        let client = UnixClient::new(&socket);
        let answer: Result<serde_json::Value, _> = client.get("/v1/health").await;
        let mut providers = None;
        let mut detail = match &answer {
            Ok(v) => format!(
                "{} {}",
                v["status"].as_str().unwrap_or("?"),
                v["version"].as_str().unwrap_or("")
            ),
            Err(e) => e.to_string(),
        };
        if daemon == RUNNERD && answer.is_ok() {
            match client.get::<ProvidersAnswer>("/v1/providers").await {
                Ok(listed) => providers = Some(listed.providers),
                Err(e) => detail.push_str(&format!("; its providers are unknown: {e}")),
            }
        }
        report.push(DaemonStatus {
            daemon: daemon.into(),
            socket: socket.display().to_string(),
            healthy: answer.is_ok(),
            detail,
            providers,
        });
    }
    report
}

/// One provider on one line, for people: `NAME (driver D, model M): EXECUTABLE`, or
/// `…: UNAVAILABLE, WHY` when runnerd found no executable.
pub fn provider_line(provider: &ProviderInfo) -> String {
    let runs = match (&provider.executable, &provider.unavailable) {
        (_, Some(why)) => format!("UNAVAILABLE, {why}"),
        (Some(executable), None) => executable.clone(),
        (None, None) => "no executable reported".to_owned(),
    };
    format!(
        "{} (driver {}, model {}): {runs}",
        provider.name, provider.driver, provider.model
    )
}
