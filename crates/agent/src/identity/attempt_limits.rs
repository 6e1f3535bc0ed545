//! Failed attempts by key (`user:<name>`, `<address>`, `register:<address>`, …) within a
//! window: rows of the identity store, so in a cluster every agentd host counts the same
//! failures (a guesser spread over hosts by a load balancer meets one limit, not one per host).
//!
//! An attempt is counted before it is checked, in one transaction with the check of every
//! key's count, so concurrent attempts (on one host or several) cannot slip past a limit
//! together; one that succeeds is uncounted ([`IdentityStore::uncount_attempt`]). Rows older
//! than the window are swept as attempts are counted. An attempt refused by a limit is not
//! counted: waiting is all it takes.
//!
//! A key's limit is a count in the window ([`AttemptLimit::Count`]), or a backoff
//! ([`AttemptLimit::Backoff`]): a few failures free, then a wait after the last one that
//! doubles with every further failure, so a guesser slows down fast while a person who
//! mistyped waits seconds, not the whole window.
//!
//! [`FailureLimits`] is how the public listener's endpoints count (console sign-in and invites,
//! device-login approval, OAuth registration and authorization): by keys made from the client's
//! address ([`ClientAddress`], which the listener puts in each request), on a blocking thread.

use crate::db::Sql;
use crate::identity::store::{IdentityError, IdentityStore, new_id};
use hyper::http::request::Parts;
use std::net::IpAddr;

/// The rows one counted attempt added (one per key): uncounted together if it succeeds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CountedAttempt(Vec<String>);

/// How many failures under one key are let through in the window.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AttemptLimit {
    /// At most this many in the window; the next waits until the oldest leave it.
    Count(usize),
    /// `free` failures, then each further attempt waits `first_wait_ms` after the last
    /// failure, doubled for every failure past `free`, and never longer than the window.
    Backoff { free: usize, first_wait_ms: i64 },
}

impl From<usize> for AttemptLimit {
    fn from(count: usize) -> AttemptLimit {
        AttemptLimit::Count(count)
    }
}

impl AttemptLimit {
    /// How long after `now` the next attempt must wait, given the key's failures `times`
    /// (oldest first) in the window; `None` when it may go now.
    fn wait_ms(self, times: &[i64], now: i64, window_ms: i64) -> Option<i64> {
        match self {
            AttemptLimit::Count(limit) => {
                if limit == 0 || times.len() < limit {
                    return None;
                }
                // The next attempt is allowed once enough of the oldest failures expired.
                let oldest = times[times.len() - limit];
                Some(oldest + window_ms - now)
            }
            AttemptLimit::Backoff {
                free,
                first_wait_ms,
            } => {
                let past = times.len().checked_sub(free)?;
                let last = *times.last()?;
                let doublings = u32::try_from(past).unwrap_or(u32::MAX).min(32);
                let wait = first_wait_ms
                    .saturating_mul(1_i64 << doublings)
                    .min(window_ms);
                let ms = last + wait - now;
                (ms > 0).then_some(ms)
            }
        }
    }
}

impl IdentityStore {
    /// Counts an attempt under each `(key, limit)`, unless a key's failures in the
    /// `window_ms` before `now` already reach its [`AttemptLimit`]: then nothing is counted and
    /// the answer is the seconds until every key lets an attempt through again.
    pub fn count_attempt(
        &self,
        keys: &[(&str, impl Into<AttemptLimit> + Copy)],
        now: i64,
        window_ms: i64,
    ) -> Result<Result<CountedAttempt, i64>, IdentityError> {
        let since = now - window_ms;
        let keys: Vec<(&str, AttemptLimit)> = keys.iter().map(|(k, l)| (*k, (*l).into())).collect();
        self.transaction(|tx| {
            tx.execute("DELETE FROM attempt_failures WHERE at_ms <= ?1", &[&since])?;
            let mut wait_ms: Option<i64> = None;
            for (key, limit) in &keys {
                let times: Vec<i64> = tx.query_all(
                    "SELECT at_ms FROM attempt_failures WHERE key = ?1 ORDER BY at_ms",
                    &[key],
                    |r| r.get(0),
                )?;
                if let Some(ms) = limit.wait_ms(&times, now, window_ms) {
                    wait_ms = Some(wait_ms.map_or(ms, |w| w.max(ms)));
                }
            }
            if let Some(ms) = wait_ms {
                return Ok(Err((ms + 999) / 1000));
            }
            let mut rows = Vec::with_capacity(keys.len());
            for (key, _) in &keys {
                let id = new_id("af");
                tx.execute(
                    "INSERT INTO attempt_failures (id, key, at_ms) VALUES (?1, ?2, ?3)",
                    &[&id, key, &now],
                )?;
                rows.push(id);
            }
            Ok(Ok(CountedAttempt(rows)))
        })
    }

