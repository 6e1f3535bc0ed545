//! agentworks: guarded agent access to files on two kinds of machine.
//!
//! One package, three daemons and two command-line programs. The library holds every domain;
//! the binaries in `src/bin/` only parse flags, set up logging, take their listener and call
//! `run` of their domain.
//!
//! Layout, one module per domain:
//!
//! - [`agent`]: `agentworks-agentd`: the public MCP endpoint, the operator socket, file tools.
//! - [`cli`]: every program's clap definition (the binaries parse with it; the man pages and
//!   completions are generated from it).
//! - [`ctl`]: `agentworksctl` beyond flag parsing (`quickstart`, `status`).
//! - [`daemon`]: plumbing every daemon shares: the one TOML config, the state-root layout,
//!   socket activation, `sd_notify`, logging, shutdown signals and capability dropping.
//! - [`mcp`]: the public MCP endpoint at `/mcp` (streamable HTTP, the stateless 2026-07-28
//!   revision and the 2025 handshake era), bearer auth, and the tool catalog over agentd's
//!   `Backend`.
//! - [`ipc`]: HTTP/1.1 + JSON over Unix sockets, `SO_PEERCRED` peer checks, the one JSON error
//!   envelope, the client the daemons and CLIs use to talk to each other, and the public
//!   listeners' defences (connection table, header screen, body budget, read timeouts).
//! - [`gateway`]: `agentworks-gatewayd`: the executor protocol, the device registry, dispatch.
//! - [`executor`]: the laptop executor's Landlock sandbox launcher (`agentworks __sandbox-exec`)
//!   and the shell runner with its limits (timeout, output caps, scrubbed environment).
//! - [`guard`]: the folder and policy guard (write paths, blocked, blocked-write, read-only,
//!   protected files) evaluated on normalised relative paths; shared by every caller.
//! - [`identity`]: agentd's users, projects, roles, tokens and the write authority.
//! - [`patch`]: the one unified-diff parser and strict applier.
//! - [`workspace`]: `agentworks-workspaced`, the only process that writes the documents tree:
//!   confined paths, revisions, the per-project lock, receipts, ownership and ACL preservation.

pub mod agent;
pub mod cli;
pub mod ctl;
pub mod daemon;
pub mod executor;
pub mod gateway;
pub mod guard;
pub mod identity;
pub mod ipc;
pub mod mcp;
pub mod patch;
pub mod workspace;
