//! `agentworks`, the laptop CLI: `login`, `logout`, `chat` and `executor connect`, plus the
//! hidden modes the executor re-executes itself in. Parses flags and calls
//! [`agentworks_laptop::app`], which documents the exit codes.

use std::process::ExitCode;

use agentworks_laptop::app;
use agentworks_laptop::cli;

fn main() -> ExitCode {
    // The sandbox launcher and patch applier modes: first, before parsing and while the
    // process is single-threaded (see `app::hidden_mode`).
    if let Some(code) = app::hidden_mode() {
        return code;
    }
    app::run(cli::parse())
}
