//! agentd's SQL database: embedded SQLite on one host, or the cluster's PostgreSQL when
//! `[cluster] database_url` is set (issue 16), behind one small API that runs the *same* SQL on
//! both, so a store is written (and tested) once.
//!
//! Why hand-written and not `sqlx`'s `Any` driver: agentd's stores are synchronous (short calls
//! on blocking threads, SQLite's cached statements), and `sqlx` would make every one of them
//! async and drop rusqlite, which the rest of the workspace keeps. What is here is only the
//! translation a portable subset needs:
//!
//! - Placeholders are written `?1`, `?2` (SQLite's numbered form) and become `$1`, `$2` for
//!   PostgreSQL ([`postgres_sql`]). A bare `?` is refused, never guessed.
//! - Values and columns are the types both drivers map alike ([`Value`], [`Column`]): `i64`
//!   (PostgreSQL `BIGINT`), `String` (`TEXT`), `Vec<u8>` (`BYTEA`), `bool`, and their
//!   `Option`s. So a PostgreSQL schema declares every integer `BIGINT`; a flag stored as 0/1
//!   stays an `i64`, and only an expression (`role IN (…)`) is read as a `bool`.
//! - In PostgreSQL the tables live in a namespace of their own (`agentd`), found through the
//!   connection's `search_path`, so the SQL names them as SQLite does.
//! - Transactions ([`Database::transaction`]) are `SERIALIZABLE` in PostgreSQL and retried when
//!   the server aborts one for a conflict with another agentd's, so a read-then-write (a code
//!   redeemed once, a name taken once) is as atomic across hosts as SQLite's one writer makes it
//!   on one host. The closure must therefore have no effect outside the transaction.
//! - The PostgreSQL driver blocks on a runtime of its own, which panics on a thread already
//!   running a Tokio runtime; calls that may come from one are moved off it ([`off_runtime`]).
//!   SQLite calls stay where they are, as before.

use std::borrow::Cow;
use std::path::Path;
use std::sync::{Arc, Mutex, MutexGuard};

use agentworks_daemon::postgres::{self as pg, ConnectError, MigrateError, PoolError, Schema};

/// How many times a PostgreSQL transaction aborted for a conflict is run again.
const MAX_TRANSACTION_RETRIES: u32 = 16;

