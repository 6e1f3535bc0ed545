//! The `sd_notify` protocol: READY, STATUS, STOPPING and the watchdog.
//!
//! Owns telling the service manager how the daemon is doing. READY=1 must be sent only after
//! the daemon's sockets are open and its stores are ready; that ordering is the caller's job,
//! this module only makes the calls cheap and safe.
//!
//! Must never fail or stop the daemon: without `NOTIFY_SOCKET` every call is a no-op, and a
//! failed send is logged at debug level and otherwise ignored.

use std::time::Duration;

use sd_notify::NotifyState;
use tokio_util::sync::CancellationToken;

fn send(states: &[NotifyState<'_>]) {
    if let Err(error) = sd_notify::notify(states) {
        tracing::debug!(%error, "sd_notify failed");
    }
}

/// Sends READY=1 and STATUS=`status`. No-op without `NOTIFY_SOCKET`.
pub fn notify_ready(status: &str) {
    send(&[NotifyState::Ready, NotifyState::Status(status)]);
}

/// Sends STATUS=`status`. No-op without `NOTIFY_SOCKET`.
pub fn notify_status(status: &str) {
    send(&[NotifyState::Status(status)]);
}

/// Sends STOPPING=1. No-op without `NOTIFY_SOCKET`.
pub fn notify_stopping() {
    send(&[NotifyState::Stopping]);
}

/// The ping period for a watchdog timeout: half of it, so one late tick is not fatal, and never
/// zero so a bogus `WATCHDOG_USEC=0` cannot make a busy loop.
pub fn watchdog_period(timeout: Duration) -> Duration {
    (timeout / 2).max(Duration::from_millis(1))
}

/// If `WATCHDOG_USEC` is set for this pid, spawns a tokio task that sends WATCHDOG=1 every half
/// interval until `shutdown` is cancelled. Must be called inside a runtime.
pub fn spawn_watchdog(shutdown: CancellationToken) {
    let Some(timeout) = sd_notify::watchdog_enabled() else {
        return;
    };
    let period = watchdog_period(timeout);
    tracing::debug!(?period, "systemd watchdog enabled");
    tokio::spawn(async move {
        let mut ticks = tokio::time::interval(period);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => break,
                _ = ticks.tick() => send(&[NotifyState::Watchdog]),
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn watchdog_period_is_half_and_never_zero() {
        assert_eq!(
            watchdog_period(Duration::from_secs(10)),
            Duration::from_secs(5)
        );
        assert_eq!(watchdog_period(Duration::ZERO), Duration::from_millis(1));
    }

    #[test]
    fn notify_without_socket_is_a_no_op() {
        // The test runner is not a notify service; these must simply return.
        if std::env::var_os("NOTIFY_SOCKET").is_none() {
            notify_ready("ready");
            notify_status("status");
            notify_stopping();
        }
    }
}
