//! `runnerd.sock`: agentd asks runnerd to run a chat's turn with a coding CLI (a provider).
//!
//! - `GET /v1/health`: the one health answer.
//! - `GET /v1/providers`: [`ProvidersAnswer`], the configured providers and whether each one's
//!   executable was found.
//! - `POST /v1/turns` ([`TurnRequest`]): runs one turn; the answer is a stream of
//!   newline-delimited JSON [`TurnEvent`]s, the first [`TurnEvent::Started`] (with the turn's
//!   id), the last [`TurnEvent::End`] or [`TurnEvent::Error`]. Closing the stream does not stop
//!   the turn; `POST /v1/turns/{id}/cancel` does.
//! - `POST /v1/turns/{id}/cancel`: ends the turn's CLI and its whole process tree.
//! - `POST /v1/turns/{id}/bridge/{call_id}` ([`BridgeAnswer`]): agentd's answer to a
//!   [`TurnEvent::BridgeCall`] of that turn. Each call is answered once; an answer to a call
//!   that is not waiting (answered, timed out, its turn ended) is `unknown_bridge_call` (404).
//!
//! The bridge: the CLI's `agentworks-mcpbridge` forwards each call of a bridge tool to runnerd.
//! runnerd runs a server-mode `execute_shell_command` itself (a fresh sandbox of the turn's
//! mode, the project as cwd); every other call (`diff_patch_workspace_file`, and any tool
//! runnerd does not run itself) goes to agentd as a [`TurnEvent::BridgeCall`] on the turn's
//! stream, and waits for agentd's [`BridgeAnswer`] ([`BRIDGE_ANSWER_TIMEOUT_SECS`] at most; the
//! turn's cancel or end ends the wait). agentd executes it with the person's live authority,
//! exactly as the model loop's tool of that name, and makes its own request ids.
//!
//! Besides its two built-in tools, the bridge offers the turn's [`TurnRequest::tools`]: in a
//! server-mode chat of an authoring role, the project's MCP connections' tools, exactly as the
//! model loop is offered them that turn. runnerd only lists them to the bridge (which fetches
//! its tool list from runnerd's bridge endpoint when it starts) and hands their calls to agentd
//! as [`TurnEvent::BridgeCall`]s; agentd runs them through its one tool executor, which checks
//! the turn and the person's role again at every call.
//!
//! runnerd trusts the request only because its socket peer passed the `SO_PEERCRED` check
//! (agentd, or root), and re-checks what it can itself: the project's folder, the mode.

use agentworks_core::guard::Guard;
use serde::{Deserialize, Serialize};

/// The most bytes of a turn request's body (the prompt is most of it).
pub const MAX_TURN_REQUEST_BYTES: usize = 1024 * 1024;

/// How long runnerd waits for agentd's [`BridgeAnswer`] to a [`TurnEvent::BridgeCall`] before
/// the CLI's call fails with a tool error saying so.
pub const BRIDGE_ANSWER_TIMEOUT_SECS: u64 = 120;

/// What a CLI may do to the project in a chat, chosen when the chat starts and never promoted.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Mode {
    /// The project is read-only.
    #[default]
    Run,
    /// The project is writable within the resolved write grants (blocked, read-only and
    /// protected paths excluded); only for authoring roles.
    Builder,
}

impl Mode {
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Run => "run",
            Mode::Builder => "builder",
        }
    }
}

/// `GET /v1/providers`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProvidersAnswer {
    pub providers: Vec<ProviderInfo>,
    /// Why CLIs run without the bridge tools (`agentworks-mcpbridge` was not found when runnerd
    /// started), when they do.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bridge_unavailable: Option<String>,
}

/// One configured provider, as agentd and `agentworksctl status` see it (never its key).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProviderInfo {
    pub name: String,
    /// The dialect runnerd drives it with: `codex`.
    pub driver: String,
    pub model: String,
    /// The executable runnerd found at start, when it found one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub executable: Option<String>,
    /// Why the provider cannot run (its executable is missing), when it cannot.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unavailable: Option<String>,
}

/// `POST /v1/turns`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TurnRequest {
    pub chat_id: String,
    pub user_id: String,
    /// The project's folder name under the documents root.
    pub project: String,
    pub provider: String,
    pub mode: Mode,
    /// The guard agentd resolved for this person on this project (Builder's write grants).
    pub guard: Guard,
    /// What the person wrote.
    pub prompt: String,
    /// The CLI's session (Codex's thread) recorded by an earlier turn of this chat, with the
    /// session key it was recorded under: resumed only under the same key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resume: Option<Resume>,
    /// The tools the turn's bridge offers besides its built-in `execute_shell_command` and
    /// `diff_patch_workspace_file`: for a server-mode chat, the project's MCP connections' tools
    /// the person may use this turn (authoring roles only; none otherwise). Never the server
    /// file tools (the CLI reads the project natively and patches through the bridge). Their
    /// calls come back to agentd as [`TurnEvent::BridgeCall`]s. Empty when absent.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tools: Vec<BridgeTool>,
    /// The chat is bound to a folder on the person's laptop: the turn's runtime gets no
    /// `project` link and its sandbox no project access at all, the CLI's native shell and
    /// file tools are switched off (a CLI that cannot is refused), and both bridge tools go to
    /// agentd ([`TurnEvent::BridgeCall`]), which sends them to the laptop through gatewayd.
    /// `project` and `guard` then only name the runtime; `tools` must be empty.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub laptop: Option<LaptopFolder>,
}

