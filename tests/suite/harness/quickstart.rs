//! `agentworksctl quickstart --json` as the tests run it: both of its ports given (each
//! reserved with [`super::reserve_ports`]), its stderr (its own messages and its daemons' logs)
//! kept in a file that is shown whenever the start fails (no JSON line) and that a test may
//! read, and the record it leaves for agentworksctl's other commands kept in a temp
//! `XDG_STATE_HOME` of its own unless the test chose one (so that no test's quickstart is found
//! by another test's commands). [`runnerd_providers`] asks a quickstart's runnerd for its
//! providers on its socket, and [`executable_file`] makes the executable a `--provider` names.

use super::daemons::send_signal;
use nix::sys::signal::Signal;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The arguments of `agentworksctl quickstart --json` on `state` with both of its ports given
/// (`--port`, `--gateway-port`).
pub fn quickstart_args(state: &Path, ports: [u16; 2]) -> Vec<std::ffi::OsString> {
    let mut args: Vec<std::ffi::OsString> = [
        "quickstart",
        "--json",
        "--port",
        &ports[0].to_string(),
        "--gateway-port",
        &ports[1].to_string(),
        "--state-root",
    ]
    .iter()
    .map(Into::into)
    .collect();
    args.push(state.into());
    args
}

/// A running `agentworksctl quickstart --json`: the child and its first stdout line (the JSON
/// `Started`). Its stderr, which its daemons inherit, goes to `stderr`, shown whenever its
/// start fails.
pub struct QuickstartRun {
    /// `None` once [`QuickstartRun::into_parts`] handed it to the test.
    child: Option<Child>,
    pub started: serde_json::Value,
    pub stderr: tempfile::NamedTempFile,
    /// The `XDG_STATE_HOME` the harness gave it (none when the test set it, or `HOME`).
    _state_home: Option<tempfile::TempDir>,
}

impl QuickstartRun {
    /// Spawns `command` (quickstart with [`quickstart_args`]) and reads its JSON line; panics
    /// with quickstart's stderr if there is none.
    pub fn spawn(mut command: Command) -> QuickstartRun {
        use std::io::BufRead;
        let chosen = command
            .get_envs()
            .any(|(name, value)| value.is_some() && (name == "XDG_STATE_HOME" || name == "HOME"));
        let state_home = (!chosen).then(|| tempfile::tempdir().unwrap());
        if let Some(home) = &state_home {
            command.env("XDG_STATE_HOME", home.path());
        }
        let stderr = tempfile::NamedTempFile::new().unwrap();
        command
            .stdout(Stdio::piped())
            .stderr(stderr.reopen().unwrap());
        let mut child = command.spawn().unwrap();
        let mut line = String::new();
        let read = std::io::BufReader::new(child.stdout.take().unwrap()).read_line(&mut line);
        match read.ok().and_then(|_| serde_json::from_str(&line).ok()) {
            Some(started) => QuickstartRun {
                child: Some(child),
                started,
                stderr,
                _state_home: state_home,
            },
            None => {
                let _ = child.kill();
                let status = child.wait();
                panic!(
                    "quickstart printed no JSON line ({status:?}); stdout: {line:?}; stderr:\n{}",
                    std::fs::read_to_string(stderr.path()).unwrap_or_default()
                );
            }
        }
    }

    /// The quickstart process.
    pub fn child(&mut self) -> &mut Child {
        self.child.as_mut().expect("the child was handed over")
    }

    /// The process and its `Started` line, for a test that stops it itself.
    pub fn into_parts(mut self) -> (Child, serde_json::Value) {
        let child = self.child.take().expect("the child was handed over");
        (child, std::mem::take(&mut self.started))
    }

    /// What quickstart and its daemons wrote to stderr so far.
    pub fn stderr(&self) -> String {
        std::fs::read_to_string(self.stderr.path()).unwrap()
    }
}

/// A quickstart the test did not stop (it failed, or it only needed the stack) is stopped as a
/// person would, SIGTERM, and waited for, so its daemons never outlive the test and hold its
/// ports; one that does not stop within 30 s is killed.
impl Drop for QuickstartRun {
    fn drop(&mut self) {
        let Some(child) = self.child.as_mut() else {
            return;
        };
        if !matches!(child.try_wait(), Ok(None)) {
            return;
        }
        let _ = send_signal(child, Signal::SIGTERM);
        let deadline = Instant::now() + Duration::from_secs(30);
        while matches!(child.try_wait(), Ok(None)) {
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// `GET /v1/providers` on the socket of the runnerd a quickstart started (`runnerd_socket` of
/// its `Started` line): the `providers` array.
pub fn runnerd_providers(started: &serde_json::Value) -> serde_json::Value {
    let socket = started["runnerd_socket"]
        .as_str()
        .unwrap_or_else(|| panic!("no runnerd_socket in {started}"));
    let client = agentworks_support::unix_http::UnixClient::new(socket);
    let answer: serde_json::Value = super::block_on(client.get("/v1/providers"))
        .unwrap_or_else(|e| panic!("GET /v1/providers on {socket}: {e}"));
    answer["providers"].clone()
}

/// An executable file (0755) at `path`, a shell script that exits 0: what a `--provider`
/// names when the test needs only that runnerd finds it, not that it runs.
pub fn executable_file(path: &Path) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::write(path, "#!/bin/sh\nexit 0\n").unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).unwrap();
}
