//! The coding-CLI agent: a [`Driver`] that asks runnerd to run the turn (`runnerd.sock`, or the
//! runnerd of the project's host over NATS in a cluster:
//! `POST /v1/turns`) and turns runnerd's stream into the turn's events.
//!
//! At the turn's start it resolves the person's live access to the project, as every file tool
//! does ([`crate::catalog::files::FileTools::access`]): the guard runnerd gets is that resolved
//! guard (Builder's write grants), and a Builder chat needs an authoring role at every turn, not
//! only when it was created. A chat bound to a laptop folder runs its CLI with no project at
//! all and its native tools off (runnerd's side); the bridge's shell and patch calls come back
//! here and go to the bound device through the turn's one executor, as the model loop's do.
//! The CLI session the chat's last turn recorded is resumed, with the session key it was
//! recorded under; runnerd resumes it only under the same key.
//!
//! runnerd's events become the ones the console already renders ([`Relay`]): `text` as `text`;
//! the CLI's own tool calls as `tool_call` and `tool_result` (a one-line command, its exit and
//! its bounded output, with the state and summary every tool result gets); `usage` (the turn's
//! running total) counted into the turn's usage and stored, so the Costs tab shows it; `error` as
//! the turn's error with runnerd's code and sentence. What the chat keeps is stored as the model
//! loop stores it: the CLI's text as the assistant's messages, its tool calls and their results.
//!
//! Cancel calls runnerd's cancel for the turn and waits a moment for its end. A runnerd that is
//! not running fails the turn at once with a sentence; a stream that ends before the turn did
//! is an error too: a turn never hangs on a runnerd that went away.
//!
//! The bridge offers the CLI, besides its two built-in tools, the project's MCP connections'
//! tools that the turn's [`Toolset`](crate::chat::tools::Toolset) offers (an authoring role in
//! server mode; none otherwise), passed to runnerd in the turn request. A call of the CLI's
//! bridge that runnerd hands over (`bridge_call`) runs here, as the model loop's tool of that
//! name would: a patch through workspaced's guarded patch with the person's live authority and
//! a request id made here; a connection's tool through the turn's one executor
//! ([`Toolset::execute`](crate::chat::tools::Toolset::execute), which re-checks the turn and the
//! person's role); anything else is refused. Each is shown and stored like every tool call, its
//! answer posted back to runnerd.
//!
//! May call: the chat service (its stores, the person's access, runnerd's client), the tools'
//! result rule ([`tool_result`]) and the server file tools' bridge patch. The CLI's own tools
//! run in runnerd's sandbox.

use super::driver::{Driver, Event, Turn};
use crate::catalog::files::require_authoring_role_for;
use crate::chat::attachments::{Kind, text_preview};
use crate::chat::model::{MAX_REPORTED_TOKENS, ToolCall, Usage};
use crate::chat::service::{blocking, to_tool};
use crate::chat::store::{CliSession, Mode};
use crate::chat::tools::Mode as ToolMode;
use crate::chat::tools::executor::tool_result;
use crate::chat::tools::images::read_attachment;
use crate::clients::runnerd::{RunnerdClient, RunnerdError, TurnStream};
use crate::mcp::ToolError;
use agentworks_contract::runnerd::{
    BridgeAnswer, BridgeError, BridgeTool, LaptopFolder, Resume, TurnEvent, TurnRequest, codes,
};
use serde_json::{Value, json};
use std::collections::HashMap;
use std::time::Duration;

/// How long a cancelled turn waits for runnerd's last events before it ends anyway.
const CANCEL_GRACE: Duration = Duration::from_secs(10);

/// The coding CLI a chat's agent names, run by runnerd.
pub struct CliAgent {
    runnerd: RunnerdClient,
}

