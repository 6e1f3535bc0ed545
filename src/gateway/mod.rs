//! `agentworks-gatewayd`: connected laptops. The device registry, the executor WebSocket, and
//! dispatch of shell and patch requests for agentd.
//!
//! - [`protocol`]: the frames on the executor WebSocket and the dispatch API's bodies.
//!
//! gatewayd holds no document and no identity data: it asks agentd about every token, on
//! connect and on every dispatch, and never re-sends a request on its own.

pub mod protocol;
