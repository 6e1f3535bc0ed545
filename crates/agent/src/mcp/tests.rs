//! End-to-end tests of the MCP endpoint: a real hyper server on 127.0.0.1:0 in this process,
//! serving [`McpService`] over agentd's [`Catalog`] of a [`FakeBackend`] (the only stand-in: tokens and files in memory,
//! revisions as sha256, `write_file` honouring `expected_revision` and `request_id`).
//!
//! Two kinds of client drive it: the official Python SDK (`mcp` 2.3.0, an independent
//! implementation) through the scripts in `tests/mcp_client/`, and raw HTTP requests from a
//! hyper client for the transport and auth rules a well-behaved SDK never breaks.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::header::{HeaderMap, HeaderName, HeaderValue};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use serde_json::{Map, Value, json};
use sha2::{Digest, Sha256};
use tokio::net::{TcpListener, TcpStream};

use super::{AuthError, Body, Caller, McpConfig, McpService, ToolError};
use crate::catalog::{self, Catalog, Operation, OperationRunner};

// ---------------------------------------------------------------------------------------------
// The fake backend.

#[derive(Default)]
struct FakeState {
    /// (workflow, path) → content.
    files: HashMap<(String, String), String>,
    /// request_id → (payload digest, recorded outcome).
    writes: HashMap<String, (String, Value)>,
}

struct FakeBackend {
    state: Mutex<FakeState>,
}

fn revision(content: &str) -> String {
    format!("sha256:{}", hex::encode(Sha256::digest(content.as_bytes())))
}

fn tool_error(code: &str, message: &str, details: Value) -> ToolError {
    ToolError {
        code: code.into(),
        message: message.into(),
        details: details.as_object().cloned().unwrap_or_default(),
    }
}

impl FakeBackend {
    fn new() -> FakeBackend {
        let mut state = FakeState::default();
        state
            .files
            .insert(("wf1".into(), "notes.md".into()), "hello\n".into());
        FakeBackend {
            state: Mutex::new(state),
        }
    }

    fn write(&self, args: &Map<String, Value>) -> Result<Value, ToolError> {
        let s = |k: &str| args[k].as_str().unwrap().to_owned();
        let (workflow, path, content, expected, request_id) = (
            s("workflow_id"),
            s("path"),
            s("content"),
            s("expected_revision"),
            s("request_id"),
        );
        let digest = hex::encode(Sha256::digest(
            serde_json::to_vec(&json!([workflow, path, content, expected])).unwrap(),
        ));
        let mut state = self.state.lock().unwrap();
        if let Some((recorded, outcome)) = state.writes.get(&request_id) {
            if *recorded == digest {
                return Ok(outcome.clone());
            }
            return Err(tool_error(
                "request_id_reused",
                "this request_id was used for another write",
                json!({}),
            ));
        }
        let key = (workflow.clone(), path.clone());
        let current = state.files.get(&key).map(|c| revision(c));
        let matches = match (&current, expected.as_str()) {
            (None, "missing") => true,
            (Some(current), expected) => current == expected,
            (None, _) => false,
        };
        if !matches {
            return Err(tool_error(
                "revision_conflict",
                "the file changed since it was read",
                json!({"current_revision": current.unwrap_or_else(|| "missing".into())}),
            ));
        }
        let new = revision(&content);
        state.files.insert(key, content);
        let outcome = json!({
            "revision": new,
            "receipt": {"request_id": request_id, "previous_revision": current.unwrap_or_else(|| "missing".into()), "state": "applied"},
        });
        state.writes.insert(request_id, (digest, outcome.clone()));
        Ok(outcome)
    }
}

impl OperationRunner for FakeBackend {
    async fn authenticate(&self, bearer: Option<&str>) -> Result<Caller, AuthError> {
        let scopes: &[&str] = match bearer {
            None => return Err(AuthError::Missing),
            Some("read") => &["workflows:read"],
            Some("write") => &["workflows:write"],
            Some("viewer") => &["workflows:write"],
            Some("devices") => &["devices:connect"],
            Some("revoked") => return Err(AuthError::Revoked),
            Some("expired") => return Err(AuthError::Expired),
            Some(_) => return Err(AuthError::Invalid),
        };
        let token = bearer.unwrap_or_default();
        Ok(Caller {
            token_id: format!("tok-{token}"),
            user_id: format!("user-{token}"),
            user_name: token.to_owned(),
            scopes: scopes.iter().map(|s| (*s).to_owned()).collect(),
        })
    }

    async fn allowed_operations(&self, caller: &Caller) -> Vec<Operation> {
        if caller.user_name == "viewer" {
            // A write token of a user whose live role cannot author.
            return vec![Operation::ListWorkflows, Operation::ReadFile];
        }
        Operation::ALL.to_vec()
    }

