//! Plain HTTP/1.1 requests to a daemon's loopback port, and stateless MCP `tools/call`s to
//! agentd's `/mcp` built on them: one fresh connection per call, so a test sees exactly the
//! status, headers and body that one request got.

use super::block_on;

/// One HTTP/1.1 request to 127.0.0.1:`port`: (status, headers, body text).
pub fn http(
    port: u16,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> (u16, hyper::HeaderMap, String) {
    http_bytes(port, method, path, headers, body.as_bytes())
}

/// [`http`] with a body of any bytes (an upload that is not UTF-8).
pub fn http_bytes(
    port: u16,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> (u16, hyper::HeaderMap, String) {
    send_http(None, port, method, path, headers, body)
}

/// [`http`] from the loopback address `source` (any of 127.0.0.0/8, so a test has as many
/// clients at distinct addresses as it needs): what a daemon sees as the peer's address.
pub fn http_from(
    source: std::net::Ipv4Addr,
    port: u16,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> (u16, hyper::HeaderMap, String) {
    send_http(Some(source), port, method, path, headers, body.as_bytes())
}

fn send_http(
    source: Option<std::net::Ipv4Addr>,
    port: u16,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> (u16, hyper::HeaderMap, String) {
    use http_body_util::BodyExt;
    block_on(async {
        let stream = match source {
            None => tokio::net::TcpStream::connect(("127.0.0.1", port))
                .await
                .unwrap(),
            Some(source) => {
                let socket = tokio::net::TcpSocket::new_v4().unwrap();
                socket.bind((source, 0).into()).unwrap();
                socket
                    .connect((std::net::Ipv4Addr::LOCALHOST, port).into())
                    .await
                    .unwrap()
            }
        };
        let (mut sender, conn) =
            hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
                .await
                .unwrap();
        tokio::spawn(conn);
        let mut request = hyper::Request::builder()
            .method(method)
            .uri(path)
            .header("host", format!("127.0.0.1:{port}"));
        for (k, v) in headers {
            request = request.header(*k, *v);
        }
        let request = request
            .body(http_body_util::Full::new(bytes::Bytes::copy_from_slice(
                body,
            )))
            .unwrap();
        let response = sender.send_request(request).await.unwrap();
        let status = response.status().as_u16();
        let headers = response.headers().clone();
        let body = response.into_body().collect().await.unwrap().to_bytes();
        (status, headers, String::from_utf8_lossy(&body).into_owned())
    })
}

/// A stateless (2026-07-28) `tools/call` of `tool` with `arguments`: (HTTP status, the
/// JSON-RPC response or error body).
pub fn mcp_call(
    port: u16,
    token: &str,
    tool: &str,
    arguments: serde_json::Value,
) -> (u16, serde_json::Value) {
    let body = serde_json::json!({
        "jsonrpc": "2.0", "id": 1, "method": "tools/call",
        "params": {
            "name": tool, "arguments": arguments,
            "_meta": {
                "io.modelcontextprotocol/protocolVersion": "2026-07-28",
                "io.modelcontextprotocol/clientCapabilities": {}
            }
        }
    });
    let auth = format!("Bearer {token}");
    let (status, _, text) = http(
        port,
        "POST",
        "/mcp",
        &[
            ("authorization", &auth),
            ("content-type", "application/json"),
            ("accept", "application/json, text/event-stream"),
            ("mcp-protocol-version", "2026-07-28"),
            ("mcp-method", "tools/call"),
            ("mcp-name", tool),
        ],
        &body.to_string(),
    );
    (
        status,
        serde_json::from_str(&text).unwrap_or(serde_json::Value::String(text)),
    )
}

/// The structured result of a successful tool call, or the tool error's `{code, …}`.
pub fn tool_result(
    port: u16,
    token: &str,
    tool: &str,
    arguments: serde_json::Value,
) -> Result<serde_json::Value, serde_json::Value> {
    let (status, body) = mcp_call(port, token, tool, arguments);
    assert_eq!(status, 200, "{tool}: HTTP {status}: {body}");
    let result = &body["result"];
    if result["isError"] == true {
        Err(result["structuredContent"]["error"].clone())
    } else {
        Ok(result["structuredContent"].clone())
    }
}

/// The Python with the official MCP SDK (`AGENTWORKS_MCP_PYTHON`, else `/tmp/mcpvenv`); the
/// test fails, saying how to get one, when it is missing.
pub fn mcp_python() -> std::path::PathBuf {
    let python = std::env::var_os("AGENTWORKS_MCP_PYTHON")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| "/tmp/mcpvenv/bin/python".into());
    assert!(
        python.exists(),
        "this test needs the official MCP Python SDK at {} (run .ci/run, or: python3 -m venv /tmp/mcpvenv && /tmp/mcpvenv/bin/pip install mcp==2.3.0)",
        python.display()
    );
    python
}

/// Runs `tests/mcp_client/<script> <url> <args…>` with the SDK's Python and `env`; fails the
/// test (with the script's output) unless it succeeds, and returns its summary: the JSON
/// object on its last stdout line.
pub fn run_mcp_client(
    script: &str,
    url: &str,
    args: &[&str],
    env: &[(&str, &str)],
) -> serde_json::Value {
    let scripts = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/mcp_client");
    let output = std::process::Command::new(mcp_python())
        .arg(scripts.join(script))
        .arg(url)
        .args(args)
        .current_dir(&scripts)
        .envs(env.iter().copied())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{script} {args:?}: {}\n{stdout}\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_str(stdout.lines().last().unwrap_or_default()).unwrap_or_else(|e| {
        panic!("{script}: the last line is not a JSON summary ({e}):\n{stdout}")
    })
}
