//! gatewayd hosts calling each other over NATS (issue 16). A dispatch, cancel or recovery that
//! agentd makes on this host's socket for a device whose connection another live host holds
//! (its lease says so) is sent to that host's [`peer_subject`] as a [`PeerCall`] and answered
//! there, by the same code, as if agentd had called that host's socket; its [`PeerAnswer`] is
//! this host's answer. The request id is still claimed once, in the shared database, by the
//! host that sends the frame, so the same id dispatched through two hosts at once runs once.
//!
//! Every call and answer carries a MAC ([`PEER_MAC_HEADER`]: HMAC-SHA256 under the cluster's
//! peer key, which every host reads from the shared database, over the subject and the
//! payload). A message without a valid one is dropped and logged, so a NATS user who cannot
//! read the database cannot make any gateway send anything to a laptop, and an answer cannot
//! be forged onto another call's inbox. A call whose clock is off by more than
//! [`MAX_CLOCK_SKEW`] is dropped too (a replay runs nothing twice anyway: the request id is
//! claimed in the database). A call is served only here: one for a device this host does not
//! hold is refused, never passed on to a third host.
//!
//! Must never: act on a message whose MAC does not verify; log the peer key; answer a call
//! from a host that is not a gatewayd of this cluster (the MAC is the proof).

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures_util::StreamExt;
use hmac::{Hmac, KeyInit, Mac};
use http_body_util::BodyExt;
use hyper::StatusCode;
use sha2::Sha256;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use agentworks_contract::cluster::{PEER_MAC_HEADER, PeerAnswer, PeerCall, peer_subject};
use agentworks_contract::executor::MAX_FRAME_BYTES;
use agentworks_support::clock::now_ms;

use crate::Gateway;

/// How far a call's `sent_at_ms` may be from this host's clock.
pub const MAX_CLOCK_SKEW: Duration = Duration::from_secs(60);
/// The largest call or answer read: a dispatch body and its envelope.
pub const MAX_MESSAGE_BYTES: usize = MAX_FRAME_BYTES + 4096;
/// The endpoints a peer may call.
pub const PEER_PATHS: [&str; 3] = ["/v1/dispatch", "/v1/cancel", "/v1/recover"];

/// The cluster's peer key (see [`crate::store::Store::peer_key`]).
#[derive(Clone)]
pub struct PeerKey(Arc<[u8; 32]>);

impl std::fmt::Debug for PeerKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("PeerKey(..)")
    }
}

impl PeerKey {
    pub fn new(key: [u8; 32]) -> PeerKey {
        PeerKey(Arc::new(key))
    }

    fn hmac(&self, subject: &str, payload: &[u8]) -> Hmac<Sha256> {
        // HMAC pads a key shorter than its 64-byte block with zeros; padding it here gives
        // the same MAC through the infallible fixed-size constructor.
        let mut block = [0u8; 64];
        block[..32].copy_from_slice(&*self.0);
        let mut mac = <Hmac<Sha256> as KeyInit>::new(&block.into());
        mac.update(subject.as_bytes());
        mac.update(&[0]);
        mac.update(payload);
        mac
    }

    /// The hex MAC of `payload` published on `subject`.
    pub fn seal(&self, subject: &str, payload: &[u8]) -> String {
        hex::encode(self.hmac(subject, payload).finalize().into_bytes())
    }

