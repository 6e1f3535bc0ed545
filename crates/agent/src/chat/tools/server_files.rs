//! The server-file tools of a server-mode turn: `read_file`, `list_files`, `search_files` and
//! `write_file` on the chat's project, through [`FileTools`] with the person's live authority
//! (source `agent`), exactly as the MCP endpoint's operations of the same names. The project is
//! always the chat's (the model names none), and a write's request id is made by the server,
//! never by the model.

use super::{Mode, arguments, schema, tool, unknown_tool};
use crate::catalog::files::{FileTools, Source};
use crate::chat::model::ToolCall;
use crate::mcp::{Caller, ToolError};
use serde_json::{Value, json};

/// The four server-mode tools.
pub fn definitions() -> Vec<Value> {
    vec![
        tool(
            "read_file",
            "Read a file of this project: its content and revision.",
            schema(
                json!({"path": {"type": "string", "description": "path relative to the project root"}}),
                &["path"],
            ),
        ),
        tool(
            "list_files",
            "List the files of this project (recursively), optionally under a folder.",
            schema(json!({"path": {"type": "string"}}), &[]),
        ),
        tool(
            "search_files",
            "Search the text of this project's files.",
            schema(
                json!({"query": {"type": "string"}, "path": {"type": "string"}}),
                &["query"],
            ),
        ),
        tool(
            "write_file",
            "Create or replace a UTF-8 file of this project. expected_revision is the revision \
             read_file returned, or \"missing\" to create a new file.",
            schema(
                json!({"path": {"type": "string"}, "content": {"type": "string"},
                       "expected_revision": {"type": "string"}}),
                &["path", "content", "expected_revision"],
            ),
        ),
    ]
}

/// A server-mode call: one of the four file tools, always on the chat's project, a write
/// with the request id made here (never the model's).
pub async fn execute(
    files: &FileTools,
    caller: &Caller,
    project_id: &str,
    call: &ToolCall,
    request_id: &str,
) -> Result<Value, ToolError> {
    let project = json!(project_id);
    let source = Source::Agent;
    match call.name.as_str() {
        "read_file" => {
            let mut args = arguments(call, &["path"])?;
            args.insert("workflow_id".into(), project);
            files.read_file(caller, &args, source).await
        }
        "list_files" => {
            let mut args = arguments(call, &["path"])?;
            args.insert("workflow_id".into(), project);
            files.list_files(caller, &args, source).await
        }
        "search_files" => {
            let mut args = arguments(call, &["query", "path"])?;
            args.insert("workflow_id".into(), project);
            files.search_files(caller, &args, source).await
        }
        "write_file" => {
            let mut args = arguments(call, &["path", "content", "expected_revision"])?;
            args.insert("workflow_id".into(), project);
            args.insert("request_id".into(), json!(request_id));
            files.write_file(caller, &args, source).await
        }
        other => Err(unknown_tool(other, Mode::Server)),
    }
}
