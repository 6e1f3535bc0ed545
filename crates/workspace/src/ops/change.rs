//! The change requests (write, patch, move, delete, restore): each validates its request,
//! hashes its payload for the idempotency check, and hands [`Workspace::change`] a plan that
//! reads the current state under the lock and says what the change will do.
//!
//! A plan must never modify anything: it runs before the prepared receipt exists.

use super::{Current, Workspace, lock_poisoned};
use crate::error::WorkspaceError;
use crate::receipts::{Operation, ReceiptState};
use agentworks_contract::workspaced::*;
use agentworks_core::guard::RelPath;
use agentworks_core::revision::Revision;
use agentworks_fs::confine::ConfineError;
use rustix::fs::Stat;
use sha2::{Digest, Sha256};
use std::os::fd::OwnedFd;
use std::sync::Arc;

/// What a change will do once its receipt is prepared.
pub(super) enum Action {
    Replace {
        parent: OwnedFd,
        name: String,
        content: Vec<u8>,
        existing: Option<(OwnedFd, Stat)>,
    },
    Move {
        from_parent: OwnedFd,
        from_name: String,
        stat: Stat,
        to_parent: OwnedFd,
        to_name: String,
    },
    Delete {
        parent: OwnedFd,
        name: String,
        stat: Stat,
    },
}

/// A change, planned under the lock: the paths, the revisions before and after, the
/// before-content for the receipt, and the action.
pub(super) struct Planned {
    pub(super) path: RelPath,
    pub(super) to_path: Option<RelPath>,
    pub(super) previous: Revision,
    pub(super) resulting: Revision,
    pub(super) before: Option<Vec<u8>>,
    pub(super) action: Action,
}

pub(super) fn parse_expected(raw: &str) -> Result<Revision, WorkspaceError> {
    Revision::parse(raw).map_err(|e| WorkspaceError::InvalidRequest(e.to_string()))
}

pub(super) fn payload_hash(parts: &[&str]) -> String {
    let mut hasher = Sha256::new();
    for part in parts {
        hasher.update((part.len() as u64).to_le_bytes());
        hasher.update(part.as_bytes());
    }
    hex::encode(hasher.finalize())
}

impl Workspace {
    pub async fn write(
        self: &Arc<Self>,
        req: &WriteRequest,
    ) -> Result<ChangeResponse, WorkspaceError> {
        let path = RelPath::parse(&req.path)?;
        req.context.guard.resolve()?.check_write(&path)?;
        let expected = parse_expected(&req.expected_revision)?;
        self.check_size(&path, req.content.len())?;
        let hash = payload_hash(&["write", path.as_str(), &req.expected_revision, &req.content]);
        let content = req.content.as_bytes().to_vec();
        let planned_path = path.clone();
        self.change_batched(
            &req.context,
            Operation::Write,
            &req.request_id,
            hash,
            &path,
            Box::new(move |ws, project| {
                let path = planned_path;
                let current = ws.current(project, &path, expected == Revision::Missing)?;
                ws.check_expected(&path, &expected, &current.revision)?;
                Ok(ws.plan_replace(path, current, content))
            }),
        )
        .await
    }

    pub async fn patch(
        self: &Arc<Self>,
        req: &PatchRequest,
    ) -> Result<ChangeResponse, WorkspaceError> {
        let path = RelPath::parse(&req.path)?;
        req.context.guard.resolve()?.check_write(&path)?;
        let expected = parse_expected(&req.expected_revision)?;
        self.check_size(&path, req.diff.len())?;
        let hash = payload_hash(&["patch", path.as_str(), &req.expected_revision, &req.diff]);
        let diff = req.diff.clone();
        let planned_path = path.clone();
        self.change_batched(
            &req.context,
            Operation::Patch,
            &req.request_id,
            hash,
            &path,
            Box::new(move |ws, project| {
                let path = planned_path;
                let current = ws.current(project, &path, expected == Revision::Missing)?;
                ws.check_expected(&path, &expected, &current.revision)?;
                let base = match &current.content {
                    Some(bytes) => {
                        std::str::from_utf8(bytes).map_err(|_| WorkspaceError::NotText {
                            path: path.to_string(),
                        })?
                    }
                    None => "",
                };
                let patched = agentworks_core::patch::apply_strict(base, &diff)?;
                ws.check_size(&path, patched.len())?;
                Ok(ws.plan_replace(path, current, patched.into_bytes()))
            }),
        )
        .await
    }

    pub fn move_file(&self, req: &MoveRequest) -> Result<ChangeResponse, WorkspaceError> {
        let from = RelPath::parse(&req.path)?;
        let to = RelPath::parse(&req.to_path)?;
        let guard = req.context.guard.resolve()?;
        guard.check_write(&from)?;
        guard.check_write(&to)?;
        let expected = parse_expected(&req.expected_revision)?;
        if expected == Revision::Missing || from == to {
            return Err(WorkspaceError::InvalidRequest(
                "move needs the source's current revision and a different destination".into(),
            ));
        }
        let hash = payload_hash(&["move", from.as_str(), to.as_str(), &req.expected_revision]);
        self.change(
            &req.context,
            Operation::Move,
            &req.request_id,
            hash,
            |project| {
                let source = self.current(project, &from, false)?;
                self.check_expected(&from, &expected, &source.revision)?;
                let dest = self.current(project, &to, true)?;
                self.check_expected(&to, &Revision::Missing, &dest.revision)?;
                let Some((_, stat)) = source.file else {
                    return Err(ConfineError::NotFound {
                        path: from.to_string(),
                    }
                    .into());
                };
                Ok(Planned {
                    path: from.clone(),
                    to_path: Some(to.clone()),
                    previous: source.revision.clone(),
                    resulting: source.revision,
                    before: None,
                    action: Action::Move {
                        from_parent: source.parent,
                        from_name: source.name,
                        stat,
                        to_parent: dest.parent,
                        to_name: dest.name,
                    },
                })
            },
        )
    }