impl CliAgent {
    /// The driver of a CLI chat's turn; without runnerd, the turn fails with the sentence
    /// saying how to start it.
    pub fn configured(service: &crate::chat::service::ChatService) -> Result<CliAgent, ToolError> {
        match service.runnerd.clone() {
            Some(runnerd) => Ok(CliAgent { runnerd }),
            None => Err(ToolError::new(
                "runnerd_not_running",
                crate::clients::runnerd::NOT_RUNNING,
            )),
        }
    }
}

fn from_runnerd(error: RunnerdError) -> ToolError {
    ToolError::new(error.code(), error.to_string())
}

impl Driver for CliAgent {
    async fn drive(&self, turn: &Turn<'_>, usage: &mut Usage) -> Result<&'static str, ToolError> {
        let (service, spec) = (turn.service, turn.spec);
        let chat = &spec.chat;
        // The person's live access now: the guard runnerd applies, and the role Builder needs.
        let (project, access) = service.files.access(&spec.caller, &chat.project_id).await?;
        if chat.mode == Mode::Builder {
            require_authoring_role_for(
                &access,
                "a Builder turn (the coding CLI writes the project)",
            )?;
        }
        let request = TurnRequest {
            chat_id: chat.chat_id.clone(),
            user_id: spec.caller.user_id.clone(),
            project: project.folder,
            provider: chat.agent.clone(),
            mode: chat.mode,
            guard: access.guard,
            prompt: prompt(turn).await?,
            resume: chat.cli_session.clone().map(|s| Resume {
                session_id: s.session_id,
                session_key: s.session_key,
            }),
            tools: bridge_tools(turn.tools.connection_definitions()),
            // Bound: the CLI's hands are the laptop's (the patch tool as the device shared the
            // folder when the turn's tools were fixed); every call is checked again here.
            laptop: match turn.tools.mode() {
                ToolMode::Local { writable } => Some(LaptopFolder { writable }),
                ToolMode::Server => None,
            },
        };
        // The turn's start, cancel and bridge answers go to the runnerd of the project's host.
        let on_project = CliAgent {
            runnerd: self.runnerd.on_project(&request.project),
        };
        let mut stream = on_project
            .runnerd
            .start_turn(&request)
            .await
            .map_err(from_runnerd)?;
        let mut relay = Relay {
            laptop: chat.binding.is_some(),
            ..Relay::default()
        };
        let ended = on_project.relay(turn, &mut stream, &mut relay, usage).await;
        // Whatever ended the turn, what the person saw is kept.
        for message in relay.finish() {
            service.append(&chat.chat_id, spec.turn, message).await?;
        }
        ended
    }
}

impl CliAgent {
    /// Reads runnerd's stream to the turn's end, emitting and storing as it goes.
    async fn relay(
        &self,
        turn: &Turn<'_>,
        stream: &mut TurnStream,
        relay: &mut Relay,
        usage: &mut Usage,
    ) -> Result<&'static str, ToolError> {
        let (service, spec) = (turn.service, turn.spec);
        let chat_id = &spec.chat.chat_id;
        let mut cancel_sent = false;
        let mut grace: Option<tokio::time::Instant> = None;
        loop {
            // Once cancelled and runnerd knows the turn's id, it is told (once).
            if turn.cancel.is_cancelled() && !cancel_sent {
                if let Some(turn_id) = relay.turn_id.clone() {
                    cancel_sent = true;
                    if let Err(error) = self.runnerd.cancel(&turn_id).await {
                        tracing::warn!(chat = %chat_id, turn_id, %error, "runnerd did not take the cancel");
                    }
                }
                grace.get_or_insert_with(|| tokio::time::Instant::now() + CANCEL_GRACE);
            }
            let next = tokio::select! {
                next = stream.next() => next,
                _ = turn.cancel.cancelled(), if grace.is_none() => continue,
                _ = sleep_until(grace), if grace.is_some() => return Ok("cancelled"),
            };
            let event = match next {
                Ok(Some(event)) => event,
                Ok(None) if grace.is_some() => return Ok("cancelled"),
                Ok(None) => {
                    return Err(ToolError::new(
                        "runnerd_failed",
                        "runnerd's stream ended before the turn did (did agentworks-runnerd stop?)",
                    ));
                }
                Err(error) => {
                    if let Some(turn_id) = relay.turn_id.clone() {
                        let _ = self.runnerd.cancel(&turn_id).await;
                    }
                    return Err(from_runnerd(error));
                }
            };
            let step = relay.on(event, grace.is_some());
            for (kind, data) in step.emit {
                turn.events.emit(kind, data);
            }
            for message in step.store {
                service.append(chat_id, spec.turn, message).await?;
            }
            if let Some(session) = step.session {
                let store = service.chats.clone();
                let id = chat_id.clone();
                blocking(move || store.set_cli_session(&id, &session))
                    .await
                    .map_err(to_tool)?;
            }
            if let Some(used) = step.usage {
                usage.add(used);
                let store = service.chats.clone();
                let (id, number) = (chat_id.clone(), spec.turn);
                blocking(move || store.add_usage(&id, number, &used))
                    .await
                    .map_err(to_tool)?;
            }
            if let Some((call_id, tool, arguments)) = step.bridge {
                self.bridge_call(turn, relay, &call_id, &tool, &arguments)
                    .await?;
            }
            if let Some(end) = step.end {
                return end;
            }
        }
    }

