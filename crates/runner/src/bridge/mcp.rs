//! `agentworks-mcpbridge`'s MCP server on stdio: newline-delimited JSON-RPC 2.0 on stdin and
//! stdout, both protocol eras (the `initialize` handshake of 2025-06-18 and 2025-11-25, and the
//! stateless 2026-07-28 `server/discover` with the version in each request's `_meta`), offering
//! the bridge tools and forwarding each `tools/call` to runnerd ([`Forwarder`]).
//!
//! The tools are fetched from runnerd once, when the server starts ([`serve`]): the built-ins
//! ([`super::tools`]) and the turn's extra tools (the project's MCP connections' tools, for an
//! authoring role in server mode), merged by [`super::offered_tools`]; if runnerd cannot
//! answer, the built-ins alone. A call of a tool not listed is refused here.
//!
//! Owns: the framing (one message per line, at most [`MAX_CALL_BYTES`] a line; a longer line is
//! skipped whole and answered with a parse error), the method table, the errors (JSON-RPC
//! errors for protocol faults, `isError` results with a sentence for a tool that failed), and
//! `notifications/cancelled` (the call's task is dropped, no answer follows). Calls run
//! concurrently; answers go out as they finish, one writer owning stdout.
//!
//! Must never: write anything but JSON-RPC messages to stdout (logs go to stderr), run a tool
//! itself, or answer a notification.

use std::collections::HashMap;

