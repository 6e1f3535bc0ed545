//! `/v1/patch_set`: a multi-file unified diff (create, modify, delete) under one request id,
//! with one durable receipt per file.
//!
//! The order, all under the project's lock:
//!
//! 1. Parse ([`agentworks_core::patch::parse_patch_set`]: size, file and hunk counts bounded;
//!    renames, quoted paths, a path named twice refused) and name every file: a [`RelPath`]
//!    allowed by the guard's `check_write` (protected, blocked, read-only, traversal), as
//!    `/v1/write` and `/v1/patch` check it; `expected_revisions` by the rule on
//!    [`PatchSetRequest`]; and the set's whole effect ([`agentworks_core::set_effect`]): a
//!    file that one part creates and another needs as a folder is refused here, not found
//!    half way through step 5.
//! 2. Idempotency: receipts under the id replay their recorded (reconciled) outcome when the
//!    payload is the same, else `request_id_reused`.
//! 3. Validate every file before any changes: opened through `confine` (no symlink, no escape,
//!    no second hard link), revision checked, UTF-8, every hunk matching exactly, each result
//!    within `max_file_bytes`, and the contents held for the whole set (each file as read plus
//!    as it will be) within [`SET_CONTENT_FACTOR`] times it. Any failure
//!    is the first file's error (wrapped in [`WorkspaceError::InFile`], naming it) and nothing
//!    has changed: no receipt, no folder, no file. Every earlier change of these files still
//!    prepared is then decided from the disk ([`Workspace::decide_prepared_on`]).
//! 4. Every receipt *prepared*, in one transaction.
//! 5. Each file in the diff's order: stage + carry-over + re-check + rename or unlink (the
//!    single-file change's [`Workspace::apply`]), folder fsync, its receipt *applied*, its audit
//!    event. The folders of a created file are made only now, when its turn comes.
//!
//! If file `k` fails before its rename, it and every later file are marked `not_applied` and
//! the answer is `partially_applied` (or, for the first file, the file's own error: nothing
//! changed). A crash anywhere leaves each receipt prepared or decided; each prepared one is
//! reconciled from the disk on its own (at start, or by `/v1/receipt`), so each file reports
//! applied / not applied / uncertain from what the disk holds, never from a guess about the
//! others. A retry with the same request id never finishes a set: it answers the recorded
//! per-file states (`replayed: true`); the caller re-reads and sends the files still to change
//! under a new request id, exactly as a single-file change is never retried by workspaced.
//!
//! What "from the disk" can know: after a SIGKILL the disk holds exactly what was renamed or
//! unlinked, so a file whose new revision is there is applied; after a power loss a rename
//! whose folder fsync had not completed may be undone, and the file then reports not applied,
//! which is again what the disk holds. A file holding neither revision (changed by someone
//! else since) is `uncertain`.
//!
//! Failpoints (debug builds, `AGENTWORKS_FAILPOINT`), `n` counting files from 1:
//! `patch_set_before_<n>` before file n is staged, `patch_set_renamed_<n>` after its rename and
//! folder fsync but before its receipt is marked applied, `patch_set_applied_<n>` after that;
//! the single-file steps' failpoints fire inside each file's apply too.
//!
//! Must never: change a file before every file of the set is validated and every receipt is
//! durable; follow a symlink or leave the project; apply a file after an earlier one failed.

use super::change::{Planned, parse_expected, payload_hash};
use super::pipeline::{audit, mark_applied};
use super::{Project, Workspace, lock_poisoned, validate_request_id};
use crate::error::WorkspaceError;
use crate::receipts::{
    Operation, Receipt, ReceiptError, ReceiptPart, ReceiptState, ReceiptStore, capped_before,
    new_receipt_id,
};
use agentworks_contract::workspaced::*;
use agentworks_core::guard::{RelPath, ResolvedGuard};
use agentworks_core::patch::{FileChange, PatchError, PatchSetLimits, parse_patch_set};
use agentworks_core::revision::Revision;
use agentworks_core::set_effect::{self, Change, Names};
use agentworks_fs::confine::ConfineError;
use agentworks_fs::failpoint::{self, Failpoint, Hit};
use std::sync::Mutex;

