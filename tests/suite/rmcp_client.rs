//! agentd's `/mcp` through the official Rust MCP SDK (`rmcp`), a client written independently
//! of our transport: it negotiates its own protocol version, sends its own headers and parses
//! our answers with its own model types. Each tool's success and refusal paths run through it.

use super::harness::*;
use rmcp::ServiceExt;
use rmcp::model::{CallToolRequestParams, CallToolResult};
use rmcp::service::{RoleClient, RunningService};
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use serde_json::{Value, json};

type Client = RunningService<RoleClient, ()>;

async fn connect(stack: &Stack, token: &str) -> Client {
    let config = StreamableHttpClientTransportConfig::with_uri(stack.mcp_url()).auth_header(token);
    ().serve(StreamableHttpClientTransport::from_config(config))
        .await
        .expect("the rmcp client connects")
}

/// One `tools/call` through rmcp: `Ok(structuredContent)` or `Err(the error object)` of an
/// `isError` result. A protocol error fails the test with rmcp's own message.
async fn call(client: &Client, tool: &'static str, arguments: Value) -> Result<Value, Value> {
    let Value::Object(arguments) = arguments else {
        panic!("arguments must be an object")
    };
    let result: CallToolResult = client
        .call_tool(CallToolRequestParams::new(tool).with_arguments(arguments))
        .await
        .unwrap_or_else(|e| panic!("{tool}: {e}"));
    let structured = result.structured_content.clone().unwrap_or(Value::Null);
    if result.is_error == Some(true) {
        Err(structured["error"].clone())
    } else {
        Ok(structured)
    }
}

#[test]
fn rmcp_lists_reads_writes_and_sees_every_refusal() {
    let stack = Stack::start();
    let (wf, token) = stack.user_with_project("alice", "demo", &["workflows:write"]);
    let (_, reader) = stack.user_with_project("alice", "demo", &["workflows:read"]);
    std::fs::write(stack.state.documents().join("demo/workflow.json"), "{}").unwrap();
    block_on(async {
        let client = connect(&stack, &token).await;
        let tools = client.list_all_tools().await.unwrap();
        let names: Vec<&str> = tools.iter().map(|t| t.name.as_ref()).collect();
        for expected in ["get_api_spec", "call_tool", "read_file", "write_file"] {
            assert!(
                names.contains(&expected),
                "{expected} missing from {names:?}"
            );
        }
        for tool in &tools {
            let annotations = tool.annotations.as_ref();
            assert!(
                annotations.is_some_and(|a| a.open_world_hint == Some(false)),
                "{} has no openWorldHint: false",
                tool.name
            );
        }

        // Success, replay, conflict and reuse of a request id with another payload.
        let write = |content: &str, expected: &str, id: &str| {
            json!({"workflow_id": wf, "path": "code/a.py", "content": content,
                   "expected_revision": expected, "request_id": id})
        };
        let first = call(&client, "write_file", write("v1\n", "missing", "r1"))
            .await
            .unwrap();
        assert_eq!(first["revision"], revision("v1\n"));
        let replay = call(&client, "write_file", write("v1\n", "missing", "r1"))
            .await
            .unwrap();
        assert_eq!(replay["replayed"], true);
        let conflict = call(&client, "write_file", write("v2\n", "missing", "r2"))
            .await
            .unwrap_err();
        assert_eq!(conflict["code"], "revision_conflict");
        let reused = call(&client, "write_file", write("other\n", "missing", "r1"))
            .await
            .unwrap_err();
        assert_eq!(reused["code"], "request_id_reused");
        let read = call(
            &client,
            "read_file",
            json!({"workflow_id": wf, "path": "code/a.py"}),
        )
        .await
        .unwrap();
        assert_eq!(read["content"], "v1\n");

        // Protected files and paths out of the project are refused, and nothing is written.
        let current = call(
            &client,
            "read_file",
            json!({"workflow_id": wf, "path": "workflow.json"}),
        )
        .await
        .unwrap();
        let protected = call(
            &client,
            "write_file",
            json!({"workflow_id": wf, "path": "workflow.json", "content": "{\"x\":1}",
                   "expected_revision": current["revision"], "request_id": "r3"}),
        )
        .await
        .unwrap_err();
        assert_eq!(
            (protected["code"].as_str(), protected["reason"].as_str()),
            (Some("forbidden"), Some("protected"))
        );
        for path in ["../escape.txt", "/etc/passwd", "code/../../escape.txt"] {
            let refused = call(
                &client,
                "write_file",
                json!({"workflow_id": wf, "path": path, "content": "x",
                       "expected_revision": "missing", "request_id": format!("t-{path}")}),
            )
            .await
            .unwrap_err();
            assert!(
                ["path_refused", "forbidden"].contains(&refused["code"].as_str().unwrap_or("")),
                "{path}: {refused}"
            );
        }
        assert!(!stack.state.documents().join("escape.txt").exists());
        client.cancel().await.unwrap();

        // A read-only token does not even see the write tool, and calling it is refused.
        let client = connect(&stack, &reader).await;
        let tools = client.list_all_tools().await.unwrap();
        assert!(tools.iter().all(|t| t.name != "write_file"));
        let refused = client
            .call_tool(
                CallToolRequestParams::new("write_file").with_arguments(
                    write("v3\n", &revision("v1\n"), "r4")
                        .as_object()
                        .unwrap()
                        .clone(),
                ),
            )
            .await;
        assert!(refused.is_err() || refused.unwrap().is_error == Some(true));
        client.cancel().await.unwrap();
    });
    assert_eq!(
        std::fs::read_to_string(stack.state.documents().join("demo/code/a.py")).unwrap(),
        "v1\n"
    );
}

