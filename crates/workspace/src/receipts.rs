//! Durable receipts: one SQLite database per project root, WAL with `synchronous=FULL`.
//!
//! A receipt is written *prepared* before a change touches the documents tree and marked
//! *applied* (or *not_applied*) after; a prepared receipt left by a crash is reconciled from
//! the file on disk, never guessed (`workspace::ops`). Request ids are scoped to the caller:
//! the unique key is `(user_id, request_id, part_index)`, so one person's id never finds
//! another's receipt, and a patch set holds one receipt per file (`part_index` 0..`part_count`)
//! under its one request id; every other change is part 0 of 1.
//!
//! Schema versions (`PRAGMA user_version`): 0 is the first layout, unique on
//! `(user_id, request_id)`, which SQLite cannot relax in place; [`ReceiptStore::open`] rebuilds
//! such a table into version 2 in one transaction, copying every row (rowid included, so the
//! history's order is kept) and checking the count before it commits; a store newer than this
//! binary knows is refused, never rewritten.
//!
//! `synchronous=FULL` because NORMAL in WAL mode can lose the last committed transactions on
//! power loss, and a receipt that vanishes after we answered "applied" is a lie. The one
//! exception is the group commit's applied marks ([`ReceiptStore::set_states_unsynced`]): a
//! mark lost to a power cut leaves its receipt *prepared*, never gone, and the change it
//! records is already durable on disk, so recovery decides it *applied* again. Receipts are
//! never pruned here.

use agentworks_core::revision::Revision;
use rusqlite::{Connection, OptionalExtension, params};
use std::path::{Path, PathBuf};

/// Before-content kept per receipt; longer content is truncated and flagged.
pub const BEFORE_CONTENT_CAP: usize = 128 * 1024;

#[derive(Debug, thiserror::Error)]
pub enum ReceiptError {
    #[error("the receipt store {path} is unavailable: {source}; refusing the change (fail closed)")]
    Unavailable {
        path: PathBuf,
        source: rusqlite::Error,
    },
    #[error("receipt store {path}: {source}")]
    Query {
        path: PathBuf,
        source: rusqlite::Error,
    },
}

pub use agentworks_contract::workspaced::{Operation, Receipt, ReceiptPart, ReceiptState};

/// The receipt database of one project root.
pub struct ReceiptStore {
    path: PathBuf,
    conn: Connection,
    /// Whether the connection is back at `synchronous=FULL` after
    /// [`ReceiptStore::set_states_unsynced`]; a prepared receipt is never written while not.
    synced: std::cell::Cell<bool>,
}

/// The layout this binary writes (`PRAGMA user_version`).
const SCHEMA_VERSION: i64 = 2;

/// The version-2 table, created as `{table}`.
const TABLE: &str = "
CREATE TABLE IF NOT EXISTS {table} (
    receipt_id TEXT PRIMARY KEY,
    request_id TEXT NOT NULL,
    operation TEXT NOT NULL,
    project TEXT NOT NULL,
    path TEXT NOT NULL,
    to_path TEXT,
    user_id TEXT NOT NULL,
    user_name TEXT NOT NULL,
    connection_id TEXT,
    source TEXT NOT NULL,
    previous_revision TEXT NOT NULL,
    resulting_revision TEXT NOT NULL,
    state TEXT NOT NULL,
    created_at_ms INTEGER NOT NULL,
    updated_at_ms INTEGER NOT NULL,
    payload_hash TEXT NOT NULL,
    before_content BLOB,
    before_truncated INTEGER NOT NULL,
    part_index INTEGER NOT NULL DEFAULT 0,
    part_count INTEGER NOT NULL DEFAULT 1,
    UNIQUE (user_id, request_id, part_index)
);
";

/// The secondary indexes. `receipts_by_to_path` holds only moves (the one operation with a
/// `to_path`), so a write adds nothing to it; with `receipts_by_path` it lets a file's history
/// be found without reading every receipt.
const INDEXES: &str = "
CREATE INDEX IF NOT EXISTS receipts_by_path ON receipts (path, created_at_ms);
CREATE INDEX IF NOT EXISTS receipts_by_state ON receipts (state);
CREATE INDEX IF NOT EXISTS receipts_by_to_path ON receipts (to_path) WHERE to_path IS NOT NULL;
";

/// The columns version 0 had, all kept by the migration.
const V0_COLUMNS: &str = "receipt_id, request_id, operation, project, path, to_path, user_id, user_name, \
    connection_id, source, previous_revision, resulting_revision, state, created_at_ms, \
    updated_at_ms, payload_hash, before_content, before_truncated";

/// The columns of the current layout, in the order [`row_to_receipt`] reads them. A macro, so
/// the statements below are made once, at compile time, not formatted on every call (a write
/// runs two of them).
macro_rules! columns {
    () => {
        "receipt_id, request_id, operation, project, path, to_path, user_id, user_name, \
         connection_id, source, previous_revision, resulting_revision, state, created_at_ms, \
         updated_at_ms, payload_hash, before_content, before_truncated, part_index, part_count"
    };
}

