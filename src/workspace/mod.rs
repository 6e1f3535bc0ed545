//! `agentworks-workspaced`: the only process that writes the documents tree.
//!
//! It owns every managed read and write of project files: confined paths ([`confine`]),
//! revisions ([`revision`]), the per-project lock ([`lock`]), durable receipts ([`receipts`]),
//! ownership and ACL carry-over ([`acl`]), the operations themselves ([`ops`]) and the socket
//! API ([`server`], bodies in [`api`], errors in [`error`]).
//!
//! It must never be reachable from the network, never serve a peer it does not know, and never
//! change a file without a revision check and a prepared receipt.

pub mod acl;
pub mod api;
pub mod confine;
pub mod error;
pub mod failpoint;
pub mod lock;
pub mod ops;
pub mod receipts;
pub mod revision;
pub mod server;
