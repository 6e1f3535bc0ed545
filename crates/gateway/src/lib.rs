//! `agentworks-gatewayd`: connected laptops. The device registry, the executor WebSocket, and
//! dispatch of shell and patch requests for agentd.
//!
//! - The frames on the executor WebSocket and the dispatch API's bodies are in
//!   `agentworks_contract` (`executor`, `gatewayd`).
//! - [`executor`]: the public listener: `GET /v1/executor` checks, the upgrade, and one
//!   session task per connected laptop (hello, heartbeats, hostile-frame checks, results).
//! - [`dispatch`]: `gatewayd.sock`, served to agentd: health, devices, dispatch, cancel,
//!   outcome, recover (a dispatch whose answer agentd lost, settled from the device's receipt).
//! - [`registry`]: which connection speaks for which device, the pending requests and the
//!   receipt queries.
//! - [`store`]: device ids (each owned by the credential that created it), every dispatched
//!   request with a fingerprint of its payload and its outcome, and device leases; in SQLite
//!   on one host, in a shared PostgreSQL database with `[cluster]` (issue 16).
//! - [`tokens`]: asking agentd whether executor tokens are (still) valid.
//! - [`nats`]: with `[cluster]`, the NATS connection and the revocation subject, which makes
//!   every host re-check a revoked token at once.
//! - [`agentd_calls`]: with `[cluster]`, agentd's calls over NATS (this host's subject and the queue
//!   group's), authenticated with the cluster's gatewayd key.
//! - [`cli`]: its command line; [`start`]: its start as a daemon (listeners, store, READY).
//!
//! gatewayd holds no document and no identity data: it asks agentd about every token, on
//! connect, on every dispatch and every `token_recheck_ms` for every connected device.
//!
//! Must never re-send a request (a request id is recorded before it is sent and answered from
//! the record ever after, and only for the same payload; a timeout, a disconnect or a restart
//! make it `unknown`, not retried, and only the device's own receipt can settle it later),
//! never trust a frame (every frame from a laptop is parsed strictly, bounded, and matched to
//! the connection it came on), never list or dispatch to another person's device (every
//! lookup checks the owner and answers "not found" otherwise), and never let one credential
//! speak for a device another credential created.
//!
//! One registry per process. In a cluster (`[cluster] database_url`), each connected device's
//! lease names the host holding its connection: taken at connect, renewed every heartbeat by
//! `watch_leases`, released at disconnect; a host that misses [`store::MISSED_RENEWALS`]
//! renewals loses its leases on another host's pass, and its pending requests become
//! `unknown`. A dispatch, cancel or recovery for a device another live host holds is refused with
//! that host's id (`device_on_other_host`); agentd makes it there over NATS ([`agentd_calls`]).

pub mod agentd_calls;
pub mod cli;
pub mod dispatch;
pub mod executor;
pub mod nats;
pub mod registry;
pub mod start;
pub mod store;
pub mod tokens;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use agentworks_contract::executor::{CLOSE_REVOKED, Outcome};
use agentworks_contract::gatewayd::DispatchState;
use agentworks_daemon::audit;
use agentworks_daemon::config::Config;
use agentworks_daemon::layout::{LayoutError, ensure_private_dir};
use agentworks_fs::failpoint::{self, Failpoint};
use agentworks_support::clock::now_ms;
use registry::{Pending, Registry};
use store::{Store, StoreError};
use tokens::TokenAuthority;

/// The audit target: one event per connect, disconnect, revocation close and request, each a
/// journal entry with its `MESSAGE_ID` from [`agentworks_daemon::audit`].
pub const AUDIT_TARGET: &str = agentworks_daemon::audit::TARGET;