    /// Whether `mac` (hex) is the MAC of `payload` on `subject`; compared in constant time.
    pub fn verify(&self, subject: &str, payload: &[u8], mac: &str) -> bool {
        let Ok(mac) = hex::decode(mac) else {
            return false;
        };
        self.hmac(subject, payload).verify_slice(&mac).is_ok()
    }
}

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
        let failed = |reason: String| PeerError::Failed {
            host: host.to_owned(),
            reason,
        };
        let payload = serde_json::to_vec(&call).map_err(|e| failed(e.to_string()))?;
        let subject = peer_subject(host);
        let mut headers = async_nats::HeaderMap::new();
        headers.insert(PEER_MAC_HEADER, self.key.seal(&subject, &payload).as_str());
        let request = async_nats::Request::new()
            .payload(Bytes::from(payload))
            .headers(headers)
            .timeout(Some(timeout));
        let answer =
            self.client
                .send_request(subject, request)
                .await
                .map_err(|error| match error.kind() {
                    async_nats::RequestErrorKind::NoResponders => PeerError::NoResponders {
                        host: host.to_owned(),
                    },
                    async_nats::RequestErrorKind::TimedOut => PeerError::TimedOut {
                        host: host.to_owned(),
                        secs: timeout.as_secs(),
                    },
                    _ => failed(error.to_string()),
                })?;
        let bad = |problem| PeerError::BadAnswer {
            host: host.to_owned(),
            problem,
        };
        let mac = answer
            .headers
            .as_ref()
            .and_then(|h| h.get(PEER_MAC_HEADER))
            .map(|v| v.as_str().to_owned())
            .ok_or_else(|| bad("it has no MAC"))?;
        if !self.key.verify(&answer.subject, &answer.payload, &mac) {
            return Err(bad("its MAC does not verify"));
        }
        let answer: PeerAnswer =
            serde_json::from_slice(&answer.payload).map_err(|_| bad("it is not an answer"))?;
        let status = StatusCode::from_u16(answer.status).map_err(|_| bad("a bad status"))?;
        Ok((status, Bytes::from(answer.body)))
    }
}

/// A call that passed the checks of [`open_call`].
#[derive(Debug, PartialEq, Eq)]
struct OpenedCall {
    call: PeerCall,
    reply: String,
}

/// Checks a message on this host's subject: its size, its MAC, its shape, its clock, its path
/// and a reply subject to answer on. `Err` says why it is dropped.
fn open_call(
    key: &PeerKey,
    this_host: &str,
    message: &async_nats::Message,
    now_ms: i64,
) -> Result<OpenedCall, &'static str> {
    if message.payload.len() > MAX_MESSAGE_BYTES {
        return Err("too large");
    }
    let mac = message
        .headers
        .as_ref()
        .and_then(|h| h.get(PEER_MAC_HEADER))
        .ok_or("no MAC")?;
    if !key.verify(&message.subject, &message.payload, mac.as_str()) {
        return Err("its MAC does not verify");
    }
    let call: PeerCall = serde_json::from_slice(&message.payload).map_err(|_| "not a call")?;
    let skew = u128::from(now_ms.abs_diff(call.sent_at_ms));
    if skew > MAX_CLOCK_SKEW.as_millis() {
        return Err("sent too long ago, or its clock is off");
    }
    if call.origin == this_host {
        return Err("sent by this host to itself");
    }
    if !PEER_PATHS.contains(&call.path.as_str()) {
        return Err("not an endpoint peers may call");
    }
    let reply = message.reply.as_ref().ok_or("no reply subject")?;
    Ok(OpenedCall {
        call,
        reply: reply.to_string(),
    })
}

/// Answers the calls on this host's subject until `shutdown`, each in its own task (a dispatch
/// waits for the device's result); the tasks in flight are awaited before it returns.
pub async fn serve_calls(
    gateway: Gateway,
    peers: Peers,
    mut calls: async_nats::Subscriber,
    shutdown: CancellationToken,
) {
    let tasks = TaskTracker::new();
    loop {
        let message = tokio::select! {
            _ = shutdown.cancelled() => break,
            message = calls.next() => message,
        };
        let Some(message) = message else {
            tracing::warn!(
                subject = %peer_subject(peers.host()),
                "the NATS subscription for peer calls ended; other hosts cannot reach devices here"
            );
            break;
        };
        let opened = match open_call(&peers.key, peers.host(), &message, now_ms()) {
            Ok(opened) => opened,
            Err(problem) => {
                tracing::warn!(
                    subject = %message.subject,
                    bytes = message.payload.len(),
                    problem,
                    "dropped a peer call"
                );
                continue;
            }
        };
        let (gateway, peers) = (gateway.clone(), peers.clone());
        tasks.spawn(async move { answer(gateway, peers, opened).await });
    }
    tasks.close();
    tasks.wait().await;
}

