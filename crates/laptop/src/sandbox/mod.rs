//! The executor's sandbox: the policy a command runs under and the launcher that enforces it.
//!
//! Owns: [`SandboxPolicy`] (which folders a command may read, write or never touch), the
//! Landlock support check ([`landlock_status`]) and the launcher ([`launcher_main`]): the
//! `agentworks` binary re-executed as `agentworks __sandbox-exec <policy-json> -- <sh> -c <cmd>`.
//! The launcher, in this order (each step in `launcher.rs` says why it comes there): marks
//! inherited descriptors close-on-exec; becomes the leader of a new session with no controlling
//! terminal; becomes a child subreaper; opens the command's cgroup (when the executor made one);
//! sets `no_new_privs` and `RLIMIT_NPROC`; covers the exclusions inside writable folders by
//! mounts in a user and mount namespace of its own, where it can (`overmount.rs`); builds and
//! applies a Landlock ruleset to itself that
//! grants no terminal device; installs the seccomp filter refusing Unix sockets and io_uring
//! (below ABI 9, unless allowed; `seccomp.rs`); forks the shell (which moves into the command's
//! cgroup, enters a nested ruleset with the signal and abstract-socket scopes, so it cannot
//! signal the launcher or connect to an abstract socket outside the sandbox, drops every
//! capability, takes the namespace and mount seccomp filter when it is in the launcher's
//! namespaces, and gets back the signal mask the launcher was started with); and when the shell
//! ends — or the launcher is told to stop — ends everything the command left (`cgroup.kill`
//! first, then SIGKILL to every descendant it finds) and exits with the shell's status only once
//! `waitpid(-1)` answers `ECHILD`.
//!
//! On macOS (`macos.rs`) the same launcher subcommand, with the same policy, runs the command
//! as `sandbox-exec -p <profile> -- <sh> -c <command>`, the profile generated from the policy by
//! `sbpl.rs`; in this order: checks the pinned folders still are the directories opened at
//! connect, marks inherited descriptors close-on-exec, leads a new session with no controlling
//! terminal, sets `RLIMIT_NPROC`, starts sandbox-exec in its session and process group, records
//! every process of the command (descendants, group members) while it runs, and ends them all
//! with SIGKILL rounds once it ends or the launcher is told to stop (there is no subreaper and
//! no `/proc`: `tree.rs` says what that can and cannot find). macOS has no `PR_SET_PDEATHSIG`
//! either: the launcher ends the command when it sees its executor is gone.
//!
//! Layout: this file holds the policy, its error, the argument parsing and terminal check both
//! launchers share, and the sandbox support check ([`check_available`]: Landlock on Linux,
//! `sandbox-exec` on macOS); `sbpl.rs` the macOS back end of the same policy (a `sandbox-exec`
//! profile, generated and evaluated on any machine); `tree.rs` finding a command's processes
//! without a subreaper (pure, tested anywhere); `pinned.rs` the macOS launcher's check of the
//! pinned folders (tested anywhere); `macos.rs` the macOS launcher;
//! `spawn.rs` what the executor sets on the launcher's process before exec ([`new_session`],
//! [`die_with_parent`], [`inherit_pinned`]); `plan.rs` the rule planning (which paths get which
//! Landlock rights, the exclusion walk, the pinned-descriptor checks), which applies nothing;
//! `overmount.rs` the covers of exclusions by mounts in the command's own user and mount
//! namespace, and the connect-time probe for them;
//! `launcher.rs` the launcher's steps in their order, applying the planned ruleset; `reaper.rs`
//! the waiting for the shell and the ending and reaping of every process the command left.
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
//! blocked path cannot be carved out of a granted folder. Where the kernel allows it and the
//! policy asks for it ([`SandboxPolicy::overmount_exclusions`]), the launcher covers each
//! existing `--block` and `--read-only` path inside a writable folder with a mount in a user and
//! mount namespace of the command's own (`overmount.rs`), and the walk below no longer descends
//! to it. Everything else (missing paths, the CLI's own dirs, machines without the namespace)
//! goes through the walk: for a grant `W` containing an
//! excluded path `W/a/b`, the launcher grants every entry of `W` except `a` individually, then
//! every entry of `a` except `b`, and so on; `W` and `a` themselves only get directory listing
//! (or read access when the exclusion is a read-only one). `--block` paths, the CLI's
//! credentials and state (`denied`) and the toolchains' credential files are excluded that way;
//! `--read-only` paths (and read-only folders nested in a writable one) get read access only.
//!
//! Residual limits: where the walk is used, new entries cannot be created directly in a folder
//! that lies on the path to an exclusion (`W` and `a` above), since only their existing entries
//! are granted (connect names those folders); entries
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

