//! `agentworks executor connect`: the WebSocket client loop.
//!
//! Owns: dialling `<gateway>/v1/executor` (`wss://`, or `ws://` to loopback only) with
//! `Authorization: Bearer <token>`; the Hello with folder aliases; answering pings and noticing
//! a silent server; failing over between the gateways given, in their order, and waiting with
//! exponential backoff (1 s → 30 s, with jitter) only once a whole round of them failed, and
//! not at all before the first redial after a session that served ([`Failover`]); the
//! one-line status on stderr; running each request under the grants and the receipts;
//! answering the server's receipt queries from the receipts alone; ending on SIGINT/SIGTERM (running
//! commands cancelled, close 1000) or on a 4001/4003 close from any gateway (the credential is
//! no longer accepted, and the other gateways are not tried with it).
//!
//! Must never: send an absolute path in the Hello; run a request whose receipt could not be
//! recorded first; run a request id twice; keep a command running after its connection is gone;
//! run anything because of a receipt query.

use std::collections::HashMap;
use std::io::IsTerminal;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use tokio::sync::mpsc;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::protocol::{CloseFrame, WebSocketConfig};
use tokio_tungstenite::tungstenite::{self, Message};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use agentworks_contract::executor::{
    CLOSE_REVOKED, CLOSE_UNAUTHORIZED, ExecutorFrame, FolderAccess, GatewayFrame, MAX_FRAME_BYTES,
    MAX_TIMEOUT_SECS, Operation, Outcome, UndoneChange,
};
use agentworks_fs::failpoint::{self, Failpoint};

use super::config::{Dirs, ensure_private_dir};
use super::grants::{Folder, Grants};
use super::project_config::Snapshot;
use super::receipts::{Begin, Receipts};
use super::shell::{self, ShellError, ShellRequest};
use super::tls::TlsClient;
use agentworks_sandbox::SandboxPolicy;
use agentworks_sandbox::cgroup::CommandCgroup;

/// The gateway's default port, used when no gateway URL was given: agentd's host, this port,
/// `ws` for an `http` agentd and `wss` for an `https` one.
pub const DEFAULT_GATEWAY_PORT: u16 = 8471;
/// First and largest reconnect delay.
const BACKOFF_START: Duration = Duration::from_secs(1);
const BACKOFF_MAX: Duration = Duration::from_secs(30);
/// The most jitter added to a wait of `backoff`: a quarter of it, so laptops cut off together
/// do not all redial at once.
const fn jitter_cap(backoff: Duration) -> Duration {
    match backoff.checked_div(4) {
        Some(cap) => cap,
        None => Duration::ZERO,
    }
}
/// The longest wait between two dials: the capped backoff and its jitter. A test waiting for a
/// laptop to come back after a long outage waits at least this.
pub const LONGEST_REDIAL_WAIT: Duration = BACKOFF_MAX.saturating_add(jitter_cap(BACKOFF_MAX));
/// A session welcomed and up at least this long has served: the backoff starts again at
/// [`BACKOFF_START`] and a new round of the gateways begins, its first dial at once. A shorter
/// one counts as a failure, so gateways that welcome and then drop the executor at once are not
/// redialled without a wait (and a served session's immediate redial comes at most once per
/// this long).
const SERVED_AFTER: Duration = BACKOFF_START;
/// How long to wait for the handshake.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(20);
/// Heartbeat interval assumed until the server's Welcome names one.
const DEFAULT_HEARTBEAT: Duration = Duration::from_secs(30);

/// Why the executor could not (or may not) connect.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    #[error("bad server URL {url:?}: {reason}")]
    BadUrl { url: String, reason: String },
    #[error(
        "refusing {url}: unencrypted ws:// is only allowed to a loopback host (127.0.0.1, ::1, localhost); use wss://"
    )]
    InsecureUrl { url: String },
    #[error("cannot set up TLS: {0}")]
    Tls(String),
}

/// A parsed `scheme://host[:port]` base URL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BaseUrl {
    pub scheme: String,
    pub host: String,
    pub port: Option<u16>,
    pub path: String,
}

/// Parse a base URL; `allowed` lists the schemes accepted.
pub fn parse_url(raw: &str, allowed: &[&str]) -> Result<BaseUrl, ConnectError> {
    let bad = |reason: &str| ConnectError::BadUrl {
        url: raw.to_owned(),
        reason: reason.to_owned(),
    };
    let uri: hyper::Uri = raw.parse().map_err(|_| bad("not a URL"))?;
    let scheme = uri
        .scheme_str()
        .ok_or_else(|| bad("no scheme"))?
        .to_ascii_lowercase();
    if !allowed.contains(&scheme.as_str()) {
        return Err(bad(&format!("use one of: {}", allowed.join(", "))));
    }
    let host = uri.host().ok_or_else(|| bad("no host"))?.to_owned();
    if uri.query().is_some() {
        return Err(bad("a query is not allowed"));
    }
    Ok(BaseUrl {
        scheme,
        host,
        port: uri.port_u16(),
        path: uri.path().trim_end_matches('/').to_owned(),
    })
}

pub use agentworks_support::url::is_loopback_host as is_loopback;

impl BaseUrl {
    pub fn authority(&self) -> String {
        let host = if self.host.contains(':') && !self.host.starts_with('[') {
            format!("[{}]", self.host)
        } else {
            self.host.clone()
        };
        match self.port {
            Some(port) => format!("{host}:{port}"),
            None => host,
        }
    }

    pub fn render(&self) -> String {
        format!("{}://{}{}", self.scheme, self.authority(), self.path)
    }
}

