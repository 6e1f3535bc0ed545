//! Stopping a turn that runs on another agentd host (issue 16). A running turn lives in the
//! memory of the host that started it; its claim on the chat in the shared store
//! (`turn_claims`) names that host. `POST /v1/chats/{id}/cancel` on any host checks the owner as
//! usual, and when the turn is not its own, asks the claim's host over NATS
//! ([`agentd_subject`]) to stop it; that host answers as its own endpoint would (202 with the
//! turn, or 409 `no_turn_running`).
//!
//! Calls and answers are sealed under the cluster's agentd key ([`AGENTD_KEY`],
//! [`agentworks_daemon::bus`]), which only hosts that can read the shared database have: a call
//! without a valid MAC, a stale one, or one for anything but [`AGENTD_CANCEL_TURN`] is dropped
//! and logged, and stops nothing. The calling host has authenticated the chat's owner; the MAC
//! says the call comes from such a host.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use hyper::StatusCode;
use tokio_util::sync::CancellationToken;

use agentworks_contract::cluster::{
    AGENTD_CANCEL_TURN, AGENTD_KEY, CancelTurn, PeerCall, agentd_subject,
};
use agentworks_daemon::bus::{self, BusError, BusKey, OpenedCall};
use agentworks_daemon::config::ClusterConfig;
use agentworks_support::clock::now_ms;

use agentworks_daemon::ipc::envelope::{Body, Refusal};

/// How long a host waits for another to answer a cancel: it only looks up a map.
pub const CANCEL_TIMEOUT: Duration = Duration::from_secs(5);

/// The largest call accepted: a chat id in a small envelope.
const MAX_CALL_BYTES: usize = 4096;

/// Why this host cannot take calls from the other agentd hosts (agentd then refuses to start).
#[derive(Debug, thiserror::Error)]
pub enum TurnPeersError {
    #[error("cannot read the cluster's agentd key from the cluster database")]
    Key(#[source] bus::KeyError),
    #[error("cannot subscribe to {subject}: {reason}")]
    Subscribe { subject: String, reason: String },
}

/// This host's way to the other agentd hosts. Cheap to clone.
#[derive(Clone)]
pub struct TurnPeers {
    client: async_nats::Client,
    key: BusKey,
    /// This host's id: the calls' origin.
    origin: Arc<str>,
}

impl TurnPeers {
    /// Reads the cluster's agentd key and subscribes to this host's subject on `client`
    /// (agentd's NATS connection); the calls are then answered by [`serve`].
    pub async fn join(
        cluster: &ClusterConfig,
        client: async_nats::Client,
    ) -> Result<(TurnPeers, async_nats::Subscriber), TurnPeersError> {
        let key = bus::cluster_key(cluster, "agentworks-agentd", AGENTD_KEY)
            .await
            .map_err(TurnPeersError::Key)?;
        let origin: Arc<str> = Arc::from(cluster.host_id.as_deref().unwrap_or("-"));
        let subject = agentd_subject(&origin);
        let calls =
            client
                .subscribe(subject.clone())
                .await
                .map_err(|e| TurnPeersError::Subscribe {
                    subject,
                    reason: e.to_string(),
                })?;
        Ok((
            TurnPeers {
                client,
                key,
                origin,
            },
            calls,
        ))
    }

    /// This host's id.
    pub fn host(&self) -> &str {
        &self.origin
    }

    /// Asks agentd host `host` to stop the turn running in `chat_id`: its status and body.
    pub async fn cancel_on(
        &self,
        host: &str,
        chat_id: &str,
    ) -> Result<(StatusCode, Bytes), BusError> {
        let body = CancelTurn {
            chat_id: chat_id.to_owned(),
        };
        let call = PeerCall {
            origin: self.origin.to_string(),
            sent_at_ms: now_ms(),
            path: AGENTD_CANCEL_TURN.to_owned(),
            // A struct of one string always serializes.
            body: serde_json::to_string(&body).unwrap_or_default(),
        };
        bus::request(
            &self.client,
            &self.key,
            &agentd_subject(host),
            &call,
            CANCEL_TIMEOUT,
        )
        .await
    }
}

/// What a call may ask: only a turn's cancel.
fn accept(call: &PeerCall) -> Result<(), &'static str> {
    if call.path == AGENTD_CANCEL_TURN {
        Ok(())
    } else {
        Err("not a call agentd answers")
    }
}

/// What answers another host's call: the turns running here. The chat service implements it
/// (in [`crate::chat::api`], beside the cancel endpoint it answers as).
pub trait RunningTurns: Clone + Send + Sync + 'static {
    /// Stops the turn running in `chat_id` on this host, if one does, and answers as the cancel
    /// endpoint does (202 with the turn, or 409 `no_turn_running`); `origin` is the asking host.
    fn cancel_for_peer(
        &self,
        chat_id: &str,
        origin: &str,
    ) -> impl std::future::Future<Output = hyper::Response<Body>> + Send;
}

/// Answers the other hosts' calls on `calls` until `shutdown`, each in its own task.
pub async fn serve(
    peers: TurnPeers,
    calls: async_nats::Subscriber,
    chats: impl RunningTurns,
    shutdown: CancellationToken,
) {
    let key = peers.key.clone();
    bus::serve_calls(
        calls,
        shutdown,
        "a call from another agentd host",
        "the NATS subscription for the other agentd hosts' calls ended",
        |message| bus::open_call(&key, message, now_ms(), MAX_CALL_BYTES, accept),
        |opened| answer(peers.clone(), chats.clone(), opened),
    )
    .await;
}

/// Stops the turn a call names, if it runs here, and answers as the cancel endpoint does.
async fn answer(peers: TurnPeers, chats: impl RunningTurns, opened: OpenedCall) {
    let OpenedCall { call, reply } = opened;
    let response = match serde_json::from_str::<CancelTurn>(&call.body) {
        Ok(CancelTurn { chat_id }) => chats.cancel_for_peer(&chat_id, &call.origin).await,
        Err(_) => {
            Refusal::new(StatusCode::BAD_REQUEST, "invalid_request", "not a cancel").into_response()
        }
    };
    if let Err(error) = bus::answer_response(&peers.client, &peers.key, reply, response).await {
        tracing::warn!(%error, origin = %call.origin, "cannot answer another agentd host's call");
    }
}