/// Most files one patch set changes.
pub const MAX_PATCH_SET_FILES: usize = 64;
/// Most hunks in one patch set, all files together.
pub const MAX_PATCH_SET_HUNKS: usize = 10_000;
/// The diff is at most this many times `max_file_bytes`.
pub const SET_BYTES_FACTOR: u64 = 4;
/// What a set holds in memory while it is checked and applied, every file's current and new
/// content together, is at most this many times `max_file_bytes` (each file is at most
/// `max_file_bytes` on its own): a short diff naming many large files would otherwise make one
/// request hold up to [`MAX_PATCH_SET_FILES`] × 2 × `max_file_bytes`.
pub const SET_CONTENT_FACTOR: u64 = 8;

/// One file of the request, named and checked against the guard.
struct SetFile {
    path: RelPath,
    change: FileChange,
    text: String,
    added: usize,
    removed: usize,
    expected: Option<Revision>,
}

/// What to do for one file once every receipt is prepared.
enum Step {
    /// Its folder exists: planned on the fds opened while validating.
    Ready(Box<Planned>),
    /// A new file in a folder that does not exist yet: the folder is made at its turn.
    CreateInNewFolder(Vec<u8>),
}

/// One validated file.
struct PlannedFile {
    path: RelPath,
    previous: Revision,
    resulting: Revision,
    before: Option<Vec<u8>>,
    step: Step,
}

fn in_file(index: usize, path: &RelPath) -> impl FnOnce(WorkspaceError) -> WorkspaceError + '_ {
    move |source| WorkspaceError::InFile {
        index,
        path: path.to_string(),
        source: Box::new(source),
    }
}

fn file_answer(receipt: &Receipt, file: &SetFile) -> PatchSetFile {
    PatchSetFile {
        path: receipt.path.clone(),
        action: FileAction::of(&receipt.previous_revision, &receipt.resulting_revision),
        state: receipt.state,
        previous_revision: receipt.previous_revision.clone(),
        revision: match &receipt.resulting_revision {
            Revision::Missing => None,
            other => Some(other.clone()),
        },
        added_lines: file.added,
        removed_lines: file.removed,
        receipt: receipt.clone(),
    }
}

fn answer(
    request_id: &str,
    receipts: &[Receipt],
    files: &[SetFile],
    replayed: bool,
) -> PatchSetResponse {
    PatchSetResponse {
        state: set_state(receipts.iter().map(|r| r.state)),
        replayed,
        request_id: request_id.to_owned(),
        files: receipts
            .iter()
            .zip(files)
            .map(|(receipt, file)| file_answer(receipt, file))
            .collect(),
    }
}

/// Step 1: the files of the diff, named inside the project and allowed by the guard, each
/// with the revision the rule on [`PatchSetRequest`] expects.
fn name_files(
    req: &PatchSetRequest,
    guard: &ResolvedGuard,
    limits: PatchSetLimits,
) -> Result<Vec<SetFile>, WorkspaceError> {
    let parsed = parse_patch_set(&req.diff, limits)?;
    let mut files: Vec<SetFile> = Vec::with_capacity(parsed.len());
    for (index, patch) in parsed.into_iter().enumerate() {
        let path = RelPath::parse(&patch.path).map_err(|e| WorkspaceError::InFile {
            index,
            path: patch.path.clone(),
            source: Box::new(e.into()),
        })?;
        guard
            .check_write(&path)
            .map_err(|e| in_file(index, &path)(e.into()))?;
        if let Some(first) = files.iter().position(|f| f.path == path) {
            return Err(PatchError::DuplicatePath {
                path: path.to_string(),
                first: first + 1,
                second: index + 1,
            }
            .into());
        }
        files.push(SetFile {
            path,
            change: patch.change,
            text: patch.text,
            added: patch.added,
            removed: patch.removed,
            expected: None,
        });
    }
    let changes: Vec<Change<'_>> = files
        .iter()
        .map(|f| match f.change {
            FileChange::Create => Change::Create(&f.path),
            FileChange::Modify => Change::Modify(&f.path),
            FileChange::Delete => Change::Delete(&f.path),
        })
        .collect();
    set_effect::check_set(&changes, Names::Exact).map_err(PatchError::from)?;
    for (raw, revision) in req.expected_revisions.iter().flatten() {
        let named = RelPath::parse(raw).ok();
        let Some(file) = files.iter_mut().find(|f| Some(&f.path) == named.as_ref()) else {
            return Err(WorkspaceError::InvalidRequest(format!(
                "expected_revisions names {raw:?}, which the diff does not change"
            )));
        };
        file.expected = Some(parse_expected(revision)?);
    }
    for (index, file) in files.iter().enumerate() {
        let refused =
            |why: &str| in_file(index, &file.path)(WorkspaceError::InvalidRequest(why.to_owned()));
        match (file.change, &file.expected) {
            (FileChange::Modify, None) => {
                return Err(refused(
                    "a modified file needs its current revision in expected_revisions (its hunks check only the lines they touch)",
                ));
            }
            (FileChange::Modify | FileChange::Delete, Some(Revision::Missing)) => {
                return Err(refused(
                    "expected_revisions says \"missing\" for a file the diff modifies or deletes",
                ));
            }
            (FileChange::Create, Some(revision)) if *revision != Revision::Missing => {
                return Err(refused(
                    "the diff creates this file (--- /dev/null); its expected revision can only be \"missing\"",
                ));
            }
            _ => {}
        }
    }
    Ok(files)
}

