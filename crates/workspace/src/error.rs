//! The errors workspaced answers with, and their one mapping to the JSON error envelope.
//!
//! Every variant has a stable `code` (what agentd and the MCP tools pass on) and the details a
//! caller needs to act: the current revision on a conflict, the receipt on an uncertain outcome.

use crate::acl::AclError;
use crate::lock::LockError;
use crate::receipts::{Receipt, ReceiptError};
use agentworks_core::guard::{GuardError, PathError};
use agentworks_core::revision::Revision;
use agentworks_daemon::ipc::envelope::{Body, error_response};
use agentworks_fs::confine::ConfineError;
use hyper::StatusCode;
use serde_json::{Map, Value, json};

#[derive(Debug, thiserror::Error)]
pub enum WorkspaceError {
    #[error("invalid request: {0}")]
    InvalidRequest(String),
    #[error("project {project:?} is not a folder under the documents root")]
    UnknownProject { project: String },
    #[error("{0}")]
    Path(#[from] PathError),
    #[error("{0}")]
    Guard(#[from] GuardError),
    #[error("{0}")]
    Confine(#[from] ConfineError),
    #[error("{path} is {size} bytes; the limit is {limit}")]
    TooLarge { path: String, size: u64, limit: u64 },
    #[error("{path} is not UTF-8 text")]
    NotText { path: String },
    #[error("{path} is at revision {current}, not {expected}; re-read it and reconcile")]
    RevisionConflict {
        path: String,
        expected: Revision,
        current: Revision,
    },
    #[error("request id {request_id:?} was already used for a different change; use a new id")]
    RequestIdReused {
        request_id: String,
        receipt_id: String,
    },
    #[error("request id {request_id:?} is still being processed; retry shortly")]
    RequestInProgress { request_id: String },
    #[error("{0}")]
    Busy(#[from] LockError),
    #[error("edit {edit_index} (0-based) matches nothing: its old_text does not occur in {path}")]
    EditNoMatch { path: String, edit_index: usize },
    #[error(
        "edit {edit_index} (0-based) is ambiguous: its old_text occurs {matches} times in {path}; add context to make it unique, or set replace_all"
    )]
    EditNotUnique {
        path: String,
        edit_index: usize,
        matches: usize,
    },
    #[error("the patch does not apply: {0}")]
    PatchRejected(#[from] agentworks_core::patch::PatchError),
    #[error("{0}")]
    AuditUnavailable(#[from] ReceiptError),
    #[error("{0}")]
    MetadataNotKept(#[from] AclError),
    #[error(
        "the outcome of request {request_id:?} is uncertain: {reason}; look it up by request id before retrying"
    )]
    Uncertain {
        request_id: String,
        reason: String,
        receipt: Box<Receipt>,
    },
    /// One file of a patch set was refused; the code and details are the inner error's, with
    /// the file's path and its place in the diff (`file_index`, 0-based) added.
    #[error("file {} of the patch set ({path}): {source}", index + 1)]
    InFile {
        index: usize,
        path: String,
        source: Box<WorkspaceError>,
    },
    /// A patch set stopped part way: some files were changed, the rest were not; `files` holds
    /// each file's receipt state.
    #[error(
        "patch set {request_id:?} stopped at file {} ({path}): {reason}; the files before it were changed and it and the files after it were not (see files)",
        index + 1
    )]
    PartiallyApplied {
        request_id: String,
        index: usize,
        path: String,
        reason: String,
        files: Vec<agentworks_contract::workspaced::PatchSetFile>,
    },
    #[error("no receipt for request id {request_id:?}")]
    ReceiptNotFound { request_id: String },
    /// An earlier change of the path is still undecided (its receipt prepared) and cannot be
    /// decided now (its folder cannot be synced); a new change would make its decision a
    /// guess, so it is refused until the earlier one can be decided.
    #[error(
        "an earlier change of {path} (request {request_id:?}, receipt {receipt_id}) is not decided yet and its folder cannot be synced to decide it; retry later"
    )]
    Undecided {
        path: String,
        request_id: String,
        receipt_id: String,
    },
    #[error("{0}")]
    CannotRestore(String),
    #[error("{operation} {path}: {source}")]
    Io {
        operation: &'static str,
        path: String,
        source: std::io::Error,
    },
}

impl WorkspaceError {
    pub fn io(
        operation: &'static str,
        path: impl std::fmt::Display,
        source: impl Into<std::io::Error>,
    ) -> Self {
        WorkspaceError::Io {
            operation,
            path: path.to_string(),
            source: source.into(),
        }
    }

