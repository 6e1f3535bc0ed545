//! Exclusions inside a writable folder enforced by mounts, in a user and mount namespace of the
//! command's own, so that Landlock can grant the folder whole.
//!
//! Why: Landlock only grants, and a rule on a directory covers everything beneath it, so the
//! rule walk (`plan.rs`) carves an exclusion out by granting the other entries one by one, and
//! every directory on the path to it loses file creation (with `--block proj/.env`, `touch
//! proj/new` was refused, and so was every build that makes `target/` or `node_modules/`). Here
//! the launcher makes a user namespace (mapping only its own uid and gid) and a mount namespace,
//! and covers each exclusion that exists:
//!
//! - a blocked file by `/dev/null`, bound read-only and `nodev` (opening it fails with `EACCES`;
//!   it reads nothing and takes nothing);
//! - a blocked directory by an empty read-only tmpfs whose root has mode 000 (listing it fails);
//! - a `--read-only` path (or a read-only folder nested in a writable one) by a read-only bind of
//!   itself, recursive;
//! - and every directory between the folder and an exclusion by a bind of itself: a mount point
//!   cannot be renamed or removed (`EBUSY`), so a command cannot move a blocked file away from
//!   under its cover, or rename its parent and plant a new file at its path.
//!
//! Each target is opened beneath the folder with `openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS)`
//! and the mount is made on that descriptor, never on a path looked up again. A path can also be
//! reachable through another mount of the same filesystem (a bind mount of a parent elsewhere,
//! btrfs's top level mounted for backups): `/proc/self/mountinfo` is read and the same cover is
//! put on every such view, checked to be the same inode. Mounts made in this namespace never
//! propagate out (`/` is made private first, and a namespace owned by a less privileged user
//! namespace only receives propagation); they vanish with the namespace, when the command's last
//! process is gone, so nothing is left in the person's folder.
//!
//! What cannot be covered stays with the walk: an exclusion that does not exist (a mount needs a
//! mount point, and making one would leave a file in the person's folder), one that is a symlink
//! or a special file, and one the kernel refuses to cover. Each cover is checked after it is made;
//! one that is not in place goes to the walk as well.
//!
//! The command cannot undo a cover: Landlock refuses every mount operation to a sandboxed
//! process, the shell gets no capability (`privileges::drop_capabilities`), and a seccomp filter
//! refuses the namespace and mount system calls (`seccomp::namespace_filter`).
//!
//! The launcher first enters the namespace in a forked child (`trial_in_child`): a process
//! cannot leave a user namespace, and one where `unshare` works but writing the id maps does not
//! (uid 0 without `CAP_SETFCAP`) would leave it there as nobody; with the trial such a launcher
//! stays as it was and uses the walk.
//!
//! Where the kernel refuses the namespace (Ubuntu's `apparmor_restrict_unprivileged_userns`,
//! most containers), the caller's probe ([`probe`], the laptop's at connect) finds out, the policy asks for no
//! cover, and connect prints which directories lose file creation and why.
//!
//! The same namespace holds the command's private terminals when the policy asks for them
//! ([`SandboxPolicy::private_terminals`], `terminals.rs`): entered for them alone if there is
//! nothing to cover. Where it cannot be entered, the command gets no terminal at all.
//!
//! Owns: entering the namespaces, the covers and their checks, the probe.
//! Must never: mount anything outside the launcher's own mount namespace, follow a symlink to a
//! target, or report an exclusion as covered whose cover is not in place.

use std::ffi::{OsStr, OsString};
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStringExt;
use std::path::{Path, PathBuf};

use rustix::fs::{FileType, Mode, OFlags};
use rustix::mount::{
    FsMountFlags, FsOpenFlags, MountAttrFlags, MountPropagationFlags, MoveMountFlags, OpenTreeFlags,
};

use crate::{PinnedAccess, SandboxPolicy, TEST_NO_USERNS_ENV, terminals};

/// How an exclusion is covered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Cover {
    /// `--block`: nothing readable, writable or listable.
    Hide,
    /// `--read-only`, and read-only folders nested in a writable one: a read-only view.
    ReadOnly,
}

/// What the launcher could do: the exclusions now covered by a mount (canonical paths, as the
/// policy gives them), which the rule walk leaves alone, and the command's terminals.
#[derive(Debug, Default)]
pub(crate) struct Covered {
    pub(crate) paths: Vec<PathBuf>,
    /// Whether the launcher is in namespaces of its own now (the shell then gets the seccomp
    /// filter that keeps it from making or entering others).
    pub(crate) in_namespace: bool,
    pub(crate) terminals: Terminals,
}

