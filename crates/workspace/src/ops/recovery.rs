//! Deciding interrupted changes: a receipt left *prepared* is compared with what the disk holds
//! now and marked applied, not applied or uncertain, at start for every project ([`Workspace::recover`],
//! after the walk that removes staged files and syncs every folder), on request by request id
//! ([`Workspace::receipt`]), and before a change of the same path is planned
//! ([`Workspace::decide_prepared_on`]).
//!
//! Before it reads a path it syncs the path's folder, so what it decides from is durable: a
//! change whose process died between its rename and its folder's sync is visible but would
//! be undone by a power cut.
//!
//! A receipt is left prepared while workspaced runs on when its change's folder sync or its
//! applied mark failed after the rename (the caller was told `uncertain`). It must be decided
//! before another change of its path: that change could put the previous content back (then
//! a later reconcile would record `not_applied` for a change that did reach the file, and a
//! caller told so sends it again) or write the same content (`applied` for one that did not).
//! What cannot be decided then refuses the new change.
//!
//! It must never change a document: it reads the tree (and syncs its folders) and writes
//! only receipts.

use super::pipeline::audit;
use super::sweep::sweep_and_sync;
use super::{Project, Workspace, fsync_fd, lock_poisoned, revision_on_disk, validate_request_id};
use crate::error::WorkspaceError;
use crate::receipts::{Operation, Receipt, ReceiptState, ReceiptStore};
use agentworks_contract::workspaced::*;
use agentworks_core::guard::RelPath;
use agentworks_core::revision::Revision;
use agentworks_daemon::audit;
use agentworks_fs::confine::{self, ConfineError};
use std::os::fd::AsFd;
use std::sync::Mutex;

/// What start-up recovery found.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct RecoveryReport {
    pub temp_files_removed: usize,
    /// Folders synced by the walk (see `sweep.rs`), the documents root included.
    pub folders_synced: usize,
    pub applied: usize,
    pub not_applied: usize,
    pub uncertain: usize,
}

/// fsync the folder that holds `path` in `project`, if it exists (a path the rules now refuse
/// is never opened: nothing to sync, its receipt is decided `uncertain`).
fn sync_folder_of(project: &Project, path: &str) -> Result<(), WorkspaceError> {
    let Ok(path) = RelPath::parse(path) else {
        return Ok(());
    };
    match confine::open_parent(project.root.as_fd(), &path, false) {
        Ok((folder, _)) => fsync_fd(folder.as_fd(), "fsync folder", &path),
        Err(ConfineError::NotFound { .. }) | Err(ConfineError::NotADirectory { .. }) => Ok(()),
        Err(e) => Err(e.into()),
    }
}

impl Workspace {
    /// Decide a prepared receipt from what is on disk and record the decision. `Ok(false)`
    /// when its folder cannot be synced: the receipt stays prepared (answered `uncertain`).
    pub(super) fn reconcile(
        &self,
        project: &Project,
        store: &Mutex<ReceiptStore>,
        receipt: &mut Receipt,
    ) -> Result<bool, WorkspaceError> {
        // What a path holds now; `None` for a file that has gained a second link since: it is
        // not read (its other name may be a file outside the project), so the receipt stays
        // uncertain rather than being decided from it. `None` too for a path recorded before
        // a rule refused it (a control character): it is never opened again.
        let on_disk = |path: &str| -> Result<Option<Revision>, WorkspaceError> {
            let Ok(path) = RelPath::parse(path) else {
                return Ok(None);
            };
            match revision_on_disk(project.root.as_fd(), &path) {
                Ok(revision) => Ok(Some(revision)),
                Err(WorkspaceError::Confine(ConfineError::HardLink { .. })) => Ok(None),
                Err(e) => Err(e),
            }
        };
        // What the disk shows is not yet durable when the change's process died between its
        // rename (or unlink) and its folder's sync: the new entry is seen now and lost at a
        // power cut. Deciding from it would record `applied` for a change that a cut then
        // undoes. So the folders are synced first, and only what they hold is decided; one
        // that cannot be synced leaves the receipt prepared, answered `uncertain` for now.
        let mut synced = sync_folder_of(project, &receipt.path);
        if let (Ok(()), Some(to)) = (&synced, &receipt.to_path) {
            synced = sync_folder_of(project, to);
        }
        if let Err(error) = synced {
            tracing::warn!(receipt = %receipt.receipt_id, %error, "cannot sync the folder of an interrupted change; it stays prepared");
            receipt.state = ReceiptState::Uncertain;
            return Ok(false);
        }
        let at_path = on_disk(&receipt.path)?;
        let state = match (&receipt.to_path, at_path) {
            (_, None) => ReceiptState::Uncertain,
            (Some(to), Some(at_path)) => match on_disk(to)? {
                Some(at_to)
                    if at_path == Revision::Missing && at_to == receipt.resulting_revision =>
                {
                    ReceiptState::Applied
                }
                Some(at_to)
                    if at_path == receipt.previous_revision && at_to == Revision::Missing =>
                {
                    ReceiptState::NotApplied
                }
                _ => ReceiptState::Uncertain,
            },
            (None, Some(at_path)) if at_path == receipt.resulting_revision => ReceiptState::Applied,
            (None, Some(at_path)) if at_path == receipt.previous_revision => {
                ReceiptState::NotApplied
            }
            (None, Some(_)) => ReceiptState::Uncertain,
        };
        receipt.updated_at_ms = lock_poisoned(store).set_state(&receipt.receipt_id, state)?;
        receipt.state = state;
        tracing::info!(
            target: audit::TARGET,
            message_id = audit::RECEIPT_RECONCILED,
            agentworks_event = "receipt_reconciled",
            agentworks_user_id = %receipt.user_id,
            agentworks_user_name = %receipt.user_name,
            agentworks_project = %receipt.project,
            agentworks_path = %receipt.path,
            agentworks_request_id = %receipt.request_id,
            agentworks_receipt_id = %receipt.receipt_id,
            agentworks_state = ?state,
            "reconciled an interrupted change"
        );
        if state == ReceiptState::Applied {
            audit(receipt);
        }
        Ok(true)
    }

