//! The executor side of gatewayd: the public listener laptops dial, and one session task per
//! connected laptop.
//!
//! Owns, in this order for each TCP connection: the connection table (`max_connections`, of
//! which a quarter is kept for authenticated sessions, and `max_connections_per_address`; a
//! connection that is still sending its request headers may be evicted to make room, see
//! [`agentworks_daemon::ipc::connections`]; past the bounds a 503 and close), one HTTP/1.1 request (`GET /v1/executor`, else 404/405), the bearer
//! token (missing → 401), the WebSocket handshake headers (else 400), agentd's verdict on the
//! token (refused → agentd's 401/403 with its code; agentd unreachable → 503) — all *before*
//! the upgrade — then the session: the hello (within 10 s), the device's stable id (owned by
//! the connection's credential; another credential with the same name is another device and is
//! told so in the welcome), the welcome, heartbeats, request and receipt-query frames out,
//! result and receipt frames in, and the cleanup that fails every pending request of the
//! connection as unknown.
//!
//! Must never trust a frame: only text frames of at most [`MAX_FRAME_BYTES`] that parse as an
//! [`ExecutorFrame`] (unknown fields and types refused) are read; anything else closes the
//! connection with a policy error (1008; 1009 for an oversized frame). A result counts only
//! for a request pending *on this connection*, a receipt only for a query sent on it. Must
//! never re-send a request, and never log a token, a command, its output or a diff.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use agentworks_daemon::ipc::bearer::Bearer;
use futures_util::{SinkExt, StreamExt};
use hyper::body::Incoming;
use hyper::header::{
    CONNECTION, HeaderMap, HeaderValue, SEC_WEBSOCKET_ACCEPT, SEC_WEBSOCKET_KEY,
    SEC_WEBSOCKET_VERSION, UPGRADE, WWW_AUTHENTICATE,
};
use hyper::upgrade::Upgraded;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::sync::mpsc;
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::handshake::derive_accept_key;
use tokio_tungstenite::tungstenite::protocol::frame::CloseFrame;
use tokio_tungstenite::tungstenite::protocol::{Role, WebSocketConfig};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::registry::{Control, Live};
use super::{AUDIT_TARGET, Gateway};
use agentworks_contract::agentd::TokenCheckResponse;
use agentworks_contract::executor::{
    CLOSE_GOING_AWAY, CLOSE_POLICY, CLOSE_REPLACED, ExecutorFrame, FolderInfo, GatewayFrame,
    MAX_FRAME_BYTES, check_hello,
};
use agentworks_contract::gatewayd::DispatchState;
use agentworks_daemon::audit;
use agentworks_daemon::ipc::connections::{
    ConnectionLimits, ConnectionSlot, ConnectionTable, FILES_BESIDES_CONNECTIONS, Phase,
    fit_to_open_files,
};
use agentworks_daemon::ipc::envelope::{Body, error_response};
use agentworks_daemon::ipc::server::{Acceptor, Served, admit_or_refuse, serve_until_evicted};
use agentworks_support::clock::now_ms;

/// The one path executors dial.
pub const EXECUTOR_PATH: &str = "/v1/executor";
/// How long a connection may take to send its request headers.
const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);
/// hyper's read buffer while an upgrade request's head arrives.
const MAX_HEAD_BYTES: usize = 16 * 1024;
/// How long one frame may take to write before the peer counts as gone.
const WRITE_TIMEOUT: Duration = Duration::from_secs(10);
/// How long the closing handshake may take after we sent our close frame.
const CLOSE_DRAIN: Duration = Duration::from_secs(1);
/// The longest bearer token accepted (agentd's are far shorter).
const MAX_TOKEN_BYTES: usize = 1024;
/// A WebSocket close reason must fit in 123 bytes.
const MAX_CLOSE_REASON_BYTES: usize = 120;

type Ws = WebSocketStream<TokioIo<Upgraded>>;

