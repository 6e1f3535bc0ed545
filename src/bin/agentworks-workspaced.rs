//! `agentworks-workspaced`: the only writer of the documents tree.
//!
//! Thin on purpose: parse flags, then the shared daemon start (logging, dropping every
//! capability but `agentworks_workspace::start::KEPT_CAPABILITIES`, the config) hands over to
//! `agentworks_workspace::start::run`. Exit codes: 0 after a clean shutdown, 1 when the daemon
//! could not start or failed while running, 2 for a bad command line or config.

use agentworks_daemon::entry;
use agentworks_workspace::cli::Args;
use agentworks_workspace::start::{self, KEPT_CAPABILITIES};
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
    entry::main(
        "agentworks-workspaced",
        KEPT_CAPABILITIES,
        args.config.as_deref(),
        // The failure prints with its causes on one line.
        start::run,
    )
}
