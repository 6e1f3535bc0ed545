//! `gatewayd.sock`: the dispatch API agentd calls (HTTP/1.1 + JSON, peer-checked).
//!
//! | endpoint | body | answer |
//! | --- | --- | --- |
//! | `GET /v1/health` | — | `{status, daemon, version, connected}` |
//! | `POST /v1/devices` | [`DevicesRequest`] | `[DeviceInfo]`: that person's devices, online or seen in the last 30 days |
//! | `POST /v1/dispatch` | [`DispatchRequest`] | [`DispatchState`], after the result (or the failure) |
//! | `POST /v1/cancel` | [`RequestRef`] | [`CancelResponse`] |
//! | `POST /v1/outcome` | [`RequestRef`] | [`DispatchState`], as recorded (survives restarts) |
//! | `POST /v1/recover` | [`DispatchRequest`] | [`Recovery`]: the state of a dispatch whose answer agentd lost |
//! | `POST /v1/locate` | [`LocateRequest`] | [`Located`]: the host whose lease the device is under (a cluster) |
//! | `POST /v1/watch` | [`DispatchRequest`] | [`Watched`]: its record and its device's holder now (a cluster) |
//!
//! Errors are the usual envelope: `invalid_request` (400), `not_found` (404: no such device or
//! request *for this person*), `device_offline` (409), `folder_not_granted` (403),
//! `token_revoked` or agentd's other token codes (401), `request_id_reused` (409: the id was
//! used for another person, device, folder or operation), `agentd_unavailable` (503),
//! `device_on_other_host` (409, in a cluster: another host holds the device's connection, named in
//! `host_id`; the call is to be made there),
//! `peer_forbidden` (403: the caller's uid is not root, gatewayd's own, or in
//! `[gatewayd] allowed_users`).
//!
//! Order of a dispatch: validate → answer a known request id from its record if it is the same
//! request (same person, device, folder and operation; else `request_id_reused`), never sending
//! it again → the device must be this person's (else 404) and online (else 409) and share the
//! folder (else 403) → re-check the connection's token with agentd (invalid: close the
//! connection with 4001 and answer 401) → record the request as pending → send it once → wait
//! for its result, its connection's end, or its deadline (command timeout + 30 s; 60 s for a
//! patch), whichever comes first → answer what was recorded.
//!
//! A recovery (agentd's exchange failed after it sent the dispatch, so it cannot know whether
//! gatewayd sent it): no record → claim the id as never sent ([`Recovery::NeverSent`]); a
//! record of another request → `request_id_reused`; done → that; pending → unsettled; unknown
//! → ask the device's connection (the credential that owns the device) for its receipt, for at
//! most [`RECEIPT_QUERY_TIMEOUT`]: a recorded outcome is stored and answered, "running" or no
//! answer is unsettled, "never seen" is unknown for good.
//!
//! In a cluster, agentd makes these calls over NATS ([`crate::agentd_calls`]), each answered here by
//! this same code: a dispatch on the subject of the host that holds the device (found with
//! `/v1/locate`), the rest on any host's. A call for a device whose connection another live host
//! holds (its lease) is refused `device_on_other_host`, naming that host; gatewayd never passes
//! a call on itself. While it waits for a dispatch's answer agentd reads `/v1/watch` on any host,
//! so a holder that dies is seen from the shared database (its pending requests made unknown
//! when it loses its leases, or the request never recorded there, whose id agentd then claims
//! as never sent with `/v1/recover`).
//!
//! Must never reveal that another person's device or request exists, never send a request id
//! twice, never replay one request's outcome for another, never fall back to another device,
//! and never pass a call on to another host.

use std::collections::HashSet;
use std::time::Duration;

use bytes::Bytes;
use hyper::http::request::Parts;
use hyper::{Method, Response, StatusCode};
use serde::Serialize;
use tokio::sync::oneshot;
use tokio_util::sync::CancellationToken;

use super::registry::{Live, Pending};
use super::store::{Begin, NewRequest, RequestRecord, StoreError, payload_sha256};
use super::{AUDIT_TARGET, Gateway};
use agentworks_contract::envelope::Health;
use agentworks_contract::executor::valid_alias;
use agentworks_contract::executor::{
    GatewayFrame, MAX_FRAME_BYTES, MAX_TIMEOUT_SECS, Operation, ReceiptState,
};
use agentworks_contract::gatewayd::{
    CancelResponse, DeviceInfo, DevicesRequest, DispatchRequest, DispatchState, GatewayHealth,
    LocateRequest, Located, Recovery, RequestRef, Watched,
};
use agentworks_daemon::audit;
use agentworks_daemon::ipc::envelope::{Body, Refusal, decode_json, json_response, run_blocking};
use agentworks_daemon::ipc::server::{
    Peer, PeerPolicy, ServerLimits, refuse_peer, serve as serve_ipc,
};
use agentworks_fs::failpoint::{self, Failpoint};
use agentworks_support::clock::now_ms;

