//! A client for a project's remote MCP servers (streamable HTTP), over the one guarded outbound
//! client ([`agentworks_support::outbound::GuardedClient`]): every request is dialled only to a
//! checked public address, with no proxy and no redirect across origins, and every answer is
//! bounded in size and time.
//!
//! One [`RemoteSession`] is one MCP session: `initialize` (protocol 2025-11-25, accepting the
//! earlier versions a server may answer with), `notifications/initialized`, then `tools/list`
//! and `tools/call`. Over streamable HTTP each is a POST whose answer is JSON or a
//! server-sent-event stream that the server closes after the response ([`response_of`] reads
//! both). Over the older HTTP+SSE transport (2024-11-05) a GET opens one event stream whose
//! first `endpoint` event names where to POST (it must be the same origin), and every response
//! arrives on that stream ([`EventLines`] reads it as it comes). A server's own requests
//! (sampling, elicitation) are not answered: agentd never lets a remote server drive its model.
//!
//! It is hand-written rather than taken from the official Rust SDK (`rmcp`) because that client
//! brings its own HTTP stack (reqwest), which dials without the guard's address checks; the
//! part of the protocol agentd needs is a few JSON-RPC calls.
//!
//! Must never: send a request to an address the guard refuses, follow a redirect to another
//! origin, keep reading past the size limit, or hand the model an answer that is not the
//! JSON-RPC response to the request it sent.

use crate::connections::store::Transport;
use agentworks_support::outbound::{GuardedClient, OutboundError, Streaming};
use bytes::Bytes;
use hyper::header::{ACCEPT, CONTENT_TYPE, HeaderMap, HeaderName, HeaderValue, WWW_AUTHENTICATE};
use hyper::{Method, Request, StatusCode};
use serde_json::{Value, json};
use std::sync::atomic::{AtomicU64, Ordering};

/// The version asked for in `initialize`.
pub const PROTOCOL_VERSION: &str = "2025-11-25";
/// The versions accepted in the server's answer.
pub const ACCEPTED_VERSIONS: &[&str] = &["2025-11-25", "2025-06-18", "2025-03-26", "2024-11-05"];
/// How long a response may take to arrive on an HTTP+SSE stream.
pub const SSE_RESPONSE_WAIT: std::time::Duration = std::time::Duration::from_secs(120);
/// The most an HTTP+SSE stream may carry in all, in bytes.
pub const SSE_STREAM_LIMIT: usize = 16 << 20;
/// `tools/list` pages read at most (a server that keeps sending cursors is cut off).
pub const MAX_TOOL_PAGES: usize = 8;
/// Tools taken from one server at most.
pub const MAX_TOOLS: usize = 128;

const SESSION_HEADER: &str = "mcp-session-id";
const VERSION_HEADER: &str = "mcp-protocol-version";

#[derive(Debug, thiserror::Error)]
pub enum RemoteError {
    #[error("{0}")]
    Outbound(#[from] OutboundError),
    #[error("the server needs a sign-in (HTTP 401){}", .challenge.as_deref().map(|c| format!(": {c}")).unwrap_or_default())]
    Unauthorized { challenge: Option<String> },
    #[error("the server answered HTTP {status}: {excerpt}")]
    Status { status: StatusCode, excerpt: String },
    #[error("the server's answer is not MCP: {0}")]
    Protocol(String),
    #[error("the server refused {method}: {message} (JSON-RPC error {code})")]
    Rpc {
        method: String,
        code: i64,
        message: String,
    },
}

impl RemoteError {
    /// A stable code for the chat's tool result and the API.
    pub fn code(&self) -> &'static str {
        match self {
            RemoteError::Outbound(OutboundError::RefusedHost { .. })
            | RemoteError::Outbound(OutboundError::RefusedAddress { .. }) => "address_refused",
            RemoteError::Outbound(OutboundError::Redirect { .. }) => "redirect_refused",
            RemoteError::Outbound(_) => "server_unreachable",
            RemoteError::Unauthorized { .. } => "sign_in_required",
            RemoteError::Status { .. } | RemoteError::Protocol(_) => "server_error",
            RemoteError::Rpc { .. } => "server_refused",
        }
    }
}

