//! Daemon plumbing shared by agentd, workspaced and gatewayd.
//!
//! Owns the mechanics every daemon repeats: the one TOML config ([`config`]), the state-root
//! layout ([`layout`]), taking or binding listening sockets ([`listener`]), `sd_notify`
//! ([`systemd`]), logging to journald or stderr ([`logging`]), shutdown signals ([`shutdown`]),
//! dropping capabilities ([`caps`]) and opening a SQLite store durably ([`sqlite`]).
//!
//! Must never hold domain logic: nothing here knows what a document, a token or a device is, and
//! nothing here opens another daemon's state directory.

pub mod audit;
pub mod caps;
pub mod config;
pub mod entry;
pub mod layout;
pub mod listener;
pub mod logging;
pub mod shutdown;
pub mod sqlite;
pub mod systemd;
