//! The HTTP/1.1 server side of a daemon's listeners: accept loop, per-connection tasks, peer
//! credentials, body limits and graceful shutdown.
//!
//! Two servers share the per-request plumbing:
//!
//! - [`serve`], for the Unix sockets (`workspaced.sock`, `agentd.sock`, `gatewayd.sock`): a
//!   semaphore bounds concurrent connections, each peer's credentials come from
//!   `SO_PEERCRED`, a body over the limit gets a 413 envelope before the handler runs. Its
//!   callers are peer-checked, so it trusts nothing else about them and needs nothing more.
//! - [`serve_public`], for a public TCP listener, where every byte is hostile until checked: a
//!   [`ConnectionTable`] bounds connections per client address and keeps a share of them for
//!   authenticated requests (evicting connections that only wait); a [`Screen`] supplied by
//!   the daemon decides from the request *head alone* whether it carries a verified
//!   credential, and so how large a body it may send, before a byte of the body is read;
//!   bodies are read under one byte budget shared by every connection (a flood waits for it,
//!   or gets 503; it never grows the heap), with header and body read timeouts and a minimum
//!   body rate. A body refused while being read (413, 400, 408, 503) is a [`BodyRefusal`]
//!   that the screen writes out ([`Screen::body_refusal`]: the error envelope unless the
//!   endpoint speaks a protocol of its own, as `/mcp` does JSON-RPC).
//!
//! Also the [`PeerPolicy`] a daemon checks Unix-socket credentials against.
//!
//! Must never serve a connection whose credentials it could not read, never read a body
//! before its head was screened, and never route or authorize endpoints itself: the handler
//! receives the peer and decides.

use std::collections::BTreeSet;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Limited};
use hyper::body::{Body as _, Frame, Incoming, SizeHint};
use hyper::header::{CONNECTION, CONTENT_LENGTH, HeaderValue, RETRY_AFTER};
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::connections::{ConnectionLimits, ConnectionSlot, ConnectionTable, Phase, Refusal};
use super::envelope::{self, Body, error_response};

/// Who is on the other end of a connection, from `SO_PEERCRED` at connect time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Peer {
    /// The peer's effective uid.
    pub uid: u32,
    /// The peer's effective gid.
    pub gid: u32,
    /// The peer's pid (0 if the kernel did not report one).
    pub pid: i32,
}

/// Limits of one server.
#[derive(Debug, Clone, Copy)]
pub struct ServerLimits {
    /// Connections served at once; further ones wait in the listen backlog.
    pub max_connections: usize,
    /// Request bodies larger than this get a 413 `too_large` envelope.
    pub max_body_bytes: usize,
}

/// How long a connection may take to send a request's headers.
const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(30);
/// First and longest pause after a failed accept (e.g. out of file descriptors).
const ACCEPT_BACKOFF_MIN: Duration = Duration::from_millis(10);
const ACCEPT_BACKOFF_MAX: Duration = Duration::from_secs(1);

/// Serves `listener` until `shutdown` is cancelled.
///
/// Accept loop: a semaphore bounds concurrent connections to `max_connections`; accept errors
/// back off (10 ms doubling to 1 s) instead of spinning; each connection gets its [`Peer`] from
/// `SO_PEERCRED` and runs in its own task tracked by a `TaskTracker`; a connection whose
/// credentials cannot be read is closed. On `shutdown`: stop accepting, let in-flight requests
/// finish (hyper graceful shutdown per connection; idle keep-alive connections close at once),
/// then return once all tasks are done.
///
/// Bodies larger than `max_body_bytes` get a 413 envelope (code `too_large`) without calling
/// the handler; the handler receives the collected body bytes.
pub async fn serve<L, H, F>(
    listener: L,
    handler: H,
    shutdown: CancellationToken,
    limits: ServerLimits,
) where
    L: Accept,
    H: Fn(L::Peer, hyper::http::request::Parts, Bytes) -> F + Clone + Send + Sync + 'static,
    F: std::future::Future<Output = Response<Body>> + Send + 'static,
{
    let permits = Arc::new(Semaphore::new(limits.max_connections.max(1)));
    let tracker = TaskTracker::new();
    let mut acceptor = Acceptor::new(listener);
    loop {
        let permit = tokio::select! {
            _ = shutdown.cancelled() => break,
            permit = permits.clone().acquire_owned() => match permit {
                Ok(permit) => permit,
                Err(_) => break, // never closed; treat as shutdown
            },
        };
        let Some((stream, peer)) = acceptor.next(&shutdown).await else {
            break;
        };
        let handler = handler.clone();
        let shutdown = shutdown.clone();
        tracker.spawn(async move {
            serve_connection(stream, peer, handler, shutdown, limits.max_body_bytes).await;
            drop(permit);
        });
    }
    drop(acceptor);
    tracker.close();
    tracker.wait().await;
}

/// What one accept produced: a connection with its peer, or a connection we closed at once.
pub enum Accepted<S, P> {
    Connection(S, P),
    /// Accepted and closed (for example: its credentials could not be read).
    Dropped,
}

/// A listener `serve` can run: Unix sockets (peer = `SO_PEERCRED`) and TCP (peer = address).
pub trait Accept: Send + 'static {
    type Stream: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static;
    type Peer: std::fmt::Debug + Copy + Send + Sync + 'static;
    fn accept(
        &self,
    ) -> impl std::future::Future<Output = std::io::Result<Accepted<Self::Stream, Self::Peer>>> + Send;
}

impl Accept for tokio::net::UnixListener {
    type Stream = tokio::net::UnixStream;
    type Peer = Peer;
    async fn accept(&self) -> std::io::Result<Accepted<Self::Stream, Peer>> {
        let (stream, _) = tokio::net::UnixListener::accept(self).await?;
        match stream.peer_cred() {
            Ok(cred) => Ok(Accepted::Connection(
                stream,
                Peer {
                    uid: cred.uid(),
                    gid: cred.gid(),
                    pid: cred.pid().unwrap_or(0),
                },
            )),
            Err(error) => {
                // Without credentials there is nobody to authorize: close it.
                tracing::warn!(%error, "cannot read peer credentials; closing connection");
                Ok(Accepted::Dropped)
            }
        }
    }
}

impl Accept for tokio::net::TcpListener {
    type Stream = tokio::net::TcpStream;
    type Peer = std::net::SocketAddr;
    async fn accept(&self) -> std::io::Result<Accepted<Self::Stream, Self::Peer>> {
        let (stream, address) = tokio::net::TcpListener::accept(self).await?;
        let _ = stream.set_nodelay(true);
        Ok(Accepted::Connection(stream, address))
    }
}

/// Every accept loop's one way to take the next connection (the Unix sockets', the public
/// listener's and gatewayd's executor listener): a failed accept (for example, out of file
/// descriptors) backs off, 10 ms doubling to 1 s, instead of spinning; a success resets it.
pub struct Acceptor<L> {
    listener: L,
    backoff: Duration,
}

