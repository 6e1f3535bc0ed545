//! The ACP driver: any coding CLI that speaks the Agent Client Protocol (protocol version 1)
//! over its stdin and stdout (`opencode acp`, `gemini --acp`, …), driven as its client. Tested
//! with OpenCode 1.18.33 (`crates/runner/tests/opencode_cli.rs`,
//! `tests/suite/runnerd_opencode.rs`).
//!
//! Owns: how an ACP agent is configured for a turn ([`AcpOptions`]: its arguments, the API it
//! speaks to the model gateway, and how the gateway is given to it, e.g. OpenCode's generated
//! `opencode.json`), the conversation itself ([`converse`]: `initialize`, `session/new` with the
//! bridge in `mcpServers` or `session/load` of the chat's session, `session/prompt`,
//! `session/cancel` on Stop), the translation of `session/update` notifications into the turn's
//! events ([`UpdateParser`]), and the permission policy ([`decide_permission`]).
//!
//! The messages are the few this client uses, in the protocol's wire shapes ([`wire`]), not the
//! `agent-client-protocol` crate's types: that crate switches on `serde_json`'s
//! `preserve_order` for everything it is built with, which would change how every map in the
//! workspace serializes. The JSON-RPC framing is ours too: every line the agent prints is read
//! bounded (a longer one is dropped whole), a line that is not a message we understand is
//! skipped, and nothing the agent sends can block or end the turn except the answer to our own
//! `session/prompt` (or its exit).
//!
//! Must never: answer `session/request_permission` by asking the model or anyone else (the
//! policy decides: the bridge's tools and, in server mode, the agent's own announced tools are
//! allowed; everything else is refused; a chat bound to a laptop folder allows only the bridge),
//! advertise the `fs/*` or `terminal/*` client capabilities (the agent's own tools run inside
//! our sandbox; runnerd never reads or writes files for it), forward the history an agent
//! replays while loading a session as this turn's events, or put a key's value in a generated
//! file (the config names the environment variable that holds the turn's capability).

use std::collections::HashMap;
use std::path::PathBuf;
use std::time::Duration;

use agentworks_contract::runnerd::{TurnEvent, codes};
use serde::Serialize;
use serde_json::{Value, json};
use tokio::io::{AsyncBufRead, AsyncWrite, AsyncWriteExt};
use tokio_util::sync::CancellationToken;

use crate::bridge::mcp::read_line;
use crate::driver::{CliDriver, Conversation, DriverError, Generated, Launch, TurnSetup};
use crate::driver::{bounded, one_line};
use crate::gateway::KeyHeader;
use wire::{
    ContentBlock, InitializeResponse, NewSessionResponse, PermissionOptionKind, PromptResponse,
    RequestPermissionRequest, SessionNotification, SessionUpdate, ToolCallContent, ToolCallStatus,
};

/// The MCP server name of `agentworks-mcpbridge` in `session/new`. OpenCode names its tools
/// `bridge_<tool>` (seen with 1.18.33: `bridge_execute_shell_command`).
pub const BRIDGE_SERVER: &str = "bridge";

/// The environment variable holding the turn's capability, which the agent's config names
/// (OpenCode: `{env:AGENTWORKS_MODEL_KEY}`); never the operator's key.
pub const MODEL_KEY_ENV: &str = "AGENTWORKS_MODEL_KEY";

/// The provider id in OpenCode's generated config: the model is `agentworks/<model>`.
pub const OPENCODE_PROVIDER_ID: &str = "agentworks";

/// The ACP protocol version this client speaks.
const PROTOCOL_VERSION: u16 = 1;

/// The longest line of the agent's stdout kept (a tool's output is bounded far below).
const MAX_MESSAGE_LINE: usize = 4 * 1024 * 1024;

/// How long a cancelled prompt may take to end on its own before the turn ends anyway (the
/// turn then kills the tree).
pub const CANCEL_GRACE: Duration = Duration::from_secs(3);

/// How an ACP agent is run for a provider (`[runnerd.providers.NAME.acp]`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AcpOptions {
    /// The arguments that make the executable speak ACP on stdio (`["acp"]`, `["--acp"]`).
    pub args: Vec<String>,
    /// How the model gateway is given to the agent.
    pub agent: AcpAgent,
    /// The API the agent speaks to the gateway (and the gateway forwards upstream).
    pub api: AcpApi,
}

/// How the model gateway is given to an ACP agent: the config it is started with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AcpAgent {
    /// OpenCode (`opencode acp`): `opencode.json` in its global config directory under the
    /// runtime's home, naming an OpenAI-compatible provider at the gateway.
    OpenCode,
}

impl AcpAgent {
    /// The agent named in the config (`agent = "opencode"`).
    pub fn from_name(name: &str) -> Option<AcpAgent> {
        match name {
            "opencode" => Some(AcpAgent::OpenCode),
            _ => None,
        }
    }

    /// The APIs it can speak to the gateway; the first is its default.
    pub fn apis(self) -> &'static [AcpApi] {
        match self {
            AcpAgent::OpenCode => &[AcpApi::ChatCompletions],
        }
    }
}

/// The API dialect an ACP agent speaks to the gateway.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AcpApi {
    /// OpenAI chat completions (`POST {base}/chat/completions`), the key as a bearer token.
    ChatCompletions,
}

impl AcpApi {
    /// The API named in the config (`api = "chat_completions"`).
    pub fn from_name(name: &str) -> Option<AcpApi> {
        match name {
            "chat_completions" => Some(AcpApi::ChatCompletions),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            AcpApi::ChatCompletions => "chat_completions",
        }
    }
}

/// The ACP dialect as a [`CliDriver`]; the provider's [`AcpOptions`] come with the turn.
pub struct AcpDriver;

impl AcpDriver {
    fn options<'a>(setup: &TurnSetup<'a>) -> Result<&'a AcpOptions, DriverError> {
        setup.acp.ok_or_else(|| {
            DriverError::Config("an ACP provider needs its [runnerd.providers.NAME.acp]".into())
        })
    }
}

impl CliDriver for AcpDriver {
    fn upstream_auth(&self) -> KeyHeader {
        // Every API an ACP agent may speak here takes a bearer token (chat completions).
        KeyHeader::Bearer
    }

    fn files(&self, setup: &TurnSetup) -> Result<Vec<Generated>, DriverError> {
        let options = Self::options(setup)?;
        match options.agent {
            AcpAgent::OpenCode => opencode_files(setup, options.api),
        }
    }

