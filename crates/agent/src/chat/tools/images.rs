//! `read_image {name}`: the images attached to the turn's message, offered in both modes only
//! to a turn whose message carries one. It reads this turn's uploads (kept in agentd's private
//! state), never another turn's and never the laptop. The image reaches the model from the
//! driver, as the message after the call's result.

use super::{arguments, schema, string, tool};
use crate::chat::attachments::{AttachmentInfo, Kind};
use crate::chat::model::ToolCall;
use crate::chat::service::{ChatService, blocking};
use crate::mcp::ToolError;
use agentworks_daemon::ipc::envelope::Refusal;
use serde_json::{Value, json};

/// `read_image`, offered to a turn whose message carries an image.
pub fn definition() -> Value {
    tool(
        "read_image",
        "See an image the person attached to this message (by its name as listed in the \
         message). Only this message's attachments can be read.",
        schema(json!({"name": {"type": "string"}}), &["name"]),
    )
}

/// `read_image {name}`: one of this turn's image attachments (`images`), by name or id. Its
/// bytes are not in the result: the driver adds them as the next message.
pub async fn read_image(
    service: &ChatService,
    chat_id: &str,
    turn: i64,
    images: &[AttachmentInfo],
    call: &ToolCall,
) -> Result<Value, ToolError> {
    let args = arguments(call, &["name"])?;
    let name = string(&args, "name")?;
    let listed: Vec<&str> = images
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
    let (info, _) = read_attachment(service, chat_id, turn, &name)
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

/// An attachment of `turn`, by id or name, with its bytes.
pub async fn read_attachment(
    service: &ChatService,
    chat_id: &str,
    turn: i64,
    id_or_name: &str,
) -> Result<(AttachmentInfo, Vec<u8>), Refusal> {
    let store = service.attachments.clone();
    let (chat_id, key) = (chat_id.to_owned(), id_or_name.to_owned());
    blocking(move || store.read_for_turn(&chat_id, turn, &key)).await
}
