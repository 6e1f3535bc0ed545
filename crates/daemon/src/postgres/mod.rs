//! The cluster's PostgreSQL (`[cluster] database_url`, issue 16), as agentd's and gatewayd's
//! stores reach it: a connection pool ([`Pool`]) with the TLS the URL asks for ([`tls`]), and
//! schema migrations applied once under an advisory lock ([`migrate`]). Each store keeps its own
//! tables (prefixed with its daemon's name), migrations and queries; this holds only how to get
//! there.
//!
//! The driver is the `postgres` crate (the synchronous client of rust-postgres, maintained with
//! `tokio-postgres`, which it wraps) with an `r2d2_postgres` pool, by the same maintainer. The
//! stores' callers call short synchronous methods, as they do for SQLite, and each blocking call
//! waits on its connection's own small runtime, never on the daemon's. The pool (at most
//! [`MAX_CONNECTIONS`]) checks a connection before lending it, so a restarted server costs one
//! failed call, not a dead store.
//!
//! Never logs the database URL's password: errors carry the URL redacted.

pub mod tls;

use std::sync::Arc;
use std::time::Duration;

use ::postgres::GenericClient;
use ::postgres::config::SslMode;
use r2d2_postgres::PostgresConnectionManager;
use r2d2_postgres::r2d2;
use tokio_postgres_rustls::MakeRustlsConnect;

use crate::config::cluster_urls::{DatabaseTls, parse_database_url};
use crate::config::redact_url;

pub use self::tls::DatabaseTlsError;

/// The most connections one daemon holds to the database.
pub const MAX_CONNECTIONS: u32 = 8;
/// How long a connection (at start: the first one) may take before the server counts as
/// unreachable.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// The pool's connection manager: the `postgres` client over rustls.
pub type Manager = PostgresConnectionManager<MakeRustlsConnect>;
/// A connection lent by the [`Pool`]; back to the pool when dropped.
pub type Connection = r2d2::PooledConnection<Manager>;
/// Why the pool lent no connection.
pub type PoolError = r2d2::Error;

/// Why the database cannot be reached at start.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    /// `cluster.database_url` is not a URL the PostgreSQL driver accepts.
    #[error("cluster.database_url {url} is not a usable PostgreSQL URL: {source}")]
    Url {
        /// The URL with its password redacted.
        url: String,
        source: ::postgres::Error,
    },
    /// The server could not be reached.
    #[error("cannot reach the cluster database {url}: {reason}")]
    Unreachable {
        /// The URL with its password redacted.
        url: String,
        /// The last connection error with its causes ("error performing TLS handshake:
        /// invalid peer certificate: UnknownIssuer").
        reason: String,
    },
    /// The TLS that `cluster.database_url` asks for cannot be set up.
    #[error("cluster.database_url {url}: {source}")]
    Tls {
        /// The URL with its password redacted.
        url: String,
        source: DatabaseTlsError,
    },
}

/// Why a schema migration was not applied (the schema is left as it was).
#[derive(Debug, thiserror::Error)]
pub enum MigrateError {
    /// Taking the lock, reading or recording the version failed.
    #[error("cannot {operation}: {source}")]
    Query {
        operation: &'static str,
        source: ::postgres::Error,
    },
    /// One migration's SQL failed.
    #[error("cannot apply schema migration {version}: {source}")]
    Apply {
        version: i32,
        source: ::postgres::Error,
    },
    /// The database holds a schema newer than this daemon knows.
    #[error(
        "the database has {table} version {found}, newer than this {daemon}'s {known}; upgrade \
         {daemon} on this host"
    )]
    TooNew {
        table: &'static str,
        daemon: &'static str,
        found: i32,
        known: i32,
    },
}

/// A cheap-to-clone pool of connections to the cluster's database.
#[derive(Clone)]
pub struct Pool {
    // Declared before `_closer`, so the closer's clone of the pool is always the last one.
    pool: r2d2::Pool<Manager>,
    _closer: Arc<CloseOffRuntime>,
}

