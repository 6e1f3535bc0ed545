//! runnerd's bridge endpoint: a loopback HTTP/1.1 listener of its own (`127.0.0.1`, a port the
//! kernel picks), separate from the model gateway, where a turn's `agentworks-mcpbridge` reads
//! its tool list (`GET /v1/bridge/tools`: the built-ins and the turn's extra tools) and posts its
//! tool calls (`POST /v1/bridge/call`), each with `Authorization: Bearer <bridge capability>`.
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
//! - the patch tool and the turn's extra tools: a [`TurnEvent::BridgeCall`] on the turn's stream,
//!   then the wait for agentd's
//!   [`BridgeAnswer`] ([`BridgeEndpoint::answer`], from `runnerd.sock`), at most the answer
//!   timeout; the turn's cancel or end ends the wait with a tool error. A patch in Run mode is
//!   refused here already (the project is read-only), and so is a tool the turn does not offer.
//!
//! Must never: accept a call without an open capability, run a command outside the sandbox or
//! with more than the turn's grants, give a command the runtime (the CLI's files) or a scratch
//! directory the CLI can reach, or let an answer reach another turn's call.

use std::collections::HashMap;
use std::ffi::OsString;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use agentworks_contract::runnerd::{
    BRIDGE_ANSWER_TIMEOUT_SECS, BridgeAnswer, BridgeTool, LaptopFolder, Mode, TurnEvent,
};
use agentworks_daemon::ipc::envelope::{Body, error_response, json_response};
use agentworks_sandbox::limits::Limits;
use agentworks_sandbox::process::Launcher;
use agentworks_sandbox::shell::{self, ShellCommand};
use agentworks_sandbox::{PinnedDir, SandboxPolicy};
use bytes::Bytes;
use http_body_util::{BodyExt, Limited};
use hyper::body::Incoming;
use hyper::header::{self, HeaderMap};
use hyper::{Method, Request, Response, StatusCode};
use serde_json::{Value, json};
use tokio::sync::{mpsc::UnboundedSender, oneshot};
use tokio_util::sync::CancellationToken;

use super::{
    BridgeCall, BridgeReply, MAX_CALL_BYTES, MAX_EXTRA_TOOLS, PATCH_TOOL, SHELL_TOOL, ToolList,
};
use crate::loopback::{digest, lock};

/// The path the bridge posts to (its URL is [`BridgeEndpoint::url`] + `/call`).
const CALL_PATH: &str = "/v1/bridge/call";
/// The path of the bridge's tool list (its URL + `/tools`).
const TOOLS_PATH: &str = "/v1/bridge/tools";
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
    /// The turn works in a laptop folder: its built-ins are the laptop's (the patch tool only
    /// for a writable folder) and both go to agentd, whatever the chat's mode.
    pub laptop: Option<LaptopFolder>,
    /// The turn's extra tools ([`agentworks_contract::runnerd::TurnRequest::tools`]), offered
    /// after the built-ins; one named like a built-in or an earlier one is left out.
    pub tools: Vec<BridgeTool>,
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
        tokio::spawn(crate::loopback::serve(
            listener,
            inner.clone(),
            inner.shutdown.clone(),
            "the bridge endpoint",
            handle,
        ));
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
        let mut turn = turn;
        turn.tools = extra_tools(std::mem::take(&mut turn.tools));
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

/// The extra tools a turn offers: none named like a built-in or an earlier one, at most
/// [`MAX_EXTRA_TOOLS`].
fn extra_tools(tools: Vec<BridgeTool>) -> Vec<BridgeTool> {
    let mut kept: Vec<BridgeTool> = Vec::new();
    for tool in tools {
        if super::is_builtin(&tool.name) || kept.iter().any(|k| k.name == tool.name) {
            tracing::warn!(tool = %tool.name, "an extra bridge tool reuses a name; left out");
            continue;
        }
        if kept.len() == MAX_EXTRA_TOOLS {
            break;
        }
        kept.push(tool);
    }
    kept
}

