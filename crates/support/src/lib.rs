//! Small mechanisms more than one side needs, none of them daemon plumbing: the clock
//! ([`clock`]), opening a durable SQLite store ([`sqlite`]), the TLS client configuration
//! ([`tls`]), the URL rules ([`url`]), the HTTP client over Unix sockets the CLIs, daemons,
//! tests and benchmarks use ([`unix_http`]), the one guarded client for outbound requests to
//! addresses a user or client chose ([`outbound`]), and a token cancelled on SIGTERM/SIGINT for whoever
//! winds down on a signal ([`signals`]).
//!
//! Must never know a domain: no document, token or device type lives here.

pub mod clock;
pub mod outbound;
pub mod signals;
pub mod sqlite;
pub mod tls;
pub mod unix_http;
pub mod url;
