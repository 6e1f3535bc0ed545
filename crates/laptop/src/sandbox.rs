//! The executor's sandbox: the policy a command runs under and the launcher that enforces it.
//!
//! Owns: [`SandboxPolicy`] (which folders a command may read, write or never touch), the
//! Landlock support check ([`landlock_status`]) and the launcher ([`launcher_main`]): the
//! `agentworks` binary re-executed as `agentworks __sandbox-exec <policy-json> -- <sh> -c <cmd>`.
//! The launcher, in this order (each step in `launch` says why it comes there): marks inherited
//! descriptors close-on-exec; becomes the leader of a new session with no controlling terminal;
//! becomes a child subreaper; opens the command's cgroup (when the executor made one); sets
//! `no_new_privs` and `RLIMIT_NPROC`; builds and applies a Landlock ruleset to itself that grants
//! no terminal device; installs the seccomp filter refusing Unix sockets and io_uring (below
//! ABI 9, unless allowed; `seccomp.rs`); forks the shell (which moves into the command's cgroup
//! and enters a nested ruleset with the signal and abstract-socket scopes, so it cannot signal
//! the launcher or connect to an abstract socket outside the sandbox); and when the shell ends
//! — or the launcher is told to stop — ends everything the command left (`cgroup.kill` first,
//! then SIGKILL to every descendant it finds) and exits with the shell's status only once
//! `waitpid(-1)` answers `ECHILD`.
//!
//! Must never: run a command without a ruleset the kernel reports as fully enforced (Landlock
//! missing, an ABI below [`MIN_ABI`], a rule that cannot be added or a partially enforced
//! ruleset all refuse), nor with a controlling terminal, nor without a scope or seccomp filter
//! it needs; skip a granted folder it cannot open; follow a symlink when granting; grant the
//! whole home directory (only a fixed list of toolchain folders, read/execute) or a terminal
//! device; exit while a process of the command is alive; leave files or mount points in the
//! person's folders; restrict the network.
//!
//! # How exclusions work
//!
//! Landlock rules only ever allow, and a rule on a directory covers everything beneath it, so a
//! blocked path cannot be carved out of a granted folder. Instead, for a grant `W` containing an
//! excluded path `W/a/b`, the launcher grants every entry of `W` except `a` individually, then
//! every entry of `a` except `b`, and so on; `W` and `a` themselves only get directory listing
//! (or read access when the exclusion is a read-only one). `--block` paths, the CLI's
//! credentials and state (`denied`) and the toolchains' credential files are excluded that way;
//! `--read-only` paths (and read-only folders nested in a writable one) get read access only.
//!
//! Residual limits: new entries cannot be created directly in a folder that lies on the path to
//! an exclusion (`W` and `a` above), since only their existing entries are granted; entries
//! created after the ruleset is built are covered only when their parent folder is; the names
//! (never the contents) inside a blocked directory can be listed, because listing rights on `W`
//! reach down the whole tree; `/proc` is readable (the command sees every process's command
//! line, and Landlock's ptrace restriction cannot be relied on to keep other same-user
//! processes' `/proc/<pid>/environ`, `maps` or `fd` out of reach: on Linux 6.18 it did not, so
//! the executor makes itself non-dumpable and drops secrets from its own environment at start;
//! other same-user processes on the machine stay visible this way); `/tmp` is not granted
//! (`TMPDIR` points at the private scratch dir); on kernels below ABI 6 the command can signal
//! processes outside the sandbox (and, with `--allow-unix-sockets`, reach abstract sockets);
//! without a delegated cgroup, ending a command is a race the launcher wins by killing faster
//! than the command forks (a cgroup's `cgroup.kill` has no such race); ptys cannot be made
//! (`/dev/ptmx` is not granted), so tools that need one (`script`, `expect`) do not work.

use std::convert::Infallible;
use std::ffi::{OsStr, OsString};
use std::io;
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::CommandExt;
use std::path::{Component, Path, PathBuf};
use std::time::Duration;

use landlock::{
    ABI, Access, AccessFs, BitFlags, CompatLevel, Compatible, PathBeneath, Ruleset, RulesetAttr,
    RulesetCreated, RulesetCreatedAttr, RulesetStatus, Scope,
};
use nix::errno::Errno;
use nix::sys::signal::{SigSet, Signal, kill};
use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
use nix::unistd::Pid;
use rustix::fs::{FileType, Mode, OFlags};

use super::cgroup::CommandCgroupFds;
use super::limits::{self, CommandLimits};
use super::privileges;
use super::seccomp::{self, SeccompError};

/// The hidden subcommand that puts the `agentworks` binary in launcher mode.
pub const SUBCOMMAND: &str = "__sandbox-exec";
/// Printed by the binary before a launcher error; the shell runner recognises a refusal by it.
pub const REFUSAL_PREFIX: &str = "agentworks sandbox refused: ";
/// The lowest Landlock ABI we run commands under: ABI 3 adds `truncate` control, without which
/// a read-only file could still be emptied.
pub const MIN_ABI: i32 = 3;
/// Debug builds only: simulate a kernel reporting this Landlock ABI (`0` = unavailable).
pub const TEST_ABI_ENV: &str = "AGENTWORKS_TEST_LANDLOCK_ABI";

/// System paths every command may read and execute (missing ones are skipped).
const SYSTEM_READ: &[&str] = &[
    "/usr",
    "/bin",
    "/sbin",
    "/lib",
    "/lib32",
    "/lib64",
    "/libx32",
    // Configuration: resolver, certificates, passwd/group, alternatives. Secret files in /etc
    // are root-only by permission, and the executor runs as the person.
    "/etc",
    "/opt",
    "/nix",
    // Many tools need /proc (self/exe, cpuinfo, meminfo); see the module doc for what it shows.
    "/proc",
    "/sys",
    // Where /etc/resolv.conf points on systemd-resolved machines.
    "/run/systemd/resolve",
];

