//! gatewayd hosts calling each other over NATS (issue 16). A dispatch, cancel or recovery that
//! agentd makes on this host's socket for a device whose connection another live host holds
//! (its lease says so) is sent to that host's [`peer_subject`] as a [`PeerCall`] and answered
//! there, by the same code, as if agentd had called that host's socket; its [`PeerAnswer`] is
//! this host's answer. The request id is still claimed once, in the shared database, by the
//! host that sends the frame, so the same id dispatched through two hosts at once runs once.
//!
//! Every call and answer is sealed and checked by [`agentworks_daemon::bus`], under the
//! cluster's peer key, which every host reads from the shared database. A message without a
//! valid MAC is dropped and logged, so a NATS user who cannot read the database cannot make any
//! gateway send anything to a laptop, and an answer cannot be forged onto another call's inbox.
//! A call whose clock is off by more than [`bus::MAX_CLOCK_SKEW`] is dropped too (a replay runs
//! nothing twice anyway: the request id is claimed in the database). A call is served only here: one for a device this host does not
//! hold is refused, never passed on to a third host.
//!
//! Must never: act on a message whose MAC does not verify; log the peer key; answer a call
//! from a host that is not a gatewayd of this cluster (the MAC is the proof).

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use hyper::StatusCode;
use tokio_util::sync::CancellationToken;

use agentworks_contract::cluster::{PeerCall, peer_subject};
use agentworks_contract::executor::MAX_FRAME_BYTES;
use agentworks_daemon::bus::{self, BusError, OpenedCall};
use agentworks_support::clock::now_ms;

use crate::Gateway;

/// The largest call or answer read: a dispatch body and its envelope.
pub const MAX_MESSAGE_BYTES: usize = MAX_FRAME_BYTES + 4096;
/// The endpoints a peer may call.
pub const PEER_PATHS: [&str; 3] = ["/v1/dispatch", "/v1/cancel", "/v1/recover"];

/// The cluster's peer key (see [`crate::store::Store::peer_key`]).
pub type PeerKey = bus::BusKey;

/// Why a call to another host got no usable answer.
#[derive(Debug, thiserror::Error)]
pub enum PeerError {
    /// No gatewayd listens on that host's subject: the call reached no one.
    #[error("gatewayd host \"{host}\" is not listening on NATS; nothing was sent there")]
    NoResponders { host: String },
    /// The call may have been delivered; no answer came in time.
    #[error("gatewayd host \"{host}\" did not answer within {secs} s")]
    TimedOut { host: String, secs: u64 },
    /// Publishing or waiting failed otherwise (the NATS connection).
    #[error("calling gatewayd host \"{host}\" over NATS failed: {reason}")]
    Failed { host: String, reason: String },
    /// An answer came but is not one (a bad MAC, not a [`PeerAnswer`]); dropped.
    #[error("the answer from gatewayd host \"{host}\" was dropped: {problem}")]
    BadAnswer { host: String, problem: &'static str },
}

impl PeerError {
    /// True when the call certainly reached no host, so nothing can have been sent.
    pub fn nothing_sent(&self) -> bool {
        matches!(self, PeerError::NoResponders { .. })
    }
}

/// This host's side of the peer calls: the NATS client, the key and its own id.
#[derive(Clone)]
pub struct Peers {
    client: async_nats::Client,
    key: PeerKey,
    host: Arc<str>,
}

impl Peers {
    pub fn new(client: async_nats::Client, key: PeerKey, host: &str) -> Peers {
        Peers {
            client,
            key,
            host: Arc::from(host),
        }
    }

    /// This host's id.
    pub fn host(&self) -> &str {
        &self.host
    }

