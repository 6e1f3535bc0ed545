//! `agentworks-agentd`: identity, the public MCP endpoint, and the operator socket.
//!
//! - [`identity`]: users, projects, roles, tokens and the write authority.
//! - [`mcp`]: the MCP streamable HTTP endpoint (both protocol eras) over a `Backend`.
//! - [`cli`]: its command line; [`start`]: its start as a daemon (listeners, store, READY).
//! - [`files`]: the catalog's file operations for one caller, through workspaced.
//! - [`mcp_backend`]: agentd's implementation of the MCP layer's `Backend`.
//! - [`console`]: the web console and its signed-in sessions.
//! - [`attachments`]: files attached to a chat message, kept in agentd's private state.
//! - [`admin`]: the operator and gateway endpoints on `agentd.sock`.
//! - [`revocations`]: with `[cluster]`, announcing revoked tokens to every gatewayd on NATS.
//! - [`device`]: the device authorization grant (RFC 8628) for `agentworks login`.
//! - [`laptop_cli`]: the laptop CLI this server shipped with, its manifest and its one-line
//!   install, served unauthenticated at `/v1/cli`.
//! - [`sealed`]: AES-256-GCM sealing of secrets kept at rest (the key file or credential);
//!   [`project_secrets`]: a project's sealed secrets (what connection headers name).
//! - [`mcp_connections`], [`mcp_connections_api`]: a project's remote MCP servers (the store,
//!   the rules a connection meets, and the API that manages them); [`mcp_remote`]: the client
//!   that talks to them through the guarded outbound client; [`mcp_connection_tools`]: their
//!   tools in a server-mode turn; [`mcp_oauth`]: signing a connection in with OAuth;
//!   [`mcp_apps`]: the operator's sign-in apps for servers without dynamic registration.
//! - [`chat_api`], [`chat_service`], [`chats`], [`turn`], [`model`]: the agent: the chat
//!   endpoints (REST + SSE on the public listener), the service handle they share with the
//!   model loop, the chat store, the loop itself, chats bound to a laptop folder.
//! - [`db`]: the SQL layer the stores share, on SQLite (one host) or the cluster's PostgreSQL.
//!
//! agentd never opens a document: every file operation goes to workspaced over its socket,
//! with the caller's resolved guard, which workspaced re-applies.

pub mod admin;
pub mod attachments;
pub mod catalog;
pub mod chat_api;
#[cfg(any(test, feature = "store-conformance"))]
pub mod chat_conformance;
pub mod chat_service;
pub mod chats;
pub mod cli;
pub mod console;
pub mod db;
pub mod device;
pub mod files;
pub mod gatewayd_client;
pub mod identity;
pub mod laptop_cli;
pub mod mcp;
pub mod mcp_apps;
pub mod mcp_backend;
pub mod mcp_connection_tools;
pub mod mcp_connections;
pub mod mcp_connections_api;
pub mod mcp_oauth;
pub mod mcp_remote;
pub mod model;
pub mod oauth;
pub mod project_secrets;
pub mod revocations;
pub mod sealed;
pub mod start;
pub mod turn;
pub mod turn_peers;
pub mod workspaced_client;

use crate::catalog::Catalog;
use crate::identity::IdentityStore;
use crate::mcp::{McpConfig, McpService};
use agentworks_contract::envelope::Health;
use agentworks_daemon::config::Config;
use agentworks_daemon::ipc::connections::{
    ConnectionLimits, FILES_BESIDES_CONNECTIONS, fit_to_open_files,
};
use agentworks_daemon::ipc::envelope::{Body, error_response, json_response};
use agentworks_daemon::ipc::server::{
    BodyRefusal, PublicLimits, Screen, ServerLimits, Verdict, serve, serve_public,
};
use agentworks_daemon::layout::ensure_private_dir;
use agentworks_support::outbound::GuardedClient;
use hyper::{Method, Request, StatusCode};
use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject;
use std::path::Path;
use std::sync::Arc;
use tokio_util::sync::CancellationToken;

