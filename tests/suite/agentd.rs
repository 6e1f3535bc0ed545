//! agentd end to end: the authority matrix through the real MCP endpoint, operator peer
//! checks, and agentworksctl. Each cell of the matrix is its own test.

use super::harness::*;
use agentworks_support::unix_http::{ClientError, UnixClient};
use serde_json::json;

fn write(
    stack: &Stack,
    token: &str,
    workflow: &str,
    path: &str,
    content: &str,
    expected: &str,
    id: &str,
) -> Result<serde_json::Value, serde_json::Value> {
    tool_result(
        stack.port,
        token,
        "write_file",
        json!({"workflow_id": workflow, "path": path, "content": content, "expected_revision": expected, "request_id": id}),
    )
}

#[test]
fn read_only_and_run_only_tokens_cannot_write() {
    let stack = Stack::start();
    let (wf, _) = stack.user_with_project("alice", "demo", &["workflows:write"]);
    for scope in ["workflows:read", "workflows:run"] {
        let token = stack.token("alice", &[scope], json!({}));
        // It can read.
        assert!(tool_result(stack.port, &token, "list_files", json!({"workflow_id": wf})).is_ok());
        // The write tool is refused at the HTTP layer with insufficient_scope.
        let (status, _) = mcp_call(
            stack.port,
            &token,
            "write_file",
            json!({"workflow_id": wf, "path": "a.txt", "content": "x", "expected_revision": "missing", "request_id": "r"}),
        );
        assert_eq!(status, 403, "{scope}");
        assert!(!stack.state.documents().join("demo/a.txt").exists());
    }
}

#[test]
fn a_runner_cannot_write_even_with_a_write_token() {
    let stack = Stack::start();
    let (wf, _) = stack.user_with_project("alice", "demo", &["workflows:write"]);
    stack.admin("users/add", json!({"name": "rita"}));
    stack.admin(
        "members/add",
        json!({"project": "demo", "user": "rita", "role": "runner"}),
    );
    let token = stack.token("rita", &["workflows:write"], json!({}));
    let err = write(&stack, &token, &wf, "a.txt", "x", "missing", "r1").unwrap_err();
    assert_eq!(err["code"], "forbidden", "{err}");
    assert!(
        tool_result(
            stack.port,
            &token,
            "read_file",
            json!({"workflow_id": wf, "path": "README.md"})
        )
        .is_err(),
        "no README yet"
    );
    assert!(!stack.state.documents().join("demo/a.txt").exists());
}

#[test]
fn folder_caps_narrow_writes() {
    let stack = Stack::start();
    let (wf, _) = stack.user_with_project("alice", "demo", &["workflows:write"]);
    let token = stack.token(
        "alice",
        &["workflows:write"],
        json!({"write_folders": ["code"], "read_only_folders": ["code/vendor"]}),
    );
    assert!(write(&stack, &token, &wf, "code/task.py", "x", "missing", "c1").is_ok());
    let err = write(&stack, &token, &wf, "docs/a.md", "x", "missing", "c2").unwrap_err();
    assert_eq!(
        (err["code"].as_str(), err["reason"].as_str()),
        (Some("forbidden"), Some("outside_write_paths")),
        "{err}"
    );
    let err = write(
        &stack,
        &token,
        &wf,
        "code/vendor/lib.py",
        "x",
        "missing",
        "c3",
    )
    .unwrap_err();
    assert_eq!(err["reason"], "read_only", "{err}");
}

#[test]
fn project_policy_narrows_and_blocks() {
    let stack = Stack::start();
    stack.admin("users/add", json!({"name": "alice"}));
    stack.admin(
        "projects/add",
        json!({"name": "pol", "kind": "workflow", "owner": "alice",
               "policy": {"write_paths": ["code"], "blocked_paths": ["secret"], "blocked_write_paths": ["code/locked"]}}),
    );
    std::fs::create_dir_all(stack.state.documents().join("pol/secret")).unwrap();
    std::fs::write(stack.state.documents().join("pol/secret/key"), "k").unwrap();
    let token = stack.token("alice", &["workflows:write"], json!({}));
    assert!(write(&stack, &token, "pol", "code/a.py", "x", "missing", "p1").is_ok());
    assert_eq!(
        write(&stack, &token, "pol", "docs/a.md", "x", "missing", "p2").unwrap_err()["reason"],
        "outside_write_paths"
    );
    assert_eq!(
        write(&stack, &token, "pol", "code/locked/a", "x", "missing", "p3").unwrap_err()["reason"],
        "read_only"
    );
    let err = tool_result(
        stack.port,
        &token,
        "read_file",
        json!({"workflow_id": "pol", "path": "secret/key"}),
    )
    .unwrap_err();
    assert_eq!(err["reason"], "blocked", "{err}");
    // Even a token whose caps name the blocked folder cannot widen past the policy.
    let wide = stack.token(
        "alice",
        &["workflows:write"],
        json!({"write_folders": ["secret"]}),
    );
    assert!(write(&stack, &wide, "pol", "secret/new", "x", "missing", "p4").is_err());
}

