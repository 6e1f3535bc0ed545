//! `agentworks-agentd`: identity, the public MCP endpoint and the operator socket.
//!
//! Thin on purpose: parse flags, then the shared daemon start (logging, dropping every
//! capability, the config) hands over to `agentworks_agent::start::run`. Exit codes: 0 after a
//! clean shutdown, 1 when it could not start, 2 for a bad command line or config.

use agentworks_agent::cli::Args;
use agentworks_agent::start;
use agentworks_daemon::entry;
use clap::Parser;
use std::process::ExitCode;

// mimalloc, not glibc's malloc: every MCP write allocates and frees many small JSON values and
// a few 4 KiB buffers across threads, and glibc's arenas spent about a tenth of this daemon's
// time in `_int_malloc`, `_int_free` and `malloc_consolidate` (mcp_throughput, issue 14).
#[cfg(target_os = "linux")]
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    let args = Args::parse();
    // agentd needs no capability at all.
    entry::main(
        "agentworks-agentd",
        &[],
        args.config.as_deref(),
        // The failure prints with its causes on one line.
        |config, _| start::run(config),
    )
}
