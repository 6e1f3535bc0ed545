//! The HTTP/1.1 server side of a daemon socket: accept loop, per-connection tasks, peer
//! credentials, body limits and graceful shutdown.
//!
//! Owns: bounding concurrent connections with a semaphore, backing off on accept errors,
//! reading each peer's credentials with `SO_PEERCRED`, refusing bodies over the limit with a
//! 413 envelope before the handler runs, and on shutdown letting in-flight requests finish.
//! Also the [`PeerPolicy`] a daemon checks those credentials against.
//!
//! Must never serve a connection whose credentials it could not read, and never route or
//! authorize endpoints itself: the handler receives the [`Peer`] and decides.

use std::collections::BTreeSet;
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Limited};
use hyper::body::Incoming;
use hyper::header::{CONNECTION, CONTENT_LENGTH, HeaderValue};
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

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
    let mut backoff = ACCEPT_BACKOFF_MIN;
    loop {
        let permit = tokio::select! {
            _ = shutdown.cancelled() => break,
            permit = permits.clone().acquire_owned() => match permit {
                Ok(permit) => permit,
                Err(_) => break, // never closed; treat as shutdown
            },
        };
        let accepted = tokio::select! {
            _ = shutdown.cancelled() => break,
            accepted = listener.accept() => accepted,
        };
        let (stream, peer) = match accepted {
            Ok(Accepted::Connection(stream, peer)) => {
                backoff = ACCEPT_BACKOFF_MIN;
                (stream, peer)
            }
            Ok(Accepted::Dropped) => continue,
            Err(error) => {
                tracing::warn!(%error, ?backoff, "accept failed; backing off");
                tokio::select! {
                    _ = shutdown.cancelled() => break,
                    _ = tokio::time::sleep(backoff) => {}
                }
                backoff = (backoff * 2).min(ACCEPT_BACKOFF_MAX);
                continue;
            }
        };
        let handler = handler.clone();
        let shutdown = shutdown.clone();
        tracker.spawn(async move {
            serve_connection(stream, peer, handler, shutdown, limits.max_body_bytes).await;
            drop(permit);
        });
    }
    drop(listener);
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
            return error_response(
                StatusCode::BAD_REQUEST,
                "bad_request",
                format!("cannot read the request body: {error}"),
                serde_json::Map::new(),
            );
        }
    };
    handler(peer, parts, bytes).await
}

/// The 413 envelope. The connection is closed after it, since the unread rest of the body
/// would otherwise be parsed as the next request.
fn too_large(max_body_bytes: usize) -> Response<Body> {
    let mut details = serde_json::Map::new();
    details.insert("max_body_bytes".into(), serde_json::json!(max_body_bytes));
    let mut response = error_response(
        StatusCode::PAYLOAD_TOO_LARGE,
        "too_large",
        format!("the request body is larger than {max_body_bytes} bytes"),
        details,
    );
    response
        .headers_mut()
        .insert(CONNECTION, HeaderValue::from_static("close"));
    response
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
    use crate::ipc::client::{ClientError, UnixClient};
    use crate::ipc::envelope::json_response;
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
}