/// The executor endpoint: `--gateway`/stored gateway URL, or agentd's host on
/// [`DEFAULT_GATEWAY_PORT`]. `ws://` is accepted only to loopback.
pub fn executor_url(gateway: Option<&str>, server: &str) -> Result<String, ConnectError> {
    let base = match gateway {
        Some(raw) => parse_url(raw, &["ws", "wss"])?,
        None => {
            let server = parse_url(server, &["http", "https"])?;
            BaseUrl {
                scheme: if server.scheme == "https" {
                    "wss"
                } else {
                    "ws"
                }
                .to_owned(),
                host: server.host,
                port: Some(DEFAULT_GATEWAY_PORT),
                path: String::new(),
            }
        }
    };
    if base.scheme == "ws" && !is_loopback(&base.host) {
        return Err(ConnectError::InsecureUrl { url: base.render() });
    }
    Ok(format!("{}/v1/executor", base.render()))
}

/// The executor endpoints in failover order: each gateway URL (`--gateway`, repeated, or the
/// list stored at login) checked as [`executor_url`] checks one, the first bad one refusing
/// them all; with none, agentd's host on [`DEFAULT_GATEWAY_PORT`] alone.
pub fn executor_urls(gateways: &[String], server: &str) -> Result<Vec<String>, ConnectError> {
    if gateways.is_empty() {
        return Ok(vec![executor_url(None, server)?]);
    }
    gateways
        .iter()
        .map(|gateway| executor_url(Some(gateway), server))
        .collect()
}

/// Which gateway the loop dials next and how long it waits first. The gateways are tried in
/// the order given, one after another; only once every gateway of a round has failed does the
/// loop wait, 1 s doubling to 30 s (the caller adds the jitter). A session that served (see
/// [`SERVED_AFTER`]) resets the backoff and starts a new round at the next gateway (with one
/// gateway, the same one), dialled at once: losing a session that served is not a failed
/// dial, and waiting before the first redial would add the whole backoff to every failover
/// (issue 16). The new round waits only once each gateway in it failed. A session lost
/// before it served counts as a failure like a refused dial, so gateways that welcome and
/// drop the executor at once stay under the backoff.
///
/// Pure (no clock, no randomness), so the order and the waits are unit-tested.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failover {
    /// How many gateways there are (at least one).
    count: usize,
    /// The index of the gateway dialled now.
    current: usize,
    /// How many gateways failed since the round began.
    failed: usize,
    /// The wait after the next round that fails.
    backoff: Duration,
}

impl Failover {
    /// A round starting at the first of `count` gateways.
    pub fn new(count: usize) -> Failover {
        Failover::at(count, 0)
    }

    /// A round at gateway `current` of `count` (a list that just changed: the gateway dialled
    /// now is at `current` in it).
    pub fn at(count: usize, current: usize) -> Failover {
        let count = count.max(1);
        Failover {
            count,
            current: current.min(count - 1),
            failed: 0,
            backoff: BACKOFF_START,
        }
    }

    /// The index of the gateway to dial.
    pub fn current(&self) -> usize {
        self.current
    }

    /// The session on the current gateway ended (or its dial failed); `served`: it was
    /// welcomed and lasted (see [`SERVED_AFTER`]). Moves on to the next gateway and returns
    /// how long to wait before dialling it: `None` after a session that served and within a
    /// round, the backoff once the round has failed whole (the next round's is doubled, up to
    /// 30 s).
    pub fn next_gateway(&mut self, served: bool) -> Option<Duration> {
        self.current = (self.current + 1) % self.count;
        if served {
            // A new round, whose first dial is now; its gateways' failures are counted anew.
            self.failed = 0;
            self.backoff = BACKOFF_START;
            return None;
        }
        self.failed += 1;
        if self.failed < self.count {
            return None;
        }
        self.failed = 0;
        let wait = self.backoff;
        self.backoff = (self.backoff * 2).min(BACKOFF_MAX);
        Some(wait)
    }
}

/// The TLS client configuration, or why it cannot be built.
pub fn tls_config() -> Result<TlsClient, ConnectError> {
    TlsClient::new().map_err(|e| ConnectError::Tls(e.to_string()))
}

/// The status line: `\r`-rewritten on a terminal, plain lines otherwise.
#[derive(Debug, Clone)]
pub struct Status {
    tty: bool,
}

impl Default for Status {
    fn default() -> Self {
        Status {
            tty: std::io::stderr().is_terminal(),
        }
    }
}

impl Status {
    /// Shows `text`, which may quote what a server sent, without its control characters: the
    /// only escape sequence on this line is the status line's own rewrite.
    pub fn show(&self, text: &str) {
        let text = agentworks_core::text::strip_controls(text);
        if self.tty {
            eprint!("\r\x1b[2K{text}");
        } else {
            eprintln!("{text}");
        }
    }

    /// End the status line (on a terminal) before printing something else.
    pub fn finish(&self) {
        if self.tty {
            eprintln!();
        }
    }
}

/// Everything a connection needs.
pub struct Executor {
    /// The executor endpoints (`…/v1/executor`), in failover order; at least one.
    pub gateways: Vec<String>,
    pub token: String,
    /// The account stored with the token at login, shown until a gateway names it.
    pub account: Option<String>,
    pub device_name: String,
    pub grants: Arc<Grants>,
    pub dirs: Dirs,
    pub receipts: Arc<Receipts>,
    /// The `agentworks` executable (the sandbox launcher).
    pub launcher: PathBuf,
    /// Process, memory and Unix-socket limits, and the delegated cgroup (the sandbox crate's
    /// `limits`).
    pub limits: Arc<agentworks_sandbox::limits::Limits>,
    /// How exclusions inside writable folders are enforced here (found at connect).
    pub exclusions: agentworks_sandbox::ExclusionMechanism,
    /// `--allow-project-config`: commands' changes to the protected project config stay.
    pub allow_project_config: bool,
    pub status: Status,
    /// The executor endpoints the server advertised in its last welcome (`[gatewayd]
    /// advertised_urls`), each checked as [`executor_url`] checks `--gateway`; empty until one
    /// does. The loop fails over between these first, then the ones it was given.
    pub advertised: std::sync::Mutex<Vec<String>>,
}

/// The most advertised gateways taken from one welcome.
pub const MAX_ADVERTISED: usize = 16;

