//! How agentd reaches gatewayd: over `gatewayd.sock` on this host (one host), or in a cluster
//! over NATS to the gatewayd hosts (issue 16), which answer the same endpoints and bodies
//! ([`agentworks_contract::cluster::gateway_subject`]). Either way a call gives the same result
//! or [`ClientError`], so the turn and the chat API do not know which.
//!
//! In a cluster agentd is the only one that publishes calls to gatewayd, and a gatewayd only
//! answers them, never passing one on (NATS permissions say so too):
//! - a dispatch goes to the host that holds the device's connection: `/v1/watch` on any host
//!   (the queue group, [`GATEWAY_ANY_SUBJECT`]) names it from the device's lease (and answers a
//!   request id already settled from its record; an offline device is refused by
//!   `/v1/locate`), then `/v1/dispatch` on that host's subject. A holder that lost the device meanwhile refuses
//!   `device_on_other_host` with the new holder, which is tried next (at most [`MAX_MOVES`]).
//!   While the answer is awaited, `/v1/watch` on any host reads the request's record and its
//!   device's lease every [`WATCH_EVERY`]: a record that is done is the answer; one made
//!   `unknown` without an answer (the holder died and the others made its pending requests
//!   unknown, never re-sent; or it restarted), or no gatewayd listening at all, means the
//!   answer was lost: [`ClientError::Elsewhere`], which the turn recovers (`/v1/recover`: the
//!   device's receipt, once it is connected again to any host) until the operation's
//!   deadline, as after a broken socket on one host, and reports `outcome_unknown` if nothing
//!   can tell; a request that no host recorded within
//!   [`UNRECORDED_CLAIM`], or before its holder lost the device, has its id claimed as never
//!   sent (`/v1/recover`), so it can never run later, and is refused
//!   `gateway_host_unavailable`. A call that certainly reached no one (no gatewayd listens on
//!   the holder's subject) is `device_offline`; one that got no answer may have run, and is
//!   [`ClientError::Elsewhere`], which the turn recovers as after a lost socket exchange.
//! - every other call (devices, outcome, cancel, recovery) goes to any host; one refused
//!   `device_on_other_host` (a cancel or a receipt query for a device another host holds) is
//!   made once more on the holder's subject.
//!
//! Calls and answers are sealed under the cluster's gatewayd key
//! ([`agentworks_contract::cluster::GATEWAYD_KEY`], [`agentworks_daemon::bus`]). The request id
//! is claimed once in the shared database by whichever gatewayd sends the frame, so two agentd
//! hosts dispatching the same id (a retried HTTP request) run it once.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use hyper::StatusCode;
use serde::Serialize;
use serde::de::DeserializeOwned;

use agentworks_contract::cluster::{GATEWAY_ANY_SUBJECT, GATEWAYD_KEY, PeerCall, gateway_subject};
use agentworks_contract::envelope::{ErrorBody, ErrorEnvelope};
use agentworks_contract::gatewayd::{
    DispatchRequest, DispatchState, LocateRequest, Located, Recovery, Watched,
};
use agentworks_daemon::bus::{self, BusError, BusKey};
use agentworks_daemon::config::Config;
use agentworks_support::clock::now_ms;
use agentworks_support::unix_http::{ClientError, UnixClient, decode_response};

/// How often a dispatch on another host has its record and its device's lease read.
pub const WATCH_EVERY: Duration = Duration::from_secs(1);
/// How long a dispatch may go unrecorded by its holder (which records it at once when the call
/// arrives) before its id is claimed as never sent: a call lost with a NATS server then fails
/// in seconds, not at its deadline, and can never run later.
pub const UNRECORDED_CLAIM: Duration = Duration::from_secs(10);
/// How many times a dispatch follows its device to another host before it gives up.
pub const MAX_MOVES: usize = 3;
/// How much longer than a dispatch's deadline agentd waits for the holder's answer.
const DISPATCH_MARGIN: Duration = Duration::from_secs(10);
/// How long a call on any host waits for its answer before it is made again (each time it may
/// reach another host of the queue group: one that hangs is not waited on for long).
const ANY_TIMEOUT: Duration = Duration::from_secs(3);
/// How many times a call on any host is made when it gets no answer. Every such call is
/// idempotent: a read, a cancel, or a recovery (whose claim is made once).
const ANY_ATTEMPTS: usize = 3;
/// How long agentd's recovery of a lost answer waits: the host may ask the device for its
/// receipt, for at most 10 s.
const RECOVER_TIMEOUT: Duration = Duration::from_secs(12);
/// How long a call on the holder's subject (other than a dispatch) waits.
const HOLDER_TIMEOUT: Duration = Duration::from_secs(15);

