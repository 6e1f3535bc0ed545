//! End-to-end tests of the MCP endpoint: a real hyper server on 127.0.0.1:0 in this process,
//! serving [`McpService`] over agentd's [`Catalog`] of a [`FakeBackend`] (the only stand-in: tokens and files in memory,
//! revisions as sha256, `write_file` honouring `expected_revision` and `request_id`), and, for
//! what agentd's backend does not serve (resources, prompts, completion, notifications,
//! input requests), over a [`FeatureBackend`] that serves everything.
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

use super::{AuthError, Backend, Body, Caller, McpConfig, McpService, ToolError};
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
            reach: None,
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
    start_with(Catalog::new(FakeBackend::new())).await
}

/// A server over any backend, configured as agentd's.
async fn start_with<B: Backend>(backend: B) -> Server {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let service = Arc::new(McpService::new(
        Arc::new(backend),
        McpConfig {
            instructions: catalog::INSTRUCTIONS.to_owned(),
            scopes_supported: catalog::WORKFLOW_SCOPES.map(str::to_owned).to_vec(),
            authorization_servers: Vec::new(),
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
            "Bearer resource_metadata=\"http://{}/.well-known/oauth-protected-resource/mcp\", scope=\"workflows:read workflows:run workflows:write\"",
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
    // ... answering the request's own id (caught by fuzz/checks/mcp_request.rs: it was null).
    assert_eq!(reply.json()["id"], json!(1));
    assert_eq!(reply.json()["error"]["data"]["requested"], "2025-03-26");
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

// ---------------------------------------------------------------------------------------------
// Resources, prompts, completion, notifications and input-required, over a backend that
// serves them (agentd's serves resources only, its project files: checked first).

#[tokio::test]
async fn agentds_catalog_declares_resources_only_and_serves_nothing_more() {
    let server = start().await;
    let discover = modern(&server, "read", "server/discover", json!({}), &[]).await;
    assert_eq!(
        discover.json()["result"]["capabilities"],
        json!({"tools": {}, "resources": {}})
    );
    let (init, session) = initialize(&server, "read", "2025-11-25").await;
    assert_eq!(
        init.json()["result"]["capabilities"],
        json!({"tools": {"listChanged": false}, "resources": {"subscribe": false, "listChanged": false}})
    );
    for (method, params) in [
        ("prompts/list", json!({})),
        ("prompts/get", json!({"name": "p"})),
        (
            "completion/complete",
            json!({"ref": {"type": "ref/prompt", "name": "p"}, "argument": {"name": "a", "value": ""}}),
        ),
    ] {
        let extra: Vec<(&str, &str)> = match params.get("uri").and_then(Value::as_str) {
            Some(uri) => vec![("mcp-name", uri)],
            None => vec![],
        };
        let reply = modern(&server, "read", method, params.clone(), &extra).await;
        assert_eq!(reply.status, StatusCode::NOT_FOUND, "{method}");
        assert_eq!(reply.json()["error"]["code"], -32601, "{method}");
        let reply = legacy(
            &server,
            "read",
            json!({"jsonrpc": "2.0", "id": 3, "method": method, "params": params}),
            &[("mcp-session-id", &session)],
        )
        .await;
        assert_eq!(reply.json()["error"]["code"], -32601, "{method}");
    }
    for method in ["logging/setLevel", "resources/subscribe"] {
        let reply = legacy(
            &server,
            "read",
            json!({"jsonrpc": "2.0", "id": 4, "method": method, "params": {"level": "info", "uri": "x"}}),
            &[("mcp-session-id", &session)],
        )
        .await;
        assert_eq!(reply.json()["error"]["code"], -32601, "{method}");
    }
    // A log level or a progress token changes nothing for a backend that sends neither: the
    // answer stays plain JSON.
    let reply = modern_meta(
        &server,
        "read",
        "tools/call",
        json!({"name": "list_workflows", "arguments": {}}),
        json!({"io.modelcontextprotocol/logLevel": "debug", "progressToken": "p1"}),
    )
    .await;
    assert_eq!(reply.status, StatusCode::OK);
    assert_eq!(reply.header("content-type"), "application/json");
    assert_eq!(reply.json()["result"]["resultType"], "complete");
}

/// A backend serving every optional feature, for the transport's side of each.
struct FeatureBackend;

const FEATURE_RESOURCES: usize = 5;

impl Backend for FeatureBackend {
    async fn authenticate(&self, bearer: Option<&str>) -> Result<Caller, super::Admission> {
        let token = bearer.ok_or(AuthError::Missing)?;
        Ok(Caller {
            token_id: token.to_owned(),
            user_id: token.to_owned(),
            user_name: token.to_owned(),
            scopes: Vec::new(),
            reach: None,
        })
    }

    async fn list_tools(&self, _request: super::RequestContext<'_>) -> Vec<Value> {
        vec![json!({"name": "ask", "description": "asks", "inputSchema": {"type": "object"}})]
    }

    async fn call_tool(
        &self,
        request: super::RequestContext<'_>,
        name: &str,
        _arguments: Map<String, Value>,
    ) -> Result<super::ToolResult, super::CallError> {
        use super::{CallError, InputRequired, LogLevel};
        let done = |text: String| super::ToolResult {
            content: vec![json!({"type": "text", "text": text})],
            structured_content: None,
            is_error: false,
        };
        let elicit = || {
            json!({"method": "elicitation/create", "params": {"message": "name?",
            "requestedSchema": {"type": "object", "properties": {"name": {"type": "string"}}}}})
        };
        match name {
            "progress" => {
                let notifier = request.notifier;
                notifier.progress(1.0, Some(3.0), Some("one"));
                // Not above the last: dropped.
                notifier.progress(1.0, Some(3.0), Some("again"));
                tokio::time::sleep(Duration::from_millis(20)).await;
                notifier.progress(2.0, Some(3.0), None);
                Ok(done(format!(
                    "wants_progress={}",
                    notifier.wants_progress()
                )))
            }
            "log" => {
                request
                    .notifier
                    .log(LogLevel::Debug, None, json!("debug line"));
                request
                    .notifier
                    .log(LogLevel::Error, Some("test"), json!("error line"));
                Ok(done("logged".into()))
            }
            "forbidden_after_progress" => {
                request.notifier.progress(1.0, None, None);
                Err(CallError::InsufficientScope("workflows:write".into()))
            }
            "needs_sampling" => {
                if request.client_capabilities.contains_key("sampling") {
                    return Ok(done("sampled".into()));
                }
                let mut required = Map::new();
                required.insert("sampling".into(), json!({}));
                Err(CallError::MissingCapability(required))
            }
            "ask" | "ask_other" => match (
                request.input_responses.and_then(|r| r.get("name")),
                request.request_state,
            ) {
                (Some(answer), Some(state)) => Ok(done(format!(
                    "{} after {}",
                    answer["content"]["name"].as_str().unwrap_or("?"),
                    state["asked"]
                ))),
                _ => Err(CallError::InputRequired(InputRequired {
                    requests: [("name".to_owned(), elicit())].into_iter().collect(),
                    state: Some(json!({"asked": name})),
                })),
            },
            "ask_roots" => Err(CallError::InputRequired(InputRequired {
                requests: [("roots".to_owned(), json!({"method": "roots/list"}))]
                    .into_iter()
                    .collect(),
                state: None,
            })),
            other => Err(CallError::UnknownTool(other.to_owned())),
        }
    }

    fn features(&self) -> super::Features {
        super::Features {
            resources: true,
            resource_subscriptions: false,
            prompts: true,
            completions: true,
            logging: true,
        }
    }

    async fn list_resources(
        &self,
        _request: super::RequestContext<'_>,
        cursor: Option<&str>,
    ) -> Result<super::Page, super::CallError> {
        let start: usize = match cursor {
            None => 0,
            Some(cursor) => cursor
                .parse()
                .map_err(|_| super::CallError::InvalidParams("bad cursor".into()))?,
        };
        let end = (start + 2).min(FEATURE_RESOURCES);
        Ok(super::Page {
            items: (start..end)
                .map(|i| json!({"uri": format!("r://{i}"), "name": format!("r{i}")}))
                .collect(),
            next_cursor: (end < FEATURE_RESOURCES).then(|| end.to_string()),
            cache: super::CacheHint {
                ttl_ms: 1000,
                public: true,
            },
        })
    }

    async fn read_resource(
        &self,
        _request: super::RequestContext<'_>,
        uri: &str,
    ) -> Result<super::ResourceContents, super::CallError> {
        match uri {
            "r://empty" => Ok(super::ResourceContents::default()),
            "r://0" => Ok(super::ResourceContents {
                contents: vec![json!({"uri": uri, "mimeType": "text/plain", "text": "zero"})],
                cache: super::CacheHint::default(),
            }),
            _ => Err(super::CallError::UnknownResource(uri.to_owned())),
        }
    }

    async fn get_prompt(
        &self,
        _request: super::RequestContext<'_>,
        name: &str,
        arguments: &std::collections::BTreeMap<String, String>,
    ) -> Result<super::PromptResult, super::CallError> {
        if name != "echo" {
            return Err(super::CallError::UnknownPrompt(name.to_owned()));
        }
        Ok(super::PromptResult {
            description: Some("echoes".into()),
            messages: vec![json!({"role": "user", "content": {"type": "text",
                "text": format!("{arguments:?}")}})],
        })
    }

    async fn complete(
        &self,
        _request: super::RequestContext<'_>,
        _reference: &super::CompletionRef,
        argument: (&str, &str),
        _context: &std::collections::BTreeMap<String, String>,
    ) -> Result<super::Completion, super::CallError> {
        Ok(super::Completion {
            values: (0..150).map(|i| format!("{}{i}", argument.1)).collect(),
            total: Some(150),
            has_more: false,
        })
    }
}

/// A 2026-07-28 POST whose `_meta` gets `meta` merged in (capabilities, log level, progress
/// token); headers consistent with the body.
async fn modern_meta(
    server: &Server,
    token: &str,
    method: &str,
    params: Value,
    meta: Value,
) -> Reply {
    let mut body: Value = serde_json::from_str(&modern_body(1, method, params.clone())).unwrap();
    for (key, value) in meta.as_object().unwrap() {
        body["params"]["_meta"][key] = value.clone();
    }
    let auth = format!("Bearer {token}");
    let name = params
        .get("name")
        .or_else(|| params.get("uri"))
        .and_then(Value::as_str)
        .map(str::to_owned);
    let mut headers: Vec<(&str, &str)> = JSON_HEADERS.to_vec();
    headers.push(("authorization", &auth));
    headers.push(("mcp-protocol-version", "2026-07-28"));
    headers.push(("mcp-method", method));
    if let Some(name) = &name {
        headers.push(("mcp-name", name));
    }
    send(
        server.addr,
        Method::POST,
        "/mcp",
        &headers,
        &body.to_string(),
    )
    .await
}

/// The JSON-RPC messages of a `text/event-stream` body, in order.
fn sse_messages(reply: &Reply) -> Vec<Value> {
    assert_eq!(reply.header("content-type"), "text/event-stream");
    String::from_utf8(reply.body.to_vec())
        .unwrap()
        .split("\n\n")
        .filter(|event| !event.is_empty())
        .map(|event| {
            let data = event
                .strip_prefix("event: message\ndata: ")
                .unwrap_or_else(|| panic!("not one message event: {event:?}"));
            serde_json::from_str(data).unwrap()
        })
        .collect()
}

#[tokio::test]
async fn resources_page_with_cursors_and_carry_cache_hints_on_2026_only() {
    let server = start_with(FeatureBackend).await;
    let discover = modern(&server, "t", "server/discover", json!({}), &[]).await;
    assert_eq!(
        discover.json()["result"]["capabilities"],
        json!({"tools": {}, "resources": {}, "prompts": {}, "completions": {}, "logging": {}})
    );
    let (init, session) = initialize(&server, "t", "2025-11-25").await;
    assert_eq!(
        init.json()["result"]["capabilities"]["resources"],
        json!({"subscribe": false, "listChanged": false})
    );
    let mut uris = Vec::new();
    let mut cursor = Value::Null;
    for _ in 0..10 {
        let reply = modern(
            &server,
            "t",
            "resources/list",
            json!({"cursor": cursor}),
            &[],
        )
        .await;
        let result = &reply.json()["result"];
        assert_eq!(result["ttlMs"], 1000);
        assert_eq!(result["cacheScope"], "public");
        assert_eq!(result["resultType"], "complete");
        for item in result["resources"].as_array().unwrap() {
            uris.push(item["uri"].as_str().unwrap().to_owned());
        }
        cursor = result.get("nextCursor").cloned().unwrap_or(Value::Null);
        if cursor.is_null() {
            break;
        }
    }
    assert_eq!(uris, ["r://0", "r://1", "r://2", "r://3", "r://4"]);
    // A cursor that is not a string, or one the backend does not know: invalid params.
    for cursor in [json!(7), json!("nope")] {
        let reply = modern(
            &server,
            "t",
            "resources/list",
            json!({"cursor": cursor}),
            &[],
        )
        .await;
        assert_eq!(reply.status, StatusCode::BAD_REQUEST);
        assert_eq!(reply.json()["error"]["code"], -32602);
    }
    // The handshake era has no cache hints; templates default to nothing served.
    let reply = legacy(
        &server,
        "t",
        json!({"jsonrpc": "2.0", "id": 2, "method": "resources/list"}),
        &[("mcp-session-id", &session)],
    )
    .await;
    let result = &reply.json()["result"];
    assert_eq!(result["nextCursor"], "2");
    assert!(result.get("ttlMs").is_none() && result.get("resultType").is_none());
    let reply = modern(&server, "t", "resources/templates/list", json!({}), &[]).await;
    assert_eq!(reply.json()["error"]["code"], -32601);
    // Subscriptions are not declared, so not served.
    let reply = legacy(
        &server,
        "t",
        json!({"jsonrpc": "2.0", "id": 3, "method": "resources/subscribe", "params": {"uri": "r://0"}}),
        &[("mcp-session-id", &session)],
    )
    .await;
    assert_eq!(reply.json()["error"]["code"], -32601);
}

#[tokio::test]
async fn unknown_or_empty_resources_are_invalid_params_naming_the_uri() {
    let server = start_with(FeatureBackend).await;
    let read = |uri: &'static str| {
        let server = &server;
        async move {
            modern(
                server,
                "t",
                "resources/read",
                json!({"uri": uri}),
                &[("mcp-name", uri)],
            )
            .await
        }
    };
    let ok = read("r://0").await;
    let result = &ok.json()["result"];
    assert_eq!(result["contents"][0]["text"], "zero");
    assert_eq!(result["cacheScope"], "private");
    assert_eq!(result["ttlMs"], 0);
    for uri in ["r://nonexistent", "r://empty"] {
        let reply = read(uri).await;
        assert_eq!(reply.status, StatusCode::BAD_REQUEST, "{uri}");
        let error = &reply.json()["error"];
        assert_eq!(error["code"], -32602, "{uri}");
        assert_eq!(error["data"]["uri"], uri);
    }
    let reply = modern(&server, "t", "resources/read", json!({"uri": 5}), &[]).await;
    assert_eq!(reply.json()["error"]["code"], -32602);
}

#[tokio::test]
async fn prompts_take_string_arguments_and_completions_are_capped_at_100() {
    let server = start_with(FeatureBackend).await;
    let reply = modern(
        &server,
        "t",
        "prompts/get",
        json!({"name": "echo", "arguments": {"a": "x"}}),
        &[],
    )
    .await;
    let result = &reply.json()["result"];
    assert_eq!(result["description"], "echoes");
    assert_eq!(result["messages"][0]["content"]["text"], "{\"a\": \"x\"}");
    for (params, code) in [
        (json!({"name": "echo", "arguments": {"a": 1}}), -32602),
        (json!({"name": "echo", "arguments": "a"}), -32602),
        (json!({"name": "nope"}), -32602),
    ] {
        let reply = modern(&server, "t", "prompts/get", params.clone(), &[]).await;
        assert_eq!(reply.json()["error"]["code"], code, "{params}");
    }
    // prompts/list is declared but this backend kept the default: -32601, not a crash.
    let reply = modern(&server, "t", "prompts/list", json!({}), &[]).await;
    assert_eq!(reply.json()["error"]["code"], -32601);
    let reply = modern(
        &server,
        "t",
        "completion/complete",
        json!({"ref": {"type": "ref/prompt", "name": "echo"}, "argument": {"name": "a", "value": "v"}}),
        &[],
    )
    .await;
    let completion = &reply.json()["result"]["completion"];
    assert_eq!(completion["values"].as_array().unwrap().len(), 100);
    assert_eq!(completion["values"][0], "v0");
    assert_eq!(completion["hasMore"], true);
    assert_eq!(completion["total"], 150);
    for params in [
        json!({"ref": {"type": "ref/other", "name": "echo"}, "argument": {"name": "a", "value": "v"}}),
        json!({"ref": {"type": "ref/prompt", "name": "echo"}, "argument": {"name": "a"}}),
        json!({"ref": {"type": "ref/prompt", "name": "echo"}, "argument": {"name": "a", "value": "v"},
            "context": {"arguments": {"b": []}}}),
        json!({"ref": null, "argument": null}),
    ] {
        let reply = modern(&server, "t", "completion/complete", params.clone(), &[]).await;
        assert_eq!(reply.json()["error"]["code"], -32602, "{params}");
    }
}

#[tokio::test]
async fn progress_streams_as_server_sent_events_before_the_result() {
    let server = start_with(FeatureBackend).await;
    let reply = modern_meta(
        &server,
        "t",
        "tools/call",
        json!({"name": "progress"}),
        json!({"progressToken": "tok-1"}),
    )
    .await;
    assert_eq!(reply.status, StatusCode::OK);
    let messages = sse_messages(&reply);
    assert_eq!(messages.len(), 3, "{messages:?}");
    for (message, progress) in messages.iter().zip([1.0, 2.0]) {
        assert_eq!(message["method"], "notifications/progress");
        assert_eq!(message["params"]["progressToken"], "tok-1");
        assert_eq!(message["params"]["progress"], progress);
        assert_eq!(message["params"]["total"], 3.0);
    }
    assert_eq!(messages[0]["params"]["message"], "one");
    assert_eq!(messages[2]["id"], 1);
    assert_eq!(
        messages[2]["result"]["content"][0]["text"],
        "wants_progress=true"
    );
    assert_eq!(messages[2]["result"]["resultType"], "complete");
    // No token, or a client that takes only JSON: no notifications, a JSON answer.
    let reply = modern(&server, "t", "tools/call", json!({"name": "progress"}), &[]).await;
    assert_eq!(reply.header("content-type"), "application/json");
    assert_eq!(
        reply.json()["result"]["content"][0]["text"],
        "wants_progress=false"
    );
    let mut body: Value =
        serde_json::from_str(&modern_body(9, "tools/call", json!({"name": "progress"}))).unwrap();
    body["params"]["_meta"]["progressToken"] = json!(5);
    let json_only = send(
        server.addr,
        Method::POST,
        "/mcp",
        &[
            ("content-type", "application/json"),
            ("accept", "application/json"),
            ("authorization", "Bearer t"),
            ("mcp-protocol-version", "2026-07-28"),
            ("mcp-method", "tools/call"),
            ("mcp-name", "progress"),
        ],
        &body.to_string(),
    )
    .await;
    assert_eq!(json_only.header("content-type"), "application/json");
    assert_eq!(json_only.json()["id"], 9);
    // A token that is neither a string nor an integer is invalid params.
    let reply = modern_meta(
        &server,
        "t",
        "tools/call",
        json!({"name": "progress"}),
        json!({"progressToken": {"x": 1}}),
    )
    .await;
    assert_eq!(reply.json()["error"]["code"], -32602);
    // Once streaming, a refusal that would have been HTTP 403 is a JSON-RPC error event.
    let reply = modern_meta(
        &server,
        "t",
        "tools/call",
        json!({"name": "forbidden_after_progress"}),
        json!({"progressToken": 1}),
    )
    .await;
    assert_eq!(reply.status, StatusCode::OK);
    let messages = sse_messages(&reply);
    assert_eq!(messages.len(), 2);
    assert_eq!(messages[1]["error"]["code"], -32011);
    assert_eq!(messages[1]["error"]["data"]["scope"], "workflows:write");
}

#[tokio::test]
async fn log_messages_only_at_the_level_the_client_asked_for() {
    let server = start_with(FeatureBackend).await;
    // 2026-07-28: none without `_meta` logLevel.
    let reply = modern(&server, "t", "tools/call", json!({"name": "log"}), &[]).await;
    assert_eq!(reply.header("content-type"), "application/json");
    let reply = modern_meta(
        &server,
        "t",
        "tools/call",
        json!({"name": "log"}),
        json!({"io.modelcontextprotocol/logLevel": "warning"}),
    )
    .await;
    let messages = sse_messages(&reply);
    assert_eq!(messages.len(), 2, "{messages:?}");
    assert_eq!(
        messages[0],
        json!({"jsonrpc": "2.0", "method": "notifications/message",
            "params": {"level": "error", "logger": "test", "data": "error line"}})
    );
    let reply = modern_meta(
        &server,
        "t",
        "tools/call",
        json!({"name": "log"}),
        json!({"io.modelcontextprotocol/logLevel": "loud"}),
    )
    .await;
    assert_eq!(reply.json()["error"]["code"], -32602);
    // 2025: logging/setLevel on the session, then the POST streams.
    let (_, session) = initialize(&server, "t", "2025-11-25").await;
    let call =
        json!({"jsonrpc": "2.0", "id": 5, "method": "tools/call", "params": {"name": "log"}});
    let before = legacy(&server, "t", call.clone(), &[("mcp-session-id", &session)]).await;
    assert_eq!(before.header("content-type"), "application/json");
    let set = |level: &str| json!({"jsonrpc": "2.0", "id": 6, "method": "logging/setLevel", "params": {"level": level}});
    let reply = legacy(&server, "t", set("debug"), &[("mcp-session-id", &session)]).await;
    assert_eq!(reply.json()["result"], json!({}));
    let reply = legacy(&server, "t", call.clone(), &[("mcp-session-id", &session)]).await;
    let messages = sse_messages(&reply);
    assert_eq!(messages.len(), 3);
    assert_eq!(messages[0]["params"]["level"], "debug");
    assert_eq!(messages[2]["result"]["content"][0]["text"], "logged");
    // Another token's session is not found; no session or a bad level is refused.
    let reply = legacy(&server, "u", set("debug"), &[("mcp-session-id", &session)]).await;
    assert_eq!(reply.status, StatusCode::NOT_FOUND);
    let reply = legacy(&server, "t", set("debug"), &[]).await;
    assert_eq!(reply.json()["error"]["code"], -32600);
    let reply = legacy(&server, "t", set("LOUD"), &[("mcp-session-id", &session)]).await;
    assert_eq!(reply.json()["error"]["code"], -32602);
}

#[tokio::test]
async fn an_undeclared_client_capability_is_32021_and_http_400() {
    let server = start_with(FeatureBackend).await;
    let reply = modern(
        &server,
        "t",
        "tools/call",
        json!({"name": "needs_sampling"}),
        &[],
    )
    .await;
    assert_eq!(reply.status, StatusCode::BAD_REQUEST);
    let error = &reply.json()["error"];
    assert_eq!(error["code"], -32021);
    assert_eq!(
        error["data"]["requiredCapabilities"],
        json!({"sampling": {}})
    );
    assert_eq!(reply.json()["id"], 1);
    let reply = modern_meta(
        &server,
        "t",
        "tools/call",
        json!({"name": "needs_sampling"}),
        json!({"io.modelcontextprotocol/clientCapabilities": {"sampling": {}}}),
    )
    .await;
    assert_eq!(reply.json()["result"]["content"][0]["text"], "sampled");
    // The transport refuses an input request for a capability the client lacks, whatever the
    // backend asked.
    let reply = modern(
        &server,
        "t",
        "tools/call",
        json!({"name": "ask_roots"}),
        &[],
    )
    .await;
    assert_eq!(reply.status, StatusCode::BAD_REQUEST);
    assert_eq!(
        reply.json()["error"]["data"]["requiredCapabilities"],
        json!({"roots": {}})
    );
    // Capabilities that are not an object are invalid params.
    let reply = modern_meta(
        &server,
        "t",
        "tools/call",
        json!({"name": "needs_sampling"}),
        json!({"io.modelcontextprotocol/clientCapabilities": ["sampling"]}),
    )
    .await;
    assert_eq!(reply.json()["error"]["code"], -32602);
}

#[tokio::test]
async fn input_required_round_trips_with_a_sealed_state_bound_to_its_request() {
    let server = start_with(FeatureBackend).await;
    let caps = json!({"io.modelcontextprotocol/clientCapabilities": {"elicitation": {}}});
    let round1 = modern_meta(
        &server,
        "t",
        "tools/call",
        json!({"name": "ask"}),
        caps.clone(),
    )
    .await;
    assert_eq!(round1.status, StatusCode::OK);
    let result = round1.json()["result"].clone();
    assert_eq!(result["resultType"], "input_required");
    assert_eq!(
        result["inputRequests"]["name"]["method"],
        "elicitation/create"
    );
    let state = result["requestState"].as_str().unwrap().to_owned();
    assert!(!state.contains("asked"), "the state is opaque: {state}");
    let retry = |name: &'static str, responses: Value, state: Value, token: &'static str| {
        let server = &server;
        let caps = caps.clone();
        async move {
            modern_meta(
                server,
                token,
                "tools/call",
                json!({"name": name, "inputResponses": responses, "requestState": state}),
                caps,
            )
            .await
        }
    };
    let answer = json!({"name": {"action": "accept", "content": {"name": "Alice"}}});
    let done = retry("ask", answer.clone(), json!(state), "t").await;
    let result = &done.json()["result"];
    assert_eq!(result["resultType"], "complete");
    assert_eq!(result["content"][0]["text"], "Alice after \"ask\"");
    // Tampered, for another tool, for another token, or not a string: invalid params, and the
    // backend never sees it.
    let tampered = format!("{state}-TAMPERED");
    for (name, state, token) in [
        ("ask", json!(tampered), "t"),
        ("ask_other", json!(state), "t"),
        ("ask", json!(state), "u"),
        ("ask", json!(5), "t"),
    ] {
        let reply = retry(name, answer.clone(), state.clone(), token).await;
        assert_eq!(
            reply.status,
            StatusCode::BAD_REQUEST,
            "{name} {state} {token}"
        );
        assert_eq!(reply.json()["error"]["code"], -32602);
    }
    // inputResponses must be an object of objects.
    for responses in [
        json!(null),
        json!(12345),
        json!({"name": 12345}),
        json!(["x"]),
    ] {
        let reply = retry("ask", responses.clone(), json!(state), "t").await;
        assert_eq!(reply.json()["error"]["code"], -32602, "{responses}");
    }
    // Without the elicitation capability the transport will not ask.
    let reply = modern(&server, "t", "tools/call", json!({"name": "ask"}), &[]).await;
    assert_eq!(reply.json()["error"]["code"], -32021);
    // The handshake era has no retry parameters: they are ignored, and a client that did not
    // declare elicitation at initialize is not asked (see the next test for one that did).
    let (_, session) = initialize(&server, "t", "2025-11-25").await;
    let reply = legacy(
        &server,
        "t",
        json!({"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": {"name": "ask",
            "inputResponses": answer, "requestState": state}}),
        &[("mcp-session-id", &session)],
    )
    .await;
    assert_eq!(reply.json()["error"]["code"], -32021);
}

/// A POST whose response body is read event by event (a streamed answer).
struct EventStream {
    status: StatusCode,
    headers: HeaderMap,
    body: hyper::body::Incoming,
    buffer: String,
}

impl EventStream {
    async fn open(addr: SocketAddr, headers: &[(&str, &str)], body: Value) -> EventStream {
        let stream = TcpStream::connect(addr).await.unwrap();
        let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .unwrap();
        tokio::spawn(connection);
        let mut request = Request::builder()
            .method(Method::POST)
            .uri("/mcp")
            .header("host", addr.to_string());
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        let request = request
            .body(Full::new(Bytes::from(body.to_string())))
            .unwrap();
        let response = sender.send_request(request).await.unwrap();
        let (parts, body) = response.into_parts();
        EventStream {
            status: parts.status,
            headers: parts.headers,
            body,
            buffer: String::new(),
        }
    }

    /// The next message event, waiting at most 5 s.
    async fn next(&mut self) -> Value {
        loop {
            if let Some((event, rest)) = self.buffer.split_once("\n\n") {
                let data = event.strip_prefix("event: message\ndata: ").unwrap();
                let message = serde_json::from_str(data).unwrap();
                self.buffer = rest.to_owned();
                return message;
            }
            let frame = tokio::time::timeout(Duration::from_secs(5), self.body.frame())
                .await
                .expect("an event within 5 s")
                .expect("the stream goes on")
                .unwrap();
            if let Ok(data) = frame.into_data() {
                self.buffer.push_str(std::str::from_utf8(&data).unwrap());
            }
        }
    }
}

#[tokio::test]
async fn legacy_input_requests_are_asked_on_the_stream_and_answered_on_the_session() {
    let server = start_with(FeatureBackend).await;
    let init = |capabilities: Value| {
        let server = &server;
        async move {
            let reply = legacy(
                server,
                "t",
                json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
                    "protocolVersion": "2025-11-25", "capabilities": capabilities,
                    "clientInfo": {"name": "raw", "version": "0"}}}),
                &[],
            )
            .await;
            reply.header("mcp-session-id").to_owned()
        }
    };
    let session = init(json!({"elicitation": {}})).await;
    let headers = [
        ("content-type", "application/json"),
        ("accept", "application/json, text/event-stream"),
        ("authorization", "Bearer t"),
        ("mcp-protocol-version", "2025-11-25"),
        ("mcp-session-id", session.as_str()),
    ];
    let call =
        json!({"jsonrpc": "2.0", "id": 5, "method": "tools/call", "params": {"name": "ask"}});
    let mut stream = EventStream::open(server.addr, &headers, call.clone()).await;
    assert_eq!(stream.status, StatusCode::OK);
    assert_eq!(stream.headers["content-type"], "text/event-stream");
    let request = stream.next().await;
    assert_eq!(request["method"], "elicitation/create");
    assert_eq!(request["params"]["message"], "name?");
    let request_id = request["id"].as_str().unwrap().to_owned();
    let reply = |id: &str, token: &str, session: &str| {
        let server = &server;
        let body = json!({"jsonrpc": "2.0", "id": id,
            "result": {"action": "accept", "content": {"name": "Bob"}}});
        let (token, session) = (token.to_owned(), session.to_owned());
        async move {
            legacy(
                server,
                &token,
                body,
                &[
                    ("mcp-session-id", &session),
                    ("mcp-protocol-version", "2025-11-25"),
                ],
            )
            .await
        }
    };
    // Another token cannot use the session; another session or id answers nothing.
    assert_eq!(
        reply(&request_id, "u", &session).await.status,
        StatusCode::NOT_FOUND
    );
    let other_session = init(json!({"elicitation": {}})).await;
    assert_eq!(
        reply(&request_id, "t", &other_session).await.status,
        StatusCode::ACCEPTED
    );
    assert_eq!(
        reply("agentworks-nope", "t", &session).await.status,
        StatusCode::ACCEPTED
    );
    // The right one is taken, and the backend runs again with it and its state.
    assert_eq!(
        reply(&request_id, "t", &session).await.status,
        StatusCode::ACCEPTED
    );
    let answer = stream.next().await;
    assert_eq!(answer["id"], 5);
    assert_eq!(answer["result"]["content"][0]["text"], "Bob after \"ask\"");
    assert!(answer["result"].get("resultType").is_none());
    // A client that did not declare elicitation is not asked; one without a session cannot be.
    let unable = init(json!({})).await;
    let reply = legacy(&server, "t", call.clone(), &[("mcp-session-id", &unable)]).await;
    assert_eq!(reply.json()["error"]["code"], -32021);
    assert_eq!(
        reply.json()["error"]["data"]["requiredCapabilities"],
        json!({"elicitation": {}})
    );
    let reply = legacy(&server, "t", call, &[]).await;
    assert_eq!(reply.json()["error"]["code"], -32603);
}

