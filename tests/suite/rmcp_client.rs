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