    async fn call(
        &self,
        _caller: &Caller,
        operation: Operation,
        args: Map<String, Value>,
    ) -> Result<Value, ToolError> {
        let get = |k: &str| {
            args.get(k)
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_owned()
        };
        match operation {
            Operation::ListWorkflows => Ok(json!([{"id": "wf1", "name": "Demo"}])),
            Operation::ListFiles => {
                let state = self.state.lock().unwrap();
                let mut files: Vec<&String> = state
                    .files
                    .keys()
                    .filter(|(w, _)| *w == get("workflow_id"))
                    .map(|(_, p)| p)
                    .collect();
                files.sort();
                Ok(json!({ "files": files }))
            }
            Operation::ReadFile => {
                let state = self.state.lock().unwrap();
                match state.files.get(&(get("workflow_id"), get("path"))) {
                    Some(content) => Ok(json!({"content": content, "revision": revision(content)})),
                    None => Err(tool_error(
                        "not_found",
                        "no such file",
                        json!({"path": get("path")}),
                    )),
                }
            }
            Operation::SearchFiles => Ok(json!({"matches": []})),
            Operation::WriteFile => self.write(&args),
            Operation::GetWriteReceipt => {
                let state = self.state.lock().unwrap();
                match state.writes.get(&get("request_id")) {
                    Some((_, outcome)) => Ok(outcome["receipt"].clone()),
                    None => Err(tool_error("not_found", "no such receipt", json!({}))),
                }
            }
            // The transport tests need no more (agentd's file tools are tested end to end).
            other => Err(tool_error(
                "not_implemented",
                "the fake backend does not serve this operation",
                json!({"name": other.name()}),
            )),
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The server.

const ALLOWED_ORIGIN: &str = "https://app.example.com";

struct Server {
    addr: SocketAddr,
    task: tokio::task::JoinHandle<()>,
}

impl Server {
    fn url(&self) -> String {
        format!("http://{}/mcp", self.addr)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn start() -> Server {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let service = Arc::new(McpService::new(
        Arc::new(Catalog::new(FakeBackend::new())),
        McpConfig {
            instructions: catalog::INSTRUCTIONS.to_owned(),
            scopes_supported: catalog::WORKFLOW_SCOPES.map(str::to_owned).to_vec(),
            public_url: format!("http://{addr}"),
            allowed_origins: vec![ALLOWED_ORIGIN.into()],
            loopback_port: Some(addr.port()),
            server_name: "agentworks-test".into(),
            server_version: "0.0.0".into(),
            max_sessions_per_token: 32,
        },
    ));
    let task = tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            let service = service.clone();
            tokio::spawn(async move {
                let handler = service_fn(move |request: Request<hyper::body::Incoming>| {
                    let service = service.clone();
                    async move {
                        let (parts, body) = request.into_parts();
                        let body = match Limited::new(body, 1 << 20).collect().await {
                            Ok(collected) => collected.to_bytes(),
                            Err(_) => {
                                let mut r = Response::new(agentworks_daemon::ipc::envelope::full(
                                    Bytes::from_static(b"too large"),
                                ));
                                *r.status_mut() = StatusCode::PAYLOAD_TOO_LARGE;
                                return Ok::<_, std::convert::Infallible>(r);
                            }
                        };
                        let request = Request::from_parts(parts, body);
                        Ok(service.handle(request).await.unwrap_or_else(|| {
                            let mut r = Response::new(Body::default());
                            *r.status_mut() = StatusCode::NOT_FOUND;
                            r
                        }))
                    }
                });
                let _ = http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), handler)
                    .await;
            });
        }
    });
    Server { addr, task }
}

// ---------------------------------------------------------------------------------------------
// A raw HTTP client.

struct Reply {
    status: StatusCode,
    headers: HeaderMap,
    body: Bytes,
}

impl Reply {
    fn json(&self) -> Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {:?}", String::from_utf8_lossy(&self.body)))
    }

    fn header(&self, name: &str) -> &str {
        self.headers
            .get(name)
            .unwrap_or_else(|| panic!("no {name} header in {:?}", self.headers))
            .to_str()
            .unwrap()
    }
}

async fn send(
    addr: SocketAddr,
    method: Method,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> Reply {
    let stream = TcpStream::connect(addr).await.unwrap();
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .unwrap();
    tokio::spawn(connection);
    let mut request = Request::builder()
        .method(method)
        .uri(path)
        .header("host", addr.to_string());
    for (name, value) in headers {
        request = request.header(
            HeaderName::from_bytes(name.as_bytes()).unwrap(),
            HeaderValue::from_str(value).unwrap(),
        );
    }
    let request = request
        .body(Full::new(Bytes::from(body.to_owned())))
        .unwrap();
    let response = sender.send_request(request).await.unwrap();
    let (parts, body) = response.into_parts();
    Reply {
        status: parts.status,
        headers: parts.headers,
        body: body.collect().await.unwrap().to_bytes(),
    }
}

const JSON_HEADERS: [(&str, &str); 2] = [
    ("content-type", "application/json"),
    ("accept", "application/json, text/event-stream"),
];

fn modern_body(id: u64, method: &str, params: Value) -> String {
    let mut params = params;
    params["_meta"] = json!({
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": {},
    });
    json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}).to_string()
}

/// A 2026-07-28 POST with consistent headers; `extra` may add or override headers.
async fn modern(
    server: &Server,
    token: &str,
    method: &str,
    params: Value,
    extra: &[(&str, &str)],
) -> Reply {
    let auth = format!("Bearer {token}");
    let name = params
        .get("name")
        .and_then(Value::as_str)
        .map(str::to_owned);
    let mut headers: Vec<(&str, &str)> = JSON_HEADERS.to_vec();
    headers.push(("authorization", &auth));
    headers.push(("mcp-protocol-version", "2026-07-28"));
    headers.push(("mcp-method", method));
    if let Some(name) = &name {
        headers.push(("mcp-name", name));
    }
    for (k, v) in extra {
        headers.retain(|(h, _)| h != k);
        headers.push((k, v));
    }
    send(
        server.addr,
        Method::POST,
        "/mcp",
        &headers,
        &modern_body(1, method, params),
    )
    .await
}

