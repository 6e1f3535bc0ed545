//! `agentworks-runnerd`: a chat's agent as a coding CLI (Codex, Claude Code) that the operator
//! installed and configured as a provider, run on the server's project in a private runtime,
//! sandboxed.
//!
//! Owns: the providers ([`provider`]: `[runnerd.providers.NAME]`, the executable found at
//! start), the private runtimes ([`runtime`]: a keyed directory per user, project, chat,
//! provider and mode, with its `project` link and generated guidance), the model gateway
//! ([`gateway`]: a per-turn capability on loopback, the operator's key added only there, usage
//! counted), the drivers ([`driver`]: what each CLI dialect gives a turn; [`codex`] and
//! [`claude`]: their generated config, command line and environment, their JSON stream turned
//! into the turn's events), a turn ([`turn`]: the CLI in the sandbox, cancel,
//! timeout), the bridge ([`bridge`]: `agentworks-mcpbridge`'s stdio MCP server and runnerd's
//! loopback endpoint that answers its calls), the socket API agentd calls ([`server`]), the same
//! API over the cluster's NATS for agentd on other hosts ([`cluster`]) and the daemon's start
//! ([`start`]).
//!
//! Must never: let a provider's key into a sandbox (environment, runtime files, arguments),
//! start a CLI outside the sandbox, grant the project writable in Run mode, or delete what a
//! runtime's `project` names.

pub mod acp;
pub mod bridge;
pub mod claude;
pub mod cli;
pub mod cluster;
pub mod codex;
pub mod driver;
pub mod gateway;
mod loopback;
pub mod provider;
pub mod runtime;
pub mod server;
pub mod start;
pub mod turn;

/// The sandbox's launcher, when this process was started as one (`__sandbox-exec`): the
/// binary's `main` calls it first, while single-threaded.
pub fn launcher_main_if_launcher() -> Option<std::process::ExitCode> {
    agentworks_sandbox::launcher::main_if_launcher()
}
