//! Daemon plumbing shared by agentd, workspaced and gatewayd.
//!
//! Owns the mechanics every daemon repeats: the one TOML config ([`config`]), the state-root
//! layout ([`layout`]), taking or binding listening sockets ([`listener`]), `sd_notify`
//! ([`systemd`]), logging to journald or stderr ([`logging`]), joining the cluster's NATS server ([`nats`]) and calling its hosts over it ([`bus`]) and its PostgreSQL ([`postgres`]), shutdown signals ([`shutdown`]),
//! dropping capabilities ([`caps`]), the audit log ([`audit`]), and the server side of HTTP over
//! Unix sockets and the public listeners ([`ipc`]). For agentd, workspaced and gatewayd only:
//! the laptop CLI is not a daemon and never links this crate.
//!
//! Must never hold domain logic: nothing here knows what a document, a token or a device is, and
//! nothing here opens another daemon's state directory.

pub mod audit;
pub mod bus;
pub mod caps;
pub mod config;
pub mod entry;
pub mod ipc;
pub mod layout;
pub mod listener;
pub mod logging;
pub mod nats;
pub mod postgres;
pub mod shutdown;
pub mod systemd;