/// How long a recovery waits for the device to answer a receipt query.
pub const RECEIPT_QUERY_TIMEOUT: Duration = Duration::from_secs(10);
/// The longest request id accepted.
const MAX_REQUEST_ID_BYTES: usize = 128;
/// The longest user or device id accepted.
const MAX_ID_BYTES: usize = 128;
/// Serves `gatewayd.sock` until `shutdown`.
pub async fn serve(
    listener: tokio::net::UnixListener,
    gateway: Gateway,
    policy: PeerPolicy,
    shutdown: CancellationToken,
) {
    let limits = ServerLimits {
        max_connections: 256,
        max_body_bytes: MAX_FRAME_BYTES,
    };
    let handler = move |peer: Peer, parts: Parts, body: Bytes| {
        let gateway = gateway.clone();
        let policy = policy.clone();
        async move {
            if !policy.allows(&peer) {
                let why = "not an allowed user";
                return refuse_peer(&peer, "gatewayd.sock", parts.uri.path(), why);
            }
            route(&gateway, &parts, &body)
                .await
                .unwrap_or_else(Refusal::into_response)
        }
    };
    serve_ipc(listener, handler, shutdown, limits).await;
}

/// gatewayd's own failure (logged): a 500 `internal` that says what failed.
fn internal(error: impl std::fmt::Display) -> Refusal {
    tracing::error!(%error, "gatewayd.sock request failed");
    Refusal::internal(format!("gatewayd failed: {error}"))
}

/// A store failure is gatewayd's own: `internal`.
impl From<StoreError> for Refusal {
    fn from(error: StoreError) -> Refusal {
        internal(error)
    }
}

/// Runs a store call on a blocking thread.
async fn blocking<T, F>(f: F) -> Result<T, Refusal>
where
    T: Send + 'static,
    F: FnOnce() -> Result<T, StoreError> + Send + 'static,
{
    run_blocking(f, Refusal::from).await
}

fn ok<T: Serialize>(value: &T) -> Response<Body> {
    json_response(StatusCode::OK, value)
}

async fn route(gateway: &Gateway, parts: &Parts, body: &Bytes) -> Result<Response<Body>, Refusal> {
    let path = parts.uri.path();
    if parts.method == Method::GET && path == "/v1/health" {
        return Ok(ok(&GatewayHealth {
            health: Health::ok("agentworks-gatewayd", env!("CARGO_PKG_VERSION")),
            connected: gateway.registry.live_count(),
        }));
    }
    if !POST_PATHS.contains(&path) {
        return Err(unknown_endpoint(&parts.method, path));
    }
    if parts.method != Method::POST {
        return Err(Refusal::new(
            StatusCode::METHOD_NOT_ALLOWED,
            "method_not_allowed",
            "use POST",
        ));
    }
    post(gateway, path, body).await
}

/// The POST endpoints, on the socket and over NATS alike.
pub const POST_PATHS: [&str; 7] = [
    "/v1/devices",
    "/v1/dispatch",
    "/v1/cancel",
    "/v1/outcome",
    "/v1/recover",
    "/v1/locate",
    "/v1/watch",
];

fn unknown_endpoint(method: &Method, path: &str) -> Refusal {
    Refusal::new(
        StatusCode::NOT_FOUND,
        "unknown_endpoint",
        format!("{method} {path} is not an endpoint of gatewayd's socket"),
    )
}

async fn post(gateway: &Gateway, path: &str, body: &Bytes) -> Result<Response<Body>, Refusal> {
    match path {
        "/v1/devices" => devices(gateway, body).await,
        "/v1/dispatch" => dispatch(gateway, body).await,
        "/v1/cancel" => cancel(gateway, body).await,
        "/v1/recover" => recover(gateway, body).await,
        "/v1/outcome" => outcome(gateway, body).await,
        "/v1/locate" => locate(gateway, body).await,
        "/v1/watch" => watch(gateway, body).await,
        _ => Err(unknown_endpoint(&Method::POST, path)),
    }
}

