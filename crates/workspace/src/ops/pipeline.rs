//! The change pipeline: the one order every change follows, under the project's lock.
//!
//! [`Workspace::change`] counts the request as in flight and takes the lock; then, in this
//! order, each step a function of its own: (1) the idempotency check (replay the recorded
//! outcome of the same request id), (2) the revision check and plan, with every earlier
//! change of the planned paths still prepared decided from the disk first
//! ([`Workspace::decide_prepared_on`]), (3) the durable *prepared*
//! receipt, (4) stage + fsync + metadata carry-over, identity re-check and rename or unlink
//! ([`Workspace::apply`]), (5) the folder fsync, (6) the *applied* receipt, (7) the audit event.
//!
//! The order is the guarantee and must never change: nothing touches a file before its
//! prepared receipt is durable (fail closed), and a change that reached the file but could not
//! be confirmed is answered `uncertain`, never retried here.

use super::change::Planned;
use super::group_commit::{BatchJob, BatchPlan};
use super::{Project, Workspace, lock_poisoned, validate_request_id};
use crate::error::WorkspaceError;
use crate::lock::{LockError, ProjectLock};
use crate::receipts::{
    Operation, Receipt, ReceiptError, ReceiptState, ReceiptStore, capped_before, new_receipt_id,
};
use agentworks_contract::workspaced::*;
use agentworks_core::guard::RelPath;
use agentworks_daemon::audit;
use agentworks_fs::failpoint::{self, Failpoint, Hit};
use std::sync::{Arc, Mutex};

/// Who is making which change: project, caller and request id. Counts the calls of one request
/// in flight at once, so a second one waiting for the lock is told `request_in_progress`.
pub(super) type FlightKey = (String, String, String);

/// One change on its way through the pipeline: what was asked, by whom, in which project.
pub(super) struct ChangeInFlight<'a> {
    pub(super) ctx: &'a Context,
    pub(super) operation: Operation,
    pub(super) request_id: &'a str,
    pub(super) payload_hash: String,
    pub(super) project: &'a Project,
    pub(super) flight_key: &'a FlightKey,
}

/// One call of a [`FlightKey`] counted in flight while this lives (also when a caller's task
/// is dropped, its connection gone, mid-wait).
struct InFlight<'a> {
    workspace: &'a Workspace,
    key: FlightKey,
}

impl<'a> InFlight<'a> {
    fn count(workspace: &'a Workspace, key: FlightKey) -> InFlight<'a> {
        *lock_poisoned(&workspace.in_flight)
            .entry(key.clone())
            .or_insert(0) += 1;
        InFlight { workspace, key }
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        let mut in_flight = lock_poisoned(&self.workspace.in_flight);
        if let Some(count) = in_flight.get_mut(&self.key) {
            *count -= 1;
            if *count == 0 {
                in_flight.remove(&self.key);
            }
        }
    }
}

impl Workspace {
    /// The shared skeleton of every change; `plan` runs under the lock, after the idempotency
    /// check, and must not modify anything.
    pub(super) fn change(
        &self,
        ctx: &Context,
        operation: Operation,
        request_id: &str,
        payload_hash: String,
        plan: impl FnOnce(&Project) -> Result<Planned, WorkspaceError>,
    ) -> Result<ChangeResponse, WorkspaceError> {
        validate_request_id(request_id)?;
        let project = self.project(&ctx.project)?;
        let flight_key = (
            project.name.clone(),
            ctx.principal.user_id.clone(),
            request_id.to_owned(),
        );
        self.counted_in_flight(&flight_key, || {
            let change = ChangeInFlight {
                ctx,
                operation,
                request_id,
                payload_hash,
                project: &project,
                flight_key: &flight_key,
            };
            self.change_in_flight(change, plan)
        })
    }

