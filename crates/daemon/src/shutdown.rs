//! Shutdown signals: the first SIGTERM or SIGINT sends STOPPING=1 to systemd and cancels one
//! token the whole daemon watches.
//!
//! Owns installing the signal handlers. Must never exit the process itself: the daemon decides
//! how to wind down (stop accepting, finish in-flight requests). STOPPING=1 is sent here, before
//! the token is cancelled, because a task woken by the token may never run once the daemon's
//! main future returns and the runtime shuts down.

use tokio::signal::unix::{SignalKind, signal};
use tokio_util::sync::CancellationToken;

/// A token cancelled on the first SIGTERM or SIGINT (after STOPPING=1 is sent, when under
/// systemd). Must be called inside a runtime.
///
/// The handlers are installed before this returns, so a signal arriving right after is not
/// lost. If a handler cannot be installed (which tokio only reports for invalid signals or an
/// exhausted fd table), the error is logged and that signal keeps its default action, which
/// still terminates the process.
pub fn on_signals() -> CancellationToken {
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
        tracing::info!(signal = name, "shutting down");
        crate::systemd::notify_stopping();
        cancel.cancel();
    });
    token
}

async fn recv(signal: Option<tokio::signal::unix::Signal>) {
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
    use std::time::Duration;

    #[tokio::test]
    async fn sigint_cancels_the_token() {
        let token = on_signals();
        assert!(!token.is_cancelled());
        // SIGINT to ourselves: the handler installed above catches it.
        nix::sys::signal::raise(nix::sys::signal::Signal::SIGINT).unwrap();
        tokio::time::timeout(Duration::from_secs(5), token.cancelled())
            .await
            .unwrap();
    }
}
