//! How agentd reaches runnerd, which runs a chat's turn with a coding CLI: the providers it
//! has, a turn as a stream of [`TurnEvent`]s, a turn's cancel and agentd's answers to its
//! bridge calls. Over `runnerd.sock` on this host (`[runnerd] socket`, else
//! `<runtime_dir>/runnerd.sock`) by default; in a cluster, a project's turns run on the host
//! that stores it, over NATS to the runnerd there (`[runnerd] serve_cluster`,
//! [`agentworks_contract::cluster::runnerd_subject`]): the host `[agentd.project_workspaced_hosts]`
//! names for the project, else `[agentd] workspaced_host`, else the socket. The providers (the
//! agents a person may pick) are asked of that default.
//!
//! Over NATS every call and answer is sealed with the cluster's runnerd key
//! ([`agentworks_daemon::bus`]). A turn's events come on an inbox this client subscribed to
//! before starting it, as [`TurnFrame`]s: each must carry a valid MAC and the next number, or it
//! is dropped and logged (a frame missing in between ends the turn); when neither an event nor a
//! heartbeat comes for [`TURN_SILENT_HEARTBEATS`] heartbeats, runnerd or its host is gone and
//! the turn ends with `runnerd_unreachable`, naming the host.
//!
//! runnerd is optional: without it the only agent is `api`. A socket (or a host's subject)
//! nobody listens on is [`RunnerdError::NotRunning`], with the sentence a person acts on. Never decides who may
//! run what: the chat API and the turn check the person first.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use agentworks_contract::cluster::{
    PeerCall, RUNNERD_KEY, RUNNERD_TURNS, TURN_HEARTBEAT_SECS, TURN_SILENT_HEARTBEATS, TurnCall,
    TurnFrame, runnerd_subject,
};
use agentworks_contract::runnerd::{
    BridgeAnswer, BridgeError, ProvidersAnswer, TurnEvent, TurnRequest,
};
use agentworks_daemon::bus::{self, BusError, BusKey};
use agentworks_daemon::config::Config;
use agentworks_support::clock::now_ms;
use agentworks_support::unix_http::{ClientError, LineStream, UnixClient, decode_response};
use futures_util::StreamExt;
use serde::de::DeserializeOwned;
use std::path::Path;

/// The longest line of a turn's stream runnerd may send (a tool's output is bounded there).
pub const MAX_EVENT_LINE_BYTES: usize = 4 * 1024 * 1024;

/// What a person is told when runnerd does not answer.
pub const NOT_RUNNING: &str = "runnerd is not running: start agentworks-runnerd";

/// How long a call to the runnerd of another host waits for its answer (a turn's start, a
/// cancel, a bridge answer, the providers: each answered at once there).
pub const CLUSTER_CALL_TIMEOUT: Duration = Duration::from_secs(10);

/// The most dropped frames of one turn logged one by one; the rest are counted.
const LOGGED_DROPS: u32 = 16;

#[derive(Debug, thiserror::Error)]
pub enum RunnerdError {
    /// Nothing listens on the socket (or it is missing), or on the NATS subject of the host's
    /// runnerd: runnerd is not running. `socket` names where it was called.
    #[error("{NOT_RUNNING} (nothing answers on {socket})")]
    NotRunning { socket: String },
    /// The runnerd of another cluster host does not answer: a call got no answer in time, or a
    /// running turn's frames stopped.
    #[error("the runnerd of cluster host {host:?} cannot be reached: {reason}")]
    Unreachable { host: String, reason: String },
    /// Frames of a turn from another host never arrived: the turn's stream has a hole.
    #[error(
        "{missing} message(s) of the turn from the runnerd of cluster host {host:?} were lost \
         on NATS; the turn is ended here"
    )]
    Lost { host: String, missing: u64 },
    /// runnerd refused the call with its own code and sentence.
    #[error("{message}")]
    Refused { code: String, message: String },
    /// The exchange failed otherwise (a broken connection, an answer that is not runnerd's).
    #[error("runnerd failed: {0}")]
    Failed(ClientError),
    /// A line of the turn's stream is not a turn event.
    #[error("runnerd sent a line that is not a turn event: {0}")]
    BadEvent(serde_json::Error),
}

