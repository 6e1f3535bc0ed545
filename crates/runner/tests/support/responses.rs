//! A scripted OpenAI Responses API server on loopback: the model a coding CLI talks to in tests.
//!
//! It accepts `POST /v1/responses`, records each request (path, headers, JSON body), and answers
//! the Nth request with the Nth [`Reply`] of its script as a stream of server-sent `response.*`
//! events: `response.created`, `response.output_item.added`, `response.output_text.delta` (for
//! text), `response.output_item.done` and `response.completed` with [`USAGE_PER_REPLY`]. A
//! request beyond the script, or to another path, gets a 500 naming why, so a test never passes
//! on an answer it did not script.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

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

/// A request the server received.
#[derive(Debug, Clone)]
pub struct RecordedRequest {
    pub method: String,
    pub path: String,
    /// Header names lowercased.
    pub headers: Vec<(String, String)>,
    /// The JSON body (`Value::Null` when it was not JSON).
    pub body: Value,
    /// When its head arrived (the benchmarks time a CLI's first model request).
    pub at: std::time::Instant,
}

impl RecordedRequest {
    pub fn header(&self, name: &str) -> Option<&str> {
        let name = name.to_ascii_lowercase();
        self.headers
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, v)| v.as_str())
    }

    /// The names of the request's tools: functions by name, namespaces as `namespace`, hosted
    /// tools by type.
    pub fn tool_names(&self) -> Vec<String> {
        self.body["tools"]
            .as_array()
            .map(|tools| {
                tools
                    .iter()
                    .map(|t| {
                        t["name"]
                            .as_str()
                            .or(t["type"].as_str())
                            .unwrap_or("")
                            .to_owned()
                    })
                    .collect()
            })
            .unwrap_or_default()
    }

    /// The tool named `name`, when the request offers it.
    pub fn tool(&self, name: &str) -> Option<&Value> {
        self.body["tools"]
            .as_array()?
            .iter()
            .find(|t| t["name"].as_str() == Some(name))
    }

    /// The request's `input` items.
    pub fn input(&self) -> &[Value] {
        self.body["input"].as_array().map_or(&[], Vec::as_slice)
    }
}

/// The running server; stops when dropped.
pub struct ScriptedResponses {
    addr: SocketAddr,
    requests: Arc<Mutex<Vec<RecordedRequest>>>,
    task: JoinHandle<()>,
}

impl ScriptedResponses {
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

impl Drop for ScriptedResponses {
    fn drop(&mut self) {
        self.task.abort();
    }
}

struct State {
    script: Vec<Reply>,
    requests: Arc<Mutex<Vec<RecordedRequest>>>,
}

impl State {
    async fn answer(&self, request: Request<Incoming>) -> Response<Full<Bytes>> {
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
            return Response::builder()
                .status(StatusCode::UNAUTHORIZED)
                .header("content-type", "application/json")
                .body(Full::new(Bytes::from(body.to_string())))
                .expect("a static response is valid");
        }
        let Some(reply) = self.script.get(index) else {
            return failure(format!(
                "the script has {} replies; this is request {}",
                self.script.len(),
                index + 1
            ));
        };
        let stream = sse(&events(reply, index));
        Response::builder()
            .header("content-type", "text/event-stream")
            .body(Full::new(Bytes::from(stream)))
            .expect("a static response is valid")
    }
}

fn failure(message: String) -> Response<Full<Bytes>> {
    let body = json!({"error": {"message": message, "type": "server_error"}}).to_string();
    Response::builder()
        .status(StatusCode::INTERNAL_SERVER_ERROR)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body)))
        .expect("a static response is valid")
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

/// Server-sent events: `event: <type>` and `data: <json>` per event.
fn sse(events: &[Value]) -> String {
    events
        .iter()
        .map(|e| format!("event: {}\ndata: {e}\n\n", e["type"].as_str().unwrap_or("")))
        .collect()
}