    /// [`Workspace::change`] for a change that may share its syncs with others queued for the
    /// same project (`group_commit.rs`): the same steps in the same order, once per batch.
    /// `plan` owns what it needs, since the batch's leader runs it on its own thread; the
    /// caller awaits the answer without holding a thread.
    pub(super) async fn change_batched(
        self: &Arc<Self>,
        ctx: &Context,
        operation: Operation,
        request_id: &str,
        payload_hash: String,
        path: &RelPath,
        plan: BatchPlan,
    ) -> Result<ChangeResponse, WorkspaceError> {
        validate_request_id(request_id)?;
        // Refused here, before queueing, if there is no such project.
        let project = self.project(&ctx.project)?.name;
        let job = BatchJob {
            ctx: ctx.clone(),
            operation,
            request_id: request_id.to_owned(),
            payload_hash,
            path: path.clone(),
            plan,
        };
        let _counted = InFlight::count(self, job.flight_key(&project));
        self.change_in_batch(&project, job).await
    }

    /// Run `work` counted as a call of `flight_key` in flight (see [`FlightKey`]).
    pub(super) fn counted_in_flight<T>(
        &self,
        flight_key: &FlightKey,
        work: impl FnOnce() -> Result<T, WorkspaceError>,
    ) -> Result<T, WorkspaceError> {
        let _counted = InFlight::count(self, flight_key.clone());
        work()
    }

    /// The steps, in their order; each returns early with the answer it decides.
    fn change_in_flight(
        &self,
        change: ChangeInFlight<'_>,
        plan: impl FnOnce(&Project) -> Result<Planned, WorkspaceError>,
    ) -> Result<ChangeResponse, WorkspaceError> {
        failpoint::hit(Failpoint::BeforeLock);
        let _lock = self.lock_for_change(&change)?;
        let store = self.store(change.project)?;
        // 1. Same id: replay the recorded outcome, or refuse a different payload.
        if let Some(replayed) = self.replay_recorded(&change, &store)? {
            return Ok(replayed);
        }
        // 2. Revision check and planning (nothing changes yet); an earlier change of these
        // paths left prepared is decided first, before this one can change what it finds.
        let planned = plan(change.project)?;
        let paths: Vec<&RelPath> = std::iter::once(&planned.path)
            .chain(&planned.to_path)
            .collect();
        self.decide_prepared_on(change.project, &store, &paths)?;
        // 3. Durable prepared receipt; if it cannot be written, refuse before touching the file.
        let request_id = change.request_id;
        let receipt = prepare_receipt(change, &planned, &store)?;
        // 4. Apply.
        self.apply_or_mark_not_applied(&planned, &receipt, &store)?;
        // The target changed. If its folder cannot be synced the change may not survive a
        // crash: leave the receipt prepared (reconciled from the disk later) and say so.
        let receipt = self.durable_or_uncertain(&planned, request_id, receipt)?;
        failpoint::hit(Failpoint::BeforeMarkApplied);
        // 5. Applied, audited, answered.
        let receipt = mark_applied(&store, request_id, receipt)?;
        failpoint::hit(Failpoint::AfterMarkApplied);
        audit(&receipt);
        Ok(ChangeResponse {
            state: ReceiptState::Applied,
            replayed: false,
            previous_revision: receipt.previous_revision.clone(),
            revision: receipt.resulting_revision.clone(),
            receipt,
        })
    }

    /// The project's lock; a timeout while another call of the same request holds or awaits
    /// it is `request_in_progress`, not a lock error.
    fn lock_for_change(&self, change: &ChangeInFlight<'_>) -> Result<ProjectLock, WorkspaceError> {
        self.lock_for_request(change.project, change.flight_key, change.request_id)
    }

    /// The project's lock for a counted request (see [`Workspace::lock_for_change`]).
    pub(super) fn lock_for_request(
        &self,
        project: &Project,
        flight_key: &FlightKey,
        request_id: &str,
    ) -> Result<ProjectLock, WorkspaceError> {
        self.lock(project)
            .map_err(|e| self.lock_refused(flight_key, request_id, e))
    }