    fn launch(
        &self,
        setup: &TurnSetup,
        capability: &str,
        _resume: Option<&str>,
    ) -> Result<Launch, DriverError> {
        let options = Self::options(setup)?;
        let mut env = vec![(MODEL_KEY_ENV.to_owned(), capability.into())];
        match options.agent {
            AcpAgent::OpenCode => env.extend(opencode_env()),
        }
        Ok(Launch {
            args: options.args.clone(),
            env,
        })
    }

    fn conversation(&self, setup: &TurnSetup, resume: Option<&str>) -> Conversation {
        Conversation::Acp(AcpSession {
            cwd: setup.runtime_dir.to_path_buf(),
            bridge_command: setup.bridge_command.map(PathBuf::from),
            bridge_env: Vec::new(),
            bound: setup.bound,
            resume: resume.map(str::to_owned),
        })
    }
}

/// OpenCode's config directory, relative to the runtime: `$XDG_CONFIG_HOME/opencode` (the
/// runtime's environment sets `XDG_CONFIG_HOME` to `home/.config`).
const OPENCODE_CONFIG_DIR: &str = "home/.config/opencode";

/// The files of an OpenCode turn, all in its global config directory (the only one it reads:
/// [`opencode_env`] switches off project config discovery):
///
/// - `opencode.json`: the `agentworks` provider (`@ai-sdk/openai-compatible`, bundled in the
///   binary) at the gateway, its key read from [`MODEL_KEY_ENV`], the model; no update checks,
///   no sharing, no title requests; every permission `allow` (ours is the boundary: the
///   sandbox) — in a chat bound to a laptop, `ask` for everything but the bridge, and the ACP
///   policy refuses what asks ([`decide_permission`]); a refused call is answered to the
///   model and the turn goes on (`experimental.continue_loop_on_deny`).
/// - `AGENTS.md`: the generated instructions (OpenCode reads the global one always).
/// - `plugin/agentworks-shell-env.js`: its `shell.env` hook keeps the turn's capability and
///   the server's password out of the environment of the commands its `bash` tool runs.
/// - `package-lock.json` and `node_modules/`: OpenCode 1.18 installs `@opencode-ai/plugin` from
///   registry.npmjs.org into every config directory at start unless its `node_modules` exists
///   and its lock names that package (read from the binary: `Npm.install`); nothing here needs
///   the package, so the lock says it is there and no install starts.
fn opencode_files(setup: &TurnSetup, api: AcpApi) -> Result<Vec<Generated>, DriverError> {
    if setup.model.trim().is_empty() {
        return Err(DriverError::Config("the provider has no model name".into()));
    }
    let url = setup.gateway_base_url;
    if !(url.starts_with("http://") || url.starts_with("https://")) {
        return Err(DriverError::Config(format!(
            "the model gateway's base URL {url:?} is not an http:// or https:// URL"
        )));
    }
    let AcpApi::ChatCompletions = api;
    let config = OpenCodeConfig {
        schema: "https://opencode.ai/config.json",
        model: format!("{OPENCODE_PROVIDER_ID}/{}", setup.model),
        small_model: format!("{OPENCODE_PROVIDER_ID}/{}", setup.model),
        autoupdate: false,
        share: "disabled",
        provider: HashMap::from([(
            OPENCODE_PROVIDER_ID,
            OpenCodeProvider {
                npm: "@ai-sdk/openai-compatible",
                name: OPENCODE_PROVIDER_ID,
                options: OpenCodeProviderOptions {
                    base_url: url,
                    api_key: format!("{{env:{MODEL_KEY_ENV}}}"),
                },
                models: HashMap::from([(setup.model, json!({ "name": setup.model }))]),
            },
        )]),
        // The title agent would send a request of its own per new session; it is only a label.
        agent: json!({ "title": { "disable": true } }),
        // A call the policy refuses is answered to the model, which goes on (with the bridge's
        // tools); by default OpenCode would end the turn at the first refusal.
        experimental: json!({ "continue_loop_on_deny": true }),
        permission: if setup.bound {
            json!({ "*": "ask", format!("{BRIDGE_SERVER}_*"): "allow" })
        } else {
            json!("allow")
        },
    };
    let config = serde_json::to_string_pretty(&config)
        .map_err(|e| DriverError::Config(format!("cannot write OpenCode's config: {e}")))?;
    let dir = PathBuf::from(OPENCODE_CONFIG_DIR);
    Ok(vec![
        Generated {
            path: dir.join("opencode.json"),
            content: config,
        },
        Generated {
            path: dir.join("AGENTS.md"),
            content: setup.guidance.to_owned(),
        },
        Generated {
            path: dir.join("package-lock.json"),
            content: json!({
                "lockfileVersion": 3,
                "packages": { "": { "dependencies": { "@opencode-ai/plugin": "*" } } },
            })
            .to_string(),
        },
        Generated {
            path: dir.join("plugin/agentworks-shell-env.js"),
            content: opencode_shell_env_plugin(),
        },
        Generated {
            path: dir.join("node_modules/README"),
            content: "Written by agentworks-runnerd so that OpenCode installs nothing here.\n"
                .to_owned(),
        },
    ])
}

/// The variables of OpenCode's environment that its commands must not inherit: the turn's
/// capability on the model gateway and the password of its loopback server.
const OPENCODE_SHELL_HIDDEN: &[&str] = &[MODEL_KEY_ENV, "OPENCODE_SERVER_PASSWORD"];

/// A plugin of OpenCode's (its `shell.env` hook, which every command of its `bash` tool goes
/// through: `{...process.env, ...hook's env}`) that takes [`OPENCODE_SHELL_HIDDEN`] out of its
/// commands' environment: a variable set to `undefined` is not passed to the child.
fn opencode_shell_env_plugin() -> String {
    let names = serde_json::to_string(OPENCODE_SHELL_HIDDEN).unwrap_or_else(|_| "[]".into());
    OPENCODE_SHELL_ENV_PLUGIN.replace("HIDDEN_NAMES", &names)
}

const OPENCODE_SHELL_ENV_PLUGIN: &str = r#"// Written by agentworks-runnerd: the turn's secrets stay out of OpenCode's commands.
const hidden = HIDDEN_NAMES;
export default {
  id: "agentworks-shell-env",
  server: async () => ({
    "shell.env": async (_input, output) => {
      for (const name of hidden) output.env[name] = undefined;
    },
  }),
};
"#;