/// Why a statement failed.
#[derive(Debug, thiserror::Error)]
pub enum DbError {
    #[error(transparent)]
    Sqlite(#[from] rusqlite::Error),
    #[error("{}", postgres_message(.0))]
    Postgres(#[from] ::postgres::Error),
    /// No pooled connection became free, or none could be made, in time.
    #[error("no connection to the cluster database: {0}")]
    Pool(#[from] PoolError),
    /// A query that must return a row returned none.
    #[error("the query returned no row")]
    NoRow,
    /// A statement used a bare `?` placeholder, which has no PostgreSQL equivalent.
    #[error("a statement uses a bare '?' placeholder; number it (?1)")]
    BarePlaceholder,
    /// A PostgreSQL transaction kept conflicting with other hosts' and was given up.
    #[error("the transaction conflicted with another host's {0} times in a row")]
    Conflicts(u32),
}

/// The server's own message with its detail ("duplicate key value violates unique constraint
/// …"), which the driver's `Display` leaves out.
fn postgres_message(error: &::postgres::Error) -> String {
    match error.as_db_error() {
        Some(db) => format!("{}: {}", db.severity(), db.message()),
        None => error.to_string(),
    }
}

impl DbError {
    /// A unique or primary key constraint refused the row (a name or id already taken).
    pub fn is_unique_violation(&self) -> bool {
        match self {
            DbError::Sqlite(rusqlite::Error::SqliteFailure(failure, _)) => {
                failure.extended_code == rusqlite::ffi::SQLITE_CONSTRAINT_UNIQUE
                    || failure.extended_code == rusqlite::ffi::SQLITE_CONSTRAINT_PRIMARYKEY
            }
            DbError::Postgres(error) => {
                error.code() == Some(&::postgres::error::SqlState::UNIQUE_VIOLATION)
            }
            _ => false,
        }
    }

    /// PostgreSQL aborted a transaction for a conflict with a concurrent one: running it again
    /// is safe and expected.
    fn is_conflict(&self) -> bool {
        use ::postgres::error::SqlState;
        match self {
            DbError::Postgres(error) => matches!(
                error.code(),
                Some(&SqlState::T_R_SERIALIZATION_FAILURE) | Some(&SqlState::T_R_DEADLOCK_DETECTED)
            ),
            _ => false,
        }
    }
}

/// An error type a transaction's closure may return: one that can carry, and give back, the
/// [`DbError`] that aborted it.
pub trait TransactionError: From<DbError> {
    /// The database error inside, if this is one.
    fn as_db_error(&self) -> Option<&DbError>;
}

impl TransactionError for DbError {
    fn as_db_error(&self) -> Option<&DbError> {
        Some(self)
    }
}

/// A value bound to a placeholder: one both drivers bind to the same column type.
pub trait Value: rusqlite::ToSql + ::postgres::types::ToSql + Sync {}
impl<T: rusqlite::ToSql + ::postgres::types::ToSql + Sync> Value for T {}

/// A column read from a row: one both drivers read from the same column type.
pub trait Column: rusqlite::types::FromSql + for<'a> ::postgres::types::FromSql<'a> {}
impl<T: rusqlite::types::FromSql + for<'a> ::postgres::types::FromSql<'a>> Column for T {}

/// One row of a result.
pub enum Row<'r> {
    Sqlite(&'r rusqlite::Row<'r>),
    Postgres(&'r ::postgres::Row),
}

impl Row<'_> {
    /// Column `index` (from 0); a type mismatch is an error, never a panic.
    pub fn get<T: Column>(&self, index: usize) -> Result<T, DbError> {
        match self {
            Row::Sqlite(row) => Ok(row.get(index)?),
            Row::Postgres(row) => Ok(row.try_get(index)?),
        }
    }
}

/// `sql` with SQLite's numbered placeholders (`?1`) as PostgreSQL's (`$1`); text inside quotes
/// is left alone.
pub fn postgres_sql(sql: &str) -> Result<Cow<'_, str>, DbError> {
    if !sql.contains('?') {
        return Ok(Cow::Borrowed(sql));
    }
    let mut out = String::with_capacity(sql.len());
    let mut quoted = false;
    let mut chars = sql.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\'' => {
                quoted = !quoted;
                out.push(c);
            }
            '?' if !quoted => {
                if !chars.peek().is_some_and(char::is_ascii_digit) {
                    return Err(DbError::BarePlaceholder);
                }
                out.push('$');
            }
            _ => out.push(c),
        }
    }
    Ok(Cow::Owned(out))
}

/// Runs `work` where the PostgreSQL driver may block: off any Tokio runtime's worker thread.
/// On a multi-threaded runtime that is `block_in_place` (the worker hands its tasks on); on a
/// current-thread runtime (tests) a short-lived thread of its own.
fn off_runtime<R: Send>(work: impl FnOnce() -> R + Send) -> R {
    use tokio::runtime::{Handle, RuntimeFlavor};
    match Handle::try_current().map(|handle| handle.runtime_flavor()) {
        Err(_) => work(),
        Ok(RuntimeFlavor::MultiThread) => tokio::task::block_in_place(work),
        Ok(_) => std::thread::scope(|scope| match scope.spawn(work).join() {
            Ok(result) => result,
            Err(panic) => std::panic::resume_unwind(panic),
        }),
    }
}

/// A cheap-to-clone handle on one store's database.
#[derive(Clone)]
pub enum Database {
    /// One connection for writes, taken in turn (SQLite has one writer anyway), and a few for
    /// reads.
    Sqlite(Arc<SqliteConnections>),
    /// A pool on the cluster's database, each connection's `search_path` the store's namespace.
    Postgres(pg::Pool),
}

/// Read connections beside a SQLite database's one writer: about as many as agentd has
/// runtime threads, and a couple more for the blocking ones.
const SQLITE_READERS: usize = 4;

