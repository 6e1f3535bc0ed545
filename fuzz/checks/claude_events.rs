//! runnerd's Claude Code driver reading `claude -p --output-format stream-json` stdout
//! (`claude::EventParser`): what Claude Code prints carries the model's words (text, commands,
//! tool output), so each line is hostile.
//!
//! The input is the stdout, split into lines at `\n` (invalid UTF-8 replaced), each fed to
//! `EventParser::line`, then `finish` with an exit status the input's length picks. `$BIG` in a
//! line becomes 66 000 bytes of two-byte characters, so the bounds are reached from short inputs.
//!
//! It must never panic, and every event stays bounded: a text, a tool call's command and a
//! tool's output at most `MAX_TOOL_OUTPUT_BYTES` (the command on one line), a failure's message
//! at most that plus a short sentence; a session id has a UUID's form; a result follows its own
//! call, once, and each call id is called once; failures are `cli_failed`; `finish` reports
//! exactly one failure when no `result` came, none otherwise, and nothing the second time.

use std::collections::HashSet;

use agentworks_contract::runnerd::TurnEvent;
use agentworks_runner::claude::{EventParser, is_session_id};
use agentworks_runner::driver::MAX_TOOL_OUTPUT_BYTES;

/// The longest sentence the parser wraps around a message from the input
/// ("Claude Code exited with status -2147483648 before the turn ended: …").
const WRAPPING: usize = 96;

pub fn run(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    let big = "é".repeat(33_000);
    let mut parser = EventParser::new();
    let mut called = HashSet::new();
    let mut answered = HashSet::new();
    let mut ended = false;
    for line in text.split('\n') {
        let line = if line.contains("$BIG") {
            line.replace("$BIG", &big)
        } else {
            line.to_owned()
        };
        for event in parser.line(&line) {
            check(&event, &mut called, &mut answered);
        }
        let kind = serde_json::from_str::<serde_json::Value>(line.trim())
            .ok()
            .and_then(|v| v.get("type").and_then(|t| t.as_str()).map(str::to_owned));
        if kind.as_deref() == Some("result") {
            ended = true;
        }
    }
    let exit_code = match data.len() % 3 {
        0 => Some(0),
        1 => Some(1),
        _ => None,
    };
    let last = parser.finish(exit_code);
    if ended {
        assert!(last.is_empty(), "{last:?}");
    } else {
        assert!(
            matches!(last.as_slice(), [TurnEvent::Error { .. }]),
            "{last:?}"
        );
    }
    for event in &last {
        check(event, &mut called, &mut answered);
    }
    assert!(parser.finish(exit_code).is_empty());
}

fn check(event: &TurnEvent, called: &mut HashSet<String>, answered: &mut HashSet<String>) {
    match event {
        TurnEvent::Session { session_id } => assert!(is_session_id(session_id), "{session_id}"),
        TurnEvent::Text { text } => {
            assert!(text.len() <= MAX_TOOL_OUTPUT_BYTES, "{}", text.len());
        }
        TurnEvent::ToolCall {
            call_id,
            tool,
            command,
        } => {
            assert!(tool.len() <= MAX_TOOL_OUTPUT_BYTES, "{}", tool.len());
            assert!(command.len() <= MAX_TOOL_OUTPUT_BYTES, "{}", command.len());
            assert!(
                !command
                    .trim_end_matches("\n[output truncated]")
                    .contains(['\n', '\r', '\t']),
                "not one line: {command:?}"
            );
            assert!(called.insert(call_id.clone()), "{call_id} called twice");
        }
        TurnEvent::ToolResult {
            call_id, output, ..
        } => {
            assert!(
                called.contains(call_id),
                "a result before its call: {call_id}"
            );
            assert!(answered.insert(call_id.clone()), "{call_id} answered twice");
            assert!(output.len() <= MAX_TOOL_OUTPUT_BYTES, "{}", output.len());
        }
        TurnEvent::Error { code, message } => {
            assert_eq!(code, "cli_failed");
            assert!(
                message.len() <= MAX_TOOL_OUTPUT_BYTES + WRAPPING,
                "{}",
                message.len()
            );
        }
        other => panic!("the Claude Code parser made {other:?}"),
    }
}
