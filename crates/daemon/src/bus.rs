//! Calls between the daemons of a cluster over NATS request-reply (issue 16): one daemon's
//! socket endpoint run on another host, as a [`PeerCall`] answered with a [`PeerAnswer`]. Used
//! by gatewayd hosts calling each other (a dispatch for a device another host holds) and by
//! agentd calling a workspaced on a storage host that runs no agentd. What may be called, and
//! what it does, is each daemon's own; this holds the sealing and the checks they share.
//!
//! Every call and answer carries a MAC ([`PEER_MAC_HEADER`]: HMAC-SHA256 under a key every
//! host of the cluster reads from the shared database, over the subject and the payload). A
//! message without a valid one is not opened, so a NATS user who cannot read the database can
//! make no daemon do anything, and an answer cannot be forged onto another call's inbox. A call
//! whose clock is off by more than [`MAX_CLOCK_SKEW`] is not opened either.
//!
//! Must never: open a message whose MAC does not verify; log a key.

use std::sync::Arc;
use std::time::Duration;

use agentworks_contract::cluster::{PEER_MAC_HEADER, PeerAnswer, PeerCall};
use bytes::Bytes;
use hmac::{Hmac, KeyInit, Mac};
use hyper::StatusCode;
use sha2::Sha256;

/// How far a call's `sent_at_ms` may be from the answering host's clock.
pub const MAX_CLOCK_SKEW: Duration = Duration::from_secs(60);

/// A key the hosts of a cluster seal their calls with (32 bytes from the shared database).
#[derive(Clone)]
pub struct BusKey(Arc<[u8; 32]>);

impl std::fmt::Debug for BusKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("BusKey(..)")
    }
}

