//! A scripted Anthropic Messages API server on loopback: the model Claude Code talks to in tests.
//!
//! It accepts `POST /v1/messages` (Claude Code adds `?beta=true`), records each request (path,
//! headers, JSON body), and answers the Nth request with the Nth [`Reply`] of its script as a
//! stream of server-sent events: `message_start` (with the input tokens of
//! [`USAGE_PER_REPLY`]), `content_block_start`, one `content_block_delta` (`text_delta` or
//! `input_json_delta`), `content_block_stop`, `message_delta` (the stop reason and the output
//! tokens) and `message_stop`. A request beyond the script, or to another path (Claude Code's
//! `count_tokens`, `HEAD /api/hello` and the like, which the driver's environment switches off),
//! gets a 500 naming why, so a test never passes on an answer it did not script.

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
    /// The upstream refuses the key: 401 with an Anthropic error body, for this request and
    /// every later one.
    RefuseKey,
    /// A call of the client's tool `name` (native, like `Bash`, or an MCP tool, which Claude
    /// Code names `mcp__<server>__<tool>`).
    ToolUse {
        name: String,
        id: String,
        input: Value,
    },
}

impl Reply {
    /// A call of Claude Code's native shell tool, `Bash {command}`.
    pub fn bash(id: &str, command: &str) -> Reply {
        Reply::ToolUse {
            name: "Bash".into(),
            id: id.into(),
            input: json!({"command": command, "description": "scripted"}),
        }
    }

    /// A call of the tool `tool` of the client's MCP server `server`.
    pub fn mcp(server: &str, tool: &str, id: &str, input: Value) -> Reply {
        Reply::ToolUse {
            name: format!("mcp__{server}__{tool}"),
            id: id.into(),
            input,
        }
    }
}

/// The running server; stops when dropped.
pub struct ScriptedMessages {
    server: ScriptedServer,
}

impl ScriptedMessages {
    /// Starts the server on an ephemeral loopback port.
    pub async fn start(script: Vec<Reply>) -> std::io::Result<Self> {
        let state = Arc::new(State { script });
        let server =
            ScriptedServer::start(move |request, index| state.answer(request, index)).await?;
        Ok(Self { server })
    }

    /// The base URL of the API, `http://127.0.0.1:PORT/v1` (an upstream's form; Claude Code's
    /// `ANTHROPIC_BASE_URL` is this without `/v1`).
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
        if method != "POST" || path != "/v1/messages" {
            return failure(format!("the scripted server has no {method} {path}"));
        }
        let refusing =
            matches!(self.script.last(), Some(Reply::RefuseKey)) && index + 1 >= self.script.len();
        if refusing {
            let body = json!({"type": "error", "error": {
                "type": "authentication_error",
                "message": "invalid x-api-key",
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
        let model = request.body["model"].as_str().unwrap_or("scripted");
        sse(&events(reply, index, model))
    }
}

/// The events of one reply.
fn events(reply: &Reply, index: usize, model: &str) -> Vec<Value> {
    let (input_tokens, output_tokens) = USAGE_PER_REPLY;
    let mut events = vec![json!({
        "type": "message_start",
        "message": {
            "id": format!("msg_{index}"), "type": "message", "role": "assistant",
            "model": model, "content": [], "stop_reason": null, "stop_sequence": null,
            "usage": {"input_tokens": input_tokens, "output_tokens": 1},
        },
    })];
    let stop_reason = match reply {
        // Answered before any event (`State::answer`).
        Reply::RefuseKey => "end_turn",
        Reply::Text(text) => {
            events.push(json!({
                "type": "content_block_start", "index": 0,
                "content_block": {"type": "text", "text": ""},
            }));
            events.push(json!({
                "type": "content_block_delta", "index": 0,
                "delta": {"type": "text_delta", "text": text},
            }));
            "end_turn"
        }
        Reply::ToolUse { name, id, input } => {
            events.push(json!({
                "type": "content_block_start", "index": 0,
                "content_block": {"type": "tool_use", "id": id, "name": name, "input": {}},
            }));
            events.push(json!({
                "type": "content_block_delta", "index": 0,
                "delta": {"type": "input_json_delta", "partial_json": input.to_string()},
            }));
            "tool_use"
        }
    };
    events.push(json!({"type": "content_block_stop", "index": 0}));
    events.push(json!({
        "type": "message_delta",
        "delta": {"stop_reason": stop_reason, "stop_sequence": null},
        "usage": {"output_tokens": output_tokens},
    }));
    events.push(json!({"type": "message_stop"}));
    events
}
