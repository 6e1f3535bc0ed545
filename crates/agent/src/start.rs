//! agentd's start and life as a daemon, in this order: the signal token, `agentd.sock`, the
//! public listener, the identity store, with `[cluster]` the NATS connection that announces
//! revoked tokens and takes the other agentd hosts' calls, the clients of workspaced, gatewayd
//! and runnerd, READY, serving until shutdown ([`serve_listeners`]: the chats' and connections'
//! stores, the MCP endpoint, the OAuth server and the console, handed to the public listener's
//! router in `lib.rs` and to the socket's [`crate::admin`]). agentd keeps no capability at all
//! (`agentworks_daemon::entry` drops them before any thread exists).
//!
//! It must never announce READY before both listeners are taken, the identity store opens and,
//! in a cluster, NATS answers.

use crate::catalog::Catalog;
use crate::catalog::backend::AgentMcp;
use crate::identity::IdentityStore;
use crate::mcp::{McpConfig, McpService};
use crate::{PublicRoutes, PublicScreen};
use agentworks_daemon::config::Config;
use agentworks_daemon::ipc::connections::{
    ConnectionLimits, FILES_BESIDES_CONNECTIONS, fit_to_open_files,
};
use agentworks_daemon::ipc::server::{PublicLimits, ServerLimits, serve, serve_public};
use agentworks_daemon::layout::ensure_private_dir;
use agentworks_daemon::listener::{self, ListenFailed, ListenerOrigin};
use agentworks_daemon::{shutdown, systemd};
use agentworks_support::outbound::GuardedClient;
use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject;
use std::path::Path;
use std::sync::Arc;
use tokio_util::sync::CancellationToken;

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
    /// In a cluster: agentd cannot seal its calls to the runnerd of another host.
    #[error("cannot call the runnerd of another host")]
    Runnerd(#[source] crate::clients::runnerd::RunnerdClientError),
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
    let identity = open_identity(&config).map_err(StartError::Identity)?;
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
    let workspaced =
        crate::clients::workspaced::WorkspacedClient::for_config(&config, nats.clone())
            .await
            .map_err(StartError::Workspaced)?;
    // A project's coding CLIs run on the host that stores it.
    let runnerd = crate::clients::runnerd::RunnerdClient::for_config(&config, nats)
        .await
        .map_err(StartError::Runnerd)?;
    tracing::info!(
        socket = %socket_path.display(),
        socket_activated = socket_origin == ListenerOrigin::Activated,
        public = %public.local_addr().map_or("-".into(), |a| a.to_string()),
        public_activated = public_origin == ListenerOrigin::Activated,
        public_url = %config.agentd.public_url(),
        workspaced = %workspaced.target(),
        gatewayd = %gatewayd.target(),
        runnerd = %runnerd.target(),
        host_id = config.cluster.host_id.as_deref().unwrap_or("-"),
        "agentd ready"
    );
    systemd::notify_ready("serving /mcp and agentd.sock");
    systemd::spawn_watchdog(shutdown.clone());
    let daemons = DaemonClients {
        workspaced,
        gatewayd,
        runnerd,
    };
    serve_listeners(&config, identity, daemons, peers, public, socket, shutdown).await;
    if let Some(announcer) = announcer {
        let _ = announcer.await;
    }
    tracing::info!("agentd stopped");
    Ok(())
}

