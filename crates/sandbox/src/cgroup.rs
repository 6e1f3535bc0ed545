//! Commands in cgroups of their own, where the caller's cgroup v2 subtree is delegated to it.
//!
//! Owns: finding the caller's cgroup and deciding whether it is delegated ([`CgroupTree::
//! delegated`]); moving the caller into a leaf of it and enabling the memory and pids
//! controllers for its children; one cgroup per command with `memory.max` and `pids.max`
//! ([`CgroupTree::command`]), ended with `cgroup.kill` and removed afterwards
//! ([`CommandCgroup::kill_and_remove`]); and the launcher's side, descriptors on the command
//! cgroup's `cgroup.procs` and `cgroup.kill` opened before Landlock forbids it
//! ([`CommandCgroupFds`]).
//!
//! Layout, for a delegated cgroup `D` (e.g. the scope `systemd-run --user --scope -p Delegate=yes
//! agentworks executor connect …` makes, or a unit's `Delegate=yes`), with the names the caller
//! gives in its [`CgroupLayout`] (the laptop's executor's shown):
//!
//! ```text
//! D/                                   +memory +pids in cgroup.subtree_control (when D allows)
//!   agentworks-executor/               the caller and its launchers (`own_leaf`)
//!   agentworks-command-<pid>-<n>/      one command (memory.max, pids.max), ended by cgroup.kill
//! ```
//!
//! cgroup v2's "no internal processes" rule: controllers can be enabled for D's children only
//! while D itself holds no process, so the caller first moves itself into the leaf, and the
//! controllers come only when D held nothing else (a scope of its own). Otherwise commands still
//! get their own cgroup and `cgroup.kill`, but no memory limit, and the caller says so.
//!
//! "Delegated" means: not the root cgroup, the directory owned by the caller's user, and its
//! `cgroup.procs` and `cgroup.subtree_control` writable by it, which is what systemd's
//! `Delegate=yes` gives a user's unit or scope. The launcher, a child of the caller, stays in
//! the leaf; it moves only the command (in the forked child, before exec) into the command's
//! cgroup, so `cgroup.kill` never kills the launcher that waits for the command.
//!
//! Must never: write to a cgroup that is not delegated (the root cgroup, a cgroup of another
//! user, one of systemd's own that is not writable); leave a command's cgroup with processes in
//! it; follow a request id into a path (command cgroups are named by the caller's pid and a
//! counter).

use std::io::{self, Write};
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use rustix::fs::{Mode, OFlags};

/// The names a caller uses in its delegated cgroup, and how messages name the caller.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CgroupLayout {
    /// The caller as a person reads it in a message ("the executor").
    pub owner: &'static str,
    /// The caller's own leaf inside the delegated cgroup.
    pub own_leaf: &'static str,
    /// Prefix of a command's cgroup name (then the caller's pid and a counter).
    pub command_prefix: &'static str,
}
/// How long removing a killed command's cgroup may wait for its processes to be gone.
const REMOVE_WAIT: Duration = Duration::from_secs(5);

/// Why cgroups cannot be used (said at connect; commands then run without a memory limit and
/// are ended by the launcher's subreaper alone).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct NoCgroup(pub String);

/// A failed cgroup operation.
#[derive(Debug, thiserror::Error)]
pub enum CgroupError {
    #[error("cannot {what} {path}: {source}")]
    Io {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("the command's cgroup {path} still has processes after cgroup.kill")]
    StillPopulated { path: PathBuf },
}

fn io_error(what: &'static str, path: &Path) -> impl FnOnce(io::Error) -> CgroupError {
    let path = path.to_owned();
    move |source| CgroupError::Io { what, path, source }
}

/// The delegated cgroup the caller runs in, prepared for command cgroups.
#[derive(Debug)]
pub struct CgroupTree {
    /// The delegated cgroup `D`.
    base: PathBuf,
    layout: CgroupLayout,
    /// Whether `memory` is enabled for `D`'s children (so `memory.max` exists in them).
    memory: bool,
    /// Whether `pids` is enabled for `D`'s children (so `pids.max` exists in them).
    pids: bool,
    /// Why the memory controller is not available, when it is not.
    memory_unavailable: Option<String>,
    next: AtomicU64,
}

/// The cgroup v2 path (`0::/…` line) of `/proc/self/cgroup`.
pub fn own_cgroup_path(proc_self_cgroup: &str) -> Option<&str> {
    proc_self_cgroup
        .lines()
        .find_map(|line| line.strip_prefix("0::"))
        .map(str::trim)
}

