//! One turn of a chat: the model loop and its tools.
//!
//! The person's message is stored first (titling a chat that has no title yet); a turn
//! without a configured model ends there, with [`NO_MODEL`].
//!
//! The loop sends the conversation and the turn's tool list to the model, runs the tool calls
//! it asks for, feeds the results back, and ends when the model answers without tool calls (or
//! after `max_tool_rounds` rounds, an error). Every message (user, assistant, tool) is stored,
//! so the next turn continues the chat; the model gets the most recent whole turns that fit in
//! `max_history_bytes` (the current turn always), told how many earlier messages it does not see.
//!
//! The tool list is fixed when the turn starts, from the chat's binding:
//!
//! - server mode (no binding): exactly `read_file`, `list_files`, `search_files`, `write_file`,
//!   through [`FileTools`](crate::catalog::files::FileTools) with the person's live authority (source `agent`); the project is
//!   always the chat's, and write request ids are made here, never by the model; and, for a
//!   person whose live role authors (owner, co-owner, editor), the project's MCP connections'
//!   tools ([`crate::connections::tools`]: none, and no word of them, for a viewer or a runner);
//! - bound to a laptop folder: exactly `execute_shell_command {command, timeout?}` and
//!   `diff_patch_workspace_file {filepath, diff}` (the bridge schemas: no device, folder or
//!   project argument), dispatched through gatewayd to the bound device and folder with
//!   server-made request ids; the patch tool only when the device's folder list at the turn's
//!   start says the folder is shared writable (a read-only folder, or one whose access cannot
//!   be learned, gets the shell tool alone). Nothing else exists in such a turn: no server file
//!   tools, no MCP connections, no secrets. An offline device fails the call
//!   (`device_offline`); nothing ever falls back to the server.
//!
//! A message's attachments (uploaded in the console, kept in agentd's private state) reach the
//! model from the server, never the laptop: text files as bounded previews in the person's
//! message, images through `read_image {name}`, which reads only this turn's attachments and is
//! offered, in both modes, only to a turn whose message carries an image. It reads server
//! uploads, not the laptop, so it is the one tool a bound turn has beside the two local ones.
//! The image itself is stored in the history as a reference and reaches the model as a data
//! URL only within its own turn; later turns see a line saying it was shown.
//!
//! Every tool call re-checks the retained state first: this turn is still the chat's running
//! turn and the chat's binding is still the one the turn started with; a stale call is a tool
//! error and does nothing. A local call also re-checks, from live rows, that the person still
//! has an authoring role (owner, co-owner, editor) on the chat's project.
//!
//! Every tool result is judged once by [`call_state`]: `done` or `failed` and a one-line
//! summary, on the `tool_result` event and (computed again from the stored content) on the
//! tool messages of `GET /v1/chats/{id}`. A turn's token usage is summed over its model calls,
//! stored after each one and sent with `end`.
//!
//! When the exchange with gatewayd fails after the dispatch was sent (connection reset, a bad
//! answer), nobody here knows whether it ran: the call is never reported "not run". agentd asks
//! gatewayd to recover it (`POST /v1/recover`: gatewayd's record, or the device's own receipt)
//! until the operation's deadline, and answers the real result, "never sent" (gatewayd had no
//! record), or `outcome_unknown`, never a guess.

use crate::attachments::{AttachmentInfo, Kind, text_preview};
use crate::catalog::files::{Source, require_authoring_role_for};
use crate::chat_service::{ChatService, blocking, to_tool};
use crate::chats::{Binding, Chat};
use crate::connections::TurnConnections;
use crate::identity::Access;
use crate::mcp::{Caller, ToolError};
use crate::model::{ToolCall, Usage};
use agentworks_contract::executor::{DEFAULT_TIMEOUT_SECS, FolderAccess, Operation, Outcome};
use agentworks_contract::gatewayd::{
    CancelResponse, DispatchRequest, DispatchState, Recovery, RequestRef,
};
use agentworks_daemon::ipc::envelope::Refusal;
use agentworks_support::unix_http::ClientError;
use serde_json::{Map, Value, json};
use std::time::Duration;
use tokio::sync::mpsc::UnboundedSender;
use tokio_util::sync::CancellationToken;

/// What a turn without a model answers (`model_not_configured`). agentd cannot tell a
/// quickstart from an installed server, so it names both ways to configure one.
pub const NO_MODEL: &str = "no model is configured, so nothing answers: an operator sets \
     [agentd.model] base_url and model in the config file, or starts agentworksctl quickstart \
     with --model-url URL --model NAME. Your message is kept in this chat; once a model is \
     configured, send another and the agent answers from there";

