//! Legacy (2025-06-18 / 2025-11-25) sessions: the `Mcp-Session-Id` minted at `initialize`, the
//! version it negotiated, and the token that opened it.
//!
//! A session is only a name for a negotiated version: it grants nothing, and every request is
//! authenticated on its own. Must never let a session be used by another token (it answers
//! exactly as if the session did not exist) and never grow without bound: the table is capped,
//! idle sessions expire, and one token holds at most `max_per_token` sessions (opening one
//! more ends that token's least recently used one), so one caller can never fill the table
//! and lock everybody else out. A std mutex is enough: it is never held across an `.await`.

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use serde_json::{Map, Value};

use super::wire::LogLevel;

/// Why a session could not be used or opened.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub(super) enum SessionError {
    /// Unknown, ended, expired, or opened by another token: HTTP 404.
    #[error("session not found: it ended, expired, or never existed; initialize a new one")]
    NotFound,
    /// The table is full of live sessions: HTTP 503.
    #[error("too many open sessions; try again later")]
    Full,
}

/// The largest client capabilities object a session keeps (serialized); a bigger one is kept
/// as its capability names only, so a session's size stays bounded whatever a client sends.
const MAX_CAPABILITIES_BYTES: usize = 4096;
/// The most capability names kept from an oversized capabilities object.
const MAX_CAPABILITY_NAMES: usize = 32;

#[derive(Debug)]
struct Session {
    token_id: String,
    state: SessionState,
    last_used: Instant,
}

/// What a session remembers for its requests.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct SessionState {
    /// The version negotiated at `initialize`.
    pub protocol_version: String,
    /// The capabilities the client declared at `initialize` (bounded, see
    /// [`bounded_capabilities`]).
    pub client_capabilities: Map<String, Value>,
    /// The level `logging/setLevel` asked for; no log messages before it.
    pub log_level: Option<LogLevel>,
}

/// `capabilities` as a session keeps it: verbatim when small, else the names alone.
pub(super) fn bounded_capabilities(capabilities: &Map<String, Value>) -> Map<String, Value> {
    let small =
        serde_json::to_string(capabilities).is_ok_and(|s| s.len() <= MAX_CAPABILITIES_BYTES);
    if small {
        return capabilities.clone();
    }
    capabilities
        .keys()
        .filter(|name| name.len() <= 64)
        .take(MAX_CAPABILITY_NAMES)
        .map(|name| (name.clone(), Value::Object(Map::new())))
        .collect()
}

/// The live sessions, bounded in all and per token, and idle-expiring.
#[derive(Debug)]
pub(super) struct SessionTable {
    sessions: Mutex<HashMap<String, Session>>,
    max_sessions: usize,
    max_per_token: usize,
    idle_timeout: Duration,
}

