//! HTTP/1.1 + JSON over Unix sockets between the daemons and the CLIs.
//!
//! Owns the one JSON error envelope ([`envelope`]), bearer-token parsing ([`bearer`]), the server side with its `SO_PEERCRED` peer
//! check ([`server`]) and the client the daemons, CLIs, tests and benchmarks use ([`client`]).
//!
//! Must never decide what an endpoint does or who may call it beyond the peer policy it is
//! handed: routing and per-endpoint authorization belong to each daemon's domain module.

pub mod bearer;
pub mod client;
pub mod envelope;
pub mod server;
