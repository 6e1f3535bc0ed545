//! A command started in the sandbox, and the handle on it: what every program that runs
//! commands for an agent uses (the laptop's shell runner and patch applier; a daemon running a
//! coding CLI for minutes while it streams JSON lines on stdout).
//!
//! Owns: [`Launcher`] (which executable is the launcher: one whose `main` calls
//! [`main_if_launcher`](crate::launcher::main_if_launcher) first; by default this process's
//! own), [`SandboxCommand`] (the program, its arguments, its policy, its environment — explicit,
//! nothing inherited — and which standard streams are piped) and [`SandboxedChild`]: the running
//! command, whose pipes the caller reads and writes as it goes, [`SandboxedChild::signal`] to
//! every process of it, [`SandboxedChild::kill_tree`] to end all of them, and
//! [`SandboxedChild::wait`] for its exit. A handle dropped before its launcher was reaped ends
//! the tree itself.
//!
//! The launcher is spawned as `<launcher> __sandbox-exec <policy-json> -- <program> [args...]`:
//! the leader of a new session (no controlling terminal; its process group id is its pid),
//! receiving SIGTERM when the thread that spawned it ends (Linux; on macOS the launcher ends the
//! command once it sees its parent is gone), with the policy's pinned descriptors inherited and
//! no other, in the command's working directory. Its exit status is the
//! command's (128+signal when the command was signalled or the launcher told to stop); a
//! launcher that refused exits [`REFUSAL_EXIT`] after writing [`REFUSAL_PREFIX`] and why to
//! stderr ([`refusal`] reads it).
//!
//! Ending the tree, in this order: SIGTERM to the launcher, which kills every process of the
//! command and exits once none is left; after [`KILL_GRACE`], `cgroup.kill` on the command's
//! cgroup (when it has one); after [`LAUNCHER_GRACE`], SIGKILL to the launcher's process group.
//! Once the launcher is reaped, whatever is still in the cgroup or the group is killed too.
//!
//! Must never: give the command the caller's environment (only what the caller set), a terminal
//! or any stream of the caller's on its standard streams (only /dev/null or pipes), or a
//! descriptor the policy does not pin; signal a process that is not the command's; leave the
//! command running once the handle is gone.

use std::ffi::{OsStr, OsString};
use std::io;
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use nix::sys::signal::{Signal, kill, killpg};
use nix::unistd::Pid;
use tokio::process::{ChildStderr, ChildStdin, ChildStdout};

use crate::cgroup::kill_cgroup_at;
use crate::launcher::{REFUSAL_EXIT, REFUSAL_PREFIX, SUBCOMMAND};
use crate::{SandboxPolicy, spawn};

/// Between SIGTERM to the launcher and `cgroup.kill` on the command's cgroup.
pub const KILL_GRACE: Duration = Duration::from_secs(2);
/// Between SIGTERM to the launcher and SIGKILL to its process group. Without a cgroup the
/// launcher is the only one that can find the command's orphans (they are its children), and
/// killing it hands them to init, so it gets time to finish; only a launcher stuck on a process
/// that cannot die (uninterruptible sleep) needs the SIGKILL.
pub const LAUNCHER_GRACE: Duration = Duration::from_secs(10);

/// The executable a [`SandboxCommand`] re-executes as its launcher: a binary whose `main` calls
/// [`main_if_launcher`](crate::launcher::main_if_launcher) before anything else.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Launcher {
    exe: PathBuf,
}

impl Launcher {
    /// This process's own executable, the usual launcher (the laptop's `agentworks`, a daemon's
    /// own binary).
    pub fn current_exe() -> io::Result<Launcher> {
        std::env::current_exe().map(Launcher::at)
    }

    /// The launcher at `exe`.
    pub fn at(exe: impl Into<PathBuf>) -> Launcher {
        Launcher { exe: exe.into() }
    }

    pub fn exe(&self) -> &Path {
        &self.exe
    }
}

/// What a command's standard stream is. Never one of the caller's own: a terminal there would let
/// the command read the person's keystrokes or draw on their screen, a socket would reach
/// whatever is at its other end.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Stream {
    /// `/dev/null`.
    #[default]
    Null,
    /// A pipe to the caller, in [`SandboxedChild::stdin`], `stdout` or `stderr`.
    Piped,
}

impl Stream {
    fn stdio(self) -> Stdio {
        match self {
            Stream::Null => Stdio::null(),
            Stream::Piped => Stdio::piped(),
        }
    }
}