/// Every file tool of part 3 through rmcp: success, a stale revision, a replay, a request id
/// reused with another payload, a protected file, traversal, and a read token; then the disk.
#[test]
fn rmcp_drives_every_file_tool_through_success_and_refusal() {
    let stack = Stack::start();
    let (wf, token) = stack.user_with_project("alice", "demo", &["workflows:write"]);
    let reader = stack.token("alice", &["workflows:read"], json!({}));
    let demo = stack.state.documents().join("demo");
    for (path, content) in [
        ("notes.md", "one\ntwo\nthree\n"),
        ("workflow.json", "{}"),
        ("old.md", "move me\n"),
        ("gone.md", "delete me\n"),
        ("src/a.rs", "fn a() {}\n"),
    ] {
        std::fs::create_dir_all(demo.join(path).parent().unwrap()).unwrap();
        std::fs::write(demo.join(path), content).unwrap();
    }
    let stale = format!("sha256:{}", "0".repeat(64));
    block_on(async {
        let client = connect(&stack, &token).await;
        let args = |extra: Value| {
            let mut all = json!({"workflow_id": wf});
            all.as_object_mut()
                .unwrap()
                .extend(extra.as_object().unwrap().clone());
            all
        };
        let code = |refused: Result<Value, Value>| {
            refused.expect_err("refused")["code"]
                .as_str()
                .unwrap_or("")
                .to_owned()
        };

        // Reads: a range with the total line count, several paths, info, a bounded listing.
        let ranged = call(
            &client,
            "read_file",
            args(json!({"path": "notes.md", "offset": 1, "limit": 1})),
        )
        .await
        .unwrap();
        assert_eq!(
            (ranged["content"].as_str(), ranged["total_lines"].as_u64()),
            (Some("two\n"), Some(3))
        );
        let many = call(
            &client,
            "read_files",
            args(json!({"paths": ["notes.md", "../x", "absent.md"]})),
        )
        .await
        .unwrap();
        assert_eq!(
            (many["read"].as_u64(), many["failed"].as_u64()),
            (Some(1), Some(2)),
            "{many}"
        );
        assert_eq!(many["files"][1]["error"]["code"], "path_refused", "{many}");
        let info = call(&client, "get_file_info", args(json!({"path": "notes.md"})))
            .await
            .unwrap();
        assert_eq!(info["revision"], revision("one\ntwo\nthree\n"));
        assert_eq!(info["size"], 14);
        let listed = call(
            &client,
            "list_files",
            args(json!({"depth": 1, "exclude": ["*.md"]})),
        )
        .await
        .unwrap();
        let paths: Vec<&str> = listed["entries"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|e| e["path"].as_str())
            .collect();
        assert!(
            paths.contains(&"src") && !paths.contains(&"src/a.rs") && !paths.contains(&"notes.md"),
            "{paths:?}"
        );

        // edit_file: dry run, apply, replay, reuse, stale, protected, traversal.
        let notes = revision("one\ntwo\nthree\n");
        let edit = |id: &str, old: &str, expected: &str| {
            args(
                json!({"path": "notes.md", "edits": [{"old_text": old, "new_text": "TWO\n"}],
                        "expected_revision": expected, "request_id": id}),
            )
        };
        let mut dry = edit("e1", "two\n", &notes);
        dry["dry_run"] = json!(true);
        let preview = call(&client, "edit_file", dry).await.unwrap();
        assert_eq!(preview["revision"], revision("one\nTWO\nthree\n"));
        let applied = call(&client, "edit_file", edit("e1", "two\n", &notes))
            .await
            .unwrap();
        assert_eq!(
            (
                applied["state"].as_str(),
                applied["diff"] == preview["diff"]
            ),
            (Some("applied"), true)
        );
        let replay = call(&client, "edit_file", edit("e1", "two\n", &notes))
            .await
            .unwrap();
        assert_eq!(replay["replayed"], true);
        assert_eq!(
            code(call(&client, "edit_file", edit("e1", "one\n", &notes)).await),
            "request_id_reused"
        );
        assert_eq!(
            code(call(&client, "edit_file", edit("e2", "one\n", &stale)).await),
            "revision_conflict"
        );
        let protected = call(
            &client,
            "edit_file",
            args(
                json!({"path": "workflow.json", "edits": [{"old_text": "{}", "new_text": "[]"}],
                        "expected_revision": revision("{}"), "request_id": "e3"}),
            ),
        )
        .await
        .unwrap_err();
        assert_eq!(protected["reason"], "protected", "{protected}");
        let escape = call(
            &client,
            "edit_file",
            args(
                json!({"path": "../demo/notes.md", "edits": [{"old_text": "one", "new_text": "1"}],
                        "expected_revision": revision("one\nTWO\nthree\n"), "request_id": "e4"}),
            ),
        )
        .await;
        assert_eq!(code(escape), "path_refused");

        // move_file and delete_file: apply, replay, reuse, stale, protected, traversal.
        let old = revision("move me\n");
        let mv = |id: &str, to: &str, expected: &str| {
            args(
                json!({"path": "old.md", "to_path": to, "expected_revision": expected, "request_id": id}),
            )
        };
        assert_eq!(
            code(call(&client, "move_file", mv("m0", "moved.md", &stale)).await),
            "revision_conflict"
        );
        let moved = call(&client, "move_file", mv("m1", "moved.md", &old))
            .await
            .unwrap();
        assert_eq!(moved["state"], "applied");
        assert_eq!(
            call(&client, "move_file", mv("m1", "moved.md", &old))
                .await
                .unwrap()["replayed"],
            true
        );
        assert_eq!(
            code(call(&client, "move_file", mv("m1", "other.md", &old)).await),
            "request_id_reused"
        );
        let onto_protected = call(
            &client,
            "move_file",
            args(json!({"path": "moved.md", "to_path": "product.json", "expected_revision": old, "request_id": "m2"})),
        )
        .await
        .unwrap_err();
        assert_eq!(onto_protected["reason"], "protected", "{onto_protected}");
        let out = call(
            &client,
            "move_file",
            args(json!({"path": "moved.md", "to_path": "/tmp/escaped.md", "expected_revision": old, "request_id": "m3"})),
        )
        .await;
        assert_eq!(code(out), "path_refused");
        let gone = revision("delete me\n");
        let del = |id: &str, path: &str, expected: &str| {
            args(json!({"path": path, "expected_revision": expected, "request_id": id}))
        };
        assert_eq!(
            code(call(&client, "delete_file", del("d0", "gone.md", &stale)).await),
            "revision_conflict"
        );
        assert_eq!(
            call(&client, "delete_file", del("d1", "gone.md", &gone))
                .await
                .unwrap()["revision"],
            "missing"
        );
        assert_eq!(
            call(&client, "delete_file", del("d1", "gone.md", &gone))
                .await
                .unwrap()["replayed"],
            true
        );
        assert_eq!(
            code(call(&client, "delete_file", del("d1", "notes.md", &gone)).await),
            "request_id_reused"
        );
        let protected = call(
            &client,
            "delete_file",
            del("d2", "workflow.json", &revision("{}")),
        )
        .await
        .unwrap_err();
        assert_eq!(protected["reason"], "protected", "{protected}");
        assert_eq!(
            code(
                call(
                    &client,
                    "delete_file",
                    del("d3", "../../etc/hostname", &gone)
                )
                .await
            ),
            "path_refused"
        );
        client.cancel().await.unwrap();

        // A read token sees no change tool, and calling one is refused.
        let client = connect(&stack, &reader).await;
        let names: Vec<String> = client
            .list_all_tools()
            .await
            .unwrap()
            .iter()
            .map(|t| t.name.to_string())
            .collect();
        for change in ["edit_file", "move_file", "delete_file"] {
            assert!(
                !names.iter().any(|n| n == change),
                "{change} listed for a read token: {names:?}"
            );
        }
        assert!(
            names.iter().any(|n| n == "read_files") && names.iter().any(|n| n == "get_file_info")
        );
        let refused = client
            .call_tool(
                CallToolRequestParams::new("delete_file").with_arguments(
                    del("d4", "notes.md", &revision("one\nTWO\nthree\n"))
                        .as_object()
                        .unwrap()
                        .clone(),
                ),
            )
            .await;
        assert!(refused.is_err() || refused.unwrap().is_error == Some(true));
        client.cancel().await.unwrap();
    });
    let read = |path: &str| std::fs::read_to_string(demo.join(path)).ok();
    assert_eq!(read("notes.md").as_deref(), Some("one\nTWO\nthree\n"));
    assert_eq!(read("moved.md").as_deref(), Some("move me\n"));
    assert_eq!(
        (read("old.md"), read("gone.md"), read("product.json")),
        (None, None, None)
    );
    assert_eq!(read("workflow.json").as_deref(), Some("{}"));
    assert!(!std::path::Path::new("/tmp/escaped.md").exists());
}

