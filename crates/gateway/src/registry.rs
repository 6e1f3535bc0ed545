//! The in-memory registry of connected executors and of the requests waiting on them.
//!
//! Owns, for this process only: which connection currently speaks for each device id (one per
//! device; a newer one of the same credential replaces the older), the token id each
//! connection authenticated with, the folders it shares, a channel to its session task, every
//! pending request with the connection it was sent on and the one reply slot its dispatcher
//! waits on, and every receipt query waiting for its device's answer.
//!
//! The invariant that makes "never twice" hold: a pending request lives in exactly one map
//! entry, and whoever *removes* it (the result frame, the disconnect, the deadline, the
//! shutdown) is the only one who records and answers its outcome.
//!
//! Must never list or hand out a device to anyone but the session and dispatch code, which
//! check the owner; never match a result (or receipt) frame to a request (or receipt query)
//! sent on another connection.
//!
//! One registry per process. More than one gateway host would need a shared registry (or a
//! device-to-host map in a shared store) so that agentd can reach the host holding a device's
//! WebSocket, routing affinity so that a device's reconnect and a chat's dispatches land on the
//! same host (or are forwarded to it), and a shared request table so that a request id is
//! never sent twice from two hosts; token revocation polling would then run on every host.

use std::collections::HashMap;
use std::sync::Mutex;

use tokio::sync::{mpsc, oneshot};

use agentworks_contract::executor::{FolderInfo, GatewayFrame, ReceiptState};
use agentworks_contract::gatewayd::DispatchState;

/// What a dispatcher or the token watcher asks a session task to do.
#[derive(Debug)]
pub enum Control {
    /// Send this frame to the executor.
    Frame(GatewayFrame),
    /// Close the connection with `code` and `reason`; its pending requests fail with
    /// `pending_reason`.
    Close {
        code: u16,
        reason: String,
        pending_reason: String,
    },
}

/// One live executor connection.
#[derive(Debug, Clone)]
pub struct Live {
    /// Unique per accepted connection in this process; tells a replaced connection apart.
    pub conn_id: u64,
    pub user_id: String,
    pub device_name: String,
    /// The agentd token id the connection authenticated with (never the token itself).
    pub token_id: String,
    pub folders: Vec<FolderInfo>,
    pub connected_at_ms: i64,
    pub control: mpsc::UnboundedSender<Control>,
}

/// A request sent to a device and not yet answered.
#[derive(Debug)]
pub struct Pending {
    pub conn_id: u64,
    pub device_id: String,
    pub user_id: String,
    pub kind: &'static str,
    /// The dispatcher's reply slot; dropped silently if the dispatcher went away.
    pub reply: oneshot::Sender<DispatchState>,
}

/// A receipt query sent to a device and not yet answered.
#[derive(Debug)]
struct ReceiptQuery {
    conn_id: u64,
    reply: oneshot::Sender<ReceiptState>,
}

#[derive(Default)]
struct Inner {
    live: HashMap<String, Live>,
    pending: HashMap<String, Pending>,
    /// At most one receipt query per request id at a time.
    receipt_queries: HashMap<String, ReceiptQuery>,
    next_conn_id: u64,
}

/// See the module doc.
#[derive(Default)]
pub struct Registry {
    inner: Mutex<Inner>,
}

impl Registry {
    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A fresh connection id.
    pub fn next_conn_id(&self) -> u64 {
        let mut inner = self.lock();
        inner.next_conn_id += 1;
        inner.next_conn_id
    }

    /// Makes `live` the connection of `device_id`; returns the one it replaced, if any.
    pub fn register(&self, device_id: &str, live: Live) -> Option<Live> {
        self.lock().live.insert(device_id.to_owned(), live)
    }

    /// Removes `device_id`'s connection if it is still `conn_id` (not a newer one).
    pub fn unregister(&self, device_id: &str, conn_id: u64) {
        let mut inner = self.lock();
        if inner
            .live
            .get(device_id)
            .is_some_and(|l| l.conn_id == conn_id)
        {
            inner.live.remove(device_id);
        }
    }

    /// The live connection of `device_id`.
    pub fn live(&self, device_id: &str) -> Option<Live> {
        self.lock().live.get(device_id).cloned()
    }

    /// The live connections of `user_id`, by device id.
    pub fn live_of_user(&self, user_id: &str) -> Vec<(String, Live)> {
        self.lock()
            .live
            .iter()
            .filter(|(_, l)| l.user_id == user_id)
            .map(|(id, l)| (id.clone(), l.clone()))
            .collect()
    }

    /// Every live connection's (device id, connection id, token id).
    pub fn tokens(&self) -> Vec<(String, u64, String)> {
        self.lock()
            .live
            .iter()
            .map(|(id, l)| (id.clone(), l.conn_id, l.token_id.clone()))
            .collect()
    }