/// OpenCode's environment: its background traffic off (update checks, the models.dev fetch,
/// sharing, LSP downloads, the default auth plugins), no `~/.claude` or project-level config,
/// and a fresh password on the HTTP server it runs on loopback for its own ACP front end (port
/// 4096 or another): without it any local process, another turn's CLI included, could drive
/// this turn's agent.
fn opencode_env() -> Vec<(String, std::ffi::OsString)> {
    let mut env: Vec<(String, std::ffi::OsString)> = [
        "OPENCODE_DISABLE_AUTOUPDATE",
        "OPENCODE_DISABLE_MODELS_FETCH",
        "OPENCODE_DISABLE_SHARE",
        "OPENCODE_DISABLE_LSP_DOWNLOAD",
        "OPENCODE_DISABLE_DEFAULT_PLUGINS",
        "OPENCODE_DISABLE_CLAUDE_CODE",
        "OPENCODE_DISABLE_PROJECT_CONFIG",
    ]
    .into_iter()
    .map(|name| (name.to_owned(), "1".into()))
    .collect();
    env.push((
        "OPENCODE_SERVER_PASSWORD".to_owned(),
        hex::encode(rand::random::<[u8; 24]>()).into(),
    ));
    env
}

#[derive(Serialize)]
struct OpenCodeConfig<'a> {
    #[serde(rename = "$schema")]
    schema: &'a str,
    model: String,
    small_model: String,
    autoupdate: bool,
    share: &'a str,
    provider: HashMap<&'a str, OpenCodeProvider<'a>>,
    agent: Value,
    experimental: Value,
    permission: Value,
}

#[derive(Serialize)]
struct OpenCodeProvider<'a> {
    npm: &'a str,
    name: &'a str,
    options: OpenCodeProviderOptions<'a>,
    models: HashMap<&'a str, Value>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct OpenCodeProviderOptions<'a> {
    #[serde(rename = "baseURL")]
    base_url: &'a str,
    api_key: String,
}

/// What one turn's conversation needs beyond the prompt.
#[derive(Debug, Clone)]
pub struct AcpSession {
    /// The session's cwd: the runtime (never the project).
    pub cwd: PathBuf,
    /// `agentworks-mcpbridge`, offered as the stdio MCP server [`BRIDGE_SERVER`].
    pub bridge_command: Option<PathBuf>,
    /// The bridge's environment (its URL and this turn's capability), set by the turn: they
    /// travel in `session/new` over the pipe, never in a file.
    pub bridge_env: Vec<(String, String)>,
    /// A chat bound to a laptop folder: only the bridge's tools are allowed.
    pub bound: bool,
    /// The chat's session to load, when it has one under the same session key.
    pub resume: Option<String>,
}

/// Why a conversation ended without the turn's normal end.
#[derive(Debug, thiserror::Error)]
pub enum AcpError {
    /// The agent closed its stdout before answering the prompt.
    #[error("the agent closed its output before the turn ended")]
    Closed,
    /// The agent answered one of our requests with an error.
    #[error("the agent refused {method}: {message}")]
    Refused {
        method: &'static str,
        message: String,
    },
    /// The agent answered with something that is not the protocol's answer.
    #[error("the agent's answer to {method} is not one ACP allows: {why}")]
    Malformed { method: &'static str, why: String },
    /// The agent ended the turn with a stop reason that is a failure.
    #[error("the agent stopped the turn: {0}")]
    Stopped(String),
    /// Stop: the prompt was cancelled (and the agent had [`CANCEL_GRACE`] to end it).
    #[error("the turn was stopped")]
    Cancelled,
    /// Writing to the agent failed (it exited or closed its input).
    #[error("cannot write to the agent: {0}")]
    Write(std::io::Error),
}

impl AcpError {
    /// The turn's failure code for it.
    pub fn code(&self) -> &'static str {
        match self {
            AcpError::Cancelled => codes::CANCELLED,
            _ => codes::CLI_FAILED,
        }
    }
}

/// Runs one turn's conversation with the agent on `input` (its stdout) and `output` (its
/// stdin): the session made or loaded, `prompt` sent, the updates turned into events for
/// `emit`, permissions decided by policy, until the prompt's answer. `cancel` sends
/// `session/cancel` and ends the conversation at the answer or after [`CANCEL_GRACE`].
pub async fn converse<R, W>(
    input: R,
    output: W,
    session: &AcpSession,
    prompt: &str,
    cancel: &CancellationToken,
    emit: &mut (dyn FnMut(TurnEvent) + Send),
) -> Result<(), AcpError>
where
    R: AsyncBufRead + Unpin + Send,
    W: AsyncWrite + Unpin + Send,
{
    let mut peer = Peer {
        input,
        output,
        next_id: 0,
        line: Vec::new(),
        parser: UpdateParser::default(),
        bound: session.bound,
    };

    // No `fs` or `terminal` capability: the agent's own tools work inside the sandbox.
    let initialize: InitializeResponse = peer
        .request(
            "initialize",
            &json!({
                "protocolVersion": PROTOCOL_VERSION,
                "clientCapabilities": {
                    "fs": {"readTextFile": false, "writeTextFile": false},
                    "terminal": false,
                },
                "clientInfo": {"name": "agentworks-runnerd", "version": env!("CARGO_PKG_VERSION")},
            }),
            emit,
        )
        .await?;

    // The bridge as a stdio MCP server (`type` absent: stdio, the one every agent supports).
    let mcp_servers: Vec<Value> = session
        .bridge_command
        .iter()
        .map(|command| {
            json!({
                "name": BRIDGE_SERVER,
                "command": command,
                "args": [],
                "env": session
                    .bridge_env
                    .iter()
                    .map(|(name, value)| json!({"name": name, "value": value}))
                    .collect::<Vec<_>>(),
            })
        })
        .collect();

    let mut session_id = None;
    if let Some(resume) = &session.resume
        && initialize.agent_capabilities.load_session
    {
        // The agent replays the session's history as updates before it answers: not this
        // turn's events.
        peer.parser.replaying = true;
        let loaded: Result<Value, AcpError> = peer
            .request(
                "session/load",
                &json!({"sessionId": resume, "cwd": session.cwd, "mcpServers": mcp_servers}),
                emit,
            )
            .await;
        peer.parser.replaying = false;
        match loaded {
            Ok(_) => session_id = Some(resume.clone()),
            // A session the agent lost (its store removed, another version): a new one.
            Err(AcpError::Refused { message, .. }) => {
                tracing::info!(session = %resume, %message, "the agent could not load the session; starting a new one");
            }
            Err(other) => return Err(other),
        }
    }
    let session_id = match session_id {
        Some(id) => id,
        None => {
            let created: NewSessionResponse = peer
                .request(
                    "session/new",
                    &json!({"cwd": session.cwd, "mcpServers": mcp_servers}),
                    emit,
                )
                .await?;
            created.session_id
        }
    };
    emit(TurnEvent::Session {
        session_id: session_id.clone(),
    });

    let prompt_id = peer
        .send_request(
            "session/prompt",
            &json!({"sessionId": session_id, "prompt": [{"type": "text", "text": prompt}]}),
        )
        .await?;
    let answer = tokio::select! {
        answer = peer.wait(prompt_id, "session/prompt", emit) => Some(answer),
        _ = cancel.cancelled() => None,
    };
    let answer = match answer {
        Some(answer) => answer,
        None => {
            // Stop: the agent ends its prompt (answering `cancelled`) and its tools; the turn
            // then ends its tree whatever it did.
            peer.send_notification("session/cancel", &json!({"sessionId": session_id}))
                .await?;
            let _ =
                tokio::time::timeout(CANCEL_GRACE, peer.wait(prompt_id, "session/prompt", emit))
                    .await;
            peer.parser.flush(emit);
            return Err(AcpError::Cancelled);
        }
    };
    peer.parser.flush(emit);
    let response: PromptResponse = decode("session/prompt", answer?)?;
    match response.stop_reason.as_str() {
        "end_turn" | "max_tokens" | "max_turn_requests" => Ok(()),
        "cancelled" => Err(AcpError::Cancelled),
        "refusal" => Err(AcpError::Stopped("the model refused to go on".into())),
        other => Err(AcpError::Stopped(bounded(other))),
    }
}