#[test]
fn protected_files_refuse_even_in_a_writable_folder() {
    let stack = Stack::start();
    let (wf, token) = stack.user_with_project("alice", "demo", &["workflows:write"]);
    std::fs::write(stack.state.documents().join("demo/workflow.json"), "{}").unwrap();
    let current = tool_result(
        stack.port,
        &token,
        "read_file",
        json!({"workflow_id": wf, "path": "workflow.json"}),
    )
    .unwrap();
    let err = write(
        &stack,
        &token,
        &wf,
        "workflow.json",
        "{\"x\":1}",
        current["revision"].as_str().unwrap(),
        "w1",
    )
    .unwrap_err();
    assert_eq!(
        (err["code"].as_str(), err["reason"].as_str()),
        (Some("forbidden"), Some("protected"))
    );
    assert_eq!(
        write(
            &stack,
            &token,
            &wf,
            "sub/product.json",
            "{}",
            "missing",
            "w2"
        )
        .unwrap_err()["reason"],
        "protected"
    );
    assert_eq!(
        std::fs::read_to_string(stack.state.documents().join("demo/workflow.json")).unwrap(),
        "{}"
    );
}

#[test]
fn another_users_workflow_is_invisible() {
    let stack = Stack::start();
    let (alice_wf, alice) = stack.user_with_project("alice", "alices", &["workflows:write"]);
    let (_, bob) = stack.user_with_project("bob", "bobs", &["workflows:write"]);
    std::fs::write(
        stack.state.documents().join("alices/private.md"),
        "alice only",
    )
    .unwrap();
    let listed = tool_result(stack.port, &bob, "list_workflows", json!({})).unwrap();
    let names: Vec<_> = listed["workflows"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| w["name"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(names, vec!["bobs"]);
    for (tool, args) in [
        (
            "read_file",
            json!({"workflow_id": alice_wf, "path": "private.md"}),
        ),
        ("list_files", json!({"workflow_id": alice_wf})),
        (
            "search_files",
            json!({"workflow_id": alice_wf, "query": "alice"}),
        ),
    ] {
        let err = tool_result(stack.port, &bob, tool, args).unwrap_err();
        assert_eq!(err["code"], "not_found", "{tool}: {err}");
        assert!(!err.to_string().contains("alice only"));
    }
    // Idempotency keys are scoped to the caller.
    write(
        &stack,
        &alice,
        &alice_wf,
        "a.md",
        "a",
        "missing",
        "shared-id",
    )
    .unwrap();
    let (bob_wf, _) = stack.user_with_project("bob", "bobs", &["workflows:write"]);
    let err = tool_result(
        stack.port,
        &bob,
        "get_write_receipt",
        json!({"workflow_id": bob_wf, "request_id": "shared-id"}),
    )
    .unwrap_err();
    assert_eq!(err["code"], "not_found");
}

#[test]
fn revoked_expired_and_devices_tokens_are_refused() {
    let stack = Stack::start();
    let (wf, token) = stack.user_with_project("alice", "demo", &["workflows:write"]);
    assert!(tool_result(stack.port, &token, "list_workflows", json!({})).is_ok());
    let id = stack.admin("tokens/list", json!({"user": "alice"}))[0]["id"]
        .as_str()
        .unwrap()
        .to_owned();
    stack.admin("tokens/revoke", json!({"id": id}));
    let (status, _) = mcp_call(stack.port, &token, "list_workflows", json!({}));
    assert_eq!(status, 401);

    // Valid for 3 s (room for a loaded machine between making it and using it), then expired.
    let expires_at_ms = agentworks_agent::identity::store::now_ms() + 3_000;
    let soon = stack.token(
        "alice",
        &["workflows:write"],
        json!({ "expires_at_ms": expires_at_ms }),
    );
    assert_eq!(
        mcp_call(stack.port, &soon, "list_workflows", json!({})).0,
        200
    );
    let left = expires_at_ms - agentworks_agent::identity::store::now_ms();
    std::thread::sleep(std::time::Duration::from_millis(left.max(0) as u64 + 100));
    assert_eq!(
        mcp_call(stack.port, &soon, "list_workflows", json!({})).0,
        401
    );

    let devices = stack.token("alice", &["devices:connect"], json!({}));
    let (status, _) = mcp_call(
        stack.port,
        &devices,
        "read_file",
        json!({"workflow_id": wf, "path": "a"}),
    );
    assert_eq!(status, 403);

    let (status, headers, _) = http(
        stack.port,
        "POST",
        "/mcp",
        &[("content-type", "application/json")],
        "{}",
    );
    assert_eq!(status, 401);
    let challenge = headers.get("www-authenticate").unwrap().to_str().unwrap();
    assert!(challenge.contains("resource_metadata="), "{challenge}");
    let bogus = format!("awt_{}_{}", "0".repeat(16), "0".repeat(64));
    assert_eq!(
        mcp_call(stack.port, &bogus, "list_workflows", json!({})).0,
        401
    );
}

/// Refusals of a JSON-RPC request through the real listener, including the ones it makes before
/// reading the body (the screen, the body limit): a JSON-RPC error with id `null`, our stable
/// code and message in `data`, the HTTP status and challenge unchanged; a GET keeps the
/// envelope, and a body that is not JSON says where it broke.
#[test]
fn refusals_of_json_rpc_requests_are_json_rpc_errors_clients_can_read() {
    let stack = Stack::start();
    let (_, token) = stack.user_with_project("alice", "demo", &["workflows:write"]);
    let json_post = [("content-type", "application/json")];
    let (status, headers, body) = http(
        stack.port,
        "POST",
        "/mcp",
        &json_post,
        r#"{"jsonrpc":"2.0","id":5,"method":"tools/list"}"#,
    );
    assert_eq!(status, 401, "{body}");
    assert!(headers.contains_key("www-authenticate"));
    let body: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(body["jsonrpc"], "2.0");
    // Refused from the head, before the body (and its id) was read.
    assert_eq!(body["id"], serde_json::Value::Null);
    assert_eq!(body["error"]["code"], -32010);
    assert_eq!(body["error"]["data"]["code"], "missing_token");
    assert_eq!(body["error"]["message"], body["error"]["data"]["message"]);

    let (status, _, body) = http(stack.port, "GET", "/mcp", &[], "");
    assert_eq!(status, 401, "{body}");
    let body: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(body["error"]["code"], "missing_token", "{body}");

    // Over the body limit, declared: 413 before a byte of it is read.
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", stack.port)).unwrap();
    write!(
        stream,
        "POST /mcp HTTP/1.1\r\nhost: x\r\nauthorization: Bearer {token}\r\n\
         content-type: application/json\r\ncontent-length: {}\r\n\r\n",
        64 * 1024 * 1024
    )
    .unwrap();
    stream
        .set_read_timeout(Some(std::time::Duration::from_secs(30)))
        .unwrap();
    let mut answer = String::new();
    let _ = stream.read_to_string(&mut answer);
    assert!(answer.starts_with("HTTP/1.1 413"), "{answer}");
    let body: serde_json::Value =
        serde_json::from_str(answer.split("\r\n\r\n").nth(1).unwrap_or_default()).unwrap();
    assert_eq!(body["id"], serde_json::Value::Null);
    assert_eq!(body["error"]["code"], -32600);
    assert_eq!(body["error"]["data"]["code"], "too_large");
    assert!(body["error"]["data"]["max_body_bytes"].is_u64(), "{body}");

    let auth = format!("Bearer {token}");
    let (status, _, body) = http(
        stack.port,
        "POST",
        "/mcp",
        &[
            ("content-type", "application/json"),
            ("authorization", &auth),
        ],
        "{\"jsonrpc\": \"2.0\", \"id\": 1,\n \"method\": }",
    );
    assert_eq!(status, 400, "{body}");
    let body: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(body["error"]["code"], -32700);
    let message = body["error"]["message"].as_str().unwrap();
    assert!(message.contains("at line 2 column"), "{message}");
}

/// A disabled user's tokens get one refusal code everywhere: the MCP endpoint, the chat API and
/// gatewayd's token check (which once said `token_disabled` where the others said
/// `user_disabled`).
#[test]
fn a_disabled_users_tokens_are_refused_with_one_code_at_every_endpoint() {
    let stack = Stack::start();
    stack.user_with_project("alice", "demo", &["workflows:write"]);
    let workflows = stack.token("alice", &["workflows:write"], json!({}));
    let devices = stack.token("alice", &["devices:connect"], json!({}));
    let token_check = |token: &str| {
        block_on(
            UnixClient::new(stack.agentd_socket())
                .post::<_, serde_json::Value>("/v1/gateway/token-check", &json!({"token": token})),
        )
    };
    assert!(token_check(&devices).is_ok());
    stack.admin("users/disable", json!({"name": "alice"}));

    let (status, body) = mcp_call(stack.port, &workflows, "list_workflows", json!({}));
    assert_eq!(status, 401, "{body}");
    assert!(body.to_string().contains("user_disabled"), "{body}");
    let (status, _, body) = http(
        stack.port,
        "GET",
        "/v1/chats",
        &[("authorization", &format!("Bearer {workflows}"))],
        "",
    );
    assert_eq!(status, 401, "{body}");
    assert!(body.contains("\"user_disabled\""), "{body}");
    match token_check(&devices) {
        Err(ClientError::Remote { status, body }) => {
            assert_eq!(status, 401);
            assert_eq!(body.code, "user_disabled", "{}", body.message);
        }
        other => panic!("token-check of a disabled user's token: {other:?}"),
    }
}

#[test]
fn a_role_removed_between_two_calls_counts_on_the_second() {
    let stack = Stack::start();
    let (wf, _) = stack.user_with_project("alice", "demo", &["workflows:write"]);
    stack.admin("users/add", json!({"name": "eve"}));
    stack.admin(
        "members/add",
        json!({"project": "demo", "user": "eve", "role": "editor"}),
    );
    let token = stack.token("eve", &["workflows:write"], json!({}));
    assert!(write(&stack, &token, &wf, "e.md", "1", "missing", "e1").is_ok());
    stack.admin("members/remove", json!({"project": "demo", "user": "eve"}));
    // No project grants eve a write any more, so the live catalog refuses the operation.
    let err = write(&stack, &token, &wf, "e2.md", "2", "missing", "e2").unwrap_err();
    assert_eq!(err["code"], "forbidden", "{err}");
    assert!(!stack.state.documents().join("demo/e2.md").exists());
    let err = tool_result(
        stack.port,
        &token,
        "read_file",
        json!({"workflow_id": wf, "path": "e.md"}),
    )
    .unwrap_err();
    // With no project left, even reading is refused, naming no workflow.
    assert_eq!(err["code"], "forbidden", "{err}");
    assert!(!err.to_string().contains("demo"), "{err}");
    // Downgraded instead of removed: reads work, writes do not.
    stack.admin(
        "members/add",
        json!({"project": "demo", "user": "eve", "role": "viewer"}),
    );
    assert!(
        tool_result(
            stack.port,
            &token,
            "read_file",
            json!({"workflow_id": wf, "path": "e.md"})
        )
        .is_ok()
    );
    assert_eq!(
        write(&stack, &token, &wf, "e3.md", "3", "missing", "e3").unwrap_err()["code"],
        "forbidden"
    );
}

#[test]
fn write_conflict_replay_and_receipt_through_mcp() {
    let stack = Stack::start();
    let (wf, token) = stack.user_with_project("alice", "demo", &["workflows:write"]);
    let first = write(
        &stack,
        &token,
        &wf,
        "code/task.py",
        "print('v1')\n",
        "missing",
        "m1",
    )
    .unwrap();
    assert_eq!(first["state"], "applied");
    assert_eq!(first["revision"], revision("print('v1')\n"));
    let again = write(
        &stack,
        &token,
        &wf,
        "code/task.py",
        "print('v1')\n",
        "missing",
        "m1",
    )
    .unwrap();
    assert_eq!(again["replayed"], true);
    assert_eq!(again["receipt_id"], first["receipt_id"]);
    let err = write(
        &stack,
        &token,
        &wf,
        "code/task.py",
        "print('v2')\n",
        "missing",
        "m2",
    )
    .unwrap_err();
    assert_eq!(err["code"], "revision_conflict");
    assert_eq!(err["current_revision"], revision("print('v1')\n"));
    let err = write(
        &stack,
        &token,
        &wf,
        "code/task.py",
        "other",
        "missing",
        "m1",
    )
    .unwrap_err();
    assert_eq!(err["code"], "request_id_reused");
    let receipt = tool_result(
        stack.port,
        &token,
        "get_write_receipt",
        json!({"workflow_id": wf, "request_id": "m1"}),
    )
    .unwrap();
    assert_eq!(receipt["receipt"]["state"], "applied");
    assert_eq!(receipt["receipt"]["user_name"], "alice");
    assert_eq!(receipt["receipt"]["source"], "mcp");
    // The operator sees the same receipt through agentworksctl.
    let out = stack.ctl(&[
        "--json",
        "receipt",
        "show",
        "m1",
        "--project",
        "demo",
        "--user",
        "alice",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let shown: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(shown["receipt_id"], first["receipt_id"]);
}

#[test]
fn operator_endpoints_refuse_other_peers() {
    let _users = users_lock();
    let (uid, gid) = ensure_user("awtest-notadmin", &[]);
    let stack = Stack::start();
    std::fs::set_permissions(
        stack.agentd_socket().parent().unwrap(),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    std::fs::set_permissions(
        stack.agentd_socket(),
        std::os::unix::fs::PermissionsExt::from_mode(0o666),
    )
    .unwrap();
    let out = std::process::Command::new("setpriv")
        .args([
            format!("--reuid={uid}"),
            format!("--regid={gid}"),
            "--clear-groups".into(),
        ])
        .args(["curl", "-s", "--unix-socket"])
        .arg(stack.agentd_socket())
        .args([
            "http://_/v1/admin/users/add",
            "-H",
            "content-type: application/json",
            "-d",
            "{\"name\":\"mallory\"}",
        ])
        .output()
        .unwrap();
    let body = String::from_utf8_lossy(&out.stdout);
    assert!(body.contains("peer_forbidden"), "{body}");
    let users = stack.admin("users/list", json!({}));
    assert!(
        users
            .as_array()
            .unwrap()
            .iter()
            .all(|u| u["name"] != "mallory")
    );
}

#[test]
fn agentworksctl_administers_with_clear_errors_and_json() {
    let (stack, gateway_port) = Stack::start_with_gateway();
    let ok = |args: &[&str]| {
        let out = stack.ctl(args);
        assert!(
            out.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    ok(&["user", "add", "carol"]);
    ok(&[
        "project",
        "add",
        "site",
        "--kind",
        "code",
        "--owner",
        "carol",
        "--write-path",
        "src",
    ]);
    assert!(
        stack.state.documents().join("site").is_dir(),
        "workspaced created the folder"
    );
    ok(&[
        "member",
        "add",
        "--project",
        "site",
        "--user",
        "carol",
        "--role",
        "co-owner",
    ]);
    let token = ok(&[
        "--json",
        "token",
        "create",
        "--user",
        "carol",
        "--scope",
        "workflows:write",
        "--expires-in",
        "30d",
        "--write-folder",
        "src",
    ]);
    let token: serde_json::Value = serde_json::from_str(&token).unwrap();
    assert!(token["token"].as_str().unwrap().starts_with("awt_"));
    assert_eq!(token["info"]["file_guard"]["write_folders"], json!(["src"]));
    let listed = ok(&["token", "list", "--user", "carol"]);
    assert!(
        !listed.contains(token["token"].as_str().unwrap()),
        "secrets are never listed"
    );
    let users: serde_json::Value = serde_json::from_str(&ok(&["--json", "user", "list"])).unwrap();
    assert!(
        users
            .as_array()
            .unwrap()
            .iter()
            .any(|u| u["name"] == "carol")
    );
    // Clear errors and exit codes.
    let dup = stack.ctl(&["user", "add", "carol"]);
    assert_eq!(dup.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&dup.stderr).contains("already exists"));
    let bad = stack.ctl(&[
        "token",
        "create",
        "--user",
        "carol",
        "--scope",
        "devices:connect",
        "--scope",
        "workflows:read",
    ]);
    assert_eq!(bad.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&bad.stderr).contains("exclusive"));
    let usage = stack.ctl(&[
        "member",
        "add",
        "--project",
        "site",
        "--user",
        "carol",
        "--role",
        "god",
    ]);
    assert_eq!(usage.status.code(), Some(2));
    // status reports every daemon, runnerd (issue 45) among them; it fails while one is down
    // and passes once all answer.
    let down = stack.ctl(&["status"]);
    assert_eq!(down.status.code(), Some(1));
    let said = String::from_utf8_lossy(&down.stdout).into_owned();
    assert!(said.contains("DOWN agentworks-gatewayd"), "{said}");
    assert!(said.contains("DOWN agentworks-runnerd"), "{said}");
    let _gatewayd = Gatewayd::start(&stack, gateway_port);
    let down = stack.ctl(&["status"]);
    assert_eq!(down.status.code(), Some(1));
    let said = String::from_utf8_lossy(&down.stdout).into_owned();
    assert!(said.contains("ok   agentworks-gatewayd"), "{said}");
    assert!(said.contains("DOWN agentworks-runnerd"), "{said}");
    let _runnerd = Runnerd::start(&stack.state);
    let status = stack.ctl(&["status"]);
    let said = String::from_utf8_lossy(&status.stdout).into_owned();
    assert!(status.status.success(), "{said}");
    assert!(
        said.contains("ok   agentworks-runnerd") && said.contains("no provider"),
        "{said}"
    );
    let report: serde_json::Value =
        serde_json::from_slice(&stack.ctl(&["--json", "status"]).stdout).unwrap();
    let daemons: Vec<&str> = report
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["daemon"].as_str().unwrap())
        .collect();
    assert_eq!(
        daemons,
        [
            "agentworks-workspaced",
            "agentworks-agentd",
            "agentworks-gatewayd",
            "agentworks-runnerd"
        ]
    );
    assert_eq!(report[3]["healthy"], true, "{report}");
    assert_eq!(report[3]["providers"], json!([]), "{report}");
    assert!(report[0].get("providers").is_none(), "{report}");
    let help = stack.ctl(&["token", "create", "--help"]);
    assert!(String::from_utf8_lossy(&help.stdout).contains("--write-folder"));
}

/// The official Python SDK (`mcp==2.3.0`), an independently written client, against the real
/// agentd and workspaced: connect with a bearer token, list tools, read, write with the
/// revision, retry the same request id, conflict, create, get_api_spec, call_tool — in the
/// stateless era and both handshake eras.
#[test]
fn python_sdk_end_to_end_against_the_real_stack() {
    for (script, args, era) in [
        ("modern.py", vec![], "2026-07-28"),
        ("legacy.py", vec!["2025-11-25"], "2025-11-25"),
        ("legacy.py", vec!["2025-06-18"], "2025-06-18"),
    ] {
        // A fresh stack per era: the scenario expects notes.md to start as "hello\n".
        let stack = Stack::start();
        let (wf, write_token) = stack.user_with_project("alice", "demo", &["workflows:write"]);
        let read_token = stack.token("alice", &["workflows:read"], json!({}));
        std::fs::write(stack.state.documents().join("demo/notes.md"), "hello\n").unwrap();
        let summary = run_mcp_client(
            script,
            &stack.mcp_url(),
            &args,
            &[
                ("AW_WRITE_TOKEN", &write_token),
                ("AW_READ_TOKEN", &read_token),
                ("AW_WORKFLOW", &wf),
            ],
        );
        assert_eq!(summary["era"], era);
        // The writes really went through workspaced, with receipts.
        assert_eq!(
            std::fs::read_to_string(stack.state.documents().join("demo/notes.md")).unwrap(),
            "hello, world\n"
        );
        assert_eq!(
            std::fs::read_to_string(stack.state.documents().join("demo/new.md")).unwrap(),
            "new\n"
        );
        let history = stack.workspaced.client().json(
            "/v1/history",
            json!({"context": ctx("demo", "alice"), "path": "notes.md"}),
        );
        let entries = history.unwrap()["entries"].as_array().unwrap().clone();
        assert_eq!(
            entries.len(),
            1,
            "one applied write of notes.md, the retry was replayed"
        );
        assert_eq!(entries[0]["receipt"]["source"], "mcp");
    }
}
