//! Opening a SQLite store (the daemons' and the laptop executor's) the one way they all need:
//! WAL, refused when SQLite cannot give it (an in-memory or WAL-less file system would quietly
//! keep another journal mode), `synchronous=FULL` (a committed row survives power loss),
//! foreign keys enforced, a 10 s busy timeout for a second process on the same file, the query
//! planner's stability guarantee (so cached statements stay prepared), then the store's
//! idempotent schema.

use rusqlite::Connection;
use rusqlite::config::DbConfig;
use std::path::Path;
use std::time::Duration;

/// How long a statement waits for another connection's lock before failing.
const BUSY_TIMEOUT: Duration = Duration::from_secs(10);

/// Opens (creating if needed) the database at `path` and applies `schema` (which must be
/// idempotent: `CREATE … IF NOT EXISTS`).
///
/// A database SQLite will not put in WAL mode is an error (`InvalidParameterName` carrying
/// "journal_mode is …, not wal"): `synchronous=FULL` is only the durability we promise with WAL.
pub fn open_durable(path: &Path, schema: &str) -> rusqlite::Result<Connection> {
    let conn = Connection::open(path)?;
    conn.busy_timeout(BUSY_TIMEOUT)?;
    let mode = conn.query_row("PRAGMA journal_mode=WAL", [], |r| r.get::<_, String>(0))?;
    if !mode.eq_ignore_ascii_case("wal") {
        return Err(rusqlite::Error::InvalidParameterName(format!(
            "journal_mode is {mode}, not wal"
        )));
    }
    conn.execute_batch("PRAGMA synchronous=FULL; PRAGMA foreign_keys=ON;")?;
    // Plans that never depend on the values bound. Without the guarantee SQLite marks a
    // parameter compared with `=` in a term no index serves (`WHERE t.id = ?1` in a join, say)
    // as one whose value could change the plan; rusqlite clears a statement's bindings when it
    // takes it back into its cache, and clearing such a statement's bindings expires it, so
    // every `prepare_cached` query would be parsed and planned again on each use (agentd's
    // token check on every MCP call among them). Only plans change: the stores have no
    // statistics (no ANALYZE) for the values to matter, and results are the same either way.
    conn.set_db_config(DbConfig::SQLITE_DBCONFIG_ENABLE_QPSG, true)?;
    conn.execute_batch(schema)?;
    Ok(conn)
}

/// A second connection to a database [`open_durable`] opened, for reads only: SQLite refuses
/// any write on it (`query_only`), so a read that tried one fails instead of writing beside
/// the one writer. In WAL mode it reads the last commit without waiting for a writer.
pub fn open_reader(path: &Path) -> rusqlite::Result<Connection> {
    let conn = Connection::open(path)?;
    conn.busy_timeout(BUSY_TIMEOUT)?;
    conn.execute_batch("PRAGMA query_only=ON;")?;
    // As in `open_durable`: cached statements keep their plans.
    conn.set_db_config(DbConfig::SQLITE_DBCONFIG_ENABLE_QPSG, true)?;
    Ok(conn)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn opens_in_wal_with_full_sync_and_foreign_keys() {
        let dir = tempfile::tempdir().unwrap();
        let schema = "CREATE TABLE IF NOT EXISTS a (id TEXT PRIMARY KEY);
                      CREATE TABLE IF NOT EXISTS b (a_id TEXT NOT NULL REFERENCES a(id));";
        let conn = open_durable(&dir.path().join("s.db"), schema).unwrap();
        let mode: String = conn
            .query_row("PRAGMA journal_mode", [], |r| r.get(0))
            .unwrap();
        let sync: i64 = conn
            .query_row("PRAGMA synchronous", [], |r| r.get(0))
            .unwrap();
        assert_eq!((mode.as_str(), sync), ("wal", 2));
        assert!(conn.execute("INSERT INTO b VALUES ('none')", []).is_err());
        // The schema is applied again on every open.
        drop(conn);
        open_durable(&dir.path().join("s.db"), schema).unwrap();
    }

    /// A cached query whose parameter is compared in a term no index serves is not prepared
    /// again on every use (it was, once for each call, before the stability guarantee).
    #[test]
    fn cached_statements_are_not_prepared_again_on_every_use() {
        use rusqlite::StatementStatus;
        let dir = tempfile::tempdir().unwrap();
        let schema = "CREATE TABLE IF NOT EXISTS users (id TEXT PRIMARY KEY, name TEXT);
                      CREATE TABLE IF NOT EXISTS tokens (id TEXT PRIMARY KEY, user_id TEXT,
                                                         grant_id TEXT);
                      CREATE TABLE IF NOT EXISTS grants (id TEXT PRIMARY KEY, resource TEXT);
                      INSERT OR IGNORE INTO users VALUES ('u1', 'one');
                      INSERT OR IGNORE INTO tokens VALUES ('t1', 'u1', NULL), ('t2', 'u1', NULL);";
        let conn = open_durable(&dir.path().join("s.db"), schema).unwrap();
        let sql = "SELECT t.id, u.name, g.resource FROM tokens t JOIN users u ON u.id = t.user_id
                   LEFT JOIN grants g ON g.id = t.grant_id WHERE t.id = ?1";
        for id in ["t1", "t2", "t1", "t2"] {
            let name: String = conn
                .prepare_cached(sql)
                .unwrap()
                .query_row([id], |r| r.get(1))
                .unwrap();
            assert_eq!(name, "one");
        }
        let statement = conn.prepare_cached(sql).unwrap();
        assert_eq!(statement.get_status(StatementStatus::RePrepare), 0);
    }

    #[test]
    fn refuses_a_database_that_cannot_be_wal() {
        // SQLite keeps an in-memory database in journal_mode "memory" whatever is asked.
        let err = open_durable(Path::new(":memory:"), "").unwrap_err();
        assert!(
            err.to_string().contains("journal_mode is memory, not wal"),
            "{err}"
        );
    }
}
