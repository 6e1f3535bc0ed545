//! gatewayd's durable state: SQLite at `<state>/gateway/gatewayd.db` (WAL, `synchronous=FULL`).
//!
//! Owns two tables: `devices` (one stable device id per `(user_id, device_name)`, the folders
//! it last shared, when it was last seen) and `requests` (every dispatched request id with its
//! owner, device, kind and state: `pending`, `done` with the outcome, or `unknown` with a
//! reason). A request is recorded *before* it is sent, so a request id once in this table is
//! never sent again, whatever happens to gatewayd.
//!
//! At open, every request still `pending` becomes `unknown`: gatewayd died while it was on a
//! laptop, and nobody can tell whether it ran.
//!
//! Must never hold a token, never delete a request record, and never be called on an async
//! thread: every call is short and synchronous; async callers use `spawn_blocking`.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use rusqlite::{Connection, OptionalExtension, params};

use super::protocol::{DispatchState, FolderInfo, Outcome};

/// Why the gateway store failed.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// Opening the database or setting it up failed.
    #[error("cannot open the gateway store {path}: {source}")]
    Open {
        path: PathBuf,
        source: rusqlite::Error,
    },
    /// A statement failed.
    #[error("gateway store: cannot {operation}: {source}")]
    Query {
        operation: &'static str,
        source: rusqlite::Error,
    },
    /// A stored JSON column could not be (de)serialized.
    #[error("gateway store: the {what} of {id} is not valid JSON: {source}")]
    Json {
        what: &'static str,
        id: String,
        source: serde_json::Error,
    },
}

fn query(operation: &'static str) -> impl FnOnce(rusqlite::Error) -> StoreError {
    move |source| StoreError::Query { operation, source }
}

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS devices (
    device_id     TEXT PRIMARY KEY,
    user_id       TEXT NOT NULL,
    name          TEXT NOT NULL,
    folders       TEXT NOT NULL DEFAULT '[]',
    version       TEXT NOT NULL DEFAULT '',
    created_at_ms INTEGER NOT NULL,
    last_seen_ms  INTEGER NOT NULL,
    UNIQUE (user_id, name)
);
CREATE TABLE IF NOT EXISTS requests (
    request_id     TEXT PRIMARY KEY,
    user_id        TEXT NOT NULL,
    device_id      TEXT NOT NULL,
    folder         TEXT NOT NULL,
    kind           TEXT NOT NULL,
    state          TEXT NOT NULL CHECK (state IN ('pending', 'done', 'unknown')),
    outcome        TEXT,
    reason         TEXT,
    created_at_ms  INTEGER NOT NULL,
    finished_at_ms INTEGER
);
CREATE INDEX IF NOT EXISTS devices_by_user ON devices (user_id, last_seen_ms);
";

/// The reason recorded for requests found pending when gatewayd starts.
pub const RESTART_REASON: &str =
    "gatewayd stopped while the request was pending; it may or may not have run on the device";

/// A device as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceRecord {
    pub device_id: String,
    pub user_id: String,
    pub name: String,
    pub folders: Vec<FolderInfo>,
    pub last_seen_ms: i64,
}

/// A dispatched request as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestRecord {
    pub request_id: String,
    pub user_id: String,
    pub device_id: String,
    pub kind: String,
    pub state: DispatchState,
}

/// What [`Store::begin_request`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Begin {
    /// Recorded as pending now: the caller may send it, once.
    New,
    /// The id was recorded before: never send it again.
    Existing(RequestRecord),
}

/// A cheap-to-clone handle on the store.
#[derive(Clone)]
pub struct Store {
    conn: Arc<Mutex<Connection>>,
}

impl Store {
    /// Opens (creating if needed) the database at `path`, then turns every request left
    /// `pending` into `unknown`. Returns the store and how many requests were reconciled.
    pub fn open(path: &Path, now_ms: i64) -> Result<(Store, usize), StoreError> {
        let err = |source| StoreError::Open {
            path: path.to_owned(),
            source,
        };
        let conn = crate::daemon::sqlite::open_durable(path, SCHEMA).map_err(err)?;
        let reconciled = conn
            .execute(
                "UPDATE requests SET state = 'unknown', reason = ?1, finished_at_ms = ?2
                 WHERE state = 'pending'",
                params![RESTART_REASON, now_ms],
            )
            .map_err(err)?;
        Ok((
            Store {
                conn: Arc::new(Mutex::new(conn)),
            },
            reconciled,
        ))
    }

