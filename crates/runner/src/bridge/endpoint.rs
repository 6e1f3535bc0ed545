//! runnerd's bridge endpoint: a loopback HTTP/1.1 listener of its own (`127.0.0.1`, a port the
//! kernel picks), separate from the model gateway, where a turn's `agentworks-mcpbridge` posts
//! its tool calls (`POST /v1/bridge/call`, `Authorization: Bearer <bridge capability>`).
//!
//! Each turn opens a [`BridgeCapability`]: a fresh random string (`awbr_…`, distinct from the
//! model capability) that names the turn; only its SHA-256 digest is looked up. Dropping it
//! (the turn ended) refuses it at once (401) and ends every call still waiting.
//!
//! A call is answered here or by agentd:
//! - `execute_shell_command`, when the turn has a [`ShellSandbox`] (server mode): run with
//!   `agentworks_sandbox::shell::run` in a fresh sandbox of the turn's mode — the turn's own
//!   policy (the project through the descriptors pinned at the turn's start: read-only in Run,
//!   the write grants writable in Builder, blocked and protected paths excluded), the project as
//!   cwd, a fresh scratch directory outside every runtime, a cgroup of its own — and its exit
//!   code, stdout and stderr answered. The cwd grants nothing: the sandbox grants only what the
//!   policy lists, so Run stays read-only with the project as cwd.
//! - any other tool: a [`TurnEvent::BridgeCall`] on the turn's stream, then the wait for agentd's
//!   [`BridgeAnswer`] ([`BridgeEndpoint::answer`], from `runnerd.sock`), at most the answer
//!   timeout; the turn's cancel or end ends the wait with a tool error. A patch in Run mode is
//!   refused here already (the project is read-only).
//!
//! Must never: accept a call without an open capability, run a command outside the sandbox or
//! with more than the turn's grants, give a command the runtime (the CLI's files) or a scratch
//! directory the CLI can reach, or let an answer reach another turn's call.

use std::collections::HashMap;
use std::convert::Infallible;
use std::ffi::OsString;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use agentworks_contract::runnerd::{BRIDGE_ANSWER_TIMEOUT_SECS, BridgeAnswer, Mode, TurnEvent};
use agentworks_daemon::ipc::envelope::{Body, error_response, json_response};
use agentworks_daemon::ipc::server::Acceptor;
use agentworks_sandbox::limits::Limits;
use agentworks_sandbox::process::Launcher;
use agentworks_sandbox::shell::{self, ShellCommand};
use agentworks_sandbox::{PinnedDir, SandboxPolicy};
use bytes::Bytes;
use http_body_util::{BodyExt, Limited};
use hyper::body::Incoming;
use hyper::header::{self, HeaderMap};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use tokio::sync::{Semaphore, mpsc::UnboundedSender, oneshot};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::{BridgeCall, BridgeReply, MAX_CALL_BYTES, PATCH_TOOL, SHELL_TOOL};

/// The path the bridge posts to (its URL is [`BridgeEndpoint::url`] + `/call`).
const CALL_PATH: &str = "/v1/bridge/call";
/// Connections served at once (a CLI makes one per call, a few in parallel).
const MAX_CONNECTIONS: usize = 64;
const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(30);
/// What every bridge capability starts with.
const CAPABILITY_PREFIX: &str = "awbr_";

/// Why the endpoint could not start.
#[derive(Debug, thiserror::Error)]
pub enum EndpointError {
    #[error("cannot listen on 127.0.0.1 for the bridge endpoint: {0}")]
    Bind(#[source] std::io::Error),
    #[error("cannot read the bridge endpoint's listening address: {0}")]
    Address(#[source] std::io::Error),
}

/// Why agentd's answer was not taken.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum AnswerError {
    #[error("no bridge call {call_id:?} of turn {turn_id:?} is waiting for an answer")]
    NotWaiting { turn_id: String, call_id: String },
    #[error("an answer must be ok with a result or not ok with an error")]
    Malformed,
}

/// The running endpoint: a cheap handle to clone.
#[derive(Clone)]
pub struct BridgeEndpoint {
    inner: Arc<Endpoint>,
}

impl std::fmt::Debug for BridgeEndpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BridgeEndpoint")
            .field("address", &self.inner.address)
            .finish_non_exhaustive()
    }
}

