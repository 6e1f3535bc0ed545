//! The PostgreSQL back end of the gateway [`Store`](super::Store), for several gatewayd hosts
//! sharing one database (`[cluster] database_url`, issue 16).
//!
//! The pool, its TLS and the migration under an advisory lock are
//! [`agentworks_daemon::postgres`]'s, shared with agentd's store.
//!
//! At open: the server must answer within [`pg::CONNECT_TIMEOUT`] (gatewayd refuses to start
//! otherwise); the schema [`MIGRATIONS`] are applied in one transaction under a transaction-level
//! advisory lock (`pg_advisory_xact_lock`), so hosts starting together apply each once and a
//! failed migration leaves the schema as it was; a database with a newer schema than this
//! gatewayd knows is refused. Then the requests *this host* left pending become `unknown`;
//! other hosts' pending requests are theirs.
//!
//! Tables are prefixed `gateway_`, since agentd will share the database. A request id is
//! claimed with one `INSERT … ON CONFLICT (request_id) DO NOTHING`: of any number of hosts
//! claiming one id at once, exactly one inserts it, and only that one may send it.
//!
//! Never logs the database URL's password (errors carry the URL redacted).

use std::sync::Arc;

use ::postgres::types::FromSql;
use ::postgres::{GenericClient, Row};

use agentworks_contract::executor::{FolderInfo, Outcome};
use agentworks_contract::gatewayd::DispatchState;
use agentworks_daemon::postgres::{self as pg, ConnectError, MigrateError, Schema};

use super::{
    Begin, DeviceRecord, LOST_HOST_REASON, Lease, NewRequest, RESTART_REASON, Registered,
    RequestRecord, StoreError, final_columns, new_request_columns, state_from_columns,
};

/// The gateway's tables, migrated under the advisory lock "awgwschm".
const SCHEMA: Schema = Schema {
    daemon: "gatewayd",
    namespace: None,
    version_table: "gateway_schema",
    lock_key: 0x6177_6777_7363_686d,
    migrations: MIGRATIONS,
};

/// The schema, one migration per version, applied in order; never edit one that has shipped,
/// add the next.
pub const MIGRATIONS: &[&str] = &[
    // 1: devices, requests and leases.
    "
CREATE TABLE gateway_devices (
    device_id     TEXT PRIMARY KEY,
    user_id       TEXT NOT NULL,
    -- The agentd token id of the credential that created the device.
    token_id      TEXT,
    name          TEXT NOT NULL,
    folders       TEXT NOT NULL DEFAULT '[]',
    version       TEXT NOT NULL DEFAULT '',
    created_at_ms BIGINT NOT NULL,
    last_seen_ms  BIGINT NOT NULL,
    UNIQUE (user_id, token_id, name)
);
CREATE INDEX gateway_devices_by_user ON gateway_devices (user_id, last_seen_ms);
CREATE TABLE gateway_requests (
    request_id     TEXT PRIMARY KEY,
    -- The gatewayd host that recorded (and may have sent) the request.
    host_id        TEXT NOT NULL,
    user_id        TEXT NOT NULL,
    device_id      TEXT NOT NULL,
    folder         TEXT NOT NULL,
    kind           TEXT NOT NULL,
    state          TEXT NOT NULL CHECK (state IN ('pending', 'done', 'unknown')),
    outcome        TEXT,
    reason         TEXT,
    created_at_ms  BIGINT NOT NULL,
    finished_at_ms BIGINT,
    payload_sha256 TEXT,
    sent           BOOLEAN NOT NULL
);
CREATE INDEX gateway_requests_pending ON gateway_requests (host_id) WHERE state = 'pending';
CREATE TABLE gateway_leases (
    device_id     TEXT PRIMARY KEY,
    host_id       TEXT NOT NULL,
    expires_at_ms BIGINT NOT NULL
);
CREATE INDEX gateway_leases_by_host ON gateway_leases (host_id);
CREATE INDEX gateway_leases_by_expiry ON gateway_leases (expires_at_ms);
",
    // 2: the key that authenticates what gatewayd hosts tell each other over NATS.
    "
CREATE TABLE gateway_peer_key (
    id  SMALLINT PRIMARY KEY CHECK (id = 1),
    key BYTEA NOT NULL CHECK (length(key) = 32)
);
",
    // 3: which hosts are alive, renewed with their leases, so a host that dies is noticed even
    // when every one of its devices reconnected elsewhere before its leases expired.
    "
CREATE TABLE gateway_hosts (
    host_id        TEXT PRIMARY KEY,
    alive_until_ms BIGINT NOT NULL
);
",
    // 4: agentd calls gatewayd hosts under the shared `gatewayd-calls` key (`cluster_keys`);
    // gatewayd hosts no longer call each other, so their own key goes.
    "
DROP TABLE gateway_peer_key;
",
];

