//! `agentworksctl`: the operator CLI.
//!
//! Parses flags and calls [`agentworks_ctl::app::run`]. Exit codes: 0 success, 1 the
//! operation failed (refused by a daemon, or a daemon unreachable), 2 bad usage or
//! configuration.

use std::process::ExitCode;

use agentworks_ctl::cli::Cli;
use clap::Parser;

fn main() -> ExitCode {
    agentworks_ctl::app::run(Cli::parse())
}