/// The failover list once the server advertised `advertised`: those first, in its order, then
/// the gateways given (`--gateway` or login) that it did not name.
pub fn with_advertised(advertised: &[String], given: &[String]) -> Vec<String> {
    let mut list: Vec<String> = Vec::with_capacity(advertised.len() + given.len());
    for url in advertised.iter().chain(given) {
        if !list.contains(url) {
            list.push(url.clone());
        }
    }
    list
}

/// How `run` ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum End {
    /// SIGINT/SIGTERM: sharing ended.
    Shutdown,
    /// The server closed with 4001/4003 (or refused the handshake with 401/403).
    Unauthorized(String),
}

enum SessionEnd {
    Shutdown,
    Unauthorized(String),
    Lost { reason: String, welcomed: bool },
}

/// Connect, serve, fail over and reconnect until shut down or refused. A refused credential
/// (4001/4003, or 401/403 at the handshake) ends the loop whichever gateway refused it.
pub async fn run(
    executor: Arc<Executor>,
    shutdown: CancellationToken,
) -> Result<End, ConnectError> {
    let needs_tls = |gateways: &[String]| gateways.iter().any(|url| url.starts_with("wss://"));
    let mut tls = if needs_tls(&executor.gateways) {
        Some(tls_config()?)
    } else {
        None
    };
    let mut gateways = executor.gateways.clone();
    let mut failover = Failover::new(gateways.len());
    let mut url = gateway_at(&gateways, failover.current()).to_owned();
    let mut status = format!("connecting to {url} …");
    loop {
        executor.status.show(&status);
        let started = tokio::time::Instant::now();
        match session(&executor, &url, tls.clone(), &shutdown).await {
            SessionEnd::Shutdown => return Ok(End::Shutdown),
            SessionEnd::Unauthorized(message) => return Ok(End::Unauthorized(message)),
            SessionEnd::Lost { reason, welcomed } => {
                let served = welcomed && started.elapsed() >= SERVED_AFTER;
                // The server's list, if it sent one, joins the failover from here on.
                let advertised = executor
                    .advertised
                    .lock()
                    .map(|list| list.clone())
                    .unwrap_or_default();
                let listed = with_advertised(&advertised, &executor.gateways);
                if listed != gateways {
                    if tls.is_none() && needs_tls(&listed) {
                        tls = Some(tls_config()?);
                    }
                    let here = listed.iter().position(|g| *g == url).unwrap_or(0);
                    failover = Failover::at(listed.len(), here);
                    gateways = listed;
                }
                let wait = failover.next_gateway(served);
                let next = gateway_at(&gateways, failover.current()).to_owned();
                let lost = if gateways.len() == 1 {
                    format!("disconnected ({reason}); reconnecting")
                } else {
                    format!("gateway {url} lost ({reason}); trying {next}")
                };
                url = next;
                status = format!("connecting to {url} …");
                let Some(backoff) = wait else {
                    status = format!("{lost} …");
                    continue;
                };
                let cap = u64::try_from(jitter_cap(backoff).as_millis()).unwrap_or(u64::MAX);
                let jitter = Duration::from_millis(rand::random::<u64>() % cap.saturating_add(1));
                let delay = backoff + jitter;
                executor
                    .status
                    .show(&format!("{lost} in {:.1} s", delay.as_secs_f64()));
                tokio::select! {
                    () = tokio::time::sleep(delay) => {}
                    () = shutdown.cancelled() => return Ok(End::Shutdown),
                }
            }
        }
    }
}

/// The gateway at `index` (the list is never empty; [`Failover`] keeps the index in range).
fn gateway_at(gateways: &[String], index: usize) -> &str {
    gateways.get(index).map_or("", String::as_str)
}

fn lost(reason: impl Into<String>, welcomed: bool) -> SessionEnd {
    SessionEnd::Lost {
        reason: reason.into(),
        welcomed,
    }
}

/// The WebSocket to the gateway, and its two halves once split.
type Socket =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;
type SocketSink = futures_util::stream::SplitSink<Socket, Message>;
type SocketStream = futures_util::stream::SplitStream<Socket>;

/// One connection, start to end: dial, Hello, the frame loop, then every running command
/// stopped and (on shutdown) a normal close.
async fn session(
    executor: &Arc<Executor>,
    url: &str,
    tls: Option<TlsClient>,
    shutdown: &CancellationToken,
) -> SessionEnd {
    let ws = match dial(executor, url, tls, shutdown).await {
        Ok(ws) => ws,
        Err(end) => return end,
    };
    let (mut sink, mut stream) = ws.split();
    let hello = ExecutorFrame::Hello {
        device_name: executor.device_name.clone(),
        version: env!("CARGO_PKG_VERSION").to_owned(),
        folders: executor.grants.folder_infos(),
    };
    if let Err(e) = send(&mut sink, &hello).await {
        return lost(e, false);
    }
    executor
        .status
        .show("connected; waiting for the server's welcome");

    let (out_tx, mut out_rx) = mpsc::channel::<ExecutorFrame>(64);
    let mut connection = Connection {
        executor,
        out_tx,
        cancel: shutdown.child_token(),
        running: Arc::default(),
        tasks: TaskTracker::new(),
        heartbeat: DEFAULT_HEARTBEAT,
        welcomed: false,
    };
    let end = connection
        .serve(&mut sink, &mut stream, &mut out_rx, shutdown)
        .await;
    connection.end(&end, &mut sink, &mut stream).await;
    end
}

/// The WebSocket limits of the executor's connection: no message or frame larger than
/// [`MAX_FRAME_BYTES`].
pub fn ws_config() -> WebSocketConfig {
    let mut config = WebSocketConfig::default();
    config.max_message_size = Some(MAX_FRAME_BYTES);
    config.max_frame_size = Some(MAX_FRAME_BYTES);
    config
}