/// Serves a call agentd made over NATS ([`crate::agentd_calls`]): one of [`POST_PATHS`], answered as
/// the same call on this socket would be.
pub async fn serve_agentd_call(gateway: &Gateway, path: &str, body: &Bytes) -> Response<Body> {
    post(gateway, path, body)
        .await
        .unwrap_or_else(Refusal::into_response)
}

fn valid_id(id: &str, max: usize) -> bool {
    !id.is_empty()
        && id.len() <= max
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-' | b':'))
}

fn check_ids(user_id: &str, request_id: Option<&str>) -> Result<(), Refusal> {
    if !valid_id(user_id, MAX_ID_BYTES) {
        return Err(Refusal::new(
            StatusCode::BAD_REQUEST,
            "invalid_request",
            "user_id must be 1 to 128 of A-Z a-z 0-9 . _ - :",
        ));
    }
    if let Some(id) = request_id
        && !valid_id(id, MAX_REQUEST_ID_BYTES)
    {
        return Err(Refusal::new(
            StatusCode::BAD_REQUEST,
            "invalid_request",
            "request_id must be 1 to 128 of A-Z a-z 0-9 . _ - :",
        ));
    }
    Ok(())
}

/// `POST /v1/devices`: this person's devices, online first.
async fn devices(gateway: &Gateway, body: &Bytes) -> Result<Response<Body>, Refusal> {
    let request: DevicesRequest = decode_json(body)?;
    check_ids(&request.user_id, None)?;
    let since = now_ms() - gateway.settings.recent_devices.as_millis() as i64;
    let store = gateway.store.clone();
    let user_id = request.user_id.clone();
    // In a cluster, the live leases of all this person's devices in one query (not one per
    // device): a device connected to another live host is online too.
    let cluster = gateway.lease_host.is_some();
    let (stored, leases) = blocking(move || {
        let stored = store.devices_of(&user_id, since)?;
        let leases = if cluster {
            store.live_leases_of(&user_id, now_ms())?
        } else {
            Vec::new()
        };
        Ok((stored, leases))
    })
    .await?;
    let this_host = gateway.lease_host.as_deref();
    let leased_elsewhere: HashSet<String> = leases
        .into_iter()
        .filter(|lease| Some(lease.host_id.as_str()) != this_host)
        .map(|lease| lease.device_id)
        .collect();
    let live = gateway.registry.live_of_user(&request.user_id);
    let mut listed: Vec<DeviceInfo> = live
        .iter()
        .map(|(device_id, l)| DeviceInfo {
            device_id: device_id.clone(),
            name: l.device_name.clone(),
            user_id: l.user_id.clone(),
            online: true,
            folders: l.folders.clone(),
            connected_at_ms: Some(l.connected_at_ms),
            last_seen_ms: now_ms(),
        })
        .collect();
    for device in stored {
        if live.iter().any(|(id, _)| *id == device.device_id) {
            continue;
        }
        let online = leased_elsewhere.contains(&device.device_id);
        listed.push(DeviceInfo {
            device_id: device.device_id,
            name: device.name,
            user_id: device.user_id,
            online,
            folders: device.folders,
            connected_at_ms: None,
            last_seen_ms: device.last_seen_ms,
        });
    }
    // Defence in depth: whatever the lookups did, only this person's devices leave.
    listed.retain(|d| d.user_id == request.user_id);
    listed.sort_by(|a, b| b.online.cmp(&a.online).then_with(|| a.name.cmp(&b.name)));
    Ok(ok(&listed))
}

/// The deadline of an operation, and its kind's name for the record and the audit.
fn deadline_and_kind(operation: &Operation) -> (Duration, &'static str) {
    let kind = match operation {
        Operation::ExecuteShellCommand { .. } => "execute_shell_command",
        Operation::DiffPatchWorkspaceFile { .. } => "diff_patch_workspace_file",
    };
    (operation.deadline(), kind)
}

fn check_operation(operation: &Operation) -> Result<(), Refusal> {
    let bad = |message: &str| {
        Err(Refusal::new(
            StatusCode::BAD_REQUEST,
            "invalid_request",
            message.to_owned(),
        ))
    };
    match operation {
        Operation::ExecuteShellCommand { command, timeout } => {
            if command.trim().is_empty() {
                return bad("the command is empty");
            }
            if timeout.is_some_and(|t| t == 0 || t > MAX_TIMEOUT_SECS) {
                return bad("timeout must be 1 to 300 seconds");
            }
        }
        Operation::DiffPatchWorkspaceFile { filepath, diff } => {
            if filepath.is_empty() || diff.is_empty() {
                return bad("filepath and diff must not be empty");
            }
        }
    }
    Ok(())
}

