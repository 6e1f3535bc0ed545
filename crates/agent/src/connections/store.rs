//! MCP connections of a project: the remote MCP servers a `code` project's owner or co-owner
//! added, in `<state>/agent/mcp_connections.db` (SQLite, WAL, `synchronous=FULL`) or, with
//! `[cluster] database_url`, in the cluster's PostgreSQL (namespace `agentd`, version table
//! `mcp_connections_schema`), and the rules a connection must meet before it is stored.
//!
//! A connection is remote only: an `https://` URL (streamable HTTP, or SSE for older servers).
//! A stdio server would run a command on this host as agentd, so a request that names a
//! command is refused by name, never stored. The URL's host is checked with the guarded
//! outbound client's own rules ([`agentworks_support::outbound::check_host`]) when it is
//! added; the address actually dialled is checked again on every request by that client, so a
//! name that resolves somewhere else later gains nothing. A URL with user-info is refused (a
//! credential typed into a URL would be stored and shown); the URL shown anywhere has no query
//! string or fragment ([`shown_url`]).
//!
//! Header values are never typed in: a header names a project secret and a format
//! (`{"secret": "LINEAR_API_KEY", "format": "Bearer {}"}`), resolved when a request is made.
//! Header names that the transport itself owns (`Host`, `Content-Length`, the MCP session and
//! protocol headers, …) are refused.
//!
//! Each connection has an internal name (`mcpc_` and 16 random hex digits) that is unique for
//! ever; display names may repeat. Everything keyed per connection (sessions, tool lists,
//! sealed credentials) is keyed by the internal name, so two connections named alike never
//! share any of it.
//!
//! Must never: store or return a header value or a credential in clear, or decide who may use
//! a connection (the caller checks the live role at every request: [`crate::connections::api`]).

use crate::db::{Database, DbError, Row, Sql, TransactionError};
use agentworks_support::outbound::check_host;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::Path;
use url::Url;

/// The most connections one project may have.
pub const MAX_PER_PROJECT: usize = 32;
/// The longest display name, in characters.
pub const MAX_NAME_CHARS: usize = 64;
/// The longest URL, in bytes.
pub const MAX_URL_BYTES: usize = 2048;
/// The most headers one connection may send.
pub const MAX_HEADERS: usize = 16;

#[derive(Debug, thiserror::Error)]
pub enum ConnectionStoreError {
    #[error("cannot open the MCP connection store {path}: {source}")]
    Open {
        path: std::path::PathBuf,
        source: rusqlite::Error,
    },
    /// The cluster's database (`[cluster] database_url`) cannot be reached or migrated.
    #[error("the MCP connection store (PostgreSQL) cannot be opened: {0}")]
    OpenShared(#[from] crate::db::OpenError),
    #[error("the MCP connection store failed: {0}")]
    Sql(#[from] DbError),
    #[error("a stored connection's headers are not valid JSON: {0}")]
    Corrupt(#[from] serde_json::Error),
}

impl TransactionError for ConnectionStoreError {
    fn as_db_error(&self) -> Option<&DbError> {
        match self {
            ConnectionStoreError::Sql(error) => Some(error),
            _ => None,
        }
    }
}

/// Why a connection is refused before it is stored; each has a stable `code`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConnectionRuleError {
    #[error(
        "agentd connects to remote MCP servers only (streamable HTTP or SSE at an https:// URL); a stdio server would run a command on the server, so it cannot be added"
    )]
    Stdio,
    #[error("name must be 1 to {MAX_NAME_CHARS} characters with no control characters")]
    Name,
    #[error("url is not a URL: {0}")]
    Url(String),
    #[error("url must start with https:// (a remote MCP server over TLS), not {0}://")]
    Scheme(String),
    #[error(
        "url must not carry a user name or password; name a project secret in a header instead"
    )]
    UserInfo,
    #[error("url's host is refused: {0}")]
    Host(String),
    #[error("{0}")]
    Header(String),
    #[error("the project has {MAX_PER_PROJECT} connections already; remove one first")]
    TooMany,
}

impl ConnectionRuleError {
    pub fn code(&self) -> &'static str {
        match self {
            ConnectionRuleError::Stdio => "stdio_not_supported",
            ConnectionRuleError::Name => "invalid_name",
            ConnectionRuleError::Url(_)
            | ConnectionRuleError::Scheme(_)
            | ConnectionRuleError::UserInfo => "invalid_url",
            ConnectionRuleError::Host(_) => "address_refused",
            ConnectionRuleError::Header(_) => "invalid_header",
            ConnectionRuleError::TooMany => "too_many_connections",
        }
    }
}

/// The transport a connection speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Transport {
    StreamableHttp,
    Sse,
}

impl Transport {
    fn as_str(self) -> &'static str {
        match self {
            Transport::StreamableHttp => "streamable_http",
            Transport::Sse => "sse",
        }
    }

    fn parse(s: &str) -> Option<Transport> {
        match s {
            "streamable_http" => Some(Transport::StreamableHttp),
            "sse" => Some(Transport::Sse),
            _ => None,
        }
    }
}