/// Dials the gateway at `url` with the bearer token; the handshake's refusal (401/403) is
/// final.
async fn dial(
    executor: &Executor,
    url: &str,
    tls: Option<TlsClient>,
    shutdown: &CancellationToken,
) -> Result<Socket, SessionEnd> {
    let mut request = match url.into_client_request() {
        Ok(request) => request,
        Err(e) => return Err(lost(e.to_string(), false)),
    };
    match format!("Bearer {}", executor.token).parse() {
        Ok(value) => {
            request.headers_mut().insert("authorization", value);
        }
        Err(_) => {
            return Err(SessionEnd::Unauthorized(
                "the stored token is malformed".into(),
            ));
        }
    }
    let connector = tls.map(super::tls::ws_connector);
    let dial = tokio_tungstenite::connect_async_tls_with_config(
        request,
        Some(ws_config()),
        true,
        connector,
    );
    tokio::select! {
        () = shutdown.cancelled() => Err(SessionEnd::Shutdown),
        dialled = tokio::time::timeout(CONNECT_TIMEOUT, dial) => match dialled {
            Err(_) => Err(lost("the handshake timed out", false)),
            Ok(Err(tungstenite::Error::Http(response)))
                if matches!(response.status().as_u16(), 401 | 403) =>
            {
                Err(SessionEnd::Unauthorized(format!(
                    "the server refused the credential (HTTP {})",
                    response.status()
                )))
            }
            Ok(Err(e)) => Err(lost(e.to_string(), false)),
            Ok(Ok((ws, _))) => Ok(ws),
        },
    }
}

/// What one connection keeps while it serves: where replies go, the requests it runs (each
/// cancellable by id, all cancelled with the connection), and what the server's Welcome said.
struct Connection<'a> {
    executor: &'a Arc<Executor>,
    /// Frames the request tasks send back; the frame loop writes them to the socket.
    out_tx: mpsc::Sender<ExecutorFrame>,
    /// Cancelled when the connection ends: every running command is a child of it.
    cancel: CancellationToken,
    running: Arc<Mutex<HashMap<String, CancellationToken>>>,
    tasks: TaskTracker,
    heartbeat: Duration,
    welcomed: bool,
}

impl Connection<'_> {
    /// The frame loop: until shutdown, a silent server (three heartbeats), a lost socket or a
    /// close, writes the tasks' frames out and handles each message the server sends.
    async fn serve(
        &mut self,
        sink: &mut SocketSink,
        stream: &mut SocketStream,
        out_rx: &mut mpsc::Receiver<ExecutorFrame>,
        shutdown: &CancellationToken,
    ) -> SessionEnd {
        let mut last_seen = tokio::time::Instant::now();
        loop {
            let silent_until = last_seen + self.heartbeat * 3;
            tokio::select! {
                () = shutdown.cancelled() => return SessionEnd::Shutdown,
                () = tokio::time::sleep_until(silent_until) => {
                    return lost("no heartbeat from the server", self.welcomed);
                }
                Some(frame) = out_rx.recv() => {
                    if let Err(e) = send(sink, &frame).await {
                        return lost(e, self.welcomed);
                    }
                }
                message = stream.next() => {
                    last_seen = tokio::time::Instant::now();
                    if let Some(end) = self.on_message(message, sink).await {
                        return end;
                    }
                }
            }
        }
    }

    /// One WebSocket message from the server; `Some` ends the session.
    async fn on_message(
        &mut self,
        message: Option<Result<Message, tungstenite::Error>>,
        sink: &mut SocketSink,
    ) -> Option<SessionEnd> {
        let welcomed = self.welcomed;
        match message {
            None => Some(lost("the connection closed", welcomed)),
            Some(Err(e)) => Some(lost(e.to_string(), welcomed)),
            Some(Ok(Message::Ping(data))) => match sink.send(Message::Pong(data)).await {
                Ok(()) => None,
                Err(e) => Some(lost(e.to_string(), welcomed)),
            },
            Some(Ok(Message::Close(frame))) => Some(closed_by_server(frame, welcomed)),
            Some(Ok(Message::Text(text))) => {
                self.on_frame(text.as_str());
                None
            }
            Some(Ok(_)) => None,
        }
    }

    /// One text frame from the server.
    fn on_frame(&mut self, text: &str) {
        match serde_json::from_str::<GatewayFrame>(text) {
            Ok(GatewayFrame::Welcome {
                device_id,
                heartbeat_secs,
                notice,
                gateways,
                account,
            }) => {
                self.on_welcome(&device_id, heartbeat_secs, notice, account);
                self.on_advertised(&gateways);
            }
            Ok(GatewayFrame::Request {
                request_id,
                folder,
                operation,
            }) => self.start_request(request_id, folder, operation),
            Ok(GatewayFrame::Cancel { request_id }) => {
                if let Some(token) = self
                    .running
                    .lock()
                    .ok()
                    .and_then(|m| m.get(&request_id).cloned())
                {
                    token.cancel();
                }
            }
            Ok(GatewayFrame::ReceiptQuery { request_id }) => self.answer_receipt_query(request_id),
            Err(e) => {
                self.executor
                    .status
                    .show(&format!("ignored a frame the server sent: {e}"));
            }
        }
    }

    /// Every (re)connect says which account's agent the laptop now serves: the gateway's word
    /// for it, else the one stored at login.
    fn on_welcome(
        &mut self,
        device_id: &str,
        heartbeat_secs: u64,
        notice: Option<String>,
        account: Option<String>,
    ) {
        let executor = self.executor;
        self.welcomed = true;
        self.heartbeat = Duration::from_secs(heartbeat_secs.clamp(1, 600));
        if let Some(notice) = notice {
            executor
                .status
                .show(&format!("notice from the server: {notice}"));
            executor.status.finish();
        }
        let aliases: Vec<String> = executor
            .grants
            .folders
            .iter()
            .map(|f| f.alias.clone())
            .collect();
        let serving = account
            .as_deref()
            .or(executor.account.as_deref())
            .map(|account| format!(" for the account {account}"))
            .unwrap_or_default();
        let line = format!(
            "connected as device {device_id}{serving}, sharing {}; Ctrl-C ends sharing",
            aliases.join(", ")
        );
        executor.status.show(&line);
    }

    /// The gateways the server advertised: each one a `--gateway` could be (`wss://`, or
    /// `ws://` to loopback) is kept for the failover, up to [`MAX_ADVERTISED`]; the others are
    /// named and left out, since the executor would send its token there.
    fn on_advertised(&mut self, gateways: &[String]) {
        if gateways.is_empty() {
            return;
        }
        let mut usable = Vec::new();
        for gateway in gateways.iter().take(MAX_ADVERTISED) {
            match executor_url(Some(gateway), "") {
                Ok(endpoint) if !usable.contains(&endpoint) => usable.push(endpoint),
                Ok(_) => {}
                Err(error) => self.executor.status.show(&format!(
                    "ignored an advertised gateway {gateway:?}: {error}"
                )),
            }
        }
        if let Ok(mut advertised) = self.executor.advertised.lock()
            && *advertised != usable
        {
            *advertised = usable;
        }
    }

    /// Runs one request in its own task, cancellable by its id until it ends.
    fn start_request(&mut self, request_id: String, folder: String, operation: Operation) {
        let cancel = self.cancel.child_token();
        if let Ok(mut map) = self.running.lock() {
            map.insert(request_id.clone(), cancel.clone());
        }
        let executor = Arc::clone(self.executor);
        let out = self.out_tx.clone();
        let running = Arc::clone(&self.running);
        self.tasks.spawn(async move {
            handle(&executor, &request_id, &folder, operation, cancel, out).await;
            if let Ok(mut map) = running.lock() {
                map.remove(&request_id);
            }
        });
    }

    /// Answers a receipt query. Only the receipts answer; nothing runs because of this frame.
    fn answer_receipt_query(&mut self, request_id: String) {
        let receipts = Arc::clone(&self.executor.receipts);
        let out = self.out_tx.clone();
        let status = self.executor.status.clone();
        self.tasks.spawn(async move {
            let id = request_id.clone();
            match tokio::task::spawn_blocking(move || receipts.lookup(&id)).await {
                Ok(Ok(receipt)) => {
                    let _ = out
                        .send(ExecutorFrame::Receipt {
                            request_id,
                            receipt,
                        })
                        .await;
                }
                // Unreadable receipts are not "unknown": no answer, and the server asks again.
                Ok(Err(e)) => status.show(&format!("cannot read a receipt: {e}")),
                Err(e) => status.show(&format!("cannot read a receipt: {e}")),
            }
        });
    }

    /// Disconnect, shutdown and revocation stop every running command; their outcomes are
    /// recorded in the receipts before we go on. On shutdown the socket is closed normally.
    async fn end(&self, end: &SessionEnd, sink: &mut SocketSink, stream: &mut SocketStream) {
        self.cancel.cancel();
        self.tasks.close();
        let _ = tokio::time::timeout(shell::KILL_GRACE * 3, self.tasks.wait()).await;
        if matches!(end, SessionEnd::Shutdown) {
            let close = CloseFrame {
                code: CloseCode::Normal,
                reason: "sharing ended".into(),
            };
            let _ = sink.send(Message::Close(Some(close))).await;
            let _ = tokio::time::timeout(Duration::from_secs(2), async {
                while let Some(Ok(message)) = stream.next().await {
                    if matches!(message, Message::Close(_)) {
                        break;
                    }
                }
            })
            .await;
        }
    }
}

