//! The catalog's table: each [`Operation`]'s name, scopes, input schema, description and
//! annotations; the two meta tools (`get_api_spec`, `call_tool`); the effective catalog for a
//! caller (the backend's allowed operations ∩ the token's scopes); and argument validation
//! against the small JSON Schema subset our schemas use.
//!
//! Pure: no I/O, no backend calls. Must never widen access: an operation is effective only when
//! both the backend allows it and the token carries one of its scopes.

use serde_json::{Map, Value, json};

use crate::mcp::{Caller, ToolError};

/// One catalog operation. Each is also listed as an MCP tool of the same name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Operation {
    /// `list_workflows`: the workflows this token may see.
    ListWorkflows,
    /// `list_files`: `workflow_id`, `path?`, `depth?`, `exclude?`, `max_entries?`; entries with
    /// kind and size, and whether the answer was truncated.
    ListFiles,
    /// `read_file`: `workflow_id`, `path`, `offset?`, `limit?` (lines); returns `content`,
    /// `revision` and `total_lines`.
    ReadFile,
    /// `read_files`: `workflow_id`, `paths` (at most [`READ_FILES_MAX_PATHS`]); one result or
    /// error per path.
    ReadFiles,
    /// `get_file_info`: `workflow_id`, `path`; kind, size, revision, modification time.
    GetFileInfo,
    /// `search_files`: `workflow_id`, `query`, `path?`.
    SearchFiles,
    /// `write_file`: `workflow_id`, `path`, `content`, `expected_revision`, `request_id`.
    WriteFile,
    /// `edit_file`: `workflow_id`, `path`, `edits`, `expected_revision`, `request_id`,
    /// `dry_run?`; answers the unified diff and the (would-be) revision.
    EditFile,
    /// `move_file`: `workflow_id`, `path`, `to_path`, `expected_revision`, `request_id`.
    MoveFile,
    /// `delete_file`: `workflow_id`, `path`, `expected_revision`, `request_id`.
    DeleteFile,
    /// `apply_patch`: `workflow_id`, `diff` (multi-file unified), `request_id`,
    /// `expected_revisions?`; one receipt per file under the request id.
    ApplyPatch,
    /// `get_write_receipt`: `workflow_id`, `request_id`.
    GetWriteReceipt,
}

/// Scopes that let a token use the endpoint at all (reads need any one of them).
pub const WORKFLOW_SCOPES: [&str; 3] = ["workflows:read", "workflows:run", "workflows:write"];

const WRITE_SCOPES: [&str; 1] = ["workflows:write"];

/// The most paths one `read_files` call reads (each answer holds up to a whole file).
pub const READ_FILES_MAX_PATHS: usize = 20;
/// The most edits one `edit_file` call applies.
pub const EDIT_FILE_MAX_EDITS: usize = 100;
/// The most `exclude` patterns of a `list_files` call (workspaced's own bound).
pub const LIST_FILES_MAX_EXCLUDES: usize = 64;
/// The deepest `depth` of a `list_files` call (workspaced's walk stops at 64 levels).
pub const LIST_FILES_MAX_DEPTH: u64 = 64;
/// The most files one `apply_patch` diff changes (workspaced's own bound).
pub const PATCH_MAX_FILES: usize = 64;
/// The largest `max_entries` of a `list_files` call (workspaced's default and bound).
pub const LIST_FILES_MAX_ENTRIES: u64 = 10_000;

/// The meta tool returning the effective catalog.
pub(super) const GET_API_SPEC: &str = "get_api_spec";
/// The meta tool dispatching `{name, arguments}` to an operation.
pub(super) const CALL_TOOL: &str = "call_tool";

/// What a tool does to the workflow's files, for its annotations.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Effect {
    /// Reads only.
    Read,
    /// Changes or removes existing content (a write replaces, an edit rewrites, a move
    /// removes the source, a delete removes).
    Destructive,
}

impl Operation {
    /// Every operation, in catalog order.
    pub const ALL: [Operation; 12] = [
        Operation::ListWorkflows,
        Operation::ListFiles,
        Operation::ReadFile,
        Operation::ReadFiles,
        Operation::GetFileInfo,
        Operation::SearchFiles,
        Operation::WriteFile,
        Operation::EditFile,
        Operation::MoveFile,
        Operation::DeleteFile,
        Operation::ApplyPatch,
        Operation::GetWriteReceipt,
    ];