/// Whether the command gets terminals of its own ([`SandboxPolicy::private_terminals`]).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) enum Terminals {
    /// The policy did not ask: no terminal device is granted.
    #[default]
    NotAsked,
    /// A devpts instance of its own is on `/dev/pts` and `/dev/ptmx` (`terminals.rs`): the
    /// plan grants them.
    Private,
    /// Asked for, but not made (why): no terminal device is granted either.
    Refused(String),
}

/// Why the namespace or a cover could not be made.
#[derive(Debug, thiserror::Error)]
pub enum OvermountError {
    #[error("{what} failed: {source}")]
    Step {
        what: &'static str,
        #[source]
        source: io::Error,
    },
}

fn step(what: &'static str) -> impl FnOnce(rustix::io::Errno) -> OvermountError {
    move |e| OvermountError::Step {
        what,
        source: e.into(),
    }
}

/// One exclusion inside a writable root.
#[derive(Debug, Clone)]
struct Target {
    /// The exclusion as the policy gives it (canonical).
    path: PathBuf,
    /// Beneath the root.
    relative: PathBuf,
    cover: Cover,
}

/// A writable root and the exclusions inside it.
#[derive(Debug)]
struct Root {
    path: PathBuf,
    /// Device and inode the caller pinned (for a pinned root): the path must still name it.
    pinned: Option<(u64, u64)>,
    targets: Vec<Target>,
}

/// The writable roots of `policy` with the exclusions strictly inside them, each root's targets
/// outermost first. Exclusions elsewhere (the CLI's own dirs, the toolchains' credentials,
/// exclusions in read-only folders) are the walk's.
fn roots_and_targets(policy: &SandboxPolicy) -> Vec<Root> {
    let mut roots: Vec<Root> = policy
        .pinned
        .iter()
        .filter(|p| p.access == PinnedAccess::ReadWrite)
        .map(|p| Root {
            path: p.path.clone(),
            pinned: Some((p.dev, p.ino)),
            targets: Vec::new(),
        })
        .chain(policy.read_write.iter().map(|p| Root {
            path: p.clone(),
            pinned: None,
            targets: Vec::new(),
        }))
        .collect();
    let exclusions = policy
        .blocked
        .iter()
        .map(|p| (p, Cover::Hide))
        .chain(policy.read_only_within.iter().map(|p| (p, Cover::ReadOnly)));
    for (path, cover) in exclusions {
        // The deepest root holding it (a writable root may lie in another, Downloads).
        let Some(root) = roots
            .iter_mut()
            .filter(|r| path != &r.path && path.starts_with(&r.path))
            .max_by_key(|r| r.path.components().count())
        else {
            continue;
        };
        let Ok(relative) = path.strip_prefix(&root.path) else {
            continue;
        };
        root.targets.push(Target {
            path: path.clone(),
            relative: relative.to_owned(),
            cover,
        });
    }
    for root in &mut roots {
        root.targets
            .sort_by_key(|t| (t.relative.components().count(), t.cover == Cover::ReadOnly));
    }
    roots.retain(|r| !r.targets.is_empty());
    roots
}

/// Whether `policy` asks for what only the namespace gives: private terminals, or an
/// exclusion a cover would serve (one inside a writable root).
pub(crate) fn wanted(policy: &SandboxPolicy) -> bool {
    policy.private_terminals
        || (policy.overmount_exclusions && !roots_and_targets(policy).is_empty())
}