/// A cheap-to-clone handle on the PostgreSQL store of one gatewayd host.
#[derive(Clone)]
pub struct PostgresStore {
    pool: pg::Pool,
    host_id: Arc<str>,
}

fn query(operation: &'static str) -> impl FnOnce(::postgres::Error) -> StoreError {
    move |source| StoreError::PostgresQuery { operation, source }
}

/// Column `index` of `row`, or the error of `operation` (a type mismatch never panics).
fn column<'a, T: FromSql<'a>>(
    row: &'a Row,
    index: usize,
    operation: &'static str,
) -> Result<T, StoreError> {
    row.try_get(index).map_err(query(operation))
}

fn json_error(what: &'static str, id: &str) -> impl FnOnce(serde_json::Error) -> StoreError {
    let id = id.to_owned();
    move |source| StoreError::Json { what, id, source }
}

impl From<ConnectError> for StoreError {
    fn from(error: ConnectError) -> StoreError {
        match error {
            ConnectError::Url { url, source } => StoreError::PostgresUrl { url, source },
            ConnectError::Unreachable { url, reason } => {
                StoreError::PostgresConnect { url, reason }
            }
            ConnectError::Tls { url, source } => StoreError::PostgresTls { url, source },
        }
    }
}

impl From<MigrateError> for StoreError {
    fn from(error: MigrateError) -> StoreError {
        match error {
            MigrateError::Query { operation, source } => {
                StoreError::PostgresQuery { operation, source }
            }
            MigrateError::Apply { version, source } => {
                StoreError::PostgresMigrate { version, source }
            }
            MigrateError::TooNew { found, known, .. } => {
                StoreError::PostgresSchemaTooNew { found, known }
            }
        }
    }
}

impl PostgresStore {
    /// See [`super::Store::open_postgres`].
    pub fn open(
        url: &str,
        host_id: &str,
        now_ms: i64,
    ) -> Result<(PostgresStore, usize), StoreError> {
        let store = PostgresStore {
            pool: pg::Pool::connect(url, "agentworks-gatewayd", None)?,
            host_id: Arc::from(host_id),
        };
        let mut conn = store.conn("migrate the schema")?;
        pg::migrate(&mut *conn, &SCHEMA, now_ms)?;
        let reconciled = conn
            .execute(
                "UPDATE gateway_requests SET state = 'unknown', reason = $1, finished_at_ms = $2
                 WHERE state = 'pending' AND host_id = $3",
                &[&RESTART_REASON, &now_ms, &host_id],
            )
            .map_err(query("mark this host's pending requests unknown"))?;
        drop(conn);
        Ok((store, usize::try_from(reconciled).unwrap_or(usize::MAX)))
    }

    fn conn(&self, operation: &'static str) -> Result<pg::Connection, StoreError> {
        self.pool
            .get()
            .map_err(|source| StoreError::PostgresPool { operation, source })
    }

