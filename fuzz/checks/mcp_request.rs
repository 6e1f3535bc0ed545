//! The public MCP endpoint's request handling: the JSON-RPC parser (`mcp::wire::parse_message`)
//! on its own, and a whole `/mcp` request through `McpService::handle` (Origin, bearer,
//! method, `Content-Type`, `Accept`, the JSON-RPC body, era classification, the 2026-07-28
//! header ladder with `MCP-Protocol-Version`, `Mcp-Method`, `Mcp-Name` and `Mcp-Param-*`)
//! over a small in-memory backend.
//!
//! The input is an HTTP head and a body split at the first empty line: the head's first line
//! is the method, each further line a `Name: value` header (lines hyper could never deliver
//! are dropped). Without an empty line the whole input is the body of a POST with a JSON
//! content type and a good token, so the fuzzer reaches the parser at once.
//!
//! It must never panic and never answer 5xx. The parser: whatever it accepts re-serialises to
//! a body that parses to the same message, with a valid id that `request_id` reads too; a
//! refusal is a parse error or an invalid request echoing only a valid id. The service: a 401
//! carries a challenge and a 405 an `Allow`; every body is JSON (or one SSE event of JSON);
//! a JSON-RPC answer has exactly one of `result` and `error` and answers the request's own id
//! (or `null` when none could be read); any other answer is the error envelope.

use std::sync::Arc;

use agentworks_agent::mcp::wire::{self, Message, code};
use agentworks_agent::mcp::{
    Admission, AuthError, Backend, CallError, Caller, McpConfig, McpService, RequestContext,
    ToolResult,
};
use bytes::Bytes;
use http_body_util::BodyExt;
use hyper::header::{HeaderName, HeaderValue};
use hyper::{Method, Request};
use serde_json::{Map, Value, json};

/// Tokens: `good` has the endpoint's scope, `weak` is short of it, anything else is unknown.
struct FuzzBackend;

impl Backend for FuzzBackend {
    async fn authenticate(&self, bearer: Option<&str>) -> Result<Caller, Admission> {
        match bearer {
            None => Err(AuthError::Missing.into()),
            Some("good") => Ok(Caller {
                token_id: "t1".to_owned(),
                user_id: "u1".to_owned(),
                user_name: "fuzz".to_owned(),
                scopes: vec!["workflows:read".to_owned()],
                reach: None,
            }),
            Some("weak") => Err(Admission::InsufficientScope("workflows:read".to_owned())),
            Some(_) => Err(AuthError::Invalid.into()),
        }
    }

    async fn list_tools(&self, _request: RequestContext<'_>) -> Vec<Value> {
        vec![
            json!({"name": "echo", "description": "echoes its arguments", "inputSchema": {
                "type": "object",
                "properties": {
                    "region": {"type": "string", "x-mcp-header": "Region"},
                    "count": {"type": "integer", "x-mcp-header": "Count"},
                    "text": {"type": "string"},
                },
            }}),
        ]
    }

    async fn call_tool(
        &self,
        _request: RequestContext<'_>,
        name: &str,
        arguments: Map<String, Value>,
    ) -> Result<ToolResult, CallError> {
        if name != "echo" {
            return Err(CallError::UnknownTool(name.to_owned()));
        }
        Ok(ToolResult {
            content: vec![json!({"type": "text", "text": Value::Object(arguments).to_string()})],
            structured_content: None,
            is_error: false,
        })
    }
}

fn service() -> McpService<FuzzBackend> {
    McpService::new(
        Arc::new(FuzzBackend),
        McpConfig {
            public_url: "http://127.0.0.1:8470".to_owned(),
            instructions: "fuzzing".to_owned(),
            scopes_supported: vec!["workflows:read".to_owned()],
            authorization_servers: Vec::new(),
            allowed_origins: vec!["https://app.example.com".to_owned()],
            loopback_port: Some(8470),
            server_name: "agentworks-fuzz".to_owned(),
            server_version: "0.0.0".to_owned(),
            max_sessions_per_token: 4,
        },
    )
}

thread_local! {
    static RUNTIME: tokio::runtime::Runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a current-thread runtime");
}

