//! Notifications during a request: progress (`notifications/progress`, when the request carried
//! a `progressToken`) and log messages (`notifications/message`, at or above the level the
//! client asked for), written as server-sent events on the request's own POST response before
//! its result.
//!
//! Owns the [`Notifier`] a backend writes to, the bounded queue behind it, and the response
//! body that drains that queue. Must never block a backend (a full queue drops the
//! notification: they are advisory), never let a queue grow without bound, never send a
//! notification the client did not ask for, and never send a server-to-client *request*
//! (the 2026-07-28 wire forbids them on a response stream; the 2025 era's input requests go
//! through [`Notifier::ask`], only there).

use std::pin::Pin;
use std::sync::{Mutex, PoisonError};
use std::task::{Context, Poll};

use bytes::Bytes;
use serde_json::{Value, json};
use tokio::sync::mpsc;

use super::answer::Answer;
use super::wire::LogLevel;

/// Events one streamed response may have queued and not yet sent; beyond this the client is
/// not reading and further notifications are dropped.
pub(super) const QUEUE_EVENTS: usize = 64;
/// The largest notification sent; a bigger one is dropped (a log line is not a file).
const MAX_NOTIFICATION_BYTES: usize = 64 * 1024;

/// One item on a streamed request's queue: a notification (an encoded SSE event), or the end.
pub(super) enum Item {
    Notification(Bytes),
    Done(Answer),
}

/// Where a backend sends progress and log messages for the request it is answering. Every
/// method is cheap and never blocks; one the client did not ask for is a no-op.
#[derive(Debug)]
pub struct Notifier {
    /// The queue to the response body, when the answer may stream.
    sink: Option<mpsc::Sender<Item>>,
    /// The request's `_meta.progressToken`.
    progress_token: Option<Value>,
    /// The least severe level the client wants.
    log_level: Option<LogLevel>,
    /// The last progress sent (progress must increase).
    last_progress: Mutex<Option<f64>>,
}

impl Notifier {
    /// A notifier that sends nothing (the client asked for nothing, or cannot take a stream).
    pub fn silent() -> Notifier {
        Notifier {
            sink: None,
            progress_token: None,
            log_level: None,
            last_progress: Mutex::new(None),
        }
    }

    pub(super) fn new(
        sink: mpsc::Sender<Item>,
        progress_token: Option<Value>,
        log_level: Option<LogLevel>,
    ) -> Notifier {
        Notifier {
            sink: Some(sink),
            progress_token,
            log_level,
            last_progress: Mutex::new(None),
        }
    }

    /// Whether progress reports reach the client (it sent a `progressToken`).
    pub fn wants_progress(&self) -> bool {
        self.sink.is_some() && self.progress_token.is_some()
    }

    /// Whether a log message at `level` reaches the client.
    pub fn wants_log(&self, level: LogLevel) -> bool {
        self.sink.is_some() && self.log_level.is_some_and(|least| level >= least)
    }

    /// Reports progress (`progress` out of `total`, if known). A value not above the last one
    /// sent is dropped: MCP requires progress to increase.
    pub fn progress(&self, progress: f64, total: Option<f64>, message: Option<&str>) {
        let Some(token) = self.progress_token.as_ref().filter(|_| self.sink.is_some()) else {
            return;
        };
        if !progress.is_finite() || total.is_some_and(|t| !t.is_finite()) {
            return;
        }
        {
            let mut last = self
                .last_progress
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            if last.is_some_and(|last| progress <= last) {
                return;
            }
            *last = Some(progress);
        }
        let mut params = json!({"progressToken": token, "progress": progress});
        if let Some(total) = total {
            params["total"] = json!(total);
        }
        if let Some(message) = message {
            params["message"] = json!(message);
        }
        self.send("notifications/progress", params);
    }

    /// Sends a log message (`data`: any JSON, usually a string) if the client wants `level`.
    pub fn log(&self, level: LogLevel, logger: Option<&str>, data: Value) {
        if !self.wants_log(level) {
            return;
        }
        let mut params = json!({"level": level.as_str(), "data": data});
        if let Some(logger) = logger {
            params["logger"] = json!(logger);
        }
        self.send("notifications/message", params);
    }

    /// Whether this request's answer can carry requests to the client (it may stream).
    pub(super) fn can_ask(&self) -> bool {
        self.sink.is_some()
    }

    /// Sends a server-to-client request (2025 era) on the stream, waiting for room: unlike a
    /// notification it must not be dropped. `false` if the client is gone.
    pub(super) async fn ask(&self, request: &Value) -> bool {
        let Some(sink) = &self.sink else { return false };
        sink.send(Item::Notification(sse_event(request)))
            .await
            .is_ok()
    }

    fn send(&self, method: &str, params: Value) {
        let Some(sink) = &self.sink else { return };
        let event = sse_event(&json!({"jsonrpc": "2.0", "method": method, "params": params}));
        if event.len() > MAX_NOTIFICATION_BYTES {
            tracing::debug!(
                method,
                bytes = event.len(),
                "mcp notification too large; dropped"
            );
            return;
        }
        if sink.try_send(Item::Notification(event)).is_err() {
            tracing::debug!(method, "mcp notification queue full or closed; dropped");
        }
    }
}

/// One JSON-RPC message as a server-sent event.
pub(super) fn sse_event(message: &Value) -> Bytes {
    let json = serde_json::to_string(message).unwrap_or_else(|_| {
        r#"{"jsonrpc":"2.0","id":null,"error":{"code":-32603,"message":"Internal error"}}"#
            .to_owned()
    });
    Bytes::from(format!("event: message\ndata: {json}\n\n"))
}

/// A streamed response body: the first event already received, then the queue's events until
/// its end, which `finish` turns into the last event (the JSON-RPC answer). Ends after that,
/// or with `finish(None)`'s event when the request's task ended without an answer.
pub(super) struct StreamBody<F> {
    first: Option<Bytes>,
    queue: mpsc::Receiver<Item>,
    finish: F,
    done: bool,
}

impl<F> StreamBody<F>
where
    F: FnMut(Option<Answer>) -> Bytes + Unpin,
{
    pub(super) fn new(first: Bytes, queue: mpsc::Receiver<Item>, finish: F) -> StreamBody<F> {
        StreamBody {
            first: Some(first),
            queue,
            finish,
            done: false,
        }
    }
}

impl<F> hyper::body::Body for StreamBody<F>
where
    F: FnMut(Option<Answer>) -> Bytes + Unpin,
{
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<hyper::body::Frame<Bytes>, Self::Error>>> {
        let this = self.get_mut();
        if let Some(first) = this.first.take() {
            return Poll::Ready(Some(Ok(hyper::body::Frame::data(first))));
        }
        if this.done {
            return Poll::Ready(None);
        }
        let chunk = match this.queue.poll_recv(cx) {
            Poll::Pending => return Poll::Pending,
            Poll::Ready(Some(Item::Notification(event))) => event,
            Poll::Ready(Some(Item::Done(answer))) => {
                this.done = true;
                (this.finish)(Some(answer))
            }
            Poll::Ready(None) => {
                this.done = true;
                (this.finish)(None)
            }
        };
        Poll::Ready(Some(Ok(hyper::body::Frame::data(chunk))))
    }
}
