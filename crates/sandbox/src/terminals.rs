//! Terminals private to one command: a new devpts instance mounted on `/dev/pts` in the
//! launcher's own user and mount namespace, its `ptmx` bound over `/dev/ptmx`, so that the PTYs
//! a command makes (`openpty`, `script`, Codex's `exec_command {tty: true}`) are the only ones
//! it can see or open.
//!
//! Why: every coding CLI runs as the same user, so granting the machine's `/dev/ptmx` and
//! `/dev/pts` would let one chat's command open another's `/dev/pts/N` and type into it
//! (`write`, or `TIOCSTI` where the terminal is the reader's). A devpts mounted in a user
//! namespace is always a new instance (`newinstance`): its `/dev/pts` lists only the PTYs made
//! through its own `ptmx`, and the other instances' devices are other inodes, which the Landlock
//! rules (granted on this instance's root and `ptmx` only, by `plan.rs`) never cover, whatever
//! path reaches them (`/proc/<pid>/fd/N` of another process included).
//!
//! The instance: `ptmxmode=0666` (its `ptmx` opens for the command), `mode=0620` (a new PTY's
//! slave: its owner's, writable by its group), no `gid=` (the tty group is not mapped in the
//! namespace, and the kernel refuses an unmapped one: a slave gets its maker's group), at most
//! [`MAX_PTYS`] PTYs (the machine's `kernel.pty.max` is shared by every instance), `nosuid` and
//! `noexec`, never `nodev`.
//!
//! Owns: making the instance and checking that `/dev/ptmx` and `/dev/pts` now show it.
//! Must never: run outside the launcher's own mount namespace (the caller enters it first), or
//! report terminals as private when a path still shows the machine's devpts.

use std::io;
use std::os::fd::{AsFd, BorrowedFd};

use rustix::fs::{FileType, Mode, OFlags};
use rustix::mount::{FsMountFlags, FsOpenFlags, MountAttrFlags, MoveMountFlags, OpenTreeFlags};

/// The most PTYs a command may hold at once (Codex keeps one per running `tty: true` command).
pub(crate) const MAX_PTYS: u32 = 128;

/// Why the private terminals could not be made (the command then gets no terminal at all).
#[derive(Debug, thiserror::Error)]
#[error("{what} failed: {source}")]
pub struct TerminalError {
    what: &'static str,
    #[source]
    source: io::Error,
}

fn step(what: &'static str) -> impl FnOnce(rustix::io::Errno) -> TerminalError {
    move |e| TerminalError {
        what,
        source: e.into(),
    }
}

fn not_private(why: &str) -> TerminalError {
    TerminalError {
        what: "checking the private terminals",
        source: io::Error::other(why.to_owned()),
    }
}

/// Mounts a new devpts instance on `/dev/pts` and binds its `ptmx` over `/dev/ptmx` (unless
/// `/dev/ptmx` is a symlink, which then resolves into the new instance), then checks both
/// paths show it. The launcher must be in its own user and mount namespace, with `/` private.
pub(crate) fn make_private() -> Result<(), TerminalError> {
    let fs = rustix::mount::fsopen("devpts", FsOpenFlags::FSOPEN_CLOEXEC)
        .map_err(step("fsopen(devpts)"))?;
    // Implied in a user namespace; said anyway, so the intent does not rest on that.
    rustix::mount::fsconfig_set_flag(fs.as_fd(), "newinstance")
        .map_err(step("fsconfig(newinstance)"))?;
    for (key, value) in [
        ("ptmxmode", "0666".to_owned()),
        ("mode", "0620".to_owned()),
        ("max", MAX_PTYS.to_string()),
    ] {
        rustix::mount::fsconfig_set_string(fs.as_fd(), key, value.as_str())
            .map_err(step("fsconfig(devpts options)"))?;
    }
    rustix::mount::fsconfig_create(fs.as_fd()).map_err(step("fsconfig(create)"))?;
    let instance = rustix::mount::fsmount(
        fs.as_fd(),
        FsMountFlags::FSMOUNT_CLOEXEC,
        MountAttrFlags::MOUNT_ATTR_NOSUID | MountAttrFlags::MOUNT_ATTR_NOEXEC,
    )
    .map_err(step("fsmount(devpts)"))?;
    let device = rustix::fs::fstat(&instance)
        .map_err(step("fstat(devpts)"))?
        .st_dev;

    let pts = rustix::fs::open(
        "/dev/pts",
        OFlags::PATH | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(step("opening /dev/pts"))?;
    attach(instance.as_fd(), pts.as_fd())?;

    let ptmx = rustix::fs::open(
        "/dev/ptmx",
        OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(step("opening /dev/ptmx"))?;
    let ptmx_kind =
        FileType::from_raw_mode(rustix::fs::fstat(&ptmx).map_err(step("fstat"))?.st_mode);
    if ptmx_kind != FileType::Symlink {
        // The instance is attached now (in this namespace), so its ptmx can be cloned.
        let own_ptmx = rustix::mount::open_tree(
            instance.as_fd(),
            "ptmx",
            OpenTreeFlags::OPEN_TREE_CLONE | OpenTreeFlags::OPEN_TREE_CLOEXEC,
        )
        .map_err(step("open_tree(ptmx)"))?;
        attach(own_ptmx.as_fd(), ptmx.as_fd())?;
    }

    // A fresh lookup of each path, symlinks followed as a command's open would.
    for path in ["/dev/pts", "/dev/ptmx"] {
        let stat = rustix::fs::stat(path).map_err(step("stat after mounting"))?;
        if stat.st_dev != device {
            return Err(not_private(&format!(
                "{path} does not show the new devpts instance"
            )));
        }
    }
    let ptmx = rustix::fs::stat("/dev/ptmx").map_err(step("stat(/dev/ptmx)"))?;
    if FileType::from_raw_mode(ptmx.st_mode) != FileType::CharacterDevice {
        return Err(not_private("/dev/ptmx is not the instance's ptmx device"));
    }
    Ok(())
}

/// Moves the detached mount `tree` onto `target`.
fn attach(tree: BorrowedFd<'_>, target: BorrowedFd<'_>) -> Result<(), TerminalError> {
    rustix::mount::move_mount(
        tree,
        "",
        target,
        "",
        MoveMountFlags::MOVE_MOUNT_F_EMPTY_PATH | MoveMountFlags::MOVE_MOUNT_T_EMPTY_PATH,
    )
    .map_err(step("move_mount"))
}