/// A legacy POST (no version header unless given).
async fn legacy(server: &Server, token: &str, body: Value, extra: &[(&str, &str)]) -> Reply {
    let auth = format!("Bearer {token}");
    let mut headers: Vec<(&str, &str)> = JSON_HEADERS.to_vec();
    headers.push(("authorization", &auth));
    headers.extend_from_slice(extra);
    send(
        server.addr,
        Method::POST,
        "/mcp",
        &headers,
        &body.to_string(),
    )
    .await
}

async fn initialize(server: &Server, token: &str, version: &str) -> (Reply, String) {
    let reply = legacy(
        server,
        token,
        json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
            "protocolVersion": version, "capabilities": {}, "clientInfo": {"name": "raw", "version": "0"}}}),
        &[],
    )
    .await;
    let session = reply.header("mcp-session-id").to_owned();
    (reply, session)
}

// ---------------------------------------------------------------------------------------------
// The Python SDK as the client.

fn python() -> PathBuf {
    let path = std::env::var_os("AGENTWORKS_MCP_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/tmp/mcpvenv/bin/python"));
    assert!(
        path.exists(),
        "the MCP interoperability tests need the official Python SDK, and {} does not exist. \
         Run `.ci/run`, or: python3 -m venv /tmp/mcpvenv && /tmp/mcpvenv/bin/pip install mcp==2.3.0 \
         (or point AGENTWORKS_MCP_PYTHON at a Python that has mcp==2.3.0 installed)",
        path.display()
    );
    path
}

/// Runs `tests/mcp_client/<script>` against `server`; returns its summary (last stdout line).
async fn run_python(server: &Server, script: &str, args: &[&str]) -> Value {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/mcp_client");
    let mut command = tokio::process::Command::new(python());
    command
        .arg(dir.join(script))
        .arg(server.url())
        .args(args)
        .current_dir(&dir)
        .kill_on_drop(true);
    let output = tokio::time::timeout(Duration::from_secs(120), command.output())
        .await
        .unwrap_or_else(|_| panic!("{script} timed out"))
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "{script} {args:?} failed ({}):\n--- stdout\n{stdout}\n--- stderr\n{stderr}",
        output.status
    );
    let last = stdout.lines().last().unwrap_or_default();
    let summary: Value = serde_json::from_str(last).unwrap_or_else(|e| panic!("{e}: {stdout}"));
    // Shown with --nocapture: which era each run negotiated.
    println!(
        "{script} {args:?}: negotiated {} via {}\n{stdout}",
        summary["era"], summary["handshake"]
    );
    summary
}

#[tokio::test]
async fn python_sdk_auto_mode_negotiates_2026_07_28() {
    let server = start().await;
    let summary = run_python(&server, "modern.py", &[]).await;
    assert_eq!(summary["era"], "2026-07-28");
    assert_eq!(summary["handshake"], "server/discover");
    assert_eq!(summary["session_issued"], false);
    assert_eq!(summary["ok"], true);
}

#[tokio::test]
async fn python_sdk_legacy_mode_2025_11_25() {
    let server = start().await;
    let summary = run_python(&server, "legacy.py", &["2025-11-25"]).await;
    assert_eq!(summary["era"], "2025-11-25");
    assert_eq!(summary["handshake"], "initialize");
    assert_eq!(summary["session_issued"], true);
    assert_eq!(summary["delete_status"], 204);
}

#[tokio::test]
async fn python_sdk_legacy_mode_2025_06_18() {
    let server = start().await;
    let summary = run_python(&server, "legacy.py", &["2025-06-18"]).await;
    assert_eq!(summary["era"], "2025-06-18");
    assert_eq!(summary["handshake"], "initialize");
    assert_eq!(summary["session_issued"], true);
}