/// Device files commands may read and write: the null and random devices, and never a
/// terminal (`/dev/tty`, `/dev/ptmx`, `/dev/pts/*`, `/dev/console`): a command that could open
/// one could type into the person's shell with `TIOCSTI` or read and draw on their terminals.
const DEVICES: &[&str] = &[
    "/dev/null",
    "/dev/zero",
    "/dev/full",
    "/dev/random",
    "/dev/urandom",
];

/// Toolchain folders under the person's home granted read and execute. Never the whole home.
pub const HOME_TOOLCHAINS: &[&str] = &[
    ".rustup",
    ".cargo",
    ".nvm",
    ".pyenv",
    ".volta",
    ".bun",
    ".deno",
    ".local/bin",
    ".local/lib",
    "go/bin",
    "go/pkg/mod",
];

/// Credential files inside the toolchain folders: never readable.
pub const HOME_TOOLCHAIN_SECRETS: &[&str] = &[".cargo/credentials", ".cargo/credentials.toml"];

/// What a pinned directory grants.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PinnedAccess {
    /// Read, write, create, remove (a `--write-folder`, the Downloads companion).
    ReadWrite,
    /// Read and execute (a `--folder`, a toolchain folder).
    ReadOnly,
}

/// A directory the executor opened once at connect and keeps open (an `O_PATH` descriptor),
/// granted to a command through that descriptor: whatever its path names later (a symlink, a
/// folder moved in its place) does not change what the rule covers. The launcher inherits the
/// descriptor ([`inherit_pinned`]) and checks that it still is the directory recorded here.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PinnedGrant {
    /// The descriptor's number in the executor, and so in the launcher.
    pub fd: i32,
    /// Device and inode of the directory when it was opened.
    pub dev: u64,
    pub ino: u64,
    /// Its canonical path at connect: exclusions are matched against it, and messages name it.
    pub path: PathBuf,
    pub access: PinnedAccess,
}

/// What a command may touch. Paths must be absolute; the path-based ones (`read_write`,
/// `read_only`, `home`) are resolved (symlinks followed) by the launcher before the ruleset is
/// built, so the executor grants its shared folders, Downloads and toolchains through `pinned`
/// descriptors instead and uses paths only for its own private scratch dir and executable.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct SandboxPolicy {
    /// Directories granted through descriptors pinned at connect.
    #[serde(default)]
    pub pinned: Vec<PinnedGrant>,
    /// Writable folders granted by path.
    pub read_write: Vec<PathBuf>,
    /// Read-only paths granted by path (the launcher executable, for patches).
    pub read_only: Vec<PathBuf>,
    /// `--block` paths: neither readable nor writable nor creatable (existing or not).
    pub blocked: Vec<PathBuf>,
    /// `--read-only` paths inside a writable folder: not writable.
    pub read_only_within: Vec<PathBuf>,
    /// The CLI's credentials and state dirs: never readable.
    pub denied: Vec<PathBuf>,
    /// The person's home, for toolchain read/exec grants by path (never credentials); the
    /// executor pins its toolchains instead and leaves this empty.
    pub home: Option<PathBuf>,
    /// Private scratch dir (TMPDIR, caches point here): always read/write, whatever `denied`
    /// says of the state dir it lies in.
    pub scratch: PathBuf,
    /// Where the command starts.
    pub cwd: PathBuf,
    /// Processes, Unix sockets and the command's cgroup (see [`CommandLimits`]).
    #[serde(default)]
    pub limits: CommandLimits,
}

/// Why the launcher refused (or failed) to run a command.
#[derive(Debug, thiserror::Error)]
pub enum SandboxError {
    #[error("Landlock is unavailable, so commands are refused: {reason}")]
    LandlockUnavailable { reason: String },
    #[error(
        "the kernel's Landlock ABI {found} is below the required ABI {required} (Linux 6.2+), so commands are refused"
    )]
    AbiTooOld { found: i32, required: i32 },
    #[error(
        "bad launcher arguments: {0} (usage: {SUBCOMMAND} <policy-json> -- <program> [args...])"
    )]
    Usage(String),
    #[error("bad sandbox policy: {0}")]
    Policy(String),
    #[error("cannot open granted path {path}: {source}")]
    GrantPath {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error(
        "the pinned descriptor {fd} for {path} is not that directory any more ({reason}); reconnect to share it again"
    )]
    Pinned {
        fd: i32,
        path: PathBuf,
        reason: String,
    },
    #[error("cannot build the Landlock ruleset: {0}")]
    Ruleset(#[from] landlock::RulesetError),
    #[error("the Landlock ruleset is not fully enforced ({0}), so the command is refused")]
    NotEnforced(String),
    #[error("cannot {what}: {source}")]
    Setup {
        what: &'static str,
        #[source]
        source: io::Error,
    },
    #[error(
        "the launcher still has a controlling terminal ({0}), so the command is refused: it could type into the person's shell"
    )]
    Terminal(String),
    #[error("{0}, so the command is refused")]
    Seccomp(#[from] SeccompError),
    #[error("cannot use the command's cgroup {path}, so the command is refused: {source}")]
    Cgroup {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("cannot start {program}: {source}")]
    Spawn {
        program: String,
        #[source]
        source: io::Error,
    },
}

impl SandboxError {
    fn setup(what: &'static str) -> impl FnOnce(io::Error) -> SandboxError {
        move |source| SandboxError::Setup { what, source }
    }
}

