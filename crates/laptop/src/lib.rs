//! `agentworks`, the laptop CLI: the person's side of the server → laptop direction.
//!
//! - [`app`]: what each subcommand does once parsed, and the hidden modes.
//! - [`cli`]: its command line; [`config`]: its private directories and stored credential.
//! - [`login`]: `agentworks login`/`logout` (the RFC 8628 device grant against agentd).
//! - [`grants`]: what `executor connect` shares, validated and pinned before it dials.
//! - [`connect`]: the WebSocket client loop to gatewayd; [`receipts`]: one private receipt per
//!   request id.
//! - [`shell`]: one command through the launcher, with its limits ([`limits`], [`cgroup`]).
//! - [`sandbox`]: the policy a command runs under and the launcher that enforces it (Landlock,
//!   [`seccomp`], [`privileges`] for a root launcher).
//! - [`resolve`]: a path that may not exist yet, canonicalised as far as it exists (grants
//!   and the sandbox's exclusions).
//! - [`patch`]: `diff_patch_workspace_file` applied inside a granted folder.
//! - [`chat`]: `agentworks chat`, the terminal client for agentd's chats.
//!
//! Owns: how a granted shell command is confined and bounded on the person's machine.
//! Never: runs a command outside a fully enforced Landlock ruleset, or links daemon plumbing
//! (this is not a daemon: no systemd, journald or capability handling of the daemons).

pub mod app;
pub mod cgroup;
pub mod chat;
pub mod cli;
pub mod config;
pub mod connect;
pub mod grants;
pub mod limits;
pub mod login;
pub mod patch;
pub mod privileges;
pub mod receipts;
pub mod resolve;
pub mod sandbox;
pub mod seccomp;
pub mod shell;
