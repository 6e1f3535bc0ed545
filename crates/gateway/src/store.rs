//! gatewayd's durable state: SQLite at `<state>/gateway/gatewayd.db` (WAL, `synchronous=FULL`).
//!
//! Owns two tables: `devices` (one stable device id per `(user_id, token_id, device_name)`:
//! a device id belongs to the credential that created it; the folders it last shared, when it
//! was last seen) and `requests` (every dispatched request id with its owner, device, kind, a
//! SHA-256 of its payload (folder and operation) and its state: `pending`, `done` with the
//! outcome, or `unknown` with a reason). A request is recorded *before* it is sent, so a
//! request id once in this table is never sent again, whatever happens to gatewayd; a request
//! id claimed by a recovery before it was ever recorded is kept `unknown` with `sent = 0`.
//!
//! At open, every request still `pending` becomes `unknown`: gatewayd died while it was on a
//! laptop, and nobody can tell whether it ran. Only the device's own receipt can later turn
//! such an `unknown` into `done` ([`Store::recover_request`]).
//!
//! Databases made before devices were owned by credentials are migrated at open: their device
//! rows keep their ids but have no credential, so no connection ever claims them again (the
//! laptop gets a new device id on its next connection); their request rows have no payload
//! fingerprint, so a request id of theirs is never replayed for any payload.
//!
//! Must never hold a token, never delete a request record, and never be called on an async
//! thread: every call is short and synchronous; async callers use `spawn_blocking`.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use rusqlite::{Connection, OptionalExtension, params};

use agentworks_contract::executor::{FolderInfo, Operation, Outcome};
use agentworks_contract::gatewayd::DispatchState;

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

/// The devices table as it is now; also the target of the migration from the table keyed by
/// `(user_id, name)` alone.
const DEVICES_TABLE: &str = "
CREATE TABLE IF NOT EXISTS devices (
    device_id     TEXT PRIMARY KEY,
    user_id       TEXT NOT NULL,
    -- The agentd token id of the credential that created the device; NULL for devices from
    -- before devices were owned by credentials, which no connection ever claims.
    token_id      TEXT,
    name          TEXT NOT NULL,
    folders       TEXT NOT NULL DEFAULT '[]',
    version       TEXT NOT NULL DEFAULT '',
    created_at_ms INTEGER NOT NULL,
    last_seen_ms  INTEGER NOT NULL,
    UNIQUE (user_id, token_id, name)
);
";

const SCHEMA: &str = "
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
    finished_at_ms INTEGER,
    payload_sha256 TEXT,
    sent           INTEGER NOT NULL DEFAULT 1
);
";

/// Brings a database made by an earlier gatewayd to the current schema, in one transaction:
/// the devices table gains its credential column (rebuilt, since its unique key changes) and
/// the requests table its payload fingerprint and `sent` flag.
fn migrate(conn: &mut Connection) -> rusqlite::Result<()> {
    let tx = conn.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
    let has_devices: bool = tx.query_row(
        "SELECT COUNT(*) > 0 FROM sqlite_master WHERE type = 'table' AND name = 'devices'",
        [],
        |r| r.get(0),
    )?;
    if !has_devices {
        tx.execute_batch(DEVICES_TABLE)?;
    } else if !has_column(&tx, "devices", "token_id")? {
        tx.execute_batch(&format!(
            "ALTER TABLE devices RENAME TO devices_before_credentials;
             {DEVICES_TABLE}
             INSERT INTO devices
                 (device_id, user_id, token_id, name, folders, version, created_at_ms, last_seen_ms)
                 SELECT device_id, user_id, NULL, name, folders, version, created_at_ms, last_seen_ms
                 FROM devices_before_credentials;
             DROP TABLE devices_before_credentials;"
        ))?;
    }
    tx.execute_batch(
        "CREATE INDEX IF NOT EXISTS devices_by_user ON devices (user_id, last_seen_ms);",
    )?;
    if !has_column(&tx, "requests", "payload_sha256")? {
        tx.execute_batch("ALTER TABLE requests ADD COLUMN payload_sha256 TEXT;")?;
    }
    if !has_column(&tx, "requests", "sent")? {
        tx.execute_batch("ALTER TABLE requests ADD COLUMN sent INTEGER NOT NULL DEFAULT 1;")?;
    }
    tx.commit()
}

