//! runnerd's ACP client (`acp::converse`) talking to a hostile agent: the input is everything
//! the agent prints on its stdout (JSON-RPC lines: answers to our requests, `session/update`
//! notifications, its own requests such as `session/request_permission`), read until it ends.
//! The conversation runs twice, in server mode and bound to a laptop folder, on a
//! current-thread runtime, with what runnerd writes to the agent kept.
//!
//! It must never panic and always end (the input's end is the agent closing its output); the
//! events stay bounded and ordered (a tool's result follows its call, each call once); and the
//! permission policy holds whatever the agent claims: never an "always" option, and in a bound
//! chat no allow option chosen for a request when nothing in the input names the bridge.

use std::collections::HashSet;
use std::path::PathBuf;

use agentworks_contract::runnerd::TurnEvent;
use agentworks_runner::acp::{AcpSession, converse};
use agentworks_runner::driver::MAX_TOOL_OUTPUT_BYTES;
use serde_json::Value;
use tokio_util::sync::CancellationToken;

/// The most bytes one text event may hold: the client joins chunks up to its line limit
/// (4 MiB), the last chunk whole.
const MAX_TEXT: usize = 8 * 1024 * 1024;

pub fn run(data: &[u8]) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("a current-thread runtime");
    for bound in [false, true] {
        let written = runtime.block_on(conversation(data, bound));
        check_permissions(data, &written, bound);
    }
}

/// One conversation on `data`; what the client wrote to the agent.
async fn conversation(data: &[u8], bound: bool) -> Vec<u8> {
    let session = AcpSession {
        cwd: PathBuf::from("/state/runner/runtimes/fuzz"),
        bridge_command: Some(PathBuf::from("/usr/bin/agentworks-mcpbridge")),
        bridge_env: vec![("AGENTWORKS_BRIDGE_TOKEN".into(), "t".into())],
        bound,
        resume: (data.len() % 2 == 1).then(|| "ses_1".to_owned()),
    };
    let mut written = Vec::new();
    let mut called = HashSet::new();
    let mut answered = HashSet::new();
    let mut emit = |event: TurnEvent| check(&event, &mut called, &mut answered);
    let cancel = CancellationToken::new();
    let _ = converse(data, &mut written, &session, "hi", &cancel, &mut emit).await;
    written
}

fn check(event: &TurnEvent, called: &mut HashSet<String>, answered: &mut HashSet<String>) {
    match event {
        TurnEvent::Session { .. } => {}
        TurnEvent::Text { text } => assert!(text.len() <= MAX_TEXT, "{}", text.len()),
        TurnEvent::ToolCall {
            call_id, command, ..
        } => {
            assert!(command.len() <= MAX_TOOL_OUTPUT_BYTES, "{}", command.len());
            assert!(called.insert(call_id.clone()), "{call_id} called twice");
        }
        TurnEvent::ToolResult {
            call_id, output, ..
        } => {
            assert!(called.contains(call_id), "a result before its call");
            assert!(answered.insert(call_id.clone()), "{call_id} answered twice");
            assert!(output.len() <= MAX_TOOL_OUTPUT_BYTES, "{}", output.len());
        }
        other => panic!("the ACP client emitted {other:?}"),
    }
}

/// The options the agent offered, by kind: (allow ids, reject ids, allow-always ids).
fn offered(data: &[u8]) -> (HashSet<String>, HashSet<String>, HashSet<String>) {
    let (mut allow, mut reject, mut always) = (HashSet::new(), HashSet::new(), HashSet::new());
    for line in String::from_utf8_lossy(data).split('\n') {
        let Ok(message) = serde_json::from_str::<Value>(line.trim()) else {
            continue;
        };
        if message["method"] != "session/request_permission" {
            continue;
        }
        for option in message["params"]["options"]
            .as_array()
            .into_iter()
            .flatten()
        {
            let (Some(id), Some(kind)) = (option["optionId"].as_str(), option["kind"].as_str())
            else {
                continue;
            };
            match kind {
                "allow_always" => {
                    always.insert(id.to_owned());
                }
                k if k.starts_with("allow") => {
                    allow.insert(id.to_owned());
                }
                _ => {
                    reject.insert(id.to_owned());
                }
            }
        }
    }
    (allow, reject, always)
}

fn check_permissions(data: &[u8], written: &[u8], bound: bool) {
    let (allow, reject, always) = offered(data);
    let names_bridge = String::from_utf8_lossy(data).contains("bridge");
    for line in String::from_utf8_lossy(written).lines() {
        let message: Value = serde_json::from_str(line).expect("runnerd writes JSON lines");
        let outcome = &message["result"]["outcome"];
        if outcome["outcome"] != "selected" {
            continue;
        }
        let Some(chosen) = outcome["optionId"].as_str() else {
            panic!("a selected outcome without an option: {line}");
        };
        let only = |set: &HashSet<String>, others: [&HashSet<String>; 2]| {
            set.contains(chosen) && others.iter().all(|o| !o.contains(chosen))
        };
        assert!(
            !only(&always, [&allow, &reject]),
            "chose an always option: {line}"
        );
        if bound && !names_bridge {
            assert!(
                !only(&allow, [&always, &reject]),
                "allowed a tool in a bound chat: {line}"
            );
        }
    }
}