    /// The tool name, e.g. `read_file`.
    pub fn name(self) -> &'static str {
        match self {
            Operation::ListWorkflows => "list_workflows",
            Operation::ListFiles => "list_files",
            Operation::ReadFile => "read_file",
            Operation::ReadFiles => "read_files",
            Operation::GetFileInfo => "get_file_info",
            Operation::SearchFiles => "search_files",
            Operation::WriteFile => "write_file",
            Operation::EditFile => "edit_file",
            Operation::MoveFile => "move_file",
            Operation::DeleteFile => "delete_file",
            Operation::ApplyPatch => "apply_patch",
            Operation::GetWriteReceipt => "get_write_receipt",
        }
    }

    /// The operation with this tool name.
    pub fn from_name(name: &str) -> Option<Operation> {
        Operation::ALL.into_iter().find(|op| op.name() == name)
    }

    /// Whether the operation changes files (and so needs an author role, `workflows:write`,
    /// an `expected_revision` and a `request_id`).
    pub fn is_change(self) -> bool {
        matches!(
            self,
            Operation::WriteFile
                | Operation::EditFile
                | Operation::MoveFile
                | Operation::DeleteFile
                | Operation::ApplyPatch
        )
    }

    /// Scopes of which any one suffices. The first is the one named in an
    /// `insufficient_scope` challenge (the least a client should ask for).
    pub fn scopes(self) -> &'static [&'static str] {
        if self.is_change() || self == Operation::GetWriteReceipt {
            &WRITE_SCOPES
        } else {
            &WORKFLOW_SCOPES
        }
    }

    /// [`Operation::input_schema`], built once: every call validates its arguments against
    /// it, and building it took about a twentieth of agentd's time per `write_file`.
    pub fn cached_input_schema(self) -> &'static Value {
        static SCHEMAS: std::sync::LazyLock<Vec<Value>> = std::sync::LazyLock::new(|| {
            Operation::ALL
                .into_iter()
                .map(Operation::input_schema)
                .collect()
        });
        let index = Operation::ALL
            .iter()
            .position(|op| *op == self)
            .unwrap_or_default();
        &SCHEMAS[index]
    }

    /// JSON Schema of the arguments: an object with `additionalProperties: false`, in the
    /// subset [`validate_arguments`] checks.
    pub fn input_schema(self) -> Value {
        let workflow_id = json!({"type": "string", "description": "The workflow (project) id, from list_workflows."});
        let path = |what: &str| json!({"type": "string", "description": what});
        let file = path("File path relative to the workflow root.");
        let expected_revision = |what: &str| json!({"type": "string", "description": what});
        let current_revision = expected_revision(
            "The file's current revision (sha256:<hex>, from read_file or get_file_info); a mismatch is refused with revision_conflict.",
        );
        let request_id = json!({"type": "string", "description": "A unique id for this change; retrying with the same id and payload returns the recorded outcome, the same id with another payload is refused with request_id_reused."});
        let (properties, required): (Value, &[&str]) = match self {
            Operation::ListWorkflows => (json!({}), &[]),
            Operation::ListFiles => (
                json!({
                    "workflow_id": workflow_id,
                    "path": path("Folder to list, relative to the workflow root; the root when omitted."),
                    "depth": {"type": "integer", "minimum": 1, "maximum": LIST_FILES_MAX_DEPTH, "description": "Levels below path to list (1: its direct children); every level when omitted."},
                    "exclude": {
                        "type": "array", "maxItems": LIST_FILES_MAX_EXCLUDES,
                        "items": {"type": "string"},
                        "description": "Glob patterns left out (and not descended into): without '/' they match any path component (node_modules, *.log), with '/' the path below `path` (src/gen, docs/**/*.tmp); * and ? stay within a component, ** is any number of components.",
                    },
                    "max_entries": {"type": "integer", "minimum": 1, "maximum": LIST_FILES_MAX_ENTRIES, "description": "The most entries answered (10000 when omitted); `truncated` says when more exist."},
                }),
                &["workflow_id"],
            ),
            Operation::ReadFile => (
                json!({
                    "workflow_id": workflow_id,
                    "path": file,
                    "offset": {"type": "integer", "minimum": 0, "description": "Lines to skip (0-based: a search hit on line n is offset n-1); 0 when omitted."},
                    "limit": {"type": "integer", "minimum": 1, "description": "The most lines answered; to the end of the file when omitted."},
                }),
                &["workflow_id", "path"],
            ),
            Operation::ReadFiles => (
                json!({
                    "workflow_id": workflow_id,
                    "paths": {
                        "type": "array", "minItems": 1, "maxItems": READ_FILES_MAX_PATHS,
                        "items": {"type": "string"},
                        "description": "File paths relative to the workflow root; each is read on its own (one that fails does not fail the others).",
                    },
                }),
                &["workflow_id", "paths"],
            ),
            Operation::GetFileInfo => (
                json!({
                    "workflow_id": workflow_id,
                    "path": path("File or folder path relative to the workflow root."),
                }),
                &["workflow_id", "path"],
            ),
            Operation::SearchFiles => (
                json!({
                    "workflow_id": workflow_id,
                    "query": {"type": "string", "description": "Text to search for."},
                    "path": path("Folder to search in, relative to the workflow root; the root when omitted."),
                }),
                &["workflow_id", "query"],
            ),
            Operation::WriteFile => (
                json!({
                    "workflow_id": workflow_id,
                    "path": file,
                    "content": {"type": "string", "description": "The complete new content (UTF-8)."},
                    "expected_revision": expected_revision("The revision read_file returned (sha256:<hex>), or \"missing\" to create a file that must not exist yet."),
                    "request_id": request_id,
                }),
                &[
                    "workflow_id",
                    "path",
                    "content",
                    "expected_revision",
                    "request_id",
                ],
            ),
            Operation::EditFile => (
                json!({
                    "workflow_id": workflow_id,
                    "path": file,
                    "edits": {
                        "type": "array", "minItems": 1, "maxItems": EDIT_FILE_MAX_EDITS,
                        "description": "Exact-text replacements, applied in order, each to the result of the previous.",
                        "items": {
                            "type": "object",
                            "properties": {
                                "old_text": {"type": "string", "minLength": 1, "description": "The text to replace, byte for byte (no whitespace or line-ending normalising); must occur exactly once unless replace_all."},
                                "new_text": {"type": "string", "description": "The replacement."},
                                "replace_all": {"type": "boolean", "description": "Replace every occurrence (at least one) instead of exactly one; false when omitted."},
                            },
                            "required": ["old_text", "new_text"],
                            "additionalProperties": false,
                        },
                    },
                    "expected_revision": current_revision,
                    "request_id": request_id,
                    "dry_run": {"type": "boolean", "description": "Answer the diff and the revision the edit would produce, writing and recording nothing; false when omitted."},
                }),
                &[
                    "workflow_id",
                    "path",
                    "edits",
                    "expected_revision",
                    "request_id",
                ],
            ),
            Operation::MoveFile => (
                json!({
                    "workflow_id": workflow_id,
                    "path": path("The file to move, relative to the workflow root."),
                    "to_path": path("Where it goes, relative to the workflow root; must not exist yet."),
                    "expected_revision": current_revision,
                    "request_id": request_id,
                }),
                &[
                    "workflow_id",
                    "path",
                    "to_path",
                    "expected_revision",
                    "request_id",
                ],
            ),
            Operation::DeleteFile => (
                json!({
                    "workflow_id": workflow_id,
                    "path": file,
                    "expected_revision": current_revision,
                    "request_id": request_id,
                }),
                &["workflow_id", "path", "expected_revision", "request_id"],
            ),
            Operation::ApplyPatch => (
                json!({
                    "workflow_id": workflow_id,
                    "diff": {"type": "string", "minLength": 1, "description": "A unified diff of one or more files, each headed by ---/+++ lines with paths relative to the workflow root (a/ and b/ prefixes allowed): --- /dev/null creates a file, +++ /dev/null deletes one (its hunks remove every line). Renames are refused. At most 64 files."},
                    "request_id": request_id,
                    "expected_revisions": {
                        "type": "object", "maxProperties": PATCH_MAX_FILES,
                        "additionalProperties": {"type": "string"},
                        "description": "File path → the revision read_file returned. Required for every modified file; a deleted file may omit it (its hunks state the whole file); a created file must not exist (\"missing\" or omitted).",
                    },
                }),
                &["workflow_id", "diff", "request_id"],
            ),
            Operation::GetWriteReceipt => (
                json!({
                    "workflow_id": workflow_id,
                    "request_id": {"type": "string", "description": "The request_id of the change (write, edit, move, delete, patch) to look up."},
                }),
                &["workflow_id", "request_id"],
            ),
        };
        json!({
            "type": "object",
            "properties": properties,
            "required": required,
            "additionalProperties": false,
        })
    }

    /// One paragraph for a model deciding which tool to use.
    pub fn description(self) -> &'static str {
        match self {
            Operation::ListWorkflows => "List the workflows (projects) this token may see.",
            Operation::ListFiles => {
                "List files and folders in a workflow, optionally below a folder, with each entry's kind and size. Bounded by depth, exclude patterns and max_entries; truncated says when more entries exist."
            }
            Operation::ReadFile => {
                "Read a file in a workflow, whole or a range of lines (offset, limit). Returns the content, the whole file's revision (sha256:<hex>, which changes need) and its total_lines."
            }
            Operation::ReadFiles => {
                "Read several files of a workflow at once. Each path gets its own result (content, revision, total_lines) or its own error; one that fails does not fail the others."
            }
            Operation::GetFileInfo => {
                "Get a file's or folder's kind, size, revision and modification time without reading it."
            }
            Operation::SearchFiles => {
                "Search file contents in a workflow, optionally below a folder."
            }
            Operation::WriteFile => {
                "Replace or create a file in a workflow. Guarded: expected_revision must be the current revision from read_file (or \"missing\" to create); a mismatch is refused with revision_conflict and the current revision. Retrying with the same request_id returns the same outcome."
            }
            Operation::EditFile => {
                "Edit a file by exact-text replacements, applied in order. Each old_text must occur exactly once (unless replace_all); otherwise the edit is refused with edit_no_match or edit_not_unique naming the edit's 0-based edit_index and its matches. Answers the unified diff and the new revision; dry_run answers them without writing. Guarded by expected_revision; retrying with the same request_id returns the same outcome."
            }
            Operation::MoveFile => {
                "Move or rename a file within a workflow. Guarded by the file's expected_revision; the destination must not exist. Retrying with the same request_id returns the same outcome."
            }
            Operation::DeleteFile => {
                "Delete a file in a workflow. Guarded by expected_revision; the receipt keeps its content for a restore. Retrying with the same request_id returns the same outcome."
            }
            Operation::ApplyPatch => {
                "Apply a multi-file unified diff (create, modify, delete) in a workflow as one request. Every file is checked first (paths, revisions, every hunk, sizes); any failure changes nothing and names the file (path, file_index). Each file gets its own receipt under the request_id; if the set stops part way, partially_applied lists each file's state. Retrying with the same request_id returns the recorded outcome: the result when every file was applied, else an error (partially_applied, not_applied or uncertain) with each file's state; it never applies anything again."
            }
            Operation::GetWriteReceipt => {
                "Look up the receipt of an earlier change (write, edit, move, delete, patch) by its request_id, to resolve an uncertain outcome; a patch lists each file's receipt."
            }
        }
    }

    fn title(self) -> &'static str {
        match self {
            Operation::ListWorkflows => "List workflows",
            Operation::ListFiles => "List files",
            Operation::ReadFile => "Read file",
            Operation::ReadFiles => "Read files",
            Operation::GetFileInfo => "Get file info",
            Operation::SearchFiles => "Search files",
            Operation::WriteFile => "Write file",
            Operation::EditFile => "Edit file",
            Operation::MoveFile => "Move file",
            Operation::DeleteFile => "Delete file",
            Operation::ApplyPatch => "Apply patch",
            Operation::GetWriteReceipt => "Get write receipt",
        }
    }

    fn effect(self) -> Effect {
        if self.is_change() {
            Effect::Destructive
        } else {
            Effect::Read
        }
    }

    /// MCP tool annotations (hints; never trusted for access).
    pub fn annotations(self) -> Value {
        let changes = self.effect() == Effect::Destructive;
        json!({
            "title": self.title(),
            "readOnlyHint": !changes,
            "destructiveHint": changes,
            // Same request_id → same outcome, so even the changes are idempotent.
            "idempotentHint": true,
            // The workflow's files only: nothing outside this server.
            "openWorldHint": false,
        })
    }
}

