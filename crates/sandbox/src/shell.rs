//! Run to completion: one shell command through the launcher, its output captured, its time
//! bounded (the laptop's commands; a coding CLI's bridge shell commands on the server).
//!
//! Owns: starting `/bin/sh -c <command>` as a [`SandboxCommand`] with stdin on /dev/null, the
//! caller's environment for it (nothing else: the caller scrubs what it passes) and the
//! variables that point temp files and caches into the policy's private scratch dir (`TMPDIR`,
//! `XDG_CACHE_HOME`, `npm_config_cache`, `PIP_CACHE_DIR`, their dirs made); capturing each
//! stream up to [`MAX_CAPTURE`] (reading on to EOF so the command never blocks); the timeout
//! (60 s by default, at most 300 s); and cancellation, both ending the whole tree
//! ([`SandboxedChild::kill_tree`]).
//!
//! The same on macOS: the launcher there runs the shell under `sandbox-exec` and ends what it
//! left without cgroups; the caps and the stop sequence here are shared, and a command never
//! has a cgroup.
//!
//! Must never: run the command itself (only the launcher does, under Landlock or
//! sandbox-exec); pass the caller's own environment through; retry a command.

use std::ffi::OsString;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::io::{AsyncRead, AsyncReadExt};
use tokio_util::sync::CancellationToken;

use crate::SandboxPolicy;
use crate::process::{Launcher, SandboxCommand, SandboxedChild, SpawnError, Stream, refusal};

/// Default timeout when the request names none.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(60);
/// Longest timeout a request may ask for.
pub const MAX_TIMEOUT: Duration = Duration::from_secs(300);
/// Bytes kept per stream; the rest is read and discarded.
pub const MAX_CAPTURE: usize = 1024 * 1024;
/// How long output readers may run on after the launcher exited.
const DRAIN_GRACE: Duration = Duration::from_secs(5);
/// The shell every command runs in.
const SHELL: &str = "/bin/sh";

/// One shell command to run.
#[derive(Debug, Clone)]
pub struct ShellCommand {
    pub command: String,
    /// Default [`DEFAULT_TIMEOUT`]; zero or above [`MAX_TIMEOUT`] is refused.
    pub timeout: Option<Duration>,
    pub policy: SandboxPolicy,
    /// The command's whole environment, besides the scratch variables (which win).
    pub env: Vec<(OsString, OsString)>,
}

/// What happened. `exit_code` is the launcher's: the shell's status, or 128+signal when the
/// shell was signalled or the launcher was stopped; `signal` is set when the launcher itself
/// died of a signal (the SIGKILL after the grace period).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShellOutcome {
    pub exit_code: Option<i32>,
    pub signal: Option<i32>,
    /// Lossy UTF-8.
    pub stdout: String,
    pub stderr: String,
    pub stdout_truncated: bool,
    pub stderr_truncated: bool,
    pub timed_out: bool,
    pub cancelled: bool,
    pub duration_ms: u64,
}

