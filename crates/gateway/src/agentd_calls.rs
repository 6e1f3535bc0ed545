//! agentd's calls to gatewayd over NATS (issue 16). agentd dispatches a request on the
//! [`gateway_subject`] of the host that holds the device's connection (its lease), and makes
//! every other call on [`GATEWAY_ANY_SUBJECT`], which one gatewayd of the queue group answers
//! from the shared database. Each call is a [`PeerCall`] answered by the same code as the
//! socket ([`crate::dispatch::serve_agentd_call`]); its [`agentworks_contract::cluster::PeerAnswer`]
//! is that answer. A call for a device another host holds is refused `device_on_other_host`
//! with that host's id: gatewayd never passes a call on, and never publishes a call itself
//! (NATS permissions let only agentd publish on these subjects). The request id is claimed once,
//! in the shared database, by the host that sends the frame, so the same id dispatched by two
//! agentd hosts at once runs once.
//!
//! Every call and answer is sealed and checked by [`agentworks_daemon::bus`], under the
//! cluster's gatewayd key ([`GATEWAYD_KEY`]), which every host reads from the shared database.
//! A message without a valid MAC is dropped and logged, so a NATS user who cannot read the
//! database cannot make any gateway send anything to a laptop, and an answer cannot be forged
//! onto another call's inbox. A call whose clock is off by more than [`bus::MAX_CLOCK_SKEW`] is
//! dropped too (a replay runs nothing twice anyway: the request id is claimed in the database).
//!
//! Must never: act on a message whose MAC does not verify; log the key.

use std::sync::Arc;

use bytes::Bytes;
use tokio_util::sync::CancellationToken;

#[cfg(doc)]
use agentworks_contract::cluster::{GATEWAY_ANY_SUBJECT, GATEWAYD_KEY, PeerCall, gateway_subject};
use agentworks_contract::executor::MAX_FRAME_BYTES;
use agentworks_daemon::bus::{self, OpenedCall};
use agentworks_support::clock::now_ms;

use crate::Gateway;
use crate::dispatch::POST_PATHS;

/// The largest call or answer read: a dispatch body and its envelope.
pub const MAX_MESSAGE_BYTES: usize = MAX_FRAME_BYTES + 4096;

/// The cluster's gatewayd key ([`GATEWAYD_KEY`]).
pub type GatewaydKey = bus::BusKey;

/// This host's side of agentd's calls: the NATS client (to answer), the key and its own id.
#[derive(Clone)]
pub struct CallServer {
    client: async_nats::Client,
    key: GatewaydKey,
    host: Arc<str>,
}

impl CallServer {
    pub fn new(client: async_nats::Client, key: GatewaydKey, host: &str) -> CallServer {
        CallServer {
            client,
            key,
            host: Arc::from(host),
        }
    }

    /// This host's id.
    pub fn host(&self) -> &str {
        &self.host
    }
}

/// Checks a message on this host's subjects ([`bus::open_call`]), for gatewayd's endpoints.
/// `Err` says why it is dropped.
fn open_call(
    key: &GatewaydKey,
    message: &async_nats::Message,
    now_ms: i64,
) -> Result<OpenedCall, &'static str> {
    bus::open_call(key, message, now_ms, MAX_MESSAGE_BYTES, |call| {
        if POST_PATHS.contains(&call.path.as_str()) {
            Ok(())
        } else {
            Err("not an endpoint of gatewayd")
        }
    })
}

/// Answers the calls on `calls` (this host's subject, or the queue group's) until `shutdown`, each in its own task (a dispatch
/// waits for the device's result); the tasks in flight are awaited before it returns.
pub async fn serve_calls(
    gateway: Gateway,
    server: CallServer,
    calls: async_nats::Subscriber,
    shutdown: CancellationToken,
) {
    let lost = "a NATS subscription for agentd's calls ended; agentd cannot reach devices here";
    bus::serve_calls(
        calls,
        shutdown,
        "a call from agentd",
        lost,
        |message| open_call(&server.key, message, now_ms()),
        |opened| answer(gateway.clone(), server.clone(), opened),
    )
    .await;
}

/// Runs one call on this host and publishes its answer, sealed for the caller's inbox.
async fn answer(gateway: Gateway, server: CallServer, opened: OpenedCall) {
    let OpenedCall { call, reply } = opened;
    tracing::debug!(origin = %call.origin, path = %call.path, "a call from agentd");
    let body = Bytes::from(call.body);
    let response = crate::dispatch::serve_agentd_call(&gateway, &call.path, &body).await;
    if let Err(error) = bus::answer_response(&server.client, &server.key, reply, response).await {
        tracing::warn!(%error, origin = %call.origin, "cannot answer a call from agentd");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The sealing and checks are [`bus`]'s (tested there); here only which paths agentd may
    /// call: gatewayd's POST endpoints, whoever the origin (agentd may share gatewayd's host id).
    #[test]
    fn agentd_may_call_the_post_endpoints_only() {
        let key = GatewaydKey::new([7; 32]);
        let subject = agentworks_contract::cluster::gateway_subject("gw-b");
        let now = 1_000_000_000;
        let sealed_from = |origin: &str, path: &str| {
            let payload = serde_json::to_vec(&agentworks_contract::cluster::PeerCall {
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
        for path in POST_PATHS {
            assert!(
                open_call(&key, &sealed_from("gw-b", path), now).is_ok(),
                "{path}"
            );
        }
        for path in ["/v1/health", "/v1/dispatch/x", "/v1/tokens/check"] {
            assert!(
                open_call(&key, &sealed_from("gw-a", path), now).is_err(),
                "{path}"
            );
        }
    }
}
