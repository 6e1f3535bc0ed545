//! The tools a turn was given at its start ([`Toolset`]) and the one executor of their calls.
//!
//! Every driver of a turn calls [`Toolset::execute`]: the model loop for each tool call the
//! model asks for, and a coding CLI's driver for each call of a connection's tool that the
//! CLI's bridge hands over ([`Toolset::connection_definitions`] is what the bridge offers), so
//! both get the same checks and the same results. Every call re-checks the retained state first:
//! this turn is still the chat's running turn and the chat's binding is still the one the turn
//! started with; a stale call is a tool error and does nothing. Then it goes to its kind: an
//! image of the turn, a connection's tool, a server file, or the bound laptop folder.
//!
//! Every tool result is judged once by [`call_state`]: `done` or `failed` and a one-line
//! summary, on the `tool_result` event ([`tool_result`]) and (computed again from the stored
//! content) on the tool messages of `GET /v1/chats/{id}`.

use super::{Mode, connections, images, laptop, server_files};
use crate::chat::attachments::{AttachmentInfo, Kind};
use crate::chat::model::ToolCall;
use crate::chat::service::ChatService;
use crate::chat::store::Chat;
use crate::connections::TurnConnections;
use crate::mcp::{Caller, ToolError};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

/// What a turn offers, fixed at its start: its mode's tools, in server mode the project's MCP
/// connections' tools, and `read_image` when its message carries an image; with what the calls
/// are made for (the person, the chat as the turn started, the turn's number).
pub struct Toolset {
    caller: Caller,
    chat: Chat,
    turn: i64,
    /// The images the turn's message carries.
    images: Vec<AttachmentInfo>,
    mode: Mode,
    remote: TurnConnections,
}

impl Toolset {
    /// The tools of turn `turn` of `chat` for `caller`, from the chat's binding: in server
    /// mode the server files and the project's connections, bound to a laptop folder the shell
    /// and (for a folder the device shares writable now) the patch tool.
    pub async fn resolve(
        service: &ChatService,
        caller: &Caller,
        chat: &Chat,
        turn: i64,
        attachments: &[AttachmentInfo],
    ) -> Toolset {
        let mode = match &chat.binding {
            None => Mode::Server,
            Some(binding) => Mode::Local {
                writable: laptop::bound_folder_writable(service, caller, binding).await,
            },
        };
        // A project's MCP connections serve server-mode turns only: a turn bound to a laptop
        // folder gets exactly its local tools (and read_image), never a remote server's. They
        // also need an authoring role, checked there (and at every call).
        let remote = match mode {
            Mode::Server => {
                connections::open(&service.connection_tools, caller, &chat.project_id).await
            }
            Mode::Local { .. } => TurnConnections::default(),
        };
        Toolset {
            caller: caller.clone(),
            chat: chat.clone(),
            turn,
            images: attachments
                .iter()
                .filter(|a| a.kind == Kind::Image)
                .cloned()
                .collect(),
            mode,
            remote,
        }
    }

    /// What the turn may call.
    pub fn mode(&self) -> Mode {
        self.mode
    }

    /// The tools' definitions, as a model API takes them (function tools with JSON schemas).
    pub fn definitions(&self) -> Vec<Value> {
        let mut tools = match self.mode {
            Mode::Server => server_files::definitions(),
            Mode::Local { writable } => laptop::definitions(writable),
        };
        tools.extend(self.remote.tools.iter().cloned());
        if !self.images.is_empty() {
            tools.push(images::definition());
        }
        tools
    }

    /// The project's MCP connections' tools this turn offers (model API function tools), the
    /// part of [`definitions`](Self::definitions) a coding CLI's bridge offers too: none in a
    /// turn bound to a laptop folder, or for a person without an authoring role.
    pub fn connection_definitions(&self) -> &[Value] {
        &self.remote.tools
    }