/// The idempotency payload: the diff and the expected revisions, in key order.
fn set_payload_hash(req: &PatchSetRequest) -> String {
    let mut parts: Vec<&str> = vec!["patch_set", &req.diff];
    for (path, revision) in req.expected_revisions.iter().flatten() {
        parts.push(path);
        parts.push(revision);
    }
    payload_hash(&parts)
}

impl Workspace {
    pub fn patch_set(&self, req: &PatchSetRequest) -> Result<PatchSetResponse, WorkspaceError> {
        validate_request_id(&req.request_id)?;
        let guard = req.context.guard.resolve()?;
        let limits = PatchSetLimits {
            max_diff_bytes: usize::try_from(
                self.limits.max_file_bytes.saturating_mul(SET_BYTES_FACTOR),
            )
            .unwrap_or(usize::MAX),
            max_files: MAX_PATCH_SET_FILES,
            max_hunks: MAX_PATCH_SET_HUNKS,
        };
        let files = name_files(req, &guard, limits)?;
        let hash = set_payload_hash(req);
        let project = self.project(&req.context.project)?;
        let flight_key = (
            project.name.clone(),
            req.context.principal.user_id.clone(),
            req.request_id.clone(),
        );
        self.counted_in_flight(&flight_key, || {
            failpoint::hit(Failpoint::BeforeLock);
            let _lock = self.lock_for_request(&project, &flight_key, &req.request_id)?;
            let store = self.store(&project)?;
            if let Some(replayed) = self.replay_set(&project, &store, req, &hash, &files)? {
                return Ok(replayed);
            }
            let planned = self.plan_set(&project, &files)?;
            // An earlier change of any of the files left prepared is decided first.
            let paths: Vec<&RelPath> = planned.iter().map(|p| &p.path).collect();
            self.decide_prepared_on(&project, &store, &paths)?;
            let receipts = prepare_set(req, &project, &hash, &planned, &store)?;
            self.apply_set(&project, &store, &req.request_id, planned, receipts, &files)
        })
    }

    /// Step 2: the recorded outcome of this caller's request id, each prepared file
    /// reconciled from the disk first; another payload (or a single-file change) under the id
    /// is `request_id_reused`.
    fn replay_set(
        &self,
        project: &Project,
        store: &Mutex<ReceiptStore>,
        req: &PatchSetRequest,
        hash: &str,
        files: &[SetFile],
    ) -> Result<Option<PatchSetResponse>, WorkspaceError> {
        let mut recorded =
            lock_poisoned(store).find_all(&req.context.principal.user_id, &req.request_id)?;
        let Some(first) = recorded.first() else {
            return Ok(None);
        };
        let same = recorded.len() == files.len()
            && recorded
                .iter()
                .all(|r| r.operation == Operation::PatchSet && r.payload_hash == hash);
        if !same {
            return Err(WorkspaceError::RequestIdReused {
                request_id: req.request_id.clone(),
                receipt_id: first.receipt_id.clone(),
            });
        }
        for receipt in &mut recorded {
            if receipt.state == ReceiptState::Prepared {
                self.reconcile(project, store, receipt)?;
            }
        }
        Ok(Some(answer(&req.request_id, &recorded, files, true)))
    }

