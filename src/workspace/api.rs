//! The request and response bodies of workspaced's socket API (`/v1/...`), shared with its
//! callers (agentd, agentworksctl, tests).
//!
//! Every request carries a [`Context`]: which project, who is asking, and the guard agentd
//! resolved for them. workspaced trusts the context only because its socket peer passed the
//! `SO_PEERCRED` check, and re-applies the guard itself.

use crate::guard::Guard;
use crate::workspace::receipts::{Receipt, ReceiptState};
use crate::workspace::revision::Revision;
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

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Health {
    pub status: String,
    pub daemon: String,
    pub version: String,
}

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
