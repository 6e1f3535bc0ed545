//! `agentworks-mcpbridge`'s stdio MCP server reading a line from the coding CLI
//! (`bridge::mcp::line_action`, which `serve` runs on every line): the CLI writes what its
//! model asks for, so each line is hostile.
//!
//! The input is one line: up to its first `\n` (`serve` splits there and never passes one on).
//!
//! It must never panic. An answer is one JSON-RPC 2.0 response (it serialises to one line,
//! has exactly one of `result` and `error`, an error has an integer code and a sentence) that
//! answers the request's own id, or `null` when the line had no valid one; a parse error only
//! for a line that is not JSON, and every line that is not JSON gets one. A notification or a
//! reply is never answered; a cancel names the request id the notification gave; a call
//! forwarded to runnerd is a `tools/call` of one of the two bridge tools with object
//! arguments, from a request with a valid id, `modern` exactly when the request named
//! 2026-07-28 in its `_meta`.

use agentworks_runner::bridge::mcp::{LineAction, code, line_action};
use agentworks_runner::bridge::{PATCH_TOOL, SHELL_TOOL};
use serde_json::{Map, Value};

const ANSWERED_NOW: [&str; 4] = ["initialize", "server/discover", "ping", "tools/list"];

pub fn run(data: &[u8]) {
    let line = data.split(|&b| b == b'\n').next().unwrap_or_default();
    let text = String::from_utf8_lossy(line);
    let text = text.trim();
    let parsed = serde_json::from_str::<Value>(text).ok();
    let empty = Map::new();
    let object = parsed.as_ref().and_then(Value::as_object);
    let message = object.unwrap_or(&empty);
    let id = message.get("id");
    let valid_id = matches!(id, Some(Value::String(_) | Value::Number(_)));
    let method = message.get("method").and_then(Value::as_str);
    let params = message.get("params").unwrap_or(&Value::Null);
    let notification = object.is_some() && method.is_some() && id.is_none();
    let reply = object.is_some()
        && !message.contains_key("method")
        && id.is_some()
        && (message.contains_key("result") || message.contains_key("error"));

    match line_action(line) {
        LineAction::Nothing => assert!(
            text.is_empty() || notification || reply,
            "no answer to {text:?}"
        ),
        LineAction::Answer(answer) => {
            assert!(!text.is_empty());
            assert!(!notification, "answered a notification: {answer}");
            assert!(!reply, "answered a reply: {answer}");
            check_answer(&answer, parsed.as_ref(), id.filter(|_| valid_id), method);
        }
        LineAction::Cancel(request) => {
            assert!(notification, "{text}");
            assert_eq!(method, Some("notifications/cancelled"));
            assert_eq!(Some(&request), params.get("requestId"));
        }
        LineAction::Call {
            id: call_id,
            call,
            modern,
        } => {
            assert!(valid_id, "{text}");
            assert_eq!(Some(&call_id), id);
            assert_eq!(method, Some("tools/call"));
            assert!(
                call.tool == SHELL_TOOL || call.tool == PATCH_TOOL,
                "{call:?}"
            );
            assert!(call.arguments.is_object(), "{call:?}");
            let version = &params["_meta"]["io.modelcontextprotocol/protocolVersion"];
            assert_eq!(modern, version == "2026-07-28", "{text}");
        }
    }
}

/// One JSON-RPC response to `request` (the line, when it was JSON), whose valid id was `id`.
fn check_answer(answer: &Value, request: Option<&Value>, id: Option<&Value>, method: Option<&str>) {
    let line = serde_json::to_string(answer).expect("an answer serialises");
    assert!(!line.contains('\n'), "{line}");
    let fields = answer.as_object().expect("an answer is an object");
    assert_eq!(fields.get("jsonrpc"), Some(&Value::from("2.0")), "{line}");
    assert!(
        fields
            .keys()
            .all(|k| matches!(k.as_str(), "jsonrpc" | "id" | "result" | "error")),
        "{line}"
    );
    assert_eq!(fields.get("id"), Some(id.unwrap_or(&Value::Null)), "{line}");
    match (fields.get("result"), fields.get("error")) {
        (Some(result), None) => {
            assert!(id.is_some(), "a result without an id: {line}");
            assert!(result.is_object(), "{line}");
            assert!(
                method.is_some_and(|m| ANSWERED_NOW.contains(&m)),
                "{method:?} answered with {line}"
            );
        }
        (None, Some(error)) => {
            let code = error["code"].as_i64().expect("an integer code");
            assert!(
                error["message"].as_str().is_some_and(|m| !m.is_empty()),
                "{line}"
            );
            assert_eq!(code == code::PARSE_ERROR, request.is_none(), "{line}");
            if code == code::METHOD_NOT_FOUND {
                assert!(
                    method.is_some_and(|m| !ANSWERED_NOW.contains(&m) && m != "tools/call"),
                    "{line}"
                );
            }
        }
        _ => panic!("not exactly one of result and error: {line}"),
    }
}
