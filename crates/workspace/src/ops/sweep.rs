//! The temp sweep at start: remove the staged files (named [`TEMP_PREFIX`]...) that a crash
//! left beside their targets.
//!
//! It must never remove anything else, never follow a symlink, and never go deeper than
//! [`MAX_WALK_DEPTH`] folders.

use super::{MAX_WALK_DEPTH, TEMP_PREFIX};
use agentworks_fs::confine;
use rustix::fs::{AtFlags, Mode, OFlags};
use std::os::fd::{AsFd, BorrowedFd};

/// Remove our staged files under `dir` (at folder depth `depth`); returns how many went.
pub(super) fn sweep_temp_files(dir: BorrowedFd<'_>, depth: usize) -> usize {
    let Ok(listing) = rustix::fs::Dir::read_from(dir) else {
        return 0;
    };
    let mut removed = 0;
    let mut subdirs = Vec::new();
    for entry in listing.flatten() {
        let Ok(name) = entry.file_name().to_str() else {
            continue;
        };
        if name == "." || name == ".." {
            continue;
        }
        let Ok(stat) = rustix::fs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW) else {
            continue;
        };
        match rustix::fs::FileType::from_raw_mode(stat.st_mode) {
            rustix::fs::FileType::RegularFile
                if name.starts_with(TEMP_PREFIX)
                    && rustix::fs::unlinkat(dir, name, AtFlags::empty()).is_ok() =>
            {
                removed += 1;
            }
            rustix::fs::FileType::Directory if depth + 1 < MAX_WALK_DEPTH => {
                subdirs.push(name.to_owned())
            }
            _ => {}
        }
    }
    for name in subdirs {
        if let Ok(fd) = confine::open_beneath(
            dir,
            name.as_str(),
            OFlags::RDONLY | OFlags::DIRECTORY,
            Mode::empty(),
        ) {
            removed += sweep_temp_files(fd.as_fd(), depth + 1);
        }
    }
    removed
}
