//! gatewayd's durable state, behind one [`Store`] with two back ends: embedded SQLite on one
//! host (the default, [`sqlite`]) and a shared PostgreSQL database when `[cluster]
//! database_url` is set ([`postgres`]; several gatewayd hosts, issue 16).
//!
//! Both keep the same three tables (PostgreSQL's prefixed `gateway_`):
//!
//! - `devices`: one stable device id per `(user_id, token_id, device_name)`: a device id belongs
//!   to the credential that created it; the folders it last shared, when it was last seen.
//! - `requests`: every dispatched request id with its owner, device, kind, a SHA-256 of its
//!   payload (folder and operation) and its state: `pending`, `done` with the outcome, or
//!   `unknown` with a reason. A request is recorded *before* it is sent, so a request id once
//!   in this table is never sent again, whatever happens to gatewayd; a request id claimed by a
//!   recovery before it was ever recorded is kept `unknown` with `sent = 0`. The claim is one
//!   atomic statement (PostgreSQL: `INSERT … ON CONFLICT DO NOTHING`; SQLite: a write-locked
//!   transaction), so two hosts claiming one id never both send it.
//! - `leases`: which host holds a device's connection (device id → host id, until
//!   `expires_at_ms`), renewed by the host's heartbeat; a host that misses
//!   [`MISSED_RENEWALS`] renewals loses its leases ([`Store::expire_leases`]). On one host
//!   they are kept too, so both back ends behave alike.
//!
//! At open, every request still `pending` *of this host* becomes `unknown`: gatewayd died while
//! it was on a laptop, and nobody can tell whether it ran. Only the device's own receipt can
//! later turn such an `unknown` into `done` ([`Store::recover_request`]).
//!
//! Why an enum and not a trait object: the callers (the executor sessions and the dispatch
//! API) clone a cheap handle into `spawn_blocking` and call short synchronous methods; an enum
//! keeps exactly that shape for both back ends, with no boxing and no generic parameter
//! threaded through [`crate::Gateway`].
//!
//! Must never hold a token, never delete a request record, and never be called on an async
//! thread: every call is short and synchronous (the PostgreSQL driver blocks on its own
//! runtime); async callers use `spawn_blocking`.

pub mod postgres;
pub mod sqlite;

#[cfg(any(test, feature = "store-conformance"))]
pub mod conformance;

use std::path::{Path, PathBuf};

use agentworks_contract::executor::{FolderInfo, Operation, Outcome};
use agentworks_contract::gatewayd::DispatchState;

pub use self::postgres::PostgresStore;
pub use self::sqlite::SqliteStore;
pub use agentworks_daemon::postgres::DatabaseTlsError;

/// Why the gateway store failed.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// Opening the SQLite database or setting it up failed.
    #[error("cannot open the gateway store {path}: {source}")]
    Open {
        path: PathBuf,
        source: rusqlite::Error,
    },
    /// A SQLite statement failed.
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
    /// `cluster.database_url` is not a URL the PostgreSQL driver accepts.
    #[error("cluster.database_url {url} is not a usable PostgreSQL URL: {source}")]
    PostgresUrl {
        /// The URL with its password redacted.
        url: String,
        source: ::postgres::Error,
    },
    /// The PostgreSQL server could not be reached (at start: gatewayd refuses to start).
    #[error("cannot reach the cluster database {url}: {reason}")]
    PostgresConnect {
        /// The URL with its password redacted.
        url: String,
        /// The last connection error with its causes ("error performing TLS handshake:
        /// invalid peer certificate: UnknownIssuer").
        reason: String,
    },
    /// The TLS that `cluster.database_url` asks for cannot be set up.
    #[error("cluster.database_url {url}: {source}")]
    PostgresTls {
        /// The URL with its password redacted.
        url: String,
        source: DatabaseTlsError,
    },
    /// No pooled connection became free, or none could be made, in time.
    #[error("gateway store (PostgreSQL): no connection for {operation}: {source}")]
    PostgresPool {
        operation: &'static str,
        source: agentworks_daemon::postgres::PoolError,
    },
    /// A schema migration failed (the schema is left as it was: each runs in a transaction).
    #[error("gateway store (PostgreSQL): cannot apply schema migration {version}: {source}")]
    PostgresMigrate {
        version: i32,
        source: ::postgres::Error,
    },
    /// The database holds a schema newer than this gatewayd knows.
    #[error(
        "gateway store (PostgreSQL): the database has schema version {found}, newer than this \
         gatewayd's {known}; upgrade gatewayd on this host"
    )]
    PostgresSchemaTooNew { found: i32, known: i32 },
    /// Another host holds the claim on a request id, yet its record cannot be read (never
    /// expected: request records are never deleted). Nothing is sent.
    #[error(
        "gateway store (PostgreSQL): request {request_id} is claimed, but its record cannot be \
         read; it is not sent"
    )]
    ClaimVanished { request_id: String },
    /// A PostgreSQL statement failed.
    #[error("gateway store (PostgreSQL): cannot {operation}: {source}")]
    PostgresQuery {
        operation: &'static str,
        source: ::postgres::Error,
    },
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
pub const LOST_HOST_REASON: &str = "the gatewayd host holding the device's connection stopped renewing its lease (it is lost); whether the device ran the request is unknown and it is not re-sent";
pub const NEVER_SENT_REASON: &str = "gatewayd never recorded this request, so it was never sent to the device; the id is now claimed and it never will be";