/// `SELECT` of every column of the receipts, then `$rest` (its `WHERE`, order and limit).
macro_rules! select_receipts {
    ($rest:literal) => {
        concat!("SELECT ", columns!(), " FROM receipts ", $rest)
    };
}

/// The caller's first receipt under a request id (a write's idempotency check).
const FIND_FIRST: &str =
    select_receipts!("WHERE user_id = ?1 AND request_id = ?2 ORDER BY part_index LIMIT 1");
const FIND_ALL: &str =
    select_receipts!("WHERE user_id = ?1 AND request_id = ?2 ORDER BY part_index");
const BY_RECEIPT_ID: &str = select_receipts!("WHERE receipt_id = ?1");
const PREPARED: &str = select_receipts!("WHERE state = 'prepared' ORDER BY created_at_ms");
/// The prepared receipts of the path `?1` as source or destination: read through
/// `receipts_by_state`, which holds few prepared rows (none, nearly always), so a change pays
/// one index lookup for it. The index is named: with statistics (`ANALYZE`) an older SQLite
/// (3.40, Debian 12's) picks the two path indexes instead, which read every receipt the path
/// ever had; the bundled one does not, but the plan should not hang on a planner's version.
const PREPARED_ON_PATH: &str = concat!(
    "SELECT ",
    columns!(),
    " FROM receipts INDEXED BY receipts_by_state",
    " WHERE state = 'prepared' AND (path = ?1 OR to_path = ?1) ORDER BY created_at_ms"
);
/// [`ReceiptStore::recent`] for every receipt (`?1` the limit).
const RECENT: &str = select_receipts!("ORDER BY rowid DESC LIMIT ?1");
/// [`ReceiptStore::recent`] for the receipts of the path `?1` as source or target (`?2` the
/// limit).
const RECENT_FOR_PATH: &str = select_receipts!(
    "WHERE rowid IN \
     (SELECT rowid FROM receipts WHERE path = ?1 \
      UNION ALL SELECT rowid FROM receipts WHERE to_path = ?1) \
     ORDER BY rowid DESC LIMIT ?2"
);
const INSERT: &str = concat!(
    "INSERT INTO receipts (",
    columns!(),
    ") VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17, ?18, ?19, ?20)"
);

/// Bring the store to [`SCHEMA_VERSION`]: create it, migrate version 0, or refuse a newer one.
fn migrate(conn: &Connection) -> rusqlite::Result<()> {
    let version: i64 = conn.query_row("PRAGMA user_version", [], |r| r.get(0))?;
    if version > SCHEMA_VERSION {
        return Err(rusqlite::Error::InvalidParameterName(format!(
            "the receipt store has schema version {version}; this workspaced knows {SCHEMA_VERSION} at most"
        )));
    }
    if version == SCHEMA_VERSION {
        return conn.execute_batch(&format!(
            "{}{INDEXES}",
            TABLE.replace("{table}", "receipts")
        ));
    }
    // IMMEDIATE: no other writer between reading the old table and replacing it.
    conn.execute_batch("BEGIN IMMEDIATE")?;
    let migrated = (|| -> rusqlite::Result<()> {
        let exists: bool = conn.query_row(
            "SELECT EXISTS (SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'receipts')",
            [],
            |r| r.get(0),
        )?;
        if exists {
            let before: i64 = conn.query_row("SELECT COUNT(*) FROM receipts", [], |r| r.get(0))?;
            conn.execute_batch(&format!(
                "DROP TABLE IF EXISTS receipts_v2;
                 {table}
                 INSERT INTO receipts_v2 (rowid, {V0_COLUMNS}, part_index, part_count)
                     SELECT rowid, {V0_COLUMNS}, 0, 1 FROM receipts ORDER BY rowid;",
                table = TABLE.replace("{table}", "receipts_v2"),
            ))?;
            let after: i64 =
                conn.query_row("SELECT COUNT(*) FROM receipts_v2", [], |r| r.get(0))?;
            if after != before {
                return Err(rusqlite::Error::InvalidParameterName(format!(
                    "migrating the receipt store copied {after} of {before} receipts"
                )));
            }
            conn.execute_batch("DROP TABLE receipts; ALTER TABLE receipts_v2 RENAME TO receipts;")?;
        } else {
            conn.execute_batch(&TABLE.replace("{table}", "receipts"))?;
        }
        conn.execute_batch(&format!(
            "{INDEXES} PRAGMA user_version = {SCHEMA_VERSION};"
        ))
    })();
    match migrated {
        Ok(()) => conn.execute_batch("COMMIT"),
        Err(e) => {
            let _ = conn.execute_batch("ROLLBACK");
            Err(e)
        }
    }
}

use agentworks_support::clock::now_ms;
use agentworks_support::sqlite::open_durable;

