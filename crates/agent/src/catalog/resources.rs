//! Project files as MCP resources: `agentworks://workflows/{workflow_id}/files/{+path}`.
//!
//! Owns the URI scheme (building, parsing, percent-encoding of the path), the paging cursor
//! and the MIME type shown. Every list and read runs the catalog's own `list_workflows`,
//! `list_files` and `read_file` operations for the caller, so the token's scopes, the live
//! role, the folder caps, the policy and workspaced's guard and confinement apply exactly as
//! they do to the tools. Must never read a file or decide authority itself, and never trust a
//! URI or a cursor: both come from the client.

use percent_encoding::{AsciiSet, NON_ALPHANUMERIC, percent_decode_str, utf8_percent_encode};
use serde_json::{Map, Value, json};

use crate::mcp::{CacheHint, CallError, Caller, Page, ResourceContents, ToolError};

use super::Operation;

/// Every resource URI starts with this.
const PREFIX: &str = "agentworks://workflows/";
/// Between the workflow id and the file's path.
const FILES: &str = "/files/";
/// The one resource template (RFC 6570: `{+path}` keeps the path's slashes).
pub const TEMPLATE: &str = "agentworks://workflows/{workflow_id}/files/{+path}";
/// Resources per `resources/list` page.
const PAGE_SIZE: usize = 100;
/// Files listed per workflow (workspaced's own bound); the template reads any other.
const MAX_FILES_PER_WORKFLOW: u64 = 10_000;
/// The longest cursor read (ours are a workflow id and one path, hex-encoded).
const MAX_CURSOR_BYTES: usize = 16 * 1024;
/// The `_meta` key of a read's revision (what `write_file` and `edit_file` expect back).
pub const REVISION_META: &str = "agentworks/revision";

/// Path bytes written as they are: the RFC 3986 unreserved characters and `/`; everything else
/// (spaces, `%`, `?`, `#`, non-ASCII) is percent-encoded, so a URI names exactly one path.
const PATH_ENCODE: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~')
    .remove(b'/');

/// The URI of `path` in `workflow_id`.
pub fn uri(workflow_id: &str, path: &str) -> String {
    format!(
        "{PREFIX}{workflow_id}{FILES}{}",
        utf8_percent_encode(path, PATH_ENCODE)
    )
}

/// The workflow id and the (decoded) path a URI of ours names; `None` for anything else. The
/// path is not checked here: `read_file`'s guard refuses `..`, absolute paths and symlinks out.
pub fn parse_uri(uri: &str) -> Option<(String, String)> {
    let rest = uri.strip_prefix(PREFIX)?;
    let (workflow_id, path) = rest.split_once(FILES)?;
    let id_ok = !workflow_id.is_empty()
        && workflow_id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
    let path = percent_decode_str(path).decode_utf8().ok()?;
    (id_ok && !path.is_empty() && !path.contains('\0'))
        .then(|| (workflow_id.to_owned(), path.into_owned()))
}

/// Where the next page starts: after `path` in `workflow_id` (workflows in id order).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Cursor {
    workflow_id: String,
    after: String,
}

impl Cursor {
    fn encode(&self) -> String {
        hex::encode(json!([self.workflow_id, self.after]).to_string())
    }

    fn decode(cursor: &str) -> Option<Cursor> {
        if cursor.len() > MAX_CURSOR_BYTES {
            return None;
        }
        let (workflow_id, after): (String, String) =
            serde_json::from_slice(&hex::decode(cursor).ok()?).ok()?;
        Some(Cursor { workflow_id, after })
    }
}

/// The MIME type shown for a file, from its extension; files are read as UTF-8 text.
fn mime_type(path: &str) -> &'static str {
    let extension = path.rsplit_once('.').map(|(_, e)| e.to_ascii_lowercase());
    match extension.as_deref() {
        Some("md" | "markdown") => "text/markdown",
        Some("json") => "application/json",
        Some("yaml" | "yml") => "application/yaml",
        Some("toml") => "application/toml",
        Some("html" | "htm") => "text/html",
        Some("css") => "text/css",
        Some("csv") => "text/csv",
        Some("xml") => "application/xml",
        Some("js" | "mjs") => "text/javascript",
        Some("py") => "text/x-python",
        Some("rs") => "text/x-rust",
        Some("sh") => "text/x-shellscript",
        _ => "text/plain",
    }
}

/// How the resources reach the files: the catalog's own operations, run for the caller with
/// every check a tool call gets (the token's scopes, then the runner's live access).
/// [`super::Catalog`] is the one implementation outside the tests; this module never runs an
/// operation another way.
pub(super) trait Operations {
    fn run(
        &self,
        caller: &Caller,
        operation: Operation,
        arguments: Map<String, Value>,
    ) -> impl std::future::Future<Output = Result<Result<Value, ToolError>, CallError>> + Send;
}