/// How many renewals in a row a host may miss before its leases expire.
pub const MISSED_RENEWALS: i64 = 3;

/// When a lease taken or renewed at `now_ms` by a host renewing every `renew_every_ms`
/// expires: after [`MISSED_RENEWALS`] missed renewals.
pub fn lease_expiry(now_ms: i64, renew_every_ms: i64) -> i64 {
    now_ms.saturating_add(renew_every_ms.saturating_mul(MISSED_RENEWALS))
}

/// The `(state, reason, finished_at_ms)` a new request is recorded with: `pending` to be sent,
/// or `unknown` and never sent for an id claimed by a recovery.
fn new_request_columns(
    send: bool,
    now_ms: i64,
) -> (&'static str, Option<&'static str>, Option<i64>) {
    if send {
        ("pending", None, None)
    } else {
        ("unknown", Some(NEVER_SENT_REASON), Some(now_ms))
    }
}

/// The `(state, outcome JSON, reason)` columns recording a final state.
type FinalColumns<'s> = (&'static str, Option<String>, Option<&'s str>);

/// The columns recording a final `state`; `None` for `Pending`, which is never recorded as a
/// final state.
fn final_columns<'s>(
    request_id: &str,
    state: &'s DispatchState,
) -> Result<Option<FinalColumns<'s>>, StoreError> {
    Ok(match state {
        DispatchState::Pending => None,
        DispatchState::Done { outcome } => {
            let json = serde_json::to_string(outcome).map_err(|source| StoreError::Json {
                what: "outcome",
                id: request_id.to_owned(),
                source,
            })?;
            Some(("done", Some(json), None))
        }
        DispatchState::Unknown { reason } => Some(("unknown", None, Some(reason.as_str()))),
    })
}

/// A request's state from its `state`, `outcome` and `reason` columns.
fn state_from_columns(
    request_id: &str,
    state: &str,
    outcome: Option<String>,
    reason: Option<String>,
) -> Result<DispatchState, StoreError> {
    Ok(match (state, outcome) {
        ("done", Some(json)) => DispatchState::Done {
            outcome: serde_json::from_str::<Outcome>(&json).map_err(|source| StoreError::Json {
                what: "outcome",
                id: request_id.to_owned(),
                source,
            })?,
        },
        ("pending", _) => DispatchState::Pending,
        _ => DispatchState::Unknown {
            reason: reason.unwrap_or_else(|| "the outcome was not recorded".to_owned()),
        },
    })
}

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
    /// The id was recorded before: never send it again. Boxed: a record holds a whole outcome.
    Existing(Box<RequestRecord>),
}

/// A host's hold on a device's connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lease {
    pub device_id: String,
    pub host_id: String,
    /// Unless renewed, the lease is gone at this time (milliseconds since the epoch).
    pub expires_at_ms: i64,
}

/// A cheap-to-clone handle on the store, whichever back end holds it.
#[derive(Clone)]
pub enum Store {
    /// One host: `<state>/gateway/gatewayd.db`.
    Sqlite(SqliteStore),
    /// Several hosts: the shared PostgreSQL database.
    Postgres(PostgresStore),
}

/// Calls the same method on whichever back end `$store` is.
macro_rules! on_backend {
    ($store:expr, $inner:ident => $call:expr) => {
        match $store {
            Store::Sqlite($inner) => $call,
            Store::Postgres($inner) => $call,
        }
    };
}

impl Store {
    /// Opens (creating if needed) the SQLite database at `path`, then turns every request left
    /// `pending` into `unknown`. Returns the store and how many requests were reconciled.
    pub fn open_sqlite(path: &Path, now_ms: i64) -> Result<(Store, usize), StoreError> {
        let (store, reconciled) = SqliteStore::open(path, now_ms)?;
        Ok((Store::Sqlite(store), reconciled))
    }

