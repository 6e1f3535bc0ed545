//! Opening project paths without ever leaving the project.
//!
//! Every open starts from a directory fd and goes through `openat2` with `RESOLVE_BENEATH |
//! RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS`: the kernel refuses `..` escapes and every
//! symlink on the path, including one swapped in while we resolve. The fds returned here are
//! what later calls act on (`*at` calls, `f*` metadata calls), so a component replaced after
//! the open changes nothing we touch.
//!
//! This module never opens a path string relative to the process cwd and never follows a
//! symlink.

use crate::guard::RelPath;
use rustix::fs::{Mode, OFlags, ResolveFlags, Stat};
use rustix::io::Errno;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

/// How often a resolution interrupted by a concurrent rename (`EAGAIN`) is retried.
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
    #[error("cannot open {path}: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },
}

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

/// `openat2` beneath `dir`, retrying the kernel's `EAGAIN` for a rename that raced the lookup.
fn open_beneath(
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
/// created with `mkdirat` on the fd of its confined parent, so a symlink planted meanwhile is
/// refused, and the kernel applies the parent's default ACL as for any new directory).
pub fn open_dir_creating(root: BorrowedFd<'_>, dir: &RelPath) -> Result<OwnedFd, ConfineError> {
    match open_dir(root, Some(dir)) {
        Err(ConfineError::NotFound { .. }) => {}
        other => return other,
    }
    let mut current = open_dir(root, None)?;
    let mut walked = String::new();
    for component in dir.components() {
        if !walked.is_empty() {
            walked.push('/');
        }
        walked.push_str(component);
        match rustix::fs::mkdirat(&current, component, Mode::from_raw_mode(0o777)) {
            // A new entry is durable only once its parent folder is synced.
            Ok(()) => rustix::fs::fsync(&current).map_err(|e| classify(&walked, e))?,
            Err(Errno::EXIST) => {}
            Err(e) => return Err(classify(&walked, e)),
        }
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
/// but a regular file is refused after `fstat`.
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
    fn creates_missing_parents_inside_the_root() {
        let project = tempfile::tempdir().unwrap();
        let root = root_fd(project.path());
        let file = p("a/b/c/file.txt");
        let (_dir, name) = open_parent(root.as_fd(), &file, true).unwrap();
        assert_eq!(name, "file.txt");
        assert!(project.path().join("a/b/c").is_dir());
    }
}