/// Makes the user and mount namespace, mounts the command's private terminals when the policy
/// asks for them (`terminals.rs`), and covers every exclusion of `policy` inside a writable
/// root that it can. `Ok` with nothing covered and no terminal when the kernel refuses the
/// namespace (the walk then does everything, as without namespaces); an error only when the
/// process is left in a namespace it cannot use (its ids could not be mapped), and the command
/// must be refused.
pub(crate) fn cover(policy: &SandboxPolicy) -> Result<Covered, OvermountError> {
    let roots = if policy.overmount_exclusions {
        roots_and_targets(policy)
    } else {
        Vec::new()
    };
    if roots.is_empty() && !policy.private_terminals {
        return Ok(Covered::default());
    }
    // Until they are made, the terminals asked for are refused (fail closed).
    let refused = |why: String| {
        if policy.private_terminals {
            Terminals::Refused(why)
        } else {
            Terminals::NotAsked
        }
    };
    if cfg!(debug_assertions) && std::env::var(TEST_NO_USERNS_ENV).is_ok_and(|v| v == "1") {
        return Ok(Covered {
            terminals: refused(format!(
                "{TEST_NO_USERNS_ENV}=1 simulates a machine that refuses user namespaces"
            )),
            ..Covered::default()
        });
    }
    // Tried in a child first: one that cannot map its ids leaves this process as it was, and
    // the walk (with no terminal) takes over, instead of a refusal.
    if let Err(e) = trial_in_child() {
        return Ok(Covered {
            terminals: refused(explain(e)),
            ..Covered::default()
        });
    }
    match enter_namespaces()? {
        Entered::Refused(e) => {
            return Ok(Covered {
                terminals: refused(explain(e)),
                ..Covered::default()
            });
        }
        Entered::Yes => {}
    }
    let mut covered = Covered {
        paths: Vec::new(),
        in_namespace: true,
        terminals: Terminals::NotAsked,
    };
    // Any failure from here on leaves the rest to the walk, which is complete by itself; the
    // mounts already made only take access away.
    if let Err(e) = rustix::mount::mount_change(
        "/",
        MountPropagationFlags::PRIVATE | MountPropagationFlags::REC,
    ) {
        covered.terminals = refused(explain(step("making / private")(e)));
        return Ok(covered);
    }
    if policy.private_terminals {
        covered.terminals = match terminals::make_private() {
            Ok(()) => Terminals::Private,
            Err(e) => Terminals::Refused(e.to_string()),
        };
    }
    if roots.is_empty() {
        return Ok(covered);
    }
    let views = Views::read();
    for root in &roots {
        let Ok(root_fd) = open_root(root) else {
            continue;
        };
        let mut done: Vec<(PathBuf, Cover)> = Vec::new();
        for target in &root.targets {
            // Inside a hidden directory there is nothing left to reach; inside a read-only view
            // a read-only exclusion is served already.
            if let Some((_, outer)) = done
                .iter()
                .find(|(p, _)| target.relative.starts_with(p) && target.relative != *p)
                && (*outer == Cover::Hide || target.cover == Cover::ReadOnly)
            {
                covered.paths.push(target.path.clone());
                continue;
            }
            if cover_target(root_fd.as_fd(), root, target, &done, &views).is_ok() {
                covered.paths.push(target.path.clone());
                done.push((target.relative.clone(), target.cover));
            }
        }
    }
    Ok(covered)
}

/// The outcome of trying to enter the namespaces.
enum Entered {
    Yes,
    /// `unshare` refused: nothing changed.
    Refused(OvermountError),
}

/// `unshare(CLONE_NEWUSER | CLONE_NEWNS)`, then this process's uid and gid mapped to themselves
/// (one id each: what an unprivileged process may map; `setgroups` denied, as the kernel
/// requires for that). Inside, the process holds every capability of the new user namespace and
/// none outside it.
fn enter_namespaces() -> Result<Entered, OvermountError> {
    let uid = rustix::process::getuid().as_raw();
    let gid = rustix::process::getgid().as_raw();
    if let Err(e) = nix::sched::unshare(
        nix::sched::CloneFlags::CLONE_NEWUSER | nix::sched::CloneFlags::CLONE_NEWNS,
    ) {
        return Ok(Entered::Refused(OvermountError::Step {
            what: "unshare(CLONE_NEWUSER | CLONE_NEWNS)",
            source: e.into(),
        }));
    }
    write_proc("/proc/self/setgroups", b"deny").map_err(step("writing /proc/self/setgroups"))?;
    write_proc("/proc/self/uid_map", format!("{uid} {uid} 1").as_bytes())
        .map_err(step("writing /proc/self/uid_map"))?;
    write_proc("/proc/self/gid_map", format!("{gid} {gid} 1").as_bytes())
        .map_err(step("writing /proc/self/gid_map"))?;
    Ok(Entered::Yes)
}