/// The SDK used to show only "Server returned an error response" for a 401: with the refusal
/// as a JSON-RPC error body, what it raises carries our message and stable code, in both modes.
#[tokio::test]
async fn python_sdk_shows_our_message_for_a_missing_or_wrong_token() {
    let server = start().await;
    let results = run_python(&server, "refusals.py", &[]).await;
    for (case, code, message) in [
        (
            "missing",
            "missing_token",
            "this endpoint needs an `Authorization: Bearer <token>` header",
        ),
        ("wrong", "invalid_token", "the bearer token is not valid"),
    ] {
        for mode in ["auto", "legacy"] {
            let raised = &results[format!("{case}/{mode}")];
            assert_eq!(raised["type"], "MCPError", "{case}/{mode}: {raised}");
            assert_eq!(raised["code"], -32010, "{case}/{mode}: {raised}");
            assert_eq!(raised["message"], message, "{case}/{mode}: {raised}");
            assert_eq!(raised["str"], message, "{case}/{mode}: {raised}");
            assert_eq!(raised["data"]["code"], code, "{case}/{mode}: {raised}");
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Raw HTTP: auth.

#[tokio::test]
async fn missing_token_is_401_with_resource_metadata() {
    let server = start().await;
    let reply = send(
        server.addr,
        Method::POST,
        "/mcp",
        &JSON_HEADERS,
        &modern_body(1, "server/discover", json!({})),
    )
    .await;
    assert_eq!(reply.status, StatusCode::UNAUTHORIZED);
    let challenge = reply.header("www-authenticate");
    assert_eq!(
        challenge,
        format!(
            "Bearer resource_metadata=\"http://{}/.well-known/oauth-protected-resource/mcp\"",
            server.addr
        )
    );
    // A JSON-RPC request gets a JSON-RPC error answering its id, our code and message in `data`.
    let json = reply.json();
    assert_eq!(json["jsonrpc"], "2.0");
    assert_eq!(json["id"], 1);
    assert_eq!(json["error"]["code"], -32010);
    assert_eq!(json["error"]["data"]["code"], "missing_token");
    assert_eq!(
        json["error"]["message"],
        "this endpoint needs an `Authorization: Bearer <token>` header"
    );
    assert_eq!(json["error"]["data"]["message"], json["error"]["message"]);
    // Anything else (a GET, a body that is not JSON) keeps the envelope.
    for (method, headers) in [
        (Method::GET, &[][..]),
        (Method::POST, &[("content-type", "text/plain")][..]),
    ] {
        let reply = send(server.addr, method.clone(), "/mcp", headers, "").await;
        assert_eq!(reply.status, StatusCode::UNAUTHORIZED, "{method}");
        assert_eq!(reply.json()["error"]["code"], "missing_token", "{method}");
    }
}

#[tokio::test]
async fn bad_tokens_are_401_invalid_token() {
    let server = start().await;
    for (token, code) in [
        ("revoked", "token_revoked"),
        ("expired", "token_expired"),
        ("nonsense", "invalid_token"),
    ] {
        let reply = modern(&server, token, "tools/list", json!({}), &[]).await;
        assert_eq!(reply.status, StatusCode::UNAUTHORIZED, "{token}");
        let challenge = reply.header("www-authenticate");
        assert!(
            challenge.starts_with("Bearer error=\"invalid_token\""),
            "{challenge}"
        );
        assert!(challenge.contains("resource_metadata=\""), "{challenge}");
        assert_eq!(reply.json()["error"]["code"], -32010, "{token}");
        assert_eq!(reply.json()["error"]["data"]["code"], code);
    }
    // initialize is authenticated too.
    let reply = legacy(
        &server,
        "revoked",
        json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {}}),
        &[],
    )
    .await;
    assert_eq!(reply.status, StatusCode::UNAUTHORIZED);
}

#[tokio::test]
async fn other_refusals_of_a_json_rpc_request_answer_its_id() {
    let server = start().await;
    let list = json!({"jsonrpc": "2.0", "id": "req-9", "method": "tools/list"});
    // 406: a client that accepts neither JSON nor SSE.
    let reply = send(
        server.addr,
        Method::POST,
        "/mcp",
        &[
            ("content-type", "application/json"),
            ("accept", "text/plain"),
            ("authorization", "Bearer read"),
        ],
        &list.to_string(),
    )
    .await;
    assert_eq!(reply.status, StatusCode::NOT_ACCEPTABLE);
    let json = reply.json();
    assert_eq!(json["id"], "req-9");
    assert_eq!(json["error"]["code"], -32600);
    assert_eq!(json["error"]["data"]["code"], "not_acceptable");
    // 400: a session header sent twice.
    let reply = legacy(
        &server,
        "read",
        list.clone(),
        &[("mcp-session-id", "a"), ("mcp-session-id", "b")],
    )
    .await;
    assert_eq!(reply.status, StatusCode::BAD_REQUEST);
    let json = reply.json();
    assert_eq!(json["id"], "req-9");
    assert_eq!(json["error"]["code"], -32600);
    assert_eq!(json["error"]["data"]["code"], "bad_session_header");
    // 415 is never JSON-RPC: the body is not JSON by its own account.
    let reply = send(
        server.addr,
        Method::POST,
        "/mcp",
        &[
            ("content-type", "text/plain"),
            ("authorization", "Bearer read"),
        ],
        &list.to_string(),
    )
    .await;
    assert_eq!(reply.status, StatusCode::UNSUPPORTED_MEDIA_TYPE);
    assert_eq!(reply.json()["error"]["code"], "unsupported_media_type");
}

#[tokio::test]
async fn metadata_documents() {
    let server = start().await;
    let reply = send(
        server.addr,
        Method::GET,
        "/.well-known/oauth-protected-resource/mcp",
        &[],
        "",
    )
    .await;
    assert_eq!(reply.status, StatusCode::OK);
    let doc = reply.json();
    assert_eq!(doc["resource"], format!("http://{}/mcp", server.addr));
    assert_eq!(doc["bearer_methods_supported"], json!(["header"]));
    assert_eq!(
        doc["scopes_supported"],
        json!(["workflows:read", "workflows:run", "workflows:write"])
    );
    assert_eq!(doc["resource_name"], "agentworks-test");
    let root = send(
        server.addr,
        Method::GET,
        "/.well-known/oauth-protected-resource",
        &[],
        "",
    )
    .await;
    assert_eq!(root.status, StatusCode::OK);
    assert_eq!(root.json()["resource"], format!("http://{}", server.addr));
    let post = send(
        server.addr,
        Method::POST,
        "/.well-known/oauth-protected-resource",
        &[],
        "",
    )
    .await;
    assert_eq!(post.status, StatusCode::METHOD_NOT_ALLOWED);
    // Other paths are not ours.
    let other = send(server.addr, Method::GET, "/api/status", &[], "").await;
    assert_eq!(other.status, StatusCode::NOT_FOUND);
    assert!(other.body.is_empty());
}

#[tokio::test]
async fn devices_token_is_403_insufficient_scope() {
    let server = start().await;
    let reply = modern(&server, "devices", "server/discover", json!({}), &[]).await;
    assert_eq!(reply.status, StatusCode::FORBIDDEN);
    let challenge = reply.header("www-authenticate");
    assert!(
        challenge.contains("error=\"insufficient_scope\""),
        "{challenge}"
    );
    assert!(
        challenge.contains("scope=\"workflows:read\""),
        "{challenge}"
    );
    assert!(challenge.contains("resource_metadata=\""), "{challenge}");
    assert_eq!(reply.json()["error"]["code"], -32011);
    assert_eq!(reply.json()["error"]["data"]["code"], "insufficient_scope");
}

#[tokio::test]
async fn write_with_a_read_token_is_403_naming_workflows_write() {
    let server = start().await;
    let args = json!({"workflow_id": "wf1", "path": "notes.md", "content": "x", "expected_revision": "missing", "request_id": "r1"});
    for (tool, params) in [
        (
            "write_file",
            json!({"name": "write_file", "arguments": args}),
        ),
        (
            "call_tool",
            json!({"name": "call_tool", "arguments": {"name": "write_file", "arguments": args}}),
        ),
    ] {
        let reply = modern(&server, "read", "tools/call", params, &[]).await;
        assert_eq!(reply.status, StatusCode::FORBIDDEN, "{tool}");
        let challenge = reply.header("www-authenticate");
        assert!(
            challenge.contains("error=\"insufficient_scope\""),
            "{challenge}"
        );
        assert!(
            challenge.contains("scope=\"workflows:write\""),
            "{challenge}"
        );
        assert_eq!(reply.json()["error"]["data"]["scope"], "workflows:write");
    }
    // Nothing was written.
    let read = modern(
        &server,
        "read",
        "tools/call",
        json!({"name": "read_file", "arguments": {"workflow_id": "wf1", "path": "notes.md"}}),
        &[],
    )
    .await;
    assert_eq!(
        read.json()["result"]["structuredContent"]["content"],
        "hello\n"
    );
}

#[tokio::test]
async fn foreign_origin_is_403_before_auth() {
    let server = start().await;
    let reply = modern(
        &server,
        "write",
        "tools/list",
        json!({}),
        &[("origin", "https://evil.example")],
    )
    .await;
    assert_eq!(reply.status, StatusCode::FORBIDDEN);
    assert_eq!(reply.json()["error"]["code"], -32011);
    assert_eq!(reply.json()["error"]["data"]["code"], "origin_forbidden");
    // Even without a token: the origin check comes first.
    let reply = send(
        server.addr,
        Method::POST,
        "/mcp",
        &[("origin", "null")],
        "{}",
    )
    .await;
    assert_eq!(reply.status, StatusCode::FORBIDDEN);
    // Allowed and same origins pass, and so do the listener's loopback names.
    let port = server.addr.port();
    let same = format!("http://{}", server.addr);
    let localhost = format!("http://localhost:{port}");
    let v6 = format!("http://[::1]:{port}");
    for origin in [ALLOWED_ORIGIN, &same, &localhost, &v6] {
        let reply = modern(
            &server,
            "write",
            "tools/list",
            json!({}),
            &[("origin", origin)],
        )
        .await;
        assert_eq!(reply.status, StatusCode::OK, "{origin}");
    }
    // Another port on this machine is another origin.
    let other = format!("http://localhost:{}", port.wrapping_add(1));
    let reply = modern(
        &server,
        "write",
        "tools/list",
        json!({}),
        &[("origin", other.as_str())],
    )
    .await;
    assert_eq!(reply.status, StatusCode::FORBIDDEN, "{other}");
}

// ---------------------------------------------------------------------------------------------
// Raw HTTP: the 2026-07-28 transport.

#[tokio::test]
async fn modern_discover_and_results_carry_result_type() {
    let server = start().await;
    let reply = modern(&server, "read", "server/discover", json!({}), &[]).await;
    assert_eq!(reply.status, StatusCode::OK);
    assert!(reply.headers.get("mcp-session-id").is_none());
    let result = &reply.json()["result"];
    assert_eq!(result["resultType"], "complete");
    assert_eq!(
        result["supportedVersions"],
        json!(["2025-06-18", "2025-11-25", "2026-07-28"])
    );
    assert_eq!(
        result["_meta"]["io.modelcontextprotocol/serverInfo"]["name"],
        "agentworks-test"
    );
    assert_eq!(result["cacheScope"], "private");
    let list = modern(&server, "read", "tools/list", json!({}), &[])
        .await
        .json();
    assert_eq!(list["result"]["resultType"], "complete");
    let names: Vec<&str> = list["result"]["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        [
            "get_api_spec",
            "call_tool",
            "list_workflows",
            "list_files",
            "read_file",
            "read_files",
            "get_file_info",
            "search_files"
        ]
    );
    // Removed in 2026-07-28: ping is an unknown method (404 per the status table).
    let ping = modern(&server, "read", "ping", json!({}), &[]).await;
    assert_eq!(ping.status, StatusCode::NOT_FOUND);
    assert_eq!(ping.json()["error"]["code"], -32601);
}