impl RunnerdError {
    /// The stable code a turn's `error` event carries.
    pub fn code(&self) -> &str {
        match self {
            RunnerdError::NotRunning { .. } => "runnerd_not_running",
            RunnerdError::Unreachable { .. } => "runnerd_unreachable",
            RunnerdError::Refused { code, .. } => code,
            RunnerdError::Failed(_) | RunnerdError::BadEvent(_) | RunnerdError::Lost { .. } => {
                "runnerd_failed"
            }
        }
    }
}

impl From<ClientError> for RunnerdError {
    fn from(error: ClientError) -> RunnerdError {
        match error {
            ClientError::Connect { path, .. } => RunnerdError::NotRunning {
                socket: path.display().to_string(),
            },
            ClientError::Remote { body, .. } => RunnerdError::Refused {
                code: body.code,
                message: body.message,
            },
            other => RunnerdError::Failed(other),
        }
    }
}

/// Why the runnerd of another host cannot be called at start.
#[derive(Debug, thiserror::Error)]
pub enum RunnerdClientError {
    #[error("cannot read the cluster's runnerd key from the cluster database")]
    Key(#[source] bus::KeyError),
}

/// A cheap-to-clone client for runnerd: where each project's turns run.
#[derive(Debug, Clone)]
pub struct RunnerdClient {
    /// Every project not listed in `by_project`, and the providers.
    default: Route,
    /// A project's folder → the runnerd of the host that stores it.
    by_project: Arc<BTreeMap<String, Route>>,
}

/// One runnerd.
#[derive(Debug, Clone)]
enum Route {
    /// `runnerd.sock` on this host.
    Socket(UnixClient),
    /// The runnerd of another cluster host, over NATS.
    Cluster(Arc<OnHost>),
}

/// The runnerd of cluster host `host`.
struct OnHost {
    client: async_nats::Client,
    key: BusKey,
    host: String,
    /// This agentd's host id, as the calls' origin.
    origin: String,
}

impl std::fmt::Debug for OnHost {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OnHost").field("host", &self.host).finish()
    }
}

impl RunnerdClient {
    /// A client for the socket at `socket` alone.
    pub fn new(socket: impl AsRef<Path>) -> RunnerdClient {
        RunnerdClient {
            default: Route::Socket(UnixClient::new(socket.as_ref())),
            by_project: Arc::default(),
        }
    }

    /// The client `config` asks for: in a cluster (`nats`, agentd's connection), over NATS to
    /// the runnerd of the host that stores each project, as [`super::workspaced`] reaches its
    /// workspaced (`agentd.workspaced_host`, `[agentd.project_workspaced_hosts]`); else the
    /// socket.
    pub async fn for_config(
        config: &Config,
        nats: Option<async_nats::Client>,
    ) -> Result<RunnerdClient, RunnerdClientError> {
        let socket = RunnerdClient::new(config.runnerd_socket());
        let agentd = &config.agentd;
        let (Some(client), true) = (
            nats,
            agentd.workspaced_host.is_some() || !agentd.project_workspaced_hosts.is_empty(),
        ) else {
            return Ok(socket);
        };
        let key = bus::cluster_key(&config.cluster, "agentworks-agentd", RUNNERD_KEY)
            .await
            .map_err(RunnerdClientError::Key)?;
        let origin = config.cluster.host_id.clone().unwrap_or_else(|| "-".into());
        let on_host = |host: &str| {
            Route::Cluster(Arc::new(OnHost {
                client: client.clone(),
                key: key.clone(),
                host: host.to_owned(),
                origin: origin.clone(),
            }))
        };
        Ok(RunnerdClient {
            default: agentd
                .workspaced_host
                .as_deref()
                .map_or(socket.default, on_host),
            by_project: Arc::new(
                agentd
                    .project_workspaced_hosts
                    .iter()
                    .map(|(folder, host)| (folder.clone(), on_host(host)))
                    .collect(),
            ),
        })
    }

    /// Where calls go, for logs: the socket's path or the NATS subject, and each project sent
    /// elsewhere.
    pub fn target(&self) -> String {
        let mut target = self.default.target();
        for (folder, route) in self.by_project.iter() {
            target.push_str(&format!(", project {folder:?}: {}", route.target()));
        }
        target
    }