fn has_column(conn: &Connection, table: &str, column: &str) -> rusqlite::Result<bool> {
    let mut statement = conn.prepare(&format!("PRAGMA table_info({table})"))?;
    let names = statement
        .query_map([], |r| r.get::<_, String>(1))?
        .collect::<rusqlite::Result<Vec<_>>>()?;
    Ok(names.iter().any(|n| n == column))
}

/// The SHA-256 (hex) of what a request asks for: its folder and operation, as JSON. Two
/// dispatches under one request id are the same request only if these match.
pub fn payload_sha256(folder: &str, operation: &Operation) -> String {
    use sha2::Digest;
    let mut hasher = sha2::Sha256::new();
    // Serialising our own enum cannot fail; a failure would hash as the folder alone, which
    // never matches a real payload's hash.
    hasher.update(serde_json::to_vec(&(folder, operation)).unwrap_or_default());
    hex::encode(hasher.finalize())
}

/// The reason recorded for requests found pending when gatewayd starts.
pub const RESTART_REASON: &str =
    "gatewayd stopped while the request was pending; it may or may not have run on the device";
/// The reason recorded for a request id claimed by a recovery before it was ever recorded.
pub const NEVER_SENT_REASON: &str = "gatewayd never recorded this request, so it was never sent to the device; the id is now claimed and it never will be";

/// A device as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceRecord {
    pub device_id: String,
    pub user_id: String,
    /// The credential that created the device; `None` for a device from before devices were
    /// owned by credentials (no connection speaks for it any more).
    pub token_id: Option<String>,
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
    /// [`payload_sha256`] of the request; `None` for a request recorded before fingerprints.
    pub payload_sha256: Option<String>,
    /// False for an id claimed by a recovery without ever being sent.
    pub sent: bool,
    pub state: DispatchState,
}

/// What [`Store::register_device`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Registered {
    pub device_id: String,
    /// Another device of the same person already has this name (another credential's, or one
    /// from before devices were owned by credentials).
    pub name_clash: bool,
}