/// One tool a remote server offers, as it described it.
#[derive(Debug, Clone, PartialEq)]
pub struct RemoteTool {
    pub name: String,
    pub description: String,
    pub input_schema: Value,
}

/// One MCP session with a remote server.
#[derive(Debug)]
pub struct RemoteSession {
    client: GuardedClient,
    url: String,
    /// The connection's own headers (its resolved secrets), sent with every request.
    headers: HeaderMap,
    session_id: Option<HeaderValue>,
    protocol: String,
    server_name: String,
    next_id: AtomicU64,
    /// Over HTTP+SSE: the stream every response arrives on (`url` is then the POST endpoint).
    legacy: Option<LegacyStream>,
}

/// The event stream of an HTTP+SSE session: a task reads it and hands on each message.
#[derive(Debug)]
struct LegacyStream {
    messages: tokio::sync::Mutex<tokio::sync::mpsc::Receiver<Value>>,
    reader: tokio::task::JoinHandle<()>,
}

impl Drop for LegacyStream {
    fn drop(&mut self) {
        self.reader.abort();
    }
}

/// Server-sent events from a stream that arrives in pieces: complete lines are taken as they
/// come (a line may be split across chunks, and across a UTF-8 character), an empty line ends
/// an event. CR LF and LF both end a line.
#[derive(Default)]
pub struct EventLines {
    pending: Vec<u8>,
    event: String,
    data: Option<String>,
}

impl EventLines {
    /// Feed a chunk; the events it completed, as `(event name, data)` (the name `message` when
    /// the event had none).
    pub fn feed(&mut self, chunk: &[u8]) -> Vec<(String, String)> {
        self.pending.extend_from_slice(chunk);
        let mut done = Vec::new();
        while let Some(end) = self.pending.iter().position(|&b| b == b'\n') {
            let mut line: Vec<u8> = self.pending.drain(..=end).collect();
            line.pop();
            if line.last() == Some(&b'\r') {
                line.pop();
            }
            let line = String::from_utf8_lossy(&line);
            if line.is_empty() {
                if let Some(data) = self.data.take() {
                    let name = std::mem::take(&mut self.event);
                    done.push((
                        if name.is_empty() {
                            "message".into()
                        } else {
                            name
                        },
                        data,
                    ));
                }
                self.event.clear();
                continue;
            }
            let (field, value) = line.split_once(':').unwrap_or((&line, ""));
            let value = value.strip_prefix(' ').unwrap_or(value);
            match field {
                "event" => self.event = value.to_owned(),
                "data" => match &mut self.data {
                    Some(data) => {
                        data.push('\n');
                        data.push_str(value);
                    }
                    None => self.data = Some(value.to_owned()),
                },
                _ => {}
            }
        }
        done
    }
}

/// Reads an HTTP+SSE stream to its end: the first `endpoint` event's data goes to `endpoint`,
/// every JSON message to `messages`.
async fn read_stream(
    mut stream: Streaming,
    endpoint: tokio::sync::oneshot::Sender<String>,
    messages: tokio::sync::mpsc::Sender<Value>,
) {
    let mut endpoint = Some(endpoint);
    let mut lines = EventLines::default();
    while let Ok(Some(chunk)) = stream.chunk().await {
        for (name, data) in lines.feed(&chunk) {
            if name == "endpoint" {
                if let Some(endpoint) = endpoint.take() {
                    let _ = endpoint.send(data);
                }
            } else if let Ok(message) = serde_json::from_str::<Value>(&data)
                && messages.send(message).await.is_err()
            {
                return;
            }
        }
    }
}