    pub fn delete(&self, req: &DeleteRequest) -> Result<ChangeResponse, WorkspaceError> {
        let path = RelPath::parse(&req.path)?;
        req.context.guard.resolve()?.check_write(&path)?;
        let expected = parse_expected(&req.expected_revision)?;
        if expected == Revision::Missing {
            return Err(WorkspaceError::InvalidRequest(
                "delete needs the file's current revision, not \"missing\"".into(),
            ));
        }
        let hash = payload_hash(&["delete", path.as_str(), &req.expected_revision]);
        self.change(
            &req.context,
            Operation::Delete,
            &req.request_id,
            hash,
            |project| {
                let current = self.current(project, &path, false)?;
                self.check_expected(&path, &expected, &current.revision)?;
                self.plan_delete(path.clone(), current)
            },
        )
    }

    pub fn restore(&self, req: &RestoreRequest) -> Result<ChangeResponse, WorkspaceError> {
        let guard = req.context.guard.resolve()?;
        let expected = parse_expected(&req.expected_revision)?;
        let hash = payload_hash(&["restore", &req.receipt_id, &req.expected_revision]);
        self.change(&req.context, Operation::Restore, &req.request_id, hash, |project| {
            let store = self.store(project)?;
            let source = lock_poisoned(&store)
                .by_receipt_id(&req.receipt_id)?
                .ok_or_else(|| WorkspaceError::ReceiptNotFound {
                    request_id: req.receipt_id.clone(),
                })?;
            if source.state != ReceiptState::Applied || source.operation == Operation::Move {
                return Err(WorkspaceError::CannotRestore(format!(
                    "receipt {} is a {} in state {:?}; only applied writes, patches, edits, deletes and restores can be restored",
                    source.receipt_id,
                    source.operation.as_str(),
                    source.state
                )));
            }
            if source.before_truncated {
                return Err(WorkspaceError::CannotRestore(format!(
                    "receipt {} kept only the first 128 KiB of the file; it cannot be restored from history",
                    source.receipt_id
                )));
            }
            let path = RelPath::parse(&source.path)?;
            guard.check_write(&path)?;
            let current = self.current(project, &path, true)?;
            self.check_expected(&path, &expected, &current.revision)?;
            match (&source.previous_revision, source.before_content) {
                (Revision::Missing, _) => {
                    if current.revision == Revision::Missing {
                        return Err(WorkspaceError::CannotRestore(format!("{path} already does not exist")));
                    }
                    self.plan_delete(path, current)
                }
                (previous, Some(before)) if Revision::of(&before) == *previous => {
                    Ok(self.plan_replace(path, current, before))
                }
                _ => Err(WorkspaceError::CannotRestore(format!(
                    "receipt {} holds no complete before-content",
                    source.receipt_id
                ))),
            }
        })
    }

    pub(super) fn check_size(&self, path: &RelPath, len: usize) -> Result<(), WorkspaceError> {
        if len as u64 > self.limits.max_file_bytes {
            return Err(WorkspaceError::TooLarge {
                path: path.to_string(),
                size: len as u64,
                limit: self.limits.max_file_bytes,
            });
        }
        Ok(())
    }

    pub(super) fn check_expected(
        &self,
        path: &RelPath,
        expected: &Revision,
        current: &Revision,
    ) -> Result<(), WorkspaceError> {
        if expected != current {
            return Err(WorkspaceError::RevisionConflict {
                path: path.to_string(),
                expected: expected.clone(),
                current: current.clone(),
            });
        }
        Ok(())
    }

    pub(super) fn plan_replace(
        &self,
        path: RelPath,
        current: Current,
        content: Vec<u8>,
    ) -> Planned {
        Planned {
            path,
            to_path: None,
            previous: current.revision,
            resulting: Revision::of(&content),
            before: current.content,
            action: Action::Replace {
                parent: current.parent,
                name: current.name,
                content,
                existing: current.file,
            },
        }
    }

    pub(super) fn plan_delete(
        &self,
        path: RelPath,
        current: Current,
    ) -> Result<Planned, WorkspaceError> {
        let Some((_, stat)) = current.file else {
            return Err(ConfineError::NotFound {
                path: path.to_string(),
            }
            .into());
        };
        Ok(Planned {
            path,
            to_path: None,
            previous: current.revision,
            resulting: Revision::Missing,
            before: current.content,
            action: Action::Delete {
                parent: current.parent,
                name: current.name,
                stat,
            },
        })
    }
}