/// Why a command could not be started (nothing ran).
#[derive(Debug, thiserror::Error)]
pub enum SpawnError {
    #[error("cannot encode the sandbox policy: {0}")]
    Policy(#[from] serde_json::Error),
    #[error("cannot start the sandbox launcher {exe}: {source}")]
    Launcher {
        exe: PathBuf,
        #[source]
        source: io::Error,
    },
}

/// A command to run in the sandbox: a program (found by the launcher through the `PATH` given
/// here, if not a path), its arguments, the policy it runs under (its working directory is the
/// policy's `cwd`), its environment — empty unless set here — and its standard streams, each
/// `/dev/null` unless piped.
#[derive(Debug, Clone)]
pub struct SandboxCommand {
    program: OsString,
    args: Vec<OsString>,
    policy: SandboxPolicy,
    env: Vec<(OsString, OsString)>,
    stdin: Stream,
    stdout: Stream,
    stderr: Stream,
}

impl SandboxCommand {
    pub fn new(program: impl AsRef<OsStr>, policy: SandboxPolicy) -> SandboxCommand {
        SandboxCommand {
            program: program.as_ref().to_owned(),
            args: Vec::new(),
            policy,
            env: Vec::new(),
            stdin: Stream::Null,
            stdout: Stream::Null,
            stderr: Stream::Null,
        }
    }

    pub fn arg(&mut self, arg: impl AsRef<OsStr>) -> &mut SandboxCommand {
        self.args.push(arg.as_ref().to_owned());
        self
    }

    pub fn args<I, S>(&mut self, args: I) -> &mut SandboxCommand
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        self.args
            .extend(args.into_iter().map(|a| a.as_ref().to_owned()));
        self
    }

    /// Sets one variable of the command's environment (a later one of the same name wins).
    pub fn env(&mut self, key: impl AsRef<OsStr>, value: impl AsRef<OsStr>) -> &mut SandboxCommand {
        self.env
            .push((key.as_ref().to_owned(), value.as_ref().to_owned()));
        self
    }

    pub fn envs<I, K, V>(&mut self, vars: I) -> &mut SandboxCommand
    where
        I: IntoIterator<Item = (K, V)>,
        K: AsRef<OsStr>,
        V: AsRef<OsStr>,
    {
        for (key, value) in vars {
            self.env(key, value);
        }
        self
    }

    pub fn stdin(&mut self, stream: Stream) -> &mut SandboxCommand {
        self.stdin = stream;
        self
    }

    pub fn stdout(&mut self, stream: Stream) -> &mut SandboxCommand {
        self.stdout = stream;
        self
    }

    pub fn stderr(&mut self, stream: Stream) -> &mut SandboxCommand {
        self.stderr = stream;
        self
    }

    pub fn policy(&self) -> &SandboxPolicy {
        &self.policy
    }

    /// Starts the launcher, which confines itself and then runs the program. Returns once the
    /// launcher is started, not the program: a launcher that refuses exits [`REFUSAL_EXIT`]
    /// ([`refusal`]). Call it from a tokio runtime's worker thread (or the thread that runs
    /// `block_on`), never a blocking-pool one: on Linux the launcher is sent SIGTERM (and ends
    /// the command) when the spawning thread ends. The policy's pinned descriptors must stay
    /// open until this returns.
    pub fn spawn(&self, launcher: &Launcher) -> Result<SandboxedChild, SpawnError> {
        let policy_json = serde_json::to_string(&self.policy)?;
        let mut command = tokio::process::Command::new(launcher.exe());
        command
            .arg(SUBCOMMAND)
            .arg(policy_json)
            .arg("--")
            .arg(&self.program)
            .args(&self.args)
            .env_clear()
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .current_dir(&self.policy.cwd)
            .stdin(self.stdin.stdio())
            .stdout(self.stdout.stdio())
            .stderr(self.stderr.stdio());
        // A new session (and process group) for the launcher: no controlling terminal, and the
        // group id is the launcher's pid, which the SIGKILL fallback reaches.
        spawn::new_session(&mut command);
        spawn::die_with_parent(&mut command);
        spawn::inherit_pinned(&mut command, &self.policy);
        let mut child = command.spawn().map_err(|source| SpawnError::Launcher {
            exe: launcher.exe().to_owned(),
            source,
        })?;
        let pid = child
            .id()
            .and_then(|id| i32::try_from(id).ok())
            .map(Pid::from_raw);
        let cgroup = self.policy.limits.cgroup.clone();
        Ok(SandboxedChild {
            stdin: child.stdin.take(),
            stdout: child.stdout.take(),
            stderr: child.stderr.take(),
            child,
            pid,
            guard: StopGuard {
                launcher: pid,
                cgroup: cgroup.clone(),
            },
            cgroup,
        })
    }
}