    /// This client with every call going to the runnerd of the project whose folder is
    /// `project`: what a turn's start, cancel and bridge answers use.
    pub fn on_project(&self, project: &str) -> RunnerdClient {
        RunnerdClient {
            default: self.route(project).clone(),
            by_project: Arc::default(),
        }
    }

    fn route(&self, project: &str) -> &Route {
        self.by_project.get(project).unwrap_or(&self.default)
    }

    /// `GET /v1/providers`: the providers runnerd has, and whether each can run.
    pub async fn providers(&self) -> Result<ProvidersAnswer, RunnerdError> {
        match &self.default {
            Route::Socket(client) => Ok(client.get("/v1/providers").await?),
            Route::Cluster(on) => on.call("/v1/providers", String::new()).await,
        }
    }

    /// `POST /v1/turns` to the runnerd of the request's project: starts a turn; its events
    /// follow on the stream.
    pub async fn start_turn(&self, request: &TurnRequest) -> Result<TurnStream, RunnerdError> {
        match self.route(&request.project) {
            Route::Socket(client) => {
                let lines = client
                    .post_lines("/v1/turns", request, MAX_EVENT_LINE_BYTES)
                    .await?;
                Ok(TurnStream::Socket(lines))
            }
            Route::Cluster(on) => on.start_turn(request).await.map(TurnStream::Cluster),
        }
    }

    /// `POST /v1/turns/{id}/bridge/{call_id}`: agentd's answer to a bridge call of the turn.
    pub async fn answer_bridge(
        &self,
        turn_id: &str,
        call_id: &str,
        answer: &BridgeAnswer,
    ) -> Result<(), RunnerdError> {
        let path = format!(
            "/v1/turns/{}/bridge/{}",
            url_segment(turn_id),
            url_segment(call_id)
        );
        match &self.default {
            Route::Socket(client) => {
                taken(client.post::<_, serde_json::Value>(&path, answer).await)
            }
            Route::Cluster(on) => {
                let body = on.fitting_answer(&path, answer)?;
                taken(on.call::<serde_json::Value>(&path, body).await)
            }
        }
    }

    /// `POST /v1/turns/{id}/cancel`: ends the turn's CLI and its process tree.
    pub async fn cancel(&self, turn_id: &str) -> Result<(), RunnerdError> {
        // The id is runnerd's own; it goes in the path, so it must stay one segment.
        let path = format!("/v1/turns/{}/cancel", url_segment(turn_id));
        match &self.default {
            Route::Socket(client) => taken(
                client
                    .post::<_, serde_json::Value>(&path, &serde_json::json!({}))
                    .await,
            ),
            Route::Cluster(on) => taken(on.call::<serde_json::Value>(&path, "{}".into()).await),
        }
    }
}

/// An answer that is not JSON still means runnerd took the call.
fn taken<E: Into<RunnerdError>>(result: Result<serde_json::Value, E>) -> Result<(), RunnerdError> {
    match result.map_err(Into::into) {
        Ok(_) | Err(RunnerdError::Failed(ClientError::Decode { .. })) => Ok(()),
        Err(error) => Err(error),
    }
}

impl Route {
    fn target(&self) -> String {
        match self {
            Route::Socket(client) => client.socket().display().to_string(),
            Route::Cluster(on) => runnerd_subject(&on.host),
        }
    }
}

impl OnHost {
    /// One sealed call of `path` with `body` to this host's runnerd: its 2xx answer as `Resp`.
    async fn call<Resp: DeserializeOwned>(
        &self,
        path: &str,
        body: String,
    ) -> Result<Resp, RunnerdError> {
        let call = PeerCall {
            origin: self.origin.clone(),
            sent_at_ms: now_ms(),
            path: path.to_owned(),
            body,
        };
        let subject = runnerd_subject(&self.host);
        let unreachable = |reason: String| RunnerdError::Unreachable {
            host: self.host.clone(),
            reason,
        };
        let (status, answer) = bus::request(
            &self.client,
            &self.key,
            &subject,
            &call,
            CLUSTER_CALL_TIMEOUT,
        )
        .await
        .map_err(|error| match error {
            BusError::NoResponders { .. } => RunnerdError::NotRunning {
                socket: format!(
                    "{subject}, cluster host {:?}, which needs [runnerd] serve_cluster",
                    self.host
                ),
            },
            error @ BusError::TimedOut { .. } => unreachable(error.to_string()),
            other => RunnerdError::Failed(ClientError::Elsewhere {
                endpoint: path.to_owned(),
                reason: other.to_string(),
            }),
        })?;
        Ok(decode_response(path, status, &answer)?)
    }