    /// Whether `name` is one of the connections' tools this turn offers.
    pub fn offers_connection_tool(&self, name: &str) -> bool {
        self.chat.binding.is_none() && self.remote.offers(name)
    }

    /// `(display name, code, message)` of each of the project's connections left out of the
    /// turn (down, or wanting a sign-in).
    pub fn unavailable(&self) -> &[(String, String, String)] {
        &self.remote.unavailable
    }

    /// The line a prompt adds when some connection is left out.
    pub fn prompt_note(&self) -> Option<String> {
        self.remote.prompt_note()
    }

    /// The request id of the turn's `call_index`-th call: made by the server, never the model,
    /// so a retried call is the same request to workspaced and to the laptop.
    pub fn request_id(&self, call_index: u32) -> String {
        format!(
            "chat-{}-turn-{}-call-{call_index}",
            self.chat.chat_id, self.turn
        )
    }

    /// Runs one tool call of the turn, after re-checking the turn is still current.
    pub async fn execute(
        &self,
        service: &ChatService,
        call: &ToolCall,
        request_id: &str,
        cancel: &CancellationToken,
    ) -> Result<Value, ToolError> {
        // Retained state, re-checked on every call.
        service
            .check_current(&self.chat.chat_id, self.turn, self.chat.binding_generation)
            .await?;
        if call.name == "read_image" && !self.images.is_empty() {
            return images::read_image(service, &self.chat.chat_id, self.turn, &self.images, call)
                .await;
        }
        let project_id = &self.chat.project_id;
        match &self.chat.binding {
            None if self.remote.offers(&call.name) => {
                let tools = &service.connection_tools;
                connections::call(tools, &self.remote, &self.caller, project_id, call).await
            }
            None => {
                server_files::execute(&service.files, &self.caller, project_id, call, request_id)
                    .await
            }
            Some(binding) => {
                let operation = laptop::operation(call, self.mode)?;
                laptop::execute(
                    service,
                    &self.caller,
                    project_id,
                    binding,
                    operation,
                    request_id,
                    cancel,
                )
                .await
            }
        }
    }
}

/// What a tool call came to, as a person sees it: ✓ or ✗.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum CallState {
    Done,
    Failed,
}

impl CallState {
    pub fn as_str(self) -> &'static str {
        match self {
            CallState::Done => "done",
            CallState::Failed => "failed",
        }
    }
}

/// The longest summary of a call, in characters.
pub const MAX_SUMMARY_CHARS: usize = 200;

/// The one rule for a tool call's state and its one-line summary, from its result as stored
/// (`{"ok": true, "result": …}` or `{"ok": false, "error": {"code", "message"}}`; the
/// `tool_result` event carries the same fields):
///
/// - an error (refused, not run, offline, outcome unknown…) is failed, with its message;
/// - a command's result (one with `exit_code`) is failed when it was cancelled, timed out, or
///   exited with anything but 0 (no exit code: killed by a signal), summarised as `cancelled`,
///   `timed out after N s`, or `exit N` and the first non-empty line of stderr;
/// - anything else is done.
///
/// A command that exits non-zero is an `ok` result (it ran, and the model needs its output),
/// which is why `ok` alone does not say ✓.
pub fn call_state(content: &Value) -> (CallState, String) {
    if content["ok"] != Value::Bool(true) {
        let error = &content["error"];
        let message = error["message"].as_str().unwrap_or_default();
        let text = if message.trim().is_empty() {
            error["code"].as_str().unwrap_or("failed")
        } else {
            message
        };
        return (CallState::Failed, one_line(text));
    }
    let result = &content["result"];
    if let Some(result) = result.as_object()
        && result.contains_key("exit_code")
    {
        if result.get("cancelled") == Some(&Value::Bool(true)) {
            return (CallState::Failed, "cancelled".into());
        }
        if result.get("timed_out") == Some(&Value::Bool(true)) {
            let summary = match result.get("timeout_secs").and_then(Value::as_u64) {
                Some(secs) => format!("timed out after {secs} s"),
                None => "timed out".into(),
            };
            return (CallState::Failed, summary);
        }
        let stderr = result
            .get("stderr")
            .and_then(Value::as_str)
            .and_then(|e| e.lines().map(str::trim).find(|l| !l.is_empty()));
        let code = result.get("exit_code").and_then(Value::as_i64);
        let head = match code {
            Some(code) => format!("exit {code}"),
            None => "killed by a signal".into(),
        };
        return match (code, stderr) {
            (Some(0), _) => (CallState::Done, head),
            (_, Some(line)) => (CallState::Failed, one_line(&format!("{head}: {line}"))),
            (_, None) => (CallState::Failed, head),
        };
    }
    let summary = if let Some(files) = result["files"].as_array() {
        let paths: Vec<&str> = files.iter().filter_map(|f| f["path"].as_str()).collect();
        format!("patched {}", paths.join(", "))
    } else if let (Some(state), Some(path)) = (result["state"].as_str(), result["path"].as_str()) {
        format!("{state}: {path}")
    } else {
        "done".into()
    };
    (CallState::Done, one_line(&summary))
}

