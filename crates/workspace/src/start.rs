//! workspaced's start and life as a daemon: which capabilities it keeps, then (in this order)
//! the socket, the documents tree, recovery, READY, serving until shutdown.
//!
//! It owns the decision about privilege: workspaced keeps CAP_CHOWN and CAP_FOWNER, and only
//! if an operator granted them; every other capability is dropped by
//! `agentworks_daemon::entry` before any thread exists. What that means for ownership is
//! [`crate::acl::carry_over`]'s: with both, a replacement goes back to its former owner; with
//! neither, the service owns it and names the former owner in an ACL entry; with CAP_CHOWN
//! alone a replacement of someone else's file is refused (only the owner or CAP_FOWNER may then
//! set its ACL and mode).
//!
//! It must never announce READY before the socket is bound and recovery has finished.

use crate::error::WorkspaceError;
use crate::ops::{Limits, Workspace};
use crate::server;
use agentworks_daemon::config::Config;
use agentworks_daemon::ipc::server::{PeerPolicy, ServerLimits};
use agentworks_daemon::listener::{self, ListenFailed};
use agentworks_daemon::{shutdown, systemd};
use caps::Capability;
use std::sync::Arc;
use std::time::Duration;

/// The capabilities workspaced keeps if it holds them: CAP_CHOWN and CAP_FOWNER, to keep
/// owners exactly. Everything else is dropped.
pub const KEPT_CAPABILITIES: &[Capability] = &[Capability::CAP_CHOWN, Capability::CAP_FOWNER];

/// Why workspaced could not start. The message is the step that failed; its cause is the
/// source (printed after it, as a chain, by the binary).
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// The socket could not be taken from systemd or bound.
    #[error(transparent)]
    Listen(#[from] ListenFailed),
    /// The documents root or the state directories could not be opened or prepared.
    #[error("cannot open the documents tree")]
    OpenDocuments(#[source] WorkspaceError),
    /// The recovery task panicked or was cancelled.
    #[error("recovery did not finish")]
    RecoveryDidNotFinish(#[source] tokio::task::JoinError),
    /// Start-up recovery (the temp sweep and reconciling prepared receipts) failed.
    #[error("cannot reconcile receipts at start")]
    Recover(#[source] WorkspaceError),
    /// `[workspaced] serve_cluster` is set and the cluster cannot be joined.
    #[error("cannot serve agentd hosts over the cluster")]
    Cluster(#[source] crate::cluster::ClusterError),
}

/// Run workspaced with `config` until a shutdown signal; `kept` is what
/// `agentworks_daemon::entry` kept of [`KEPT_CAPABILITIES`] (logged at READY).
pub async fn run(config: Config, kept: Vec<Capability>) -> Result<(), StartError> {
    let shutdown = shutdown::on_signals();
    let socket_path = config.workspaced_socket();
    // The socket first, so callers queue in its backlog while we recover instead of failing.
    let (listener, origin) = listener::unix_listener("workspaced.sock", &socket_path)
        .map_err(|e| e.at(socket_path.display()))?;
    let limits = Limits {
        max_file_bytes: config.workspaced.max_file_bytes,
        lock_timeout: Duration::from_millis(config.workspaced.lock_timeout_ms),
        search_max_results: config.workspaced.search_max_results,
    };
    let workspace = Workspace::open(&config.documents_root, config.layout(), limits)
        .map_err(StartError::OpenDocuments)?;
    let workspace = Arc::new(workspace);
    let recovering = workspace.clone();
    let report = tokio::task::spawn_blocking(move || recovering.recover())
        .await
        .map_err(StartError::RecoveryDidNotFinish)?
        .map_err(StartError::Recover)?;
    // With serve_cluster, NATS and the database must answer now, before READY.
    let cluster = if config.workspaced.serve_cluster {
        Some(
            crate::cluster::join(&config)
                .await
                .map_err(StartError::Cluster)?,
        )
    } else {
        None
    };
    tracing::info!(
        socket = %socket_path.display(),
        cluster_subject = cluster.as_ref().map(|(.., subject)| subject.as_str()),
        socket_activated = origin == listener::ListenerOrigin::Activated,
        documents_root = %workspace.documents_root().display(),
        capabilities = ?kept,
        temp_files_removed = report.temp_files_removed,
        folders_synced = report.folders_synced,
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
    let bus = cluster.map(|(client, key, calls, _)| {
        tokio::spawn(crate::cluster::serve(
            workspace.clone(),
            client,
            key,
            calls,
            server_limits.max_body_bytes,
            shutdown.clone(),
        ))
    });
    server::run(listener, workspace, policy, server_limits, shutdown).await;
    if let Some(bus) = bus {
        let _ = bus.await;
    }
    tracing::info!("workspaced stopped");
    Ok(())
}
