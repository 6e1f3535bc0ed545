//! What the caller sets on a launcher it is about to spawn (in
//! [`SandboxCommand::spawn`](crate::process::SandboxCommand::spawn)), run in the forked child
//! before it execs the launcher: a new session, death with its parent, the pinned descriptors
//! inherited.
//!
//! Owns: the caller's side of starting a launcher. Must never: do anything in the forked child
//! that is not async-signal-safe (no allocation, no lock), or clear close-on-exec on a
//! descriptor the policy does not pin.

use std::io;

#[cfg(target_os = "linux")]
use nix::sys::signal::Signal;

use crate::SandboxPolicy;

/// Makes a launcher about to be spawned by `command` receive SIGTERM when the caller dies
/// (even by SIGKILL), so that it kills the command and every descendant instead of running on
/// unsupervised. The launcher blocks SIGTERM and handles it like a stop request. A launcher
/// whose parent is already gone when it starts never execs. (The kernel sends the signal when
/// the spawning *thread* ends: spawn from a runtime worker thread, never a blocking-pool one.)
#[cfg(target_os = "linux")]
pub(crate) fn die_with_parent(command: &mut tokio::process::Command) {
    let parent = nix::unistd::getpid();
    // SAFETY: the closure runs in the forked child before exec and only makes two
    // async-signal-safe system calls (prctl, getppid); it allocates nothing and takes no lock.
    unsafe {
        command.pre_exec(move || {
            nix::sys::prctl::set_pdeathsig(Signal::SIGTERM)?;
            if nix::unistd::getppid() != parent {
                return Err(io::Error::from_raw_os_error(libc::ESRCH));
            }
            Ok(())
        });
    }
}

/// macOS has no `PR_SET_PDEATHSIG`: the launcher notes its parent when it starts (and refuses to
/// start if it was re-parented already) and, in its wait loop, ends the command and every
/// process of it as soon as it is re-parented. Nothing to set before exec.
#[cfg(target_os = "macos")]
pub(crate) fn die_with_parent(_command: &mut tokio::process::Command) {}

/// Lets the launcher about to be spawned by `command` inherit the policy's pinned descriptors:
/// they are close-on-exec in the caller (so no other child gets them) and the child clears
/// that flag on exactly these, before exec. The launcher marks every inherited descriptor
/// close-on-exec again first thing, so the command never holds them.
pub(crate) fn inherit_pinned(command: &mut tokio::process::Command, policy: &SandboxPolicy) {
    let fds: Vec<i32> = policy.pinned.iter().map(|p| p.fd).collect();
    if fds.is_empty() {
        return;
    }
    // SAFETY: the closure runs in the forked child before exec and only calls fcntl(F_SETFD),
    // which is async-signal-safe, on descriptor numbers copied before the fork; it allocates
    // nothing (the Vec was built in the parent) and takes no lock. F_SETFD with 0 only clears
    // FD_CLOEXEC on the child's own table entry; a stale number fails with EBADF, which fails
    // the spawn.
    unsafe {
        command.pre_exec(move || {
            for &fd in &fds {
                if libc::fcntl(fd, libc::F_SETFD, 0) == -1 {
                    return Err(io::Error::last_os_error());
                }
            }
            Ok(())
        });
    }
}

/// Makes a launcher about to be spawned by `command` the leader of a new session (and so of a
/// new process group with its pid as id, which `killpg(launcher)` reaches), with no controlling
/// terminal. Used instead of `process_group(0)`: `setsid()` fails for a process-group leader.
/// The launcher checks again ([`launcher_main`](crate::launcher_main) step 2) and refuses
/// without it.
pub(crate) fn new_session(command: &mut tokio::process::Command) {
    // SAFETY: the closure runs in the forked child before exec and makes one async-signal-safe
    // system call (setsid); it allocates nothing and takes no lock.
    unsafe {
        command.pre_exec(|| {
            nix::unistd::setsid()?;
            Ok(())
        });
    }
}