/// Why one of agentd's stores could not be opened: the identity store (agentd then refuses to
/// start), or the chats' and connections' stores (their endpoints then answer 503).
#[derive(Debug, thiserror::Error)]
pub enum AgentdError {
    #[error("cannot prepare agentd's state directory {path}: {source}")]
    StateDir {
        path: std::path::PathBuf,
        source: agentworks_daemon::layout::LayoutError,
    },
    #[error("{0}")]
    Identity(#[from] crate::identity::IdentityError),
    #[error("{0}")]
    Chats(#[from] crate::chat::store::ChatStoreError),
    #[error("{0}")]
    Attachments(#[from] crate::chat::attachments::AttachmentError),
    #[error("{0}")]
    Connections(#[from] crate::connections::store::ConnectionStoreError),
    #[error("{0}")]
    Secrets(#[from] crate::connections::secrets::SecretStoreError),
}

/// Open the chat store, the attachments, the MCP connections and the project secrets: in the
/// cluster's PostgreSQL with `[cluster] database_url` (every agentd host sees the same chats,
/// uploads, connections and secrets), else beside each other in `<state>/agent/`; and the
/// model client, if configured. The sealing key stays per host (its file, or the systemd
/// credential), so hosts sharing a database must be given the same credential. The chats get
/// the connections' tools; the connections get their guarded client from `config` too.
pub fn open_chats_and_connections(
    config: &Config,
    identity: &IdentityStore,
    files: &crate::catalog::files::FileTools,
    gatewayd: crate::clients::gatewayd::GatewaydClient,
    runnerd: crate::clients::runnerd::RunnerdClient,
) -> Result<
    (
        crate::chat::service::ChatService,
        crate::connections::Connections,
    ),
    AgentdError,
> {
    let dir = config.layout().agent_dir();
    ensure_private_dir(&dir, 0o700).map_err(|source| AgentdError::StateDir {
        path: dir.clone(),
        source,
    })?;
    // In a cluster, on the identity store's connections: one pool for the whole process.
    let shared = identity.postgres_pool();
    let (store, attachments, connection_store) = match shared {
        Some(pool) => (
            crate::chat::store::ChatStore::on_postgres(pool)?,
            crate::chat::attachments::AttachmentStore::on_postgres(pool)?,
            crate::connections::store::ConnectionStore::on_postgres(pool)?,
        ),
        None => (
            crate::chat::store::ChatStore::open(&dir.join("chats.db"))?,
            crate::chat::attachments::AttachmentStore::open(&dir.join("attachments.db"))?,
            crate::connections::store::ConnectionStore::open(&dir.join("mcp_connections.db"))?,
        ),
    };
    let host_id = config
        .cluster
        .host_id
        .clone()
        .unwrap_or_else(|| "-".to_owned());
    // The turns this host ran before it stopped are gone: their claims on their chats too.
    let dropped = store.release_turn_claims_of(&host_id)?;
    if dropped > 0 {
        tracing::info!(
            dropped,
            "released the chats of turns that ran when agentd last stopped"
        );
    }
    let credentials = std::env::var_os("CREDENTIALS_DIRECTORY").map(std::path::PathBuf::from);
    let sealing = match crate::connections::sealed::SealingKey::load_or_create(
        &dir,
        credentials.as_deref(),
    ) {
        Ok(key) => Some(Arc::new(key)),
        Err(error) => {
            tracing::error!(%error, "project secrets and MCP connection sign-ins are unavailable");
            None
        }
    };
    let secrets = match (&sealing, shared) {
        (Some(key), Some(pool)) => Some(crate::connections::secrets::SecretStore::on_postgres(
            pool,
            key.clone(),
        )?),
        (Some(key), None) => Some(crate::connections::secrets::SecretStore::open(
            &dir.join("project_secrets.db"),
            key.clone(),
        )?),
        (None, _) => None,
    };
    let connections = crate::connections::Connections {
        client: connections_client(config),
        secrets,
        sealing,
        public_url: config.agentd.public_url(),
        ..crate::connections::Connections::new(identity.clone(), files.clone(), connection_store)
    };
    let model = config
        .agentd
        .model
        .clone()
        .map(|m| crate::chat::model::ModelClient::new(m, credentials));
    let chats = crate::chat::service::ChatService {
        host_id,
        runnerd: Some(runnerd),
        ..crate::chat::service::ChatService::new(
            identity.clone(),
            files.clone(),
            store,
            attachments,
            connections.tools(),
            gatewayd,
            model,
        )
    };
    Ok((chats, connections))
}

/// Open the identity store: in the cluster's PostgreSQL with `[cluster] database_url` (every
/// agentd host sees the same users, projects and tokens), else at `<state>/agent/agentd.db`.
pub fn open_identity(config: &Config) -> Result<IdentityStore, AgentdError> {
    let dir = config.layout().agent_dir();
    ensure_private_dir(&dir, 0o700).map_err(|source| AgentdError::StateDir {
        path: dir.clone(),
        source,
    })?;
    match &config.cluster.database_url {
        Some(url) => Ok(IdentityStore::open_postgres(url)?),
        None => Ok(IdentityStore::open(&dir.join("agentd.db"))?),
    }
}

/// How agentd reaches the other daemons: workspaced, gatewayd and runnerd, each over its
/// socket on this host or, in a cluster, over NATS.
pub struct DaemonClients {
    pub workspaced: crate::clients::workspaced::WorkspacedClient,
    pub gatewayd: crate::clients::gatewayd::GatewaydClient,
    pub runnerd: crate::clients::runnerd::RunnerdClient,
}

/// Serve the public listener and the socket until `shutdown`, then let in-flight requests end.
pub async fn serve_listeners(
    config: &Config,
    identity: IdentityStore,
    daemons: DaemonClients,
    peers: Option<(crate::chat::peers::TurnPeers, async_nats::Subscriber)>,
    public: tokio::net::TcpListener,
    socket: tokio::net::UnixListener,
    shutdown: CancellationToken,
) {
    let DaemonClients {
        workspaced,
        gatewayd,
        runnerd,
    } = daemons;
    let files = crate::catalog::files::FileTools::new(identity.clone(), workspaced.clone());
    let sessions = crate::console::session::Sessions::new(
        identity.clone(),
        config.agentd.public_url(),
        config.agentd.allowed_origins.clone(),
        crate::console::session::loopback_port(&public),
    );
    let (chat_service, connections) =
        match open_chats_and_connections(config, &identity, &files, gatewayd, runnerd) {
            Ok((chats, connections)) => (
                Some(crate::chat::service::ChatService {
                    sessions: sessions.clone(),
                    peers: peers.as_ref().map(|(peers, _)| peers.clone()),
                    ..chats
                }),
                Some(crate::connections::Connections {
                    sessions: sessions.clone(),
                    ..connections
                }),
            ),
            Err(error) => {
                // MCP and the operator socket still serve; the chat endpoints answer 503.
                tracing::error!(%error, "cannot open the chat store; chats are unavailable");
                (None, None)
            }
        };
    let mcp = mcp_service(config, &identity, files, &public);
    let screen = Arc::new(PublicScreen {
        mcp: mcp.clone(),
        chats: chat_service.clone(),
        connections: connections.clone(),
        sessions: sessions.clone(),
    });
    let outbound = outbound_client(config);
    let oauth = crate::oauth::server::AuthorizationServer::new(
        identity.clone(),
        &config.agentd.public_url(),
        crate::console::session::loopback_port(&public),
        outbound,
    );
    let laptop_cli = crate::console::laptop_cli::LaptopCli::new(
        config.agentd.cli_dir.clone(),
        config.agentd.public_url(),
        shutdown.clone(),
    );
    laptop_cli.offer();
    let routes = PublicRoutes {
        mcp,
        oauth,
        identity: identity.clone(),
        public_url: config.agentd.public_url(),
        chats: chat_service.clone(),
        connections: connections.clone(),
        sessions,
        laptop_cli,
    };
    let public_handler = move |peer: std::net::SocketAddr,
                               mut parts: hyper::http::request::Parts,
                               body: bytes::Bytes| {
        // The console's failed-sign-in limits count per client address.
        parts
            .extensions
            .insert(crate::identity::attempt_limits::ClientAddress(peer.ip()));
        let routes = routes.clone();
        async move { routes.handle(parts, body).await }
    };
    let admin = crate::admin::Admin {
        mcp_apps: connections
            .as_ref()
            .map(crate::connections::Connections::apps),
        public_url: config.agentd.public_url(),
        identity,
        workspaced,
        policy: Arc::new(crate::admin::SocketPolicy::new(
            &config.agentd.admin_group,
            &config.agentd.gateway_users,
        )),
    };
    let socket_handler = move |peer, parts, body| {
        let admin = admin.clone();
        async move { admin.handle(peer, parts, body).await }
    };
    let socket_limits = ServerLimits {
        max_connections: 256,
        max_body_bytes: 1024 * 1024,
    };
    let public_limits = public_limits(config, &socket_limits);
    // The other agentd hosts' calls (a turn's cancel), answered from the chat service.
    let peer_calls = async {
        if let (Some((peers, calls)), Some(chats)) = (peers, chat_service) {
            crate::chat::peers::serve(peers, calls, chats, shutdown.clone()).await;
        }
    };
    tokio::join!(
        serve_public(
            public,
            screen,
            public_handler,
            shutdown.clone(),
            public_limits
        ),
        serve(socket, socket_handler, shutdown.clone(), socket_limits),
        peer_calls,
    );
}

/// The guarded client agentd fetches OAuth client metadata documents with: the public web
/// roots plus `agentd.outbound_root_certificates`. `None` (logged, naming the file) when one of
/// those files cannot be used, so metadata documents are refused rather than fetched while
/// trusting fewer roots than the operator configured.
fn outbound_client(config: &Config) -> Option<GuardedClient> {
    let refused = "OAuth clients named by a metadata document are refused";
    built(outbound_builder(config, refused)?, refused)
}

/// The guarded client for the projects' MCP connections: the same roots, same-origin
/// redirects followed (never another origin's), larger answers (a tool list, a result) and a
/// longer wait (a tool may take a while). `None` (logged) as for [`outbound_client`].
fn connections_client(config: &Config) -> Option<GuardedClient> {
    let refused = "MCP connections are not used";
    let builder = outbound_builder(config, refused)?
        .follow_same_origin_redirects()
        .max_body_bytes(4 << 20)
        .request_timeout(std::time::Duration::from_secs(120));
    built(builder, refused)
}

fn built(builder: agentworks_support::outbound::Builder, refused: &str) -> Option<GuardedClient> {
    match builder.build() {
        Ok(client) => Some(client),
        Err(error) => {
            tracing::error!(%error, "cannot build the outbound HTTP client; {refused}");
            None
        }
    }
}

/// A guarded client's settings with the public web roots and every configured root; `None`
/// (logged with `refused`, what not having it means) when a configured file is unusable.
fn outbound_builder(
    config: &Config,
    refused: &str,
) -> Option<agentworks_support::outbound::Builder> {
    let mut builder = GuardedClient::builder();
    for path in &config.agentd.outbound_root_certificates {
        match root_certificates(path) {
            Ok(certificates) => {
                for certificate in certificates {
                    builder = builder.add_root_certificate_der(certificate.to_vec());
                }
            }
            Err(error) => {
                tracing::error!(
                    file = %path.display(),
                    "cannot use agentd.outbound_root_certificates: {error}; {refused}"
                );
                return None;
            }
        }
    }
    Some(builder)
}

/// The certificates of one PEM file, each usable as a root; the error names the file.
fn root_certificates(path: &Path) -> Result<Vec<CertificateDer<'static>>, String> {
    let file = path.display();
    let pem = std::fs::read(path).map_err(|e| format!("cannot read {file}: {e}"))?;
    let certificates = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("{file} is not valid PEM: {e}"))?;
    if certificates.is_empty() {
        return Err(format!("{file} holds no PEM certificate"));
    }
    for (index, certificate) in certificates.iter().enumerate() {
        rustls::RootCertStore::empty()
            .add(certificate.clone())
            .map_err(|e| format!("certificate {} of {file} is unusable: {e}", index + 1))?;
    }
    Ok(certificates)
}

/// The MCP endpoint over agentd's backend, configured for the public listener it serves on.
fn mcp_service(
    config: &Config,
    identity: &IdentityStore,
    files: crate::catalog::files::FileTools,
    public: &tokio::net::TcpListener,
) -> Arc<AgentMcp> {
    let runner = crate::catalog::backend::AgentBackend::new(
        identity.clone(),
        files,
        format!("{}/mcp", config.agentd.public_url()),
    );
    Arc::new(McpService::new(
        Arc::new(Catalog::new(runner)),
        McpConfig {
            public_url: config.agentd.public_url(),
            instructions: crate::catalog::INSTRUCTIONS.to_owned(),
            scopes_supported: crate::catalog::WORKFLOW_SCOPES.map(str::to_owned).to_vec(),
            authorization_servers: vec![config.agentd.public_url()],
            allowed_origins: config.agentd.allowed_origins.clone(),
            loopback_port: public
                .local_addr()
                .ok()
                .filter(|address| address.ip().is_loopback())
                .map(|address| address.port()),
            server_name: "agentworks".into(),
            server_version: env!("CARGO_PKG_VERSION").into(),
            max_sessions_per_token: config.agentd.max_sessions_per_token,
        },
    ))
}

/// The public listener's limits: the connections the open-file limit leaves once the
/// socket's connections are set aside, and the bytes of bodies in flight.
fn public_limits(config: &Config, socket_limits: &ServerLimits) -> PublicLimits {
    let connections = fit_to_open_files(
        ConnectionLimits::with_reserved_quarter(
            config.agentd.max_connections,
            config.agentd.max_connections_per_address,
        ),
        FILES_BESIDES_CONNECTIONS + socket_limits.max_connections as u64,
    );
    let public_limits = PublicLimits::new(connections, config.agentd.max_body_bytes_in_flight);
    // Field by field: a log line holds values, not a struct's Debug dump.
    let connections = &public_limits.connections;
    tracing::info!(
        max_connections = connections.max_connections,
        max_per_address = connections.max_per_address,
        reserved_for_authenticated = connections.reserved_for_authenticated,
        max_anonymous_body_bytes = public_limits.max_anonymous_body_bytes,
        body_budget_bytes = public_limits.body_budget_bytes,
        "public listener limits"
    );
    public_limits
}

#[cfg(test)]
mod tests {
    use super::root_certificates;

    #[test]
    fn an_unusable_root_certificate_file_is_an_error_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("missing.pem");
        let error = root_certificates(&missing).unwrap_err();
        assert!(
            error.contains("cannot read") && error.contains("missing.pem"),
            "{error}"
        );
        for (name, text, says) in [
            ("empty.pem", "", "holds no PEM certificate"),
            (
                "key.pem",
                "-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n",
                "holds no PEM certificate",
            ),
            (
                "cut.pem",
                "-----BEGIN CERTIFICATE-----\nAAAA\n",
                "is not valid PEM",
            ),
            (
                "junk.pem",
                "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n",
                "certificate 1 of",
            ),
        ] {
            let path = dir.path().join(name);
            std::fs::write(&path, text).unwrap();
            let error = root_certificates(&path).unwrap_err();
            assert!(
                error.contains(says) && error.contains(name),
                "{name}: {error}"
            );
        }
    }
}