impl<L: Accept> Acceptor<L> {
    pub fn new(listener: L) -> Acceptor<L> {
        Acceptor {
            listener,
            backoff: ACCEPT_BACKOFF_MIN,
        }
    }

    /// The next connection and its peer, or `None` once `shutdown` is cancelled.
    pub async fn next(&mut self, shutdown: &CancellationToken) -> Option<(L::Stream, L::Peer)> {
        loop {
            let accepted = tokio::select! {
                _ = shutdown.cancelled() => return None,
                accepted = self.listener.accept() => accepted,
            };
            match accepted {
                Ok(Accepted::Connection(stream, peer)) => {
                    self.backoff = ACCEPT_BACKOFF_MIN;
                    return Some((stream, peer));
                }
                Ok(Accepted::Dropped) => continue,
                Err(error) => {
                    let backoff = self.backoff;
                    tracing::warn!(%error, ?backoff, "accept failed; backing off");
                    tokio::select! {
                        _ = shutdown.cancelled() => return None,
                        _ = tokio::time::sleep(backoff) => {}
                    }
                    self.backoff = (backoff * 2).min(ACCEPT_BACKOFF_MAX);
                }
            }
        }
    }
}

/// Admits a new TCP connection to `table`; one it cannot take (its address over its limit
/// with nothing to evict) gets its 503 at once and `None`, and closes when dropped.
pub fn admit_or_refuse(
    table: &ConnectionTable,
    stream: &tokio::net::TcpStream,
    address: SocketAddr,
) -> Option<ConnectionSlot> {
    match table.admit(address.ip()) {
        Ok(slot) => Some(slot),
        Err(refusal) => {
            tracing::debug!(%address, %refusal, "connection refused");
            refuse_connection(stream, refusal);
            None
        }
    }
}

async fn serve_connection<S, P, H, F>(
    stream: S,
    peer: P,
    handler: H,
    shutdown: CancellationToken,
    max_body_bytes: usize,
) where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    P: std::fmt::Debug + Copy + Send + Sync + 'static,
    H: Fn(P, hyper::http::request::Parts, Bytes) -> F + Clone + Send + Sync + 'static,
    F: std::future::Future<Output = Response<Body>> + Send + 'static,
{
    let service = hyper::service::service_fn(move |request: Request<Incoming>| {
        let handler = handler.clone();
        async move { Ok::<_, Infallible>(handle_request(request, peer, handler, max_body_bytes).await) }
    });
    let connection = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(HEADER_READ_TIMEOUT)
        .serve_connection(TokioIo::new(stream), service);
    let mut connection = std::pin::pin!(connection);
    let result = tokio::select! {
        result = connection.as_mut() => result,
        _ = shutdown.cancelled() => {
            connection.as_mut().graceful_shutdown();
            connection.await
        }
    };
    if let Err(error) = result {
        tracing::debug!(%error, ?peer, "connection ended with an error");
    }
}

/// Applies the body limit, then calls the handler.
async fn handle_request<P, H, F>(
    request: Request<Incoming>,
    peer: P,
    handler: H,
    max_body_bytes: usize,
) -> Response<Body>
where
    H: Fn(P, hyper::http::request::Parts, Bytes) -> F,
    F: std::future::Future<Output = Response<Body>>,
{
    let (parts, body) = request.into_parts();
    let declared = parts
        .headers
        .get(CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|len| len > max_body_bytes as u64) {
        return too_large(max_body_bytes);
    }
    let bytes = match Limited::new(body, max_body_bytes).collect().await {
        Ok(collected) => collected.to_bytes(),
        Err(error) => {
            if error
                .downcast_ref::<http_body_util::LengthLimitError>()
                .is_some()
            {
                return too_large(max_body_bytes);
            }
            return BodyRefusal::unreadable(&error).envelope();
        }
    };
    handler(peer, parts, bytes).await
}

/// The 413 envelope. The connection is closed after it, since the unread rest of the body
/// would otherwise be parsed as the next request.
fn too_large(max_body_bytes: usize) -> Response<Body> {
    closing(BodyRefusal::too_large(max_body_bytes).envelope())
}

/// Why a request's body was not read to the end (after its head passed the screen): the
/// status, the stable code and message, and the details of its error envelope. A public
/// listener lets its [`Screen`] spell the answer ([`Screen::body_refusal`]), since an endpoint
/// may have a protocol of its own (agentd's `/mcp` answers a JSON-RPC request with a JSON-RPC
/// error); the server then adds the headers the refusal needs (`Connection: close`, and
/// `Retry-After` when [`BodyRefusal::retry_after_secs`] says so).
#[derive(Debug, Clone, PartialEq)]
pub struct BodyRefusal {
    /// 413, 400, 408 or 503.
    pub status: StatusCode,
    /// Stable, snake_case: `too_large`, `bad_request`, `body_timeout`, `busy`.
    pub code: &'static str,
    /// What happened, for a person.
    pub message: String,
    /// The envelope's extra fields (e.g. `max_body_bytes`).
    pub details: serde_json::Map<String, serde_json::Value>,
    /// The `Retry-After` the answer carries, in seconds, if any.
    pub retry_after_secs: Option<u32>,
}

impl BodyRefusal {
    /// 413: the body is larger than `max_body_bytes`.
    pub fn too_large(max_body_bytes: usize) -> BodyRefusal {
        let mut details = serde_json::Map::new();
        details.insert("max_body_bytes".into(), serde_json::json!(max_body_bytes));
        BodyRefusal {
            status: StatusCode::PAYLOAD_TOO_LARGE,
            code: "too_large",
            message: format!("the request body is larger than {max_body_bytes} bytes"),
            details,
            retry_after_secs: None,
        }
    }

    /// 400: the body could not be read (a broken chunked encoding, say).
    fn unreadable(error: &dyn std::fmt::Display) -> BodyRefusal {
        BodyRefusal {
            status: StatusCode::BAD_REQUEST,
            code: "bad_request",
            message: format!("cannot read the request body: {error}"),
            details: serde_json::Map::new(),
            retry_after_secs: None,
        }
    }

    /// The agentworks error envelope for this refusal (without the headers the server adds).
    pub fn envelope(self) -> Response<Body> {
        error_response(self.status, self.code, self.message, self.details)
    }
}

// ----- the public listener -----

/// What a public listener learns from a request's head, before it reads a byte of the body.
pub enum Verdict {
    /// The head carries a verified credential (and, where the endpoint checks one, an allowed
    /// `Origin`): the body may be up to `max_body_bytes` (the endpoint's own limit).
    Authenticated { max_body_bytes: usize },
    /// No verified credential: the body may be at most
    /// [`PublicLimits::max_anonymous_body_bytes`]; the handler decides what to answer
    /// (device login, metadata, health, 404).
    Anonymous,
    /// Refused from the head alone (a missing or bad token, a forbidden `Origin`): this answer
    /// is sent without reading the body, and the connection closes after it.
    Refused(Response<Body>),
}

