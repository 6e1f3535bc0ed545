//! A scripted OpenAI Responses API server on loopback: the model a coding CLI talks to in tests.
//!
//! It accepts `POST /v1/responses`, records each request (path, headers, JSON body), and answers
//! the Nth request with the Nth [`Reply`] of its script as a stream of server-sent `response.*`
//! events: `response.created`, `response.output_item.added`, `response.output_text.delta` (for
//! text), `response.output_item.done` and `response.completed` with [`USAGE_PER_REPLY`]. A
//! request beyond the script, or to another path, gets a 500 naming why, so a test never passes
//! on an answer it did not script.

use std::sync::Arc;

use hyper::{Response, StatusCode};
use serde_json::{Value, json};

pub use super::RecordedRequest;
use super::{Body, ScriptedServer, failure, json_response, sse};

/// The usage every scripted answer reports: (input tokens, output tokens).
pub const USAGE_PER_REPLY: (u64, u64) = (11, 7);

/// One scripted answer.
#[derive(Debug, Clone)]
pub enum Reply {
    /// An assistant message with this text.
    Text(String),
    /// The upstream refuses the key: 401 with an OpenAI-style error body, for this request
    /// and every later one.
    RefuseKey,
    /// A call to one of the client's function tools.
    FunctionCall {
        name: String,
        call_id: String,
        arguments: Value,
    },
    /// A call to a tool of the client's MCP server `server`, as Codex 0.171 offers them: a
    /// function `tool` in the namespace `mcp__<server>`.
    McpCall {
        server: String,
        tool: String,
        call_id: String,
        arguments: Value,
    },
}

impl Reply {
    /// A call of Codex's shell tool (`exec_command {cmd}`), running `cmd`.
    pub fn exec_command(call_id: &str, cmd: &str) -> Reply {
        Reply::FunctionCall {
            name: "exec_command".into(),
            call_id: call_id.into(),
            arguments: json!({ "cmd": cmd }),
        }
    }
}

/// The running server; stops when dropped.
pub struct ScriptedResponses {
    server: ScriptedServer,
}

impl ScriptedResponses {
    /// Starts the server on an ephemeral loopback port.
    pub async fn start(script: Vec<Reply>) -> std::io::Result<Self> {
        let state = Arc::new(State { script });
        let server =
            ScriptedServer::start(move |request, index| state.answer(request, index)).await?;
        Ok(Self { server })
    }

    /// The base URL a client is configured with: `http://127.0.0.1:PORT/v1`.
    pub fn base_url(&self) -> String {
        self.server.base_url()
    }

    /// Every request so far, in order.
    pub fn requests(&self) -> Vec<RecordedRequest> {
        self.server.requests()
    }
}

struct State {
    script: Vec<Reply>,
}

impl State {
    fn answer(&self, request: &RecordedRequest, index: usize) -> Response<Body> {
        let (method, path) = (&request.method, &request.path);
        if method != "POST" || path != "/v1/responses" {
            return failure(format!("the scripted server has no {method} {path}"));
        }
        let refusing =
            matches!(self.script.last(), Some(Reply::RefuseKey)) && index + 1 >= self.script.len();
        if refusing {
            let body = json!({"error": {
                "message": "Incorrect API key provided",
                "type": "invalid_request_error",
                "code": "invalid_api_key",
            }});
            return json_response(StatusCode::UNAUTHORIZED, &body);
        }
        let Some(reply) = self.script.get(index) else {
            return failure(format!(
                "the script has {} replies; this is request {}",
                self.script.len(),
                index + 1
            ));
        };
        sse(&events(reply, index))
    }
}

/// The `response.*` events of one reply.
fn events(reply: &Reply, index: usize) -> Vec<Value> {
    let response_id = format!("resp_{index}");
    let mut events = vec![json!({
        "type": "response.created",
        "response": {"id": response_id, "status": "in_progress"},
    })];
    match reply {
        // Answered before any event (`ScriptedResponses::answer`).
        Reply::RefuseKey => {}
        Reply::Text(text) => {
            let item_id = format!("msg_{index}");
            events.push(json!({
                "type": "response.output_item.added", "output_index": 0,
                "item": {"type": "message", "id": item_id, "role": "assistant", "content": []},
            }));
            events.push(json!({
                "type": "response.output_text.delta", "item_id": item_id,
                "output_index": 0, "content_index": 0, "delta": text,
            }));
            events.push(json!({
                "type": "response.output_item.done", "output_index": 0,
                "item": {"type": "message", "id": item_id, "role": "assistant",
                         "content": [{"type": "output_text", "text": text, "annotations": []}]},
            }));
        }
        Reply::FunctionCall {
            name,
            call_id,
            arguments,
        } => {
            let item = json!({
                "type": "function_call", "id": format!("fc_{index}"), "call_id": call_id,
                "name": name, "arguments": arguments.to_string(),
            });
            events.push(
                json!({"type": "response.output_item.added", "output_index": 0, "item": item}),
            );
            events.push(
                json!({"type": "response.output_item.done", "output_index": 0, "item": item}),
            );
        }
        Reply::McpCall {
            server,
            tool,
            call_id,
            arguments,
        } => {
            let item = json!({
                "type": "function_call", "id": format!("fc_{index}"), "call_id": call_id,
                "name": tool, "namespace": format!("mcp__{server}"),
                "arguments": arguments.to_string(),
            });
            events.push(
                json!({"type": "response.output_item.added", "output_index": 0, "item": item}),
            );
            events.push(
                json!({"type": "response.output_item.done", "output_index": 0, "item": item}),
            );
        }
    }
    let (input, output) = USAGE_PER_REPLY;
    events.push(json!({
        "type": "response.completed",
        "response": {"id": response_id, "status": "completed", "usage": {
            "input_tokens": input, "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": output, "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": input + output,
        }},
    }));
    events
}