/// The server closed the socket: 4001/4003 end sharing (the credential is no longer accepted),
/// any other close is a lost connection.
fn closed_by_server(frame: Option<CloseFrame>, welcomed: bool) -> SessionEnd {
    let code = frame.as_ref().map(|f| u16::from(f.code));
    let reason = frame.map(|f| f.reason.to_string()).unwrap_or_default();
    if code == Some(CLOSE_REVOKED) || code == Some(CLOSE_UNAUTHORIZED) {
        return SessionEnd::Unauthorized(format!(
            "the server closed the connection ({}{}{reason})",
            if code == Some(CLOSE_REVOKED) {
                "credential revoked"
            } else {
                "credential not accepted"
            },
            if reason.is_empty() { "" } else { ": " },
        ));
    }
    lost(format!("closed by the server ({reason})"), welcomed)
}

async fn send<S>(sink: &mut S, frame: &ExecutorFrame) -> Result<(), String>
where
    S: futures_util::Sink<Message, Error = tungstenite::Error> + Unpin,
{
    let text = serde_json::to_string(frame).map_err(|e| e.to_string())?;
    sink.send(Message::text(text))
        .await
        .map_err(|e| e.to_string())
}

fn refused(code: &str, message: impl Into<String>) -> Outcome {
    Outcome::Refused {
        code: code.to_owned(),
        message: message.into(),
    }
}

/// One request: receipts first, then (at most once) the operation, then the receipt.
async fn handle(
    executor: &Arc<Executor>,
    request_id: &str,
    folder: &str,
    operation: Operation,
    cancel: CancellationToken,
    out: mpsc::Sender<ExecutorFrame>,
) {
    let _ = out
        .send(ExecutorFrame::Accepted {
            request_id: request_id.to_owned(),
        })
        .await;
    failpoint::hit(Failpoint::ExecutorReceived);
    let begin = {
        let receipts = Arc::clone(&executor.receipts);
        let (id, f, op) = (request_id.to_owned(), folder.to_owned(), operation.clone());
        tokio::task::spawn_blocking(move || receipts.begin(&id, &f, &op)).await
    };
    let outcome = match begin {
        Ok(Ok(Begin::Run)) => {
            failpoint::hit(Failpoint::ExecutorRunning);
            let outcome = execute(executor, request_id, folder, operation, cancel).await;
            failpoint::hit(Failpoint::ExecutorRan);
            let receipts = Arc::clone(&executor.receipts);
            let (id, o) = (request_id.to_owned(), outcome.clone());
            match tokio::task::spawn_blocking(move || receipts.finish(&id, &o)).await {
                Ok(Ok(())) => {
                    failpoint::hit(Failpoint::ExecutorDone);
                }
                Ok(Err(e)) => executor
                    .status
                    .show(&format!("cannot record a receipt: {e}")),
                Err(e) => executor
                    .status
                    .show(&format!("cannot record a receipt: {e}")),
            }
            outcome
        }
        Ok(Ok(Begin::Recorded(outcome))) => outcome,
        Ok(Ok(Begin::InProgress)) => return,
        Ok(Err(e)) => refused(
            "receipts_unavailable",
            format!("the request was not run: its receipt could not be recorded ({e})"),
        ),
        Err(e) => refused(
            "receipts_unavailable",
            format!("the request was not run: {e}"),
        ),
    };
    let _ = out
        .send(ExecutorFrame::Result {
            request_id: request_id.to_owned(),
            outcome,
        })
        .await;
}

