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

use crate::db::Sql;
use crate::identity::store::{IdentityError, IdentityStore, new_id};

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

#[cfg(test)]
mod tests {
    use super::AttemptLimit;

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
