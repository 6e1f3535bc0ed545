//! Why the launcher refused (or failed) to run a command.
//!
//! Owns: [`SandboxError`], one variant per step that can fail, each carrying what a person needs
//! (the path, the descriptor, the kernel's answer). Every one of them means no command ran.

use std::io;
use std::path::PathBuf;

use crate::launcher::SUBCOMMAND;
#[cfg(target_os = "linux")]
use crate::overmount::OvermountError;
use crate::resolve::ResolveError;
#[cfg(target_os = "linux")]
use crate::seccomp::SeccompError;

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
        "the pinned descriptor {fd} for {path} is not that directory any more ({reason}); it must be opened and pinned again (on the laptop: reconnect to share it again)"
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
    Namespace(#[from] OvermountError),
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
    pub(crate) fn setup(what: &'static str) -> impl FnOnce(io::Error) -> SandboxError {
        move |source| SandboxError::Setup { what, source }
    }
}
