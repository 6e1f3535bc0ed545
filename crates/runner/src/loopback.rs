//! What runnerd's two loopback HTTP servers share (the model gateway, the bridge's endpoint):
//! the accept loop with its connection bound, one connection's HTTP/1.1 with a header timeout
//! and a graceful end on shutdown, and the small helpers both use for their capability tables.
//!
//! Must never: accept past its bound (further clients wait in the listen backlog), or outlive
//! its shutdown token.

use std::convert::Infallible;
use std::future::Future;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use agentworks_daemon::ipc::server::Acceptor;
use hyper::body::Incoming;
use hyper::{Request, Response};
use hyper_util::rt::{TokioIo, TokioTimer};
use sha2::{Digest, Sha256};
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// Connections served at once (a CLI makes a few); further ones wait in the listen backlog.
const MAX_CONNECTIONS: usize = 64;
/// How long a client may take to send a request's headers.
const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(30);

/// Serves `listener` until `shutdown`: a semaphore bounds the connections, each runs in its own
/// task and answers every request with `handle(request, state)`; on shutdown the loop stops
/// accepting, each connection ends gracefully, and the loop waits for them. `what` names the
/// server in the log.
pub(crate) async fn serve<S, B, F, Fut>(
    listener: tokio::net::TcpListener,
    state: Arc<S>,
    shutdown: CancellationToken,
    what: &'static str,
    handle: F,
) where
    S: Send + Sync + 'static,
    F: Fn(Request<Incoming>, Arc<S>) -> Fut + Copy + Send + Sync + 'static,
    Fut: Future<Output = Response<B>> + Send + 'static,
    B: hyper::body::Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let permits = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    let tracker = TaskTracker::new();
    let mut acceptor = Acceptor::new(listener);
    loop {
        let permit = tokio::select! {
            _ = shutdown.cancelled() => break,
            permit = permits.clone().acquire_owned() => match permit {
                Ok(permit) => permit,
                Err(_) => break, // never closed
            },
        };
        let Some((stream, _)) = acceptor.next(&shutdown).await else {
            break;
        };
        let (state, shutdown) = (state.clone(), shutdown.clone());
        tracker.spawn(async move {
            serve_connection(stream, state, shutdown, what, handle).await;
            drop(permit);
        });
    }
    drop(acceptor);
    tracker.close();
    tracker.wait().await;
}

async fn serve_connection<S, B, F, Fut>(
    stream: tokio::net::TcpStream,
    state: Arc<S>,
    shutdown: CancellationToken,
    what: &'static str,
    handle: F,
) where
    S: Send + Sync + 'static,
    F: Fn(Request<Incoming>, Arc<S>) -> Fut + Copy + Send + Sync + 'static,
    Fut: Future<Output = Response<B>> + Send + 'static,
    B: hyper::body::Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let service = hyper::service::service_fn(move |request: Request<Incoming>| {
        let state = state.clone();
        async move { Ok::<_, Infallible>(handle(request, state).await) }
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
        tracing::debug!(%error, server = what, "loopback connection ended with an error");
    }
}

/// A std mutex's guard; a poisoned one is still used (the tables hold counts and maps, each
/// left whole by any panic).
pub(crate) fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The SHA-256 of a capability: the tables keep digests, never the capabilities.
pub(crate) fn digest(bytes: &[u8]) -> [u8; 32] {
    Sha256::digest(bytes).into()
}