/// Whether `record` is the request `request` asks for: same person, device, folder and
/// operation. A record from before payload fingerprints matches nothing (fail closed).
fn same_request(record: &RequestRecord, request: &DispatchRequest) -> bool {
    record.user_id == request.user_id
        && record.device_id == request.device_id
        && record.payload_sha256.as_deref()
            == Some(payload_sha256(&request.folder, &request.operation).as_str())
}

fn reused() -> Refusal {
    Refusal::new(
        StatusCode::CONFLICT,
        "request_id_reused",
        "this request id was already used for another request; make a new one",
    )
}

/// The answer for a request id seen before: its record, if it is this very request;
/// otherwise `request_id_reused` (which says nothing about the other use).
fn replay(record: RequestRecord, request: &DispatchRequest) -> Result<Response<Body>, Refusal> {
    if !same_request(&record, request) {
        return Err(reused());
    }
    Ok(ok(&record.state))
}

/// `POST /v1/dispatch`: checks, then the request recorded and sent once, then its answer.
async fn dispatch(gateway: &Gateway, body: &Bytes) -> Result<Response<Body>, Refusal> {
    let request: DispatchRequest = decode_json(body)?;
    check_ids(&request.user_id, Some(&request.request_id))?;
    check_operation(&request.operation)?;
    let (deadline, kind) = deadline_and_kind(&request.operation);
    failpoint::hit(Failpoint::DispatchReceived);

    // A request id seen before is answered from its record, never sent again.
    let store = gateway.store.clone();
    let id = request.request_id.clone();
    if let Some(record) = blocking(move || store.request(&id)).await? {
        return replay(record, &request);
    }
    let live = target_connection(gateway, &request).await?;
    let frame = request_frame(&request)?;
    let answer = match send_once(gateway, &request, &live, frame, kind).await? {
        Sent::Waiting(answer) => answer,
        Sent::Answered(response) => return Ok(response),
    };
    spawn_deadline(gateway, &request.request_id, deadline);
    match answer.await {
        Ok(state) => Ok(ok(&state)),
        // Every path that removes a pending entry answers it; this is a last resort.
        Err(_) => {
            let store = gateway.store.clone();
            let id = request.request_id.clone();
            let record = blocking(move || store.request(&id)).await?;
            Ok(ok(&record.map(|r| r.state).unwrap_or(
                DispatchState::Unknown {
                    reason: "the request's outcome was lost".into(),
                },
            )))
        }
    }
}

/// A call this host cannot serve in a cluster.
#[derive(Debug, thiserror::Error)]
pub enum RouteError {
    /// Another host holds the device's connection (its lease): the call is to be made there.
    #[error(
        "the device \"{device_name}\" is connected to gatewayd host \"{host_id}\", not to this \
         host (\"{this_host}\"); make the call there"
    )]
    HeldByOtherHost {
        device_name: String,
        host_id: String,
        this_host: String,
    },
}

/// `device_on_other_host` (409), with the holder in `host_id`.
impl From<RouteError> for Refusal {
    fn from(error: RouteError) -> Refusal {
        let message = error.to_string();
        match error {
            RouteError::HeldByOtherHost { host_id, .. } => {
                Refusal::new(StatusCode::CONFLICT, "device_on_other_host", message)
                    .with_detail("host_id", host_id)
            }
        }
    }
}

/// In a cluster, the host other than this one whose live lease `device_id` is under, if any.
async fn leased_elsewhere(gateway: &Gateway, device_id: &str) -> Result<Option<String>, Refusal> {
    let Some(this_host) = gateway.lease_host.clone() else {
        return Ok(None);
    };
    let (store, id) = (gateway.store.clone(), device_id.to_owned());
    let lease = blocking(move || store.lease(&id, now_ms())).await?;
    Ok(lease
        .map(|lease| lease.host_id)
        .filter(|host| **host != *this_host))
}

/// In a cluster, refuses a call for `device_id` (not connected here) if another live host
/// holds its lease ([`RouteError::HeldByOtherHost`]), so that agentd makes it there.
async fn refuse_if_held_elsewhere(
    gateway: &Gateway,
    device_id: &str,
    device_name: &str,
) -> Result<(), Refusal> {
    match leased_elsewhere(gateway, device_id).await? {
        None => Ok(()),
        Some(host) => Err(RouteError::HeldByOtherHost {
            device_name: device_name.to_owned(),
            host_id: host,
            this_host: gateway.lease_host.as_deref().unwrap_or("-").to_owned(),
        }
        .into()),
    }
}

