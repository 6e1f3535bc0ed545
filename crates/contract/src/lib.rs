//! The wire contracts between the agentworks processes: one module per socket or endpoint
//! family, with its request and answer types, error codes, limits and the validation rules
//! both sides apply. Serde types only, no I/O.
//!
//! - [`workspaced`]: `workspaced.sock` (agentd and agentworksctl call it), and receipts.
//! - [`agentd`]: `agentd.sock`: the operator endpoints and the gateway's token checks; the
//!   identity vocabulary (scopes, roles, project kinds).
//! - [`public_api`]: agentd's public device login and chat API.
//! - [`runnerd`]: `runnerd.sock`: agentd asks runnerd to run a turn with a coding CLI.
//! - [`gatewayd`]: `gatewayd.sock`: dispatch to connected laptops (agentd calls it).
//! - [`executor`]: the executor WebSocket between gatewayd and `agentworks executor connect`.
//! - [`cluster`]: the NATS subjects and messages between the hosts of a cluster.
//! - [`envelope`]: the one JSON error envelope every socket and endpoint speaks, and the one
//!   health answer.
//!
//! A daemon crate depends on this crate, never on another daemon's crate.

pub mod agentd;
pub mod cluster;
pub mod envelope;
pub mod executor;
pub mod gatewayd;
pub mod public_api;
pub mod runnerd;
pub mod workspaced;