impl Pool {
    /// Connects to `url` as `application_name` (shown in `pg_stat_activity`): the server must
    /// answer within [`CONNECT_TIMEOUT`], with the TLS the URL asks for. With a `namespace`,
    /// every connection's `search_path` is that PostgreSQL schema alone, so a store's SQL names
    /// its tables as it does in SQLite (`users`, not `agentd.users`) and reaches no other
    /// store's.
    pub fn connect(
        url: &str,
        application_name: &str,
        namespace: Option<&str>,
    ) -> Result<Pool, ConnectError> {
        let tls_failed = |source| ConnectError::Tls {
            url: redact_url(url),
            source,
        };
        let parsed = parse_database_url(url).map_err(|problem| tls_failed(problem.into()))?;
        let mut config: ::postgres::Config =
            parsed
                .driver_url
                .parse()
                .map_err(|source| ConnectError::Url {
                    url: redact_url(url),
                    source,
                })?;
        let ssl_mode = match parsed.tls {
            DatabaseTls::Off => SslMode::Disable,
            DatabaseTls::Verified { .. } => SslMode::Require,
        };
        config
            .connect_timeout(CONNECT_TIMEOUT)
            .application_name(application_name)
            .ssl_mode(ssl_mode);
        if let Some(namespace) = namespace {
            config.options(&format!("-c search_path={namespace}"));
        }
        let connector = tls::connector(&parsed.tls).map_err(tls_failed)?;
        let last_error = LastConnectError::default();
        let pool = r2d2::Pool::builder()
            .max_size(MAX_CONNECTIONS)
            .min_idle(Some(1))
            .connection_timeout(CONNECT_TIMEOUT)
            // r2d2 logs through `log`, which the daemons do not collect; failures reach the
            // caller as errors instead, with their causes kept here.
            .error_handler(Box::new(last_error.clone()))
            .build(PostgresConnectionManager::new(config, connector))
            .map_err(|source| ConnectError::Unreachable {
                url: redact_url(url),
                reason: last_error.take().unwrap_or_else(|| source.to_string()),
            })?;
        Ok(Pool {
            _closer: Arc::new(CloseOffRuntime(Some(pool.clone()))),
            pool,
        })
    }

    /// A connection, waiting at most [`CONNECT_TIMEOUT`] for one.
    pub fn get(&self) -> Result<Connection, PoolError> {
        self.pool.get()
    }
}

/// Holds a clone of the pool and, when the last handle goes, drops it on a thread of its own.
/// Closing a `postgres` connection blocks on the connection's runtime, and blocking on a runtime
/// panics on an async thread, where a daemon's last handle may well go (a task ending at
/// shutdown).
struct CloseOffRuntime(Option<r2d2::Pool<Manager>>);

impl Drop for CloseOffRuntime {
    fn drop(&mut self) {
        let Some(pool) = self.0.take() else {
            return;
        };
        if tokio::runtime::Handle::try_current().is_err() {
            return; // not on a runtime: the pool closes here, as it goes out of scope
        }
        let (send, receive) = std::sync::mpsc::channel::<r2d2::Pool<Manager>>();
        let closing = std::thread::Builder::new()
            .name("postgres-pool-close".to_owned())
            .spawn(move || drop(receive.recv()));
        match closing {
            Ok(_) => {
                if let Err(unsent) = send.send(pool) {
                    std::mem::forget(unsent); // never closed here; the process ends it
                }
            }
            Err(_) => std::mem::forget(pool),
        }
    }
}

/// The last connection error with its causes: r2d2 keeps only the outermost message ("error
/// performing TLS handshake"), not why, which the person starting the daemon needs.
#[derive(Debug, Clone, Default)]
struct LastConnectError(Arc<std::sync::Mutex<Option<String>>>);

impl LastConnectError {
    fn take(&self) -> Option<String> {
        self.0.lock().ok()?.take()
    }
}

impl r2d2::HandleError<::postgres::Error> for LastConnectError {
    fn handle_error(&self, error: ::postgres::Error) {
        let mut text = error.to_string();
        let mut cause = std::error::Error::source(&error);
        while let Some(inner) = cause {
            text.push_str(&format!(": {inner}"));
            cause = inner.source();
        }
        if let Ok(mut last) = self.0.lock() {
            *last = Some(text);
        }
    }
}

/// One store's schema: its migrations, one per version, applied in order (never edit one that
/// has shipped; add the next).
pub struct Schema {
    /// The daemon that owns it, for messages ("gatewayd").
    pub daemon: &'static str,
    /// The PostgreSQL schema (namespace) the tables live in, created first if missing; `None`
    /// for `public`. Connections of a [`Pool`] made with the same namespace find them.
    pub namespace: Option<&'static str>,
    /// The table that records the versions applied (`gateway_schema`).
    pub version_table: &'static str,
    /// The transaction-level advisory lock key the migrations run under; one per store.
    pub lock_key: i64,
    pub migrations: &'static [&'static str],
}