/// 404 `not_found` for a device that is not this person's (or does not exist: the same answer).
fn no_such_device(device_id: &str) -> Refusal {
    Refusal::new(
        StatusCode::NOT_FOUND,
        "not_found",
        format!("no device {device_id} for this user"),
    )
}

/// 409 `device_offline`: no host holds the device's connection.
fn device_offline(name: &str) -> Refusal {
    Refusal::new(
        StatusCode::CONFLICT,
        "device_offline",
        format!(
            "the device \"{name}\" is not connected; on that computer, run `agentworks executor connect` and try again"
        ),
    )
}

/// The connection that speaks for the request's device: this person's device (else not
/// found), online here (in a cluster, a device another host holds is refused with that host),
/// sharing the folder, and its token still valid now.
async fn target_connection(gateway: &Gateway, request: &DispatchRequest) -> Result<Live, Refusal> {
    // The device: this person's (else not found), online, sharing the folder.
    if !valid_id(&request.device_id, MAX_ID_BYTES) {
        return Err(no_such_device(&request.device_id));
    }
    let store = gateway.store.clone();
    let device_id = request.device_id.clone();
    let device = blocking(move || store.device(&device_id)).await?;
    let Some(device) = device.filter(|d| d.user_id == request.user_id) else {
        return Err(no_such_device(&request.device_id));
    };
    let Some(live) = gateway
        .registry
        .live(&request.device_id)
        .filter(|l| l.user_id == request.user_id)
    else {
        refuse_if_held_elsewhere(gateway, &request.device_id, &device.name).await?;
        return Err(device_offline(&device.name));
    };
    if !valid_alias(&request.folder) || !live.folders.iter().any(|f| f.alias == request.folder) {
        return Err(Refusal::new(
            StatusCode::FORBIDDEN,
            "folder_not_granted",
            format!(
                "the device \"{}\" does not share a folder named \"{}\"",
                live.device_name, request.folder
            ),
        ));
    }

    // The token, again, now.
    match gateway.tokens.invalid(vec![live.token_id.clone()]).await {
        Ok(invalid) if invalid.contains(&live.token_id) => {
            super::revoke(gateway, &request.device_id, live.conn_id);
            return Err(Refusal::new(
                StatusCode::UNAUTHORIZED,
                "token_revoked",
                "the device's token is no longer valid; its connection was closed",
            ));
        }
        Ok(_) => {}
        Err(error) => return Err(error.into()),
    }
    Ok(live)
}

/// The request as the frame the executor gets; it must fit the executor's limit, or it would
/// be refused on the wire.
fn request_frame(request: &DispatchRequest) -> Result<GatewayFrame, Refusal> {
    let frame = GatewayFrame::Request {
        request_id: request.request_id.clone(),
        folder: request.folder.clone(),
        operation: request.operation.clone(),
    };
    let frame_bytes = serde_json::to_vec(&frame)
        .map(|v| v.len())
        .map_err(internal)?;
    if frame_bytes > MAX_FRAME_BYTES {
        return Err(Refusal::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "too_large",
            format!("the request is {frame_bytes} bytes on the wire; at most {MAX_FRAME_BYTES}"),
        ));
    }
    Ok(frame)
}

/// What sending a dispatch came to: waiting for the device's answer, or answered already
/// (an earlier record of the same request, or a device that went away before the send).
enum Sent {
    Waiting(oneshot::Receiver<DispatchState>),
    Answered(Response<Body>),
}

/// Records the request, then sends it once on `live`.
async fn send_once(
    gateway: &Gateway,
    request: &DispatchRequest,
    live: &Live,
    frame: GatewayFrame,
    kind: &'static str,
) -> Result<Sent, Refusal> {
    let begun = record_request(gateway, request, kind, true).await?;
    if let Begin::Existing(record) = begun {
        return replay(*record, request).map(Sent::Answered);
    }
    failpoint::hit(Failpoint::DispatchRecorded);
    let (reply, answer) = oneshot::channel();
    let pending = Pending {
        conn_id: live.conn_id,
        device_id: request.device_id.clone(),
        user_id: request.user_id.clone(),
        kind,
        reply,
    };
    tracing::info!(
        target: AUDIT_TARGET,
        message_id = audit::REQUEST_SENT,
        agentworks_event = "request_sent",
        agentworks_user_id = %request.user_id,
        agentworks_device_id = %request.device_id,
        agentworks_request_id = %request.request_id,
        agentworks_kind = kind,
        agentworks_folder = %request.folder,
        "dispatching a request"
    );
    if let Err(pending) = gateway
        .registry
        .send_pending(&request.request_id, frame, pending)
    {
        // The connection went away between the checks and the send: nothing was sent.
        let state = DispatchState::Unknown {
            reason: "the device disconnected before the request could be sent; it was not sent"
                .into(),
        };
        gateway
            .resolve(request.request_id.clone(), pending, state.clone())
            .await;
        return Ok(Sent::Answered(ok(&state)));
    }
    failpoint::hit(Failpoint::DispatchSent);
    Ok(Sent::Waiting(answer))
}