struct Endpoint {
    address: SocketAddr,
    /// Open turns by the digest of their capability.
    by_digest: Mutex<HashMap<[u8; 32], Arc<BridgeTurn>>>,
    /// The same turns by turn id, for agentd's answers.
    by_turn: Mutex<HashMap<String, Arc<BridgeTurn>>>,
    answer_timeout: Duration,
    shutdown: CancellationToken,
}

/// What a turn gives its bridge.
pub struct TurnBridge {
    pub turn_id: String,
    pub mode: Mode,
    /// The turn's stream (one JSON line per event), for [`TurnEvent::BridgeCall`].
    pub events: UnboundedSender<Bytes>,
    /// The turn's cancel: ends every call's wait and command.
    pub cancel: CancellationToken,
    /// How server-mode shell commands run; `None` sends them to agentd too.
    pub shell: Option<ShellSandbox>,
}

/// A server-mode turn's shell: its sandbox policy with the project as cwd.
pub struct ShellSandbox {
    pub launcher: Launcher,
    pub limits: Arc<Limits>,
    /// The turn's policy (its pinned grants, blocked and read-only paths, denied paths) with
    /// `cwd` the project's pinned path; `read_write` and `scratch` are replaced per command.
    pub policy: SandboxPolicy,
    /// Where each command's fresh scratch directory is made (outside every runtime).
    pub scratch_root: PathBuf,
    /// The descriptors `policy` names, kept open while the turn's bridge lives.
    pub pins: Vec<PinnedDir>,
    /// The commands' environment (no secrets), besides HOME (the scratch dir) and the scratch
    /// variables `shell::run` sets.
    pub env: Vec<(OsString, OsString)>,
}

/// One turn's bridge, as its calls see it.
struct BridgeTurn {
    setup: TurnBridge,
    /// agentd's answers awaited, by call id.
    waiting: Mutex<HashMap<String, oneshot::Sender<BridgeAnswer>>>,
    /// Cancelled when the turn is cancelled or its capability closed.
    ended: CancellationToken,
}

impl BridgeEndpoint {
    /// Binds `127.0.0.1:0` and serves until `shutdown` is cancelled; agentd's answers are
    /// awaited [`BRIDGE_ANSWER_TIMEOUT_SECS`].
    pub async fn start(shutdown: CancellationToken) -> Result<BridgeEndpoint, EndpointError> {
        BridgeEndpoint::start_with(shutdown, Duration::from_secs(BRIDGE_ANSWER_TIMEOUT_SECS)).await
    }

    /// As [`start`](Self::start), waiting `answer_timeout` for agentd's answers.
    pub async fn start_with(
        shutdown: CancellationToken,
        answer_timeout: Duration,
    ) -> Result<BridgeEndpoint, EndpointError> {
        let listener = tokio::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
            .await
            .map_err(EndpointError::Bind)?;
        let address = listener.local_addr().map_err(EndpointError::Address)?;
        let inner = Arc::new(Endpoint {
            address,
            by_digest: Mutex::new(HashMap::new()),
            by_turn: Mutex::new(HashMap::new()),
            answer_timeout,
            shutdown,
        });
        tokio::spawn(serve(listener, inner.clone()));
        Ok(BridgeEndpoint { inner })
    }

    /// What the bridge gets as [`super::URL_ENV`]: `http://127.0.0.1:PORT/v1/bridge`.
    pub fn url(&self) -> String {
        format!("http://{}/v1/bridge", self.inner.address)
    }

    /// Opens `turn`'s bridge: a fresh capability (256 random bits, hex, prefixed `awbr_`).
    pub fn open_turn(&self, turn: TurnBridge) -> BridgeCapability {
        let secret = format!(
            "{CAPABILITY_PREFIX}{}",
            hex::encode(rand::random::<[u8; 32]>())
        );
        let digest = digest(secret.as_bytes());
        let turn_id = turn.turn_id.clone();
        let ended = turn.cancel.child_token();
        let turn = Arc::new(BridgeTurn {
            setup: turn,
            waiting: Mutex::new(HashMap::new()),
            ended,
        });
        lock(&self.inner.by_digest).insert(digest, turn.clone());
        lock(&self.inner.by_turn).insert(turn_id.clone(), turn.clone());
        BridgeCapability {
            secret,
            digest,
            turn_id,
            turn,
            endpoint: self.inner.clone(),
        }
    }

