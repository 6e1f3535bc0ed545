//! Opening project paths without ever leaving the project.
//!
//! Every open starts from a directory fd and goes through `openat2` with `RESOLVE_BENEATH |
//! RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS`: the kernel refuses `..` escapes and every
//! symlink on the path, including one swapped in while we resolve. The fds returned here are
//! what later calls act on (`*at` calls, `f*` metadata calls), so a component replaced after
//! the open changes nothing we touch.
//!
//! Where `openat2` is unavailable — a kernel before 5.6, or systemd's `RestrictSUIDSGID=`, whose
//! seccomp filter cannot inspect `openat2`'s flags and so fails every call with `ENOSYS` — the
//! same rule is kept by walking the path one component at a time with `openat(O_NOFOLLOW)` from
//! the fd of the component before: a [`RelPath`] has no `..`, no empty and no absolute
//! components, so every step stays beneath the start, and `O_NOFOLLOW` on every step refuses every
//! symlink (magic links included) exactly where `RESOLVE_NO_SYMLINKS` would.
//!
//! A regular file with more than one hard link is refused by [`open_file`]: its other names may
//! lie anywhere on the same filesystem (a private key, a root-only file), and no path check can
//! see them, so confinement by path says nothing about what such a file is.
//!
//! A folder it makes is durable before it is handed out: its entry is synced in the folder
//! above. If that sync fails, the folder above is remembered (in this process) and synced by
//! the next [`open_dir_creating`] or [`make_dir`] that passes through it, so a folder that
//! exists is never used as durable when its entry may not be. A crash forgets that; the
//! process's start-up must then sync what it serves (workspaced's recovery syncs every folder
//! of every project).
//!
//! This module never opens a path string relative to the process cwd, never follows a symlink
//! and never hands out a regular file that has a second name.

use crate::failpoint::{self, Failpoint, Hit};
use agentworks_core::guard::RelPath;
#[cfg(target_os = "linux")]
use rustix::fs::ResolveFlags;
use rustix::fs::{AtFlags, Mode, OFlags, Stat};
use rustix::io::Errno;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::Mutex;
#[cfg(target_os = "linux")]
use std::sync::atomic::{AtomicBool, Ordering};

/// Folders (device, inode) in which this process made a folder whose entry it then failed to
/// sync: the next walk through one syncs it first (see the module doc).
static UNSYNCED_PARENTS: Mutex<Vec<FolderId>> = Mutex::new(Vec::new());

/// A folder's (device, inode); dev_t is signed and narrower on macOS.
type FolderId = (rustix::fs::Dev, u64);

fn unsynced_parents() -> std::sync::MutexGuard<'static, Vec<FolderId>> {
    // A panic while holding it leaves a valid list.
    UNSYNCED_PARENTS.lock().unwrap_or_else(|e| e.into_inner())
}

fn identity(fd: BorrowedFd<'_>) -> Result<FolderId, Errno> {
    let stat = rustix::fs::fstat(fd)?;
    // ino_t: u64 here, narrower on some targets.
    #[allow(clippy::useless_conversion)]
    Ok((stat.st_dev, u64::from(stat.st_ino)))
}

/// Sync `folder` if a folder made in it was left unsynced (see the module doc); it is
/// forgotten once the sync succeeds.
fn sync_if_left_unsynced(folder: BorrowedFd<'_>) -> Result<(), Errno> {
    if unsynced_parents().is_empty() {
        return Ok(());
    }
    let id = identity(folder)?;
    if !unsynced_parents().contains(&id) {
        return Ok(());
    }
    rustix::fs::fsync(folder)?;
    unsynced_parents().retain(|known| *known != id);
    Ok(())
}

/// Make the folder `name` in `parent` and sync `parent`, so the new entry is durable: `true`
/// if it was made, `false` if it was there already (then `parent` is synced first if a folder
/// made in it before was left unsynced). A failed sync leaves the new folder in place and
/// `parent` remembered, for the next call through it to sync.
pub fn make_dir(parent: BorrowedFd<'_>, name: &str) -> Result<bool, Errno> {
    match rustix::fs::mkdirat(parent, name, Mode::from_raw_mode(0o777)) {
        Ok(()) => {
            let synced = match failpoint::hit(Failpoint::AfterMkdir) {
                Hit::Fail => Err(Errno::IO),
                Hit::Continue => rustix::fs::fsync(parent),
            };
            if let Err(e) = synced {
                // An identity that cannot be read leaves nothing to find it by; the error
                // still refuses this change.
                if let Ok(id) = identity(parent) {
                    unsynced_parents().push(id);
                }
                return Err(e);
            }
            Ok(true)
        }
        Err(Errno::EXIST) => {
            sync_if_left_unsynced(parent)?;
            Ok(false)
        }
        Err(e) => Err(e),
    }
}