    /// Step 3: every file read and checked, every hunk applied in memory; nothing changes.
    fn plan_set(
        &self,
        project: &Project,
        files: &[SetFile],
    ) -> Result<Vec<PlannedFile>, WorkspaceError> {
        let total_limit = self
            .limits
            .max_file_bytes
            .saturating_mul(SET_CONTENT_FACTOR);
        let mut total: u64 = 0;
        let mut planned = Vec::with_capacity(files.len());
        for (index, file) in files.iter().enumerate() {
            let one = self
                .plan_file(project, file)
                .map_err(in_file(index, &file.path))?;
            let before = one.before.as_ref().map_or(0, Vec::len) as u64;
            let after = match &one.step {
                Step::Ready(p) => match &p.action {
                    super::change::Action::Replace { content, .. } => content.len() as u64,
                    _ => 0,
                },
                Step::CreateInNewFolder(content) => content.len() as u64,
            };
            total = total.saturating_add(before).saturating_add(after);
            if total > total_limit {
                return Err(WorkspaceError::TooLarge {
                    path: format!(
                        "the patch set's contents before and after (files 1 to {})",
                        index + 1
                    ),
                    size: total,
                    limit: total_limit,
                });
            }
            planned.push(one);
        }
        Ok(planned)
    }

    fn plan_file(&self, project: &Project, file: &SetFile) -> Result<PlannedFile, WorkspaceError> {
        let path = &file.path;
        // Never create a folder while validating: a created file's missing folder is made at
        // its turn, after every receipt is prepared.
        let current = match self.current(project, path, false) {
            Ok(current) => Some(current),
            Err(WorkspaceError::Confine(ConfineError::NotFound { .. }))
                if file.change == FileChange::Create =>
            {
                None
            }
            Err(e) => return Err(e),
        };
        let revision = current
            .as_ref()
            .map_or(Revision::Missing, |c| c.revision.clone());
        match file.change {
            FileChange::Create => self.check_expected(path, &Revision::Missing, &revision)?,
            FileChange::Modify | FileChange::Delete => {
                if revision == Revision::Missing {
                    return Err(ConfineError::NotFound {
                        path: path.to_string(),
                    }
                    .into());
                }
                if let Some(expected) = &file.expected {
                    self.check_expected(path, expected, &revision)?;
                }
            }
        }
        let base = match current.as_ref().and_then(|c| c.content.as_deref()) {
            Some(bytes) => std::str::from_utf8(bytes).map_err(|_| WorkspaceError::NotText {
                path: path.to_string(),
            })?,
            None => "",
        };
        let result = agentworks_core::patch::apply_strict(base, &file.text)?;
        if result == base && file.change == FileChange::Modify {
            return Err(PatchError::NoChange.into());
        }
        if file.change == FileChange::Delete && !result.is_empty() {
            return Err(PatchError::DeleteLeavesContent {
                bytes: result.len(),
            }
            .into());
        }
        self.check_size(path, result.len())?;
        let resulting = match file.change {
            FileChange::Delete => Revision::Missing,
            _ => Revision::of(result.as_bytes()),
        };
        let mut step = match (current, file.change) {
            (None, _) => Step::CreateInNewFolder(result.into_bytes()),
            (Some(current), FileChange::Delete) => {
                Step::Ready(Box::new(self.plan_delete(path.clone(), current)?))
            }
            (Some(current), _) => Step::Ready(Box::new(self.plan_replace(
                path.clone(),
                current,
                result.into_bytes(),
            ))),
        };
        // The receipt's before-content, moved out of the plan (`apply` never reads it).
        let before = match &mut step {
            Step::Ready(p) => p.before.take(),
            Step::CreateInNewFolder(_) => None,
        };
        Ok(PlannedFile {
            path: path.clone(),
            previous: revision,
            resulting,
            before,
            step,
        })
    }