/// Whether the token carries any one of `scopes`.
pub(super) fn has_any_scope(caller: &Caller, scopes: &[&str]) -> bool {
    caller.scopes.iter().any(|s| scopes.contains(&s.as_str()))
}

/// The operations this caller may use: the backend's `allowed` ∩ the token's scopes, in catalog
/// order, without duplicates.
pub(super) fn effective_operations(caller: &Caller, allowed: &[Operation]) -> Vec<Operation> {
    Operation::ALL
        .into_iter()
        .filter(|op| allowed.contains(op) && has_any_scope(caller, op.scopes()))
        .collect()
}

/// The `get_api_spec` result: the effective catalog.
pub(super) fn api_spec(operations: &[Operation]) -> Value {
    let operations: Vec<Value> = operations
        .iter()
        .map(|op| {
            json!({
                "name": op.name(),
                "description": op.description(),
                "input_schema": op.input_schema(),
                "annotations": op.annotations(),
            })
        })
        .collect();
    json!({ "operations": operations })
}

fn meta_tool_schema(name: &str) -> Value {
    if name == CALL_TOOL {
        json!({
            "type": "object",
            "properties": {
                "name": {"type": "string", "description": "The operation name, as listed by get_api_spec."},
                "arguments": {"type": "object", "description": "The operation's arguments, per its input_schema."},
            },
            "required": ["name"],
            "additionalProperties": false,
        })
    } else {
        json!({"type": "object", "properties": {}, "required": [], "additionalProperties": false})
    }
}