    /// Runs one call of the CLI's bridge that runnerd handed over (a patch, through
    /// workspaced's guarded patch with the person's live authority and a request id made here;
    /// a connection's tool the turn offers, through the turn's one executor),
    /// shows and stores its result as the model loop's, and answers runnerd. A cancel ends the
    /// wait for it; runnerd's wait ends with the turn.
    async fn bridge_call(
        &self,
        turn: &Turn<'_>,
        relay: &Relay,
        call_id: &str,
        tool: &str,
        arguments: &Value,
    ) -> Result<(), ToolError> {
        let (service, spec) = (turn.service, turn.spec);
        let chat = &spec.chat;
        let safe_id: String = call_id
            .chars()
            .filter(|c| c.is_ascii_alphanumeric() || *c == '-' || *c == '_')
            .take(64)
            .collect();
        let request_id = format!("chat-{}-turn-{}-bridge-{safe_id}", chat.chat_id, spec.turn);
        // Through the turn's one executor, as the model loop calls it (it re-checks the turn
        // is current and the person's role): bound to a laptop folder, both bridge tools go to
        // the device through gatewayd (the patch tool only on a writable folder; never resent,
        // the outcome recovered; `device_offline` with no fallback to the server); in server
        // mode, a connection's tool the turn offers.
        let through_executor = match chat.binding {
            Some(_) => matches!(tool, "execute_shell_command" | "diff_patch_workspace_file"),
            None => turn.tools.offers_connection_tool(tool),
        };
        let run = async {
            match tool {
                _ if through_executor => {
                    let call = ToolCall {
                        id: call_id.to_owned(),
                        name: tool.to_owned(),
                        arguments: arguments.to_string(),
                    };
                    turn.tools
                        .execute(service, &call, &request_id, turn.cancel)
                        .await
                }
                _ if chat.binding.is_some() => Err(ToolError::new(
                    "unknown_tool",
                    format!("a chat bound to a laptop folder has no bridge tool {tool:?}"),
                )),
                "diff_patch_workspace_file" if chat.mode == Mode::Builder => {
                    crate::chat::tools::server_files::bridge_patch(
                        &service.files,
                        &spec.caller,
                        &chat.project_id,
                        arguments,
                        &request_id,
                    )
                    .await
                }
                "diff_patch_workspace_file" => Err(ToolError::new(
                    "read_only_chat",
                    "this chat runs in Run mode: the project is read-only",
                )),
                other => Err(ToolError::new(
                    "unknown_tool",
                    format!("agentd runs no bridge tool named {other:?} for a coding CLI"),
                )),
            }
        };
        let result = tokio::select! {
            result = run => result,
            _ = turn.cancel.cancelled() => Err(ToolError::new("cancelled", "the turn was stopped")),
        };
        let call = ToolCall {
            id: call_id.to_owned(),
            name: tool.to_owned(),
            arguments: arguments.to_string(),
        };
        let (event, content) = tool_result(&call, &result);
        turn.events.emit("tool_result", event);
        service
            .append(
                &chat.chat_id,
                spec.turn,
                json!({"role": "tool", "tool_call_id": call_id, "content": content.to_string()}),
            )
            .await?;
        let answer = match result {
            Ok(value) => BridgeAnswer {
                ok: true,
                result: Some(value),
                error: None,
            },
            Err(error) => BridgeAnswer {
                ok: false,
                result: None,
                error: Some(BridgeError {
                    code: error.code,
                    message: error.message,
                }),
            },
        };
        if let Some(turn_id) = &relay.turn_id
            && let Err(error) = self.runnerd.answer_bridge(turn_id, call_id, &answer).await
        {
            tracing::warn!(chat = %chat.chat_id, call_id, %error, "runnerd did not take a bridge answer");
        }
        Ok(())
    }
}