/// Why gatewayd cannot be reached over NATS at start.
#[derive(Debug, thiserror::Error)]
pub enum GatewaydClientError {
    #[error("cannot read the cluster's gatewayd key from the cluster database")]
    Key(#[source] bus::KeyError),
}

/// A cheap-to-clone client for gatewayd.
#[derive(Clone)]
pub struct GatewaydClient(Route);

#[derive(Clone)]
enum Route {
    /// `gatewayd.sock` on this host.
    Socket(UnixClient),
    /// The cluster's gatewayd hosts, over NATS.
    Cluster(Arc<Cluster>),
}

struct Cluster {
    client: async_nats::Client,
    key: BusKey,
    /// This agentd's host id, as the calls' origin.
    origin: String,
}

/// How a dispatch on one host ended: its answer, or the device is on another host now.
enum OnHost {
    Answer(Result<DispatchState, ClientError>),
    Moved(String),
}

/// What the watch of a dispatch on another host saw.
enum Settled {
    /// The record is done; or it was made unknown without an answer (a host that lost its
    /// leases has its pending requests made unknown), or no gatewayd listens any more: each
    /// [`ClientError::Elsewhere`], a lost answer, to be recovered; or the watch was refused
    /// (`request_id_reused`).
    Final(Result<DispatchState, ClientError>),
    /// No host recorded the request within [`UNRECORDED_CLAIM`], or (`lost`) before the
    /// holder's lease on the device ended (it died as the call went out).
    Unrecorded { lost: bool },
}

impl GatewaydClient {
    /// `gatewayd.sock` at `client`'s path.
    pub fn socket(client: UnixClient) -> GatewaydClient {
        GatewaydClient(Route::Socket(client))
    }

    /// The cluster's gatewayd hosts over NATS (`client`), calls sealed with `key` (the
    /// cluster's [`GATEWAYD_KEY`]) and sent as host `origin`.
    pub fn cluster(client: async_nats::Client, key: BusKey, origin: &str) -> GatewaydClient {
        GatewaydClient(Route::Cluster(Arc::new(Cluster {
            client,
            key,
            origin: origin.to_owned(),
        })))
    }

    /// The client `config` asks for: over NATS (`nats`, agentd's connection) in a cluster,
    /// else the socket.
    pub async fn for_config(
        config: &Config,
        nats: Option<async_nats::Client>,
    ) -> Result<GatewaydClient, GatewaydClientError> {
        let Some(client) = nats else {
            return Ok(GatewaydClient::socket(UnixClient::new(
                config.gatewayd_socket(),
            )));
        };
        let key = bus::cluster_key(&config.cluster, "agentworks-agentd", GATEWAYD_KEY)
            .await
            .map_err(GatewaydClientError::Key)?;
        let origin = config.cluster.host_id.as_deref().unwrap_or("-");
        Ok(GatewaydClient::cluster(client, key, origin))
    }

    /// Where calls go, for logs and messages: the socket's path, or the NATS subjects.
    pub fn target(&self) -> String {
        match &self.0 {
            Route::Socket(client) => client.socket().display().to_string(),
            Route::Cluster(_) => format!("{GATEWAY_ANY_SUBJECT} and each host's subject"),
        }
    }

    /// POSTs `body` as JSON to `path`: the 2xx answer as `Resp`, or the error envelope as
    /// [`ClientError::Remote`], as [`UnixClient::post`] does. A dispatch goes through
    /// [`GatewaydClient::dispatch`].
    pub async fn post<Req: Serialize, Resp: DeserializeOwned>(
        &self,
        path: &str,
        body: &Req,
    ) -> Result<Resp, ClientError> {
        match &self.0 {
            Route::Socket(client) => client.post(path, body).await,
            Route::Cluster(cluster) => {
                let body = encode(path, body)?;
                let timeout = if path == "/v1/recover" {
                    RECOVER_TIMEOUT
                } else {
                    ANY_TIMEOUT
                };
                let (status, answer) = cluster.anywhere(path, &body, timeout).await?;
                decode_response(path, status, &answer)
            }
        }
    }