    /// Step 5: each file in order; the first failure stops the set (see the module doc).
    fn apply_set(
        &self,
        project: &Project,
        store: &Mutex<ReceiptStore>,
        request_id: &str,
        planned: Vec<PlannedFile>,
        mut receipts: Vec<Receipt>,
        files: &[SetFile],
    ) -> Result<PatchSetResponse, WorkspaceError> {
        for (index, file) in planned.into_iter().enumerate() {
            let path = file.path.clone();
            // `patch_set_before_<n>:fail`: file n fails before anything of it is written.
            let applied =
                if failpoint::hit_numbered(Failpoint::PatchSetBefore, index + 1) == Hit::Fail {
                    Err(WorkspaceError::io(
                        "patch_set_before",
                        &path,
                        std::io::Error::other("failpoint"),
                    ))
                } else {
                    Ok(())
                };
            let applied = applied.and_then(|()| match file.step {
                Step::Ready(planned) => self.apply(&planned).map(|()| *planned),
                Step::CreateInNewFolder(content) => self
                    .current(project, &path, true)
                    .and_then(|current| {
                        self.check_expected(&path, &Revision::Missing, &current.revision)?;
                        Ok(self.plan_replace(path.clone(), current, content))
                    })
                    .and_then(|planned| self.apply(&planned).map(|()| planned)),
            });
            let planned = match applied {
                Ok(planned) => planned,
                Err(error) => {
                    // Nothing of this file reached the disk (every error of `apply` comes
                    // before its rename or unlink), nor of any later one.
                    mark_not_applied(store, &mut receipts[index..]);
                    if index == 0 {
                        return Err(in_file(index, &path)(error));
                    }
                    return Err(WorkspaceError::PartiallyApplied {
                        request_id: request_id.into(),
                        index,
                        path: path.to_string(),
                        reason: error.to_string(),
                        files: answer(request_id, &receipts, files, false).files,
                    });
                }
            };
            if let Err(error) = self.sync_after(&planned) {
                // It reached the disk but may not survive a crash: its receipt stays prepared
                // (reconciled later); the later files are not touched.
                mark_not_applied(store, &mut receipts[index + 1..]);
                return Err(WorkspaceError::Uncertain {
                    request_id: request_id.into(),
                    reason: format!(
                        "file {} ({path}) of the patch set reached the disk but could not be made durable ({error}); the files after it were not changed",
                        index + 1
                    ),
                    receipt: Box::new(receipts[index].clone()),
                });
            }
            failpoint::hit_numbered(Failpoint::PatchSetRenamed, index + 1);
            match mark_applied(store, request_id, receipts[index].clone()) {
                Ok(receipt) => {
                    audit(&receipt);
                    receipts[index] = receipt;
                }
                Err(uncertain) => {
                    mark_not_applied(store, &mut receipts[index + 1..]);
                    return Err(uncertain);
                }
            }
            failpoint::hit_numbered(Failpoint::PatchSetApplied, index + 1);
        }
        Ok(answer(request_id, &receipts, files, false))
    }
}

/// Mark receipts of files never touched `not_applied` (best effort: one left prepared is
/// reconciled from the disk later, which gives the same answer).
fn mark_not_applied(store: &Mutex<ReceiptStore>, receipts: &mut [Receipt]) {
    for receipt in receipts {
        match lock_poisoned(store).set_state(&receipt.receipt_id, ReceiptState::NotApplied) {
            Ok(updated) => {
                receipt.state = ReceiptState::NotApplied;
                receipt.updated_at_ms = updated;
            }
            Err(_) => {
                tracing::warn!(receipt = %receipt.receipt_id, "could not mark receipt not_applied; it will be reconciled");
            }
        }
    }
}

