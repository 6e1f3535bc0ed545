//! The launcher on macOS: the re-executed `<binary> __sandbox-exec` process that runs the
//! command as `sandbox-exec -p <profile> -- <program> <args…>` and ends everything it left.
//!
//! Owns: the macOS launcher's steps in their order (`launch`, each with why it comes there),
//! the wait loop that records the command's processes while it runs (there is no child
//! subreaper and no `/proc`: see `tree.rs`), and the process table over libproc
//! (`proc_listchildpids`, `proc_listpgrppids`, `proc_pidinfo`, through the `libc` crate: the
//! `libproc` crate generates its bindings with bindgen from the macOS SDK, which a Linux machine
//! checking this build does not have).
//! Must never: run the command without the profile (a missing `sandbox-exec` refuses), with a
//! controlling terminal, or with a pinned folder that is not the directory pinned at connect;
//! exit while a process of the command it can find is alive.

use std::convert::Infallible;
use std::io;
use std::os::unix::process::CommandExt;
use std::time::Duration;

use nix::errno::Errno;
use nix::sys::signal::{SigSet, Signal, kill};
use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
use nix::unistd::Pid;

use super::pinned::check_pinned;
use super::{check_no_terminal, parse_launcher_args};
use crate::SandboxError;
use crate::limits;
use crate::sbpl::{Profile, SANDBOX_EXEC, sandbox_exec_args};
use crate::tree::{self, ProcessInfo, ProcessTable, Seen};

/// How often the wait loop records the command's processes and checks for a stop signal.
const POLL: Duration = Duration::from_millis(10);

/// The stop signals: blocked from the start, then noticed by the wait loop as pending.
const STOP_SIGNALS: [Signal; 3] = [Signal::SIGTERM, Signal::SIGINT, Signal::SIGHUP];

/// The macOS launcher's steps ([`launcher_main`](super::launcher_main) is the entry).
pub(super) fn launch(args: &[String]) -> Result<Infallible, SandboxError> {
    // Block the stop signals first, so that one arriving during setup stays pending and the
    // wait loop handles it (ending the command) instead of killing the launcher while the
    // command's processes run on. The command gets no blocked or ignored signal
    // (default_signals_for_command; std keeps the parent's mask in the child): with SIGTERM
    // blocked, `kill` and `timeout` could not stop its background jobs.
    let mut signals = SigSet::empty();
    for signal in STOP_SIGNALS {
        signals.add(signal);
    }
    signals
        .thread_block()
        .map_err(|e| SandboxError::setup("block signals")(e.into()))?;
    // The caller that started us (the executor): macOS has no PR_SET_PDEATHSIG, so the wait
    // loop watches for re-parenting instead. Already re-parented: the caller is gone, run
    // nothing.
    let caller = nix::unistd::getppid();
    if caller.as_raw() == 1 {
        return Err(SandboxError::Setup {
            what: "start: the program that started this launcher is gone",
            source: io::Error::from_raw_os_error(libc::ESRCH),
        });
    }

    let (policy, program, program_args) = parse_launcher_args(args)?;

    // 1. The pinned folders must still be the directories opened at connect: the profile names
    // paths, so a folder moved away and replaced (or a symlink put in its place) would
    // otherwise be granted through its name. Checked before the descriptors are let go.
    check_pinned(&policy)?;

    // 2. Inherited descriptors above 2 close at exec (no close_range on macOS: the open ones
    // are listed in /dev/fd), so the command holds no directory, socket or terminal opened
    // outside its profile.
    mark_inherited_cloexec().map_err(SandboxError::setup(
        "mark inherited descriptors close-on-exec",
    ))?;

    // 3. A new session with no controlling terminal (the runner made us a session leader
    // already), so `/dev/tty` cannot be opened and TIOCSTI cannot type into the person's shell.
    let me = nix::unistd::getpid();
    if nix::unistd::getsid(None).ok() != Some(me) {
        nix::unistd::setsid().map_err(|e| SandboxError::Terminal(format!("setsid: {e}")))?;
    }
    check_no_terminal()?;

    // 4. The process limit (RLIMIT_NPROC, the user's count now plus the allowance), inherited
    // by everything the command starts.
    limits::set_process_limit(policy.limits.max_processes)
        .map_err(SandboxError::setup("set RLIMIT_NPROC"))?;

    // 5. The profile, generated from the policy, and sandbox-exec, which must exist: no
    // sandbox, no command.
    std::fs::metadata(SANDBOX_EXEC).map_err(|source| SandboxError::SandboxExecUnavailable {
        path: SANDBOX_EXEC.into(),
        source,
    })?;
    let profile = Profile::generate(&policy);

    // 6. Start `sandbox-exec -p <profile> -- <program> <args>`: in our session and process
    // group, so the group finds what the command leaves.
    let mut command = std::process::Command::new(SANDBOX_EXEC);
    command
        .args(sandbox_exec_args(&profile, &program, &program_args))
        .current_dir(&policy.cwd);
    // SAFETY: the closure runs in the forked child before exec and makes only async-signal-safe
    // system calls (sigaction, sigprocmask); it allocates nothing.
    unsafe {
        command.pre_exec(super::default_signals_for_command);
    }
    let child = command.spawn().map_err(|source| SandboxError::Spawn {
        program: format!("{SANDBOX_EXEC} ({})", program.to_string_lossy()),
        source,
    })?;
    let shell = Pid::from_raw(i32::try_from(child.id()).unwrap_or(i32::MAX));
    drop(child);

    // 7. Wait, recording the command's processes; then end every one that can be found.
    let table = Libproc;
    let mut seen = Seen::new();
    let status = wait_for_command(&table, me, shell, caller, &mut seen);
    end_command(&table, me, &mut seen);
    std::process::exit(status)
}