/// Project files as resources through rmcp: paged listing of exactly the files the token may
/// read, reads with the MIME type and the revision in `_meta`, the template, and the guard:
/// traversal (also percent-encoded), a symlink out and another user's workflow are refused.
#[test]
fn rmcp_lists_and_reads_project_files_as_resources_under_the_read_guard() {
    use rmcp::model::{PaginatedRequestParams, ReadResourceRequestParams};
    let stack = Stack::start();
    let (wf, _) = stack.user_with_project("alice", "demo", &["workflows:read"]);
    let (other_wf, _) = stack.user_with_project("alice", "second", &["workflows:read"]);
    let (bobs_wf, _) = stack.user_with_project("bob", "bobs", &["workflows:read"]);
    let token = stack.token("alice", &["workflows:read"], json!({"project": "demo"}));
    let documents = stack.state.documents();
    for i in 0..120 {
        let file = documents.join(format!("demo/src/f{i:03}.rs"));
        std::fs::create_dir_all(file.parent().unwrap()).unwrap();
        std::fs::write(file, format!("// {i}\n")).unwrap();
    }
    std::fs::write(documents.join("demo/notes with space.md"), "# notes\n").unwrap();
    std::fs::write(documents.join("second/hidden.md"), "SECRET-SECOND\n").unwrap();
    std::fs::write(documents.join("bobs/secret.md"), "SECRET-BOB\n").unwrap();
    std::fs::write(stack.state.root().join("outside.txt"), "SECRET-OUTSIDE\n").unwrap();
    std::os::unix::fs::symlink(
        stack.state.root().join("outside.txt"),
        documents.join("demo/link.md"),
    )
    .unwrap();
    let uri =
        |workflow: &str, path: &str| format!("agentworks://workflows/{workflow}/files/{path}");
    block_on(async {
        let client = connect(&stack, &token).await;
        let first = client.list_resources(None).await.unwrap();
        assert_eq!(first.resources.len(), 100);
        let cursor = first.next_cursor.clone().expect("a second page");
        let second = client
            .list_resources(Some(
                PaginatedRequestParams::default().with_cursor(Some(cursor)),
            ))
            .await
            .unwrap();
        assert_eq!(second.next_cursor, None);
        let all: Vec<Value> = first
            .resources
            .iter()
            .chain(&second.resources)
            .map(|r| serde_json::to_value(r).unwrap())
            .collect();
        let uris: Vec<&str> = all.iter().filter_map(|r| r["uri"].as_str()).collect();
        // 120 sources and the notes: no symlink, nothing of the second workflow or of bob's.
        assert_eq!(uris.len(), 121, "{uris:?}");
        assert!(
            uris.contains(&uri(&wf, "notes%20with%20space.md").as_str()),
            "{uris:?}"
        );
        assert!(
            uris.iter()
                .all(|u| u.starts_with(&uri(&wf, "")) && !u.ends_with("link.md")),
            "{uris:?}"
        );
        let notes = all
            .iter()
            .find(|r| r["name"] == "notes with space.md")
            .unwrap();
        assert_eq!(notes["mimeType"], "text/markdown");

        let read = client
            .read_resource(ReadResourceRequestParams::new(uri(
                &wf,
                "notes%20with%20space.md",
            )))
            .await
            .unwrap();
        let contents = serde_json::to_value(&read.contents).unwrap();
        assert_eq!(contents[0]["text"], "# notes\n");
        assert_eq!(contents[0]["mimeType"], "text/markdown");
        assert_eq!(
            contents[0]["_meta"]["agentworks/revision"],
            revision("# notes\n")
        );

        let templates = client.list_resource_templates(None).await.unwrap();
        let templates = serde_json::to_value(&templates.resource_templates).unwrap();
        assert_eq!(
            templates[0]["uriTemplate"],
            "agentworks://workflows/{workflow_id}/files/{+path}"
        );

        // Refused: traversal (plain and encoded), a symlink out, a workflow outside the token,
        // another user's workflow, a foreign scheme. Each is a JSON-RPC error, never content.
        for (target, expect) in [
            (uri(&wf, "../second/hidden.md"), "path_refused"),
            (uri(&wf, "%2e%2e/%2e%2e/outside.txt"), "path_refused"),
            (uri(&wf, "link.md"), "path_refused"),
            (uri(&other_wf, "hidden.md"), "ErrorCode(-32602)"),
            (uri(&bobs_wf, "secret.md"), "ErrorCode(-32602)"),
            ("file:///etc/passwd".to_owned(), "ErrorCode(-32602)"),
        ] {
            let refused = client
                .read_resource(ReadResourceRequestParams::new(target.clone()))
                .await;
            let message = format!("{:?}", refused.expect_err(&target));
            assert!(
                message.contains("ErrorCode(-32602)") && message.contains(expect),
                "{target}: {message}"
            );
            assert!(!message.contains("SECRET"), "{target}: {message}");
        }
        client.cancel().await.unwrap();
    });
}