/// How often a resolution interrupted by a concurrent rename (`EAGAIN`) is retried.
#[cfg(target_os = "linux")]
const RENAME_RACE_RETRIES: usize = 8;

/// Why a confined open failed.
#[derive(Debug, thiserror::Error)]
pub enum ConfineError {
    #[error("{path} is or passes through a symlink; symlinks are refused anywhere on a path")]
    Symlink { path: String },
    #[error("{path} resolves outside the project")]
    Escape { path: String },
    #[error("{path} does not exist")]
    NotFound { path: String },
    #[error("{path} is not a regular file")]
    NotAFile { path: String },
    #[error("{path} is not a directory (or a component of it is a file)")]
    NotADirectory { path: String },
    #[error(
        "{path} has {links} hard links; a file with another name may be a file outside the folder, so it is refused"
    )]
    HardLink { path: String, links: u64 },
    #[error("cannot open {path}: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },
}

#[cfg(target_os = "linux")]
fn resolve_flags() -> ResolveFlags {
    ResolveFlags::BENEATH | ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_MAGICLINKS
}

fn classify(path: &str, errno: Errno) -> ConfineError {
    let path = path.to_owned();
    match errno {
        Errno::LOOP => ConfineError::Symlink { path },
        Errno::XDEV => ConfineError::Escape { path },
        Errno::NOENT => ConfineError::NotFound { path },
        Errno::NOTDIR => ConfineError::NotADirectory { path },
        other => ConfineError::Io {
            path,
            source: other.into(),
        },
    }
}

#[cfg(target_os = "linux")]
/// Set once `openat2` answered `ENOSYS`: it will not come back in this process (a seccomp filter
/// or the kernel), so later opens go straight to the component walk.
static OPENAT2_MISSING: AtomicBool = AtomicBool::new(false);

/// Open `path` (`/`-separated components of a [`RelPath`], or `.`) beneath `dir`, refusing `..`
/// escapes and every symlink on the way: `openat2`, or the component walk where it is missing.
pub fn open_beneath(
    dir: BorrowedFd<'_>,
    path: &str,
    flags: OFlags,
    mode: Mode,
) -> Result<OwnedFd, Errno> {
    // Only Linux has `openat2`; elsewhere (the laptop CLI on macOS) the walk is the one way.
    #[cfg(target_os = "linux")]
    if !OPENAT2_MISSING.load(Ordering::Relaxed) {
        // Debug builds: `AGENTWORKS_FAILPOINT=openat2:fail` answers as systemd's filter does.
        let answer = match failpoint::hit(Failpoint::Openat2) {
            Hit::Fail => Err(Errno::NOSYS),
            Hit::Continue => openat2_beneath(dir, path, flags, mode),
        };
        match answer {
            Err(Errno::NOSYS) => {
                if !OPENAT2_MISSING.swap(true, Ordering::Relaxed) {
                    tracing::info!(
                        "openat2 is not available (ENOSYS: an old kernel or a seccomp filter such \
                         as systemd's RestrictSUIDSGID=); confining paths by opening one \
                         component at a time with O_NOFOLLOW"
                    );
                }
            }
            other => return other,
        }
    }
    open_walking(dir, path, flags, mode)
}

/// `openat2` beneath `dir`, retrying the kernel's `EAGAIN` for a rename that raced the lookup.
#[cfg(target_os = "linux")]
fn openat2_beneath(
    dir: BorrowedFd<'_>,
    path: &str,
    flags: OFlags,
    mode: Mode,
) -> Result<OwnedFd, Errno> {
    let mut attempt = 0;
    loop {
        match rustix::fs::openat2(dir, path, flags | OFlags::CLOEXEC, mode, resolve_flags()) {
            Err(Errno::AGAIN) if attempt < RENAME_RACE_RETRIES => attempt += 1,
            other => return other,
        }
    }
}