/// The mount point of the cgroup v2 hierarchy in `/proc/self/mountinfo`, with the root of the
/// mount (`/` unless inside a cgroup namespace bind).
pub fn cgroup2_mount(mountinfo: &str) -> Option<(PathBuf, String)> {
    mountinfo.lines().find_map(|line| {
        let (before, after) = line.split_once(" - ")?;
        if after.split_whitespace().next()? != "cgroup2" {
            return None;
        }
        let mut fields = before.split_whitespace();
        let root = fields.nth(3)?;
        let mount_point = fields.next()?;
        Some((
            PathBuf::from(unescape_mountinfo(mount_point)),
            unescape_mountinfo(root),
        ))
    })
}

/// mountinfo escapes space, tab, newline and backslash as `\ooo`.
fn unescape_mountinfo(field: &str) -> String {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\\'
            && i + 3 < bytes.len()
            && bytes[i + 1..i + 4]
                .iter()
                .all(|b| (b'0'..=b'7').contains(b))
        {
            let value =
                (bytes[i + 1] - b'0') * 64 + (bytes[i + 2] - b'0') * 8 + (bytes[i + 3] - b'0');
            out.push(value);
            i += 4;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn read(path: &Path) -> Result<String, CgroupError> {
    std::fs::read_to_string(path).map_err(io_error("read", path))
}

fn write(path: &Path, value: &str) -> Result<(), CgroupError> {
    std::fs::OpenOptions::new()
        .write(true)
        .open(path)
        .and_then(|mut file| file.write_all(value.as_bytes()))
        .map_err(io_error("write to", path))
}

fn writable(path: &Path) -> bool {
    rustix::fs::access(path, rustix::fs::Access::WRITE_OK).is_ok()
}

impl CgroupTree {
    /// Finds the caller's cgroup, checks that it is delegated, moves the caller (every thread
    /// of this process) into its leaf and enables the memory and pids controllers for command
    /// cgroups where it can. `Err` says, for a person, why commands get no cgroup.
    pub fn delegated(layout: CgroupLayout) -> Result<CgroupTree, NoCgroup> {
        if cfg!(target_os = "macos") {
            return Err(NoCgroup(
                "macOS has no cgroups (the launcher finds and ends the command's processes itself)"
                    .to_owned(),
            ));
        }
        let cgroup = std::fs::read_to_string("/proc/self/cgroup")
            .map_err(|e| NoCgroup(format!("cannot read /proc/self/cgroup: {e}")))?;
        let mountinfo = std::fs::read_to_string("/proc/self/mountinfo")
            .map_err(|e| NoCgroup(format!("cannot read /proc/self/mountinfo: {e}")))?;
        let base = locate(&cgroup, &mountinfo, layout.owner)?;
        check_delegated(&base)?;
        CgroupTree::prepare(base, layout)
    }

    fn prepare(base: PathBuf, layout: CgroupLayout) -> Result<CgroupTree, NoCgroup> {
        let owner = layout.owner;
        let leaf = base.join(layout.own_leaf);
        match std::fs::create_dir(&leaf) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
            Err(e) => {
                return Err(NoCgroup(format!(
                    "cannot create the cgroup of {owner} {}: {e}",
                    leaf.display()
                )));
            }
        }
        // "0" moves the writing process, every thread of it.
        write(&leaf.join("cgroup.procs"), "0")
            .map_err(|e| NoCgroup(format!("cannot move {owner} into its own cgroup: {e}")))?;

        let available = read(&base.join("cgroup.controllers")).unwrap_or_default();
        let available: Vec<&str> = available.split_whitespace().collect();
        let wanted: Vec<&str> = ["memory", "pids"]
            .into_iter()
            .filter(|c| available.contains(c))
            .collect();
        let mut enable_error = None;
        if !wanted.is_empty() {
            let request: Vec<String> = wanted.iter().map(|c| format!("+{c}")).collect();
            if let Err(e) = write(&base.join("cgroup.subtree_control"), &request.join(" ")) {
                enable_error = Some(e.to_string());
            }
        }
        let enabled = read(&base.join("cgroup.subtree_control")).unwrap_or_default();
        let enabled: Vec<&str> = enabled.split_whitespace().collect();
        let memory = enabled.contains(&"memory");
        let pids = enabled.contains(&"pids");
        let memory_unavailable = if memory {
            None
        } else if !available.contains(&"memory") {
            Some(format!(
                "the cgroup {} has no memory controller (its cgroup.controllers: {:?})",
                base.display(),
                available.join(" ")
            ))
        } else {
            Some(format!(
                "the memory controller cannot be enabled in {} ({}); it must hold no process but {owner}: start {owner} in a scope of its own",
                base.display(),
                enable_error.unwrap_or_else(|| "it stayed disabled".to_owned())
            ))
        };
        Ok(CgroupTree {
            base,
            layout,
            memory,
            pids,
            memory_unavailable,
            next: AtomicU64::new(1),
        })
    }

    /// The delegated cgroup.
    pub fn base(&self) -> &Path {
        &self.base
    }

    /// `None` when commands get `memory.max`; otherwise why not.
    pub fn memory_unavailable(&self) -> Option<&str> {
        self.memory_unavailable.as_deref()
    }

    /// Whether commands get `pids.max`.
    pub fn has_pids(&self) -> bool {
        self.pids
    }

    /// A new, empty cgroup for one command, with `memory.max` and `pids.max` where the
    /// controllers are enabled.
    pub fn command(&self, memory_max: u64, pids_max: u64) -> Result<CommandCgroup, CgroupError> {
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        let path = self.base.join(format!(
            "{}{}-{n}",
            self.layout.command_prefix,
            std::process::id()
        ));
        std::fs::create_dir(&path).map_err(io_error("create the command cgroup", &path))?;
        let cgroup = CommandCgroup { path: Some(path) };
        let path = cgroup.path();
        if self.memory {
            write(&path.join("memory.max"), &memory_max.to_string())?;
        }
        if self.pids {
            write(&path.join("pids.max"), &pids_max.to_string())?;
        }
        Ok(cgroup)
    }
}

/// The cgroup v2 directory this process is in.
fn locate(proc_self_cgroup: &str, mountinfo: &str, owner: &str) -> Result<PathBuf, NoCgroup> {
    let Some(own) = own_cgroup_path(proc_self_cgroup) else {
        return Err(NoCgroup(
            "this machine has no cgroup v2 hierarchy (cgroup v1 only)".to_owned(),
        ));
    };
    let Some((mount, root)) = cgroup2_mount(mountinfo) else {
        return Err(NoCgroup(
            "the cgroup v2 hierarchy is not mounted".to_owned(),
        ));
    };
    let relative = if root == "/" {
        own
    } else {
        own.strip_prefix(root.as_str()).unwrap_or(own)
    };
    let relative = relative.trim_start_matches('/');
    if relative.is_empty() {
        return Err(NoCgroup(format!(
            "{owner} runs in the root cgroup, which is never delegated"
        )));
    }
    if relative
        .split('/')
        .any(|c| c == ".." || c == "." || c.is_empty())
    {
        return Err(NoCgroup(format!("unexpected cgroup path {own:?}")));
    }
    Ok(mount.join(relative))
}

fn check_delegated(base: &Path) -> Result<(), NoCgroup> {
    let meta = std::fs::metadata(base)
        .map_err(|e| NoCgroup(format!("cannot stat the cgroup {}: {e}", base.display())))?;
    let euid = rustix::process::geteuid().as_raw();
    if meta.uid() != euid {
        return Err(NoCgroup(format!(
            "the cgroup {} is not delegated to you (it belongs to uid {})",
            base.display(),
            meta.uid()
        )));
    }
    for file in ["cgroup.procs", "cgroup.subtree_control"] {
        if !writable(&base.join(file)) {
            return Err(NoCgroup(format!(
                "the cgroup {} is not delegated to you ({file} is not writable)",
                base.display()
            )));
        }
    }
    if !writable(base) {
        return Err(NoCgroup(format!(
            "the cgroup {} is not delegated to you (cannot create cgroups in it)",
            base.display()
        )));
    }
    Ok(())
}

/// One command's cgroup; killed and removed by [`CommandCgroup::kill_and_remove`] (or, if
/// dropped without it, killed and removed without waiting).
#[derive(Debug)]
pub struct CommandCgroup {
    path: Option<PathBuf>,
}

impl CommandCgroup {
    pub fn path(&self) -> &Path {
        self.path.as_deref().unwrap_or(Path::new(""))
    }

    /// Kills whatever is left in the cgroup (`cgroup.kill`), waits until it is empty and
    /// removes it. Blocking: call from a blocking thread.
    pub fn kill_and_remove(mut self) -> Result<(), CgroupError> {
        let Some(path) = self.path.take() else {
            return Ok(());
        };
        let deadline = Instant::now() + REMOVE_WAIT;
        loop {
            if populated(&path)? {
                write(&path.join("cgroup.kill"), "1")?;
            } else {
                match std::fs::remove_dir(&path) {
                    Ok(()) => return Ok(()),
                    Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
                    // Busy while the last process is being released.
                    Err(e) if e.raw_os_error() == Some(libc::EBUSY) => {}
                    Err(e) => return Err(io_error("remove", &path)(e)),
                }
            }
            if Instant::now() > deadline {
                return Err(CgroupError::StillPopulated { path });
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for CommandCgroup {
    fn drop(&mut self) {
        if let Some(path) = self.path.take() {
            let _ = write(&path.join("cgroup.kill"), "1");
            let _ = std::fs::remove_dir(&path);
        }
    }
}

/// Best effort `cgroup.kill` on the cgroup at `path` (the runner's fallback when the launcher
/// did not end in time; the cgroup's removal reports what this cannot).
pub fn kill_cgroup_at(path: &Path) {
    let _ = write(&path.join("cgroup.kill"), "1");
}

/// Whether `cgroup.events` says processes are still in the cgroup (or its children).
fn populated(path: &Path) -> Result<bool, CgroupError> {
    let events = read(&path.join("cgroup.events"))?;
    Ok(events.lines().any(|line| line.trim() == "populated 1"))
}

/// The launcher's handles on a command's cgroup, opened before the Landlock ruleset (which
/// grants `/sys` read-only) so the launcher can still move the command in and kill it.
#[derive(Debug)]
pub struct CommandCgroupFds {
    procs: OwnedFd,
    kill: OwnedFd,
}

impl CommandCgroupFds {
    /// Opens `cgroup.procs` and `cgroup.kill` of `path` for writing, close-on-exec.
    pub fn open(path: &Path) -> io::Result<CommandCgroupFds> {
        let open = |name: &str| {
            let file = path.join(name);
            rustix::fs::open(
                &file,
                OFlags::WRONLY | OFlags::CLOEXEC | OFlags::NOFOLLOW,
                Mode::empty(),
            )
            .map_err(|e| {
                io::Error::new(
                    io::Error::from(e).kind(),
                    format!("{}: {e}", file.display()),
                )
            })
        };
        Ok(CommandCgroupFds {
            procs: open("cgroup.procs")?,
            kill: open("cgroup.kill")?,
        })
    }

    /// Duplicates both descriptors (close-on-exec), for the forked child.
    pub fn try_clone(&self) -> io::Result<CommandCgroupFds> {
        Ok(CommandCgroupFds {
            procs: self.procs.try_clone()?,
            kill: self.kill.try_clone()?,
        })
    }

    /// Moves the calling process into the command's cgroup. Async-signal-safe (one write(2)):
    /// called in the forked child before exec.
    pub fn join_self(&self) -> io::Result<()> {
        write_fd(&self.procs, b"0")
    }

    /// Kills every process in the command's cgroup at once; processes forking meanwhile are
    /// killed too (the kernel handles that race).
    pub fn kill_all(&self) -> io::Result<()> {
        write_fd(&self.kill, b"1")
    }
}

fn write_fd(fd: &OwnedFd, bytes: &[u8]) -> io::Result<()> {
    // SAFETY: write(2) on a descriptor we own, from a valid buffer of the given length; it
    // allocates nothing and is async-signal-safe.
    let written = unsafe { libc::write(fd.as_raw_fd(), bytes.as_ptr().cast(), bytes.len()) };
    if written < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const OWNER: &str = "the executor";

    const MOUNTINFO: &str = "\
24 30 0:22 / /sys rw,nosuid,nodev,noexec,relatime shared:7 - sysfs sysfs rw
35 24 0:30 / /sys/fs/cgroup/unified rw,nosuid,nodev,noexec,relatime shared:10 - cgroup2 cgroup2 rw,nsdelegate
";

    #[test]
    fn finds_the_cgroup_v2_directory() {
        let cgroup = "4:memory:/x\n0::/user.slice/user-1000.slice/user@1000.service/app.slice/run-r1.scope\n";
        assert_eq!(
            locate(cgroup, MOUNTINFO, OWNER).expect("path"),
            PathBuf::from(
                "/sys/fs/cgroup/unified/user.slice/user-1000.slice/user@1000.service/app.slice/run-r1.scope"
            )
        );
        assert!(
            locate("0::/\n", MOUNTINFO, OWNER)
                .expect_err("root")
                .0
                .contains("root cgroup")
        );
        assert!(
            locate("4:memory:/x\n", MOUNTINFO, OWNER)
                .expect_err("v1")
                .0
                .contains("v1")
        );
        assert!(
            locate("0::/a\n", "", OWNER)
                .expect_err("unmounted")
                .0
                .contains("not mounted")
        );
        assert!(locate("0::/a/../b\n", MOUNTINFO, OWNER).is_err());
    }

    #[test]
    fn mountinfo_escapes_are_decoded() {
        let info = "35 24 0:30 / /mnt/with\\040space rw - cgroup2 cgroup2 rw\n";
        assert_eq!(
            cgroup2_mount(info),
            Some((PathBuf::from("/mnt/with space"), "/".to_owned()))
        );
    }
}