/// [`enter_namespaces`] in a forked child, which then exits: `Err` (the child's error) when it
/// would fail. Why: `unshare` can succeed where writing the maps then fails (uid 0 without
/// `CAP_SETFCAP` may not map itself since Linux 5.12: runnerd run as root without
/// capabilities), and a process cannot leave the user namespace it entered, where it is
/// nobody. Only while the process is single-threaded (the launcher, before it forks the shell).
fn trial_in_child() -> Result<(), OvermountError> {
    let failed = |what: &'static str| {
        move |e: nix::errno::Errno| OvermountError::Step {
            what,
            source: e.into(),
        }
    };
    let (reader, writer) =
        nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(failed("pipe2"))?;
    // SAFETY: the launcher is single-threaded here, so the child is a copy of the only thread
    // and no lock is held by a thread that vanished; it allocates (the error text), writes to
    // its pipe and ends with _exit, running nothing of the parent's (no destructor, no atexit).
    match unsafe { nix::unistd::fork() }.map_err(failed("fork (namespace trial)"))? {
        nix::unistd::ForkResult::Child => {
            drop(reader);
            let code = match enter_namespaces() {
                Ok(Entered::Yes) => 0,
                Ok(Entered::Refused(e)) | Err(e) => {
                    let _ = rustix::io::write(&writer, e.to_string().as_bytes());
                    1
                }
            };
            // SAFETY: ends the child at once, without running anything of the parent's.
            unsafe { libc::_exit(code) }
        }
        nix::unistd::ForkResult::Parent { child } => {
            drop(writer);
            let mut why = Vec::new();
            let mut buf = [0u8; 512];
            loop {
                match rustix::io::read(&reader, &mut buf) {
                    Ok(0) => break,
                    Ok(n) => why.extend_from_slice(&buf[..n]),
                    Err(rustix::io::Errno::INTR) => continue,
                    Err(_) => break,
                }
            }
            let status = loop {
                match nix::sys::wait::waitpid(child, None) {
                    Err(nix::errno::Errno::EINTR) => continue,
                    other => break other.map_err(failed("waitpid (namespace trial)"))?,
                }
            };
            if status == nix::sys::wait::WaitStatus::Exited(child, 0) {
                return Ok(());
            }
            Err(OvermountError::Step {
                what: "entering a user and mount namespace (tried in a child)",
                source: io::Error::other(if why.is_empty() {
                    format!("{status:?}")
                } else {
                    String::from_utf8_lossy(&why).into_owned()
                }),
            })
        }
    }
}

fn write_proc(path: &str, contents: &[u8]) -> Result<(), rustix::io::Errno> {
    let fd = rustix::fs::open(path, OFlags::WRONLY | OFlags::CLOEXEC, Mode::empty())?;
    let written = rustix::io::write(&fd, contents)?;
    if written != contents.len() {
        return Err(rustix::io::Errno::IO);
    }
    Ok(())
}

/// The root, opened by its path in this namespace (the pinned descriptor belongs to the
/// caller's, where these mounts are not seen), and checked to be the directory pinned.
fn open_root(root: &Root) -> Result<OwnedFd, rustix::io::Errno> {
    let fd = rustix::fs::open(
        &root.path,
        OFlags::PATH | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )?;
    if let Some(pinned) = root.pinned
        && dev_ino(fd.as_fd())? != pinned
    {
        return Err(rustix::io::Errno::STALE);
    }
    Ok(fd)
}

// st_dev and st_ino are unsigned on Linux; the casts only widen.
#[allow(clippy::unnecessary_cast)]
fn dev_ino(fd: BorrowedFd<'_>) -> Result<(u64, u64), rustix::io::Errno> {
    let stat = rustix::fs::fstat(fd)?;
    Ok((stat.st_dev as u64, stat.st_ino as u64))
}

/// `relative` beneath `root`, as an `O_PATH` descriptor, no symlink followed anywhere.
fn open_beneath(root: BorrowedFd<'_>, relative: &Path) -> Result<OwnedFd, rustix::io::Errno> {
    let Some(text) = relative.to_str() else {
        return Err(rustix::io::Errno::INVAL);
    };
    agentworks_fs::confine::open_beneath(root, text, OFlags::PATH | OFlags::NOFOLLOW, Mode::empty())
}

