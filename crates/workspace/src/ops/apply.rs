//! The steps of a change that touch the tree: stage the new content beside the target (with
//! the target's ownership and ACLs, fsynced), re-check that the target is still what was
//! checked, rename or unlink, then fsync the folders.
//!
//! Every error before the rename or unlink means nothing reached the target; it must never
//! rename over a file that changed since its revision was checked.

use super::change::{Action, Planned};
use super::{TEMP_PREFIX, Workspace, failpoint_io, fsync_fd, revision_on_disk};
use crate::acl;
use crate::error::WorkspaceError;
use agentworks_core::guard::RelPath;
use agentworks_core::revision::Revision;
use agentworks_fs::confine::ConfineError;
use agentworks_fs::failpoint::{self, Failpoint};
use agentworks_fs::staged::StagedFile;
use rustix::fs::{AtFlags, RenameFlags, Stat};
use rustix::io::Errno;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

fn same_identity(a: &Stat, b: &Stat) -> bool {
    a.st_dev == b.st_dev && a.st_ino == b.st_ino
}

fn unchanged_since(a: &Stat, b: &Stat) -> bool {
    same_identity(a, b)
        && a.st_size == b.st_size
        && a.st_mtime == b.st_mtime
        && a.st_mtime_nsec == b.st_mtime_nsec
        && a.st_ctime == b.st_ctime
        && a.st_ctime_nsec == b.st_ctime_nsec
}

impl Workspace {
    pub(super) fn apply(&self, planned: &Planned) -> Result<(), WorkspaceError> {
        let path = &planned.path;
        match &planned.action {
            Action::Replace {
                parent,
                name,
                content,
                existing,
            } => self.replace(
                parent.as_fd(),
                name,
                content,
                existing.as_ref(),
                &planned.previous,
                path,
            ),
            Action::Delete { parent, name, stat } => {
                self.recheck(parent.as_fd(), name, stat, &planned.previous, path)?;
                failpoint_io(Failpoint::BeforeUnlink, path)?;
                rustix::fs::unlinkat(parent, name.as_str(), AtFlags::empty())
                    .map_err(|e| WorkspaceError::io("delete", path, e))
            }
            Action::Move {
                from_parent,
                from_name,
                stat,
                to_parent,
                to_name,
            } => {
                let to = planned.to_path.as_ref().unwrap_or(path);
                self.recheck(
                    from_parent.as_fd(),
                    from_name,
                    stat,
                    &planned.previous,
                    path,
                )?;
                failpoint_io(Failpoint::BeforeRename, path)?;
                match rustix::fs::renameat_with(
                    from_parent,
                    from_name.as_str(),
                    to_parent,
                    to_name.as_str(),
                    RenameFlags::NOREPLACE,
                ) {
                    Ok(()) => {}
                    Err(Errno::EXIST) => {
                        return Err(WorkspaceError::RevisionConflict {
                            path: to.to_string(),
                            expected: Revision::Missing,
                            current: revision_on_disk(
                                to_parent.as_fd(),
                                &RelPath::parse(to_name)?,
                            )?,
                        });
                    }
                    Err(e) => return Err(WorkspaceError::io("move", path, e)),
                }
                Ok(())
            }
        }
    }

    /// Before replacing or removing `name`, make sure it is still the inode whose revision we
    /// checked and that nobody wrote to it since (an editor outside agentworks takes no lock).
    pub(super) fn recheck(
        &self,
        parent: BorrowedFd<'_>,
        name: &str,
        checked: &Stat,
        expected: &Revision,
        path: &RelPath,
    ) -> Result<(), WorkspaceError> {
        match rustix::fs::statat(parent, name, AtFlags::SYMLINK_NOFOLLOW) {
            Ok(now) if unchanged_since(&now, checked) => Ok(()),
            _ => Err(WorkspaceError::RevisionConflict {
                path: path.to_string(),
                expected: expected.clone(),
                current: revision_on_disk(parent, &RelPath::parse(name)?)?,
            }),
        }
    }

    /// Stage `content` beside the target, give it the target's ownership and ACLs, fsync it,
    /// re-check the target and rename over it (the folder fsync is the caller's next step).
    pub(super) fn replace(
        &self,
        parent: BorrowedFd<'_>,
        name: &str,
        content: &[u8],
        existing: Option<&(OwnedFd, Stat)>,
        previous: &Revision,
        path: &RelPath,
    ) -> Result<(), WorkspaceError> {
        let staged = self.stage(parent, content, existing, path)?;
        failpoint::hit(Failpoint::AfterStage);
        self.rename_staged(staged, parent, name, existing, previous, path)
    }