/// Why gatewayd could not start.
#[derive(Debug, thiserror::Error)]
pub enum GatewayError {
    /// The private state directory could not be made.
    #[error("cannot prepare gatewayd's state directory {path}: {source}")]
    StateDir { path: PathBuf, source: LayoutError },
    /// The store could not be opened.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// `[cluster] database_url` is set but no host id was settled (the config loader settles
    /// one for every cluster; this is a config built by other means).
    #[error("cluster.database_url is set but cluster.host_id is not; set cluster.host_id")]
    NoHostId,
}

/// Timings and limits, from `[gatewayd]`.
#[derive(Debug, Clone)]
pub struct Settings {
    /// WebSocket ping period; a connection silent for three of these is dropped.
    pub heartbeat: Duration,
    /// How often connected tokens are re-checked with agentd.
    pub token_recheck: Duration,
    /// Most executor connections at once.
    pub max_connections: usize,
    /// Most executor connections at once from one client address.
    pub max_connections_per_address: usize,
    /// How long a new connection has to send its hello.
    pub hello_timeout: Duration,
    /// Devices not seen for this long are no longer listed.
    pub recent_devices: Duration,
    /// The gateways every executor is told of in its welcome (`advertised_urls`).
    pub advertised_urls: Vec<String>,
}

impl Settings {
    pub fn from_config(config: &Config) -> Settings {
        let g = &config.gatewayd;
        Settings {
            heartbeat: Duration::from_secs(g.heartbeat_secs.max(1)),
            token_recheck: Duration::from_millis(g.token_recheck_ms.max(10)),
            max_connections: g.max_connections.max(1),
            max_connections_per_address: g.max_connections_per_address.max(1),
            hello_timeout: Duration::from_secs(10),
            recent_devices: Duration::from_secs(30 * 24 * 3600),
            advertised_urls: g.advertised_urls.clone(),
        }
    }
}

/// The shared state of one gatewayd process. Cheap to clone.
#[derive(Clone)]
pub struct Gateway {
    store: Store,
    registry: Arc<Registry>,
    tokens: TokenAuthority,
    settings: Arc<Settings>,
    /// In a cluster, this host's id: it takes a lease on every device connected here, renews
    /// them every heartbeat, and refuses dispatches to devices another live host holds. `None`
    /// on one host (SQLite), where no lease is ever taken.
    lease_host: Option<Arc<str>>,
}

/// Opens gatewayd's store: with `[cluster] database_url`, the shared PostgreSQL database as
/// host `cluster.host_id` (an unreachable server is an error: gatewayd does not start);
/// otherwise `<state>/gateway` (0700) and `gatewayd.db` in it. Requests this host left pending
/// in a previous process become `unknown` here. Blocks: call it off the async threads.
pub fn open_store(config: &Config) -> Result<Store, GatewayError> {
    let cluster = &config.cluster;
    let (store, reconciled) = match &cluster.database_url {
        Some(url) => {
            let host_id = cluster.host_id.as_deref().ok_or(GatewayError::NoHostId)?;
            Store::open_postgres(url, host_id, now_ms())?
        }
        None => {
            let dir = config.layout().gateway_dir();
            ensure_private_dir(&dir, 0o700).map_err(|source| GatewayError::StateDir {
                path: dir.clone(),
                source,
            })?;
            Store::open_sqlite(&dir.join("gatewayd.db"), now_ms())?
        }
    };
    if reconciled > 0 {
        tracing::warn!(
            reconciled,
            "requests pending when gatewayd stopped are now unknown"
        );
    }
    Ok(store)
}

impl Gateway {
    pub fn new(store: Store, tokens: TokenAuthority, settings: Settings) -> Gateway {
        Gateway {
            store,
            registry: Arc::new(Registry::default()),
            tokens,
            settings: Arc::new(settings),
            lease_host: None,
        }
    }

    /// This gateway takes and renews device leases as host `host_id` (a cluster host).
    pub fn with_lease_host(mut self, host_id: &str) -> Gateway {
        self.lease_host = Some(Arc::from(host_id));
        self
    }

