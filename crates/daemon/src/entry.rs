//! The start every daemon binary shares, in the order it must happen: logging, then dropping
//! capabilities (before any thread exists: capability sets are per thread), then the config,
//! then the tokio runtime, then the daemon's own `run`. Exit codes: 0 after a clean shutdown,
//! 1 when the daemon could not start or failed, 2 for a bad config.
//!
//! It never decides what a daemon does; it only makes every daemon start and fail the same way.

use crate::{caps, config::Config, logging};
use std::path::Path;
use std::process::ExitCode;

/// Run a daemon binary's `run(config, kept_capabilities)` with the shared start.
pub fn main<F, Fut, E>(
    name: &'static str,
    keep: &[::caps::Capability],
    config_path: Option<&Path>,
    run: F,
) -> ExitCode
where
    F: FnOnce(Config, Vec<::caps::Capability>) -> Fut,
    Fut: std::future::Future<Output = Result<(), E>>,
    E: std::fmt::Debug + std::fmt::Display,
{
    logging::init(name);
    let kept = match caps::retain_only(keep) {
        Ok(kept) => kept,
        Err(e) => {
            eprintln!("{name}: cannot drop capabilities: {e}");
            return ExitCode::from(1);
        }
    };
    let config = match Config::load(config_path) {
        Ok(config) => config,
        Err(e) => {
            eprintln!("{name}: {e}");
            return ExitCode::from(2);
        }
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("{name}: cannot start the runtime: {e}");
            return ExitCode::from(1);
        }
    };
    match runtime.block_on(run(config, kept)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            // `{:#}` prints an anyhow chain on one line; other errors print as usual.
            tracing::error!("{e:#}");
            eprintln!("{name}: {e:#}");
            ExitCode::from(1)
        }
    }
}
