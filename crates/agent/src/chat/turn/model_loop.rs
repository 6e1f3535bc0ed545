//! The built-in model loop (the `api` agent): a [`Driver`] over any OpenAI-compatible
//! chat-completions endpoint ([`ModelClient`]).
//!
//! The loop sends the conversation and the turn's tool list to the model, runs the tool calls
//! it asks for through the turn's one executor ([`Toolset::execute`]), feeds the results back,
//! and ends when the model answers without tool calls (or after `max_tool_rounds` rounds, an
//! error). Every message (user, assistant, tool) is stored, so the next turn continues the
//! chat; the model gets the most recent whole turns that fit in `max_history_bytes` (the
//! current turn always), told how many earlier messages it does not see. A turn's token usage
//! is summed over its model calls, stored after each one and sent with `end`.
//!
//! A message's attachments reach the model from the server: text files as bounded previews in
//! the person's message, images through `read_image`. The image itself is stored in the
//! history as a reference and reaches the model as a data URL only within its own turn; later
//! turns see a line saying it was shown.

use super::driver::{Driver, Turn, TurnSpec};
use crate::chat::attachments::{AttachmentInfo, Kind, text_preview};
use crate::chat::model::{ModelClient, ToolCall, Usage};
use crate::chat::service::{ChatService, blocking, to_tool};
use crate::chat::tools::Mode;
use crate::chat::tools::executor::tool_result;
use crate::chat::tools::images::read_attachment;
use crate::mcp::ToolError;
use serde_json::{Value, json};

/// What a turn without a model answers (`model_not_configured`). agentd cannot tell a
/// quickstart from an installed server, so it names both ways to configure one.
pub const NO_MODEL: &str = "no model is configured, so nothing answers: an operator sets \
     [agentd.model] base_url and model in the config file, or starts agentworksctl quickstart \
     with --model-url URL --model NAME. Your message is kept in this chat; once a model is \
     configured, send another and the agent answers from there";

/// The scheme of an image reference in the stored history: `attachment:<id>`.
const IMAGE_REFERENCE: &str = "attachment:";

/// The built-in model loop over the configured model.
pub struct ModelLoop {
    model: ModelClient,
}

impl ModelLoop {
    /// The loop over agentd's model; without one, the turn ends with `model_not_configured`
    /// ([`NO_MODEL`]).
    pub fn configured(service: &ChatService) -> Result<ModelLoop, ToolError> {
        match service.model.clone() {
            Some(model) => Ok(ModelLoop { model }),
            None => Err(ToolError::new("model_not_configured", NO_MODEL)),
        }
    }
}