    /// How many connections are registered.
    pub fn live_count(&self) -> usize {
        self.lock().live.len()
    }

    /// Asks connection `conn_id` of `device_id` to close (no-op if it is gone or replaced).
    pub fn close(&self, device_id: &str, conn_id: u64, code: u16, reason: &str, pending: &str) {
        let inner = self.lock();
        if let Some(live) = inner.live.get(device_id)
            && live.conn_id == conn_id
        {
            let _ = live.control.send(Control::Close {
                code,
                reason: reason.to_owned(),
                pending_reason: pending.to_owned(),
            });
        }
    }

    /// Atomically: if `conn_id` is still `device_id`'s connection, records `pending` under
    /// `request_id` and queues `frame` on it. Otherwise gives `pending` back: nothing was sent.
    #[allow(clippy::result_large_err)]
    pub fn send_pending(
        &self,
        request_id: &str,
        frame: GatewayFrame,
        pending: Pending,
    ) -> Result<(), Pending> {
        let mut inner = self.lock();
        let Some(live) = inner.live.get(&pending.device_id) else {
            return Err(pending);
        };
        if live.conn_id != pending.conn_id || inner.pending.contains_key(request_id) {
            return Err(pending);
        }
        if live.control.send(Control::Frame(frame)).is_err() {
            return Err(pending);
        }
        inner.pending.insert(request_id.to_owned(), pending);
        Ok(())
    }

    /// Removes a pending request. With `conn_id`, only if it was sent on that connection (a
    /// result frame can only answer its own connection's requests).
    pub fn take_pending(&self, request_id: &str, conn_id: Option<u64>) -> Option<Pending> {
        let mut inner = self.lock();
        let matches = inner
            .pending
            .get(request_id)
            .is_some_and(|p| conn_id.is_none_or(|c| p.conn_id == c));
        if matches {
            inner.pending.remove(request_id)
        } else {
            None
        }
    }

    /// Whether `request_id` is pending on connection `conn_id`.
    pub fn is_pending_on(&self, request_id: &str, conn_id: u64) -> bool {
        self.lock()
            .pending
            .get(request_id)
            .is_some_and(|p| p.conn_id == conn_id)
    }

    /// The connection a pending request was sent on, with its device id.
    pub fn pending_connection(&self, request_id: &str) -> Option<(String, u64)> {
        self.lock()
            .pending
            .get(request_id)
            .map(|p| (p.device_id.clone(), p.conn_id))
    }

    /// Removes every request pending on `conn_id`.
    pub fn take_all_pending(&self, conn_id: u64) -> Vec<(String, Pending)> {
        let mut inner = self.lock();
        let ids: Vec<String> = inner
            .pending
            .iter()
            .filter(|(_, p)| p.conn_id == conn_id)
            .map(|(id, _)| id.clone())
            .collect();
        ids.into_iter()
            .filter_map(|id| inner.pending.remove(&id).map(|p| (id, p)))
            .collect()
    }

    /// Sends a receipt query for `request_id` on `device_id`'s connection `conn_id` and returns
    /// where its answer will arrive. `None` if that connection is gone (or replaced), or a query
    /// for this request id is already under way.
    pub fn query_receipt(
        &self,
        device_id: &str,
        conn_id: u64,
        request_id: &str,
    ) -> Option<oneshot::Receiver<ReceiptState>> {
        let mut inner = self.lock();
        if inner.receipt_queries.contains_key(request_id) {
            return None;
        }
        let live = inner.live.get(device_id).filter(|l| l.conn_id == conn_id)?;
        let frame = GatewayFrame::ReceiptQuery {
            request_id: request_id.to_owned(),
        };
        live.control.send(Control::Frame(frame)).ok()?;
        let (reply, answer) = oneshot::channel();
        inner
            .receipt_queries
            .insert(request_id.to_owned(), ReceiptQuery { conn_id, reply });
        Some(answer)
    }

    /// Delivers a receipt frame from connection `conn_id`. False (and ignored) unless a query
    /// for `request_id` was sent on that very connection.
    pub fn answer_receipt(&self, request_id: &str, conn_id: u64, receipt: ReceiptState) -> bool {
        let mut inner = self.lock();
        if inner
            .receipt_queries
            .get(request_id)
            .is_none_or(|q| q.conn_id != conn_id)
        {
            return false;
        }
        match inner.receipt_queries.remove(request_id) {
            Some(query) => query.reply.send(receipt).is_ok(),
            None => false,
        }
    }

    /// Forgets an unanswered receipt query of connection `conn_id` (its asker gave up).
    pub fn forget_receipt_query(&self, request_id: &str, conn_id: u64) {
        let mut inner = self.lock();
        if inner
            .receipt_queries
            .get(request_id)
            .is_some_and(|q| q.conn_id == conn_id)
        {
            inner.receipt_queries.remove(request_id);
        }
    }

