//! `agentworks-workspaced`: the only process that writes the documents tree.
//!
//! It owns every managed read and write of project files: the per-project lock ([`lock`]),
//! durable receipts ([`receipts`]), ownership and ACL carry-over ([`acl`]), the operations
//! themselves ([`ops`], a multi-file patch set among them), the socket API ([`server`], errors in [`error`]), its command line
//! ([`cli`]) and its start as a daemon, with the capabilities it keeps ([`start`]). Paths are
//! confined by `agentworks_fs::confine`, revisions are `agentworks_core::revision`'s, and the
//! socket's bodies are `agentworks_contract::workspaced`.
//!
//! It must never be reachable from the network, never serve a peer it does not know, and never
//! change a file without a revision check and a prepared receipt.

pub mod acl;
pub mod cli;
pub mod cluster;
pub mod error;
pub mod lock;
pub mod ops;
pub mod receipts;
pub mod server;
pub mod start;
