//! A client for an OpenAI-compatible chat-completions endpoint with tool calling
//! (`POST <base_url>/chat/completions`), over hyper: `https://` through rustls with the webpki
//! roots, `http://` to loopback hosts only.
//!
//! Answers are streamed (`stream: true`, `[agentd.model] stream = false` turns it off): the
//! text reaches the turn's caller as it arrives, and the chunks' deltas (text, tool calls by
//! index, the final `usage`) are put back together into the same answer a non-streamed request
//! gets, then checked by the same parser. An endpoint that ignores `stream` and answers JSON is
//! read as before. The server-sent events are read by [`SseReader`], a few lines written here:
//! the format is small and fixed, and what matters (bounds, line endings split across reads,
//! UTF-8 errors) is easier to check in our own code than through a general event-source crate.
//!
//! The API key comes from `[agentd.model] api_key_file`, else from the systemd credential
//! `$CREDENTIALS_DIRECTORY/model-api-key`, else none is sent. It is read for every request (so
//! a rotated key is picked up) and never logged, never put in an error.
//!
//! Each answer's `usage` (prompt, completion and total tokens) is read into [`Usage`]; an
//! endpoint that sends none counts zeros, and odd values never fail a turn.

use agentworks_daemon::config::ModelConfig;
use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use serde_json::{Value, json};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

/// The largest model response read (streamed or not).
const MAX_RESPONSE_BYTES: usize = 16 * 1024 * 1024;
/// Most tool calls one streamed answer may build (by their `index`).
const MAX_STREAMED_TOOL_CALLS: usize = 128;
/// The systemd credential name of the API key.
const CREDENTIAL_NAME: &str = "model-api-key";

#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    #[error("the model endpoint is misconfigured: {0}")]
    Config(String),
    #[error("cannot read the model API key from {path}: {reason}")]
    Key { path: PathBuf, reason: String },
    #[error("the model endpoint could not be reached: {0}")]
    Unreachable(String),
    #[error("the model did not answer within {0} s")]
    Timeout(u64),
    #[error("the model endpoint answered {status}: {body}")]
    Status { status: u16, body: String },
    #[error("the model's answer is not a chat completion: {0}")]
    Decode(String),
}

impl ModelError {
    /// The error event code.
    pub fn code(&self) -> &'static str {
        match self {
            ModelError::Config(_) | ModelError::Key { .. } => "model_misconfigured",
            ModelError::Timeout(_) => "model_timeout",
            _ => "model_unavailable",
        }
    }
}

/// One tool call the model asked for.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolCall {
    pub id: String,
    pub name: String,
    /// As the model sent it: a JSON text (not trusted to parse).
    pub arguments: String,
}

/// One model answer.
#[derive(Debug, Clone)]
pub struct Reply {
    pub content: Option<String>,
    pub tool_calls: Vec<ToolCall>,
    /// The assistant message to store and send back next time (OpenAI format).
    pub message: Value,
    /// The tokens this request used, as the model reported them (zeros if it did not).
    pub usage: Usage,
}

/// The most tokens one reported count is taken as: no real request comes near it, and it
/// keeps a hostile or broken endpoint's numbers from overflowing the stored sums.
pub const MAX_REPORTED_TOKENS: u64 = 1 << 40;

/// Tokens used, from the chat completion's `usage` object (OpenAI's field names).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct Usage {
    pub prompt_tokens: u64,
    pub completion_tokens: u64,
    pub total_tokens: u64,
}

impl Usage {
    /// The `usage` object of a chat completion: each count a non-negative integer, else 0,
    /// at most [`MAX_REPORTED_TOKENS`]; a missing `total_tokens` is the sum of the other two.
    pub fn from_reply(usage: &Value) -> Usage {
        let count = |name: &str| usage[name].as_u64().map(|n| n.min(MAX_REPORTED_TOKENS));
        let prompt_tokens = count("prompt_tokens").unwrap_or(0);
        let completion_tokens = count("completion_tokens").unwrap_or(0);
        Usage {
            prompt_tokens,
            completion_tokens,
            total_tokens: count("total_tokens").unwrap_or(prompt_tokens + completion_tokens),
        }
    }

