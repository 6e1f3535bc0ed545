//! The shared state root's layout: which daemon's data lives where.
//!
//! Owns the path arithmetic (`agent/`, `files/receipts/<root_key>/`, `files/locks/<root_key>.lock`,
//! `gateway/`), the project root key, and making a private directory safely.
//!
//! Must never open or create another daemon's directory on its behalf: each daemon calls
//! [`ensure_private_dir`] only for its own subtree, and the per-daemon users keep them apart.

use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{DirBuilderExt, MetadataExt};
use std::path::{Path, PathBuf};

use rustix::fs::{Mode, OFlags};
use sha2::{Digest, Sha256};

/// Paths inside one state root.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StateLayout {
    /// The state root itself, e.g. `/var/lib/agentworks`.
    pub root: PathBuf,
}

impl StateLayout {
    /// agentd's directory: `<root>/agent`.
    pub fn agent_dir(&self) -> PathBuf {
        self.root.join("agent")
    }

    /// workspaced's directory: `<root>/files`.
    pub fn files_dir(&self) -> PathBuf {
        self.root.join("files")
    }

    /// gatewayd's directory: `<root>/gateway`.
    pub fn gateway_dir(&self) -> PathBuf {
        self.root.join("gateway")
    }

    /// The receipts of one project: `<root>/files/receipts/<root_key>`.
    pub fn receipts_dir(&self, project_root: &Path) -> PathBuf {
        self.files_dir()
            .join("receipts")
            .join(root_key(project_root))
    }

    /// The per-project lock file: `<root>/files/locks/<root_key>.lock`.
    pub fn lock_path(&self, project_root: &Path) -> PathBuf {
        self.files_dir()
            .join("locks")
            .join(format!("{}.lock", root_key(project_root)))
    }
}

/// The key of a project root: sha256 of the path's bytes as given, first 32 hex characters.
///
/// Callers pass the canonical absolute path; this function does not canonicalize, so the same
/// folder reached through a symlink would get another key.
pub fn root_key(project_root: &Path) -> String {
    let digest = Sha256::digest(project_root.as_os_str().as_bytes());
    let mut key = hex::encode(digest);
    key.truncate(32);
    key
}

/// Why a private directory could not be made.
#[derive(Debug, thiserror::Error)]
pub enum LayoutError {
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
    /// Setting the mode failed (usually: the directory belongs to another user).
    #[error("cannot set mode {mode:o} on {path}: {source} (is it owned by another user?)")]
    Chmod {
        path: PathBuf,
        mode: u32,
        source: std::io::Error,
    },
}