/// What a request runs with once every check passed: its folder, a fresh private scratch dir,
/// the policy, and the command's cgroup (when the person's cgroup tree is delegated).
struct Prepared<'a> {
    folder: &'a Folder,
    scratch: PathBuf,
    policy: SandboxPolicy,
    cgroup: Option<CommandCgroup>,
}

/// One request's operation in its folder: refused unless every check passes, then the command
/// or the patch, then its cgroup and scratch dir removed.
async fn execute(
    executor: &Arc<Executor>,
    request_id: &str,
    alias: &str,
    operation: Operation,
    cancel: CancellationToken,
) -> Outcome {
    let Prepared {
        folder,
        scratch,
        policy,
        cgroup: command_cgroup,
    } = match prepare(executor, request_id, alias) {
        Ok(prepared) => prepared,
        Err(refusal) => return refusal,
    };
    let mut protected = Vec::new();
    let outcome = match operation {
        Operation::ExecuteShellCommand { command, timeout } => {
            let timeout = match shell_timeout(timeout) {
                Ok(timeout) => timeout,
                Err(refusal) => return cleanup(&scratch, refusal),
            };
            protected = match record_project_config(executor, folder).await {
                Ok(snapshots) => snapshots,
                Err(refusal) => return cleanup(&scratch, refusal),
            };
            let downloads = executor.grants.downloads_of(folder);
            run_shell(executor, command, timeout, policy, downloads, cancel).await
        }
        Operation::DiffPatchWorkspaceFile { filepath, diff } => {
            if folder.access != FolderAccess::ReadWrite {
                refused(
                    "read_only_folder",
                    format!("{alias} is shared read-only (--folder); patches need --write-folder"),
                )
            } else {
                let mut job = super::patch::PatchJob::new(&executor.grants, folder, filepath, diff);
                job.allow_project_config = executor.allow_project_config;
                super::patch::run(&executor.launcher, &policy, &folder.path, &job).await
            }
        }
    };
    if let Some(cgroup) = command_cgroup
        && let Ok(Err(e)) = tokio::task::spawn_blocking(move || cgroup.kill_and_remove()).await
    {
        executor.status.show(&format!("{e}"));
    }
    // The command's process tree is gone (the launcher exits only then, and its cgroup was
    // killed above): its changes to the protected project config are undone now.
    let outcome = undo_project_config(executor, protected, outcome).await;
    cleanup(&scratch, outcome)
}

/// The protected project config (project_config.rs) of every writable folder a command on
/// `folder` may change: the folder, if it is a write folder, and its Downloads companion. None
/// with `--allow-project-config`. A folder whose set cannot be recorded refuses the command.
async fn record_project_config(
    executor: &Arc<Executor>,
    folder: &Folder,
) -> Result<Vec<Snapshot>, Outcome> {
    if executor.allow_project_config {
        return Ok(Vec::new());
    }
    let mut roots: Vec<(PathBuf, String)> = Vec::new();
    if folder.access == FolderAccess::ReadWrite {
        roots.push((folder.path.clone(), folder.alias.clone()));
    }
    if let Some(downloads) = executor.grants.downloads_of(folder) {
        roots.push((downloads.to_owned(), "~/Downloads".to_owned()));
    }
    if roots.is_empty() {
        return Ok(Vec::new());
    }
    let taken = tokio::task::spawn_blocking(move || {
        roots
            .iter()
            .map(|(root, label)| Snapshot::take(root, label))
            .collect::<std::io::Result<Vec<Snapshot>>>()
    })
    .await;
    match taken {
        Ok(Ok(snapshots)) => Ok(snapshots),
        Ok(Err(e)) => Err(refused(
            "project_config_unavailable",
            format!(
                "the command was not run: its folder's protected project config could not be \
                 recorded ({e})"
            ),
        )),
        Err(e) => Err(refused(
            "project_config_unavailable",
            format!("the command was not run: {e}"),
        )),
    }
}

/// Undoes every change to the protected sets recorded in `snapshots` and adds what was undone to
/// a completed command's outcome.
async fn undo_project_config(
    executor: &Executor,
    snapshots: Vec<Snapshot>,
    outcome: Outcome,
) -> Outcome {
    if snapshots.is_empty() {
        return outcome;
    }
    let changes = tokio::task::spawn_blocking(move || {
        snapshots
            .iter()
            .flat_map(Snapshot::undo)
            .collect::<Vec<_>>()
    })
    .await
    .unwrap_or_else(|e| {
        vec![UndoneChange {
            path: String::new(),
            change: format!("the protected project config could not be checked: {e}"),
            undone: false,
        }]
    });
    for change in &changes {
        executor
            .status
            .show(&format!("undone: {}: {}", change.path, change.change));
    }
    match outcome {
        Outcome::Completed {
            stdout,
            stderr,
            exit_code,
            stdout_truncated,
            stderr_truncated,
            timed_out,
            cancelled,
            undone,
        } => Outcome::Completed {
            stdout,
            stderr,
            exit_code,
            stdout_truncated,
            stderr_truncated,
            timed_out,
            cancelled,
            undone: undone.into_iter().chain(changes).collect(),
        },
        other => other,
    }
}

