//! Ending on a signal: a token cancelled on the first SIGTERM or SIGINT, for a process that
//! winds down by itself (the daemons, the laptop's `executor connect`).
//!
//! Owns installing the two handlers. Must never exit the process itself, nor know who is
//! stopping: what to do between the signal and the cancellation (the daemons tell systemd
//! STOPPING=1) is the caller's `before_cancel`.

use tokio::signal::unix::{Signal, SignalKind, signal};
use tokio_util::sync::CancellationToken;

/// A token cancelled on the first SIGTERM or SIGINT, right after `before_cancel` ran with the
/// signal's name (`"SIGTERM"` or `"SIGINT"`). Must be called inside a runtime.
///
/// The handlers are installed before this returns, so a signal arriving right after is not
/// lost. If a handler cannot be installed (which tokio only reports for invalid signals or an
/// exhausted fd table), the error is logged and that signal keeps its default action, which
/// still terminates the process.
pub fn cancel_on_signals(
    before_cancel: impl FnOnce(&'static str) + Send + 'static,
) -> CancellationToken {
    let token = CancellationToken::new();
    let term = signal(SignalKind::terminate())
        .inspect_err(|error| tracing::error!(%error, "cannot install SIGTERM handler"))
        .ok();
    let int = signal(SignalKind::interrupt())
        .inspect_err(|error| tracing::error!(%error, "cannot install SIGINT handler"))
        .ok();
    let cancel = token.clone();
    tokio::spawn(async move {
        let name = tokio::select! {
            _ = recv(term) => "SIGTERM",
            _ = recv(int) => "SIGINT",
            _ = cancel.cancelled() => return,
        };
        before_cancel(name);
        cancel.cancel();
    });
    token
}

/// The next delivery of `signal`; never, without a handler.
async fn recv(signal: Option<Signal>) {
    match signal {
        Some(mut signal) => {
            signal.recv().await;
        }
        None => std::future::pending::<()>().await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::time::Duration;

    #[tokio::test]
    async fn sigterm_runs_before_cancel_then_cancels_the_token() {
        let ran = Arc::new(AtomicBool::new(false));
        let seen = ran.clone();
        let token = cancel_on_signals(move |name| {
            assert_eq!(name, "SIGTERM");
            seen.store(true, Ordering::SeqCst);
        });
        assert!(!token.is_cancelled());
        // SIGTERM to ourselves: the handler installed above catches it.
        nix::sys::signal::raise(nix::sys::signal::Signal::SIGTERM).unwrap();
        tokio::time::timeout(Duration::from_secs(5), token.cancelled())
            .await
            .unwrap();
        assert!(ran.load(Ordering::SeqCst));
    }
}