/// A SQLite database's connections. Reads ([`Database::read`]) take a reader of their own, so
/// an MCP call's token check neither waits behind a write (which may wait for the disk) nor
/// queues with every other call's on one connection: with one connection for all, the checks
/// of calls in flight convoyed on its lock and most went to blocking threads (about a sixth of
/// agentd's CPU per call).
pub struct SqliteConnections {
    writer: Mutex<rusqlite::Connection>,
    readers: Vec<Mutex<rusqlite::Connection>>,
}

impl SqliteConnections {
    /// A free reader if there is one, else the first one once it is free.
    fn reader(&self) -> MutexGuard<'_, rusqlite::Connection> {
        for reader in &self.readers {
            if let Ok(free) = reader.try_lock() {
                return free;
            }
        }
        self.readers[0].lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether a read now would find a reader free.
    fn any_reader_free(&self) -> bool {
        self.readers.iter().any(|reader| reader.try_lock().is_ok())
    }
}

/// Why a store's database cannot be opened.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    #[error(transparent)]
    Sqlite(#[from] rusqlite::Error),
    #[error(transparent)]
    Connect(#[from] ConnectError),
    #[error("no connection to the cluster database: {0}")]
    Pool(#[from] PoolError),
    #[error(transparent)]
    Migrate(#[from] MigrateError),
    /// A store's tables are not in agentd's namespace, where the shared pool looks.
    #[error(
        "a store's PostgreSQL namespace is {found:?}, not agentd's {NAMESPACE:?} (a bug: its \
         tables would not be found)"
    )]
    Namespace { found: Option<&'static str> },
}

/// The PostgreSQL schema (namespace) every agentd store keeps its tables in.
pub const NAMESPACE: &str = "agentd";

/// agentd's connections to the cluster's database at `url`: one pool that every store of the
/// process shares ([`Database::on_postgres`]), so a host holds at most
/// [`pg::MAX_CONNECTIONS`] connections, not that many per store.
pub fn connect_postgres(url: &str) -> Result<pg::Pool, OpenError> {
    off_runtime(|| {
        Ok(pg::Pool::connect(
            url,
            "agentworks-agentd",
            Some(NAMESPACE),
        )?)
    })
}

impl Database {
    /// The SQLite database at `path` ([`agentworks_support::sqlite::open_durable`]), with
    /// `schema` applied.
    pub fn open_sqlite(path: &Path, schema: &str) -> Result<Database, rusqlite::Error> {
        let writer = agentworks_support::sqlite::open_durable(path, schema)?;
        let readers = (0..SQLITE_READERS)
            .map(|_| agentworks_support::sqlite::open_reader(path).map(Mutex::new))
            .collect::<Result<_, _>>()?;
        Ok(Database::Sqlite(Arc::new(SqliteConnections {
            writer: Mutex::new(writer),
            readers,
        })))
    }

    /// The cluster's database on agentd's `pool` ([`connect_postgres`]), with `schema`'s
    /// migrations applied under its lock.
    pub fn on_postgres(
        pool: &pg::Pool,
        schema: &Schema,
        now_ms: i64,
    ) -> Result<Database, OpenError> {
        if schema.namespace != Some(NAMESPACE) {
            return Err(OpenError::Namespace {
                found: schema.namespace,
            });
        }
        off_runtime(|| {
            pg::migrate(&mut *pool.get()?, schema, now_ms)?;
            Ok(Database::Postgres(pool.clone()))
        })
    }

    /// The pool this database uses, if it is the cluster's, for the other stores to share.
    pub fn postgres_pool(&self) -> Option<&pg::Pool> {
        match self {
            Database::Sqlite(_) => None,
            Database::Postgres(pool) => Some(pool),
        }
    }

    /// The SQLite connection, for what only SQLite has (its own migrations); `None` on
    /// PostgreSQL.
    pub fn sqlite(&self) -> Option<MutexGuard<'_, rusqlite::Connection>> {
        match self {
            Database::Sqlite(sqlite) => {
                Some(sqlite.writer.lock().unwrap_or_else(|e| e.into_inner()))
            }
            Database::Postgres(_) => None,
        }
    }

    /// Runs `work`, a few quick reads ([`Database::read`]), for async code: in place when
    /// this is SQLite and one of its readers is free, otherwise on a blocking thread. A read in
    /// WAL mode never waits for a writer, so in place it takes microseconds and saves the two
    /// thread hand-offs a blocking task costs (per MCP call that was most of agentd's
    /// scheduling); every reader busy, or PostgreSQL (its driver waits on the network), goes
    /// to a blocking thread as before. Another thread can still take the reader between the
    /// check and `work`; then `work` waits for that one read.
    pub async fn read_soon<T: Send + 'static>(
        &self,
        work: impl FnOnce() -> T + Send + 'static,
    ) -> Result<T, tokio::task::JoinError> {
        if let Database::Sqlite(sqlite) = self
            && sqlite.any_reader_free()
        {
            return Ok(work());
        }
        tokio::task::spawn_blocking(work).await
    }

    /// A connection for a few statements, each committed on its own.
    pub fn conn(&self) -> Result<Conn<'_>, DbError> {
        Ok(match self {
            Database::Sqlite(sqlite) => {
                Conn::Sqlite(sqlite.writer.lock().unwrap_or_else(|e| e.into_inner()))
            }
            Database::Postgres(pool) => Conn::Postgres(Box::new(off_runtime(|| pool.get())?)),
        })
    }

    /// Runs `work`, a few reads, as one read: on SQLite in one deferred transaction on a read
    /// connection (one read lock for all of them, and one snapshot, instead of a lock and an
    /// unlock per statement; the connection refuses writes), on PostgreSQL on one pooled
    /// connection, each statement on its own as with [`Database::conn`]. `work` must not
    /// write.
    pub fn read<T, E: From<DbError>>(
        &self,
        work: impl FnOnce(&mut Conn<'_>) -> Result<T, E>,
    ) -> Result<T, E> {
        let mut conn = match self {
            Database::Sqlite(sqlite) => Conn::Sqlite(sqlite.reader()),
            Database::Postgres(_) => self.conn()?,
        };
        if let Conn::Sqlite(c) = &conn {
            c.prepare_cached("BEGIN DEFERRED")
                .and_then(|mut begin| begin.execute([]))
                .map_err(DbError::from)?;
        }
        // A panic in `work` must not leave the shared connection inside the transaction (every
        // later statement would run in it, never committed): end it, then pass the panic on.
        let result =
            match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| work(&mut conn))) {
                Ok(result) => result,
                Err(panic) => {
                    if let Conn::Sqlite(c) = &conn
                        && !c.is_autocommit()
                    {
                        let _ = c.execute_batch("ROLLBACK");
                    }
                    std::panic::resume_unwind(panic)
                }
            };
        if let Conn::Sqlite(c) = &conn
            && !c.is_autocommit()
        {
            // Ending a read transaction releases its lock; nothing was written to keep.
            let ended = c
                .prepare_cached("COMMIT")
                .and_then(|mut commit| commit.execute([]));
            if let Err(error) = ended {
                // Never leave the shared connection inside a transaction.
                let _ = c.execute_batch("ROLLBACK");
                return Err(DbError::from(error).into());
            }
        }
        result
    }

    /// Runs `work` in one transaction and commits it if `work` returns `Ok`. On PostgreSQL the
    /// transaction is `SERIALIZABLE` and `work` runs again (up to
    /// [`MAX_TRANSACTION_RETRIES`] times) when the server aborts it for a conflict with another
    /// host's, so `work` must do nothing but its statements.
    pub fn transaction<T: Send, E: TransactionError + Send>(
        &self,
        mut work: impl FnMut(&mut Tx<'_>) -> Result<T, E> + Send,
    ) -> Result<T, E> {
        match self {
            Database::Sqlite(sqlite) => {
                let mut conn = sqlite.writer.lock().unwrap_or_else(|e| e.into_inner());
                // IMMEDIATE: the write lock first, so two processes on one file wait for each
                // other (the busy timeout) instead of failing a read-then-write.
                let tx = conn
                    .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)
                    .map_err(DbError::from)?;
                let mut tx = Tx::Sqlite(tx);
                let value = work(&mut tx)?;
                let Tx::Sqlite(tx) = tx else { unreachable!() };
                tx.commit().map_err(DbError::from)?;
                Ok(value)
            }
            Database::Postgres(pool) => off_runtime(|| {
                let mut conn = pool.get().map_err(DbError::from)?;
                let mut conflicts = 0;
                loop {
                    let attempt: Result<T, E> = (|| {
                        let tx = conn
                            .build_transaction()
                            .isolation_level(::postgres::IsolationLevel::Serializable)
                            .start()
                            .map_err(DbError::from)?;
                        let mut tx = Tx::Postgres(tx);
                        let value = work(&mut tx)?;
                        let Tx::Postgres(tx) = tx else { unreachable!() };
                        tx.commit().map_err(DbError::from)?;
                        Ok(value)
                    })();
                    match attempt {
                        Err(error) if error.as_db_error().is_some_and(DbError::is_conflict) => {
                            conflicts += 1;
                            if conflicts > MAX_TRANSACTION_RETRIES {
                                return Err(DbError::Conflicts(conflicts).into());
                            }
                        }
                        other => return other,
                    }
                }
            }),
        }
    }
}