/// One server-sent event: `(kind, data)`.
pub type Event = (&'static str, Value);

/// What the turn works on, fixed at its start.
pub struct TurnSpec {
    pub caller: Caller,
    pub chat: Chat,
    pub project_name: String,
    pub turn: i64,
    pub message: String,
    /// The attachments the message carries, claimed for this turn.
    pub attachments: Vec<AttachmentInfo>,
}

/// The scheme of an image reference in the stored history: `attachment:<id>`.
const IMAGE_REFERENCE: &str = "attachment:";

/// `read_image`, offered to a turn whose message carries an image.
fn read_image_tool() -> Value {
    tool(
        "read_image",
        "See an image the person attached to this message (by its name as listed in the \
         message). Only this message's attachments can be read.",
        schema(json!({"name": {"type": "string"}}), &["name"]),
    )
}

fn schema(properties: Value, required: &[&str]) -> Value {
    json!({"type": "object", "properties": properties, "required": required,
           "additionalProperties": false})
}

fn tool(name: &str, description: &str, parameters: Value) -> Value {
    json!({"type": "function",
           "function": {"name": name, "description": description, "parameters": parameters}})
}

/// The four server-mode tools.
pub fn server_tools() -> Vec<Value> {
    vec![
        tool(
            "read_file",
            "Read a file of this project: its content and revision.",
            schema(
                json!({"path": {"type": "string", "description": "path relative to the project root"}}),
                &["path"],
            ),
        ),
        tool(
            "list_files",
            "List the files of this project (recursively), optionally under a folder.",
            schema(json!({"path": {"type": "string"}}), &[]),
        ),
        tool(
            "search_files",
            "Search the text of this project's files.",
            schema(
                json!({"query": {"type": "string"}, "path": {"type": "string"}}),
                &["query"],
            ),
        ),
        tool(
            "write_file",
            "Create or replace a UTF-8 file of this project. expected_revision is the revision \
             read_file returned, or \"missing\" to create a new file.",
            schema(
                json!({"path": {"type": "string"}, "content": {"type": "string"},
                       "expected_revision": {"type": "string"}}),
                &["path", "content", "expected_revision"],
            ),
        ),
    ]
}

/// The local tools of a bound turn (the bridge schemas): the shell, and the patch tool only for
/// a writable folder.
pub fn local_tools(writable: bool) -> Vec<Value> {
    let mut tools = vec![tool(
        "execute_shell_command",
        "Run a shell command in the shared folder on the person's computer (sandboxed to \
         the folder; the network is reachable). Returns stdout, stderr and the exit code.",
        schema(
            json!({"command": {"type": "string"},
                   "timeout": {"type": "integer", "minimum": 1, "maximum": 300,
                               "description": "seconds; default 60"}}),
            &["command"],
        ),
    )];
    if writable {
        tools.push(tool(
            "diff_patch_workspace_file",
            "Apply a unified diff to one file in the shared folder (writable folders only).",
            schema(
                json!({"filepath": {"type": "string", "description": "relative to the folder"},
                       "diff": {"type": "string"}}),
                &["filepath", "diff"],
            ),
        ));
    }
    tools
}

/// What a turn may call, fixed at its start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// No binding: the four server file tools.
    Server,
    /// Bound to a laptop folder: the shell, and the patch tool if the folder is writable.
    Local { writable: bool },
}

impl Mode {
    fn tools(self) -> Vec<Value> {
        match self {
            Mode::Server => server_tools(),
            Mode::Local { writable } => local_tools(writable),
        }
    }
}

/// What a turn offers, fixed at its start: its mode's tools and, in server mode, the project's
/// MCP connections' tools.
struct Toolset {
    mode: Mode,
    remote: TurnConnections,
}

/// Whether the bound folder is shared writable, from the device's folder list now. Anything
/// that does not say so (a read-only folder, an unknown device or folder, gatewayd unreachable)
/// is false: the patch tool is then not offered.
async fn bound_folder_writable(service: &ChatService, caller: &Caller, binding: &Binding) -> bool {
    match service.devices(caller).await {
        Ok(devices) => devices
            .iter()
            .find(|d| d.device_id == binding.device_id)
            .and_then(|d| d.folders.iter().find(|f| f.alias == binding.folder))
            .is_some_and(|f| f.access == FolderAccess::ReadWrite),
        Err(error) => {
            tracing::info!(%error, "the bound folder's access is unknown; no patch tool this turn");
            false
        }
    }
}

fn system_prompt(spec: &TurnSpec, mode: Mode) -> String {
    match (&spec.chat.binding, mode) {
        (Some(binding), Mode::Local { writable }) => format!(
            "You are the coding agent of the project \"{}\". This chat is bound to the folder \
             \"{}\" on the person's computer: use {} there. No other tools exist in this turn.",
            spec.project_name,
            binding.folder,
            if writable {
                "execute_shell_command (cat, ls, sed, builds, tests) and diff_patch_workspace_file"
            } else {
                "execute_shell_command (cat, ls, grep, builds, tests); the folder is shared \
                 read-only, so commands cannot change it and there is no patch tool"
            }
        ),
        _ => format!(
            "You are the coding agent of the project \"{}\". You work on the project's files on \
             the server with read_file, list_files, search_files and write_file.",
            spec.project_name
        ),
    }
}

/// Refuses a local call (or a binding) unless the person's live role on the project authors:
/// running commands and patches on a laptop folder is authoring, whatever a viewer or runner
/// may read.
pub fn require_authoring_role(access: &Access) -> Result<(), ToolError> {
    require_authoring_role_for(access, "running commands or patches in a laptop folder")
}