    /// The lease period's unit: leases are renewed every heartbeat and expire after
    /// [`store::MISSED_RENEWALS`] missed renewals.
    fn lease_renew_ms(&self) -> i64 {
        i64::try_from(self.settings.heartbeat.as_millis()).unwrap_or(i64::MAX)
    }

    /// In a cluster: takes `device_id`'s lease for this host (its connection is here now).
    /// On one host: nothing.
    async fn take_lease(&self, device_id: &str) -> Result<(), String> {
        let Some(host) = self.lease_host.clone() else {
            return Ok(());
        };
        let (store, id, every) = (
            self.store.clone(),
            device_id.to_owned(),
            self.lease_renew_ms(),
        );
        let taken = tokio::task::spawn_blocking(move || {
            let now = now_ms();
            store.take_lease(&id, &host, now, store::lease_expiry(now, every))
        })
        .await;
        match taken {
            Ok(Ok(Some(previous))) => {
                tracing::info!(
                    device_id,
                    previous_host = %previous.host_id,
                    "took over the lease of a device another host held"
                );
                Ok(())
            }
            Ok(Ok(None)) => Ok(()),
            Ok(Err(error)) => Err(error.to_string()),
            Err(error) => Err(error.to_string()),
        }
    }

    /// In a cluster: gives up `device_id`'s lease at its disconnect, unless a newer connection
    /// of the device is live here (then the lease stays, or is taken again if a release raced
    /// with that connection's take).
    async fn release_lease(&self, device_id: &str) {
        let Some(host) = self.lease_host.clone() else {
            return;
        };
        if self.registry.live(device_id).is_some() {
            return;
        }
        let (store, id) = (self.store.clone(), device_id.to_owned());
        let released = tokio::task::spawn_blocking(move || store.release_lease(&id, &host)).await;
        match released {
            Ok(Ok(_)) => {}
            Ok(Err(error)) => {
                tracing::warn!(%error, device_id, "cannot release a device's lease; it expires by itself")
            }
            Err(error) => tracing::warn!(%error, device_id, "the lease release task failed"),
        }
        // A connection that went live (and took the lease) during the release keeps a lease.
        if self.registry.live(device_id).is_some()
            && let Err(error) = self.take_lease(device_id).await
        {
            tracing::warn!(error, device_id, "cannot take a device's lease again");
        }
    }

    /// Records the final state of a request whose pending entry the caller removed, emits the
    /// audit event, and answers the dispatcher waiting on it (if it still waits).
    async fn resolve(&self, request_id: String, pending: Pending, state: DispatchState) {
        let store = self.store.clone();
        let (id, recorded) = (request_id.clone(), state.clone());
        let result =
            tokio::task::spawn_blocking(move || store.finish_request(&id, &recorded, now_ms()))
                .await;
        match result {
            Ok(Ok(())) => {}
            Ok(Err(error)) => {
                tracing::error!(%error, request_id, "cannot record a request's outcome")
            }
            Err(error) => tracing::error!(%error, request_id, "recording task failed"),
        }
        failpoint::hit(Failpoint::ResultRecorded);
        audit_request(
            &pending.user_id,
            &pending.device_id,
            pending.kind,
            &request_id,
            &state,
        );
        let _ = pending.reply.send(state);
    }
}

/// The one audit event per dispatched request: who, where, what kind, how it ended (again when
/// an unknown outcome is recovered from the device's receipt). Never the command, its output,
/// a diff or a token.
fn audit_request(
    user_id: &str,
    device_id: &str,
    kind: &str,
    request_id: &str,
    state: &DispatchState,
) {
    let (state_name, status, exit_code) = match state {
        DispatchState::Done { outcome } => {
            let (status, exit) = match outcome {
                Outcome::Completed { exit_code, .. } => ("completed", *exit_code),
                Outcome::Patched { .. } => ("patched", None),
                Outcome::Refused { .. } => ("refused", None),
                Outcome::Interrupted { .. } => ("interrupted", None),
            };
            ("done", status, exit)
        }
        DispatchState::Pending => ("pending", "pending", None),
        DispatchState::Unknown { .. } => ("unknown", "unknown", None),
    };
    tracing::info!(
        target: AUDIT_TARGET,
        message_id = audit::REQUEST,
        agentworks_event = "request",
        agentworks_user_id = user_id,
        agentworks_device_id = device_id,
        agentworks_request_id = request_id,
        agentworks_kind = kind,
        agentworks_state = state_name,
        agentworks_status = status,
        agentworks_exit_code = exit_code,
        "dispatched request finished"
    );
}