/// Decides, from a request's head alone, whether it carries a verified credential and how
/// large a body that allows. The daemon supplies it: it knows its routes and its tokens.
/// The handler still authenticates the request itself; the screen only decides what the
/// server does before the handler runs.
pub trait Screen: Send + Sync + 'static {
    fn screen(
        &self,
        head: &hyper::http::request::Parts,
    ) -> impl std::future::Future<Output = Verdict> + Send;

    /// The answer to a request whose head passed but whose body was refused (413, 400, 408,
    /// 503): by default the error envelope. The server adds `Connection: close` and any
    /// `Retry-After` to whatever this returns.
    fn body_refusal(
        &self,
        head: &hyper::http::request::Parts,
        refusal: BodyRefusal,
    ) -> Response<Body> {
        let _ = head;
        refusal.envelope()
    }
}

/// Largest body of a request without a verified credential (device login, OAuth).
pub const MAX_ANONYMOUS_BODY_BYTES: usize = 64 * 1024;
/// How long a public connection may take to send a request's head (including the idle time
/// before it, on a kept-alive connection).
pub const PUBLIC_HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);
/// The body read deadline: this long, plus one second for every
/// [`PUBLIC_BODY_MIN_BYTES_PER_SEC`] bytes received (Apache's `mod_reqtimeout` rule).
pub const PUBLIC_BODY_READ_GRACE: Duration = Duration::from_secs(10);
/// The slowest body rate a public connection may keep up after the grace period.
pub const PUBLIC_BODY_MIN_BYTES_PER_SEC: u64 = 1024;
/// How long a request waits for its share of the body budget before it gets 503.
pub const PUBLIC_BODY_BUDGET_WAIT: Duration = Duration::from_secs(10);
/// hyper's read buffer per public connection: bounds what a connection that never ends its
/// headers can make us hold (hyper's default is ~400 KiB).
const PUBLIC_READ_BUFFER_BYTES: usize = 64 * 1024;

/// Limits of one public listener.
#[derive(Debug, Clone, Copy)]
pub struct PublicLimits {
    /// Connections in all, per client address, and the share kept for authenticated
    /// requests.
    pub connections: ConnectionLimits,
    /// See [`Verdict::Anonymous`].
    pub max_anonymous_body_bytes: usize,
    /// Bytes of all request bodies being read or handled at once; no single body may be
    /// larger.
    pub body_budget_bytes: usize,
    /// See [`PUBLIC_BODY_BUDGET_WAIT`].
    pub body_budget_wait: Duration,
    /// See [`PUBLIC_HEADER_READ_TIMEOUT`].
    pub header_read_timeout: Duration,
    /// See [`PUBLIC_BODY_READ_GRACE`].
    pub body_read_grace: Duration,
    /// See [`PUBLIC_BODY_MIN_BYTES_PER_SEC`].
    pub body_min_bytes_per_sec: u64,
}

impl PublicLimits {
    /// The given connection bounds and body budget with the default timeouts and caps.
    pub fn new(connections: ConnectionLimits, body_budget_bytes: usize) -> PublicLimits {
        PublicLimits {
            connections,
            max_anonymous_body_bytes: MAX_ANONYMOUS_BODY_BYTES,
            body_budget_bytes: body_budget_bytes.max(MAX_ANONYMOUS_BODY_BYTES),
            body_budget_wait: PUBLIC_BODY_BUDGET_WAIT,
            header_read_timeout: PUBLIC_HEADER_READ_TIMEOUT,
            body_read_grace: PUBLIC_BODY_READ_GRACE,
            body_min_bytes_per_sec: PUBLIC_BODY_MIN_BYTES_PER_SEC,
        }
    }
}

/// Serves a public TCP listener until `shutdown` is cancelled.
///
/// In order, for every connection: wait until the [`ConnectionTable`] has a slot a newcomer
/// could use (free, or held by a connection that only waits), so that while every slot is
/// working new connections queue in the listen backlog; accept; admit it to the table (its
/// address over its limit with nothing to evict → a 503 written without blocking, and
/// close); serve it in its own task, which closes it at once if the table evicts it. For
/// every request: screen the head ([`Screen`]); a refusal is answered without reading the
/// body; otherwise the body is read within its limit (413), under the shared byte budget
/// (503 after [`PublicLimits::body_budget_wait`]) and the read timeout and minimum rate
/// (408), then the handler runs, and the body's share of the budget is given back when the
/// handler returns. On `shutdown`: stop accepting, close the connections that only wait, let
/// in-flight requests finish, return once every connection task has.
pub async fn serve_public<S, H, F>(
    listener: tokio::net::TcpListener,
    screen: Arc<S>,
    handler: H,
    shutdown: CancellationToken,
    limits: PublicLimits,
) where
    S: Screen,
    H: Fn(SocketAddr, hyper::http::request::Parts, Bytes) -> F + Clone + Send + Sync + 'static,
    F: std::future::Future<Output = Response<Body>> + Send + 'static,
{
    let table = ConnectionTable::new(limits.connections);
    let budget = Arc::new(Semaphore::new(limits.body_budget_bytes));
    let tracker = TaskTracker::new();
    let mut acceptor = Acceptor::new(listener);
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => break,
            _ = table.room() => {}
        }
        let Some((stream, address)) = acceptor.next(&shutdown).await else {
            break;
        };
        let Some(slot) = admit_or_refuse(&table, &stream, address) else {
            continue;
        };
        let connection = PublicConnection {
            peer: address,
            slot: Arc::new(slot),
            screen: screen.clone(),
            handler: handler.clone(),
            budget: budget.clone(),
            limits,
        };
        tracker.spawn(connection.serve(stream, shutdown.clone()));
    }
    drop(acceptor);
    // In-flight requests finish; connections that only wait (or trickle headers) close now.
    table.evict_waiting();
    tracker.close();
    tracker.wait().await;
}

/// Writes a 503 envelope for a connection that was not admitted, without waiting (a fresh
/// socket's send buffer takes it whole), and lets the caller drop (close) the socket.
pub fn refuse_connection(stream: &tokio::net::TcpStream, refusal: Refusal) {
    let body =
        serde_json::json!({"error": {"code": refusal.code(), "message": refusal.to_string()}})
            .to_string();
    let response = format!(
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\ncontent-length: {}\r\nretry-after: 1\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    let _ = stream.try_write(response.as_bytes());
}

/// One admitted public connection and what its requests need.
struct PublicConnection<S, H> {
    peer: SocketAddr,
    slot: Arc<ConnectionSlot>,
    screen: Arc<S>,
    handler: H,
    budget: Arc<Semaphore>,
    limits: PublicLimits,
}

/// A hyper server connection that can be asked to finish its request and close: a plain
/// HTTP/1 connection or one that may upgrade (the executor WebSocket).
pub trait Drainable: std::future::Future<Output = Result<(), hyper::Error>> {
    fn drain(self: Pin<&mut Self>);
}

impl<I, S, B> Drainable for hyper::server::conn::http1::Connection<I, S>
where
    S: hyper::service::HttpService<Incoming, ResBody = B>,
    S::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    I: hyper::rt::Read + hyper::rt::Write + Unpin,
    B: hyper::body::Body + 'static,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    fn drain(self: Pin<&mut Self>) {
        self.graceful_shutdown();
    }
}

