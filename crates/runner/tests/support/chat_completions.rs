//! A scripted OpenAI chat-completions server on loopback: the model an OpenAI-compatible
//! coding CLI (OpenCode) talks to in tests.
//!
//! It accepts `POST /v1/chat/completions`, records each request (path, headers, JSON body), and
//! answers the Nth request with the Nth [`Reply`] of its script as streamed chunks
//! (`chat.completion.chunk` server-sent events): the assistant's text or its tool call, the
//! finish reason, then a last chunk with no choices and the usage ([`USAGE_PER_REPLY`], as
//! `stream_options.include_usage` asks), then `data: [DONE]`. A request beyond the script, or to
//! another path, gets a 500 naming why, so a test never passes on an answer it did not script.

use std::sync::Arc;

use bytes::Bytes;
use futures_util::StreamExt;
use http_body_util::BodyExt;
use hyper::{Response, StatusCode};
use serde_json::{Value, json};

pub use super::RecordedRequest;
use super::{Body, ScriptedServer, failure, json_response, whole};

/// The usage every scripted answer reports: (prompt tokens, completion tokens).
pub const USAGE_PER_REPLY: (u64, u64) = (13, 5);

/// One scripted answer.
#[derive(Debug, Clone)]
pub enum Reply {
    /// An assistant message with this text.
    Text(String),
    /// A call of the client's function `name` (OpenCode names an MCP server's tools
    /// `<server>_<tool>`, e.g. `bridge_execute_shell_command`; its own shell is `bash`).
    ToolCall {
        name: String,
        call_id: String,
        arguments: Value,
    },
    /// The upstream refuses the key: 401 with an OpenAI-style error body, for this request
    /// and every later one.
    RefuseKey,
    /// The answer starts (its text) and then stalls until the client hangs up: a turn that
    /// is stopped while the model streams.
    Stall(String),
}

impl Reply {
    /// A call of OpenCode's tool `name` with `arguments`.
    pub fn tool(name: &str, call_id: &str, arguments: Value) -> Reply {
        Reply::ToolCall {
            name: name.into(),
            call_id: call_id.into(),
            arguments,
        }
    }
}

impl RecordedRequest {
    /// The function names of a chat-completions request's `tools`.
    pub fn function_names(&self) -> Vec<String> {
        self.body["tools"]
            .as_array()
            .map(|tools| {
                tools
                    .iter()
                    .filter_map(|t| t["function"]["name"].as_str().map(str::to_owned))
                    .collect()
            })
            .unwrap_or_default()
    }
}

/// The running server; stops when dropped.
pub struct ScriptedChat {
    server: ScriptedServer,
}

impl ScriptedChat {
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
        if method != "POST" || path != "/v1/chat/completions" {
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
        if let Reply::Stall(text) = reply {
            let first = Bytes::from(data_lines(&[chunk(
                index,
                json!({"role": "assistant", "content": text}),
                None,
            )]));
            // The first chunk, then nothing until the client hangs up.
            let stream = futures_util::stream::once(async move {
                Ok::<_, std::convert::Infallible>(hyper::body::Frame::data(first))
            })
            .chain(futures_util::stream::pending());
            return Response::builder()
                .header("content-type", "text/event-stream")
                .body(BodyExt::boxed(http_body_util::StreamBody::new(stream)))
                .expect("a static response is valid");
        }
        whole(
            StatusCode::OK,
            "text/event-stream",
            data_lines(&chunks(reply, index)),
        )
    }
}

/// One `chat.completion.chunk` with one choice.
fn chunk(index: usize, delta: Value, finish_reason: Option<&str>) -> Value {
    json!({
        "id": format!("chatcmpl-{index}"), "object": "chat.completion.chunk", "created": 0,
        "model": "scripted",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason}],
    })
}

/// The chunks of one reply, the usage last.
fn chunks(reply: &Reply, index: usize) -> Vec<Value> {
    let mut chunks = Vec::new();
    match reply {
        Reply::Text(text) => {
            chunks.push(chunk(
                index,
                json!({"role": "assistant", "content": text}),
                None,
            ));
            chunks.push(chunk(index, json!({}), Some("stop")));
        }
        Reply::ToolCall {
            name,
            call_id,
            arguments,
        } => {
            chunks.push(chunk(
                index,
                json!({"role": "assistant", "tool_calls": [{
                    "index": 0, "id": call_id, "type": "function",
                    "function": {"name": name, "arguments": arguments.to_string()},
                }]}),
                None,
            ));
            chunks.push(chunk(index, json!({}), Some("tool_calls")));
        }
        // Answered before any chunk (`State::answer`).
        Reply::RefuseKey | Reply::Stall(_) => {}
    }
    let (prompt, completion) = USAGE_PER_REPLY;
    chunks.push(json!({
        "id": format!("chatcmpl-{index}"), "object": "chat.completion.chunk", "created": 0,
        "model": "scripted", "choices": [],
        "usage": {"prompt_tokens": prompt, "completion_tokens": completion,
                  "total_tokens": prompt + completion},
    }));
    chunks
}

/// Server-sent events as chat completions stream them: `data: <json>` per chunk (no `event:`
/// line), then `data: [DONE]`.
fn data_lines(chunks: &[Value]) -> String {
    let mut out: String = chunks.iter().map(|c| format!("data: {c}\n\n")).collect();
    out.push_str("data: [DONE]\n\n");
    out
}
