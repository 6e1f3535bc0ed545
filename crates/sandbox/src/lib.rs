//! `agentworks-sandbox`: one command confined on the machine it runs on, for every program
//! that runs commands for an agent (the laptop CLI's executor; the server's coding-CLI runner).
//!
//! Owns: [`SandboxPolicy`] (which folders a command may read, write or never touch), the
//! support check ([`check_available`], [`landlock_status`]), the launcher that enforces the
//! policy, and the process that runs a command through it.
//!
//! Using it, for a program that runs commands (the laptop's `agentworks`; a daemon): its
//! `main` calls [`launcher::main_if_launcher`] first, so that the same binary re-executed as
//! `<binary> __sandbox-exec <policy-json> -- <program> [args...]` becomes the launcher. To run a
//! command it builds a [`SandboxPolicy`] (the folders, its own state `denied`, a scratch dir,
//! the [`CommandLimits`]: a cgroup per command from [`limits::Limits::for_command`] where the
//! caller's cgroup is delegated) and either runs a shell command to completion with its output
//! captured ([`shell::run`]: 1 MiB per stream, 60 s by default, 300 s at most, the tree ended on
//! cancel) or starts any program with [`process::SandboxCommand`] (an explicit environment, piped
//! streams) and holds a [`process::SandboxedChild`]: read and write its pipes as it runs, signal
//! its processes, end its whole tree, wait for its exit:
//!
//! ```no_run
//! use agentworks_sandbox::SandboxPolicy;
//! use agentworks_sandbox::process::{Launcher, SandboxCommand, Stream};
//! use tokio::io::AsyncBufReadExt;
//!
//! fn main() -> std::process::ExitCode {
//!     // First, while single-threaded: re-executed as the launcher, the binary becomes it.
//!     if let Some(code) = agentworks_sandbox::launcher::main_if_launcher() {
//!         return code;
//!     }
//!     // …the program itself: a runtime, and commands started as below.
//!     std::process::ExitCode::SUCCESS
//! }
//!
//! async fn turn(policy: SandboxPolicy) -> Result<(), Box<dyn std::error::Error>> {
//!     let mut command = SandboxCommand::new("/opt/cli/bin/agent", policy);
//!     command
//!         .args(["exec", "--json"])
//!         .env("PATH", "/usr/bin:/bin")
//!         .env("HOME", "/var/lib/runner/home")
//!         .stdin(Stream::Piped)
//!         .stdout(Stream::Piped);
//!     let mut child = command.spawn(&Launcher::current_exe()?)?;
//!     let stdout = child.stdout.take().ok_or("stdout is piped")?;
//!     let mut lines = tokio::io::BufReader::new(stdout).lines();
//!     while let Some(event) = lines.next_line().await? {
//!         if event.contains("\"cancelled\"") {
//!             child.kill_tree().await?;
//!             break;
//!         }
//!     }
//!     let status = child.wait().await?;
//!     println!("the agent exited: {status}");
//!     Ok(())
//! }
//! ```
//!
//! The launcher, in this order (each step in `launcher/linux.rs` says why it comes there): marks
//! inherited descriptors close-on-exec; becomes the leader of a new session with no controlling
//! terminal; becomes a child subreaper; opens the command's cgroup (when the caller made one);
//! sets `no_new_privs` and `RLIMIT_NPROC`; covers the exclusions inside writable folders by
//! mounts in a user and mount namespace of its own, where it can (`overmount.rs`), and in the
//! same namespace mounts a devpts instance of the command's own when the policy asks for
//! private terminals (`terminals.rs`); builds and applies a Landlock ruleset to itself that
//! grants no terminal device but those private ones; installs the seccomp filter refusing Unix sockets and io_uring
//! (below ABI 9, unless allowed; `seccomp.rs`); forks the command (which moves into its
//! cgroup, enters a nested ruleset with the signal and abstract-socket scopes, so it cannot
//! signal the launcher or connect to an abstract socket outside the sandbox, drops every
//! capability, takes the namespace and mount seccomp filter when it is in the launcher's
//! namespaces, and gets back the signal mask the launcher was started with); and when the
//! command's first process ends — or the launcher is told to stop — ends everything the command
//! left (`cgroup.kill` first, then SIGKILL to every descendant it finds) and exits with that
//! process's status only once `waitpid(-1)` answers `ECHILD`.
//!
//! On macOS (`launcher/macos.rs`) the same launcher subcommand, with the same policy, runs the
//! command as `sandbox-exec -p <profile> -- <program> [args...]`, the profile generated from the
//! policy by `sbpl.rs`; in this order: checks the pinned folders still are the directories
//! opened when they were pinned, marks inherited descriptors close-on-exec, leads a new session
//! with no controlling terminal, sets `RLIMIT_NPROC`, starts sandbox-exec in its session and
//! process group, records every process of the command (descendants, group members) while it
//! runs, and ends them all with SIGKILL rounds once it ends or the launcher is told to stop
//! (there is no subreaper and no `/proc`: `tree.rs` says what that can and cannot find). macOS
//! has no `PR_SET_PDEATHSIG` either: the launcher ends the command when it sees its parent is
//! gone.
//!
//! Layout:
//! - [`policy`]: the policy; [`error`]: why the launcher refused; [`check`]: whether this
//!   machine can sandbox, and how it enforces exclusions (the namespace probe).
//! - [`process`]: a command started through the launcher and the handle on it; [`shell`]: a
//!   shell command run to completion, captured and bounded in time; `spawn.rs`: what is set on
//!   the launcher's process before exec (a new session, death with its parent, the pinned
//!   descriptors inherited).
//! - [`launcher`]: the hidden subcommands and their entry, the argument parsing and terminal
//!   check both launchers share; `launcher/linux.rs` the Linux launcher's steps in their order,
//!   applying the planned ruleset; `launcher/reaper.rs` the waiting for the command and the
//!   ending and reaping of every process it left; `launcher/macos.rs` the macOS launcher;
//!   `launcher/pinned.rs` its check of the pinned folders (tested anywhere).
//! - `plan.rs` the rule planning (which paths get which Landlock rights, the exclusion walk, the
//!   pinned-descriptor checks), which applies nothing; `overmount.rs` the covers of exclusions by
//!   mounts in the command's own user and mount namespace, and the probe for them;
//!   `terminals.rs` the command's private terminals in that namespace; `seccomp`
//!   the filters; `privileges` a root launcher's PID namespace and capability drop (Linux).
//! - [`sbpl`]: the macOS back end of the same policy (a `sandbox-exec` profile, generated and
//!   evaluated on any machine); `tree`: finding a command's processes without a subreaper
//!   (pure, tested anywhere).
//! - [`limits`]: the process, memory and Unix-socket limits; [`cgroup`]: one cgroup per command
//!   in a delegated subtree.
//! - [`resolve`]: a path that may not exist yet, canonicalised as far as it exists.
//!
//! Platforms: Linux and macOS. Linux-only mechanisms (Landlock, seccomp, capabilities, cgroups,
//! `/proc`, the child subreaper) are `cfg(target_os = "linux")`, each with a macOS counterpart
//! under `cfg(target_os = "macos")`; any other target does not compile.
//!
//! Links no daemon plumbing (systemd, journald) and no code of the programs that use it: what
//! is theirs (their credentials, their toolchains, their receipts) comes in through the policy.
//!
//! Must never: run a command without a ruleset the kernel reports as fully enforced (Landlock
//! missing, an ABI below [`MIN_ABI`], a rule that cannot be added or a partially enforced
//! ruleset all refuse), nor with a controlling terminal, nor without a scope or seccomp filter
//! it needs; skip a granted folder it cannot open; follow a symlink when granting; grant a path
//! the policy does not name (besides the system paths and the null and random devices), `/`
//! or a terminal device other than the command's private ones; exit while a process of the command is alive; leave files or mount
//! points in the person's folders; restrict the network.
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
//! than the command forks (a cgroup's `cgroup.kill` has no such race); without
//! [`SandboxPolicy::private_terminals`] (the laptop), or where the namespace is refused, ptys
//! cannot be made (`/dev/ptmx` is not granted), so tools that need one (`script`, `expect`) do
//! not work.
//!
//! # Terminals
//!
//! Every command runs as the same user as its neighbours (every chat's coding CLI on a server),
//! so the machine's terminals are never granted: one command could open another's `/dev/pts/N`
//! and type into it. With [`SandboxPolicy::private_terminals`] the launcher mounts a new devpts
//! instance on `/dev/pts` in its own user and mount namespace and binds that instance's `ptmx`
//! over `/dev/ptmx` (`terminals.rs`), then grants those two and `/dev/tty`: the command makes
//! and uses PTYs of its own, sees no other in `/dev/pts`, and cannot open another instance's by
//! any path (the rules hold this instance's inodes only). Its session still has no controlling
//! terminal from outside, so `TIOCSTI` reaches only a PTY it made. Where the namespace or the
//! mount is refused, no terminal device is granted at all, and the command's stderr starts with
//! [`NO_TERMINAL_NOTICE`] and the reason.