fn decode<T: serde::de::DeserializeOwned>(
    method: &'static str,
    value: Value,
) -> Result<T, AcpError> {
    serde_json::from_value(value).map_err(|e| AcpError::Malformed {
        method,
        why: e.to_string(),
    })
}

/// Our side of the JSON-RPC connection.
struct Peer<R, W> {
    input: R,
    output: W,
    next_id: u64,
    line: Vec<u8>,
    parser: UpdateParser,
    bound: bool,
}

impl<R, W> Peer<R, W>
where
    R: AsyncBufRead + Unpin + Send,
    W: AsyncWrite + Unpin + Send,
{
    async fn write(&mut self, message: &Value) -> Result<(), AcpError> {
        let mut bytes = message.to_string().into_bytes();
        bytes.push(b'\n');
        self.output
            .write_all(&bytes)
            .await
            .map_err(AcpError::Write)?;
        self.output.flush().await.map_err(AcpError::Write)
    }

    async fn send_request(
        &mut self,
        method: &str,
        params: &impl Serialize,
    ) -> Result<u64, AcpError> {
        let id = self.next_id;
        self.next_id += 1;
        self.write(&json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}))
            .await?;
        Ok(id)
    }

    async fn send_notification(
        &mut self,
        method: &str,
        params: &impl Serialize,
    ) -> Result<(), AcpError> {
        self.write(&json!({"jsonrpc": "2.0", "method": method, "params": params}))
            .await
    }

    /// Sends a request and reads until its answer, decoded.
    async fn request<T: serde::de::DeserializeOwned>(
        &mut self,
        method: &'static str,
        params: &impl Serialize,
        emit: &mut (dyn FnMut(TurnEvent) + Send),
    ) -> Result<T, AcpError> {
        let id = self.send_request(method, params).await?;
        let result = self.wait(id, method, emit).await?;
        decode(method, result)
    }

    /// Reads the agent's messages, handling its requests and notifications, until the answer
    /// to request `id`: its `result`, or its error as [`AcpError::Refused`].
    async fn wait(
        &mut self,
        id: u64,
        method: &'static str,
        emit: &mut (dyn FnMut(TurnEvent) + Send),
    ) -> Result<Value, AcpError> {
        loop {
            let long = read_line(&mut self.input, &mut self.line, MAX_MESSAGE_LINE)
                .await
                .map_err(|_| AcpError::Closed)?
                .ok_or(AcpError::Closed)?;
            if long {
                tracing::debug!("the agent printed a line longer than {MAX_MESSAGE_LINE} bytes");
                continue;
            }
            let Ok(message) = serde_json::from_slice::<Value>(&self.line) else {
                tracing::debug!("the agent printed a line that is not JSON");
                continue;
            };
            let Some(object) = message.as_object() else {
                continue;
            };
            match (
                object.get("id"),
                object.get("method").and_then(Value::as_str),
            ) {
                // Its request to us.
                (Some(request_id), Some(their_method)) => {
                    let answer = self.answer(their_method, object.get("params"), emit);
                    let mut reply = json!({"jsonrpc": "2.0", "id": request_id});
                    match answer {
                        Ok(result) => reply["result"] = result,
                        Err((code, message)) => {
                            reply["error"] = json!({"code": code, "message": message})
                        }
                    }
                    self.write(&reply).await?;
                }
                // A notification.
                (None, Some(their_method)) => {
                    if their_method == "session/update"
                        && let Some(params) = object.get("params")
                        && let Ok(notification) =
                            serde_json::from_value::<SessionNotification>(params.clone())
                    {
                        self.parser.update(notification.update, emit);
                    }
                }
                // An answer: ours, or stale (an id we never sent or no longer wait for).
                (Some(answer_id), None) => {
                    if answer_id.as_u64() != Some(id) {
                        continue;
                    }
                    if let Some(error) = object.get("error") {
                        let message = error
                            .get("message")
                            .and_then(Value::as_str)
                            .unwrap_or("no message");
                        return Err(AcpError::Refused {
                            method,
                            message: bounded(message),
                        });
                    }
                    return Ok(object.get("result").cloned().unwrap_or(Value::Null));
                }
                (None, None) => {}
            }
        }
    }

    /// Our answer to one of the agent's requests: a result, or a JSON-RPC error.
    fn answer(
        &mut self,
        method: &str,
        params: Option<&Value>,
        emit: &mut (dyn FnMut(TurnEvent) + Send),
    ) -> Result<Value, (i64, String)> {
        if method != "session/request_permission" {
            // fs/*, terminal/* and the rest: never advertised, never served.
            return Err((-32601, format!("{method} is not offered by this client")));
        }
        let request = params
            .cloned()
            .and_then(|p| serde_json::from_value::<RequestPermissionRequest>(p).ok())
            .ok_or((-32602, "invalid session/request_permission".to_owned()))?;
        // What the agent announced first (its tool call), flushed so text keeps its order.
        self.parser.flush(emit);
        let tool = self
            .parser
            .tool_name(&request.tool_call.tool_call_id)
            .map(str::to_owned);
        let decision = decide_permission(tool.as_deref(), self.bound);
        if let Permission::Refuse(why) = &decision {
            tracing::info!(tool = ?tool, why, "refused a tool call by policy");
            // The turn shows the call and why it was refused; the agent's own report of its
            // failure that follows is the same call's, not another result.
            self.parser.refused(&request.tool_call, why, emit);
        }
        Ok(json!({ "outcome": choose_option(&request, &decision) }))
    }
}

