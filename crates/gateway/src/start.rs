//! gatewayd's start and life as a daemon, in this order: the signal token, the executor
//! listener, `gatewayd.sock`, the gateway store, with `[cluster]` the cluster's gatewayd key (from
//! the shared database) and the NATS connection with its subscriptions, READY, serving until shutdown. gatewayd keeps no capability at all
//! (`agentworks_daemon::entry` drops them before any thread exists).
//!
//! It must never announce READY before both listeners are taken, the store opens and, in a
//! cluster, NATS answers.

use crate::GatewayError;
use agentworks_daemon::config::Config;
use agentworks_daemon::listener::{self, ListenFailed, ListenerOrigin};
use agentworks_daemon::{shutdown, systemd};

/// Why gatewayd could not start. The message is the step that failed; its cause is the source
/// (printed after it, as a chain, by the binary).
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// A listener (the executor address or the socket) could not be taken from systemd or bound.
    #[error(transparent)]
    Listen(#[from] ListenFailed),
    #[error("cannot open the gateway store")]
    Store(#[source] GatewayError),
    /// In a cluster: the NATS server could not be joined.
    #[error("cannot join the cluster's NATS server")]
    Nats(#[source] crate::nats::NatsError),
    /// In a cluster: the gatewayd key could not be read from (or stored in) the shared database.
    #[error("cannot read the cluster's gatewayd key from the shared database")]
    GatewaydKey(#[source] agentworks_daemon::bus::KeyError),
    /// The blocking task opening the store panicked or was cancelled.
    #[error("the task opening the gateway store failed")]
    StoreTask(#[source] tokio::task::JoinError),
}

/// Runs gatewayd until SIGTERM/SIGINT.
pub async fn run(config: Config) -> Result<(), StartError> {
    let shutdown = shutdown::on_signals();
    let socket_path = config.gatewayd_socket();
    let (public, public_origin) = listener::tcp_listener("gatewayd-ws", config.gatewayd.listen)
        .map_err(|e| e.at(config.gatewayd.listen))?;
    let (socket, socket_origin) = listener::unix_listener("gatewayd.sock", &socket_path)
        .map_err(|e| e.at(socket_path.display()))?;
    // Off the async threads: opening blocks (SQLite's fsyncs, PostgreSQL's own runtime).
    let opening = {
        let config = config.clone();
        tokio::task::spawn_blocking(move || crate::open_store(&config))
    };
    let store = opening
        .await
        .map_err(StartError::StoreTask)?
        .map_err(StartError::Store)?;
    let (bus, calls_key) = if config.cluster.is_enabled() {
        let key = agentworks_daemon::bus::cluster_key(
            &config.cluster,
            "agentworks-gatewayd",
            agentworks_contract::cluster::GATEWAYD_KEY,
        )
        .await
        .map_err(StartError::GatewaydKey)?;
        let bus = crate::nats::Bus::join(&config.cluster).await;
        (Some(bus.map_err(StartError::Nats)?), Some(key))
    } else {
        (None, None)
    };
    tracing::info!(
        socket = %socket_path.display(),
        socket_activated = socket_origin == ListenerOrigin::Activated,
        public = %public.local_addr().map_or("-".into(), |a| a.to_string()),
        public_activated = public_origin == ListenerOrigin::Activated,
        public_url = %config.gatewayd.public_url(),
        store = store.backend(),
        host_id = config.cluster.host_id.as_deref().unwrap_or("-"),
        agentd = %config.agentd_socket().display(),
        "gatewayd ready"
    );
    systemd::notify_ready("serving /v1/executor and gatewayd.sock");
    systemd::spawn_watchdog(shutdown.clone());
    crate::run(&config, store, bus, calls_key, public, socket, shutdown).await;
    tracing::info!("gatewayd stopped");
    Ok(())
}
