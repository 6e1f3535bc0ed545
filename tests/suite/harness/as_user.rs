//! Processes of the tests' unprivileged users: a command started as `uid:gid` (first moved,
//! as root, into a cgroup, and made a terminal's session leader if asked), a cgroup v2
//! directory delegated to a user the way systemd's `Delegate=yes` does it, the tasks a user
//! runs (what `RLIMIT_NPROC` counts), and a tree handed to a user.

use std::ffi::CString;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// A name no other test of this run uses.
fn unique(prefix: &str) -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    format!("{prefix}-{}-{n}", std::process::id())
}

/// Hands `path` and everything under it to `uid:gid`.
pub fn chown_tree(path: &Path, uid: u32, gid: u32) {
    let status = Command::new("chown")
        .arg("-R")
        .arg(format!("{uid}:{gid}"))
        .arg(path)
        .status()
        .unwrap();
    assert!(status.success());
}

/// How a laptop process is started: as `uid:gid`, optionally first moved (as root) into a
/// cgroup and made the session leader of a terminal.
#[derive(Clone, Default)]
pub struct Start {
    pub cgroup: Option<PathBuf>,
    pub terminal: bool,
}

/// `command` as `uid:gid` (supplementary groups cleared), after `start`'s steps.
pub fn as_user(command: &mut Command, uid: u32, gid: u32, start: Start) {
    let procs = start
        .cgroup
        .map(|c| CString::new(c.join("cgroup.procs").to_str().unwrap()).unwrap());
    let terminal = start.terminal;
    // SAFETY: the closure runs in the forked child before exec and makes only async-signal-safe
    // system calls (open, write, close, setgroups, setgid, setuid, setsid, ioctl) on values
    // prepared before the fork; it allocates nothing.
    unsafe {
        command.pre_exec(move || {
            if let Some(procs) = &procs {
                let fd = libc::open(procs.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
                if fd < 0 || libc::write(fd, b"0".as_ptr().cast(), 1) != 1 {
                    return Err(std::io::Error::last_os_error());
                }
                libc::close(fd);
            }
            if libc::setgroups(0, std::ptr::null()) != 0
                || libc::setgid(gid) != 0
                || libc::setuid(uid) != 0
            {
                return Err(std::io::Error::last_os_error());
            }
            if terminal && (libc::setsid() < 0 || libc::ioctl(0, libc::TIOCSCTTY, 0) != 0) {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

/// A cgroup v2 directory delegated to `uid:gid` the way systemd's `Delegate=yes` does it (the
/// directory and its cgroup.procs, cgroup.threads and cgroup.subtree_control chowned); removed
/// on drop (with whatever the executor made in it).
pub struct DelegatedCgroup {
    pub path: PathBuf,
}

impl DelegatedCgroup {
    pub fn new(uid: u32, gid: u32) -> DelegatedCgroup {
        let root = cgroup2_root();
        let path = root.join(unique("awtest-delegated"));
        std::fs::create_dir(&path).unwrap_or_else(|e| {
            panic!(
                "cannot create a cgroup under {} ({e}): this test needs a writable cgroup v2 hierarchy",
                root.display()
            )
        });
        for entry in [
            "",
            "cgroup.procs",
            "cgroup.threads",
            "cgroup.subtree_control",
        ] {
            nix::unistd::chown(
                &path.join(entry),
                Some(nix::unistd::Uid::from_raw(uid)),
                Some(nix::unistd::Gid::from_raw(gid)),
            )
            .unwrap();
        }
        DelegatedCgroup { path }
    }

    pub fn controllers(&self) -> String {
        std::fs::read_to_string(self.path.join("cgroup.controllers")).unwrap_or_default()
    }
}

impl Drop for DelegatedCgroup {
    fn drop(&mut self) {
        // Children first; each must be empty by now (the executor was killed before).
        if let Ok(entries) = std::fs::read_dir(&self.path) {
            for entry in entries.flatten() {
                if entry.file_type().map(|t| t.is_dir()).unwrap_or(false) {
                    let _ = std::fs::write(entry.path().join("cgroup.kill"), "1");
                    for _ in 0..200 {
                        if std::fs::remove_dir(entry.path()).is_ok() {
                            break;
                        }
                        std::thread::sleep(Duration::from_millis(10));
                    }
                }
            }
        }
        let _ = std::fs::remove_dir(&self.path);
    }
}

/// Where the cgroup v2 hierarchy is mounted (`/sys/fs/cgroup` or, on a hybrid machine,
/// `/sys/fs/cgroup/unified`).
pub fn cgroup2_root() -> PathBuf {
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    agentworks_sandbox::cgroup::cgroup2_mount(&mountinfo)
        .expect("this test needs a cgroup v2 hierarchy (cgroup2 is not mounted)")
        .0
}

/// Tasks (threads) of real uid `uid` now, from `/proc/<pid>/status` (`Uid:` real id,
/// `Threads:`), which is what RLIMIT_NPROC counts.
pub fn tasks_of(uid: u32) -> u64 {
    let mut count = 0;
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(status) = std::fs::read_to_string(entry.path().join("status")) else {
            continue;
        };
        let field = |key: &str| {
            status
                .lines()
                .find_map(|l| l.strip_prefix(key))
                .and_then(|rest| rest.split_whitespace().next())
                .and_then(|v| v.parse::<u64>().ok())
        };
        if field("Uid:") == Some(u64::from(uid)) {
            count += field("Threads:").unwrap_or(1);
        }
    }
    count
}