    /// Queues a frame on `device_id`'s connection `conn_id` (best effort).
    pub fn send_frame(&self, device_id: &str, conn_id: u64, frame: GatewayFrame) -> bool {
        let inner = self.lock();
        match inner.live.get(device_id) {
            Some(live) if live.conn_id == conn_id => {
                live.control.send(Control::Frame(frame)).is_ok()
            }
            _ => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn live(registry: &Registry, user: &str) -> (Live, mpsc::UnboundedReceiver<Control>) {
        let (tx, rx) = mpsc::unbounded_channel();
        (
            Live {
                conn_id: registry.next_conn_id(),
                user_id: user.into(),
                device_name: "laptop".into(),
                token_id: "tok".into(),
                folders: Vec::new(),
                connected_at_ms: 0,
                control: tx,
            },
            rx,
        )
    }

    fn pending(conn_id: u64) -> (Pending, oneshot::Receiver<DispatchState>) {
        let (tx, rx) = oneshot::channel();
        (
            Pending {
                conn_id,
                device_id: "d1".into(),
                user_id: "u1".into(),
                kind: "shell",
                reply: tx,
            },
            rx,
        )
    }

    fn cancel(id: &str) -> GatewayFrame {
        GatewayFrame::Cancel {
            request_id: id.into(),
        }
    }

    #[test]
    fn a_replaced_connection_cannot_unregister_or_answer_for_the_new_one() {
        let registry = Registry::default();
        let (old, _old_rx) = live(&registry, "u1");
        let old_id = old.conn_id;
        assert!(registry.register("d1", old).is_none());
        let (new, mut new_rx) = live(&registry, "u1");
        let new_id = new.conn_id;
        assert_eq!(registry.register("d1", new).unwrap().conn_id, old_id);
        registry.unregister("d1", old_id);
        assert_eq!(registry.live("d1").unwrap().conn_id, new_id);

        let (p, _rx) = pending(new_id);
        registry.send_pending("r1", cancel("r1"), p).unwrap();
        assert!(matches!(new_rx.try_recv(), Ok(Control::Frame(_))));
        // A second pending under the same id is refused: never sent twice.
        let (p, _rx2) = pending(new_id);
        assert!(registry.send_pending("r1", cancel("r1"), p).is_err());
        // The old connection cannot take the new one's request.
        assert!(registry.take_pending("r1", Some(old_id)).is_none());
        assert!(registry.is_pending_on("r1", new_id));
        assert_eq!(registry.take_all_pending(new_id).len(), 1);
        assert!(registry.take_pending("r1", None).is_none());
    }

    #[test]
    fn a_receipt_answers_only_the_query_sent_on_its_connection() {
        let registry = Registry::default();
        let (l, mut rx) = live(&registry, "u1");
        let id = l.conn_id;
        registry.register("d1", l);
        let answer = registry.query_receipt("d1", id, "r1").unwrap();
        assert!(matches!(
            rx.try_recv(),
            Ok(Control::Frame(GatewayFrame::ReceiptQuery { .. }))
        ));
        // One query per request id at a time; none on another connection id.
        assert!(registry.query_receipt("d1", id, "r1").is_none());
        assert!(registry.query_receipt("d1", id + 1, "r2").is_none());
        // Another connection cannot answer it, nor can an unasked id be answered.
        assert!(!registry.answer_receipt("r1", id + 1, ReceiptState::Running));
        assert!(!registry.answer_receipt("r9", id, ReceiptState::Running));
        assert!(registry.answer_receipt("r1", id, ReceiptState::Unknown));
        assert_eq!(answer.blocking_recv().unwrap(), ReceiptState::Unknown);
        // Answered once; a forgotten query frees the id for the next one.
        assert!(!registry.answer_receipt("r1", id, ReceiptState::Unknown));
        let _again = registry.query_receipt("d1", id, "r1").unwrap();
        registry.forget_receipt_query("r1", id);
        assert!(registry.query_receipt("d1", id, "r1").is_some());
    }

    #[test]
    fn nothing_is_sent_on_a_gone_connection() {
        let registry = Registry::default();
        let (l, rx) = live(&registry, "u1");
        let id = l.conn_id;
        registry.register("d1", l);
        drop(rx);
        let (p, _r) = pending(id);
        assert!(registry.send_pending("r1", cancel("r1"), p).is_err());
        registry.unregister("d1", id);
        let (p, _r) = pending(id);
        assert!(registry.send_pending("r2", cancel("r2"), p).is_err());
        assert_eq!(registry.live_count(), 0);
    }
}
