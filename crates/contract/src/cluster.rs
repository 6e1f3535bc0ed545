//! What the hosts of a cluster say to each other over NATS (`[cluster]`): the subjects and
//! their messages. Messages only wake and route; the rows in PostgreSQL are the truth.

use serde::{Deserialize, Serialize};

/// agentd announces a revoked token here, after the revocation is committed; every gatewayd
/// re-checks that token with agentd and closes its connections if it is no longer accepted.
pub const REVOKED_SUBJECT: &str = "agentworks.tokens.revoked";

/// The message on [`REVOKED_SUBJECT`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TokenRevoked {
    pub token_id: String,
}