/// The WebSocket limits: no message or frame larger than [`MAX_FRAME_BYTES`].
pub fn ws_config() -> WebSocketConfig {
    WebSocketConfig::default()
        .max_message_size(Some(MAX_FRAME_BYTES))
        .max_frame_size(Some(MAX_FRAME_BYTES))
        // tungstenite's defaults (128 KiB read buffer, zero-filled on the first read, and a
        // 128 KiB write buffer) stay resident: ~142 KiB per idle laptop. A 4 KiB read buffer
        // and writing each frame at once keep an idle connection at ~14 KiB (bench:
        // gateway_roundtrip); large frames still arrive, in more reads.
        .read_buffer_size(READ_BUFFER_BYTES)
        .write_buffer_size(0)
}

/// The per-connection read buffer (see [`ws_config`]).
const READ_BUFFER_BYTES: usize = 4096;

/// Accepts executor connections until `shutdown`, then waits for every session to close.
pub async fn serve(
    listener: tokio::net::TcpListener,
    gateway: Gateway,
    shutdown: CancellationToken,
) {
    let table = ConnectionTable::new(fit_to_open_files(
        ConnectionLimits::with_reserved_quarter(
            gateway.settings.max_connections,
            gateway.settings.max_connections_per_address,
        ),
        FILES_BESIDES_CONNECTIONS,
    ));
    let tracker = TaskTracker::new();
    let mut acceptor = Acceptor::new(listener);
    // Unlike the public HTTP listener this one does not wait for room before accepting: a
    // full table answers a newcomer 503 at once, so an executor retries with its backoff.
    while let Some((stream, remote)) = acceptor.next(&shutdown).await {
        let Some(slot) = admit_or_refuse(&table, &stream, remote) else {
            continue;
        };
        tracker.spawn(handle_connection(
            stream,
            remote,
            gateway.clone(),
            shutdown.clone(),
            Arc::new(slot),
            tracker.clone(),
        ));
    }
    drop(acceptor);
    // Sessions close with 1001 (going away); connections still sending their head close now.
    table.evict_waiting();
    tracker.close();
    tracker.wait().await;
}

/// One TCP connection: exactly one HTTP request, which either upgrades or is refused.
async fn handle_connection(
    stream: tokio::net::TcpStream,
    remote: SocketAddr,
    gateway: Gateway,
    shutdown: CancellationToken,
    slot: Arc<ConnectionSlot>,
    tracker: TaskTracker,
) {
    let evicted = slot.evicted().clone();
    let session_shutdown = shutdown.clone();
    let service = hyper::service::service_fn(move |request: Request<Incoming>| {
        let gateway = gateway.clone();
        let shutdown = session_shutdown.clone();
        let slot = slot.clone();
        let tracker = tracker.clone();
        async move {
            Ok::<_, Infallible>(upgrade(request, remote, gateway, shutdown, slot, tracker).await)
        }
    });
    let connection = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(HEADER_READ_TIMEOUT)
        // A connection that never ends its headers holds at most this much (hyper's default
        // read buffer grows to ~400 KiB).
        .max_buf_size(MAX_HEAD_BYTES)
        .serve_connection(TokioIo::new(stream), service)
        .with_upgrades();
    match serve_until_evicted(connection, &evicted, &shutdown).await {
        // Still sending its request headers when room was needed (or at shutdown).
        Served::Evicted => {
            tracing::debug!(%remote, "waiting executor connection evicted to make room")
        }
        Served::Ended(Err(error)) => {
            tracing::debug!(%error, %remote, "executor HTTP connection ended with an error")
        }
        Served::Ended(Ok(())) => {}
    }
}

/// A refusal envelope; the connection closes after it (one request per connection: a refused
/// peer gets no second try on the same socket).
fn refuse(status: StatusCode, code: &str, message: impl Into<String>) -> Response<Body> {
    let mut response = error_response(status, code, message, serde_json::Map::new());
    response
        .headers_mut()
        .insert(CONNECTION, HeaderValue::from_static("close"));
    response
}