#[derive(Debug, thiserror::Error)]
pub enum ShellError {
    #[error("timeout {requested:?} is above the maximum of {max:?}")]
    TimeoutTooLong { requested: Duration, max: Duration },
    #[error("timeout must be more than zero")]
    ZeroTimeout,
    #[error("cannot prepare the scratch dir {path}: {source}")]
    Scratch {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Spawn(#[from] SpawnError),
    #[error("cannot wait for the sandbox launcher: {0}")]
    Wait(#[source] std::io::Error),
    /// The launcher refused: no sandbox, so the command never ran.
    #[error("the command was not run: {0}")]
    SandboxRefused(String),
}

/// Runs `command` through `launcher` and returns once every process of it is gone: it exited,
/// timed out or `cancel` fired (the last two end its tree).
pub async fn run(
    launcher: &Launcher,
    command: ShellCommand,
    cancel: CancellationToken,
) -> Result<ShellOutcome, ShellError> {
    let timeout = checked_timeout(command.timeout)?;
    let scratch_env = prepare_scratch(&command.policy.scratch)?;
    let mut sandboxed = SandboxCommand::new(SHELL, command.policy);
    sandboxed
        .arg("-c")
        .arg(&command.command)
        .envs(command.env)
        .envs(scratch_env)
        .stdout(Stream::Piped)
        .stderr(Stream::Piped);
    let started = Instant::now();
    let mut child = sandboxed.spawn(launcher)?;

    let stdout = Capture::start(child.stdout.take());
    let stderr = Capture::start(child.stderr.take());

    let mut timed_out = false;
    let mut cancelled = false;
    let status = tokio::select! {
        status = child.wait() => status.map_err(ShellError::Wait)?,
        () = tokio::time::sleep(timeout) => {
            timed_out = true;
            stop(&mut child).await?
        }
        () = cancel.cancelled() => {
            cancelled = true;
            stop(&mut child).await?
        }
    };

    let drain_until = tokio::time::Instant::now() + DRAIN_GRACE;
    let (stdout, stdout_truncated) = stdout.finish(drain_until).await;
    let (stderr, stderr_truncated) = stderr.finish(drain_until).await;
    let duration_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);

    if let Some(reason) = refusal(&status, &stderr) {
        return Err(ShellError::SandboxRefused(reason.to_owned()));
    }
    Ok(ShellOutcome {
        exit_code: status.code(),
        signal: status.signal(),
        stdout,
        stderr,
        stdout_truncated,
        stderr_truncated,
        timed_out,
        cancelled,
        duration_ms,
    })
}

async fn stop(child: &mut SandboxedChild) -> Result<std::process::ExitStatus, ShellError> {
    child.kill_tree().await.map_err(ShellError::Wait)
}

/// The request's timeout: [`DEFAULT_TIMEOUT`] when it names none; zero or above
/// [`MAX_TIMEOUT`] is refused.
fn checked_timeout(requested: Option<Duration>) -> Result<Duration, ShellError> {
    match requested {
        None => Ok(DEFAULT_TIMEOUT),
        Some(t) if t.is_zero() => Err(ShellError::ZeroTimeout),
        Some(t) if t > MAX_TIMEOUT => Err(ShellError::TimeoutTooLong {
            requested: t,
            max: MAX_TIMEOUT,
        }),
        Some(t) => Ok(t),
    }
}

/// The variables that point temp files and caches into the private `scratch` dir, with their
/// dirs made.
fn prepare_scratch(scratch: &Path) -> Result<[(&'static str, PathBuf); 4], ShellError> {
    let scratch_env = [
        ("TMPDIR", scratch.to_owned()),
        ("XDG_CACHE_HOME", scratch.join("cache")),
        ("npm_config_cache", scratch.join("npm")),
        ("PIP_CACHE_DIR", scratch.join("pip")),
    ];
    for (_, dir) in &scratch_env {
        std::fs::create_dir_all(dir).map_err(|source| ShellError::Scratch {
            path: dir.clone(),
            source,
        })?;
    }
    Ok(scratch_env)
}

/// One output stream read to EOF in a task, keeping the first [`MAX_CAPTURE`] bytes.
struct Capture {
    shared: Arc<Mutex<(Vec<u8>, bool)>>,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl Capture {
    fn start<R: AsyncRead + Unpin + Send + 'static>(reader: Option<R>) -> Capture {
        let shared = Arc::new(Mutex::new((Vec::new(), false)));
        let task = reader.map(|mut reader| {
            let shared = Arc::clone(&shared);
            tokio::spawn(async move {
                let mut chunk = vec![0u8; 64 * 1024];
                loop {
                    let n = match reader.read(&mut chunk).await {
                        Ok(0) | Err(_) => break,
                        Ok(n) => n,
                    };
                    let Ok(mut buf) = shared.lock() else { break };
                    let room = MAX_CAPTURE.saturating_sub(buf.0.len());
                    buf.0.extend_from_slice(&chunk[..n.min(room)]);
                    if n > room {
                        buf.1 = true;
                    }
                }
            })
        });
        Capture { shared, task }
    }

    /// Waits for EOF until `until` (a descendant that somehow kept the pipe open cannot hold
    /// the result hostage), then returns the text and whether it was truncated.
    async fn finish(mut self, until: tokio::time::Instant) -> (String, bool) {
        if let Some(mut task) = self.task.take()
            && tokio::time::timeout_at(until, &mut task).await.is_err()
        {
            task.abort();
        }
        match self.shared.lock() {
            Ok(buf) => (String::from_utf8_lossy(&buf.0).into_owned(), buf.1),
            Err(_) => (String::new(), false),
        }
    }
}