/// A header's value: a project secret's name and where it goes in the value.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SecretHeader {
    pub secret: String,
    /// The value with `{}` where the secret goes; `{}` alone when absent.
    #[serde(default = "whole_value")]
    pub format: String,
}

fn whole_value() -> String {
    "{}".into()
}

/// A connection as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct McpConnection {
    /// The internal name, unique for ever: `mcpc_<16 hex>`.
    pub id: String,
    pub project_id: String,
    /// What people and the model see; may repeat within a project.
    pub name: String,
    /// The whole URL, query included (some servers take a key there); never shown as it is.
    pub url: String,
    pub transport: Transport,
    pub headers: BTreeMap<String, SecretHeader>,
    pub created_by: String,
    pub created_at_ms: i64,
}

impl McpConnection {
    /// The connection as the API shows it: the URL without its query or fragment, the headers'
    /// secret names (never a value).
    pub fn shown(&self) -> serde_json::Value {
        serde_json::json!({
            "connection_id": self.id,
            "project_id": self.project_id,
            "name": self.name,
            "url": shown_url(&self.url),
            "transport": self.transport,
            "headers": self.headers,
            "tool_prefix": tool_prefix(self),
            "app_key": provider_key(&self.url),
            "created_by": self.created_by,
            "created_at_ms": self.created_at_ms,
        })
    }
}

/// The prefix of every tool of `connection`, as the model sees it: `mcp_`, the display name
/// in lower case with every run of other characters as one `_` (at most 16), `_`, the first 6
/// hex digits of the internal name, `__`.
pub fn tool_prefix(connection: &McpConnection) -> String {
    let mut slug = String::new();
    for c in connection.name.chars() {
        if c.is_ascii_alphanumeric() {
            slug.push(c.to_ascii_lowercase());
        } else if !slug.ends_with('_') {
            slug.push('_');
        }
    }
    let slug: String = slug.trim_matches('_').chars().take(16).collect();
    let slug = if slug.is_empty() {
        "server".into()
    } else {
        slug
    };
    let tag: String = connection
        .id
        .trim_start_matches("mcpc_")
        .chars()
        .take(6)
        .collect();
    format!("mcp_{slug}_{tag}__")
}

/// `url` as it may be shown: scheme, host, port and path only.
pub fn shown_url(url: &str) -> String {
    match Url::parse(url) {
        Ok(mut u) => {
            u.set_query(None);
            u.set_fragment(None);
            let _ = u.set_username("");
            let _ = u.set_password(None);
            u.to_string()
        }
        Err(_) => String::from("(unparsable URL)"),
    }
}

/// The operator sign-in app a connection's URL uses when its server offers no dynamic
/// registration: every Google server shares `google`, GitHub's `github`, Slack's `slack`;
/// any other server is its host name (or address).
pub fn provider_key(url: &str) -> String {
    let host = Url::parse(url)
        .ok()
        .and_then(|u| {
            u.host_str()
                .map(|h| h.trim_end_matches('.').to_ascii_lowercase())
        })
        .unwrap_or_default();
    let under = |domain: &str| host == domain || host.ends_with(&format!(".{domain}"));
    if under("google.com") || under("googleapis.com") {
        "google".into()
    } else if under("github.com") || under("githubcopilot.com") {
        "github".into()
    } else if under("slack.com") {
        "slack".into()
    } else {
        host
    }
}

/// An operator-configured sign-in app, as stored: its secret sealed, and the issuer (the
/// provider's OAuth authorization server) it is pinned to: it is used only with a server whose
/// discovered metadata names exactly that issuer. `None` for an app set before apps were
/// pinned: such an app is never used (fail closed) until an operator sets its issuer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredApp {
    pub key: String,
    pub client_id: String,
    pub sealed_secret: Option<Vec<u8>>,
    pub issuer: Option<String>,
    pub updated_at_ms: i64,
}

/// What a person asks to add, already parsed from JSON.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NewConnection {
    pub name: String,
    #[serde(default)]
    pub url: Option<String>,
    #[serde(default)]
    pub transport: Option<String>,
    #[serde(default)]
    pub headers: BTreeMap<String, serde_json::Value>,
    /// Present only to be refused by name: a stdio server's command line.
    #[serde(default)]
    pub command: Option<serde_json::Value>,
    #[serde(default)]
    pub args: Option<serde_json::Value>,
    #[serde(default)]
    pub env: Option<serde_json::Value>,
}

/// A checked connection, ready to store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckedConnection {
    pub name: String,
    pub url: String,
    pub transport: Transport,
    pub headers: BTreeMap<String, SecretHeader>,
}

/// Headers the transport sets itself, or that would change what the request is.
const RESERVED_HEADERS: &[&str] = &[
    "host",
    "content-length",
    "content-type",
    "transfer-encoding",
    "connection",
    "upgrade",
    "te",
    "trailer",
    "keep-alive",
    "proxy-authorization",
    "proxy-connection",
    "accept",
    "mcp-session-id",
    "mcp-protocol-version",
    "last-event-id",
    "cookie",
];