use serde_json::{Map, Value, json};
use tokio::io::{AsyncBufRead, AsyncBufReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::mpsc;
use tokio::task::AbortHandle;

use super::client::Forwarder;
use super::{BridgeCall, MAX_CALL_BYTES};

/// The handshake revisions served, oldest first.
pub const HANDSHAKE_VERSIONS: [&str; 2] = ["2025-06-18", "2025-11-25"];
/// The answer to an `initialize` offering a version not served.
pub const LATEST_HANDSHAKE_VERSION: &str = "2025-11-25";
/// The stateless revisions served.
pub const MODERN_VERSIONS: [&str; 1] = ["2026-07-28"];
/// `params._meta` key carrying a 2026-07-28 request's protocol version.
const PROTOCOL_VERSION_META_KEY: &str = "io.modelcontextprotocol/protocolVersion";
/// `result._meta` key carrying our name and version on `server/discover`.
const SERVER_INFO_META_KEY: &str = "io.modelcontextprotocol/serverInfo";
const SERVER_NAME: &str = "agentworks-bridge";

/// JSON-RPC and MCP error codes.
pub mod code {
    pub const PARSE_ERROR: i64 = -32700;
    pub const INVALID_REQUEST: i64 = -32600;
    pub const METHOD_NOT_FOUND: i64 = -32601;
    pub const INVALID_PARAMS: i64 = -32602;
    /// The request's protocol version is not served (2026-07-28).
    pub const UNSUPPORTED_PROTOCOL_VERSION: i64 = -32022;
}

/// What the model is told about the tools as a whole.
const INSTRUCTIONS: &str = "agentworks bridge tools: paths are relative to the project's root. \
    execute_shell_command runs with the project as its working directory, in this chat's mode \
    (Run: read-only; Builder: writable within the person's grants). diff_patch_workspace_file \
    applies a unified diff to one file through agentworks, with a receipt.";

/// What the instructions add when the turn offers its project's MCP connections' tools.
const CONNECTIONS_NOTE: &str = " The other tools are the project's MCP connections' tools \
    (each description names its server); agentworks calls them for you with the project's \
    credentials.";

/// Serves MCP on `input` and `output` until `input` ends (the CLI closed it), offering the
/// tools runnerd lists for the turn (fetched once, now; the built-ins alone if runnerd cannot
/// answer). Calls still running then are dropped: nobody is there to read their answers.
pub async fn serve<R, W>(input: R, output: W, forwarder: Forwarder) -> std::io::Result<()>
where
    R: AsyncBufRead + Unpin,
    W: AsyncWrite + Unpin + Send + 'static,
{
    let fetched = match forwarder.tools().await {
        Ok(tools) => Some(tools),
        Err(why) => {
            // stderr only: stdout is the protocol.
            eprintln!(
                "agentworks-mcpbridge: no tool list from runnerd ({why}); offering the built-in tools only"
            );
            None
        }
    };
    serve_tools(input, output, forwarder, super::offered_tools(fetched)).await
}

/// [`serve`] with the tool list given (`tools`, as `tools/list` answers it).
pub async fn serve_tools<R, W>(
    input: R,
    output: W,
    forwarder: Forwarder,
    tools: Vec<Value>,
) -> std::io::Result<()>
where
    R: AsyncBufRead + Unpin,
    W: AsyncWrite + Unpin + Send + 'static,
{
    let tools = Tools::new(tools);
    let (answers, mut outbox) = mpsc::unbounded_channel::<Value>();
    let writer = tokio::spawn(async move {
        let mut output = output;
        while let Some(message) = outbox.recv().await {
            let Ok(mut line) = serde_json::to_vec(&message) else {
                continue;
            };
            line.push(b'\n');
            output.write_all(&line).await?;
            output.flush().await?;
        }
        Ok::<(), std::io::Error>(())
    });
    let mut input = input;
    let mut line = Vec::new();
    let mut running: HashMap<String, AbortHandle> = HashMap::new();
    loop {
        let long = match read_line(&mut input, &mut line, MAX_CALL_BYTES).await? {
            None => break,
            Some(long) => long,
        };
        running.retain(|_, task| !task.is_finished());
        if long {
            let _ = answers.send(error_message(
                &Value::Null,
                code::PARSE_ERROR,
                &format!("a message longer than {MAX_CALL_BYTES} bytes was skipped"),
            ));
            continue;
        }
        match act_on(&tools, &line) {
            LineAction::Nothing => {}
            LineAction::Answer(message) => {
                let _ = answers.send(message);
            }
            LineAction::Cancel(id) => {
                if let Some(task) = running.remove(&id_key(&id)) {
                    task.abort();
                }
            }
            LineAction::Call { id, call, modern } => {
                let forwarder = forwarder.clone();
                let answers = answers.clone();
                let key = id_key(&id);
                let task = tokio::spawn(async move {
                    let reply = forwarder.call(&call).await;
                    let mut result = json!({
                        "content": [{"type": "text", "text": reply.text}],
                        "isError": reply.is_error,
                    });
                    if modern {
                        result["resultType"] = json!("complete");
                    }
                    let _ = answers.send(result_message(&id, result));
                });
                running.insert(key, task.abort_handle());
            }
        }
    }
    for task in running.values() {
        task.abort();
    }
    drop(answers);
    writer.await.unwrap_or(Ok(()))
}

/// What [`serve`] does with one line it read.
#[doc(hidden)]
#[derive(Debug)]
pub enum LineAction {
    /// Nothing: a blank line, a notification, or a reply to a request (the bridge sends none).
    Nothing,
    /// Write this message (an answer, or a protocol error).
    Answer(Value),
    /// Drop the running call with this request id (`notifications/cancelled`).
    Cancel(Value),
    /// Forward this tool call to runnerd; its result answers request `id`.
    Call {
        id: Value,
        call: BridgeCall,
        modern: bool,
    },
}

/// One line from the client (without its `\n`, at most [`MAX_CALL_BYTES`]) turned into what
/// the server does with it, without I/O, for a bridge offering the built-in tools: [`serve`]
/// runs every line through the same steps with the turn's tools. Public (and hidden) only so
/// the fuzz target `bridge_mcp` (`fuzz/`) can reach it; not an API.
#[doc(hidden)]
pub fn line_action(line: &[u8]) -> LineAction {
    act_on(&Tools::new(super::offered_tools(None)), line)
}

/// [`line_action`] with the turn's tools.
fn act_on(tools: &Tools, line: &[u8]) -> LineAction {
    let text = String::from_utf8_lossy(line);
    let text = text.trim();
    if text.is_empty() {
        return LineAction::Nothing;
    }
    match classify(text) {
        Incoming::Answer(message) => LineAction::Answer(message),
        Incoming::Ignored => LineAction::Nothing,
        Incoming::Cancelled(id) => LineAction::Cancel(id),
        Incoming::Request { id, method, params } => match answer(tools, &id, &method, &params) {
            Reply::Now(message) => LineAction::Answer(message),
            Reply::Call { call, modern } => LineAction::Call { id, call, modern },
        },
    }
}

/// Reads one line (without its `\n`) into `line`, at most `max` bytes kept; `Some(true)` when
/// the line was longer (read to its end and dropped), `None` at the end of the input. Also how
/// runnerd reads a CLI's event stream (`turn.rs`).
pub(crate) async fn read_line<R: AsyncBufRead + Unpin>(
    input: &mut R,
    line: &mut Vec<u8>,
    max: usize,
) -> std::io::Result<Option<bool>> {
    line.clear();
    let mut long = false;
    loop {
        let available = input.fill_buf().await?;
        if available.is_empty() {
            return Ok(if line.is_empty() && !long {
                None
            } else {
                Some(long)
            });
        }
        let (piece, used, done) = match available.iter().position(|b| *b == b'\n') {
            Some(i) => (&available[..i], i + 1, true),
            None => (available, available.len(), false),
        };
        if !long && line.len() + piece.len() <= max {
            line.extend_from_slice(piece);
        } else {
            long = true;
            line.clear();
        }
        input.consume(used);
        if done {
            return Ok(Some(long));
        }
    }
}

/// One line from the client, sorted.
enum Incoming {
    /// A fault answered at once (parse error, invalid request).
    Answer(Value),
    /// `notifications/cancelled` for a request id.
    Cancelled(Value),
    Request {
        id: Value,
        method: String,
        params: Map<String, Value>,
    },
    /// Another notification, or a reply to a request (the bridge sends none).
    Ignored,
}

fn classify(text: &str) -> Incoming {
    let value: Value = match serde_json::from_str(text) {
        Ok(value) => value,
        Err(e) => {
            return Incoming::Answer(error_message(
                &Value::Null,
                code::PARSE_ERROR,
                &format!("not JSON: {e}"),
            ));
        }
    };
    let Value::Object(message) = value else {
        return Incoming::Answer(error_message(
            &Value::Null,
            code::INVALID_REQUEST,
            "a message must be one JSON-RPC object (batches are not supported)",
        ));
    };
    let id = message.get("id").cloned();
    let valid_id = matches!(&id, Some(Value::String(_) | Value::Number(_)));
    match (message.get("method"), id) {
        // A notification is never answered, not even for a fault in its params.
        (Some(Value::String(method)), None) => {
            if method == "notifications/cancelled"
                && let Some(request) = message.get("params").and_then(|p| p.get("requestId"))
            {
                return Incoming::Cancelled(request.clone());
            }
            Incoming::Ignored
        }
        (Some(Value::String(method)), Some(id)) if valid_id => {
            let params = match message.get("params") {
                None | Some(Value::Null) => Map::new(),
                Some(Value::Object(params)) => params.clone(),
                Some(_) => {
                    return Incoming::Answer(error_message(
                        &id,
                        code::INVALID_PARAMS,
                        "params must be an object",
                    ));
                }
            };
            Incoming::Request {
                id,
                method: method.clone(),
                params,
            }
        }
        (None, Some(_)) if message.contains_key("result") || message.contains_key("error") => {
            Incoming::Ignored
        }
        (_, id) => Incoming::Answer(error_message(
            &id.filter(|_| valid_id).unwrap_or(Value::Null),
            code::INVALID_REQUEST,
            "not a JSON-RPC request: it needs a string `method` and a string or number `id`",
        )),
    }
}

/// The tools offered, and the instructions that describe them.
struct Tools {
    list: Vec<Value>,
    instructions: String,
}

impl Tools {
    fn new(list: Vec<Value>) -> Tools {
        let mut instructions = INSTRUCTIONS.to_owned();
        if list
            .iter()
            .any(|t| t["name"].as_str().is_some_and(|n| !super::is_builtin(n)))
        {
            instructions.push_str(CONNECTIONS_NOTE);
        }
        Tools { list, instructions }
    }

    fn offers(&self, name: &str) -> bool {
        self.list.iter().any(|t| t["name"].as_str() == Some(name))
    }

    /// The names, for an error message.
    fn names(&self) -> String {
        let names: Vec<&str> = self
            .list
            .iter()
            .filter_map(|t| t["name"].as_str())
            .collect();
        names.join(", ")
    }
}

/// How a request is answered.
enum Reply {
    Now(Value),
    /// A tool call to forward; `modern` marks a 2026-07-28 request.
    Call {
        call: BridgeCall,
        modern: bool,
    },
}

fn answer(tools: &Tools, id: &Value, method: &str, params: &Map<String, Value>) -> Reply {
    let now = |result: Result<Value, (i64, String)>| {
        Reply::Now(match result {
            Ok(result) => result_message(id, result),
            Err((code, message)) => error_message(id, code, &message),
        })
    };
    // A 2026-07-28 request names its version in `_meta`; anything else is the handshake era.
    let version = params
        .get("_meta")
        .and_then(|meta| meta.get(PROTOCOL_VERSION_META_KEY));
    let modern = match version {
        None => false,
        Some(Value::String(v)) if MODERN_VERSIONS.contains(&v.as_str()) => true,
        Some(other) => {
            return Reply::Now(json!({
                "jsonrpc": "2.0", "id": id,
                "error": {
                    "code": code::UNSUPPORTED_PROTOCOL_VERSION,
                    "message": format!("protocol version {other} is not served"),
                    "data": {"supported": supported_versions(), "requested": other},
                },
            }));
        }
    };
    let complete = |mut result: Value| {
        if modern {
            result["resultType"] = json!("complete");
        }
        Ok(result)
    };
    match method {
        "initialize" => {
            let offered = params
                .get("protocolVersion")
                .and_then(Value::as_str)
                .unwrap_or("");
            let version = if HANDSHAKE_VERSIONS.contains(&offered) {
                offered
            } else {
                LATEST_HANDSHAKE_VERSION
            };
            now(Ok(json!({
                "protocolVersion": version,
                "capabilities": {"tools": {"listChanged": false}},
                "serverInfo": server_info(),
                "instructions": tools.instructions,
            })))
        }
        "server/discover" => now(complete(json!({
            "supportedVersions": supported_versions(),
            "capabilities": {"tools": {}},
            "instructions": tools.instructions,
            "ttlMs": 0,
            "cacheScope": "private",
            "_meta": {SERVER_INFO_META_KEY: server_info()},
        }))),
        "ping" => now(complete(json!({}))),
        "tools/list" => {
            let mut result = json!({"tools": tools.list});
            if modern {
                result["ttlMs"] = json!(0);
                result["cacheScope"] = json!("private");
            }
            now(complete(result))
        }
        "tools/call" => {
            let name = match params.get("name") {
                Some(Value::String(name)) => name.clone(),
                _ => {
                    return now(Err((
                        code::INVALID_PARAMS,
                        "tools/call needs a string `name`".into(),
                    )));
                }
            };
            if !tools.offers(&name) {
                return now(Err((
                    code::INVALID_PARAMS,
                    format!("Unknown tool: {name} (the tools are {})", tools.names()),
                )));
            }
            let arguments = match params.get("arguments") {
                None | Some(Value::Null) => json!({}),
                Some(Value::Object(arguments)) => Value::Object(arguments.clone()),
                Some(_) => {
                    return now(Err((
                        code::INVALID_PARAMS,
                        "tools/call `arguments` must be an object".into(),
                    )));
                }
            };
            Reply::Call {
                call: BridgeCall {
                    tool: name,
                    arguments,
                },
                modern,
            }
        }
        other => now(Err((
            code::METHOD_NOT_FOUND,
            format!("Method not found: {other}"),
        ))),
    }
}

fn server_info() -> Value {
    json!({"name": SERVER_NAME, "version": env!("CARGO_PKG_VERSION")})
}

fn supported_versions() -> Vec<&'static str> {
    HANDSHAKE_VERSIONS
        .iter()
        .chain(MODERN_VERSIONS.iter())
        .copied()
        .collect()
}