/// The bearer token of a request, if it has exactly one well-formed one of printable ASCII
/// within `MAX_TOKEN_BYTES` (1 KiB).
pub fn bearer(headers: &HeaderMap) -> Option<String> {
    match agentworks_daemon::ipc::bearer::bearer(headers) {
        Bearer::Token(token)
            if token.len() <= MAX_TOKEN_BYTES && token.bytes().all(|b| b.is_ascii_graphic()) =>
        {
            Some(token.to_owned())
        }
        _ => None,
    }
}

/// Whether a comma-separated header (e.g. `Connection: keep-alive, Upgrade`) lists `token`.
fn header_lists(headers: &HeaderMap, name: hyper::header::HeaderName, token: &str) -> bool {
    headers.get_all(name).iter().any(|v| {
        v.to_str().is_ok_and(|v| {
            v.split(',')
                .any(|part| part.trim().eq_ignore_ascii_case(token))
        })
    })
}

/// The `Sec-WebSocket-Key` of a well-formed version-13 upgrade request, else the refusal.
#[allow(clippy::result_large_err)]
fn websocket_key(headers: &HeaderMap) -> Result<String, Response<Body>> {
    if !header_lists(headers, UPGRADE, "websocket") || !header_lists(headers, CONNECTION, "upgrade")
    {
        return Err(refuse(
            StatusCode::BAD_REQUEST,
            "not_websocket",
            "GET /v1/executor is a WebSocket endpoint (Upgrade: websocket)",
        ));
    }
    if headers.get(SEC_WEBSOCKET_VERSION).map(|v| v.as_bytes()) != Some(b"13") {
        let mut response = refuse(
            StatusCode::UPGRADE_REQUIRED,
            "websocket_version",
            "only WebSocket version 13 is spoken",
        );
        response
            .headers_mut()
            .insert(SEC_WEBSOCKET_VERSION, HeaderValue::from_static("13"));
        return Err(response);
    }
    match headers.get(SEC_WEBSOCKET_KEY).and_then(|v| v.to_str().ok()) {
        Some(key) if !key.trim().is_empty() && key.len() <= 64 => Ok(key.trim().to_owned()),
        _ => Err(refuse(
            StatusCode::BAD_REQUEST,
            "not_websocket",
            "missing or invalid Sec-WebSocket-Key",
        )),
    }
}

/// Checks one HTTP request and, if everything holds, answers 101 and starts the session.
async fn upgrade(
    mut request: Request<Incoming>,
    remote: SocketAddr,
    gateway: Gateway,
    shutdown: CancellationToken,
    slot: Arc<ConnectionSlot>,
    tracker: TaskTracker,
) -> Response<Body> {
    // It sent its head: no longer evictable (it answers or upgrades now).
    slot.set_phase(Phase::Busy);
    let (key, owner) = match admit(&request, remote, &gateway).await {
        Ok(admitted) => admitted,
        Err(response) => return response,
    };
    // Authenticated: from here on it uses the share kept for authenticated sessions.
    slot.set_phase(Phase::Authenticated);
    let response = match switching_protocols(&key) {
        Ok(response) => response,
        Err(response) => return response,
    };
    let on_upgrade = hyper::upgrade::on(&mut request);
    tracker.spawn(run_upgraded(
        on_upgrade, gateway, owner, remote, shutdown, slot,
    ));
    response
}