    /// The attempt succeeded: it no longer counts as a failure.
    pub fn uncount_attempt(&self, attempt: &CountedAttempt) -> Result<(), IdentityError> {
        let mut db = self.db()?;
        for id in &attempt.0 {
            db.execute("DELETE FROM attempt_failures WHERE id = ?1", &[id])?;
        }
        Ok(())
    }
}

/// The client's address, which agentd's public listener puts in each request's extensions
/// (for the failed-attempt limits): the TCP peer's, never a header's (agentd trusts no proxy).
#[derive(Debug, Clone, Copy)]
pub struct ClientAddress(pub IpAddr);

impl ClientAddress {
    /// What limits count this client under: its IPv4 address (an IPv4-mapped IPv6 one as
    /// IPv4), or the /64 of an IPv6 one, which one host usually holds whole.
    pub fn bucket(&self) -> String {
        match self.0 {
            IpAddr::V4(v4) => v4.to_string(),
            IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
                Some(v4) => v4.to_string(),
                None => {
                    let prefix = u128::from(v6) & !((1u128 << 64) - 1);
                    format!("{}/64", std::net::Ipv6Addr::from(prefix))
                }
            },
        }
    }
}

/// Failed attempts count for this long: 15 minutes.
pub const FAILURE_WINDOW_MS: i64 = 15 * 60_000;
/// Failed attempts by key (`user:<name>`, `address:<ip>`), counted in the identity store
/// ([`crate::identity::attempt_limits`]) so every agentd host of a cluster counts the same.
/// Cheap to clone.
#[derive(Clone)]
pub struct FailureLimits {
    identity: IdentityStore,
}

/// Why an attempt was not let through: too many failures (the seconds to wait), or the store
/// could not count it (refused rather than let through uncounted).
pub enum Limited {
    Wait(i64),
    Unavailable(String),
}

impl FailureLimits {
    pub fn new(identity: IdentityStore) -> FailureLimits {
        FailureLimits { identity }
    }

    /// Count an attempt as failed before it is checked, so concurrent attempts cannot slip
    /// past the limit together; [`FailureLimits::succeeded`] takes it back. If a key is
    /// already at its limit nothing is counted.
    pub async fn begin(
        &self,
        keys: &[(&str, impl Into<AttemptLimit> + Copy)],
        now: i64,
    ) -> Result<CountedAttempt, Limited> {
        let identity = self.identity.clone();
        let keys: Vec<(String, AttemptLimit)> = keys
            .iter()
            .map(|(k, l)| ((*k).to_owned(), (*l).into()))
            .collect();
        let counted = tokio::task::spawn_blocking(move || {
            let keys: Vec<(&str, AttemptLimit)> =
                keys.iter().map(|(k, l)| (k.as_str(), *l)).collect();
            identity.count_attempt(&keys, now, FAILURE_WINDOW_MS)
        })
        .await;
        match counted {
            Ok(Ok(Ok(attempt))) => Ok(attempt),
            Ok(Ok(Err(seconds))) => Err(Limited::Wait(seconds)),
            Ok(Err(error)) => Err(Limited::Unavailable(error.to_string())),
            Err(error) => Err(Limited::Unavailable(error.to_string())),
        }
    }