    /// agentd's answer to call `call_id` of turn `turn_id`; refused when that call is not
    /// waiting (answered already, timed out, another turn's, or its turn ended).
    pub fn answer(
        &self,
        turn_id: &str,
        call_id: &str,
        answer: BridgeAnswer,
    ) -> Result<(), AnswerError> {
        let well_formed = matches!(
            &answer,
            BridgeAnswer {
                ok: true,
                error: None,
                ..
            } | BridgeAnswer {
                ok: false,
                error: Some(_),
                result: None,
            }
        );
        if !well_formed {
            return Err(AnswerError::Malformed);
        }
        let not_waiting = || AnswerError::NotWaiting {
            turn_id: turn_id.to_owned(),
            call_id: call_id.to_owned(),
        };
        let turn = lock(&self.inner.by_turn)
            .get(turn_id)
            .cloned()
            .ok_or_else(not_waiting)?;
        let sender = lock(&turn.waiting)
            .remove(call_id)
            .ok_or_else(not_waiting)?;
        sender.send(answer).map_err(|_| not_waiting())
    }
}

/// One turn's bridge, open for as long as this value lives.
pub struct BridgeCapability {
    secret: String,
    digest: [u8; 32],
    turn_id: String,
    turn: Arc<BridgeTurn>,
    endpoint: Arc<Endpoint>,
}

impl std::fmt::Debug for BridgeCapability {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BridgeCapability")
            .field("turn_id", &self.turn_id)
            .finish_non_exhaustive()
    }
}

impl BridgeCapability {
    /// What the bridge gets as [`super::TOKEN_ENV`].
    pub fn secret(&self) -> &str {
        &self.secret
    }

    /// Closes the bridge (as dropping it does).
    pub fn close(self) {}
}