/// The request's `Sec-WebSocket-Key` and the token's owner, if it is a WebSocket upgrade of
/// [`EXECUTOR_PATH`] with a `devices:connect` token agentd accepts; else the refusal.
#[allow(clippy::result_large_err)]
async fn admit(
    request: &Request<Incoming>,
    remote: SocketAddr,
    gateway: &Gateway,
) -> Result<(String, TokenCheckResponse), Response<Body>> {
    if request.uri().path() != EXECUTOR_PATH {
        return Err(refuse(
            StatusCode::NOT_FOUND,
            "not_found",
            format!("executors connect to {EXECUTOR_PATH}"),
        ));
    }
    if request.method() != Method::GET {
        return Err(refuse(
            StatusCode::METHOD_NOT_ALLOWED,
            "method_not_allowed",
            "use GET",
        ));
    }
    let Some(token) = bearer(request.headers()) else {
        let mut response = refuse(
            StatusCode::UNAUTHORIZED,
            "missing_token",
            "connect with Authorization: Bearer <devices:connect token> (agentworks login)",
        );
        response
            .headers_mut()
            .insert(WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        return Err(response);
    };
    let key = websocket_key(request.headers())?;
    let owner = match gateway.tokens.check(&token).await {
        Ok(owner) => owner,
        Err(error) => {
            tracing::info!(%remote, code = error.code(), "executor token refused at connect");
            return Err(refuse(error.status(), error.code(), error.to_string()));
        }
    };
    drop(token);
    Ok((key, owner))
}

/// The 101 answer to an upgrade with `key`, or the 500 when it cannot be built.
#[allow(clippy::result_large_err)]
fn switching_protocols(key: &str) -> Result<Response<Body>, Response<Body>> {
    let accept = derive_accept_key(key.as_bytes());
    Response::builder()
        .status(StatusCode::SWITCHING_PROTOCOLS)
        .header(UPGRADE, "websocket")
        .header(CONNECTION, "Upgrade")
        .header(SEC_WEBSOCKET_ACCEPT, accept)
        .body(Body::default())
        .map_err(|error| {
            refuse(
                StatusCode::INTERNAL_SERVER_ERROR,
                "internal",
                format!("cannot build the upgrade response: {error}"),
            )
        })
}

/// Once hyper hands over the upgraded connection, runs the session on it; the connection's
/// slot is held until the session ends.
async fn run_upgraded(
    on_upgrade: hyper::upgrade::OnUpgrade,
    gateway: Gateway,
    owner: TokenCheckResponse,
    remote: SocketAddr,
    shutdown: CancellationToken,
    slot: Arc<ConnectionSlot>,
) {
    match on_upgrade.await {
        Ok(upgraded) => {
            let ws = WebSocketStream::from_raw_socket(
                TokioIo::new(upgraded),
                Role::Server,
                Some(ws_config()),
            )
            .await;
            session(gateway, ws, owner, remote, shutdown).await;
        }
        Err(error) => tracing::debug!(%error, %remote, "executor upgrade failed"),
    }
    drop(slot);
}

/// How a session ended.
struct Ending {
    /// The close frame to send, if the connection is still writable.
    close: Option<(u16, String)>,
    /// Why the connection's pending requests fail.
    pending_reason: String,
    /// For the log and the audit event.
    why: String,
}

impl Ending {
    fn close(code: u16, reason: &str, pending_reason: &str) -> Ending {
        Ending {
            close: Some((code, reason.to_owned())),
            pending_reason: pending_reason.to_owned(),
            why: reason.to_owned(),
        }
    }

    fn policy(reason: impl Into<String>) -> Ending {
        let reason = reason.into();
        Ending {
            close: Some((CLOSE_POLICY, reason.clone())),
            pending_reason: DISCONNECTED.to_owned(),
            why: reason,
        }
    }

    fn lost(why: impl Into<String>) -> Ending {
        Ending {
            close: None,
            pending_reason: DISCONNECTED.to_owned(),
            why: why.into(),
        }
    }
}

const DISCONNECTED: &str = "the device disconnected while the request was pending; its outcome is unknown and it is not re-sent";

/// At most `max` bytes of `text`, cut at a character boundary.
fn truncate(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_owned();
    }
    let mut cut = max;
    while !text.is_char_boundary(cut) {
        cut -= 1;
    }
    text[..cut].to_owned()
}

/// Sends a close frame (best effort, bounded in time).
async fn send_close(ws: &mut Ws, code: u16, reason: &str) {
    let frame = CloseFrame {
        code: code.into(),
        reason: truncate(reason, MAX_CLOSE_REASON_BYTES).into(),
    };
    let _ = tokio::time::timeout(WRITE_TIMEOUT, ws.send(Message::Close(Some(frame)))).await;
}

