//! A project's MCP connections: the remote MCP servers a `code` project's owner or co-owner
//! added, what they need (the project's secrets their headers name, an owner's OAuth sign-in,
//! the operator's sign-in apps, all sealed at rest) and their tools in a server-mode chat turn.
//!
//! - [`store`]: the connections, their sealed sign-ins and the sign-in apps, and the rules a
//!   connection meets before it is stored.
//! - [`api`]: the connections and secrets endpoints on the public listener.
//! - [`service`]: the handle the API shares ([`Connections`]).
//! - [`tools`]: the connections' tools in a chat turn ([`ConnectionTools`], [`TurnConnections`]).
//! - [`remote`]: the MCP client that talks to a server through the guarded outbound client.
//! - [`sign_in`]: signing a connection in with OAuth (agentd as an OAuth client).
//! - [`apps`]: the operator's sign-in apps for servers without dynamic registration.
//! - [`secrets`]: a project's sealed secrets; [`sealed`]: the AES-256-GCM sealing of
//!   everything kept at rest here.
//!
//! May call: `identity` and `catalog::files` (a person's live role and access, at every
//! request and every call), `mcp` (the caller and tool error types), `console::session` (the
//! API's caller), `db`, and the guarded outbound client. Never calls `chat`: a chat turn
//! reaches this folder only through [`ConnectionTools`], which opens a turn's
//! [`TurnConnections`] for the turn's person and project and calls their tools.

pub mod api;
pub mod apps;
#[cfg(any(test, feature = "store-conformance"))]
pub mod conformance;
pub mod remote;
pub mod sealed;
pub mod secrets;
pub mod service;
pub mod sign_in;
pub mod store;
pub mod tools;

pub use service::Connections;
pub use tools::{ConnectionTools, TurnConnections};