/// The statements a connection and a transaction both run.
pub trait Sql {
    /// Runs a statement; the number of rows it changed.
    fn execute(&mut self, sql: &str, params: &[&dyn Value]) -> Result<usize, DbError>;

    /// The rows of a query (at most `limit`), each through `map`.
    fn query<T: Send>(
        &mut self,
        sql: &str,
        params: &[&dyn Value],
        limit: Option<usize>,
        map: impl FnMut(&Row<'_>) -> Result<T, DbError> + Send,
    ) -> Result<Vec<T>, DbError>;

    /// Every row of a query, each through `map`.
    fn query_all<T: Send>(
        &mut self,
        sql: &str,
        params: &[&dyn Value],
        map: impl FnMut(&Row<'_>) -> Result<T, DbError> + Send,
    ) -> Result<Vec<T>, DbError> {
        self.query(sql, params, None, map)
    }

    /// The first row of a query through `map`, if there is one.
    fn query_opt<T: Send>(
        &mut self,
        sql: &str,
        params: &[&dyn Value],
        map: impl FnOnce(&Row<'_>) -> Result<T, DbError> + Send,
    ) -> Result<Option<T>, DbError> {
        let mut map = Some(map);
        let once = move |row: &Row<'_>| match map.take() {
            Some(map) => map(row),
            None => Err(DbError::NoRow),
        };
        Ok(self.query(sql, params, Some(1), once)?.into_iter().next())
    }

    /// The first row of a query through `map`; [`DbError::NoRow`] when there is none.
    fn query_one<T: Send>(
        &mut self,
        sql: &str,
        params: &[&dyn Value],
        map: impl FnOnce(&Row<'_>) -> Result<T, DbError> + Send,
    ) -> Result<T, DbError> {
        self.query_opt(sql, params, map)?.ok_or(DbError::NoRow)
    }
}

/// `table.column` (declared `definition`), added to an SQLite store made before it had one
/// (SQLite's own migrations; PostgreSQL's are numbered, see [`Schema`]).
pub fn add_sqlite_column(
    conn: &rusqlite::Connection,
    table: &str,
    column: &str,
    definition: &str,
) -> rusqlite::Result<()> {
    let has_column = conn
        .prepare(&format!(
            "SELECT 1 FROM pragma_table_info('{table}') WHERE name = '{column}'"
        ))?
        .exists([])?;
    if !has_column {
        conn.execute_batch(&format!(
            "ALTER TABLE {table} ADD COLUMN {column} {definition};"
        ))?;
    }
    Ok(())
}

fn sqlite_params<'p>(params: &'p [&'p dyn Value]) -> Vec<&'p dyn rusqlite::ToSql> {
    params.iter().map(|p| *p as &dyn rusqlite::ToSql).collect()
}

fn postgres_params<'p>(
    params: &'p [&'p dyn Value],
) -> Vec<&'p (dyn ::postgres::types::ToSql + Sync)> {
    params
        .iter()
        .map(|p| *p as &(dyn ::postgres::types::ToSql + Sync))
        .collect()
}

fn sqlite_execute(
    conn: &rusqlite::Connection,
    sql: &str,
    params: &[&dyn Value],
) -> Result<usize, DbError> {
    let mut stmt = conn.prepare_cached(sql)?;
    Ok(stmt.execute(&*sqlite_params(params))?)
}

fn sqlite_query<T>(
    conn: &rusqlite::Connection,
    sql: &str,
    params: &[&dyn Value],
    limit: Option<usize>,
    mut map: impl FnMut(&Row<'_>) -> Result<T, DbError>,
) -> Result<Vec<T>, DbError> {
    let mut stmt = conn.prepare_cached(sql)?;
    let mut rows = stmt.query(&*sqlite_params(params))?;
    let mut out = Vec::new();
    while let Some(row) = rows.next()? {
        out.push(map(&Row::Sqlite(row))?);
        if limit.is_some_and(|limit| out.len() >= limit) {
            break;
        }
    }
    Ok(out)
}

fn postgres_execute(
    client: &mut impl ::postgres::GenericClient,
    sql: &str,
    params: &[&dyn Value],
) -> Result<usize, DbError> {
    let changed = client.execute(&*postgres_sql(sql)?, &postgres_params(params))?;
    Ok(usize::try_from(changed).unwrap_or(usize::MAX))
}

fn postgres_query<T>(
    client: &mut impl ::postgres::GenericClient,
    sql: &str,
    params: &[&dyn Value],
    limit: Option<usize>,
    mut map: impl FnMut(&Row<'_>) -> Result<T, DbError>,
) -> Result<Vec<T>, DbError> {
    let rows = client.query(&*postgres_sql(sql)?, &postgres_params(params))?;
    rows.iter()
        .take(limit.unwrap_or(usize::MAX))
        .map(|row| map(&Row::Postgres(row)))
        .collect()
}

/// A connection lent by a [`Database`].
pub enum Conn<'d> {
    Sqlite(MutexGuard<'d, rusqlite::Connection>),
    Postgres(Box<pg::Connection>),
}

impl Sql for Conn<'_> {
    fn execute(&mut self, sql: &str, params: &[&dyn Value]) -> Result<usize, DbError> {
        match self {
            Conn::Sqlite(conn) => sqlite_execute(conn, sql, params),
            Conn::Postgres(client) => off_runtime(|| postgres_execute(&mut ***client, sql, params)),
        }
    }

    fn query<T: Send>(
        &mut self,
        sql: &str,
        params: &[&dyn Value],
        limit: Option<usize>,
        map: impl FnMut(&Row<'_>) -> Result<T, DbError> + Send,
    ) -> Result<Vec<T>, DbError> {
        match self {
            Conn::Sqlite(conn) => sqlite_query(conn, sql, params, limit, map),
            Conn::Postgres(client) => {
                off_runtime(|| postgres_query(&mut ***client, sql, params, limit, map))
            }
        }
    }
}

/// An open transaction ([`Database::transaction`]). Already off any runtime.
pub enum Tx<'c> {
    Sqlite(rusqlite::Transaction<'c>),
    Postgres(::postgres::Transaction<'c>),
}

impl Sql for Tx<'_> {
    fn execute(&mut self, sql: &str, params: &[&dyn Value]) -> Result<usize, DbError> {
        match self {
            Tx::Sqlite(tx) => sqlite_execute(tx, sql, params),
            Tx::Postgres(tx) => postgres_execute(tx, sql, params),
        }
    }

    fn query<T: Send>(
        &mut self,
        sql: &str,
        params: &[&dyn Value],
        limit: Option<usize>,
        map: impl FnMut(&Row<'_>) -> Result<T, DbError> + Send,
    ) -> Result<Vec<T>, DbError> {
        match self {
            Tx::Sqlite(tx) => sqlite_query(tx, sql, params, limit, map),
            Tx::Postgres(tx) => postgres_query(tx, sql, params, limit, map),
        }
    }
}

/// What the stores' conformance functions share (each store's are written once and run on
/// both back ends: by the unit tests on SQLite, by the integration suite on PostgreSQL).
#[cfg(any(test, feature = "store-conformance"))]
pub mod conformance {
    #![allow(clippy::unwrap_used)]

    use std::sync::{Arc, Barrier};

    /// How many hosts race in the `racing_hosts_…` functions.
    pub const HOSTS: usize = 6;

    /// Runs `work` on every host at once (after a barrier); what each returned, in host order.
    pub fn race<H: Sync, T: Send>(hosts: &[H], work: impl Fn(usize, &H) -> T + Sync) -> Vec<T> {
        let barrier = Arc::new(Barrier::new(hosts.len()));
        std::thread::scope(|scope| {
            let runs: Vec<_> = hosts
                .iter()
                .enumerate()
                .map(|(i, host)| {
                    let (barrier, work) = (barrier.clone(), &work);
                    scope.spawn(move || {
                        barrier.wait();
                        work(i, host)
                    })
                })
                .collect();
            runs.into_iter().map(|run| run.join().unwrap()).collect()
        })
    }

    /// One conformance function on a fresh SQLite file in a temporary directory; every call of
    /// the closure opens it again (another connection, as a second process would).
    #[cfg(test)]
    pub fn on_sqlite<S>(
        file: &str,
        open: impl Fn(&std::path::Path) -> S,
        check: fn(&dyn Fn() -> S),
    ) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(file);
        check(&|| open(&path));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbered_placeholders_become_postgres_ones_outside_quotes() {
        assert_eq!(
            postgres_sql("SELECT a FROM t WHERE b = ?1 AND c = '?2' AND d = ?12").unwrap(),
            "SELECT a FROM t WHERE b = $1 AND c = '?2' AND d = $12"
        );
        assert!(matches!(
            postgres_sql("SELECT a FROM t WHERE b = ?"),
            Err(DbError::BarePlaceholder)
        ));
        assert!(matches!(postgres_sql("SELECT 1"), Ok(Cow::Borrowed(_))));
    }

    /// A read is one transaction that ends, also when its work fails or panics: the next
    /// write on the shared connection is committed and seen by another connection.
    #[test]
    fn a_read_transaction_always_ends() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.db");
        let schema = "CREATE TABLE IF NOT EXISTS t (id TEXT PRIMARY KEY, n INTEGER NOT NULL);";
        let db = Database::open_sqlite(&path, schema).unwrap();
        let count = |db: &Database| -> i64 {
            db.conn()
                .unwrap()
                .query_one("SELECT count(*) FROM t", &[], |r| r.get(0))
                .unwrap()
        };
        let read: Result<i64, DbError> =
            db.read(|c| c.query_one("SELECT count(*) FROM t", &[], |r| r.get::<i64>(0)));
        assert_eq!(read.unwrap(), 0);
        let failed: Result<i64, DbError> =
            db.read(|c| c.query_one("SELECT n FROM t WHERE id = 'none'", &[], |r| r.get(0)));
        assert!(matches!(failed, Err(DbError::NoRow)), "{failed:?}");
        let panicked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let _: Result<(), DbError> = db.read(|_| panic!("a bug in a read"));
        }));
        assert!(panicked.is_err());
        db.conn()
            .unwrap()
            .execute("INSERT INTO t (id, n) VALUES (?1, ?2)", &[&"a", &1i64])
            .unwrap();
        let other = Database::open_sqlite(&path, schema).unwrap();
        assert_eq!(count(&other), 1, "the write after the reads was committed");
    }