/// The checks that refuse a request before anything runs, in order, then its scratch dir,
/// policy and cgroup. A refusal once the scratch dir exists removes it.
fn prepare<'a>(
    executor: &'a Executor,
    request_id: &str,
    alias: &str,
) -> Result<Prepared<'a>, Outcome> {
    let grants = &executor.grants;
    let Some(folder) = grants.folder(alias) else {
        return Err(refused(
            "folder_not_shared",
            format!("{alias:?} is not a folder this executor shares"),
        ));
    };
    // No sandbox, no command and no patch. The launcher checks again, but it cannot be relied on
    // to see what this process sees (it runs with a scrubbed environment).
    if let Err(e) = agentworks_sandbox::check_available() {
        return Err(refused(
            "sandbox_unavailable",
            format!("the request was not run: {e}"),
        ));
    }
    // The folder (and Downloads) must still be the directories pinned at connect: a moved or
    // replaced root is refused rather than granted through whatever its path names now.
    if let Err(e) = grants.check_pinned(folder) {
        return Err(refused("folder_replaced", e.to_string()));
    }
    let scratch_root = executor.dirs.scratch_root();
    if let Err(e) =
        ensure_private_dir(&executor.dirs.state).and_then(|()| ensure_private_dir(&scratch_root))
    {
        return Err(refused("scratch_unavailable", e.to_string()));
    }
    let scratch = super::patch::scratch_dir(&scratch_root, request_id);
    if let Err(e) = ensure_private_dir(&scratch) {
        return Err(refused("scratch_unavailable", e.to_string()));
    }
    let mut policy = match grants.policy(folder, &scratch) {
        Ok(policy) => policy,
        Err(e) => return Err(cleanup(&scratch, refused("folder_replaced", e.to_string()))),
    };
    policy.overmount_exclusions =
        executor.exclusions == agentworks_sandbox::ExclusionMechanism::Overmount;
    let cgroup = match executor.limits.for_command(&mut policy) {
        Ok(cgroup) => cgroup,
        Err(e) => {
            return Err(cleanup(
                &scratch,
                refused(
                    "cgroup_unavailable",
                    format!("the request was not run: {e}"),
                ),
            ));
        }
    };
    Ok(Prepared {
        folder,
        scratch,
        policy,
        cgroup,
    })
}

/// A shell command's timeout: at least 1 s, at most [`MAX_TIMEOUT_SECS`]; none given is the
/// runner's default.
fn shell_timeout(timeout: Option<u64>) -> Result<Option<Duration>, Outcome> {
    match timeout {
        Some(0) => Err(refused(
            "invalid_timeout",
            "timeout must be at least 1 second",
        )),
        Some(t) if t > MAX_TIMEOUT_SECS => Err(refused(
            "invalid_timeout",
            format!("timeout {t} s is above the maximum of {MAX_TIMEOUT_SECS} s"),
        )),
        other => Ok(other.map(Duration::from_secs)),
    }
}

/// Runs one shell command through the launcher and turns its end into the request's outcome;
/// `downloads` is the folder's Downloads companion, if it has one (`$AGENTWORKS_DOWNLOADS`).
async fn run_shell(
    executor: &Executor,
    command: String,
    timeout: Option<Duration>,
    policy: SandboxPolicy,
    downloads: Option<&std::path::Path>,
    cancel: CancellationToken,
) -> Outcome {
    let mut env_extra = Vec::new();
    if let Some(downloads) = downloads {
        env_extra.push((
            "AGENTWORKS_DOWNLOADS".to_owned(),
            downloads.to_string_lossy().into_owned(),
        ));
    }
    let request = ShellRequest {
        command,
        timeout,
        policy,
        env_extra,
    };
    match shell::run(&executor.launcher, request, cancel).await {
        Ok(done) => Outcome::Completed {
            stdout: done.stdout,
            stderr: done.stderr,
            exit_code: done.exit_code,
            stdout_truncated: done.stdout_truncated,
            stderr_truncated: done.stderr_truncated,
            timed_out: done.timed_out,
            cancelled: done.cancelled,
            undone: Vec::new(),
        },
        Err(ShellError::SandboxRefused(reason)) => refused(
            "sandbox_unavailable",
            format!("the command was not run: {reason}"),
        ),
        Err(e @ (ShellError::TimeoutTooLong { .. } | ShellError::ZeroTimeout)) => {
            refused("invalid_timeout", e.to_string())
        }
        Err(e) => refused("command_failed", e.to_string()),
    }
}

