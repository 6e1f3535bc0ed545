//! The launcher's entry: the hidden subcommands a binary is re-executed with to run one command
//! in the sandbox, and what the Linux and macOS launchers share.
//!
//! Owns: [`SUBCOMMAND`] and [`PROBE_SUBCOMMAND`], [`main_if_launcher`] (what a binary's `main`
//! calls first), the launcher's arguments (`<policy-json> -- <program> [args...]`) and the
//! check that it has no controlling terminal. The steps themselves are in `launcher/linux.rs`
//! and `launcher/macos.rs`. Must never: run anything before the process is confined, or return
//! to the caller's `main` once a command was started (the launcher exits with its status).

use std::ffi::OsString;
use std::process::ExitCode;

use nix::sys::signal::Signal;
use rustix::fs::{Mode, OFlags};

use crate::{SandboxError, SandboxPolicy};

#[cfg(target_os = "linux")]
mod linux;
#[cfg(target_os = "macos")]
mod macos;
#[cfg(any(target_os = "macos", test))]
mod pinned;
#[cfg(target_os = "linux")]
mod reaper;

#[cfg(target_os = "linux")]
use linux::launch;
#[cfg(target_os = "macos")]
use macos::launch;
#[cfg(target_os = "macos")]
pub(crate) use macos::start_time as process_start_time;

/// The hidden subcommand that puts a binary in launcher mode.
pub const SUBCOMMAND: &str = "__sandbox-exec";
/// The hidden subcommand of the connect-time namespace probe
/// ([`exclusion_mechanism`](crate::exclusion_mechanism)).
pub const PROBE_SUBCOMMAND: &str = "__sandbox-probe";
/// Printed by the launcher before its error; the runner recognises a refusal by it.
pub const REFUSAL_PREFIX: &str = "agentworks sandbox refused: ";
/// Linux: the line the launcher writes on the command's stderr, before the reason, when the
/// policy asked for private terminals and they could not be made (the command then runs with
/// no terminal device at all).
pub const NO_TERMINAL_NOTICE: &str =
    "agentworks sandbox: no terminal for this command (private terminals cannot be made here): ";
/// The exit status of a launcher that refused to run a command.
pub const REFUSAL_EXIT: u8 = 126;

/// The launcher modes of any binary that runs sandboxed commands, recognised by its first
/// argument: [`SUBCOMMAND`] (run one command, [`launcher_main`]) and [`PROBE_SUBCOMMAND`]
/// ([`probe_main`]). `None` when it is neither, and the binary goes on as itself.
///
/// Must be called first in `main`, before anything else runs and while the process is
/// single-threaded: the launcher confines the process it is in. In launcher mode it returns
/// only when the launcher refused, before any command ran, with [`REFUSAL_EXIT`] (the refusal
/// printed to stderr after [`REFUSAL_PREFIX`]); a command that ran ends the process with its
/// own status.
pub fn main_if_launcher() -> Option<ExitCode> {
    let mode = std::env::args_os().nth(1)?;
    if mode == SUBCOMMAND {
        let args: Vec<String> = std::env::args().collect();
        let error = launcher_main(&args[2..]);
        eprintln!("{REFUSAL_PREFIX}{error}");
        return Some(ExitCode::from(REFUSAL_EXIT));
    }
    if mode == PROBE_SUBCOMMAND {
        return Some(ExitCode::from(probe_main()));
    }
    None
}

/// The probe's entry (`<binary> __sandbox-probe`): first thing in `main`, while the process is
/// single-threaded. Linux: enters a user and mount namespace and makes one cover of each kind,
/// detached; prints why it could not on stdout. Returns the exit code (0: usable).
pub fn probe_main() -> u8 {
    #[cfg(target_os = "linux")]
    if let Err(reason) = crate::overmount::probe() {
        println!("{reason}");
        return 1;
    }
    0
}