/// The parser's own invariants on one body.
fn check_parser(body: &[u8]) {
    let valid_id = |id: &Value| id.is_string() || id.is_i64() || id.is_u64();
    match wire::parse_message(body) {
        Ok(message) => {
            let again = match &message {
                Message::Request { id, method, params } => {
                    assert!(valid_id(id), "{id}");
                    assert_eq!(&wire::request_id(body), id);
                    json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params})
                }
                Message::Notification { method, params } => {
                    json!({"jsonrpc": "2.0", "method": method, "params": params})
                }
                Message::Reply { id, outcome } => {
                    assert!(valid_id(id), "{id}");
                    match outcome {
                        Ok(result) => json!({"jsonrpc": "2.0", "id": id, "result": result}),
                        Err(error) => json!({"jsonrpc": "2.0", "id": id, "error": error}),
                    }
                }
            };
            let text = serde_json::to_vec(&again).expect("JSON serialises");
            assert_eq!(
                wire::parse_message(&text).as_ref().ok(),
                Some(&message),
                "{again}"
            );
        }
        Err((id, error)) => {
            assert!(
                matches!(error.code, code::PARSE_ERROR | code::INVALID_REQUEST),
                "{error:?}"
            );
            assert!(id.is_null() || valid_id(&id), "{id}");
            if !id.is_null() {
                assert_eq!(wire::request_id(body), id);
            }
            if error.code == code::PARSE_ERROR {
                assert!(serde_json::from_slice::<Value>(body).is_err());
            }
        }
    }
}

/// The request the input describes (see the module docs).
fn request(data: &[u8]) -> Request<Bytes> {
    let split = data.windows(2).position(|w| w == b"\n\n");
    let Some(split) = split else {
        let mut request = Request::new(Bytes::copy_from_slice(data));
        *request.method_mut() = Method::POST;
        *request.uri_mut() = hyper::Uri::from_static("/mcp");
        let headers = request.headers_mut();
        headers.insert("content-type", HeaderValue::from_static("application/json"));
        headers.insert("authorization", HeaderValue::from_static("Bearer good"));
        headers.insert(
            "accept",
            HeaderValue::from_static("application/json, text/event-stream"),
        );
        return request;
    };
    let (head, body) = (&data[..split], &data[split + 2..]);
    let mut lines = head.split(|&b| b == b'\n');
    let method = lines
        .next()
        .and_then(|m| Method::from_bytes(m).ok())
        .unwrap_or(Method::POST);
    let mut request = Request::new(Bytes::copy_from_slice(body));
    *request.method_mut() = method;
    *request.uri_mut() = hyper::Uri::from_static("/mcp");
    for line in lines {
        let Some(colon) = line.iter().position(|&b| b == b':') else {
            continue;
        };
        let value = line[colon + 1..].trim_ascii();
        if let (Ok(name), Ok(value)) = (
            HeaderName::from_bytes(&line[..colon]),
            HeaderValue::from_bytes(value),
        ) {
            request.headers_mut().append(name, value);
        }
    }
    request
}

/// The parser's invariants on the body, then the service's on the whole request.
fn check_service(data: &[u8]) {
    let request = request(data);
    let body = request.body().clone();
    check_parser(&body);
    let response = RUNTIME.with(|runtime| {
        runtime.block_on(async {
            let response = service().handle(request).await.expect("/mcp is routed");
            let (parts, answer) = response.into_parts();
            let answer = answer.collect().await.expect("infallible").to_bytes();
            (parts, answer)
        })
    });
    let (parts, answer) = response;
    let status = parts.status.as_u16();
    assert!(status < 500, "HTTP {status}");
    if status == 401 {
        assert!(parts.headers.contains_key("www-authenticate"));
    }
    if status == 405 {
        assert!(parts.headers.contains_key("allow"));
    }
    if matches!(status, 202 | 204) && answer.is_empty() {
        return;
    }
    let content_type = parts
        .headers
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default();
    let text = std::str::from_utf8(&answer).expect("the answer is UTF-8");
    let json = match content_type {
        "application/json" => text,
        "text/event-stream" => text
            .lines()
            .rev()
            .find_map(|line| line.strip_prefix("data: "))
            .expect("an event with data"),
        other => panic!("content type {other:?}: {text}"),
    };
    let answer: Value = serde_json::from_str(json).expect("the answer is JSON");
    if answer.get("jsonrpc").is_none() {
        let error = &answer["error"];
        assert!(
            error["code"].is_string() && error["message"].is_string(),
            "{answer}"
        );
        assert_ne!(status, 200, "{answer}");
        return;
    }
    assert_eq!(answer["jsonrpc"], "2.0", "{answer}");
    let id = &answer["id"];
    assert!(
        answer.get("result").is_some() != answer.get("error").is_some(),
        "{answer}"
    );
    assert!(id.is_null() || *id == wire::request_id(&body), "{answer}");
    match wire::parse_message(&body) {
        Ok(Message::Request { id: asked, .. }) => assert_eq!(*id, asked, "{answer}"),
        Ok(_) => {}
        Err(_) => assert!(answer.get("error").is_some(), "{answer}"),
    }
    if answer["error"]["code"] == code::PARSE_ERROR {
        assert!(wire::parse_message(&body).is_err(), "{answer}");
    }
}

pub fn run(data: &[u8]) {
    check_service(data);
}