    /// A read runs on a connection of its own: it answers, from the last commit, while a
    /// write holds the writer inside its transaction (with one shared connection it waited
    /// for the writer's lock), and it cannot write.
    #[test]
    fn a_read_does_not_wait_for_the_writer_and_cannot_write() {
        let dir = tempfile::tempdir().unwrap();
        let schema = "CREATE TABLE IF NOT EXISTS t (id TEXT PRIMARY KEY, n INTEGER NOT NULL);";
        let db = Database::open_sqlite(&dir.path().join("t.db"), schema).unwrap();
        db.conn()
            .unwrap()
            .execute("INSERT INTO t (id, n) VALUES (?1, ?2)", &[&"a", &1i64])
            .unwrap();
        let (started, writing) = std::sync::mpsc::channel();
        let (finish, finished) = std::sync::mpsc::channel::<()>();
        // The transaction's closure must be `Send`; a receiver is not `Sync`.
        let finished = Mutex::new(finished);
        let n = std::thread::scope(|scope| {
            let writer = db.clone();
            scope.spawn(move || {
                writer
                    .transaction(|tx| {
                        tx.execute("UPDATE t SET n = 2 WHERE id = ?1", &[&"a"])?;
                        started.send(()).unwrap();
                        // Held until the read below has answered (or the test gave up).
                        let _ = finished
                            .lock()
                            .unwrap()
                            .recv_timeout(std::time::Duration::from_secs(10));
                        Ok::<_, DbError>(())
                    })
                    .unwrap();
            });
            writing.recv().unwrap();
            let (answer, answered) = std::sync::mpsc::channel();
            let reader = db.clone();
            scope.spawn(move || {
                let n: Result<i64, DbError> =
                    reader.read(|c| c.query_one("SELECT n FROM t", &[], |r| r.get(0)));
                let _ = answer.send(n);
            });
            let n = answered.recv_timeout(std::time::Duration::from_secs(5));
            finish.send(()).unwrap();
            n
        });
        assert_eq!(
            n.expect("the read waited for the writer").unwrap(),
            1,
            "the read sees the last commit, not the open transaction"
        );
        let wrote: Result<usize, DbError> =
            db.read(|c| c.execute("UPDATE t SET n = 3 WHERE id = ?1", &[&"a"]));
        assert!(wrote.is_err(), "a read connection refuses writes");
    }