/// The most recent part of a chat's messages whose JSON fits in `budget` bytes, cut only before a
/// user message, so it starts with one and every tool call keeps its results. The current turn
/// (from the last user message on) is always included, whatever its size.
fn recent_history(messages: &[Value], budget: usize) -> &[Value] {
    let mut size = 0;
    let mut start = None;
    for (index, message) in messages.iter().enumerate().rev() {
        size += message.to_string().len();
        if message["role"] == "user" {
            if start.is_some() && size > budget {
                break;
            }
            start = Some(index);
        }
    }
    &messages[start.unwrap_or(0)..]
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

/// Runs one turn to its end, sending events to `events`. Never panics the caller: every
/// failure becomes an `error` event followed by `end`.
pub async fn run(
    service: ChatService,
    spec: TurnSpec,
    cancel: CancellationToken,
    events: UnboundedSender<Event>,
) {
    let emit = |kind: &'static str, data: Value| {
        // The client may have gone; the turn still runs to its end and is stored.
        let _ = events.send((kind, data));
    };
    let mut usage = Usage::default();
    let reason = match drive(&service, &spec, &cancel, &emit, &mut usage).await {
        Ok(reason) => reason,
        Err(error) => {
            tracing::warn!(chat = %spec.chat.chat_id, turn = spec.turn, code = %error.code, "turn failed: {}", error.message);
            emit(
                "error",
                json!({"code": error.code, "message": error.message}),
            );
            "error"
        }
    };
    emit("end", json!({"reason": reason, "usage": usage}));
}

/// The model loop of one turn, from storing the person's message to the reason it ended;
/// `usage` sums the tokens of its model calls (each also stored as it comes).
async fn drive(
    service: &ChatService,
    spec: &TurnSpec,
    cancel: &CancellationToken,
    emit: &impl Fn(&'static str, Value),
    usage: &mut Usage,
) -> Result<&'static str, ToolError> {
    let chat_id = spec.chat.chat_id.clone();
    let user = user_message(spec);
    service.append(&chat_id, spec.turn, user).await?;
    // The first message sent titles the chat; a later one leaves the title as it is.
    if let Some(title) = crate::chats::title_of(&spec.message) {
        let store = service.chats.clone();
        let id = chat_id.clone();
        blocking(move || store.title_once(&id, &title))
            .await
            .map_err(to_tool)?;
    }
    // Only now: without a model the person's message is kept in the chat (and titles it),
    // so nothing they sent is lost and a later turn, once a model is configured, goes on
    // from it.
    let Some(model) = service.model.clone() else {
        return Err(ToolError::new("model_not_configured", NO_MODEL));
    };
    let mode = match &spec.chat.binding {
        None => Mode::Server,
        Some(binding) => Mode::Local {
            writable: bound_folder_writable(service, &spec.caller, binding).await,
        },
    };
    // A project's MCP connections serve server-mode turns only: a turn bound to a laptop folder
    // gets exactly its local tools (and read_image), never a remote server's. They also need an
    // authoring role, checked there (and at every call).
    let remote = match mode {
        Mode::Server => {
            service
                .connection_tools
                .for_turn(&spec.caller, &spec.chat.project_id)
                .await
        }
        Mode::Local { .. } => TurnConnections::default(),
    };
    for (name, code, message) in &remote.unavailable {
        emit(
            "connection_unavailable",
            json!({"name": name, "code": code, "message": message}),
        );
    }
    let mut tools = mode.tools();
    tools.extend(remote.tools.iter().cloned());
    let toolset = Toolset { mode, remote };
    if spec.attachments.iter().any(|a| a.kind == Kind::Image) {
        tools.push(read_image_tool());
    }
    // The answer's text goes out as it arrives (a `text` event per streamed piece), and is
    // kept so that what the person saw is stored even if the answer never completes.
    let shown = std::sync::Mutex::new(String::new());
    let on_text = |text: &str| {
        shown
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push_str(text);
        emit("text", json!({"text": text}));
    };
    let mut call_index = 0u32;
    for _round in 0..model.max_tool_rounds() {
        let conversation = conversation(service, spec, &toolset, model.max_history_bytes()).await?;
        shown.lock().unwrap_or_else(|e| e.into_inner()).clear();
        // A cancelled turn abandons the model request; the text it had streamed is stored.
        let reply = tokio::select! {
            reply = model.complete(&conversation, &tools, &on_text) => reply,
            _ = cancel.cancelled() => {
                store_unfinished_answer(service, spec, &shown).await?;
                return Ok("cancelled");
            }
        };
        let reply = match reply {
            Ok(reply) => reply,
            Err(error) => {
                store_unfinished_answer(service, spec, &shown).await?;
                return Err(ToolError::new(error.code(), error.to_string()));
            }
        };
        usage.add(reply.usage);
        store_usage(service, &chat_id, spec.turn, reply.usage).await?;
        service
            .append(&chat_id, spec.turn, reply.message.clone())
            .await?;
        if reply.tool_calls.is_empty() {
            return Ok("completed");
        }
        // Images read this round follow all of the round's tool results (a model API wants
        // every result right after the call that asked for it).
        let mut images = Vec::new();
        for call in &reply.tool_calls {
            call_index += 1;
            if let Some(image) =
                answer_call(service, spec, &toolset, call, call_index, cancel, emit).await?
            {
                images.push(image);
            }
        }
        for image in images {
            service.append(&chat_id, spec.turn, image).await?;
        }
        if cancel.is_cancelled() {
            return Ok("cancelled");
        }
    }
    Err(ToolError::new(
        "max_tool_rounds",
        format!(
            "the model still asked for tools after {} rounds; the turn was stopped",
            model.max_tool_rounds()
        ),
    ))
}