    /// Connects to the PostgreSQL database at `url` as host `host_id` (failing at once if the
    /// server cannot be reached), applies the schema migrations under an advisory lock, then
    /// turns every request this host left `pending` into `unknown`. Returns the store and how
    /// many requests were reconciled.
    pub fn open_postgres(
        url: &str,
        host_id: &str,
        now_ms: i64,
    ) -> Result<(Store, usize), StoreError> {
        let (store, reconciled) = PostgresStore::open(url, host_id, now_ms)?;
        Ok((Store::Postgres(store), reconciled))
    }

    /// Which back end this is, for logs: `"sqlite"` or `"postgres"`.
    pub fn backend(&self) -> &'static str {
        match self {
            Store::Sqlite(_) => "sqlite",
            Store::Postgres(_) => "postgres",
        }
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
        on_backend!(self, s => s.register_device(user_id, token_id, name, folders, version, now_ms))
    }

    /// Marks a device seen now (at disconnect).
    pub fn touch_device(&self, device_id: &str, now_ms: i64) -> Result<(), StoreError> {
        on_backend!(self, s => s.touch_device(device_id, now_ms))
    }

    /// One device by id, whoever owns it (the caller checks the owner).
    pub fn device(&self, device_id: &str) -> Result<Option<DeviceRecord>, StoreError> {
        on_backend!(self, s => s.device(device_id))
    }

    /// `user_id`'s devices seen at or after `since_ms`, most recent first. Only that person's.
    pub fn devices_of(
        &self,
        user_id: &str,
        since_ms: i64,
    ) -> Result<Vec<DeviceRecord>, StoreError> {
        on_backend!(self, s => s.devices_of(user_id, since_ms))
    }

    /// Records a request as pending unless its id is already known; see [`Begin`].
    /// `payload_sha256` is [`payload_sha256`] of its folder and operation.
    pub fn begin_request(
        &self,
        request: &NewRequest<'_>,
        now_ms: i64,
    ) -> Result<Begin, StoreError> {
        on_backend!(self, s => s.insert_request(request, now_ms, true))
    }

    /// Claims a request id nobody recorded (recovery of a dispatch whose answer agentd lost):
    /// recorded `unknown`, never sent, so a dispatch still under way with this id finds it and
    /// never sends it. An id already known is returned as it is.
    pub fn claim_unsent(&self, request: &NewRequest<'_>, now_ms: i64) -> Result<Begin, StoreError> {
        on_backend!(self, s => s.insert_request(request, now_ms, false))
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
        on_backend!(self, s => s.recover_request(request_id, outcome, now_ms))
    }

    /// Records the final state of a pending request. A request already final keeps its first
    /// final state (a late result never overwrites `unknown`), with one exception in a cluster:
    /// an `unknown` of [`LOST_HOST_REASON`] recorded while this host, alive but cut off from
    /// the database longer than a lease, still had the request on the device, is replaced by
    /// the device's answer (as a receipt would, see [`Store::recover_request`]).
    pub fn finish_request(
        &self,
        request_id: &str,
        state: &DispatchState,
        now_ms: i64,
    ) -> Result<(), StoreError> {
        on_backend!(self, s => s.finish_request(request_id, state, now_ms))
    }

    /// A request by id, whoever dispatched it (the caller checks the owner).
    pub fn request(&self, request_id: &str) -> Result<Option<RequestRecord>, StoreError> {
        on_backend!(self, s => s.request(request_id))
    }

    /// `host_id` takes `device_id`'s lease until `expires_at_ms` (see [`lease_expiry`]): the
    /// device's newest connection is on this host, so the lease is this host's whoever held
    /// it. Returns the lease another host still held (live) before, whose connection is stale.
    pub fn take_lease(
        &self,
        device_id: &str,
        host_id: &str,
        now_ms: i64,
        expires_at_ms: i64,
    ) -> Result<Option<Lease>, StoreError> {
        on_backend!(self, s => s.take_lease(device_id, host_id, now_ms, expires_at_ms))
    }

    /// The heartbeat: `host_id` holds the leases of `connected` (the devices connected to it
    /// now) until `expires_at_ms`, and no other. A device's lease is renewed, or taken back if
    /// it lapsed (a database outage longer than a lease, say) or was never recorded (its take
    /// failed), unless another host holds a live one (the device's newer connection is there);
    /// a lease of this host's on a device no longer connected here (its release failed) is
    /// dropped. Returns how many leases the host holds now.
    pub fn renew_leases(
        &self,
        host_id: &str,
        connected: &[String],
        now_ms: i64,
        expires_at_ms: i64,
    ) -> Result<u64, StoreError> {
        on_backend!(self, s => s.renew_leases(host_id, connected, now_ms, expires_at_ms))
    }

    /// Gives up `device_id`'s lease if `host_id` holds it (at disconnect); true if it did.
    /// Another host's lease on the device is left alone.
    pub fn release_lease(&self, device_id: &str, host_id: &str) -> Result<bool, StoreError> {
        on_backend!(self, s => s.release_lease(device_id, host_id))
    }

    /// The live lease on `device_id` at `now_ms`, if any.
    pub fn lease(&self, device_id: &str, now_ms: i64) -> Result<Option<Lease>, StoreError> {
        on_backend!(self, s => s.lease(device_id, now_ms))
    }

    /// The live leases at `now_ms` on `user_id`'s devices, by device id, in one query: what
    /// the device list needs to tell which of them are connected to another host. Only that
    /// person's devices; an expired lease (not yet deleted by [`Store::expire_leases`]) is not
    /// live.
    pub fn live_leases_of(&self, user_id: &str, now_ms: i64) -> Result<Vec<Lease>, StoreError> {
        on_backend!(self, s => s.live_leases_of(user_id, now_ms))
    }

    /// Deletes every lease that expired at or before `now_ms` (its host missed
    /// [`MISSED_RENEWALS`] renewals) and returns them, by device id.
    pub fn expire_leases(&self, now_ms: i64) -> Result<Vec<Lease>, StoreError> {
        on_backend!(self, s => s.expire_leases(now_ms))
    }

    /// Marks every request `host_id` recorded and left pending `unknown` (with `reason`):
    /// that host missed [`MISSED_RENEWALS`] lease renewals and counts as lost, so whether it
    /// sent them can no longer be known, and they are never re-sent. Returns how many. On one
    /// host (SQLite) there is no other host: always 0 (this host's own are settled at open).
    pub fn lose_host_requests(
        &self,
        host_id: &str,
        reason: &str,
        now_ms: i64,
    ) -> Result<usize, StoreError> {
        on_backend!(self, s => s.lose_host_requests(host_id, reason, now_ms))
    }

    /// The heartbeat of `host_id` itself: it counts as alive until `alive_until_ms` (see
    /// [`lease_expiry`]). On one host (SQLite): nothing.
    pub fn renew_host(&self, host_id: &str, alive_until_ms: i64) -> Result<(), StoreError> {
        on_backend!(self, s => s.renew_host(host_id, alive_until_ms))
    }

    /// Deletes every host whose heartbeat lapsed at or before `now_ms` and returns their ids,
    /// sorted: they missed [`MISSED_RENEWALS`] renewals and count as lost, even if all their
    /// devices already reconnected elsewhere (so no lease of theirs is left to expire). On one
    /// host (SQLite): none.
    pub fn expire_hosts(&self, now_ms: i64) -> Result<Vec<String>, StoreError> {
        on_backend!(self, s => s.expire_hosts(now_ms))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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

    #[test]
    fn a_lease_lasts_three_renewal_periods() {
        assert_eq!(lease_expiry(1_000, 500), 2_500);
        assert_eq!(lease_expiry(i64::MAX - 1, 500), i64::MAX);
    }

    /// The conformance suite on SQLite; `tests/suite/gateway_store.rs` runs it on both.
    mod sqlite_conformance {
        use super::super::conformance;
        use super::*;

        fn backend() -> (tempfile::TempDir, impl Fn(i64) -> (Store, usize)) {
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("gatewayd.db");
            (dir, move |now| Store::open_sqlite(&path, now).unwrap())
        }

        #[test]
        fn device_ids_are_stable_per_user_credential_and_name() {
            let (_dir, open) = backend();
            conformance::device_ids_are_stable_per_user_credential_and_name(&open);
        }

        #[test]
        fn a_request_id_is_recorded_once_and_pending_becomes_unknown_at_reopen() {
            let (_dir, open) = backend();
            conformance::a_request_id_is_recorded_once_and_pending_becomes_unknown_at_reopen(&open);
        }

        #[test]
        fn only_a_sent_unknown_request_is_recovered_and_a_claimed_id_is_never_sent() {
            let (_dir, open) = backend();
            conformance::only_a_sent_unknown_request_is_recovered_and_a_claimed_id_is_never_sent(
                &open,
            );
        }

        #[test]
        fn two_stores_claiming_one_request_id_at_once_record_it_once() {
            let (_dir, open) = backend();
            conformance::two_stores_claiming_one_request_id_at_once_record_it_once(&open);
        }

        #[test]
        fn leases_are_taken_renewed_released_and_expire_after_three_missed_renewals() {
            let (_dir, open) = backend();
            conformance::leases_are_taken_renewed_released_and_expire_after_three_missed_renewals(
                &open,
            );
        }

        #[test]
        fn a_persons_live_leases_are_listed_in_one_query() {
            let (_dir, open) = backend();
            conformance::a_persons_live_leases_are_listed_in_one_query(&open);
        }
    }
}
