//! What the runner's integration tests share: scripted model servers on loopback (the
//! Responses API, the Messages API, chat completions), and where the real Codex, Claude Code
//! and OpenCode CLIs are installed. The workspace's suite (`tests/suite`) includes it too.
//!
//! Each test binary includes it with `mod support;` and uses only part of it.
#![allow(dead_code)]

pub mod chat_completions;
pub mod messages;
pub mod responses;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

/// The native binary in the npm install (the `bin/codex.js` wrapper only finds and execs it).
pub fn codex_binary() -> PathBuf {
    let (package, triple) = match std::env::consts::ARCH {
        "x86_64" => ("codex-linux-x64", "x86_64-unknown-linux-musl"),
        "aarch64" => ("codex-linux-arm64", "aarch64-unknown-linux-musl"),
        other => panic!("no Codex package for {other}"),
    };
    let path = repository()
        .join("tests/codex/node_modules/@openai")
        .join(package)
        .join("vendor")
        .join(triple)
        .join("bin/codex");
    assert!(
        path.is_file(),
        "the Codex CLI is not installed at {}: run `(cd tests/codex && npm ci --ignore-scripts)` \
         from the repository's root",
        path.display()
    );
    path
}

/// The native binary in the npm install of `@anthropic-ai/claude-code` (its `bin/claude.exe`
/// is only a placeholder its install script replaces; the tests install without scripts).
pub fn claude_binary() -> PathBuf {
    let package = match std::env::consts::ARCH {
        "x86_64" => "claude-code-linux-x64",
        "aarch64" => "claude-code-linux-arm64",
        other => panic!("no Claude Code package for {other}"),
    };
    let path = repository()
        .join("tests/claude/node_modules/@anthropic-ai")
        .join(package)
        .join("claude");
    assert!(
        path.is_file(),
        "Claude Code is not installed at {}: run `(cd tests/claude && npm ci --ignore-scripts)` \
         from the repository's root",
        path.display()
    );
    path
}

/// OpenCode's native binary, from the npm package `opencode-ai` names as its optional
/// dependency for this machine (tests/opencode pins it): `opencode-linux-x64`, or its
/// `-baseline` build where the CPU lacks AVX2 (the plain build needs it).
pub fn opencode_binary() -> PathBuf {
    let package = match std::env::consts::ARCH {
        "x86_64" if cpu_has_avx2() => "opencode-linux-x64",
        "x86_64" => "opencode-linux-x64-baseline",
        other => panic!("tests/opencode pins no OpenCode package for {other}"),
    };
    let path = repository()
        .join("tests/opencode/node_modules")
        .join(package)
        .join("bin/opencode");
    assert!(
        path.is_file(),
        "OpenCode is not installed at {}: run `(cd tests/opencode && npm ci --ignore-scripts)` \
         from the repository's root",
        path.display()
    );
    path
}

/// Whether the CPU has AVX2 (the `flags` of /proc/cpuinfo).
fn cpu_has_avx2() -> bool {
    std::fs::read_to_string("/proc/cpuinfo")
        .map(|info| {
            info.lines()
                .filter(|l| l.starts_with("flags"))
                .any(|l| l.split_whitespace().any(|flag| flag == "avx2"))
        })
        .unwrap_or(false)
}

/// The repository's root: the runner crate's tests and the workspace's suite both include this
/// file, so it is found from either manifest.
fn repository() -> PathBuf {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    manifest
        .ancestors()
        .find(|dir| dir.join("tests/codex/package.json").is_file())
        .unwrap_or(manifest)
        .to_path_buf()
}

/// A request a scripted server received.
#[derive(Debug, Clone)]
pub struct RecordedRequest {
    pub method: String,
    /// Without the query (Claude Code asks for `/v1/messages?beta=true`).
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

    /// The request's `input` items (Responses API).
    pub fn input(&self) -> &[Value] {
        self.body["input"].as_array().map_or(&[], Vec::as_slice)
    }

    /// The request's `messages` (Messages API).
    pub fn messages(&self) -> &[Value] {
        self.body["messages"].as_array().map_or(&[], Vec::as_slice)
    }
}

/// A loopback HTTP/1.1 server that records every request and answers the Nth (counted from 1,
/// passed as index N-1) with what `answer` makes of it; stops when dropped. Each dialect's
/// scripted server is one.
pub struct ScriptedServer {
    addr: SocketAddr,
    requests: Arc<Mutex<Vec<RecordedRequest>>>,
    task: JoinHandle<()>,
}

impl ScriptedServer {
    /// Starts the server on an ephemeral loopback port.
    pub async fn start<F>(answer: F) -> std::io::Result<Self>
    where
        F: Fn(&RecordedRequest, usize) -> Response<Body> + Send + Sync + 'static,
    {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let requests = Arc::new(Mutex::new(Vec::new()));
        let answer = Arc::new(answer);
        let log = Arc::clone(&requests);
        let task = tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                let answer = Arc::clone(&answer);
                let log = Arc::clone(&log);
                tokio::spawn(async move {
                    let service = hyper::service::service_fn(move |request| {
                        let answer = Arc::clone(&answer);
                        let log = Arc::clone(&log);
                        async move {
                            let (recorded, index) = record(request, &log).await;
                            Ok::<_, std::convert::Infallible>(answer(&recorded, index))
                        }
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

impl Drop for ScriptedServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Reads and logs one request: what it was, and its index in the log.
async fn record(
    request: Request<Incoming>,
    log: &Mutex<Vec<RecordedRequest>>,
) -> (RecordedRequest, usize) {
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
    let recorded = RecordedRequest {
        method,
        path,
        headers,
        body,
        at,
    };
    let mut requests = log.lock().expect("the request log's lock was poisoned");
    requests.push(recorded.clone());
    (recorded, requests.len() - 1)
}

/// A scripted answer's body: whole, or streamed (an answer that stalls).
pub type Body = http_body_util::combinators::BoxBody<Bytes, std::convert::Infallible>;

/// A 500 whose error names why the script could not answer.
pub fn failure(message: String) -> Response<Body> {
    let body = json!({"type": "error", "error": {"message": message, "type": "api_error"}});
    json_response(StatusCode::INTERNAL_SERVER_ERROR, &body)
}

/// A JSON answer with `status`.
pub fn json_response(status: StatusCode, body: &Value) -> Response<Body> {
    whole(status, "application/json", body.to_string())
}

/// An answer of `body`, whole.
pub fn whole(status: StatusCode, content_type: &str, body: String) -> Response<Body> {
    Response::builder()
        .status(status)
        .header("content-type", content_type)
        .body(Full::new(Bytes::from(body)).boxed())
        .expect("a static response is valid")
}

/// A `200 text/event-stream` answer of these events: `event: <type>` and `data: <json>` each.
pub fn sse(events: &[Value]) -> Response<Body> {
    let stream: String = events
        .iter()
        .map(|e| format!("event: {}\ndata: {e}\n\n", e["type"].as_str().unwrap_or("")))
        .collect();
    whole(StatusCode::OK, "text/event-stream", stream)
}