    /// What a caller is told when the project's lock (or its turn in the group-commit queue)
    /// did not come in time: `request_in_progress` while another call of the same request holds
    /// or awaits it, otherwise the lock error (`busy`).
    pub(super) fn lock_refused(
        &self,
        flight_key: &FlightKey,
        request_id: &str,
        error: LockError,
    ) -> WorkspaceError {
        let same_request_in_flight = lock_poisoned(&self.in_flight)
            .get(flight_key)
            .copied()
            .unwrap_or(0)
            > 1;
        match error {
            LockError::Timeout { .. } if same_request_in_flight => {
                WorkspaceError::RequestInProgress {
                    request_id: request_id.into(),
                }
            }
            e => e.into(),
        }
    }

    /// Step 1: the answer already recorded for this caller's request id, if any (a prepared
    /// one reconciled from the disk first); a different payload under the same id is refused.
    pub(super) fn replay_recorded(
        &self,
        change: &ChangeInFlight<'_>,
        store: &Mutex<ReceiptStore>,
    ) -> Result<Option<ChangeResponse>, WorkspaceError> {
        let recorded =
            lock_poisoned(store).find(&change.ctx.principal.user_id, change.request_id)?;
        let Some(mut receipt) = recorded else {
            return Ok(None);
        };
        if receipt.payload_hash != change.payload_hash {
            return Err(WorkspaceError::RequestIdReused {
                request_id: change.request_id.into(),
                receipt_id: receipt.receipt_id,
            });
        }
        if receipt.state == ReceiptState::Prepared {
            self.reconcile(change.project, store, &mut receipt)?;
        }
        Ok(Some(ChangeResponse {
            state: receipt.state,
            replayed: true,
            previous_revision: receipt.previous_revision.clone(),
            revision: receipt.resulting_revision.clone(),
            receipt,
        }))
    }

    /// Step 4: apply the plan; on an error, record `not_applied` and pass the error on.
    fn apply_or_mark_not_applied(
        &self,
        planned: &Planned,
        receipt: &Receipt,
        store: &Mutex<ReceiptStore>,
    ) -> Result<(), WorkspaceError> {
        if let Err(error) = self.apply(planned) {
            // Every error of `apply` comes before the rename or unlink: nothing reached the
            // target. Record that (best effort: a prepared receipt left behind is reconciled
            // from the disk later, which gives the same answer).
            if lock_poisoned(store)
                .set_state(&receipt.receipt_id, ReceiptState::NotApplied)
                .is_err()
            {
                tracing::warn!(receipt = %receipt.receipt_id, "could not mark receipt not_applied; it will be reconciled");
            }
            return Err(error);
        }
        Ok(())
    }