fn result_message(id: &Value, result: Value) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "result": result})
}

fn error_message(id: &Value, code: i64, message: &str) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "error": {"code": code, "message": message}})
}

/// A request id as a map key: `1` and `"1"` are different ids.
fn id_key(id: &Value) -> String {
    id.to_string()
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::bridge::{PATCH_TOOL, SHELL_TOOL};
    use tokio::io::{AsyncReadExt, BufReader};

    /// Runs the server over in-memory pipes on `input` (lines), returns every message it
    /// wrote. The forwarder points at a loopback port nobody listens on.
    async fn exchange(input: &str) -> Vec<Value> {
        exchange_with(input.as_bytes().to_vec(), dead_forwarder()).await
    }

    fn dead_forwarder() -> Forwarder {
        // Bound then dropped: nothing listens there now.
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        Forwarder::new(&format!("http://127.0.0.1:{port}/v1/bridge"), "t".into()).unwrap()
    }

    async fn exchange_with(input: Vec<u8>, forwarder: Forwarder) -> Vec<Value> {
        let (out_write, mut out_read) = tokio::io::duplex(1 << 20);
        let reader = BufReader::new(std::io::Cursor::new(input));
        serve(reader, out_write, forwarder).await.unwrap();
        let mut text = String::new();
        out_read.read_to_string(&mut text).await.unwrap();
        text.lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }

    fn by_id(messages: &[Value], id: Value) -> &Value {
        messages
            .iter()
            .find(|m| m["id"] == id)
            .unwrap_or_else(|| panic!("no answer to {id}: {messages:#?}"))
    }

    #[tokio::test]
    async fn the_handshake_era_initializes_and_lists_the_tools() {
        let out = exchange(concat!(
            r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"codex","version":"0"}}}"#,
            "\n",
            r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#,
            "\n",
            r#"{"jsonrpc":"2.0","id":"two","method":"tools/list"}"#,
            "\n",
            r#"{"jsonrpc":"2.0","id":3,"method":"initialize","params":{"protocolVersion":"2099-01-01"}}"#,
            "\n",
        ))
        .await;
        assert_eq!(out.len(), 3, "the notification got no answer: {out:#?}");
        let init = &by_id(&out, json!(1))["result"];
        assert_eq!(init["protocolVersion"], "2025-06-18");
        assert_eq!(init["capabilities"]["tools"]["listChanged"], false);
        assert_eq!(init["serverInfo"]["name"], SERVER_NAME);
        let tools = by_id(&out, json!("two"))["result"]["tools"]
            .as_array()
            .unwrap()
            .clone();
        let names: Vec<&str> = tools.iter().filter_map(|t| t["name"].as_str()).collect();
        assert_eq!(names, [SHELL_TOOL, PATCH_TOOL]);
        for tool in &tools {
            assert_eq!(tool["inputSchema"]["type"], "object");
            assert!(!tool["description"].as_str().unwrap().is_empty());
        }
        assert_eq!(
            tools[0]["inputSchema"]["required"],
            json!(["command"]),
            "{tools:#?}"
        );
        assert_eq!(
            tools[1]["inputSchema"]["required"],
            json!(["filepath", "diff"])
        );
        // An unknown version gets the latest we serve.
        assert_eq!(
            by_id(&out, json!(3))["result"]["protocolVersion"],
            LATEST_HANDSHAKE_VERSION
        );
    }

    #[tokio::test]
    async fn the_stateless_era_discovers_and_lists_with_the_version_in_meta() {
        let meta = r#""_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28"}"#;
        let out = exchange(&format!(
            "{{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"server/discover\",\"params\":{{{meta}}}}}\n\
             {{\"jsonrpc\":\"2.0\",\"id\":2,\"method\":\"tools/list\",\"params\":{{{meta}}}}}\n\
             {{\"jsonrpc\":\"2.0\",\"id\":3,\"method\":\"tools/list\",\"params\":{{\"_meta\":{{\"io.modelcontextprotocol/protocolVersion\":\"2030-01-01\"}}}}}}\n"
        ))
        .await;
        let discover = &by_id(&out, json!(1))["result"];
        assert_eq!(
            discover["supportedVersions"],
            json!(["2025-06-18", "2025-11-25", "2026-07-28"])
        );
        assert_eq!(discover["resultType"], "complete");
        assert_eq!(discover["capabilities"]["tools"], json!({}));
        assert_eq!(discover["_meta"][SERVER_INFO_META_KEY]["name"], SERVER_NAME);
        let list = &by_id(&out, json!(2))["result"];
        assert_eq!(list["resultType"], "complete");
        assert_eq!(list["tools"].as_array().unwrap().len(), 2);
        let refused = &by_id(&out, json!(3))["error"];
        assert_eq!(refused["code"], code::UNSUPPORTED_PROTOCOL_VERSION);
        assert_eq!(refused["data"]["supported"][2], "2026-07-28");
    }

    #[tokio::test]
    async fn bad_json_unknown_methods_and_bad_calls_are_protocol_errors() {
        let out = exchange(concat!(
            "{not json\n",
            "[1,2]\n",
            r#"{"jsonrpc":"2.0","id":1,"method":"resources/list"}"#,
            "\n",
            r#"{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"rm_rf"}}"#,
            "\n",
            r#"{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"execute_shell_command","arguments":"ls"}}"#,
            "\n",
            r#"{"jsonrpc":"2.0","id":4,"method":"tools/call","params":{}}"#,
            "\n",
            r#"{"jsonrpc":"2.0","id":{"x":1},"method":"ping"}"#,
            "\n",
            r#"{"jsonrpc":"2.0","id":5,"result":{}}"#,
            "\n",
            "\n",
        ))
        .await;
        let codes: Vec<(Value, i64)> = out
            .iter()
            .map(|m| (m["id"].clone(), m["error"]["code"].as_i64().unwrap()))
            .collect();
        assert_eq!(
            codes,
            [
                (Value::Null, code::PARSE_ERROR),
                (Value::Null, code::INVALID_REQUEST),
                (json!(1), code::METHOD_NOT_FOUND),
                (json!(2), code::INVALID_PARAMS),
                (json!(3), code::INVALID_PARAMS),
                (json!(4), code::INVALID_PARAMS),
                (Value::Null, code::INVALID_REQUEST),
            ],
            "{out:#?}"
        );
        assert!(
            out[3]["error"]["message"]
                .as_str()
                .unwrap()
                .contains("Unknown tool: rm_rf")
        );
    }

    #[tokio::test]
    async fn a_line_over_the_limit_is_skipped_and_the_next_one_served() {
        let mut input = vec![b'x'; MAX_CALL_BYTES + 10];
        input.push(b'\n');
        input.extend_from_slice(br#"{"jsonrpc":"2.0","id":7,"method":"ping"}"#);
        input.push(b'\n');
        let out = exchange_with(input, dead_forwarder()).await;
        assert_eq!(out.len(), 2, "{out:#?}");
        assert_eq!(out[0]["error"]["code"], code::PARSE_ERROR);
        assert!(
            out[0]["error"]["message"]
                .as_str()
                .unwrap()
                .contains("longer than")
        );
        assert_eq!(by_id(&out, json!(7))["result"], json!({}));
    }

    #[tokio::test]
    async fn a_call_runnerd_cannot_take_is_a_tool_error_with_a_sentence() {
        // Only the call's answer is awaited before the input ends: give it time to finish.
        let (mut client, server_in) = tokio::io::duplex(1 << 16);
        let (out_write, out_read) = tokio::io::duplex(1 << 16);
        let server = tokio::spawn(serve(
            BufReader::new(server_in),
            out_write,
            dead_forwarder(),
        ));
        client
            .write_all(
                br#"{"jsonrpc":"2.0","id":9,"method":"tools/call","params":{"name":"execute_shell_command","arguments":{"command":"ls"}}}
"#,
            )
            .await
            .unwrap();
        let mut lines = BufReader::new(out_read).lines();
        let answer: Value =
            serde_json::from_str(&lines.next_line().await.unwrap().unwrap()).unwrap();
        drop(client);
        server.await.unwrap().unwrap();
        assert_eq!(answer["id"], 9);
        assert_eq!(answer["result"]["isError"], true);
        let text = answer["result"]["content"][0]["text"].as_str().unwrap();
        assert!(text.contains("cannot reach runnerd"), "{text}");
    }

    #[tokio::test]
    async fn extra_tools_are_listed_and_forwarded_and_unlisted_ones_refused() {
        let extra = json!({"name": "mcp_docs_a1b2c3__search", "description": "[MCP server \"Docs\"] Search.",
                           "inputSchema": {"type": "object"}});
        let tools = crate::bridge::offered_tools(Some(crate::bridge::ToolList {
            tools: vec![extra.clone()],
            laptop: None,
        }));
        let (mut client, server_in) = tokio::io::duplex(1 << 16);
        let (out_write, out_read) = tokio::io::duplex(1 << 16);
        let server = tokio::spawn(serve_tools(
            BufReader::new(server_in),
            out_write,
            dead_forwarder(),
            tools,
        ));
        client
            .write_all(concat!(
                r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18"}}"#,
                "\n",
                r#"{"jsonrpc":"2.0","id":2,"method":"tools/list"}"#,
                "\n",
                r#"{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"mcp_other_d4e5f6__x","arguments":{}}}"#,
                "\n",
                r#"{"jsonrpc":"2.0","id":4,"method":"tools/call","params":{"name":"mcp_docs_a1b2c3__search","arguments":{"q":"x"}}}"#,
                "\n",
            ).as_bytes())
            .await
            .unwrap();
        let mut lines = BufReader::new(out_read).lines();
        let mut out = Vec::new();
        while out.len() < 4 {
            let line = lines.next_line().await.unwrap().unwrap();
            out.push(serde_json::from_str::<Value>(&line).unwrap());
        }
        drop(client);
        server.await.unwrap().unwrap();
        let instructions = by_id(&out, json!(1))["result"]["instructions"]
            .as_str()
            .unwrap();
        assert!(instructions.contains("MCP connections"), "{instructions}");
        let listed = by_id(&out, json!(2))["result"]["tools"].as_array().unwrap();
        let names: Vec<&str> = listed.iter().filter_map(|t| t["name"].as_str()).collect();
        assert_eq!(names, [SHELL_TOOL, PATCH_TOOL, "mcp_docs_a1b2c3__search"]);
        assert_eq!(listed[2], extra);
        let refused = &by_id(&out, json!(3))["error"];
        assert_eq!(refused["code"], code::INVALID_PARAMS);
        assert!(
            refused["message"]
                .as_str()
                .unwrap()
                .contains("mcp_docs_a1b2c3__search"),
            "{refused}"
        );
        // The listed extra tool went to runnerd (nobody listens: a tool error saying so).
        let forwarded = &by_id(&out, json!(4))["result"];
        assert_eq!(forwarded["isError"], true);
        assert!(
            forwarded["content"][0]["text"]
                .as_str()
                .unwrap()
                .contains("cannot reach runnerd"),
            "{forwarded}"
        );
    }

    #[tokio::test]
    async fn without_runnerds_list_the_builtins_alone_are_offered() {
        let out = exchange(concat!(
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/list"}"#,
            "\n",
            r#"{"jsonrpc":"2.0","id":2,"method":"initialize","params":{}}"#,
            "\n",
        ))
        .await;
        let names: Vec<&str> = by_id(&out, json!(1))["result"]["tools"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|t| t["name"].as_str())
            .collect();
        assert_eq!(names, [SHELL_TOOL, PATCH_TOOL]);
        let instructions = by_id(&out, json!(2))["result"]["instructions"]
            .as_str()
            .unwrap();
        assert!(!instructions.contains("MCP connections"), "{instructions}");
    }
}