/// The deadline runs in its own task, so it fires even if agentd stops waiting.
fn spawn_deadline(gateway: &Gateway, request_id: &str, deadline: Duration) {
    let watchdog = gateway.clone();
    let request_id = request_id.to_owned();
    tokio::spawn(async move {
        tokio::time::sleep(deadline).await;
        if let Some(pending) = watchdog.registry.take_pending(&request_id, None) {
            // Ask the executor to stop it; the request itself is never sent again.
            watchdog.registry.send_frame(
                &pending.device_id,
                pending.conn_id,
                GatewayFrame::Cancel {
                    request_id: request_id.clone(),
                },
            );
            let state = DispatchState::Unknown {
                reason: format!(
                    "no result within {} s; the request was cancelled on the device and is not re-sent",
                    deadline.as_secs()
                ),
            };
            watchdog.resolve(request_id, pending, state).await;
        }
    });
}

/// Records `request` as pending (`send`) or claims its id as never sent; see
/// [`super::store::Store::begin_request`] and [`super::store::Store::claim_unsent`].
async fn record_request(
    gateway: &Gateway,
    request: &DispatchRequest,
    kind: &'static str,
    send: bool,
) -> Result<Begin, Refusal> {
    let store = gateway.store.clone();
    let (rid, uid, did, folder) = (
        request.request_id.clone(),
        request.user_id.clone(),
        request.device_id.clone(),
        request.folder.clone(),
    );
    let payload = payload_sha256(&request.folder, &request.operation);
    blocking(move || {
        let new = NewRequest {
            request_id: &rid,
            user_id: &uid,
            device_id: &did,
            folder: &folder,
            kind,
            payload_sha256: &payload,
        };
        if send {
            store.begin_request(&new, now_ms())
        } else {
            store.claim_unsent(&new, now_ms())
        }
    })
    .await
}

/// `POST /v1/recover`: the state of a dispatch whose answer agentd lost, recovered from the
/// device's receipt when the record says unknown. Never sends the request.
async fn recover(gateway: &Gateway, body: &Bytes) -> Result<Response<Body>, Refusal> {
    let request: DispatchRequest = decode_json(body)?;
    check_recovery(&request)?;
    let (_, kind) = deadline_and_kind(&request.operation);
    // Unknown to gatewayd: it was never sent, and claiming the id makes sure it never is (a
    // dispatch of it still under way finds the claim and answers from it).
    let record = match record_request(gateway, &request, kind, false).await? {
        Begin::New => return Ok(ok(&Recovery::NeverSent)),
        Begin::Existing(record) => *record,
    };
    if !same_request(&record, &request) {
        return Err(reused());
    }
    if let Some(recovery) = recovery_from_record(&record) {
        return Ok(ok(&recovery));
    }
    // Unknown: only the device's own receipt can tell; it is asked where the device is.
    if gateway.registry.live(&record.device_id).is_none() {
        refuse_if_held_elsewhere(gateway, &record.device_id, &record.device_id).await?;
    }
    let receipt = match ask_for_receipt(gateway, &record, &request.request_id).await? {
        Ok(receipt) => receipt,
        Err(unsettled) => return Ok(ok(&unsettled)),
    };
    let recovery =
        settle_from_receipt(gateway, &record, kind, &request.request_id, receipt).await?;
    Ok(ok(&recovery))
}

/// A recovery's checks: a dispatch's, and more, because a claim is recorded from its device
/// and folder, which must be what a dispatch would accept.
fn check_recovery(request: &DispatchRequest) -> Result<(), Refusal> {
    check_ids(&request.user_id, Some(&request.request_id))?;
    check_operation(&request.operation)?;
    if !valid_id(&request.device_id, MAX_ID_BYTES) || !valid_alias(&request.folder) {
        return Err(Refusal::new(
            StatusCode::BAD_REQUEST,
            "invalid_request",
            "device_id and folder must be an id and a folder alias",
        ));
    }
    Ok(())
}

/// A recovery that is not settled yet, and why.
fn unsettled(reason: &str) -> Recovery {
    Recovery::Unsettled {
        reason: reason.to_owned(),
    }
}