/// Checks Landlock support and returns the ABI version, or an error saying why commands are
/// refused. Debug builds honour [`TEST_ABI_ENV`] to simulate an older or missing Landlock.
pub fn landlock_status() -> Result<i32, SandboxError> {
    let kernel = kernel_abi()?;
    let abi = match simulated_abi() {
        Some(simulated) if simulated <= 0 => {
            return Err(SandboxError::LandlockUnavailable {
                reason: format!("{TEST_ABI_ENV}={simulated} simulates a kernel without Landlock"),
            });
        }
        Some(simulated) => simulated.min(kernel),
        None => kernel,
    };
    if abi < MIN_ABI {
        return Err(SandboxError::AbiTooOld {
            found: abi,
            required: MIN_ABI,
        });
    }
    Ok(abi)
}

fn simulated_abi() -> Option<i32> {
    if !cfg!(debug_assertions) {
        return None;
    }
    std::env::var(TEST_ABI_ENV).ok()?.trim().parse().ok()
}

fn kernel_abi() -> Result<i32, SandboxError> {
    const LANDLOCK_CREATE_RULESET_VERSION: libc::c_uint = 1;
    // SAFETY: landlock_create_ruleset(NULL, 0, VERSION) only queries the ABI version: the kernel
    // reads no memory (the attribute pointer is NULL, size 0) and creates no descriptor.
    let version = unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            std::ptr::null::<libc::c_void>(),
            0usize,
            LANDLOCK_CREATE_RULESET_VERSION,
        )
    };
    if version < 0 {
        let error = io::Error::last_os_error();
        let reason = match error.raw_os_error() {
            Some(libc::EOPNOTSUPP) => {
                "the kernel has Landlock but it is disabled at boot (add `landlock` to the `lsm=` kernel parameter)".to_owned()
            }
            Some(libc::ENOSYS) => {
                "the kernel was built without Landlock (CONFIG_SECURITY_LANDLOCK)".to_owned()
            }
            _ => format!("querying the Landlock ABI failed: {error}"),
        };
        return Err(SandboxError::LandlockUnavailable { reason });
    }
    i32::try_from(version).map_err(|_| SandboxError::LandlockUnavailable {
        reason: format!("the kernel reported an impossible Landlock ABI {version}"),
    })
}

