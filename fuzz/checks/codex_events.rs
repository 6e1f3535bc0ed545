//! runnerd's Codex driver reading `codex exec --json` stdout (`codex::EventParser`): what Codex
//! prints carries the model's words (text, commands, tool output), so each line is hostile.
//!
//! The input is the stdout, split into lines at `\n` (invalid UTF-8 replaced, as no real line
//! could hold it), each fed to `EventParser::line`, then `finish` with an exit status the
//! input's length picks. `$BIG` in a line becomes 66 000 bytes of two-byte characters, so the
//! bounds are reached from inputs far shorter than libFuzzer's length limit.
//!
//! It must never panic, and every event stays bounded: a tool call's command and a tool's
//! output at most `MAX_TOOL_OUTPUT_BYTES` (the command on one line, but for the truncation
//! mark), every other string no longer than the longest line plus a short sentence; a result
//! follows its own call and each item is called once; failures are `cli_failed`; `finish`
//! reports exactly one failure when no `turn.completed` or `turn.failed` came, none otherwise,
//! and nothing the second time. A parser with a usage baseline makes the same events, its
//! usage that baseline less.

use std::collections::HashSet;

use agentworks_contract::runnerd::TurnEvent;
use agentworks_runner::codex::{EventParser, MAX_TOOL_OUTPUT_BYTES};

/// What `$BIG` expands to: more than `MAX_TOOL_OUTPUT_BYTES`, in characters of two bytes, so a
/// cut must find a character boundary.
fn big() -> String {
    "é".repeat(33_000)
}

/// The mark `bounded` appends to what it cut (codex.rs's `TRUNCATED`).
const TRUNCATED: &str = "\n[output truncated]";
/// The longest sentence the parser wraps around a message from the input
/// ("Codex exited with status -2147483648 before the turn ended: …").
const WRAPPING: usize = 96;
const BASELINE: (u64, u64) = (5, 3);

pub fn run(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    let big = big();
    let mut plain = EventParser::new();
    let mut resumed = EventParser::with_usage_baseline(BASELINE.0, BASELINE.1);
    let mut called = HashSet::new();
    let mut longest = 0;
    let mut ended = false;
    for line in text.split('\n') {
        let line = if line.contains("$BIG") {
            line.replace("$BIG", &big)
        } else {
            line.to_owned()
        };
        longest = longest.max(line.len());
        let events = plain.line(&line);
        let again = resumed.line(&line);
        assert_eq!(events.len(), again.len(), "{events:?} {again:?}");
        for (event, other) in events.iter().zip(&again) {
            same_but_usage(event, other);
            check(event, longest, &mut called);
        }
        let kind = serde_json::from_str::<serde_json::Value>(line.trim())
            .ok()
            .and_then(|v| v.get("type").and_then(|t| t.as_str()).map(str::to_owned));
        if matches!(kind.as_deref(), Some("turn.completed" | "turn.failed")) {
            ended = true;
        }
    }
    let exit_code = match data.len() % 3 {
        0 => Some(0),
        1 => Some(1),
        _ => None,
    };
    let last = plain.finish(exit_code);
    assert_eq!(last, resumed.finish(exit_code));
    if ended {
        assert!(last.is_empty(), "{last:?}");
    } else {
        assert!(
            matches!(last.as_slice(), [TurnEvent::Error { .. }]),
            "{last:?}"
        );
    }
    for event in &last {
        check(event, longest, &mut called);
    }
    assert!(plain.finish(exit_code).is_empty());
}

/// The same event from both parsers; a usage less the baseline.
fn same_but_usage(plain: &TurnEvent, resumed: &TurnEvent) {
    match (plain, resumed) {
        (
            TurnEvent::Usage {
                input_tokens,
                output_tokens,
            },
            TurnEvent::Usage {
                input_tokens: input,
                output_tokens: output,
            },
        ) => {
            assert_eq!(*input, input_tokens.saturating_sub(BASELINE.0));
            assert_eq!(*output, output_tokens.saturating_sub(BASELINE.1));
        }
        _ => assert_eq!(plain, resumed),
    }
}

fn check(event: &TurnEvent, longest: usize, called: &mut HashSet<String>) {
    let from_line = |s: &str| assert!(s.len() <= longest + WRAPPING, "{} bytes", s.len());
    match event {
        TurnEvent::Session { session_id } => from_line(session_id),
        TurnEvent::Text { text } => from_line(text),
        TurnEvent::ToolCall {
            call_id,
            tool,
            command,
        } => {
            from_line(call_id);
            from_line(tool);
            assert!(command.len() <= MAX_TOOL_OUTPUT_BYTES, "{}", command.len());
            // Folded to one line (a cut may end on a space, before the mark).
            let (folded, cut) = match command.strip_suffix(TRUNCATED) {
                Some(folded) => (folded, true),
                None => (command.as_str(), false),
            };
            assert!(
                !folded.contains(|c: char| c.is_whitespace() && c != ' ') && !folded.contains("  "),
                "not one line: {folded:?}"
            );
            assert!(
                !folded.starts_with(' ') && (cut || !folded.ends_with(' ')),
                "not folded: {folded:?}"
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
            assert!(output.len() <= MAX_TOOL_OUTPUT_BYTES, "{}", output.len());
        }
        TurnEvent::Usage { .. } => {}
        TurnEvent::Error { code, message } => {
            assert_eq!(code, "cli_failed");
            from_line(message);
        }
        other => panic!("the Codex parser made {other:?}"),
    }
}