use std::ffi::OsString;
use std::io;
use std::path::PathBuf;

use rustix::fs::{Mode, OFlags};

use super::limits::CommandLimits;
use super::resolve::ResolveError;
#[cfg(target_os = "linux")]
use super::seccomp::SeccompError;

#[cfg(target_os = "linux")]
mod launcher;
#[cfg(target_os = "macos")]
mod macos;
#[cfg(target_os = "linux")]
mod overmount;
#[cfg(any(target_os = "macos", test))]
mod pinned;
#[cfg(target_os = "linux")]
mod plan;
#[cfg(target_os = "linux")]
mod reaper;
pub mod sbpl;
mod spawn;
#[cfg(any(target_os = "macos", test))]
pub mod tree;

#[cfg(target_os = "linux")]
use launcher::launch;
#[cfg(target_os = "macos")]
use macos::launch;
#[cfg(target_os = "macos")]
pub use macos::start_time as process_start_time;
pub use spawn::{die_with_parent, inherit_pinned, new_session};
/// The hidden subcommand that puts the `agentworks` binary in launcher mode.
pub const SUBCOMMAND: &str = "__sandbox-exec";
/// Printed by the binary before a launcher error; the shell runner recognises a refusal by it.
pub const REFUSAL_PREFIX: &str = "agentworks sandbox refused: ";
/// The lowest Landlock ABI we run commands under: ABI 3 adds `truncate` control, without which
/// a read-only file could still be emptied.
pub const MIN_ABI: i32 = 3;
/// Debug builds only: simulate a kernel reporting this Landlock ABI (`0` = unavailable).
pub const TEST_ABI_ENV: &str = "AGENTWORKS_TEST_LANDLOCK_ABI";
/// Debug builds only, read by the executor at connect: `1` makes it act as on a machine that
/// refuses unprivileged user namespaces (the exclusions then use the rule walk).
pub const TEST_NO_USERNS_ENV: &str = "AGENTWORKS_TEST_NO_USERNS";
/// The hidden subcommand of the connect-time namespace probe ([`exclusion_mechanism`]).
pub const PROBE_SUBCOMMAND: &str = "__sandbox-probe";

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
    /// Linux: enforce the `blocked` and `read_only_within` paths that lie inside a writable
    /// folder by mounts in a user and mount namespace of the command's own, so the folder is
    /// granted whole and keeps file creation (`overmount.rs`); what cannot be covered is left to
    /// the rule walk, and so is everything when the kernel refuses the namespace. The executor
    /// sets it when its connect-time probe ([`mount_namespace_status`]) found namespaces
    /// usable. Ignored on macOS, whose profile denies a path inside an allowed folder itself.
    #[serde(default)]
    pub overmount_exclusions: bool,
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
    #[cfg(target_os = "linux")]
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
    #[cfg(target_os = "linux")]
    #[error("{0}, so the command is refused")]
    Seccomp(#[from] SeccompError),
    #[cfg(target_os = "linux")]
    #[error("the command's user namespace cannot be used ({0}), so the command is refused")]
    Namespace(#[from] overmount::OvermountError),
    #[cfg(target_os = "macos")]
    #[error("{path} cannot be used, so commands are refused: {source}")]
    SandboxExecUnavailable {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
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

/// An exclusion that cannot be resolved is a grant that cannot be opened.
impl From<ResolveError> for SandboxError {
    fn from(ResolveError { path, source }: ResolveError) -> SandboxError {
        SandboxError::GrantPath { path, source }
    }
}

impl SandboxError {
    fn setup(what: &'static str) -> impl FnOnce(io::Error) -> SandboxError {
        move |source| SandboxError::Setup { what, source }
    }
}

/// How this machine enforces a `--block` or `--read-only` path inside a writable folder.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ExclusionMechanism {
    /// macOS: the profile denies the path itself; nothing else loses access.
    Profile,
    /// Linux: a mount covers it in the command's own user and mount namespace, and the folder
    /// keeps file creation; a path that does not exist yet is still carved out by the walk.
    Overmount,
    /// Linux, where the kernel refuses an unprivileged user and mount namespace: the rule walk,
    /// and every directory on the path to an exclusion loses file creation. Why.
    Walk(String),
}

/// Which [`ExclusionMechanism`] commands get here, found at connect by running `launcher`
/// (the `agentworks` binary) as `agentworks __sandbox-probe`, which tries the namespace steps
/// the launcher takes. Debug builds honour [`TEST_NO_USERNS_ENV`].
pub fn exclusion_mechanism(launcher: &std::path::Path) -> ExclusionMechanism {
    if cfg!(target_os = "macos") {
        return ExclusionMechanism::Profile;
    }
    if cfg!(debug_assertions) && std::env::var(TEST_NO_USERNS_ENV).is_ok_and(|v| v == "1") {
        return ExclusionMechanism::Walk(format!(
            "{TEST_NO_USERNS_ENV}=1 simulates a machine that refuses them"
        ));
    }
    match std::process::Command::new(launcher)
        .arg(PROBE_SUBCOMMAND)
        .env_clear()
        .stdin(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .output()
    {
        Ok(out) if out.status.success() => ExclusionMechanism::Overmount,
        Ok(out) => ExclusionMechanism::Walk(String::from_utf8_lossy(&out.stdout).trim().to_owned()),
        Err(e) => ExclusionMechanism::Walk(format!(
            "the probe {} could not run: {e}",
            launcher.display()
        )),
    }
}

/// The probe's entry (`agentworks __sandbox-probe`): first thing in `main`, while the process is
/// single-threaded. Linux: enters a user and mount namespace and makes one cover of each kind,
/// detached; prints why it could not on stdout. Returns the exit code (0: usable).
pub fn probe_main() -> u8 {
    #[cfg(target_os = "linux")]
    if let Err(reason) = overmount::probe() {
        println!("{reason}");
        return 1;
    }
    0
}

/// Launcher mode entry: called by the `agentworks` binary when re-executed as
/// `agentworks __sandbox-exec <policy-json> -- <sh> -c <command>` (Landlock on Linux,
/// `sandbox-exec` on macOS). Must be called first thing in `main`, while the process is
/// single-threaded. On success it never returns (it exits with the shell's status, 128+signal if
/// the shell was signalled or the launcher told to stop); it returns only on error, before any
/// command ran, and the caller prints the error after [`REFUSAL_PREFIX`] and exits 126.
pub fn launcher_main(args: &[String]) -> SandboxError {
    match launch(args) {
        Ok(never) => match never {},
        Err(error) => error,
    }
}

/// Whether this machine can run commands in the sandbox, or an error saying why they are
/// refused: the Landlock ABI on Linux ([`landlock_status`]); on macOS `None` once
/// `sandbox-exec` is there.
pub fn check_available() -> Result<Option<i32>, SandboxError> {
    #[cfg(target_os = "linux")]
    return landlock_status().map(Some);
    #[cfg(target_os = "macos")]
    return std::fs::metadata(sbpl::SANDBOX_EXEC)
        .map(|_| None)
        .map_err(|source| SandboxError::SandboxExecUnavailable {
            path: sbpl::SANDBOX_EXEC.into(),
            source,
        });
}

/// Both launchers' check that they have no controlling terminal: `/dev/tty` must not open
/// (`ENXIO`: no controlling terminal; `ENOENT`: no such device on this machine).
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

type ParsedArgs = (SandboxPolicy, OsString, Vec<OsString>);

/// Both launchers' arguments: `<policy-json> -- <program> [args...]`.
fn parse_launcher_args(args: &[String]) -> Result<ParsedArgs, SandboxError> {
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

/// Checks Landlock support and returns the ABI version, or an error saying why commands are
/// refused. Debug builds honour [`TEST_ABI_ENV`] to simulate an older or missing Landlock.
#[cfg(target_os = "linux")]
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

#[cfg(target_os = "linux")]
fn simulated_abi() -> Option<i32> {
    if !cfg!(debug_assertions) {
        return None;
    }
    std::env::var(TEST_ABI_ENV).ok()?.trim().parse().ok()
}

#[cfg(target_os = "linux")]
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