/// Creates `dir` (and parents) if missing, then makes sure it is a real directory (not a
/// symlink) with exactly `mode` (permission bits, e.g. `0o700`); error otherwise.
///
/// Missing parents get the default mode (0777 minus umask); only `dir` itself is forced to
/// `mode`. The final check and chmod go through a descriptor opened with `O_NOFOLLOW`, so a
/// symlink swapped in after the check is refused rather than followed.
pub fn ensure_private_dir(dir: &Path, mode: u32) -> Result<(), LayoutError> {
    let mode = mode & 0o7777;
    if let Some(parent) = dir.parent()
        && !parent.as_os_str().is_empty()
    {
        std::fs::create_dir_all(parent).map_err(|source| LayoutError::Create {
            path: parent.to_path_buf(),
            source,
        })?;
    }
    match std::fs::DirBuilder::new().mode(mode).create(dir) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(source) => {
            return Err(LayoutError::Create {
                path: dir.to_path_buf(),
                source,
            });
        }
    }
    // lstat first only to give a precise error; the descriptor below is what we trust.
    let meta = std::fs::symlink_metadata(dir).map_err(|source| LayoutError::Open {
        path: dir.to_path_buf(),
        source,
    })?;
    if meta.file_type().is_symlink() {
        return Err(LayoutError::Symlink {
            path: dir.to_path_buf(),
        });
    }
    if !meta.is_dir() {
        return Err(LayoutError::NotDirectory {
            path: dir.to_path_buf(),
        });
    }
    let fd = rustix::fs::open(
        dir,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(|errno| match errno {
        rustix::io::Errno::LOOP => LayoutError::Symlink {
            path: dir.to_path_buf(),
        },
        rustix::io::Errno::NOTDIR => LayoutError::NotDirectory {
            path: dir.to_path_buf(),
        },
        errno => LayoutError::Open {
            path: dir.to_path_buf(),
            source: errno.into(),
        },
    })?;
    let stat = rustix::fs::fstat(&fd).map_err(|errno| LayoutError::Open {
        path: dir.to_path_buf(),
        source: errno.into(),
    })?;
    if stat.st_mode & 0o7777 != mode {
        rustix::fs::fchmod(&fd, Mode::from_raw_mode(mode)).map_err(|errno| LayoutError::Chmod {
            path: dir.to_path_buf(),
            mode,
            source: errno.into(),
        })?;
    }
    // Re-check through the path: what the caller will use must be what we fixed.
    let after = std::fs::symlink_metadata(dir).map_err(|source| LayoutError::Open {
        path: dir.to_path_buf(),
        source,
    })?;
    if after.ino() != stat.st_ino || after.dev() != stat.st_dev {
        return Err(LayoutError::Symlink {
            path: dir.to_path_buf(),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn layout_paths_follow_the_design() {
        let l = StateLayout {
            root: PathBuf::from("/var/lib/agentworks"),
        };
        let key = root_key(Path::new("/srv/project"));
        assert_eq!(l.agent_dir(), Path::new("/var/lib/agentworks/agent"));
        assert_eq!(l.files_dir(), Path::new("/var/lib/agentworks/files"));
        assert_eq!(l.gateway_dir(), Path::new("/var/lib/agentworks/gateway"));
        assert_eq!(
            l.receipts_dir(Path::new("/srv/project")),
            PathBuf::from(format!("/var/lib/agentworks/files/receipts/{key}"))
        );
        assert_eq!(
            l.lock_path(Path::new("/srv/project")),
            PathBuf::from(format!("/var/lib/agentworks/files/locks/{key}.lock"))
        );
    }

    #[test]
    fn root_key_is_stable_and_32_hex() {
        let a = root_key(Path::new("/srv/project"));
        assert_eq!(a, root_key(Path::new("/srv/project")));
        assert_eq!(a.len(), 32);
        assert!(
            a.chars()
                .all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase())
        );
        assert_ne!(a, root_key(Path::new("/srv/project/")));
        // sha256("/srv/project"), computed independently with sha256sum.
        assert_eq!(a, "4f3f91f6b0b47e3bebd44da0bf365177");
    }

    #[test]
    fn ensure_private_dir_creates_and_fixes_mode() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("a/b/files");
        ensure_private_dir(&dir, 0o700).unwrap();
        let mode = std::fs::metadata(&dir).unwrap().permissions().mode() & 0o7777;
        assert_eq!(mode, 0o700);

        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
        ensure_private_dir(&dir, 0o700).unwrap();
        let mode = std::fs::metadata(&dir).unwrap().permissions().mode() & 0o7777;
        assert_eq!(mode, 0o700);
        // Idempotent.
        ensure_private_dir(&dir, 0o700).unwrap();
    }

    #[test]
    fn ensure_private_dir_refuses_a_symlink() {
        let tmp = tempfile::tempdir().unwrap();
        let target = tmp.path().join("target");
        std::fs::create_dir(&target).unwrap();
        std::fs::set_permissions(&target, std::fs::Permissions::from_mode(0o755)).unwrap();
        let link = tmp.path().join("link");
        std::os::unix::fs::symlink(&target, &link).unwrap();
        let err = ensure_private_dir(&link, 0o700).unwrap_err();
        assert!(matches!(err, LayoutError::Symlink { .. }), "{err}");
        // The target was not touched.
        let mode = std::fs::metadata(&target).unwrap().permissions().mode() & 0o7777;
        assert_eq!(mode, 0o755);
    }

    #[test]
    fn ensure_private_dir_refuses_a_file() {
        let tmp = tempfile::tempdir().unwrap();
        let file = tmp.path().join("file");
        std::fs::write(&file, b"x").unwrap();
        let err = ensure_private_dir(&file, 0o700).unwrap_err();
        assert!(matches!(err, LayoutError::NotDirectory { .. }), "{err}");
    }
}