#[tokio::test]
async fn modern_get_and_delete_are_405() {
    let server = start().await;
    for method in [Method::GET, Method::DELETE] {
        let reply = send(
            server.addr,
            method.clone(),
            "/mcp",
            &[
                ("authorization", "Bearer read"),
                ("mcp-protocol-version", "2026-07-28"),
                ("accept", "text/event-stream"),
            ],
            "",
        )
        .await;
        assert_eq!(reply.status, StatusCode::METHOD_NOT_ALLOWED, "{method}");
        assert_eq!(reply.header("allow"), "POST");
    }
}

#[tokio::test]
async fn modern_header_mismatch_is_400() {
    let server = start().await;
    let call =
        json!({"name": "read_file", "arguments": {"workflow_id": "wf1", "path": "notes.md"}});
    for extra in [
        &[("mcp-protocol-version", "2025-11-25")][..],
        &[("mcp-method", "tools/list")],
        &[("mcp-name", "write_file")],
    ] {
        let reply = modern(&server, "read", "tools/call", call.clone(), extra).await;
        assert_eq!(reply.status, StatusCode::BAD_REQUEST, "{extra:?}");
        let body = reply.json();
        // Even a handshake-era version header: the body's envelope says 2026-07-28.
        assert_eq!(body["error"]["code"], -32020, "{extra:?}");
        assert_eq!(body["id"], 1);
    }
    // Missing Mcp-Method.
    let body = modern_body(1, "tools/list", json!({}));
    let reply = send(
        server.addr,
        Method::POST,
        "/mcp",
        &[
            JSON_HEADERS[0],
            JSON_HEADERS[1],
            ("authorization", "Bearer read"),
            ("mcp-protocol-version", "2026-07-28"),
        ],
        &body,
    )
    .await;
    assert_eq!(reply.status, StatusCode::BAD_REQUEST);
    assert_eq!(reply.json()["error"]["code"], -32020);
    // Envelope without the header at all.
    let reply = send(
        server.addr,
        Method::POST,
        "/mcp",
        &[
            JSON_HEADERS[0],
            JSON_HEADERS[1],
            ("authorization", "Bearer read"),
        ],
        &body,
    )
    .await;
    assert_eq!(reply.status, StatusCode::BAD_REQUEST);
    assert_eq!(reply.json()["error"]["code"], -32020);
}

