//! One turn of a chat, from the person's message to `end`.
//!
//! The person's message is stored first (titling a chat that has no title yet). Then the chat's
//! agent picks the turn's driver ([`driver`] is the seam): the built-in model loop for an `api`
//! chat ([`model_loop`]; a turn without a configured model ends there, with
//! [`NO_MODEL`](model_loop::NO_MODEL)), a coding CLI run by runnerd for any other ([`cli`]; a
//! turn without runnerd ends there, saying how to start it); its message is kept, so nothing the person sent is lost
//! and a later turn goes on from it. Then the turn's tools are resolved once, from the chat's
//! binding ([`crate::chat::tools`]), each connection left out is reported
//! (`connection_unavailable`), and the driver runs the turn. Every failure becomes an `error`
//! event; the last event is always `end {reason, usage}`.
//!
//! A message's attachments (uploaded in the console, kept in agentd's private state) are stored
//! with it as listed; each driver gives them to its agent from the server, never the laptop.
//!
//! May call: the chat service and stores, [`crate::chat::tools`] (the turn's [`Toolset`] and its
//! one executor), the model client, runnerd's client, and `mcp`'s tool error. A driver sees only what
//! [`driver::Turn`] gives it; connections reach it only as tools in the toolset.

pub mod cli;
pub mod driver;
pub mod model_loop;

pub use driver::{Event, TurnSpec};

use crate::chat::model::Usage;
use crate::chat::service::{ChatService, blocking, to_tool};
use crate::chat::store::title_of;
use crate::chat::tools::Toolset;
use crate::mcp::ToolError;
use cli::CliAgent;
use driver::{Driver, Events, Turn};
use model_loop::ModelLoop;
use serde_json::{Value, json};
use tokio::sync::mpsc::UnboundedSender;
use tokio_util::sync::CancellationToken;

/// Runs one turn to its end, sending events to `events`. Never panics the caller: every
/// failure becomes an `error` event followed by `end`.
pub async fn run(
    service: ChatService,
    spec: TurnSpec,
    cancel: CancellationToken,
    events: UnboundedSender<Event>,
) {
    let events = Events::new(events);
    let mut usage = Usage::default();
    let reason = match start_and_drive(&service, &spec, &cancel, &events, &mut usage).await {
        Ok(reason) => reason,
        Err(error) => {
            tracing::warn!(chat = %spec.chat.chat_id, turn = spec.turn, code = %error.code, "turn failed: {}", error.message);
            events.emit(
                "error",
                json!({"code": error.code, "message": error.message}),
            );
            "error"
        }
    };
    events.emit("end", json!({"reason": reason, "usage": usage}));
}

/// One turn from storing the person's message to the reason it ended; `usage` sums the tokens
/// its driver used.
async fn start_and_drive(
    service: &ChatService,
    spec: &TurnSpec,
    cancel: &CancellationToken,
    events: &Events,
    usage: &mut Usage,
) -> Result<&'static str, ToolError> {
    let chat_id = spec.chat.chat_id.clone();
    service
        .append(&chat_id, spec.turn, user_message(spec))
        .await?;
    // The first message sent titles the chat; a later one leaves the title as it is.
    if let Some(title) = title_of(&spec.message) {
        let store = service.chats.clone();
        blocking(move || store.title_once(&chat_id, &title))
            .await
            .map_err(to_tool)?;
    }
    // Only now: a turn whose driver cannot run (no model, no runnerd) keeps the person's
    // message in the chat (and its title), so a later turn goes on from it.
    let driver = if spec.chat.is_cli() {
        Agent::Cli(CliAgent::configured(service)?)
    } else {
        Agent::Model(ModelLoop::configured(service)?)
    };
    let tools = Toolset::resolve(
        service,
        &spec.caller,
        &spec.chat,
        spec.turn,
        &spec.attachments,
    )
    .await;
    for (name, code, message) in tools.unavailable() {
        events.emit(
            "connection_unavailable",
            json!({"name": name, "code": code, "message": message}),
        );
    }
    let turn = Turn {
        service,
        spec,
        tools: &tools,
        cancel,
        events,
    };
    match driver {
        Agent::Model(driver) => driver.drive(&turn, usage).await,
        Agent::Cli(driver) => driver.drive(&turn, usage).await,
    }
}

/// The driver of a chat's agent.
enum Agent {
    Model(ModelLoop),
    Cli(CliAgent),
}

/// The person's message as stored: the text and, when it carries any, its attachments as
/// listed (the console shows them; a driver gives them to its agent).
fn user_message(spec: &TurnSpec) -> Value {
    let mut message = json!({"role": "user", "content": spec.message});
    if !spec.attachments.is_empty() {
        message["attachments"] = json!(spec.attachments);
    }
    message
}