fn cleanup(scratch: &std::path::Path, outcome: Outcome) -> Outcome {
    let _ = std::fs::remove_dir_all(scratch);
    outcome
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls() {
        assert_eq!(
            executor_url(None, "http://127.0.0.1:8470").expect("url"),
            "ws://127.0.0.1:8471/v1/executor"
        );
        assert_eq!(
            executor_url(None, "https://agents.example.com").expect("url"),
            "wss://agents.example.com:8471/v1/executor"
        );
        assert_eq!(
            executor_url(Some("wss://gw.example.com/base/"), "http://x").expect("url"),
            "wss://gw.example.com/base/v1/executor"
        );
        assert!(matches!(
            executor_url(Some("ws://gw.example.com"), "http://x"),
            Err(ConnectError::InsecureUrl { .. })
        ));
        assert!(matches!(
            executor_url(None, "http://example.com"),
            Err(ConnectError::InsecureUrl { .. })
        ));
        assert!(executor_url(Some("ws://[::1]:9"), "http://x").is_ok());
        assert!(executor_url(Some("ftp://x"), "http://x").is_err());
    }

    /// Every gateway is checked; the first bad one refuses the whole list, naming itself.
    #[test]
    fn every_gateway_url_is_checked() {
        let list = |urls: &[&str]| urls.iter().map(|u| (*u).to_owned()).collect::<Vec<_>>();
        assert_eq!(
            executor_urls(&[], "https://agents.example.com").expect("urls"),
            ["wss://agents.example.com:8471/v1/executor"]
        );
        assert_eq!(
            executor_urls(
                &list(&["wss://a.example.com", "ws://127.0.0.1:9/"]),
                "http://x"
            )
            .expect("urls"),
            [
                "wss://a.example.com/v1/executor",
                "ws://127.0.0.1:9/v1/executor"
            ]
        );
        let refused = executor_urls(
            &list(&["wss://a.example.com", "ws://b.example.com"]),
            "http://x",
        )
        .expect_err("ws:// to a remote host");
        assert!(
            matches!(&refused, ConnectError::InsecureUrl { url } if url == "ws://b.example.com"),
            "{refused}"
        );
        assert!(matches!(
            executor_urls(&list(&["wss://a.example.com", "ftp://c"]), "http://x"),
            Err(ConnectError::BadUrl { url, .. }) if url == "ftp://c"
        ));
    }

    /// Lost sessions, none of which served: the gateway index and the wait before each dial.
    fn steps(failover: &mut Failover, n: usize) -> Vec<(usize, Option<u64>)> {
        (0..n)
            .map(|_| {
                let wait = failover.next_gateway(false);
                (failover.current(), wait.map(|w| w.as_secs()))
            })
            .collect()
    }

    /// Each gateway in turn at once; a wait only after a whole round failed, doubling to 30 s.
    #[test]
    fn failover_tries_each_gateway_before_it_waits() {
        let mut failover = Failover::new(3);
        assert_eq!(failover.current(), 0);
        assert_eq!(
            steps(&mut failover, 9),
            [
                (1, None),
                (2, None),
                (0, Some(1)),
                (1, None),
                (2, None),
                (0, Some(2)),
                (1, None),
                (2, None),
                (0, Some(4)),
            ]
        );
        let waits: Vec<_> = steps(&mut failover, 3 * 4)
            .into_iter()
            .filter_map(|(_, wait)| wait)
            .collect();
        assert_eq!(waits, [8, 16, 30, 30]);
    }

    /// One gateway: every failure waits, doubling; a session that served is redialled at
    /// once, and only if that redial fails does the loop wait, 1 s again.
    #[test]
    fn one_gateway_waits_after_every_failure_but_not_after_a_served_session() {
        let mut failover = Failover::new(1);
        assert_eq!(
            steps(&mut failover, 4),
            [(0, Some(1)), (0, Some(2)), (0, Some(4)), (0, Some(8))]
        );
        assert_eq!(failover.next_gateway(true), None);
        assert_eq!(failover.current(), 0);
        assert_eq!(
            steps(&mut failover, 3),
            [(0, Some(1)), (0, Some(2)), (0, Some(4))]
        );
        // Served twice in a row: at once each time (each served session lasted SERVED_AFTER).
        assert_eq!(failover.next_gateway(true), None);
        assert_eq!(failover.next_gateway(true), None);
        assert_eq!(steps(&mut failover, 1), [(0, Some(1))]);
        // An empty list is treated as one gateway rather than dividing by zero.
        assert_eq!(Failover::new(0).next_gateway(false), Some(BACKOFF_START));
        assert_eq!(Failover::new(0).next_gateway(true), None);
    }

    /// A session that served resets the backoff and starts a new round at the next gateway,
    /// dialled at once; the round waits (1 s again) only once each of its gateways failed, the
    /// one that lost the session included.
    #[test]
    fn a_served_session_starts_a_new_round_at_once() {
        let mut failover = Failover::new(2);
        assert_eq!(
            steps(&mut failover, 4),
            [(1, None), (0, Some(1)), (1, None), (0, Some(2))]
        );
        // Gateway 0 serves, then its session is lost: gateway 1 at once, then 0 at once, then
        // the round has failed whole and the wait is 1 s.
        assert_eq!(failover.next_gateway(true), None);
        assert_eq!(failover.current(), 1);
        assert_eq!(
            steps(&mut failover, 3),
            [(0, None), (1, Some(1)), (0, None)]
        );
        // Gateway 0 serves in the middle of a round: its loss starts a new round at once.
        assert_eq!(failover.next_gateway(true), None);
        assert_eq!(failover.current(), 1);
        assert_eq!(steps(&mut failover, 2), [(0, None), (1, Some(1))]);
    }

    /// The server's gateways join the failover list first; the ones given stay after them.
    #[test]
    fn an_advertised_list_comes_first_and_keeps_the_given_gateways_after_it() {
        let given = vec![
            "wss://a/v1/executor".to_owned(),
            "wss://x/v1/executor".to_owned(),
        ];
        let advertised = vec![
            "wss://a/v1/executor".to_owned(),
            "wss://b/v1/executor".to_owned(),
        ];
        assert_eq!(
            with_advertised(&advertised, &given),
            [
                "wss://a/v1/executor",
                "wss://b/v1/executor",
                "wss://x/v1/executor"
            ]
        );
        assert_eq!(with_advertised(&[], &given), given);
        // Failing over from `a` (index 0 of the new list) goes to `b` at once after it served.
        let mut failover = Failover::at(3, 0);
        assert_eq!(failover.next_gateway(true), None);
        assert_eq!(failover.current(), 1);
        // An index past the end is clamped, never out of range.
        assert_eq!(Failover::at(2, 7).current(), 1);
    }

    /// A gateway that welcomes the executor and drops it before [`SERVED_AFTER`] is a failure
    /// like a refused dial: such sessions back off, they are never redialled in a hot loop.
    #[test]
    fn sessions_that_never_serve_stay_under_the_backoff() {
        for count in 1..=3 {
            let mut failover = Failover::new(count);
            let waits: Vec<u64> = steps(&mut failover, count * 6)
                .into_iter()
                .filter_map(|(_, wait)| wait)
                .collect();
            assert_eq!(waits, [1, 2, 4, 8, 16, 30], "{count} gateways");
        }
    }
}