#[cfg(not(any(target_os = "linux", target_os = "macos")))]
compile_error!(
    "the agentworks sandbox runs commands only under Landlock (Linux) or sandbox-exec (macOS); \
     this target's OS has neither, so it is not built for it"
);

pub mod cgroup;
pub mod check;
pub mod error;
pub mod launcher;
pub mod limits;
#[cfg(target_os = "linux")]
mod overmount;
pub mod pin;
#[cfg(target_os = "linux")]
mod plan;
pub mod policy;
#[cfg(target_os = "linux")]
pub mod privileges;
pub mod process;
pub mod resolve;
pub mod sbpl;
#[cfg(target_os = "linux")]
pub mod seccomp;
pub mod shell;
mod spawn;
#[cfg(target_os = "linux")]
mod terminals;
#[cfg(any(target_os = "macos", test))]
pub mod tree;

#[cfg(target_os = "linux")]
pub use check::landlock_status;
pub use check::{
    ExclusionMechanism, MIN_ABI, TEST_ABI_ENV, TEST_NO_USERNS_ENV, check_available,
    exclusion_mechanism,
};
pub use error::SandboxError;
pub use launcher::{
    NO_TERMINAL_NOTICE, PROBE_SUBCOMMAND, REFUSAL_EXIT, REFUSAL_PREFIX, SUBCOMMAND, launcher_main,
    probe_main,
};
pub use limits::CommandLimits;
pub use pin::PinnedDir;
pub use policy::{PinnedAccess, PinnedGrant, SandboxPolicy};
