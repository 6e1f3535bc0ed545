//! A scripted OpenAI chat-completions server on loopback: the model an OpenAI-compatible
//! coding CLI (OpenCode) talks to in tests.
//!
//! It accepts `POST /v1/chat/completions`, records each request (path, headers, JSON body), and
//! answers the Nth request with the Nth [`Reply`] of its script as streamed chunks
//! (`chat.completion.chunk` server-sent events): the assistant's text or its tool call, the
//! finish reason, then a last chunk with no choices and the usage ([`USAGE_PER_REPLY`], as
//! `stream_options.include_usage` asks), then `data: [DONE]`. A request beyond the script, or to
//! another path, gets a 500 naming why, so a test never passes on an answer it did not script.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use futures_util::StreamExt;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

pub use super::responses::RecordedRequest;

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

    /// The request's `messages`.
    pub fn messages(&self) -> &[Value] {
        self.body["messages"].as_array().map_or(&[], Vec::as_slice)
    }
}

/// The running server; stops when dropped.
pub struct ScriptedChat {
    addr: SocketAddr,
    requests: Arc<Mutex<Vec<RecordedRequest>>>,
    task: JoinHandle<()>,
}

impl ScriptedChat {
    /// Starts the server on an ephemeral loopback port.
    pub async fn start(script: Vec<Reply>) -> std::io::Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let requests = Arc::new(Mutex::new(Vec::new()));
        let state = Arc::new(State {
            script,
            requests: Arc::clone(&requests),
        });
        let task = tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                let state = Arc::clone(&state);
                tokio::spawn(async move {
                    let service = hyper::service::service_fn(move |request| {
                        let state = Arc::clone(&state);
                        async move { Ok::<_, std::convert::Infallible>(state.answer(request).await) }
                    });
                    // A client that hangs up mid-answer is not the test's failure.
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        Ok(Self {
            addr,
            requests,
            task,
        })
    }

    /// The base URL a client is configured with: `http://127.0.0.1:PORT/v1`.
    pub fn base_url(&self) -> String {
        format!("http://{}/v1", self.addr)
    }

    /// Every request so far, in order.
    pub fn requests(&self) -> Vec<RecordedRequest> {
        self.requests
            .lock()
            .expect("the request log's lock was poisoned")
            .clone()
    }
}

impl Drop for ScriptedChat {
    fn drop(&mut self) {
        self.task.abort();
    }
}

struct State {
    script: Vec<Reply>,
    requests: Arc<Mutex<Vec<RecordedRequest>>>,
}

type Body = http_body_util::combinators::BoxBody<Bytes, std::convert::Infallible>;

impl State {
    async fn answer(&self, request: Request<Incoming>) -> Response<Body> {
        let at = std::time::Instant::now();
        let method = request.method().to_string();
        let path = request.uri().path().to_owned();
        let headers = request
            .headers()
            .iter()
            .map(|(n, v)| {
                (
                    n.as_str().to_owned(),
                    String::from_utf8_lossy(v.as_bytes()).into_owned(),
                )
            })
            .collect();
        let body = match request.into_body().collect().await {
            Ok(collected) => serde_json::from_slice(&collected.to_bytes()).unwrap_or(Value::Null),
            Err(_) => Value::Null,
        };
        let index = {
            let mut requests = self
                .requests
                .lock()
                .expect("the request log's lock was poisoned");
            requests.push(RecordedRequest {
                method: method.clone(),
                path: path.clone(),
                headers,
                body,
                at,
            });
            requests.len() - 1
        };
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
            return full(
                StatusCode::UNAUTHORIZED,
                "application/json",
                body.to_string(),
            );
        }
        let Some(reply) = self.script.get(index) else {
            return failure(format!(
                "the script has {} replies; this is request {}",
                self.script.len(),
                index + 1
            ));
        };
        if let Reply::Stall(text) = reply {
            let first = Bytes::from(sse(&[chunk(
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
        full(
            StatusCode::OK,
            "text/event-stream",
            sse(&chunks(reply, index)),
        )
    }
}

fn full(status: StatusCode, content_type: &str, body: String) -> Response<Body> {
    Response::builder()
        .status(status)
        .header("content-type", content_type)
        .body(BodyExt::boxed(Full::new(Bytes::from(body))))
        .expect("a static response is valid")
}

fn failure(message: String) -> Response<Body> {
    let body = json!({"error": {"message": message, "type": "server_error"}}).to_string();
    full(StatusCode::INTERNAL_SERVER_ERROR, "application/json", body)
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

/// Server-sent events: `data: <json>` per chunk, then `data: [DONE]`.
fn sse(chunks: &[Value]) -> String {
    let mut out: String = chunks.iter().map(|c| format!("data: {c}\n\n")).collect();
    out.push_str("data: [DONE]\n\n");
    out
}