/// What the record alone says about the request, or `None` if it says unknown after a send
/// (then only the device's receipt can tell).
fn recovery_from_record(record: &RequestRecord) -> Option<Recovery> {
    match &record.state {
        DispatchState::Done { .. } => Some(Recovery::Settled {
            state: record.state.clone(),
            from_receipt: false,
        }),
        DispatchState::Pending => Some(unsettled("the request is still running on the device")),
        DispatchState::Unknown { .. } if !record.sent => Some(Recovery::NeverSent),
        DispatchState::Unknown { .. } => None,
    }
}

/// Asks the device for its receipt of `request_id`, on the connection of the credential that
/// owns the device, for at most [`RECEIPT_QUERY_TIMEOUT`]: its answer, or (`Err`) the
/// unsettled recovery if it cannot be asked or does not answer.
async fn ask_for_receipt(
    gateway: &Gateway,
    record: &RequestRecord,
    request_id: &str,
) -> Result<Result<ReceiptState, Recovery>, Refusal> {
    let store = gateway.store.clone();
    let device_id = record.device_id.clone();
    let device = blocking(move || store.device(&device_id)).await?;
    let live = gateway.registry.live(&record.device_id).filter(|live| {
        live.user_id == record.user_id
            && device.as_ref().is_some_and(|d| {
                d.user_id == record.user_id && d.token_id.as_deref() == Some(live.token_id.as_str())
            })
    });
    let Some(live) = live else {
        return Ok(Err(unsettled(
            "the device is not connected; its receipt can be asked for once it is",
        )));
    };
    let Some(answer) = gateway
        .registry
        .query_receipt(&record.device_id, live.conn_id, request_id)
    else {
        return Ok(Err(unsettled(
            "the device's receipt is being asked for already",
        )));
    };
    match tokio::time::timeout(RECEIPT_QUERY_TIMEOUT, answer).await {
        Ok(Ok(receipt)) => Ok(Ok(receipt)),
        _ => {
            gateway
                .registry
                .forget_receipt_query(request_id, live.conn_id);
            Ok(Err(unsettled(
                "the device did not answer the receipt query",
            )))
        }
    }
}

/// The recovery the device's receipt settles: still running, never seen there (unknown for
/// good), or its outcome, which is stored (and audited if that changed the record).
async fn settle_from_receipt(
    gateway: &Gateway,
    record: &RequestRecord,
    kind: &'static str,
    request_id: &str,
    receipt: ReceiptState,
) -> Result<Recovery, Refusal> {
    match receipt {
        ReceiptState::Running => Ok(unsettled("the device says the request is still running")),
        ReceiptState::Unknown => Ok(Recovery::Settled {
            state: DispatchState::Unknown {
                reason: "the device has no receipt of this request (it never arrived there, or its receipts were lost); whether it ran is unknown and it is not re-sent".into(),
            },
            from_receipt: true,
        }),
        ReceiptState::Done { outcome } => {
            let store = gateway.store.clone();
            let (id, recorded) = (request_id.to_owned(), outcome.clone());
            let changed =
                blocking(move || store.recover_request(&id, &recorded, now_ms())).await?;
            failpoint::hit(Failpoint::ReceiptSettled);
            let state = DispatchState::Done { outcome };
            if changed {
                super::audit_request(&record.user_id, &record.device_id, kind, request_id, &state);
            }
            Ok(Recovery::Settled {
                state,
                from_receipt: true,
            })
        }
    }
}

/// This person's record of `request_id`, or a 404 that says nothing more.
async fn owned_record(gateway: &Gateway, reference: &RequestRef) -> Result<RequestRecord, Refusal> {
    check_ids(&reference.user_id, Some(&reference.request_id))?;
    let store = gateway.store.clone();
    let id = reference.request_id.clone();
    let record = blocking(move || store.request(&id)).await?;
    record
        .filter(|r| r.user_id == reference.user_id)
        .ok_or_else(|| {
            Refusal::new(
                StatusCode::NOT_FOUND,
                "not_found",
                format!("no request {} for this user", reference.request_id),
            )
        })
}

