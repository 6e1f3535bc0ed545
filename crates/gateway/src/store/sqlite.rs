//! The SQLite back end of the gateway [`Store`](super::Store), the default (one host):
//! `<state>/gateway/gatewayd.db` (WAL, `synchronous=FULL`).
//!
//! Owns three tables: `devices`, `requests` and `leases` (see [`super`] for what each holds).
//! Databases made before devices were owned by credentials are migrated at open: their device
//! rows keep their ids but have no credential, so no connection ever claims them again (the
//! laptop gets a new device id on its next connection); their request rows have no payload
//! fingerprint, so a request id of theirs is never replayed for any payload.
//!
//! One connection behind a mutex: every call is short and synchronous, and a request id is
//! claimed inside an immediate (write-locked) transaction, so two connections to one file (two
//! processes) never both record it.

use std::path::Path;
use std::sync::{Arc, Mutex, MutexGuard};

use rusqlite::{Connection, OptionalExtension, params};

use agentworks_contract::executor::{FolderInfo, Outcome};
use agentworks_contract::gatewayd::DispatchState;

use super::{
    Begin, DeviceRecord, Lease, NewRequest, RESTART_REASON, Registered, RequestRecord, StoreError,
    final_columns, new_request_columns, state_from_columns,
};

fn query(operation: &'static str) -> impl FnOnce(rusqlite::Error) -> StoreError {
    move |source| StoreError::Query { operation, source }
}

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
CREATE TABLE IF NOT EXISTS leases (
    device_id     TEXT PRIMARY KEY,
    host_id       TEXT NOT NULL,
    expires_at_ms INTEGER NOT NULL
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

/// A cheap-to-clone handle on the SQLite store.
#[derive(Clone)]
pub struct SqliteStore {
    conn: Arc<Mutex<Connection>>,
}

impl SqliteStore {
    /// Opens (creating if needed) the database at `path`, then turns every request left
    /// `pending` into `unknown`. Returns the store and how many requests were reconciled.
    pub fn open(path: &Path, now_ms: i64) -> Result<(SqliteStore, usize), StoreError> {
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
            SqliteStore {
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
                SqliteStore::device_from_row,
            )
            .optional()
            .map_err(query("read a device"))?;
        row.map(SqliteStore::with_folders).transpose()
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
            .query_map(params![user_id, since_ms], SqliteStore::device_from_row)
            .map_err(query("list devices"))?
            .collect::<Result<Vec<_>, _>>()
            .map_err(query("list devices"))?;
        rows.into_iter().map(SqliteStore::with_folders).collect()
    }

    /// [`super::Store::begin_request`] (`send`) or [`super::Store::claim_unsent`]: inside one
    /// write-locked transaction, so of two connections claiming one id only one records it.
    pub(super) fn insert_request(
        &self,
        request: &NewRequest<'_>,
        now_ms: i64,
        send: bool,
    ) -> Result<Begin, StoreError> {
        let mut db = self.db();
        let tx = db
            .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)
            .map_err(query("begin a request"))?;
        if let Some(existing) = SqliteStore::request_in(&tx, request.request_id)? {
            return Ok(Begin::Existing(Box::new(existing)));
        }
        let (state, reason, finished) = new_request_columns(send, now_ms);
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
        let Some((name, outcome, reason)) = final_columns(request_id, state)? else {
            return Ok(());
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
        SqliteStore::request_in(&self.db(), request_id)
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
        let state = state_from_columns(request_id, &state, outcome, reason)?;
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

    /// See [`super::Store::take_lease`].
    pub fn take_lease(
        &self,
        device_id: &str,
        host_id: &str,
        now_ms: i64,
        expires_at_ms: i64,
    ) -> Result<Option<Lease>, StoreError> {
        let mut db = self.db();
        let tx = db
            .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)
            .map_err(query("begin taking a lease"))?;
        let previous = tx
            .query_row(
                "SELECT host_id, expires_at_ms FROM leases
                 WHERE device_id = ?1 AND host_id != ?2 AND expires_at_ms > ?3",
                params![device_id, host_id, now_ms],
                |r| {
                    Ok(Lease {
                        device_id: device_id.to_owned(),
                        host_id: r.get(0)?,
                        expires_at_ms: r.get(1)?,
                    })
                },
            )
            .optional()
            .map_err(query("read a lease"))?;
        tx.execute(
            "INSERT INTO leases (device_id, host_id, expires_at_ms) VALUES (?1, ?2, ?3)
             ON CONFLICT (device_id) DO UPDATE
             SET host_id = excluded.host_id, expires_at_ms = excluded.expires_at_ms",
            params![device_id, host_id, expires_at_ms],
        )
        .map_err(query("take a lease"))?;
        tx.commit().map_err(query("commit a lease"))?;
        Ok(previous)
    }

    /// See [`super::Store::renew_leases`].
    pub fn renew_leases(
        &self,
        host_id: &str,
        connected: &[String],
        now_ms: i64,
        expires_at_ms: i64,
    ) -> Result<u64, StoreError> {
        let mut db = self.db();
        let tx = db
            .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)
            .map_err(query("begin renewing leases"))?;
        let held_before: Vec<String> = tx
            .prepare("SELECT device_id FROM leases WHERE host_id = ?1")
            .and_then(|mut s| {
                s.query_map(params![host_id], |r| r.get(0))?
                    .collect::<Result<_, _>>()
            })
            .map_err(query("read this host's leases"))?;
        for gone in held_before.iter().filter(|d| !connected.contains(d)) {
            tx.execute(
                "DELETE FROM leases WHERE device_id = ?1 AND host_id = ?2",
                params![gone, host_id],
            )
            .map_err(query("drop the leases of devices gone"))?;
        }
        let mut held = 0;
        for device_id in connected {
            held += tx
                .execute(
                    "INSERT INTO leases (device_id, host_id, expires_at_ms) VALUES (?1, ?2, ?4)
                     ON CONFLICT (device_id) DO UPDATE
                     SET host_id = excluded.host_id, expires_at_ms = excluded.expires_at_ms
                     WHERE leases.host_id = excluded.host_id OR leases.expires_at_ms <= ?3",
                    params![device_id, host_id, now_ms, expires_at_ms],
                )
                .map_err(query("renew leases"))? as u64;
        }
        tx.commit().map_err(query("commit the lease renewal"))?;
        Ok(held)
    }

    /// See [`super::Store::release_lease`].
    pub fn release_lease(&self, device_id: &str, host_id: &str) -> Result<bool, StoreError> {
        let released = self
            .db()
            .execute(
                "DELETE FROM leases WHERE device_id = ?1 AND host_id = ?2",
                params![device_id, host_id],
            )
            .map_err(query("release a lease"))?;
        Ok(released == 1)
    }

    /// See [`super::Store::lease`].
    pub fn lease(&self, device_id: &str, now_ms: i64) -> Result<Option<Lease>, StoreError> {
        self.db()
            .query_row(
                "SELECT host_id, expires_at_ms FROM leases
                 WHERE device_id = ?1 AND expires_at_ms > ?2",
                params![device_id, now_ms],
                |r| {
                    Ok(Lease {
                        device_id: device_id.to_owned(),
                        host_id: r.get(0)?,
                        expires_at_ms: r.get(1)?,
                    })
                },
            )
            .optional()
            .map_err(query("read a lease"))
    }

    /// See [`super::Store::live_leases_of`].
    pub fn live_leases_of(&self, user_id: &str, now_ms: i64) -> Result<Vec<Lease>, StoreError> {
        let db = self.db();
        let mut statement = db
            .prepare_cached(
                "SELECT leases.device_id, leases.host_id, leases.expires_at_ms
                 FROM leases JOIN devices ON devices.device_id = leases.device_id
                 WHERE devices.user_id = ?1 AND leases.expires_at_ms > ?2
                 ORDER BY leases.device_id",
            )
            .map_err(query("read a person's leases"))?;
        statement
            .query_map(params![user_id, now_ms], |r| {
                Ok(Lease {
                    device_id: r.get(0)?,
                    host_id: r.get(1)?,
                    expires_at_ms: r.get(2)?,
                })
            })
            .map_err(query("read a person's leases"))?
            .collect::<Result<Vec<_>, _>>()
            .map_err(query("read a person's leases"))
    }

    /// See [`super::Store::expire_leases`].
    pub fn expire_leases(&self, now_ms: i64) -> Result<Vec<Lease>, StoreError> {
        let db = self.db();
        let mut statement = db
            .prepare(
                "DELETE FROM leases WHERE expires_at_ms <= ?1
                 RETURNING device_id, host_id, expires_at_ms",
            )
            .map_err(query("expire leases"))?;
        let mut expired = statement
            .query_map(params![now_ms], |r| {
                Ok(Lease {
                    device_id: r.get(0)?,
                    host_id: r.get(1)?,
                    expires_at_ms: r.get(2)?,
                })
            })
            .map_err(query("expire leases"))?
            .collect::<Result<Vec<_>, _>>()
            .map_err(query("expire leases"))?;
        expired.sort_by(|a, b| a.device_id.cmp(&b.device_id));
        Ok(expired)
    }

    /// See [`super::Store::lose_host_requests`]: one host, so no other host's requests.
    pub fn lose_host_requests(
        &self,
        _host_id: &str,
        _reason: &str,
        _now_ms: i64,
    ) -> Result<usize, StoreError> {
        Ok(0)
    }

    /// See [`super::Store::renew_host`]: one host has no other to tell it is alive.
    pub fn renew_host(&self, _host_id: &str, _alive_until_ms: i64) -> Result<(), StoreError> {
        Ok(())
    }

    /// See [`super::Store::expire_hosts`]: one host never loses another.
    pub fn expire_hosts(&self, _now_ms: i64) -> Result<Vec<String>, StoreError> {
        Ok(Vec::new())
    }
}

#[cfg(test)]
mod tests {
    //! What only the SQLite back end has: databases of earlier gatewayds. Everything else is
    //! tested on both back ends by [`super::super::conformance`].
    use super::*;

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
        let (store, reconciled) = SqliteStore::open(&path, 5).unwrap();
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
        let (store, _) = SqliteStore::open(&path, 6).unwrap();
        assert_eq!(store.devices_of("u1", 0).unwrap().len(), 2);
    }
}
