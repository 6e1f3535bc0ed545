//! Opening a SQLite store (the daemons' and the laptop executor's) the one way they all need:
//! WAL, refused when SQLite cannot give it (an in-memory or WAL-less file system would quietly
//! keep another journal mode), `synchronous=FULL` (a committed row survives power loss),
//! foreign keys enforced, a 10 s busy timeout for a second process on the same file, then the
//! store's idempotent schema.

use rusqlite::Connection;
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
    conn.execute_batch(schema)?;
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