/// Launcher mode entry ([`main_if_launcher`] calls it): the binary re-executed as
/// `<binary> __sandbox-exec <policy-json> -- <program> [args...]` (Landlock on Linux,
/// `sandbox-exec` on macOS), `args` being what follows the subcommand. Must be called first
/// thing in `main`, while the process is single-threaded. On success it never returns (it exits
/// with the program's status, 128+signal if the program was signalled or the launcher told to
/// stop); it returns only on error, before any command ran, and the caller prints the error
/// after [`REFUSAL_PREFIX`] and exits [`REFUSAL_EXIT`].
pub fn launcher_main(args: &[String]) -> SandboxError {
    match launch(args) {
        Ok(never) => match never {},
        Err(error) => error,
    }
}

/// Sends `signal` to every live process of the command the launcher `launcher` (a child of this
/// process) runs, never to the launcher itself; returns how many. Linux: the launcher's
/// descendants in `/proc` (it is their subreaper, so orphans are among them); macOS: its
/// descendants and the members of its process group.
pub(crate) fn signal_command(launcher: i32, signal: Signal) -> usize {
    #[cfg(target_os = "linux")]
    return reaper::signal_live_descendants(launcher, signal, 0);
    #[cfg(target_os = "macos")]
    return macos::signal_command(launcher, signal);
}

/// Both launchers' last step in the command's process before exec: no signal blocked and
/// every signal at its default action. What the program that started the launcher blocked or
/// ignored is not the command's: a script's `cmd &` starts `cmd` with SIGINT and SIGQUIT
/// ignored, `nohup` adds SIGHUP, and a non-interactive shell cannot trap a signal ignored on
/// entry (POSIX), so `signal` and `kill -INT` would never reach a command's trap; a command
/// started with SIGCHLD blocked waits for its background jobs forever. exec already resets
/// caught signals; ignored ones and the mask it keeps. Async-signal-safe: sigaction and
/// sigprocmask only, nothing allocated.
pub(crate) fn default_signals_for_command() -> std::io::Result<()> {
    #[cfg(target_os = "linux")]
    const LAST_SIGNAL: libc::c_int = 64;
    #[cfg(target_os = "macos")]
    const LAST_SIGNAL: libc::c_int = 31;
    for signal in 1..=LAST_SIGNAL {
        if signal == libc::SIGKILL || signal == libc::SIGSTOP {
            continue;
        }
        // SAFETY: sets a disposition in the forked child, whose only thread this is; SIG_DFL
        // installs no handler. A number the C library keeps for itself (glibc's 32 and 33)
        // fails with EINVAL and keeps its default, which is what we want anyway.
        unsafe { libc::signal(signal, libc::SIG_DFL) };
    }
    nix::sys::signal::SigSet::empty()
        .thread_set_mask()
        .map_err(std::io::Error::from)
}

/// Both launchers' check that they have no controlling terminal: `/dev/tty` must not open
/// (`ENXIO`: no controlling terminal; `ENOENT`: no such device on this machine).
pub(crate) fn check_no_terminal() -> Result<(), SandboxError> {
    match rustix::fs::open(
        "/dev/tty",
        OFlags::RDWR | OFlags::NOCTTY | OFlags::CLOEXEC,
        Mode::empty(),
    ) {
        Ok(_) => Err(SandboxError::Terminal("/dev/tty opens".to_owned())),
        Err(rustix::io::Errno::NXIO | rustix::io::Errno::NOENT) => Ok(()),
        Err(e) => Err(SandboxError::Terminal(format!(
            "opening /dev/tty failed with {e}, not ENXIO"
        ))),
    }
}

pub(crate) type ParsedArgs = (SandboxPolicy, OsString, Vec<OsString>);

/// Both launchers' arguments: `<policy-json> -- <program> [args...]`.
pub(crate) fn parse_launcher_args(args: &[String]) -> Result<ParsedArgs, SandboxError> {
    let [policy, separator, program, rest @ ..] = args else {
        return Err(SandboxError::Usage("too few arguments".to_owned()));
    };
    if separator != "--" {
        return Err(SandboxError::Usage(format!(
            "expected `--` after the policy, got {separator:?}"
        )));
    }
    let policy: SandboxPolicy =
        serde_json::from_str(policy).map_err(|e| SandboxError::Policy(e.to_string()))?;
    Ok((
        policy,
        OsString::from(program),
        rest.iter().map(OsString::from).collect(),
    ))
}
