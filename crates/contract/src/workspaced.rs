//! The request and response bodies of workspaced's socket API (`/v1/...`), shared with its
//! callers (agentd, agentworksctl, tests).
//!
//! Every request carries a [`Context`]: which project, who is asking, and the guard agentd
//! resolved for them. workspaced trusts the context only because its socket peer passed the
//! `SO_PEERCRED` check, and re-applies the guard itself.
//!
//! Reads: `/v1/read` ([`ReadRequest`], a line range optional), `/v1/stat`
//! ([`StatRequest`]), `/v1/list` ([`ListRequest`]: depth, exclude, max_entries),
//! `/v1/search`, `/v1/history`, `/v1/receipt`. Changes (each with `expected_revision` and
//! `request_id`, answered with a [`ChangeResponse`]): `/v1/write`, `/v1/patch`, `/v1/edit`
//! ([`EditRequest`], answered with an [`EditAnswer`]), `/v1/move`, `/v1/delete`,
//! `/v1/restore`; `/v1/patch_set` ([`PatchSetRequest`], a multi-file diff, answered with a
//! [`PatchSetResponse`]) has one receipt per file under its one request id, and `/v1/receipt`
//! answers a [`ReceiptAnswer`] listing them. Positions are 0-based where a caller gives them (edit indexes, read
//! offsets); search numbers lines from 1, as editors show them.

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

/// `/v1/read`: a file, or a range of its lines. A body with only `context` and `path` reads
/// the whole file.
///
/// A line ends after its `\n` (a last line without one counts too; an empty file has none).
/// `offset` is 0-based, the number of lines skipped (as edit indexes are 0-based; a search
/// hit on line `n`, which search numbers from 1, is `offset: n - 1`); `limit` (at least 1) is
/// the most lines answered, to the end of the file without it. Either one makes the read
/// ranged; an offset past the end answers no content, not an error.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReadRequest {
    pub context: Context,
    pub path: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub offset: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit: Option<u64>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct ReadResponse {
    pub path: String,
    /// The whole file, or only the requested lines (with their line endings) of a ranged read.
    pub content: String,
    /// The whole file's revision, ranged or not.
    pub revision: Revision,
    /// The whole file's size in bytes.
    pub size: u64,
    /// Lines in the whole file (see [`ReadRequest`]).
    #[serde(default)]
    pub total_lines: u64,
    /// A ranged read's offset, echoed (0 when only `limit` was given).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub offset: Option<u64>,
    /// A ranged read's limit, echoed (absent: to the end).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit: Option<u64>,
}

/// `/v1/list`: the entries below `path`, with optional bounds. A body with only `context`,
/// `path` and `recursive` lists as it always did.
///
/// `depth` counts levels below `path` (1 = its direct children) and wins over `recursive`;
/// without it `recursive: true` is unlimited (to the walk's 64 levels) and `false` is 1.
/// `exclude` leaves out (and does not descend into) matching entries: a pattern without `/`
/// matches any path component (`node_modules`, `*.log`), one with `/` the path relative to
/// `path` (`src/gen`, `docs/**/*.tmp`, `/build`); `*` and `?` stay within a component, `**`
/// is any number of components; at most 64 patterns of 256 bytes. `max_entries` bounds the
/// answer (clamped to 1..=10 000, the default); `truncated` says more entries exist.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ListRequest {
    pub context: Context,
    #[serde(default)]
    pub path: String,
    #[serde(default)]
    pub recursive: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub depth: Option<usize>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub exclude: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_entries: Option<usize>,
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

/// `/v1/stat`: what one path is, under the same guard and confinement as a read (a hidden or
/// refused path is refused as a read refuses it; a missing one is `not_found`).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StatRequest {
    pub context: Context,
    pub path: String,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct StatResponse {
    pub path: String,
    pub kind: EntryKind,
    /// Bytes, for a file only.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub size: Option<u64>,
    /// The whole file's revision (the `expected_revision` of a change), for a file only.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub revision: Option<Revision>,
    /// Last modification, milliseconds since the Unix epoch.
    pub modified_ms: i64,
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

/// One exact replacement of an [`EditRequest`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TextEdit {
    /// The text to find, byte for byte (no whitespace or line-ending normalising). Never empty.
    pub old_text: String,
    pub new_text: String,
    /// Replace every occurrence (at least one) instead of exactly one.
    #[serde(default)]
    pub replace_all: bool,
}

