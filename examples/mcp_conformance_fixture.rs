//! The MCP conformance fixture: agentd's production MCP transport (`agentworks_agent::mcp`:
//! the same router, header ladder, both eras, legacy sessions, error mapping) and its public
//! listener (`serve_public`: the same limits and refusals), over a backend that serves the
//! fixture tools the official conformance suite (`@modelcontextprotocol/conformance`) calls by
//! name, with the exact content its scenarios expect.
//!
//! A test artefact only: it is an example, so no package installs it. It listens on loopback
//! only and accepts any request without a token (the suite cannot send one); agentd's own
//! endpoint, with its tokens, is checked by the same suite separately in `.ci/run`.
//!
//! Run: `cargo run --example mcp_conformance_fixture -- [PORT]` (0 or none: any free port).
//! It prints `listening on http://127.0.0.1:PORT/mcp` once it accepts connections and serves
//! until SIGINT or SIGTERM.

use agentworks_agent::mcp::{
    Admission, Backend, CallError, Caller, McpConfig, McpService, RequestContext, ToolResult,
};
use agentworks_daemon::ipc::connections::ConnectionLimits;
use agentworks_daemon::ipc::server::{BodyRefusal, PublicLimits, Screen, Verdict, serve_public};
use serde_json::{Map, Value, json};
use std::sync::Arc;

/// A 1×1 red PNG, as the suite's reference server sends it.
const PNG: &str = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8DwHwAFBQIAX8jx0gAAAABJRU5ErkJggg==";
/// A minimal WAV, as the suite's reference server sends it.
const WAV: &str = "UklGRiYAAABXQVZFZm10IBAAAAABAAEAQB8AAAB9AAACABAAZGF0YQIAAAA=";
/// The largest request body the fixture reads.
const MAX_BODY_BYTES: usize = 1024 * 1024;

/// The fixture's tools: a name, a description and an input schema each, and the content the
/// suite checks.
struct FixtureBackend;

fn tool(name: &str, description: &str, input_schema: Value) -> Value {
    json!({"name": name, "description": description, "inputSchema": input_schema})
}

fn no_arguments() -> Value {
    json!({"type": "object", "properties": {}})
}

fn text(text: &str) -> Value {
    json!({"type": "text", "text": text})
}

fn content(items: Vec<Value>) -> ToolResult {
    ToolResult {
        content: items,
        structured_content: None,
        is_error: false,
    }
}

/// `json_schema_2020_12_tool`'s input schema, which the suite checks is passed through
/// verbatim (`$schema`, `$defs`, `$anchor`, composition and conditional keywords).
fn json_schema_2020_12() -> Value {
    json!({
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "type": "object",
        "$defs": {"address": {"$anchor": "addressDef", "type": "object",
            "properties": {"street": {"type": "string"}, "city": {"type": "string"}}}},
        "properties": {
            "name": {"type": "string"},
            "address": {"$ref": "#/$defs/address"},
            "contactMethod": {"type": "string", "enum": ["phone", "email"]},
            "phone": {"type": "string"},
            "email": {"type": "string"},
        },
        "allOf": [{"anyOf": [{"required": ["phone"]}, {"required": ["email"]}]}],
        "if": {"properties": {"contactMethod": {"const": "phone"}}, "required": ["contactMethod"]},
        "then": {"required": ["phone"]},
        "else": {"required": ["email"]},
        "additionalProperties": false,
    })
}

impl Backend for FixtureBackend {
    async fn authenticate(&self, _bearer: Option<&str>) -> Result<Caller, Admission> {
        Ok(Caller {
            token_id: "conformance".into(),
            user_id: "conformance".into(),
            user_name: "conformance".into(),
            scopes: Vec::new(),
        })
    }

    async fn list_tools(&self, _request: RequestContext<'_>) -> Vec<Value> {
        vec![
            tool(
                "test_simple_text",
                "Returns a simple text response.",
                no_arguments(),
            ),
            tool("test_image_content", "Returns an image.", no_arguments()),
            tool(
                "test_audio_content",
                "Returns an audio clip.",
                no_arguments(),
            ),
            tool(
                "test_embedded_resource",
                "Returns an embedded resource.",
                no_arguments(),
            ),
            tool(
                "test_multiple_content_types",
                "Returns text, an image and a resource.",
                no_arguments(),
            ),
            tool(
                "test_error_handling",
                "Always fails, as a tool result.",
                no_arguments(),
            ),
            tool(
                "json_schema_2020_12_tool",
                "Has a JSON Schema 2020-12 input schema.",
                json_schema_2020_12(),
            ),
        ]
    }