    /// Step 5: fsync the folders; if that fails the answer is `uncertain` with the receipt.
    fn durable_or_uncertain(
        &self,
        planned: &Planned,
        request_id: &str,
        receipt: Receipt,
    ) -> Result<Receipt, WorkspaceError> {
        if let Err(error) = self.sync_after(planned) {
            return Err(WorkspaceError::Uncertain {
                request_id: request_id.into(),
                reason: format!(
                    "the change reached the file but could not be made durable ({error})"
                ),
                receipt: Box::new(receipt),
            });
        }
        Ok(receipt)
    }
}

/// Step 3: build the receipt and store it as *prepared*; an error here means nothing changed.
fn prepare_receipt(
    change: ChangeInFlight<'_>,
    planned: &Planned,
    store: &Mutex<ReceiptStore>,
) -> Result<Receipt, WorkspaceError> {
    let receipt = build_receipt(change, planned, store)?;
    lock_poisoned(store).insert_prepared(&receipt)?;
    failpoint::hit(Failpoint::AfterPrepare);
    Ok(receipt)
}

/// The *prepared* receipt of a planned change, not stored yet.
pub(super) fn build_receipt(
    change: ChangeInFlight<'_>,
    planned: &Planned,
    store: &Mutex<ReceiptStore>,
) -> Result<Receipt, WorkspaceError> {
    let ChangeInFlight {
        ctx,
        operation,
        request_id,
        payload_hash,
        project,
        ..
    } = change;
    let now = agentworks_support::clock::now_ms();
    let (before, before_truncated) = match &planned.before {
        Some(content) => {
            let (kept, truncated) = capped_before(content);
            (Some(kept), truncated)
        }
        None => (None, false),
    };
    let receipt = Receipt {
        receipt_id: new_receipt_id(),
        request_id: request_id.into(),
        operation,
        project: project.name.clone(),
        path: planned.path.to_string(),
        to_path: planned.to_path.as_ref().map(ToString::to_string),
        user_id: ctx.principal.user_id.clone(),
        user_name: ctx.principal.user_name.clone(),
        connection_id: ctx.principal.connection_id.clone(),
        source: ctx.principal.source.clone(),
        previous_revision: planned.previous.clone(),
        resulting_revision: planned.resulting.clone(),
        state: ReceiptState::Prepared,
        created_at_ms: now,
        updated_at_ms: now,
        payload_hash,
        before_content: before,
        before_truncated,
        part: None,
    };
    if failpoint::hit(Failpoint::ReceiptUnavailable) == Hit::Fail {
        return Err(WorkspaceError::AuditUnavailable(
            ReceiptError::Unavailable {
                path: lock_poisoned(store).path().to_owned(),
                source: rusqlite::Error::InvalidQuery,
            },
        ));
    }
    Ok(receipt)
}

/// Step 6: record the receipt as *applied*; if that fails the change was made but cannot be
/// confirmed, and the answer is `uncertain`.
pub(super) fn mark_applied(
    store: &Mutex<ReceiptStore>,
    request_id: &str,
    mut receipt: Receipt,
) -> Result<Receipt, WorkspaceError> {
    let marked = match failpoint::hit(Failpoint::MarkApplied) {
        Hit::Fail => Err(ReceiptError::Unavailable {
            path: lock_poisoned(store).path().to_owned(),
            source: rusqlite::Error::InvalidQuery,
        }),
        Hit::Continue => lock_poisoned(store).set_state(&receipt.receipt_id, ReceiptState::Applied),
    };
    match marked {
        Ok(updated) => {
            receipt.state = ReceiptState::Applied;
            receipt.updated_at_ms = updated;
            Ok(receipt)
        }
        Err(e) => Err(WorkspaceError::Uncertain {
            request_id: request_id.into(),
            reason: format!("the change was made but its receipt could not be confirmed ({e})"),
            receipt: Box::new(receipt),
        }),
    }
}

/// One structured audit event per applied change, a journal entry with the operation's
/// `MESSAGE_ID` (see [`agentworks_daemon::audit`]) and `AGENTWORKS_*` fields. File contents never enter it.
pub(super) fn audit(receipt: &Receipt) {
    let message_id = match receipt.operation {
        Operation::Write => audit::WRITE,
        Operation::Patch => audit::PATCH,
        Operation::Move => audit::MOVE,
        Operation::Delete => audit::DELETE,
        Operation::Restore => audit::RESTORE,
        // An edit is a content replacement like a patch; it shares the patch's MESSAGE_ID
        // (the daemon crate's catalogue has no edit id yet) and says `edit` in its event field.
        Operation::Edit => audit::PATCH,
        // One event per file of a patch set, with the patch's id and `patch_set` in its field.
        Operation::PatchSet => audit::PATCH,
    };
    tracing::info!(
        target: audit::TARGET,
        message_id,
        agentworks_event = receipt.operation.as_str(),
        agentworks_user_id = %receipt.user_id,
        agentworks_user_name = %receipt.user_name,
        agentworks_project = %receipt.project,
        agentworks_path = %receipt.path,
        agentworks_to_path = receipt.to_path.as_deref(),
        agentworks_request_id = %receipt.request_id,
        agentworks_receipt_id = %receipt.receipt_id,
        agentworks_previous_revision = %receipt.previous_revision,
        agentworks_resulting_revision = %receipt.resulting_revision,
        agentworks_source = %receipt.source,
        "change applied"
    );
}