    #[test]
    fn the_same_statements_run_on_sqlite() {
        let dir = tempfile::tempdir().unwrap();
        let db = Database::open_sqlite(
            &dir.path().join("t.db"),
            "CREATE TABLE IF NOT EXISTS t (id TEXT PRIMARY KEY, n INTEGER NOT NULL);",
        )
        .unwrap();
        let mut conn = db.conn().unwrap();
        conn.execute("INSERT INTO t (id, n) VALUES (?1, ?2)", &[&"a", &1i64])
            .unwrap();
        let duplicate = conn
            .execute("INSERT INTO t (id, n) VALUES (?1, ?2)", &[&"a", &2i64])
            .unwrap_err();
        assert!(duplicate.is_unique_violation(), "{duplicate}");
        drop(conn);
        let n: i64 = db
            .transaction(|tx| {
                tx.execute("UPDATE t SET n = n + 1 WHERE id = ?1", &[&"a"])?;
                tx.query_one("SELECT n FROM t WHERE id = ?1", &[&"a"], |r| r.get(0))
            })
            .unwrap();
        assert_eq!(n, 2);
        // A failed transaction leaves nothing.
        let failed: Result<(), DbError> = db.transaction(|tx| {
            tx.execute("UPDATE t SET n = 100 WHERE id = ?1", &[&"a"])?;
            Err(DbError::NoRow)
        });
        assert!(failed.is_err());
        let mut conn = db.conn().unwrap();
        let all = conn
            .query_all("SELECT id, n FROM t", &[], |r| {
                Ok((r.get::<String>(0)?, r.get::<i64>(1)?))
            })
            .unwrap();
        assert_eq!(all, vec![("a".to_owned(), 2)]);
        assert!(
            conn.query_opt("SELECT n FROM t WHERE id = ?1", &[&"b"], |r| r
                .get::<i64>(0))
                .unwrap()
                .is_none()
        );
    }
}
