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

/// A coding CLI's `diff_patch_workspace_file {filepath, diff}` through its bridge, on the
/// chat's project: applied by workspaced's guarded patch (receipts, protected files, the
/// person's live authority, every hunk checked against the file as it is now) with the request
/// id made here. A diff without file headers is one file's hunks, given headers for `filepath`;
/// a diff with headers may name no file but `filepath`.
pub async fn bridge_patch(
    files: &FileTools,
    caller: &Caller,
    project_id: &str,
    arguments: &Value,
    request_id: &str,
) -> Result<Value, ToolError> {
    let field = |name: &str| {
        arguments
            .get(name)
            .and_then(Value::as_str)
            .map(str::to_owned)
            .ok_or_else(|| {
                ToolError::new(
                    "invalid_arguments",
                    format!("diff_patch_workspace_file needs {name} (a string)"),
                )
            })
    };
    let (filepath, diff) = (field("filepath")?, field("diff")?);
    let diff = with_file_headers(&filepath, &diff)?;
    // The file's revision now: the CLI made its diff from the file it read natively, as a
    // laptop's patch applies to the file as it is; the hunks' context still has to match.
    let mut stat = serde_json::Map::new();
    stat.insert("workflow_id".into(), json!(project_id));
    stat.insert("path".into(), json!(filepath));
    let revision = match files.get_file_info(caller, &stat, Source::Agent).await {
        Ok(info) => info.get("revision").cloned(),
        Err(error) if error.code == "not_found" => None,
        Err(error) => return Err(error),
    };
    let mut args = serde_json::Map::new();
    args.insert("workflow_id".into(), json!(project_id));
    args.insert("diff".into(), json!(diff));
    args.insert("request_id".into(), json!(request_id));
    if let Some(revision) = revision {
        args.insert("expected_revisions".into(), json!({ filepath: revision }));
    }
    files.apply_patch(caller, &args, Source::Agent).await
}

/// `diff` as a unified diff of `filepath` alone: headers added to bare hunks; headers that
/// name another file refused.
fn with_file_headers(filepath: &str, diff: &str) -> Result<String, ToolError> {
    let names_the_file = |line: &str, prefix: &str| {
        let name = line[prefix.len()..].split('\t').next().unwrap_or("").trim();
        name == "/dev/null"
            || name == filepath
            || name.strip_prefix("a/") == Some(filepath)
            || name.strip_prefix("b/") == Some(filepath)
    };
    let mut has_headers = false;
    for line in diff.lines() {
        for prefix in ["--- ", "+++ "] {
            if line.starts_with(prefix) && !line.starts_with("--- -") {
                has_headers = true;
                if !names_the_file(line, prefix) {
                    return Err(ToolError::new(
                        "invalid_arguments",
                        format!(
                            "the diff names another file than {filepath:?} ({line:?}): \
                             diff_patch_workspace_file patches one file"
                        ),
                    ));
                }
            }
        }
    }
    if has_headers {
        return Ok(diff.to_owned());
    }
    Ok(format!("--- a/{filepath}\n+++ b/{filepath}\n{diff}"))
}

#[cfg(test)]
mod bridge_tests {
    use super::with_file_headers;

    #[test]
    fn bare_hunks_get_headers_and_other_files_are_refused() {
        let hunk = "@@ -1 +1 @@\n-a\n+b\n";
        assert_eq!(
            with_file_headers("docs/x.md", hunk).unwrap(),
            format!("--- a/docs/x.md\n+++ b/docs/x.md\n{hunk}")
        );
        let own = format!("--- a/docs/x.md\n+++ b/docs/x.md\n{hunk}");
        assert_eq!(with_file_headers("docs/x.md", &own).unwrap(), own);
        let other = format!("--- a/docs/x.md\n+++ b/workflow.json\n{hunk}");
        assert_eq!(
            with_file_headers("docs/x.md", &other).unwrap_err().code,
            "invalid_arguments"
        );
    }
}