/// Stores the text an unfinished answer (cancelled, or failed mid-stream) had already shown,
/// as the model's message of the turn, so a reopened chat shows what the person saw and the
/// model sees it next turn. Nothing is stored when nothing was shown.
async fn store_unfinished_answer(
    service: &ChatService,
    spec: &TurnSpec,
    shown: &std::sync::Mutex<String>,
) -> Result<(), ToolError> {
    let text = std::mem::take(&mut *shown.lock().unwrap_or_else(|e| e.into_inner()));
    if text.is_empty() {
        return Ok(());
    }
    let message = json!({"role": "assistant", "content": text});
    service.append(&spec.chat.chat_id, spec.turn, message).await
}

/// Adds one model call's tokens to the turn's stored usage.
async fn store_usage(
    service: &ChatService,
    chat_id: &str,
    turn: i64,
    usage: Usage,
) -> Result<(), ToolError> {
    let store = service.chats.clone();
    let chat_id = chat_id.to_owned();
    blocking(move || store.add_usage(&chat_id, turn, &usage))
        .await
        .map_err(to_tool)
}

/// What the model gets this round: the system prompt, then the most recent whole turns of
/// the stored chat that fit in `max_history_bytes` (the prompt says how many it does not see).
async fn conversation(
    service: &ChatService,
    spec: &TurnSpec,
    toolset: &Toolset,
    max_history_bytes: usize,
) -> Result<Vec<Value>, ToolError> {
    let stored = service.messages(&spec.chat.chat_id).await?;
    let (turns, history): (Vec<i64>, Vec<Value>) =
        stored.into_iter().map(|m| (m.turn, m.message)).unzip();
    // The budget counts messages as stored: attachments are expanded only in what is sent.
    let recent = recent_history(&history, max_history_bytes);
    let omitted = history.len() - recent.len();
    let mut system = system_prompt(spec, toolset.mode);
    if let Some(note) = toolset.remote.prompt_note() {
        system.push_str(&note);
    }
    if omitted > 0 {
        system.push_str(&format!(
            " The {omitted} earliest messages of this chat are not shown (history limit)."
        ));
    }
    let mut conversation = vec![json!({"role": "system", "content": system})];
    for (message, &turn) in recent.iter().zip(&turns[omitted..]) {
        let message = expand_attachments(service, spec, turn, message.clone()).await?;
        conversation.push(if turn == spec.turn {
            with_images(service, spec, message).await?
        } else {
            without_images(message)
        });
    }
    Ok(conversation)
}

