//! Shutdown signals: the first SIGTERM or SIGINT sends STOPPING=1 to systemd and cancels one
//! token the whole daemon watches.
//!
//! Owns what a daemon does on the signal; the handlers themselves are
//! [`agentworks_support::signals`]. Must never exit the process itself: the daemon decides
//! how to wind down (stop accepting, finish in-flight requests). STOPPING=1 is sent here, before
//! the token is cancelled, because a task woken by the token may never run once the daemon's
//! main future returns and the runtime shuts down.

use tokio_util::sync::CancellationToken;

/// A token cancelled on the first SIGTERM or SIGINT (after STOPPING=1 is sent, when under
/// systemd). Must be called inside a runtime.
///
/// The handlers are installed before this returns, so a signal arriving right after is not
/// lost (see [`agentworks_support::signals::cancel_on_signals`], which also says what happens
/// when one cannot be installed).
pub fn on_signals() -> CancellationToken {
    agentworks_support::signals::cancel_on_signals(|name| {
        tracing::info!(signal = name, "shutting down");
        crate::systemd::notify_stopping();
    })
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