impl<I, S, B> Drainable for hyper::server::conn::http1::UpgradeableConnection<I, S>
where
    S: hyper::service::HttpService<Incoming, ResBody = B>,
    S::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    I: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
    B: hyper::body::Body + 'static,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    fn drain(self: Pin<&mut Self>) {
        self.graceful_shutdown();
    }
}

/// How [`serve_until_evicted`] ended.
pub enum Served {
    /// The connection ran to its end (after a graceful drain, at shutdown).
    Ended(Result<(), hyper::Error>),
    /// Its slot was evicted while it only waited (to make room, or at shutdown); the
    /// connection was dropped, which closes the socket.
    Evicted,
}

/// Serves `connection` until it ends; at `shutdown` it is drained (the request in progress
/// finishes), and an eviction of its slot while it only waits drops it at once.
pub async fn serve_until_evicted<C: Drainable>(
    connection: C,
    evicted: &CancellationToken,
    shutdown: &CancellationToken,
) -> Served {
    let mut connection = std::pin::pin!(connection);
    tokio::select! {
        result = connection.as_mut() => Served::Ended(result),
        _ = evicted.cancelled() => Served::Evicted,
        _ = shutdown.cancelled() => {
            connection.as_mut().drain();
            tokio::select! {
                result = connection.as_mut() => Served::Ended(result),
                // The server evicts every waiting connection at shutdown.
                _ = evicted.cancelled() => Served::Evicted,
            }
        }
    }
}

impl<S, H> Clone for PublicConnection<S, H>
where
    H: Clone,
{
    fn clone(&self) -> Self {
        PublicConnection {
            peer: self.peer,
            slot: self.slot.clone(),
            screen: self.screen.clone(),
            handler: self.handler.clone(),
            budget: self.budget.clone(),
            limits: self.limits,
        }
    }
}

impl<S, H, F> PublicConnection<S, H>
where
    S: Screen,
    H: Fn(SocketAddr, hyper::http::request::Parts, Bytes) -> F + Clone + Send + Sync + 'static,
    F: std::future::Future<Output = Response<Body>> + Send + 'static,
{
    async fn serve(self, stream: tokio::net::TcpStream, shutdown: CancellationToken) {
        let evicted = self.slot.evicted().clone();
        let (peer, header_read_timeout) = (self.peer, self.limits.header_read_timeout);
        let service = hyper::service::service_fn(move |request: Request<Incoming>| {
            let connection = self.clone();
            async move { Ok::<_, Infallible>(connection.request(request).await) }
        });
        let connection = hyper::server::conn::http1::Builder::new()
            .timer(TokioTimer::new())
            .header_read_timeout(header_read_timeout)
            .max_buf_size(PUBLIC_READ_BUFFER_BYTES)
            .serve_connection(TokioIo::new(stream), service);
        match serve_until_evicted(connection, &evicted, &shutdown).await {
            Served::Evicted => tracing::debug!(%peer, "waiting connection evicted to make room"),
            Served::Ended(Err(error)) => {
                tracing::debug!(%error, %peer, "connection ended with an error")
            }
            Served::Ended(Ok(())) => {}
        }
    }

    /// Screens the head, reads the body within its limits, runs the handler.
    async fn request(self, request: Request<Incoming>) -> Response<Body> {
        // Not evictable while we look at its head: it has sent one.
        self.slot.set_phase(Phase::Busy);
        let (parts, body) = request.into_parts();
        let (max_body_bytes, authenticated) = match self.screen.screen(&parts).await {
            Verdict::Refused(response) => return self.answer(closing(response)),
            Verdict::Authenticated { max_body_bytes } => {
                self.slot.set_phase(Phase::Authenticated);
                (max_body_bytes, true)
            }
            Verdict::Anonymous => (self.limits.max_anonymous_body_bytes, false),
        };
        let max_body_bytes = max_body_bytes.min(self.limits.body_budget_bytes);
        if !authenticated && !body.is_end_stream() {
            // A slow anonymous body is as evictable as slow headers.
            self.slot.set_phase(Phase::ReadingAnonymousBody);
        }
        let read = read_public_body(body, &parts, max_body_bytes, &self.budget, &self.limits).await;
        let (bytes, budget_share) = match read {
            Ok(read) => read,
            Err(refusal) => {
                let retry_after = refusal.retry_after_secs;
                let mut response = self.screen.body_refusal(&parts, refusal);
                if let Some(secs) = retry_after {
                    response
                        .headers_mut()
                        .insert(RETRY_AFTER, HeaderValue::from(secs));
                }
                return self.answer(closing(response));
            }
        };
        if !authenticated {
            self.slot.set_phase(Phase::Busy);
        }
        let response = (self.handler)(self.peer, parts, bytes).await;
        drop(budget_share);
        self.answer(response)
    }

    /// The response, with a body that marks the connection waiting again once it is sent.
    fn answer(&self, response: Response<Body>) -> Response<Body> {
        let slot = self.slot.clone();
        response.map(|body| {
            SlotReleasingBody {
                inner: body,
                slot: Some(slot),
            }
            .boxed_unsync()
        })
    }
}

/// A response body that moves its connection back to [`Phase::Waiting`] when it is dropped
/// (sent, or the connection went away): until then the connection is working, even while a
/// streamed answer (server-sent events) is still being written.
struct SlotReleasingBody {
    inner: Body,
    slot: Option<Arc<ConnectionSlot>>,
}

impl hyper::body::Body for SlotReleasingBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

impl Drop for SlotReleasingBody {
    fn drop(&mut self) {
        if let Some(slot) = self.slot.take() {
            slot.set_phase(Phase::Waiting);
        }
    }
}

/// The response with `Connection: close`: after it, the unread rest of a body (or a refused
/// peer's next request) must not be parsed on this connection.
fn closing(mut response: Response<Body>) -> Response<Body> {
    response
        .headers_mut()
        .insert(CONNECTION, HeaderValue::from_static("close"));
    response
}