/// The same confinement without `openat2`: one `openat(O_NOFOLLOW)` per component, each from
/// the fd of the one before. Refuses what `openat2_beneath` refuses, with the same errors: `..`
/// (`EXDEV`), an absolute or empty component (`EXDEV`), a symlink anywhere (`ELOOP`).
fn open_walking(
    dir: BorrowedFd<'_>,
    path: &str,
    flags: OFlags,
    mode: Mode,
) -> Result<OwnedFd, Errno> {
    let components: Vec<&str> = path.split('/').collect();
    if components.iter().any(|c| c.is_empty() || *c == "..") {
        return Err(Errno::XDEV);
    }
    let (last, parents) = components.split_last().ok_or(Errno::XDEV)?;
    let mut current: Option<OwnedFd> = None;
    for component in parents {
        let at = current.as_ref().map_or(dir, |fd| fd.as_fd());
        let next = openat_nofollow(
            at,
            component,
            OFlags::RDONLY | OFlags::DIRECTORY,
            Mode::empty(),
        )?;
        current = Some(next);
    }
    let at = current.as_ref().map_or(dir, |fd| fd.as_fd());
    openat_nofollow(at, last, flags, mode)
}

/// One step of the walk. `O_DIRECTORY` on a symlink answers `ENOTDIR` before `O_NOFOLLOW` gets
/// to say `ELOOP`, so a refused step is looked at again to report a symlink as one.
fn openat_nofollow(
    at: BorrowedFd<'_>,
    component: &str,
    flags: OFlags,
    mode: Mode,
) -> Result<OwnedFd, Errno> {
    match rustix::fs::openat(
        at,
        component,
        flags | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        mode,
    ) {
        Err(Errno::NOTDIR) => match rustix::fs::statat(at, component, AtFlags::SYMLINK_NOFOLLOW) {
            Ok(stat)
                if rustix::fs::FileType::from_raw_mode(stat.st_mode)
                    == rustix::fs::FileType::Symlink =>
            {
                Err(Errno::LOOP)
            }
            _ => Err(Errno::NOTDIR),
        },
        other => other,
    }
}

/// Open a directory beneath `root`; `None` opens (a duplicate of) `root` itself.
pub fn open_dir(root: BorrowedFd<'_>, dir: Option<&RelPath>) -> Result<OwnedFd, ConfineError> {
    let path = dir.map(RelPath::as_str).unwrap_or(".");
    open_beneath(
        root,
        path,
        OFlags::RDONLY | OFlags::DIRECTORY,
        Mode::empty(),
    )
    .map_err(|e| classify(path, e))
}

/// Open the directory `dir` beneath `root`, creating missing components one at a time (each
/// created with [`make_dir`] on the fd of its confined parent, so a symlink planted meanwhile
/// is refused, the kernel applies the parent's default ACL as for any new directory, and the
/// new entry is synced). While a folder made earlier is left unsynced, every component is
/// walked, so the folder above it is synced before it is used.
pub fn open_dir_creating(root: BorrowedFd<'_>, dir: &RelPath) -> Result<OwnedFd, ConfineError> {
    if unsynced_parents().is_empty() {
        match open_dir(root, Some(dir)) {
            Err(ConfineError::NotFound { .. }) => {}
            other => return other,
        }
    }
    let mut current = open_dir(root, None)?;
    let mut walked = String::new();
    for component in dir.components() {
        if !walked.is_empty() {
            walked.push('/');
        }
        walked.push_str(component);
        make_dir(current.as_fd(), component).map_err(|e| classify(&walked, e))?;
        current = open_beneath(
            current.as_fd(),
            component,
            OFlags::RDONLY | OFlags::DIRECTORY,
            Mode::empty(),
        )
        .map_err(|e| classify(&walked, e))?;
    }
    Ok(current)
}

/// Open the regular file `name` inside the directory `parent` for reading. `Ok(None)` when it
/// does not exist. Opened non-blocking so a FIFO planted at the path cannot hang us; anything
/// but a regular file, and a regular file with more than one link, is refused after `fstat`.
pub fn open_file(
    parent: BorrowedFd<'_>,
    name: &str,
    display: &RelPath,
) -> Result<Option<(OwnedFd, Stat)>, ConfineError> {
    let fd = match open_beneath(
        parent,
        name,
        OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::NOCTTY,
        Mode::empty(),
    ) {
        Ok(fd) => fd,
        Err(Errno::NOENT) => return Ok(None),
        Err(e) => return Err(classify(display.as_str(), e)),
    };
    let stat = rustix::fs::fstat(&fd).map_err(|e| classify(display.as_str(), e))?;
    if rustix::fs::FileType::from_raw_mode(stat.st_mode) != rustix::fs::FileType::RegularFile {
        return Err(ConfineError::NotAFile {
            path: display.to_string(),
        });
    }
    // The link count of the inode we hold, not of a path looked up again: a link made after
    // this check names the file we validated, never another one.
    let links = stat.st_nlink as u64; // nlink_t: u64 here, u32 on some targets
    if links > 1 {
        return Err(ConfineError::HardLink {
            path: display.to_string(),
            links,
        });
    }
    Ok(Some((fd, stat)))
}