/// Lets the peer answer our close (or go away), for at most [`CLOSE_DRAIN`].
async fn drain(ws: &mut Ws) {
    let _ = tokio::time::timeout(CLOSE_DRAIN, async {
        while let Some(Ok(_)) = ws.next().await {}
    })
    .await;
}

async fn send_frame(ws: &mut Ws, frame: &GatewayFrame) -> Result<(), String> {
    let text = serde_json::to_string(frame).map_err(|e| format!("cannot encode a frame: {e}"))?;
    match tokio::time::timeout(WRITE_TIMEOUT, ws.send(Message::text(text))).await {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) => Err(format!("cannot send a frame: {e}")),
        Err(_) => Err("the executor stopped reading".to_owned()),
    }
}

/// Waits for the hello; any other frame first is a policy error.
async fn read_hello(ws: &mut Ws) -> Result<(String, String, Vec<FolderInfo>), Ending> {
    loop {
        match ws.next().await {
            None => return Err(Ending::lost("disconnected before the hello")),
            Some(Err(error)) => return Err(read_error(error)),
            Some(Ok(Message::Text(text))) => {
                return match serde_json::from_str::<ExecutorFrame>(text.as_str()) {
                    Ok(ExecutorFrame::Hello {
                        device_name,
                        version,
                        folders,
                    }) => Ok((device_name, version, folders)),
                    Ok(_) => Err(Ending::policy("the first frame must be the hello")),
                    Err(_) => Err(Ending::policy("malformed frame")),
                };
            }
            Some(Ok(Message::Ping(_) | Message::Pong(_) | Message::Frame(_))) => {}
            Some(Ok(Message::Binary(_))) => {
                return Err(Ending::policy("binary frames are not part of the protocol"));
            }
            Some(Ok(Message::Close(_))) => return Err(Ending::lost("closed before the hello")),
        }
    }
}

fn read_error(error: tokio_tungstenite::tungstenite::Error) -> Ending {
    use tokio_tungstenite::tungstenite::Error;
    match error {
        Error::Capacity(_) => Ending {
            close: Some((1009, "frame too large".into())),
            pending_reason: DISCONNECTED.to_owned(),
            why: "frame too large".into(),
        },
        Error::Protocol(e) => Ending::policy(format!("protocol error: {e}")),
        Error::Utf8(_) => Ending::policy("invalid UTF-8"),
        other => Ending::lost(format!("read failed: {other}")),
    }
}

/// One executor connection after the upgrade: hello, register, serve, clean up.
async fn session(
    gateway: Gateway,
    mut ws: Ws,
    owner: TokenCheckResponse,
    remote: SocketAddr,
    shutdown: CancellationToken,
) {
    let Some((device_name, version, folders)) =
        accept_hello(&gateway, &mut ws, &owner, remote, &shutdown).await
    else {
        return;
    };
    let Some((device_id, name_clash)) =
        register_device(&gateway, &mut ws, &owner, &device_name, &folders, &version).await
    else {
        return;
    };
    let (conn_id, mut inbox) = go_live(
        &gateway,
        &owner,
        &device_id,
        &device_name,
        folders,
        remote,
        &version,
    );
    // After going live, so a disconnect racing with this take sees the new connection (see
    // `Gateway::release_lease`).
    if let Err(error) = gateway.take_lease(&device_id).await {
        tracing::error!(%error, %device_id, "cannot take the device's lease");
        end_session(
            &gateway,
            &mut ws,
            inbox,
            &owner,
            &device_id,
            conn_id,
            Ending::close(
                1011,
                "gatewayd cannot record the device's connection right now",
                DISCONNECTED,
            ),
        )
        .await;
        return;
    }
    let welcome = welcome(&gateway, &owner, &device_id, &device_name, name_clash);
    let ending = match send_frame(&mut ws, &welcome).await {
        Ok(()) => serve_session(&gateway, &mut ws, &mut inbox, conn_id, &shutdown).await,
        Err(why) => Ending::lost(why),
    };
    end_session(
        &gateway, &mut ws, inbox, &owner, &device_id, conn_id, ending,
    )
    .await;
}