impl SessionTable {
    pub fn new(max_sessions: usize, max_per_token: usize, idle_timeout: Duration) -> SessionTable {
        SessionTable {
            sessions: Mutex::new(HashMap::new()),
            max_sessions,
            max_per_token: max_per_token.max(1),
            idle_timeout,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Session>> {
        // No code path panics while holding the lock; if one ever did, the map is still a
        // consistent map of sessions, so keep serving.
        self.sessions.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Opens a session for `token_id` at `protocol_version` and returns its id (128 random bits,
    /// hex: visible ASCII as the transport requires).
    pub fn open(
        &self,
        token_id: &str,
        protocol_version: &str,
        client_capabilities: &Map<String, Value>,
        now: Instant,
    ) -> Result<String, SessionError> {
        let mut sessions = self.lock();
        // This token's own sessions first: at its bound, its least recently used one ends
        // (its id then answers 404, and a client re-initializes, as the transport says).
        let mut own = 0usize;
        let mut least_recent: Option<(&String, Instant)> = None;
        for (id, session) in sessions.iter() {
            if session.token_id == token_id {
                own += 1;
                if least_recent.is_none_or(|(_, used)| session.last_used < used) {
                    least_recent = Some((id, session.last_used));
                }
            }
        }
        if own >= self.max_per_token
            && let Some(id) = least_recent.map(|(id, _)| id.clone())
        {
            sessions.remove(&id);
        }
        if sessions.len() >= self.max_sessions {
            let idle = self.idle_timeout;
            sessions.retain(|_, s| now.saturating_duration_since(s.last_used) < idle);
        }
        if sessions.len() >= self.max_sessions {
            return Err(SessionError::Full);
        }
        let id = hex::encode(rand::random::<[u8; 16]>());
        sessions.insert(
            id.clone(),
            Session {
                token_id: token_id.to_owned(),
                state: SessionState {
                    protocol_version: protocol_version.to_owned(),
                    client_capabilities: bounded_capabilities(client_capabilities),
                    log_level: None,
                },
                last_used: now,
            },
        );
        Ok(id)
    }

    /// What a live session owned by `token_id` remembers; marks it used.
    pub fn resolve(
        &self,
        id: &str,
        token_id: &str,
        now: Instant,
    ) -> Result<SessionState, SessionError> {
        self.with_session(id, token_id, now, |session| session.state.clone())
    }

    /// Sets the log level of a live session owned by `token_id`.
    pub fn set_log_level(
        &self,
        id: &str,
        token_id: &str,
        level: LogLevel,
        now: Instant,
    ) -> Result<(), SessionError> {
        self.with_session(id, token_id, now, |session| {
            session.state.log_level = Some(level);
        })
    }

    fn with_session<T>(
        &self,
        id: &str,
        token_id: &str,
        now: Instant,
        then: impl FnOnce(&mut Session) -> T,
    ) -> Result<T, SessionError> {
        let mut sessions = self.lock();
        let Some(session) = sessions.get_mut(id) else {
            return Err(SessionError::NotFound);
        };
        if now.saturating_duration_since(session.last_used) >= self.idle_timeout {
            sessions.remove(id);
            return Err(SessionError::NotFound);
        }
        if session.token_id != token_id {
            return Err(SessionError::NotFound);
        }
        session.last_used = now;
        Ok(then(session))
    }

    /// Ends a live session owned by `token_id`.
    pub fn close(&self, id: &str, token_id: &str, now: Instant) -> Result<(), SessionError> {
        self.resolve(id, token_id, now)?;
        self.lock().remove(id);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn open_resolve_close() {
        let table = SessionTable::new(4, 4, Duration::from_secs(60));
        let now = Instant::now();
        let id = table.open("tok", "2025-11-25", &Map::new(), now).unwrap();
        assert_eq!(id.len(), 32);
        assert_eq!(
            table.resolve(&id, "tok", now).unwrap().protocol_version,
            "2025-11-25"
        );
        assert_eq!(
            table.resolve(&id, "other", now),
            Err(SessionError::NotFound)
        );
        assert_eq!(table.close(&id, "other", now), Err(SessionError::NotFound));
        table.close(&id, "tok", now).unwrap();
        assert_eq!(table.resolve(&id, "tok", now), Err(SessionError::NotFound));
        assert_eq!(
            table.resolve("nope", "tok", now),
            Err(SessionError::NotFound)
        );
    }

    #[test]
    fn idle_sessions_expire_and_make_room() {
        // Three tokens, one session each: the table (not a per-token bound) is what is full.
        let table = SessionTable::new(2, 2, Duration::from_secs(60));
        let start = Instant::now();
        let a = table.open("tok", "2025-06-18", &Map::new(), start).unwrap();
        table
            .open("tok-2", "2025-06-18", &Map::new(), start)
            .unwrap();
        assert_eq!(
            table.open("tok-3", "2025-06-18", &Map::new(), start),
            Err(SessionError::Full)
        );
        let later = start + Duration::from_secs(61);
        assert_eq!(table.resolve(&a, "tok", later), Err(SessionError::NotFound));
        assert!(table.open("tok", "2025-06-18", &Map::new(), later).is_ok());
    }

    #[test]
    fn one_token_holds_at_most_its_bound_and_loses_its_least_recent_first() {
        let table = SessionTable::new(8, 3, Duration::from_secs(60));
        let start = Instant::now();
        let at = |ms| start + Duration::from_millis(ms);
        let first = table
            .open("greedy", "2025-06-18", &Map::new(), at(0))
            .unwrap();
        let second = table
            .open("greedy", "2025-06-18", &Map::new(), at(1))
            .unwrap();
        let third = table
            .open("greedy", "2025-06-18", &Map::new(), at(2))
            .unwrap();
        // The first one is used again: the second is now the least recent.
        table.resolve(&first, "greedy", at(3)).unwrap();
        let fourth = table
            .open("greedy", "2025-06-18", &Map::new(), at(4))
            .unwrap();
        assert_eq!(
            table.resolve(&second, "greedy", at(5)),
            Err(SessionError::NotFound)
        );
        for id in [&first, &third, &fourth] {
            assert!(table.resolve(id, "greedy", at(5)).is_ok());
        }
        // However many it opens, others still get sessions: the table never fills up.
        for i in 0..100 {
            table
                .open("greedy", "2025-06-18", &Map::new(), at(10 + i))
                .unwrap();
        }
        let others: Vec<String> = (0..5)
            .map(|i| {
                table
                    .open(&format!("other-{i}"), "2025-11-25", &Map::new(), at(200))
                    .unwrap()
            })
            .collect();
        for (i, id) in others.iter().enumerate() {
            assert!(table.resolve(id, &format!("other-{i}"), at(201)).is_ok());
        }
    }

    #[test]
    fn a_session_keeps_bounded_capabilities_and_its_own_log_level() {
        let table = SessionTable::new(4, 4, Duration::from_secs(60));
        let now = Instant::now();
        let small: Map<String, Value> = serde_json::from_value(
            serde_json::json!({"sampling": {}, "roots": {"listChanged": true}}),
        )
        .unwrap();
        let id = table.open("tok", "2025-11-25", &small, now).unwrap();
        let state = table.resolve(&id, "tok", now).unwrap();
        assert_eq!(state.client_capabilities, small);
        assert_eq!(state.log_level, None);
        table
            .set_log_level(&id, "tok", LogLevel::Warning, now)
            .unwrap();
        assert_eq!(
            table.resolve(&id, "tok", now).unwrap().log_level,
            Some(LogLevel::Warning)
        );
        assert_eq!(
            table.set_log_level(&id, "other", LogLevel::Debug, now),
            Err(SessionError::NotFound)
        );
        // A huge capabilities object is kept as (a bounded number of) its names.
        let mut huge = Map::new();
        for i in 0..1000 {
            huge.insert(format!("cap{i}"), Value::String("x".repeat(100)));
        }
        huge.insert("y".repeat(100), Value::Null);
        let kept = bounded_capabilities(&huge);
        assert_eq!(kept.len(), MAX_CAPABILITY_NAMES);
        assert!(kept.values().all(|v| v == &Value::Object(Map::new())));
        assert!(kept.keys().all(|k| k.len() <= 64));
    }
}
