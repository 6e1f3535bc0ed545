//! A project's chats: the person's conversations with the agent, and the turn that answers each
//! message.
//!
//! - [`api`]: the chat endpoints (REST + SSE on the public listener); [`agents`]: the agents
//!   a chat may have (`api`, the model loop, or a coding CLI runnerd runs) and the check of a
//!   new chat's agent and mode.
//! - [`service`]: the handle the endpoints and a running turn share ([`ChatService`]).
//! - [`store`]: the chats, their messages, turns, usage and bindings; [`attachments`]: the
//!   files attached to a message, kept in agentd's private state.
//! - [`turn`]: one turn: the seam a driver plugs into ([`turn::driver`]) and the drivers, one
//!   per kind of agent (the model loop, [`turn::model_loop`]; a coding CLI through runnerd,
//!   [`turn::cli`]).
//! - [`tools`]: a turn's tools, one file per kind (server files, the laptop, the connections,
//!   images), with one executor every driver calls.
//! - [`model`]: the client of the configured model (any OpenAI-compatible endpoint).
//! - [`peers`]: with `[cluster]`, stopping a turn that runs on another agentd host.
//!
//! Chats belong to a project and are pinned to the person who created them. A chat bound to a
//! laptop folder gets exactly the two local tools, routed through gatewayd; everything else
//! (server file tools, MCP connections, secrets) is excluded from that turn.
//!
//! May call: `identity` and `catalog::files` (a person's live access, the server files),
//! `clients::gatewayd` (the laptops), `clients::runnerd` (the coding CLIs), `connections` only through
//! [`ConnectionTools`](crate::connections::ConnectionTools) and the
//! [`TurnConnections`](crate::connections::TurnConnections) it opens, `console::session` (the
//! API's caller), `mcp` (the caller and tool error types) and `db`. Nothing in agentd calls
//! into chats but the router and the daemon's start.

pub mod agents;
pub mod api;
pub mod attachments;
#[cfg(any(test, feature = "store-conformance"))]
pub mod conformance;
pub mod model;
pub mod peers;
pub mod service;
pub mod store;
pub mod tools;
pub mod turn;

pub use service::ChatService;
