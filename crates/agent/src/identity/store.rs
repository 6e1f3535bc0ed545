//! The identity store: SQLite at `<state>/agent/agentd.db` (WAL, `synchronous=FULL`).
//!
//! Users, projects (with their policy), members and roles, personal access tokens (hashed,
//! with scopes, an optional project restriction, expiry, revocation and folder caps). Calls
//! are short and synchronous; async callers run them on a blocking thread. Nothing here
//! decides access: `authority::resolve` does, from what this returns.

use crate::db::{Database, DbError, Row, Sql, TransactionError};
use crate::identity::authority::{FileGuard, Role, Scope};
use crate::identity::token;
pub use agentworks_contract::agentd::ProjectKind;
use agentworks_core::guard::Guard;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use std::sync::{Arc, LazyLock, OnceLock};
use tokio::sync::mpsc;

#[derive(Debug, thiserror::Error)]
pub enum IdentityError {
    #[error("the identity store {path} cannot be opened: {source}")]
    Open {
        path: PathBuf,
        source: rusqlite::Error,
    },
    /// The cluster's database (`[cluster] database_url`) cannot be reached or migrated.
    #[error("the identity store (PostgreSQL) cannot be opened: {0}")]
    OpenShared(#[from] crate::db::OpenError),
    #[error("identity store query failed: {0}")]
    Query(#[from] DbError),
    #[error("{0}")]
    Invalid(String),
    #[error("{kind} {name:?} does not exist")]
    NotFound { kind: &'static str, name: String },
    #[error("{kind} {name:?} already exists")]
    Exists { kind: &'static str, name: String },
}

impl From<rusqlite::Error> for IdentityError {
    fn from(error: rusqlite::Error) -> IdentityError {
        IdentityError::Query(error.into())
    }
}

impl TransactionError for IdentityError {
    fn as_db_error(&self) -> Option<&DbError> {
        match self {
            IdentityError::Query(error) => Some(error),
            _ => None,
        }
    }
}

impl IdentityError {
    pub fn code(&self) -> &'static str {
        match self {
            IdentityError::Open { .. } | IdentityError::OpenShared(_) | IdentityError::Query(_) => {
                "identity_unavailable"
            }
            IdentityError::Invalid(_) => "invalid_request",
            IdentityError::NotFound { .. } => "not_found",
            IdentityError::Exists { .. } => "already_exists",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct User {
    pub id: String,
    pub name: String,
    pub disabled: bool,
    pub created_at_ms: i64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Project {
    pub id: String,
    pub name: String,
    pub kind: ProjectKind,
    /// The folder's name under the documents root.
    pub folder: String,
    /// The policy as stored (JSON of a guard); parsed by the authority, never trusted blindly.
    pub policy: String,
    pub created_at_ms: i64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Member {
    pub project: String,
    pub user: String,
    pub user_id: String,
    pub role: Role,
}

/// A token as listed: never its secret.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TokenInfo {
    pub id: String,
    pub user_id: String,
    pub user_name: String,
    pub label: String,
    pub scopes: Vec<Scope>,
    pub project_id: Option<String>,
    pub file_guard: FileGuard,
    pub expires_at_ms: Option<i64>,
    pub revoked_at_ms: Option<i64>,
    pub created_at_ms: i64,
    /// The OAuth grant an access token was issued under (`None` for a personal token).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub grant_id: Option<String>,
    /// A grant's consented projects (ids): the token reaches no other.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub projects: Option<Vec<String>>,
    /// The resource a grant's token was issued for (RFC 8707): it is accepted nowhere else.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub audience: Option<String>,
}

impl TokenInfo {
    /// The projects this token may reach, `None` for all: a personal token's one project or
    /// an OAuth grant's consented ones.
    pub fn project_restriction(&self) -> Option<Vec<String>> {
        match (&self.projects, &self.project_id) {
            (Some(projects), _) => Some(projects.clone()),
            (None, Some(project)) => Some(vec![project.clone()]),
            (None, None) => None,
        }
    }
}

pub use agentworks_contract::agentd::TokenRefusal;

/// Why a presented bearer token names no caller.
#[derive(Debug, thiserror::Error)]
pub enum TokenCheckError {
    /// The token was checked and refused.
    #[error("{}", .0.message())]
    Refused(TokenRefusal),
    /// The store could not be read: every endpoint refuses rather than guesses.
    #[error(transparent)]
    Store(#[from] IdentityError),
    /// The blocking task that reads the store failed.
    #[error("the token check failed: {0}")]
    Task(String),
}

/// New token parameters.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct TokenRequest {
    pub user: String,
    pub label: String,
    pub scopes: Vec<Scope>,
    pub project: Option<String>,
    pub expires_at_ms: Option<i64>,
    pub file_guard: FileGuard,
}

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS users (
    id TEXT PRIMARY KEY, name TEXT NOT NULL UNIQUE, disabled INTEGER NOT NULL DEFAULT 0,
    created_at_ms INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS projects (
    id TEXT PRIMARY KEY, name TEXT NOT NULL UNIQUE, kind TEXT NOT NULL, folder TEXT NOT NULL UNIQUE,
    policy TEXT NOT NULL, created_at_ms INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS members (
    project_id TEXT NOT NULL REFERENCES projects(id), user_id TEXT NOT NULL REFERENCES users(id),
    role TEXT NOT NULL, PRIMARY KEY (project_id, user_id));
-- a user's memberships (every MCP call reads them): without it, a scan of the whole table
CREATE INDEX IF NOT EXISTS members_by_user ON members (user_id);
CREATE TABLE IF NOT EXISTS tokens (
    id TEXT PRIMARY KEY, user_id TEXT NOT NULL REFERENCES users(id), label TEXT NOT NULL,
    secret_hash TEXT NOT NULL, scopes TEXT NOT NULL, project_id TEXT REFERENCES projects(id),
    file_guard TEXT NOT NULL, expires_at_ms INTEGER, revoked_at_ms INTEGER, created_at_ms INTEGER NOT NULL,
    grant_id TEXT);
CREATE INDEX IF NOT EXISTS tokens_revoked ON tokens (revoked_at_ms);
-- the OAuth authorization server (identity::oauth): registered clients, grants, codes and
-- refresh tokens; a grant's access tokens are rows in `tokens` with its grant_id
CREATE TABLE IF NOT EXISTS oauth_clients (
    id TEXT PRIMARY KEY, name TEXT, redirect_uris TEXT NOT NULL, auth_method TEXT NOT NULL,
    secret_hash TEXT, created_at_ms INTEGER NOT NULL, expires_at_ms INTEGER);
CREATE TABLE IF NOT EXISTS oauth_grants (
    id TEXT PRIMARY KEY, user_id TEXT NOT NULL REFERENCES users(id), client_id TEXT NOT NULL,
    client_name TEXT NOT NULL, redirect_uri TEXT NOT NULL, scopes TEXT NOT NULL,
    projects TEXT NOT NULL, file_guard TEXT NOT NULL, resource TEXT NOT NULL,
    created_at_ms INTEGER NOT NULL, last_used_at_ms INTEGER, revoked_at_ms INTEGER);
CREATE TABLE IF NOT EXISTS oauth_codes (
    code_hash TEXT PRIMARY KEY, grant_id TEXT NOT NULL REFERENCES oauth_grants(id),
    redirect_uri TEXT NOT NULL, code_challenge TEXT NOT NULL, expires_at_ms INTEGER NOT NULL,
    used_at_ms INTEGER);
CREATE TABLE IF NOT EXISTS oauth_refresh_tokens (
    id TEXT PRIMARY KEY, grant_id TEXT NOT NULL REFERENCES oauth_grants(id),
    secret_hash TEXT NOT NULL, scopes TEXT NOT NULL, created_at_ms INTEGER NOT NULL,
    expires_at_ms INTEGER NOT NULL, used_at_ms INTEGER);
-- console accounts (identity::accounts): passwords, one-time codes, sessions
CREATE TABLE IF NOT EXISTS passwords (
    user_id TEXT PRIMARY KEY REFERENCES users(id), phc TEXT NOT NULL, updated_at_ms INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS one_time_codes (
    code_hash TEXT PRIMARY KEY, user_id TEXT NOT NULL REFERENCES users(id), kind TEXT NOT NULL,
    expires_at_ms INTEGER NOT NULL, used_at_ms INTEGER, created_at_ms INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS sessions (
    id TEXT PRIMARY KEY, secret_hash TEXT NOT NULL UNIQUE, user_id TEXT NOT NULL REFERENCES users(id),
    token_id TEXT NOT NULL REFERENCES tokens(id), csrf_token TEXT NOT NULL,
    created_at_ms INTEGER NOT NULL, last_used_at_ms INTEGER NOT NULL, expires_at_ms INTEGER NOT NULL);
-- device logins in progress (identity::device_logins)
CREATE TABLE IF NOT EXISTS device_logins (
    device_code_hash TEXT PRIMARY KEY, user_code TEXT NOT NULL UNIQUE, label TEXT NOT NULL,
    created_at_ms INTEGER NOT NULL, last_poll_at_ms INTEGER, approved_for TEXT,
    denied INTEGER NOT NULL DEFAULT 0, redeemed_at_ms INTEGER,
    address TEXT NOT NULL DEFAULT '');
-- failed sign-ins and other guesses, by key (identity::attempt_limits)
CREATE TABLE IF NOT EXISTS attempt_failures (
    id TEXT PRIMARY KEY, key TEXT NOT NULL, at_ms INTEGER NOT NULL);
CREATE INDEX IF NOT EXISTS attempt_failures_by_key ON attempt_failures (key, at_ms);
CREATE INDEX IF NOT EXISTS attempt_failures_by_time ON attempt_failures (at_ms);
-- OAuth authorization requests waiting for consent (identity::authorization_requests)
CREATE TABLE IF NOT EXISTS oauth_requests (
    id_hash TEXT PRIMARY KEY, request TEXT NOT NULL, created_at_ms INTEGER NOT NULL,
    decided INTEGER NOT NULL DEFAULT 0, client_id TEXT NOT NULL DEFAULT '',
    address TEXT NOT NULL DEFAULT '');
";

/// The same tables in the cluster's PostgreSQL (`[cluster] database_url`), in the namespace
/// `agentd`: every integer a `BIGINT`, as [`crate::db`] reads them. One migration per version;
/// never edit one that has shipped, add the next.
pub const POSTGRES_MIGRATIONS: &[&str] = &[
    // 1: users, projects, members, tokens, the OAuth server's rows and console accounts.
    "
CREATE TABLE users (
    id TEXT PRIMARY KEY, name TEXT NOT NULL UNIQUE, disabled BIGINT NOT NULL DEFAULT 0,
    created_at_ms BIGINT NOT NULL);
CREATE TABLE projects (
    id TEXT PRIMARY KEY, name TEXT NOT NULL UNIQUE, kind TEXT NOT NULL, folder TEXT NOT NULL UNIQUE,
    policy TEXT NOT NULL, created_at_ms BIGINT NOT NULL);
CREATE TABLE members (
    project_id TEXT NOT NULL REFERENCES projects(id), user_id TEXT NOT NULL REFERENCES users(id),
    role TEXT NOT NULL, PRIMARY KEY (project_id, user_id));
CREATE INDEX members_by_user ON members (user_id);
CREATE TABLE tokens (
    id TEXT PRIMARY KEY, user_id TEXT NOT NULL REFERENCES users(id), label TEXT NOT NULL,
    secret_hash TEXT NOT NULL, scopes TEXT NOT NULL, project_id TEXT REFERENCES projects(id),
    file_guard TEXT NOT NULL, expires_at_ms BIGINT, revoked_at_ms BIGINT,
    created_at_ms BIGINT NOT NULL, grant_id TEXT);
CREATE INDEX tokens_revoked ON tokens (revoked_at_ms);
CREATE INDEX tokens_grant ON tokens (grant_id);
CREATE TABLE oauth_clients (
    id TEXT PRIMARY KEY, name TEXT, redirect_uris TEXT NOT NULL, auth_method TEXT NOT NULL,
    secret_hash TEXT, created_at_ms BIGINT NOT NULL, expires_at_ms BIGINT);
CREATE TABLE oauth_grants (
    id TEXT PRIMARY KEY, user_id TEXT NOT NULL REFERENCES users(id), client_id TEXT NOT NULL,
    client_name TEXT NOT NULL, redirect_uri TEXT NOT NULL, scopes TEXT NOT NULL,
    projects TEXT NOT NULL, file_guard TEXT NOT NULL, resource TEXT NOT NULL,
    created_at_ms BIGINT NOT NULL, last_used_at_ms BIGINT, revoked_at_ms BIGINT);
CREATE TABLE oauth_codes (
    code_hash TEXT PRIMARY KEY, grant_id TEXT NOT NULL REFERENCES oauth_grants(id),
    redirect_uri TEXT NOT NULL, code_challenge TEXT NOT NULL, expires_at_ms BIGINT NOT NULL,
    used_at_ms BIGINT);
CREATE TABLE oauth_refresh_tokens (
    id TEXT PRIMARY KEY, grant_id TEXT NOT NULL REFERENCES oauth_grants(id),
    secret_hash TEXT NOT NULL, scopes TEXT NOT NULL, created_at_ms BIGINT NOT NULL,
    expires_at_ms BIGINT NOT NULL, used_at_ms BIGINT);
CREATE TABLE passwords (
    user_id TEXT PRIMARY KEY REFERENCES users(id), phc TEXT NOT NULL, updated_at_ms BIGINT NOT NULL);
CREATE TABLE one_time_codes (
    code_hash TEXT PRIMARY KEY, user_id TEXT NOT NULL REFERENCES users(id), kind TEXT NOT NULL,
    expires_at_ms BIGINT NOT NULL, used_at_ms BIGINT, created_at_ms BIGINT NOT NULL);
CREATE TABLE sessions (
    id TEXT PRIMARY KEY, secret_hash TEXT NOT NULL UNIQUE, user_id TEXT NOT NULL REFERENCES users(id),
    token_id TEXT NOT NULL REFERENCES tokens(id), csrf_token TEXT NOT NULL,
    created_at_ms BIGINT NOT NULL, last_used_at_ms BIGINT NOT NULL, expires_at_ms BIGINT NOT NULL);
",
    // 2: device logins in progress, failed attempts and authorization requests waiting for
    // consent, so any host answers a login or a consent another host started, and every host
    // counts the same failures.
    "
CREATE TABLE device_logins (
    device_code_hash TEXT PRIMARY KEY, user_code TEXT NOT NULL UNIQUE, label TEXT NOT NULL,
    created_at_ms BIGINT NOT NULL, last_poll_at_ms BIGINT, approved_for TEXT,
    denied BIGINT NOT NULL DEFAULT 0, redeemed_at_ms BIGINT);
CREATE TABLE attempt_failures (id TEXT PRIMARY KEY, key TEXT NOT NULL, at_ms BIGINT NOT NULL);
CREATE INDEX attempt_failures_by_key ON attempt_failures (key, at_ms);
CREATE INDEX attempt_failures_by_time ON attempt_failures (at_ms);
CREATE TABLE oauth_requests (
    id_hash TEXT PRIMARY KEY, request TEXT NOT NULL, created_at_ms BIGINT NOT NULL,
    decided BIGINT NOT NULL DEFAULT 0);
",
    // 3: who is waiting (issue 42): the client and the source address of each authorization
    // request, and the source address of each device login, so each is bounded on its own.
    "
ALTER TABLE oauth_requests ADD COLUMN client_id TEXT NOT NULL DEFAULT '';
ALTER TABLE oauth_requests ADD COLUMN address TEXT NOT NULL DEFAULT '';
CREATE INDEX oauth_requests_by_client ON oauth_requests (client_id);
CREATE INDEX oauth_requests_by_address ON oauth_requests (address);
ALTER TABLE device_logins ADD COLUMN address TEXT NOT NULL DEFAULT '';
CREATE INDEX device_logins_by_address ON device_logins (address);
",
];

/// agentd's identity tables in PostgreSQL, migrated under the advisory lock "awagidnt".
pub const POSTGRES_SCHEMA: agentworks_daemon::postgres::Schema =
    agentworks_daemon::postgres::Schema {
        daemon: "agentd",
        namespace: Some("agentd"),
        version_table: "identity_schema",
        lock_key: 0x6177_6167_6964_6e74,
        migrations: POSTGRES_MIGRATIONS,
    };

pub use agentworks_support::clock::now_ms;

pub(crate) fn new_id(prefix: &str) -> String {
    format!("{prefix}_{}", hex::encode(rand::random::<[u8; 8]>()))
}

/// Names of users and projects: short, lowercase, safe in paths and on command lines.
pub fn validate_name(kind: &str, name: &str) -> Result<(), IdentityError> {
    let ok = !name.is_empty()
        && name.len() <= 64
        && name
            .bytes()
            .next()
            .is_some_and(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"-_.".contains(&b));
    if ok {
        Ok(())
    } else {
        Err(IdentityError::Invalid(format!(
            "{kind} name {name:?} must be 1-64 characters of a-z, 0-9, '-', '_', '.', starting with a letter or digit"
        )))
    }
}

/// A cheap-to-clone handle on the store.
#[derive(Clone)]
pub struct IdentityStore {
    db: Database,
    /// In a cluster, where a revoked token's id goes once its revocation is committed (agentd
    /// publishes it on NATS: `crate::clients::revocations`). Unset on one host.
    revoked: Arc<OnceLock<mpsc::UnboundedSender<String>>>,
}

fn row_user(r: &Row<'_>) -> Result<User, DbError> {
    Ok(User {
        id: r.get(0)?,
        name: r.get(1)?,
        disabled: r.get::<i64>(2)? != 0,
        created_at_ms: r.get(3)?,
    })
}

pub(crate) fn row_project(r: &Row<'_>) -> Result<Project, DbError> {
    let kind: String = r.get(2)?;
    Ok(Project {
        id: r.get(0)?,
        name: r.get(1)?,
        kind: ProjectKind::parse(&kind).unwrap_or(ProjectKind::Workflow),
        folder: r.get(3)?,
        policy: r.get(4)?,
        created_at_ms: r.get(5)?,
    })
}

fn row_token(r: &Row<'_>) -> Result<(TokenInfo, String), DbError> {
    let scopes: String = r.get(5)?;
    let guard: String = r.get(7)?;
    // Unreadable scopes or caps fail closed: no scope, nothing writable.
    let scopes: Vec<Scope> = serde_json::from_str(&scopes).unwrap_or_default();
    let file_guard: FileGuard = serde_json::from_str(&guard).unwrap_or(FileGuard {
        write_folders: Some(Vec::new()),
        read_only_folders: Vec::new(),
    });
    let grant_id: Option<String> = r.get(11)?;
    // A grant's token: its projects and audience come from the grant row; a grant that is
    // missing, revoked or unreadable leaves the token revoked and reaching nothing.
    let grant_projects: Option<String> = r.get(12)?;
    let grant_revoked: Option<i64> = r.get(14)?;
    let projects = grant_id.as_ref().map(|_| {
        grant_projects
            .as_deref()
            .and_then(|p| serde_json::from_str::<Vec<String>>(p).ok())
            .unwrap_or_default()
    });
    let mut revoked_at_ms: Option<i64> = r.get(9)?;
    if grant_id.is_some() && (grant_projects.is_none() || grant_revoked.is_some()) {
        revoked_at_ms = revoked_at_ms.or(grant_revoked).or(Some(0));
    }
    let audience = grant_id
        .as_ref()
        .map(|_| r.get::<Option<String>>(13))
        .transpose()?
        .map(|a| a.unwrap_or_default());
    Ok((
        TokenInfo {
            id: r.get(0)?,
            user_id: r.get(1)?,
            user_name: r.get(2)?,
            label: r.get(3)?,
            scopes,
            project_id: r.get(6)?,
            file_guard,
            expires_at_ms: r.get(8)?,
            revoked_at_ms,
            created_at_ms: r.get(10)?,
            grant_id,
            projects,
            audience,
        },
        r.get(4)?,
    ))
}

const TOKEN_COLUMNS: &str = "t.id, t.user_id, u.name, t.label, t.secret_hash, t.scopes, t.project_id, \
     t.file_guard, t.expires_at_ms, t.revoked_at_ms, t.created_at_ms, t.grant_id, g.projects, \
     g.resource, g.revoked_at_ms";

/// The tables [`TOKEN_COLUMNS`] reads from.
const TOKEN_FROM: &str = "tokens t JOIN users u ON u.id = t.user_id \
     LEFT JOIN oauth_grants g ON g.id = t.grant_id";

// The reads a request's checks combine in one read transaction (`Database::read`); the
// store's methods of the same names run each on its own.

/// A token, its user and its grant by the token's id: every authenticated request's first read.
static TOKEN_BY_ID: LazyLock<String> =
    LazyLock::new(|| format!("SELECT {TOKEN_COLUMNS} FROM {TOKEN_FROM} WHERE t.id = ?1"));

const USER_BY_ID: &str = "SELECT id, name, disabled, created_at_ms FROM users WHERE id = ?1";

/// The user's role in one project.
const ROLE_OF: &str = "SELECT role FROM members WHERE project_id = ?1 AND user_id = ?2";

/// A membership whose role authors. Equalities, not `role IN (…)`: SQLite builds a small
/// temporary table for an `IN` list each time the statement runs.
macro_rules! author_role {
    () => {
        "(role = 'owner' OR role = 'co-owner' OR role = 'editor')"
    };
}

/// Whether the user is a member anywhere, and an author anywhere: two index probes that stop
/// at the first match, where reading every membership row made a string of each.
const MEMBER_AND_AUTHOR_ANYWHERE: &str = concat!(
    "SELECT EXISTS (SELECT 1 FROM members WHERE user_id = ?1), ",
    "EXISTS (SELECT 1 FROM members WHERE user_id = ?1 AND ",
    author_role!(),
    ")"
);

/// Each of the user's memberships: its project, and whether the role authors.
const MEMBERSHIPS_OF_USER: &str = concat!(
    "SELECT project_id, ",
    author_role!(),
    " FROM members WHERE user_id = ?1"
);

fn token_row_in(db: &mut impl Sql, id: &str) -> Result<Option<(TokenInfo, String)>, DbError> {
    db.query_opt(&TOKEN_BY_ID, &[&id], row_token)
}

fn user_by_id_in(db: &mut impl Sql, id: &str) -> Result<Option<User>, DbError> {
    db.query_opt(USER_BY_ID, &[&id], row_user)
}

/// The columns [`row_project`] reads, from `projects`.
macro_rules! select_project {
    () => {
        "SELECT id, name, kind, folder, policy, created_at_ms FROM projects"
    };
}

const PROJECT_BY_ID: &str = concat!(select_project!(), " WHERE id = ?1");
const PROJECT_BY_NAME: &str = concat!(select_project!(), " WHERE name = ?1");

/// A project by one of the two statements above.
fn project_in(db: &mut impl Sql, by: &str, value: &str) -> Result<Option<Project>, DbError> {
    db.query_opt(by, &[&value], row_project)
}

fn find_project_in(db: &mut impl Sql, id_or_name: &str) -> Result<Option<Project>, DbError> {
    match project_in(db, PROJECT_BY_ID, id_or_name)? {
        Some(p) => Ok(Some(p)),
        None => project_in(db, PROJECT_BY_NAME, id_or_name),
    }
}

fn role_of_in(db: &mut impl Sql, project_id: &str, user_id: &str) -> Result<Option<Role>, DbError> {
    let role: Option<String> = db.query_opt(ROLE_OF, &[&project_id, &user_id], |r| r.get(0))?;
    Ok(role.and_then(|r| Role::parse(&r)))
}

fn capabilities_in(
    db: &mut impl Sql,
    user_id: &str,
    projects: Option<&[String]>,
) -> Result<(bool, bool), DbError> {
    let Some(projects) = projects else {
        // Every call of the MCP endpoint with a token for all the user's projects asks this.
        let found = db.query_opt(MEMBER_AND_AUTHOR_ANYWHERE, &[&user_id], |r| {
            Ok((r.get::<bool>(0)?, r.get::<bool>(1)?))
        })?;
        return Ok(found.unwrap_or((false, false)));
    };
    let rows = db.query_all(MEMBERSHIPS_OF_USER, &[&user_id], |r| {
        Ok((r.get::<String>(0)?, r.get::<bool>(1)?))
    })?;
    let reached = rows
        .iter()
        .filter(|(project, _)| projects.contains(project));
    let (mut member, mut author) = (false, false);
    for (_, authors) in reached {
        member = true;
        author |= authors;
    }
    Ok((member, author))
}

impl IdentityStore {
    /// The SQLite store at `path` (one host).
    pub fn open(path: &Path) -> Result<IdentityStore, IdentityError> {
        let err = |source| IdentityError::Open {
            path: path.to_owned(),
            source,
        };
        let db = Database::open_sqlite(path, SCHEMA).map_err(err)?;
        if let Some(conn) = db.sqlite() {
            add_token_grant_column(&conn).map_err(err)?;
            add_waiting_address_columns(&conn).map_err(err)?;
        }
        Ok(IdentityStore::on(db))
    }

    /// The store in the cluster's PostgreSQL at `url` (several agentd hosts share it), its
    /// schema migrated first.
    pub fn open_postgres(url: &str) -> Result<IdentityStore, IdentityError> {
        let db = Database::on_postgres(
            &crate::db::connect_postgres(url)?,
            &POSTGRES_SCHEMA,
            now_ms(),
        )?;
        Ok(IdentityStore::on(db))
    }

    /// agentd's pool to the cluster's database, when this store is there: the other stores
    /// of the process open on it ([`crate::db::connect_postgres`]).
    pub fn postgres_pool(&self) -> Option<&agentworks_daemon::postgres::Pool> {
        self.db.postgres_pool()
    }

    fn on(db: Database) -> IdentityStore {
        IdentityStore {
            db,
            revoked: Arc::new(OnceLock::new()),
        }
    }

    /// From now on, the id of every token this store revokes is sent to `revoked` after the
    /// revocation is committed (never blocking: an unbounded channel). Set once; a second call
    /// is ignored.
    pub fn announce_revocations_to(&self, revoked: mpsc::UnboundedSender<String>) {
        let _ = self.revoked.set(revoked);
    }

    /// A connection for a few statements, each committed on its own.
    /// Runs `work` (a few reads of this store) for async code: [`Database::read_soon`].
    pub async fn read_soon<T: Send + 'static>(
        &self,
        work: impl FnOnce() -> T + Send + 'static,
    ) -> Result<T, tokio::task::JoinError> {
        self.db.read_soon(work).await
    }

    pub(super) fn db(&self) -> Result<crate::db::Conn<'_>, DbError> {
        self.db.conn()
    }

    /// Runs `work` in one transaction ([`Database::transaction`]: on PostgreSQL it may run
    /// more than once).
    pub(super) fn transaction<T: Send>(
        &self,
        work: impl FnMut(&mut crate::db::Tx<'_>) -> Result<T, IdentityError> + Send,
    ) -> Result<T, IdentityError> {
        self.db.transaction(work)
    }

    // ----- users -----

    pub fn add_user(&self, name: &str) -> Result<User, IdentityError> {
        validate_name("user", name)?;
        if self.user_by_name(name)?.is_some() {
            return Err(IdentityError::Exists {
                kind: "user",
                name: name.into(),
            });
        }
        let user = User {
            id: new_id("usr"),
            name: name.into(),
            disabled: false,
            created_at_ms: now_ms(),
        };
        self.db()?
            .execute(
                "INSERT INTO users (id, name, disabled, created_at_ms) VALUES (?1, ?2, 0, ?3)",
                &[&user.id, &user.name, &user.created_at_ms],
            )
            .map_err(|e| exists_if_taken(e, "user", name))?;
        Ok(user)
    }

    pub fn user_by_name(&self, name: &str) -> Result<Option<User>, IdentityError> {
        Ok(self.db()?.query_opt(
            "SELECT id, name, disabled, created_at_ms FROM users WHERE name = ?1",
            &[&name],
            row_user,
        )?)
    }

    pub fn user_by_id(&self, id: &str) -> Result<Option<User>, IdentityError> {
        Ok(user_by_id_in(&mut self.db()?, id)?)
    }

    /// What the user may do anywhere, from one query: (member of any project, author in any
    /// project), restricted to the token's projects when it is. Used for the effective
    /// catalog; every call still resolves its own project's access in full.
    pub fn capabilities(
        &self,
        user_id: &str,
        projects: Option<&[String]>,
    ) -> Result<(bool, bool), IdentityError> {
        Ok(capabilities_in(&mut self.db()?, user_id, projects)?)
    }

    /// What deciding a caller's access to one project reads, in one read transaction: the
    /// token, its user, and the project (by id or name) with the user's role there (`None`
    /// when there is no such project). `None` when the token or its user is gone.
    #[allow(clippy::type_complexity)]
    pub fn project_access_rows(
        &self,
        token_id: &str,
        project: &str,
    ) -> Result<Option<(TokenInfo, User, Option<(Project, Option<Role>)>)>, IdentityError> {
        self.db.read(|db| {
            let Some((token, _)) = token_row_in(db, token_id)? else {
                return Ok(None);
            };
            let Some(user) = user_by_id_in(db, &token.user_id)? else {
                return Ok(None);
            };
            let Some(project) = find_project_in(db, project)? else {
                return Ok(Some((token, user, None)));
            };
            let role = role_of_in(db, &project.id, &user.id)?;
            Ok(Some((token, user, Some((project, role)))))
        })
    }

    pub(super) fn require_user(&self, name: &str) -> Result<User, IdentityError> {
        self.user_by_name(name)?
            .ok_or_else(|| IdentityError::NotFound {
                kind: "user",
                name: name.into(),
            })
    }

    pub fn list_users(&self) -> Result<Vec<User>, IdentityError> {
        Ok(self.db()?.query_all(
            "SELECT id, name, disabled, created_at_ms FROM users ORDER BY name",
            &[],
            row_user,
        )?)
    }

    // ----- projects and members -----

    /// Add a project owned by `owner`. `policy` must parse as a guard; `folder` is one path
    /// component (the folder under the documents root, created by workspaced).
    pub fn add_project(
        &self,
        name: &str,
        kind: ProjectKind,
        folder: &str,
        policy: &Guard,
        owner: &str,
    ) -> Result<Project, IdentityError> {
        validate_name("project", name)?;
        validate_name("folder", folder)?;
        policy
            .resolve()
            .map_err(|e| IdentityError::Invalid(format!("the project policy is invalid: {e}")))?;
        let owner = self.require_user(owner)?;
        if self.project_by_name(name)?.is_some() {
            return Err(IdentityError::Exists {
                kind: "project",
                name: name.into(),
            });
        }
        let project = Project {
            id: new_id("prj"),
            name: name.into(),
            kind,
            folder: folder.into(),
            policy: serde_json::to_string(policy)
                .map_err(|e| IdentityError::Invalid(e.to_string()))?,
            created_at_ms: now_ms(),
        };
        self.transaction(|tx| {
            tx.execute(
                "INSERT INTO projects (id, name, kind, folder, policy, created_at_ms) VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
                &[&project.id, &project.name, &kind.as_str(), &project.folder, &project.policy, &project.created_at_ms],
            )
            // The name was free a moment ago; another host may have taken it, or the folder.
            .map_err(|e| exists_if_taken(e, "project or project folder", &format!("{name} ({folder})")))?;
            tx.execute(
                "INSERT INTO members (project_id, user_id, role) VALUES (?1, ?2, 'owner')",
                &[&project.id, &owner.id],
            )?;
            Ok(())
        })?;
        Ok(project)
    }

    pub fn project_by_name(&self, name: &str) -> Result<Option<Project>, IdentityError> {
        Ok(project_in(&mut self.db()?, PROJECT_BY_NAME, name)?)
    }

    pub fn project_by_id(&self, id: &str) -> Result<Option<Project>, IdentityError> {
        Ok(project_in(&mut self.db()?, PROJECT_BY_ID, id)?)
    }

    /// A project by id or by name (operators type names; MCP clients send ids).
    pub fn find_project(&self, id_or_name: &str) -> Result<Option<Project>, IdentityError> {
        Ok(find_project_in(&mut self.db()?, id_or_name)?)
    }

    fn require_project(&self, name: &str) -> Result<Project, IdentityError> {
        self.find_project(name)?
            .ok_or_else(|| IdentityError::NotFound {
                kind: "project",
                name: name.into(),
            })
    }

    pub fn list_projects(&self) -> Result<Vec<Project>, IdentityError> {
        Ok(self.db()?.query_all(
            concat!(select_project!(), " ORDER BY name"),
            &[],
            row_project,
        )?)
    }

    pub fn set_member(
        &self,
        project: &str,
        user: &str,
        role: Role,
    ) -> Result<Member, IdentityError> {
        let project = self.require_project(project)?;
        let user = self.require_user(user)?;
        self.db()?.execute(
            "INSERT INTO members (project_id, user_id, role) VALUES (?1, ?2, ?3)
             ON CONFLICT (project_id, user_id) DO UPDATE SET role = excluded.role",
            &[&project.id, &user.id, &role.as_str()],
        )?;
        Ok(Member {
            project: project.name,
            user: user.name,
            user_id: user.id,
            role,
        })
    }

    pub fn remove_member(&self, project: &str, user: &str) -> Result<(), IdentityError> {
        let project = self.require_project(project)?;
        let user = self.require_user(user)?;
        let removed = self.db()?.execute(
            "DELETE FROM members WHERE project_id = ?1 AND user_id = ?2",
            &[&project.id, &user.id],
        )?;
        if removed == 0 {
            return Err(IdentityError::NotFound {
                kind: "membership",
                name: format!("{} in {}", user.name, project.name),
            });
        }
        Ok(())
    }

    pub fn list_members(&self, project: &str) -> Result<Vec<Member>, IdentityError> {
        let project = self.require_project(project)?;
        let rows = self.db()?.query_all(
            "SELECT u.name, u.id, m.role FROM members m JOIN users u ON u.id = m.user_id
             WHERE m.project_id = ?1 ORDER BY u.name",
            &[&project.id],
            |r| {
                let role: String = r.get(2)?;
                Ok((r.get::<String>(0)?, r.get::<String>(1)?, role))
            },
        )?;
        Ok(rows
            .into_iter()
            .filter_map(|(user, user_id, role)| {
                Role::parse(&role).map(|role| Member {
                    project: project.name.clone(),
                    user,
                    user_id,
                    role,
                })
            })
            .collect())
    }

    /// The user's live role on a project, if any.
    pub fn role_of(&self, project_id: &str, user_id: &str) -> Result<Option<Role>, IdentityError> {
        Ok(role_of_in(&mut self.db()?, project_id, user_id)?)
    }

    /// Every project the user is a member of, with the role.
    pub fn projects_of(&self, user_id: &str) -> Result<Vec<(Project, Role)>, IdentityError> {
        let rows = self.db()?.query_all(
            "SELECT p.id, p.name, p.kind, p.folder, p.policy, p.created_at_ms, m.role
             FROM members m JOIN projects p ON p.id = m.project_id WHERE m.user_id = ?1 ORDER BY p.name",
            &[&user_id],
            |r| Ok((row_project(r)?, r.get::<String>(6)?)),
        )?;
        Ok(rows
            .into_iter()
            .filter_map(|(p, role)| Role::parse(&role).map(|r| (p, r)))
            .collect())
    }

    // ----- tokens -----

    /// Create a token; the plaintext is returned once and never stored.
    pub fn create_token(
        &self,
        request: &TokenRequest,
    ) -> Result<(TokenInfo, String), IdentityError> {
        Scope::validate_set(&request.scopes).map_err(IdentityError::Invalid)?;
        let user = self.require_user(&request.user)?;
        let project_id = match &request.project {
            Some(p) => Some(self.require_project(p)?.id),
            None => None,
        };
        // Caps must parse now, so a token never carries a cap that later fails open.
        let caps_check = Guard {
            write_paths: request.file_guard.write_folders.clone().unwrap_or_default(),
            read_only_paths: request.file_guard.read_only_folders.clone(),
            ..Guard::default()
        };
        caps_check.resolve().map_err(|e| {
            IdentityError::Invalid(format!("the token's folder caps are invalid: {e}"))
        })?;
        if request.expires_at_ms.is_some_and(|t| t <= now_ms()) {
            return Err(IdentityError::Invalid("the expiry is in the past".into()));
        }
        let minted = token::mint();
        let info = TokenInfo {
            id: minted.id.clone(),
            user_id: user.id.clone(),
            user_name: user.name.clone(),
            label: request.label.clone(),
            scopes: request.scopes.clone(),
            project_id,
            file_guard: request.file_guard.clone(),
            expires_at_ms: request.expires_at_ms,
            revoked_at_ms: None,
            created_at_ms: now_ms(),
            grant_id: None,
            projects: None,
            audience: None,
        };
        self.db()?.execute(
            "INSERT INTO tokens (id, user_id, label, secret_hash, scopes, project_id, file_guard, expires_at_ms, revoked_at_ms, created_at_ms)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, NULL, ?9)",
            &[
                &info.id,
                &info.user_id,
                &info.label,
                &minted.secret_hash,
                &to_json(&info.scopes),
                &info.project_id,
                &to_json(&info.file_guard),
                &info.expires_at_ms,
                &info.created_at_ms,
            ],
        )?;
        Ok((info, minted.plaintext))
    }

    pub fn list_tokens(&self, user: Option<&str>) -> Result<Vec<TokenInfo>, IdentityError> {
        let user_id = match user {
            Some(name) => Some(self.require_user(name)?.id),
            None => None,
        };
        let rows = self.db()?.query_all(
            &format!(
                "SELECT {TOKEN_COLUMNS} FROM {TOKEN_FROM}
                 WHERE (CAST(?1 AS TEXT) IS NULL OR t.user_id = ?1) ORDER BY t.created_at_ms"
            ),
            &[&user_id],
            row_token,
        )?;
        Ok(rows.into_iter().map(|(t, _)| t).collect())
    }

    pub fn revoke_token(&self, id: &str) -> Result<TokenInfo, IdentityError> {
        let changed = self.db()?.execute(
            "UPDATE tokens SET revoked_at_ms = ?1 WHERE id = ?2 AND revoked_at_ms IS NULL",
            &[&now_ms(), &id],
        )?;
        // Committed (one autocommitted statement): tell the cluster, if there is one. A closed
        // channel (agentd shutting down) loses nothing gatewayd's periodic re-check misses.
        if changed > 0
            && let Some(revoked) = self.revoked.get()
        {
            let _ = revoked.send(id.to_owned());
        }
        let token = self
            .token_by_id(id)?
            .ok_or_else(|| IdentityError::NotFound {
                kind: "token",
                name: id.into(),
            })?;
        if changed == 0 && token.revoked_at_ms.is_none() {
            return Err(IdentityError::NotFound {
                kind: "token",
                name: id.into(),
            });
        }
        Ok(token)
    }

    pub fn token_by_id(&self, id: &str) -> Result<Option<TokenInfo>, IdentityError> {
        Ok(self.token_row(id)?.map(|(t, _)| t))
    }

    fn token_row(&self, id: &str) -> Result<Option<(TokenInfo, String)>, IdentityError> {
        Ok(token_row_in(&mut self.db()?, id)?)
    }

    /// Check a presented token against live rows: parse, find, compare the hash, then
    /// revocation, expiry and the user's state (the token and its user in one read
    /// transaction).
    pub fn authenticate(
        &self,
        presented: &str,
    ) -> Result<Result<(TokenInfo, User), TokenRefusal>, IdentityError> {
        let found = self.authenticate_then(presented, |_, _, _| Ok(()))?;
        Ok(found.map(|(token, user, ())| (token, user)))
    }

    /// [`IdentityStore::authenticate`], and `then` over the accepted token and its user in
    /// the same read (one lock and one snapshot for both).
    fn authenticate_then<X>(
        &self,
        presented: &str,
        then: impl FnOnce(&mut crate::db::Conn<'_>, &TokenInfo, &User) -> Result<X, DbError>,
    ) -> Result<Result<(TokenInfo, User, X), TokenRefusal>, IdentityError> {
        let Some((id, secret)) = token::parse(presented) else {
            return Ok(Err(TokenRefusal::Invalid));
        };
        self.db.read(|db| {
            let found = token_row_in(db, id)?;
            let Some((info, hash)) = found else {
                return Ok(Err(TokenRefusal::Invalid));
            };
            if !token::hashes_equal(&token::hash_secret(secret), &hash) {
                return Ok(Err(TokenRefusal::Invalid));
            }
            if info.revoked_at_ms.is_some() {
                return Ok(Err(TokenRefusal::Revoked));
            }
            if info.expires_at_ms.is_some_and(|t| t <= now_ms()) {
                return Ok(Err(TokenRefusal::Expired));
            }
            let Some(user) = user_by_id_in(db, &info.user_id)? else {
                return Ok(Err(TokenRefusal::Invalid));
            };
            if user.disabled {
                return Ok(Err(TokenRefusal::Disabled));
            }
            let extra = then(db, &info, &user)?;
            Ok(Ok((info, user, extra)))
        })
    }

    /// [`IdentityStore::authenticate`] on a blocking thread, as one result: the way every
    /// endpoint (chats, the device login, gatewayd's token check) resolves a bearer token.
    /// A token bound to a resource (an OAuth grant's, RFC 8707) is refused here: it is
    /// accepted only where [`IdentityStore::check_bearer_at`] names its resource.
    pub async fn check_bearer(
        &self,
        presented: &str,
    ) -> Result<(TokenInfo, User), TokenCheckError> {
        self.check_bearer_at(presented, None).await
    }

    /// [`IdentityStore::check_bearer`] at `resource` (`/mcp`'s URL): personal tokens, and the
    /// tokens issued for exactly this resource.
    pub async fn check_bearer_at(
        &self,
        presented: &str,
        resource: Option<&str>,
    ) -> Result<(TokenInfo, User), TokenCheckError> {
        let (token, user, ()) = self
            .check_bearer_then(presented, resource, |_, _, _| Ok(()))
            .await?;
        Ok((token, user))
    }

    /// [`IdentityStore::check_bearer_at`], and with it, in the same read, what the user's
    /// roles reach through the token (member, author of some project it reaches): the MCP
    /// endpoint's check, one read where it took two.
    pub async fn check_bearer_and_reach(
        &self,
        presented: &str,
        resource: &str,
    ) -> Result<(TokenInfo, User, (bool, bool)), TokenCheckError> {
        self.check_bearer_then(presented, Some(resource), |db, token, user| {
            capabilities_in(db, &user.id, token.project_restriction().as_deref())
        })
        .await
    }

    async fn check_bearer_then<X: Send + 'static>(
        &self,
        presented: &str,
        resource: Option<&str>,
        then: impl FnOnce(&mut crate::db::Conn<'_>, &TokenInfo, &User) -> Result<X, DbError>
        + Send
        + 'static,
    ) -> Result<(TokenInfo, User, X), TokenCheckError> {
        let store = self.clone();
        let presented = presented.to_owned();
        let resource = resource.map(str::to_owned);
        match self
            .db
            .read_soon(move || store.authenticate_then(&presented, then))
            .await
        {
            Ok(Ok(Ok((token, ..))))
                if token
                    .audience
                    .as_deref()
                    .is_some_and(|audience| Some(audience) != resource.as_deref()) =>
            {
                Err(TokenCheckError::Refused(TokenRefusal::Invalid))
            }
            Ok(Ok(Ok(found))) => Ok(found),
            Ok(Ok(Err(refusal))) => Err(TokenCheckError::Refused(refusal)),
            Ok(Err(error)) => Err(TokenCheckError::Store(error)),
            Err(error) => Err(TokenCheckError::Task(error.to_string())),
        }
    }
}

/// Stores made before OAuth grants have no `tokens.grant_id`: add it (a NULL for every
/// existing token, which are all personal).
fn add_token_grant_column(conn: &rusqlite::Connection) -> rusqlite::Result<()> {
    crate::db::add_sqlite_column(conn, "tokens", "grant_id", "TEXT")?;
    conn.execute_batch("CREATE INDEX IF NOT EXISTS tokens_grant ON tokens (grant_id);")
}

/// Stores made before authorization requests and device logins were bounded per client and
/// per source address have no columns saying who is waiting: add them (rows already waiting
/// count as an unknown client and address; they expire within minutes).
fn add_waiting_address_columns(conn: &rusqlite::Connection) -> rusqlite::Result<()> {
    crate::db::add_sqlite_column(
        conn,
        "oauth_requests",
        "client_id",
        "TEXT NOT NULL DEFAULT ''",
    )?;
    crate::db::add_sqlite_column(
        conn,
        "oauth_requests",
        "address",
        "TEXT NOT NULL DEFAULT ''",
    )?;
    crate::db::add_sqlite_column(conn, "device_logins", "address", "TEXT NOT NULL DEFAULT ''")?;
    conn.execute_batch(
        "CREATE INDEX IF NOT EXISTS oauth_requests_by_client ON oauth_requests (client_id);
         CREATE INDEX IF NOT EXISTS oauth_requests_by_address ON oauth_requests (address);
         CREATE INDEX IF NOT EXISTS device_logins_by_address ON device_logins (address);",
    )
}

/// `error`, or [`IdentityError::Exists`] when it is a name or id already taken (by another
/// agentd host between our check and our insert, or a folder another project has).
pub(crate) fn exists_if_taken(error: DbError, kind: &'static str, name: &str) -> IdentityError {
    if error.is_unique_violation() {
        IdentityError::Exists {
            kind,
            name: name.to_owned(),
        }
    } else {
        error.into()
    }
}

/// Serialising a value we built ourselves cannot fail; keep the fallible call in one place.
pub(crate) fn to_json<T: Serialize>(value: &T) -> String {
    serde_json::to_string(value).unwrap_or_else(|_| "null".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The reads every MCP call makes (the token check, then the project's access) find their
    /// rows through an index: none scans a table, however many users, tokens and members the
    /// store holds, and none builds a temporary table. Without `members_by_user`, the
    /// membership reads scanned `members`; with `role IN (…)`, each built one.
    #[test]
    fn per_call_reads_scan_no_table() {
        let (_d, s) = store();
        let conn = s.db.sqlite().unwrap();
        for sql in [
            TOKEN_BY_ID.as_str(),
            USER_BY_ID,
            PROJECT_BY_ID,
            PROJECT_BY_NAME,
            ROLE_OF,
            MEMBER_AND_AUTHOR_ANYWHERE,
            MEMBERSHIPS_OF_USER,
        ] {
            let mut plan = conn.prepare(&format!("EXPLAIN QUERY PLAN {sql}")).unwrap();
            let params = ["x"; 2];
            let params = &params[..plan.parameter_count()];
            let steps: Vec<String> = plan
                .query_map(rusqlite::params_from_iter(params), |r| r.get(3))
                .unwrap()
                .collect::<Result<_, _>>()
                .unwrap();
            assert!(!steps.is_empty(), "no plan for {sql}");
            let mut program = conn.prepare(&format!("EXPLAIN {sql}")).unwrap();
            let ops: Vec<String> = program
                .query_map(rusqlite::params_from_iter(params), |r| r.get(1))
                .unwrap()
                .collect::<Result<_, _>>()
                .unwrap();
            assert!(
                !ops.iter().any(|op| op == "OpenEphemeral"),
                "{sql}\nbuilds a temporary table each time it runs"
            );
            for step in steps.iter().filter(|s| *s != "SCAN CONSTANT ROW") {
                assert!(!step.starts_with("SCAN"), "{sql}\nscans a table: {steps:?}");
            }
        }
    }

    fn store() -> (tempfile::TempDir, IdentityStore) {
        let dir = tempfile::tempdir().unwrap();
        let s = IdentityStore::open(&dir.path().join("agentd.db")).unwrap();
        (dir, s)
    }

    fn open_policy() -> Guard {
        Guard {
            write_paths: vec![".".into()],
            ..Guard::default()
        }
    }

    #[test]
    fn users_projects_members() {
        let (_d, s) = store();
        s.add_user("alice").unwrap();
        s.add_user("bob").unwrap();
        assert!(matches!(
            s.add_user("alice"),
            Err(IdentityError::Exists { .. })
        ));
        assert!(matches!(
            s.add_user("Bad Name"),
            Err(IdentityError::Invalid(_))
        ));
        let p = s
            .add_project(
                "demo",
                ProjectKind::Workflow,
                "demo",
                &open_policy(),
                "alice",
            )
            .unwrap();
        let alice = s.user_by_name("alice").unwrap().unwrap();
        let bob = s.user_by_name("bob").unwrap().unwrap();
        assert_eq!(s.role_of(&p.id, &alice.id).unwrap(), Some(Role::Owner));
        assert_eq!(s.role_of(&p.id, &bob.id).unwrap(), None);
        s.set_member("demo", "bob", Role::Runner).unwrap();
        assert_eq!(s.role_of(&p.id, &bob.id).unwrap(), Some(Role::Runner));
        s.set_member("demo", "bob", Role::Editor).unwrap();
        assert_eq!(s.list_members("demo").unwrap().len(), 2);
        s.remove_member("demo", "bob").unwrap();
        assert_eq!(s.role_of(&p.id, &bob.id).unwrap(), None);
        assert_eq!(s.projects_of(&alice.id).unwrap().len(), 1);
        assert!(matches!(
            s.add_project("other", ProjectKind::Code, "demo", &open_policy(), "alice"),
            Err(IdentityError::Exists { .. })
        ));
    }

    #[test]
    fn tokens_are_hashed_and_refused_when_revoked_expired_or_disabled() {
        let (dir, s) = store();
        s.add_user("alice").unwrap();
        let (info, plain) = s
            .create_token(&TokenRequest {
                user: "alice".into(),
                label: "t".into(),
                scopes: vec![Scope::WorkflowsWrite],
                ..TokenRequest::default()
            })
            .unwrap();
        let raw = std::fs::read(dir.path().join("agentd.db")).unwrap();
        let secret = plain.rsplit('_').next().unwrap();
        assert!(
            !raw.windows(secret.len()).any(|w| w == secret.as_bytes()),
            "the secret is never stored"
        );
        assert_eq!(s.authenticate(&plain).unwrap().unwrap().0.id, info.id);
        let mut tampered = plain.clone();
        tampered.pop();
        tampered.push(if plain.ends_with('0') { '1' } else { '0' });
        assert_eq!(
            s.authenticate(&tampered).unwrap().unwrap_err(),
            TokenRefusal::Invalid
        );
        s.set_user_disabled("alice", true).unwrap();
        assert_eq!(
            s.authenticate(&plain).unwrap().unwrap_err(),
            TokenRefusal::Disabled
        );
        s.set_user_disabled("alice", false).unwrap();
        s.revoke_token(&info.id).unwrap();
        assert_eq!(
            s.authenticate(&plain).unwrap().unwrap_err(),
            TokenRefusal::Revoked
        );
        let (_, soon) = s
            .create_token(&TokenRequest {
                user: "alice".into(),
                scopes: vec![Scope::WorkflowsRead],
                expires_at_ms: Some(now_ms() + 50),
                ..TokenRequest::default()
            })
            .unwrap();
        std::thread::sleep(std::time::Duration::from_millis(80));
        assert_eq!(
            s.authenticate(&soon).unwrap().unwrap_err(),
            TokenRefusal::Expired
        );
        assert!(
            s.create_token(&TokenRequest {
                user: "alice".into(),
                scopes: vec![Scope::DevicesConnect, Scope::WorkflowsRead],
                ..TokenRequest::default()
            })
            .is_err()
        );
    }

    #[test]
    fn the_mcp_check_reads_what_the_token_reaches_with_the_token() {
        let (_dir, s) = store();
        for user in ["alice", "bob", "carol"] {
            s.add_user(user).unwrap();
        }
        for project in ["one", "two"] {
            s.add_project(
                project,
                ProjectKind::Workflow,
                project,
                &open_policy(),
                "alice",
            )
            .unwrap();
        }
        s.set_member("one", "bob", Role::Viewer).unwrap();
        s.set_member("two", "bob", Role::Editor).unwrap();
        let token = |user: &str, project: Option<&str>| {
            s.create_token(&TokenRequest {
                user: user.into(),
                scopes: vec![Scope::WorkflowsWrite],
                project: project.map(str::to_owned),
                ..TokenRequest::default()
            })
            .unwrap()
        };
        let resource = "http://127.0.0.1:1/mcp";
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        for (user, project, reach) in [
            ("bob", None, (true, true)),
            ("bob", Some("one"), (true, false)),
            ("bob", Some("two"), (true, true)),
            ("carol", None, (false, false)),
        ] {
            let (info, plain) = token(user, project);
            let (checked, checked_user, read) = runtime
                .block_on(s.check_bearer_and_reach(&plain, resource))
                .unwrap();
            assert_eq!(checked.id, info.id);
            assert_eq!(checked_user.name, user);
            assert_eq!(read, reach, "{user} through {project:?}");
            let apart =
                s.db.read(|db| {
                    let projects = checked.project_restriction();
                    capabilities_in(db, &checked_user.id, projects.as_deref())
                })
                .unwrap();
            assert_eq!(read, apart, "{user} through {project:?}: as read apart");
        }
        // Refused as the plain check refuses: nothing is read past a bad token.
        let (info, plain) = token("bob", None);
        s.revoke_token(&info.id).unwrap();
        assert!(matches!(
            runtime.block_on(s.check_bearer_and_reach(&plain, resource)),
            Err(TokenCheckError::Refused(TokenRefusal::Revoked))
        ));
    }
}