    /// `POST /v1/dispatch`: the request sent once to its device, and its state.
    pub async fn dispatch(&self, request: &DispatchRequest) -> Result<DispatchState, ClientError> {
        match &self.0 {
            Route::Socket(client) => client.post("/v1/dispatch", request).await,
            Route::Cluster(cluster) => cluster.dispatch(request).await,
        }
    }
}

fn encode<Req: Serialize>(path: &str, body: &Req) -> Result<String, ClientError> {
    serde_json::to_string(body).map_err(|source| ClientError::Encode {
        endpoint: path.to_owned(),
        source,
    })
}

/// A refusal made here, shaped as gatewayd's own.
fn refusal(status: StatusCode, code: &str, message: String) -> ClientError {
    ClientError::Remote {
        status: status.as_u16(),
        body: ErrorBody {
            code: code.to_owned(),
            message,
            details: serde_json::Map::new(),
        },
    }
}

/// A failure before the dispatch went anywhere: gatewayd's own refusals as they are, anything
/// else `gateway_unavailable` (503), which says it was not sent.
fn not_sent(error: ClientError) -> ClientError {
    match error {
        ClientError::Remote { .. } => error,
        other => refusal(
            StatusCode::SERVICE_UNAVAILABLE,
            "gateway_unavailable",
            format!(
                "the device gateways cannot be asked where the device is ({other}); the request \
                 was not sent, so it did not run"
            ),
        ),
    }
}

/// The host named by a `device_on_other_host` refusal, if `answer` is one.
fn held_by(status: StatusCode, answer: &[u8]) -> Option<String> {
    if status != StatusCode::CONFLICT {
        return None;
    }
    let envelope: ErrorEnvelope = serde_json::from_slice(answer).ok()?;
    if envelope.error.code != "device_on_other_host" {
        return None;
    }
    envelope
        .error
        .details
        .get("host_id")?
        .as_str()
        .map(str::to_owned)
}

impl Cluster {
    /// One sealed call on `subject`.
    async fn call(
        &self,
        subject: &str,
        path: &str,
        body: &str,
        timeout: Duration,
    ) -> Result<(StatusCode, Bytes), BusError> {
        let call = PeerCall {
            origin: self.origin.clone(),
            sent_at_ms: now_ms(),
            path: path.to_owned(),
            body: body.to_owned(),
        };
        bus::request(&self.client, &self.key, subject, &call, timeout).await
    }

    /// A call on any host, made again (at most [`ANY_ATTEMPTS`] times) while none answers
    /// within `timeout`; made once more on the holder's subject if the host refuses it as
    /// `device_on_other_host`.
    async fn anywhere(
        &self,
        path: &str,
        body: &str,
        timeout: Duration,
    ) -> Result<(StatusCode, Bytes), ClientError> {
        self.anywhere_on_bus(path, body, timeout)
            .await
            .map_err(|error| ClientError::Elsewhere {
                endpoint: path.to_owned(),
                reason: error.to_string(),
            })
    }

    /// [`Cluster::anywhere`], with the bus's own error.
    async fn anywhere_on_bus(
        &self,
        path: &str,
        body: &str,
        timeout: Duration,
    ) -> Result<(StatusCode, Bytes), BusError> {
        let mut attempt = 1;
        let (status, answer) = loop {
            match self.call(GATEWAY_ANY_SUBJECT, path, body, timeout).await {
                Err(BusError::TimedOut { .. }) if attempt < ANY_ATTEMPTS => attempt += 1,
                answered => break answered?,
            }
        };
        match held_by(status, &answer) {
            Some(host) => {
                self.call(&gateway_subject(&host), path, body, HOLDER_TIMEOUT)
                    .await
            }
            None => Ok((status, answer)),
        }
    }