/// Reads a public request's body: at most `max_body_bytes` (413 as soon as the declared
/// length or the bytes received say more), its size held in `budget` (the declared length up
/// front, in one fair wait; a chunked body in steps as it arrives) and never read faster than
/// the budget allows (503 after the budget wait), within the read deadline (408). Returns the
/// bytes and their share of the budget, to be dropped when the handler is done with them.
async fn read_public_body(
    mut body: Incoming,
    parts: &hyper::http::request::Parts,
    max_body_bytes: usize,
    budget: &Arc<Semaphore>,
    limits: &PublicLimits,
) -> Result<(Bytes, Option<OwnedSemaphorePermit>), BodyRefusal> {
    if body.is_end_stream() {
        return Ok((Bytes::new(), None));
    }
    let declared = parts
        .headers
        .get(CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|len| len > max_body_bytes as u64) {
        return Err(BodyRefusal::too_large(max_body_bytes));
    }
    let budget_deadline = tokio::time::Instant::now() + limits.body_budget_wait;
    let mut share: Option<OwnedSemaphorePermit> = None;
    let mut reserved = 0usize;
    if let Some(len) = declared {
        // hyper ends the body at exactly the declared length, so this is all it can need.
        let len = len as usize;
        share = Some(reserve_budget(budget, len, budget_deadline).await?);
        reserved = len;
    }
    let mut collected: Vec<u8> = Vec::with_capacity(declared.unwrap_or(0) as usize);
    // The clock starts once the budget is ours: waiting for it is not the client's fault.
    let read_started = tokio::time::Instant::now();
    let min_rate = limits.body_min_bytes_per_sec.max(1) as f64;
    loop {
        let allowed =
            limits.body_read_grace + Duration::from_secs_f64(collected.len() as f64 / min_rate);
        let frame = match tokio::time::timeout_at(read_started + allowed, body.frame()).await {
            Err(_) => return Err(body_too_slow(limits)),
            Ok(None) => break,
            Ok(Some(Err(error))) => return Err(BodyRefusal::unreadable(&error)),
            Ok(Some(Ok(frame))) => frame,
        };
        let Ok(data) = frame.into_data() else {
            continue; // trailers
        };
        let total = collected.len() + data.len();
        if total > max_body_bytes {
            return Err(BodyRefusal::too_large(max_body_bytes));
        }
        if total > reserved {
            // A chunked body: reserve in steps of at least 256 KiB, never past the limit.
            let step = (total - reserved)
                .max(256 * 1024)
                .min(max_body_bytes - reserved);
            let more = reserve_budget(budget, step, budget_deadline).await?;
            match share.as_mut() {
                Some(share) => share.merge(more),
                None => share = Some(more),
            }
            reserved += step;
        }
        collected.extend_from_slice(&data);
    }
    Ok((Bytes::from(collected), share))
}

/// `bytes` of the body budget, waiting until `deadline` at most.
async fn reserve_budget(
    budget: &Arc<Semaphore>,
    bytes: usize,
    deadline: tokio::time::Instant,
) -> Result<OwnedSemaphorePermit, BodyRefusal> {
    let permits = u32::try_from(bytes).unwrap_or(u32::MAX);
    match tokio::time::timeout_at(deadline, budget.clone().acquire_many_owned(permits)).await {
        Ok(Ok(permit)) => Ok(permit),
        // Timed out, or (never) closed.
        _ => Err(BodyRefusal {
            status: StatusCode::SERVICE_UNAVAILABLE,
            code: "busy",
            message:
                "the server is reading as many request bodies as it holds at once; retry shortly"
                    .to_owned(),
            details: serde_json::Map::new(),
            retry_after_secs: Some(1),
        }),
    }
}

/// The 408 refusal for a body that did not keep up the minimum rate.
fn body_too_slow(limits: &PublicLimits) -> BodyRefusal {
    let mut details = serde_json::Map::new();
    details.insert(
        "min_bytes_per_sec".into(),
        serde_json::json!(limits.body_min_bytes_per_sec),
    );
    BodyRefusal {
        status: StatusCode::REQUEST_TIMEOUT,
        code: "body_timeout",
        message: format!(
            "the request body arrived too slowly: after {} s it must keep up {} bytes per second",
            limits.body_read_grace.as_secs(),
            limits.body_min_bytes_per_sec
        ),
        details,
        retry_after_secs: None,
    }
}

/// Which uids may call a socket: root, our own uid, and named users.
#[derive(Debug, Clone)]
pub struct PeerPolicy {
    allowed: BTreeSet<u32>,
}

impl PeerPolicy {
    /// Allows root, our own uid, and the uids of `names`, resolved now with `getpwnam`; names
    /// that do not exist are skipped with a warning (so a config listing a user that is only
    /// created later does not stop the daemon, but that user is not allowed until restart).
    pub fn for_users(names: &[String]) -> PeerPolicy {
        let mut uids = Vec::with_capacity(names.len());
        for name in names {
            match nix::unistd::User::from_name(name) {
                Ok(Some(user)) => uids.push(user.uid.as_raw()),
                Ok(None) => {
                    tracing::warn!(user = %name, "allowed user does not exist; skipping it");
                }
                Err(error) => {
                    tracing::warn!(user = %name, %error, "cannot look up allowed user; skipping it");
                }
            }
        }
        PeerPolicy::for_uids(uids)
    }

    /// Allows root, our own uid, and `uids`.
    pub fn for_uids(uids: impl IntoIterator<Item = u32>) -> PeerPolicy {
        let mut allowed: BTreeSet<u32> = uids.into_iter().collect();
        allowed.insert(0);
        allowed.insert(nix::unistd::getuid().as_raw());
        PeerPolicy { allowed }
    }

    /// Whether `peer` may call.
    pub fn allows(&self, peer: &Peer) -> bool {
        self.allowed.contains(&peer.uid)
    }

    /// The allowed uids, for logging at start.
    pub fn uids(&self) -> impl Iterator<Item = u32> + '_ {
        self.allowed.iter().copied()
    }
}

/// Logs the refusal of `peer`, which asked for `path` on `socket` without being allowed to
/// (`why`: which policy it failed), and answers it with [`forbidden_peer`].
pub fn refuse_peer(peer: &Peer, socket: &str, path: &str, why: &str) -> Response<envelope::Body> {
    tracing::warn!(
        uid = peer.uid,
        pid = peer.pid,
        socket,
        path,
        "refused a peer: {why}"
    );
    forbidden_peer(peer)
}