/// Makes a launcher about to be spawned by `command` receive SIGTERM when the executor dies
/// (even by SIGKILL), so that it kills the command and every descendant instead of running on
/// unsupervised. The launcher blocks SIGTERM and handles it like a stop request. A launcher
/// whose parent is already gone when it starts never execs. (The kernel sends the signal when
/// the spawning *thread* ends: spawn from a runtime worker thread, never a blocking-pool one.)
pub fn die_with_parent(command: &mut tokio::process::Command) {
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

/// Lets the launcher about to be spawned by `command` inherit the policy's pinned descriptors:
/// they are close-on-exec in the executor (so no other child gets them) and the child clears
/// that flag on exactly these, before exec. The launcher marks every inherited descriptor
/// close-on-exec again first thing, so the command never holds them.
pub fn inherit_pinned(command: &mut tokio::process::Command, policy: &SandboxPolicy) {
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
/// The launcher checks again ([`launcher_main`] step 2) and refuses without it.
pub fn new_session(command: &mut tokio::process::Command) {
    // SAFETY: the closure runs in the forked child before exec and makes one async-signal-safe
    // system call (setsid); it allocates nothing and takes no lock.
    unsafe {
        command.pre_exec(|| {
            nix::unistd::setsid()?;
            Ok(())
        });
    }
}

/// Launcher mode entry: called by the `agentworks` binary when re-executed as
/// `agentworks __sandbox-exec <policy-json> -- <sh> -c <command>`. Must be called first thing in
/// `main`, while the process is single-threaded. On success it never returns (it exits with the
/// shell's status, 128+signal if the shell was signalled or the launcher told to stop); it
/// returns only on error, before any command ran, and the caller prints the error after
/// [`REFUSAL_PREFIX`] and exits 126.
pub fn launcher_main(args: &[String]) -> SandboxError {
    match launch(args) {
        Ok(never) => match never {},
        Err(error) => error,
    }
}

fn launch(args: &[String]) -> Result<Infallible, SandboxError> {
    // Block the stop signals first so that one arriving during setup stays pending and is
    // handled by the wait loop (killing the shell) instead of killing the launcher while
    // descendants run on. The shell does not inherit the mask: std resets it in the child.
    let mut signals = SigSet::empty();
    for signal in [
        Signal::SIGCHLD,
        Signal::SIGTERM,
        Signal::SIGINT,
        Signal::SIGHUP,
    ] {
        signals.add(signal);
    }
    signals
        .thread_block()
        .map_err(|e| SandboxError::setup("block signals")(e.into()))?;

    let (policy, program, program_args) = parse_args(args)?;

    // 1. Inherited descriptors above 2: a descriptor opened before the ruleset (a directory,
    // a socket, a terminal) would let the command reach outside it, since Landlock checks paths
    // at open time. We mark them close-on-exec rather than closing them, so the launcher never
    // closes a descriptor some part of this process might still own; the shell inherits only
    // 0-2 (the runner makes them /dev/null and pipes, never the person's terminal).
    // SAFETY: close_range with CLOSE_RANGE_CLOEXEC only sets a flag on descriptors; it closes
    // nothing, touches no memory, and cannot invalidate a descriptor owned elsewhere.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_close_range,
            3 as libc::c_uint,
            libc::c_uint::MAX,
            libc::CLOSE_RANGE_CLOEXEC,
        )
    };
    if rc != 0 {
        return Err(SandboxError::setup(
            "mark inherited descriptors close-on-exec",
        )(io::Error::last_os_error()));
    }

    // 2. A new session with no controlling terminal, before anything is forked: without a
    // controlling terminal `/dev/tty` cannot be opened and `TIOCSTI` (which needs one) cannot
    // push keystrokes into the person's shell. The runner already made us a session leader;
    // a launcher started otherwise makes its own session, and one that still has a terminal
    // (or cannot tell) refuses.
    let me = nix::unistd::getpid();
    if nix::unistd::getsid(None).ok() != Some(me) {
        nix::unistd::setsid().map_err(|e| SandboxError::Terminal(format!("setsid: {e}")))?;
    }
    check_no_terminal()?;

    // 3. Child subreaper: orphans of the command (a grandchild whose parent exited, one that
    // called setsid()) are re-parented to us rather than to init, so we can find and kill them.
    nix::sys::prctl::set_child_subreaper(true)
        .map_err(|e| SandboxError::setup("become a child subreaper")(e.into()))?;

    // 4. The command's cgroup (when the executor made one): its cgroup.procs (to move the shell
    // in) and cgroup.kill (to end it) are opened now, since the ruleset below grants /sys
    // read-only. The launcher itself stays outside, so cgroup.kill never kills it.
    let cgroup = match &policy.limits.cgroup {
        Some(path) => {
            Some(
                CommandCgroupFds::open(path).map_err(|source| SandboxError::Cgroup {
                    path: path.clone(),
                    source,
                })?,
            )
        }
        None => None,
    };

    // 5. no_new_privs before the ruleset: Landlock requires it for an unprivileged process,
    // and it keeps setuid binaries from gaining privileges inside the sandbox.
    nix::sys::prctl::set_no_new_privs()
        .map_err(|e| SandboxError::setup("set no_new_privs")(e.into()))?;

    // 6. The process limit: RLIMIT_NPROC counts every process of the user, so it is the count
    // now plus the command's allowance (see limits.rs); the shell and everything it starts
    // inherit it.
    limits::set_process_limit(policy.limits.max_processes)
        .map_err(SandboxError::setup("set RLIMIT_NPROC"))?;

    // 7. The Landlock ruleset, applied to the launcher itself (single-threaded, so to the whole
    // process) and inherited by the shell. Fully enforced or refuse. From ABI 9 it also
    // governs connect() to named Unix sockets (only beneath the writable folders and the
    // scratch dir), unless the person allowed Unix sockets.
    let abi = landlock_status()?;
    let mut plan = plan_rules(&policy, abi)?;
    if policy.limits.allow_unix_sockets {
        plan.allow_unix_sockets();
    }
    apply_ruleset(plan)?;
    let scopes = scope_ruleset(abi)?;

    // 8. Below ABI 9, the seccomp filter refusing Unix sockets and io_uring (seccomp.rs),
    // unless the person allowed Unix sockets. Built and installed last, so nothing the
    // launcher still needs is refused; one that cannot be installed refuses.
    if seccomp::needs_unix_socket_filter(abi, policy.limits.allow_unix_sockets) {
        let filter = seccomp::unix_socket_filter()?;
        seccomp::install(&filter)?;
    }

    // 9. Fork the shell: it moves itself into the command's cgroup and enters the nested scope
    // ruleset (signals and abstract Unix sockets), then execs.
    let mut command = std::process::Command::new(&program);
    command
        .args(&program_args)
        .current_dir(&policy.cwd)
        .env_remove(TEST_ABI_ENV);
    let mut scopes = scopes;
    let child_cgroup = cgroup.as_ref().map(CommandCgroupFds::try_clone);
    let child_cgroup = child_cgroup
        .transpose()
        .map_err(|source| SandboxError::Cgroup {
            path: policy.limits.cgroup.clone().unwrap_or_default(),
            source,
        })?;
    // SAFETY: the closure runs in the forked child before exec. The launcher is
    // single-threaded (launcher_main runs first in main; nothing here spawns threads), so
    // no lock can be held by a thread that vanished in the fork and allocating is sound.
    // It only writes to a cgroup.procs descriptor opened before the fork, calls
    // landlock_restrict_self on a ruleset built before the fork, and drops capabilities
    // (prctl, capset).
    unsafe {
        command.pre_exec(move || {
            if let Some(fds) = &child_cgroup {
                fds.join_self()?;
            }
            restrict_to_scopes(&mut scopes)?;
            // Last: a privileged launcher's command gets no capability (privileges.rs).
            privileges::drop_capabilities()
        });
    }
    // A launcher with CAP_SYS_ADMIN (a root executor, which RLIMIT_NPROC does not bind) puts
    // the command in its own PID namespace: when the shell, its first process, is killed, the
    // kernel kills the rest, so a fork-hopping chain cannot outrun the reaper. Only now: the
    // first process forked after this is the namespace's, and the process-limit probe above
    // forks too.
    if privileges::may_unshare_pid() {
        privileges::own_pid_namespace().map_err(SandboxError::setup("create a PID namespace"))?;
    }
    let child = command.spawn().map_err(|source| SandboxError::Spawn {
        program: program.to_string_lossy().into_owned(),
        source,
    })?;
    let shell = Pid::from_raw(i32::try_from(child.id()).unwrap_or(i32::MAX));
    // We reap with waitpid(-1) below (orphans included), so std's handle is not used to wait.
    drop(child);

    // 10. Wait for the shell (or a stop signal), then end everything the command left.
    let status = wait_for_shell(shell, &signals);
    end_command(cgroup.as_ref());
    std::process::exit(status)
}