impl RemoteSession {
    /// `initialize` and `notifications/initialized` over `transport`.
    pub async fn open(
        client: GuardedClient,
        url: &str,
        headers: HeaderMap,
        transport: Transport,
    ) -> Result<RemoteSession, RemoteError> {
        let (url, legacy) = match transport {
            Transport::StreamableHttp => (url.to_owned(), None),
            Transport::Sse => {
                let (endpoint, stream) = open_legacy(&client, url, &headers).await?;
                (endpoint, Some(stream))
            }
        };
        let mut session = RemoteSession {
            client,
            url,
            headers,
            session_id: None,
            protocol: PROTOCOL_VERSION.to_owned(),
            server_name: String::new(),
            next_id: AtomicU64::new(1),
            legacy,
        };
        let (result, response_headers) = session
            .exchange(
                "initialize",
                Some(json!({
                    "protocolVersion": PROTOCOL_VERSION,
                    "capabilities": {},
                    "clientInfo": {"name": "agentworks-agentd", "version": env!("CARGO_PKG_VERSION")},
                })),
            )
            .await?;
        let version = result["protocolVersion"].as_str().unwrap_or_default();
        if !ACCEPTED_VERSIONS.contains(&version) {
            return Err(RemoteError::Protocol(format!(
                "it speaks protocol version {version:?}; agentd speaks {}",
                ACCEPTED_VERSIONS.join(", ")
            )));
        }
        session.protocol = version.to_owned();
        session.server_name = result["serverInfo"]["name"]
            .as_str()
            .unwrap_or_default()
            .chars()
            .filter(|c| !c.is_control())
            .take(64)
            .collect();
        session.session_id = response_headers.get(SESSION_HEADER).cloned();
        session.notify("notifications/initialized").await?;
        Ok(session)
    }

    /// The name the server gave itself (control characters removed, at most 64).
    pub fn server_name(&self) -> &str {
        &self.server_name
    }

    /// Every tool the server lists (following cursors, within the bounds above).
    pub async fn list_tools(&self) -> Result<Vec<RemoteTool>, RemoteError> {
        let mut tools = Vec::new();
        let mut cursor: Option<String> = None;
        for _ in 0..MAX_TOOL_PAGES {
            let params = cursor.as_ref().map(|c| json!({"cursor": c}));
            let (result, _) = self.exchange("tools/list", params).await?;
            let listed = result["tools"]
                .as_array()
                .ok_or_else(|| RemoteError::Protocol("tools/list has no tools array".into()))?;
            for tool in listed {
                let Some(name) = tool["name"].as_str() else {
                    return Err(RemoteError::Protocol("a tool has no name".into()));
                };
                tools.push(RemoteTool {
                    name: name.to_owned(),
                    description: tool["description"].as_str().unwrap_or_default().to_owned(),
                    input_schema: match &tool["inputSchema"] {
                        Value::Object(_) => tool["inputSchema"].clone(),
                        _ => json!({"type": "object"}),
                    },
                });
                if tools.len() >= MAX_TOOLS {
                    return Ok(tools);
                }
            }
            match result["nextCursor"].as_str() {
                Some(next) if !next.is_empty() => cursor = Some(next.to_owned()),
                _ => return Ok(tools),
            }
        }
        Ok(tools)
    }

    /// `tools/call`: the server's `CallToolResult` as it sent it.
    pub async fn call_tool(&self, name: &str, arguments: Value) -> Result<Value, RemoteError> {
        let (result, _) = self
            .exchange(
                "tools/call",
                Some(json!({"name": name, "arguments": arguments})),
            )
            .await?;
        Ok(result)
    }

    fn request(&self, body: &Value) -> Result<Request<Bytes>, RemoteError> {
        let mut builder = Request::builder().method(Method::POST).uri(&self.url);
        for (name, value) in &self.headers {
            builder = builder.header(name, value);
        }
        builder = builder.header(CONTENT_TYPE, "application/json");
        if self.legacy.is_none() {
            builder = builder
                .header(ACCEPT, "application/json, text/event-stream")
                .header(HeaderName::from_static(VERSION_HEADER), &self.protocol);
        }
        if let Some(id) = &self.session_id {
            builder = builder.header(HeaderName::from_static(SESSION_HEADER), id);
        }
        builder
            .body(Bytes::from(body.to_string()))
            .map_err(|e| RemoteError::Protocol(format!("the request could not be built: {e}")))
    }