/// The checked hello (device name, version, folders), or `None` once the connection was
/// refused: no hello in time, a bad one, or gatewayd shutting down (closed and drained).
async fn accept_hello(
    gateway: &Gateway,
    ws: &mut Ws,
    owner: &TokenCheckResponse,
    remote: SocketAddr,
    shutdown: &CancellationToken,
) -> Option<(String, String, Vec<FolderInfo>)> {
    let hello = tokio::select! {
        _ = shutdown.cancelled() => Err(Ending::close(CLOSE_GOING_AWAY, "gatewayd is shutting down", DISCONNECTED)),
        hello = tokio::time::timeout(gateway.settings.hello_timeout, read_hello(ws)) => match hello {
            Ok(hello) => hello,
            Err(_) => Err(Ending::policy("no hello within 10 s")),
        },
    };
    match hello.and_then(|h| {
        check_hello(&h.0, &h.1, &h.2)
            .map(|()| h)
            .map_err(Ending::policy)
    }) {
        Ok(hello) => Some(hello),
        Err(ending) => {
            tracing::info!(%remote, user_id = %owner.user_id, why = %ending.why, "executor refused before registering");
            if let Some((code, reason)) = &ending.close {
                send_close(ws, *code, reason).await;
                drain(ws).await;
            }
            None
        }
    }
}

/// The device's id and whether its name clashes with another credential's device, or `None`
/// once the store failed (the executor got a 1011 close).
///
/// The device id belongs to this credential: another token with the same name is another
/// device (a clash notice says so), never this one's id.
async fn register_device(
    gateway: &Gateway,
    ws: &mut Ws,
    owner: &TokenCheckResponse,
    device_name: &str,
    folders: &[FolderInfo],
    version: &str,
) -> Option<(String, bool)> {
    let store = gateway.store.clone();
    let (user_id, token_id, name, shared, ver) = (
        owner.user_id.clone(),
        owner.token_id.clone(),
        device_name.to_owned(),
        folders.to_vec(),
        version.to_owned(),
    );
    let registered = tokio::task::spawn_blocking(move || {
        store.register_device(&user_id, &token_id, &name, &shared, &ver, now_ms())
    })
    .await;
    let detail = match registered {
        Ok(Ok(registered)) => return Some((registered.device_id, registered.name_clash)),
        Ok(Err(e)) => e.to_string(),
        Err(e) => e.to_string(),
    };
    tracing::error!(error = %detail, "cannot register a device");
    send_close(ws, 1011, "gatewayd cannot register the device right now").await;
    None
}

/// Makes this connection the device's live one (an older connection of the same device is
/// told to close), audits the connect, and answers the connection's id and control inbox.
fn go_live(
    gateway: &Gateway,
    owner: &TokenCheckResponse,
    device_id: &str,
    device_name: &str,
    folders: Vec<FolderInfo>,
    remote: SocketAddr,
    version: &str,
) -> (u64, mpsc::UnboundedReceiver<Control>) {
    let conn_id = gateway.registry.next_conn_id();
    let (control, inbox) = mpsc::unbounded_channel();
    let live = Live {
        conn_id,
        user_id: owner.user_id.clone(),
        device_name: device_name.to_owned(),
        token_id: owner.token_id.clone(),
        folders,
        connected_at_ms: now_ms(),
        control,
    };
    if let Some(old) = gateway.registry.register(device_id, live) {
        let _ = old.control.send(Control::Close {
            code: CLOSE_REPLACED,
            reason: "replaced by a newer connection of the same device".into(),
            pending_reason: "the device reconnected while the request was pending; its outcome is unknown and it is not re-sent".into(),
        });
    }
    tracing::info!(
        target: AUDIT_TARGET,
        message_id = audit::EXECUTOR_CONNECTED,
        agentworks_event = "executor_connected",
        agentworks_user_id = %owner.user_id,
        agentworks_device_id = %device_id,
        agentworks_device_name = %device_name,
        agentworks_remote = %remote,
        agentworks_version = %version,
        "executor connected"
    );
    (conn_id, inbox)
}