    /// Adds `other`'s counts (saturating).
    pub fn add(&mut self, other: Usage) {
        self.prompt_tokens = self.prompt_tokens.saturating_add(other.prompt_tokens);
        self.completion_tokens = self
            .completion_tokens
            .saturating_add(other.completion_tokens);
        self.total_tokens = self.total_tokens.saturating_add(other.total_tokens);
    }
}

struct Endpoint {
    https: bool,
    host: String,
    port: u16,
    /// The base path without a trailing slash, e.g. `/v1`.
    path: String,
    authority: String,
}

fn parse_endpoint(base_url: &str) -> Result<Endpoint, ModelError> {
    let uri: hyper::Uri = base_url
        .parse()
        .map_err(|e| ModelError::Config(format!("base_url {base_url:?}: {e}")))?;
    let https = match uri.scheme_str() {
        Some("https") => true,
        Some("http") => false,
        _ => {
            return Err(ModelError::Config(format!(
                "base_url {base_url:?} must start with https:// (or http:// to a loopback host)"
            )));
        }
    };
    let host = uri
        .host()
        .ok_or_else(|| ModelError::Config(format!("base_url {base_url:?} has no host")))?
        .trim_start_matches('[')
        .trim_end_matches(']')
        .to_owned();
    if !https && !agentworks_support::url::is_loopback_host(&host) {
        return Err(ModelError::Config(format!(
            "base_url {base_url:?}: plain http:// is allowed to loopback hosts only; use https://"
        )));
    }
    let port = uri.port_u16().unwrap_or(if https { 443 } else { 80 });
    let authority = uri
        .authority()
        .map(|a| a.as_str().to_owned())
        .unwrap_or_else(|| host.clone());
    Ok(Endpoint {
        https,
        host,
        port,
        path: uri.path().trim_end_matches('/').to_owned(),
        authority,
    })
}

/// The chat-completions client for the configured model.
#[derive(Clone)]
pub struct ModelClient {
    config: Arc<ModelConfig>,
    credentials_dir: Option<PathBuf>,
}

impl ModelClient {
    /// `credentials_dir` is `$CREDENTIALS_DIRECTORY`, if systemd set it.
    pub fn new(config: ModelConfig, credentials_dir: Option<PathBuf>) -> ModelClient {
        ModelClient {
            config: Arc::new(config),
            credentials_dir,
        }
    }

    pub fn max_tool_rounds(&self) -> u32 {
        self.config.max_tool_rounds
    }

    pub fn max_history_bytes(&self) -> usize {
        self.config.max_history_bytes
    }

    /// The model name sent with every request.
    pub fn model_name(&self) -> &str {
        &self.config.model
    }

    /// The configured base URL as it may be shown to people: scheme, host, port and path
    /// only (a user-info part or a query string could carry a credential, so neither is
    /// shown); `None` if it does not parse (a turn then fails with `model_misconfigured`).
    pub fn shown_base_url(&self) -> Option<String> {
        let endpoint = parse_endpoint(&self.config.base_url).ok()?;
        let host = if endpoint.host.contains(':') {
            format!("[{}]", endpoint.host)
        } else {
            endpoint.host
        };
        let (scheme, default_port) = if endpoint.https {
            ("https", 443)
        } else {
            ("http", 80)
        };
        let port = if endpoint.port == default_port {
            String::new()
        } else {
            format!(":{}", endpoint.port)
        };
        Some(format!("{scheme}://{host}{port}{}", endpoint.path))
    }

    fn api_key(&self) -> Result<Option<String>, ModelError> {
        let path = match (&self.config.api_key_file, &self.credentials_dir) {
            (Some(path), _) => path.clone(),
            (None, Some(dir)) => {
                let path = dir.join(CREDENTIAL_NAME);
                if !path.exists() {
                    return Ok(None);
                }
                path
            }
            (None, None) => return Ok(None),
        };
        let text = std::fs::read_to_string(&path).map_err(|e| ModelError::Key {
            path: path.clone(),
            reason: e.kind().to_string(),
        })?;
        let key = text.trim().to_owned();
        if key.is_empty() {
            return Err(ModelError::Key {
                path,
                reason: "the file is empty".into(),
            });
        }
        Ok(Some(key))
    }