    async fn notify(&self, method: &str) -> Result<(), RemoteError> {
        let request = self.request(&json!({"jsonrpc": "2.0", "method": method}))?;
        let response = self.client.send(request).await?;
        check_status(response.status, &response.headers, &response.body)
    }

    /// One request and its response: the `result`, and the response's headers.
    async fn exchange(
        &self,
        method: &str,
        params: Option<Value>,
    ) -> Result<(Value, HeaderMap), RemoteError> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let mut body = json!({"jsonrpc": "2.0", "id": id, "method": method});
        if let Some(params) = params {
            body["params"] = params;
        }
        let response = self.client.send(self.request(&body)?).await?;
        check_status(response.status, &response.headers, &response.body)?;
        if let Some(legacy) = &self.legacy {
            let message = legacy.response(id).await?;
            return outcome(method, message, response.headers);
        }
        let content_type = response
            .headers
            .get(CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default();
        let message = response_of(content_type, &response.body, id)?;
        outcome(method, message, response.headers)
    }
}

/// A JSON-RPC response as the `result` (with the answer's headers), or the error it carries.
fn outcome(
    method: &str,
    message: Value,
    headers: HeaderMap,
) -> Result<(Value, HeaderMap), RemoteError> {
    if let Some(error) = message.get("error") {
        return Err(RemoteError::Rpc {
            method: method.to_owned(),
            code: error["code"].as_i64().unwrap_or(0),
            message: error["message"]
                .as_str()
                .unwrap_or("no message")
                .chars()
                .take(500)
                .collect(),
        });
    }
    match message.get("result") {
        Some(result) => Ok((result.clone(), headers)),
        None => Err(RemoteError::Protocol(format!(
            "the response to {method} has neither result nor error"
        ))),
    }
}

impl LegacyStream {
    /// The response with `id` from the stream (other messages passed over), within
    /// [`SSE_RESPONSE_WAIT`].
    async fn response(&self, id: u64) -> Result<Value, RemoteError> {
        let mut messages = self.messages.lock().await;
        let deadline = tokio::time::Instant::now() + SSE_RESPONSE_WAIT;
        loop {
            match tokio::time::timeout_at(deadline, messages.recv()).await {
                Ok(Some(message))
                    if message["id"].as_u64() == Some(id) && message.get("method").is_none() =>
                {
                    return Ok(message);
                }
                Ok(Some(_)) => continue,
                Ok(None) => {
                    return Err(RemoteError::Protocol(format!(
                        "the event stream ended with no response to request {id}"
                    )));
                }
                Err(_) => {
                    return Err(RemoteError::Protocol(format!(
                        "no response to request {id} within {} s",
                        SSE_RESPONSE_WAIT.as_secs()
                    )));
                }
            }
        }
    }
}