impl Driver for ModelLoop {
    /// The model loop of one turn, to the reason it ended; `usage` sums the tokens of its model
    /// calls (each also stored as it comes).
    async fn drive(&self, turn: &Turn<'_>, usage: &mut Usage) -> Result<&'static str, ToolError> {
        let (service, spec) = (turn.service, turn.spec);
        let chat_id = &spec.chat.chat_id;
        let tools = turn.tools.definitions();
        // The answer's text goes out as it arrives (a `text` event per streamed piece), and is
        // kept so that what the person saw is stored even if the answer never completes.
        let shown = std::sync::Mutex::new(String::new());
        let on_text = |text: &str| {
            shown
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push_str(text);
            turn.events.emit("text", json!({"text": text}));
        };
        let mut call_index = 0u32;
        for _round in 0..self.model.max_tool_rounds() {
            let conversation = conversation(turn, self.model.max_history_bytes()).await?;
            shown.lock().unwrap_or_else(|e| e.into_inner()).clear();
            // A cancelled turn abandons the model request; the text it had streamed is stored.
            let reply = tokio::select! {
                reply = self.model.complete(&conversation, &tools, &on_text) => reply,
                _ = turn.cancel.cancelled() => {
                    store_unfinished_answer(turn, &shown).await?;
                    return Ok("cancelled");
                }
            };
            let reply = match reply {
                Ok(reply) => reply,
                Err(error) => {
                    store_unfinished_answer(turn, &shown).await?;
                    return Err(ToolError::new(error.code(), error.to_string()));
                }
            };
            usage.add(reply.usage);
            store_usage(service, chat_id, spec.turn, reply.usage).await?;
            service
                .append(chat_id, spec.turn, reply.message.clone())
                .await?;
            if reply.tool_calls.is_empty() {
                return Ok("completed");
            }
            // Images read this round follow all of the round's tool results (a model API wants
            // every result right after the call that asked for it).
            let mut images = Vec::new();
            for call in &reply.tool_calls {
                call_index += 1;
                if let Some(image) = answer_call(turn, call, call_index).await? {
                    images.push(image);
                }
            }
            for image in images {
                service.append(chat_id, spec.turn, image).await?;
            }
            if turn.cancel.is_cancelled() {
                return Ok("cancelled");
            }
        }
        Err(ToolError::new(
            "max_tool_rounds",
            format!(
                "the model still asked for tools after {} rounds; the turn was stopped",
                self.model.max_tool_rounds()
            ),
        ))
    }
}

/// The system prompt: the project, and where the agent works (the server's files, or the bound
/// laptop folder with what it may do there).
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

/// Stores the text an unfinished answer (cancelled, or failed mid-stream) had already shown,
/// as the model's message of the turn, so a reopened chat shows what the person saw and the
/// model sees it next turn. Nothing is stored when nothing was shown.
async fn store_unfinished_answer(
    turn: &Turn<'_>,
    shown: &std::sync::Mutex<String>,
) -> Result<(), ToolError> {
    let text = std::mem::take(&mut *shown.lock().unwrap_or_else(|e| e.into_inner()));
    if text.is_empty() {
        return Ok(());
    }
    let message = json!({"role": "assistant", "content": text});
    let spec = turn.spec;
    turn.service
        .append(&spec.chat.chat_id, spec.turn, message)
        .await
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
async fn conversation(turn: &Turn<'_>, max_history_bytes: usize) -> Result<Vec<Value>, ToolError> {
    let (service, spec) = (turn.service, turn.spec);
    let stored = service.messages(&spec.chat.chat_id).await?;
    let (turns, history): (Vec<i64>, Vec<Value>) =
        stored.into_iter().map(|m| (m.turn, m.message)).unzip();
    // The budget counts messages as stored: attachments are expanded only in what is sent.
    let recent = recent_history(&history, max_history_bytes);
    let omitted = history.len() - recent.len();
    let mut system = system_prompt(spec, turn.tools.mode());
    if let Some(note) = turn.tools.prompt_note() {
        system.push_str(&note);
    }
    if omitted > 0 {
        system.push_str(&format!(
            " The {omitted} earliest messages of this chat are not shown (history limit)."
        ));
    }
    let mut conversation = vec![json!({"role": "system", "content": system})];
    for (message, &message_turn) in recent.iter().zip(&turns[omitted..]) {
        let message = expand_attachments(turn, message_turn, message.clone()).await?;
        conversation.push(if message_turn == spec.turn {
            with_images(turn, message).await?
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
    turn: &Turn<'_>,
    call: &ToolCall,
    call_index: u32,
) -> Result<Option<Value>, ToolError> {
    let (service, spec) = (turn.service, turn.spec);
    let chat_id = &spec.chat.chat_id;
    let arguments: Value =
        serde_json::from_str(&call.arguments).unwrap_or(Value::String(call.arguments.clone()));
    turn.events.emit(
        "tool_call",
        json!({"id": call.id, "name": call.name, "arguments": arguments}),
    );
    let request_id = turn.tools.request_id(call_index);
    let result = if turn.cancel.is_cancelled() {
        Err(ToolError::new(
            "cancelled",
            "not run: the turn was cancelled",
        ))
    } else {
        turn.tools
            .execute(service, call, &request_id, turn.cancel)
            .await
    };
    let (event, content) = tool_result(call, &result);
    service
        .append(
            chat_id,
            spec.turn,
            json!({"role": "tool", "tool_call_id": call.id, "content": content.to_string()}),
        )
        .await?;
    turn.events.emit("tool_result", event);
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

/// A stored person's message as the model sees it: the text, then each text attachment's
/// bounded preview, and a line per image (naming it for `read_image` in its own turn). The
/// `attachments` field is ours, never sent to the model.
async fn expand_attachments(
    turn: &Turn<'_>,
    message_turn: i64,
    mut message: Value,
) -> Result<Value, ToolError> {
    let (service, spec) = (turn.service, turn.spec);
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
                let (info, bytes) = read_attachment(
                    service,
                    &spec.chat.chat_id,
                    message_turn,
                    &attachment.attachment_id,
                )
                .await
                .map_err(to_tool)?;
                content.push_str(&text_preview(&info, &bytes));
            }
            Kind::Image if message_turn == spec.turn => content.push_str(&format!(
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

/// A stored message with its image references of this turn replaced by the images as data URLs.
async fn with_images(turn: &Turn<'_>, mut message: Value) -> Result<Value, ToolError> {
    let (service, spec) = (turn.service, turn.spec);
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

#[cfg(test)]
mod tests {
    use super::*;

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
}