    /// The first half of [`Workspace::replace`]: the new content in a synced temp file beside
    /// the target, with the target's ownership and ACLs. Touches nothing the caller can see; an
    /// error (or dropping the result) unlinks the temp file.
    pub(super) fn stage<'p>(
        &self,
        parent: BorrowedFd<'p>,
        content: &[u8],
        existing: Option<&(OwnedFd, Stat)>,
        path: &RelPath,
    ) -> Result<StagedFile<'p>, WorkspaceError> {
        let staged = self.stage_unsynced(parent, content, existing, path)?;
        fsync_fd(staged.fd(), "fsync staged file", path)?;
        Ok(staged)
    }

    /// [`Workspace::stage`] but the sync: the temp file written and its ownership and ACLs
    /// set, so a batch can stage all its files before it syncs each.
    pub(super) fn stage_unsynced<'p>(
        &self,
        parent: BorrowedFd<'p>,
        content: &[u8],
        existing: Option<&(OwnedFd, Stat)>,
        path: &RelPath,
    ) -> Result<StagedFile<'p>, WorkspaceError> {
        // 0o666: the kernel applies the umask, or the folder's default ACL, as for any new file.
        let mut staged = StagedFile::create(parent, TEMP_PREFIX, 0o666).map_err(|e| match e {
            // The folder was removed after we opened it.
            Errno::NOENT => ConfineError::NotFound {
                path: path.to_string(),
            }
            .into(),
            other => WorkspaceError::io("stage", path, other),
        })?;
        // Every error below drops `staged`, which unlinks the temp file.
        staged
            .write_all(content)
            .map_err(|e| WorkspaceError::io("stage", path, e))?;
        if let Some((original, _)) = existing {
            // Owner/group, then ACL, then mode, all on fds; refuse rather than degrade.
            let ownership = acl::read_ownership(original.as_fd())?;
            acl::carry_over(staged.fd(), &ownership)?;
        }
        Ok(staged)
    }

    /// The second half of [`Workspace::replace`]: re-check the target and rename the staged
    /// file over it (or to it, when it must not exist yet).
    pub(super) fn rename_staged(
        &self,
        staged: StagedFile<'_>,
        parent: BorrowedFd<'_>,
        name: &str,
        existing: Option<&(OwnedFd, Stat)>,
        previous: &Revision,
        path: &RelPath,
    ) -> Result<(), WorkspaceError> {
        failpoint_io(Failpoint::BeforeRename, path)?;
        match existing {
            Some((_, checked)) => {
                self.recheck(parent, name, checked, previous, path)?;
                staged
                    .rename_to(name, false)
                    .map_err(|e| WorkspaceError::io("replace", path, e))
            }
            None => match staged.rename_to(name, true) {
                Ok(()) => Ok(()),
                Err(Errno::EXIST) => Err(WorkspaceError::RevisionConflict {
                    path: path.to_string(),
                    expected: Revision::Missing,
                    current: revision_on_disk(parent, &RelPath::parse(name)?)?,
                }),
                // The folder was removed after we opened it.
                Err(Errno::NOENT) => Err(ConfineError::NotFound {
                    path: path.to_string(),
                }
                .into()),
                Err(e) => Err(WorkspaceError::io("create", path, e)),
            },
        }
    }

    /// After the rename or unlink reached the target: make the folder entries durable.
    pub(super) fn sync_after(&self, planned: &Planned) -> Result<(), WorkspaceError> {
        let path = &planned.path;
        failpoint_io(Failpoint::AfterRename, path)?;
        match &planned.action {
            Action::Replace { parent, .. } | Action::Delete { parent, .. } => {
                fsync_fd(parent.as_fd(), "fsync folder", path)?;
            }
            Action::Move {
                from_parent,
                to_parent,
                ..
            } => {
                fsync_fd(to_parent.as_fd(), "fsync folder", path)?;
                fsync_fd(from_parent.as_fd(), "fsync folder", path)?;
            }
        }
        failpoint::hit(Failpoint::AfterDirFsync);
        Ok(())
    }
}