    /// The stable code of the envelope.
    pub fn code(&self) -> &'static str {
        match self {
            WorkspaceError::InvalidRequest(_) => "invalid_request",
            WorkspaceError::UnknownProject { .. } => "not_found",
            WorkspaceError::Path(_) => "path_refused",
            WorkspaceError::Guard(_) => "forbidden",
            WorkspaceError::Confine(c) => match c {
                ConfineError::Symlink { .. }
                | ConfineError::Escape { .. }
                | ConfineError::HardLink { .. } => "path_refused",
                ConfineError::NotFound { .. } | ConfineError::NotADirectory { .. } => "not_found",
                ConfineError::NotAFile { .. } => "not_a_file",
                ConfineError::Io { .. } => "io_error",
            },
            WorkspaceError::TooLarge { .. } => "too_large",
            WorkspaceError::NotText { .. } => "not_text",
            WorkspaceError::RevisionConflict { .. } => "revision_conflict",
            WorkspaceError::RequestIdReused { .. } => "request_id_reused",
            WorkspaceError::RequestInProgress { .. } => "request_in_progress",
            WorkspaceError::Busy(LockError::Timeout { .. }) => "busy",
            WorkspaceError::Busy(_) => "lock_unavailable",
            WorkspaceError::EditNoMatch { .. } => "edit_no_match",
            WorkspaceError::EditNotUnique { .. } => "edit_not_unique",
            WorkspaceError::PatchRejected(_) => "patch_rejected",
            WorkspaceError::AuditUnavailable(_) => "audit_unavailable",
            WorkspaceError::MetadataNotKept(_) => "ownership_not_kept",
            WorkspaceError::Uncertain { .. } => "uncertain",
            WorkspaceError::InFile { source, .. } => source.code(),
            WorkspaceError::PartiallyApplied { .. } => "partially_applied",
            WorkspaceError::ReceiptNotFound { .. } => "not_found",
            WorkspaceError::Undecided { .. } => "earlier_change_undecided",
            WorkspaceError::CannotRestore(_) => "cannot_restore",
            WorkspaceError::Io { .. } => "io_error",
        }
    }

    pub fn status(&self) -> StatusCode {
        match self.code() {
            "invalid_request" | "path_refused" | "not_a_file" => StatusCode::BAD_REQUEST,
            "forbidden" => StatusCode::FORBIDDEN,
            "not_found" => StatusCode::NOT_FOUND,
            "too_large" => StatusCode::PAYLOAD_TOO_LARGE,
            "not_text" => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "revision_conflict"
            | "request_id_reused"
            | "request_in_progress"
            | "cannot_restore"
            | "partially_applied" => StatusCode::CONFLICT,
            "patch_rejected" | "edit_no_match" | "edit_not_unique" | "ownership_not_kept" => {
                StatusCode::UNPROCESSABLE_ENTITY
            }
            "busy" | "audit_unavailable" | "lock_unavailable" | "earlier_change_undecided" => {
                StatusCode::SERVICE_UNAVAILABLE
            }
            _ => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    fn details(&self) -> Map<String, Value> {
        let value = match self {
            WorkspaceError::InFile {
                index,
                path,
                source,
            } => {
                let mut inner = source.details();
                inner.insert("path".into(), json!(path));
                inner.insert("file_index".into(), json!(index));
                return inner;
            }
            WorkspaceError::PartiallyApplied {
                index, path, files, ..
            } => json!({
                "path": path,
                "file_index": index,
                "files": files,
            }),
            WorkspaceError::Path(e) => json!({"reason": e.reason()}),
            WorkspaceError::Guard(e) => json!({"reason": e.reason()}),
            WorkspaceError::Confine(ConfineError::Symlink { path }) => {
                json!({"reason": "symlink", "path": path})
            }
            WorkspaceError::Confine(ConfineError::Escape { path }) => {
                json!({"reason": "escape", "path": path})
            }
            WorkspaceError::Confine(ConfineError::HardLink { path, links }) => {
                json!({"reason": "hard_link", "path": path, "links": links})
            }
            WorkspaceError::TooLarge { size, limit, .. } => json!({"size": size, "limit": limit}),
            WorkspaceError::RevisionConflict {
                current, expected, ..
            } => {
                json!({"current_revision": current, "expected_revision": expected})
            }
            WorkspaceError::EditNoMatch { edit_index, .. } => {
                json!({"edit_index": edit_index, "matches": 0})
            }
            WorkspaceError::EditNotUnique {
                edit_index,
                matches,
                ..
            } => json!({"edit_index": edit_index, "matches": matches}),
            WorkspaceError::RequestIdReused { receipt_id, .. } => json!({"receipt_id": receipt_id}),
            WorkspaceError::RequestInProgress { .. } | WorkspaceError::Busy(_) => {
                json!({"retryable": true})
            }
            WorkspaceError::AuditUnavailable(_) => json!({"retryable": true}),
            WorkspaceError::Undecided {
                request_id,
                receipt_id,
                ..
            } => json!({"retryable": true, "request_id": request_id, "receipt_id": receipt_id}),
            WorkspaceError::Uncertain { receipt, .. } => json!({
                "receipt": receipt,
                "previous_revision": receipt.previous_revision,
                "resulting_revision": receipt.resulting_revision,
            }),
            _ => json!({}),
        };
        match value {
            Value::Object(map) => map,
            _ => Map::new(),
        }
    }

    pub fn to_response(&self) -> hyper::Response<Body> {
        error_response(self.status(), self.code(), self.to_string(), self.details())
    }
}