/// The MCP `tools/list` entries: the two meta tools, then each effective operation.
pub(super) fn tool_list(operations: &[Operation]) -> Vec<Value> {
    let mut tools = vec![
        json!({
            "name": GET_API_SPEC,
            "title": "Get API spec",
            "description": "The catalog of operations this token may use right now, each with its input_schema and annotations.",
            "inputSchema": meta_tool_schema(GET_API_SPEC),
            "annotations": {"title": "Get API spec", "readOnlyHint": true, "destructiveHint": false, "idempotentHint": true, "openWorldHint": false},
        }),
        json!({
            "name": CALL_TOOL,
            "title": "Call operation",
            "description": "Call one catalog operation by name with its arguments (see get_api_spec). The same checks apply as when calling the operation's own tool.",
            "inputSchema": meta_tool_schema(CALL_TOOL),
            "annotations": {"title": "Call operation", "readOnlyHint": false, "destructiveHint": true, "idempotentHint": false, "openWorldHint": false},
        }),
    ];
    tools.extend(operations.iter().map(|op| {
        json!({
            "name": op.name(),
            "title": op.title(),
            "description": op.description(),
            "inputSchema": op.input_schema(),
            "annotations": op.annotations(),
        })
    }));
    tools
}

/// The input schema of a meta tool, for validating its arguments: built once, as
/// [`Operation::cached_input_schema`] is, since each call reads it twice (the header check and
/// the argument check).
pub(super) fn meta_schema(name: &str) -> Option<&'static Value> {
    static SCHEMAS: std::sync::LazyLock<[Value; 2]> =
        std::sync::LazyLock::new(|| [GET_API_SPEC, CALL_TOOL].map(meta_tool_schema));
    match name {
        GET_API_SPEC => Some(&SCHEMAS[0]),
        CALL_TOOL => Some(&SCHEMAS[1]),
        _ => None,
    }
}

/// The JSON Schema keywords [`validate_arguments`] checks (`description` and `title` are
/// annotations). A schema of ours using any other keyword would advertise a rule nobody
/// enforces; a unit test walks every schema for that.
#[cfg(test)]
const CHECKED_KEYWORDS: [&str; 13] = [
    "type",
    "description",
    "title",
    "properties",
    "required",
    "additionalProperties",
    "maxProperties",
    "items",
    "minItems",
    "maxItems",
    "minimum",
    "maximum",
    "minLength",
];

