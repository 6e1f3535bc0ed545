//! `agentworks-workspaced`: the only writer of the documents tree.
//!
//! Thin on purpose: parse flags, drop capabilities, load the config, then hand the socket to
//! `agentworks_workspace::server::run`. Exit codes: 0 after a clean shutdown, 1 when the
//! daemon could not start or failed while running, 2 for a bad command line or config.

use agentworks_daemon::ipc::server::{PeerPolicy, ServerLimits};
use agentworks_daemon::{config::Config, entry, listener, shutdown, systemd};
use agentworks_workspace::cli::Args;
use agentworks_workspace::ops::{Limits, Workspace};
use agentworks_workspace::server;
use anyhow::Context;
use clap::Parser;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

fn main() -> ExitCode {
    let args = Args::parse();
    // CAP_CHOWN and CAP_FOWNER are kept only if an operator granted them (to keep owners
    // exactly); everything else is dropped.
    entry::main(
        "agentworks-workspaced",
        &[
            ::caps::Capability::CAP_CHOWN,
            ::caps::Capability::CAP_FOWNER,
        ],
        args.config.as_deref(),
        run,
    )
}

async fn run(config: Config, kept: Vec<::caps::Capability>) -> anyhow::Result<()> {
    let shutdown = shutdown::on_signals();
    let socket_path = config.workspaced_socket();
    // The socket first, so callers queue in its backlog while we recover instead of failing.
    let (listener, origin) = listener::unix_listener("workspaced.sock", &socket_path)
        .with_context(|| format!("cannot listen on {}", socket_path.display()))?;
    let limits = Limits {
        max_file_bytes: config.workspaced.max_file_bytes,
        lock_timeout: Duration::from_millis(config.workspaced.lock_timeout_ms),
        search_max_results: config.workspaced.search_max_results,
    };
    let workspace = Workspace::open(&config.documents_root, config.layout(), limits)
        .context("cannot open the documents tree")?;
    let workspace = Arc::new(workspace);
    let recovering = workspace.clone();
    let report = tokio::task::spawn_blocking(move || recovering.recover())
        .await
        .context("recovery did not finish")?
        .context("cannot reconcile receipts at start")?;
    tracing::info!(
        socket = %socket_path.display(),
        socket_activated = origin == listener::ListenerOrigin::Activated,
        documents_root = %workspace.documents_root().display(),
        capabilities = ?kept,
        temp_files_removed = report.temp_files_removed,
        reconciled_applied = report.applied,
        reconciled_not_applied = report.not_applied,
        reconciled_uncertain = report.uncertain,
        "workspaced ready"
    );
    systemd::notify_ready("serving workspaced.sock");
    systemd::spawn_watchdog(shutdown.clone());
    let policy = PeerPolicy::for_users(&config.workspaced.allowed_users);
    let server_limits = ServerLimits {
        max_connections: 256,
        max_body_bytes: server::max_body_bytes(config.workspaced.max_file_bytes),
    };
    server::run(listener, workspace, policy, server_limits, shutdown).await;
    tracing::info!("workspaced stopped");
    Ok(())
}
