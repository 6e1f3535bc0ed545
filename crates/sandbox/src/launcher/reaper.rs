//! The launcher's reaper: waiting for the shell, then ending and reaping every process the
//! command left (it is a child subreaper, so every orphan of the command is its child).
//!
//! Owns: the wait loop, `cgroup.kill`, the SIGKILL rounds over /proc and the reaping until
//! `ECHILD`. Must never: return while a process of the command may still be alive, or signal a
//! process that is not a descendant of the launcher.

use std::time::Duration;

use nix::errno::Errno;
use nix::sys::signal::{SigSet, Signal, kill};
use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
use nix::unistd::Pid;
use rustix::fs::{Mode, OFlags};

use crate::cgroup::CommandCgroupFds;

/// Waits for the shell; returns its status (128+signal if signalled), or 128+signal of a stop
/// signal the launcher received first. Orphans that exit meanwhile are reaped.
pub(super) fn wait_for_shell(shell: Pid, signals: &SigSet) -> i32 {
    loop {
        match signals.wait() {
            Ok(Signal::SIGCHLD) => {
                if let Some(status) = reap(Some(shell)) {
                    return status;
                }
            }
            Ok(stop) => return 128 + stop as i32,
            Err(Errno::EINTR) => continue,
            // sigwait cannot fail with a valid set; if it does, stop everything rather than spin.
            Err(_) => return 125,
        }
    }
}

/// Reaps every exited child without blocking; returns the shell's status if it was among them.
fn reap(shell: Option<Pid>) -> Option<i32> {
    let mut found = None;
    loop {
        match waitpid(None, Some(WaitPidFlag::WNOHANG)) {
            Ok(WaitStatus::Exited(pid, code)) if Some(pid) == shell => found = Some(code),
            Ok(WaitStatus::Signaled(pid, signal, _)) if Some(pid) == shell => {
                found = Some(128 + signal as i32);
            }
            Ok(WaitStatus::StillAlive) | Err(Errno::ECHILD) => return found,
            Ok(_) | Err(Errno::EINTR) => continue,
            Err(_) => return found,
        }
    }
}

/// Ends whatever the command left running, and returns only when `waitpid(-1)` answers
/// `ECHILD`: no child, live or zombie, is left, and since the launcher is a subreaper every
/// orphan of the command was its child, so no process of the command exists any more.
///
/// `cgroup.kill` comes first where the command has a cgroup: the kernel kills every process in
/// it at once, forks in flight included. Then, and without a cgroup as the only means, rounds
/// of: SIGKILL every live descendant found in /proc, at once on discovery. Zombies are reaped
/// only after a round that found nothing alive, and that is what stops a fork-hopping chain
/// (fork, the parent exits, repeat), which outruns any scan of /proc: each hop leaves a zombie
/// child of the launcher, a zombie keeps its slot in the user's RLIMIT_NPROC count until it is
/// reaped, so the chain can make at most about `--max-processes` more hops before its forks
/// fail and it stays where the next round kills it. (Root is not bound by RLIMIT_NPROC; a root
/// caller needs a delegated cgroup for that.) There is no deadline: a launcher that gave up
/// would leave the rest to init (the runner's SIGKILL to the launcher's group after
/// [`LAUNCHER_GRACE`](crate::process::LAUNCHER_GRACE) is the last resort, for a launcher stuck
/// on an unkillable process).
pub(super) fn end_command(cgroup: Option<&CommandCgroupFds>) {
    // Every process of the command is in its cgroup (the shell moved in before exec, and
    // nothing in the sandbox can write a cgroup.procs: /sys is read-only), so once cgroup.kill
    // is written every child of the launcher is dying: reap them until ECHILD. If the write
    // fails, the rounds below still end everything that is ours.
    if let Some(fds) = cgroup
        && fds.kill_all().is_ok()
    {
        loop {
            match waitpid(None, None) {
                Ok(_) | Err(Errno::EINTR) => continue,
                Err(Errno::ECHILD) => return,
                Err(_) => break,
            }
        }
    }
    // The common case first: the shell exited and left nothing behind.
    if matches!(reap_all(), Reaped::NoChildren) {
        return;
    }
    let me = nix::unistd::getpid().as_raw();
    // Rounds read the stat of newer processes only (pids above the launcher's, which is where
    // the command's processes are unless pids wrapped around): reading every /proc entry can
    // take a second on a machine with thousands of processes. A round that finds nothing alive
    // while children remain may have missed a wrapped pid; after a few of those, full rounds.
    let mut fruitless = 0;
    loop {
        let newer_than = if fruitless < 3 { me } else { 0 };
        if signal_live_descendants(me, Signal::SIGKILL, newer_than) > 0 {
            fruitless = 0;
            continue;
        }
        match reap_all() {
            Reaped::NoChildren => return,
            Reaped::Some => {}
            Reaped::None => {
                // Children exist but nothing died and nothing live was found: a process
                // between states (exiting, or not yet in /proc), or a wrapped pid.
                fruitless += 1;
                std::thread::sleep(Duration::from_millis(1));
            }
        }
    }
}