/// Polls agentd every `token_recheck` with every connected token id and closes the
/// connections whose token is no longer valid (close code 4001); their pending requests
/// become unknown. agentd unreachable: the connections stay (every dispatch re-checks and
/// fails closed) and a warning is logged.
async fn watch_tokens(gateway: Gateway, shutdown: CancellationToken) {
    let mut ticks = tokio::time::interval(gateway.settings.token_recheck);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut warned = false;
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = ticks.tick() => {}
        }
        let connected = gateway.registry.tokens();
        if connected.is_empty() {
            continue;
        }
        let mut ids: Vec<String> = connected.iter().map(|(_, _, t)| t.clone()).collect();
        ids.sort();
        ids.dedup();
        match gateway.tokens.invalid(ids).await {
            Ok(invalid) => {
                warned = false;
                for (device_id, conn_id, token_id) in &connected {
                    if invalid.contains(token_id) {
                        revoke(&gateway, device_id, *conn_id);
                    }
                }
            }
            Err(error) => {
                if !warned {
                    tracing::warn!(%error, "cannot re-check executor tokens; will retry");
                    warned = true;
                }
            }
        }
    }
}

/// In a cluster, every heartbeat: renews the leases this host holds, then expires the leases
/// of hosts that missed [`store::MISSED_RENEWALS`] renewals and marks the requests those hosts
/// left pending `unknown` (never re-sent). A store failure is logged once per outage and the
/// pass runs again at the next tick.
async fn watch_leases(gateway: Gateway, host: Arc<str>, shutdown: CancellationToken) {
    let mut ticks = tokio::time::interval(gateway.settings.heartbeat);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut warned = false;
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = ticks.tick() => {}
        }
        let (store, me, every) = (
            gateway.store.clone(),
            host.clone(),
            gateway.lease_renew_ms(),
        );
        let mut connected: Vec<String> = gateway
            .registry
            .tokens()
            .into_iter()
            .map(|(device_id, _, _)| device_id)
            .collect();
        connected.sort_unstable();
        let pass =
            tokio::task::spawn_blocking(move || lease_pass(&store, &me, &connected, every)).await;
        match pass {
            Ok(Ok(())) => warned = false,
            Ok(Err(error)) if !warned => {
                tracing::warn!(%error, "cannot renew or expire device leases; will retry");
                warned = true;
            }
            Ok(Err(_)) => {}
            Err(error) => tracing::error!(%error, "the lease pass task failed"),
        }
    }
}

/// One lease pass (blocking): renew this host and its leases, expire the lost hosts and their
/// leases, fail their requests. A host is lost when its own heartbeat lapsed (even if every
/// device of it reconnected elsewhere first) or when a lease of it expired.
fn lease_pass(
    store: &Store,
    host: &str,
    connected: &[String],
    every_ms: i64,
) -> Result<(), StoreError> {
    let now = now_ms();
    let until = store::lease_expiry(now, every_ms);
    store.renew_host(host, until)?;
    store.renew_leases(host, connected, now, until)?;
    let lost_hosts = store.expire_hosts(now)?;
    let expired = store.expire_leases(now)?;
    let mut lost: Vec<&str> = expired
        .iter()
        .map(|lease| lease.host_id.as_str())
        .chain(lost_hosts.iter().map(String::as_str))
        .filter(|lost| *lost != host)
        .collect();
    lost.sort_unstable();
    lost.dedup();
    for lease in &expired {
        tracing::info!(
            device_id = %lease.device_id,
            lost_host = %lease.host_id,
            "a device's lease expired: its host missed three renewals"
        );
    }
    for lost_host in lost {
        let failed = store.lose_host_requests(lost_host, store::LOST_HOST_REASON, now)?;
        tracing::warn!(
            lost_host,
            failed,
            "a gatewayd host is lost; its pending requests are now unknown"
        );
    }
    Ok(())
}

