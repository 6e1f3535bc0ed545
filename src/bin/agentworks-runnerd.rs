//! `agentworks-runnerd`: runs coding CLIs as a chat's agent, sandboxed.
//!
//! Thin on purpose: first the sandbox's launcher (this binary re-executed as
//! `agentworks-runnerd __sandbox-exec …` becomes it, while single-threaded), then flags, then
//! the shared daemon start (logging, every capability dropped, the config) hands over to
//! `agentworks_runner::start::run`. Exit codes: 0 after a clean shutdown, 1 when the daemon
//! could not start or failed while running, 2 for a bad command line or config.

use agentworks_daemon::entry;
use agentworks_runner::cli::Args;
use agentworks_runner::start::{self, KEPT_CAPABILITIES};
use clap::Parser;
use std::process::ExitCode;

fn main() -> ExitCode {
    if let Some(code) = agentworks_runner::launcher_main_if_launcher() {
        return code;
    }
    let args = Args::parse();
    entry::main(
        "agentworks-runnerd",
        KEPT_CAPABILITIES,
        args.config.as_deref(),
        start::run,
    )
}
