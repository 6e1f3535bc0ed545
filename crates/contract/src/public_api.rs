//! agentd's public API beside MCP: the device login (RFC 8628 device authorization grant) and
//! the chat API the laptop CLI and the console call.

use serde::{Deserialize, Serialize};

/// The sentence a client must send as `confirm` to bind a chat to a laptop folder.
pub const CONFIRMATION: &str = "I understand file contents and command output go to the server and the model, and commands can reach the network";

/// Where a `devices:connect` token asks whose account it serves (`GET`, the token as bearer).
pub const DEVICE_ACCOUNT_PATH: &str = "/v1/device/account";

/// The answer to `GET /v1/device/account`: the account a `devices:connect` token belongs to,
/// i.e. the one that approved the login that minted it. `agentworks login` shows it (and asks
/// on a terminal) before it keeps the token: a code approved by someone else's account would
/// otherwise make this laptop serve that account's agent without the person knowing.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceAccount {
    pub account: String,
}

/// The answer to `POST /v1/device/code` (RFC 8628 §3.2).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceCode {
    pub device_code: String,
    pub user_code: String,
    pub verification_uri: String,
    /// Optional in RFC 8628; agentd always sends it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub verification_uri_complete: Option<String>,
    pub expires_in: u64,
    pub interval: u64,
}

/// The agent of a chat that the built-in model loop answers (the default). Any other agent is
/// the name of a provider runnerd runs (a coding CLI).
pub const API_AGENT: &str = "api";

/// `GET /v1/agents`: the agents a person may pick when starting a chat.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AgentsAnswer {
    /// `api` first, then runnerd's providers (none when runnerd is not running).
    pub agents: Vec<AgentOption>,
    /// Whether runnerd answered, and why not when it did not.
    pub runnerd: RunnerdState,
}

/// One agent a chat may have.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AgentOption {
    /// What `POST /v1/chats` takes as `agent`.
    pub name: String,
    /// `api` (the model loop) or `cli` (a coding CLI runnerd runs).
    pub kind: String,
    /// The CLI dialect (`codex`), for a `cli` agent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub driver: Option<String>,
    /// The model it uses, when one is configured.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// Whether a turn can run now; a chat of an unavailable CLI agent cannot be started.
    pub available: bool,
    /// Why it is not available, when it is not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unavailable: Option<String>,
    /// The modes a chat of this agent may have (`builder` only for a CLI agent; the person's
    /// role decides whether they may start one).
    pub modes: Vec<String>,
}

/// runnerd as agentd saw it when answering.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunnerdState {
    pub running: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}