// ---------------------------------------------------------------------------------------------
// SEP-2243 custom headers: `x-mcp-header` arguments mirrored as `Mcp-Param-{Name}`.

/// A backend whose `echo` tool declares `x-mcp-header` arguments (a string at the top, an
/// integer and a boolean nested in `options`), and whose `broken` tool declares an invalid one.
struct ParamHeaderBackend;

impl Backend for ParamHeaderBackend {
    async fn authenticate(&self, bearer: Option<&str>) -> Result<Caller, super::Admission> {
        let token = bearer.ok_or(AuthError::Missing)?;
        Ok(Caller {
            token_id: token.to_owned(),
            user_id: token.to_owned(),
            user_name: token.to_owned(),
            scopes: Vec::new(),
            reach: None,
        })
    }

    async fn list_tools(&self, _request: super::RequestContext<'_>) -> Vec<Value> {
        vec![
            json!({"name": "echo", "description": "echoes", "inputSchema": {
                "type": "object",
                "properties": {
                    "region": {"type": "string", "x-mcp-header": "Region"},
                    "options": {"type": "object", "properties": {
                        "priority": {"type": "integer", "x-mcp-header": "Priority"},
                        "verbose": {"type": "boolean", "x-mcp-header": "Verbose"},
                    }},
                    "query": {"type": "string"},
                },
            }}),
            json!({"name": "broken", "description": "badly declared", "inputSchema": {
                "type": "object",
                "properties": {"a": {"type": "string", "x-mcp-header": "Bad Name"}},
            }}),
        ]
    }