/// Open an HTTP+SSE session's stream at `url`: the POST endpoint its first event names (which
/// must be the stream's own origin), and the stream, now read by a task of its own.
async fn open_legacy(
    client: &GuardedClient,
    url: &str,
    headers: &HeaderMap,
) -> Result<(String, LegacyStream), RemoteError> {
    let mut builder = Request::builder().method(Method::GET).uri(url);
    for (name, value) in headers {
        builder = builder.header(name, value);
    }
    let request = builder
        .header(ACCEPT, "text/event-stream")
        .body(Bytes::new())
        .map_err(|e| RemoteError::Protocol(format!("the request could not be built: {e}")))?;
    let stream = client.open_stream(request, SSE_STREAM_LIMIT).await?;
    check_status(stream.status, &stream.headers, b"")?;
    let (endpoint_tx, endpoint_rx) = tokio::sync::oneshot::channel();
    let (messages_tx, messages_rx) = tokio::sync::mpsc::channel(64);
    let reader = tokio::spawn(read_stream(stream, endpoint_tx, messages_tx));
    let legacy = LegacyStream {
        messages: tokio::sync::Mutex::new(messages_rx),
        reader,
    };
    let named = tokio::time::timeout(std::time::Duration::from_secs(30), endpoint_rx)
        .await
        .map_err(|_| {
            RemoteError::Protocol("the event stream named no endpoint within 30 s".into())
        })?
        .map_err(|_| {
            RemoteError::Protocol("the event stream ended before naming its endpoint".into())
        })?;
    let base = url::Url::parse(url).map_err(|e| RemoteError::Protocol(e.to_string()))?;
    let endpoint = base
        .join(named.trim())
        .map_err(|e| RemoteError::Protocol(format!("the endpoint {named:?} is not a URL: {e}")))?;
    if endpoint.origin() != base.origin() {
        return Err(RemoteError::Protocol(format!(
            "the event stream named an endpoint on another origin ({endpoint}); refused"
        )));
    }
    Ok((endpoint.to_string(), legacy))
}

fn check_status(status: StatusCode, headers: &HeaderMap, body: &[u8]) -> Result<(), RemoteError> {
    if status == StatusCode::UNAUTHORIZED {
        return Err(RemoteError::Unauthorized {
            challenge: headers
                .get(WWW_AUTHENTICATE)
                .and_then(|v| v.to_str().ok())
                .map(|v| v.chars().take(500).collect()),
        });
    }
    if !status.is_success() {
        let excerpt: String = String::from_utf8_lossy(&body[..body.len().min(300)])
            .chars()
            .filter(|c| !c.is_control())
            .collect();
        return Err(RemoteError::Status { status, excerpt });
    }
    Ok(())
}