#[tokio::test]
async fn modern_unsupported_version_names_ours() {
    let server = start().await;
    let body = json!({"jsonrpc": "2.0", "id": 9, "method": "server/discover", "params": {"_meta": {
        "io.modelcontextprotocol/protocolVersion": "2099-01-01",
        "io.modelcontextprotocol/clientCapabilities": {}}}});
    let reply = send(
        server.addr,
        Method::POST,
        "/mcp",
        &[
            JSON_HEADERS[0],
            JSON_HEADERS[1],
            ("authorization", "Bearer read"),
            ("mcp-protocol-version", "2099-01-01"),
            ("mcp-method", "server/discover"),
        ],
        &body.to_string(),
    )
    .await;
    assert_eq!(reply.status, StatusCode::BAD_REQUEST);
    let error = &reply.json()["error"];
    assert_eq!(error["code"], -32022);
    assert_eq!(error["data"]["requested"], "2099-01-01");
    assert!(
        error["data"]["supported"]
            .as_array()
            .unwrap()
            .contains(&json!("2026-07-28"))
    );
}

#[tokio::test]
async fn sse_only_clients_get_one_event() {
    let server = start().await;
    let reply = modern(
        &server,
        "read",
        "tools/list",
        json!({}),
        &[("accept", "text/event-stream")],
    )
    .await;
    assert_eq!(reply.status, StatusCode::OK);
    assert_eq!(reply.header("content-type"), "text/event-stream");
    let text = String::from_utf8(reply.body.to_vec()).unwrap();
    let data = text
        .strip_prefix("event: message\ndata: ")
        .unwrap()
        .strip_suffix("\n\n")
        .unwrap();
    let message: Value = serde_json::from_str(data).unwrap();
    assert_eq!(message["result"]["resultType"], "complete");
    let refused = modern(
        &server,
        "read",
        "tools/list",
        json!({}),
        &[("accept", "text/html")],
    )
    .await;
    assert_eq!(refused.status, StatusCode::NOT_ACCEPTABLE);
    let wrong_type = modern(
        &server,
        "read",
        "tools/list",
        json!({}),
        &[("content-type", "text/plain")],
    )
    .await;
    assert_eq!(wrong_type.status, StatusCode::UNSUPPORTED_MEDIA_TYPE);
}

#[tokio::test]
async fn modern_notifications_are_accepted() {
    let server = start().await;
    let body =
        json!({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {}}).to_string();
    let reply = send(
        server.addr,
        Method::POST,
        "/mcp",
        &[
            JSON_HEADERS[0],
            JSON_HEADERS[1],
            ("authorization", "Bearer read"),
            ("mcp-protocol-version", "2026-07-28"),
        ],
        &body,
    )
    .await;
    assert_eq!(reply.status, StatusCode::ACCEPTED);
    assert!(reply.body.is_empty());
}

// ---------------------------------------------------------------------------------------------
// Raw HTTP: malformed input and tool errors.

