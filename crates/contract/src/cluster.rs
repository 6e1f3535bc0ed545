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

/// gatewayd host `host_id` answers agentd's calls here (NATS request-reply): a dispatch, cancel
/// or recovery for a device whose connection that host holds, as a [`PeerCall`] answered with a
/// [`PeerAnswer`], sealed under the cluster's gatewayd key ([`GATEWAYD_KEY`]). Host ids are NATS
/// subject tokens (`cluster.host_id` is ASCII letters, digits, `-` and `_`).
pub fn gateway_subject(host_id: &str) -> String {
    format!("agentworks.gateway.{host_id}.call")
}

/// Any one gatewayd answers agentd's calls here (a NATS queue group, [`GATEWAY_QUEUE`]): the
/// calls any host can answer from the shared database (devices, outcomes, where a device is),
/// and the first try of a cancel or recovery, which a host that does not hold the device
/// refuses with `device_on_other_host` and the holder's id.
pub const GATEWAY_ANY_SUBJECT: &str = "agentworks.gateways.call";

/// The queue group of [`GATEWAY_ANY_SUBJECT`]: each call reaches one gatewayd.
pub const GATEWAY_QUEUE: &str = "agentworks-gatewayd";

/// Every host's [`gateway_subject`], for NATS permissions: only agentd users publish here, only
/// gatewayd users subscribe (and [`GATEWAY_ANY_SUBJECT`] likewise).
pub const GATEWAY_SUBJECTS: &str = "agentworks.gateway.*.call";

/// The name of the cluster key [`gateway_subject`]'s and [`GATEWAY_ANY_SUBJECT`]'s calls are
/// sealed with.
pub const GATEWAYD_KEY: &str = "gatewayd-calls";

/// agentd host `host_id` answers the other agentd hosts' calls here (NATS request-reply): a
/// [`PeerCall`] to [`AGENTD_CANCEL_TURN`] for a turn it runs, answered with a [`PeerAnswer`],
/// sealed under the cluster's agentd key ([`AGENTD_KEY`]).
pub fn agentd_subject(host_id: &str) -> String {
    format!("agentworks.agentd.{host_id}.call")
}

/// Every host's [`agentd_subject`], for NATS permissions: only agentd users publish and
/// subscribe here.
pub const AGENTD_SUBJECTS: &str = "agentworks.agentd.*.call";

/// The name of the cluster key [`agentd_subject`]'s calls are sealed with.
pub const AGENTD_KEY: &str = "agentd-calls";

/// The one call between agentd hosts: stop the turn running in a chat (body
/// [`CancelTurn`]); answered 202 `{chat_id, turn}` or 409 `no_turn_running`, as
/// `POST /v1/chats/{id}/cancel` is.
pub const AGENTD_CANCEL_TURN: &str = "/v1/turns/cancel";

/// The body of an [`AGENTD_CANCEL_TURN`] call. The calling host has authenticated the chat's
/// owner; the MAC proves the call comes from a host of the cluster.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CancelTurn {
    pub chat_id: String,
}

/// The workspaced of cluster host `host_id` answers agentd's calls here (NATS request-reply,
/// with `[workspaced] serve_cluster`): the same endpoints and bodies as `workspaced.sock`, as a
/// [`PeerCall`] answered with a [`PeerAnswer`], sealed under the cluster's workspaced key.
pub fn workspaced_subject(host_id: &str) -> String {
    format!("agentworks.workspaced.{host_id}.call")
}

/// The name of the cluster key ([`workspaced_subject`]'s calls are sealed with) in the shared
/// database's `cluster.keys`.
pub const WORKSPACED_KEY: &str = "workspaced-calls";

/// Every host's [`workspaced_subject`], for NATS permissions: only agentd users publish here,
/// only workspaced users subscribe.
pub const WORKSPACED_SUBJECTS: &str = "agentworks.workspaced.*.call";

/// The header that carries a peer message's MAC: hex HMAC-SHA256, under the cluster's peer
/// key, of the subject the message is published on, a zero byte, and the payload.
pub const PEER_MAC_HEADER: &str = "Agentworks-Mac";

/// A call from one host to another over NATS: run this socket call there, as if it had been
/// made on that host's socket (`gatewayd.sock` from agentd to a gatewayd host, which never sends it
/// on to a third host; `workspaced.sock` from agentd to a storage host).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PeerCall {
    /// The calling host's id.
    pub origin: String,
    /// When it was sent (ms since the epoch); a call much older or newer is dropped.
    pub sent_at_ms: i64,
    /// The socket endpoint, e.g. `/v1/dispatch`.
    pub path: String,
    /// The endpoint's JSON body, as agentd sent it.
    pub body: String,
}

/// The answer to a [`PeerCall`]: the HTTP status and JSON body that host's socket answered.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PeerAnswer {
    pub status: u16,
    pub body: String,
}