    /// One chat completion of `messages` with `tools` (OpenAI `tools` entries). `on_text` gets
    /// the answer's text as it arrives: piece by piece from a streaming endpoint, whole from
    /// one that answers JSON.
    pub async fn complete(
        &self,
        messages: &[Value],
        tools: &[Value],
        on_text: &impl Fn(&str),
    ) -> Result<Reply, ModelError> {
        let endpoint = parse_endpoint(&self.config.base_url)?;
        let key = self.api_key()?;
        let stream = self.config.stream;
        let mut body = json!({
            "model": self.config.model,
            "messages": messages,
            "stream": stream,
        });
        if stream {
            body["stream_options"] = json!({"include_usage": true});
        }
        if !tools.is_empty() {
            body["tools"] = json!(tools);
        }
        let bytes = serde_json::to_vec(&body).map_err(|e| ModelError::Decode(e.to_string()))?;
        let mut request = hyper::Request::builder()
            .method("POST")
            .uri(format!("{}/chat/completions", endpoint.path))
            .header("host", &endpoint.authority)
            .header("content-type", "application/json")
            .header(
                "accept",
                if stream {
                    "text/event-stream, application/json"
                } else {
                    "application/json"
                },
            )
            .header(
                "user-agent",
                concat!("agentworks-agentd/", env!("CARGO_PKG_VERSION")),
            );
        if let Some(key) = key {
            request = request.header("authorization", format!("Bearer {key}"));
        }
        let request = request
            .body(Full::new(Bytes::from(bytes)))
            .map_err(|e| ModelError::Config(e.to_string()))?;
        let timeout = self.config.request_timeout_secs;
        tokio::time::timeout(
            Duration::from_secs(timeout),
            answer(&endpoint, request, on_text),
        )
        .await
        .map_err(|_| ModelError::Timeout(timeout))?
    }
}

/// Sends the request and reads its answer: streamed events or one JSON completion.
async fn answer(
    endpoint: &Endpoint,
    request: hyper::Request<Full<Bytes>>,
    on_text: &impl Fn(&str),
) -> Result<Reply, ModelError> {
    let response = send(endpoint, request).await?;
    let status = response.status().as_u16();
    let streamed = response
        .headers()
        .get(hyper::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.trim_start().starts_with("text/event-stream"));
    if (200..300).contains(&status) && streamed {
        return read_stream(response.into_body(), on_text).await;
    }
    let bytes = Limited::new(response.into_body(), MAX_RESPONSE_BYTES)
        .collect()
        .await
        .map_err(|e| ModelError::Unreachable(format!("reading the answer: {e}")))?
        .to_bytes();
    if !(200..300).contains(&status) {
        let mut text = String::from_utf8_lossy(&bytes).into_owned();
        if text.len() > 512 {
            let mut cut = 512;
            while !text.is_char_boundary(cut) {
                cut -= 1;
            }
            text.truncate(cut);
        }
        return Err(ModelError::Status { status, body: text });
    }
    let reply = parse_reply(&bytes)?;
    if let Some(text) = &reply.content {
        on_text(text);
    }
    Ok(reply)
}

/// Reads a streamed answer to its end (`data: [DONE]`, or the end of the body), handing each
/// piece of text to `on_text`, and puts the chunks back together into one answer.
async fn read_stream(
    mut body: hyper::body::Incoming,
    on_text: &impl Fn(&str),
) -> Result<Reply, ModelError> {
    let mut reader = SseReader::default();
    let mut answer = StreamedAnswer::default();
    let mut read = 0usize;
    while let Some(frame) = body.frame().await {
        let frame =
            frame.map_err(|e| ModelError::Unreachable(format!("reading the answer: {e}")))?;
        let Ok(data) = frame.into_data() else {
            continue;
        };
        read += data.len();
        if read > MAX_RESPONSE_BYTES {
            return Err(ModelError::Decode(format!(
                "the streamed answer is larger than {MAX_RESPONSE_BYTES} bytes"
            )));
        }
        for event in reader.push(&data)? {
            if event == "[DONE]" {
                return answer.finish();
            }
            answer.add(&event, on_text)?;
        }
    }
    answer.finish()
}

