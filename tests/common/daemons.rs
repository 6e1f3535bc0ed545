//! Starting, waiting for and stopping the real daemons, as the integration suite
//! (`tests/suite/harness/`) and the benchmarks (`benches/*.rs`) both do it: one environment
//! for a daemon on a temp state root, one readiness wait that fails as soon as the daemon
//! exits, one way to signal a child, and a guard that stops and reaps a child when dropped.
//! Both include this file with `#[path]` (a benchmark cannot use the test crate's modules);
//! each uses part of it. It never picks a port (that is `ports.rs`) and never starts anything
//! but the command it is handed.

use nix::sys::signal::Signal;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Sets `command` up to run a daemon on `state_root`: a cleared environment with only PATH,
/// `AGENTWORKS_STATE_ROOT`, `AGENTWORKS_CONFIG` (`<state_root>/agentworks.toml`) and
/// `RUST_LOG=warn`; stdin and stdout null; stderr inherited, so whatever the daemon says (also
/// why its start failed) is in the output of the test or benchmark.
pub fn as_daemon_on<'c>(command: &'c mut Command, state_root: &Path) -> &'c mut Command {
    command
        .env_clear()
        .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
        .env("AGENTWORKS_STATE_ROOT", state_root)
        .env("AGENTWORKS_CONFIG", state_root.join("agentworks.toml"))
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
}

/// Sends `signal` to `child` (which must not have been reaped yet).
pub fn send_signal(child: &Child, signal: Signal) -> nix::Result<()> {
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(child.id() as i32), signal)
}

/// Polls `ready` every 20 ms until it holds. Panics with "`name` exited during start" as soon
/// as `child` exits first, and with "`name` did not become ready" once `within` has passed.
pub async fn wait_ready<F, Fut>(child: &mut Child, name: &str, within: Duration, ready: F)
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + within;
    loop {
        if let Ok(Some(status)) = child.try_wait() {
            panic!("{name} exited during start: {status}");
        }
        if ready().await {
            return;
        }
        assert!(Instant::now() < deadline, "{name} did not become ready");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A child process stopped with SIGTERM and reaped when dropped (also on panic).
pub struct Process {
    pub name: &'static str,
    pub child: Child,
}

impl Process {
    /// Spawns `binary` with [`as_daemon_on`] `state_root`; panics if it cannot be started.
    pub fn daemon(name: &'static str, binary: &str, state_root: &Path) -> Process {
        let child = as_daemon_on(&mut Command::new(binary), state_root)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {binary}: {e}"));
        Process { name, child }
    }

    /// Its exit status, if it has exited.
    pub fn exited(&mut self) -> Option<std::process::ExitStatus> {
        self.child.try_wait().ok().flatten()
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// [`wait_ready`] for this process, named by its [`Process::name`].
    pub async fn wait_ready<F, Fut>(&mut self, within: Duration, ready: F)
    where
        F: Fn() -> Fut,
        Fut: std::future::Future<Output = bool>,
    {
        wait_ready(&mut self.child, self.name, within, ready).await;
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        if self.exited().is_none() {
            let _ = send_signal(&self.child, Signal::SIGTERM);
            let _ = self.child.wait();
        }
    }
}