/// The parent directory of `path` (opened, optionally creating it) and the file name in it.
pub fn open_parent<'p>(
    root: BorrowedFd<'_>,
    path: &'p RelPath,
    create: bool,
) -> Result<(OwnedFd, &'p str), ConfineError> {
    let parent = path.parent();
    let fd = match (&parent, create) {
        (Some(dir), true) => open_dir_creating(root, dir)?,
        (Some(dir), false) => open_dir(root, Some(dir))?,
        (None, _) => open_dir(root, None)?,
    };
    Ok((fd, path.file_name()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    fn root_fd(dir: &std::path::Path) -> OwnedFd {
        rustix::fs::open(dir, OFlags::RDONLY | OFlags::DIRECTORY, Mode::empty()).unwrap()
    }

    fn p(s: &str) -> RelPath {
        RelPath::parse(s).unwrap()
    }

    #[test]
    fn refuses_symlinks_anywhere_and_escapes() {
        let outside = tempfile::tempdir().unwrap();
        std::fs::write(outside.path().join("secret"), "s").unwrap();
        let project = tempfile::tempdir().unwrap();
        std::fs::create_dir(project.path().join("real")).unwrap();
        std::fs::write(project.path().join("real/f"), "x").unwrap();
        symlink(outside.path(), project.path().join("link")).unwrap();
        symlink(
            outside.path().join("secret"),
            project.path().join("real/leaf"),
        )
        .unwrap();
        let root = root_fd(project.path());

        assert!(matches!(
            open_dir(root.as_fd(), Some(&p("link"))),
            Err(ConfineError::Symlink { .. })
        ));
        let leaf = p("real/leaf");
        let (dir, name) = open_parent(root.as_fd(), &leaf, false).unwrap();
        assert!(matches!(
            open_file(dir.as_fd(), name, &p("real/leaf")),
            Err(ConfineError::Symlink { .. })
        ));
        assert!(matches!(
            open_parent(root.as_fd(), &p("link/secret"), false),
            Err(ConfineError::Symlink { .. })
        ));
        // Creating through a symlinked component is refused too.
        assert!(matches!(
            open_dir_creating(root.as_fd(), &p("link/new")),
            Err(ConfineError::Symlink { .. })
        ));
        assert!(!outside.path().join("new").exists());
        let f = p("real/f");
        let (dir, name) = open_parent(root.as_fd(), &f, false).unwrap();
        assert!(
            open_file(dir.as_fd(), name, &p("real/f"))
                .unwrap()
                .is_some()
        );
        assert!(
            open_file(dir.as_fd(), "none", &p("real/none"))
                .unwrap()
                .is_none()
        );
    }

    #[test]
    fn refuses_fifos_and_directories_as_files() {
        let project = tempfile::tempdir().unwrap();
        rustix::fs::mknodat(
            rustix::fs::CWD,
            project.path().join("fifo"),
            rustix::fs::FileType::Fifo,
            Mode::from_raw_mode(0o600),
            0,
        )
        .unwrap();
        std::fs::create_dir(project.path().join("d")).unwrap();
        let root = root_fd(project.path());
        for name in ["fifo", "d"] {
            assert!(matches!(
                open_file(root.as_fd(), name, &p(name)),
                Err(ConfineError::NotAFile { .. })
            ));
        }
    }

    #[test]
    fn refuses_a_file_with_a_second_name_anywhere() {
        let outside = tempfile::tempdir().unwrap();
        std::fs::write(outside.path().join("secret"), "s").unwrap();
        let project = tempfile::tempdir().unwrap();
        std::fs::hard_link(outside.path().join("secret"), project.path().join("link")).unwrap();
        std::fs::write(project.path().join("own"), "x").unwrap();
        std::fs::hard_link(project.path().join("own"), project.path().join("own2")).unwrap();
        let root = root_fd(project.path());
        for name in ["link", "own", "own2"] {
            assert!(
                matches!(
                    open_file(root.as_fd(), name, &p(name)),
                    Err(ConfineError::HardLink { links: 2, .. })
                ),
                "{name}"
            );
        }
        // Once the second name is gone, the file is an ordinary one again.
        std::fs::remove_file(project.path().join("own2")).unwrap();
        assert!(open_file(root.as_fd(), "own", &p("own")).unwrap().is_some());
    }

    /// The walk used without `openat2` refuses and allows exactly what `openat2` does.
    #[cfg(target_os = "linux")]
    #[test]
    fn the_component_walk_matches_openat2() {
        let outside = tempfile::tempdir().unwrap();
        std::fs::write(outside.path().join("secret"), "s").unwrap();
        let project = tempfile::tempdir().unwrap();
        let at = project.path();
        std::fs::create_dir_all(at.join("a/b")).unwrap();
        std::fs::write(at.join("a/b/f"), "x").unwrap();
        std::fs::write(at.join("top"), "x").unwrap();
        symlink(outside.path(), at.join("a/out")).unwrap();
        symlink("b", at.join("a/inner")).unwrap();
        symlink(outside.path().join("secret"), at.join("a/b/leaf")).unwrap();
        symlink("/proc/self/root", at.join("magic")).unwrap();
        let root = root_fd(at);
        let dir = OFlags::RDONLY | OFlags::DIRECTORY;
        let file = OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK;
        let cases: &[(&str, OFlags, Result<(), Errno>)] = &[
            (".", dir, Ok(())),
            ("a", dir, Ok(())),
            ("a/b", dir, Ok(())),
            ("a/b/f", file, Ok(())),
            ("top", file, Ok(())),
            ("a/out", dir, Err(Errno::LOOP)),
            ("a/out/secret", file, Err(Errno::LOOP)),
            ("a/inner", dir, Err(Errno::LOOP)),
            ("a/inner/f", file, Err(Errno::LOOP)),
            ("a/b/leaf", file, Err(Errno::LOOP)),
            ("magic", dir, Err(Errno::LOOP)),
            ("magic/etc", dir, Err(Errno::LOOP)),
            ("..", dir, Err(Errno::XDEV)),
            ("a/../..", dir, Err(Errno::XDEV)),
            ("a/b/f", dir, Err(Errno::NOTDIR)),
            ("top/x", file, Err(Errno::NOTDIR)),
            ("a/none", file, Err(Errno::NOENT)),
            ("none/f", file, Err(Errno::NOENT)),
        ];
        for (path, flags, expected) in cases {
            let with_openat2 = openat2_beneath(root.as_fd(), path, *flags, Mode::empty());
            let walking = open_walking(root.as_fd(), path, *flags, Mode::empty());
            assert_eq!(
                with_openat2.as_ref().map(|_| ()).map_err(|e| *e),
                *expected,
                "openat2 on {path}"
            );
            assert_eq!(
                walking.as_ref().map(|_| ()).map_err(|e| *e),
                *expected,
                "walk on {path}"
            );
            if let (Ok(a), Ok(b)) = (with_openat2, walking) {
                let (a, b) = (
                    rustix::fs::fstat(&a).unwrap(),
                    rustix::fs::fstat(&b).unwrap(),
                );
                assert_eq!((a.st_dev, a.st_ino), (b.st_dev, b.st_ino), "{path}");
            }
        }
    }

    /// A folder whose new entry could not be synced is synced by the next walk through it,
    /// also when the path is there already (the fast open would never look at it).
    #[test]
    fn a_folder_left_unsynced_is_synced_by_the_next_walk_through_it() {
        let project = tempfile::tempdir().unwrap();
        let root = root_fd(project.path());
        std::fs::create_dir_all(project.path().join("a/b")).unwrap();
        let a = open_dir(root.as_fd(), Some(&p("a"))).unwrap();
        let id = identity(a.as_fd()).unwrap();
        // As `make_dir` leaves it when the sync after `mkdirat(a, "b")` fails.
        unsynced_parents().push(id);
        open_dir_creating(root.as_fd(), &p("a/b")).unwrap();
        assert!(!unsynced_parents().contains(&id));
        // A folder made anew is synced at once; one that exists is left alone.
        assert!(make_dir(a.as_fd(), "c").unwrap());
        assert!(!make_dir(a.as_fd(), "c").unwrap());
        assert!(!unsynced_parents().contains(&id));
    }

    #[test]
    fn creates_missing_parents_inside_the_root() {
        let project = tempfile::tempdir().unwrap();
        let root = root_fd(project.path());
        let file = p("a/b/c/file.txt");
        let (_dir, name) = open_parent(root.as_fd(), &file, true).unwrap();
        assert_eq!(name, "file.txt");
        assert!(project.path().join("a/b/c").is_dir());
    }
}
