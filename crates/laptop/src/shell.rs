//! The shell runner: one command through the sandbox launcher, with the command limits.
//!
//! Owns: spawning `<launcher> __sandbox-exec <policy> -- /bin/sh -c <command>` as the leader of a
//! new session (no controlling terminal; its process group id is its pid) with stdin on /dev/null and a scrubbed environment (only PATH, HOME, LANG, LC_*, TERM,
//! USER, LOGNAME, SHELL, TZ survive; caches and TMPDIR point into the private scratch dir),
//! capturing each stream up to [`MAX_CAPTURE`] (reading on to EOF so the command never blocks),
//! the timeout (60 s by default, at most 300 s) and cancellation: SIGTERM to the launcher, which
//! kills every descendant, then `cgroup.kill` on the command's cgroup (when it has one) after a
//! grace period, and SIGKILL to the launcher's process group after a longer one.
//!
//! The same on macOS: the launcher there runs the shell under `sandbox-exec` and ends what it
//! left without cgroups (`sandbox/macos.rs`); the caps, the scrubbing and the stop sequence here
//! are shared, and a command never has a cgroup.
//!
//! Must never: run the command itself (only the launcher does, under Landlock or sandbox-exec); pass the
//! executor's environment through (login tokens, provider keys, agent sockets); retry a command.

use std::ffi::OsString;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill, killpg};
use nix::unistd::Pid;
use tokio::io::{AsyncRead, AsyncReadExt};
use tokio_util::sync::CancellationToken;

use agentworks_sandbox::cgroup::kill_cgroup_at;
use agentworks_sandbox::{REFUSAL_PREFIX, SUBCOMMAND, SandboxPolicy};

/// Default timeout when the request names none.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(60);
/// Longest timeout a request may ask for.
pub const MAX_TIMEOUT: Duration = Duration::from_secs(300);
/// Bytes kept per stream; the rest is read and discarded.
pub const MAX_CAPTURE: usize = 1024 * 1024;
/// Between SIGTERM to the launcher and `cgroup.kill` on the command's cgroup.
pub const KILL_GRACE: Duration = Duration::from_secs(2);
/// Between SIGTERM to the launcher and SIGKILL to its process group. Without a cgroup the
/// launcher is the only one that can find the command's orphans (they are its children), and
/// killing it hands them to init, so it gets time to finish; only a launcher stuck on a process
/// that cannot die (uninterruptible sleep) needs the SIGKILL.
pub const LAUNCHER_GRACE: Duration = Duration::from_secs(10);
/// The exit status the launcher uses when it refuses to run a command.
pub const REFUSAL_EXIT: i32 = 126;
/// How long output readers may run on after the launcher exited.
const DRAIN_GRACE: Duration = Duration::from_secs(5);
/// The shell every command runs in.
const SHELL: &str = "/bin/sh";
/// Environment variables kept from the executor's environment (plus every `LC_*`).
const KEPT_ENV: &[&str] = &[
    "PATH", "HOME", "LANG", "TERM", "USER", "LOGNAME", "SHELL", "TZ",
];