/// Covers one target: its ancestors below the root pinned by binds of themselves (unless a
/// cover already made is one of them), then the target itself, then its other views. `Err`
/// when it is missing, not a file or directory, or the cover could not be made and checked.
fn cover_target(
    root: BorrowedFd<'_>,
    root_info: &Root,
    target: &Target,
    done: &[(PathBuf, Cover)],
    views: &Views,
) -> Result<(), OvermountError> {
    let fd = open_beneath(root, &target.relative).map_err(step("opening the exclusion"))?;
    let kind = FileType::from_raw_mode(rustix::fs::fstat(&fd).map_err(step("fstat"))?.st_mode);
    if !matches!(kind, FileType::RegularFile | FileType::Directory) {
        return Err(OvermountError::Step {
            what: "covering the exclusion",
            source: io::Error::other("neither a file nor a directory"),
        });
    }
    let identity = dev_ino(fd.as_fd()).map_err(step("fstat"))?;
    drop(fd);
    let mut ancestor = PathBuf::new();
    let parents: Vec<OsString> = target
        .relative
        .parent()
        .map(|p| p.iter().map(OsStr::to_owned).collect())
        .unwrap_or_default();
    for name in parents {
        ancestor.push(name);
        if done.iter().any(|(p, _)| *p == ancestor) {
            continue;
        }
        let dir = open_beneath(root, &ancestor).map_err(step("opening a folder above it"))?;
        if !is_mount_root(dir.as_fd()) {
            bind_in_place(dir.as_fd(), false)?;
        }
    }
    // Opened again: the binds above are on the path now.
    let fd = open_beneath(root, &target.relative).map_err(step("opening the exclusion"))?;
    if dev_ino(fd.as_fd()).map_err(step("fstat"))? != identity {
        return Err(OvermountError::Step {
            what: "covering the exclusion",
            source: io::Error::other("it was replaced while it was being covered"),
        });
    }
    put_cover(fd.as_fd(), kind, target.cover)?;
    check_cover(root, &target.relative, kind, target.cover)?;
    let primary = root_info.path.join(&target.relative);
    for view in views.others(&primary) {
        let Ok(fd) = rustix::fs::open(
            &view,
            OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        ) else {
            // Not reachable by that path (shadowed, or not searchable by this user).
            continue;
        };
        if dev_ino(fd.as_fd()).ok() != Some(identity) {
            continue;
        }
        put_cover(fd.as_fd(), kind, target.cover)?;
    }
    Ok(())
}

/// Whether `dir` is the root of a mount (a cover, or a bind, made already).
fn is_mount_root(dir: BorrowedFd<'_>) -> bool {
    rustix::fs::statx(
        dir,
        "",
        rustix::fs::AtFlags::EMPTY_PATH,
        rustix::fs::StatxFlags::MNT_ID,
    )
    .is_ok_and(|s| {
        s.stx_attributes
            .contains(rustix::fs::StatxAttributes::MOUNT_ROOT)
    })
}

/// A bind of `dir` onto itself (read-only when `read_only`, recursive so that mounts beneath it
/// stay visible).
fn bind_in_place(dir: BorrowedFd<'_>, read_only: bool) -> Result<(), OvermountError> {
    let tree = rustix::mount::open_tree(
        dir,
        "",
        OpenTreeFlags::OPEN_TREE_CLONE
            | OpenTreeFlags::OPEN_TREE_CLOEXEC
            | OpenTreeFlags::AT_EMPTY_PATH
            | OpenTreeFlags::AT_RECURSIVE,
    )
    .map_err(step("open_tree (a bind)"))?;
    if read_only {
        set_attributes(tree.as_fd(), libc::MOUNT_ATTR_RDONLY)?;
    }
    attach(tree.as_fd(), dir)
}

/// Moves the detached mount `tree` onto `target`.
fn attach(tree: BorrowedFd<'_>, target: BorrowedFd<'_>) -> Result<(), OvermountError> {
    rustix::mount::move_mount(
        tree,
        "",
        target,
        "",
        MoveMountFlags::MOVE_MOUNT_F_EMPTY_PATH | MoveMountFlags::MOVE_MOUNT_T_EMPTY_PATH,
    )
    .map_err(step("move_mount"))
}

/// `mount_setattr(tree, "", AT_EMPTY_PATH | AT_RECURSIVE)` setting `attributes` (rustix has no
/// wrapper for it).
fn set_attributes(tree: BorrowedFd<'_>, attributes: u64) -> Result<(), OvermountError> {
    let attr = libc::mount_attr {
        attr_set: attributes,
        attr_clr: 0,
        propagation: 0,
        userns_fd: 0,
    };
    let empty = c"";
    // SAFETY: mount_setattr reads `size_of::<mount_attr>()` bytes from `attr`, a live local of
    // exactly that size, and the NUL-terminated empty path; it keeps no pointer. The descriptor
    // is borrowed for the call.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_mount_setattr,
            std::os::fd::AsRawFd::as_raw_fd(&tree),
            empty.as_ptr(),
            libc::AT_EMPTY_PATH | libc::AT_RECURSIVE,
            &raw const attr,
            std::mem::size_of::<libc::mount_attr>(),
        )
    };
    if rc != 0 {
        return Err(OvermountError::Step {
            what: "mount_setattr",
            source: io::Error::last_os_error(),
        });
    }
    Ok(())
}