/// Checks `arguments` against the subset of JSON Schema our schemas use: objects with
/// `properties`, `required` and `additionalProperties: false` (unknown properties refused),
/// maps (`additionalProperties` a schema every value must match, `maxProperties`),
/// and property types `string` (`minLength`), `integer` (`minimum`, `maximum`; a fraction is
/// not an integer), `boolean`, `object` and `array` (`items`, `minItems`, `maxItems`), nested
/// to any depth. A failure is a [`ToolError`] with code `invalid_arguments` whose `field`
/// names the argument as a path (`edits[1].old_text`).
pub(super) fn validate_arguments(
    schema: &Value,
    arguments: &Map<String, Value>,
) -> Result<(), ToolError> {
    check_object(schema, arguments, "")
}

fn invalid(field: &str, message: String) -> ToolError {
    let mut error = ToolError::new("invalid_arguments", message);
    error
        .details
        .insert("field".to_owned(), Value::String(field.to_owned()));
    error
}

/// `at` joined with a property name: `name` at the top, `edits[0].name` below.
fn field_path(at: &str, name: &str) -> String {
    if at.is_empty() {
        name.to_owned()
    } else {
        format!("{at}.{name}")
    }
}

fn check_object(schema: &Value, object: &Map<String, Value>, at: &str) -> Result<(), ToolError> {
    let empty = Map::new();
    let properties = schema
        .get("properties")
        .and_then(Value::as_object)
        .unwrap_or(&empty);
    let required = schema.get("required").and_then(Value::as_array);
    for name in required.into_iter().flatten().filter_map(Value::as_str) {
        if !object.contains_key(name) {
            let field = field_path(at, name);
            return Err(invalid(
                &field,
                format!("missing required argument `{field}`"),
            ));
        }
    }
    let closed = schema.get("additionalProperties") == Some(&Value::Bool(false));
    // A map (`additionalProperties` is a schema): every value of it is checked against it.
    let values = schema.get("additionalProperties").filter(|s| s.is_object());
    if let Some(most) = bound(schema, "maxProperties")
        && object.len() as i128 > most
    {
        let field = if at.is_empty() { "arguments" } else { at };
        return Err(invalid(
            field,
            format!(
                "`{field}` has {} entries; at most {most} are taken",
                object.len()
            ),
        ));
    }
    for (name, value) in object {
        let field = field_path(at, name);
        match properties.get(name).or(values) {
            Some(property) => check_value(property, value, &field)?,
            None if closed => {
                let known: Vec<&str> = properties.keys().map(String::as_str).collect();
                let expected = if known.is_empty() {
                    "none are taken here".to_owned()
                } else {
                    format!("the arguments here are: {}", known.join(", "))
                };
                return Err(invalid(
                    &field,
                    format!("unknown argument `{field}` ({expected})"),
                ));
            }
            None => {}
        }
    }
    Ok(())
}

/// A schema's integer keyword (`minimum`, `maxItems`, …), if it has one.
fn bound(schema: &Value, keyword: &str) -> Option<i128> {
    let value = schema.get(keyword)?;
    value
        .as_u64()
        .map(i128::from)
        .or_else(|| value.as_i64().map(i128::from))
}

