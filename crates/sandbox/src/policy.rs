//! The policy a sandboxed command runs under: which folders it may read, write or never touch,
//! and what limits the launcher sets ([`CommandLimits`]).
//!
//! Owns: [`SandboxPolicy`] and its pinned grants ([`PinnedGrant`]), the one description both
//! back ends (Landlock on Linux, `sandbox-exec` on macOS) enforce. It travels to the launcher as
//! JSON in its arguments. Must never: hold a relative path the launcher would resolve against
//! its own working directory (the plan refuses one).

use std::path::PathBuf;

use crate::limits::CommandLimits;

/// What a pinned directory grants.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PinnedAccess {
    /// Read, write, create, remove (the laptop's `--write-folder` and Downloads companion).
    ReadWrite,
    /// Read and execute (the laptop's `--folder` and toolchain folders).
    ReadOnly,
}

/// A directory the caller opened once (the laptop: at connect) and keeps open (an `O_PATH`
/// descriptor), granted to a command through that descriptor: whatever its path names later (a
/// symlink, a folder moved in its place) does not change what the rule covers. The launcher
/// inherits the descriptor (and only the pinned ones:
/// [`SandboxCommand::spawn`](crate::process::SandboxCommand::spawn)) and checks that it still is
/// the directory recorded here. The caller keeps it open at least until the launcher started.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PinnedGrant {
    /// The descriptor's number in the caller, and so in the launcher.
    pub fd: i32,
    /// Device and inode of the directory when it was opened.
    pub dev: u64,
    pub ino: u64,
    /// Its canonical path when it was opened: exclusions are matched against it, and messages
    /// name it.
    pub path: PathBuf,
    pub access: PinnedAccess,
}

/// What a command may touch, besides the system paths and devices every command gets (read and
/// execute; the null and random devices, never a terminal). Paths must be absolute; the
/// path-based ones (`read_write`, `read_only`, `read_only_if_present`) are resolved (symlinks
/// followed) by the launcher before the ruleset is built, so a grant whose path someone else
/// can change goes through `pinned` descriptors instead (the laptop's shared folders, Downloads
/// and toolchains; paths only for its own scratch dir and executable).
///
/// Everything that is the caller's own comes in here, none of it is built in: its credentials
/// and state (`denied`), its toolchains or install dirs (`read_only`, `read_only_if_present`),
/// its runtime or scratch dir (`scratch`, `read_write`).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct SandboxPolicy {
    /// Directories granted through descriptors pinned by the caller.
    #[serde(default)]
    pub pinned: Vec<PinnedGrant>,
    /// Writable folders granted by path (read, write, create, remove).
    pub read_write: Vec<PathBuf>,
    /// Paths granted read and execute by path, which must exist (the launcher executable, for
    /// the laptop's patches; a coding CLI's install dir).
    pub read_only: Vec<PathBuf>,
    /// Paths granted read and execute where they exist, skipped where they do not (toolchain
    /// folders under a home). Granted with the system paths, before any other grant.
    #[serde(default)]
    pub read_only_if_present: Vec<PathBuf>,
    /// Neither readable nor writable nor creatable, existing or not (the laptop's `--block`).
    pub blocked: Vec<PathBuf>,
    /// Paths inside a writable folder that are not writable (the laptop's `--read-only`).
    pub read_only_within: Vec<PathBuf>,
    /// Never readable nor writable, wherever they lie: the caller's credentials and state, a
    /// toolchain's credential files.
    pub denied: Vec<PathBuf>,
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
    /// the rule walk, and so is everything when the kernel refuses the namespace. The caller
    /// sets it when the probe ([`exclusion_mechanism`](crate::exclusion_mechanism)) found
    /// namespaces usable. Ignored on macOS, whose profile denies a path inside an allowed folder
    /// itself.
    #[serde(default)]
    pub overmount_exclusions: bool,
    /// Linux: let the command make terminals (PTYs: `openpty`, `script`, a coding CLI's
    /// `tty: true` commands) in a devpts instance of its own, mounted in the same user and mount
    /// namespace (`terminals.rs`): `/dev/ptmx`, that instance's `/dev/pts` and `/dev/tty` (which
    /// only opens a controlling terminal, and the command's session has none but its own PTYs)
    /// are granted, and no other instance's terminal is visible or can be opened, so commands of
    /// other sandboxes (other chats of the same user) stay out of each other's terminals. Where
    /// the kernel refuses the namespace the command gets no terminal at all, and the launcher
    /// says so on the command's stderr. Off: no terminal device (the laptop's rule). Ignored on
    /// macOS, whose PTYs are the machine's: no terminal there.
    #[serde(default)]
    pub private_terminals: bool,
}