// ----- the server -----

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
    let path = request.uri().path();
    if path == TOOLS_PATH {
        if request.method() != Method::GET {
            return refused(
                StatusCode::METHOD_NOT_ALLOWED,
                "method_not_allowed",
                format!("{TOOLS_PATH} takes GET"),
            );
        }
        return json_response(StatusCode::OK, &tool_list(&turn));
    }
    if path != CALL_PATH {
        return refused(
            StatusCode::NOT_FOUND,
            "unknown_endpoint",
            format!("the bridge endpoint has only GET {TOOLS_PATH} and POST {CALL_PATH}"),
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

/// Every tool `turn`'s bridge offers: the built-ins, then its extra tools.
fn tool_list(turn: &BridgeTurn) -> ToolList {
    let mut tools = super::builtin_tools(turn.setup.laptop);
    tools.extend(turn.setup.tools.iter().map(super::extra_tool));
    ToolList {
        tools,
        laptop: turn.setup.laptop,
    }
}

async fn execute(endpoint: &Endpoint, turn: &Arc<BridgeTurn>, call: BridgeCall) -> BridgeReply {
    let offered = super::builtin_tools(turn.setup.laptop)
        .iter()
        .any(|t| t["name"] == call.tool.as_str())
        || turn.setup.tools.iter().any(|t| t.name == call.tool);
    match (call.tool.as_str(), &turn.setup.shell) {
        _ if !offered => BridgeReply::error(format!(
            "there is no bridge tool named {:?} in this turn",
            call.tool
        )),
        // A laptop turn's calls are the laptop's: agentd sends them there.
        _ if turn.setup.laptop.is_some() => ask_agentd(endpoint, turn, call).await,
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
        open_at(mode, None, answer_timeout).await
    }

    async fn open_at(mode: Mode, laptop: Option<LaptopFolder>, answer_timeout: Duration) -> Opened {
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
            laptop,
            tools: Vec::new(),
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
    async fn a_laptop_turn_sends_both_tools_to_agentd_and_has_no_patch_tool_on_a_read_only_folder()
    {
        // Writable folder, Run chat: the patch is the laptop's to judge, so it goes to agentd.
        let mut o = open_at(
            Mode::Run,
            Some(LaptopFolder { writable: true }),
            Duration::from_secs(30),
        )
        .await;
        let f = forwarder(&o, o.capability.secret());
        let listed = f.tools().await.unwrap();
        assert_eq!(listed.laptop, Some(LaptopFolder { writable: true }));
        let names: Vec<_> = listed.tools.iter().map(|t| t["name"].clone()).collect();
        assert_eq!(names, [SHELL_TOOL, PATCH_TOOL]);
        for call in [
            patch(),
            BridgeCall {
                tool: SHELL_TOOL.into(),
                arguments: json!({"command": "touch made-here"}),
            },
        ] {
            let tool = call.tool.clone();
            let f = forwarder(&o, o.capability.secret());
            let reply = tokio::spawn(async move { f.call(&call).await });
            let event = next_call(&mut o.events).await;
            assert_eq!(event["tool"], tool.as_str());
            let ok = BridgeAnswer {
                ok: true,
                result: Some(json!({"on": "laptop"})),
                error: None,
            };
            let call_id = event["call_id"].as_str().unwrap();
            o.endpoint.answer("turn_1", call_id, ok).unwrap();
            assert_eq!(reply.await.unwrap(), BridgeReply::ok(r#"{"on":"laptop"}"#));
        }

        // A read-only folder: no patch tool, refused here without asking anyone.
        let mut o = open_at(
            Mode::Builder,
            Some(LaptopFolder { writable: false }),
            Duration::from_secs(30),
        )
        .await;
        let f = forwarder(&o, o.capability.secret());
        let names: Vec<_> = f
            .tools()
            .await
            .unwrap()
            .tools
            .iter()
            .map(|t| t["name"].clone())
            .collect();
        assert_eq!(names, [SHELL_TOOL]);
        let reply = f.call(&patch()).await;
        assert!(
            reply.is_error && reply.text.contains("no bridge tool"),
            "{reply:?}"
        );
        assert!(o.events.try_recv().is_err(), "nothing reached agentd");
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

    fn extra(name: &str) -> BridgeTool {
        BridgeTool {
            name: name.into(),
            description: format!("[MCP server \"Docs\"] {name}"),
            input_schema: json!({"type": "object", "properties": {"q": {"type": "string"}}}),
        }
    }

    /// A GET of the tool list with `token` on `endpoint`: the status and the JSON body.
    async fn get_tools(endpoint: &BridgeEndpoint, token: &str, method: Method) -> (u16, Value) {
        let stream = tokio::net::TcpStream::connect(endpoint.inner.address)
            .await
            .unwrap();
        let (mut sender, connection) =
            hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
                .await
                .unwrap();
        tokio::spawn(connection);
        let request = Request::builder()
            .method(method)
            .uri(TOOLS_PATH)
            .header(header::HOST, endpoint.inner.address.to_string())
            .header(header::AUTHORIZATION, format!("Bearer {token}"))
            .body(http_body_util::Empty::<Bytes>::new())
            .unwrap();
        let response = sender.send_request(request).await.unwrap();
        let status = response.status().as_u16();
        let body = response.into_body().collect().await.unwrap().to_bytes();
        (status, serde_json::from_slice(&body).unwrap())
    }

    fn listed(body: &Value) -> Vec<&str> {
        body["tools"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t["name"].as_str().unwrap())
            .collect()
    }

    #[tokio::test]
    async fn the_tool_list_is_the_turns_own_and_needs_its_open_token() {
        let endpoint = BridgeEndpoint::start_with(CancellationToken::new(), Duration::from_secs(5))
            .await
            .unwrap();
        let open_turn = |turn_id: &str, tools: Vec<BridgeTool>| {
            let (sender, events) = tokio::sync::mpsc::unbounded_channel();
            let capability = endpoint.open_turn(TurnBridge {
                turn_id: turn_id.into(),
                mode: Mode::Run,
                events: sender,
                cancel: CancellationToken::new(),
                shell: None,
                laptop: None,
                tools,
            });
            (capability, events)
        };
        // An extra tool named like a built-in, or twice, is left out.
        let (a, _a_events) = open_turn(
            "turn_a",
            vec![
                extra("mcp_docs_a1b2c3__search"),
                extra(SHELL_TOOL),
                extra("mcp_docs_a1b2c3__search"),
                extra("mcp_docs_a1b2c3__get"),
            ],
        );
        let (b, _b_events) = open_turn("turn_b", Vec::new());
        let (status, body) = get_tools(&endpoint, a.secret(), Method::GET).await;
        assert_eq!(status, 200, "{body}");
        assert_eq!(
            listed(&body),
            [
                SHELL_TOOL,
                PATCH_TOOL,
                "mcp_docs_a1b2c3__search",
                "mcp_docs_a1b2c3__get"
            ]
        );
        assert_eq!(
            body["tools"][2]["inputSchema"]["properties"]["q"]["type"],
            "string"
        );
        assert_eq!(body["tools"][0], crate::bridge::tools()[0]);
        // Another turn's token gets that turn's list, never this one's.
        let (status, body) = get_tools(&endpoint, b.secret(), Method::GET).await;
        assert_eq!((status, listed(&body)), (200, vec![SHELL_TOOL, PATCH_TOOL]));
        // No token of an open turn, no list; the list is read, never posted.
        let (status, body) = get_tools(&endpoint, "awbr_wrong", Method::GET).await;
        assert_eq!(
            (status, &body["error"]["code"]),
            (401, &json!("invalid_bridge_token"))
        );
        assert!(!body.to_string().contains("mcp_docs"));
        let (status, _) = get_tools(&endpoint, a.secret(), Method::POST).await;
        assert_eq!(status, 405);
        let secret = a.secret().to_owned();
        a.close();
        let (status, _) = get_tools(&endpoint, &secret, Method::GET).await;
        assert_eq!(status, 401, "a closed turn's token is refused");
        // The forwarder reads the same list.
        let f = Forwarder::new(&endpoint.url(), b.secret().to_owned()).unwrap();
        let tools = f.tools().await.unwrap();
        assert_eq!((tools.tools.len(), tools.laptop), (2, None));
        assert!(
            Forwarder::new(&endpoint.url(), secret)
                .unwrap()
                .tools()
                .await
                .unwrap_err()
                .contains("HTTP 401")
        );
    }

    #[tokio::test]
    async fn an_extra_tools_call_goes_to_agentd_and_a_tool_not_offered_is_refused() {
        let endpoint =
            BridgeEndpoint::start_with(CancellationToken::new(), Duration::from_secs(30))
                .await
                .unwrap();
        let (sender, mut events) = tokio::sync::mpsc::unbounded_channel();
        let capability = endpoint.open_turn(TurnBridge {
            turn_id: "turn_x".into(),
            mode: Mode::Run,
            events: sender,
            cancel: CancellationToken::new(),
            shell: None,
            laptop: None,
            tools: vec![extra("mcp_docs_a1b2c3__search")],
        });
        let f = Forwarder::new(&endpoint.url(), capability.secret().to_owned()).unwrap();
        let refused = f
            .call(&BridgeCall {
                tool: "mcp_docs_a1b2c3__delete".into(),
                arguments: json!({}),
            })
            .await;
        assert!(
            refused.is_error && refused.text.contains("no bridge tool named"),
            "{refused:?}"
        );
        let call = tokio::spawn(async move {
            f.call(&BridgeCall {
                tool: "mcp_docs_a1b2c3__search".into(),
                arguments: json!({"q": "bridge"}),
            })
            .await
        });
        // Only the offered one reached agentd.
        let event = next_call(&mut events).await;
        assert_eq!(event["tool"], "mcp_docs_a1b2c3__search");
        assert_eq!(event["arguments"], json!({"q": "bridge"}));
        endpoint
            .answer(
                "turn_x",
                event["call_id"].as_str().unwrap(),
                BridgeAnswer {
                    ok: true,
                    result: Some(json!("found it")),
                    error: None,
                },
            )
            .unwrap();
        assert_eq!(call.await.unwrap(), BridgeReply::ok("found it"));
        assert!(events.try_recv().is_err());
    }
}
