//! Making a private directory safely, for the daemons' state subtrees and the laptop CLI's
//! config and state directories alike.
//!
//! Owns the one way a directory is made private: create it if missing, refuse a symlink or a
//! non-directory in its place, and set its mode through a descriptor opened with `O_NOFOLLOW`.
//! Must never follow a symlink at the directory itself, nor change the mode of anything but
//! the directory it was asked for (missing parents are only created). Every directory it
//! creates is made durable by syncing its parent, so a power cut cannot take away a state
//! directory (and the receipts later written inside it) that a caller already relied on.

use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use rustix::fs::{Mode, OFlags};

/// Why a private directory could not be made.
#[derive(Debug, thiserror::Error)]
pub enum PrivateDirError {
    /// Creating the directory or one of its parents failed.
    #[error("cannot create directory {path}: {source}")]
    Create {
        path: PathBuf,
        source: std::io::Error,
    },
    /// The path is a symlink; following it could hand our data to whoever planted it.
    #[error("{path} is a symlink; refusing to use it as a private directory (remove it)")]
    Symlink { path: PathBuf },
    /// The path exists but is not a directory.
    #[error("{path} exists and is not a directory (move it away)")]
    NotDirectory { path: PathBuf },
    /// Opening the directory (without following symlinks) failed.
    #[error("cannot open directory {path}: {source}")]
    Open {
        path: PathBuf,
        source: std::io::Error,
    },
    /// Syncing the folder a new directory was created in failed: the new entry may not
    /// survive a power cut.
    #[error("cannot sync {path} after creating a directory in it: {source}")]
    Sync {
        path: PathBuf,
        source: std::io::Error,
    },
    /// Setting the mode failed (usually: the directory belongs to another user).
    #[error("cannot set mode {mode:o} on {path}: {source} (is it owned by another user?)")]
    Chmod {
        path: PathBuf,
        mode: u32,
        source: std::io::Error,
    },
}

/// The mode missing parents of the private directory are created with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MissingParents {
    /// 0777 minus the umask: a daemon's state root must stay traversable by the other
    /// daemons' users, so only the daemon's own subtree is private.
    DefaultMode,
    /// The private directory's own mode (minus the umask), as the XDG base-directory spec asks
    /// for `~/.config` and `~/.local/state` when the CLI is the one creating them.
    SameMode,
}