/// One command to run.
#[derive(Debug, Clone)]
pub struct ShellRequest {
    pub command: String,
    /// Default [`DEFAULT_TIMEOUT`]; above [`MAX_TIMEOUT`] is refused.
    pub timeout: Option<Duration>,
    pub policy: SandboxPolicy,
    /// Extra variables set for the command (e.g. `AGENTWORKS_DOWNLOADS`).
    pub env_extra: Vec<(String, String)>,
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
    #[error("cannot encode the sandbox policy: {0}")]
    Policy(#[from] serde_json::Error),
    #[error("cannot prepare the scratch dir {path}: {source}")]
    Scratch {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot start the sandbox launcher {exe}: {source}")]
    Spawn {
        exe: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot wait for the sandbox launcher: {0}")]
    Wait(#[source] std::io::Error),
    /// The launcher refused: no sandbox, so the command never ran.
    #[error("the command was not run: {0}")]
    SandboxRefused(String),
}

/// Runs one command through the launcher (`launcher_exe` is `std::env::current_exe()` in
/// production), with the executor's own environment as the one to scrub.
pub async fn run(
    launcher_exe: &Path,
    request: ShellRequest,
    cancel: CancellationToken,
) -> Result<ShellOutcome, ShellError> {
    run_with_env(launcher_exe, request, cancel, std::env::vars_os().collect()).await
}

/// [`run`] with an explicit parent environment to scrub (tests pass secrets in it without
/// mutating the process environment).
pub async fn run_with_env(
    launcher_exe: &Path,
    request: ShellRequest,
    cancel: CancellationToken,
    parent_env: Vec<(OsString, OsString)>,
) -> Result<ShellOutcome, ShellError> {
    let timeout = checked_timeout(request.timeout)?;
    let policy_json = serde_json::to_string(&request.policy)?;
    let scratch_env = prepare_scratch(&request.policy.scratch)?;
    let mut command = launcher_command(
        launcher_exe,
        &request,
        &policy_json,
        parent_env,
        &scratch_env,
    );
    let started = Instant::now();
    let mut child = command.spawn().map_err(|source| ShellError::Spawn {
        exe: launcher_exe.to_owned(),
        source,
    })?;
    let launcher = child
        .id()
        .and_then(|id| i32::try_from(id).ok())
        .map(Pid::from_raw);
    let cgroup = request.policy.limits.cgroup.clone();
    let mut guard = StopGuard {
        launcher,
        cgroup: cgroup.clone(),
    };

    let stdout = Capture::start(child.stdout.take());
    let stderr = Capture::start(child.stderr.take());

    let mut timed_out = false;
    let mut cancelled = false;
    let status = tokio::select! {
        status = child.wait() => status.map_err(ShellError::Wait)?,
        () = tokio::time::sleep(timeout) => {
            timed_out = true;
            stop(&mut child, launcher, cgroup.as_deref()).await?
        }
        () = cancel.cancelled() => {
            cancelled = true;
            stop(&mut child, launcher, cgroup.as_deref()).await?
        }
    };
    guard.launcher = None;
    kill_leftovers(launcher, cgroup.as_deref());

    let drain_until = tokio::time::Instant::now() + DRAIN_GRACE;
    let (stdout, stdout_truncated) = stdout.finish(drain_until).await;
    let (stderr, stderr_truncated) = stderr.finish(drain_until).await;
    let duration_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);

    if status.code() == Some(REFUSAL_EXIT)
        && let Some(reason) = stderr.strip_prefix(REFUSAL_PREFIX)
    {
        return Err(ShellError::SandboxRefused(reason.trim_end().to_owned()));
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

/// `<launcher> __sandbox-exec <policy> -- /bin/sh -c <command>` with stdin on /dev/null, the
/// output piped, and only the scrubbed parent environment, the request's extra variables and
/// the scratch variables.
fn launcher_command(
    launcher_exe: &Path,
    request: &ShellRequest,
    policy_json: &str,
    parent_env: Vec<(OsString, OsString)>,
    scratch_env: &[(&'static str, PathBuf)],
) -> tokio::process::Command {
    let mut command = tokio::process::Command::new(launcher_exe);
    command
        .arg(SUBCOMMAND)
        .arg(policy_json)
        .arg("--")
        .arg(SHELL)
        .arg("-c")
        .arg(&request.command)
        .env_clear()
        .envs(scrub_env(parent_env))
        .envs(request.env_extra.iter().map(|(k, v)| (k, v)))
        .envs(scratch_env.iter().map(|(k, v)| (k, v)))
        .current_dir(&request.policy.cwd)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());

    // A new session (and process group) for the launcher: no controlling terminal, and the
    // group id is the launcher's pid, which the SIGKILL fallback reaches.
    agentworks_sandbox::new_session(&mut command);
    agentworks_sandbox::die_with_parent(&mut command);
    agentworks_sandbox::inherit_pinned(&mut command, &request.policy);
    command
}

/// After the launcher has been reaped: anything still in its cgroup or its group (it should
/// have killed them all) goes now. A group with members keeps its id from being reused.
fn kill_leftovers(launcher: Option<Pid>, cgroup: Option<&Path>) {
    if let Some(path) = cgroup {
        kill_cgroup_at(path);
    }
    if let Some(pid) = launcher {
        let _ = killpg(pid, Signal::SIGKILL);
    }
}

/// Whether a command keeps this variable of the executor's environment: PATH, HOME, LANG,
/// LC_*, TERM, USER, LOGNAME, SHELL and TZ.
pub fn kept_env(key: &std::ffi::OsStr) -> bool {
    key.to_str()
        .is_some_and(|k| KEPT_ENV.contains(&k) || k.starts_with("LC_"))
}

/// Keeps what [`kept_env`] keeps; drops everything else.
fn scrub_env(parent: Vec<(OsString, OsString)>) -> Vec<(OsString, OsString)> {
    parent
        .into_iter()
        .filter(|(key, _)| kept_env(key))
        .collect()
}

/// SIGTERM to the launcher (it kills every descendant), then, after [`KILL_GRACE`],
/// `cgroup.kill` on the command's cgroup (when it has one), and after [`LAUNCHER_GRACE`]
/// SIGKILL to the launcher's process group (its session: everything that did not make a
/// session of its own).
async fn stop(
    child: &mut tokio::process::Child,
    launcher: Option<Pid>,
    cgroup: Option<&Path>,
) -> Result<ExitStatus, ShellError> {
    if let Some(pid) = launcher {
        let _ = kill(pid, Signal::SIGTERM);
    }
    if let Ok(status) = tokio::time::timeout(KILL_GRACE, child.wait()).await {
        return status.map_err(ShellError::Wait);
    }
    if let Some(path) = cgroup {
        kill_cgroup_at(path);
    }
    let rest = LAUNCHER_GRACE.saturating_sub(KILL_GRACE);
    if let Ok(status) = tokio::time::timeout(rest, child.wait()).await {
        return status.map_err(ShellError::Wait);
    }
    if let Some(pid) = launcher {
        let _ = killpg(pid, Signal::SIGKILL);
    }
    child.wait().await.map_err(ShellError::Wait)
}

/// If `run` is dropped mid-command, stop it the same way (SIGTERM now, cgroup.kill and SIGKILL
/// to the group after the grace periods, from a plain thread since no runtime may be left).
/// Nobody waits for the launcher then, so its pid may be reused meanwhile: the group is only
/// killed if the process with that pid still has the launcher's start time.
struct StopGuard {
    launcher: Option<Pid>,
    cgroup: Option<PathBuf>,
}

impl Drop for StopGuard {
    fn drop(&mut self) {
        if let Some(pid) = self.launcher.take() {
            let started = start_time(pid);
            let _ = kill(pid, Signal::SIGTERM);
            let cgroup = self.cgroup.take();
            std::thread::spawn(move || {
                std::thread::sleep(KILL_GRACE);
                if let Some(path) = &cgroup {
                    kill_cgroup_at(path);
                }
                std::thread::sleep(LAUNCHER_GRACE.saturating_sub(KILL_GRACE));
                if started.is_some() && start_time(pid) == started {
                    let _ = killpg(pid, Signal::SIGKILL);
                }
            });
        }
    }
}

/// The start time (clock ticks since boot, field 22 of `/proc/<pid>/stat`) of `pid`.
#[cfg(target_os = "linux")]
fn start_time(pid: Pid) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let (_, after_name) = stat.rsplit_once(')')?;
    after_name.split_whitespace().nth(19)?.parse().ok()
}

/// The start time of `pid` (macOS: from `proc_pidinfo`, there is no `/proc`).
#[cfg(target_os = "macos")]
fn start_time(pid: Pid) -> Option<u64> {
    agentworks_sandbox::process_start_time(pid.as_raw())
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