impl Drop for BridgeCapability {
    fn drop(&mut self) {
        // Removed first, so no new call finds it; then the calls in flight end.
        lock(&self.endpoint.by_digest).remove(&self.digest);
        lock(&self.endpoint.by_turn).remove(&self.turn_id);
        self.turn.ended.cancel();
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

fn digest(bytes: &[u8]) -> [u8; 32] {
    Sha256::digest(bytes).into()
}

// ----- the server -----

async fn serve(listener: tokio::net::TcpListener, endpoint: Arc<Endpoint>) {
    let permits = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    let tracker = TaskTracker::new();
    let shutdown = endpoint.shutdown.clone();
    let mut acceptor = Acceptor::new(listener);
    loop {
        let permit = tokio::select! {
            _ = shutdown.cancelled() => break,
            permit = permits.clone().acquire_owned() => match permit {
                Ok(permit) => permit,
                Err(_) => break,
            },
        };
        let Some((stream, _)) = acceptor.next(&shutdown).await else {
            break;
        };
        let endpoint = endpoint.clone();
        tracker.spawn(async move {
            serve_connection(stream, endpoint).await;
            drop(permit);
        });
    }
    drop(acceptor);
    tracker.close();
    tracker.wait().await;
}

async fn serve_connection(stream: tokio::net::TcpStream, endpoint: Arc<Endpoint>) {
    let shutdown = endpoint.shutdown.clone();
    let service = hyper::service::service_fn(move |request: Request<Incoming>| {
        let endpoint = endpoint.clone();
        async move { Ok::<_, Infallible>(handle(request, endpoint).await) }
    });
    let connection = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(HEADER_READ_TIMEOUT)
        .serve_connection(TokioIo::new(stream), service);
    let mut connection = std::pin::pin!(connection);
    let result = tokio::select! {
        result = connection.as_mut() => result,
        _ = shutdown.cancelled() => {
            connection.as_mut().graceful_shutdown();
            connection.await
        }
    };
    if let Err(error) = result {
        tracing::debug!(%error, "bridge endpoint connection ended with an error");
    }
}

fn refused(status: StatusCode, code: &str, message: impl Into<String>) -> Response<Body> {
    let mut response = error_response(status, code, message, Default::default());
    // The body may be unread: the connection is not reused after a refusal.
    response.headers_mut().insert(
        header::CONNECTION,
        header::HeaderValue::from_static("close"),
    );
    response
}

/// One call: the capability first (nothing else is looked at without one), then the call.
async fn handle(request: Request<Incoming>, endpoint: Arc<Endpoint>) -> Response<Body> {
    let turn = match authorize(&endpoint, request.headers()) {
        Some(turn) => turn,
        None => {
            return refused(
                StatusCode::UNAUTHORIZED,
                "invalid_bridge_token",
                "this bridge token is not valid (it belongs to no open turn)",
            );
        }
    };
    if request.uri().path() != CALL_PATH {
        return refused(
            StatusCode::NOT_FOUND,
            "unknown_endpoint",
            format!("the bridge endpoint has only POST {CALL_PATH}"),
        );
    }
    if request.method() != Method::POST {
        return refused(
            StatusCode::METHOD_NOT_ALLOWED,
            "method_not_allowed",
            format!("{CALL_PATH} takes POST"),
        );
    }
    let body = match Limited::new(request.into_body(), MAX_CALL_BYTES)
        .collect()
        .await
    {
        Ok(body) => body.to_bytes(),
        Err(e) => {
            return refused(
                StatusCode::PAYLOAD_TOO_LARGE,
                "invalid_call",
                format!("the call's body could not be read (at most {MAX_CALL_BYTES} bytes): {e}"),
            );
        }
    };
    let call: BridgeCall = match serde_json::from_slice(&body) {
        Ok(call) => call,
        Err(e) => {
            return refused(
                StatusCode::BAD_REQUEST,
                "invalid_call",
                format!("the call is not {{tool, arguments}}: {e}"),
            );
        }
    };
    let shutdown = endpoint.shutdown.clone();
    let reply = tokio::select! {
        reply = execute(&endpoint, &turn, call) => reply,
        _ = shutdown.cancelled() => BridgeReply::error("runnerd is stopping"),
    };
    json_response(StatusCode::OK, &reply)
}

/// The open, not ended turn the request's bearer token names.
fn authorize(endpoint: &Endpoint, headers: &HeaderMap) -> Option<Arc<BridgeTurn>> {
    let mut values = headers.get_all(header::AUTHORIZATION).iter();
    let value = values.next()?.as_bytes();
    if values.next().is_some() {
        return None;
    }
    let token = match value.get(..7) {
        Some(scheme) if scheme.eq_ignore_ascii_case(b"bearer ") => value[7..].trim_ascii(),
        _ => return None,
    };
    let turn = lock(&endpoint.by_digest).get(&digest(token)).cloned()?;
    (!turn.ended.is_cancelled()).then_some(turn)
}

async fn execute(endpoint: &Endpoint, turn: &Arc<BridgeTurn>, call: BridgeCall) -> BridgeReply {
    match (call.tool.as_str(), &turn.setup.shell) {
        (SHELL_TOOL, Some(shell)) => run_shell(turn, shell, &call.arguments).await,
        (PATCH_TOOL, _) if turn.setup.mode == Mode::Run => BridgeReply::error(
            "this chat runs in Run mode: the project is read-only, so no patch can be applied",
        ),
        _ => ask_agentd(endpoint, turn, call).await,
    }
}

/// Hands the call to agentd on the turn's stream and waits for its answer.
async fn ask_agentd(endpoint: &Endpoint, turn: &Arc<BridgeTurn>, call: BridgeCall) -> BridgeReply {
    let call_id = format!("bc_{}", hex::encode(rand::random::<[u8; 12]>()));
    let (sender, receiver) = oneshot::channel();
    lock(&turn.waiting).insert(call_id.clone(), sender);
    let event = TurnEvent::BridgeCall {
        call_id: call_id.clone(),
        tool: call.tool.clone(),
        arguments: call.arguments,
    };
    if let Ok(mut line) = serde_json::to_vec(&event) {
        line.push(b'\n');
        let _ = turn.setup.events.send(Bytes::from(line));
    }
    let reply = tokio::select! {
        answer = receiver => match answer {
            Ok(answer) => reply_of(answer),
            Err(_) => BridgeReply::error("the turn ended before agentworks answered this call"),
        },
        _ = tokio::time::sleep(endpoint.answer_timeout) => BridgeReply::error(format!(
            "agentworks did not answer this {} call within {} s; it may not have run",
            call.tool,
            endpoint.answer_timeout.as_secs()
        )),
        _ = turn.ended.cancelled() => BridgeReply::error("the turn was stopped before this call was answered"),
    };
    lock(&turn.waiting).remove(&call_id);
    reply
}

/// agentd's answer as the text the CLI's model sees.
fn reply_of(answer: BridgeAnswer) -> BridgeReply {
    if answer.ok {
        return BridgeReply::ok(match answer.result {
            None | Some(Value::Null) => "done".to_owned(),
            Some(Value::String(text)) => text,
            Some(other) => other.to_string(),
        });
    }
    match answer.error {
        Some(error) => BridgeReply::error(format!("{} ({})", error.message, error.code)),
        None => BridgeReply::error("the call failed"),
    }
}

/// The shell tool's arguments: `{command, timeout?}`, nothing else.
fn shell_arguments(arguments: &Value) -> Result<(String, Option<Duration>), String> {
    let Value::Object(arguments) = arguments else {
        return Err("the arguments must be an object {command, timeout?}".to_owned());
    };
    if let Some(unknown) = arguments
        .keys()
        .find(|k| *k != "command" && *k != "timeout")
    {
        return Err(format!(
            "unknown argument {unknown:?}: the arguments are command and timeout"
        ));
    }
    let command = match arguments.get("command") {
        Some(Value::String(command)) if !command.trim().is_empty() => command.clone(),
        _ => return Err("command must be a non-empty string".to_owned()),
    };
    let timeout = match arguments.get("timeout") {
        None | Some(Value::Null) => None,
        Some(value) => match value.as_u64() {
            Some(secs @ 1..=300) => Some(Duration::from_secs(secs)),
            _ => return Err("timeout must be a whole number of seconds from 1 to 300".to_owned()),
        },
    };
    Ok((command, timeout))
}

/// Runs one command in a fresh sandbox of the turn's mode, the project as its cwd.
async fn run_shell(turn: &Arc<BridgeTurn>, shell: &ShellSandbox, arguments: &Value) -> BridgeReply {
    let (command, timeout) = match shell_arguments(arguments) {
        Ok(parsed) => parsed,
        Err(why) => return BridgeReply::error(why),
    };
    // A scratch directory of its own, under runnerd's state (no runtime, so nothing the CLI
    // could have replaced with a link), removed afterwards.
    let scratch = shell.scratch_root.join(format!(
        "{}-{}",
        turn.setup.turn_id,
        hex::encode(rand::random::<[u8; 8]>())
    ));
    if let Err(e) = make_private_dirs(&shell.scratch_root, &scratch) {
        return BridgeReply::error(format!(
            "the command was not run: cannot make its scratch directory: {e}"
        ));
    }
    let mut policy = shell.policy.clone();
    policy.read_write = Vec::new();
    policy.scratch = scratch.clone();
    let cgroup = match shell.limits.for_command(&mut policy) {
        Ok(cgroup) => cgroup,
        Err(e) => {
            let _ = std::fs::remove_dir_all(&scratch);
            return BridgeReply::error(format!(
                "the command was not run: cannot make its cgroup: {e}"
            ));
        }
    };
    let mut env = shell.env.clone();
    env.push(("HOME".into(), scratch.clone().into_os_string()));
    let outcome = shell::run(
        &shell.launcher,
        ShellCommand {
            command,
            timeout,
            policy,
            env,
        },
        turn.ended.child_token(),
    )
    .await;
    if let Some(cgroup) = cgroup
        && let Err(e) = cgroup.kill_and_remove()
    {
        tracing::warn!(turn = %turn.setup.turn_id, error = %e, "cannot remove a bridge command's cgroup");
    }
    if let Err(e) = std::fs::remove_dir_all(&scratch) {
        tracing::warn!(path = %scratch.display(), error = %e, "cannot remove a bridge command's scratch directory");
    }
    match outcome {
        Ok(outcome) => {
            let mut result = json!({
                "exit_code": outcome.exit_code,
                "stdout": outcome.stdout,
                "stderr": outcome.stderr,
            });
            for (flag, set) in [
                ("stdout_truncated", outcome.stdout_truncated),
                ("stderr_truncated", outcome.stderr_truncated),
                ("timed_out", outcome.timed_out),
                ("cancelled", outcome.cancelled),
            ] {
                if set {
                    result[flag] = json!(true);
                }
            }
            BridgeReply {
                is_error: outcome.timed_out || outcome.cancelled,
                text: result.to_string(),
            }
        }
        Err(e) => BridgeReply::error(format!("the command was not run: {e}")),
    }
}

/// `root` (0700, made if missing) and `dir` in it (0700, must be new).
fn make_private_dirs(root: &std::path::Path, dir: &std::path::Path) -> std::io::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(root)?;
    std::fs::DirBuilder::new().mode(0o700).create(dir)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::bridge::client::Forwarder;
    use agentworks_contract::runnerd::BridgeError;

    struct Opened {
        endpoint: BridgeEndpoint,
        capability: BridgeCapability,
        events: tokio::sync::mpsc::UnboundedReceiver<Bytes>,
        cancel: CancellationToken,
    }

    async fn open(mode: Mode, answer_timeout: Duration) -> Opened {
        let endpoint = BridgeEndpoint::start_with(CancellationToken::new(), answer_timeout)
            .await
            .unwrap();
        let (sender, events) = tokio::sync::mpsc::unbounded_channel();
        let cancel = CancellationToken::new();
        let capability = endpoint.open_turn(TurnBridge {
            turn_id: "turn_1".into(),
            mode,
            events: sender,
            cancel: cancel.clone(),
            shell: None,
        });
        Opened {
            endpoint,
            capability,
            events,
            cancel,
        }
    }

    fn forwarder(o: &Opened, token: &str) -> Forwarder {
        Forwarder::new(&o.endpoint.url(), token.to_owned()).unwrap()
    }

    fn patch() -> BridgeCall {
        BridgeCall {
            tool: PATCH_TOOL.into(),
            arguments: json!({"filepath": "a.txt", "diff": "@@ -1 +1 @@\n-a\n+b\n"}),
        }
    }

    /// The next `bridge_call` event on the turn's stream.
    async fn next_call(events: &mut tokio::sync::mpsc::UnboundedReceiver<Bytes>) -> Value {
        let line = tokio::time::timeout(Duration::from_secs(5), events.recv())
            .await
            .unwrap()
            .unwrap();
        serde_json::from_slice(&line).unwrap()
    }

    #[tokio::test]
    async fn a_call_goes_to_agentd_and_its_answer_comes_back_once() {
        let mut o = open(Mode::Builder, Duration::from_secs(30)).await;
        let f = forwarder(&o, o.capability.secret());
        let call = tokio::spawn(async move { f.call(&patch()).await });
        let event = next_call(&mut o.events).await;
        assert_eq!(event["type"], "bridge_call");
        assert_eq!(event["tool"], PATCH_TOOL);
        assert_eq!(event["arguments"]["filepath"], "a.txt");
        let call_id = event["call_id"].as_str().unwrap().to_owned();
        // Another turn's id, or a call that does not wait, is refused.
        let ok = BridgeAnswer {
            ok: true,
            result: Some(json!({"receipt": "r1"})),
            error: None,
        };
        assert!(matches!(
            o.endpoint.answer("turn_2", &call_id, ok.clone()),
            Err(AnswerError::NotWaiting { .. })
        ));
        assert!(o.endpoint.answer("turn_1", "bc_nope", ok.clone()).is_err());
        let malformed = BridgeAnswer {
            ok: false,
            result: None,
            error: None,
        };
        assert_eq!(
            o.endpoint.answer("turn_1", &call_id, malformed),
            Err(AnswerError::Malformed)
        );
        o.endpoint.answer("turn_1", &call_id, ok.clone()).unwrap();
        let reply = call.await.unwrap();
        assert_eq!(reply, BridgeReply::ok(r#"{"receipt":"r1"}"#));
        // Answered once only.
        assert!(o.endpoint.answer("turn_1", &call_id, ok).is_err());

        // An error answer is a tool error with its sentence and code.
        let f = forwarder(&o, o.capability.secret());
        let call = tokio::spawn(async move { f.call(&patch()).await });
        let call_id = next_call(&mut o.events).await["call_id"]
            .as_str()
            .unwrap()
            .to_owned();
        o.endpoint
            .answer(
                "turn_1",
                &call_id,
                BridgeAnswer {
                    ok: false,
                    result: None,
                    error: Some(BridgeError {
                        code: "path_blocked".into(),
                        message: "secret/ is blocked".into(),
                    }),
                },
            )
            .unwrap();
        assert_eq!(
            call.await.unwrap(),
            BridgeReply::error("secret/ is blocked (path_blocked)")
        );
    }

    #[tokio::test]
    async fn no_answer_times_out_and_cancel_ends_the_wait() {
        let mut o = open(Mode::Builder, Duration::from_millis(300)).await;
        let reply = forwarder(&o, o.capability.secret()).call(&patch()).await;
        assert!(reply.is_error);
        assert!(reply.text.contains("did not answer"), "{}", reply.text);
        let call_id = next_call(&mut o.events).await["call_id"]
            .as_str()
            .unwrap()
            .to_owned();
        let late = BridgeAnswer {
            ok: true,
            result: None,
            error: None,
        };
        assert!(o.endpoint.answer("turn_1", &call_id, late).is_err());

        let o = open(Mode::Builder, Duration::from_secs(60)).await;
        let f = forwarder(&o, o.capability.secret());
        let call = tokio::spawn(async move { f.call(&patch()).await });
        tokio::time::sleep(Duration::from_millis(200)).await;
        o.cancel.cancel();
        let reply = tokio::time::timeout(Duration::from_secs(5), call)
            .await
            .unwrap()
            .unwrap();
        assert!(
            reply.is_error && reply.text.contains("stopped"),
            "{reply:?}"
        );
    }

    #[tokio::test]
    async fn a_closed_or_unknown_token_is_refused_and_run_mode_refuses_patches() {
        let o = open(Mode::Run, Duration::from_secs(5)).await;
        let reply = forwarder(&o, o.capability.secret()).call(&patch()).await;
        assert!(
            reply.is_error && reply.text.contains("Run mode"),
            "{reply:?}"
        );
        let wrong = forwarder(&o, "awbr_wrong").call(&patch()).await;
        assert!(
            wrong.is_error && wrong.text.contains("HTTP 401"),
            "{wrong:?}"
        );
        let secret = o.capability.secret().to_owned();
        let Opened {
            endpoint,
            capability,
            ..
        } = o;
        capability.close();
        let reply = Forwarder::new(&endpoint.url(), secret)
            .unwrap()
            .call(&patch())
            .await;
        assert!(
            reply.is_error && reply.text.contains("HTTP 401"),
            "{reply:?}"
        );
    }

    #[test]
    fn shell_arguments_are_command_and_timeout_only() {
        assert_eq!(
            shell_arguments(&json!({"command": "ls", "timeout": 5})).unwrap(),
            ("ls".to_owned(), Some(Duration::from_secs(5)))
        );
        assert_eq!(shell_arguments(&json!({"command": "ls"})).unwrap().1, None);
        for bad in [
            json!({"command": ""}),
            json!({"command": "ls", "timeout": 0}),
            json!({"command": "ls", "timeout": 301}),
            json!({"command": "ls", "timeout": "5"}),
            json!({"command": "ls", "cwd": "/"}),
            json!("ls"),
        ] {
            assert!(shell_arguments(&bad).is_err(), "{bad}");
        }
    }
}