/// A request about to be recorded.
#[derive(Debug, Clone, Copy)]
pub struct NewRequest<'a> {
    pub request_id: &'a str,
    pub user_id: &'a str,
    pub device_id: &'a str,
    pub folder: &'a str,
    pub kind: &'a str,
    /// [`payload_sha256`] of the folder and operation.
    pub payload_sha256: &'a str,
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
        let mut conn = agentworks_support::sqlite::open_durable(path, SCHEMA).map_err(err)?;
        migrate(&mut conn).map_err(err)?;
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

    /// The stable id of `(user_id, token_id, name)`, created on first sight; records the folders
    /// and version this connection shares and marks it seen now. A device id belongs to the
    /// credential that created it: another token with the same name gets its own device id
    /// (and `name_clash`), never this one.
    pub fn register_device(
        &self,
        user_id: &str,
        token_id: &str,
        name: &str,
        folders: &[FolderInfo],
        version: &str,
        now_ms: i64,
    ) -> Result<Registered, StoreError> {
        let folders_json = serde_json::to_string(folders).map_err(|source| StoreError::Json {
            what: "folders",
            id: name.to_owned(),
            source,
        })?;
        let mut db = self.db();
        let tx = db.transaction().map_err(query("begin a device update"))?;
        let existing: Option<String> = tx
            .query_row(
                "SELECT device_id FROM devices WHERE user_id = ?1 AND token_id = ?2 AND name = ?3",
                params![user_id, token_id, name],
                |r| r.get(0),
            )
            .optional()
            .map_err(query("look up a device"))?;
        let name_clash: bool = tx
            .query_row(
                "SELECT COUNT(*) > 0 FROM devices
                 WHERE user_id = ?1 AND name = ?3 AND (token_id IS NULL OR token_id != ?2)",
                params![user_id, token_id, name],
                |r| r.get(0),
            )
            .map_err(query("look up devices of the same name"))?;
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
                     (device_id, user_id, token_id, name, folders, version, created_at_ms, last_seen_ms)
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?7)",
                    params![id, user_id, token_id, name, folders_json, version, now_ms],
                )
                .map_err(query("insert a device"))?;
                id
            }
        };
        tx.commit().map_err(query("commit a device update"))?;
        Ok(Registered {
            device_id,
            name_clash,
        })
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
                token_id: row.get(5)?,
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
                "SELECT device_id, user_id, name, folders, last_seen_ms, token_id FROM devices
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
                "SELECT device_id, user_id, name, folders, last_seen_ms, token_id FROM devices
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
    /// `payload_sha256` is [`payload_sha256`] of its folder and operation.
    pub fn begin_request(
        &self,
        request: &NewRequest<'_>,
        now_ms: i64,
    ) -> Result<Begin, StoreError> {
        self.insert_request(request, now_ms, true)
    }

    /// Claims a request id nobody recorded (recovery of a dispatch whose answer agentd lost):
    /// recorded `unknown`, never sent, so a dispatch still under way with this id finds it and
    /// never sends it. An id already known is returned as it is.
    pub fn claim_unsent(&self, request: &NewRequest<'_>, now_ms: i64) -> Result<Begin, StoreError> {
        self.insert_request(request, now_ms, false)
    }

    fn insert_request(
        &self,
        request: &NewRequest<'_>,
        now_ms: i64,
        send: bool,
    ) -> Result<Begin, StoreError> {
        let mut db = self.db();
        let tx = db
            .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)
            .map_err(query("begin a request"))?;
        if let Some(existing) = Store::request_in(&tx, request.request_id)? {
            return Ok(Begin::Existing(existing));
        }
        let (state, reason, finished) = if send {
            ("pending", None, None)
        } else {
            ("unknown", Some(NEVER_SENT_REASON), Some(now_ms))
        };
        tx.execute(
            "INSERT INTO requests (request_id, user_id, device_id, folder, kind, state, reason,
                                   created_at_ms, finished_at_ms, payload_sha256, sent)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11)",
            params![
                request.request_id,
                request.user_id,
                request.device_id,
                request.folder,
                request.kind,
                state,
                reason,
                now_ms,
                finished,
                request.payload_sha256,
                send
            ],
        )
        .map_err(query("record a request"))?;
        tx.commit().map_err(query("commit a request"))?;
        Ok(Begin::New)
    }

    /// Turns an `unknown` request that was sent into `done` with `outcome`, which must come
    /// from the device's own receipt. True if it was changed; a request in any other state
    /// (done, pending, or never sent) is left as it is.
    pub fn recover_request(
        &self,
        request_id: &str,
        outcome: &Outcome,
        now_ms: i64,
    ) -> Result<bool, StoreError> {
        let text = serde_json::to_string(outcome).map_err(|source| StoreError::Json {
            what: "outcome",
            id: request_id.to_owned(),
            source,
        })?;
        let changed = self
            .db()
            .execute(
                "UPDATE requests SET state = 'done', outcome = ?2, reason = NULL, finished_at_ms = ?3
                 WHERE request_id = ?1 AND state = 'unknown' AND sent = 1",
                params![request_id, text, now_ms],
            )
            .map_err(query("record a recovered outcome"))?;
        Ok(changed == 1)
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
            Option<String>,
            bool,
        );
        let row: Option<Row> = conn
            .query_row(
                "SELECT user_id, device_id, kind, state, outcome, reason, payload_sha256, sent
                 FROM requests WHERE request_id = ?1",
                params![request_id],
                |r| {
                    Ok((
                        r.get(0)?,
                        r.get(1)?,
                        r.get(2)?,
                        r.get(3)?,
                        r.get(4)?,
                        r.get(5)?,
                        r.get(6)?,
                        r.get(7)?,
                    ))
                },
            )
            .optional()
            .map_err(query("read a request"))?;
        let Some((user_id, device_id, kind, state, outcome, reason, payload_sha256, sent)) = row
        else {
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
            payload_sha256,
            sent,
            state,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use agentworks_contract::executor::FolderAccess;

    fn folders() -> Vec<FolderInfo> {
        vec![FolderInfo {
            alias: "proj".into(),
            access: FolderAccess::ReadWrite,
            downloads: false,
        }]
    }

    fn new_request<'a>(request_id: &'a str, payload: &'a str) -> NewRequest<'a> {
        NewRequest {
            request_id,
            user_id: "u1",
            device_id: "d1",
            folder: "proj",
            kind: "shell",
            payload_sha256: payload,
        }
    }

    #[test]
    fn device_ids_are_stable_per_user_credential_and_name() {
        let tmp = tempfile::tempdir().unwrap();
        let (store, _) = Store::open(&tmp.path().join("g.db"), 1).unwrap();
        let a = store
            .register_device("u1", "t1", "laptop", &folders(), "1", 10)
            .unwrap();
        assert!(!a.name_clash);
        let again = store
            .register_device("u1", "t1", "laptop", &[], "2", 20)
            .unwrap();
        let other_user = store
            .register_device("u2", "t9", "laptop", &[], "1", 30)
            .unwrap();
        assert_eq!(a, again);
        assert_ne!(a.device_id, other_user.device_id);
        assert!(!other_user.name_clash, "another person's names never clash");
        // Another credential of the same person, same name: its own device, never the first.
        let other_token = store
            .register_device("u1", "t2", "laptop", &[], "1", 40)
            .unwrap();
        assert_ne!(other_token.device_id, a.device_id);
        assert!(other_token.name_clash);
        let first = store.device(&a.device_id).unwrap().unwrap();
        assert_eq!(first.token_id.as_deref(), Some("t1"));
        assert_eq!(first.last_seen_ms, 20);
        assert!(first.folders.is_empty());
        let listed = store.devices_of("u1", 0).unwrap();
        assert_eq!(listed.len(), 2);
        assert!(store.devices_of("u1", 41).unwrap().is_empty());
        assert_eq!(
            store
                .device(&other_user.device_id)
                .unwrap()
                .unwrap()
                .user_id,
            "u2"
        );
    }

    #[test]
    fn a_database_from_before_credentials_is_migrated_and_its_devices_never_claimed() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("g.db");
        {
            // The schema gatewayd used before devices were owned by credentials.
            let conn = Connection::open(&path).unwrap();
            conn.execute_batch(
                "CREATE TABLE devices (
                    device_id TEXT PRIMARY KEY, user_id TEXT NOT NULL, name TEXT NOT NULL,
                    folders TEXT NOT NULL DEFAULT '[]', version TEXT NOT NULL DEFAULT '',
                    created_at_ms INTEGER NOT NULL, last_seen_ms INTEGER NOT NULL,
                    UNIQUE (user_id, name));
                 CREATE TABLE requests (
                    request_id TEXT PRIMARY KEY, user_id TEXT NOT NULL, device_id TEXT NOT NULL,
                    folder TEXT NOT NULL, kind TEXT NOT NULL,
                    state TEXT NOT NULL CHECK (state IN ('pending', 'done', 'unknown')),
                    outcome TEXT, reason TEXT, created_at_ms INTEGER NOT NULL,
                    finished_at_ms INTEGER);
                 CREATE INDEX devices_by_user ON devices (user_id, last_seen_ms);
                 INSERT INTO devices VALUES ('dev_old', 'u1', 'laptop', '[]', '0.1', 1, 2);
                 INSERT INTO requests (request_id, user_id, device_id, folder, kind, state, created_at_ms)
                     VALUES ('r-old', 'u1', 'dev_old', 'proj', 'shell', 'pending', 1);",
            )
            .unwrap();
        }
        let (store, reconciled) = Store::open(&path, 5).unwrap();
        assert_eq!(reconciled, 1);
        let old = store.device("dev_old").unwrap().unwrap();
        assert_eq!((old.token_id, old.name.as_str()), (None, "laptop"));
        // No credential ever claims the old device: the same name gets a new id, and a clash.
        let new = store
            .register_device("u1", "t1", "laptop", &[], "1", 10)
            .unwrap();
        assert_ne!(new.device_id, "dev_old");
        assert!(new.name_clash);
        let record = store.request("r-old").unwrap().unwrap();
        assert_eq!((record.payload_sha256, record.sent), (None, true));
        drop(store);
        // Opening again changes nothing.
        let (store, _) = Store::open(&path, 6).unwrap();
        assert_eq!(store.devices_of("u1", 0).unwrap().len(), 2);
    }

    #[test]
    fn a_request_id_is_recorded_once_and_pending_becomes_unknown_at_reopen() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("g.db");
        let (store, _) = Store::open(&path, 1).unwrap();
        assert_eq!(
            store.begin_request(&new_request("r1", "h1"), 5).unwrap(),
            Begin::New
        );
        assert_eq!(
            store.begin_request(&new_request("r2", "h2"), 5).unwrap(),
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
        match store.begin_request(&new_request("r1", "h1"), 8).unwrap() {
            Begin::Existing(record) => {
                assert_eq!(record.state, done);
                assert_eq!(record.payload_sha256.as_deref(), Some("h1"));
            }
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

    #[test]
    fn only_a_sent_unknown_request_is_recovered_and_a_claimed_id_is_never_sent() {
        let tmp = tempfile::tempdir().unwrap();
        let (store, _) = Store::open(&tmp.path().join("g.db"), 1).unwrap();
        let outcome = Outcome::Refused {
            code: "x".into(),
            message: "y".into(),
        };
        store.begin_request(&new_request("sent", "h"), 1).unwrap();
        // Pending: not recoverable (its result frame may still come).
        assert!(!store.recover_request("sent", &outcome, 2).unwrap());
        let unknown = DispatchState::Unknown {
            reason: "lost".into(),
        };
        store.finish_request("sent", &unknown, 3).unwrap();
        assert!(store.recover_request("sent", &outcome, 4).unwrap());
        assert_eq!(
            store.request("sent").unwrap().unwrap().state,
            DispatchState::Done {
                outcome: outcome.clone()
            }
        );
        assert!(
            !store.recover_request("sent", &outcome, 5).unwrap(),
            "done stays done"
        );

        // A claim records the id as never sent; a dispatch with it then finds the claim.
        assert_eq!(
            store.claim_unsent(&new_request("lost", "h"), 6).unwrap(),
            Begin::New
        );
        match store.begin_request(&new_request("lost", "h"), 7).unwrap() {
            Begin::Existing(record) => {
                assert!(!record.sent);
                assert_eq!(
                    record.state,
                    DispatchState::Unknown {
                        reason: NEVER_SENT_REASON.into()
                    }
                );
            }
            other => panic!("{other:?}"),
        }
        assert!(!store.recover_request("lost", &outcome, 8).unwrap());
        assert!(matches!(
            store.claim_unsent(&new_request("sent", "h"), 9).unwrap(),
            Begin::Existing(_)
        ));
    }

    #[test]
    fn payload_fingerprints_tell_operations_and_folders_apart() {
        let echo = |c: &str| Operation::ExecuteShellCommand {
            command: c.into(),
            timeout: None,
        };
        assert_eq!(
            payload_sha256("proj", &echo("a")),
            payload_sha256("proj", &echo("a"))
        );
        assert_ne!(
            payload_sha256("proj", &echo("a")),
            payload_sha256("proj", &echo("b"))
        );
        assert_ne!(
            payload_sha256("proj", &echo("a")),
            payload_sha256("other", &echo("a"))
        );
        assert_eq!(payload_sha256("p", &echo("a")).len(), 64);
    }
}