/// Puts the cover on `target` (a file or directory, as `kind` says).
fn put_cover(target: BorrowedFd<'_>, kind: FileType, cover: Cover) -> Result<(), OvermountError> {
    match (cover, kind) {
        (Cover::ReadOnly, _) => bind_in_place(target, true),
        (Cover::Hide, FileType::Directory) => {
            let fs = rustix::mount::fsopen("tmpfs", FsOpenFlags::FSOPEN_CLOEXEC)
                .map_err(step("fsopen(tmpfs)"))?;
            rustix::mount::fsconfig_set_string(fs.as_fd(), "mode", "000")
                .map_err(step("fsconfig(mode)"))?;
            rustix::mount::fsconfig_set_string(fs.as_fd(), "size", "4k")
                .map_err(step("fsconfig(size)"))?;
            rustix::mount::fsconfig_create(fs.as_fd()).map_err(step("fsconfig(create)"))?;
            let mount = rustix::mount::fsmount(
                fs.as_fd(),
                FsMountFlags::FSMOUNT_CLOEXEC,
                MountAttrFlags::MOUNT_ATTR_RDONLY
                    | MountAttrFlags::MOUNT_ATTR_NOSUID
                    | MountAttrFlags::MOUNT_ATTR_NODEV
                    | MountAttrFlags::MOUNT_ATTR_NOEXEC,
            )
            .map_err(step("fsmount(tmpfs)"))?;
            attach(mount.as_fd(), target)
        }
        (Cover::Hide, _) => {
            let null = rustix::mount::open_tree(
                rustix::fs::CWD,
                "/dev/null",
                OpenTreeFlags::OPEN_TREE_CLONE | OpenTreeFlags::OPEN_TREE_CLOEXEC,
            )
            .map_err(step("open_tree(/dev/null)"))?;
            set_attributes(
                null.as_fd(),
                libc::MOUNT_ATTR_RDONLY
                    | libc::MOUNT_ATTR_NODEV
                    | libc::MOUNT_ATTR_NOSUID
                    | libc::MOUNT_ATTR_NOEXEC,
            )?;
            attach(null.as_fd(), target)
        }
    }
}

/// Checks, through a fresh lookup, that the cover is what the path now shows: a read-only mount
/// for a read-only target; for a hidden one, the root of another mount that cannot be opened.
fn check_cover(
    root: BorrowedFd<'_>,
    relative: &Path,
    kind: FileType,
    cover: Cover,
) -> Result<(), OvermountError> {
    let not_in_place = |why: &str| OvermountError::Step {
        what: "checking the cover",
        source: io::Error::other(why.to_owned()),
    };
    let fd = open_beneath(root, relative).map_err(step("opening the covered exclusion"))?;
    if !is_mount_root(fd.as_fd()) {
        return Err(not_in_place("the path is not a mount"));
    }
    let flags = rustix::fs::fstatvfs(&fd).map_err(step("fstatvfs"))?.f_flag;
    if !flags.contains(rustix::fs::StatVfsMountFlags::RDONLY) {
        return Err(not_in_place("the mount is writable"));
    }
    if cover == Cover::Hide {
        let kind_now =
            FileType::from_raw_mode(rustix::fs::fstat(&fd).map_err(step("fstat"))?.st_mode);
        let hidden = match kind {
            FileType::Directory => kind_now == FileType::Directory,
            _ => {
                kind_now == FileType::CharacterDevice
                    && flags.contains(rustix::fs::StatVfsMountFlags::NODEV)
            }
        };
        if !hidden {
            return Err(not_in_place("the path does not show the cover"));
        }
    }
    Ok(())
}