/// Runs one call on this host and publishes its answer, sealed for the caller's inbox.
async fn answer(gateway: Gateway, peers: Peers, opened: OpenedCall) {
    let OpenedCall { call, reply } = opened;
    tracing::debug!(origin = %call.origin, path = %call.path, "a peer call");
    let body = Bytes::from(call.body);
    let response = crate::dispatch::serve_peer_call(&gateway, &call.path, &body).await;
    let status = response.status().as_u16();
    let body = match response.into_body().collect().await {
        Ok(collected) => collected.to_bytes(),
        Err(never) => match never {},
    };
    let answer = PeerAnswer {
        status,
        body: String::from_utf8_lossy(&body).into_owned(),
    };
    let Ok(payload) = serde_json::to_vec(&answer) else {
        return;
    };
    let mut headers = async_nats::HeaderMap::new();
    headers.insert(PEER_MAC_HEADER, peers.key.seal(&reply, &payload).as_str());
    let sent = peers
        .client
        .publish_with_headers(reply, headers, Bytes::from(payload))
        .await;
    if let Err(error) = sent {
        tracing::warn!(%error, origin = %call.origin, "cannot answer a peer call");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn message(subject: &str, payload: &[u8], mac: Option<String>) -> async_nats::Message {
        let headers = mac.map(|mac| {
            let mut headers = async_nats::HeaderMap::new();
            headers.insert(PEER_MAC_HEADER, mac.as_str());
            headers
        });
        async_nats::Message {
            subject: subject.into(),
            reply: Some("_INBOX.abc".into()),
            payload: Bytes::copy_from_slice(payload),
            headers,
            status: None,
            description: None,
            length: payload.len(),
        }
    }

    fn call(origin: &str, sent_at_ms: i64, path: &str) -> Vec<u8> {
        serde_json::to_vec(&PeerCall {
            origin: origin.into(),
            sent_at_ms,
            path: path.into(),
            body: "{}".into(),
        })
        .unwrap()
    }

    #[test]
    fn only_a_sealed_fresh_call_from_another_host_is_opened() {
        let key = PeerKey::new([7; 32]);
        let subject = peer_subject("gw-b");
        let now = 1_000_000_000;
        let good = call("gw-a", now, "/v1/dispatch");
        let sealed = message(&subject, &good, Some(key.seal(&subject, &good)));
        let opened = open_call(&key, "gw-b", &sealed, now).unwrap();
        assert_eq!(opened.call.origin, "gw-a");
        assert_eq!(opened.reply, "_INBOX.abc");

        let refused = |m: &async_nats::Message| open_call(&key, "gw-b", m, now).unwrap_err();
        assert_eq!(refused(&message(&subject, &good, None)), "no MAC");
        let other_key = PeerKey::new([8; 32]).seal(&subject, &good);
        assert_eq!(
            refused(&message(&subject, &good, Some(other_key))),
            "its MAC does not verify"
        );
        // A call sealed for another host's subject does not open here.
        let elsewhere = key.seal(&peer_subject("gw-c"), &good);
        assert_eq!(
            refused(&message(&subject, &good, Some(elsewhere))),
            "its MAC does not verify"
        );
        let sealed_as = |payload: Vec<u8>| {
            let mac = key.seal(&subject, &payload);
            message(&subject, &payload, Some(mac))
        };
        let stale = now - 61_000;
        assert_eq!(
            refused(&sealed_as(call("gw-a", stale, "/v1/dispatch"))),
            "sent too long ago, or its clock is off"
        );
        assert_eq!(
            refused(&sealed_as(call("gw-b", now, "/v1/dispatch"))),
            "sent by this host to itself"
        );
        assert_eq!(
            refused(&sealed_as(call("gw-a", now, "/v1/devices"))),
            "not an endpoint peers may call"
        );
        assert_eq!(refused(&sealed_as(b"{}".to_vec())), "not a call");
        assert!(!key.verify(&subject, &good, "not hex"));
    }
}