fn row_to_receipt(row: &rusqlite::Row<'_>) -> rusqlite::Result<Receipt> {
    let revision = |i: usize| -> rusqlite::Result<Revision> {
        let raw: String = row.get(i)?;
        Revision::parse(&raw).map_err(|e| {
            rusqlite::Error::FromSqlConversionFailure(i, rusqlite::types::Type::Text, Box::new(e))
        })
    };
    Ok(Receipt {
        receipt_id: row.get(0)?,
        request_id: row.get(1)?,
        operation: Operation::parse(&row.get::<_, String>(2)?),
        project: row.get(3)?,
        path: row.get(4)?,
        to_path: row.get(5)?,
        user_id: row.get(6)?,
        user_name: row.get(7)?,
        connection_id: row.get(8)?,
        source: row.get(9)?,
        previous_revision: revision(10)?,
        resulting_revision: revision(11)?,
        state: ReceiptState::parse(&row.get::<_, String>(12)?),
        created_at_ms: row.get(13)?,
        updated_at_ms: row.get(14)?,
        payload_hash: row.get(15)?,
        before_content: row.get(16)?,
        before_truncated: row.get::<_, i64>(17)? != 0,
        part: match Operation::parse(&row.get::<_, String>(2)?) {
            Operation::PatchSet => Some(ReceiptPart {
                index: row.get(18)?,
                count: row.get(19)?,
            }),
            _ => None,
        },
    })
}