/// Check every rule; the first broken one is the answer.
pub fn check(new: NewConnection) -> Result<CheckedConnection, ConnectionRuleError> {
    let stdio_transport = new
        .transport
        .as_deref()
        .is_some_and(|t| t.eq_ignore_ascii_case("stdio"));
    if new.command.is_some() || new.args.is_some() || new.env.is_some() || stdio_transport {
        return Err(ConnectionRuleError::Stdio);
    }
    let name = new.name.trim().to_owned();
    let chars = name.chars().count();
    if chars == 0 || chars > MAX_NAME_CHARS || name.chars().any(char::is_control) {
        return Err(ConnectionRuleError::Name);
    }
    let transport = match new.transport.as_deref() {
        None => Transport::StreamableHttp,
        Some(t) => Transport::parse(t).ok_or_else(|| {
            ConnectionRuleError::Url(format!(
                "transport {t:?} is not one of streamable_http, sse"
            ))
        })?,
    };
    let raw = new
        .url
        .ok_or_else(|| ConnectionRuleError::Url("url is required".into()))?;
    if raw.len() > MAX_URL_BYTES {
        return Err(ConnectionRuleError::Url(format!(
            "longer than {MAX_URL_BYTES} bytes"
        )));
    }
    let url = Url::parse(raw.trim()).map_err(|e| ConnectionRuleError::Url(e.to_string()))?;
    match url.scheme() {
        "https" => {}
        "stdio" | "file" | "unix" => return Err(ConnectionRuleError::Stdio),
        other => return Err(ConnectionRuleError::Scheme(other.to_owned())),
    }
    if !url.username().is_empty() || url.password().is_some() {
        return Err(ConnectionRuleError::UserInfo);
    }
    let host = url
        .host_str()
        .ok_or_else(|| ConnectionRuleError::Url("it has no host".into()))?;
    check_host(host)
        .map_err(|refusal| ConnectionRuleError::Host(format!("{host} is {refusal}")))?;
    if new.headers.len() > MAX_HEADERS {
        return Err(ConnectionRuleError::Header(format!(
            "at most {MAX_HEADERS} headers"
        )));
    }
    let mut headers = BTreeMap::new();
    for (header, value) in new.headers {
        let lower = header.to_ascii_lowercase();
        if hyper::header::HeaderName::from_bytes(lower.as_bytes()).is_err() {
            return Err(ConnectionRuleError::Header(format!(
                "{header:?} is not a header name"
            )));
        }
        if RESERVED_HEADERS.contains(&lower.as_str()) {
            return Err(ConnectionRuleError::Header(format!(
                "{header} is set by the transport itself and cannot be configured"
            )));
        }
        let secret: SecretHeader = serde_json::from_value(value).map_err(|_| {
            ConnectionRuleError::Header(format!(
                "header {header} must name a project secret, as {{\"secret\": \"NAME\", \"format\": \"Bearer {{}}\"}}; a value typed into a connection is never stored"
            ))
        })?;
        crate::connections::secrets::check_name(&secret.secret)
            .map_err(|e| ConnectionRuleError::Header(e.to_string()))?;
        if secret.format.matches("{}").count() != 1
            || secret.format.chars().any(|c| c.is_control())
            || secret.format.len() > 256
        {
            return Err(ConnectionRuleError::Header(format!(
                "header {header}'s format must hold `{{}}` exactly once (where the secret goes), with no control characters"
            )));
        }
        if headers.insert(lower.clone(), secret).is_some() {
            return Err(ConnectionRuleError::Header(format!(
                "header {header} is named twice"
            )));
        }
    }
    Ok(CheckedConnection {
        name,
        url: url.to_string(),
        transport,
        headers,
    })
}

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS mcp_connections (
    id TEXT PRIMARY KEY,
    project_id TEXT NOT NULL,
    name TEXT NOT NULL,
    url TEXT NOT NULL,
    transport TEXT NOT NULL,
    headers TEXT NOT NULL,
    created_by TEXT NOT NULL,
    created_at_ms INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS mcp_connections_project ON mcp_connections(project_id, created_at_ms);
CREATE TABLE IF NOT EXISTS mcp_credentials (
    connection_id TEXT PRIMARY KEY REFERENCES mcp_connections(id),
    sealed BLOB NOT NULL,
    updated_at_ms INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS mcp_apps (
    key TEXT PRIMARY KEY,
    client_id TEXT NOT NULL,
    sealed_secret BLOB,
    updated_at_ms INTEGER NOT NULL,
    issuer TEXT
);
CREATE TABLE IF NOT EXISTS mcp_sign_ins (
    state_hash TEXT PRIMARY KEY,
    user_id TEXT NOT NULL,
    sealed BLOB NOT NULL,
    started_at_ms INTEGER NOT NULL
);
PRAGMA user_version = 4;
";

/// The same tables in the cluster's PostgreSQL (`[cluster] database_url`), in the namespace
/// `agentd`: integers `BIGINT`, sealed bytes `BYTEA`, and a `rowid` column numbering the
/// connections as they are inserted (PostgreSQL has none of its own), so the SQL that lists
/// them in order is the same on both. One migration per version; never edit one that has
/// shipped, add the next.
pub const POSTGRES_MIGRATIONS: &[&str] = &[
    // 1: connections, their sealed sign-ins and the operator's sign-in apps.
    "
CREATE TABLE mcp_connections (
    id TEXT PRIMARY KEY, project_id TEXT NOT NULL, name TEXT NOT NULL, url TEXT NOT NULL,
    transport TEXT NOT NULL, headers TEXT NOT NULL, created_by TEXT NOT NULL,
    created_at_ms BIGINT NOT NULL, rowid BIGINT GENERATED ALWAYS AS IDENTITY);
CREATE INDEX mcp_connections_project ON mcp_connections (project_id, created_at_ms);
CREATE TABLE mcp_credentials (
    connection_id TEXT PRIMARY KEY REFERENCES mcp_connections(id), sealed BYTEA NOT NULL,
    updated_at_ms BIGINT NOT NULL);
CREATE TABLE mcp_apps (
    key TEXT PRIMARY KEY, client_id TEXT NOT NULL, sealed_secret BYTEA,
    updated_at_ms BIGINT NOT NULL);
",
    // 2: sign-ins waiting for their callback, so the callback may reach any host.
    "
CREATE TABLE mcp_sign_ins (
    state_hash TEXT PRIMARY KEY, user_id TEXT NOT NULL, sealed BYTEA NOT NULL,
    started_at_ms BIGINT NOT NULL);
",
    // 3: the issuer each operator sign-in app is pinned to (issue 42); NULL (an app set
    // before) is never used until an operator sets it.
    "
ALTER TABLE mcp_apps ADD COLUMN issuer TEXT;
",
];

/// agentd's MCP connection tables in PostgreSQL, migrated under the advisory lock "awagmcpc".
pub const POSTGRES_SCHEMA: agentworks_daemon::postgres::Schema =
    agentworks_daemon::postgres::Schema {
        daemon: "agentd",
        namespace: Some("agentd"),
        version_table: "mcp_connections_schema",
        lock_key: 0x6177_6167_6d63_7063,
        migrations: POSTGRES_MIGRATIONS,
    };

const COLUMNS: &str = "id, project_id, name, url, transport, headers, created_by, created_at_ms";

fn row_connection(r: &Row<'_>) -> Result<(McpConnection, String), DbError> {
    let transport: String = r.get(4)?;
    Ok((
        McpConnection {
            id: r.get(0)?,
            project_id: r.get(1)?,
            name: r.get(2)?,
            url: r.get(3)?,
            // An unknown transport cannot be stored through `add`; read it as the default.
            transport: Transport::parse(&transport).unwrap_or(Transport::StreamableHttp),
            headers: BTreeMap::new(),
            created_by: r.get(6)?,
            created_at_ms: r.get(7)?,
        },
        r.get(5)?,
    ))
}

/// Why a sign-in waiting for its callback was not taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SignInTakeRefusal {
    /// No such sign-in, or it expired or was taken already.
    Unknown,
    /// Another person started it.
    NotYours,
}

/// A cheap-to-clone handle on the connection store. Calls block: run them off the async workers.
#[derive(Clone)]
pub struct ConnectionStore {
    pub(crate) db: Database,
}

fn row_app(r: &Row<'_>) -> Result<StoredApp, DbError> {
    Ok(StoredApp {
        key: r.get(0)?,
        client_id: r.get(1)?,
        sealed_secret: r.get(2)?,
        updated_at_ms: r.get(3)?,
        issuer: r.get(4)?,
    })
}

/// The columns [`row_app`] reads.
const APP_COLUMNS: &str = "key, client_id, sealed_secret, updated_at_ms, issuer";

/// The connection read, with its headers parsed.
fn with_headers(
    (mut connection, headers): (McpConnection, String),
) -> Result<McpConnection, ConnectionStoreError> {
    connection.headers = serde_json::from_str(&headers)?;
    Ok(connection)
}

impl ConnectionStore {
    /// The SQLite store at `path` (one host).
    pub fn open(path: &Path) -> Result<ConnectionStore, ConnectionStoreError> {
        let err = |source| ConnectionStoreError::Open {
            path: path.to_owned(),
            source,
        };
        let db = Database::open_sqlite(path, SCHEMA).map_err(err)?;
        if let Some(conn) = db.sqlite() {
            // A store from before sign-in apps were pinned to an issuer.
            crate::db::add_sqlite_column(&conn, "mcp_apps", "issuer", "TEXT").map_err(err)?;
        }
        Ok(ConnectionStore { db })
    }

    /// The store in the cluster's PostgreSQL at `url` (several agentd hosts share it), its
    /// schema migrated first.
    pub fn open_postgres(url: &str) -> Result<ConnectionStore, ConnectionStoreError> {
        Self::on_postgres(&crate::db::connect_postgres(url)?)
    }

    /// The store on agentd's `pool` to the cluster's database, which its other stores share
    /// ([`crate::db::connect_postgres`]), its schema migrated first.
    pub fn on_postgres(
        pool: &agentworks_daemon::postgres::Pool,
    ) -> Result<ConnectionStore, ConnectionStoreError> {
        let db =
            Database::on_postgres(pool, &POSTGRES_SCHEMA, agentworks_support::clock::now_ms())?;
        Ok(ConnectionStore { db })
    }

    /// Store a checked connection; `Ok(Err(TooMany))` when the project is full. The count and
    /// the insert are one transaction, so two adds racing cannot pass the limit.
    pub fn add(
        &self,
        project_id: &str,
        created_by: &str,
        checked: CheckedConnection,
    ) -> Result<Result<McpConnection, ConnectionRuleError>, ConnectionStoreError> {
        let connection = McpConnection {
            id: format!("mcpc_{}", hex::encode(rand::random::<[u8; 8]>())),
            project_id: project_id.to_owned(),
            name: checked.name,
            url: checked.url,
            transport: checked.transport,
            headers: checked.headers,
            created_by: created_by.to_owned(),
            created_at_ms: agentworks_support::clock::now_ms(),
        };
        let headers = serde_json::to_string(&connection.headers)?;
        let added = self.db.transaction(|tx| {
            let count: i64 = tx.query_one(
                "SELECT count(*) FROM mcp_connections WHERE project_id = ?1",
                &[&project_id],
                |r| r.get(0),
            )?;
            if usize::try_from(count).unwrap_or(usize::MAX) >= MAX_PER_PROJECT {
                return Ok(false);
            }
            tx.execute(
                &format!(
                    "INSERT INTO mcp_connections ({COLUMNS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)"
                ),
                &[
                    &connection.id,
                    &connection.project_id,
                    &connection.name,
                    &connection.url,
                    &connection.transport.as_str(),
                    &headers,
                    &connection.created_by,
                    &connection.created_at_ms,
                ],
            )?;
            Ok::<_, ConnectionStoreError>(true)
        })?;
        Ok(if added {
            Ok(connection)
        } else {
            Err(ConnectionRuleError::TooMany)
        })
    }

    /// The project's connections, oldest first.
    pub fn list(&self, project_id: &str) -> Result<Vec<McpConnection>, ConnectionStoreError> {
        self.db
            .conn()?
            .query_all(
                &format!(
                    "SELECT {COLUMNS} FROM mcp_connections WHERE project_id = ?1 \
                     ORDER BY created_at_ms, rowid"
                ),
                &[&project_id],
                row_connection,
            )?
            .into_iter()
            .map(with_headers)
            .collect()
    }

    /// One connection of the project, if it has it.
    pub fn get(
        &self,
        project_id: &str,
        id: &str,
    ) -> Result<Option<McpConnection>, ConnectionStoreError> {
        self.db
            .conn()?
            .query_opt(
                &format!("SELECT {COLUMNS} FROM mcp_connections WHERE project_id = ?1 AND id = ?2"),
                &[&project_id, &id],
                row_connection,
            )?
            .map(with_headers)
            .transpose()
    }

    /// Remove a connection of the project, and its sealed sign-in with it; whether it was there.
    pub fn remove(&self, project_id: &str, id: &str) -> Result<bool, ConnectionStoreError> {
        let removed = self.db.transaction(|tx| {
            // The sign-in first: it refers to the connection.
            tx.execute(
                "DELETE FROM mcp_credentials WHERE connection_id IN
                     (SELECT id FROM mcp_connections WHERE project_id = ?1 AND id = ?2)",
                &[&project_id, &id],
            )?;
            tx.execute(
                "DELETE FROM mcp_connections WHERE project_id = ?1 AND id = ?2",
                &[&project_id, &id],
            )
        })?;
        Ok(removed > 0)
    }

    /// Store a connection's sealed sign-in (replacing the one before); false when the
    /// connection is gone.
    pub fn put_credentials(&self, id: &str, sealed: &[u8]) -> Result<bool, ConnectionStoreError> {
        let now = agentworks_support::clock::now_ms();
        // The check and the write are one transaction: a connection removed by another host in
        // between cannot be left with a sign-in (on PostgreSQL the reference refuses it too).
        Ok(self.db.transaction(|tx| {
            let exists: bool = tx.query_one(
                "SELECT EXISTS (SELECT 1 FROM mcp_connections WHERE id = ?1)",
                &[&id],
                |r| r.get(0),
            )?;
            if !exists {
                return Ok::<_, DbError>(false);
            }
            tx.execute(
                "INSERT INTO mcp_credentials (connection_id, sealed, updated_at_ms) VALUES (?1, ?2, ?3)
                 ON CONFLICT (connection_id) DO UPDATE SET sealed = excluded.sealed,
                     updated_at_ms = excluded.updated_at_ms",
                &[&id, &sealed, &now],
            )?;
            Ok(true)
        })?)
    }

    /// Forget a connection's sign-in; whether it had one.
    pub fn remove_credentials(&self, id: &str) -> Result<bool, ConnectionStoreError> {
        Ok(self.db.conn()?.execute(
            "DELETE FROM mcp_credentials WHERE connection_id = ?1",
            &[&id],
        )? > 0)
    }

    /// A connection's sealed sign-in, if it has one.
    pub fn credentials(&self, id: &str) -> Result<Option<Vec<u8>>, ConnectionStoreError> {
        Ok(self.db.conn()?.query_opt(
            "SELECT sealed FROM mcp_credentials WHERE connection_id = ?1",
            &[&id],
            |r| r.get(0),
        )?)
    }

    /// Set (or replace) an operator sign-in app, pinned to `issuer`.
    pub fn set_app(
        &self,
        key: &str,
        client_id: &str,
        sealed_secret: Option<&[u8]>,
        issuer: &str,
    ) -> Result<StoredApp, ConnectionStoreError> {
        let now = agentworks_support::clock::now_ms();
        self.db.conn()?.execute(
            "INSERT INTO mcp_apps (key, client_id, sealed_secret, updated_at_ms, issuer) VALUES (?1, ?2, ?3, ?4, ?5)
             ON CONFLICT (key) DO UPDATE SET client_id = excluded.client_id,
                 sealed_secret = excluded.sealed_secret, updated_at_ms = excluded.updated_at_ms,
                 issuer = excluded.issuer",
            &[&key, &client_id, &sealed_secret, &now, &issuer],
        )?;
        Ok(StoredApp {
            key: key.to_owned(),
            client_id: client_id.to_owned(),
            sealed_secret: sealed_secret.map(<[u8]>::to_vec),
            issuer: Some(issuer.to_owned()),
            updated_at_ms: now,
        })
    }

    /// One operator sign-in app.
    pub fn app(&self, key: &str) -> Result<Option<StoredApp>, ConnectionStoreError> {
        Ok(self.db.conn()?.query_opt(
            &format!("SELECT {APP_COLUMNS} FROM mcp_apps WHERE key = ?1"),
            &[&key],
            row_app,
        )?)
    }

    /// Every operator sign-in app, by key.
    pub fn apps(&self) -> Result<Vec<StoredApp>, ConnectionStoreError> {
        Ok(self.db.conn()?.query_all(
            &format!("SELECT {APP_COLUMNS} FROM mcp_apps ORDER BY key"),
            &[],
            row_app,
        )?)
    }

    /// Remove an operator sign-in app; whether it was there.
    pub fn remove_app(&self, key: &str) -> Result<bool, ConnectionStoreError> {
        Ok(self
            .db
            .conn()?
            .execute("DELETE FROM mcp_apps WHERE key = ?1", &[&key])?
            > 0)
    }

    /// Keep a sign-in waiting for its callback: `sealed` under the hash of its `state`, for
    /// `user_id`. Sign-ins started before `live_since` are dropped first, and then the oldest
    /// beyond `max` in all, so started sign-ins cannot fill the store.
    pub fn put_sign_in(
        &self,
        state_hash: &str,
        user_id: &str,
        sealed: &[u8],
        now: i64,
        live_since: i64,
        max: i64,
    ) -> Result<(), ConnectionStoreError> {
        Ok(self.db.transaction(|tx| {
            tx.execute(
                "DELETE FROM mcp_sign_ins WHERE started_at_ms < ?1",
                &[&live_since],
            )?;
            tx.execute(
                "DELETE FROM mcp_sign_ins WHERE started_at_ms <= (SELECT started_at_ms
                     FROM mcp_sign_ins ORDER BY started_at_ms DESC LIMIT 1 OFFSET ?1)",
                &[&(max - 1)],
            )?;
            tx.execute(
                "INSERT INTO mcp_sign_ins (state_hash, user_id, sealed, started_at_ms)
                 VALUES (?1, ?2, ?3, ?4)",
                &[&state_hash, &user_id, &sealed, &now],
            )?;
            Ok::<_, DbError>(())
        })?)
    }

    /// Take the sign-in stored under `state_hash`, once, if `user_id` started it and it started
    /// at `live_since` or later. A sign-in of another person is left in place (who started it
    /// can still finish it); an expired one is removed.
    pub fn take_sign_in(
        &self,
        state_hash: &str,
        user_id: &str,
        live_since: i64,
    ) -> Result<Result<Vec<u8>, SignInTakeRefusal>, ConnectionStoreError> {
        Ok(self.db.transaction(|tx| {
            let found: Option<(String, i64)> = tx.query_opt(
                "SELECT user_id, started_at_ms FROM mcp_sign_ins WHERE state_hash = ?1",
                &[&state_hash],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )?;
            let Some((owner, started)) = found else {
                return Ok::<_, DbError>(Err(SignInTakeRefusal::Unknown));
            };
            if started < live_since {
                tx.execute(
                    "DELETE FROM mcp_sign_ins WHERE state_hash = ?1",
                    &[&state_hash],
                )?;
                return Ok(Err(SignInTakeRefusal::Unknown));
            }
            if owner != user_id {
                return Ok(Err(SignInTakeRefusal::NotYours));
            }
            let sealed: Option<Vec<u8>> = tx.query_opt(
                "DELETE FROM mcp_sign_ins WHERE state_hash = ?1 RETURNING sealed",
                &[&state_hash],
                |r| r.get(0),
            )?;
            Ok(sealed.ok_or(SignInTakeRefusal::Unknown))
        })?)
    }

    /// Which of the project's connections have a sign-in stored.
    pub fn signed_in(
        &self,
        project_id: &str,
    ) -> Result<std::collections::HashSet<String>, ConnectionStoreError> {
        let ids = self.db.conn()?.query_all(
            "SELECT c.id FROM mcp_connections c JOIN mcp_credentials k ON k.connection_id = c.id
             WHERE c.project_id = ?1",
            &[&project_id],
            |r| r.get::<String>(0),
        )?;
        Ok(ids.into_iter().collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn new(value: serde_json::Value) -> NewConnection {
        serde_json::from_value(value).expect("shape")
    }

    fn refused(value: serde_json::Value) -> ConnectionRuleError {
        check(new(value)).expect_err("refused")
    }

    #[test]
    fn a_remote_https_server_with_a_secret_header_is_accepted() {
        let checked = check(new(json!({
            "name": " Linear ",
            "url": "https://mcp.linear.app/mcp?team=42",
            "headers": {"Authorization": {"secret": "LINEAR_API_KEY", "format": "Bearer {}"},
                        "X-Team": {"secret": "TEAM"}},
        })))
        .unwrap();
        assert_eq!(checked.name, "Linear");
        assert_eq!(checked.transport, Transport::StreamableHttp);
        assert_eq!(checked.headers["authorization"].format, "Bearer {}");
        assert_eq!(checked.headers["x-team"].format, "{}");
        assert_eq!(shown_url(&checked.url), "https://mcp.linear.app/mcp");
    }

    #[test]
    fn stdio_in_every_spelling_is_refused_by_name() {
        for value in [
            json!({"name": "fs", "command": "npx", "args": ["server"]}),
            json!({"name": "fs", "url": "https://example.com/mcp", "command": "sh"}),
            json!({"name": "fs", "transport": "stdio", "url": "https://example.com/mcp"}),
            json!({"name": "fs", "env": {"A": "b"}, "url": "https://example.com/mcp"}),
            json!({"name": "fs", "url": "stdio://npx"}),
            json!({"name": "fs", "url": "file:///usr/bin/server"}),
        ] {
            assert_eq!(
                refused(value.clone()),
                ConnectionRuleError::Stdio,
                "{value}"
            );
        }
    }

    #[test]
    fn plain_http_user_info_and_refused_hosts_are_refused() {
        assert_eq!(
            refused(json!({"name": "a", "url": "http://example.com/mcp"})).code(),
            "invalid_url"
        );
        assert_eq!(
            refused(json!({"name": "a", "url": "https://me:pw@example.com/mcp"})),
            ConnectionRuleError::UserInfo
        );
        for host in [
            "127.0.0.1",
            "localhost",
            "10.0.0.8",
            "169.254.169.254",
            "100.100.100.200",
            "[::ffff:127.0.0.1]",
            "[::1]",
            "[fd00:ec2::254]",
            "metadata.google.internal",
            "0x7f.1",
            "2130706433",
        ] {
            let error = refused(json!({"name": "a", "url": format!("https://{host}/mcp")}));
            assert_eq!(error.code(), "address_refused", "{host}: {error}");
        }
    }

    #[test]
    fn header_values_typed_in_reserved_names_and_bad_formats_are_refused() {
        let with = |headers: serde_json::Value| {
            refused(json!({"name": "a", "url": "https://example.com/mcp", "headers": headers}))
        };
        for headers in [
            json!({"Authorization": "Bearer sk-live-123"}),
            json!({"Authorization": {"value": "sk-live-123"}}),
            json!({"Authorization": {"secret": "lower_case"}}),
            json!({"Authorization": {"secret": "KEY", "format": "Bearer"}}),
            json!({"Authorization": {"secret": "KEY", "format": "{} {}"}}),
            json!({"Host": {"secret": "KEY"}}),
            json!({"Mcp-Session-Id": {"secret": "KEY"}}),
            json!({"bad header": {"secret": "KEY"}}),
            json!({"X-A": {"secret": "KEY"}, "x-a": {"secret": "KEY"}}),
        ] {
            assert_eq!(with(headers.clone()).code(), "invalid_header", "{headers}");
        }
    }

    #[test]
    fn names_are_checked_and_may_repeat_but_internal_names_never_do() {
        assert_eq!(
            refused(json!({"name": "  ", "url": "https://example.com/"})),
            ConnectionRuleError::Name
        );
        assert_eq!(
            refused(json!({"name": "a\u{0}b", "url": "https://example.com/"})),
            ConnectionRuleError::Name
        );
        let dir = tempfile::tempdir().unwrap();
        let store = ConnectionStore::open(&dir.path().join("c.db")).unwrap();
        let checked = check(new(
            json!({"name": "Docs", "url": "https://example.com/mcp?k=v"}),
        ))
        .unwrap();
        let a = store.add("p1", "u1", checked.clone()).unwrap().unwrap();
        let b = store.add("p1", "u1", checked.clone()).unwrap().unwrap();
        assert_eq!(a.name, b.name);
        assert_ne!(a.id, b.id);
        assert!(a.id.starts_with("mcpc_") && a.id.len() == 5 + 16);
        // The whole URL is kept; only what is shown loses the query.
        assert_eq!(a.url, "https://example.com/mcp?k=v");
        assert_eq!(a.shown()["url"], "https://example.com/mcp");
        assert_eq!(store.list("p1").unwrap(), vec![a.clone(), b.clone()]);
        assert!(store.list("p2").unwrap().is_empty());
        // Another project's id cannot reach it.
        assert_eq!(store.get("p2", &a.id).unwrap(), None);
        assert!(!store.remove("p2", &a.id).unwrap());
        assert!(store.remove("p1", &a.id).unwrap());
        assert_eq!(store.list("p1").unwrap(), vec![b]);
    }

    #[test]
    fn a_sign_in_is_kept_per_connection_and_removed_with_it() {
        let dir = tempfile::tempdir().unwrap();
        let store = ConnectionStore::open(&dir.path().join("c.db")).unwrap();
        let checked = check(new(json!({"name": "x", "url": "https://example.com/"}))).unwrap();
        let a = store.add("p", "u", checked.clone()).unwrap().unwrap();
        let b = store.add("p", "u", checked).unwrap().unwrap();
        assert!(store.put_credentials(&a.id, b"sealed-a").unwrap());
        assert!(store.put_credentials(&a.id, b"sealed-a2").unwrap());
        assert_eq!(
            store.credentials(&a.id).unwrap().as_deref(),
            Some(&b"sealed-a2"[..])
        );
        assert_eq!(store.credentials(&b.id).unwrap(), None);
        assert_eq!(store.signed_in("p").unwrap(), [a.id.clone()].into());
        // Another project's id removes nothing; the project's own removes both rows.
        assert!(!store.remove("q", &a.id).unwrap());
        assert!(store.credentials(&a.id).unwrap().is_some());
        assert!(store.remove("p", &a.id).unwrap());
        assert_eq!(store.credentials(&a.id).unwrap(), None);
        // A sign-in that finishes after its connection was removed is not stored.
        assert!(!store.put_credentials(&a.id, b"late").unwrap());
        assert!(store.signed_in("p").unwrap().is_empty());
    }

    #[test]
    fn providers_share_one_app_and_other_servers_are_their_host() {
        for (url, key) in [
            ("https://gmail.mcp.googleapis.com/mcp", "google"),
            ("https://drive.google.com/mcp", "google"),
            ("https://api.githubcopilot.com/mcp/", "github"),
            ("https://github.com/mcp", "github"),
            ("https://mcp.slack.com/mcp", "slack"),
            ("https://notgoogle.com/mcp", "notgoogle.com"),
            ("https://MCP.Linear.app./mcp", "mcp.linear.app"),
            ("https://11.2.3.4:8443/mcp", "11.2.3.4"),
        ] {
            assert_eq!(provider_key(url), key, "{url}");
        }
        let dir = tempfile::tempdir().unwrap();
        let store = ConnectionStore::open(&dir.path().join("c.db")).unwrap();
        store
            .set_app(
                "google",
                "id-1",
                Some(b"sealed"),
                "https://accounts.google.com",
            )
            .unwrap();
        store
            .set_app("google", "id-2", None, "https://oauth2.google.example")
            .unwrap();
        let app = store.app("google").unwrap().unwrap();
        assert_eq!((app.client_id.as_str(), app.sealed_secret), ("id-2", None));
        assert_eq!(app.issuer.as_deref(), Some("https://oauth2.google.example"));
        assert_eq!(store.apps().unwrap().len(), 1);
        assert!(store.remove_app("google").unwrap());
        assert_eq!(store.app("google").unwrap(), None);
    }

    #[test]
    fn a_project_holds_at_most_its_limit() {
        let dir = tempfile::tempdir().unwrap();
        let store = ConnectionStore::open(&dir.path().join("c.db")).unwrap();
        let checked = check(new(json!({"name": "x", "url": "https://example.com/"}))).unwrap();
        for _ in 0..MAX_PER_PROJECT {
            store.add("p", "u", checked.clone()).unwrap().unwrap();
        }
        assert_eq!(
            store.add("p", "u", checked.clone()).unwrap(),
            Err(ConnectionRuleError::TooMany)
        );
        assert!(store.add("q", "u", checked).unwrap().is_ok());
    }
}
