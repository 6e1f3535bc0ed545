//! The policy a sandboxed command runs under: which folders it may read, write or never touch,
//! and what limits the launcher sets ([`CommandLimits`]).
//!
//! Owns: [`SandboxPolicy`] and its pinned grants ([`PinnedGrant`]), the one description both
//! back ends (Landlock on Linux, `sandbox-exec` on macOS) enforce. It travels to the launcher as
//! JSON in its arguments. Must never: hold a relative path the launcher would resolve against
//! its own working directory (the plan refuses one).

use std::path::PathBuf;

use crate::limits::CommandLimits;

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
/// descriptor ([`inherit_pinned`](crate::inherit_pinned)) and checks that it still is the directory recorded here.
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
    /// sets it when its connect-time probe ([`exclusion_mechanism`](crate::exclusion_mechanism)) found namespaces
    /// usable. Ignored on macOS, whose profile denies a path inside an allowed folder itself.
    #[serde(default)]
    pub overmount_exclusions: bool,
}