/// The welcome frame: the device's id, the heartbeat, and a notice when its name clashes.
fn welcome(
    gateway: &Gateway,
    owner: &TokenCheckResponse,
    device_id: &str,
    device_name: &str,
    name_clash: bool,
) -> GatewayFrame {
    let notice = name_clash.then(|| {
        tracing::warn!(user_id = %owner.user_id, %device_id, "a device connected with the name of another credential's device; it got its own device id");
        format!(
            "another device of yours is already named \"{device_name}\" (it connected with another credential); this connection is a separate device, {device_id}, and never receives that device's requests: give it another --name to tell them apart"
        )
    });
    GatewayFrame::Welcome {
        device_id: device_id.to_owned(),
        heartbeat_secs: gateway.settings.heartbeat.as_secs(),
        notice,
        gateways: gateway.settings.advertised_urls.clone(),
        account: Some(owner.user_name.clone()),
    }
}

/// Cleanup, in order: nobody can dispatch to this connection any more; the executor learns
/// why (close frame); every request pending on it fails now; then the closing handshake.
async fn end_session(
    gateway: &Gateway,
    ws: &mut Ws,
    inbox: mpsc::UnboundedReceiver<Control>,
    owner: &TokenCheckResponse,
    device_id: &str,
    conn_id: u64,
    ending: Ending,
) {
    gateway.registry.unregister(device_id, conn_id);
    drop(inbox);
    if let Some((code, reason)) = &ending.close {
        send_close(ws, *code, reason).await;
    }
    let failed = gateway.registry.take_all_pending(conn_id);
    let failed_count = failed.len();
    for (request_id, pending) in failed {
        let state = DispatchState::Unknown {
            reason: ending.pending_reason.clone(),
        };
        gateway.resolve(request_id, pending, state).await;
    }
    gateway.release_lease(device_id).await;
    let store = gateway.store.clone();
    let id = device_id.to_owned();
    let _ = tokio::task::spawn_blocking(move || store.touch_device(&id, now_ms())).await;
    tracing::info!(
        target: AUDIT_TARGET,
        message_id = audit::EXECUTOR_DISCONNECTED,
        agentworks_event = "executor_disconnected",
        agentworks_user_id = %owner.user_id,
        agentworks_device_id = %device_id,
        agentworks_reason = %ending.why,
        agentworks_close_code = ending.close.as_ref().map(|(c, _)| *c),
        agentworks_failed_requests = failed_count,
        "executor disconnected"
    );
    if ending.close.is_some() {
        drain(ws).await;
    }
}