/// Largest body of an authenticated `POST /mcp` (the largest file, JSON-escaped).
const MAX_MCP_BODY_BYTES: usize = 48 * 1024 * 1024;

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
    Chats(#[from] chats::ChatStoreError),
    #[error("{0}")]
    Attachments(#[from] attachments::AttachmentError),
    #[error("{0}")]
    Connections(#[from] mcp_connections::ConnectionStoreError),
    #[error("{0}")]
    Secrets(#[from] project_secrets::SecretStoreError),
}

// ----- the agent (chats): begin -----
/// Open the chat store, the attachments, the MCP connections and the project secrets: in the
/// cluster's PostgreSQL with `[cluster] database_url` (every agentd host sees the same chats,
/// uploads, connections and secrets), else beside each other in `<state>/agent/`; and the
/// model client, if configured. The sealing key stays per host (its file, or the systemd
/// credential), so hosts sharing a database must be given the same credential.
pub fn open_chats(
    config: &Config,
    identity: &IdentityStore,
    files: &files::FileTools,
    gatewayd: gatewayd_client::GatewaydClient,
) -> Result<chat_service::ChatService, AgentdError> {
    let dir = config.layout().agent_dir();
    ensure_private_dir(&dir, 0o700).map_err(|source| AgentdError::StateDir {
        path: dir.clone(),
        source,
    })?;
    // In a cluster, on the identity store's connections: one pool for the whole process.
    let shared = identity.postgres_pool();
    let (store, attachments, connections) = match shared {
        Some(pool) => (
            chats::ChatStore::on_postgres(pool)?,
            attachments::AttachmentStore::on_postgres(pool)?,
            mcp_connections::ConnectionStore::on_postgres(pool)?,
        ),
        None => (
            chats::ChatStore::open(&dir.join("chats.db"))?,
            attachments::AttachmentStore::open(&dir.join("attachments.db"))?,
            mcp_connections::ConnectionStore::open(&dir.join("mcp_connections.db"))?,
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
    let sealing = match sealed::SealingKey::load_or_create(&dir, credentials.as_deref()) {
        Ok(key) => Some(Arc::new(key)),
        Err(error) => {
            tracing::error!(%error, "project secrets and MCP connection sign-ins are unavailable");
            None
        }
    };
    let secrets = match (&sealing, shared) {
        (Some(key), Some(pool)) => Some(project_secrets::SecretStore::on_postgres(
            pool,
            key.clone(),
        )?),
        (Some(key), None) => Some(project_secrets::SecretStore::open(
            &dir.join("project_secrets.db"),
            key.clone(),
        )?),
        (None, _) => None,
    };
    let model = config
        .agentd
        .model
        .clone()
        .map(|m| model::ModelClient::new(m, credentials));
    Ok(chat_service::ChatService {
        secrets,
        sealing,
        public_url: config.agentd.public_url(),
        host_id,
        ..chat_service::ChatService::new(
            identity.clone(),
            files.clone(),
            store,
            attachments,
            connections,
            gatewayd,
            model,
        )
    })
}
// ----- the agent (chats): end -----

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

/// How agentd reaches the other daemons: workspaced and gatewayd, each over its socket on this
/// host or, in a cluster, over NATS.
pub struct DaemonClients {
    pub workspaced: workspaced_client::WorkspacedClient,
    pub gatewayd: gatewayd_client::GatewaydClient,
}

/// Serve the public listener and the socket until `shutdown`, then let in-flight requests end.
pub async fn run(
    config: &Config,
    identity: IdentityStore,
    daemons: DaemonClients,
    peers: Option<(turn_peers::TurnPeers, async_nats::Subscriber)>,
    public: tokio::net::TcpListener,
    socket: tokio::net::UnixListener,
    shutdown: CancellationToken,
) {
    let DaemonClients {
        workspaced,
        gatewayd,
    } = daemons;
    let files = files::FileTools::new(identity.clone(), workspaced.clone());
    let sessions = console::session::Sessions::new(
        identity.clone(),
        config.agentd.public_url(),
        config.agentd.allowed_origins.clone(),
        console::session::loopback_port(&public),
    );
    // ----- the agent (chats): begin -----
    let chat_service = match open_chats(config, &identity, &files, gatewayd) {
        Ok(service) => Some(chat_service::ChatService {
            sessions: sessions.clone(),
            connections_client: connections_client(config),
            peers: peers.as_ref().map(|(peers, _)| peers.clone()),
            ..service
        }),
        Err(error) => {
            // MCP and the operator socket still serve; the chat endpoints answer 503.
            tracing::error!(%error, "cannot open the chat store; chats are unavailable");
            None
        }
    };
    // ----- the agent (chats): end -----
    let mcp = mcp_service(config, &identity, files, &public);
    let screen = Arc::new(PublicScreen {
        mcp: mcp.clone(),
        chats: chat_service.clone(),
        sessions: sessions.clone(),
    });
    let outbound = outbound_client(config);
    let oauth = oauth::server::AuthorizationServer::new(
        identity.clone(),
        &config.agentd.public_url(),
        console::session::loopback_port(&public),
        outbound,
    );
    let laptop_cli = laptop_cli::LaptopCli::new(
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
        sessions,
        laptop_cli,
    };
    let public_handler = move |peer: std::net::SocketAddr,
                               mut parts: hyper::http::request::Parts,
                               body: bytes::Bytes| {
        // The console's failed-sign-in limits count per client address.
        parts
            .extensions
            .insert(console::accounts::ClientAddress(peer.ip()));
        let routes = routes.clone();
        async move { routes.handle(parts, body).await }
    };
    let mcp_apps = mcp_apps_of(chat_service.as_ref());
    let admin = admin::Admin {
        mcp_apps,
        public_url: config.agentd.public_url(),
        identity,
        workspaced,
        policy: Arc::new(admin::SocketPolicy::new(
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
            turn_peers::serve(peers, calls, chats, shutdown.clone()).await;
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

/// The operator's MCP sign-in apps, on the chat side's connection store and sealing key.
fn mcp_apps_of(chats: Option<&chat_service::ChatService>) -> Option<mcp_apps::McpApps> {
    chats.map(|service| mcp_apps::McpApps {
        store: service.connections.clone(),
        sealing: service.sealing.clone(),
        public_url: service.public_url.clone(),
    })
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

/// agentd's MCP endpoint: the transport over the workflow-file catalog.
pub type AgentMcp = McpService<Catalog<mcp_backend::AgentBackend>>;

/// The MCP endpoint over agentd's backend, configured for the public listener it serves on.
fn mcp_service(
    config: &Config,
    identity: &IdentityStore,
    files: files::FileTools,
    public: &tokio::net::TcpListener,
) -> Arc<AgentMcp> {
    let runner = mcp_backend::AgentBackend::new(
        identity.clone(),
        files,
        format!("{}/mcp", config.agentd.public_url()),
    );
    Arc::new(McpService::new(
        Arc::new(Catalog::new(runner)),
        McpConfig {
            public_url: config.agentd.public_url(),
            instructions: catalog::INSTRUCTIONS.to_owned(),
            scopes_supported: catalog::WORKFLOW_SCOPES.map(str::to_owned).to_vec(),
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

/// What the public listener serves, in the order it is tried: device login (and its approval
/// page), the console's device-login API and sign-in endpoints, the console's pages, the laptop
/// CLI (`/v1/cli`), health, the chat endpoints, then MCP (which answers its own paths; everything else is a 404).
#[derive(Clone)]
struct PublicRoutes {
    mcp: Arc<AgentMcp>,
    oauth: oauth::server::AuthorizationServer,
    identity: IdentityStore,
    public_url: String,
    chats: Option<chat_service::ChatService>,
    sessions: console::session::Sessions,
    laptop_cli: laptop_cli::LaptopCli,
}

impl PublicRoutes {
    async fn handle(
        &self,
        parts: hyper::http::request::Parts,
        body: bytes::Bytes,
    ) -> hyper::Response<Body> {
        if let Some(response) =
            device::handle_public(&self.identity, &self.public_url, &parts, &body).await
        {
            return response;
        }
        if let Some(response) = console::device_login::handle(&self.sessions, &parts, &body).await {
            return response;
        }
        let client_address = parts
            .extensions
            .get::<console::accounts::ClientAddress>()
            .map(|address| address.0);
        if let Some(response) = self.oauth.handle(&parts, &body, client_address).await {
            return response;
        }
        if let Some(response) =
            console::oauth_consent::handle(&self.sessions, &self.oauth, &parts, &body).await
        {
            return response;
        }
        if let Some(response) = console::accounts::handle(&self.sessions, &parts, &body).await {
            return response;
        }
        if let Some(response) = console::assets::handle(&parts) {
            return response;
        }
        if let Some(response) = self.laptop_cli.handle(&parts).await {
            return response;
        }
        if parts.method == Method::GET && parts.uri.path() == "/v1/health" {
            return json_response(
                StatusCode::OK,
                &Health::ok("agentworks-agentd", env!("CARGO_PKG_VERSION")),
            );
        }
        // ----- the agent (chats): begin -----
        let chat_path = parts.uri.path();
        if chat_path == "/v1/chats"
            || chat_path.starts_with("/v1/chats/")
            || chat_path == "/v1/devices"
            || chat_path == "/v1/projects"
            || chat_path.starts_with("/v1/projects/")
            || chat_path == mcp_connections_api::CALLBACK_PATH
            || chat_path == "/v1/models"
        {
            return match &self.chats {
                Some(service) => match service.handle(&parts, &body).await {
                    Some(response) => response,
                    None => not_found(chat_path),
                },
                None => error_response(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "unavailable",
                    "the chat store could not be opened; see agentd's log",
                    Default::default(),
                ),
            };
        }
        // ----- the agent (chats): end -----
        let path = parts.uri.path().to_owned();
        match self.mcp.handle(Request::from_parts(parts, body)).await {
            Some(response) => response,
            None => not_found(&path),
        }
    }
}

/// What agentd's public listener decides from a request's head, before it reads the body:
/// `/mcp` and the chat endpoints need a valid bearer token or console session (and `/mcp` an
/// allowed `Origin`; a session, its `Origin` and CSRF token), as does console sign-out,
/// checked here by the same code their handlers run, so a request they would refuse is
/// refused without its body ever being read; with one, the endpoint's own body limit
/// applies. Everything else (device login, sign-in, OAuth metadata, health, 404s) is anonymous and
/// gets [`agentworks_daemon::ipc::server::MAX_ANONYMOUS_BODY_BYTES`].
struct PublicScreen {
    mcp: Arc<AgentMcp>,
    chats: Option<chat_service::ChatService>,
    sessions: console::session::Sessions,
}

impl Screen for PublicScreen {
    async fn screen(&self, head: &hyper::http::request::Parts) -> Verdict {
        if head.uri.path() == "/mcp" {
            return self.mcp.verdict(head, MAX_MCP_BODY_BYTES).await;
        }
        if let Some(verdict) = console::accounts::screen(&self.sessions, head).await {
            return verdict;
        }
        if let Some(chats) = &self.chats
            && let Some(screened) = chats.screen(head).await
        {
            return match screened {
                Ok(max_body_bytes) => Verdict::Authenticated { max_body_bytes },
                Err(refusal) => Verdict::Refused(refusal),
            };
        }
        Verdict::Anonymous
    }

    /// `/mcp` spells a refused body its own way (a JSON-RPC error for a JSON-RPC request);
    /// every other path gets the envelope.
    fn body_refusal(
        &self,
        head: &hyper::http::request::Parts,
        refusal: BodyRefusal,
    ) -> hyper::Response<Body> {
        if head.uri.path() == "/mcp" {
            return self.mcp.body_refusal(&head.method, &head.headers, refusal);
        }
        refusal.envelope()
    }
}

fn not_found(path: &str) -> hyper::Response<Body> {
    error_response(
        StatusCode::NOT_FOUND,
        "not_found",
        format!("{path} is not served here; MCP is at /mcp"),
        Default::default(),
    )
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