    fn db(&self) -> MutexGuard<'_, Connection> {
        self.conn.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The stable id of `(user_id, name)`, created on first sight; records the folders and
    /// version this connection shares and marks it seen now.
    pub fn register_device(
        &self,
        user_id: &str,
        name: &str,
        folders: &[FolderInfo],
        version: &str,
        now_ms: i64,
    ) -> Result<String, StoreError> {
        let folders_json = serde_json::to_string(folders).map_err(|source| StoreError::Json {
            what: "folders",
            id: name.to_owned(),
            source,
        })?;
        let mut db = self.db();
        let tx = db.transaction().map_err(query("begin a device update"))?;
        let existing: Option<String> = tx
            .query_row(
                "SELECT device_id FROM devices WHERE user_id = ?1 AND name = ?2",
                params![user_id, name],
                |r| r.get(0),
            )
            .optional()
            .map_err(query("look up a device"))?;
        let device_id = match existing {
            Some(id) => {
                tx.execute(
                    "UPDATE devices SET folders = ?2, version = ?3, last_seen_ms = ?4
                     WHERE device_id = ?1",
                    params![id, folders_json, version, now_ms],
                )
                .map_err(query("update a device"))?;
                id
            }
            None => {
                let id = format!("dev_{}", hex::encode(rand::random::<[u8; 12]>()));
                tx.execute(
                    "INSERT INTO devices
                     (device_id, user_id, name, folders, version, created_at_ms, last_seen_ms)
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?6)",
                    params![id, user_id, name, folders_json, version, now_ms],
                )
                .map_err(query("insert a device"))?;
                id
            }
        };
        tx.commit().map_err(query("commit a device update"))?;
        Ok(device_id)
    }

    /// Marks a device seen now (at disconnect).
    pub fn touch_device(&self, device_id: &str, now_ms: i64) -> Result<(), StoreError> {
        self.db()
            .execute(
                "UPDATE devices SET last_seen_ms = ?2 WHERE device_id = ?1",
                params![device_id, now_ms],
            )
            .map_err(query("mark a device seen"))?;
        Ok(())
    }

    fn device_from_row(row: &rusqlite::Row<'_>) -> rusqlite::Result<(DeviceRecord, String)> {
        Ok((
            DeviceRecord {
                device_id: row.get(0)?,
                user_id: row.get(1)?,
                name: row.get(2)?,
                folders: Vec::new(),
                last_seen_ms: row.get(4)?,
            },
            row.get(3)?,
        ))
    }

    fn with_folders(
        (mut device, json): (DeviceRecord, String),
    ) -> Result<DeviceRecord, StoreError> {
        device.folders = serde_json::from_str(&json).map_err(|source| StoreError::Json {
            what: "folders",
            id: device.device_id.clone(),
            source,
        })?;
        Ok(device)
    }

    /// One device by id, whoever owns it (the caller checks the owner).
    pub fn device(&self, device_id: &str) -> Result<Option<DeviceRecord>, StoreError> {
        let row = self
            .db()
            .query_row(
                "SELECT device_id, user_id, name, folders, last_seen_ms FROM devices
                 WHERE device_id = ?1",
                params![device_id],
                Store::device_from_row,
            )
            .optional()
            .map_err(query("read a device"))?;
        row.map(Store::with_folders).transpose()
    }

    /// `user_id`'s devices seen at or after `since_ms`, most recent first. Only that person's.
    pub fn devices_of(
        &self,
        user_id: &str,
        since_ms: i64,
    ) -> Result<Vec<DeviceRecord>, StoreError> {
        let db = self.db();
        let mut statement = db
            .prepare(
                "SELECT device_id, user_id, name, folders, last_seen_ms FROM devices
                 WHERE user_id = ?1 AND last_seen_ms >= ?2 ORDER BY last_seen_ms DESC, name",
            )
            .map_err(query("list devices"))?;
        let rows = statement
            .query_map(params![user_id, since_ms], Store::device_from_row)
            .map_err(query("list devices"))?
            .collect::<Result<Vec<_>, _>>()
            .map_err(query("list devices"))?;
        rows.into_iter().map(Store::with_folders).collect()
    }

    /// Records a request as pending unless its id is already known; see [`Begin`].
    pub fn begin_request(
        &self,
        request_id: &str,
        user_id: &str,
        device_id: &str,
        folder: &str,
        kind: &str,
        now_ms: i64,
    ) -> Result<Begin, StoreError> {
        let mut db = self.db();
        let tx = db.transaction().map_err(query("begin a request"))?;
        if let Some(existing) = Store::request_in(&tx, request_id)? {
            return Ok(Begin::Existing(existing));
        }
        tx.execute(
            "INSERT INTO requests (request_id, user_id, device_id, folder, kind, state, created_at_ms)
             VALUES (?1, ?2, ?3, ?4, ?5, 'pending', ?6)",
            params![request_id, user_id, device_id, folder, kind, now_ms],
        )
        .map_err(query("record a request"))?;
        tx.commit().map_err(query("commit a request"))?;
        Ok(Begin::New)
    }

    /// Records the final state of a pending request. A request already final keeps its first
    /// final state (a late result never overwrites `unknown`).
    pub fn finish_request(
        &self,
        request_id: &str,
        state: &DispatchState,
        now_ms: i64,
    ) -> Result<(), StoreError> {
        let (name, outcome, reason) = match state {
            DispatchState::Pending => return Ok(()),
            DispatchState::Done { outcome } => (
                "done",
                Some(
                    serde_json::to_string(outcome).map_err(|source| StoreError::Json {
                        what: "outcome",
                        id: request_id.to_owned(),
                        source,
                    })?,
                ),
                None,
            ),
            DispatchState::Unknown { reason } => ("unknown", None, Some(reason.as_str())),
        };
        self.db()
            .execute(
                "UPDATE requests SET state = ?2, outcome = ?3, reason = ?4, finished_at_ms = ?5
                 WHERE request_id = ?1 AND state = 'pending'",
                params![request_id, name, outcome, reason, now_ms],
            )
            .map_err(query("record a request's outcome"))?;
        Ok(())
    }

    /// A request by id, whoever dispatched it (the caller checks the owner).
    pub fn request(&self, request_id: &str) -> Result<Option<RequestRecord>, StoreError> {
        Store::request_in(&self.db(), request_id)
    }

    fn request_in(
        conn: &Connection,
        request_id: &str,
    ) -> Result<Option<RequestRecord>, StoreError> {
        type Row = (
            String,
            String,
            String,
            String,
            Option<String>,
            Option<String>,
        );
        let row: Option<Row> = conn
            .query_row(
                "SELECT user_id, device_id, kind, state, outcome, reason FROM requests
                 WHERE request_id = ?1",
                params![request_id],
                |r| {
                    Ok((
                        r.get(0)?,
                        r.get(1)?,
                        r.get(2)?,
                        r.get(3)?,
                        r.get(4)?,
                        r.get(5)?,
                    ))
                },
            )
            .optional()
            .map_err(query("read a request"))?;
        let Some((user_id, device_id, kind, state, outcome, reason)) = row else {
            return Ok(None);
        };
        let state = match (state.as_str(), outcome) {
            ("done", Some(json)) => DispatchState::Done {
                outcome: serde_json::from_str::<Outcome>(&json).map_err(|source| {
                    StoreError::Json {
                        what: "outcome",
                        id: request_id.to_owned(),
                        source,
                    }
                })?,
            },
            ("pending", _) => DispatchState::Pending,
            _ => DispatchState::Unknown {
                reason: reason.unwrap_or_else(|| "the outcome was not recorded".to_owned()),
            },
        };
        Ok(Some(RequestRecord {
            request_id: request_id.to_owned(),
            user_id,
            device_id,
            kind,
            state,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gateway::protocol::FolderAccess;

    fn folders() -> Vec<FolderInfo> {
        vec![FolderInfo {
            alias: "proj".into(),
            access: FolderAccess::ReadWrite,
            downloads: false,
        }]
    }

    #[test]
    fn device_ids_are_stable_per_user_and_name() {
        let tmp = tempfile::tempdir().unwrap();
        let (store, _) = Store::open(&tmp.path().join("g.db"), 1).unwrap();
        let a = store
            .register_device("u1", "laptop", &folders(), "1", 10)
            .unwrap();
        let again = store.register_device("u1", "laptop", &[], "2", 20).unwrap();
        let other_user = store.register_device("u2", "laptop", &[], "1", 30).unwrap();
        assert_eq!(a, again);
        assert_ne!(a, other_user);
        let listed = store.devices_of("u1", 0).unwrap();
        assert_eq!(listed.len(), 1);
        assert_eq!(listed[0].last_seen_ms, 20);
        assert!(listed[0].folders.is_empty());
        assert!(store.devices_of("u1", 21).unwrap().is_empty());
        assert_eq!(store.device(&other_user).unwrap().unwrap().user_id, "u2");
    }

    #[test]
    fn a_request_id_is_recorded_once_and_pending_becomes_unknown_at_reopen() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("g.db");
        let (store, _) = Store::open(&path, 1).unwrap();
        assert_eq!(
            store
                .begin_request("r1", "u1", "d1", "proj", "shell", 5)
                .unwrap(),
            Begin::New
        );
        assert_eq!(
            store
                .begin_request("r2", "u1", "d1", "proj", "shell", 5)
                .unwrap(),
            Begin::New
        );
        let done = DispatchState::Done {
            outcome: Outcome::Refused {
                code: "x".into(),
                message: "y".into(),
            },
        };
        store.finish_request("r1", &done, 6).unwrap();
        // A second final state never overwrites the first.
        store
            .finish_request(
                "r1",
                &DispatchState::Unknown {
                    reason: "late".into(),
                },
                7,
            )
            .unwrap();
        match store
            .begin_request("r1", "u1", "d1", "proj", "shell", 8)
            .unwrap()
        {
            Begin::Existing(record) => assert_eq!(record.state, done),
            other => panic!("{other:?}"),
        }
        drop(store);
        let (store, reconciled) = Store::open(&path, 9).unwrap();
        assert_eq!(reconciled, 1);
        assert_eq!(store.request("r1").unwrap().unwrap().state, done);
        assert_eq!(
            store.request("r2").unwrap().unwrap().state,
            DispatchState::Unknown {
                reason: RESTART_REASON.into()
            }
        );
        assert!(store.request("r3").unwrap().is_none());
    }
}