/// Step 2: FD_CLOEXEC on every open descriptor above 2.
fn mark_inherited_cloexec() -> io::Result<()> {
    let mut open = Vec::new();
    for entry in std::fs::read_dir("/dev/fd")? {
        if let Some(fd) = entry?
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<i32>().ok())
        {
            open.push(fd);
        }
    }
    for fd in open.into_iter().filter(|&fd| fd > 2) {
        // SAFETY: F_GETFD/F_SETFD only read and set the close-on-exec flag of a descriptor
        // number; one that was closed meanwhile (the /dev/fd listing's own) fails with EBADF,
        // which is ignored. No memory is touched and nothing is closed.
        unsafe {
            let flags = libc::fcntl(fd, libc::F_GETFD);
            if flags != -1 {
                libc::fcntl(fd, libc::F_SETFD, flags | libc::FD_CLOEXEC);
            }
        }
    }
    Ok(())
}

/// Waits for sandbox-exec (the command), recording its processes every [`POLL`]; returns its
/// status (128+signal if signalled), or 128+signal of a stop signal, or 128+SIGTERM when the
/// caller went away. Exited children are reaped as they go.
fn wait_for_command(table: &Libproc, me: Pid, shell: Pid, caller: Pid, seen: &mut Seen) -> i32 {
    loop {
        tree::record(table, me.as_raw(), seen);
        loop {
            match waitpid(None, Some(WaitPidFlag::WNOHANG)) {
                Ok(WaitStatus::Exited(pid, code)) if pid == shell => return code,
                Ok(WaitStatus::Signaled(pid, signal, _)) if pid == shell => {
                    return 128 + signal as i32;
                }
                Ok(WaitStatus::StillAlive) | Err(Errno::ECHILD) => break,
                Ok(_) | Err(Errno::EINTR) => continue,
                Err(_) => break,
            }
        }
        if let Some(signal) = pending_stop_signal() {
            return 128 + signal as i32;
        }
        if nix::unistd::getppid() != caller {
            return 128 + Signal::SIGTERM as i32;
        }
        std::thread::sleep(POLL);
    }
}

/// A pending (blocked) stop signal, if any.
fn pending_stop_signal() -> Option<Signal> {
    // SAFETY: sigpending writes one sigset_t into the zeroed value we own; sigismember only
    // reads it.
    let pending = unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        if libc::sigpending(&mut set) != 0 {
            return None;
        }
        set
    };
    STOP_SIGNALS
        .into_iter()
        // SAFETY: sigismember reads the set we own.
        .find(|&signal| unsafe { libc::sigismember(&pending, signal as libc::c_int) } == 1)
}