/// The policy's answer to one permission request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Permission {
    Allow,
    Refuse(&'static str),
}

/// Whether a tool call may run: `tool` is the name the agent announced its call under (`None`:
/// a call it never announced). The bridge's tools always; in server mode the agent's own
/// announced tools too (they run inside the turn's sandbox, which is the boundary); in a chat
/// bound to a laptop folder nothing else (its hands are the bridge's tools only).
pub fn decide_permission(tool: Option<&str>, bound: bool) -> Permission {
    match tool {
        Some(name) if is_bridge_tool(name) => Permission::Allow,
        Some(_) if bound => Permission::Refuse(
            "the chat is bound to a laptop folder: only the bridge's tools may run",
        ),
        Some(_) => Permission::Allow,
        None => Permission::Refuse("the agent never announced this tool call"),
    }
}

/// A tool of the bridge as an agent names it: `bridge_<tool>` (OpenCode) or `bridge.<tool>`,
/// `bridge__<tool>`, `mcp__bridge__<tool>` (other agents' conventions).
fn is_bridge_tool(name: &str) -> bool {
    let name = name.strip_prefix("mcp__").unwrap_or(name);
    name.strip_prefix(BRIDGE_SERVER)
        .is_some_and(|rest| rest.starts_with(['_', '.']) && rest.len() > 1)
}

/// The option that carries out `decision`: allow once (never "always": each call is decided
/// again), refuse once; the request cancelled when the agent offered no such option.
fn choose_option(request: &RequestPermissionRequest, decision: &Permission) -> Value {
    let wanted: &[PermissionOptionKind] = match decision {
        Permission::Allow => &[PermissionOptionKind::AllowOnce],
        Permission::Refuse(_) => &[
            PermissionOptionKind::RejectOnce,
            PermissionOptionKind::RejectAlways,
        ],
    };
    wanted
        .iter()
        .find_map(|kind| request.options.iter().find(|o| o.kind == *kind))
        .map(|option| json!({"outcome": "selected", "optionId": option.option_id}))
        .unwrap_or_else(|| json!({"outcome": "cancelled"}))
}

/// Turns `session/update` notifications into the turn's events.
///
/// Text arrives in chunks: consecutive agent message chunks are one [`TurnEvent::Text`],
/// flushed when anything else happens. A tool call is announced (`tool_call`, its name as the
/// title; OpenCode sends its input only later) and becomes [`TurnEvent::ToolCall`] when it
/// starts running or ends, [`TurnEvent::ToolResult`] when it ends.
#[derive(Debug, Default)]
pub struct UpdateParser {
    text: String,
    tools: HashMap<String, ToolState>,
    /// A session is being loaded: its replayed history is not this turn's.
    pub replaying: bool,
}

/// How the turn shows a tool call the policy refused (its result's output begins so).
pub const REFUSED: &str = "refused by runnerd's policy";

/// The most tool calls remembered in one turn (a hostile agent could announce without end).
const MAX_TOOL_CALLS: usize = 10_000;

#[derive(Debug, Default)]
struct ToolState {
    name: String,
    input: Option<Value>,
    called: bool,
    ended: bool,
}

impl UpdateParser {
    /// The name the agent announced tool call `id` under.
    pub fn tool_name(&self, id: &str) -> Option<&str> {
        self.tools.get(id).map(|t| t.name.as_str())
    }

    /// One update.
    pub fn update(&mut self, update: SessionUpdate, emit: &mut (dyn FnMut(TurnEvent) + Send)) {
        if self.replaying {
            return;
        }
        match update {
            SessionUpdate::AgentMessageChunk(chunk) => {
                if let ContentBlock::Text { text } = chunk.content
                    && self.text.len() < MAX_MESSAGE_LINE
                {
                    self.text.push_str(&text);
                }
            }
            SessionUpdate::ToolCall(call) => {
                self.flush(emit);
                let id = call.tool_call_id.clone();
                if !self.tools.contains_key(&id) && self.tools.len() >= MAX_TOOL_CALLS {
                    return;
                }
                let name = call.name.clone().or(call.title.clone()).unwrap_or_default();
                let state = self.tools.entry(id.clone()).or_insert_with(|| ToolState {
                    name,
                    ..ToolState::default()
                });
                state.input = call
                    .raw_input
                    .clone()
                    .filter(non_empty)
                    .or(state.input.take());
                let output = output_text(
                    call.content.as_deref().unwrap_or_default(),
                    call.raw_output.as_ref(),
                );
                let status = call.status.unwrap_or(ToolCallStatus::Pending);
                Self::progress(
                    &id,
                    state,
                    status,
                    output,
                    call.raw_output.as_ref(),
                    false,
                    emit,
                );
            }
            SessionUpdate::ToolCallUpdate(update) => {
                self.flush(emit);
                let id = update.tool_call_id.clone();
                // An update of a call never announced: announced now, under its title.
                if !self.tools.contains_key(&id) && self.tools.len() >= MAX_TOOL_CALLS {
                    return;
                }
                let state = self.tools.entry(id.clone()).or_insert_with(|| ToolState {
                    name: update
                        .name
                        .clone()
                        .or(update.title.clone())
                        .unwrap_or_default(),
                    ..ToolState::default()
                });
                if let Some(input) = update.raw_input.clone().filter(non_empty) {
                    state.input = Some(input);
                }
                let output = output_text(
                    update.content.as_deref().unwrap_or_default(),
                    update.raw_output.as_ref(),
                );
                let status = update.status.unwrap_or(ToolCallStatus::Pending);
                Self::progress(
                    &id,
                    state,
                    status,
                    output,
                    update.raw_output.as_ref(),
                    false,
                    emit,
                );
            }
            _ => {}
        }
    }