impl ReceiptStore {
    /// Open (creating) the store at `dir/receipts.db` with WAL and `synchronous=FULL`
    /// ([`open_durable`]: a store that cannot be WAL is refused).
    pub fn open(dir: &Path) -> Result<ReceiptStore, ReceiptError> {
        let path = dir.join("receipts.db");
        let unavailable = |source| ReceiptError::Unavailable {
            path: path.clone(),
            source,
        };
        let conn = open_durable(&path, "").map_err(unavailable)?;
        migrate(&conn).map_err(unavailable)?;
        Ok(ReceiptStore {
            path,
            conn,
            synced: std::cell::Cell::new(true),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    fn query_err(&self, source: rusqlite::Error) -> ReceiptError {
        ReceiptError::Query {
            path: self.path.clone(),
            source,
        }
    }

    /// Record a prepared receipt. Any failure is `Unavailable`: the caller must refuse.
    pub fn insert_prepared(&self, receipt: &Receipt) -> Result<(), ReceiptError> {
        let unavailable = |source| ReceiptError::Unavailable {
            path: self.path.clone(),
            source,
        };
        self.synchronous_full().map_err(unavailable)?;
        insert_row(&self.conn, receipt).map_err(unavailable)
    }

    /// Put the connection back at `synchronous=FULL` if an unsynced commit left it otherwise.
    fn synchronous_full(&self) -> rusqlite::Result<()> {
        if !self.synced.get() {
            self.conn.execute_batch("PRAGMA synchronous=FULL")?;
            self.synced.set(true);
        }
        Ok(())
    }

    /// Record every receipt of a patch set as prepared, in one transaction: all or none.
    pub fn insert_prepared_all(&self, receipts: &[Receipt]) -> Result<(), ReceiptError> {
        let unavailable = |source| ReceiptError::Unavailable {
            path: self.path.clone(),
            source,
        };
        self.synchronous_full().map_err(unavailable)?;
        let tx = self.conn.unchecked_transaction().map_err(unavailable)?;
        for receipt in receipts {
            insert_row(&tx, receipt).map_err(unavailable)?;
        }
        tx.commit().map_err(unavailable)
    }

    /// Move a receipt to `state`, returning the updated time.
    pub fn set_state(&self, receipt_id: &str, state: ReceiptState) -> Result<i64, ReceiptError> {
        let now = now_ms();
        let changed = self
            .conn
            .prepare_cached(SET_STATE)
            .and_then(|mut stmt| stmt.execute(params![state.as_str(), now, receipt_id]))
            .map_err(|e| self.query_err(e))?;
        if changed != 1 {
            return Err(self.query_err(rusqlite::Error::QueryReturnedNoRows));
        }
        Ok(now)
    }

    /// Move several receipts to their states in one transaction (one commit, one sync): all or
    /// none. Returns the updated time.
    pub fn set_states(&self, changes: &[(&str, ReceiptState)]) -> Result<i64, ReceiptError> {
        let now = now_ms();
        let tx = self
            .conn
            .unchecked_transaction()
            .map_err(|e| self.query_err(e))?;
        for (receipt_id, state) in changes {
            let changed = tx
                .prepare_cached(SET_STATE)
                .and_then(|mut stmt| stmt.execute(params![state.as_str(), now, receipt_id]))
                .map_err(|e| self.query_err(e))?;
            if changed != 1 {
                return Err(self.query_err(rusqlite::Error::QueryReturnedNoRows));
            }
        }
        tx.commit().map_err(|e| self.query_err(e))?;
        Ok(now)
    }

    /// [`ReceiptStore::set_states`] committed without waiting for the disk (`synchronous=NORMAL`
    /// for this one transaction): the group commit's applied and not-applied marks. Sound
    /// because each such mark comes after the change it records is durable (the folder synced)
    /// or never happened, and WAL commits reach the disk in order: the next synced commit on
    /// this store (the next change's prepared receipt, always before its rename) makes the
    /// marks durable with it. A power cut before that leaves the receipts *prepared*, and
    /// recovery decides them from the disk, where the outcome already is.
    pub fn set_states_unsynced(
        &self,
        changes: &[(&str, ReceiptState)],
    ) -> Result<i64, ReceiptError> {
        self.synced.set(false);
        self.conn
            .execute_batch("PRAGMA synchronous=NORMAL")
            .map_err(|e| self.query_err(e))?;
        let marked = self.set_states(changes);
        // Back to FULL now; if that fails, the next prepared receipt tries again and is
        // refused rather than written unsynced.
        self.synchronous_full().map_err(|e| self.query_err(e))?;
        marked
    }

    /// The caller's receipt for `request_id`, if any (for a patch set, its first file's).
    pub fn find(&self, user_id: &str, request_id: &str) -> Result<Option<Receipt>, ReceiptError> {
        self.conn
            .prepare_cached(FIND_FIRST)
            .and_then(|mut stmt| {
                stmt.query_row(params![user_id, request_id], row_to_receipt)
                    .optional()
            })
            .map_err(|e| self.query_err(e))
    }

    /// Every receipt the caller holds under `request_id`, in part order (one for a single-file
    /// change, one per file for a patch set).
    pub fn find_all(&self, user_id: &str, request_id: &str) -> Result<Vec<Receipt>, ReceiptError> {
        let mut stmt = self
            .conn
            .prepare_cached(FIND_ALL)
            .map_err(|e| self.query_err(e))?;
        let rows = stmt
            .query_map(params![user_id, request_id], row_to_receipt)
            .map_err(|e| self.query_err(e))?;
        rows.collect::<Result<Vec<_>, _>>()
            .map_err(|e| self.query_err(e))
    }

    pub fn by_receipt_id(&self, receipt_id: &str) -> Result<Option<Receipt>, ReceiptError> {
        self.conn
            .query_row(BY_RECEIPT_ID, params![receipt_id], row_to_receipt)
            .optional()
            .map_err(|e| self.query_err(e))
    }

    /// Every receipt still prepared (left by an interrupted change).
    pub fn prepared(&self) -> Result<Vec<Receipt>, ReceiptError> {
        let mut stmt = self.conn.prepare(PREPARED).map_err(|e| self.query_err(e))?;
        let rows = stmt
            .query_map([], row_to_receipt)
            .map_err(|e| self.query_err(e))?;
        rows.collect::<Result<Vec<_>, _>>()
            .map_err(|e| self.query_err(e))
    }

    /// Every receipt of `path` (as source or destination) still prepared.
    pub fn prepared_on(&self, path: &str) -> Result<Vec<Receipt>, ReceiptError> {
        let mut stmt = self
            .conn
            .prepare_cached(PREPARED_ON_PATH)
            .map_err(|e| self.query_err(e))?;
        let rows = stmt
            .query_map(params![path], row_to_receipt)
            .map_err(|e| self.query_err(e))?;
        rows.collect::<Result<Vec<_>, _>>()
            .map_err(|e| self.query_err(e))
    }

    /// The most recent receipts, newest first, optionally for one path (as source or target).
    ///
    /// Newest is the order the receipts were recorded in (the rowid: changes of a project are
    /// recorded one at a time, under its lock), not their clock time, which can step back.
    /// Both queries read only what they return (and, for a path, that path's receipts): the
    /// one query this replaced read every receipt of the project and sorted them, while the
    /// caller held the project's lock, so one history call stalled the project's writes for a
    /// time that grew with its history.
    pub fn recent(&self, path: Option<&str>, limit: usize) -> Result<Vec<Receipt>, ReceiptError> {
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let mut stmt = self
            .conn
            .prepare_cached(if path.is_some() {
                RECENT_FOR_PATH
            } else {
                RECENT
            })
            .map_err(|e| self.query_err(e))?;
        let rows = match path {
            Some(path) => stmt.query_map(params![path, limit], row_to_receipt),
            None => stmt.query_map(params![limit], row_to_receipt),
        }
        .map_err(|e| self.query_err(e))?;
        rows.collect::<Result<Vec<_>, _>>()
            .map_err(|e| self.query_err(e))
    }
}

/// A receipt's state change (compiled once per connection: `prepare_cached`, as every
/// statement a change runs).
const SET_STATE: &str = "UPDATE receipts SET state = ?1, updated_at_ms = ?2 WHERE receipt_id = ?3";

/// One receipt row, as prepared.
fn insert_row(conn: &Connection, receipt: &Receipt) -> rusqlite::Result<()> {
    let (part_index, part_count) = receipt.part.map_or((0, 1), |p| (p.index, p.count));
    conn.prepare_cached(INSERT)?
        .execute(params![
            receipt.receipt_id,
            receipt.request_id,
            receipt.operation.as_str(),
            receipt.project,
            receipt.path,
            receipt.to_path,
            receipt.user_id,
            receipt.user_name,
            receipt.connection_id,
            receipt.source,
            receipt.previous_revision.to_string(),
            receipt.resulting_revision.to_string(),
            ReceiptState::Prepared.as_str(),
            receipt.created_at_ms,
            receipt.updated_at_ms,
            receipt.payload_hash,
            receipt.before_content,
            receipt.before_truncated as i64,
            part_index,
            part_count,
        ])
        .map(|_| ())
}

/// A fresh receipt id: `rcpt_`, the time in milliseconds (48 bits) and 80 random bits, in
/// 32 hex digits.
///
/// Time first, so ids made one after another sort together: each new id then lands on the
/// last page of the receipt id index, as the rows do in the table, instead of on a random
/// page that the commit must write to the WAL whole. With wholly random ids, 8 busy projects
/// made about 10.5 WAL writes (`pwrite`) per change; with these, about 8.4. 80 random bits
/// keep two ids of the same millisecond apart.
pub fn new_receipt_id() -> String {
    let millis = u64::try_from(now_ms()).unwrap_or(0) & 0xffff_ffff_ffff;
    let random: [u8; 10] = rand::random();
    format!("rcpt_{millis:012x}{}", hex::encode(random))
}

/// Cap before-content at [`BEFORE_CONTENT_CAP`].
pub fn capped_before(content: &[u8]) -> (Vec<u8>, bool) {
    if content.len() > BEFORE_CONTENT_CAP {
        (content[..BEFORE_CONTENT_CAP].to_vec(), true)
    } else {
        (content.to_vec(), false)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn receipt_ids_sort_by_time_and_stay_unique() {
        let hex32 = |id: &str| {
            id.strip_prefix("rcpt_")
                .is_some_and(|h| h.len() == 32 && h.bytes().all(|b| b.is_ascii_hexdigit()))
        };
        // Eight ids a few milliseconds apart come out sorted (wholly random ids would, one
        // time in 40,320).
        let ids: Vec<String> = (0..8)
            .map(|_| {
                std::thread::sleep(std::time::Duration::from_millis(2));
                new_receipt_id()
            })
            .collect();
        assert!(ids.iter().all(|id| hex32(id)), "{ids:?}");
        assert!(ids.is_sorted(), "not in the order made: {ids:?}");
        // Many in the same millisecond: the random part keeps them apart.
        let ids: std::collections::HashSet<String> =
            (0..10_000).map(|_| new_receipt_id()).collect();
        assert_eq!(ids.len(), 10_000);
    }

    fn sample(id: &str, user: &str, request: &str) -> Receipt {
        let now = now_ms();
        Receipt {
            receipt_id: id.into(),
            request_id: request.into(),
            operation: Operation::Write,
            project: "p".into(),
            path: "a.txt".into(),
            to_path: None,
            user_id: user.into(),
            user_name: "Alice".into(),
            connection_id: Some("c1".into()),
            source: "test".into(),
            previous_revision: Revision::Missing,
            resulting_revision: Revision::of(b"x"),
            state: ReceiptState::Prepared,
            created_at_ms: now,
            updated_at_ms: now,
            payload_hash: "h".into(),
            before_content: None,
            before_truncated: false,
            part: None,
        }
    }

    #[test]
    fn prepared_then_applied_survives_reopen_and_is_caller_scoped() {
        let dir = tempfile::tempdir().unwrap();
        {
            let store = ReceiptStore::open(dir.path()).unwrap();
            store.insert_prepared(&sample("r1", "u1", "req")).unwrap();
            // Another user may use the same request id.
            store.insert_prepared(&sample("r2", "u2", "req")).unwrap();
            // The same user may not.
            assert!(store.insert_prepared(&sample("r3", "u1", "req")).is_err());
            store.set_state("r1", ReceiptState::Applied).unwrap();
        }
        let store = ReceiptStore::open(dir.path()).unwrap();
        let r1 = store.find("u1", "req").unwrap().unwrap();
        assert_eq!(r1.receipt_id, "r1");
        assert_eq!(r1.state, ReceiptState::Applied);
        assert_eq!(store.find("u2", "req").unwrap().unwrap().receipt_id, "r2");
        assert!(store.find("u3", "req").unwrap().is_none());
        assert_eq!(store.prepared().unwrap().len(), 1);
        let mode: String = store
            .conn
            .query_row("PRAGMA journal_mode", [], |r| r.get(0))
            .unwrap();
        assert_eq!(mode, "wal");
        let sync: i64 = store
            .conn
            .query_row("PRAGMA synchronous", [], |r| r.get(0))
            .unwrap();
        assert_eq!(sync, 2, "synchronous must be FULL");
    }

    /// The unsynced marks commit (a reader and a reopened store see them) and leave the
    /// connection at `synchronous=FULL` for the next prepared receipt, also when they fail.
    #[test]
    fn unsynced_marks_commit_and_leave_the_store_synchronous() {
        let dir = tempfile::tempdir().unwrap();
        let sync = |store: &ReceiptStore| -> i64 {
            store
                .conn
                .query_row("PRAGMA synchronous", [], |r| r.get(0))
                .unwrap()
        };
        {
            let store = ReceiptStore::open(dir.path()).unwrap();
            store
                .insert_prepared_all(&[sample("r1", "alice", "q1"), sample("r2", "alice", "q2")])
                .unwrap();
            store
                .set_states_unsynced(&[
                    ("r1", ReceiptState::Applied),
                    ("r2", ReceiptState::NotApplied),
                ])
                .unwrap();
            assert_eq!(sync(&store), 2, "back at FULL after the marks");
            // A mark of a receipt that does not exist fails, and rolls back, still at FULL.
            assert!(
                store
                    .set_states_unsynced(&[
                        ("r1", ReceiptState::Uncertain),
                        ("nope", ReceiptState::Applied)
                    ])
                    .is_err()
            );
            assert_eq!(sync(&store), 2, "back at FULL after a failed mark");
            store.insert_prepared(&sample("r3", "alice", "q3")).unwrap();
        }
        let store = ReceiptStore::open(dir.path()).unwrap();
        assert_eq!(
            store.find("alice", "q1").unwrap().unwrap().state,
            ReceiptState::Applied
        );
        assert_eq!(
            store.find("alice", "q2").unwrap().unwrap().state,
            ReceiptState::NotApplied
        );
        assert_eq!(
            store.find("alice", "q3").unwrap().unwrap().state,
            ReceiptState::Prepared
        );
    }

    /// A file's history is its receipts as source or target, in the order they were
    /// recorded (not by a clock that stepped back), newest first, at most `limit`.
    #[test]
    fn history_is_newest_first_by_record_order_with_moves() {
        let dir = tempfile::tempdir().unwrap();
        let store = ReceiptStore::open(dir.path()).unwrap();
        let receipt = |id: &str, path: &str, to_path: Option<&str>, at: i64| {
            let mut r = sample(id, "u1", &format!("q-{id}"));
            r.path = path.into();
            r.to_path = to_path.map(Into::into);
            r.created_at_ms = at;
            r
        };
        for r in [
            receipt("r1", "a.txt", None, 5_000),
            receipt("r2", "b.txt", None, 5_001),
            receipt("r3", "b.txt", Some("a.txt"), 5_002),
            // The clock stepped back.
            receipt("r4", "a.txt", None, 1_000),
            receipt("r5", "c.txt", None, 1_001),
        ] {
            store.insert_prepared(&r).unwrap();
        }
        let ids = |path: Option<&str>, limit: usize| -> Vec<String> {
            store
                .recent(path, limit)
                .unwrap()
                .into_iter()
                .map(|r| r.receipt_id)
                .collect()
        };
        assert_eq!(ids(Some("a.txt"), 10), ["r4", "r3", "r1"]);
        assert_eq!(ids(Some("a.txt"), 2), ["r4", "r3"]);
        assert_eq!(ids(Some("b.txt"), 10), ["r3", "r2"]);
        assert_eq!(ids(Some("d.txt"), 10), Vec::<String>::new());
        assert_eq!(ids(None, 3), ["r5", "r4", "r3"]);
        assert_eq!(ids(None, 10).len(), 5);
    }

    /// History reads only what it returns (and, for one path, that path's receipts): no plan
    /// reads the whole table, and none sorts it. The query before read and sorted every
    /// receipt of the project under the project's lock.
    #[test]
    fn history_reads_neither_every_receipt_nor_sorts_them() {
        let dir = tempfile::tempdir().unwrap();
        let store = ReceiptStore::open(dir.path()).unwrap();
        for (query, for_path) in [(RECENT, false), (RECENT_FOR_PATH, true)] {
            let mut explain = store
                .conn
                .prepare(&format!("EXPLAIN QUERY PLAN {query}"))
                .unwrap();
            let detail = |r: &rusqlite::Row<'_>| r.get::<_, String>(3);
            let plan: Vec<String> = if for_path {
                explain.query_map(params!["a.txt", 20], detail)
            } else {
                explain.query_map(params![20], detail)
            }
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
            let plan = plan.join("; ");
            assert!(!plan.contains("TEMP B-TREE"), "sorts: {plan}");
            if for_path {
                assert!(!plan.contains("SCAN"), "reads every receipt: {plan}");
                assert!(plan.contains("receipts_by_path"), "{plan}");
                assert!(plan.contains("receipts_by_to_path"), "{plan}");
            }
        }
    }

    /// A change's plan asks for its path's receipts still prepared: found as source or
    /// destination, decided ones left out, read through the state index (which holds few
    /// prepared rows), also with statistics of a long history.
    #[test]
    fn prepared_on_finds_a_paths_undecided_receipts_through_the_state_index() {
        let dir = tempfile::tempdir().unwrap();
        let store = ReceiptStore::open(dir.path()).unwrap();
        let receipt = |id: &str, path: &str, to_path: Option<&str>| {
            let mut r = sample(id, "u1", &format!("q-{id}"));
            r.path = path.into();
            r.to_path = to_path.map(Into::into);
            r
        };
        for r in [
            receipt("r1", "a.txt", None),
            receipt("r2", "b.txt", Some("a.txt")),
            receipt("r3", "a.txt", None),
            receipt("r4", "c.txt", None),
        ] {
            store.insert_prepared(&r).unwrap();
        }
        store.set_state("r3", ReceiptState::Applied).unwrap();
        let ids = |path: &str| -> Vec<String> {
            let mut ids: Vec<String> = store
                .prepared_on(path)
                .unwrap()
                .into_iter()
                .map(|r| r.receipt_id)
                .collect();
            ids.sort();
            ids
        };
        assert_eq!(ids("a.txt"), ["r1", "r2"]);
        assert_eq!(ids("b.txt"), ["r2"]);
        assert_eq!(ids("d.txt"), Vec::<String>::new());
        // A long history of many paths, decided: statistics then favour the path indexes.
        let cols = "receipt_id, request_id, operation, project, path, to_path, user_id, \
                    user_name, connection_id, source, previous_revision, resulting_revision, \
                    state, created_at_ms, updated_at_ms, payload_hash, before_content, \
                    before_truncated, part_index, part_count";
        store.conn.execute_batch("BEGIN").unwrap();
        for n in 0..2_000 {
            let id = format!("old{n}");
            let copy = format!(
                "INSERT INTO receipts ({cols}) SELECT {} FROM receipts WHERE receipt_id = 'r3'",
                cols.replacen("receipt_id, request_id", "?1, ?1", 1)
                    .replacen(" path,", " ?2,", 1)
            );
            let path = format!("f{}.txt", n % 100);
            store.conn.execute(&copy, params![id, path]).unwrap();
        }
        store.conn.execute_batch("COMMIT; ANALYZE").unwrap();
        assert_eq!(ids("a.txt"), ["r1", "r2"]);
        let plan: Vec<String> = store
            .conn
            .prepare(&format!("EXPLAIN QUERY PLAN {PREPARED_ON_PATH}"))
            .unwrap()
            .query_map(params!["a.txt"], |r| r.get::<_, String>(3))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        let plan = plan.join("; ");
        assert!(plan.contains("receipts_by_state"), "{plan}");
        assert!(!plan.contains("SCAN"), "reads every receipt: {plan}");
    }

    #[test]
    fn set_states_moves_every_receipt_or_none() {
        let dir = tempfile::tempdir().unwrap();
        let store = ReceiptStore::open(dir.path()).unwrap();
        store
            .insert_prepared_all(&[sample("r1", "alice", "q1"), sample("r2", "alice", "q2")])
            .unwrap();
        store
            .set_states(&[
                ("r1", ReceiptState::Applied),
                ("r2", ReceiptState::NotApplied),
            ])
            .unwrap();
        assert_eq!(
            store.by_receipt_id("r1").unwrap().unwrap().state,
            ReceiptState::Applied
        );
        assert_eq!(
            store.by_receipt_id("r2").unwrap().unwrap().state,
            ReceiptState::NotApplied
        );
        // An unknown id rolls the whole transaction back.
        store
            .set_states(&[
                ("r1", ReceiptState::NotApplied),
                ("nope", ReceiptState::Applied),
            ])
            .unwrap_err();
        assert_eq!(
            store.by_receipt_id("r1").unwrap().unwrap().state,
            ReceiptState::Applied
        );
    }

    #[test]
    fn before_content_is_capped() {
        let big = vec![b'a'; BEFORE_CONTENT_CAP + 10];
        let (kept, truncated) = capped_before(&big);
        assert_eq!(kept.len(), BEFORE_CONTENT_CAP);
        assert!(truncated);
        assert!(!capped_before(b"small").1);
    }

    /// The first layout, exactly as the first workspaced created it.
    const V0_SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS receipts (
    receipt_id TEXT PRIMARY KEY,
    request_id TEXT NOT NULL,
    operation TEXT NOT NULL,
    project TEXT NOT NULL,
    path TEXT NOT NULL,
    to_path TEXT,
    user_id TEXT NOT NULL,
    user_name TEXT NOT NULL,
    connection_id TEXT,
    source TEXT NOT NULL,
    previous_revision TEXT NOT NULL,
    resulting_revision TEXT NOT NULL,
    state TEXT NOT NULL,
    created_at_ms INTEGER NOT NULL,
    updated_at_ms INTEGER NOT NULL,
    payload_hash TEXT NOT NULL,
    before_content BLOB,
    before_truncated INTEGER NOT NULL,
    UNIQUE (user_id, request_id)
);
CREATE INDEX IF NOT EXISTS receipts_by_path ON receipts (path, created_at_ms);
CREATE INDEX IF NOT EXISTS receipts_by_state ON receipts (state);
";

    fn part(mut receipt: Receipt, index: u32, count: u32) -> Receipt {
        receipt.operation = Operation::PatchSet;
        receipt.part = Some(ReceiptPart { index, count });
        receipt
    }

    #[test]
    fn a_first_layout_store_is_migrated_without_losing_a_receipt() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("receipts.db");
        {
            let conn = open_durable(&path, V0_SCHEMA).unwrap();
            for (i, state) in ["applied", "prepared", "not_applied"].iter().enumerate() {
                conn.execute(
                    &format!(
                        "INSERT INTO receipts ({V0_COLUMNS}) VALUES (?1, ?2, 'write', 'p', ?3, NULL, \
                         'u1', 'Alice', 'c1', 'test', 'missing', ?4, ?5, ?6, ?6, 'h', ?7, 0)"
                    ),
                    params![
                        format!("r{i}"),
                        format!("req-{i}"),
                        format!("f{i}.txt"),
                        Revision::of(format!("{i}").as_bytes()).to_string(),
                        state,
                        // The same time for all: the order is kept by rowid alone.
                        1000i64,
                        format!("before {i}").into_bytes(),
                    ],
                )
                .unwrap();
            }
            let version: i64 = conn
                .query_row("PRAGMA user_version", [], |r| r.get(0))
                .unwrap();
            assert_eq!(version, 0);
        }
        let store = ReceiptStore::open(dir.path()).unwrap();
        let version: i64 = store
            .conn
            .query_row("PRAGMA user_version", [], |r| r.get(0))
            .unwrap();
        assert_eq!(version, SCHEMA_VERSION);
        let recent = store.recent(None, 10).unwrap();
        let ids: Vec<_> = recent.iter().map(|r| r.receipt_id.as_str()).collect();
        assert_eq!(ids, ["r2", "r1", "r0"], "every receipt, history order kept");
        let r1 = store.find("u1", "req-1").unwrap().unwrap();
        assert_eq!(
            (
                r1.state,
                r1.path.as_str(),
                r1.part,
                r1.before_content.as_deref()
            ),
            (
                ReceiptState::Prepared,
                "f1.txt",
                None,
                Some(&b"before 1"[..])
            )
        );
        assert_eq!(r1.resulting_revision, Revision::of(b"1"));
        assert_eq!(store.prepared().unwrap().len(), 1);
        // The migrated store takes a patch set under one id, and still refuses a second
        // receipt for a single change's id.
        store
            .insert_prepared_all(&[
                part(sample("s0", "u1", "set"), 0, 2),
                part(sample("s1", "u1", "set"), 1, 2),
            ])
            .unwrap();
        assert!(store.insert_prepared(&sample("r9", "u1", "req-0")).is_err());
        drop(store);
        // Opening again changes nothing.
        let store = ReceiptStore::open(dir.path()).unwrap();
        assert_eq!(store.recent(None, 10).unwrap().len(), 5);
    }

    #[test]
    fn a_patch_set_is_prepared_all_or_nothing_and_found_in_part_order() {
        let dir = tempfile::tempdir().unwrap();
        let store = ReceiptStore::open(dir.path()).unwrap();
        store
            .insert_prepared_all(&[
                part(sample("p1", "u1", "set"), 1, 2),
                part(sample("p0", "u1", "set"), 0, 2),
            ])
            .unwrap();
        let all = store.find_all("u1", "set").unwrap();
        let parts: Vec<_> = all
            .iter()
            .map(|r| (r.receipt_id.as_str(), r.part))
            .collect();
        assert_eq!(
            parts,
            [
                ("p0", Some(ReceiptPart { index: 0, count: 2 })),
                ("p1", Some(ReceiptPart { index: 1, count: 2 }))
            ]
        );
        assert_eq!(store.find("u1", "set").unwrap().unwrap().receipt_id, "p0");
        // A set whose second row collides (same part twice) leaves no row at all.
        let collide = store.insert_prepared_all(&[
            part(sample("q0", "u1", "other"), 0, 2),
            part(sample("q1", "u1", "other"), 0, 2),
        ]);
        assert!(collide.is_err());
        assert!(store.find_all("u1", "other").unwrap().is_empty());
    }

    #[test]
    fn a_store_from_a_newer_workspaced_is_refused_untouched() {
        let dir = tempfile::tempdir().unwrap();
        {
            let conn =
                open_durable(&dir.path().join("receipts.db"), "PRAGMA user_version = 7;").unwrap();
            drop(conn);
        }
        assert!(matches!(
            ReceiptStore::open(dir.path()),
            Err(ReceiptError::Unavailable { .. })
        ));
    }
}