/// Applies the migrations the database lacks, in one transaction under the schema's advisory
/// lock (`pg_advisory_xact_lock`): daemons starting together apply each once, a failed
/// migration leaves the schema as it was, and a database with a newer schema is refused.
pub fn migrate(
    client: &mut impl GenericClient,
    schema: &Schema,
    now_ms: i64,
) -> Result<(), MigrateError> {
    let query = |operation| move |source| MigrateError::Query { operation, source };
    let mut tx = client
        .transaction()
        .map_err(query("begin the schema migration"))?;
    // First the lock: even creating the version table races between hosts without it.
    tx.execute("SELECT pg_advisory_xact_lock($1)", &[&schema.lock_key])
        .map_err(query("take the schema migration lock"))?;
    if let Some(namespace) = schema.namespace {
        tx.batch_execute(&format!("CREATE SCHEMA IF NOT EXISTS {namespace}"))
            .map_err(query("create the schema's namespace"))?;
    }
    let table = schema.version_table;
    tx.batch_execute(&format!(
        "CREATE TABLE IF NOT EXISTS {table} (
             version       INTEGER PRIMARY KEY,
             applied_at_ms BIGINT NOT NULL
         )"
    ))
    .map_err(query("create the schema version table"))?;
    let found: i32 = tx
        .query_one(
            &format!("SELECT COALESCE(MAX(version), 0) FROM {table}"),
            &[],
        )
        .and_then(|row| row.try_get(0))
        .map_err(query("read the schema version"))?;
    let known = i32::try_from(schema.migrations.len()).unwrap_or(i32::MAX);
    if found > known {
        return Err(MigrateError::TooNew {
            table,
            daemon: schema.daemon,
            found,
            known,
        });
    }
    for (version, sql) in (1..)
        .zip(schema.migrations)
        .skip(usize::try_from(found).unwrap_or(0))
    {
        let failed = |source| MigrateError::Apply { version, source };
        tx.batch_execute(sql).map_err(failed)?;
        tx.execute(
            &format!("INSERT INTO {table} (version, applied_at_ms) VALUES ($1, $2)"),
            &[&version, &now_ms],
        )
        .map_err(failed)?;
    }
    tx.commit().map_err(query("commit the schema migration"))
}

/// Why a cluster key could not be read.
#[derive(Debug, thiserror::Error)]
pub enum SharedKeyError {
    #[error("no connection to the cluster database: {0}")]
    Pool(#[from] PoolError),
    #[error("cannot read the cluster's {name} key: {source}")]
    Query {
        name: &'static str,
        source: ::postgres::Error,
    },
    /// The stored key is not 32 bytes (the schema forbids it; a hand-edited row).
    #[error("the cluster's {name} key (table cluster.keys) is not 32 bytes")]
    Length { name: &'static str },
}

/// The cluster's 32-byte key `name`, made by the first host that asks (`candidate`, fresh
/// random bytes) and the same for every host after: what hosts seal their NATS calls with
/// ([`crate::bus`]). Kept in `cluster.keys`, created here under an advisory lock, so any
/// daemon may be the first. Whoever can read the database can read it.
pub fn shared_key(
    pool: &Pool,
    name: &'static str,
    candidate: &[u8; 32],
) -> Result<[u8; 32], SharedKeyError> {
    let query = |source| SharedKeyError::Query { name, source };
    let mut conn = pool.get()?;
    let mut tx = conn.transaction().map_err(query)?;
    // "awclkeys": creating the namespace and table races between hosts without it.
    tx.execute(
        "SELECT pg_advisory_xact_lock($1)",
        &[&0x6177_636c_6b65_7973_i64],
    )
    .map_err(query)?;
    tx.batch_execute(
        "CREATE SCHEMA IF NOT EXISTS cluster;
         CREATE TABLE IF NOT EXISTS cluster.keys (
             name TEXT PRIMARY KEY,
             key  BYTEA NOT NULL CHECK (length(key) = 32)
         )",
    )
    .map_err(query)?;
    tx.execute(
        "INSERT INTO cluster.keys (name, key) VALUES ($1, $2) ON CONFLICT (name) DO NOTHING",
        &[&name, &candidate.as_slice()],
    )
    .map_err(query)?;
    let key: Vec<u8> = tx
        .query_one("SELECT key FROM cluster.keys WHERE name = $1", &[&name])
        .and_then(|row| row.try_get(0))
        .map_err(query)?;
    tx.commit().map_err(query)?;
    key.try_into().map_err(|_| SharedKeyError::Length { name })
}