/// Server-sent events, as the `data` of each event: lines end with LF, CRLF or CR (even split
/// across reads), `data:` lines are joined with LF, an empty line ends an event, comments and
/// other fields are skipped. A line longer than the whole answer may be is refused by the
/// caller's byte bound first.
#[derive(Default)]
struct SseReader {
    line: Vec<u8>,
    data: Option<String>,
    /// The last byte read was a CR: an LF right after it ends nothing more.
    after_cr: bool,
}

impl SseReader {
    fn push(&mut self, bytes: &[u8]) -> Result<Vec<String>, ModelError> {
        let mut events = Vec::new();
        for &byte in bytes {
            let after_cr = std::mem::replace(&mut self.after_cr, byte == b'\r');
            match byte {
                b'\n' if after_cr => {}
                b'\n' | b'\r' => {
                    let line = std::mem::take(&mut self.line);
                    let line = String::from_utf8(line).map_err(|_| {
                        ModelError::Decode("the streamed answer is not UTF-8".into())
                    })?;
                    if line.is_empty() {
                        events.extend(self.data.take());
                    } else if let Some(value) = line.strip_prefix("data:") {
                        let value = value.strip_prefix(' ').unwrap_or(value);
                        match &mut self.data {
                            Some(data) => {
                                data.push('\n');
                                data.push_str(value);
                            }
                            None => self.data = Some(value.to_owned()),
                        }
                    }
                }
                _ => self.line.push(byte),
            }
        }
        Ok(events)
    }
}

/// A streamed answer being put back together from its chunks.
#[derive(Default)]
struct StreamedAnswer {
    content: String,
    /// (id, name, arguments) by the chunks' `index`.
    tool_calls: Vec<(String, String, String)>,
    usage: Value,
}

impl StreamedAnswer {
    fn add(&mut self, event: &str, on_text: &impl Fn(&str)) -> Result<(), ModelError> {
        let chunk: Value = serde_json::from_str(event)
            .map_err(|e| ModelError::Decode(format!("a streamed chunk: {e}")))?;
        if let Some(error) = chunk.get("error").filter(|e| !e.is_null()) {
            let message = error["message"]
                .as_str()
                .map_or_else(|| error.to_string(), str::to_owned);
            return Err(ModelError::Decode(format!(
                "the model reported an error: {message}"
            )));
        }
        if chunk["usage"].is_object() {
            self.usage = chunk["usage"].clone();
        }
        let delta = &chunk["choices"][0]["delta"];
        if let Some(text) = delta["content"].as_str().filter(|t| !t.is_empty()) {
            self.content.push_str(text);
            on_text(text);
        }
        for (position, call) in delta["tool_calls"]
            .as_array()
            .into_iter()
            .flatten()
            .enumerate()
        {
            let index = call["index"].as_u64().map_or(position, |i| i as usize);
            if index >= MAX_STREAMED_TOOL_CALLS {
                return Err(ModelError::Decode(format!(
                    "a streamed answer with more than {MAX_STREAMED_TOOL_CALLS} tool calls"
                )));
            }
            if self.tool_calls.len() <= index {
                self.tool_calls.resize(index + 1, Default::default());
            }
            let (id, name, arguments) = &mut self.tool_calls[index];
            if let Some(new_id) = call["id"].as_str().filter(|i| !i.is_empty()) {
                *id = new_id.to_owned();
            }
            if let Some(part) = call["function"]["name"].as_str() {
                name.push_str(part);
            }
            if let Some(part) = call["function"]["arguments"].as_str() {
                arguments.push_str(part);
            }
        }
        Ok(())
    }

    /// The answer as one chat completion, checked by [`parse_reply`] like any other.
    fn finish(self) -> Result<Reply, ModelError> {
        let mut message = json!({"role": "assistant", "content": (!self.content.is_empty()).then_some(self.content)});
        if !self.tool_calls.is_empty() {
            message["tool_calls"] = self
                .tool_calls
                .into_iter()
                .map(|(id, name, arguments)| {
                    json!({"id": id, "type": "function", "function": {"name": name, "arguments": arguments}})
                })
                .collect();
        }
        let completion =
            json!({"choices": [{"index": 0, "message": message}], "usage": self.usage});
        parse_reply(completion.to_string().as_bytes())
    }
}