    async fn call_tool(
        &self,
        _request: RequestContext<'_>,
        name: &str,
        arguments: Map<String, Value>,
    ) -> Result<ToolResult, CallError> {
        Ok(match name {
            "test_simple_text" => {
                content(vec![text("This is a simple text response for testing.")])
            }
            "test_image_content" => content(vec![
                json!({"type": "image", "data": PNG, "mimeType": "image/png"}),
            ]),
            "test_audio_content" => content(vec![
                json!({"type": "audio", "data": WAV, "mimeType": "audio/wav"}),
            ]),
            "test_embedded_resource" => content(vec![json!({"type": "resource", "resource": {
                "uri": "test://embedded-resource", "mimeType": "text/plain",
                "text": "This is an embedded resource content."}})]),
            "test_multiple_content_types" => content(vec![
                text("Multiple content types test:"),
                json!({"type": "image", "data": PNG, "mimeType": "image/png"}),
                json!({"type": "resource", "resource": {"uri": "test://mixed-content-resource",
                    "mimeType": "application/json", "text": "{\"test\":\"data\",\"value\":123}"}}),
            ]),
            "test_error_handling" => ToolResult {
                content: vec![text("This tool intentionally returns an error for testing")],
                structured_content: None,
                is_error: true,
            },
            "json_schema_2020_12_tool" => content(vec![text(&format!(
                "Received: {}",
                Value::Object(arguments)
            ))]),
            other => return Err(CallError::UnknownTool(other.to_owned())),
        })
    }
}

/// The public listener's screen: `/mcp` as agentd screens it; nothing else is served.
struct FixtureScreen {
    mcp: Arc<McpService<FixtureBackend>>,
}

impl Screen for FixtureScreen {
    async fn screen(&self, head: &hyper::http::request::Parts) -> Verdict {
        if head.uri.path() == "/mcp" {
            return self.mcp.verdict(head, MAX_BODY_BYTES).await;
        }
        Verdict::Anonymous
    }

    fn body_refusal(
        &self,
        head: &hyper::http::request::Parts,
        refusal: BodyRefusal,
    ) -> hyper::Response<agentworks_daemon::ipc::envelope::Body> {
        self.mcp.body_refusal(&head.method, &head.headers, refusal)
    }
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let port: u16 = match std::env::args().nth(1).map(|p| p.parse()) {
        None => 0,
        Some(Ok(port)) => port,
        Some(Err(error)) => {
            eprintln!("mcp_conformance_fixture: the port must be a number: {error}");
            return std::process::ExitCode::from(2);
        }
    };
    let listener = match tokio::net::TcpListener::bind(("127.0.0.1", port)).await {
        Ok(listener) => listener,
        Err(error) => {
            eprintln!("mcp_conformance_fixture: cannot listen on 127.0.0.1:{port}: {error}");
            return std::process::ExitCode::from(1);
        }
    };
    let Ok(address) = listener.local_addr() else {
        eprintln!("mcp_conformance_fixture: the listener has no address");
        return std::process::ExitCode::from(1);
    };
    let public_url = format!("http://{address}");
    let mcp = Arc::new(McpService::new(
        Arc::new(FixtureBackend),
        McpConfig {
            public_url,
            instructions: "The MCP conformance suite's fixture server.".into(),
            scopes_supported: Vec::new(),
            allowed_origins: Vec::new(),
            loopback_port: Some(address.port()),
            server_name: "agentworks-conformance-fixture".into(),
            server_version: env!("CARGO_PKG_VERSION").into(),
            // Every client of the suite shares the one anonymous caller.
            max_sessions_per_token: 1024,
        },
    ));
    let screen = Arc::new(FixtureScreen { mcp: mcp.clone() });
    let handler = move |_peer, parts: hyper::http::request::Parts, body: bytes::Bytes| {
        let mcp = mcp.clone();
        async move {
            let path = parts.uri.path().to_owned();
            let request = hyper::Request::from_parts(parts, body);
            mcp.handle(request).await.unwrap_or_else(|| {
                agentworks_daemon::ipc::envelope::error_response(
                    hyper::StatusCode::NOT_FOUND,
                    "not_found",
                    format!("{path} is not served here; MCP is at /mcp"),
                    Default::default(),
                )
            })
        }
    };
    let shutdown = agentworks_support::signals::cancel_on_signals(|_| ());
    let limits = PublicLimits::new(
        ConnectionLimits::with_reserved_quarter(256, 256),
        64 * MAX_BODY_BYTES,
    );
    println!("listening on http://{address}/mcp");
    serve_public(listener, screen, handler, shutdown, limits).await;
    std::process::ExitCode::SUCCESS
}
