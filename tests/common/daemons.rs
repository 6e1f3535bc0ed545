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

/// A Unix datagram socket standing in for systemd's `NOTIFY_SOCKET`: a daemon started with
/// `NOTIFY_SOCKET=<path>` sends its `sd_notify` messages (READY=1, STATUS=…, STOPPING=1) here.
/// The socket lives in its own temp dir, removed when this is dropped.
pub struct NotifySocket {
    socket: std::os::unix::net::UnixDatagram,
    path: std::path::PathBuf,
    _dir: tempfile::TempDir,
}

impl NotifySocket {
    /// Binds a fresh socket in a new temp dir under `base`.
    pub fn bind_in(base: &Path) -> std::io::Result<NotifySocket> {
        let dir = tempfile::Builder::new()
            .prefix("notify-")
            .tempdir_in(base)?;
        let path = dir.path().join("notify.sock");
        let socket = std::os::unix::net::UnixDatagram::bind(&path)?;
        // Short reads, so that a daemon exiting during its start is noticed within one of them.
        socket.set_read_timeout(Some(Duration::from_millis(50)))?;
        Ok(NotifySocket {
            socket,
            path,
            _dir: dir,
        })
    }

    /// The value for `NOTIFY_SOCKET`.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Waits for a message that has `field` (e.g. `READY=1`) on a line of its own and returns
    /// it, skipping others; it returns as soon as that message arrives. Fails as soon as `child` exits first, and once `within` has passed.
    pub fn wait_for(
        &self,
        child: &mut Child,
        name: &str,
        field: &str,
        within: Duration,
    ) -> Result<String, String> {
        let deadline = Instant::now() + within;
        let mut buf = [0u8; 4096];
        loop {
            match self.socket.recv(&mut buf) {
                Ok(n) => {
                    let message = String::from_utf8_lossy(&buf[..n]).into_owned();
                    if message.lines().any(|line| line == field) {
                        return Ok(message);
                    }
                }
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                    ) => {}
                Err(e) => return Err(format!("cannot read the notify socket: {e}")),
            }
            if let Ok(Some(status)) = child.try_wait() {
                return Err(format!("{name} exited before it sent {field}: {status}"));
            }
            if Instant::now() >= deadline {
                return Err(format!("{name} did not send {field} within {within:?}"));
            }
        }
    }
}