/// The laptop folder a bound turn's bridge tools work in, as agentd saw it at the turn's start.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LaptopFolder {
    /// The device shares the folder writable: the patch tool is offered. agentd checks again
    /// at every call.
    pub writable: bool,
}

/// One extra tool of a turn's bridge, as MCP's `tools/list` describes a tool.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BridgeTool {
    /// The name the CLI's model calls it by (unique in the turn; never a built-in's).
    pub name: String,
    pub description: String,
    /// The JSON schema of its arguments (an object schema).
    pub input_schema: serde_json::Value,
}

/// A CLI session to continue.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Resume {
    pub session_id: String,
    pub session_key: String,
}

/// One line of a turn's stream.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum TurnEvent {
    /// The turn runs: its id (for cancel) and the session key of its runtime.
    Started {
        turn_id: String,
        session_key: String,
    },
    /// The CLI's session, to resume in the chat's next turn (with the started key).
    Session { session_id: String },
    /// Text the CLI's model answered.
    Text { text: String },
    /// One of the CLI's own tool calls began (`command` is what it runs, folded to one line).
    ToolCall {
        call_id: String,
        tool: String,
        command: String,
    },
    /// It ended.
    ToolResult {
        call_id: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        exit_code: Option<i32>,
        /// Its output, bounded.
        output: String,
        /// runnerd's policy refused the call (an ACP agent's permission request): it never
        /// ran, and `output` says why.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        refused: bool,
        /// The CLI reported the call failed (a tool error: a tool it does not have, an MCP
        /// error) with no exit code to say so; `output` says what it told the model.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        failed: bool,
    },
    /// The CLI called a bridge tool that agentd executes (`diff_patch_workspace_file`, or any
    /// tool runnerd does not run itself): agentd runs it as the model loop's tool of that name,
    /// with the person's live authority, and posts its [`BridgeAnswer`] to
    /// `POST /v1/turns/{turn_id}/bridge/{call_id}`. `call_id` is runnerd's, unique per turn;
    /// `arguments` are the CLI's, unchecked (agentd validates them as it does the model's).
    BridgeCall {
        call_id: String,
        tool: String,
        arguments: serde_json::Value,
    },
    /// Tokens the upstream counted for this turn's model requests so far.
    Usage {
        input_tokens: u64,
        output_tokens: u64,
    },
    /// The turn ended normally.
    End {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        exit_code: Option<i32>,
    },
    /// The turn failed: a stable code and a sentence a person can act on.
    Error { code: String, message: String },
}

/// `POST /v1/turns/{turn_id}/bridge/{call_id}`: agentd's answer to a bridge call. `ok: true`
/// with the tool's `result` (a string is shown to the CLI's model as it is, anything else as
/// JSON), or `ok: false` with the `error` the CLI's model sees as a tool error.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BridgeAnswer {
    pub ok: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result: Option<serde_json::Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<BridgeError>,
}

/// Why a bridge call failed: a stable code and a sentence (agentd's tool error).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BridgeError {
    pub code: String,
    pub message: String,
}

/// The most bytes of a [`BridgeAnswer`]'s body.
pub const MAX_BRIDGE_ANSWER_BYTES: usize = 4 * 1024 * 1024;

/// The stable codes of [`TurnEvent::Error`].
pub mod codes {
    /// No provider of that name is configured.
    pub const UNKNOWN_PROVIDER: &str = "unknown_provider";
    /// The provider's executable was not found.
    pub const PROVIDER_UNAVAILABLE: &str = "provider_unavailable";
    /// The CLI could not be started, or exited before the turn ended.
    pub const CLI_FAILED: &str = "cli_failed";
    /// The upstream refused the operator's key.
    pub const UPSTREAM_REFUSED: &str = "upstream_refused";
    /// The runtime's `project` is something else than runnerd's link.
    pub const RUNTIME_OCCUPIED: &str = "runtime_occupied";
    /// The project's folder is missing, or was replaced.
    pub const PROJECT_UNAVAILABLE: &str = "project_unavailable";
    /// The turn ran longer than `[runnerd] turn_timeout`.
    pub const TIMEOUT: &str = "turn_timeout";
    /// The turn was cancelled.
    pub const CANCELLED: &str = "cancelled";
    /// The sandbox is not available on this machine.
    pub const SANDBOX_UNAVAILABLE: &str = "sandbox_unavailable";
    /// Anything else runnerd could not do.
    pub const INTERNAL: &str = "internal";
}
