//! The seam between a turn and the agent that answers it: what a driver gets ([`Turn`]), what
//! it emits (the turn's [`Event`]s), and what a driver is ([`Driver`]).
//!
//! A turn ([`super::run`]) stores the person's message, picks the driver for the chat's agent,
//! resolves the turn's tools once and hands the driver a [`Turn`]: the chat, the person and the
//! project ([`TurnSpec`]), the tools with their one executor ([`Toolset`], whose
//! [`Toolset::execute`] every tool call goes through), the chat service (the chat store, the
//! attachments, the clients) and the turn's cancel. The driver emits the turn's events as they
//! happen (`text` for each piece of the answer, `tool_call` and `tool_result` for each call),
//! stores what the chat keeps (its messages, through the service, so the next turn goes on
//! from them whatever drives it) and returns why the turn ended (`completed`, `cancelled`)
//! with the tokens it used. The turn then sends `end`; an error the driver returns is the
//! turn's `error` event.
//!
//! The drivers: the built-in model loop ([`super::model_loop`], the `api` agent), and a coding
//! CLI run by runnerd ([`super::cli`]), which asks runnerd to run the turn and turns runnerd's
//! stream into these events (the CLI's bridge tool calls that agentd runs come back to the same
//! [`Toolset::execute`], but for the patch, which goes through workspaced's guarded patch). Both
//! get the same [`Turn`].

use crate::chat::attachments::AttachmentInfo;
use crate::chat::model::Usage;
use crate::chat::service::ChatService;
use crate::chat::store::Chat;
use crate::chat::tools::Toolset;
use crate::mcp::{Caller, ToolError};
use serde_json::Value;
use tokio::sync::mpsc::UnboundedSender;
use tokio_util::sync::CancellationToken;

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

/// One server-sent event: `(kind, data)`.
pub type Event = (&'static str, Value);

/// Where a turn's events go: the stream of the request that started it.
pub struct Events(UnboundedSender<Event>);

impl Events {
    pub fn new(sender: UnboundedSender<Event>) -> Events {
        Events(sender)
    }

    /// Sends one event. The client may have gone; the turn still runs to its end and is stored.
    pub fn emit(&self, kind: &'static str, data: Value) {
        let _ = self.0.send((kind, data));
    }
}

/// What a driver gets: everything fixed at the turn's start.
pub struct Turn<'a> {
    /// The chat store, the attachments, the clients (and the model, if configured).
    pub service: &'a ChatService,
    /// The chat, the person, the project, the turn's number and message.
    pub spec: &'a TurnSpec,
    /// The tools the turn offers and their one executor.
    pub tools: &'a Toolset,
    /// Cancelled when the person stops the turn: the driver stops at its next step.
    pub cancel: &'a CancellationToken,
    pub events: &'a Events,
}

/// An agent that answers a turn: one driver per kind of agent.
pub trait Driver {
    /// Runs `turn` to its end: why it ended (`completed`, `cancelled`), or the error the turn
    /// reports. `usage` sums the tokens it used (each also stored as it comes).
    fn drive(
        &self,
        turn: &Turn<'_>,
        usage: &mut Usage,
    ) -> impl std::future::Future<Output = Result<&'static str, ToolError>> + Send;
}