/// One page of the files `caller` may read, across their workflows in id order.
pub(super) async fn page(
    operations: &(impl Operations + Sync),
    caller: &Caller,
    cursor: Option<&str>,
) -> Result<Page, CallError> {
    let start = match cursor {
        None => None,
        Some(cursor) => Some(Cursor::decode(cursor).ok_or_else(|| {
            CallError::InvalidParams("the cursor is not one this server issued".to_owned())
        })?),
    };
    let mut workflows: Vec<(String, String)> = match operations
        .run(caller, Operation::ListWorkflows, Map::new())
        .await?
    {
        Ok(answer) => answer["workflows"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|w| {
                Some((
                    w["workflow_id"].as_str()?.to_owned(),
                    w["name"].as_str().unwrap_or_default().to_owned(),
                ))
            })
            .collect(),
        Err(_) => Vec::new(),
    };
    workflows.sort();
    let mut items = Vec::new();
    // The file last put on the page: the next page starts after it.
    let mut last: Option<Cursor> = None;
    for (workflow_id, name) in workflows {
        let after = match &start {
            Some(start) if workflow_id < start.workflow_id => continue,
            Some(start) if workflow_id == start.workflow_id => Some(start.after.as_str()),
            _ => None,
        };
        let arguments = json!({"workflow_id": workflow_id, "max_entries": MAX_FILES_PER_WORKFLOW});
        let Ok(listed) = operations
            .run(caller, Operation::ListFiles, object(arguments))
            .await?
        else {
            // Not readable (a role without reads, a policy): none of its files are listed.
            continue;
        };
        let mut files: Vec<(&str, Option<u64>)> = listed["entries"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|e| e["kind"] == "file")
            .filter_map(|e| Some((e["path"].as_str()?, e["size"].as_u64())))
            .filter(|(path, _)| after.is_none_or(|after| *path > after))
            .collect();
        files.sort();
        for (path, size) in files {
            if items.len() == PAGE_SIZE {
                return Ok(Page {
                    items,
                    next_cursor: last.as_ref().map(Cursor::encode),
                    cache: CacheHint::default(),
                });
            }
            let mut resource = json!({
                "uri": uri(&workflow_id, path),
                "name": path,
                "title": format!("{path} ({name})"),
                "mimeType": mime_type(path),
            });
            if let Some(size) = size {
                resource["size"] = json!(size);
            }
            items.push(resource);
            last = Some(Cursor {
                workflow_id: workflow_id.clone(),
                after: path.to_owned(),
            });
        }
    }
    Ok(Page {
        items,
        next_cursor: None,
        // Files change and what a token may read is its own: never cached across callers.
        cache: CacheHint::default(),
    })
}

/// The file a URI names, read through `read_file` (its guard and confinement).
pub(super) async fn read(
    operations: &(impl Operations + Sync),
    caller: &Caller,
    resource: &str,
) -> Result<ResourceContents, CallError> {
    let Some((workflow_id, path)) = parse_uri(resource) else {
        return Err(CallError::UnknownResource(resource.to_owned()));
    };
    let arguments = json!({"workflow_id": workflow_id, "path": path});
    match operations
        .run(caller, Operation::ReadFile, object(arguments))
        .await?
    {
        Ok(read) => Ok(ResourceContents {
            contents: vec![json!({
                "uri": resource,
                "mimeType": mime_type(&path),
                "text": read["content"],
                "_meta": {REVISION_META: read["revision"], "agentworks/size": read["size"]},
            })],
            cache: CacheHint::default(),
        }),
        Err(error) if error.code == "not_found" => {
            Err(CallError::UnknownResource(resource.to_owned()))
        }
        Err(error) => Err(refused(error)),
    }
}

/// A resource template object for `resources/templates/list`.
pub fn template() -> Value {
    json!({
        "uriTemplate": TEMPLATE,
        "name": "workflow-file",
        "title": "A file of a workflow",
        "description": "Any file of a workflow this token may read (workflow_id from list_workflows, path relative to the workflow); read as UTF-8 text with its revision in _meta.",
        "mimeType": "text/plain",
    })
}

/// A read the guard or the store refused: -32602 with our stable code in the message, so the
/// client sees why (`path_refused: …`, `forbidden: …`, `not_text: …`).
fn refused(error: ToolError) -> CallError {
    CallError::InvalidParams(format!("{}: {}", error.code, error.message))
}