/// The connections' tools the turn offers (model API function tools) as the bridge's extra
/// tools: name, description and argument schema, unchanged.
fn bridge_tools(definitions: &[Value]) -> Vec<BridgeTool> {
    definitions
        .iter()
        .filter_map(|tool| {
            let function = &tool["function"];
            Some(BridgeTool {
                name: function["name"].as_str()?.to_owned(),
                description: function["description"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned(),
                input_schema: match &function["parameters"] {
                    Value::Object(schema) => Value::Object(schema.clone()),
                    _ => json!({"type": "object"}),
                },
            })
        })
        .collect()
}

async fn sleep_until(deadline: Option<tokio::time::Instant>) {
    match deadline {
        Some(deadline) => tokio::time::sleep_until(deadline).await,
        None => std::future::pending().await,
    }
}

/// What the CLI is asked: the person's message, then each text attachment's bounded preview
/// (read from the server's uploads); an image is named, not shown (a CLI gets no images yet).
async fn prompt(turn: &Turn<'_>) -> Result<String, ToolError> {
    let (service, spec) = (turn.service, turn.spec);
    let mut prompt = spec.message.clone();
    for attachment in &spec.attachments {
        prompt.push_str("\n\n");
        match attachment.kind {
            Kind::Text => {
                let (info, bytes) = read_attachment(
                    service,
                    &spec.chat.chat_id,
                    spec.turn,
                    &attachment.attachment_id,
                )
                .await
                .map_err(to_tool)?;
                prompt.push_str(&text_preview(&info, &bytes));
            }
            Kind::Image => prompt.push_str(&format!(
                "[an image {:?} was attached; a coding CLI chat does not get images yet]",
                attachment.name
            )),
        }
    }
    Ok(prompt)
}

/// runnerd's events of one turn, turned into the turn's events and the chat's messages.
#[derive(Default)]
struct Relay {
    /// runnerd's id of the turn (for cancel), from `started`.
    turn_id: Option<String>,
    /// The session key of the turn's runtime, from `started`: a `session` is recorded under it.
    session_key: Option<String>,
    /// Text shown since the last stored message.
    text: String,
    /// The calls that began, by id: their tool and command.
    calls: HashMap<String, (String, String)>,
    /// The running total runnerd reported last.
    reported: (u64, u64),
    /// Codex's own reports of bridge calls that agentd runs (their bridge_call shows them).
    hidden: std::collections::HashSet<String>,
    /// The chat is bound to a laptop folder: agentd runs every bridge call, the shell too.
    laptop: bool,
}

/// The error code of a CLI's tool call that runnerd's policy refused (an ACP agent asked to
/// run its own tool in a chat bound to a laptop folder).
pub const REFUSED_BY_POLICY: &str = "refused_by_policy";

/// The error code of a CLI's tool call that the CLI itself reported failed without an exit
/// code (a tool it does not have, as a bound chat's native shell; an MCP error).
pub const TOOL_FAILED: &str = "tool_failed";

/// Whether Codex's report of a call names a bridge tool agentd runs itself: every bridge tool
/// of a laptop turn; in server mode every one but the shell, which runnerd runs and which
/// Codex's report is the only record of.
fn runs_here(tool: &str, laptop: bool) -> bool {
    tool.strip_prefix("bridge.")
        .is_some_and(|name| laptop || name != "execute_shell_command")
}

/// What one event of runnerd's comes to.
#[derive(Default)]
struct Step {
    emit: Vec<Event>,
    /// Messages the chat keeps, in order.
    store: Vec<Value>,
    /// The CLI session to resume next turn.
    session: Option<CliSession>,
    /// Tokens to add to the turn's usage.
    usage: Option<Usage>,
    /// The turn ended: how.
    end: Option<Result<&'static str, ToolError>>,
    /// A call of the CLI's bridge that agentd runs: its id, tool and arguments.
    bridge: Option<(String, String, Value)>,
}

impl Relay {
    fn on(&mut self, event: TurnEvent, cancelled: bool) -> Step {
        let mut step = Step::default();
        match event {
            TurnEvent::Started {
                turn_id,
                session_key,
            } => {
                self.turn_id = Some(turn_id);
                self.session_key = Some(session_key);
            }
            TurnEvent::Session { session_id } => {
                // A session without a key could never be resumed: it is not recorded.
                if let Some(session_key) = self.session_key.clone() {
                    step.session = Some(CliSession {
                        session_id,
                        session_key,
                    });
                }
            }
            TurnEvent::Text { text } => {
                self.text.push_str(&text);
                step.emit.push(("text", json!({"text": text})));
            }
            // Codex reports each call of the bridge too; the ones agentd runs itself (all but
            // the shell runnerd runs) are shown and stored once, from their bridge_call.
            TurnEvent::ToolCall { call_id, tool, .. } if runs_here(&tool, self.laptop) => {
                self.hidden.insert(call_id);
            }
            TurnEvent::ToolResult { call_id, .. } if self.hidden.remove(&call_id) => {}
            TurnEvent::ToolCall {
                call_id,
                tool,
                command,
            } => {
                let arguments = json!({"command": command});
                step.emit.push((
                    "tool_call",
                    json!({"id": call_id, "name": tool, "arguments": arguments}),
                ));
                // As the model loop stores a call: the text before it and the call, one message.
                let content = match std::mem::take(&mut self.text) {
                    text if text.is_empty() => Value::Null,
                    text => Value::String(text),
                };
                step.store.push(
                    json!({"role": "assistant", "content": content, "tool_calls": [{
                        "id": call_id, "type": "function",
                        "function": {"name": tool, "arguments": arguments.to_string()},
                    }]}),
                );
                self.calls.insert(call_id, (tool, command));
            }
            TurnEvent::ToolResult {
                call_id,
                exit_code,
                output,
                refused,
                failed,
            } => {
                let (tool, command) = self
                    .calls
                    .remove(&call_id)
                    .unwrap_or_else(|| ("tool".to_owned(), String::new()));
                let result = if refused {
                    // runnerd's policy refused it: it never ran, and the turn says why.
                    Err(ToolError::new(REFUSED_BY_POLICY, output))
                } else if failed {
                    // The CLI's own tool error (a tool it does not have, an MCP error).
                    Err(ToolError::new(TOOL_FAILED, output))
                } else {
                    let mut result = json!({"command": command, "output": output});
                    // No exit code (a tool that is not a command) is not "killed by a signal".
                    if let Some(code) = exit_code {
                        result["exit_code"] = json!(code);
                    }
                    Ok(result)
                };
                let call = ToolCall {
                    id: call_id.clone(),
                    name: tool,
                    arguments: String::new(),
                };
                let (event, content) = tool_result(&call, &result);
                step.emit.push(("tool_result", event));
                step.store.push(json!({"role": "tool", "tool_call_id": call_id, "content": content.to_string()}));
            }
            TurnEvent::BridgeCall {
                call_id,
                tool,
                arguments,
            } => {
                step.emit.push((
                    "tool_call",
                    json!({"id": call_id, "name": tool, "arguments": arguments}),
                ));
                let content = match std::mem::take(&mut self.text) {
                    text if text.is_empty() => Value::Null,
                    text => Value::String(text),
                };
                step.store.push(
                    json!({"role": "assistant", "content": content, "tool_calls": [{
                        "id": call_id, "type": "function",
                        "function": {"name": tool, "arguments": arguments.to_string()},
                    }]}),
                );
                step.bridge = Some((call_id, tool, arguments));
            }
            TurnEvent::Usage {
                input_tokens,
                output_tokens,
            } => {
                // The turn's running total: what it adds is the increase over the last one.
                let (input, output) = (
                    input_tokens.min(MAX_REPORTED_TOKENS),
                    output_tokens.min(MAX_REPORTED_TOKENS),
                );
                let added = (
                    input.saturating_sub(self.reported.0),
                    output.saturating_sub(self.reported.1),
                );
                self.reported = (input.max(self.reported.0), output.max(self.reported.1));
                if added != (0, 0) {
                    step.usage = Some(Usage {
                        prompt_tokens: added.0,
                        completion_tokens: added.1,
                        total_tokens: added.0 + added.1,
                    });
                }
            }
            TurnEvent::End { .. } if cancelled => step.end = Some(Ok("cancelled")),
            TurnEvent::End { .. } => step.end = Some(Ok("completed")),
            TurnEvent::Error { code, .. } if code == codes::CANCELLED || cancelled => {
                step.end = Some(Ok("cancelled"));
            }
            TurnEvent::Error { code, message } => {
                step.end = Some(Err(ToolError::new(code, message)));
            }
        }
        step
    }

    /// The text shown since the last stored message, as the assistant's message; and each
    /// call that began without a result, answered so (every stored call has its result).
    fn finish(&mut self) -> Vec<Value> {
        let mut messages = Vec::new();
        for (call_id, _) in std::mem::take(&mut self.calls) {
            let content = json!({"ok": false, "error": {"code": "not_finished",
                "message": "the turn ended before this call did"}});
            messages.push(
                json!({"role": "tool", "tool_call_id": call_id, "content": content.to_string()}),
            );
        }
        let text = std::mem::take(&mut self.text);
        if !text.is_empty() {
            messages.push(json!({"role": "assistant", "content": text}));
        }
        messages
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kinds(step: &Step) -> Vec<&str> {
        step.emit.iter().map(|(kind, _)| *kind).collect()
    }

    #[test]
    fn a_turn_streams_text_and_folded_tool_calls_and_stores_what_the_chat_keeps() {
        let mut relay = Relay::default();
        let step = relay.on(
            TurnEvent::Started {
                turn_id: "t1".into(),
                session_key: "k1".into(),
            },
            false,
        );
        assert!(step.emit.is_empty() && step.session.is_none());
        assert_eq!(relay.turn_id.as_deref(), Some("t1"));
        let step = relay.on(
            TurnEvent::Session {
                session_id: "s1".into(),
            },
            false,
        );
        assert_eq!(
            step.session,
            Some(CliSession {
                session_id: "s1".into(),
                session_key: "k1".into()
            })
        );
        let step = relay.on(
            TurnEvent::Text {
                text: "Let me look. ".into(),
            },
            false,
        );
        assert_eq!(kinds(&step), ["text"]);
        assert!(step.store.is_empty());
        let step = relay.on(
            TurnEvent::ToolCall {
                call_id: "c1".into(),
                tool: "exec_command".into(),
                command: "cat project/a.txt".into(),
            },
            false,
        );
        assert_eq!(kinds(&step), ["tool_call"]);
        assert_eq!(step.emit[0].1["arguments"]["command"], "cat project/a.txt");
        assert_eq!(step.store[0]["content"], "Let me look. ");
        assert_eq!(
            step.store[0]["tool_calls"][0]["function"]["name"],
            "exec_command"
        );
        let step = relay.on(
            TurnEvent::ToolResult {
                call_id: "c1".into(),
                exit_code: Some(1),
                output: "cat: project/a.txt: No such file\n".into(),
                refused: false,
                failed: false,
            },
            false,
        );
        let event = &step.emit[0].1;
        assert_eq!(
            (
                &event["id"],
                &event["name"],
                &event["state"],
                &event["summary"]
            ),
            (
                &json!("c1"),
                &json!("exec_command"),
                &json!("failed"),
                &json!("exit 1")
            )
        );
        assert_eq!(event["result"]["command"], "cat project/a.txt");
        assert_eq!(step.store[0]["role"], "tool");
        // A result without an exit code (not a command) is done, not "killed by a signal".
        relay.on(
            TurnEvent::ToolCall {
                call_id: "c2".into(),
                tool: "mcp__bridge".into(),
                command: "diff_patch_workspace_file a.txt".into(),
            },
            false,
        );
        let step = relay.on(
            TurnEvent::ToolResult {
                call_id: "c2".into(),
                exit_code: None,
                output: "patched".into(),
                refused: false,
                failed: false,
            },
            false,
        );
        assert_eq!(step.emit[0].1["state"], "done");
        // A call runnerd's policy refused: failed, saying why; it never ran.
        relay.on(
            TurnEvent::ToolCall {
                call_id: "c3".into(),
                tool: "bash".into(),
                command: "rm -rf x".into(),
            },
            false,
        );
        let step = relay.on(
            TurnEvent::ToolResult {
                call_id: "c3".into(),
                exit_code: None,
                output: "refused by runnerd's policy: bound".into(),
                refused: true,
                failed: false,
            },
            false,
        );
        let event = &step.emit[0].1;
        assert_eq!(event["state"], "failed", "{event}");
        assert_eq!(event["error"]["code"], REFUSED_BY_POLICY, "{event}");
        assert_eq!(
            event["error"]["message"],
            "refused by runnerd's policy: bound"
        );
        relay.on(
            TurnEvent::Text {
                text: "Done.".into(),
            },
            false,
        );
        let step = relay.on(TurnEvent::End { exit_code: Some(0) }, false);
        assert!(matches!(step.end, Some(Ok("completed"))));
        assert_eq!(
            relay.finish(),
            vec![json!({"role": "assistant", "content": "Done."})]
        );
    }

    #[test]
    fn the_bridge_gets_the_connections_tools_as_they_are_offered() {
        let definitions = vec![
            json!({"type": "function", "function": {"name": "mcp_docs_a1b2c3__search",
                "description": "[MCP server \"Docs\"] Search.",
                "parameters": {"type": "object", "properties": {"q": {"type": "string"}}}}}),
            json!({"type": "function", "function": {"name": "mcp_docs_a1b2c3__ping",
                "description": "[MCP server \"Docs\"] Ping.", "parameters": null}}),
            json!({"type": "function", "function": {"description": "no name"}}),
        ];
        let tools = bridge_tools(&definitions);
        assert_eq!(
            tools,
            [
                BridgeTool {
                    name: "mcp_docs_a1b2c3__search".into(),
                    description: "[MCP server \"Docs\"] Search.".into(),
                    input_schema: json!({"type": "object", "properties": {"q": {"type": "string"}}}),
                },
                BridgeTool {
                    name: "mcp_docs_a1b2c3__ping".into(),
                    description: "[MCP server \"Docs\"] Ping.".into(),
                    input_schema: json!({"type": "object"}),
                },
            ]
        );
        assert!(bridge_tools(&[]).is_empty());
    }

    #[test]
    fn usage_is_the_running_total_and_only_its_increase_is_added() {
        let mut relay = Relay::default();
        let used = |relay: &mut Relay, i, o| {
            relay
                .on(
                    TurnEvent::Usage {
                        input_tokens: i,
                        output_tokens: o,
                    },
                    false,
                )
                .usage
        };
        assert_eq!(
            used(&mut relay, 100, 10),
            Some(Usage {
                prompt_tokens: 100,
                completion_tokens: 10,
                total_tokens: 110
            })
        );
        assert_eq!(used(&mut relay, 100, 10), None);
        assert_eq!(
            used(&mut relay, 150, 12),
            Some(Usage {
                prompt_tokens: 50,
                completion_tokens: 2,
                total_tokens: 52
            })
        );
        assert_eq!(
            used(&mut relay, u64::MAX, 0).unwrap().prompt_tokens,
            MAX_REPORTED_TOKENS - 150
        );
    }

    #[test]
    fn errors_end_the_turn_with_runnerds_code_and_cancel_ends_it_cancelled() {
        let mut relay = Relay::default();
        let step = relay.on(
            TurnEvent::Error {
                code: "cli_failed".into(),
                message: "codex exited: boom".into(),
            },
            false,
        );
        let error = step.end.unwrap().unwrap_err();
        assert_eq!(
            (error.code.as_str(), error.message.as_str()),
            ("cli_failed", "codex exited: boom")
        );
        let step = relay.on(
            TurnEvent::Error {
                code: codes::CANCELLED.into(),
                message: "cancelled".into(),
            },
            false,
        );
        assert!(matches!(step.end, Some(Ok("cancelled"))));
        // After Stop, whatever ends the stream ends the turn cancelled.
        let step = relay.on(TurnEvent::End { exit_code: None }, true);
        assert!(matches!(step.end, Some(Ok("cancelled"))));
    }

    #[test]
    fn codexs_own_report_of_a_bridge_call_agentd_runs_is_not_shown_twice() {
        let mut relay = Relay::default();
        let hidden = relay.on(
            TurnEvent::ToolCall {
                call_id: "m1".into(),
                tool: "bridge.diff_patch_workspace_file".into(),
                command: String::new(),
            },
            false,
        );
        assert!(hidden.emit.is_empty() && hidden.store.is_empty());
        let result = relay.on(
            TurnEvent::ToolResult {
                call_id: "m1".into(),
                exit_code: None,
                output: "done".into(),
                refused: false,
                failed: false,
            },
            false,
        );
        assert!(result.emit.is_empty() && result.store.is_empty());
        // The shell runnerd runs is shown from Codex's report, its only record.
        let shown = relay.on(
            TurnEvent::ToolCall {
                call_id: "m2".into(),
                tool: "bridge.execute_shell_command".into(),
                command: "ls".into(),
            },
            false,
        );
        assert_eq!(kinds(&shown), ["tool_call"]);
        // In a laptop turn agentd runs the shell too: its bridge_call shows it.
        let mut relay = Relay {
            laptop: true,
            ..Relay::default()
        };
        let hidden = relay.on(
            TurnEvent::ToolCall {
                call_id: "m3".into(),
                tool: "bridge.execute_shell_command".into(),
                command: "ls".into(),
            },
            false,
        );
        assert!(hidden.emit.is_empty() && hidden.store.is_empty());
    }

    #[test]
    fn a_session_without_a_started_key_is_not_recorded_and_unfinished_calls_get_a_result() {
        let mut relay = Relay::default();
        assert!(
            relay
                .on(
                    TurnEvent::Session {
                        session_id: "s".into()
                    },
                    false
                )
                .session
                .is_none()
        );
        relay.on(
            TurnEvent::ToolCall {
                call_id: "c9".into(),
                tool: "exec_command".into(),
                command: "sleep 100".into(),
            },
            false,
        );
        relay.on(
            TurnEvent::Text {
                text: "partial".into(),
            },
            false,
        );
        let stored = relay.finish();
        assert_eq!(stored[0]["tool_call_id"], "c9");
        assert_eq!(stored[1]["content"], "partial");
        assert!(relay.finish().is_empty());
    }
}