    /// Calls `path` with `body` on gatewayd host `host` and waits at most `timeout` for its
    /// answer: the status and JSON body that host's socket gave.
    pub async fn call(
        &self,
        host: &str,
        path: &str,
        body: &[u8],
        timeout: Duration,
    ) -> Result<(StatusCode, Bytes), PeerError> {
        let call = PeerCall {
            origin: self.host.to_string(),
            sent_at_ms: now_ms(),
            path: path.to_owned(),
            body: String::from_utf8_lossy(body).into_owned(),
        };
        let subject = peer_subject(host);
        let host = host.to_owned();
        bus::request(&self.client, &self.key, &subject, &call, timeout)
            .await
            .map_err(|error| match error {
                BusError::NoResponders { .. } => PeerError::NoResponders { host },
                BusError::TimedOut { secs, .. } => PeerError::TimedOut { host, secs },
                BusError::Failed { reason, .. } => PeerError::Failed { host, reason },
                BusError::BadAnswer { problem, .. } => PeerError::BadAnswer { host, problem },
            })
    }
}

/// Checks a message on this host's subject ([`bus::open_call`]), for the paths peers may
/// call. `Err` says why it is dropped.
fn open_call(
    key: &PeerKey,
    this_host: &str,
    message: &async_nats::Message,
    now_ms: i64,
) -> Result<OpenedCall, &'static str> {
    bus::open_call(key, message, now_ms, MAX_MESSAGE_BYTES, |call| {
        if call.origin == this_host {
            Err("sent by this host to itself")
        } else if !PEER_PATHS.contains(&call.path.as_str()) {
            Err("not an endpoint peers may call")
        } else {
            Ok(())
        }
    })
}

/// Answers the calls on this host's subject until `shutdown`, each in its own task (a dispatch
/// waits for the device's result); the tasks in flight are awaited before it returns.
pub async fn serve_calls(
    gateway: Gateway,
    peers: Peers,
    calls: async_nats::Subscriber,
    shutdown: CancellationToken,
) {
    let lost = "the NATS subscription for peer calls ended; other hosts cannot reach devices here";
    bus::serve_calls(
        calls,
        shutdown,
        "a peer call",
        lost,
        |message| open_call(&peers.key, peers.host(), message, now_ms()),
        |opened| answer(gateway.clone(), peers.clone(), opened),
    )
    .await;
}

/// Runs one call on this host and publishes its answer, sealed for the caller's inbox.
async fn answer(gateway: Gateway, peers: Peers, opened: OpenedCall) {
    let OpenedCall { call, reply } = opened;
    tracing::debug!(origin = %call.origin, path = %call.path, "a peer call");
    let body = Bytes::from(call.body);
    let response = crate::dispatch::serve_peer_call(&gateway, &call.path, &body).await;
    if let Err(error) = bus::answer_response(&peers.client, &peers.key, reply, response).await {
        tracing::warn!(%error, origin = %call.origin, "cannot answer a peer call");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The sealing and checks are [`bus`]'s (tested there); here only which paths peers may
    /// call, and never this host itself.
    #[test]
    fn peers_may_call_dispatch_cancel_and_recover_only() {
        let key = PeerKey::new([7; 32]);
        let subject = peer_subject("gw-b");
        let now = 1_000_000_000;
        let sealed_from = |origin: &str, path: &str| {
            let payload = serde_json::to_vec(&PeerCall {
                origin: origin.into(),
                sent_at_ms: now,
                path: path.into(),
                body: "{}".into(),
            })
            .unwrap();
            let mut headers = async_nats::HeaderMap::new();
            headers.insert(
                agentworks_contract::cluster::PEER_MAC_HEADER,
                key.seal(&subject, &payload).as_str(),
            );
            async_nats::Message {
                subject: subject.as_str().into(),
                reply: Some("_INBOX.abc".into()),
                length: payload.len(),
                payload: Bytes::from(payload),
                headers: Some(headers),
                status: None,
                description: None,
            }
        };
        let sealed = |path: &str| sealed_from("gw-a", path);
        assert_eq!(
            open_call(&key, "gw-b", &sealed_from("gw-b", "/v1/dispatch"), now),
            Err("sent by this host to itself")
        );
        for path in PEER_PATHS {
            assert!(
                open_call(&key, "gw-b", &sealed(path), now).is_ok(),
                "{path}"
            );
        }
        for path in ["/v1/devices", "/v1/health", "/v1/dispatch/x"] {
            assert!(
                open_call(&key, "gw-b", &sealed(path), now).is_err(),
                "{path}"
            );
        }
    }
}
