//! HTTP/1.1 + JSON over Unix sockets between the daemons and the CLIs, and the server side of
//! the public TCP listeners.
//!
//! Owns the one JSON error envelope ([`envelope`]), bearer-token parsing ([`bearer`]), the server
//! side with its `SO_PEERCRED` peer check and the public listener's body budget and timeouts
//! ([`server`]), the public listeners' connection table ([`connections`]).
//! The client side is `agentworks_support::unix_http`.
//!
//! Must never decide what an endpoint does or who may call it beyond the peer policy it is
//! handed: routing and per-endpoint authorization belong to each daemon's domain module (a
//! public listener asks the daemon's `Screen` about every request head).

pub mod bearer;
pub mod connections;
pub mod envelope;
pub mod server;