    fn progress(
        id: &str,
        state: &mut ToolState,
        status: ToolCallStatus,
        output: String,
        raw_output: Option<&Value>,
        refused: bool,
        emit: &mut (dyn FnMut(TurnEvent) + Send),
    ) {
        let ended = matches!(status, ToolCallStatus::Completed | ToolCallStatus::Failed);
        let running = ended || status == ToolCallStatus::InProgress;
        if running && !state.called {
            state.called = true;
            emit(TurnEvent::ToolCall {
                call_id: id.to_owned(),
                tool: display_tool(&state.name),
                command: bounded(&one_line(
                    &state
                        .input
                        .as_ref()
                        .map(|i| match i.get("command").and_then(Value::as_str) {
                            Some(command) => command.to_owned(),
                            None => i.to_string(),
                        })
                        .unwrap_or_default(),
                )),
            });
        }
        if ended && !state.ended {
            state.ended = true;
            let exit_code = raw_output
                .and_then(|o| o.pointer("/metadata/exit"))
                .and_then(Value::as_i64)
                .and_then(|c| i32::try_from(c).ok());
            let output = if status == ToolCallStatus::Failed && output.is_empty() {
                "failed".to_owned()
            } else {
                output
            };
            emit(TurnEvent::ToolResult {
                call_id: id.to_owned(),
                exit_code,
                output: bounded(&output),
                refused,
                failed: status == ToolCallStatus::Failed && !refused && exit_code.is_none(),
            });
        }
    }

    /// Tool call `call` was refused by policy ([`decide_permission`]): shown as called and
    /// ended with [`REFUSED`] and why, once.
    pub fn refused(
        &mut self,
        call: &wire::ToolCall,
        why: &str,
        emit: &mut (dyn FnMut(TurnEvent) + Send),
    ) {
        let id = call.tool_call_id.clone();
        if !self.tools.contains_key(&id) && self.tools.len() >= MAX_TOOL_CALLS {
            return;
        }
        let state = self.tools.entry(id.clone()).or_insert_with(|| ToolState {
            name: call.name.clone().or(call.title.clone()).unwrap_or_default(),
            ..ToolState::default()
        });
        if let Some(input) = call.raw_input.clone().filter(non_empty) {
            state.input = Some(input);
        }
        let output = format!("{REFUSED}: {why}");
        Self::progress(&id, state, ToolCallStatus::Failed, output, None, true, emit);
    }

    /// Sends the text gathered so far as one event.
    pub fn flush(&mut self, emit: &mut (dyn FnMut(TurnEvent) + Send)) {
        if !self.text.is_empty() {
            emit(TurnEvent::Text {
                text: bounded(&std::mem::take(&mut self.text)),
            });
        }
    }
}

fn non_empty(value: &Value) -> bool {
    !matches!(value, Value::Null) && value.as_object().is_none_or(|o| !o.is_empty())
}

/// A tool's name as the turn shows it: the bridge's as `bridge.<tool>`, like Codex's.
fn display_tool(name: &str) -> String {
    match name
        .strip_prefix(BRIDGE_SERVER)
        .and_then(|r| r.strip_prefix('_'))
    {
        Some(tool) if !tool.is_empty() => format!("{BRIDGE_SERVER}.{tool}"),
        _ => name.to_owned(),
    }
}

/// A tool's output: its text content blocks, else its raw output's `output` or `error`.
fn output_text(content: &[ToolCallContent], raw_output: Option<&Value>) -> String {
    let texts: Vec<&str> = content
        .iter()
        .filter_map(|c| match c {
            ToolCallContent::Content {
                content: ContentBlock::Text { text },
            } => Some(text.as_str()),
            _ => None,
        })
        .collect();
    if !texts.is_empty() {
        return texts.join("\n");
    }
    raw_output
        .and_then(|o| o.get("output").or(o.get("error")))
        .map(|v| match v.as_str() {
            Some(s) => s.to_owned(),
            None => v.to_string(),
        })
        .unwrap_or_default()
}

/// The protocol's messages as this client reads them (ACP v1, camelCase on the wire): only the
/// fields it uses; every other field is ignored and an unknown variant is [`Other`]-like, so a
/// newer agent's additions never make a message unreadable.
///
/// [`Other`]: SessionUpdate::Other
pub mod wire {
    use serde::Deserialize;
    use serde_json::Value;

    /// `initialize`'s answer.
    #[derive(Debug, Deserialize)]
    #[serde(rename_all = "camelCase")]
    pub struct InitializeResponse {
        #[serde(default)]
        pub agent_capabilities: AgentCapabilities,
    }

    #[derive(Debug, Default, Deserialize)]
    #[serde(rename_all = "camelCase")]
    pub struct AgentCapabilities {
        /// The agent can continue a session it made earlier (`session/load`).
        #[serde(default)]
        pub load_session: bool,
    }

    /// `session/new`'s answer.
    #[derive(Debug, Deserialize)]
    #[serde(rename_all = "camelCase")]
    pub struct NewSessionResponse {
        pub session_id: String,
    }

    /// `session/prompt`'s answer.
    #[derive(Debug, Deserialize)]
    #[serde(rename_all = "camelCase")]
    pub struct PromptResponse {
        /// `end_turn`, `max_tokens`, `max_turn_requests`, `refusal`, `cancelled`.
        pub stop_reason: String,
    }

    /// The params of `session/update`.
    #[derive(Debug, Deserialize)]
    pub struct SessionNotification {
        pub update: SessionUpdate,
    }

    #[derive(Debug, Deserialize)]
    #[serde(tag = "sessionUpdate", rename_all = "snake_case")]
    pub enum SessionUpdate {
        AgentMessageChunk(ContentChunk),
        ToolCall(ToolCall),
        ToolCallUpdate(ToolCall),
        /// Plans, thoughts, commands, modes, usage, replayed user messages, …
        #[serde(other)]
        Other,
    }

    #[derive(Debug, Deserialize)]
    pub struct ContentChunk {
        pub content: ContentBlock,
    }

