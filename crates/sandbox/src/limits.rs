//! What a command may use beyond its files: processes, memory, Unix sockets.
//!
//! Owns: [`CommandLimits`], the part of the sandbox policy the launcher enforces besides
//! Landlock (the process limit, whether Unix sockets are allowed, the command's cgroup);
//! [`Limits`], the caller-wide settings (the laptop's `--max-processes`, `--max-memory` and
//! `--allow-unix-sockets`) together with the delegated cgroup found when the caller started; the
//! per-command step that gives a command its own cgroup ([`Limits::for_command`]); and the
//! process count and `RLIMIT_NPROC` the launcher sets ([`set_process_limit`]). What a person is
//! told about them is the caller's to say.
//!
//! `RLIMIT_NPROC` counts every process (every thread, in fact) of the person's user, not only
//! the command's, so an absolute limit would stop a person who already runs more than that from
//! running any command. The launcher therefore sets it to the user's current count plus
//! `--max-processes`: the command can start about that many more, fewer if the person's other
//! programs start more meanwhile. It does not bind root (nor a process with `CAP_SYS_RESOURCE`).
//! In a delegated cgroup, `pids.max` gives the command an exact limit of its own.
//!
//! Must never: refuse to start because no memory limit can be applied (the caller says so, by
//! name); run a command whose cgroup could not be made when the caller has one (refused
//! instead).

use std::path::PathBuf;

use crate::SandboxPolicy;
use crate::cgroup::{CgroupError, CgroupLayout, CgroupTree, CommandCgroup, NoCgroup};

/// `--max-processes` when not given.
pub const DEFAULT_MAX_PROCESSES: u64 = 512;

/// What the launcher enforces for one command besides the Landlock ruleset. Every field has a
/// safe default, so a policy without it gets [`DEFAULT_MAX_PROCESSES`] and no Unix sockets.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(default)]
pub struct CommandLimits {
    /// Processes (threads) the command may start beyond its user's count when it starts.
    pub max_processes: u64,
    /// `--allow-unix-sockets`: no seccomp filter on `socket(AF_UNIX)` (below Landlock ABI 9),
    /// no `LANDLOCK_ACCESS_FS_RESOLVE_UNIX` restriction (from ABI 9).
    pub allow_unix_sockets: bool,
    /// The command's own cgroup, made by the caller: the launcher moves the command into it
    /// and ends it with `cgroup.kill`.
    pub cgroup: Option<PathBuf>,
}

impl Default for CommandLimits {
    fn default() -> Self {
        CommandLimits {
            max_processes: DEFAULT_MAX_PROCESSES,
            allow_unix_sockets: false,
            cgroup: None,
        }
    }
}

/// A bad `--max-memory` or `--max-processes` value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LimitError {
    #[error(
        "{value:?} is not a size: use a number of bytes with an optional K, M, G or T (powers of 1024), e.g. 4G"
    )]
    BadSize { value: String },
    #[error("the limit must be more than zero")]
    Zero,
}

/// Parses `--max-memory`: bytes, or a number with `K`, `M`, `G` or `T` (KiB … TiB; an
/// optional trailing `B` or `iB` is accepted).
pub fn parse_size(value: &str) -> Result<u64, LimitError> {
    let bad = || LimitError::BadSize {
        value: value.to_owned(),
    };
    let trimmed = value.trim();
    let upper = trimmed.to_ascii_uppercase();
    let without_b = upper
        .strip_suffix("IB")
        .or_else(|| upper.strip_suffix('B'))
        .unwrap_or(&upper);
    let (digits, shift) = match without_b.chars().last() {
        Some('K') => (&without_b[..without_b.len() - 1], 10),
        Some('M') => (&without_b[..without_b.len() - 1], 20),
        Some('G') => (&without_b[..without_b.len() - 1], 30),
        Some('T') => (&without_b[..without_b.len() - 1], 40),
        _ => (without_b, 0),
    };
    let number: u64 = digits.trim().parse().map_err(|_| bad())?;
    let bytes = number.checked_mul(1u64 << shift).ok_or_else(bad)?;
    if bytes == 0 {
        return Err(LimitError::Zero);
    }
    Ok(bytes)
}

/// Parses `--max-processes` (more than zero).
pub fn parse_count(value: &str) -> Result<u64, LimitError> {
    match value.trim().parse::<u64>() {
        Ok(0) => Err(LimitError::Zero),
        Ok(n) => Ok(n),
        Err(_) => Err(LimitError::BadSize {
            value: value.to_owned(),
        }),
    }
}

/// Half of `MemTotal` in `/proc/meminfo` (the default `--max-memory`).
pub fn half_of_memory(meminfo: &str) -> Option<u64> {
    let line = meminfo.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024 / 2)
}

/// The caller-wide limits (the laptop's flags), and the delegated cgroup (or why there is none).
#[derive(Debug)]
pub struct Limits {
    pub max_processes: u64,
    /// `memory.max` for each command's cgroup.
    pub max_memory: u64,
    pub allow_unix_sockets: bool,
    pub cgroups: Result<CgroupTree, NoCgroup>,
}

impl Limits {
    /// The given limits and the caller's delegated cgroup, when it has one (this process moves
    /// into the leaf `layout` names). `max_memory` `None` means half of the machine's memory.
    pub fn setup(
        max_processes: u64,
        max_memory: Option<u64>,
        allow_unix_sockets: bool,
        layout: CgroupLayout,
    ) -> Limits {
        let max_memory = max_memory
            .or_else(|| {
                std::fs::read_to_string("/proc/meminfo")
                    .ok()
                    .and_then(|m| half_of_memory(&m))
            })
            .unwrap_or(u64::MAX);
        Limits {
            max_processes,
            max_memory,
            allow_unix_sockets,
            cgroups: CgroupTree::delegated(layout),
        }
    }

