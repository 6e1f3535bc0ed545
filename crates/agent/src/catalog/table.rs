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
    /// `list_files`: `workflow_id`, `path?`.
    ListFiles,
    /// `read_file`: `workflow_id`, `path`; returns `content` and `revision`.
    ReadFile,
    /// `search_files`: `workflow_id`, `query`, `path?`.
    SearchFiles,
    /// `write_file`: `workflow_id`, `path`, `content`, `expected_revision`, `request_id`.
    WriteFile,
    /// `get_write_receipt`: `workflow_id`, `request_id`.
    GetWriteReceipt,
}

/// Scopes that let a token use the endpoint at all (reads need any one of them).
pub const WORKFLOW_SCOPES: [&str; 3] = ["workflows:read", "workflows:run", "workflows:write"];

const WRITE_SCOPES: [&str; 1] = ["workflows:write"];

/// The meta tool returning the effective catalog.
pub(super) const GET_API_SPEC: &str = "get_api_spec";
/// The meta tool dispatching `{name, arguments}` to an operation.
pub(super) const CALL_TOOL: &str = "call_tool";

impl Operation {
    /// Every operation, in catalog order.
    pub const ALL: [Operation; 6] = [
        Operation::ListWorkflows,
        Operation::ListFiles,
        Operation::ReadFile,
        Operation::SearchFiles,
        Operation::WriteFile,
        Operation::GetWriteReceipt,
    ];

    /// The tool name, e.g. `read_file`.
    pub fn name(self) -> &'static str {
        match self {
            Operation::ListWorkflows => "list_workflows",
            Operation::ListFiles => "list_files",
            Operation::ReadFile => "read_file",
            Operation::SearchFiles => "search_files",
            Operation::WriteFile => "write_file",
            Operation::GetWriteReceipt => "get_write_receipt",
        }
    }

    /// The operation with this tool name.
    pub fn from_name(name: &str) -> Option<Operation> {
        Operation::ALL.into_iter().find(|op| op.name() == name)
    }

    /// Scopes of which any one suffices. The first is the one named in an
    /// `insufficient_scope` challenge (the least a client should ask for).
    pub fn scopes(self) -> &'static [&'static str] {
        match self {
            Operation::WriteFile | Operation::GetWriteReceipt => &WRITE_SCOPES,
            _ => &WORKFLOW_SCOPES,
        }
    }

    /// JSON Schema of the arguments: an object, `additionalProperties: false`, string properties.
    pub fn input_schema(self) -> Value {
        let workflow_id = json!({"type": "string", "description": "The workflow (project) id, from list_workflows."});
        let path = |what: &str| json!({"type": "string", "description": what});
        let (properties, required): (Value, &[&str]) = match self {
            Operation::ListWorkflows => (json!({}), &[]),
            Operation::ListFiles => (
                json!({
                    "workflow_id": workflow_id,
                    "path": path("Folder to list, relative to the workflow root; the root when omitted."),
                }),
                &["workflow_id"],
            ),
            Operation::ReadFile => (
                json!({
                    "workflow_id": workflow_id,
                    "path": path("File path relative to the workflow root."),
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
                    "path": path("File path relative to the workflow root."),
                    "content": {"type": "string", "description": "The complete new content (UTF-8)."},
                    "expected_revision": {"type": "string", "description": "The revision read_file returned (sha256:<hex>), or \"missing\" to create a file that must not exist yet."},
                    "request_id": {"type": "string", "description": "A unique id for this write; retrying with the same id and payload returns the recorded outcome."},
                }),
                &[
                    "workflow_id",
                    "path",
                    "content",
                    "expected_revision",
                    "request_id",
                ],
            ),
            Operation::GetWriteReceipt => (
                json!({
                    "workflow_id": workflow_id,
                    "request_id": {"type": "string", "description": "The request_id of the write to look up."},
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
                "List files and folders in a workflow, optionally below a folder."
            }
            Operation::ReadFile => {
                "Read a file in a workflow. Returns its content and its revision (sha256:<hex>), which write_file needs."
            }
            Operation::SearchFiles => {
                "Search file contents in a workflow, optionally below a folder."
            }
            Operation::WriteFile => {
                "Replace or create a file in a workflow. Guarded: expected_revision must be the current revision from read_file (or \"missing\" to create); a mismatch is refused with revision_conflict and the current revision. Retrying with the same request_id returns the same outcome."
            }
            Operation::GetWriteReceipt => {
                "Look up the receipt of an earlier write by its request_id, to resolve an uncertain outcome."
            }
        }
    }

    /// MCP tool annotations (hints; never trusted for access).
    pub fn annotations(self) -> Value {
        let title = match self {
            Operation::ListWorkflows => "List workflows",
            Operation::ListFiles => "List files",
            Operation::ReadFile => "Read file",
            Operation::SearchFiles => "Search files",
            Operation::WriteFile => "Write file",
            Operation::GetWriteReceipt => "Get write receipt",
        };
        let write = self == Operation::WriteFile;
        json!({
            "title": title,
            "readOnlyHint": !write,
            "destructiveHint": write,
            // Same request_id → same outcome, so even the write is idempotent.
            "idempotentHint": true,
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
            "title": op.annotations().get("title").cloned().unwrap_or(Value::Null),
            "description": op.description(),
            "inputSchema": op.input_schema(),
            "annotations": op.annotations(),
        })
    }));
    tools
}

/// The input schema of a meta tool, for validating its arguments.
pub(super) fn meta_schema(name: &str) -> Option<Value> {
    (name == GET_API_SPEC || name == CALL_TOOL).then(|| meta_tool_schema(name))
}

/// Checks `arguments` against the subset of JSON Schema our schemas use: `required`,
/// `additionalProperties: false`, and property `type` of `string` or `object`.
/// A failure is a [`ToolError`] with code `invalid_arguments` naming the field.
pub(super) fn validate_arguments(
    schema: &Value,
    arguments: &Map<String, Value>,
) -> Result<(), ToolError> {
    let invalid = |field: &str, message: String| {
        let mut error = ToolError::new("invalid_arguments", message);
        error
            .details
            .insert("field".to_owned(), Value::String(field.to_owned()));
        error
    };
    let empty = Map::new();
    let properties = schema
        .get("properties")
        .and_then(Value::as_object)
        .unwrap_or(&empty);
    let required = schema.get("required").and_then(Value::as_array);
    for name in required.into_iter().flatten().filter_map(Value::as_str) {
        if !arguments.contains_key(name) {
            return Err(invalid(name, format!("missing required argument `{name}`")));
        }
    }
    let closed = schema.get("additionalProperties") == Some(&Value::Bool(false));
    for (name, value) in arguments {
        let Some(property) = properties.get(name) else {
            if closed {
                return Err(invalid(name, format!("unknown argument `{name}`")));
            }
            continue;
        };
        let fits = match property.get("type").and_then(Value::as_str) {
            Some("string") => value.is_string(),
            Some("object") => value.is_object(),
            _ => true,
        };
        if !fits {
            let want = property.get("type").and_then(Value::as_str).unwrap_or("?");
            return Err(invalid(name, format!("argument `{name}` must be a {want}")));
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
        }
    }

    fn args(value: Value) -> Map<String, Value> {
        value.as_object().cloned().unwrap()
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
            validate_arguments(&call, &args(json!({"name": "read_file", "arguments": {}}))).is_ok()
        );
        assert!(
            validate_arguments(&call, &args(json!({"name": "read_file", "arguments": []})))
                .is_err()
        );
        assert!(validate_arguments(&call, &args(json!({}))).is_err());
        assert!(meta_schema("read_file").is_none());
    }
}
