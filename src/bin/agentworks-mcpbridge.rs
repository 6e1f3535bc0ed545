//! `agentworks-mcpbridge`: the agentworks tools for a coding CLI, as a stdio MCP server the CLI
//! spawns inside its sandbox (DESIGN.md, "The bridge").
//!
//! Thin on purpose: read runnerd's loopback URL and the turn's bridge capability from the
//! environment (`AGENTWORKS_BRIDGE_URL`, `AGENTWORKS_BRIDGE_TOKEN`), then serve MCP on
//! stdin/stdout with `agentworks_runner::bridge::mcp::serve` until stdin ends. Nothing else:
//! no config, no flags, no logs on stdout (stdout is the protocol). Exit codes: 0 when stdin
//! ended, 1 when the environment or stdio failed (the reason on stderr).

use agentworks_runner::bridge::client::Forwarder;
use std::process::ExitCode;

fn main() -> ExitCode {
    let forwarder = match Forwarder::from_env() {
        Ok(forwarder) => forwarder,
        Err(e) => {
            eprintln!("agentworks-mcpbridge: {e}");
            return ExitCode::FAILURE;
        }
    };
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("agentworks-mcpbridge: cannot start its runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let served = runtime.block_on(agentworks_runner::bridge::mcp::serve(
        tokio::io::BufReader::new(tokio::io::stdin()),
        tokio::io::stdout(),
        forwarder,
    ));
    match served {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("agentworks-mcpbridge: stdio failed: {e}");
            ExitCode::FAILURE
        }
    }
}