    async fn call_tool(
        &self,
        _request: super::RequestContext<'_>,
        name: &str,
        arguments: Map<String, Value>,
    ) -> Result<super::ToolResult, super::CallError> {
        Ok(super::ToolResult {
            content: vec![
                json!({"type": "text", "text": format!("{name} {}", Value::Object(arguments))}),
            ],
            structured_content: None,
            is_error: false,
        })
    }
}

/// A 2026-07-28 `tools/call` of `tool` with consistent standard headers and exactly the
/// `Mcp-Param-*` lines given (repeats kept).
async fn call_with_params(
    server: &Server,
    tool: &str,
    arguments: Value,
    params: &[(&str, &str)],
) -> Reply {
    let body = modern_body(
        7,
        "tools/call",
        json!({"name": tool, "arguments": arguments}),
    );
    let mut headers: Vec<(&str, &str)> = JSON_HEADERS.to_vec();
    headers.extend([
        ("authorization", "Bearer t"),
        ("mcp-protocol-version", "2026-07-28"),
        ("mcp-method", "tools/call"),
        ("mcp-name", tool),
    ]);
    headers.extend_from_slice(params);
    send(server.addr, Method::POST, "/mcp", &headers, &body).await
}

#[tokio::test]
async fn param_headers_that_mirror_the_arguments_are_accepted() {
    let server = start_with(ParamHeaderBackend).await;
    let long = "a".repeat(8 * 1024);
    let cases: Vec<(Value, Vec<(&str, &str)>)> = vec![
        // Base64 form, decoded (the suite's `sep-2243-server-decode-base64`).
        (
            json!({"region": "Hello"}),
            vec![("mcp-param-region", "=?base64?SGVsbG8=?=")],
        ),
        // Not exactly the form: literals (`sep-2243-server-validate-param-match`).
        (
            json!({"region": "SGVsbG8="}),
            vec![("mcp-param-region", "SGVsbG8=")],
        ),
        (
            json!({"region": "=?base64?SGVsbG8="}),
            vec![("mcp-param-region", "=?base64?SGVsbG8=")],
        ),
        (
            json!({"region": "=?base64?=", "query": "q"}),
            vec![("mcp-param-region", "=?base64?=")],
        ),
        // Non-ASCII and significant whitespace, as the specification has clients encode them.
        (
            json!({"region": " héllo, 世界 "}),
            vec![("mcp-param-region", "=?base64?IGjDqWxsbywg5LiW55WMIA==?=")],
        ),
        // The empty string, both ways.
        (
            json!({"region": ""}),
            vec![("mcp-param-region", "=?base64??=")],
        ),
        // Header-name case does not matter; undeclared Mcp-Param headers are ignored.
        (
            json!({"region": "us-west1"}),
            vec![
                ("MCP-PARAM-REGION", "us-west1"),
                ("mcp-param-other", "=?base64?!!!?="),
            ],
        ),
        // Nested integer (numerically: 42.0 is 42) and boolean.
        (
            json!({"region": "r", "options": {"priority": 42, "verbose": true}}),
            vec![
                ("mcp-param-region", "r"),
                ("mcp-param-priority", "42"),
                ("mcp-param-verbose", "true"),
            ],
        ),
        (
            json!({"options": {"priority": -7, "verbose": false}}),
            vec![
                ("mcp-param-priority", "-7.00"),
                ("mcp-param-verbose", "false"),
            ],
        ),
        // No value (absent or null): no header expected.
        (json!({}), vec![]),
        (
            json!({"region": null, "options": {"priority": null}}),
            vec![],
        ),
        // As long as a value may be.
        (
            json!({"region": long}),
            vec![("mcp-param-region", long.as_str())],
        ),
    ];
    for (arguments, params) in cases {
        let reply = call_with_params(&server, "echo", arguments.clone(), &params).await;
        assert_eq!(reply.status, StatusCode::OK, "{arguments} {params:?}");
        let body = reply.json();
        assert_eq!(body["result"]["resultType"], "complete", "{body}");
        assert_eq!(
            body["result"]["content"][0]["text"],
            format!("echo {arguments}")
        );
    }
}