    /// A dispatch on the host holding its device, following the device while it moves; a
    /// request id already recorded is answered from its record, as gatewayd would.
    async fn dispatch(&self, request: &DispatchRequest) -> Result<DispatchState, ClientError> {
        // One body for every call about this request: the dispatch, its watch, its claim.
        let body = encode("/v1/dispatch", request)?;
        let watched = self.watch(&body).await.map_err(not_sent)?;
        let mut host_id = match watched {
            // A request id seen before is answered from its record, never sent again (pending:
            // the first dispatch of it is still out, as gatewayd answers a second caller).
            Watched {
                state: Some(state), ..
            } => return Ok(state),
            Watched {
                holder: Some(host), ..
            } => host,
            // No lease: offline, or not this person's device; the refusal says which.
            Watched { holder: None, .. } => {
                let locate = LocateRequest {
                    user_id: request.user_id.clone(),
                    device_id: request.device_id.clone(),
                };
                let path = "/v1/locate";
                let (status, answer) = self
                    .anywhere(path, &encode(path, &locate)?, ANY_TIMEOUT)
                    .await
                    .map_err(not_sent)?;
                decode_response::<Located>(path, status, &answer)?.host_id
            }
        };
        for _ in 0..MAX_MOVES {
            match self.dispatch_on(&host_id, request, &body).await {
                OnHost::Answer(answer) => return answer,
                OnHost::Moved(host) => host_id = host,
            }
        }
        Err(refusal(
            StatusCode::CONFLICT,
            "device_offline",
            format!(
                "the device moved between gateway hosts {MAX_MOVES} times while the request was \
                 on its way; it was not sent, so try again"
            ),
        ))
    }

    /// `/v1/watch` on any host: the request's record and its device's holder now.
    async fn watch(&self, body: &str) -> Result<Watched, ClientError> {
        let path = "/v1/watch";
        let (status, answer) = self.anywhere(path, body, ANY_TIMEOUT).await?;
        decode_response(path, status, &answer)
    }

    /// [`Cluster::watch`] while a dispatch waits: `None` when no gatewayd listens at all (so
    /// neither does the holder, which also listens on [`GATEWAY_ANY_SUBJECT`]).
    async fn watch_waiting(&self, body: &str) -> Option<Result<Watched, ClientError>> {
        let path = "/v1/watch";
        match self.anywhere_on_bus(path, body, ANY_TIMEOUT).await {
            Ok((status, answer)) => Some(decode_response(path, status, &answer)),
            Err(BusError::NoResponders { .. }) => None,
            Err(other) => Some(Err(ClientError::Elsewhere {
                endpoint: path.to_owned(),
                reason: other.to_string(),
            })),
        }
    }

    /// The dispatch on `host`, watched until its answer or its record settles.
    async fn dispatch_on(&self, host: &str, request: &DispatchRequest, body: &str) -> OnHost {
        let path = "/v1/dispatch";
        let timeout = request.operation.deadline() + DISPATCH_MARGIN;
        let subject = gateway_subject(host);
        let call = self.call(&subject, path, body, timeout);
        tokio::pin!(call);
        let mut watch_unrecorded = true;
        loop {
            tokio::select! {
                answer = &mut call => return match answer {
                    Ok((status, answer)) => match held_by(status, &answer) {
                        Some(holder) => OnHost::Moved(holder),
                        None => OnHost::Answer(decode_response(path, status, &answer)),
                    },
                    Err(error @ BusError::NoResponders { .. }) => OnHost::Answer(Err(refusal(
                        StatusCode::CONFLICT,
                        "device_offline",
                        format!(
                            "gatewayd host \"{host}\" is not listening ({error}); the device's \
                             connection there is gone or going, so try again"
                        ),
                    ))),
                    Err(error) => OnHost::Answer(Err(ClientError::Elsewhere {
                        endpoint: path.to_owned(),
                        reason: format!("gatewayd host \"{host}\": {error}"),
                    })),
                },
                settled = self.record_settles(body, host, watch_unrecorded) => match settled {
                    Settled::Final(state) => return OnHost::Answer(state),
                    Settled::Unrecorded { lost } => match self.claim_unsent(body, host, lost).await {
                        Some(answer) => return OnHost::Answer(answer),
                        // Recorded there after all: wait for its answer or its settling.
                        None => watch_unrecorded = false,
                    },
                },
            }
        }
    }

