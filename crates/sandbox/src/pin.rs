//! A directory pinned for a command's grants: opened once (`O_PATH` on Linux, no symlink at its
//! end followed) and kept open, with the device and inode it had then, so that a grant covers
//! that directory whatever its path names later (the laptop's shared folders at connect; the
//! server's project when a coding CLI's turn starts).
//!
//! Owns: opening, re-checking and granting such a directory ([`PinnedDir`]). Must never follow
//! a symlink at the pinned path's end.

use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustix::fs::{Mode, OFlags};

use crate::{PinnedAccess, PinnedGrant};

/// A directory opened (`O_PATH`, no symlink followed) and kept open, with the device and inode
/// it had then.
#[derive(Debug, Clone)]
pub struct PinnedDir {
    /// Canonical when it was opened.
    path: PathBuf,
    fd: Arc<OwnedFd>,
    dev: u64,
    ino: u64,
}

impl PartialEq for PinnedDir {
    fn eq(&self, other: &Self) -> bool {
        (&self.path, self.dev, self.ino) == (&other.path, other.dev, other.ino)
    }
}

impl Eq for PinnedDir {}

/// How a pinned directory is opened: `O_PATH` on Linux (no read access needed, nothing but a
/// handle for Landlock's rules); macOS has no `O_PATH`, so a plain read-only directory
/// descriptor, which the launcher only compares with the path (its profile names paths).
#[cfg(target_os = "linux")]
const PIN_ACCESS: OFlags = OFlags::PATH;
#[cfg(target_os = "macos")]
const PIN_ACCESS: OFlags = OFlags::RDONLY;

/// Opens `path` (canonical) as a directory without following a symlink at its end; its device
/// and inode.
fn open_dir_at_path(path: &Path) -> std::io::Result<(OwnedFd, u64, u64)> {
    let fd = rustix::fs::open(
        path,
        PIN_ACCESS | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )?;
    let stat = rustix::fs::fstat(&fd)?;
    // st_dev and st_ino are unsigned on Linux; the casts only widen.
    #[allow(clippy::unnecessary_cast)]
    Ok((fd, stat.st_dev as u64, stat.st_ino as u64))
}

impl PinnedDir {
    /// Pins `path`, which should be canonical (a symlink at its end is refused with `ELOOP`).
    pub fn open(path: &Path) -> std::io::Result<PinnedDir> {
        let (fd, dev, ino) = open_dir_at_path(path)?;
        Ok(PinnedDir {
            path: path.to_owned(),
            fd: Arc::new(fd),
            dev,
            ino,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Whether the path still names the pinned directory (no symlink at its end, same device
    /// and inode); if not, why not, in words.
    pub fn check(&self) -> Result<(), String> {
        match open_dir_at_path(&self.path) {
            Ok((_, dev, ino)) if (dev, ino) == (self.dev, self.ino) => Ok(()),
            Ok(_) => Err("another directory is there now".to_owned()),
            Err(e) if e.raw_os_error() == Some(libc::ELOOP) => {
                Err("it is a symlink now".to_owned())
            }
            Err(e) => Err(e.to_string()),
        }
    }

    /// The sandbox grant of this directory through its descriptor (kept open as long as this
    /// value or a clone of it lives).
    pub fn grant(&self, access: PinnedAccess) -> PinnedGrant {
        PinnedGrant {
            fd: self.fd.as_raw_fd(),
            dev: self.dev,
            ino: self.ino,
            path: self.path.clone(),
            access,
        }
    }
}