async fn send(
    endpoint: &Endpoint,
    request: hyper::Request<Full<Bytes>>,
) -> Result<hyper::Response<hyper::body::Incoming>, ModelError> {
    let unreachable = |e: String| ModelError::Unreachable(e);
    let tcp = tokio::net::TcpStream::connect((endpoint.host.as_str(), endpoint.port))
        .await
        .map_err(|e| unreachable(e.to_string()))?;
    let _ = tcp.set_nodelay(true);
    if endpoint.https {
        let name = rustls::pki_types::ServerName::try_from(endpoint.host.clone())
            .map_err(|e| ModelError::Config(e.to_string()))?;
        let tls = agentworks_support::tls::client_config()
            .map_err(|e| ModelError::Config(e.to_string()))?;
        let stream = tokio_rustls::TlsConnector::from(tls)
            .connect(name, tcp)
            .await
            .map_err(|e| unreachable(e.to_string()))?;
        exchange(hyper_util::rt::TokioIo::new(stream), request).await
    } else {
        exchange(hyper_util::rt::TokioIo::new(tcp), request).await
    }
}

/// One request on a new connection: the response head, its body still to be read (the
/// connection's task drives it).
async fn exchange<IO>(
    io: IO,
    request: hyper::Request<Full<Bytes>>,
) -> Result<hyper::Response<hyper::body::Incoming>, ModelError>
where
    IO: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
{
    let failed = |e: hyper::Error| ModelError::Unreachable(e.to_string());
    let (mut sender, conn) = hyper::client::conn::http1::handshake(io)
        .await
        .map_err(failed)?;
    tokio::spawn(conn);
    sender.send_request(request).await.map_err(failed)
}