fn check_value(schema: &Value, value: &Value, field: &str) -> Result<(), ToolError> {
    let Some(want) = schema.get("type").and_then(Value::as_str) else {
        return Ok(());
    };
    let wrong_type = || {
        let article = if want.starts_with(['a', 'e', 'i', 'o', 'u']) {
            "an"
        } else {
            "a"
        };
        invalid(
            field,
            format!("argument `{field}` must be {article} {want}, not {value}"),
        )
    };
    match want {
        "string" => {
            let text = value.as_str().ok_or_else(wrong_type)?;
            if let Some(min) = bound(schema, "minLength")
                && (text.chars().count() as i128) < min
            {
                return Err(invalid(
                    field,
                    format!("argument `{field}` must be at least {min} characters long"),
                ));
            }
        }
        "integer" => {
            let number = value
                .as_u64()
                .map(i128::from)
                .or_else(|| value.as_i64().map(i128::from))
                .ok_or_else(wrong_type)?;
            if let Some(min) = bound(schema, "minimum")
                && number < min
            {
                return Err(invalid(
                    field,
                    format!("argument `{field}` must be at least {min}"),
                ));
            }
            if let Some(max) = bound(schema, "maximum")
                && number > max
            {
                return Err(invalid(
                    field,
                    format!("argument `{field}` must be at most {max}"),
                ));
            }
        }
        "boolean" => {
            value.as_bool().ok_or_else(wrong_type)?;
        }
        "object" => check_object(schema, value.as_object().ok_or_else(wrong_type)?, field)?,
        "array" => {
            let items = value.as_array().ok_or_else(wrong_type)?;
            let count = items.len() as i128;
            if let Some(min) = bound(schema, "minItems")
                && count < min
            {
                return Err(invalid(
                    field,
                    format!("argument `{field}` needs at least {min} entries"),
                ));
            }
            if let Some(max) = bound(schema, "maxItems")
                && count > max
            {
                return Err(invalid(
                    field,
                    format!("argument `{field}` takes at most {max} entries, not {count}"),
                ));
            }
            if let Some(item_schema) = schema.get("items") {
                for (index, item) in items.iter().enumerate() {
                    check_value(item_schema, item, &format!("{field}[{index}]"))?;
                }
            }
        }
        // A type our schemas never use: refuse rather than let anything through.
        _ => {
            return Err(invalid(
                field,
                format!("argument `{field}` has a schema type ({want}) this server cannot check"),
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn caller(scopes: &[&str]) -> Caller {
        Caller {
            token_id: "t".into(),
            user_id: "u".into(),
            user_name: "user".into(),
            scopes: scopes.iter().map(|s| (*s).to_owned()).collect(),
            reach: None,
        }
    }

    fn args(value: Value) -> Map<String, Value> {
        value.as_object().cloned().unwrap()
    }

    #[test]
    fn every_operation_has_its_own_cached_schema() {
        for op in Operation::ALL {
            assert_eq!(op.cached_input_schema(), &op.input_schema(), "{op:?}");
        }
    }

    #[test]
    fn names_round_trip_and_are_unique() {
        for op in Operation::ALL {
            assert_eq!(Operation::from_name(op.name()), Some(op));
        }
        assert_eq!(Operation::from_name("call_tool"), None);
        assert_eq!(Operation::from_name("READ_FILE"), None);
    }

    #[test]
    fn write_file_schema_has_exactly_the_designed_arguments() {
        let schema = Operation::WriteFile.input_schema();
        let mut props: Vec<&str> = schema["properties"]
            .as_object()
            .unwrap()
            .keys()
            .map(String::as_str)
            .collect();
        props.sort_unstable();
        assert_eq!(
            props,
            [
                "content",
                "expected_revision",
                "path",
                "request_id",
                "workflow_id"
            ]
        );
        assert_eq!(schema["required"].as_array().unwrap().len(), 5);
        assert_eq!(schema["additionalProperties"], false);
        assert_eq!(schema["type"], "object");
    }

    #[test]
    fn optional_arguments_are_not_required() {
        let schema = Operation::SearchFiles.input_schema();
        assert_eq!(schema["required"], json!(["workflow_id", "query"]));
        assert!(schema["properties"].get("path").is_some());
        assert_eq!(
            Operation::ListWorkflows.input_schema()["required"],
            json!([])
        );
    }

    #[test]
    fn scopes_and_annotations() {
        assert_eq!(Operation::WriteFile.scopes(), ["workflows:write"]);
        assert_eq!(Operation::GetWriteReceipt.scopes(), ["workflows:write"]);
        assert_eq!(Operation::ReadFile.scopes()[0], "workflows:read");
        let write = Operation::WriteFile.annotations();
        assert_eq!(write["destructiveHint"], true);
        assert_eq!(write["idempotentHint"], true);
        assert_eq!(write["readOnlyHint"], false);
        assert_eq!(write["openWorldHint"], false);
        assert_eq!(Operation::ReadFile.annotations()["readOnlyHint"], true);
    }

    #[test]
    fn effective_catalog_is_the_intersection_of_scopes_and_backend() {
        let all = Operation::ALL.to_vec();
        let read = effective_operations(&caller(&["workflows:read"]), &all);
        assert!(!read.contains(&Operation::WriteFile));
        assert!(!read.contains(&Operation::GetWriteReceipt));
        assert!(read.contains(&Operation::ReadFile));
        let write = effective_operations(&caller(&["workflows:write"]), &all);
        assert_eq!(write, all);
        // A write token whose user has no authoring role: the backend decides.
        let viewer = effective_operations(
            &caller(&["workflows:write"]),
            &[Operation::ReadFile, Operation::ReadFile],
        );
        assert_eq!(viewer, [Operation::ReadFile]);
        assert!(effective_operations(&caller(&["devices:connect"]), &all).is_empty());
    }

    #[test]
    fn tool_list_has_meta_tools_first_and_only_effective_operations() {
        let tools = tool_list(&[Operation::ReadFile]);
        let names: Vec<&str> = tools.iter().map(|t| t["name"].as_str().unwrap()).collect();
        assert_eq!(names, ["get_api_spec", "call_tool", "read_file"]);
        assert_eq!(tools[2]["inputSchema"], Operation::ReadFile.input_schema());
        let spec = api_spec(&[Operation::ReadFile]);
        assert_eq!(spec["operations"][0]["name"], "read_file");
        assert_eq!(spec["operations"].as_array().unwrap().len(), 1);
    }

    #[test]
    fn validation_requires_fields_types_and_no_extras() {
        let schema = Operation::ReadFile.input_schema();
        assert!(
            validate_arguments(&schema, &args(json!({"workflow_id": "w", "path": "a.md"}))).is_ok()
        );
        let missing = validate_arguments(&schema, &args(json!({"workflow_id": "w"}))).unwrap_err();
        assert_eq!(missing.code, "invalid_arguments");
        assert_eq!(missing.details["field"], "path");
        let wrong =
            validate_arguments(&schema, &args(json!({"workflow_id": 3, "path": "a"}))).unwrap_err();
        assert_eq!(wrong.details["field"], "workflow_id");
        let extra = validate_arguments(
            &schema,
            &args(json!({"workflow_id": "w", "path": "a", "mode": "x"})),
        )
        .unwrap_err();
        assert_eq!(extra.details["field"], "mode");
        let call = meta_schema(CALL_TOOL).unwrap();
        assert!(
            validate_arguments(call, &args(json!({"name": "read_file", "arguments": {}}))).is_ok()
        );
        assert!(
            validate_arguments(call, &args(json!({"name": "read_file", "arguments": []}))).is_err()
        );
        assert!(validate_arguments(call, &args(json!({}))).is_err());
        assert!(meta_schema("read_file").is_none());
    }

    /// Every keyword of `schema` (and of the schemas inside it) is one the validator checks.
    fn assert_checked(schema: &Value, at: &str) {
        let object = schema
            .as_object()
            .unwrap_or_else(|| panic!("{at}: not a schema"));
        for keyword in object.keys() {
            assert!(
                CHECKED_KEYWORDS.contains(&keyword.as_str()),
                "{at}: the validator does not check `{keyword}`"
            );
        }
        if let Some(properties) = object.get("properties").and_then(Value::as_object) {
            for (name, property) in properties {
                assert_checked(property, &format!("{at}.{name}"));
            }
            for name in object["required"].as_array().unwrap() {
                assert!(
                    properties.contains_key(name.as_str().unwrap()),
                    "{at}: {name}"
                );
            }
            assert_eq!(object["additionalProperties"], false, "{at}: closed");
        }
        if let Some(items) = object.get("items") {
            assert_checked(items, &format!("{at}[]"));
        }
        if let Some(values) = object.get("additionalProperties").filter(|v| v.is_object()) {
            assert_checked(values, &format!("{at}{{}}"));
        }
    }

    #[test]
    fn every_schema_uses_only_what_the_validator_checks() {
        for op in Operation::ALL {
            assert_checked(&op.input_schema(), op.name());
        }
        for tool in tool_list(&Operation::ALL) {
            assert_checked(&tool["inputSchema"], tool["name"].as_str().unwrap());
        }
    }

    #[test]
    fn apply_patch_revisions_are_a_bounded_map_of_strings() {
        let schema = Operation::ApplyPatch.input_schema();
        let args = |revisions: Value| {
            json!({"workflow_id": "w", "diff": "--- a/x\n", "request_id": "r", "expected_revisions": revisions})
                .as_object()
                .unwrap()
                .clone()
        };
        assert!(
            validate_arguments(
                &schema,
                &args(json!({"a.md": "sha256:00", "b/c.rs": "missing"}))
            )
            .is_ok()
        );
        let wrong = validate_arguments(&schema, &args(json!({"a.md": 7}))).unwrap_err();
        assert_eq!(wrong.details["field"], "expected_revisions.a.md");
        let many: Map<String, Value> = (0..=PATCH_MAX_FILES)
            .map(|i| (format!("f{i}"), json!("missing")))
            .collect();
        let too_many = validate_arguments(&schema, &args(Value::Object(many))).unwrap_err();
        assert_eq!(too_many.details["field"], "expected_revisions");
        assert!(validate_arguments(&schema, &args(json!(["a.md"]))).is_err());
    }

    #[test]
    fn every_change_takes_a_revision_and_a_request_id_and_needs_the_write_scope() {
        let changes: Vec<&str> = Operation::ALL
            .into_iter()
            .filter(|op| op.is_change())
            .map(Operation::name)
            .collect();
        assert_eq!(
            changes,
            [
                "write_file",
                "edit_file",
                "move_file",
                "delete_file",
                "apply_patch"
            ]
        );
        for op in Operation::ALL.into_iter().filter(|op| op.is_change()) {
            let required = op.input_schema()["required"].clone();
            // A patch names its files in the diff and their revisions in `expected_revisions`
            // (workspaced requires one for every modified file).
            let fields: &[&str] = if op == Operation::ApplyPatch {
                &["workflow_id", "diff", "request_id"]
            } else {
                &["workflow_id", "path", "expected_revision", "request_id"]
            };
            for field in fields {
                assert!(
                    required.as_array().unwrap().contains(&json!(*field)),
                    "{op:?} {field}"
                );
            }
            assert_eq!(op.scopes(), ["workflows:write"], "{op:?}");
        }
        assert_eq!(
            Operation::EditFile.input_schema()["required"],
            json!([
                "workflow_id",
                "path",
                "edits",
                "expected_revision",
                "request_id"
            ])
        );
        assert_eq!(
            Operation::MoveFile.input_schema()["required"],
            json!([
                "workflow_id",
                "path",
                "to_path",
                "expected_revision",
                "request_id"
            ])
        );
        for op in [Operation::ReadFiles, Operation::GetFileInfo] {
            assert_eq!(op.scopes(), WORKFLOW_SCOPES, "{op:?}");
        }
    }

    #[test]
    fn every_tool_has_all_four_hints_and_only_changes_are_destructive() {
        for tool in tool_list(&Operation::ALL) {
            let name = tool["name"].as_str().unwrap();
            let hints = &tool["annotations"];
            for hint in [
                "readOnlyHint",
                "destructiveHint",
                "idempotentHint",
                "openWorldHint",
            ] {
                assert!(hints[hint].is_boolean(), "{name}: {hint}");
            }
            assert_eq!(hints["openWorldHint"], false, "{name}");
            assert_eq!(tool["title"], hints["title"], "{name}");
            if let Some(op) = Operation::from_name(name) {
                assert_eq!(hints["readOnlyHint"], !op.is_change(), "{name}");
                assert_eq!(hints["destructiveHint"], op.is_change(), "{name}");
                assert_eq!(hints["idempotentHint"], true, "{name}");
            }
        }
        // The spec carries the same schema and annotations as the tool list.
        let spec = api_spec(&Operation::ALL);
        for (entry, op) in spec["operations"]
            .as_array()
            .unwrap()
            .iter()
            .zip(Operation::ALL)
        {
            assert_eq!(entry["name"], op.name());
            assert_eq!(entry["input_schema"], op.input_schema());
            assert_eq!(entry["annotations"], op.annotations());
        }
    }

    fn refusal(op: Operation, value: Value) -> (String, String) {
        let error = validate_arguments(&op.input_schema(), &args(value)).unwrap_err();
        assert_eq!(error.code, "invalid_arguments");
        (
            error.details["field"].as_str().unwrap().to_owned(),
            error.message,
        )
    }

    #[test]
    fn validation_checks_arrays_of_objects_integers_and_booleans() {
        let edit = |edits: Value| json!({"workflow_id": "w", "path": "a", "expected_revision": "r", "request_id": "q", "edits": edits});
        let good = edit(json!([
            {"old_text": "a", "new_text": "b"},
            {"old_text": "c", "new_text": "", "replace_all": true},
        ]));
        assert!(validate_arguments(&Operation::EditFile.input_schema(), &args(good)).is_ok());
        let cases = [
            (
                edit(json!([{"old_text": "a", "new_text": "b"}, {"old_text": "c"}])),
                "edits[1].new_text",
                "missing required",
            ),
            (
                edit(json!([{"old_text": "a", "new_text": "b", "fuzzy": true}])),
                "edits[0].fuzzy",
                "unknown argument",
            ),
            (
                edit(json!([{"old_text": "a", "new_text": "b", "replace_all": "yes"}])),
                "edits[0].replace_all",
                "must be a boolean",
            ),
            (
                edit(json!([{"old_text": "", "new_text": "b"}])),
                "edits[0].old_text",
                "at least 1 characters",
            ),
            (edit(json!(["a"])), "edits[0]", "must be an object"),
            (edit(json!([])), "edits", "at least 1 entries"),
            (edit(json!({"old_text": "a"})), "edits", "must be an array"),
            (
                edit(Value::Array(vec![
                    json!({"old_text": "a", "new_text": "b"});
                    EDIT_FILE_MAX_EDITS + 1
                ])),
                "edits",
                "at most 100 entries",
            ),
        ];
        for (value, field, says) in cases {
            let (got, message) = refusal(Operation::EditFile, value);
            assert_eq!(got, field, "{message}");
            assert!(message.contains(says), "{field}: {message}");
        }
        let mut dry = edit(json!([{"old_text": "a", "new_text": "b"}]));
        dry["dry_run"] = json!("true");
        assert_eq!(refusal(Operation::EditFile, dry).0, "dry_run");

        let read = |extra: Value| {
            let mut value = json!({"workflow_id": "w", "path": "a"});
            for (k, v) in extra.as_object().unwrap() {
                value[k] = v.clone();
            }
            value
        };
        assert!(
            validate_arguments(
                &Operation::ReadFile.input_schema(),
                &args(read(json!({"offset": 0, "limit": 5})))
            )
            .is_ok()
        );
        for (extra, field, says) in [
            (json!({"offset": -1}), "offset", "at least 0"),
            (json!({"offset": 1.5}), "offset", "must be an integer"),
            (json!({"limit": 0}), "limit", "at least 1"),
            (json!({"limit": "5"}), "limit", "must be an integer"),
        ] {
            let (got, message) = refusal(Operation::ReadFile, read(extra));
            assert_eq!(got, field, "{message}");
            assert!(message.contains(says), "{message}");
        }

        let list = json!({"workflow_id": "w", "depth": 2, "exclude": ["*.log", "node_modules"], "max_entries": 10});
        assert!(validate_arguments(&Operation::ListFiles.input_schema(), &args(list)).is_ok());
        assert_eq!(
            refusal(
                Operation::ListFiles,
                json!({"workflow_id": "w", "depth": 65})
            )
            .0,
            "depth"
        );
        assert_eq!(
            refusal(
                Operation::ListFiles,
                json!({"workflow_id": "w", "exclude": ["a", 3]})
            )
            .0,
            "exclude[1]"
        );
        assert_eq!(
            refusal(
                Operation::ListFiles,
                json!({"workflow_id": "w", "max_entries": 10_001})
            )
            .0,
            "max_entries"
        );

        let many: Vec<String> = (0..=READ_FILES_MAX_PATHS)
            .map(|i| format!("f{i}"))
            .collect();
        assert_eq!(
            refusal(
                Operation::ReadFiles,
                json!({"workflow_id": "w", "paths": many})
            )
            .0,
            "paths"
        );
        assert_eq!(
            refusal(
                Operation::ReadFiles,
                json!({"workflow_id": "w", "paths": []})
            )
            .0,
            "paths"
        );
        assert_eq!(
            refusal(
                Operation::ReadFiles,
                json!({"workflow_id": "w", "paths": ["a", null]})
            )
            .0,
            "paths[1]"
        );
        assert_eq!(
            refusal(Operation::ListWorkflows, json!({"x": 1})).1,
            "unknown argument `x` (none are taken here)"
        );
    }
}