/// The JSON-RPC response with `id` in a body that is either one JSON message (or a batch) or
/// a stream of server-sent events, each `data:` a JSON message; anything else in the stream
/// (notifications, the server's own requests, comments, other ids) is passed over.
pub fn response_of(content_type: &str, body: &[u8], id: u64) -> Result<Value, RemoteError> {
    let is_ours =
        |message: &Value| message["id"].as_u64() == Some(id) && message.get("method").is_none();
    let media = content_type
        .split(';')
        .next()
        .unwrap_or_default()
        .trim()
        .to_ascii_lowercase();
    let text = std::str::from_utf8(body)
        .map_err(|_| RemoteError::Protocol("the body is not UTF-8".into()))?;
    match media.as_str() {
        "application/json" => {
            let value: Value = serde_json::from_str(text)
                .map_err(|e| RemoteError::Protocol(format!("the body is not JSON: {e}")))?;
            let found = match value {
                Value::Array(batch) => batch.into_iter().find(is_ours),
                single => Some(single).filter(is_ours),
            };
            found.ok_or_else(|| RemoteError::Protocol(format!("no response to request {id}")))
        }
        "text/event-stream" => {
            let mut data = String::new();
            // A blank line ends an event; one more at the end flushes the last.
            for line in text.lines().chain(std::iter::once("")) {
                if line.is_empty() {
                    if !data.is_empty() {
                        if let Ok(message) = serde_json::from_str::<Value>(&data)
                            && is_ours(&message)
                        {
                            return Ok(message);
                        }
                        data.clear();
                    }
                    continue;
                }
                if let Some(rest) = line.strip_prefix("data:") {
                    if !data.is_empty() {
                        data.push('\n');
                    }
                    data.push_str(rest.strip_prefix(' ').unwrap_or(rest));
                }
                // `event:`, `id:`, `retry:` and `:` comments carry nothing needed here.
            }
            Err(RemoteError::Protocol(format!(
                "the event stream ended with no response to request {id}"
            )))
        }
        other => Err(RemoteError::Protocol(format!(
            "the answer's type is {other:?}, not application/json or text/event-stream"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_json_answer_and_a_batch_give_the_response_with_our_id() {
        let body = br#"{"jsonrpc":"2.0","id":3,"result":{"ok":true}}"#;
        assert_eq!(
            response_of("application/json; charset=utf-8", body, 3).unwrap()["result"]["ok"],
            true
        );
        assert!(response_of("application/json", body, 4).is_err());
        let batch = br#"[{"jsonrpc":"2.0","method":"notifications/progress"},{"jsonrpc":"2.0","id":7,"result":{}}]"#;
        assert_eq!(response_of("application/json", batch, 7).unwrap()["id"], 7);
    }

    #[test]
    fn an_event_stream_skips_notifications_server_requests_and_comments() {
        let body = concat!(
            ": a comment\r\n",
            "event: message\r\n",
            "data: {\"jsonrpc\":\"2.0\",\"method\":\"notifications/message\",\"params\":{}}\r\n",
            "\r\n",
            // The server's own request with our number is not our response.
            "data: {\"jsonrpc\":\"2.0\",\"id\":5,\"method\":\"sampling/createMessage\"}\n\n",
            "id: e1\n",
            "data: {\"jsonrpc\":\"2.0\",\n",
            "data: \"id\":5,\"result\":{\"content\":[]}}\n",
        );
        let message = response_of("text/event-stream", body.as_bytes(), 5).unwrap();
        assert_eq!(message["result"], json!({"content": []}));
        let none = "data: {\"jsonrpc\":\"2.0\",\"id\":6,\"result\":{}}\n\n";
        assert!(matches!(
            response_of("text/event-stream", none.as_bytes(), 5),
            Err(RemoteError::Protocol(_))
        ));
    }

    #[test]
    fn event_lines_are_taken_as_they_complete_whatever_the_chunks() {
        let stream = "event: endpoint\r\ndata: /messages/?session_id=1\r\n\r\n: keep-alive\n\ndata: {\"id\":1,\ndata:\"é\"}\n\n";
        let bytes = stream.as_bytes();
        // Every split point, including inside the two-byte 'é'.
        for cut in 0..bytes.len() {
            let mut lines = EventLines::default();
            let mut events = lines.feed(&bytes[..cut]);
            events.extend(lines.feed(&bytes[cut..]));
            assert_eq!(
                events,
                [
                    ("endpoint".to_owned(), "/messages/?session_id=1".to_owned()),
                    ("message".to_owned(), "{\"id\":1,\n\"é\"}".to_owned()),
                ],
                "cut at {cut}"
            );
        }
        // An event without its ending blank line is not handed on yet.
        let mut lines = EventLines::default();
        assert!(lines.feed(b"data: half").is_empty());
        assert!(lines.feed(b"\n").is_empty());
        assert_eq!(lines.feed(b"\n").len(), 1);
    }

    #[test]
    fn other_types_and_bytes_are_refused() {
        assert!(response_of("text/html", b"<html>", 1).is_err());
        assert!(response_of("application/json", b"\xff\xfe", 1).is_err());
        assert!(response_of("application/json", b"not json", 1).is_err());
    }

    #[test]
    fn a_401_carries_its_challenge_and_other_failures_an_excerpt() {
        let mut headers = HeaderMap::new();
        headers.insert(
            WWW_AUTHENTICATE,
            HeaderValue::from_static("Bearer resource_metadata=\"https://x/.well-known\""),
        );
        let error = check_status(StatusCode::UNAUTHORIZED, &headers, b"").unwrap_err();
        assert_eq!(error.code(), "sign_in_required");
        assert!(error.to_string().contains("resource_metadata"), "{error}");
        let error = check_status(
            StatusCode::BAD_GATEWAY,
            &HeaderMap::new(),
            b"upstream\x07 down",
        )
        .unwrap_err();
        assert_eq!(
            error.to_string(),
            "the server answered HTTP 502 Bad Gateway: upstream down"
        );
    }
}