    #[derive(Debug, Deserialize)]
    #[serde(tag = "type", rename_all = "snake_case")]
    pub enum ContentBlock {
        Text {
            text: String,
        },
        #[serde(other)]
        Other,
    }

    /// A `tool_call` (announced) or `tool_call_update` (its fields so far): both read alike,
    /// every field but the id optional.
    #[derive(Debug, Deserialize)]
    #[serde(rename_all = "camelCase")]
    pub struct ToolCall {
        pub tool_call_id: String,
        #[serde(default)]
        pub title: Option<String>,
        #[serde(default)]
        pub name: Option<String>,
        #[serde(default, deserialize_with = "lenient")]
        pub status: Option<ToolCallStatus>,
        #[serde(default, deserialize_with = "lenient")]
        pub content: Option<Vec<ToolCallContent>>,
        #[serde(default)]
        pub raw_input: Option<Value>,
        #[serde(default)]
        pub raw_output: Option<Value>,
    }

    #[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
    #[serde(rename_all = "snake_case")]
    pub enum ToolCallStatus {
        Pending,
        InProgress,
        Completed,
        Failed,
    }

    #[derive(Debug, Deserialize)]
    #[serde(tag = "type", rename_all = "snake_case")]
    pub enum ToolCallContent {
        Content {
            content: ContentBlock,
        },
        /// Diffs, terminals.
        #[serde(other)]
        Other,
    }

    /// The params of `session/request_permission`.
    #[derive(Debug, Deserialize)]
    #[serde(rename_all = "camelCase")]
    pub struct RequestPermissionRequest {
        pub tool_call: ToolCall,
        pub options: Vec<PermissionOption>,
    }

    #[derive(Debug, Deserialize)]
    #[serde(rename_all = "camelCase")]
    pub struct PermissionOption {
        pub option_id: String,
        pub kind: PermissionOptionKind,
    }

    #[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
    #[serde(rename_all = "snake_case")]
    pub enum PermissionOptionKind {
        AllowOnce,
        AllowAlways,
        RejectOnce,
        RejectAlways,
        #[serde(other)]
        Other,
    }