    /// The attempt [`FailureLimits::begin`] counted succeeded: uncount it. A failure to do so
    /// is logged: it only leaves one failure too many in the window.
    pub async fn succeeded(&self, attempt: &CountedAttempt) {
        let (identity, attempt) = (self.identity.clone(), attempt.clone());
        let uncounted =
            tokio::task::spawn_blocking(move || identity.uncount_attempt(&attempt)).await;
        if let Ok(Err(error)) = uncounted {
            tracing::warn!(%error, "cannot uncount a successful attempt");
        }
    }
}

/// The client's bucket ([`ClientAddress::bucket`]), `unknown` when the listener gave none.
pub fn client_bucket(parts: &Parts) -> String {
    parts
        .extensions
        .get::<ClientAddress>()
        .map_or_else(|| "unknown".into(), ClientAddress::bucket)
}

/// The key a client's address counts under: `address:<bucket>`.
pub fn address_key(parts: &Parts) -> String {
    format!("address:{}", client_bucket(parts))
}

#[cfg(test)]
mod tests {
    use super::{AttemptLimit, ClientAddress};

    #[test]
    fn clients_count_by_address_and_ipv6_ones_by_their_64() {
        let bucket = |ip: &str| ClientAddress(ip.parse().unwrap()).bucket();
        assert_eq!(bucket("127.0.0.2"), "127.0.0.2");
        assert_eq!(bucket("::ffff:10.1.2.3"), "10.1.2.3");
        assert_eq!(bucket("2001:db8:1:2:aaaa::1"), "2001:db8:1:2::/64");
        assert_eq!(bucket("2001:db8:1:2:bbbb::9"), bucket("2001:db8:1:2::1"));
        assert_ne!(bucket("2001:db8:1:3::1"), bucket("2001:db8:1:2::1"));
    }

    const WINDOW: i64 = 15 * 60_000;

    #[test]
    fn a_backoff_lets_a_few_through_then_doubles_its_wait_up_to_the_window() {
        let limit = AttemptLimit::Backoff {
            free: 3,
            first_wait_ms: 30_000,
        };
        let now = 10_000_000;
        assert_eq!(limit.wait_ms(&[], now, WINDOW), None);
        assert_eq!(limit.wait_ms(&[now - 3, now - 2], now, WINDOW), None);
        // The fourth attempt, right after three failures: 30 s after the last one.
        let three = [now - 3_000, now - 2_000, now - 1_000];
        assert_eq!(limit.wait_ms(&three, now, WINDOW), Some(29_000));
        assert_eq!(limit.wait_ms(&three, now + 29_000, WINDOW), None);
        // Each further failure doubles it: 60 s, 120 s, …
        let four = [now - 4, now - 3, now - 2, now];
        assert_eq!(limit.wait_ms(&four, now, WINDOW), Some(60_000));
        let five = [now - 5, now - 4, now - 3, now - 2, now];
        assert_eq!(limit.wait_ms(&five, now, WINDOW), Some(120_000));
        // Never longer than the window, however many.
        let many: Vec<i64> = (0..200).map(|i| now - 200 + i).collect();
        assert_eq!(limit.wait_ms(&many, now, WINDOW), Some(WINDOW - 1));
        assert_eq!(limit.wait_ms(&many, now + WINDOW - 1, WINDOW), None);
    }

    #[test]
    fn a_count_waits_for_the_oldest_failure_to_leave_the_window() {
        let limit = AttemptLimit::Count(2);
        let now = 10_000_000;
        assert_eq!(limit.wait_ms(&[now - 5_000], now, WINDOW), None);
        assert_eq!(
            limit.wait_ms(&[now - 5_000, now - 1_000], now, WINDOW),
            Some(WINDOW - 5_000)
        );
        assert_eq!(AttemptLimit::Count(0).wait_ms(&[now; 9], now, WINDOW), None);
    }
}
