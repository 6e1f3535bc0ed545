//! The macOS launcher's check of the pinned folders: its profile names paths, so a folder
//! pinned at connect (its descriptor inherited) is granted only while its path still names that
//! very directory. (The Linux launcher grants through the descriptors themselves; its checks
//! are in `plan.rs`.)
//!
//! Owns: [`check_pinned`], compiled on macOS and, for its tests, everywhere.
//! Must never: accept a descriptor that is not the recorded directory, a path that is a
//! symlink, or a path that names another directory.

use std::io;
use std::os::unix::fs::MetadataExt;

use crate::{SandboxError, SandboxPolicy};

/// Every pinned descriptor is the directory recorded at connect, and its path still
/// names that directory (no symlink at its end).
pub(super) fn check_pinned(policy: &SandboxPolicy) -> Result<(), SandboxError> {
    for grant in &policy.pinned {
        let pinned = |reason: String| SandboxError::Pinned {
            fd: grant.fd,
            path: grant.path.clone(),
            reason,
        };
        let fd_stat = nix::sys::stat::fstat(borrow_open_fd(grant.fd)?)
            .map_err(|e| pinned(format!("the descriptor cannot be read: {e}")))?;
        // dev_t is i32 on macOS; the caller recorded it with the same cast.
        #[allow(clippy::unnecessary_cast)]
        let (dev, ino) = (fd_stat.st_dev as u64, fd_stat.st_ino as u64);
        if (dev, ino) != (grant.dev, grant.ino) {
            return Err(pinned("the descriptor is another directory".to_owned()));
        }
        let at_path = std::fs::symlink_metadata(&grant.path)
            .map_err(|e| pinned(format!("its path cannot be read: {e}")))?;
        if at_path.file_type().is_symlink() {
            return Err(pinned("it is a symlink now".to_owned()));
        }
        if (at_path.dev(), at_path.ino()) != (dev, ino) {
            return Err(pinned("another directory is there now".to_owned()));
        }
    }
    Ok(())
}

/// A borrowed descriptor for a number the policy names, after checking it is open.
fn borrow_open_fd(fd: i32) -> Result<std::os::fd::BorrowedFd<'static>, SandboxError> {
    // SAFETY: fcntl(F_GETFD) only reads the descriptor's flags; it fails with EBADF for a
    // number that is not open, and then we do not borrow it.
    if unsafe { libc::fcntl(fd, libc::F_GETFD) } == -1 {
        return Err(SandboxError::Setup {
            what: "use a pinned descriptor",
            source: io::Error::last_os_error(),
        });
    }
    // SAFETY: the descriptor is open (checked above) and the launcher never closes it before
    // exec: it lives for the rest of this process.
    Ok(unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) })
}

#[cfg(test)]
mod tests {
    use std::os::fd::{AsRawFd, OwnedFd};
    use std::path::Path;

    use super::*;
    use crate::limits::CommandLimits;
    use crate::{PinnedAccess, PinnedGrant};

    fn pin(path: &Path) -> (OwnedFd, PinnedGrant) {
        let fd: OwnedFd = std::fs::File::open(path).expect("open").into();
        let meta = std::fs::metadata(path).expect("meta");
        let grant = PinnedGrant {
            fd: fd.as_raw_fd(),
            dev: meta.dev(),
            ino: meta.ino(),
            path: path.to_owned(),
            access: PinnedAccess::ReadWrite,
        };
        (fd, grant)
    }

    fn policy(grant: PinnedGrant) -> SandboxPolicy {
        SandboxPolicy {
            pinned: vec![grant],
            read_write: vec![],
            read_only: vec![],
            blocked: vec![],
            read_only_within: vec![],
            denied: vec![],
            read_only_if_present: vec![],
            scratch: "/nonexistent/scratch".into(),
            cwd: "/".into(),
            limits: CommandLimits::default(),
            overmount_exclusions: false,
            private_terminals: false,
        }
    }

    fn refusal(policy: &SandboxPolicy) -> String {
        match check_pinned(policy) {
            Err(SandboxError::Pinned { reason, .. }) => reason,
            other => panic!("not refused as pinned: {other:?}"),
        }
    }

    #[test]
    fn a_pinned_folder_is_granted_only_while_its_path_names_it() {
        let dir = tempfile::tempdir().expect("tempdir");
        let shared = dir.path().join("shared");
        std::fs::create_dir(&shared).expect("mkdir");
        let (_fd, grant) = pin(&shared);
        check_pinned(&policy(grant.clone())).expect("the pinned folder itself");

        // Moved away, another folder in its place.
        std::fs::rename(&shared, dir.path().join("moved")).expect("rename");
        std::fs::create_dir(&shared).expect("mkdir");
        assert_eq!(
            refusal(&policy(grant.clone())),
            "another directory is there now"
        );

        // A symlink in its place, even to the pinned folder itself.
        std::fs::remove_dir(&shared).expect("rmdir");
        std::os::unix::fs::symlink(dir.path().join("moved"), &shared).expect("symlink");
        assert_eq!(refusal(&policy(grant.clone())), "it is a symlink now");

        // A descriptor that is not the recorded directory.
        let mut other = grant;
        other.ino += 1;
        std::fs::remove_file(&shared).expect("rm");
        std::fs::rename(dir.path().join("moved"), &shared).expect("rename back");
        assert_eq!(
            refusal(&policy(other)),
            "the descriptor is another directory"
        );
    }

    #[test]
    fn a_descriptor_that_is_not_open_is_refused() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (fd, grant) = pin(dir.path());
        drop(fd);
        assert!(matches!(
            check_pinned(&policy(grant)),
            Err(SandboxError::Setup { .. })
        ));
    }
}
