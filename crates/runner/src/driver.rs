//! What a coding CLI's driver gives a turn: the files generated into its runtime, its command
//! line and environment, how the upstream takes the operator's key, and how its output becomes
//! the turn's events.
//!
//! Owns: the [`CliDriver`] trait every driver implements (Codex, Claude Code, ACP agents) and
//! [`for_driver`], which picks one for a provider. The turn ([`crate::turn`]) owns everything
//! around it: the sandbox, the runtime, the gateway capability, cancel and timeout.
//!
//! Must never: hand a driver the operator's key (it sees only the turn's capability, which it
//! passes to the CLI through the environment, never a file or an argument), or let a driver
//! write outside the turn's runtime (its files are relative paths the turn writes).

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use agentworks_contract::runnerd::{TurnEvent, codes};
use serde_json::Value;

use crate::gateway::KeyHeader;
use crate::provider::Driver;

/// The MCP server name of `agentworks-mcpbridge` in every driver's generated config; the CLIs
/// report its tools' calls under it (Codex `server = "bridge"`, Claude Code `mcp__bridge__…`).
pub const BRIDGE_SERVER: &str = "bridge";

/// The most bytes of a tool's output (and of its folded command) in one event.
pub const MAX_TOOL_OUTPUT_BYTES: usize = 64 * 1024;

/// What is appended to output cut at [`MAX_TOOL_OUTPUT_BYTES`].
pub const TRUNCATED: &str = "\n[output truncated]";

/// Everything a driver may use to prepare one turn.
#[derive(Debug, Clone)]
pub struct TurnSetup<'a> {
    /// The model name sent upstream.
    pub model: &'a str,
    /// runnerd's model gateway, `http://127.0.0.1:PORT/v1`; each CLI appends its API's path.
    pub gateway_base_url: &'a str,
    /// `agentworks-mcpbridge`, when runnerd has it: the stdio MCP server named `bridge`. Its
    /// URL and capability are in the CLI's environment ([`crate::bridge::URL_ENV`],
    /// [`crate::bridge::TOKEN_ENV`]) and must be passed on to the bridge the CLI starts.
    pub bridge_command: Option<&'a str>,
    /// Builder mode (the project writable) or Run. Enforced by the sandbox, not the CLI.
    pub builder: bool,
    /// The chat is bound to a laptop folder: the CLI's native shell and file tools must be off
    /// (its hands are the bridge's tools only). A driver that cannot switch one off refuses.
    pub bound: bool,
    /// The runtime directory (the CLI's cwd and home), absolute.
    pub runtime_dir: &'a Path,
    /// The generated instructions (what AGENTS.md holds for Codex).
    pub guidance: &'a str,
    /// An ACP provider's options (its arguments, its API, how the gateway is given to it);
    /// `None` for the other drivers.
    pub acp: Option<&'a crate::acp::AcpOptions>,
}

/// A file the driver generates in the runtime: hashed into the session key, so a chat whose
/// files changed starts a new session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Generated {
    /// Relative to the runtime directory.
    pub path: PathBuf,
    pub content: String,
}

/// How the CLI is started.
#[derive(Debug, Clone, Default)]
pub struct Launch {
    /// The arguments after the executable.
    pub args: Vec<String>,
    /// Environment beyond the runtime's (`HOME`, `TMPDIR`, …), `PATH`, `LANG` and the bridge's
    /// two variables, which the turn always sets.
    pub env: Vec<(String, OsString)>,
}

/// Why a driver cannot prepare a turn: the turn is refused with this sentence.
#[derive(Debug, thiserror::Error)]
pub enum DriverError {
    /// The provider's configuration cannot work (an empty model, a bad URL).
    #[error("{0}")]
    Config(String),
    /// The chat is bound to a laptop folder and this CLI cannot switch off a native tool.
    #[error("{0}")]
    Unbindable(String),
}

/// How the CLI's output becomes events: one line of its stdout at a time.
pub trait StreamParser: Send {
    /// One stdout line: the events it makes (none for lines the driver does not understand;
    /// a line never makes the parser fail).
    fn line(&mut self, line: &str) -> Vec<TurnEvent>;
    /// The CLI exited with `exit_code`: the events that closes (a failure if its stream never
    /// ended the turn).
    fn finish(&mut self, exit_code: Option<i32>) -> Vec<TurnEvent>;
}

/// How a turn talks to its CLI.
pub enum Conversation {
    /// The prompt written to stdin, which is then closed; stdout read as lines by the parser.
    PromptOnStdin(Box<dyn StreamParser>),
    /// The Agent Client Protocol on stdin and stdout ([`crate::acp::converse`]); the prompt
    /// goes in `session/prompt`.
    Acp(crate::acp::AcpSession),
}

/// One coding CLI's dialect.
pub trait CliDriver: Send + Sync {
    /// How the upstream API takes the operator's key (the gateway adds it).
    fn upstream_auth(&self) -> KeyHeader;
    /// The files of the turn's runtime (the instructions, the CLI's config).
    fn files(&self, setup: &TurnSetup) -> Result<Vec<Generated>, DriverError>;
    /// The command line and environment: `capability` is the turn's key on the gateway;
    /// `resume` the session to continue, when the chat has one under the same session key.
    fn launch(
        &self,
        setup: &TurnSetup,
        capability: &str,
        resume: Option<&str>,
    ) -> Result<Launch, DriverError>;
    /// How the turn reads it.
    fn conversation(&self, setup: &TurnSetup, resume: Option<&str>) -> Conversation;
}

/// The driver of a provider's dialect.
pub fn for_driver(driver: Driver) -> &'static dyn CliDriver {
    match driver {
        Driver::Codex => &crate::codex::CodexDriver,
        Driver::Acp => &crate::acp::AcpDriver,
        Driver::ClaudeCode => &crate::claude::ClaudeDriver,
    }
}

/// Whether `name` can be an environment variable's name.
pub fn is_env_name(name: &str) -> bool {
    let mut chars = name.chars();
    matches!(chars.next(), Some(c) if c == '_' || c.is_ascii_alphabetic())
        && chars.all(|c| c == '_' || c.is_ascii_alphanumeric())
}

/// The CLI's own failure, as the turn's error event (`cli_failed`).
pub fn cli_failed(message: String) -> TurnEvent {
    TurnEvent::Error {
        code: codes::CLI_FAILED.to_owned(),
        message,
    }
}

/// A string field of a JSON object from a CLI's stream; empty when missing or not a string.
pub fn str_field<'v>(value: &'v Value, name: &str) -> &'v str {
    value.get(name).and_then(Value::as_str).unwrap_or("")
}

/// Folds a command to one line: every run of whitespace (newlines included) becomes one space.
pub fn one_line(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// `text` cut to at most [`MAX_TOOL_OUTPUT_BYTES`] (on a character boundary, marked).
pub fn bounded(text: &str) -> String {
    if text.len() <= MAX_TOOL_OUTPUT_BYTES {
        return text.to_owned();
    }
    let cut = text.floor_char_boundary(MAX_TOOL_OUTPUT_BYTES - TRUNCATED.len());
    let mut out = text[..cut].to_owned();
    out.push_str(TRUNCATED);
    out
}