/// The mounts of this namespace, as `/proc/self/mountinfo` lists them: to find the other paths
/// under which a filesystem shows a covered path.
struct Views {
    mounts: Vec<MountInfo>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct MountInfo {
    /// `major:minor` of its filesystem.
    device: String,
    /// The directory of the filesystem mounted there.
    root: PathBuf,
    mount_point: PathBuf,
}

impl Views {
    fn read() -> Views {
        let text = std::fs::read("/proc/self/mountinfo").unwrap_or_default();
        Views {
            mounts: parse_mountinfo(&text),
        }
    }

    /// Every other path that shows what `path` shows through its own mount: for each other mount
    /// of the same filesystem whose root holds it.
    fn others(&self, path: &Path) -> Vec<PathBuf> {
        // The mount `path` is seen through: the deepest mount point above it, the last listed.
        let Some(own) = self
            .mounts
            .iter()
            .enumerate()
            .filter(|(_, m)| path.starts_with(&m.mount_point))
            .max_by_key(|(i, m)| (m.mount_point.components().count(), *i))
            .map(|(_, m)| m)
        else {
            return Vec::new();
        };
        let Ok(inside_mount) = path.strip_prefix(&own.mount_point) else {
            return Vec::new();
        };
        let in_filesystem = own.root.join(inside_mount);
        let mut views: Vec<PathBuf> = self
            .mounts
            .iter()
            .filter(|m| *m != own && m.device == own.device)
            .filter_map(|m| {
                let rest = in_filesystem.strip_prefix(&m.root).ok()?;
                Some(m.mount_point.join(rest))
            })
            .filter(|view| view != path)
            .collect();
        views.sort();
        views.dedup();
        views
    }
}

/// The device, root and mount point of each line of a mountinfo text (fields 3, 4 and 5, their
/// `\ooo` escapes undone).
fn parse_mountinfo(text: &[u8]) -> Vec<MountInfo> {
    text.split(|&b| b == b'\n')
        .filter_map(|line| {
            let mut fields = line.split(|&b| b == b' ');
            let (_id, _parent) = (fields.next()?, fields.next()?);
            let device = String::from_utf8(fields.next()?.to_vec()).ok()?;
            let root = PathBuf::from(OsString::from_vec(unescape(fields.next()?)));
            let mount_point = PathBuf::from(OsString::from_vec(unescape(fields.next()?)));
            Some(MountInfo {
                device,
                root,
                mount_point,
            })
        })
        .collect()
}

/// Undoes mountinfo's octal escapes (`\040` for a space, `\011`, `\012`, `\134`).
fn unescape(field: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(field.len());
    let mut i = 0;
    while i < field.len() {
        if field[i] == b'\\'
            && let Some(digits) = field.get(i + 1..i + 4)
            && digits.iter().all(|d| (b'0'..=b'7').contains(d))
        {
            let value = digits
                .iter()
                .fold(0u32, |acc, d| acc * 8 + u32::from(d - b'0'));
            if let Ok(byte) = u8::try_from(value) {
                out.push(byte);
                i += 4;
                continue;
            }
        }
        out.push(field[i]);
        i += 1;
    }
    out
}

/// The probe, run in a process of its own (`<launcher> __sandbox-probe`, so it can
/// enter namespaces): the same namespace steps as [`cover`] and one cover of each kind on a
/// detached mount. `Err` says which step the kernel refused.
pub fn probe() -> Result<(), String> {
    match enter_namespaces() {
        Ok(Entered::Yes) => {}
        Ok(Entered::Refused(e)) | Err(e) => return Err(explain(e)),
    }
    rustix::mount::mount_change(
        "/",
        MountPropagationFlags::PRIVATE | MountPropagationFlags::REC,
    )
    .map_err(step("making / private"))
    .map_err(explain)?;
    let fs = rustix::mount::fsopen("tmpfs", FsOpenFlags::FSOPEN_CLOEXEC)
        .map_err(step("fsopen(tmpfs)"))
        .map_err(explain)?;
    rustix::mount::fsconfig_create(fs.as_fd())
        .map_err(step("fsconfig(create)"))
        .map_err(explain)?;
    rustix::mount::fsmount(
        fs.as_fd(),
        FsMountFlags::FSMOUNT_CLOEXEC,
        MountAttrFlags::MOUNT_ATTR_RDONLY,
    )
    .map_err(step("fsmount(tmpfs)"))
    .map_err(explain)?;
    let null = rustix::mount::open_tree(
        rustix::fs::CWD,
        "/dev/null",
        OpenTreeFlags::OPEN_TREE_CLONE | OpenTreeFlags::OPEN_TREE_CLOEXEC,
    )
    .map_err(step("open_tree(/dev/null)"))
    .map_err(explain)?;
    set_attributes(
        null.as_fd(),
        libc::MOUNT_ATTR_RDONLY | libc::MOUNT_ATTR_NODEV,
    )
    .map_err(explain)
}

/// The error, with the usual cause where the machine shows it.
fn explain(error: OvermountError) -> String {
    let restricted =
        std::fs::read_to_string("/proc/sys/kernel/apparmor_restrict_unprivileged_userns")
            .is_ok_and(|v| v.trim() == "1");
    if restricted {
        format!(
            "{error} (kernel.apparmor_restrict_unprivileged_userns=1: AppArmor keeps unprivileged \
             user namespaces from mounting)"
        )
    } else {
        error.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mountinfo_fields_are_unescaped() {
        let text = b"36 35 98:0 /mnt1 /mnt/a\\040b rw,noatime master:1 - ext3 /dev/root rw\n\
                     37 36 0:5 / /dev rw - devtmpfs udev rw\n";
        assert_eq!(
            parse_mountinfo(text),
            vec![
                MountInfo {
                    device: "98:0".to_owned(),
                    root: PathBuf::from("/mnt1"),
                    mount_point: PathBuf::from("/mnt/a b"),
                },
                MountInfo {
                    device: "0:5".to_owned(),
                    root: PathBuf::from("/"),
                    mount_point: PathBuf::from("/dev"),
                },
            ]
        );
        assert_eq!(unescape(b"a\\134b\\011c\\9"), b"a\\b\tc\\9".to_vec());
    }

    /// A folder on `/home` (filesystem 8:1, its `/home` directory) is also under a bind of
    /// the filesystem's root at `/srv/all`, and under btrfs-like mounts of a subdirectory.
    #[test]
    fn other_views_of_a_path_are_found_through_every_mount_of_its_filesystem() {
        let line = |device: &str, root: &str, at: &str| MountInfo {
            device: device.to_owned(),
            root: PathBuf::from(root),
            mount_point: PathBuf::from(at),
        };
        let views = Views {
            mounts: vec![
                line("8:2", "/", "/"),
                line("8:1", "/home", "/home"),
                line("8:1", "/", "/srv/all"),
                line("8:1", "/home/u", "/mnt/u"),
                line("8:1", "/home/other", "/mnt/other"),
                line("8:3", "/", "/mnt/u/elsewhere"),
            ],
        };
        assert_eq!(
            views.others(Path::new("/home/u/proj/.env")),
            vec![
                PathBuf::from("/mnt/u/proj/.env"),
                PathBuf::from("/srv/all/home/u/proj/.env"),
            ]
        );
        assert!(views.others(Path::new("/etc/passwd")).is_empty());
    }

    #[test]
    fn targets_are_grouped_by_their_deepest_writable_root_outermost_first() {
        let policy = SandboxPolicy {
            pinned: vec![],
            read_write: vec![PathBuf::from("/w"), PathBuf::from("/w/inner")],
            read_only: vec![PathBuf::from("/r")],
            blocked: vec![
                PathBuf::from("/w/a/b/.env"),
                PathBuf::from("/w/inner/x"),
                PathBuf::from("/r/secret"),
                PathBuf::from("/w"),
            ],
            read_only_within: vec![PathBuf::from("/w/a")],
            denied: vec![PathBuf::from("/w/state")],
            read_only_if_present: vec![],
            scratch: PathBuf::from("/s"),
            cwd: PathBuf::from("/w"),
            limits: Default::default(),
            overmount_exclusions: true,
            private_terminals: false,
        };
        let roots = roots_and_targets(&policy);
        let summary: Vec<(PathBuf, Vec<(PathBuf, Cover)>)> = roots
            .iter()
            .map(|r| {
                (
                    r.path.clone(),
                    r.targets
                        .iter()
                        .map(|t| (t.relative.clone(), t.cover))
                        .collect(),
                )
            })
            .collect();
        assert_eq!(
            summary,
            vec![
                (
                    PathBuf::from("/w"),
                    vec![
                        (PathBuf::from("a"), Cover::ReadOnly),
                        (PathBuf::from("a/b/.env"), Cover::Hide),
                    ]
                ),
                (
                    PathBuf::from("/w/inner"),
                    vec![(PathBuf::from("x"), Cover::Hide)]
                ),
            ]
        );
    }
}
