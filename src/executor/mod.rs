//! The laptop executor's local side: the Landlock sandbox launcher ([`sandbox`]) and the shell
//! runner that drives it with the command limits ([`shell`]).
//!
//! Owns: how a granted shell command is confined and bounded on the person's machine.
//! Never: runs a command outside a fully enforced Landlock ruleset.

pub mod cgroup;
pub mod chat;
pub mod config;
pub mod connect;
pub mod grants;
pub mod limits;
pub mod login;
pub mod patch;
pub mod privileges;
pub mod receipts;
pub mod sandbox;
pub mod seccomp;
pub mod shell;
