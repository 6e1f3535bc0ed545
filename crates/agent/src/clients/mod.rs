//! How agentd reaches the other daemons: [`workspaced`] (every file operation, over
//! `workspaced.sock` or, in a cluster, NATS), [`gatewayd`] (the laptops: devices, dispatch,
//! cancel, recovery), [`runnerd`] (a chat's turn with a coding CLI) and, in a cluster,
//! [`revocations`] (every revoked token announced to every
//! gatewayd on NATS).
//!
//! Clients only: they carry a call and its answer and decide nothing about who may make it.
//! May call the contract and daemon crates; never another folder of agentd.

pub mod gatewayd;
pub mod revocations;
pub mod runnerd;
pub mod workspaced;
