//! OAuth authorization requests waiting for the person's consent (`/oauth/authorize` to
//! `/oauth/consent`): rows of the identity store, so in a cluster the consent page and its
//! decision may reach another agentd host than the request. A request's id is in the consent
//! page's address; it is kept as its SHA-256. A request is decided once, and stays (decided)
//! until it expires, so a second decision is told so.

use crate::db::Sql;
use crate::identity::store::{IdentityError, IdentityStore};
use crate::identity::token;

/// What deciding a waiting request came to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Decided now: the request as it was kept.
    Taken(String),
    /// Decided before.
    AlreadyDecided,
    /// No such request, or it expired.
    NotFound,
}

impl IdentityStore {
    /// Keep `request` (the server's JSON of it) under `id` until `ttl_ms` after `now`; false
    /// (nothing kept) when `max` live requests are waiting already.
    pub fn put_authorization_request(
        &self,
        id: &str,
        request: &str,
        now: i64,
        ttl_ms: i64,
        max: i64,
    ) -> Result<bool, IdentityError> {
        let hash = token::hash_secret(id);
        self.transaction(|tx| {
            tx.execute(
                "DELETE FROM oauth_requests WHERE created_at_ms <= ?1",
                &[&(now - ttl_ms)],
            )?;
            let waiting: i64 =
                tx.query_one("SELECT count(*) FROM oauth_requests", &[], |r| r.get(0))?;
            if waiting >= max {
                return Ok(false);
            }
            tx.execute(
                "INSERT INTO oauth_requests (id_hash, request, created_at_ms, decided)
                 VALUES (?1, ?2, ?3, 0)",
                &[&hash, &request, &now],
            )?;
            Ok(true)
        })
    }

    /// The live, undecided request kept under `id`, if any.
    pub fn authorization_request(
        &self,
        id: &str,
        now: i64,
        ttl_ms: i64,
    ) -> Result<Option<String>, IdentityError> {
        Ok(self.db()?.query_opt(
            "SELECT request FROM oauth_requests
             WHERE id_hash = ?1 AND created_at_ms > ?2 AND decided = 0",
            &[&token::hash_secret(id), &(now - ttl_ms)],
            |r| r.get(0),
        )?)
    }

    /// Decide the request kept under `id`: once, on whichever host.
    pub fn decide_authorization_request(
        &self,
        id: &str,
        now: i64,
        ttl_ms: i64,
    ) -> Result<Decision, IdentityError> {
        let hash = token::hash_secret(id);
        let since = now - ttl_ms;
        self.transaction(|tx| {
            let taken: Option<String> = tx.query_opt(
                "UPDATE oauth_requests SET decided = 1
                 WHERE id_hash = ?1 AND created_at_ms > ?2 AND decided = 0
                 RETURNING request",
                &[&hash, &since],
                |r| r.get(0),
            )?;
            if let Some(request) = taken {
                return Ok(Decision::Taken(request));
            }
            let decided: Option<i64> = tx.query_opt(
                "SELECT decided FROM oauth_requests WHERE id_hash = ?1 AND created_at_ms > ?2",
                &[&hash, &since],
                |r| r.get(0),
            )?;
            Ok(if decided.is_some() {
                Decision::AlreadyDecided
            } else {
                Decision::NotFound
            })
        })
    }
}