#[tokio::test]
async fn malformed_json_is_a_400_parse_error() {
    let server = start().await;
    for body in [
        "{\"jsonrpc\": \"2.0\", \"id\": 1, \"method\": ",
        "\u{0}\u{1}",
        "",
        &"[".repeat(10_000),
    ] {
        let reply = send(
            server.addr,
            Method::POST,
            "/mcp",
            &[
                JSON_HEADERS[0],
                JSON_HEADERS[1],
                ("authorization", "Bearer read"),
            ],
            body,
        )
        .await;
        assert_eq!(reply.status, StatusCode::BAD_REQUEST);
        let json = reply.json();
        assert_eq!(json["error"]["code"], -32700);
        assert_eq!(json["id"], Value::Null);
        // It says what was wrong, not just "Parse error".
        let message = json["error"]["message"].as_str().unwrap();
        assert!(
            message.starts_with("Parse error: ") && message.contains("line 1 column"),
            "{message}"
        );
    }
}

#[tokio::test]
async fn batches_are_refused() {
    let server = start().await;
    let batch = format!("[{}]", modern_body(1, "tools/list", json!({})));
    for version in ["2026-07-28", "2025-11-25"] {
        let reply = send(
            server.addr,
            Method::POST,
            "/mcp",
            &[
                JSON_HEADERS[0],
                JSON_HEADERS[1],
                ("authorization", "Bearer read"),
                ("mcp-protocol-version", version),
            ],
            &batch,
        )
        .await;
        assert_eq!(reply.status, StatusCode::BAD_REQUEST, "{version}");
        assert_eq!(reply.json()["error"]["code"], -32600);
    }
}

#[tokio::test]
async fn tool_failures_are_results_with_is_error() {
    let server = start().await;
    let call = |name: &str, arguments: Value| json!({"name": name, "arguments": arguments});
    let cases = [
        (
            call(
                "read_file",
                json!({"workflow_id": "wf1", "path": "absent.md"}),
            ),
            "not_found",
            "write",
        ),
        (
            call("read_file", json!({"workflow_id": "wf1"})),
            "invalid_arguments",
            "write",
        ),
        (
            call("read_file", json!({"workflow_id": 1, "path": "a"})),
            "invalid_arguments",
            "write",
        ),
        (
            call("call_tool", json!({"name": "nope"})),
            "unknown_tool",
            "write",
        ),
        (
            call(
                "call_tool",
                json!({"name": "read_file", "arguments": {"path": "a"}}),
            ),
            "invalid_arguments",
            "write",
        ),
        (
            call("get_api_spec", json!({"extra": true})),
            "invalid_arguments",
            "write",
        ),
        // A write token whose user cannot author: the backend's live check, not a scope.
        (
            call(
                "write_file",
                json!({"workflow_id": "wf1", "path": "a", "content": "x", "expected_revision": "missing", "request_id": "r"}),
            ),
            "forbidden",
            "viewer",
        ),
        (
            call(
                "write_file",
                json!({"workflow_id": "wf1", "path": "notes.md", "content": "x", "expected_revision": "sha256:00", "request_id": "r2"}),
            ),
            "revision_conflict",
            "write",
        ),
    ];
    for (params, code, token) in cases {
        let reply = modern(&server, token, "tools/call", params.clone(), &[]).await;
        assert_eq!(reply.status, StatusCode::OK, "{params}");
        let result = &reply.json()["result"];
        assert_eq!(result["isError"], true, "{params}");
        assert_eq!(result["resultType"], "complete");
        assert_eq!(
            result["structuredContent"]["error"]["code"], code,
            "{params}"
        );
        let text: Value =
            serde_json::from_str(result["content"][0]["text"].as_str().unwrap()).unwrap();
        assert_eq!(text["error"]["code"], code);
    }
    // The conflict carries the current revision.
    let reply = modern(
        &server,
        "write",
        "tools/call",
        call("write_file", json!({"workflow_id": "wf1", "path": "notes.md", "content": "x", "expected_revision": "sha256:00", "request_id": "r3"})),
        &[],
    )
    .await;
    assert_eq!(
        reply.json()["result"]["structuredContent"]["error"]["current_revision"],
        revision("hello\n")
    );
    // A viewer's catalog leaves out what the backend does not allow.
    let list = modern(&server, "viewer", "tools/list", json!({}), &[])
        .await
        .json();
    let names: Vec<&str> = list["result"]["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        ["get_api_spec", "call_tool", "list_workflows", "read_file"]
    );
    // Bad tools/call params are a protocol error, not a crash.
    let reply = modern(
        &server,
        "write",
        "tools/call",
        json!({"arguments": {}}),
        &[],
    )
    .await;
    assert_eq!(reply.status, StatusCode::BAD_REQUEST);
    assert_eq!(reply.json()["error"]["code"], -32602);
    // A tool outside the catalog is a protocol error (-32602) naming it, not a tool result.
    let reply = modern(
        &server,
        "write",
        "tools/call",
        call("format_disk", json!({})),
        &[],
    )
    .await;
    assert_eq!(reply.json()["error"]["code"], -32602, "{}", reply.json());
    assert_eq!(reply.json()["error"]["data"]["name"], "format_disk");
}

// ---------------------------------------------------------------------------------------------
// Raw HTTP: the handshake era and its sessions.