    /// `body` as JSON for a call of `path`, or, when it is larger than the NATS server's
    /// messages carry, an answer saying so: runnerd's wait for the answer then ends at once,
    /// with a tool error the CLI's model sees, rather than at its timeout.
    fn fitting_answer(&self, path: &str, answer: &BridgeAnswer) -> Result<String, RunnerdError> {
        let encode = |answer: &BridgeAnswer| {
            serde_json::to_string(answer).map_err(|source| {
                RunnerdError::Failed(ClientError::Encode {
                    endpoint: path.to_owned(),
                    source,
                })
            })
        };
        let body = encode(answer)?;
        let max_payload = self.client.server_info().max_payload;
        // The call's envelope escapes the body again; 1 KiB for the rest and the headers.
        let sealed = serde_json::to_vec(&body).map_or(usize::MAX, |v| v.len()) + 1024;
        if sealed <= max_payload {
            return Ok(body);
        }
        encode(&BridgeAnswer {
            ok: false,
            result: None,
            error: Some(BridgeError {
                code: "result_too_large".into(),
                message: format!(
                    "the tool's result ({} bytes) is larger than the cluster's NATS messages \
                     carry ({max_payload} bytes, the NATS server's max_payload)",
                    body.len()
                ),
            }),
        })
    }

    /// Subscribes to a new inbox, then asks this host's runnerd to start `request` there.
    async fn start_turn(&self, request: &TurnRequest) -> Result<BusTurn, RunnerdError> {
        let inbox = self.client.new_inbox();
        let frames =
            self.client
                .subscribe(inbox.clone())
                .await
                .map_err(|e| RunnerdError::Unreachable {
                    host: self.host.clone(),
                    reason: format!("cannot subscribe to the turn's inbox: {e}"),
                })?;
        let call = TurnCall {
            inbox,
            turn: request.clone(),
        };
        let body = serde_json::to_string(&call).map_err(|source| {
            RunnerdError::Failed(ClientError::Encode {
                endpoint: RUNNERD_TURNS.to_owned(),
                source,
            })
        })?;
        let _: serde_json::Value = self.call(RUNNERD_TURNS, body).await?;
        Ok(BusTurn::new(frames, self.key.clone(), self.host.clone()))
    }
}

/// `turn_id` with every byte outside `[A-Za-z0-9_-]` percent-encoded.
fn url_segment(turn_id: &str) -> String {
    turn_id
        .bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' => (b as char).to_string(),
            other => format!("%{other:02X}"),
        })
        .collect()
}

/// A running turn's events, in order: from the socket's response, or from the frames of a
/// runnerd on another host. Dropping it closes the stream (or the inbox), which does not stop
/// the turn: [`RunnerdClient::cancel`] does.
pub enum TurnStream {
    Socket(LineStream),
    Cluster(BusTurn),
}

impl TurnStream {
    /// The next event; `None` when runnerd closed the stream. Blank lines are skipped.
    pub async fn next(&mut self) -> Result<Option<TurnEvent>, RunnerdError> {
        loop {
            let line = match self {
                TurnStream::Socket(lines) => lines.next_line().await?,
                TurnStream::Cluster(turn) => turn.next_line().await?,
            };
            let Some(line) = line else {
                return Ok(None);
            };
            if line.iter().all(u8::is_ascii_whitespace) {
                continue;
            }
            return serde_json::from_slice(&line)
                .map(Some)
                .map_err(RunnerdError::BadEvent);
        }
    }
}

/// A turn's frames on this agentd's inbox, from the runnerd of `host`.
pub struct BusTurn {
    frames: async_nats::Subscriber,
    key: BusKey,
    host: String,
    /// The number the next frame must carry.
    expected: u64,
    /// The pieces of a line received so far.
    line: Vec<u8>,
    /// When the turn counts as gone unless a valid frame comes first.
    deadline: tokio::time::Instant,
    /// Frames dropped so far (a bad MAC, not a frame, a number seen already).
    dropped: u32,
    closed: bool,
}

/// How long a turn's frames may stop before runnerd counts as gone.
fn silence() -> Duration {
    Duration::from_secs(TURN_HEARTBEAT_SECS * TURN_SILENT_HEARTBEATS)
}