#[tokio::test]
async fn param_headers_that_are_missing_malformed_or_different_are_400_header_mismatch() {
    let server = start_with(ParamHeaderBackend).await;
    let long = "a".repeat(8 * 1024 + 1);
    let hello = json!({"region": "Hello"});
    let cases: Vec<(Value, Vec<(&str, &str)>)> = vec![
        // Bad padding, characters outside the alphabet (`sep-2243-server-reject-invalid-param-chars`).
        (
            hello.clone(),
            vec![("mcp-param-region", "=?base64?SGVsbG8?=")],
        ),
        (
            hello.clone(),
            vec![("mcp-param-region", "=?base64?SGVs!!!bG8=?=")],
        ),
        // Not canonical (nonzero trailing bits), URL-safe alphabet, not UTF-8 once decoded.
        (
            hello.clone(),
            vec![("mcp-param-region", "=?base64?SGVsbG9=?=")],
        ),
        (
            json!({"region": "\u{fb}\u{ff}"}),
            vec![("mcp-param-region", "=?base64?w7vDvw?=")],
        ),
        (
            json!({"region": "??>"}),
            vec![("mcp-param-region", "=?base64?Pz8-?=")],
        ),
        (hello.clone(), vec![("mcp-param-region", "=?base64?//8=?=")]),
        // Omitted while the body has the value (`sep-2243-server-reject-param-mismatch`).
        (hello.clone(), vec![]),
        (
            json!({"region": "r", "options": {"verbose": true}}),
            vec![("mcp-param-region", "r")],
        ),
        // A different value; the base64 of a different value; the prefix is case-sensitive.
        (hello.clone(), vec![("mcp-param-region", "World")]),
        (
            hello.clone(),
            vec![("mcp-param-region", "=?base64?V29ybGQ=?=")],
        ),
        (
            json!({"region": "=?BASE64?SGVsbG8=?="}),
            vec![("mcp-param-region", "=?base64?SGVsbG8=?=")],
        ),
        // Sent twice (first-copy and last-copy readers would disagree).
        (
            hello.clone(),
            vec![("mcp-param-region", "Hello"), ("mcp-param-region", "Hello")],
        ),
        // A header without a value in the body (absent or null).
        (json!({}), vec![("mcp-param-region", "Hello")]),
        (json!({"region": null}), vec![("mcp-param-region", "null")]),
        // Raw non-ASCII is not a header value the specification allows: base64 it.
        (
            json!({"region": "héllo"}),
            vec![("mcp-param-region", "héllo")],
        ),
        // Too long to compare.
        (
            json!({"region": long}),
            vec![("mcp-param-region", long.as_str())],
        ),
        // Integers and booleans by value.
        (
            json!({"options": {"priority": 42}}),
            vec![("mcp-param-priority", "43")],
        ),
        (
            json!({"options": {"priority": 42}}),
            vec![("mcp-param-priority", "42.5")],
        ),
        (
            json!({"options": {"priority": 42}}),
            vec![("mcp-param-priority", "0x2a")],
        ),
        (
            json!({"options": {"verbose": true}}),
            vec![("mcp-param-verbose", "True")],
        ),
        // An argument that cannot be mirrored (an object where a string is declared).
        (
            json!({"region": {"a": 1}}),
            vec![("mcp-param-region", "{\"a\":1}")],
        ),
    ];
    for (arguments, params) in cases {
        let reply = call_with_params(&server, "echo", arguments.clone(), &params).await;
        assert_eq!(
            reply.status,
            StatusCode::BAD_REQUEST,
            "{arguments} {params:?}"
        );
        let body = reply.json();
        assert_eq!(
            body["error"]["code"], -32020,
            "{arguments} {params:?} {body}"
        );
        assert_eq!(body["id"], 7);
        let message = body["error"]["message"].as_str().unwrap();
        assert!(
            message.starts_with("Header mismatch: Mcp-Param-"),
            "{message}"
        );
    }
    // More Mcp-Param lines than are read: refused for a tool that declares any.
    let many: Vec<String> = (0..65).map(|i| format!("mcp-param-x{i}")).collect();
    let mut params: Vec<(&str, &str)> = many.iter().map(|name| (name.as_str(), "v")).collect();
    params.push(("mcp-param-region", "Hello"));
    let reply = call_with_params(&server, "echo", hello.clone(), &params).await;
    assert_eq!(reply.status, StatusCode::BAD_REQUEST);
    assert_eq!(reply.json()["error"]["code"], -32020);
    // A tool whose own declaration is invalid is the backend's fault, never run.
    let reply = call_with_params(&server, "broken", json!({"a": "x"}), &[]).await;
    let body = reply.json();
    assert_eq!(body["error"]["code"], -32603, "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("invalid x-mcp-header"),
        "{body}"
    );
}

#[tokio::test]
async fn agentds_tools_declare_no_param_headers_and_ignore_stray_ones() {
    let server = start().await;
    let list = modern(&server, "read", "tools/list", json!({}), &[]).await;
    assert_eq!(list.status, StatusCode::OK);
    let tools = list.json()["result"]["tools"].clone();
    assert!(!tools.as_array().unwrap().is_empty());
    assert!(
        !tools.to_string().contains("x-mcp-header"),
        "agentd's tools declare no custom headers: {tools}"
    );
    let call =
        json!({"name": "read_file", "arguments": {"workflow_id": "wf1", "path": "notes.md"}});
    let plain = modern(&server, "read", "tools/call", call.clone(), &[]).await;
    assert_eq!(plain.status, StatusCode::OK);
    assert!(plain.json()["result"].is_object(), "{}", plain.json());
    let stray = modern(
        &server,
        "read",
        "tools/call",
        call,
        &[
            ("mcp-param-path", "=?base64?!!!?="),
            ("mcp-param-workflow_id", "other"),
        ],
    )
    .await;
    assert_eq!(stray.status, plain.status);
    assert_eq!(stray.json(), plain.json());
}
