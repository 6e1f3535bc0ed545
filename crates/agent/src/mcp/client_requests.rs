//! Server-to-client requests of the handshake era (2025-06-18 / 2025-11-25): a backend's
//! input request (sampling, elicitation, roots) is sent as a JSON-RPC request on the streamed
//! response of the POST that needs it, and the client POSTs its reply on the same session.
//! This table pairs the replies with the requests waiting for them.
//!
//! Owns the waiting requests: bounded in all, per token and per session, each removed when answered, when
//! its waiter gives up (timeout, client gone) or never registered. Must never let one session
//! answer another's request (the key is the session id and our random request id), never grow
//! without bound, and never hold its lock across an `.await`.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use serde_json::Value;
use tokio::sync::oneshot;

/// Requests waiting for a reply, in all.
const MAX_WAITING: usize = 1024;
/// Requests one session may have waiting.
const MAX_WAITING_PER_SESSION: usize = 8;
/// Requests one token may have waiting, over all its sessions (so a few tokens cannot fill
/// the table for everybody).
const MAX_WAITING_PER_TOKEN: usize = 16;

type Key = (String, String);
type Outcome = Result<Value, Value>;
/// The token a request was asked for, and where its reply goes.
type Entry = (String, oneshot::Sender<Outcome>);

/// The requests waiting for a client's reply.
#[derive(Debug, Default)]
pub(super) struct ClientRequests {
    waiting: Arc<Mutex<HashMap<Key, Entry>>>,
}

/// Why a request could not wait for its reply.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub(super) enum WaitError {
    #[error("too many requests to clients are waiting for replies; try again later")]
    Full,
}

/// One request waiting: its reply, and (on drop) its removal from the table.
pub(super) struct Waiting {
    key: Key,
    receiver: oneshot::Receiver<Outcome>,
    waiting: Arc<Mutex<HashMap<Key, Entry>>>,
}

impl Waiting {
    /// The client's reply (`Err`: its JSON-RPC error), or `None` if the table was dropped.
    pub async fn reply(&mut self) -> Option<Outcome> {
        (&mut self.receiver).await.ok()
    }
}

impl Drop for Waiting {
    fn drop(&mut self) {
        self.waiting
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&self.key);
    }
}

impl ClientRequests {
    /// Registers request `id` of `session` (opened by `token_id`); a fresh random id for it
    /// is the caller's job.
    pub fn wait(&self, token_id: &str, session: &str, id: &str) -> Result<Waiting, WaitError> {
        let mut waiting = self.waiting.lock().unwrap_or_else(PoisonError::into_inner);
        let in_session = waiting.keys().filter(|(s, _)| s == session).count();
        let of_token = waiting.values().filter(|(t, _)| t == token_id).count();
        if waiting.len() >= MAX_WAITING
            || in_session >= MAX_WAITING_PER_SESSION
            || of_token >= MAX_WAITING_PER_TOKEN
        {
            return Err(WaitError::Full);
        }
        let (sender, receiver) = oneshot::channel();
        let key = (session.to_owned(), id.to_owned());
        waiting.insert(key.clone(), (token_id.to_owned(), sender));
        Ok(Waiting {
            key,
            receiver,
            waiting: self.waiting.clone(),
        })
    }

    /// Delivers a client's reply; `false` if no request of that session and id is waiting.
    pub fn answer(&self, session: &str, id: &Value, outcome: Outcome) -> bool {
        let Some(id) = id.as_str() else {
            return false;
        };
        let sender = self
            .waiting
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&(session.to_owned(), id.to_owned()));
        sender.is_some_and(|(_, sender)| sender.send(outcome).is_ok())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[tokio::test]
    async fn replies_reach_only_their_own_session_and_request() {
        let table = ClientRequests::default();
        let mut waiting = table.wait("t", "s1", "r1").unwrap();
        assert!(!table.answer("s2", &json!("r1"), Ok(json!(1))));
        assert!(!table.answer("s1", &json!("r2"), Ok(json!(1))));
        assert!(!table.answer("s1", &json!(1), Ok(json!(1))));
        assert!(table.answer("s1", &json!("r1"), Ok(json!({"ok": true}))));
        assert_eq!(waiting.reply().await, Some(Ok(json!({"ok": true}))));
        // Answered once only.
        assert!(!table.answer("s1", &json!("r1"), Ok(json!(1))));
    }

    #[test]
    fn the_table_is_bounded_and_forgets_requests_nobody_waits_for() {
        let table = ClientRequests::default();
        let held: Vec<Waiting> = (0..MAX_WAITING_PER_SESSION)
            .map(|i| table.wait("t", "s", &i.to_string()).unwrap())
            .collect();
        assert_eq!(table.wait("t", "s", "more").err(), Some(WaitError::Full));
        assert!(table.wait("t", "other", "1").is_ok());
        // The token's other sessions share its bound.
        let more: Vec<Waiting> = (MAX_WAITING_PER_SESSION..MAX_WAITING_PER_TOKEN)
            .map(|i| table.wait("t", &format!("s{i}"), "r").unwrap())
            .collect();
        assert_eq!(table.wait("t", "s99", "r").err(), Some(WaitError::Full));
        assert!(table.wait("u", "s99", "r").is_ok());
        drop(held);
        drop(more);
        assert!(table.waiting.lock().unwrap().is_empty());
        assert!(table.wait("t", "s", "again").is_ok());
    }
}
