//! Failed attempts by key (`user:<name>`, `<address>`, `register:<address>`, …) within a
//! window: rows of the identity store, so in a cluster every agentd host counts the same
//! failures (a guesser spread over hosts by a load balancer meets one limit, not one per host).
//!
//! An attempt is counted before it is checked, in one transaction with the check of every
//! key's count, so concurrent attempts (on one host or several) cannot slip past a limit
//! together; one that succeeds is uncounted ([`IdentityStore::uncount_attempt`]). Rows older
//! than the window are swept as attempts are counted.

use crate::db::Sql;
use crate::identity::store::{IdentityError, IdentityStore, new_id};

/// The rows one counted attempt added (one per key): uncounted together if it succeeds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CountedAttempt(Vec<String>);

impl IdentityStore {
    /// Counts an attempt under each `(key, limit)`, unless a key already has `limit` failures
    /// in the `window_ms` before `now`: then nothing is counted and the answer is the seconds
    /// until every key is under its limit again.
    pub fn count_attempt(
        &self,
        keys: &[(&str, usize)],
        now: i64,
        window_ms: i64,
    ) -> Result<Result<CountedAttempt, i64>, IdentityError> {
        let since = now - window_ms;
        self.transaction(|tx| {
            tx.execute("DELETE FROM attempt_failures WHERE at_ms <= ?1", &[&since])?;
            let mut wait_ms: Option<i64> = None;
            for (key, limit) in keys {
                let times: Vec<i64> = tx.query_all(
                    "SELECT at_ms FROM attempt_failures WHERE key = ?1 ORDER BY at_ms",
                    &[key],
                    |r| r.get(0),
                )?;
                if *limit > 0 && times.len() >= *limit {
                    // The next attempt is allowed once enough of the oldest failures expired.
                    let oldest = times[times.len() - limit];
                    let ms = oldest + window_ms - now;
                    wait_ms = Some(wait_ms.map_or(ms, |w| w.max(ms)));
                }
            }
            if let Some(ms) = wait_ms {
                return Ok(Err((ms + 999) / 1000));
            }
            let mut rows = Vec::with_capacity(keys.len());
            for (key, _) in keys {
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