impl BusTurn {
    fn new(frames: async_nats::Subscriber, key: BusKey, host: String) -> BusTurn {
        BusTurn {
            frames,
            key,
            host,
            expected: 0,
            line: Vec::new(),
            deadline: tokio::time::Instant::now() + silence(),
            dropped: 0,
            closed: false,
        }
    }

    fn drop_frame(&mut self, subject: &str, problem: &str) {
        self.dropped = self.dropped.saturating_add(1);
        if self.dropped <= LOGGED_DROPS {
            tracing::warn!(
                host = %self.host,
                subject,
                problem,
                "dropped a message on a turn's inbox"
            );
        }
    }

    /// The next whole line of the turn's stream; `None` once runnerd closed it.
    async fn next_line(&mut self) -> Result<Option<Vec<u8>>, RunnerdError> {
        // A frame is a piece of a line at most, JSON-escaped once more, and its fields.
        const MAX_FRAME_BYTES: usize = 2 * MAX_EVENT_LINE_BYTES + 4096;
        loop {
            if self.closed {
                return Ok(None);
            }
            let message = match tokio::time::timeout_at(self.deadline, self.frames.next()).await {
                Ok(Some(message)) => message,
                Ok(None) => {
                    return Err(RunnerdError::Unreachable {
                        host: self.host.clone(),
                        reason: "the NATS subscription of the turn's inbox ended".into(),
                    });
                }
                Err(_) => {
                    return Err(RunnerdError::Unreachable {
                        host: self.host.clone(),
                        reason: format!(
                            "neither an event nor a heartbeat of the turn came for {} s (did \
                             agentworks-runnerd or its host stop?); the turn is ended here",
                            silence().as_secs()
                        ),
                    });
                }
            };
            let frame = bus::verify_sealed(&self.key, &message, MAX_FRAME_BYTES).and_then(|p| {
                serde_json::from_slice::<TurnFrame>(p).map_err(|_| "not a turn's frame")
            });
            let frame = match frame {
                Ok(frame) => frame,
                Err(problem) => {
                    self.drop_frame(&message.subject, problem);
                    continue;
                }
            };
            let seq = frame.seq();
            if seq < self.expected {
                self.drop_frame(&message.subject, "its number came already (a replay)");
                continue;
            }
            if seq > self.expected {
                return Err(RunnerdError::Lost {
                    host: self.host.clone(),
                    missing: seq - self.expected,
                });
            }
            self.expected += 1;
            self.deadline = tokio::time::Instant::now() + silence();
            match frame {
                TurnFrame::Heartbeat { .. } => {}
                TurnFrame::Closed { .. } => self.closed = true,
                TurnFrame::Line { data, more, .. } => {
                    if self.line.len() + data.len() > MAX_EVENT_LINE_BYTES {
                        return Err(RunnerdError::Failed(ClientError::Elsewhere {
                            endpoint: RUNNERD_TURNS.to_owned(),
                            reason: format!(
                                "the runnerd of cluster host {:?} sent a line longer than \
                                 {MAX_EVENT_LINE_BYTES} bytes",
                                self.host
                            ),
                        }));
                    }
                    self.line.extend_from_slice(data.as_bytes());
                    if !more {
                        return Ok(Some(std::mem::take(&mut self.line)));
                    }
                }
            }
        }
    }
}

impl Drop for BusTurn {
    fn drop(&mut self) {
        if self.dropped > LOGGED_DROPS {
            tracing::warn!(
                host = %self.host,
                dropped = self.dropped,
                "dropped messages on a turn's inbox (the first {LOGGED_DROPS} were logged)"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_socket_nobody_listens_on_means_runnerd_is_not_running() {
        let tmp = tempfile::tempdir().unwrap();
        let error = RunnerdClient::new(tmp.path().join("runnerd.sock"))
            .providers()
            .await
            .unwrap_err();
        assert_eq!(error.code(), "runnerd_not_running");
        assert!(error.to_string().starts_with(NOT_RUNNING), "{error}");
    }

    #[test]
    fn a_turn_id_stays_one_path_segment() {
        assert_eq!(url_segment("t-1_a"), "t-1_a");
        assert_eq!(url_segment("../x y"), "%2E%2E%2Fx%20y");
    }
}