fn parse_reply(bytes: &[u8]) -> Result<Reply, ModelError> {
    let value: Value =
        serde_json::from_slice(bytes).map_err(|e| ModelError::Decode(e.to_string()))?;
    let message = value["choices"][0]["message"].clone();
    if !message.is_object() {
        return Err(ModelError::Decode("no choices[0].message".into()));
    }
    let content = message["content"]
        .as_str()
        .filter(|s| !s.is_empty())
        .map(str::to_owned);
    let mut tool_calls = Vec::new();
    if let Some(calls) = message["tool_calls"].as_array() {
        for call in calls {
            let id = call["id"].as_str().unwrap_or_default().to_owned();
            let name = call["function"]["name"].as_str().unwrap_or_default();
            let arguments = match &call["function"]["arguments"] {
                Value::String(s) => s.clone(),
                Value::Null => "{}".to_owned(),
                other => other.to_string(),
            };
            if id.is_empty() || name.is_empty() {
                return Err(ModelError::Decode(
                    "a tool call without an id or a name".into(),
                ));
            }
            tool_calls.push(ToolCall {
                id,
                name: name.to_owned(),
                arguments,
            });
        }
    }
    // What is stored and sent back: the standard fields only.
    let mut stored = json!({"role": "assistant", "content": content});
    if !tool_calls.is_empty() {
        stored["tool_calls"] = Value::Array(
            tool_calls
                .iter()
                .map(|c| {
                    json!({"id": c.id, "type": "function",
                           "function": {"name": c.name, "arguments": c.arguments}})
                })
                .collect(),
        );
    }
    Ok(Reply {
        content,
        tool_calls,
        message: stored,
        usage: Usage::from_reply(&value["usage"]),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_need_https_or_loopback() {
        let e = parse_endpoint("http://127.0.0.1:8000/v1/").unwrap();
        assert_eq!((e.https, e.port, e.path.as_str()), (false, 8000, "/v1"));
        assert!(parse_endpoint("http://[::1]:9/v1").is_ok());
        assert!(parse_endpoint("http://localhost/v1").is_ok());
        let e = parse_endpoint("https://api.example.com/v1").unwrap();
        assert_eq!((e.https, e.port), (true, 443));
        for bad in ["http://api.example.com/v1", "ftp://x/", "not a url"] {
            assert!(parse_endpoint(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn replies_with_text_and_tool_calls_parse() {
        let text = br#"{"choices":[{"message":{"role":"assistant","content":"hi"}}]}"#;
        let r = parse_reply(text).unwrap();
        assert_eq!(r.content.as_deref(), Some("hi"));
        assert!(r.tool_calls.is_empty());
        let calls = br#"{"choices":[{"message":{"role":"assistant","content":null,
            "tool_calls":[{"id":"c1","type":"function","function":{"name":"read_file","arguments":"{\"path\":\"a\"}"}}]}}]}"#;
        let r = parse_reply(calls).unwrap();
        assert_eq!(r.tool_calls[0].name, "read_file");
        assert_eq!(r.message["tool_calls"][0]["id"], "c1");
        assert!(parse_reply(b"{}").is_err());
    }

    #[test]
    fn usage_is_read_from_the_reply_and_zero_without_one() {
        let with = br#"{"choices":[{"message":{"role":"assistant","content":"hi"}}],
            "usage":{"prompt_tokens":12,"completion_tokens":5,"total_tokens":17}}"#;
        let usage = parse_reply(with).unwrap().usage;
        assert_eq!(
            (
                usage.prompt_tokens,
                usage.completion_tokens,
                usage.total_tokens
            ),
            (12, 5, 17)
        );
        let without = br#"{"choices":[{"message":{"role":"assistant","content":"hi"}}]}"#;
        assert_eq!(parse_reply(without).unwrap().usage, Usage::default());
        // Not numbers, negative, or absurd: never a failure, never an overflow.
        let odd = br#"{"choices":[{"message":{"role":"assistant","content":"hi"}}],
            "usage":{"prompt_tokens":"many","completion_tokens":-3,"total_tokens":1e300}}"#;
        assert_eq!(parse_reply(odd).unwrap().usage, Usage::default());
        let huge = Usage::from_reply(&json!({"prompt_tokens": u64::MAX, "completion_tokens": 1}));
        assert_eq!(huge.prompt_tokens, MAX_REPORTED_TOKENS);
        assert_eq!(huge.total_tokens, MAX_REPORTED_TOKENS + 1);
        let mut sum = Usage::default();
        sum.add(Usage::from_reply(
            &json!({"prompt_tokens": 3, "completion_tokens": 4}),
        ));
        sum.add(Usage::from_reply(
            &json!({"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}),
        ));
        assert_eq!(
            sum,
            Usage {
                prompt_tokens: 4,
                completion_tokens: 5,
                total_tokens: 9
            }
        );
    }

    #[test]
    fn server_sent_events_are_read_across_any_split() {
        let stream = b": comment\r\ndata: {\"a\":1}\r\n\r\nevent: x\ndata: one\ndata: two\n\ndata:[DONE]\r\r";
        let whole = SseReader::default().push(stream).unwrap();
        assert_eq!(whole, ["{\"a\":1}", "one\ntwo", "[DONE]"]);
        for split in 0..stream.len() {
            let mut reader = SseReader::default();
            let mut events = reader.push(&stream[..split]).unwrap();
            events.extend(reader.push(&stream[split..]).unwrap());
            assert_eq!(events, whole, "split at {split}");
        }
        // A multi-byte character split across reads is whole once the line ends.
        let text = "data: é\n\n".as_bytes();
        let mut reader = SseReader::default();
        assert!(reader.push(&text[..7]).unwrap().is_empty());
        assert_eq!(reader.push(&text[7..]).unwrap(), ["é"]);
        assert!(SseReader::default().push(b"data: \xff\n\n").is_err());
    }

    #[test]
    fn streamed_chunks_are_put_back_together_and_checked() {
        let seen = std::cell::RefCell::new(Vec::new());
        let on_text = |t: &str| seen.borrow_mut().push(t.to_owned());
        let mut answer = StreamedAnswer::default();
        for chunk in [
            json!({"choices": [{"delta": {"role": "assistant", "content": "Hel"}}]}),
            json!({"choices": [{"delta": {"content": "lo"}}]}),
            json!({"choices": [{"delta": {"tool_calls": [{"index": 0, "id": "c1", "type": "function", "function": {"name": "read_file", "arguments": "{\"pa"}}]}}]}),
            json!({"choices": [{"delta": {"tool_calls": [{"index": 1, "id": "c2", "function": {"name": "list_files", "arguments": ""}}]}}]}),
            json!({"choices": [{"delta": {"tool_calls": [{"index": 0, "function": {"arguments": "th\":\"a\"}"}}]}}]}),
            json!({"choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": 3, "total_tokens": 10}}),
        ] {
            answer.add(&chunk.to_string(), &on_text).unwrap();
        }
        let reply = answer.finish().unwrap();
        assert_eq!(*seen.borrow(), ["Hel", "lo"]);
        assert_eq!(reply.content.as_deref(), Some("Hello"));
        assert_eq!(reply.tool_calls.len(), 2);
        assert_eq!(
            (
                reply.tool_calls[0].name.as_str(),
                reply.tool_calls[0].arguments.as_str()
            ),
            ("read_file", "{\"path\":\"a\"}")
        );
        assert_eq!(reply.tool_calls[1].arguments, "");
        assert_eq!(reply.usage.total_tokens, 10);
        // A tool call the stream never named is refused, like in a JSON answer.
        let mut broken = StreamedAnswer::default();
        broken
            .add(&json!({"choices": [{"delta": {"tool_calls": [{"index": 0, "function": {"arguments": "{}"}}]}}]}).to_string(), &on_text)
            .unwrap();
        assert!(broken.finish().is_err());
        // Hostile indexes and error chunks are refused.
        let mut answer = StreamedAnswer::default();
        let far = json!({"choices": [{"delta": {"tool_calls": [{"index": 100000, "id": "x", "function": {"name": "n"}}]}}]});
        assert!(answer.add(&far.to_string(), &on_text).is_err());
        let error = json!({"error": {"message": "overloaded"}});
        let refused = StreamedAnswer::default()
            .add(&error.to_string(), &on_text)
            .unwrap_err();
        assert!(refused.to_string().contains("overloaded"), "{refused}");
        assert!(StreamedAnswer::default().add("not json", &on_text).is_err());
    }

    #[test]
    fn the_shown_base_url_has_no_credentials() {
        let config = |base_url: &str| ModelConfig {
            base_url: base_url.into(),
            model: "m".into(),
            api_key_file: None,
            max_tool_rounds: 1,
            request_timeout_secs: 1,
            max_history_bytes: 1024,
            stream: true,
        };
        let shown = |base_url: &str| ModelClient::new(config(base_url), None).shown_base_url();
        assert_eq!(
            shown("https://user:secret@api.example.com/v1?key=secret").as_deref(),
            Some("https://api.example.com/v1")
        );
        assert_eq!(
            shown("http://[::1]:9/v1/").as_deref(),
            Some("http://[::1]:9/v1")
        );
        assert_eq!(shown("http://api.example.com/v1"), None);
    }

    #[test]
    fn the_key_comes_from_the_file_then_the_credential() {
        let dir = tempfile::tempdir().unwrap();
        let config = |file: Option<PathBuf>| ModelConfig {
            base_url: "http://127.0.0.1:1/v1".into(),
            model: "m".into(),
            api_key_file: file,
            max_tool_rounds: 1,
            request_timeout_secs: 1,
            max_history_bytes: 1024,
            stream: true,
        };
        assert_eq!(
            ModelClient::new(config(None), None).api_key().unwrap(),
            None
        );
        std::fs::write(dir.path().join(CREDENTIAL_NAME), "cred\n").unwrap();
        let client = ModelClient::new(config(None), Some(dir.path().to_owned()));
        assert_eq!(client.api_key().unwrap().as_deref(), Some("cred"));
        std::fs::write(dir.path().join("k"), "file-key").unwrap();
        let client = ModelClient::new(
            config(Some(dir.path().join("k"))),
            Some(dir.path().to_owned()),
        );
        assert_eq!(client.api_key().unwrap().as_deref(), Some("file-key"));
        let missing = ModelClient::new(config(Some(dir.path().join("absent"))), None);
        let err = missing.api_key().unwrap_err().to_string();
        assert!(err.contains("absent"), "{err}");
    }
}