/// `apply_patch` through rmcp: a multi-file set applies with one receipt per file, replays,
/// refuses reuse, a stale revision, a protected file and traversal; then workspaced is killed
/// (SIGKILL at a failpoint) between the first and the second file of a set, and after its
/// restart the receipt lookup through MCP reports each file as the disk has it.
#[test]
fn rmcp_applies_patch_sets_and_reads_each_files_state_after_a_crash_in_the_middle() {
    use std::os::unix::process::ExitStatusExt;
    let mut stack = Stack::start();
    let (wf, token) = stack.user_with_project("alice", "demo", &["workflows:write"]);
    let demo = stack.state.documents().join("demo");
    for (path, content) in [
        ("one.md", "one\n"),
        ("two.md", "two\n"),
        ("workflow.json", "{}\n"),
    ] {
        std::fs::write(demo.join(path), content).unwrap();
    }
    let read = |path: &str| std::fs::read_to_string(demo.join(path)).ok();
    let set = "--- a/one.md\n+++ b/one.md\n@@ -1 +1 @@\n-one\n+ONE\n\
               --- a/two.md\n+++ /dev/null\n@@ -1 +0,0 @@\n-two\n\
               --- /dev/null\n+++ b/three.md\n@@ -0,0 +1 @@\n+three\n";
    let revisions = json!({"one.md": revision("one\n"), "two.md": revision("two\n")});
    let patch = |diff: &str, expected: &Value, id: &str| json!({"workflow_id": wf, "diff": diff, "expected_revisions": expected, "request_id": id});

    // The crash first: the set is killed after one.md's rename, before two.md. The running
    // workspaced stops first (a new one would find the socket answered by the old).
    stack.workspaced.stop();
    stack.workspaced = Workspaced::start_with(
        &stack.state,
        Options {
            failpoint: Some("patch_set_renamed_1".into()),
            ..Options::default()
        },
    );
    block_on(async {
        let client = connect(&stack, &token).await;
        let killed = call(&client, "apply_patch", patch(set, &revisions, "crash")).await;
        assert!(killed.is_err(), "{killed:?}");
        client.cancel().await.unwrap();
    });
    assert_eq!(stack.workspaced.child.wait().unwrap().signal(), Some(9));
    assert_eq!(
        (
            read("one.md").as_deref(),
            read("two.md").as_deref(),
            read("three.md")
        ),
        (Some("ONE\n"), Some("two\n"), None)
    );
    stack.workspaced = Workspaced::start(&stack.state);
    block_on(async {
        let client = connect(&stack, &token).await;
        let receipt = call(
            &client,
            "get_write_receipt",
            json!({"workflow_id": wf, "request_id": "crash"}),
        )
        .await
        .unwrap();
        assert_eq!(receipt["receipt"]["state"], "uncertain", "{receipt}");
        let files: Vec<(&str, &str)> = receipt["files"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| (r["path"].as_str().unwrap(), r["state"].as_str().unwrap()))
            .collect();
        assert_eq!(
            files,
            [
                ("one.md", "applied"),
                ("two.md", "not_applied"),
                ("three.md", "not_applied")
            ]
        );

        // The rest as a new set: applies, replays, and its id cannot carry another diff.
        let rest = "--- a/two.md\n+++ /dev/null\n@@ -1 +0,0 @@\n-two\n\
                    --- /dev/null\n+++ b/three.md\n@@ -0,0 +1 @@\n+three\n";
        let applied = call(&client, "apply_patch", patch(rest, &json!({}), "rest"))
            .await
            .unwrap();
        assert_eq!(applied["state"], "applied", "{applied}");
        assert_eq!(applied["files"].as_array().map(Vec::len), Some(2));
        let replay = call(&client, "apply_patch", patch(rest, &json!({}), "rest"))
            .await
            .unwrap();
        assert_eq!(replay["replayed"], true);
        let code = |r: Result<Value, Value>| {
            r.expect_err("refused")["code"]
                .as_str()
                .unwrap_or("")
                .to_owned()
        };
        assert_eq!(
            code(call(&client, "apply_patch", patch(set, &revisions, "rest")).await),
            "request_id_reused"
        );
        // one.md is ONE now: the original revision is stale, and the conflict names the file.
        let stale = call(&client, "apply_patch", patch(set, &revisions, "stale"))
            .await
            .unwrap_err();
        assert_eq!(
            (stale["code"].as_str(), stale["path"].as_str()),
            (Some("revision_conflict"), Some("one.md")),
            "{stale}"
        );
        let protected = call(
            &client,
            "apply_patch",
            patch(
                "--- a/workflow.json\n+++ b/workflow.json\n@@ -1 +1 @@\n-{}\n+[]\n",
                &json!({"workflow.json": revision("{}\n")}),
                "protected",
            ),
        )
        .await
        .unwrap_err();
        assert_eq!(protected["reason"], "protected", "{protected}");
        for target in ["../escape.md", "/tmp/escape.md"] {
            let diff = format!("--- /dev/null\n+++ {target}\n@@ -0,0 +1 @@\n+x\n");
            assert_eq!(
                code(call(&client, "apply_patch", patch(&diff, &json!({}), target)).await),
                "path_refused"
            );
        }
        client.cancel().await.unwrap();
    });
    assert_eq!(
        (
            read("one.md").as_deref(),
            read("two.md"),
            read("three.md").as_deref()
        ),
        (Some("ONE\n"), None, Some("three\n"))
    );
    assert_eq!(read("workflow.json").as_deref(), Some("{}\n"));
    assert!(!stack.state.documents().join("escape.md").exists());
}
