//! agentd's start and life as a daemon, in this order: the signal token, `agentd.sock`, the
//! public listener, the identity store, with `[cluster]` the NATS connection that announces
//! revoked tokens and takes the other agentd hosts' calls, READY, serving until shutdown. agentd keeps no
//! capability at all (`agentworks_daemon::entry` drops them before any thread exists).
//!
//! It must never announce READY before both listeners are taken, the identity store opens and,
//! in a cluster, NATS answers.

use crate::AgentdError;
use agentworks_daemon::config::Config;
use agentworks_daemon::listener::{self, ListenFailed, ListenerOrigin};
use agentworks_daemon::{shutdown, systemd};

/// Why agentd could not start. The message is the step that failed; its cause is the source
/// (printed after it, as a chain, by the binary).
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// A listener (the socket or the public address) could not be taken from systemd or bound.
    #[error(transparent)]
    Listen(#[from] ListenFailed),
    #[error("cannot open the identity store")]
    Identity(#[source] AgentdError),
    /// In a cluster: the NATS server could not be joined.
    #[error("cannot join the cluster's NATS server")]
    Nats(#[source] crate::clients::revocations::NatsError),
    /// `[agentd] workspaced_host`: that host's workspaced cannot be called.
    #[error("cannot call the workspaced of another host")]
    Workspaced(#[source] crate::clients::workspaced::WorkspacedClientError),
    /// In a cluster: agentd cannot seal its calls to gatewayd.
    #[error("cannot call gatewayd over the cluster's NATS server")]
    Gatewayd(#[source] crate::clients::gatewayd::GatewaydClientError),
    /// In a cluster: the other agentd hosts' calls cannot be taken.
    #[error("cannot take calls from the other agentd hosts")]
    TurnPeers(#[source] crate::chat::peers::TurnPeersError),
}

/// Runs agentd until SIGTERM/SIGINT.
pub async fn run(config: Config) -> Result<(), StartError> {
    let shutdown = shutdown::on_signals();
    let socket_path = config.agentd_socket();
    let (socket, socket_origin) = listener::unix_listener("agentd.sock", &socket_path)
        .map_err(|e| e.at(socket_path.display()))?;
    let (public, public_origin) = listener::tcp_listener("agentd-http", config.agentd.listen)
        .map_err(|e| e.at(config.agentd.listen))?;
    let identity = crate::open_identity(&config).map_err(StartError::Identity)?;
    // In a cluster, revoked tokens are announced to every gatewayd; NATS must answer now.
    let mut nats = None;
    let announcer = if config.cluster.is_enabled() {
        let bus = crate::clients::revocations::RevocationBus::join(&config.cluster)
            .await
            .map_err(StartError::Nats)?;
        nats = Some(bus.client());
        let (revoked, announced) = tokio::sync::mpsc::unbounded_channel();
        identity.announce_revocations_to(revoked);
        Some(tokio::spawn(
            crate::clients::revocations::publish_revocations(bus, announced, shutdown.clone()),
        ))
    } else {
        None
    };
    // In a cluster, the other agentd hosts ask this one to stop the turns it runs.
    let peers = match &nats {
        Some(client) => Some(
            crate::chat::peers::TurnPeers::join(&config.cluster, client.clone())
                .await
                .map_err(StartError::TurnPeers)?,
        ),
        None => None,
    };
    let gatewayd = crate::clients::gatewayd::GatewaydClient::for_config(&config, nats.clone())
        .await
        .map_err(StartError::Gatewayd)?;
    let workspaced = crate::clients::workspaced::WorkspacedClient::for_config(&config, nats)
        .await
        .map_err(StartError::Workspaced)?;
    tracing::info!(
        socket = %socket_path.display(),
        socket_activated = socket_origin == ListenerOrigin::Activated,
        public = %public.local_addr().map_or("-".into(), |a| a.to_string()),
        public_activated = public_origin == ListenerOrigin::Activated,
        public_url = %config.agentd.public_url(),
        workspaced = %workspaced.target(),
        gatewayd = %gatewayd.target(),
        host_id = config.cluster.host_id.as_deref().unwrap_or("-"),
        "agentd ready"
    );
    systemd::notify_ready("serving /mcp and agentd.sock");
    systemd::spawn_watchdog(shutdown.clone());
    let daemons = crate::DaemonClients {
        workspaced,
        gatewayd,
    };
    crate::run(&config, identity, daemons, peers, public, socket, shutdown).await;
    if let Some(announcer) = announcer {
        let _ = announcer.await;
    }
    tracing::info!("agentd stopped");
    Ok(())
}
