//! Small mechanisms more than one side needs, none of them daemon plumbing: the clock
//! ([`clock`]), opening a durable SQLite store ([`sqlite`]), the TLS client configuration
//! ([`tls`]), the URL rules ([`url`]), the HTTP client over Unix sockets the CLIs, daemons,
//! tests and benchmarks use ([`unix_http`]), the one guarded client for outbound requests to
//! addresses a user or client chose ([`outbound`]), and a token cancelled on SIGTERM/SIGINT for whoever
//! winds down on a signal ([`signals`]).
//!
//! On macOS, where only the laptop CLI is built (with the system's TLS), [`tls`] and [`outbound`]
//! are not compiled: they are rustls with ring, which needs a C compiler for the target.
//!
//! Must never know a domain: no document, token or device type lives here.

pub mod clock;
#[cfg(not(target_os = "macos"))]
pub mod outbound;
pub mod signals;
pub mod sqlite;
#[cfg(not(target_os = "macos"))]
pub mod tls;
pub mod unix_http;
pub mod url;