/// Step 4: one prepared receipt per file, all in one transaction; an error means nothing
/// changed.
fn prepare_set(
    req: &PatchSetRequest,
    project: &Project,
    hash: &str,
    planned: &[PlannedFile],
    store: &Mutex<ReceiptStore>,
) -> Result<Vec<Receipt>, WorkspaceError> {
    let now = agentworks_support::clock::now_ms();
    let count = u32::try_from(planned.len()).unwrap_or(u32::MAX);
    let principal = &req.context.principal;
    let receipts: Vec<Receipt> = planned
        .iter()
        .enumerate()
        .map(|(index, file)| {
            let (before_content, before_truncated) = match &file.before {
                Some(content) => {
                    let (kept, truncated) = capped_before(content);
                    (Some(kept), truncated)
                }
                None => (None, false),
            };
            Receipt {
                receipt_id: new_receipt_id(),
                request_id: req.request_id.clone(),
                operation: Operation::PatchSet,
                project: project.name.clone(),
                path: file.path.to_string(),
                to_path: None,
                user_id: principal.user_id.clone(),
                user_name: principal.user_name.clone(),
                connection_id: principal.connection_id.clone(),
                source: principal.source.clone(),
                previous_revision: file.previous.clone(),
                resulting_revision: file.resulting.clone(),
                state: ReceiptState::Prepared,
                created_at_ms: now,
                updated_at_ms: now,
                payload_hash: hash.to_owned(),
                before_content,
                before_truncated,
                part: Some(ReceiptPart {
                    index: u32::try_from(index).unwrap_or(u32::MAX),
                    count,
                }),
            }
        })
        .collect();
    if failpoint::hit(Failpoint::ReceiptUnavailable) == Hit::Fail {
        return Err(WorkspaceError::AuditUnavailable(
            ReceiptError::Unavailable {
                path: lock_poisoned(store).path().to_owned(),
                source: rusqlite::Error::InvalidQuery,
            },
        ));
    }
    lock_poisoned(store).insert_prepared_all(&receipts)?;
    failpoint::hit(Failpoint::AfterPrepare);
    Ok(receipts)
}

#[cfg(test)]
mod tests {
    use super::super::tests::{context, fixture, writable};
    use super::*;
    use agentworks_core::guard::Guard;
    use std::collections::BTreeMap;

    fn request(diff: &str, expected: &[(&str, Revision)], request_id: &str) -> PatchSetRequest {
        request_with(writable(), diff, expected, request_id)
    }

    fn request_with(
        guard: Guard,
        diff: &str,
        expected: &[(&str, Revision)],
        request_id: &str,
    ) -> PatchSetRequest {
        PatchSetRequest {
            context: context(guard),
            diff: diff.into(),
            request_id: request_id.into(),
            expected_revisions: Some(
                expected
                    .iter()
                    .map(|(p, r)| ((*p).to_owned(), r.to_string()))
                    .collect::<BTreeMap<_, _>>(),
            ),
        }
    }

    const SET: &str = "--- /dev/null\n+++ b/deep/new.txt\n@@ -0,0 +1 @@\n+n\n--- a/m.txt\n+++ b/m.txt\n@@ -1 +1 @@\n-m\n+M\n--- a/d.txt\n+++ /dev/null\n@@ -1 +0,0 @@\n-d\n";