enum Reaped {
    /// `ECHILD`: no child at all (any exited ones have just been reaped).
    NoChildren,
    /// At least one child was reaped; others are alive.
    Some,
    /// Children exist; none has exited.
    None,
}

/// Reaps every exited child without blocking.
fn reap_all() -> Reaped {
    let mut reaped = Reaped::None;
    loop {
        match waitpid(None, Some(WaitPidFlag::WNOHANG)) {
            Ok(WaitStatus::StillAlive) => return reaped,
            Err(Errno::ECHILD) => return Reaped::NoChildren,
            Ok(_) => reaped = Reaped::Some,
            Err(Errno::EINTR) => continue,
            // waitpid(-1) cannot otherwise fail; do not spin on it.
            Err(_) => return reaped,
        }
    }
}

/// One pass over /proc: sends `signal` to every live process whose parent is `root` or a
/// descendant already found, the moment its `stat` is read; processes listed before their
/// parent are resolved at the end of the pass. Only pids above `newer_than` are read (`0`: all).
/// Returns how many were signalled. Kept cheap (one `openat` and one `read` per process into a
/// reused buffer, no allocation per entry), since a pass races a command that keeps forking.
/// The launcher kills with it (`root` itself); a caller signals a launcher's command with it
/// ([`SandboxedChild::signal`](crate::process::SandboxedChild::signal)).
pub(crate) fn signal_live_descendants(root: i32, signal: Signal, newer_than: i32) -> usize {
    let mut known: std::collections::HashSet<i32> = [root].into_iter().collect();
    let mut unresolved: Vec<(i32, i32, bool)> = Vec::new();
    let mut killed = 0;
    let hit = |pid: i32, live: bool, killed: &mut usize| {
        if live {
            // ESRCH (already gone) is fine.
            let _ = kill(Pid::from_raw(pid), signal);
            *killed += 1;
        }
    };
    let Ok(proc_dir) = rustix::fs::open(
        "/proc",
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    ) else {
        return 0;
    };
    let Ok(entries) = rustix::fs::Dir::read_from(&proc_dir) else {
        return 0;
    };
    let mut path: Vec<u8> = Vec::with_capacity(32);
    let mut stat = [0u8; 512];
    for entry in entries {
        let Ok(entry) = entry else { break };
        let name = entry.file_name().to_bytes();
        if name.is_empty() || !name.iter().all(u8::is_ascii_digit) {
            continue;
        }
        let Some(pid) = parse_i32(name) else { continue };
        if pid <= newer_than {
            continue;
        }
        path.clear();
        path.extend_from_slice(name);
        path.extend_from_slice(b"/stat\0");
        let Ok(file) = std::ffi::CStr::from_bytes_with_nul(&path) else {
            continue;
        };
        let Ok(fd) = rustix::fs::openat(
            &proc_dir,
            file,
            OFlags::RDONLY | OFlags::CLOEXEC,
            Mode::empty(),
        ) else {
            continue;
        };
        let Ok(n) = rustix::io::read(&fd, &mut stat) else {
            continue;
        };
        let Some((live, ppid)) = parse_stat(&stat[..n]) else {
            continue;
        };
        if known.contains(&ppid) {
            known.insert(pid);
            hit(pid, live, &mut killed);
        } else {
            unresolved.push((pid, ppid, live));
        }
    }
    // Children listed before their parents (pid reuse after a wrap).
    let mut progress = true;
    while progress {
        progress = false;
        unresolved.retain(|&(pid, ppid, live)| {
            if known.contains(&ppid) {
                known.insert(pid);
                hit(pid, live, &mut killed);
                progress = true;
                false
            } else {
                true
            }
        });
    }
    killed
}

fn parse_i32(digits: &[u8]) -> Option<i32> {
    std::str::from_utf8(digits).ok()?.parse().ok()
}

/// Whether the process of a `/proc/<pid>/stat` line is alive (not a zombie), and its parent.
/// The fields come after the command name, which may itself hold spaces and parentheses.
fn parse_stat(line: &[u8]) -> Option<(bool, i32)> {
    let close = line.iter().rposition(|&b| b == b')')?;
    let mut fields = line[close + 1..]
        .split(|&b| b == b' ')
        .filter(|f| !f.is_empty());
    let state = fields.next()?;
    let ppid = parse_i32(fields.next()?)?;
    Some((state != b"Z" && state != b"X", ppid))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The command name may hold spaces and parentheses; the state and parent come after the
    /// last `)`.
    #[test]
    fn stat_lines_give_liveness_and_parent() {
        assert_eq!(
            parse_stat(b"4242 (sh) S 4200 4242 4242 0 -1"),
            Some((true, 4200))
        );
        assert_eq!(
            parse_stat(b"4243 (a (b) c) R 4242 1 1 0"),
            Some((true, 4242))
        );
        assert_eq!(parse_stat(b"4244 (x) Z 4242 1"), Some((false, 4242)));
        assert_eq!(parse_stat(b"4245 (x) X 4242 1"), Some((false, 4242)));
        assert_eq!(parse_stat(b"4246 (truncated"), None);
        assert_eq!(parse_i32(b"12x"), None);
    }
}
