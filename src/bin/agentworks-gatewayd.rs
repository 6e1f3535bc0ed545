//! `agentworks-gatewayd`: connected laptops. The executor WebSocket (public) and the dispatch
//! socket (`gatewayd.sock`, for agentd).
//!
//! Thin on purpose: parse flags, then the shared daemon start (logging, dropping every
//! capability, the config) hands over to `agentworks_gateway::start::run`. Exit codes: 0 after
//! a clean shutdown, 1 when it could not start, 2 for a bad command line or config.

use agentworks_daemon::entry;
use agentworks_gateway::cli::Args;
use agentworks_gateway::start;
use clap::Parser;
use std::process::ExitCode;

fn main() -> ExitCode {
    let args = Args::parse();
    // gatewayd needs no capability at all.
    entry::main(
        "agentworks-gatewayd",
        &[],
        args.config.as_deref(),
        // The failure prints with its causes on one line.
        |config, _| start::run(config),
    )
}