/// A command running in the sandbox: its launcher, whose status is the command's, and the
/// pipes of the streams that were piped.
#[derive(Debug)]
pub struct SandboxedChild {
    pub stdin: Option<ChildStdin>,
    pub stdout: Option<ChildStdout>,
    pub stderr: Option<ChildStderr>,
    child: tokio::process::Child,
    /// The launcher's pid, which is also its process group's id.
    pid: Option<Pid>,
    cgroup: Option<PathBuf>,
    /// Armed until the launcher is reaped: dropping the handle before that ends the tree.
    guard: StopGuard,
}

impl SandboxedChild {
    /// The launcher's process id (its process group's too).
    pub fn id(&self) -> Option<u32> {
        self.pid.and_then(|pid| u32::try_from(pid.as_raw()).ok())
    }

    /// Sends `signal` to every live process of the command (the program and all it started,
    /// orphans included: they are the launcher's descendants, since it is their subreaper), never
    /// to the launcher, which would take SIGTERM, SIGINT and SIGHUP as a request to end the tree.
    /// A command that traps the signal gets to act on it (a coding CLI finishing its turn).
    /// Returns how many processes were signalled: none before the launcher started the program,
    /// nor once the launcher was reaped. Reads `/proc` (Linux) or the process table (macOS):
    /// blocking, but brief.
    pub fn signal(&self, signal: Signal) -> usize {
        match self.guard.launcher {
            Some(launcher) => crate::launcher::signal_command(launcher.as_raw(), signal),
            None => 0,
        }
    }

    /// Waits for the launcher to exit, which it does once the program has and every other
    /// process of the command is gone; returns its status (the program's). Cancel-safe.
    pub async fn wait(&mut self) -> io::Result<ExitStatus> {
        let status = self.child.wait().await?;
        self.reaped();
        Ok(status)
    }

    /// Ends the command's whole tree (the sequence of the module doc) and returns the
    /// launcher's status: 128+SIGTERM when it ended the command, or the program's own if that
    /// had exited already.
    pub async fn kill_tree(&mut self) -> io::Result<ExitStatus> {
        if let Some(pid) = self.guard.launcher {
            let _ = kill(pid, Signal::SIGTERM);
        }
        if let Ok(status) = tokio::time::timeout(KILL_GRACE, self.child.wait()).await {
            return self.after(status);
        }
        if let Some(path) = &self.cgroup {
            kill_cgroup_at(path);
        }
        let rest = LAUNCHER_GRACE.saturating_sub(KILL_GRACE);
        if let Ok(status) = tokio::time::timeout(rest, self.child.wait()).await {
            return self.after(status);
        }
        if let Some(pid) = self.guard.launcher {
            let _ = killpg(pid, Signal::SIGKILL);
        }
        let status = self.child.wait().await;
        self.after(status)
    }

    fn after(&mut self, status: io::Result<ExitStatus>) -> io::Result<ExitStatus> {
        let status = status?;
        self.reaped();
        Ok(status)
    }

    /// The launcher has been reaped: the guard is disarmed, and anything still in the command's
    /// cgroup or the launcher's group (it should have killed them all) goes now. A group with
    /// members keeps its id from being reused.
    fn reaped(&mut self) {
        if self.guard.launcher.take().is_none() {
            return;
        }
        if let Some(path) = &self.cgroup {
            kill_cgroup_at(path);
        }
        if let Some(pid) = self.pid {
            let _ = killpg(pid, Signal::SIGKILL);
        }
    }
}

/// The launcher's refusal, when `status` and the `stderr` it wrote say it refused to run the
/// command (nothing ran): the reason, without [`REFUSAL_PREFIX`].
pub fn refusal<'a>(status: &ExitStatus, stderr: &'a str) -> Option<&'a str> {
    if status.code() != Some(i32::from(REFUSAL_EXIT)) {
        return None;
    }
    stderr
        .strip_prefix(REFUSAL_PREFIX)
        .map(|reason| reason.trim_end())
}

/// If the handle is dropped before its launcher was reaped, the tree is ended the same way
/// (SIGTERM now, `cgroup.kill` and SIGKILL to the group after the grace periods, from a plain
/// thread since no runtime may be left). Nobody waits for the launcher then, so its pid may be
/// reused meanwhile: the group is only killed if the process with that pid still has the
/// launcher's start time.
#[derive(Debug)]
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
    crate::launcher::process_start_time(pid.as_raw())
}
