//! `agentworks-agentd`: identity, the public MCP endpoint and the operator socket.
//!
//! Thin on purpose: parse flags, drop every capability, load the config, take the listeners
//! (socket activation or bind), then `agentworks_agent::run`. Exit codes: 0 after a clean
//! shutdown, 1 when it could not start, 2 for a bad command line or config.

use agentworks_agent as agent;
use agentworks_agent::cli::Args;
use agentworks_daemon::{config::Config, entry, listener, shutdown, systemd};
use anyhow::Context;
use clap::Parser;
use std::process::ExitCode;

fn main() -> ExitCode {
    let args = Args::parse();
    // agentd needs no capability at all.
    entry::main(
        "agentworks-agentd",
        &[],
        args.config.as_deref(),
        |config, _| run(config),
    )
}

async fn run(config: Config) -> anyhow::Result<()> {
    let shutdown = shutdown::on_signals();
    let socket_path = config.agentd_socket();
    let (socket, socket_origin) = listener::unix_listener("agentd.sock", &socket_path)
        .with_context(|| format!("cannot listen on {}", socket_path.display()))?;
    let (public, public_origin) = listener::tcp_listener("agentd-http", config.agentd.listen)
        .with_context(|| format!("cannot listen on {}", config.agentd.listen))?;
    let identity = agent::open_identity(&config).context("cannot open the identity store")?;
    let address = public.local_addr().ok();
    tracing::info!(
        socket = %socket_path.display(),
        socket_activated = socket_origin == listener::ListenerOrigin::Activated,
        public = ?address,
        public_activated = public_origin == listener::ListenerOrigin::Activated,
        public_url = %config.agentd.public_url(),
        workspaced = %config.workspaced_socket().display(),
        "agentd ready"
    );
    systemd::notify_ready("serving /mcp and agentd.sock");
    systemd::spawn_watchdog(shutdown.clone());
    agent::run(&config, identity, public, socket, shutdown).await;
    tracing::info!("agentd stopped");
    Ok(())
}