/// Creates `dir` (and its missing parents, see [`MissingParents`]) if missing, then makes sure
/// it is a real directory (not a symlink) with exactly `mode` (permission bits, e.g. `0o700`);
/// error otherwise.
///
/// Only `dir` itself is forced to `mode`. The final check and chmod go through a descriptor
/// opened with `O_NOFOLLOW`, so a symlink swapped in after the check is refused rather than
/// followed.
pub fn ensure_private_dir(
    dir: &Path,
    mode: u32,
    parents: MissingParents,
) -> Result<(), PrivateDirError> {
    let mode = mode & 0o7777;
    // The directories this call creates, so each one's parent is synced afterwards.
    let mut created: Vec<&Path> = Vec::new();
    if let Some(parent) = dir.parent()
        && !parent.as_os_str().is_empty()
    {
        created.extend(
            parent
                .ancestors()
                .take_while(|a| !a.as_os_str().is_empty() && std::fs::symlink_metadata(a).is_err()),
        );
        let mut builder = std::fs::DirBuilder::new();
        builder.recursive(true);
        if parents == MissingParents::SameMode {
            builder.mode(mode);
        }
        builder
            .create(parent)
            .map_err(|source| PrivateDirError::Create {
                path: parent.to_path_buf(),
                source,
            })?;
    }
    match std::fs::DirBuilder::new().mode(mode).create(dir) {
        Ok(()) => created.insert(0, dir),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(source) => {
            return Err(PrivateDirError::Create {
                path: dir.to_path_buf(),
                source,
            });
        }
    }
    // Innermost first: once an outer entry is durable, everything inside it already is.
    for made in created {
        if let Some(parent) = made.parent() {
            sync_dir(if parent.as_os_str().is_empty() {
                Path::new(".")
            } else {
                parent
            })?;
        }
    }
    // lstat first only to give a precise error; the descriptor below is what we trust.
    let meta = std::fs::symlink_metadata(dir).map_err(|source| PrivateDirError::Open {
        path: dir.to_path_buf(),
        source,
    })?;
    if meta.file_type().is_symlink() {
        return Err(PrivateDirError::Symlink {
            path: dir.to_path_buf(),
        });
    }
    if !meta.is_dir() {
        return Err(PrivateDirError::NotDirectory {
            path: dir.to_path_buf(),
        });
    }
    let fd = rustix::fs::open(
        dir,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(|errno| match errno {
        rustix::io::Errno::LOOP => PrivateDirError::Symlink {
            path: dir.to_path_buf(),
        },
        rustix::io::Errno::NOTDIR => PrivateDirError::NotDirectory {
            path: dir.to_path_buf(),
        },
        errno => PrivateDirError::Open {
            path: dir.to_path_buf(),
            source: errno.into(),
        },
    })?;
    // Through std's File (fstat and fchmod on the descriptor), whose mode and device numbers
    // have one type on every Unix.
    let dir_file = std::fs::File::from(fd);
    let stat = dir_file
        .metadata()
        .map_err(|source| PrivateDirError::Open {
            path: dir.to_path_buf(),
            source,
        })?;
    if stat.mode() & 0o7777 != mode {
        dir_file
            .set_permissions(std::fs::Permissions::from_mode(mode))
            .map_err(|source| PrivateDirError::Chmod {
                path: dir.to_path_buf(),
                mode,
                source,
            })?;
    }
    // Re-check through the path: what the caller will use must be what we fixed.
    let after = std::fs::symlink_metadata(dir).map_err(|source| PrivateDirError::Open {
        path: dir.to_path_buf(),
        source,
    })?;
    if after.ino() != stat.ino() || after.dev() != stat.dev() {
        return Err(PrivateDirError::Symlink {
            path: dir.to_path_buf(),
        });
    }
    Ok(())
}

/// fsync a directory, so the entries created in it are durable.
fn sync_dir(dir: &Path) -> Result<(), PrivateDirError> {
    let failed = |errno: rustix::io::Errno| PrivateDirError::Sync {
        path: dir.to_path_buf(),
        source: errno.into(),
    };
    let fd = rustix::fs::open(
        dir,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(failed)?;
    rustix::fs::fsync(&fd).map_err(failed)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn mode_of(path: &Path) -> u32 {
        std::fs::metadata(path).unwrap().permissions().mode() & 0o7777
    }

    #[test]
    fn ensure_private_dir_creates_and_fixes_mode() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("a/b/files");
        ensure_private_dir(&dir, 0o700, MissingParents::DefaultMode).unwrap();
        assert_eq!(mode_of(&dir), 0o700);

        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
        ensure_private_dir(&dir, 0o700, MissingParents::DefaultMode).unwrap();
        assert_eq!(mode_of(&dir), 0o700);
        // Idempotent.
        ensure_private_dir(&dir, 0o700, MissingParents::DefaultMode).unwrap();
    }

    #[test]
    fn ensure_private_dir_refuses_a_symlink() {
        let tmp = tempfile::tempdir().unwrap();
        let target = tmp.path().join("target");
        std::fs::create_dir(&target).unwrap();
        std::fs::set_permissions(&target, std::fs::Permissions::from_mode(0o755)).unwrap();
        let link = tmp.path().join("link");
        std::os::unix::fs::symlink(&target, &link).unwrap();
        let err = ensure_private_dir(&link, 0o700, MissingParents::DefaultMode).unwrap_err();
        assert!(matches!(err, PrivateDirError::Symlink { .. }), "{err}");
        // The target was not touched.
        assert_eq!(mode_of(&target), 0o755);
    }

    #[test]
    fn ensure_private_dir_refuses_a_file() {
        let tmp = tempfile::tempdir().unwrap();
        let file = tmp.path().join("file");
        std::fs::write(&file, b"x").unwrap();
        let err = ensure_private_dir(&file, 0o700, MissingParents::DefaultMode).unwrap_err();
        assert!(matches!(err, PrivateDirError::NotDirectory { .. }), "{err}");
    }

    /// The laptop's case: `~/.local/state/agentworks` in a fresh home makes `.local` and
    /// `.local/state` private too (at most 0700; the umask may take more away).
    #[test]
    fn same_mode_parents_are_private_and_existing_ones_are_left_alone() {
        let tmp = tempfile::tempdir().unwrap();
        let home = tmp.path().join("home");
        std::fs::create_dir(&home).unwrap();
        std::fs::set_permissions(&home, std::fs::Permissions::from_mode(0o755)).unwrap();
        let dir = home.join(".local/state/agentworks");
        ensure_private_dir(&dir, 0o700, MissingParents::SameMode).unwrap();
        assert_eq!(mode_of(&dir), 0o700);
        assert_eq!(mode_of(&home.join(".local")) & !0o700, 0);
        assert_eq!(mode_of(&home.join(".local/state")) & !0o700, 0);
        assert_eq!(mode_of(&home), 0o755, "an existing parent keeps its mode");
    }
}