/// `/v1/edit`: exact-text replacements applied in order, each to the result of the previous.
///
/// Each `old_text` must occur exactly once (counting overlapping occurrences) unless
/// `replace_all`, then at least once; otherwise the edit is refused with `edit_no_match` or
/// `edit_not_unique`, details `edit_index` (0-based, the edit's place in `edits`) and `matches`.
/// The idempotency payload is path + edits + expected revision, not `dry_run`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EditRequest {
    pub context: Context,
    pub path: String,
    pub edits: Vec<TextEdit>,
    pub expected_revision: String,
    /// Required; a dry run neither looks it up nor records it.
    pub request_id: String,
    /// Check and compute only: no write, no receipt; the answer is an [`EditPreview`].
    #[serde(default)]
    pub dry_run: bool,
}

/// The answer to an applied (or replayed) edit: the usual change answer plus the diff.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct EditResponse {
    #[serde(flatten)]
    pub change: ChangeResponse,
    /// Unified diff (`--- a/<path>` / `+++ b/<path>`) of the file before → after. `null` only on
    /// a replay whose receipt kept no complete before-content (files over 128 KiB).
    pub diff: Option<String>,
}

/// The answer to a dry-run edit: what the edit would do, nothing written or recorded.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct EditPreview {
    /// Always true: tells a preview from an [`EditResponse`].
    pub dry_run: bool,
    pub diff: String,
    pub previous_revision: Revision,
    /// The revision the edit would produce.
    pub revision: Revision,
}

/// What `/v1/edit` answers: an [`EditResponse`], or an [`EditPreview`] for `dry_run: true`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(untagged)]
pub enum EditAnswer {
    Applied(Box<EditResponse>),
    Preview(EditPreview),
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

/// The answer to every change (write, patch, move, delete, restore; edit holds it in
/// [`EditResponse`]).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct ChangeResponse {
    pub state: ReceiptState,
    /// True when this answer is the recorded outcome of an earlier request with the same id.
    pub replayed: bool,
    pub previous_revision: Revision,
    pub revision: Revision,
    pub receipt: Receipt,
}

/// `/v1/patch_set`: a multi-file unified diff (create, modify, delete) under one request id.
///
/// Every file needs a `--- `/`+++ ` header pair (`a/`/`b/` prefixes are removed); `--- /dev/null`
/// creates a file (it must not exist), `+++ /dev/null` deletes one (its hunks must remove every
/// line), the same path on both sides modifies it. Renames, quoted paths and a path named twice
/// are refused. The whole set is checked (guard, confinement, hunks, revisions, sizes) before
/// any file changes; any failure changes nothing and names the file.
///
/// `expected_revisions` maps paths (as the diff names them) to revisions. The rule: a modified
/// file needs its entry (its hunks check only the lines they touch, so without the revision a
/// change elsewhere in the file since it was read would be silently kept under a stale diff);
/// a deleted file may omit it (its hunks must remove every line, so the diff itself states the
/// whole content being deleted); a created file may omit it or give `missing`. An entry naming
/// a path the diff does not change is refused.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PatchSetRequest {
    pub context: Context,
    pub diff: String,
    pub request_id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expected_revisions: Option<std::collections::BTreeMap<String, String>>,
}

/// What a patch set does to one file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FileAction {
    Created,
    Modified,
    Deleted,
}

impl FileAction {
    /// Read from a receipt's revisions (a patch set never leaves a file unchanged).
    pub fn of(previous: &Revision, resulting: &Revision) -> FileAction {
        match (previous, resulting) {
            (Revision::Missing, _) => FileAction::Created,
            (_, Revision::Missing) => FileAction::Deleted,
            _ => FileAction::Modified,
        }
    }
}

/// One file of a [`PatchSetResponse`], in the diff's order.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct PatchSetFile {
    pub path: String,
    pub action: FileAction,
    /// This file's receipt state.
    pub state: ReceiptState,
    pub previous_revision: Revision,
    /// The revision the file has after the change; `null` for a deleted file.
    pub revision: Option<Revision>,
    /// Lines the diff adds to and removes from this file.
    pub added_lines: usize,
    pub removed_lines: usize,
    pub receipt: Receipt,
}

/// The answer to a patch set (applied, or replayed from its receipts).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct PatchSetResponse {
    /// The set's state: `applied` or `not_applied` only when every file is, else `uncertain`.
    pub state: ReceiptState,
    /// True when this answer is the recorded outcome of an earlier request with the same id.
    pub replayed: bool,
    pub request_id: String,
    pub files: Vec<PatchSetFile>,
}