/// Step 2's check: `/dev/tty` must not open (`ENXIO`: no controlling terminal; `ENOENT`: no
/// such device on this machine).
fn check_no_terminal() -> Result<(), SandboxError> {
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

fn restrict_to_scopes(ruleset: &mut Option<RulesetCreated>) -> io::Result<()> {
    let Some(ruleset) = ruleset.take() else {
        return Ok(());
    };
    let status = ruleset.restrict_self().map_err(io::Error::other)?;
    if status.ruleset != RulesetStatus::FullyEnforced {
        return Err(io::Error::other(
            "the Landlock signal and abstract-socket scopes are not enforced",
        ));
    }
    Ok(())
}

type ParsedArgs = (SandboxPolicy, OsString, Vec<OsString>);

fn parse_args(args: &[String]) -> Result<ParsedArgs, SandboxError> {
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

/// Waits for the shell; returns its status (128+signal if signalled), or 128+signal of a stop
/// signal the launcher received first. Orphans that exit meanwhile are reaped.
fn wait_for_shell(shell: Pid, signals: &SigSet) -> i32 {
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
/// executor needs a delegated cgroup for that.) There is no deadline: a launcher that gave up
/// would leave the rest to init (the runner's SIGKILL to the launcher's group after
/// `shell::LAUNCHER_GRACE` is the last resort, for a launcher stuck on an unkillable process).
fn end_command(cgroup: Option<&CommandCgroupFds>) {
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
        if kill_live_descendants(me, newer_than) > 0 {
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

/// One pass over /proc: SIGKILLs every live process whose parent is `root` or a descendant
/// already found, the moment its `stat` is read; processes listed before their parent are
/// resolved at the end of the pass. Only pids above `newer_than` are read (`0`: all). Returns
/// how many were signalled. Kept cheap (one `openat` and one `read` per process into a reused
/// buffer, no allocation per entry), since a pass races a command that keeps forking.
fn kill_live_descendants(root: i32, newer_than: i32) -> usize {
    let mut known: std::collections::HashSet<i32> = [root].into_iter().collect();
    let mut unresolved: Vec<(i32, i32, bool)> = Vec::new();
    let mut killed = 0;
    let hit = |pid: i32, live: bool, killed: &mut usize| {
        if live {
            // ESRCH (already gone) is fine.
            let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
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

/// Whether an excluded path loses all access or only write access.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Exclusion {
    NoAccess,
    ReadOnly,
}

/// One Landlock rule: an `O_PATH` descriptor opened without following symlinks, and its rights.
#[derive(Debug)]
struct PlannedRule {
    path: PathBuf,
    fd: OwnedFd,
    access: BitFlags<AccessFs>,
}

struct Plan {
    abi: ABI,
    handled: BitFlags<AccessFs>,
    read: BitFlags<AccessFs>,
    file: BitFlags<AccessFs>,
    exclusions: Vec<(PathBuf, Exclusion)>,
    rules: Vec<PlannedRule>,
}

/// Resolves the policy into Landlock rules (the exclusion walk happens here).
fn plan_rules(policy: &SandboxPolicy, abi_version: i32) -> Result<Plan, SandboxError> {
    let abi = ABI::from(abi_version);
    let handled = AccessFs::from_all(abi);
    let mut plan = Plan {
        abi,
        handled,
        read: AccessFs::from_read(abi),
        file: AccessFs::from_file(abi),
        exclusions: Vec::new(),
        rules: Vec::new(),
    };

    // The roots: pinned directories (their descriptors checked) and path grants (resolved now).
    let mut roots: Vec<Root> = Vec::new();
    for pinned in &policy.pinned {
        check_absolute(&pinned.path)?;
        roots.push(Root {
            path: pinned.path.clone(),
            writable: pinned.access == PinnedAccess::ReadWrite,
            fd: Some(open_pinned(pinned)?),
        });
    }
    for (paths, writable, what) in [
        (&policy.read_write, true, "writable folder"),
        (&policy.read_only, false, "read-only path"),
    ] {
        for path in paths {
            roots.push(Root {
                path: resolve_existing(path, what)?,
                writable,
                fd: None,
            });
        }
    }
    let scratch = resolve_existing(&policy.scratch, "scratch dir")?;
    for path in roots.iter().map(|r| &r.path).chain([&scratch]) {
        if path == Path::new("/") {
            return Err(SandboxError::Policy(
                "refusing to grant the whole filesystem".to_owned(),
            ));
        }
    }

    // Exclusions are matched by path. Both the path as given (the executor's are canonical from
    // connect) and its resolution now are excluded: a component turned into a symlink since can
    // only add an exclusion, never drop one.
    for path in policy.blocked.iter().chain(&policy.denied) {
        plan.exclude(path, Exclusion::NoAccess)?;
    }
    for path in &policy.read_only_within {
        plan.exclude(path, Exclusion::ReadOnly)?;
    }
    // A read-only root nested in a writable one (a project inside a shared Downloads) stays
    // read-only.
    let nested_read_only: Vec<PathBuf> = roots
        .iter()
        .filter(|r| !r.writable)
        .filter(|r| {
            roots
                .iter()
                .any(|w| w.writable && r.path != w.path && r.path.starts_with(&w.path))
        })
        .map(|r| r.path.clone())
        .collect();
    for path in nested_read_only {
        plan.exclusions.push((path, Exclusion::ReadOnly));
    }
    let home = match &policy.home {
        Some(home) => Some(resolve_existing(home, "home")?),
        None => None,
    };
    if let Some(home) = &home {
        for secret in HOME_TOOLCHAIN_SECRETS {
            plan.exclude(&home.join(secret), Exclusion::NoAccess)?;
        }
    }

    let all = plan.handled;
    let read = plan.read;
    for path in SYSTEM_READ {
        plan.grant_optional(Path::new(path), read)?;
    }
    let device =
        (AccessFs::ReadFile | AccessFs::WriteFile | AccessFs::Truncate | AccessFs::IoctlDev)
            & plan.handled;
    for path in DEVICES {
        plan.grant_optional(Path::new(path), device | (plan.handled & AccessFs::ReadDir))?;
    }
    if let Some(home) = &home {
        for dir in HOME_TOOLCHAINS {
            plan.grant_optional(&home.join(dir), read)?;
        }
    }
    for root in roots {
        let access = if root.writable { all } else { read };
        let source = match &root.fd {
            Some(fd) => Source::Pinned(fd),
            None => Source::Path,
        };
        plan.grant_resolved(source, &root.path, access)?;
    }
    // The private scratch dir lies in the CLI's (denied) state dir: it is granted as itself,
    // past the exclusions.
    plan.grant_scratch(&scratch)?;
    Ok(plan)
}

/// One granted root, before the exclusion walk.
struct Root {
    path: PathBuf,
    writable: bool,
    /// The pinned descriptor, for a pinned root; path roots are opened during the walk.
    fd: Option<OwnedFd>,
}

/// Where [`Plan::grant_resolved`] gets the descriptor of the path it grants.
enum Source<'a> {
    /// Open the (resolved) path itself, without following a symlink.
    Path,
    /// A root pinned at connect: its descriptor, never its path.
    Pinned(&'a OwnedFd),
    /// An entry of a directory being walked: its name in that directory.
    Entry(&'a OwnedFd, &'a OsStr),
}

/// Takes over a pinned descriptor the launcher inherited, after checking it still is the
/// directory the executor pinned (same device and inode, a directory). The launcher owns it from
/// here (it marked every inherited descriptor close-on-exec at start, so the command never has
/// it).
fn open_pinned(pinned: &PinnedGrant) -> Result<OwnedFd, SandboxError> {
    let refuse = |reason: String| SandboxError::Pinned {
        fd: pinned.fd,
        path: pinned.path.clone(),
        reason,
    };
    if pinned.fd < 3 {
        return Err(refuse("not a pinned descriptor number".to_owned()));
    }
    // SAFETY: the number was passed by the executor, which keeps that descriptor open for its
    // life and let this process inherit it (inherit_pinned); nothing else in the launcher owns
    // or closes it, so borrowing it for the duplication below is sound. An unexpected number is
    // caught by the checks that follow (fstat fails, or it is not the recorded directory).
    let borrowed = unsafe { std::os::fd::BorrowedFd::borrow_raw(pinned.fd) };
    let fd = rustix::io::fcntl_dupfd_cloexec(borrowed, 3)
        .map_err(|e| refuse(format!("not open: {e}")))?;
    let stat = rustix::fs::fstat(&fd).map_err(|e| refuse(format!("fstat failed: {e}")))?;
    if FileType::from_raw_mode(stat.st_mode) != FileType::Directory {
        return Err(refuse("not a directory".to_owned()));
    }
    // st_dev and st_ino are unsigned on Linux; the casts only widen.
    #[allow(clippy::unnecessary_cast)]
    let (dev, ino) = (stat.st_dev as u64, stat.st_ino as u64);
    if (dev, ino) != (pinned.dev, pinned.ino) {
        return Err(refuse(format!(
            "device/inode {dev}/{ino}, pinned {}/{}",
            pinned.dev, pinned.ino
        )));
    }
    Ok(fd)
}

impl Plan {
    /// A system or toolchain path: skipped when missing, an error when it exists but cannot be
    /// opened.
    fn grant_optional(
        &mut self,
        path: &Path,
        access: BitFlags<AccessFs>,
    ) -> Result<(), SandboxError> {
        match std::fs::canonicalize(path) {
            Ok(resolved) => self.grant_resolved(Source::Path, &resolved, access),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            Err(source) => Err(SandboxError::GrantPath {
                path: path.to_owned(),
                source,
            }),
        }
    }

    /// Adds `path` (absolute) as an exclusion, and its resolution now if that differs.
    fn exclude(&mut self, path: &Path, kind: Exclusion) -> Result<(), SandboxError> {
        check_absolute(path)?;
        let resolved = resolve_lenient(path)?;
        if resolved != path {
            self.exclusions.push((resolved, kind));
        }
        self.exclusions.push((path.to_owned(), kind));
        Ok(())
    }

    /// The private scratch dir: read/write, no exclusion applies.
    fn grant_scratch(&mut self, scratch: &Path) -> Result<(), SandboxError> {
        let flags = OFlags::PATH | OFlags::NOFOLLOW | OFlags::DIRECTORY | OFlags::CLOEXEC;
        let fd =
            rustix::fs::open(scratch, flags, Mode::empty()).map_err(|e| grant_error(scratch, e))?;
        self.push(scratch, fd, self.handled);
        Ok(())
    }

    /// Grants `access` on `path` (already resolved), minus the exclusions: an excluded path is
    /// skipped or downgraded; a directory with exclusions beneath it is replaced by its entries.
    /// `source` says where its descriptor comes from.
    fn grant_resolved(
        &mut self,
        source: Source<'_>,
        path: &Path,
        access: BitFlags<AccessFs>,
    ) -> Result<(), SandboxError> {
        if self
            .exclusions
            .iter()
            .any(|(e, kind)| *kind == Exclusion::NoAccess && path.starts_with(e))
        {
            return Ok(());
        }
        let mut access = access;
        if self
            .exclusions
            .iter()
            .any(|(e, kind)| *kind == Exclusion::ReadOnly && path.starts_with(e))
        {
            access &= self.read;
        }

        let flags = OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC;
        let opened = match source {
            Source::Entry(parent, name) => rustix::fs::openat(parent, name, flags, Mode::empty()),
            Source::Path => rustix::fs::open(path, flags, Mode::empty()),
            Source::Pinned(fd) => rustix::io::fcntl_dupfd_cloexec(fd, 3),
        };
        let fd = match opened {
            Ok(fd) => fd,
            // An entry that vanished during the walk grants nothing.
            Err(rustix::io::Errno::NOENT) if matches!(source, Source::Entry(..)) => {
                return Ok(());
            }
            Err(e) => return Err(grant_error(path, e)),
        };
        let kind = rustix::fs::fstat(&fd)
            .map(|st| FileType::from_raw_mode(st.st_mode))
            .map_err(|e| grant_error(path, e))?;
        match kind {
            // Never follow a symlink when granting: its target is governed by its own rules.
            FileType::Symlink => return Ok(()),
            FileType::Directory => {}
            _ => {
                self.push(path, fd, access & self.file);
                return Ok(());
            }
        }

        let inner: Vec<Exclusion> = self
            .exclusions
            .iter()
            .filter(|(e, _)| e != path && e.starts_with(path))
            .map(|(_, kind)| *kind)
            .collect();
        if inner.is_empty() {
            self.push(path, fd, access);
            return Ok(());
        }
        // On the path to an exclusion: the folder itself gets listing (or reading, when nothing
        // beneath it is unreadable), its entries are granted one by one.
        let own = if inner.contains(&Exclusion::NoAccess) {
            access & AccessFs::ReadDir
        } else {
            access & self.read
        };
        let dir = rustix::fs::openat(
            &fd,
            ".",
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| grant_error(path, e))?;
        let mut names = Vec::new();
        for entry in rustix::fs::Dir::read_from(&dir).map_err(|e| grant_error(path, e))? {
            let entry = entry.map_err(|e| grant_error(path, e))?;
            let name = entry.file_name().to_bytes();
            if name != b"." && name != b".." {
                names.push(OsStr::from_bytes(name).to_owned());
            }
        }
        drop(dir);
        for name in &names {
            self.grant_resolved(Source::Entry(&fd, name), &path.join(name), access)?;
        }
        if !own.is_empty() {
            self.push(path, fd, own);
        }
        Ok(())
    }

    /// `--allow-unix-sockets` from ABI 9: `connect()` to named Unix sockets is not handled, so
    /// allowed everywhere (below ABI 9 the right does not exist and this changes nothing).
    fn allow_unix_sockets(&mut self) {
        self.handled.remove(AccessFs::ResolveUnix);
        for rule in &mut self.rules {
            rule.access.remove(AccessFs::ResolveUnix);
        }
        self.rules.retain(|rule| !rule.access.is_empty());
    }

    fn push(&mut self, path: &Path, fd: OwnedFd, access: BitFlags<AccessFs>) {
        let access = access & self.handled;
        if !access.is_empty() {
            self.rules.push(PlannedRule {
                path: path.to_owned(),
                fd,
                access,
            });
        }
    }
}

fn grant_error(path: &Path, error: rustix::io::Errno) -> SandboxError {
    SandboxError::GrantPath {
        path: path.to_owned(),
        source: error.into(),
    }
}

fn apply_ruleset(plan: Plan) -> Result<(), SandboxError> {
    let mut ruleset = Ruleset::default()
        .set_compatibility(CompatLevel::HardRequirement)
        .handle_access(plan.handled)?
        .create()?
        .no_new_privs(true);
    for rule in plan.rules {
        let path = rule.path;
        ruleset = ruleset
            .add_rule(PathBeneath::new(rule.fd, rule.access))
            .map_err(|e| {
                SandboxError::NotEnforced(format!("rule for {} rejected: {e}", path.display()))
            })?;
    }
    let status = ruleset.restrict_self()?;
    if status.ruleset != RulesetStatus::FullyEnforced {
        return Err(SandboxError::NotEnforced(format!(
            "kernel reported {:?} for ABI {:?}",
            status.ruleset, plan.abi
        )));
    }
    if !status.no_new_privs {
        return Err(SandboxError::NotEnforced(
            "no_new_privs is not set".to_owned(),
        ));
    }
    Ok(())
}

/// A second, nested ruleset for the shell alone (ABI 6+, whenever the kernel has it): it may
/// not signal processes outside its own domain (so neither the launcher nor the executor), nor
/// connect to an abstract Unix socket made outside it (a same-user service listening on one).
fn scope_ruleset(abi: i32) -> Result<Option<RulesetCreated>, SandboxError> {
    if abi < 6 {
        return Ok(None);
    }
    let ruleset = Ruleset::default()
        .set_compatibility(CompatLevel::HardRequirement)
        .scope(Scope::Signal | Scope::AbstractUnixSocket)?
        .create()?;
    Ok(Some(ruleset))
}

fn check_absolute(path: &Path) -> Result<(), SandboxError> {
    if !path.is_absolute() || path.components().any(|c| c == Component::ParentDir) {
        return Err(SandboxError::Policy(format!(
            "{} must be absolute and contain no `..`",
            path.display()
        )));
    }
    Ok(())
}

fn resolve_existing(path: &Path, what: &str) -> Result<PathBuf, SandboxError> {
    check_absolute(path)?;
    std::fs::canonicalize(path).map_err(|source| SandboxError::GrantPath {
        path: path.to_owned(),
        source: io::Error::new(source.kind(), format!("{what}: {source}")),
    })
}

/// Resolves the longest existing prefix of `path` and appends the missing rest, so exclusions
/// that do not exist yet (a blocked path that must not be created) still match grants.
fn resolve_lenient(path: &Path) -> Result<PathBuf, SandboxError> {
    check_absolute(path)?;
    let mut existing = path.to_path_buf();
    let mut missing: Vec<OsString> = Vec::new();
    loop {
        match std::fs::canonicalize(&existing) {
            Ok(mut resolved) => {
                for name in missing.iter().rev() {
                    resolved.push(name);
                }
                return Ok(resolved);
            }
            Err(e)
                if e.kind() == io::ErrorKind::NotFound
                    || e.raw_os_error() == Some(libc::ENOTDIR) =>
            {
                match existing.file_name() {
                    Some(name) => missing.push(name.to_owned()),
                    None => return Ok(path.to_path_buf()),
                }
                if !existing.pop() {
                    return Ok(path.to_path_buf());
                }
            }
            Err(source) => {
                return Err(SandboxError::GrantPath {
                    path: path.to_owned(),
                    source,
                });
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(root: &Path) -> SandboxPolicy {
        SandboxPolicy {
            pinned: vec![],
            read_write: vec![root.join("w")],
            read_only: vec![],
            blocked: vec![root.join("w/a/b"), root.join("w/missing")],
            read_only_within: vec![root.join("w/ro")],
            denied: vec![],
            home: None,
            scratch: root.join("scratch"),
            cwd: root.join("w"),
            limits: CommandLimits::default(),
        }
    }

    #[test]
    fn exclusions_grant_siblings_not_the_parent() {
        let dir = tempfile::tempdir().expect("tempdir");
        let root = dir.path().canonicalize().expect("canonical");
        for d in ["w/a/b", "w/a/c", "w/d", "w/ro", "scratch"] {
            std::fs::create_dir_all(root.join(d)).expect("mkdir");
        }
        std::fs::write(root.join("w/f"), "x").expect("write");
        std::os::unix::fs::symlink("/etc", root.join("w/link")).expect("symlink");
        let abi = landlock_status().expect("landlock");
        let plan = plan_rules(&policy(&root), abi).expect("plan");
        let find = |p: &str| {
            plan.rules
                .iter()
                .filter(|r| r.path == root.join(p))
                .map(|r| r.access)
                .collect::<Vec<_>>()
        };
        let all = AccessFs::from_all(ABI::from(abi));
        assert_eq!(find("w"), vec![BitFlags::from(AccessFs::ReadDir)]);
        assert_eq!(find("w/a"), vec![BitFlags::from(AccessFs::ReadDir)]);
        assert!(find("w/a/b").is_empty(), "blocked path granted");
        assert!(find("w/missing").is_empty());
        assert_eq!(find("w/a/c"), vec![all]);
        assert_eq!(find("w/d"), vec![all]);
        assert_eq!(find("w/ro"), vec![AccessFs::from_read(ABI::from(abi))]);
        assert_eq!(find("w/f"), vec![all & AccessFs::from_file(ABI::from(abi))]);
        assert!(find("w/link").is_empty(), "symlink followed");
        assert_eq!(find("scratch"), vec![all]);
    }

    /// Landlock ABI 9 (not on this machine's kernel; the plan is only built, not applied):
    /// connecting to named Unix sockets is handled and granted only beneath the writable
    /// folders and the scratch dir, never the system paths; `--allow-unix-sockets` unhandles it.
    #[test]
    fn from_abi_9_unix_sockets_resolve_only_beneath_the_shared_folders() {
        let dir = tempfile::tempdir().expect("tempdir");
        let root = dir.path().canonicalize().expect("canonical");
        for d in ["w/a/b", "w/a/c", "w/d", "w/ro", "scratch"] {
            std::fs::create_dir_all(root.join(d)).expect("mkdir");
        }
        let mut plan = plan_rules(&policy(&root), 9).expect("plan");
        assert!(plan.handled.contains(AccessFs::ResolveUnix));
        let has = |plan: &Plan, path: &Path| {
            plan.rules
                .iter()
                .any(|r| r.path == path && r.access.contains(AccessFs::ResolveUnix))
        };
        assert!(has(&plan, &root.join("w/d")));
        assert!(has(&plan, &root.join("scratch")));
        assert!(!has(&plan, &root.join("w/ro")), "a read-only exclusion");
        for system in ["/usr", "/etc", "/proc", "/dev/null"] {
            if let Ok(path) = std::fs::canonicalize(system) {
                assert!(!has(&plan, &path), "{system}");
            }
        }
        plan.allow_unix_sockets();
        assert!(!plan.handled.contains(AccessFs::ResolveUnix));
        assert!(
            plan.rules
                .iter()
                .all(|r| !r.access.contains(AccessFs::ResolveUnix))
        );
    }

    #[test]
    fn no_terminal_device_is_granted() {
        let dir = tempfile::tempdir().expect("tempdir");
        let root = dir.path().canonicalize().expect("canonical");
        for d in ["w/a/b", "w/a/c", "w/d", "w/ro", "scratch"] {
            std::fs::create_dir_all(root.join(d)).expect("mkdir");
        }
        let plan = plan_rules(&policy(&root), MIN_ABI).expect("plan");
        for terminal in ["/dev/tty", "/dev/ptmx", "/dev/pts", "/dev/console"] {
            assert!(!DEVICES.contains(&terminal), "{terminal}");
        }
        for rule in &plan.rules {
            let path = rule.path.to_string_lossy();
            let under_dev = path == "/dev" || path.starts_with("/dev/");
            assert!(
                !under_dev || DEVICES.contains(&path.as_ref()),
                "{path} is granted"
            );
        }
    }

    #[test]
    fn missing_grant_is_an_error() {
        let dir = tempfile::tempdir().expect("tempdir");
        let root = dir.path().canonicalize().expect("canonical");
        std::fs::create_dir_all(root.join("scratch")).expect("mkdir");
        let error = plan_rules(&policy(&root), MIN_ABI)
            .err()
            .expect("must fail");
        assert!(matches!(error, SandboxError::GrantPath { .. }), "{error}");
    }

    #[test]
    fn lenient_resolution_keeps_missing_tail() {
        let dir = tempfile::tempdir().expect("tempdir");
        let root = dir.path().canonicalize().expect("canonical");
        let resolved = resolve_lenient(&root.join("x/y")).expect("resolve");
        assert_eq!(resolved, root.join("x/y"));
        assert!(resolve_lenient(Path::new("relative")).is_err());
        assert!(resolve_lenient(&root.join("../etc")).is_err());
    }
}