#[tokio::test]
async fn legacy_initialize_negotiates_per_the_spec() {
    let server = start().await;
    for (offered, answered) in [
        ("2025-06-18", "2025-06-18"),
        ("2025-11-25", "2025-11-25"),
        ("2024-11-05", "2025-11-25"),
        ("2026-07-28", "2025-11-25"),
    ] {
        let (reply, session) = initialize(&server, "read", offered).await;
        assert_eq!(reply.status, StatusCode::OK);
        let result = &reply.json()["result"];
        assert_eq!(result["protocolVersion"], answered, "{offered}");
        assert_eq!(result["serverInfo"]["name"], "agentworks-test");
        assert!(result.get("resultType").is_none());
        assert_eq!(session.len(), 32);
    }
    // notifications/initialized → 202.
    let (_, session) = initialize(&server, "read", "2025-11-25").await;
    let reply = legacy(
        &server,
        "read",
        json!({"jsonrpc": "2.0", "method": "notifications/initialized"}),
        &[
            ("mcp-session-id", &session),
            ("mcp-protocol-version", "2025-11-25"),
        ],
    )
    .await;
    assert_eq!(reply.status, StatusCode::ACCEPTED);
    // An unsupported version header → 400.
    let reply = legacy(
        &server,
        "read",
        json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list"}),
        &[("mcp-protocol-version", "2025-03-26")],
    )
    .await;
    assert_eq!(reply.status, StatusCode::BAD_REQUEST);
    // Legacy results have no resultType; ping works in this era.
    let reply = legacy(
        &server,
        "read",
        json!({"jsonrpc": "2.0", "id": 2, "method": "ping"}),
        &[("mcp-session-id", &session)],
    )
    .await;
    assert_eq!(reply.json()["result"], json!({}));
    // GET offers no stream.
    let get = send(
        server.addr,
        Method::GET,
        "/mcp",
        &[
            ("authorization", "Bearer read"),
            ("mcp-session-id", &session),
        ],
        "",
    )
    .await;
    assert_eq!(get.status, StatusCode::METHOD_NOT_ALLOWED);
}

#[tokio::test]
async fn unknown_or_foreign_session_is_404() {
    let server = start().await;
    let list = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list"});
    let reply = legacy(
        &server,
        "read",
        list.clone(),
        &[("mcp-session-id", "0123456789abcdef0123456789abcdef")],
    )
    .await;
    assert_eq!(reply.status, StatusCode::NOT_FOUND);
    assert_eq!(reply.json()["error"]["code"], -32012);
    assert_eq!(reply.json()["error"]["data"]["code"], "session_not_found");
    assert_eq!(reply.json()["id"], 1);
    // Another token's session answers exactly like an unknown one.
    let (_, session) = initialize(&server, "write", "2025-11-25").await;
    let reply = legacy(
        &server,
        "read",
        list.clone(),
        &[("mcp-session-id", &session)],
    )
    .await;
    assert_eq!(reply.status, StatusCode::NOT_FOUND);
    let delete = send(
        server.addr,
        Method::DELETE,
        "/mcp",
        &[
            ("authorization", "Bearer read"),
            ("mcp-session-id", &session),
        ],
        "",
    )
    .await;
    assert_eq!(delete.status, StatusCode::NOT_FOUND);
    // The owner still can use it.
    let reply = legacy(&server, "write", list, &[("mcp-session-id", &session)]).await;
    assert_eq!(reply.status, StatusCode::OK);
    assert!(reply.json()["result"]["tools"].is_array());
}

#[tokio::test]
async fn delete_ends_a_session() {
    let server = start().await;
    let (_, session) = initialize(&server, "read", "2025-06-18").await;
    let list = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list"});
    let before = legacy(
        &server,
        "read",
        list.clone(),
        &[
            ("mcp-session-id", &session),
            ("mcp-protocol-version", "2025-06-18"),
        ],
    )
    .await;
    assert_eq!(before.status, StatusCode::OK);
    let delete = send(
        server.addr,
        Method::DELETE,
        "/mcp",
        &[
            ("authorization", "Bearer read"),
            ("mcp-session-id", &session),
        ],
        "",
    )
    .await;
    assert_eq!(delete.status, StatusCode::NO_CONTENT);
    let after = legacy(&server, "read", list, &[("mcp-session-id", &session)]).await;
    assert_eq!(after.status, StatusCode::NOT_FOUND);
    let again = send(
        server.addr,
        Method::DELETE,
        "/mcp",
        &[
            ("authorization", "Bearer read"),
            ("mcp-session-id", &session),
        ],
        "",
    )
    .await;
    assert_eq!(again.status, StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn legacy_tool_results_wrap_non_object_structured_content() {
    let server = start().await;
    let call = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "list_workflows", "arguments": {}}});
    let reply = legacy(
        &server,
        "read",
        call,
        &[("mcp-protocol-version", "2025-06-18")],
    )
    .await;
    let result = &reply.json()["result"];
    assert_eq!(result["structuredContent"]["result"][0]["id"], "wf1");
    assert_eq!(result["isError"], false);
    // Modern: any JSON value.
    let reply = modern(
        &server,
        "read",
        "tools/call",
        json!({"name": "list_workflows", "arguments": {}}),
        &[],
    )
    .await;
    assert_eq!(reply.json()["result"]["structuredContent"][0]["id"], "wf1");
}
