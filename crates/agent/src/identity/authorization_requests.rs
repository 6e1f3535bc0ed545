//! OAuth authorization requests waiting for the person's consent (`/oauth/authorize` to
//! `/oauth/consent`): rows of the identity store, so in a cluster the consent page and its
//! decision may reach another agentd host than the request. A request's id is in the consent
//! page's address; it is kept as its SHA-256. A request is decided once, and stays (decided)
//! until it expires, so a second decision is told so.
//!
//! `/oauth/authorize` is anonymous, so what waits is bounded three ways ([`PendingLimits`]):
//! undecided requests per client and per source address, and, as a last resort, all live
//! requests together. One address (or one client) filling its own share never keeps another
//! client at another address out.

use crate::db::Sql;
use crate::identity::store::{IdentityError, IdentityStore};
use crate::identity::token;

/// How many requests may wait at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PendingLimits {
    /// Undecided requests of one client.
    pub per_client: i64,
    /// Undecided requests from one source address (its bucket).
    pub per_address: i64,
    /// Live requests in all, decided ones included: the last resort.
    pub total: i64,
}

/// Which limit refused a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PendingRefusal {
    Client,
    Address,
    Total,
}

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
    /// Keep `request` (the server's JSON of it), made by `client_id` from `address`, under
    /// `id` until `ttl_ms` after `now`; refused (nothing kept) when one of the `limits` is
    /// reached, naming which.
    #[allow(clippy::too_many_arguments)]
    pub fn put_authorization_request(
        &self,
        id: &str,
        request: &str,
        client_id: &str,
        address: &str,
        now: i64,
        ttl_ms: i64,
        limits: PendingLimits,
    ) -> Result<Result<(), PendingRefusal>, IdentityError> {
        let hash = token::hash_secret(id);
        self.transaction(|tx| {
            tx.execute(
                "DELETE FROM oauth_requests WHERE created_at_ms <= ?1",
                &[&(now - ttl_ms)],
            )?;
            let from_address: i64 = tx.query_one(
                "SELECT count(*) FROM oauth_requests WHERE address = ?1 AND decided = 0",
                &[&address],
                |r| r.get(0),
            )?;
            if from_address >= limits.per_address {
                return Ok(Err(PendingRefusal::Address));
            }
            let of_client: i64 = tx.query_one(
                "SELECT count(*) FROM oauth_requests WHERE client_id = ?1 AND decided = 0",
                &[&client_id],
                |r| r.get(0),
            )?;
            if of_client >= limits.per_client {
                return Ok(Err(PendingRefusal::Client));
            }
            let waiting: i64 =
                tx.query_one("SELECT count(*) FROM oauth_requests", &[], |r| r.get(0))?;
            if waiting >= limits.total {
                return Ok(Err(PendingRefusal::Total));
            }
            tx.execute(
                "INSERT INTO oauth_requests (id_hash, request, created_at_ms, decided, client_id, address)
                 VALUES (?1, ?2, ?3, 0, ?4, ?5)",
                &[&hash, &request, &now, &client_id, &address],
            )?;
            Ok(Ok(()))
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