    /// Waits until the record of the request in `body` is final, or (with `watch_unrecorded`)
    /// until it has gone unrecorded for [`UNRECORDED_CLAIM`] or `holder` no longer holds the
    /// device's lease, reading them every [`WATCH_EVERY`]; never returns otherwise.
    async fn record_settles(&self, body: &str, holder: &str, watch_unrecorded: bool) -> Settled {
        let started = tokio::time::Instant::now();
        loop {
            tokio::time::sleep(WATCH_EVERY).await;
            let Some(watched) = self.watch_waiting(body).await else {
                // The holder no longer listens: its answer, if any comes, cannot reach here.
                return Settled::Final(Err(ClientError::Elsewhere {
                    endpoint: "/v1/dispatch".to_owned(),
                    reason: format!(
                        "gatewayd host \"{holder}\" stopped listening on NATS (no gatewayd \
                         does) while the request was out"
                    ),
                }));
            };
            match watched {
                Ok(Watched {
                    state: Some(state @ DispatchState::Done { .. }),
                    ..
                }) => return Settled::Final(Ok(state)),
                // Made unknown without an answer (its host died and the others made its pending
                // requests unknown, or it restarted): the answer was lost, as with a socket that
                // broke after the send on one host, and the turn recovers it the same way.
                Ok(Watched {
                    state: Some(DispatchState::Unknown { reason }),
                    ..
                }) => {
                    return Settled::Final(Err(ClientError::Elsewhere {
                        endpoint: "/v1/dispatch".to_owned(),
                        reason: format!(
                            "gatewayd host \"{holder}\" gave no answer, and the request's \
                             record says: {reason}"
                        ),
                    }));
                }
                Ok(Watched {
                    state: None,
                    holder: now,
                }) if watch_unrecorded => {
                    let lost = now.as_deref() != Some(holder);
                    if lost || started.elapsed() >= UNRECORDED_CLAIM {
                        return Settled::Unrecorded { lost };
                    }
                }
                Err(error @ ClientError::Remote { .. }) => return Settled::Final(Err(error)),
                // Pending, or no host answers now (NATS or PostgreSQL down): read again.
                _ => {}
            }
        }
    }

    /// Claims an unrecorded dispatch's id as never sent (`/v1/recover` on any host): its answer,
    /// or `None` if a host recorded it meanwhile and it is still pending there.
    async fn claim_unsent(
        &self,
        body: &str,
        holder: &str,
        lost: bool,
    ) -> Option<Result<DispatchState, ClientError>> {
        let path = "/v1/recover";
        let recovery = match self.anywhere(path, body, ANY_TIMEOUT).await {
            Ok((status, answer)) => decode_response::<Recovery>(path, status, &answer),
            Err(error) => Err(error),
        };
        match recovery {
            Ok(Recovery::NeverSent) => Some(Err(refusal(
                StatusCode::SERVICE_UNAVAILABLE,
                "gateway_host_unavailable",
                format!(
                    "gatewayd host \"{holder}\" did not record the request {}; the request was \
                     not sent, and its id is now claimed so it never will be",
                    if lost {
                        "before it lost the device".to_owned()
                    } else {
                        format!("within {} s", UNRECORDED_CLAIM.as_secs())
                    }
                ),
            ))),
            Ok(Recovery::Settled { state, .. }) => Some(Ok(state)),
            Ok(Recovery::Unsettled { .. }) => None,
            Err(error) => Some(Err(error)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_device_on_other_host_refusal_names_a_holder() {
        let refusal = |status: StatusCode, code: &str, host: Option<&str>| {
            let mut details = serde_json::Map::new();
            if let Some(host) = host {
                details.insert("host_id".into(), host.into());
            }
            let envelope = ErrorEnvelope {
                error: ErrorBody {
                    code: code.into(),
                    message: "m".into(),
                    details,
                },
            };
            (status, serde_json::to_vec(&envelope).unwrap())
        };
        let (status, body) = refusal(StatusCode::CONFLICT, "device_on_other_host", Some("gw-b"));
        assert_eq!(held_by(status, &body).as_deref(), Some("gw-b"));
        let (status, body) = refusal(StatusCode::CONFLICT, "device_offline", Some("gw-b"));
        assert_eq!(held_by(status, &body), None);
        let (status, body) = refusal(StatusCode::CONFLICT, "device_on_other_host", None);
        assert_eq!(held_by(status, &body), None);
        let (_, body) = refusal(StatusCode::OK, "device_on_other_host", Some("gw-b"));
        assert_eq!(held_by(StatusCode::OK, &body), None);
        assert_eq!(held_by(StatusCode::CONFLICT, b"not json"), None);
    }
}