/// Closes a connection whose token agentd no longer accepts.
fn revoke(gateway: &Gateway, device_id: &str, conn_id: u64) {
    let Some(live) = gateway.registry.live(device_id) else {
        return;
    };
    if live.conn_id != conn_id {
        return;
    }
    tracing::info!(
        target: AUDIT_TARGET,
        message_id = audit::EXECUTOR_REVOKED,
        agentworks_event = "executor_revoked",
        agentworks_user_id = %live.user_id,
        agentworks_device_id = device_id,
        "closing an executor connection: its token is no longer valid"
    );
    gateway.registry.close(
        device_id,
        conn_id,
        CLOSE_REVOKED,
        "the token was revoked",
        "the device's token was revoked while the request was pending; its outcome is unknown",
    );
}

/// Serves the executor listener and the dispatch socket (and, with `bus`, the revocation
/// subject) until `shutdown`; then closes every executor connection with 1001 (going away),
/// fails its pending requests as unknown, lets in-flight socket requests answer, and returns.
pub async fn run(
    config: &Config,
    store: Store,
    bus: Option<nats::Bus>,
    calls_key: Option<agentd_calls::GatewaydKey>,
    executors: tokio::net::TcpListener,
    socket: tokio::net::UnixListener,
    shutdown: CancellationToken,
) {
    let mut gateway = Gateway::new(
        store,
        TokenAuthority::new(config.agentd_socket()),
        Settings::from_config(config),
    );
    // Leases only where other hosts can read them: a cluster's shared database.
    if let (Some(_), Some(host)) = (&config.cluster.database_url, &config.cluster.host_id) {
        gateway = gateway.with_lease_host(host);
    }
    let policy =
        agentworks_daemon::ipc::server::PeerPolicy::for_users(&config.gatewayd.allowed_users);
    tracing::info!(
        allowed_uids = ?policy.uids().collect::<Vec<_>>(),
        "gatewayd.sock peer policy"
    );
    let watcher = tokio::spawn(watch_tokens(gateway.clone(), shutdown.clone()));
    let leases = gateway
        .lease_host
        .clone()
        .map(|host| tokio::spawn(watch_leases(gateway.clone(), host, shutdown.clone())));
    let mut agentd_calls = Vec::new();
    let revocations = bus.map(|bus| {
        if let (Some(key), Some(host)) = (calls_key, &config.cluster.host_id) {
            let server = agentd_calls::CallServer::new(bus.client.clone(), key, host);
            for calls in [bus.host_calls, bus.any_calls] {
                agentd_calls.push(tokio::spawn(agentd_calls::serve_calls(
                    gateway.clone(),
                    server.clone(),
                    calls,
                    shutdown.clone(),
                )));
            }
        }
        tokio::spawn(nats::watch_revocations(
            gateway.clone(),
            bus.revocations,
            shutdown.clone(),
        ))
    });
    let ws = tokio::spawn(executor::serve(
        executors,
        gateway.clone(),
        shutdown.clone(),
    ));
    dispatch::serve(socket, gateway, policy, shutdown).await;
    let _ = ws.await;
    let _ = watcher.await;
    if let Some(revocations) = revocations {
        let _ = revocations.await;
    }
    for calls in agentd_calls {
        let _ = calls.await;
    }
    if let Some(leases) = leases {
        let _ = leases.await;
    }
}