fn object(value: Value) -> Map<String, Value> {
    match value {
        Value::Object(map) => map,
        _ => Map::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_uri_names_exactly_one_path_and_round_trips() {
        for path in ["a.md", "src/main.rs", "with space/ü #?%.txt", "a%2e%2e/b"] {
            let built = uri("prj_1", path);
            assert!(!built[PREFIX.len()..].contains([' ', '#', '?']), "{built}");
            assert_eq!(
                parse_uri(&built),
                Some(("prj_1".to_owned(), path.to_owned()))
            );
        }
        assert_eq!(
            uri("prj_1", "a b/c.md"),
            "agentworks://workflows/prj_1/files/a%20b/c.md"
        );
    }

    #[test]
    fn foreign_or_malformed_uris_name_nothing() {
        for bad in [
            "",
            "test://static-text",
            "agentworks://workflows/",
            "agentworks://workflows/prj_1/files/",
            "agentworks://workflows//files/a.md",
            "agentworks://workflows/prj 1/files/a.md",
            "agentworks://workflows/../files/a.md",
            "agentworks://workflows/prj_1/other/a.md",
            "agentworks://workflows/prj_1/files/%ff",
            "agentworks://workflows/prj_1/files/a%00b",
        ] {
            assert_eq!(parse_uri(bad), None, "{bad:?}");
        }
        // Traversal decodes to what it says; read_file's guard refuses it (tested end to end).
        assert_eq!(
            parse_uri("agentworks://workflows/prj_1/files/%2e%2e/etc/passwd"),
            Some(("prj_1".to_owned(), "../etc/passwd".to_owned()))
        );
    }

    #[test]
    fn cursors_round_trip_and_junk_is_refused() {
        let cursor = Cursor {
            workflow_id: "prj_1".to_owned(),
            after: "src/ü.rs".to_owned(),
        };
        assert_eq!(Cursor::decode(&cursor.encode()), Some(cursor));
        for junk in ["", "zz", "7b7d", &"00".repeat(MAX_CURSOR_BYTES)] {
            assert_eq!(Cursor::decode(junk), None, "{junk:?}");
        }
    }

    /// Two workflows: `prj_a` with exactly one page of files, `prj_b` with one file whose
    /// path sorts before prj_a's last. Every file is listed on its own URI.
    struct TwoWorkflows;

    impl Operations for TwoWorkflows {
        async fn run(
            &self,
            _caller: &Caller,
            operation: Operation,
            arguments: Map<String, Value>,
        ) -> Result<Result<Value, ToolError>, CallError> {
            Ok(
                match (
                    operation,
                    arguments.get("workflow_id").and_then(Value::as_str),
                ) {
                    (Operation::ListWorkflows, _) => Ok(json!({"workflows": [
                    {"workflow_id": "prj_b", "name": "b"}, {"workflow_id": "prj_a", "name": "a"}]})),
                    (Operation::ListFiles, Some("prj_a")) => Ok(json!({"entries": (0..PAGE_SIZE)
                    .map(|i| json!({"path": format!("f{i:03}.md"), "kind": "file"}))
                    .collect::<Vec<_>>()})),
                    (Operation::ListFiles, Some("prj_b")) => {
                        Ok(json!({"entries": [{"path": "a.md", "kind": "file"}]}))
                    }
                    _ => Err(ToolError::new("not_found", "no such thing")),
                },
            )
        }
    }

    #[tokio::test]
    async fn a_page_ending_at_a_workflows_last_file_continues_with_the_next_workflow() {
        let caller = Caller {
            token_id: "t".into(),
            user_id: "u".into(),
            user_name: "user".into(),
            scopes: vec!["workflows:read".into()],
            reach: None,
        };
        let first = page(&TwoWorkflows, &caller, None).await.unwrap();
        assert_eq!(first.items.len(), PAGE_SIZE);
        assert!(
            first
                .items
                .iter()
                .all(|r| r["uri"].as_str().unwrap().contains("/prj_a/"))
        );
        let cursor = first.next_cursor.expect("a second page");
        let second = page(&TwoWorkflows, &caller, Some(&cursor)).await.unwrap();
        let uris: Vec<&str> = second
            .items
            .iter()
            .filter_map(|r| r["uri"].as_str())
            .collect();
        assert_eq!(uris, [uri("prj_b", "a.md")]);
        assert_eq!(second.next_cursor, None);
    }

    #[test]
    fn mime_types_follow_the_extension() {
        assert_eq!(mime_type("README.MD"), "text/markdown");
        assert_eq!(mime_type("workflow.json"), "application/json");
        assert_eq!(mime_type("Makefile"), "text/plain");
    }
}
