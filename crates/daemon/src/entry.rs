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
    E: std::error::Error,
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
            let line = one_line(&e);
            tracing::error!("{line}");
            eprintln!("{name}: {line}");
            ExitCode::from(1)
        }
    }
}

/// `error` and its causes on one line, `outer: inner: …`. Many of our errors already end their
/// own message with their cause (they are also shown alone, where no chain is printed), so a
/// cause whose text the line already holds is not repeated.
pub fn one_line(error: &dyn std::error::Error) -> String {
    let mut line = error.to_string();
    let mut cause = error.source();
    while let Some(inner) = cause {
        let text = inner.to_string();
        if !line.contains(&text) {
            line.push_str(": ");
            line.push_str(&text);
        }
        cause = inner.source();
    }
    line
}

#[cfg(test)]
mod tests {
    use super::one_line;

    #[derive(Debug, thiserror::Error)]
    #[error("cannot listen on {0}")]
    struct Outer(&'static str, #[source] Middle);

    #[derive(Debug, thiserror::Error)]
    #[error("cannot bind {path}: {source}")]
    struct Middle {
        path: &'static str,
        source: std::io::Error,
    }

    #[test]
    fn a_cause_already_in_the_message_is_not_repeated() {
        let error = Outer(
            "a.sock",
            Middle {
                path: "a.sock",
                source: std::io::Error::from(std::io::ErrorKind::AddrInUse),
            },
        );
        let line = one_line(&error);
        assert_eq!(line.matches("in use").count(), 1, "{line}");
        assert!(
            line.starts_with("cannot listen on a.sock: cannot bind a.sock: "),
            "{line}"
        );
    }
}
