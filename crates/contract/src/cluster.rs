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

/// The runnerd of cluster host `host_id` answers agentd's calls here (NATS request-reply, with
/// `[runnerd] serve_cluster`): the endpoints and bodies of `runnerd.sock` (`/v1/providers`,
/// `/v1/turns/{id}/cancel`, `/v1/turns/{id}/bridge/{call_id}`) as a [`PeerCall`] answered with
/// a [`PeerAnswer`], sealed under the cluster's runnerd key ([`RUNNERD_KEY`]); and a turn,
/// [`RUNNERD_TURNS`] with a [`TurnCall`], whose events follow on the caller's inbox as
/// [`TurnFrame`]s.
pub fn runnerd_subject(host_id: &str) -> String {
    format!("agentworks.runnerd.{host_id}.call")
}

/// Every host's [`runnerd_subject`], for NATS permissions: only agentd users publish here,
/// only runnerd users subscribe.
pub const RUNNERD_SUBJECTS: &str = "agentworks.runnerd.*.call";

/// The name of the cluster key [`runnerd_subject`]'s calls, their answers and a turn's
/// [`TurnFrame`]s are sealed with.
pub const RUNNERD_KEY: &str = "runnerd-calls";

/// The path of the call that starts a turn over NATS (body [`TurnCall`]); answered 202
/// `{"inbox": …}` once the turn runs, or with the error envelope `runnerd.sock` would give.
pub const RUNNERD_TURNS: &str = "/v1/turns";

/// The most bytes of a [`TurnCall::inbox`].
pub const MAX_INBOX_LEN: usize = 128;

/// How often runnerd sends a [`TurnFrame::Heartbeat`] while a turn runs.
pub const TURN_HEARTBEAT_SECS: u64 = 5;

/// How many heartbeats may go missing before agentd ends a turn as `runnerd_unreachable`:
/// no valid frame for this many [`TURN_HEARTBEAT_SECS`] means runnerd or its host is gone.
pub const TURN_SILENT_HEARTBEATS: u64 = 3;

/// The body of a [`RUNNERD_TURNS`] call: the turn, and the NATS inbox the caller subscribed to
/// before calling, where runnerd publishes the turn's [`TurnFrame`]s.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TurnCall {
    /// `_INBOX.` and subject tokens of ASCII letters, digits, `-` and `_`
    /// ([`inbox_problem`]), at most [`MAX_INBOX_LEN`] bytes.
    pub inbox: String,
    pub turn: crate::runnerd::TurnRequest,
}

/// Why `inbox` cannot be a turn's inbox, if it cannot: runnerd publishes only to an inbox, never
/// to another daemon's subject.
pub fn inbox_problem(inbox: &str) -> Option<&'static str> {
    let Some(rest) = inbox.strip_prefix("_INBOX.") else {
        return Some("it does not start with _INBOX.");
    };
    if inbox.len() > MAX_INBOX_LEN {
        return Some("it is too long");
    }
    let token_ok = |t: &str| {
        !t.is_empty()
            && t.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
    };
    if !rest.split('.').all(token_ok) {
        return Some("a token is empty or holds a character other than letters, digits, - and _");
    }
    None
}

/// One message on a turn's inbox, sealed like a [`PeerAnswer`] (the MAC over the inbox and
/// the payload). `seq` counts the turn's frames from 0, heartbeats included: agentd takes each
/// number once and in order, so a frame replayed or reordered is dropped and one lost ends the
/// turn.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "frame", rename_all = "snake_case", deny_unknown_fields)]
pub enum TurnFrame {
    /// A piece of one line of the turn's stream (a `runnerd::TurnEvent` as JSON); `more`: the
    /// line goes on in the next frame (a line longer than a NATS message may carry).
    Line { seq: u64, data: String, more: bool },
    /// The turn still runs.
    Heartbeat { seq: u64 },
    /// The stream ends (after the turn's last event), as the socket's connection closes.
    Closed { seq: u64 },
}

impl TurnFrame {
    pub fn seq(&self) -> u64 {
        match self {
            TurnFrame::Line { seq, .. }
            | TurnFrame::Heartbeat { seq }
            | TurnFrame::Closed { seq } => *seq,
        }
    }
}

/// The header that carries a peer message's MAC: hex HMAC-SHA256, under the cluster's peer
/// key, of the subject the message is published on, a zero byte, and the payload.
pub const PEER_MAC_HEADER: &str = "Agentworks-Mac";

/// A call from one host to another over NATS: run this socket call there, as if it had been
/// made on that host's socket (`gatewayd.sock` from agentd to a gatewayd host, which never sends it
/// on to a third host; `workspaced.sock` and `runnerd.sock` from agentd to a storage host).
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_turns_inbox_is_an_inbox_and_nothing_else() {
        assert_eq!(inbox_problem("_INBOX.abc-1_Z.x9"), None);
        for (inbox, problem) in [
            (
                "agentworks.workspaced.s-1.call",
                "it does not start with _INBOX.",
            ),
            ("_INBOX.>", "a token is empty or holds"),
            ("_INBOX.*", "a token is empty or holds"),
            ("_INBOX.a..b", "a token is empty or holds"),
            ("_INBOX.", "a token is empty or holds"),
            ("_INBOX.a b", "a token is empty or holds"),
        ] {
            let found = inbox_problem(inbox).unwrap_or_else(|| panic!("{inbox} passed"));
            assert!(found.starts_with(problem), "{inbox}: {found}");
        }
        let long = format!("_INBOX.{}", "a".repeat(MAX_INBOX_LEN));
        assert_eq!(inbox_problem(&long), Some("it is too long"));
    }

    #[test]
    fn a_frame_says_its_kind_and_refuses_unknown_fields() {
        let line = TurnFrame::Line {
            seq: 3,
            data: "{}".into(),
            more: false,
        };
        let json = serde_json::to_string(&line).unwrap();
        assert_eq!(json, r#"{"frame":"line","seq":3,"data":"{}","more":false}"#);
        assert_eq!(serde_json::from_str::<TurnFrame>(&json).unwrap().seq(), 3);
        assert!(
            serde_json::from_str::<TurnFrame>(r#"{"frame":"heartbeat","seq":1,"x":1}"#).is_err()
        );
    }
}
