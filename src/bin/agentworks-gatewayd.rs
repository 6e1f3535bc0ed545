//! `agentworks-gatewayd`: connected laptops. The executor WebSocket (public) and the dispatch
//! socket (`gatewayd.sock`, for agentd).
//!
//! Thin on purpose: parse flags, drop every capability, load the config, take the listeners
//! (socket activation or bind), open the store, then `agentworks_gateway::run`. Exit codes: 0
//! after a clean shutdown, 1 when it could not start, 2 for a bad command line or config.

use agentworks_daemon::{config::Config, entry, listener, shutdown, systemd};
use agentworks_gateway as gateway;
use agentworks_gateway::cli::Args;
use anyhow::Context;
use clap::Parser;
use std::process::ExitCode;

fn main() -> ExitCode {
    let args = Args::parse();
    // gatewayd needs no capability at all.
    entry::main(
        "agentworks-gatewayd",
        &[],
        args.config.as_deref(),
        |config, _| run(config),
    )
}

async fn run(config: Config) -> anyhow::Result<()> {
    let shutdown = shutdown::on_signals();
    let socket_path = config.gatewayd_socket();
    let (public, public_origin) = listener::tcp_listener("gatewayd-ws", config.gatewayd.listen)
        .with_context(|| format!("cannot listen on {}", config.gatewayd.listen))?;
    let (socket, socket_origin) = listener::unix_listener("gatewayd.sock", &socket_path)
        .with_context(|| format!("cannot listen on {}", socket_path.display()))?;
    let store = gateway::open_store(&config).context("cannot open the gateway store")?;
    tracing::info!(
        socket = %socket_path.display(),
        socket_activated = socket_origin == listener::ListenerOrigin::Activated,
        public = ?public.local_addr().ok(),
        public_activated = public_origin == listener::ListenerOrigin::Activated,
        public_url = %config.gatewayd.public_url(),
        agentd = %config.agentd_socket().display(),
        "gatewayd ready"
    );
    systemd::notify_ready("serving /v1/executor and gatewayd.sock");
    systemd::spawn_watchdog(shutdown.clone());
    gateway::run(&config, store, public, socket, shutdown).await;
    tracing::info!("gatewayd stopped");
    Ok(())
}
