//! `agentworks-agentd`: identity, the public MCP endpoint, chats and the agent, and the operator
//! socket. This file is the map (below) and the public listener's router ([`PublicRoutes`],
//! with [`PublicScreen`], what it decides from a request's head); the daemon's start, which
//! builds what the router routes to, is [`start`].
//!
//! Folders by domain, each with a module doc saying what it owns and what it may call:
//!
//! - [`identity`]: users, projects, roles, tokens, the write authority, device logins and the
//!   failed-attempt limits.
//! - [`oauth`]: the OAuth 2.1 authorization server for MCP clients and the device
//!   authorization grant (RFC 8628) for `agentworks login`.
//! - [`mcp`]: the MCP streamable HTTP endpoint (both protocol eras) over a `Backend`;
//!   [`catalog`]: agentd's tools on it (the backend, and the file operations for one caller
//!   through workspaced, which the chats' server-file tools use too).
//! - [`chat`]: the agent: the chat endpoints, the chat store, the turn (one driver per kind of
//!   agent, one file per kind of tool), chats bound to a laptop folder.
//! - [`connections`]: a project's remote MCP servers (the store, the API that manages them, the
//!   client that talks to them, signing in, the operator's sign-in apps, the project secrets
//!   their headers name, sealing) and their tools in a server-mode turn. A chat reaches it only
//!   through `ConnectionTools`; it never calls the chats.
//! - [`console`]: the web console: its pages, sign-in and sessions, device-login approval and
//!   OAuth consent, and the laptop CLI this server shipped with (`/v1/cli`, unauthenticated).
//! - [`clients`]: how agentd reaches workspaced and gatewayd (and, in a cluster, announces
//!   revoked tokens to every gatewayd).
//!
//! And daemon-wide: [`start`] (its start as a daemon: listeners, stores, clients, READY,
//! serving), [`cli`] (its command line), [`admin`] (the operator and gateway endpoints on
//! `agentd.sock`), [`db`] (the SQL layer the stores share, on SQLite or the cluster's
//! PostgreSQL).
//!
//! No file imports another that imports it back (`.ci/module_cycles.py` checks it in CI).
//! agentd never opens a document: every file operation goes to workspaced over its socket,
//! with the caller's resolved guard, which workspaced re-applies.

pub mod admin;
pub mod catalog;
pub mod chat;
pub mod cli;
pub mod clients;
pub mod connections;
pub mod console;
pub mod db;
pub mod identity;
pub mod mcp;
pub mod oauth;
pub mod start;

use crate::catalog::backend::AgentMcp;
use crate::chat::ChatService;
use crate::connections::Connections;
use crate::console::laptop_cli::LaptopCli;
use crate::console::session::Sessions;
use crate::identity::IdentityStore;
use agentworks_contract::envelope::Health;
use agentworks_daemon::ipc::envelope::{Body, error_response, json_response};
use agentworks_daemon::ipc::server::{BodyRefusal, Screen, Verdict};
use hyper::{Method, Request, StatusCode};
use std::sync::Arc;

/// Largest body of an authenticated `POST /mcp` (the largest file, JSON-escaped).
const MAX_MCP_BODY_BYTES: usize = 48 * 1024 * 1024;

/// What the public listener serves, in the order it is tried: device login (and its approval
/// page), the console's device-login API, OAuth, the console's consent and sign-in endpoints and
/// assets, the laptop CLI (`/v1/cli`), health, the connections and chat endpoints, then MCP
/// (which answers its own paths; everything else is a 404).
#[derive(Clone)]
pub(crate) struct PublicRoutes {
    pub(crate) mcp: Arc<AgentMcp>,
    pub(crate) oauth: oauth::server::AuthorizationServer,
    pub(crate) identity: IdentityStore,
    pub(crate) public_url: String,
    /// `None` (with `connections`) when the stores could not be opened: their endpoints 503.
    pub(crate) chats: Option<ChatService>,
    pub(crate) connections: Option<Connections>,
    pub(crate) sessions: Sessions,
    pub(crate) laptop_cli: LaptopCli,
}

impl PublicRoutes {
    pub(crate) async fn handle(
        &self,
        parts: hyper::http::request::Parts,
        body: bytes::Bytes,
    ) -> hyper::Response<Body> {
        if let Some(response) =
            oauth::device::handle_public(&self.identity, &self.public_url, &parts, &body).await
        {
            return response;
        }
        if let Some(response) = console::device_login::handle(&self.sessions, &parts, &body).await {
            return response;
        }
        let client_address = parts
            .extensions
            .get::<identity::attempt_limits::ClientAddress>()
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
        let chat_path = parts.uri.path();
        if chat_path == "/v1/chats"
            || chat_path.starts_with("/v1/chats/")
            || chat_path == "/v1/devices"
            || chat_path == "/v1/projects"
            || chat_path.starts_with("/v1/projects/")
            || chat_path == connections::sign_in::CALLBACK_PATH
            || chat_path == "/v1/models"
            || chat_path == "/v1/agents"
        {
            return match (&self.chats, &self.connections) {
                (Some(chats), Some(connections)) => {
                    if let Some(response) = connections.handle(&parts, &body).await {
                        return response;
                    }
                    match chats.handle(&parts, &body).await {
                        Some(response) => response,
                        None => not_found(chat_path),
                    }
                }
                _ => error_response(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "unavailable",
                    "the chat store could not be opened; see agentd's log",
                    Default::default(),
                ),
            };
        }
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
pub(crate) struct PublicScreen {
    pub(crate) mcp: Arc<AgentMcp>,
    pub(crate) chats: Option<ChatService>,
    pub(crate) connections: Option<Connections>,
    pub(crate) sessions: Sessions,
}

impl Screen for PublicScreen {
    async fn screen(&self, head: &hyper::http::request::Parts) -> Verdict {
        if head.uri.path() == "/mcp" {
            return self.mcp.verdict(head, MAX_MCP_BODY_BYTES).await;
        }
        if let Some(verdict) = console::accounts::screen(&self.sessions, head).await {
            return verdict;
        }
        if let Some(connections) = &self.connections
            && let Some(screened) = connections.screen(head).await
        {
            return match screened {
                Ok(max_body_bytes) => Verdict::Authenticated { max_body_bytes },
                Err(refusal) => Verdict::Refused(refusal),
            };
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
