//! The request and response bodies of workspaced's socket API (`/v1/...`), shared with its
//! callers (agentd, agentworksctl, tests).
//!
//! Every request carries a [`Context`]: which project, who is asking, and the guard agentd
//! resolved for them. workspaced trusts the context only because its socket peer passed the
//! `SO_PEERCRED` check, and re-applies the guard itself.

use agentworks_core::guard::Guard;
use agentworks_core::revision::Revision;
use serde::{Deserialize, Serialize};

/// Who asks, as authenticated by the calling daemon.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Principal {
    pub user_id: String,
    pub user_name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub connection_id: Option<String>,
    /// Where the request came from: `mcp`, `agent`, `ctl`, `test` …
    pub source: String,
}

/// The part every request shares.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Context {
    /// The project's folder name under the documents root.
    pub project: String,
    pub principal: Principal,
    pub guard: Guard,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReadRequest {
    pub context: Context,
    pub path: String,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct ReadResponse {
    pub path: String,
    pub content: String,
    pub revision: Revision,
    pub size: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ListRequest {
    pub context: Context,
    #[serde(default)]
    pub path: String,
    #[serde(default)]
    pub recursive: bool,
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum EntryKind {
    File,
    Dir,
    Other,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct ListEntry {
    pub path: String,
    pub kind: EntryKind,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub size: Option<u64>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct ListResponse {
    pub entries: Vec<ListEntry>,
    pub truncated: bool,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SearchRequest {
    pub context: Context,
    pub query: String,
    #[serde(default)]
    pub path: String,
    #[serde(default)]
    pub max_results: Option<usize>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct SearchMatch {
    pub path: String,
    pub line: u64,
    pub text: String,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct SearchResponse {
    pub matches: Vec<SearchMatch>,
    pub truncated: bool,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WriteRequest {
    pub context: Context,
    pub path: String,
    pub content: String,
    pub expected_revision: String,
    pub request_id: String,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PatchRequest {
    pub context: Context,
    pub path: String,
    pub diff: String,
    pub expected_revision: String,
    pub request_id: String,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MoveRequest {
    pub context: Context,
    pub path: String,
    pub to_path: String,
    pub expected_revision: String,
    pub request_id: String,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeleteRequest {
    pub context: Context,
    pub path: String,
    pub expected_revision: String,
    pub request_id: String,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RestoreRequest {
    pub context: Context,
    /// The receipt whose before-content is restored.
    pub receipt_id: String,
    /// The revision the file holds now (`missing` if it was deleted since).
    pub expected_revision: String,
    pub request_id: String,
}

/// The answer to every change (write, patch, move, delete, restore).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct ChangeResponse {
    pub state: ReceiptState,
    /// True when this answer is the recorded outcome of an earlier request with the same id.
    pub replayed: bool,
    pub previous_revision: Revision,
    pub revision: Revision,
    pub receipt: Receipt,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReceiptRequest {
    pub context: Context,
    pub request_id: String,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HistoryRequest {
    pub context: Context,
    #[serde(default)]
    pub path: Option<String>,
    #[serde(default)]
    pub limit: Option<usize>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct HistoryEntry {
    pub receipt: Receipt,
    /// The file before the change (UTF-8, possibly truncated at 128 KiB), absent for a create.
    pub before_content: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct HistoryResponse {
    pub entries: Vec<HistoryEntry>,
}

pub use crate::envelope::Health;

/// Create a project's folder under the documents root if it does not exist (operators add
/// projects through agentd, which never touches the documents tree itself).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EnsureProjectRequest {
    pub project: String,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct EnsureProjectResponse {
    pub project: String,
    pub created: bool,
}

// ----- receipts, as workspaced records and answers them -----

/// Where a receipt stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ReceiptState {
    /// Recorded before the change; the outcome is not yet known.
    Prepared,
    /// The change is on disk.
    Applied,
    /// The change never reached the disk.
    NotApplied,
    /// The file holds neither the previous nor the resulting revision: someone else changed it.
    Uncertain,
}

impl ReceiptState {
    pub fn as_str(self) -> &'static str {
        match self {
            ReceiptState::Prepared => "prepared",
            ReceiptState::Applied => "applied",
            ReceiptState::NotApplied => "not_applied",
            ReceiptState::Uncertain => "uncertain",
        }
    }

    pub fn parse(raw: &str) -> ReceiptState {
        match raw {
            "applied" => ReceiptState::Applied,
            "not_applied" => ReceiptState::NotApplied,
            "uncertain" => ReceiptState::Uncertain,
            // Anything unexpected is treated as unresolved and gets reconciled.
            _ => ReceiptState::Prepared,
        }
    }
}

/// The kind of managed change a receipt records.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Operation {
    Write,
    Patch,
    Move,
    Delete,
    Restore,
}

impl Operation {
    pub fn as_str(self) -> &'static str {
        match self {
            Operation::Write => "write",
            Operation::Patch => "patch",
            Operation::Move => "move",
            Operation::Delete => "delete",
            Operation::Restore => "restore",
        }
    }

    pub fn parse(raw: &str) -> Operation {
        match raw {
            "patch" => Operation::Patch,
            "move" => Operation::Move,
            "delete" => Operation::Delete,
            "restore" => Operation::Restore,
            _ => Operation::Write,
        }
    }
}

/// One durable receipt.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Receipt {
    pub receipt_id: String,
    pub request_id: String,
    pub operation: Operation,
    pub project: String,
    pub path: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub to_path: Option<String>,
    pub user_id: String,
    pub user_name: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub connection_id: Option<String>,
    pub source: String,
    pub previous_revision: Revision,
    pub resulting_revision: Revision,
    pub state: ReceiptState,
    pub created_at_ms: i64,
    pub updated_at_ms: i64,
    /// Hash of the request payload, to tell a retry from a reused id.
    #[serde(skip)]
    pub payload_hash: String,
    /// Up to `BEFORE_CONTENT_CAP` (workspaced's receipts) bytes of the file before the change (absent for a create).
    #[serde(skip)]
    pub before_content: Option<Vec<u8>>,
    pub before_truncated: bool,
}