/// Ends every process of the command it can find: SIGKILL rounds over the launcher's
/// descendants, its process group and what was recorded, until a round finds nothing alive;
/// then reaps its own children until `ECHILD`. A process re-parented to launchd is reaped by
/// launchd once killed.
fn end_command(table: &Libproc, me: Pid, seen: &mut Seen) {
    loop {
        let alive = tree::command_processes(table, me.as_raw(), seen);
        if alive.is_empty() {
            break;
        }
        for pid in alive {
            // ESRCH (already gone) is fine.
            let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
        }
        // Reap what died, so the next round does not count our zombies (it skips them anyway).
        while let Ok(WaitStatus::Exited(..) | WaitStatus::Signaled(..)) =
            waitpid(None, Some(WaitPidFlag::WNOHANG))
        {}
        tree::record(table, me.as_raw(), seen);
        // A process that does not die at once (in the kernel) is tried again, without spinning.
        std::thread::sleep(Duration::from_millis(1));
    }
    loop {
        match waitpid(None, None) {
            Ok(_) | Err(Errno::EINTR) => continue,
            Err(_) => return,
        }
    }
}

/// The process table through libproc.
struct Libproc;

/// `SZOMB` in `<sys/proc.h>`: a zombie's `pbi_status`.
const SZOMB: u32 = 5;

impl Libproc {
    /// Calls a libproc listing function with a zeroed buffer that grows until the answer fits.
    /// `proc_listchildpids` and `proc_listpgrppids` answer with a count of pids (libproc divides
    /// `proc_listpids`' byte count by the size of a pid); read as a count, a byte count would
    /// only be larger, so either way every pid written is kept (zeros, never written, are not).
    fn list(call: impl Fn(*mut libc::c_void, libc::c_int) -> libc::c_int) -> Vec<i32> {
        let mut capacity = 256usize;
        loop {
            let mut pids = vec![0i32; capacity];
            let bytes = libc::c_int::try_from(capacity * std::mem::size_of::<i32>())
                .unwrap_or(libc::c_int::MAX);
            let count = call(pids.as_mut_ptr().cast(), bytes);
            let Ok(count) = usize::try_from(count) else {
                return Vec::new();
            };
            if count < capacity || capacity >= 1 << 20 {
                pids.truncate(count.min(capacity));
                pids.retain(|&pid| pid > 0);
                return pids;
            }
            capacity *= 4;
        }
    }
}

impl ProcessTable for Libproc {
    fn children(&self, pid: i32) -> Vec<i32> {
        // SAFETY: proc_listchildpids writes at most `size` bytes of pids into the buffer `list`
        // allocated with that size, and returns how many it wrote.
        Libproc::list(|buffer, size| unsafe { libc::proc_listchildpids(pid, buffer, size) })
    }

    fn group(&self, pgid: i32) -> Vec<i32> {
        // SAFETY: as for proc_listchildpids.
        Libproc::list(|buffer, size| unsafe { libc::proc_listpgrppids(pgid, buffer, size) })
    }

    fn info(&self, pid: i32) -> Option<ProcessInfo> {
        let info = bsd_info(pid)?;
        Some(ProcessInfo {
            start: info
                .pbi_start_tvsec
                .saturating_mul(1_000_000)
                .saturating_add(info.pbi_start_tvusec),
            alive: info.pbi_status != SZOMB,
        })
    }
}

/// `proc_pidinfo(PROC_PIDTBSDINFO)` of `pid`, or `None` if there is no such process.
fn bsd_info(pid: i32) -> Option<libc::proc_bsdinfo> {
    let size = libc::c_int::try_from(std::mem::size_of::<libc::proc_bsdinfo>()).ok()?;
    // SAFETY: proc_bsdinfo is plain data (integers and byte arrays), for which all-zero is a
    // valid value; proc_pidinfo writes at most `size` bytes into it and returns how many.
    let mut info: libc::proc_bsdinfo = unsafe { std::mem::zeroed() };
    // SAFETY: see above; the pointer is to the value we own, of `size` bytes.
    let written = unsafe {
        libc::proc_pidinfo(
            pid,
            libc::PROC_PIDTBSDINFO,
            0,
            std::ptr::from_mut(&mut info).cast(),
            size,
        )
    };
    (written == size).then_some(info)
}

/// Sends `signal` to every process of the command of the launcher `launcher` that can be found
/// from outside it: its descendants and the members of its process group (what the launcher
/// recorded of processes that left both is its own). Returns how many.
pub(crate) fn signal_command(launcher: i32, signal: Signal) -> usize {
    tree::command_processes(&Libproc, launcher, &Seen::new())
        .into_iter()
        .filter(|&pid| kill(Pid::from_raw(pid), signal).is_ok())
        .count()
}

/// The start time of `pid` (microseconds since the epoch), for the runner's check that a pid
/// it signals late is still its launcher.
pub fn start_time(pid: i32) -> Option<u64> {
    Libproc.info(pid).map(|info| info.start)
}