    #[test]
    fn a_set_applies_every_file_with_one_receipt_each() {
        let f = fixture(&[("m.txt", "m\n"), ("d.txt", "d\n")]);
        let req = request(SET, &[("m.txt", Revision::of(b"m\n"))], "s1");
        let done = f.workspace.patch_set(&req).unwrap();
        assert_eq!(done.state, ReceiptState::Applied);
        let actions: Vec<_> = done
            .files
            .iter()
            .map(|x| (x.path.as_str(), x.action))
            .collect();
        assert_eq!(
            actions,
            [
                ("deep/new.txt", FileAction::Created),
                ("m.txt", FileAction::Modified),
                ("d.txt", FileAction::Deleted)
            ]
        );
        assert_eq!(
            std::fs::read_to_string(f.project.join("deep/new.txt")).unwrap(),
            "n\n"
        );
        assert_eq!(
            std::fs::read_to_string(f.project.join("m.txt")).unwrap(),
            "M\n"
        );
        assert!(!f.project.join("d.txt").exists());
        let receipt = f
            .workspace
            .receipt(&ReceiptRequest {
                context: context(writable()),
                request_id: "s1".into(),
            })
            .unwrap();
        let files = receipt.files.expect("a patch set lists its files");
        assert_eq!(files.len(), 3);
        assert!(files.iter().all(|r| r.state == ReceiptState::Applied));
        assert_eq!(files[2].part, Some(ReceiptPart { index: 2, count: 3 }));
        assert_eq!(files[2].before_content.as_deref(), Some(&b"d\n"[..]));
        // Replay answers the same receipts; another payload is refused.
        let again = f.workspace.patch_set(&req).unwrap();
        assert!(again.replayed);
        assert_eq!(
            again.files[1].receipt.receipt_id,
            done.files[1].receipt.receipt_id
        );
        let other = request(SET, &[("m.txt", Revision::of(b"other\n"))], "s1");
        assert_eq!(
            f.workspace.patch_set(&other).unwrap_err().code(),
            "request_id_reused"
        );
    }

    #[test]
    fn the_revision_rule_is_checked_per_action() {
        let f = fixture(&[("m.txt", "m\n"), ("d.txt", "d\n")]);
        let calls = std::cell::Cell::new(0);
        let code = |diff: &str, expected: &[(&str, Revision)]| {
            calls.set(calls.get() + 1);
            f.workspace
                .patch_set(&request(diff, expected, &format!("rule-{}", calls.get())))
                .map(|_| ())
                .map_err(|e| (e.code(), e.to_string()))
        };
        let modify = "--- a/m.txt\n+++ b/m.txt\n@@ -1 +1 @@\n-m\n+M\n";
        let (c, message) = code(modify, &[]).unwrap_err();
        assert_eq!(c, "invalid_request");
        assert!(
            message.contains("m.txt") && message.contains("expected_revisions"),
            "{message}"
        );
        assert_eq!(
            code(modify, &[("m.txt", Revision::Missing)]).unwrap_err().0,
            "invalid_request"
        );
        let create = "--- /dev/null\n+++ b/c.txt\n@@ -0,0 +1 @@\n+c\n";
        assert_eq!(
            code(create, &[("c.txt", Revision::of(b"x"))])
                .unwrap_err()
                .0,
            "invalid_request"
        );
        // A deletion needs no revision: its hunks state the whole file.
        let delete = "--- a/d.txt\n+++ /dev/null\n@@ -1 +0,0 @@\n-d\n";
        assert_eq!(code(delete, &[]), Ok(()));
        assert!(!f.project.join("d.txt").exists());
        // A modification that changes nothing is refused.
        let nothing = "--- a/m.txt\n+++ b/m.txt\n@@ -1 +1 @@\n m\n";
        assert_eq!(
            code(nothing, &[("m.txt", Revision::of(b"m\n"))])
                .unwrap_err()
                .0,
            "patch_rejected"
        );
    }

    #[test]
    fn the_guard_and_the_bounds_refuse_before_anything_changes() {
        let f = fixture(&[("ro/a.txt", "a\n"), ("m.txt", "m\n")]);
        let guard = Guard {
            write_paths: vec![".".into()],
            read_only_paths: vec!["ro".into()],
            ..Guard::default()
        };
        let diff = "--- /dev/null\n+++ b/ok.txt\n@@ -0,0 +1 @@\n+ok\n--- a/ro/a.txt\n+++ b/ro/a.txt\n@@ -1 +1 @@\n-a\n+A\n";
        let req = request_with(guard, diff, &[("ro/a.txt", Revision::of(b"a\n"))], "ro");
        let error = f.workspace.patch_set(&req).unwrap_err();
        assert_eq!(error.code(), "forbidden", "{error}");
        assert!(!f.project.join("ok.txt").exists());
        // Too many files: refused by the parser's bound, before any file is read.
        let many: String = (0..=MAX_PATCH_SET_FILES)
            .map(|i| format!("--- /dev/null\n+++ b/f{i}.txt\n@@ -0,0 +1 @@\n+x\n"))
            .collect();
        let error = f
            .workspace
            .patch_set(&request(&many, &[], "many"))
            .unwrap_err();
        assert_eq!(error.code(), "patch_rejected", "{error}");
        // A result over max_file_bytes names its file.
        let big = format!(
            "--- /dev/null\n+++ b/big.txt\n@@ -0,0 +1 @@\n+{}\n",
            "x".repeat(1024 * 1024)
        );
        let error = f
            .workspace
            .patch_set(&request(&big, &[], "big"))
            .unwrap_err();
        assert_eq!(error.code(), "too_large", "{error}");
        assert!(error.to_string().contains("big.txt"), "{error}");
        assert!(!f.project.join("big.txt").exists());
    }