/// The registered session's loop: frames out, frames in, heartbeats, until it ends.
async fn serve_session(
    gateway: &Gateway,
    ws: &mut Ws,
    inbox: &mut mpsc::UnboundedReceiver<Control>,
    conn_id: u64,
    shutdown: &CancellationToken,
) -> Ending {
    let heartbeat = gateway.settings.heartbeat;
    let mut pings = tokio::time::interval_at(tokio::time::Instant::now() + heartbeat, heartbeat);
    pings.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut last_heard = Instant::now();
    loop {
        tokio::select! {
            biased;
            _ = shutdown.cancelled() => {
                return Ending::close(
                    CLOSE_GOING_AWAY,
                    "gatewayd is shutting down",
                    "gatewayd shut down while the request was pending; its outcome is unknown and it is not re-sent",
                );
            }
            control = inbox.recv() => match control {
                Some(Control::Frame(frame)) => {
                    if let Err(why) = send_frame(ws, &frame).await {
                        return Ending::lost(why);
                    }
                }
                Some(Control::Close { code, reason, pending_reason }) => {
                    return Ending::close(code, &reason, &pending_reason);
                }
                // Only the registry holds the sender; gone means replaced.
                None => return Ending::close(CLOSE_REPLACED, "replaced by a newer connection", DISCONNECTED),
            },
            message = ws.next() => {
                let message = match message {
                    None => return Ending::lost("the executor disconnected"),
                    Some(Err(error)) => return read_error(error),
                    Some(Ok(message)) => message,
                };
                last_heard = Instant::now();
                match message {
                    Message::Text(text) => {
                        if let Err(ending) = handle_text(gateway, conn_id, text.as_str()).await {
                            return ending;
                        }
                    }
                    Message::Binary(_) => {
                        return Ending::policy("binary frames are not part of the protocol");
                    }
                    Message::Close(_) => return Ending::lost("the executor closed the connection"),
                    Message::Ping(_) | Message::Pong(_) | Message::Frame(_) => {}
                }
            }
            _ = pings.tick() => {
                if last_heard.elapsed() > heartbeat * 3 {
                    return Ending::lost("no frame or pong within three heartbeats");
                }
                match tokio::time::timeout(WRITE_TIMEOUT, ws.send(Message::Ping(Default::default()))).await {
                    Ok(Ok(())) => {}
                    _ => return Ending::lost("cannot send a heartbeat"),
                }
            }
        }
    }
}

/// One text frame from a registered executor.
async fn handle_text(gateway: &Gateway, conn_id: u64, text: &str) -> Result<(), Ending> {
    let frame = serde_json::from_str::<ExecutorFrame>(text)
        .map_err(|_| Ending::policy("malformed frame"))?;
    match frame {
        ExecutorFrame::Hello { .. } => Err(Ending::policy("the hello was already sent")),
        ExecutorFrame::Accepted { request_id } => {
            if !gateway.registry.is_pending_on(&request_id, conn_id) {
                tracing::debug!(
                    conn_id,
                    "accepted frame for a request not pending on this connection; ignored"
                );
            }
            Ok(())
        }
        ExecutorFrame::Result {
            request_id,
            outcome,
        } => {
            match gateway.registry.take_pending(&request_id, Some(conn_id)) {
                Some(pending) => {
                    gateway
                        .resolve(request_id, pending, DispatchState::Done { outcome })
                        .await;
                }
                None => tracing::warn!(
                    conn_id,
                    "result for a request not pending on this connection (late or foreign); ignored"
                ),
            }
            Ok(())
        }
        ExecutorFrame::Receipt {
            request_id,
            receipt,
        } => {
            if !gateway
                .registry
                .answer_receipt(&request_id, conn_id, receipt)
            {
                tracing::warn!(
                    conn_id,
                    "receipt for a query not sent on this connection (late or foreign); ignored"
                );
            }
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hyper::header::AUTHORIZATION;

    #[test]
    fn bearer_tokens_are_parsed_strictly() {
        let mut headers = HeaderMap::new();
        assert_eq!(bearer(&headers), None);
        headers.insert(AUTHORIZATION, HeaderValue::from_static("Bearer aw_abc.def"));
        assert_eq!(bearer(&headers).as_deref(), Some("aw_abc.def"));
        headers.insert(
            AUTHORIZATION,
            HeaderValue::from_static("Basic Zm9vOmJhcg=="),
        );
        assert_eq!(bearer(&headers), None);
        headers.insert(AUTHORIZATION, HeaderValue::from_static("Bearer "));
        assert_eq!(bearer(&headers), None);
        headers.insert(AUTHORIZATION, HeaderValue::from_static("Bearer a b"));
        assert_eq!(bearer(&headers), None);
        headers.append(AUTHORIZATION, HeaderValue::from_static("Bearer x"));
        assert_eq!(bearer(&headers), None);
    }

    #[test]
    fn close_reasons_fit_a_frame() {
        let long = "é".repeat(100);
        let cut = truncate(&long, MAX_CLOSE_REASON_BYTES);
        assert!(cut.len() <= MAX_CLOSE_REASON_BYTES);
        assert!(long.starts_with(&cut));
    }
}