/// A 403 envelope with code `peer_forbidden` naming the uid.
pub fn forbidden_peer(peer: &Peer) -> Response<envelope::Body> {
    let mut details = serde_json::Map::new();
    details.insert("uid".into(), serde_json::json!(peer.uid));
    error_response(
        StatusCode::FORBIDDEN,
        "peer_forbidden",
        format!(
            "uid {} may not call this socket; add the user to allowed_users in the config",
            peer.uid
        ),
        details,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ipc::envelope::json_response;
    use agentworks_support::unix_http::{ClientError, UnixClient};
    use std::path::PathBuf;

    #[derive(serde::Serialize, serde::Deserialize, Debug, PartialEq)]
    struct Echo {
        text: String,
    }

    #[derive(serde::Deserialize, Debug)]
    struct WhoAmI {
        uid: u32,
        gid: u32,
        pid: i32,
    }

    /// A little router standing in for a daemon's.
    async fn route(
        peer: Peer,
        parts: hyper::http::request::Parts,
        body: Bytes,
        entered: Arc<tokio::sync::Notify>,
    ) -> Response<Body> {
        match parts.uri.path() {
            "/v1/echo" => match serde_json::from_slice::<Echo>(&body) {
                Ok(echo) => json_response(StatusCode::OK, &echo),
                Err(e) => error_response(
                    StatusCode::BAD_REQUEST,
                    "bad_json",
                    e.to_string(),
                    serde_json::Map::new(),
                ),
            },
            "/v1/whoami" => json_response(
                StatusCode::OK,
                &serde_json::json!({"uid": peer.uid, "gid": peer.gid, "pid": peer.pid}),
            ),
            "/v1/conflict" => {
                let mut details = serde_json::Map::new();
                details.insert("current_revision".into(), serde_json::json!("r7"));
                error_response(
                    StatusCode::CONFLICT,
                    "revision_conflict",
                    "the file changed",
                    details,
                )
            }
            "/v1/slow" => {
                entered.notify_one();
                tokio::time::sleep(Duration::from_millis(300)).await;
                json_response(StatusCode::OK, &serde_json::json!({"text": "done"}))
            }
            _ => error_response(
                StatusCode::NOT_FOUND,
                "not_found",
                "no such endpoint",
                serde_json::Map::new(),
            ),
        }
    }

    struct Running {
        _dir: tempfile::TempDir,
        socket: PathBuf,
        shutdown: CancellationToken,
        entered: Arc<tokio::sync::Notify>,
        server: tokio::task::JoinHandle<()>,
    }

    fn start(limits: ServerLimits) -> Running {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("test.sock");
        let listener = tokio::net::UnixListener::bind(&socket).unwrap();
        let shutdown = CancellationToken::new();
        let entered = Arc::new(tokio::sync::Notify::new());
        let e = entered.clone();
        let handler = move |peer, parts, body| route(peer, parts, body, e.clone());
        let server = tokio::spawn(serve(listener, handler, shutdown.clone(), limits));
        Running {
            _dir: dir,
            socket,
            shutdown,
            entered,
            server,
        }
    }

    const LIMITS: ServerLimits = ServerLimits {
        max_connections: 8,
        max_body_bytes: 1024,
    };

    #[tokio::test]
    async fn json_round_trip() {
        let s = start(LIMITS);
        let client = UnixClient::new(&s.socket);
        let echo: Echo = client
            .post(
                "/v1/echo",
                &Echo {
                    text: "héllo".into(),
                },
            )
            .await
            .unwrap();
        assert_eq!(echo.text, "héllo");
        s.shutdown.cancel();
        s.server.await.unwrap();
    }

    #[tokio::test]
    async fn error_envelope_becomes_remote_error() {
        let s = start(LIMITS);
        let client = UnixClient::new(&s.socket);
        let err = client
            .post::<_, Echo>("/v1/conflict", &serde_json::json!({}))
            .await
            .unwrap_err();
        match err {
            ClientError::Remote { status, body } => {
                assert_eq!(status, 409);
                assert_eq!(body.code, "revision_conflict");
                assert_eq!(body.message, "the file changed");
                assert_eq!(body.details["current_revision"], "r7");
            }
            other => panic!("expected Remote, got {other:?}"),
        }
        let err = client.get::<Echo>("/v1/nope").await.unwrap_err();
        assert!(
            matches!(&err, ClientError::Remote { status: 404, body } if body.code == "not_found"),
            "{err:?}"
        );
        s.shutdown.cancel();
        s.server.await.unwrap();
    }

    #[tokio::test]
    async fn oversized_body_gets_413_without_calling_the_handler() {
        let s = start(LIMITS);
        let client = UnixClient::new(&s.socket);
        let big = Echo {
            text: "x".repeat(4096),
        };
        let err = client.post::<_, Echo>("/v1/echo", &big).await.unwrap_err();
        match err {
            ClientError::Remote { status, body } => {
                assert_eq!(status, 413);
                assert_eq!(body.code, "too_large");
                assert_eq!(body.details["max_body_bytes"], 1024);
            }
            other => panic!("expected Remote 413, got {other:?}"),
        }
        // A body just under the limit still works.
        let ok: Echo = client
            .post(
                "/v1/echo",
                &Echo {
                    text: "y".repeat(1000),
                },
            )
            .await
            .unwrap();
        assert_eq!(ok.text.len(), 1000);
        s.shutdown.cancel();
        s.server.await.unwrap();
    }

    #[tokio::test]
    async fn chunked_oversized_body_gets_413() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let s = start(LIMITS);
        // Raw HTTP with chunked encoding: no Content-Length, so the limit must apply while
        // reading.
        let mut stream = tokio::net::UnixStream::connect(&s.socket).await.unwrap();
        let chunk = "z".repeat(2000);
        let request = format!(
            "POST /v1/echo HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\n\r\n{:x}\r\n{chunk}\r\n0\r\n\r\n",
            chunk.len()
        );
        stream.write_all(request.as_bytes()).await.unwrap();
        let mut response = Vec::new();
        stream.read_to_end(&mut response).await.unwrap();
        let text = String::from_utf8_lossy(&response);
        assert!(text.starts_with("HTTP/1.1 413"), "{text}");
        assert!(text.contains("\"too_large\""), "{text}");
        s.shutdown.cancel();
        s.server.await.unwrap();
    }

    #[tokio::test]
    async fn peer_is_our_own_process() {
        let s = start(LIMITS);
        let who: WhoAmI = UnixClient::new(&s.socket).get("/v1/whoami").await.unwrap();
        assert_eq!(who.uid, nix::unistd::getuid().as_raw());
        assert_eq!(who.gid, nix::unistd::getgid().as_raw());
        assert_eq!(who.pid, std::process::id() as i32);
        s.shutdown.cancel();
        s.server.await.unwrap();
    }

    #[tokio::test]
    async fn shutdown_waits_for_an_in_flight_request() {
        let s = start(LIMITS);
        let client = UnixClient::new(&s.socket);
        let request = tokio::spawn(async move { client.get::<Echo>("/v1/slow").await });
        s.entered.notified().await;
        let started = std::time::Instant::now();
        s.shutdown.cancel();
        tokio::time::timeout(Duration::from_secs(5), s.server)
            .await
            .unwrap()
            .unwrap();
        // serve returned only after the handler's 300 ms sleep finished...
        assert!(started.elapsed() >= Duration::from_millis(200));
        // ...and the client got the full answer.
        let echo = request.await.unwrap().unwrap();
        assert_eq!(echo.text, "done");
        // The listener is gone: new calls cannot connect.
        let err = UnixClient::new(&s.socket)
            .get::<Echo>("/v1/whoami")
            .await
            .unwrap_err();
        assert!(matches!(err, ClientError::Connect { .. }), "{err:?}");
    }

    #[tokio::test]
    async fn shutdown_with_idle_connection_returns_promptly() {
        let s = start(LIMITS);
        // A connection that never sends anything.
        let _idle = tokio::net::UnixStream::connect(&s.socket).await.unwrap();
        tokio::time::sleep(Duration::from_millis(50)).await;
        s.shutdown.cancel();
        tokio::time::timeout(Duration::from_secs(5), s.server)
            .await
            .unwrap()
            .unwrap();
    }

    #[tokio::test]
    async fn connections_beyond_the_limit_wait_their_turn() {
        let s = start(ServerLimits {
            max_connections: 1,
            max_body_bytes: 1024,
        });
        let client = UnixClient::new(&s.socket);
        let slow = {
            let client = client.clone();
            tokio::spawn(async move { client.get::<Echo>("/v1/slow").await })
        };
        s.entered.notified().await;
        // The second call is accepted only after the slow one's connection closes.
        let started = std::time::Instant::now();
        let who: WhoAmI = client.get("/v1/whoami").await.unwrap();
        assert!(started.elapsed() >= Duration::from_millis(150));
        assert_eq!(who.uid, nix::unistd::getuid().as_raw());
        slow.await.unwrap().unwrap();
        s.shutdown.cancel();
        s.server.await.unwrap();
    }

    #[test]
    fn policy_allows_root_self_and_named_users() {
        // `daemon` exists on essentially every Linux system; find its uid the same way.
        let named = nix::unistd::User::from_name("daemon").unwrap();
        let policy =
            PeerPolicy::for_users(&["daemon".to_owned(), "no-such-user-agentworks".to_owned()]);
        let peer = |uid| Peer {
            uid,
            gid: uid,
            pid: 1,
        };
        assert!(policy.allows(&peer(0)));
        assert!(policy.allows(&peer(nix::unistd::getuid().as_raw())));
        if let Some(user) = named {
            assert!(policy.allows(&peer(user.uid.as_raw())));
        }
        let stranger = 4_000_017;
        assert!(
            nix::unistd::User::from_uid(stranger.into())
                .unwrap()
                .is_none()
        );
        assert!(!policy.allows(&peer(stranger)));
        assert!(PeerPolicy::for_uids([1234]).allows(&peer(1234)));
        assert!(!PeerPolicy::for_uids([1234]).allows(&peer(1235)));
    }

    #[tokio::test]
    async fn forbidden_peer_names_the_uid() {
        let response = forbidden_peer(&Peer {
            uid: 4242,
            gid: 4242,
            pid: 9,
        });
        assert_eq!(response.status(), StatusCode::FORBIDDEN);
        let bytes = response.into_body().collect().await.unwrap().to_bytes();
        let env: crate::ipc::envelope::ErrorEnvelope = serde_json::from_slice(&bytes).unwrap();
        assert_eq!(env.error.code, "peer_forbidden");
        assert!(env.error.message.contains("4242"));
        assert_eq!(env.error.details["uid"], 4242);
    }

    // ----- the public listener -----

    mod public {
        use super::super::*;
        use crate::ipc::connections::ConnectionLimits;
        use crate::ipc::envelope::json_response;
        use std::sync::atomic::{AtomicUsize, Ordering};
        use tokio::io::{AsyncReadExt, AsyncWriteExt};

        /// `/auth` needs `x-token: good` (else a 401 from the head); everything else is
        /// anonymous. `/spelled` answers a refused body in its own words.
        struct TestScreen;

        impl Screen for TestScreen {
            async fn screen(&self, head: &hyper::http::request::Parts) -> Verdict {
                if head.uri.path() != "/auth" {
                    return Verdict::Anonymous;
                }
                if head.headers.get("x-token").is_some_and(|v| v == "good") {
                    Verdict::Authenticated {
                        max_body_bytes: 4 * 1024 * 1024,
                    }
                } else {
                    Verdict::Refused(error_response(
                        StatusCode::UNAUTHORIZED,
                        "missing_token",
                        "no",
                        serde_json::Map::new(),
                    ))
                }
            }

            fn body_refusal(
                &self,
                head: &hyper::http::request::Parts,
                refusal: BodyRefusal,
            ) -> Response<Body> {
                if head.uri.path() != "/spelled" {
                    return refusal.envelope();
                }
                json_response(
                    refusal.status,
                    &serde_json::json!({"spelled": refusal.code, "details": refusal.details}),
                )
            }
        }

        struct Running {
            port: u16,
            calls: Arc<AtomicUsize>,
            shutdown: CancellationToken,
            server: tokio::task::JoinHandle<()>,
        }

        impl Running {
            async fn stop(self) {
                self.shutdown.cancel();
                tokio::time::timeout(Duration::from_secs(10), self.server)
                    .await
                    .unwrap()
                    .unwrap();
            }
        }

        async fn start(limits: PublicLimits) -> Running {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            let port = listener.local_addr().unwrap().port();
            let calls = Arc::new(AtomicUsize::new(0));
            let counted = calls.clone();
            let handler = move |_peer, _parts, body: Bytes| {
                let counted = counted.clone();
                async move {
                    counted.fetch_add(1, Ordering::SeqCst);
                    // Hold the body a moment, as a real handler parsing it would.
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    json_response(StatusCode::OK, &serde_json::json!({"bytes": body.len()}))
                }
            };
            let shutdown = CancellationToken::new();
            let server = tokio::spawn(serve_public(
                listener,
                Arc::new(TestScreen),
                handler,
                shutdown.clone(),
                limits,
            ));
            Running {
                port,
                calls,
                shutdown,
                server,
            }
        }

        fn limits() -> PublicLimits {
            PublicLimits::new(
                ConnectionLimits::with_reserved_quarter(16, 16),
                8 * 1024 * 1024,
            )
        }

        /// Sends `head` (and `body`), returns everything the server sent until it closed.
        async fn exchange(port: u16, head: &str, body: &[u8]) -> String {
            let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port))
                .await
                .unwrap();
            stream.write_all(head.as_bytes()).await.unwrap();
            let _ = stream.write_all(body).await;
            let mut out = Vec::new();
            let _ = tokio::time::timeout(Duration::from_secs(20), stream.read_to_end(&mut out))
                .await
                .expect("the server closes the connection");
            String::from_utf8_lossy(&out).into_owned()
        }

        #[tokio::test]
        async fn a_refused_head_is_answered_without_reading_the_body() {
            let s = start(limits()).await;
            // 40 MiB declared, not one byte sent: the answer comes anyway, and closes.
            let head = "POST /auth HTTP/1.1\r\nhost: x\r\ncontent-length: 41943040\r\n\r\n";
            let answer = tokio::time::timeout(Duration::from_secs(5), exchange(s.port, head, b""))
                .await
                .unwrap();
            assert!(answer.starts_with("HTTP/1.1 401"), "{answer}");
            assert!(answer.contains("connection: close"), "{answer}");
            assert_eq!(s.calls.load(Ordering::SeqCst), 0);
            s.stop().await;
        }

        #[tokio::test]
        async fn the_screen_spells_a_refused_body_and_the_server_still_closes() {
            let s = start(limits()).await;
            let big = vec![b'a'; 100 * 1024];
            for (path, expected) in [
                (
                    "/spelled",
                    "{\"details\":{\"max_body_bytes\":65536},\"spelled\":\"too_large\"}",
                ),
                ("/open", "\"code\":\"too_large\""),
            ] {
                let head = format!(
                    "POST {path} HTTP/1.1\r\nhost: x\r\ncontent-length: {}\r\n\r\n",
                    big.len()
                );
                let answer = exchange(s.port, &head, &big).await;
                assert!(answer.starts_with("HTTP/1.1 413"), "{answer}");
                assert!(answer.contains("connection: close"), "{answer}");
                assert!(answer.contains(expected), "{answer}");
            }
            assert_eq!(s.calls.load(Ordering::SeqCst), 0);
            s.stop().await;
        }

        #[tokio::test]
        async fn anonymous_bodies_are_capped_and_authenticated_ones_get_the_endpoint_limit() {
            let s = start(limits()).await;
            let big = vec![b'a'; 100 * 1024];
            let head = format!(
                "POST /open HTTP/1.1\r\nhost: x\r\ncontent-length: {}\r\n\r\n",
                big.len()
            );
            let answer = exchange(s.port, &head, &big).await;
            assert!(answer.starts_with("HTTP/1.1 413"), "{answer}");
            // Chunked, so only the bytes received can tell.
            let chunk = vec![b'b'; 70 * 1024];
            let mut body = format!("{:x}\r\n", chunk.len()).into_bytes();
            body.extend_from_slice(&chunk);
            body.extend_from_slice(b"\r\n0\r\n\r\n");
            let answer = exchange(
                s.port,
                "POST /open HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\n\r\n",
                &body,
            )
            .await;
            assert!(answer.starts_with("HTTP/1.1 413"), "{answer}");
            assert_eq!(s.calls.load(Ordering::SeqCst), 0);
            // The same 100 KiB with a good token is served.
            let head = format!(
                "POST /auth HTTP/1.1\r\nhost: x\r\nx-token: good\r\nconnection: close\r\ncontent-length: {}\r\n\r\n",
                big.len()
            );
            let answer = exchange(s.port, &head, &big).await;
            assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
            assert!(answer.contains("\"bytes\":102400"), "{answer}");
            s.stop().await;
        }

        #[tokio::test]
        async fn bodies_wait_for_the_budget_and_get_503_when_it_does_not_come() {
            let mut limits = limits();
            limits.body_budget_bytes = 1024 * 1024;
            limits.body_budget_wait = Duration::from_millis(300);
            let s = start(limits).await;
            // One request takes the whole budget and holds it (its body never ends).
            let mut holder = tokio::net::TcpStream::connect(("127.0.0.1", s.port))
                .await
                .unwrap();
            holder
                .write_all(b"POST /auth HTTP/1.1\r\nhost: x\r\nx-token: good\r\ncontent-length: 1048576\r\n\r\nxx")
                .await
                .unwrap();
            tokio::time::sleep(Duration::from_millis(100)).await;
            let head =
                "POST /auth HTTP/1.1\r\nhost: x\r\nx-token: good\r\ncontent-length: 10\r\n\r\n";
            let answer = exchange(s.port, head, b"0123456789").await;
            assert!(answer.starts_with("HTTP/1.1 503"), "{answer}");
            assert!(answer.contains("\"busy\""), "{answer}");
            // Once it is gone, the budget is back.
            drop(holder);
            tokio::time::sleep(Duration::from_millis(100)).await;
            let head = "POST /auth HTTP/1.1\r\nhost: x\r\nx-token: good\r\nconnection: close\r\ncontent-length: 10\r\n\r\n";
            let answer = exchange(s.port, head, b"0123456789").await;
            assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
            // No body may exceed the budget.
            let head = "POST /auth HTTP/1.1\r\nhost: x\r\nx-token: good\r\ncontent-length: 2097152\r\n\r\n";
            let answer = exchange(s.port, head, b"").await;
            assert!(answer.starts_with("HTTP/1.1 413"), "{answer}");
            s.stop().await;
        }

        #[tokio::test]
        async fn a_body_slower_than_the_minimum_rate_gets_408() {
            let mut limits = limits();
            limits.body_read_grace = Duration::from_millis(400);
            let s = start(limits).await;
            let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", s.port))
                .await
                .unwrap();
            stream
                .write_all(b"POST /auth HTTP/1.1\r\nhost: x\r\nx-token: good\r\ncontent-length: 100000\r\n\r\n")
                .await
                .unwrap();
            let started = std::time::Instant::now();
            let trickle = tokio::spawn(async move {
                for _ in 0..100 {
                    if stream.write_all(b"a").await.is_err() {
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                let mut out = Vec::new();
                let _ = stream.read_to_end(&mut out).await;
                String::from_utf8_lossy(&out).into_owned()
            });
            let answer = tokio::time::timeout(Duration::from_secs(5), trickle)
                .await
                .unwrap()
                .unwrap();
            assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
            assert!(answer.contains("\"body_timeout\""), "{answer}");
            assert!(started.elapsed() < Duration::from_secs(3));
            assert_eq!(s.calls.load(Ordering::SeqCst), 0);
            s.stop().await;
        }

        #[tokio::test]
        async fn connections_that_only_wait_are_evicted_for_a_newcomer() {
            let limits = PublicLimits::new(ConnectionLimits::with_reserved_quarter(4, 4), 1 << 20);
            let s = start(limits).await;
            // Three idle connections fill the anonymous share (4 - 1 reserved).
            let mut idle = Vec::new();
            for _ in 0..3 {
                let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", s.port))
                    .await
                    .unwrap();
                stream.write_all(b"GET / HTT").await.unwrap();
                idle.push(stream);
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            // A newcomer is served at once; the oldest idle one was closed for it.
            let answer = tokio::time::timeout(
                Duration::from_secs(2),
                exchange(
                    s.port,
                    "GET /x HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n",
                    b"",
                ),
            )
            .await
            .expect("served while three connections only wait");
            assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
            let mut byte = [0u8; 1];
            let closed = tokio::time::timeout(Duration::from_secs(2), idle[0].read(&mut byte))
                .await
                .unwrap();
            assert!(matches!(closed, Ok(0) | Err(_)), "{closed:?}");
            s.stop().await;
        }

        #[tokio::test]
        async fn one_address_is_held_to_its_limit() {
            let limits = PublicLimits::new(ConnectionLimits::with_reserved_quarter(64, 2), 1 << 20);
            let s = start(limits).await;
            let mut working = Vec::new();
            for _ in 0..2 {
                // Each has sent an authenticated head and is sending its body: not evictable.
                let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", s.port))
                    .await
                    .unwrap();
                stream
                    .write_all(b"POST /auth HTTP/1.1\r\nhost: x\r\nx-token: good\r\ncontent-length: 100\r\n\r\nx")
                    .await
                    .unwrap();
                working.push(stream);
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
            let answer = exchange(s.port, "GET /x HTTP/1.1\r\nhost: x\r\n\r\n", b"").await;
            assert!(answer.starts_with("HTTP/1.1 503"), "{answer}");
            assert!(answer.contains("too_many_connections"), "{answer}");
            drop(working);
            s.stop().await;
        }
    }
}
