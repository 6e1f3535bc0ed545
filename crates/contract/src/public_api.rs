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
