//! The shared state root's layout: which daemon's data lives where.
//!
//! Owns the path arithmetic (`agent/`, `files/receipts/<root_key>/`, `files/locks/<root_key>.lock`,
//! `gateway/`), the project root key, and a daemon's private directory (the fd-based mechanism
//! is agentworks-fs's; this keeps the state root's parents at the default mode).
//!
//! Must never open or create another daemon's directory on its behalf: each daemon calls
//! [`ensure_private_dir`] only for its own subtree, and the per-daemon users keep them apart.

use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use agentworks_fs::private_dir::{self, MissingParents, PrivateDirError};
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

    /// runnerd's directory: `<root>/runner` (its private runtimes under `runtimes/`).
    pub fn runner_dir(&self) -> PathBuf {
        self.root.join("runner")
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

/// Why a daemon's private directory could not be made.
#[derive(Debug, thiserror::Error)]
pub enum LayoutError {
    /// Creating it, refusing a symlink or a non-directory in its place, or setting its mode.
    #[error(transparent)]
    PrivateDir(#[from] PrivateDirError),
}

/// Creates `dir` (and parents) if missing, then makes sure it is a real directory (not a
/// symlink) with exactly `mode` (permission bits, e.g. `0o700`); error otherwise.
///
/// Missing parents get the default mode (0777 minus umask): the state root must stay
/// traversable by the other daemons' users; only `dir` itself is forced to `mode`, through a
/// descriptor opened with `O_NOFOLLOW` ([`agentworks_fs::private_dir::ensure_private_dir`]).
pub fn ensure_private_dir(dir: &Path, mode: u32) -> Result<(), LayoutError> {
    Ok(private_dir::ensure_private_dir(
        dir,
        mode,
        MissingParents::DefaultMode,
    )?)
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

    /// The mechanism's own tests are in agentworks-fs; this checks the daemons' defaults
    /// (parents left at the default mode) and that its refusals come through unchanged.
    #[test]
    fn ensure_private_dir_keeps_parents_default_and_refuses_a_symlink() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("state");
        let dir = root.join("files");
        ensure_private_dir(&dir, 0o700).unwrap();
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o7777;
        assert_eq!(mode(&dir), 0o700);
        let umask_default = {
            let probe = tmp.path().join("probe");
            std::fs::create_dir(&probe).unwrap();
            mode(&probe)
        };
        assert_eq!(mode(&root), umask_default);

        let link = tmp.path().join("link");
        std::os::unix::fs::symlink(&dir, &link).unwrap();
        let err = ensure_private_dir(&link, 0o700).unwrap_err();
        assert!(
            matches!(
                err,
                LayoutError::PrivateDir(PrivateDirError::Symlink { .. })
            ),
            "{err}"
        );
        assert!(err.to_string().contains("is a symlink; refusing"), "{err}");
    }
}