    /// Limits without a cgroup (tests, and the defaults of a policy).
    pub fn without_cgroup(reason: &str) -> Limits {
        Limits {
            max_processes: DEFAULT_MAX_PROCESSES,
            max_memory: u64::MAX,
            allow_unix_sockets: false,
            cgroups: Err(NoCgroup(reason.to_owned())),
        }
    }

    /// Sets `policy`'s [`CommandLimits`] for one request and, with a delegated cgroup, makes
    /// the command's cgroup (killed and removed with [`CommandCgroup::kill_and_remove`] once the
    /// request is done).
    pub fn for_command(
        &self,
        policy: &mut SandboxPolicy,
    ) -> Result<Option<CommandCgroup>, CgroupError> {
        let cgroup = match &self.cgroups {
            Ok(tree) => Some(tree.command(self.max_memory, self.max_processes)?),
            Err(_) => None,
        };
        policy.limits = CommandLimits {
            max_processes: self.max_processes,
            allow_unix_sockets: self.allow_unix_sockets,
            cgroup: cgroup.as_ref().map(|c| c.path().to_owned()),
        };
        Ok(cgroup)
    }
}

/// Sets `RLIMIT_NPROC` (soft and hard, so the command cannot raise it) to the real user's
/// current task count plus `max_processes`; returns the limit. Call only while the process is
/// single-threaded (the launcher, before it forks the shell): the count is probed by forking.
pub fn set_process_limit(max_processes: u64) -> std::io::Result<u64> {
    let limit = user_task_count()?.saturating_add(max_processes);
    let rlimit = rustix::process::Rlimit {
        current: Some(limit),
        maximum: Some(limit),
    };
    rustix::process::setrlimit(rustix::process::Resource::Nproc, rlimit)?;
    Ok(limit)
}

/// The real user's task count as `RLIMIT_NPROC` counts it (threads and zombies of every
/// process of the user). The kernel does not publish it, and reading every `/proc/<pid>/status`
/// can take a second on a busy machine, so it is probed: with a soft limit `L`, a fork succeeds
/// exactly when the count is below `L`, so the count is the smallest `L` at which a fork
/// succeeds, less one (about 20 forks of a child that exits at once). For root, whom the limit
/// does not bind, every fork succeeds and this says 0. The original limit is restored.
fn user_task_count() -> std::io::Result<u64> {
    use rustix::process::{Resource, Rlimit, getrlimit, setrlimit};
    let original = getrlimit(Resource::Nproc);
    let hard = original.maximum.unwrap_or(u64::MAX);
    let probe = |limit: u64| -> std::io::Result<bool> {
        setrlimit(
            Resource::Nproc,
            Rlimit {
                current: Some(limit),
                maximum: original.maximum,
            },
        )?;
        fork_succeeds()
    };
    // The smallest L in (low, high] with a successful fork.
    let mut low = 0u64;
    let mut high = 1024u64.min(hard);
    let found = loop {
        if probe(high)? {
            break true;
        }
        if high >= hard {
            break false;
        }
        low = high;
        high = high.saturating_mul(2).min(hard);
    };
    let result = if found {
        while high - low > 1 {
            let mid = low + (high - low) / 2;
            if probe(mid)? {
                high = mid;
            } else {
                low = mid;
            }
        }
        Ok(high - 1)
    } else {
        // Even the hard limit is reached: no command can start a process anyway.
        Ok(hard)
    };
    setrlimit(Resource::Nproc, original)?;
    result
}

/// Forks a child that exits at once and reaps it: `Ok(false)` when the fork fails with
/// `EAGAIN` (the user is at its `RLIMIT_NPROC`).
fn fork_succeeds() -> std::io::Result<bool> {
    // SAFETY: called only while the process is single-threaded (the launcher before it forks
    // the shell), so the child is a copy of the only thread; the child calls only _exit, which
    // is async-signal-safe, and touches no memory.
    match unsafe { libc::fork() } {
        -1 => {
            let error = std::io::Error::last_os_error();
            if error.raw_os_error() == Some(libc::EAGAIN) {
                Ok(false)
            } else {
                Err(error)
            }
        }
        0 => {
            // SAFETY: _exit ends the child without running anything of the parent's.
            unsafe { libc::_exit(0) }
        }
        child => {
            let pid = nix::unistd::Pid::from_raw(child);
            loop {
                match nix::sys::wait::waitpid(pid, None) {
                    Err(nix::errno::Errno::EINTR) => continue,
                    Ok(_) => return Ok(true),
                    Err(e) => return Err(e.into()),
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("4G"), Ok(4 << 30));
        assert_eq!(parse_size("512m"), Ok(512 << 20));
        assert_eq!(parse_size("64MiB"), Ok(64 << 20));
        assert_eq!(parse_size("1000"), Ok(1000));
        assert_eq!(parse_size("2TB"), Ok(2 << 40));
        assert_eq!(parse_size("0"), Err(LimitError::Zero));
        assert!(parse_size("lots").is_err());
        assert!(parse_size("-1G").is_err());
        assert!(parse_size("99999999999T").is_err());
        assert_eq!(parse_count("512"), Ok(512));
        assert_eq!(parse_count("0"), Err(LimitError::Zero));
    }

    #[test]
    fn half_of_the_machine() {
        let meminfo = "MemTotal:       24576000 kB\nMemFree:         1000 kB\n";
        assert_eq!(half_of_memory(meminfo), Some(24576000 * 1024 / 2));
        assert_eq!(half_of_memory("nothing"), None);
    }
}