    /// Issue 42 item 8: the first file creates `x`, the second needs `x/` as a folder. Each
    /// is fine on its own; together they used to stop half applied (`x` made, `x/y.txt` not).
    #[test]
    fn a_set_that_cannot_apply_whole_is_refused_before_anything_changes() {
        let f = fixture(&[("m.txt", "m\n")]);
        for (diff, id) in [
            (
                "--- /dev/null\n+++ b/x\n@@ -0,0 +1 @@\n+x\n--- /dev/null\n+++ b/x/y.txt\n@@ -0,0 +1 @@\n+y\n",
                "file-then-folder",
            ),
            (
                "--- /dev/null\n+++ b/x/y.txt\n@@ -0,0 +1 @@\n+y\n--- /dev/null\n+++ b/x\n@@ -0,0 +1 @@\n+x\n",
                "folder-then-file",
            ),
            (
                "--- a/m.txt\n+++ b/m.txt\n@@ -1 +1 @@\n-m\n+M\n--- /dev/null\n+++ b/m.txt/z\n@@ -0,0 +1 @@\n+z\n",
                "modified-then-folder",
            ),
        ] {
            let req = request(diff, &[("m.txt", Revision::of(b"m\n"))], id);
            let error = f.workspace.patch_set(&req).unwrap_err();
            assert_eq!(error.code(), "patch_rejected", "{id}: {error}");
            assert!(
                error.to_string().contains("cannot be both"),
                "{id}: {error}"
            );
            assert!(!f.project.join("x").exists(), "{id}");
            assert_eq!(
                std::fs::read_to_string(f.project.join("m.txt")).unwrap(),
                "m\n"
            );
            let receipt = f.workspace.receipt(&ReceiptRequest {
                context: context(writable()),
                request_id: id.into(),
            });
            assert_eq!(receipt.unwrap_err().code(), "not_found", "{id}: no receipt");
        }
    }

    #[test]
    fn what_a_set_holds_in_memory_is_bounded_across_its_files() {
        // Five files of 900 KiB under a 1 MiB max_file_bytes: each is allowed, but read and
        // rewritten together they pass 8 MiB, and the set is refused before any change.
        let body = format!("first\n{}\n", "y".repeat(900 * 1024));
        let names: Vec<String> = (0..5).map(|i| format!("f{i}.txt")).collect();
        let files: Vec<(&str, &str)> = names.iter().map(|n| (n.as_str(), body.as_str())).collect();
        let f = fixture(&files);
        let diff: String = names
            .iter()
            .map(|n| format!("--- a/{n}\n+++ b/{n}\n@@ -1 +1 @@\n-first\n+FIRST\n"))
            .collect();
        let expected: Vec<(&str, Revision)> = names
            .iter()
            .map(|n| (n.as_str(), Revision::of(body.as_bytes())))
            .collect();
        let error = f
            .workspace
            .patch_set(&request(&diff, &expected, "heavy"))
            .unwrap_err();
        assert_eq!(error.code(), "too_large", "{error}");
        assert!(error.to_string().contains("files 1 to 5"), "{error}");
        for name in &names {
            assert_eq!(std::fs::read_to_string(f.project.join(name)).unwrap(), body);
        }
        // Four of them fit.
        let four: String = diff.split_inclusive("+FIRST\n").take(4).collect();
        let done = f
            .workspace
            .patch_set(&request(&four, &expected[..4], "lighter"))
            .unwrap();
        assert_eq!(done.files.len(), 4);
    }
}