/// The first line of `text` with anything to show, at most [`MAX_SUMMARY_CHARS`] characters.
fn one_line(text: &str) -> String {
    agentworks_core::text::first_line(text, MAX_SUMMARY_CHARS)
}

/// A call's result as the `tool_result` event and as the content of the stored tool message;
/// the event's `state` and `summary` are [`call_state`] of that content.
pub fn tool_result(call: &ToolCall, result: &Result<Value, ToolError>) -> (Value, Value) {
    let content = match result {
        Ok(value) => json!({"ok": true, "result": value}),
        Err(error) => {
            let mut body = error.details.clone();
            body.insert("code".into(), json!(error.code));
            body.insert("message".into(), json!(error.message));
            json!({"ok": false, "error": body})
        }
    };
    let (state, summary) = call_state(&content);
    let mut event = json!({"id": call.id, "name": call.name, "state": state, "summary": summary});
    if let (Some(event), Some(fields)) = (event.as_object_mut(), content.as_object()) {
        event.extend(fields.clone());
    }
    (event, content)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(tools: &[Value]) -> Vec<&str> {
        tools
            .iter()
            .map(|t| t["function"]["name"].as_str().unwrap())
            .collect()
    }

    #[test]
    fn tool_lists_are_exactly_the_modes_tools() {
        assert_eq!(
            names(&server_files::definitions()),
            ["read_file", "list_files", "search_files", "write_file"]
        );
        assert_eq!(
            names(&laptop::definitions(true)),
            ["execute_shell_command", "diff_patch_workspace_file"]
        );
        assert_eq!(
            names(&laptop::definitions(false)),
            ["execute_shell_command"]
        );
        // Nothing in a local schema names a device, folder or project.
        let text = serde_json::to_string(&laptop::definitions(true)).unwrap();
        for word in ["device", "\"folder\"", "workflow_id", "request_id"] {
            assert!(!text.contains(word), "{word}");
        }
        let text = serde_json::to_string(&server_files::definitions()).unwrap();
        assert!(!text.contains("workflow_id") && !text.contains("request_id"));
    }

    fn command(exit_code: Value, stderr: &str) -> Value {
        json!({"ok": true, "result": {"stdout": "out\n", "stderr": stderr, "exit_code": exit_code,
            "timed_out": false, "cancelled": false}})
    }

    #[test]
    fn a_command_that_exits_non_zero_times_out_or_is_cancelled_failed() {
        let state = |content: &Value| {
            let (state, summary) = call_state(content);
            (state.as_str(), summary)
        };
        assert_eq!(
            state(&command(json!(0), "warning\n")),
            ("done", "exit 0".into())
        );
        assert_eq!(
            state(&command(
                json!(2),
                "\n  \n  ls: cannot access 'x': No such file\nmore\n"
            )),
            (
                "failed",
                "exit 2: ls: cannot access 'x': No such file".into()
            )
        );
        assert_eq!(state(&command(json!(1), "")), ("failed", "exit 1".into()));
        assert_eq!(
            state(&command(Value::Null, "")),
            ("failed", "killed by a signal".into())
        );
        let mut timed_out = command(json!(137), "");
        timed_out["result"]["timed_out"] = json!(true);
        timed_out["result"]["timeout_secs"] = json!(30);
        assert_eq!(state(&timed_out), ("failed", "timed out after 30 s".into()));
        timed_out["result"]
            .as_object_mut()
            .unwrap()
            .remove("timeout_secs");
        assert_eq!(state(&timed_out), ("failed", "timed out".into()));
        // A command cancelled with exit 0 (it trapped the signal) is still not done.
        let mut cancelled = command(json!(0), "");
        cancelled["result"]["cancelled"] = json!(true);
        assert_eq!(state(&cancelled), ("failed", "cancelled".into()));
    }

    #[test]
    fn a_tool_error_is_failed_with_its_message_and_other_results_are_done() {
        let state = |content: &Value| {
            let (state, summary) = call_state(content);
            (state.as_str(), summary)
        };
        let error = json!({"ok": false, "error": {"code": "device_offline",
            "message": "the device is offline\nsecond line"}});
        assert_eq!(state(&error), ("failed", "the device is offline".into()));
        let bare = json!({"ok": false, "error": {"code": "not_run", "message": ""}});
        assert_eq!(state(&bare), ("failed", "not_run".into()));
        assert_eq!(state(&json!({})).0, "failed");
        let patched =
            json!({"ok": true, "result": {"files": [{"path": "a.txt", "revision": "r"}]}});
        assert_eq!(state(&patched), ("done", "patched a.txt".into()));
        let written = json!({"ok": true, "result": {"state": "applied", "path": "x.md"}});
        assert_eq!(state(&written), ("done", "applied: x.md".into()));
        let read = json!({"ok": true, "result": {"content": "x", "revision": "r"}});
        assert_eq!(state(&read), ("done", "done".into()));
    }

    #[test]
    fn summaries_are_one_bounded_line_cut_on_a_character_boundary() {
        let long = "é".repeat(500);
        let (_, summary) = call_state(&command(json!(3), &long));
        assert_eq!(summary.chars().count(), MAX_SUMMARY_CHARS);
        assert!(
            summary.starts_with("exit 3: éé") && summary.ends_with('…'),
            "{summary}"
        );
        let (_, summary) = call_state(&json!({"ok": false, "error": {"message": "ß".repeat(300)}}));
        assert_eq!(summary.chars().count(), MAX_SUMMARY_CHARS);
        assert!(!summary.contains('\n'));
    }

    #[test]
    fn the_tool_result_event_carries_the_state_of_the_stored_content() {
        let call = ToolCall {
            id: "c1".into(),
            name: "execute_shell_command".into(),
            arguments: "{}".into(),
        };
        let failed = command(json!(2), "boom\n")["result"].clone();
        let (event, content) = tool_result(&call, &Ok(failed));
        assert_eq!(content["ok"], true);
        assert!(
            content.get("state").is_none(),
            "the model gets the result as it was"
        );
        assert_eq!(
            (
                &event["id"],
                &event["ok"],
                &event["state"],
                &event["summary"]
            ),
            (
                &json!("c1"),
                &json!(true),
                &json!("failed"),
                &json!("exit 2: boom")
            )
        );
        assert_eq!(event["result"], content["result"]);
        let (event, content) = tool_result(
            &call,
            &Err(ToolError::new("device_offline", "the device is offline")),
        );
        assert_eq!(content["error"]["code"], "device_offline");
        assert_eq!(
            (&event["state"], &event["summary"]),
            (&json!("failed"), &json!("the device is offline"))
        );
    }
}