/// Runs the turn's `call_index`-th tool call (or answers "not run" once the turn is
/// cancelled), stores its result and emits `tool_call` and `tool_result`. Every call the
/// model asked for gets a result in the history, even when cancelled.
async fn answer_call(
    service: &ChatService,
    spec: &TurnSpec,
    toolset: &Toolset,
    call: &ToolCall,
    call_index: u32,
    cancel: &CancellationToken,
    emit: &impl Fn(&'static str, Value),
) -> Result<Option<Value>, ToolError> {
    let chat_id = &spec.chat.chat_id;
    let arguments: Value =
        serde_json::from_str(&call.arguments).unwrap_or(Value::String(call.arguments.clone()));
    emit(
        "tool_call",
        json!({"id": call.id, "name": call.name, "arguments": arguments}),
    );
    let request_id = format!("chat-{chat_id}-turn-{}-call-{call_index}", spec.turn);
    let result = if cancel.is_cancelled() {
        Err(ToolError::new(
            "cancelled",
            "not run: the turn was cancelled",
        ))
    } else {
        execute(service, spec, toolset, call, &request_id, cancel).await
    };
    let (event, content) = tool_result(call, &result);
    service
        .append(
            chat_id,
            spec.turn,
            json!({"role": "tool", "tool_call_id": call.id, "content": content.to_string()}),
        )
        .await?;
    emit("tool_result", event);
    Ok(match &result {
        Ok(value) if call.name == "read_image" => value["attachment_id"].as_str().map(|id| {
            json!({"role": "user", "content": [
                {"type": "text", "text": format!("The image {} (read_image):", value["name"])},
                {"type": "image_url", "image_url": {"url": format!("{IMAGE_REFERENCE}{id}")}},
            ]})
        }),
        _ => None,
    })
}

/// The person's message as stored: the text and, when it carries any, its attachments as
/// listed (the console shows them; the model gets them through [`expand_attachments`]).
fn user_message(spec: &TurnSpec) -> Value {
    let mut message = json!({"role": "user", "content": spec.message});
    if !spec.attachments.is_empty() {
        message["attachments"] = json!(spec.attachments);
    }
    message
}

/// A stored person's message as the model sees it: the text, then each text attachment's
/// bounded preview, and a line per image (naming it for `read_image` in its own turn). The
/// `attachments` field is ours, never sent to the model.
async fn expand_attachments(
    service: &ChatService,
    spec: &TurnSpec,
    turn: i64,
    mut message: Value,
) -> Result<Value, ToolError> {
    let Some(listed) = message
        .as_object_mut()
        .and_then(|m| m.remove("attachments"))
    else {
        return Ok(message);
    };
    let listed: Vec<AttachmentInfo> = serde_json::from_value(listed).unwrap_or_default();
    let mut content = message["content"].as_str().unwrap_or_default().to_owned();
    for attachment in &listed {
        content.push_str("\n\n");
        match attachment.kind {
            Kind::Text => {
                let (info, bytes) =
                    read_attachment(service, &spec.chat.chat_id, turn, &attachment.attachment_id)
                        .await
                        .map_err(to_tool)?;
                content.push_str(&text_preview(&info, &bytes));
            }
            Kind::Image if turn == spec.turn => content.push_str(&format!(
                "[attached image {:?}, {}, {} bytes: call read_image with this name to see it]",
                attachment.name, attachment.media_type, attachment.size
            )),
            Kind::Image => content.push_str(&format!(
                "[an image {:?} was attached to this earlier message]",
                attachment.name
            )),
        }
    }
    message["content"] = json!(content);
    Ok(message)
}

async fn read_attachment(
    service: &ChatService,
    chat_id: &str,
    turn: i64,
    id_or_name: &str,
) -> Result<(AttachmentInfo, Vec<u8>), Refusal> {
    let store = service.attachments.clone();
    let (chat_id, key) = (chat_id.to_owned(), id_or_name.to_owned());
    blocking(move || store.read_for_turn(&chat_id, turn, &key)).await
}

/// `read_image {name}`: one of this turn's image attachments, by name or id. Its bytes are not
/// in the result: the loop adds them as the next message.
async fn read_image(
    service: &ChatService,
    spec: &TurnSpec,
    call: &ToolCall,
) -> Result<Value, ToolError> {
    let args = arguments(call, &["name"])?;
    let name = string(&args, "name")?;
    let listed: Vec<&str> = spec
        .attachments
        .iter()
        .filter(|a| a.kind == Kind::Image)
        .map(|a| a.name.as_str())
        .collect();
    let not_here = || {
        ToolError::new(
            "attachment_not_found",
            format!(
                "this message has no attached image {name:?}; its images are {}",
                listed.join(", ")
            ),
        )
    };
    let (info, _) = read_attachment(service, &spec.chat.chat_id, spec.turn, &name)
        .await
        .map_err(|_| not_here())?;
    if info.kind != Kind::Image {
        return Err(not_here());
    }
    Ok(
        json!({"attachment_id": info.attachment_id, "name": info.name,
              "media_type": info.media_type, "size": info.size,
              "shown": "the image follows as the next message"}),
    )
}

/// A stored message with its image references of this turn replaced by the images as data URLs.
async fn with_images(
    service: &ChatService,
    spec: &TurnSpec,
    mut message: Value,
) -> Result<Value, ToolError> {
    use base64::Engine as _;
    let Some(parts) = message["content"].as_array_mut() else {
        return Ok(message);
    };
    for part in parts {
        let Some(id) = part["image_url"]["url"]
            .as_str()
            .and_then(|url| url.strip_prefix(IMAGE_REFERENCE))
            .map(str::to_owned)
        else {
            continue;
        };
        let (info, bytes) = read_attachment(service, &spec.chat.chat_id, spec.turn, &id)
            .await
            .map_err(to_tool)?;
        let encoded = base64::engine::general_purpose::STANDARD.encode(bytes);
        part["image_url"]["url"] = json!(format!("data:{};base64,{encoded}", info.media_type));
    }
    Ok(message)
}

/// A stored message of an earlier turn with its images replaced by a line saying they were
/// shown (the model sees an image only in the turn it was attached to).
fn without_images(mut message: Value) -> Value {
    if let Some(parts) = message["content"].as_array_mut() {
        for part in parts {
            if part["type"] == "image_url" {
                *part = json!({"type": "text", "text": "[an attached image was shown here in an earlier turn]"});
            }
        }
    }
    message
}

/// A call's result as the `tool_result` event and as the content of the stored tool message;
/// the event's `state` and `summary` are [`call_state`] of that content.
fn tool_result(call: &ToolCall, result: &Result<Value, ToolError>) -> (Value, Value) {
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

/// The arguments as an object with only `allowed` keys.
fn arguments(call: &ToolCall, allowed: &[&str]) -> Result<Map<String, Value>, ToolError> {
    let Ok(Value::Object(map)) = serde_json::from_str::<Value>(&call.arguments) else {
        return Err(ToolError::new(
            "invalid_arguments",
            "the arguments must be a JSON object",
        ));
    };
    if let Some(unknown) = map.keys().find(|k| !allowed.contains(&k.as_str())) {
        return Err(ToolError::new(
            "invalid_arguments",
            format!(
                "unknown argument {unknown:?}; {} takes only {}",
                call.name,
                allowed.join(", ")
            ),
        ));
    }
    Ok(map)
}

fn string(map: &Map<String, Value>, name: &str) -> Result<String, ToolError> {
    map.get(name)
        .and_then(Value::as_str)
        .map(str::to_owned)
        .ok_or_else(|| {
            ToolError::new(
                "invalid_arguments",
                format!("the argument {name:?} (a string) is required"),
            )
        })
}

fn unknown_tool(name: &str, mode: Mode) -> ToolError {
    let available = match mode {
        Mode::Local { writable: true } => "execute_shell_command and diff_patch_workspace_file",
        Mode::Local { writable: false } => {
            "execute_shell_command (the folder is shared read-only: no patches)"
        }
        Mode::Server => "read_file, list_files, search_files and write_file",
    };
    ToolError::new(
        "unknown_tool",
        format!("there is no tool {name:?} in this turn; the tools are {available}"),
    )
}

/// Runs one tool call of the turn, after re-checking the turn is still current.
async fn execute(
    service: &ChatService,
    spec: &TurnSpec,
    toolset: &Toolset,
    call: &ToolCall,
    request_id: &str,
    cancel: &CancellationToken,
) -> Result<Value, ToolError> {
    // Retained state, re-checked on every call.
    service
        .check_current(&spec.chat.chat_id, spec.turn, spec.chat.binding_generation)
        .await?;
    if call.name == "read_image" && spec.attachments.iter().any(|a| a.kind == Kind::Image) {
        return read_image(service, spec, call).await;
    }
    match &spec.chat.binding {
        None if toolset.remote.offers(&call.name) => {
            let arguments = serde_json::from_str(&call.arguments).map_err(|e| {
                ToolError::new(
                    "invalid_arguments",
                    format!("the arguments are not JSON: {e}"),
                )
            })?;
            service
                .connection_tools
                .call(
                    &toolset.remote,
                    &spec.caller,
                    &spec.chat.project_id,
                    &call.name,
                    arguments,
                )
                .await
        }
        None => execute_on_server(service, spec, toolset.mode, call, request_id).await,
        Some(binding) => {
            let operation = local_operation(call, toolset.mode)?;
            execute_on_device(service, spec, binding, operation, request_id, cancel).await
        }
    }
}

/// A server-mode call: one of the four file tools, always on the chat's project, a write
/// with the request id made here (never the model's).
async fn execute_on_server(
    service: &ChatService,
    spec: &TurnSpec,
    mode: Mode,
    call: &ToolCall,
    request_id: &str,
) -> Result<Value, ToolError> {
    let caller = &spec.caller;
    let files = &service.files;
    let project = json!(spec.chat.project_id);
    let source = Source::Agent;
    match call.name.as_str() {
        "read_file" => {
            let mut args = arguments(call, &["path"])?;
            args.insert("workflow_id".into(), project);
            files.read_file(caller, &args, source).await
        }
        "list_files" => {
            let mut args = arguments(call, &["path"])?;
            args.insert("workflow_id".into(), project);
            files.list_files(caller, &args, source).await
        }
        "search_files" => {
            let mut args = arguments(call, &["query", "path"])?;
            args.insert("workflow_id".into(), project);
            files.search_files(caller, &args, source).await
        }
        "write_file" => {
            let mut args = arguments(call, &["path", "content", "expected_revision"])?;
            args.insert("workflow_id".into(), project);
            args.insert("request_id".into(), json!(request_id));
            files.write_file(caller, &args, source).await
        }
        other => Err(unknown_tool(other, mode)),
    }
}

/// The operation a bound turn's call asks the device for: the shell, or a patch when the
/// folder is writable; any other name is an unknown tool.
fn local_operation(call: &ToolCall, mode: Mode) -> Result<Operation, ToolError> {
    Ok(match call.name.as_str() {
        "execute_shell_command" => {
            let args = arguments(call, &["command", "timeout"])?;
            let timeout = match args.get("timeout") {
                None | Some(Value::Null) => None,
                Some(v) => Some(v.as_u64().ok_or_else(|| {
                    ToolError::new(
                        "invalid_arguments",
                        "timeout must be a whole number of seconds (1 to 300)",
                    )
                })?),
            };
            Operation::ExecuteShellCommand {
                command: string(&args, "command")?,
                timeout,
            }
        }
        "diff_patch_workspace_file" if mode == (Mode::Local { writable: true }) => {
            let args = arguments(call, &["filepath", "diff"])?;
            Operation::DiffPatchWorkspaceFile {
                filepath: string(&args, "filepath")?,
                diff: string(&args, "diff")?,
            }
        }
        other => return Err(unknown_tool(other, mode)),
    })
}

/// Sends `operation` to the bound device once the person's live authority allows it, and
/// answers its result; a cancel meanwhile is passed on to the device.
async fn execute_on_device(
    service: &ChatService,
    spec: &TurnSpec,
    binding: &Binding,
    operation: Operation,
    request_id: &str,
    cancel: &CancellationToken,
) -> Result<Value, ToolError> {
    let caller = &spec.caller;
    // The person's live authority on the project, now (revoked token, removed member,
    // a role lowered to runner or viewer).
    let (_, access) = service.files.access(caller, &spec.chat.project_id).await?;
    require_authoring_role(&access)?;
    // A cancel while the device runs the call asks it to stop (the executor kills the
    // process group) and waits for the result, which says `cancelled`.
    let call = dispatch(service, caller, binding, request_id, operation, cancel);
    tokio::pin!(call);
    tokio::select! {
        result = &mut call => return result,
        _ = cancel.cancelled() => {}
    }
    loop {
        tokio::select! {
            result = &mut call => return result,
            asked = ask_device_to_cancel(service, caller, request_id) => {
                if asked {
                    return call.await;
                }
                tokio::time::sleep(CANCEL_RETRY).await;
            }
        }
    }
}

/// How soon a cancel is asked again when gatewayd did not yet know the request.
const CANCEL_RETRY: Duration = Duration::from_millis(100);

/// `POST /v1/cancel` on gatewayd: true once a cancel frame went to the device, or the request is
/// no longer pending (nothing left to stop).
async fn ask_device_to_cancel(service: &ChatService, caller: &Caller, request_id: &str) -> bool {
    let reference = RequestRef {
        user_id: caller.user_id.clone(),
        request_id: request_id.to_owned(),
    };
    match service
        .gatewayd
        .post::<_, CancelResponse>("/v1/cancel", &reference)
        .await
    {
        Ok(answer) => answer.cancel_sent || answer.state != DispatchState::Pending,
        // Not dispatched yet (404), or gatewayd unreachable: ask again shortly.
        Err(error) => {
            tracing::debug!(%error, request_id, "cancel not delivered yet");
            false
        }
    }
}

/// Whether a failed exchange with gatewayd may have reached it: anything but "could not
/// connect" or "could not build the request". gatewayd's own refusals come before it sends,
/// except `internal`.
fn may_have_been_sent(error: &ClientError) -> bool {
    match error {
        ClientError::Connect { .. } | ClientError::Request { .. } | ClientError::Encode { .. } => {
            false
        }
        ClientError::Remote { body, .. } => body.code == "internal",
        ClientError::Http { .. }
        | ClientError::Decode { .. }
        | ClientError::Unexpected { .. }
        | ClientError::Elsewhere { .. } => true,
    }
}

/// The first and the longest pause between two recovery questions to gatewayd.
const RECOVERY_PAUSE_MIN: Duration = Duration::from_millis(250);
const RECOVERY_PAUSE_MAX: Duration = Duration::from_secs(2);

/// The dispatch's answer was lost after it may have reached gatewayd: asks gatewayd to recover
/// it (its record, or the device's receipt) until `deadline`. Returns the real state, or an
/// error that says the outcome is unknown (or, when gatewayd never recorded it, that it was
/// never sent). Never re-sends the request.
async fn recover(
    service: &ChatService,
    request: &DispatchRequest,
    deadline: tokio::time::Instant,
    cancel: &CancellationToken,
    lost: ClientError,
) -> Result<DispatchState, ToolError> {
    tracing::warn!(error = %lost, request_id = %request.request_id, "the dispatch's answer was lost; recovering it");
    let unknown = |why: &str| {
        let mut error = ToolError::new(
            "outcome_unknown",
            format!(
                "the device gateway failed after the request was sent ({lost}); {why}: whether it ran on the device is unknown and it is not re-sent; inspect the files before trying again"
            ),
        );
        error
            .details
            .insert("request_id".into(), json!(request.request_id));
        error
    };
    let mut pause = RECOVERY_PAUSE_MIN;
    loop {
        let last = match service
            .gatewayd
            .post::<_, Recovery>("/v1/recover", request)
            .await
        {
            Ok(Recovery::Settled {
                state,
                from_receipt,
            }) => {
                tracing::info!(request_id = %request.request_id, from_receipt, "a lost dispatch answer was recovered");
                return Ok(state);
            }
            Ok(Recovery::NeverSent) => {
                let mut error = ToolError::new(
                    "not_run",
                    "the device gateway failed before it recorded the request, so it was never sent to the device (and never will be under this request id); it did not run",
                );
                error
                    .details
                    .insert("request_id".into(), json!(request.request_id));
                return Err(error);
            }
            Ok(Recovery::Unsettled { reason }) => reason,
            Err(ClientError::Remote { body, .. }) if body.code == "request_id_reused" => {
                return Err(ToolError {
                    code: body.code,
                    message: body.message,
                    details: body.details,
                });
            }
            Err(error) => format!("gatewayd cannot be asked ({error})"),
        };
        if tokio::time::Instant::now() + pause >= deadline {
            return Err(unknown(&format!(
                "it could not be recovered before the request's deadline ({last})"
            )));
        }
        tokio::select! {
            () = tokio::time::sleep(pause) => {}
            () = cancel.cancelled() => {
                return Err(unknown(&format!("the turn was cancelled while it was being recovered ({last})")));
            }
        }
        pause = (pause * 2).min(RECOVERY_PAUSE_MAX);
    }
}

async fn dispatch(
    service: &ChatService,
    caller: &Caller,
    binding: &Binding,
    request_id: &str,
    operation: Operation,
    cancel: &CancellationToken,
) -> Result<Value, ToolError> {
    // The same deadline gatewayd keeps for the result; a lost answer is recovered until then.
    let deadline = tokio::time::Instant::now() + operation.deadline();
    // Said with a timed-out result, so its summary can name the limit it hit.
    let timeout_secs = match &operation {
        Operation::ExecuteShellCommand { timeout, .. } => timeout.unwrap_or(DEFAULT_TIMEOUT_SECS),
        Operation::DiffPatchWorkspaceFile { .. } => 0,
    };
    let request = DispatchRequest {
        user_id: caller.user_id.clone(),
        device_id: binding.device_id.clone(),
        folder: binding.folder.clone(),
        request_id: request_id.to_owned(),
        operation,
    };
    let state: DispatchState = match service.gatewayd.dispatch(&request).await {
        Ok(state) => state,
        Err(lost) if may_have_been_sent(&lost) => {
            recover(service, &request, deadline, cancel, lost).await?
        }
        Err(ClientError::Remote { body, .. }) => {
            return Err(ToolError {
                code: body.code,
                message: body.message,
                details: body.details,
            });
        }
        Err(other) => {
            return Err(ToolError::new(
                "gateway_unavailable",
                format!(
                    "the device gateway is not reachable ({other}); the call was not sent, so it was not run anywhere"
                ),
            ));
        }
    };
    let with_id = |mut error: ToolError| {
        error.details.insert("request_id".into(), json!(request_id));
        error
    };
    match state {
        DispatchState::Done { outcome } => match outcome {
            Outcome::Completed {
                stdout,
                stderr,
                exit_code,
                stdout_truncated,
                stderr_truncated,
                timed_out,
                cancelled,
                undone,
            } => {
                let mut result = json!({
                    "stdout": stdout, "stderr": stderr, "exit_code": exit_code,
                    "stdout_truncated": stdout_truncated, "stderr_truncated": stderr_truncated,
                    "timed_out": timed_out, "cancelled": cancelled, "request_id": request_id,
                });
                if timed_out {
                    result["timeout_secs"] = json!(timeout_secs);
                }
                // The laptop put back what the command changed in the project config that
                // makes the person's tools run programs: the model and the person see it.
                if !undone.is_empty() {
                    result["undone"] = json!(undone);
                }
                Ok(result)
            }
            Outcome::Patched { files } => Ok(json!({"files": files, "request_id": request_id})),
            Outcome::Refused { code, message } => Err(with_id(ToolError::new(code, message))),
            Outcome::Interrupted { message } => Err(with_id(ToolError::new(
                "interrupted",
                format!("{message}; inspect the files before trying again"),
            ))),
        },
        DispatchState::Pending => Err(with_id(ToolError::new(
            "outcome_unknown",
            "the request is still running on the device; inspect the files before trying again",
        ))),
        DispatchState::Unknown { reason } => Err(with_id(ToolError::new(
            "outcome_unknown",
            format!("{reason}; inspect the files before trying again"),
        ))),
    }
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
            names(&server_tools()),
            ["read_file", "list_files", "search_files", "write_file"]
        );
        assert_eq!(
            names(&local_tools(true)),
            ["execute_shell_command", "diff_patch_workspace_file"]
        );
        assert_eq!(names(&local_tools(false)), ["execute_shell_command"]);
        // Nothing in a local schema names a device, folder or project.
        let text = serde_json::to_string(&local_tools(true)).unwrap();
        for word in ["device", "\"folder\"", "workflow_id", "request_id"] {
            assert!(!text.contains(word), "{word}");
        }
        let text = serde_json::to_string(&server_tools()).unwrap();
        assert!(!text.contains("workflow_id") && !text.contains("request_id"));
    }

    #[test]
    fn history_is_cut_before_a_user_message_and_keeps_the_current_turn() {
        let user = |t: &str| json!({"role": "user", "content": t});
        let call = json!({"role": "assistant", "content": null, "tool_calls": [{"id": "c"}]});
        let result = json!({"role": "tool", "tool_call_id": "c", "content": "x".repeat(100)});
        let messages = vec![
            user("first"),
            call.clone(),
            result.clone(),
            user("second"),
            call.clone(),
            result.clone(),
            user("third"),
        ];
        let size =
            |from: usize| -> usize { messages[from..].iter().map(|m| m.to_string().len()).sum() };
        // Everything fits: everything is sent.
        assert_eq!(recent_history(&messages, size(0)).len(), 7);
        // One byte short of everything: the first turn goes, whole.
        assert_eq!(recent_history(&messages, size(0) - 1), &messages[3..]);
        // Room for less than the second turn: only the current one.
        assert_eq!(recent_history(&messages, size(3) - 1), &messages[6..]);
        // The current turn is sent even when it alone is over the budget.
        assert_eq!(recent_history(&messages, 1), &messages[6..]);
        // A current turn already in its tool rounds keeps its calls and results.
        let mut running = messages.clone();
        running.extend([call.clone(), result.clone()]);
        assert_eq!(recent_history(&running, 1), &running[6..]);
        assert!(recent_history(&[], 10).is_empty());
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

    #[test]
    fn arguments_refuse_unknown_keys() {
        let call = |args: &str| ToolCall {
            id: "c".into(),
            name: "execute_shell_command".into(),
            arguments: args.into(),
        };
        assert!(arguments(&call(r#"{"command":"ls"}"#), &["command", "timeout"]).is_ok());
        let err =
            arguments(&call(r#"{"command":"ls","device_id":"d"}"#), &["command"]).unwrap_err();
        assert_eq!(err.code, "invalid_arguments");
        assert!(arguments(&call("[1]"), &["command"]).is_err());
    }
}