    /// See [`super::Store::register_device`].
    pub fn register_device(
        &self,
        user_id: &str,
        token_id: &str,
        name: &str,
        folders: &[FolderInfo],
        version: &str,
        now_ms: i64,
    ) -> Result<Registered, StoreError> {
        let folders_json = serde_json::to_string(folders).map_err(json_error("folders", name))?;
        let new_id = format!("dev_{}", hex::encode(rand::random::<[u8; 12]>()));
        let mut conn = self.conn("register a device")?;
        let mut tx = conn.transaction().map_err(query("begin a device update"))?;
        // One statement: two hosts registering the same device at once get the same id.
        let row = tx
            .query_one(
                "INSERT INTO gateway_devices
                 (device_id, user_id, token_id, name, folders, version, created_at_ms, last_seen_ms)
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $7)
                 ON CONFLICT (user_id, token_id, name) DO UPDATE
                 SET folders = excluded.folders, version = excluded.version,
                     last_seen_ms = excluded.last_seen_ms
                 RETURNING device_id",
                &[
                    &new_id,
                    &user_id,
                    &token_id,
                    &name,
                    &folders_json,
                    &version,
                    &now_ms,
                ],
            )
            .map_err(query("record a device"))?;
        let device_id: String = column(&row, 0, "record a device")?;
        let row = tx
            .query_one(
                "SELECT COUNT(*) > 0 FROM gateway_devices
                 WHERE user_id = $1 AND name = $3 AND (token_id IS NULL OR token_id <> $2)",
                &[&user_id, &token_id, &name],
            )
            .map_err(query("look up devices of the same name"))?;
        let name_clash: bool = column(&row, 0, "look up devices of the same name")?;
        tx.commit().map_err(query("commit a device update"))?;
        Ok(Registered {
            device_id,
            name_clash,
        })
    }

    /// See [`super::Store::touch_device`].
    pub fn touch_device(&self, device_id: &str, now_ms: i64) -> Result<(), StoreError> {
        self.conn("mark a device seen")?
            .execute(
                "UPDATE gateway_devices SET last_seen_ms = $2 WHERE device_id = $1",
                &[&device_id, &now_ms],
            )
            .map_err(query("mark a device seen"))?;
        Ok(())
    }

    fn device_from_row(row: &Row) -> Result<DeviceRecord, StoreError> {
        const OP: &str = "read a device";
        let device_id: String = column(row, 0, OP)?;
        let folders: String = column(row, 3, OP)?;
        Ok(DeviceRecord {
            folders: serde_json::from_str(&folders).map_err(json_error("folders", &device_id))?,
            user_id: column(row, 1, OP)?,
            name: column(row, 2, OP)?,
            last_seen_ms: column(row, 4, OP)?,
            token_id: column(row, 5, OP)?,
            device_id,
        })
    }

    /// See [`super::Store::device`].
    pub fn device(&self, device_id: &str) -> Result<Option<DeviceRecord>, StoreError> {
        let row = self
            .conn("read a device")?
            .query_opt(
                "SELECT device_id, user_id, name, folders, last_seen_ms, token_id
                 FROM gateway_devices WHERE device_id = $1",
                &[&device_id],
            )
            .map_err(query("read a device"))?;
        row.as_ref().map(PostgresStore::device_from_row).transpose()
    }

    /// See [`super::Store::devices_of`].
    pub fn devices_of(
        &self,
        user_id: &str,
        since_ms: i64,
    ) -> Result<Vec<DeviceRecord>, StoreError> {
        self.conn("list devices")?
            .query(
                "SELECT device_id, user_id, name, folders, last_seen_ms, token_id
                 FROM gateway_devices WHERE user_id = $1 AND last_seen_ms >= $2
                 ORDER BY last_seen_ms DESC, name",
                &[&user_id, &since_ms],
            )
            .map_err(query("list devices"))?
            .iter()
            .map(PostgresStore::device_from_row)
            .collect()
    }

    /// [`super::Store::begin_request`] (`send`) or [`super::Store::claim_unsent`], as this
    /// host.
    pub(super) fn insert_request(
        &self,
        request: &NewRequest<'_>,
        now_ms: i64,
        send: bool,
    ) -> Result<Begin, StoreError> {
        let (state, reason, finished) = new_request_columns(send, now_ms);
        let mut conn = self.conn("record a request")?;
        // The claim: one statement, atomic across hosts. A concurrent insert of the same id
        // waits for the other to commit, then inserts nothing.
        let inserted = conn
            .execute(
                "INSERT INTO gateway_requests
                 (request_id, host_id, user_id, device_id, folder, kind, state, reason,
                  created_at_ms, finished_at_ms, payload_sha256, sent)
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)
                 ON CONFLICT (request_id) DO NOTHING",
                &[
                    &request.request_id,
                    &&*self.host_id,
                    &request.user_id,
                    &request.device_id,
                    &request.folder,
                    &request.kind,
                    &state,
                    &reason,
                    &now_ms,
                    &finished,
                    &request.payload_sha256,
                    &send,
                ],
            )
            .map_err(query("record a request"))?;
        if inserted == 1 {
            return Ok(Begin::New);
        }
        // Request rows are never deleted: the one that won is there.
        match PostgresStore::request_in(&mut *conn, request.request_id)? {
            Some(existing) => Ok(Begin::Existing(Box::new(existing))),
            None => Err(StoreError::ClaimVanished {
                request_id: request.request_id.to_owned(),
            }),
        }
    }

    /// See [`super::Store::recover_request`].
    pub fn recover_request(
        &self,
        request_id: &str,
        outcome: &Outcome,
        now_ms: i64,
    ) -> Result<bool, StoreError> {
        let text = serde_json::to_string(outcome).map_err(json_error("outcome", request_id))?;
        let changed = self
            .conn("record a recovered outcome")?
            .execute(
                "UPDATE gateway_requests
                 SET state = 'done', outcome = $2, reason = NULL, finished_at_ms = $3
                 WHERE request_id = $1 AND state = 'unknown' AND sent",
                &[&request_id, &text, &now_ms],
            )
            .map_err(query("record a recovered outcome"))?;
        Ok(changed == 1)
    }

    /// See [`super::Store::finish_request`].
    pub fn finish_request(
        &self,
        request_id: &str,
        state: &DispatchState,
        now_ms: i64,
    ) -> Result<(), StoreError> {
        let Some((name, outcome, reason)) = final_columns(request_id, state)? else {
            return Ok(());
        };
        self.conn("record a request's outcome")?
            .execute(
                // Also an `unknown` that only says this host was counted lost (its heartbeat
                // lapsed in a database outage) while the request was still on the device:
                // the device's own answer is better knowledge than that.
                "UPDATE gateway_requests
                 SET state = $2, outcome = $3, reason = $4, finished_at_ms = $5
                 WHERE request_id = $1 AND (state = 'pending'
                    OR (state = 'unknown' AND sent AND host_id = $6 AND reason = $7))",
                &[
                    &request_id,
                    &name,
                    &outcome,
                    &reason,
                    &now_ms,
                    &&*self.host_id,
                    &LOST_HOST_REASON,
                ],
            )
            .map_err(query("record a request's outcome"))?;
        Ok(())
    }

    /// See [`super::Store::request`].
    pub fn request(&self, request_id: &str) -> Result<Option<RequestRecord>, StoreError> {
        PostgresStore::request_in(&mut *self.conn("read a request")?, request_id)
    }

    fn request_in(
        client: &mut impl GenericClient,
        request_id: &str,
    ) -> Result<Option<RequestRecord>, StoreError> {
        const OP: &str = "read a request";
        let Some(row) = client
            .query_opt(
                "SELECT user_id, device_id, kind, state, outcome, reason, payload_sha256, sent
                 FROM gateway_requests WHERE request_id = $1",
                &[&request_id],
            )
            .map_err(query(OP))?
        else {
            return Ok(None);
        };
        let state: String = column(&row, 3, OP)?;
        let outcome: Option<String> = column(&row, 4, OP)?;
        let reason: Option<String> = column(&row, 5, OP)?;
        let state = state_from_columns(request_id, &state, outcome, reason)?;
        Ok(Some(RequestRecord {
            request_id: request_id.to_owned(),
            user_id: column(&row, 0, OP)?,
            device_id: column(&row, 1, OP)?,
            kind: column(&row, 2, OP)?,
            payload_sha256: column(&row, 6, OP)?,
            sent: column(&row, 7, OP)?,
            state,
        }))
    }

    fn lease_from_row(row: &Row) -> Result<Lease, StoreError> {
        const OP: &str = "read a lease";
        Ok(Lease {
            device_id: column(row, 0, OP)?,
            host_id: column(row, 1, OP)?,
            expires_at_ms: column(row, 2, OP)?,
        })
    }

    /// See [`super::Store::take_lease`].
    pub fn take_lease(
        &self,
        device_id: &str,
        host_id: &str,
        now_ms: i64,
        expires_at_ms: i64,
    ) -> Result<Option<Lease>, StoreError> {
        let mut conn = self.conn("take a lease")?;
        let mut tx = conn.transaction().map_err(query("begin taking a lease"))?;
        // The row, locked until the commit, so the holder reported is the one replaced.
        let previous = tx
            .query_opt(
                "SELECT device_id, host_id, expires_at_ms FROM gateway_leases
                 WHERE device_id = $1 FOR UPDATE",
                &[&device_id],
            )
            .map_err(query("read a lease"))?
            .as_ref()
            .map(PostgresStore::lease_from_row)
            .transpose()?
            .filter(|lease| lease.host_id != host_id && lease.expires_at_ms > now_ms);
        tx.execute(
            "INSERT INTO gateway_leases (device_id, host_id, expires_at_ms) VALUES ($1, $2, $3)
             ON CONFLICT (device_id) DO UPDATE
             SET host_id = excluded.host_id, expires_at_ms = excluded.expires_at_ms",
            &[&device_id, &host_id, &expires_at_ms],
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
        let mut conn = self.conn("renew leases")?;
        let mut tx = conn.transaction().map_err(query("begin renewing leases"))?;
        tx.execute(
            "DELETE FROM gateway_leases WHERE host_id = $1 AND NOT (device_id = ANY($2))",
            &[&host_id, &connected],
        )
        .map_err(query("drop the leases of devices gone"))?;
        let held = tx
            .execute(
                "INSERT INTO gateway_leases (device_id, host_id, expires_at_ms)
                 SELECT device_id, $1, $4 FROM unnest($2::text[]) AS device_id
                 ON CONFLICT (device_id) DO UPDATE
                 SET host_id = excluded.host_id, expires_at_ms = excluded.expires_at_ms
                 WHERE gateway_leases.host_id = excluded.host_id
                    OR gateway_leases.expires_at_ms <= $3",
                &[&host_id, &connected, &now_ms, &expires_at_ms],
            )
            .map_err(query("renew leases"))?;
        tx.commit().map_err(query("commit the lease renewal"))?;
        Ok(held)
    }

    /// See [`super::Store::release_lease`].
    pub fn release_lease(&self, device_id: &str, host_id: &str) -> Result<bool, StoreError> {
        let released = self
            .conn("release a lease")?
            .execute(
                "DELETE FROM gateway_leases WHERE device_id = $1 AND host_id = $2",
                &[&device_id, &host_id],
            )
            .map_err(query("release a lease"))?;
        Ok(released == 1)
    }

    /// See [`super::Store::lease`].
    pub fn lease(&self, device_id: &str, now_ms: i64) -> Result<Option<Lease>, StoreError> {
        self.conn("read a lease")?
            .query_opt(
                "SELECT device_id, host_id, expires_at_ms FROM gateway_leases
                 WHERE device_id = $1 AND expires_at_ms > $2",
                &[&device_id, &now_ms],
            )
            .map_err(query("read a lease"))?
            .as_ref()
            .map(PostgresStore::lease_from_row)
            .transpose()
    }

    /// See [`super::Store::live_leases_of`].
    pub fn live_leases_of(&self, user_id: &str, now_ms: i64) -> Result<Vec<Lease>, StoreError> {
        self.conn("read a person's leases")?
            .query(
                "SELECT l.device_id, l.host_id, l.expires_at_ms
                 FROM gateway_leases l JOIN gateway_devices d ON d.device_id = l.device_id
                 WHERE d.user_id = $1 AND l.expires_at_ms > $2
                 ORDER BY l.device_id",
                &[&user_id, &now_ms],
            )
            .map_err(query("read a person's leases"))?
            .iter()
            .map(PostgresStore::lease_from_row)
            .collect()
    }

    /// See [`super::Store::expire_leases`].
    pub fn expire_leases(&self, now_ms: i64) -> Result<Vec<Lease>, StoreError> {
        let mut expired = self
            .conn("expire leases")?
            .query(
                "DELETE FROM gateway_leases WHERE expires_at_ms <= $1
                 RETURNING device_id, host_id, expires_at_ms",
                &[&now_ms],
            )
            .map_err(query("expire leases"))?
            .iter()
            .map(PostgresStore::lease_from_row)
            .collect::<Result<Vec<_>, _>>()?;
        expired.sort_by(|a, b| a.device_id.cmp(&b.device_id));
        Ok(expired)
    }

    /// See [`super::Store::lose_host_requests`].
    pub fn lose_host_requests(
        &self,
        host_id: &str,
        reason: &str,
        now_ms: i64,
    ) -> Result<usize, StoreError> {
        let lost = self
            .conn("mark a lost host's pending requests unknown")?
            .execute(
                "UPDATE gateway_requests SET state = 'unknown', reason = $1, finished_at_ms = $2
                 WHERE state = 'pending' AND host_id = $3",
                &[&reason, &now_ms, &host_id],
            )
            .map_err(query("mark a lost host's pending requests unknown"))?;
        Ok(usize::try_from(lost).unwrap_or(usize::MAX))
    }

    /// See [`super::Store::renew_host`].
    pub fn renew_host(&self, host_id: &str, alive_until_ms: i64) -> Result<(), StoreError> {
        self.conn("renew this host")?
            .execute(
                "INSERT INTO gateway_hosts (host_id, alive_until_ms) VALUES ($1, $2)
                 ON CONFLICT (host_id) DO UPDATE SET alive_until_ms = EXCLUDED.alive_until_ms",
                &[&host_id, &alive_until_ms],
            )
            .map_err(query("renew this host"))?;
        Ok(())
    }

    /// See [`super::Store::expire_hosts`].
    pub fn expire_hosts(&self, now_ms: i64) -> Result<Vec<String>, StoreError> {
        let rows = self
            .conn("expire lost hosts")?
            .query(
                "DELETE FROM gateway_hosts WHERE alive_until_ms <= $1 RETURNING host_id",
                &[&now_ms],
            )
            .map_err(query("expire lost hosts"))?;
        let mut lost = rows
            .iter()
            .map(|row| column::<String>(row, 0, "expire lost hosts"))
            .collect::<Result<Vec<_>, _>>()?;
        lost.sort();
        Ok(lost)
    }
}