    /// Decide every receipt of `paths` (as source or destination) still prepared, before a
    /// change of them is planned (see the module doc). One indexed query when there is none,
    /// which is nearly always. A receipt that cannot be decided now refuses the change.
    pub(super) fn decide_prepared_on(
        &self,
        project: &Project,
        store: &Mutex<ReceiptStore>,
        paths: &[&RelPath],
    ) -> Result<(), WorkspaceError> {
        for path in paths {
            let prepared = lock_poisoned(store).prepared_on(path.as_str())?;
            for mut receipt in prepared {
                if !self.reconcile(project, store, &mut receipt)? {
                    return Err(WorkspaceError::Undecided {
                        path: path.to_string(),
                        request_id: receipt.request_id,
                        receipt_id: receipt.receipt_id,
                    });
                }
            }
        }
        Ok(())
    }

    /// The caller's receipt for a request id, reconciled if it was left prepared; for a patch
    /// set, every file's receipt, each reconciled on its own (see [`ReceiptAnswer`]).
    pub fn receipt(&self, req: &ReceiptRequest) -> Result<ReceiptAnswer, WorkspaceError> {
        validate_request_id(&req.request_id)?;
        let project = self.project(&req.context.project)?;
        let _lock = self.lock(&project)?;
        let store = self.store(&project)?;
        let mut found =
            lock_poisoned(&store).find_all(&req.context.principal.user_id, &req.request_id)?;
        for receipt in &mut found {
            if receipt.state == ReceiptState::Prepared {
                self.reconcile(&project, &store, receipt)?;
            }
        }
        let Some(first) = found.first() else {
            return Err(WorkspaceError::ReceiptNotFound {
                request_id: req.request_id.clone(),
            });
        };
        if first.operation != Operation::PatchSet {
            return Ok(ReceiptAnswer {
                receipt: first.clone(),
                files: None,
            });
        }
        let mut receipt = first.clone();
        receipt.state = set_state(found.iter().map(|r| r.state));
        Ok(ReceiptAnswer {
            receipt,
            files: Some(found),
        })
    }

    /// Sweep our leftover temp files, sync every folder, and reconcile every prepared
    /// receipt. Runs before READY.
    pub fn recover(&self) -> Result<RecoveryReport, WorkspaceError> {
        let mut report = RecoveryReport::default();
        // The projects' own entries (made by `ensure_project`) first.
        rustix::fs::fsync(&self.documents_fd).map_err(|e| {
            WorkspaceError::io("sync documents root", self.documents_root.display(), e)
        })?;
        report.folders_synced += 1;
        let projects = rustix::fs::Dir::read_from(&self.documents_fd).map_err(|e| {
            WorkspaceError::io("list documents root", self.documents_root.display(), e)
        })?;
        let mut names = Vec::new();
        for entry in projects.flatten() {
            if let Ok(name) = entry.file_name().to_str()
                && !name.starts_with('.')
            {
                names.push(name.to_owned());
            }
        }
        for name in names {
            let Ok(project) = self.project(&name) else {
                continue;
            };
            let _lock = self.lock(&project)?;
            let swept = sweep_and_sync(project.root.as_fd())?;
            report.temp_files_removed += swept.temp_files_removed;
            report.folders_synced += swept.folders_synced;
            if !self
                .layout
                .receipts_dir(&project.root_path)
                .join("receipts.db")
                .exists()
            {
                continue;
            }
            let store = self.store(&project)?;
            let prepared = lock_poisoned(&store).prepared()?;
            for mut receipt in prepared {
                self.reconcile(&project, &store, &mut receipt)?;
                match receipt.state {
                    ReceiptState::Applied => report.applied += 1,
                    ReceiptState::NotApplied => report.not_applied += 1,
                    _ => report.uncertain += 1,
                }
            }
        }
        Ok(report)
    }
}