    /// A field that does not read is absent, not the whole message unreadable.
    fn lenient<'de, D, T>(deserializer: D) -> Result<Option<T>, D::Error>
    where
        D: serde::Deserializer<'de>,
        T: serde::de::DeserializeOwned,
    {
        let value = Value::deserialize(deserializer)?;
        Ok(serde_json::from_value(value).ok())
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn updates(lines: &[&str]) -> Vec<TurnEvent> {
        let mut parser = UpdateParser::default();
        let mut events = Vec::new();
        let mut emit = |e: TurnEvent| events.push(e);
        for line in lines {
            if let Ok(n) = serde_json::from_str::<SessionNotification>(line) {
                parser.update(n.update, &mut emit);
            }
        }
        parser.flush(&mut emit);
        events
    }

    // The shapes below are what OpenCode 1.18.33 sent (bridge call, then its own bash).
    #[test]
    fn tool_calls_and_text_become_events() {
        let events = updates(&[
            r#"{"sessionId":"s","update":{"sessionUpdate":"tool_call","toolCallId":"call_1","title":"bridge_execute_shell_command","kind":"other","status":"pending","locations":[],"rawInput":{}}}"#,
            r#"{"sessionId":"s","update":{"sessionUpdate":"tool_call_update","toolCallId":"call_1","status":"in_progress","kind":"other","title":"bridge_execute_shell_command","locations":[],"rawInput":{"command":"echo hi"}}}"#,
            r#"{"sessionId":"s","update":{"sessionUpdate":"tool_call_update","toolCallId":"call_1","status":"completed","content":[{"type":"content","content":{"type":"text","text":"ran: echo hi"}}],"rawOutput":{"output":"ran: echo hi","metadata":{"truncated":false}}}}"#,
            r#"{"sessionId":"s","update":{"sessionUpdate":"tool_call","toolCallId":"call_2","title":"bash","kind":"execute","status":"pending","rawInput":{"cwd":"/r"}}}"#,
            r#"{"sessionId":"s","update":{"sessionUpdate":"tool_call_update","toolCallId":"call_2","status":"completed","title":"echo native","content":[{"type":"content","content":{"type":"text","text":"native\n"}}],"rawInput":{"command":"echo native"},"rawOutput":{"output":"native\n","metadata":{"exit":0}}}}"#,
            r#"{"sessionId":"s","update":{"sessionUpdate":"agent_message_chunk","content":{"type":"text","text":"do"}}}"#,
            r#"{"sessionId":"s","update":{"sessionUpdate":"agent_message_chunk","content":{"type":"text","text":"ne"}}}"#,
            r#"{"sessionId":"s","update":{"sessionUpdate":"available_commands_update","availableCommands":[]}}"#,
            r#"{"sessionId":"s","update":{"sessionUpdate":"something_new","x":1}}"#,
            "not json",
        ]);
        assert_eq!(
            events,
            [
                TurnEvent::ToolCall {
                    call_id: "call_1".into(),
                    tool: "bridge.execute_shell_command".into(),
                    command: "echo hi".into()
                },
                TurnEvent::ToolResult {
                    call_id: "call_1".into(),
                    exit_code: None,
                    output: "ran: echo hi".into(),
                    refused: false,
                    failed: false,
                },
                TurnEvent::ToolCall {
                    call_id: "call_2".into(),
                    tool: "bash".into(),
                    command: "echo native".into()
                },
                TurnEvent::ToolResult {
                    call_id: "call_2".into(),
                    exit_code: Some(0),
                    output: "native\n".into(),
                    refused: false,
                    failed: false,
                },
                TurnEvent::Text {
                    text: "done".into()
                },
            ]
        );
    }

    #[test]
    fn a_call_refused_by_policy_is_shown_once_as_refused() {
        let mut parser = UpdateParser::default();
        let mut events = Vec::new();
        let mut emit = |e: TurnEvent| events.push(e);
        let announced: SessionNotification = serde_json::from_str(
            r#"{"sessionId":"s","update":{"sessionUpdate":"tool_call","toolCallId":"c","title":"bash","status":"pending","rawInput":{}}}"#,
        )
        .unwrap();
        parser.update(announced.update, &mut emit);
        let request: RequestPermissionRequest = serde_json::from_str(
            r#"{"sessionId":"s","toolCall":{"toolCallId":"c","rawInput":{"command":"rm -rf x"}},"options":[]}"#,
        )
        .unwrap();
        parser.refused(&request.tool_call, "bound", &mut emit);
        // The agent's own report of the refused call's failure adds nothing.
        let failed: SessionNotification = serde_json::from_str(
            r#"{"sessionId":"s","update":{"sessionUpdate":"tool_call_update","toolCallId":"c","status":"failed","rawOutput":{"error":"The user rejected permission"}}}"#,
        )
        .unwrap();
        parser.update(failed.update, &mut emit);
        assert_eq!(
            events,
            [
                TurnEvent::ToolCall {
                    call_id: "c".into(),
                    tool: "bash".into(),
                    command: "rm -rf x".into()
                },
                TurnEvent::ToolResult {
                    call_id: "c".into(),
                    exit_code: None,
                    output: format!("{REFUSED}: bound"),
                    refused: true,
                    failed: false,
                },
            ]
        );
    }

    #[test]
    fn a_replayed_history_is_not_this_turns() {
        let mut parser = UpdateParser {
            replaying: true,
            ..UpdateParser::default()
        };
        let mut events = Vec::new();
        let n: SessionNotification = serde_json::from_str(
            r#"{"sessionId":"s","update":{"sessionUpdate":"agent_message_chunk","content":{"type":"text","text":"old"}}}"#,
        )
        .unwrap();
        parser.update(n.update, &mut |e| events.push(e));
        parser.flush(&mut |e| events.push(e));
        assert!(events.is_empty());
    }

    #[test]
    fn the_policy_allows_the_bridge_always_and_native_tools_only_in_server_mode() {
        for bound in [false, true] {
            assert_eq!(
                decide_permission(Some("bridge_execute_shell_command"), bound),
                Permission::Allow
            );
            assert_eq!(
                decide_permission(Some("mcp__bridge__diff_patch_workspace_file"), bound),
                Permission::Allow
            );
            assert!(matches!(
                decide_permission(None, bound),
                Permission::Refuse(_)
            ));
            // Only the bridge itself, not a name that merely starts like it.
            assert!(matches!(
                decide_permission(Some("bridgeway_x"), true),
                Permission::Refuse(_)
            ));
        }
        assert_eq!(decide_permission(Some("bash"), false), Permission::Allow);
        assert!(matches!(
            decide_permission(Some("bash"), true),
            Permission::Refuse(_)
        ));
    }

    #[test]
    fn the_chosen_option_is_once_never_always_and_cancelled_without_one() {
        let request: RequestPermissionRequest = serde_json::from_str(
            r#"{"sessionId":"s","toolCall":{"toolCallId":"c"},"options":[{"optionId":"always","kind":"allow_always","name":"A"},{"optionId":"once","kind":"allow_once","name":"O"},{"optionId":"reject","kind":"reject_once","name":"R"}]}"#,
        )
        .unwrap();
        assert_eq!(
            choose_option(&request, &Permission::Allow),
            json!({"outcome": "selected", "optionId": "once"})
        );
        assert_eq!(
            choose_option(&request, &Permission::Refuse("no")),
            json!({"outcome": "selected", "optionId": "reject"})
        );
        let only_always: RequestPermissionRequest = serde_json::from_str(
            r#"{"toolCall":{"toolCallId":"c"},"options":[{"optionId":"always","kind":"allow_always","name":"A"}]}"#,
        )
        .unwrap();
        assert_eq!(
            choose_option(&only_always, &Permission::Refuse("no")),
            json!({"outcome": "cancelled"})
        );
    }

    fn setup<'a>(options: &'a AcpOptions, bound: bool) -> TurnSetup<'a> {
        TurnSetup {
            model: "m-1",
            gateway_base_url: "http://127.0.0.1:4000/v1",
            bridge_command: None,
            builder: false,
            bound,
            runtime_dir: std::path::Path::new("/r"),
            guidance: "guide",
            acp: Some(options),
        }
    }

    #[test]
    fn opencodes_config_names_the_gateway_and_the_key_variable_never_a_key() {
        let options = AcpOptions {
            args: vec!["acp".into()],
            agent: AcpAgent::OpenCode,
            api: AcpApi::ChatCompletions,
        };
        let files = AcpDriver.files(&setup(&options, false)).unwrap();
        let config = files
            .iter()
            .find(|f| f.path.ends_with("opencode.json"))
            .unwrap();
        let value: Value = serde_json::from_str(&config.content).unwrap();
        assert_eq!(value["model"], json!("agentworks/m-1"));
        let provider = &value["provider"]["agentworks"];
        assert_eq!(
            provider["options"]["baseURL"],
            json!("http://127.0.0.1:4000/v1")
        );
        assert_eq!(
            provider["options"]["apiKey"],
            json!("{env:AGENTWORKS_MODEL_KEY}")
        );
        assert_eq!(value["permission"], json!("allow"));
        assert_eq!(value["autoupdate"], json!(false));
        assert_eq!(value["share"], json!("disabled"));

        // Its commands do not inherit the capability or the server's password.
        let plugin = files
            .iter()
            .find(|f| f.path.ends_with("plugin/agentworks-shell-env.js"))
            .unwrap();
        assert!(
            plugin
                .content
                .contains(r#"const hidden = ["AGENTWORKS_MODEL_KEY","OPENCODE_SERVER_PASSWORD"];"#),
            "{}",
            plugin.content
        );
        assert!(plugin.content.contains("\"shell.env\""));

        let bound = AcpDriver.files(&setup(&options, true)).unwrap();
        let value: Value = serde_json::from_str(
            &bound
                .iter()
                .find(|f| f.path.ends_with("opencode.json"))
                .unwrap()
                .content,
        )
        .unwrap();
        assert_eq!(
            value["permission"],
            json!({"*": "ask", "bridge_*": "allow"})
        );

        let launch = AcpDriver
            .launch(&setup(&options, false), "cap-9", None)
            .unwrap();
        assert_eq!(launch.args, ["acp"]);
        let env: HashMap<_, _> = launch.env.into_iter().collect();
        assert_eq!(env[MODEL_KEY_ENV], "cap-9");
        assert_eq!(env["OPENCODE_DISABLE_MODELS_FETCH"], "1");
        assert!(env["OPENCODE_SERVER_PASSWORD"].len() >= 32);

        let mut missing = setup(&options, false);
        missing.acp = None;
        assert!(AcpDriver.files(&missing).is_err());
    }
}