/// `POST /v1/cancel`: asks the device to stop a pending request.
async fn cancel(gateway: &Gateway, body: &Bytes) -> Result<Response<Body>, Refusal> {
    let reference: RequestRef = decode_json(body)?;
    let record = owned_record(gateway, &reference).await?;
    let here = gateway
        .registry
        .pending_connection(&reference.request_id)
        .is_some();
    if record.state == DispatchState::Pending && !here {
        refuse_if_held_elsewhere(gateway, &record.device_id, &record.device_id).await?;
    }
    let mut sent = false;
    if record.state == DispatchState::Pending
        && let Some((device_id, conn_id)) =
            gateway.registry.pending_connection(&reference.request_id)
    {
        sent = gateway.registry.send_frame(
            &device_id,
            conn_id,
            GatewayFrame::Cancel {
                request_id: reference.request_id.clone(),
            },
        );
        tracing::info!(
            target: AUDIT_TARGET,
            message_id = audit::REQUEST_CANCEL,
            agentworks_event = "request_cancel",
            agentworks_user_id = %reference.user_id,
            agentworks_device_id = %device_id,
            agentworks_request_id = %reference.request_id,
            agentworks_sent = sent,
            "cancel requested"
        );
    }
    Ok(ok(&CancelResponse {
        cancel_sent: sent,
        state: record.state,
    }))
}

/// `POST /v1/outcome`: the recorded state.
async fn outcome(gateway: &Gateway, body: &Bytes) -> Result<Response<Body>, Refusal> {
    let reference: RequestRef = decode_json(body)?;
    let record = owned_record(gateway, &reference).await?;
    Ok(ok(&record.state))
}

/// `POST /v1/locate`: the host whose live lease this person's device is under.
async fn locate(gateway: &Gateway, body: &Bytes) -> Result<Response<Body>, Refusal> {
    let request: LocateRequest = decode_json(body)?;
    check_ids(&request.user_id, None)?;
    if !valid_id(&request.device_id, MAX_ID_BYTES) {
        return Err(no_such_device(&request.device_id));
    }
    let (store, id) = (gateway.store.clone(), request.device_id.clone());
    let (device, lease) =
        blocking(move || Ok((store.device(&id)?, store.lease(&id, now_ms())?))).await?;
    let Some(device) = device.filter(|d| d.user_id == request.user_id) else {
        return Err(no_such_device(&request.device_id));
    };
    let here = gateway
        .registry
        .live(&request.device_id)
        .filter(|l| l.user_id == request.user_id)
        .and(gateway.lease_host.as_deref());
    match lease.map(|lease| lease.host_id).or(here.map(str::to_owned)) {
        Some(host_id) => Ok(ok(&Located { host_id })),
        None => Err(device_offline(&device.name)),
    }
}

/// `POST /v1/watch`: a dispatch's record (if it is this very request) and, if the device is
/// this person's, its holder.
async fn watch(gateway: &Gateway, body: &Bytes) -> Result<Response<Body>, Refusal> {
    let request: DispatchRequest = decode_json(body)?;
    check_recovery(&request)?;
    let (store, id, device) = (
        gateway.store.clone(),
        request.request_id.clone(),
        request.device_id.clone(),
    );
    let (record, owner, lease) = blocking(move || {
        let owner = store.device(&device)?.map(|d| d.user_id);
        Ok((store.request(&id)?, owner, store.lease(&device, now_ms())?))
    })
    .await?;
    let state = match record {
        Some(record) if !same_request(&record, &request) => return Err(reused()),
        Some(record) => Some(record.state),
        None => None,
    };
    // Where another person's device is connected is none of this caller's business.
    let holder = lease
        .filter(|_| owner.as_deref() == Some(request.user_id.as_str()))
        .map(|lease| lease.host_id);
    Ok(ok(&Watched { state, holder }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use agentworks_contract::executor::PATCH_DEADLINE;

    #[test]
    fn deadlines_follow_the_operation() {
        let shell = Operation::ExecuteShellCommand {
            command: "true".into(),
            timeout: Some(5),
        };
        assert_eq!(deadline_and_kind(&shell).0, Duration::from_secs(35));
        let default = Operation::ExecuteShellCommand {
            command: "true".into(),
            timeout: None,
        };
        assert_eq!(deadline_and_kind(&default).0, Duration::from_secs(90));
        let patch = Operation::DiffPatchWorkspaceFile {
            filepath: "a".into(),
            diff: "d".into(),
        };
        assert_eq!(
            deadline_and_kind(&patch),
            (PATCH_DEADLINE, "diff_patch_workspace_file")
        );
        assert!(
            check_operation(&Operation::ExecuteShellCommand {
                command: "true".into(),
                timeout: Some(301),
            })
            .is_err()
        );
    }

    #[test]
    fn ids_are_bounded_and_plain() {
        assert!(valid_id("req_01:abc-1.2", 128));
        assert!(!valid_id("", 128));
        assert!(!valid_id("a/b", 128));
        assert!(!valid_id(&"a".repeat(129), 128));
    }
}