/// The state of a set of files: `applied` / `not_applied` only when all agree, `prepared` while
/// any is undecided, else `uncertain`.
pub fn set_state(states: impl IntoIterator<Item = ReceiptState>) -> ReceiptState {
    let mut all = states.into_iter().peekable();
    let Some(first) = all.peek().copied() else {
        return ReceiptState::Uncertain;
    };
    let mut result = first;
    for state in all {
        if state == ReceiptState::Prepared {
            return ReceiptState::Prepared;
        }
        if state != result {
            result = ReceiptState::Uncertain;
        }
    }
    result
}

/// `/v1/receipt`'s answer: the receipt as it always was, plus, for a patch set, every file's.
///
/// For a patch set the top-level receipt is the first file's, except that its `state` is the
/// set's ([`set_state`]), so a caller that reads only the top level never sees `applied` for a
/// set of which a file is not applied; `files` holds each file's own receipt, in the diff's
/// order (each with its `part`).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct ReceiptAnswer {
    #[serde(flatten)]
    pub receipt: Receipt,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub files: Option<Vec<Receipt>>,
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
    Edit,
    /// One file of a `/v1/patch_set` (the receipt's `part` says which).
    PatchSet,
}

impl Operation {
    pub fn as_str(self) -> &'static str {
        match self {
            Operation::Write => "write",
            Operation::Patch => "patch",
            Operation::Move => "move",
            Operation::Delete => "delete",
            Operation::Restore => "restore",
            Operation::Edit => "edit",
            Operation::PatchSet => "patch_set",
        }
    }

    pub fn parse(raw: &str) -> Operation {
        match raw {
            "patch" => Operation::Patch,
            "move" => Operation::Move,
            "delete" => Operation::Delete,
            "restore" => Operation::Restore,
            "edit" => Operation::Edit,
            "patch_set" => Operation::PatchSet,
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
    /// Which file of a patch set this receipt is; absent for every other change.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub part: Option<ReceiptPart>,
}

/// A receipt's place in a patch set: file `index` (0-based, the diff's order) of `count`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReceiptPart {
    pub index: u32,
    pub count: u32,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_operation_round_trips_through_its_name() {
        for op in [
            Operation::Write,
            Operation::Patch,
            Operation::Move,
            Operation::Delete,
            Operation::Restore,
            Operation::Edit,
            Operation::PatchSet,
        ] {
            assert_eq!(Operation::parse(op.as_str()), op);
            let json = serde_json::to_value(op).unwrap();
            assert_eq!(json, op.as_str());
        }
    }

    fn context() -> serde_json::Value {
        serde_json::json!({"project": "p", "principal": {"user_id": "u", "user_name": "u", "source": "test"}, "guard": {}})
    }

    #[test]
    fn an_edit_request_defaults_replace_all_and_dry_run() {
        let req: EditRequest = serde_json::from_value(serde_json::json!({
            "context": context(), "path": "a.txt", "expected_revision": "missing",
            "request_id": "r", "edits": [{"old_text": "a", "new_text": "b"}],
        }))
        .unwrap();
        assert!(!req.dry_run && !req.edits[0].replace_all);
        // Unknown fields in an edit are refused, not ignored.
        assert!(
            serde_json::from_value::<EditRequest>(serde_json::json!({
                "context": context(), "path": "a.txt", "expected_revision": "missing",
                "request_id": "r", "edits": [{"old_text": "a", "new_text": "b", "fuzzy": true}],
            }))
            .is_err()
        );
    }

    #[test]
    fn an_edit_answer_is_told_apart_by_its_shape() {
        let preview = EditAnswer::Preview(EditPreview {
            dry_run: true,
            diff: "d".into(),
            previous_revision: Revision::Missing,
            revision: Revision::Missing,
        });
        let json = serde_json::to_value(&preview).unwrap();
        assert_eq!(json["dry_run"], true);
        assert_eq!(serde_json::from_value::<EditAnswer>(json).unwrap(), preview);
    }

    #[test]
    fn a_set_is_applied_or_not_applied_only_when_every_file_is() {
        use ReceiptState::*;
        assert_eq!(set_state([Applied, Applied]), Applied);
        assert_eq!(set_state([NotApplied, NotApplied]), NotApplied);
        assert_eq!(set_state([Applied, NotApplied]), Uncertain);
        assert_eq!(set_state([Applied, Prepared, NotApplied]), Prepared);
        assert_eq!(set_state([Uncertain, Applied]), Uncertain);
        assert_eq!(set_state([]), Uncertain);
    }
}