impl BusKey {
    pub fn new(key: [u8; 32]) -> BusKey {
        BusKey(Arc::new(key))
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

/// Why a cluster key could not be had at start.
#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    /// `cluster.database_url` is not set (the config loader refuses that for a cluster).
    #[error("cluster.database_url is not set")]
    NoDatabase,
    #[error(transparent)]
    Connect(#[from] crate::postgres::ConnectError),
    #[error(transparent)]
    Read(#[from] crate::postgres::SharedKeyError),
    /// The blocking task that reads it failed.
    #[error("reading the cluster key failed: {0}")]
    Task(String),
}

/// The cluster's key `name` from the shared database of `cluster`, read on a blocking thread
/// by `daemon` (the connection's application name) and closed after.
pub async fn cluster_key(
    cluster: &crate::config::ClusterConfig,
    daemon: &'static str,
    name: &'static str,
) -> Result<BusKey, KeyError> {
    let url = cluster.database_url.clone().ok_or(KeyError::NoDatabase)?;
    let read = move || -> Result<BusKey, KeyError> {
        let pool = crate::postgres::Pool::connect(&url, daemon, None)?;
        let key = crate::postgres::shared_key(&pool, name, &rand::random())?;
        Ok(BusKey::new(key))
    };
    tokio::task::spawn_blocking(read)
        .await
        .map_err(|e| KeyError::Task(e.to_string()))?
}

/// Why a call got no usable answer.
#[derive(Debug, thiserror::Error)]
pub enum BusError {
    /// Nobody listens on the subject: the call reached no one.
    #[error("nothing listens on NATS subject {subject}; nothing was sent")]
    NoResponders { subject: String },
    /// The call may have been delivered; no answer came in time.
    #[error("no answer on NATS subject {subject} within {secs} s")]
    TimedOut { subject: String, secs: u64 },
    /// Publishing or waiting failed otherwise (the NATS connection, a payload over the
    /// server's `max_payload`).
    #[error("calling over NATS subject {subject} failed: {reason}")]
    Failed { subject: String, reason: String },
    /// An answer came but is not one (a bad MAC, not a [`PeerAnswer`]); dropped.
    #[error("the answer on NATS subject {subject} was dropped: {problem}")]
    BadAnswer {
        subject: String,
        problem: &'static str,
    },
}

/// Sends `call` on `subject` sealed with `key`, and waits at most `timeout` for its sealed
/// answer: the status and body the called socket gave.
pub async fn request(
    client: &async_nats::Client,
    key: &BusKey,
    subject: &str,
    call: &PeerCall,
    timeout: Duration,
) -> Result<(StatusCode, Bytes), BusError> {
    let failed = |reason: String| BusError::Failed {
        subject: subject.to_owned(),
        reason,
    };
    let payload = serde_json::to_vec(call).map_err(|e| failed(e.to_string()))?;
    let mut headers = async_nats::HeaderMap::new();
    headers.insert(PEER_MAC_HEADER, key.seal(subject, &payload).as_str());
    let request = async_nats::Request::new()
        .payload(Bytes::from(payload))
        .headers(headers)
        .timeout(Some(timeout));
    let answer = client
        .send_request(subject.to_owned(), request)
        .await
        .map_err(|error| match error.kind() {
            async_nats::RequestErrorKind::NoResponders => BusError::NoResponders {
                subject: subject.to_owned(),
            },
            async_nats::RequestErrorKind::TimedOut => BusError::TimedOut {
                subject: subject.to_owned(),
                secs: timeout.as_secs(),
            },
            _ => failed(error.to_string()),
        })?;
    let bad = |problem| BusError::BadAnswer {
        subject: subject.to_owned(),
        problem,
    };
    let mac = answer
        .headers
        .as_ref()
        .and_then(|h| h.get(PEER_MAC_HEADER))
        .map(|v| v.as_str().to_owned())
        .ok_or_else(|| bad("it has no MAC"))?;
    if !key.verify(&answer.subject, &answer.payload, &mac) {
        return Err(bad("its MAC does not verify"));
    }
    let answer: PeerAnswer =
        serde_json::from_slice(&answer.payload).map_err(|_| bad("it is not an answer"))?;
    let status = StatusCode::from_u16(answer.status).map_err(|_| bad("a bad status"))?;
    Ok((status, Bytes::from(answer.body)))
}

/// A call that passed the checks of [`open_call`], with the inbox to answer on.
#[derive(Debug, PartialEq, Eq)]
pub struct OpenedCall {
    pub call: PeerCall,
    pub reply: String,
}

/// Checks a message on a host's subject: its size (at most `max_bytes`), its MAC, its shape,
/// its clock, then what `accept` asks of the call (its path, its origin), and a reply subject
/// to answer on. `Err` says why it is dropped.
pub fn open_call(
    key: &BusKey,
    message: &async_nats::Message,
    now_ms: i64,
    max_bytes: usize,
    accept: impl Fn(&PeerCall) -> Result<(), &'static str>,
) -> Result<OpenedCall, &'static str> {
    let payload = verify_sealed(key, message, max_bytes)?;
    let call: PeerCall = serde_json::from_slice(payload).map_err(|_| "not a call")?;
    let skew = u128::from(now_ms.abs_diff(call.sent_at_ms));
    if skew > MAX_CLOCK_SKEW.as_millis() {
        return Err("sent too long ago, or its clock is off");
    }
    accept(&call)?;
    let reply = message.reply.as_ref().ok_or("no reply subject")?;
    Ok(OpenedCall {
        call,
        reply: reply.to_string(),
    })
}

/// The payload of `message` if it is at most `max_bytes` and sealed under `key` for the
/// subject it came on; `Err` says why it is dropped.
pub fn verify_sealed<'m>(
    key: &BusKey,
    message: &'m async_nats::Message,
    max_bytes: usize,
) -> Result<&'m [u8], &'static str> {
    if message.payload.len() > max_bytes {
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
    Ok(&message.payload)
}

/// Publishes `payload` on `subject` sealed with `key` (the MAC in [`PEER_MAC_HEADER`]).
pub async fn publish_sealed(
    client: &async_nats::Client,
    key: &BusKey,
    subject: String,
    payload: Vec<u8>,
) -> Result<(), String> {
    let mut headers = async_nats::HeaderMap::new();
    headers.insert(PEER_MAC_HEADER, key.seal(&subject, &payload).as_str());
    client
        .publish_with_headers(subject, headers, Bytes::from(payload))
        .await
        .map_err(|e| e.to_string())
}

/// Serves the calls on `calls` until `shutdown`: each message is opened by `open` (a refused
/// one is logged as a dropped `what` and runs nothing) and handled by `handle` in a task of its
/// own; the tasks in flight are awaited before it returns. `lost` is logged if the subscription
/// ends first.
pub async fn serve_calls<Handled>(
    mut calls: async_nats::Subscriber,
    shutdown: tokio_util::sync::CancellationToken,
    what: &'static str,
    lost: &'static str,
    open: impl Fn(&async_nats::Message) -> Result<OpenedCall, &'static str>,
    handle: impl Fn(OpenedCall) -> Handled,
) where
    Handled: std::future::Future<Output = ()> + Send + 'static,
{
    use futures_util::StreamExt;
    let tasks = tokio_util::task::TaskTracker::new();
    loop {
        let message = tokio::select! {
            _ = shutdown.cancelled() => break,
            message = calls.next() => message,
        };
        let Some(message) = message else {
            tracing::warn!("{lost}");
            break;
        };
        match open(&message) {
            Ok(opened) => {
                tasks.spawn(handle(opened));
            }
            Err(problem) => tracing::warn!(
                subject = %message.subject,
                bytes = message.payload.len(),
                problem,
                "dropped {what}"
            ),
        }
    }
    tasks.close();
    tasks.wait().await;
}

/// Publishes the answer to a call on its `reply` inbox, sealed with `key`.
pub async fn answer(
    client: &async_nats::Client,
    key: &BusKey,
    reply: String,
    status: StatusCode,
    body: &[u8],
) -> Result<(), String> {
    let answer = PeerAnswer {
        status: status.as_u16(),
        body: String::from_utf8_lossy(body).into_owned(),
    };
    let payload = serde_json::to_vec(&answer).map_err(|e| e.to_string())?;
    publish_sealed(client, key, reply, payload).await
}

/// [`answer`] with a socket's response: its status and its whole body, as the socket would
/// have sent them.
pub async fn answer_response(
    client: &async_nats::Client,
    key: &BusKey,
    reply: String,
    response: hyper::Response<crate::ipc::envelope::Body>,
) -> Result<(), String> {
    use http_body_util::BodyExt;
    let status = response.status();
    let body = match response.into_body().collect().await {
        Ok(collected) => collected.to_bytes(),
        Err(never) => match never {},
    };
    answer(client, key, reply, status, &body).await
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
    fn only_a_sealed_fresh_call_that_its_host_accepts_is_opened() {
        let key = BusKey::new([7; 32]);
        let subject = "agentworks.gateway.gw-b.call";
        let now = 1_000_000_000;
        let open = |m: &async_nats::Message| {
            open_call(&key, m, now, 4096, |call| match call.path.as_str() {
                "/v1/dispatch" => Ok(()),
                _ => Err("not an endpoint that may be called"),
            })
        };
        let good = call("gw-a", now, "/v1/dispatch");
        let sealed = message(subject, &good, Some(key.seal(subject, &good)));
        let opened = open(&sealed).unwrap();
        assert_eq!(opened.call.origin, "gw-a");
        assert_eq!(opened.reply, "_INBOX.abc");

        let refused = |m: &async_nats::Message| open(m).unwrap_err();
        assert_eq!(refused(&message(subject, &good, None)), "no MAC");
        let other_key = BusKey::new([8; 32]).seal(subject, &good);
        assert_eq!(
            refused(&message(subject, &good, Some(other_key))),
            "its MAC does not verify"
        );
        // A call sealed for another host's subject does not open here.
        let elsewhere = key.seal("agentworks.gateway.gw-c.call", &good);
        assert_eq!(
            refused(&message(subject, &good, Some(elsewhere))),
            "its MAC does not verify"
        );
        let sealed_as = |payload: Vec<u8>| {
            let mac = key.seal(subject, &payload);
            message(subject, &payload, Some(mac))
        };
        assert_eq!(
            refused(&sealed_as(call("gw-a", now - 61_000, "/v1/dispatch"))),
            "sent too long ago, or its clock is off"
        );
        assert_eq!(
            refused(&sealed_as(call("gw-a", now, "/v1/devices"))),
            "not an endpoint that may be called"
        );
        assert_eq!(refused(&sealed_as(b"{}".to_vec())), "not a call");
        let big = vec![b' '; 5000];
        assert_eq!(refused(&sealed_as(big)), "too large");
        assert!(!key.verify(subject, &good, "not hex"));
    }
}
