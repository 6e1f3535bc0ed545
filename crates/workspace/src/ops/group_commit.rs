//! Group commit: changes that queue for one project are taken as one batch, so the batch pays
//! the syncs once instead of once per change.
//!
//! A change waits in its project's [`Queue`], its caller's task awaiting the answer without
//! holding a thread. The first change that finds no leader starts one on a blocking thread:
//! the leader takes the waiting changes in arrival order (stopping at the first one whose path
//! is the same as, inside or around a path already taken, or whose request id is already
//! taken, so the order of dependent changes never changes), runs them, sends each caller its
//! answer, and takes the next batch, until the queue is empty. A change still untaken when the
//! lock timeout passes leaves the queue and is told `busy` (or `request_in_progress`), as a
//! caller waiting on the lock is.
//!
//! Until this, every waiting change held a blocking thread asleep on a condition variable, and
//! each batch's end woke them all and handed leadership to another thread: about 13 context
//! switches per write with 8 busy projects. Now a write costs about 7, and one thread per busy
//! project runs its batches back to back.
//!
//! A batch follows the pipeline's order (`pipeline.rs`), each step once for all its changes:
//! under the project's lock, (1) each change's idempotency check and (2) revision check and
//! plan (an earlier change of its path still prepared decided first), in arrival order; (3)
//! every prepared receipt in one SQLite transaction (one sync) while (4a) each change's temp
//! file is written, then each synced (the writes of all started before
//! the first sync waits: a temp file is nothing anyone sees, and the sweep removes one a crash
//! leaves); only when both are done, (4b) each target re-checked and renamed, in order, so no
//! target is touched before its prepared receipt is durable; (5) each folder synced once; (6)
//! every applied mark (and every `not_applied` one) in one transaction that does not wait for
//! the disk: the change is durable already, the next batch's synced prepare makes the marks
//! durable before it renames anything, and a power cut before that leaves them prepared for
//! recovery to decide from the disk ([`crate::receipts::ReceiptStore::set_states_unsynced`]);
//! (7) the audit events. A change whose revision check or staging fails fails alone; the others
//! go on. If the prepared transaction fails, each change is prepared on its own, so only the
//! ones that cannot be recorded are refused.
//!
//! So a batch waits for the disk twice (the prepare and the temp files together, then the
//! folder), where one change alone through the plain pipeline waits four times.
//!
//! The prepared transaction runs on one of a few long-lived [`Helpers`] threads while the
//! leader stages the temp files itself: starting a thread for every batch cost about a
//! twelfth of workspaced's time per write. The pool is hand-written (a job queue on std's
//! channel): a crate would add a dependency for a dozen lines, and rayon's pool is meant for
//! work that never blocks, where these jobs wait for the disk.
//!
//! The waiters' requests are owned data moved into the queue ([`BatchJob`]), so the leader's
//! thread can plan them without borrowing another thread's stack.

use super::change::{Action, Planned};
use super::pipeline::{ChangeInFlight, FlightKey, audit, build_receipt};
use super::{Project, Workspace, fsync_fd, lock_poisoned};
use crate::error::WorkspaceError;
use crate::lock::LockError;
use crate::receipts::{Operation, Receipt, ReceiptState};
use agentworks_contract::workspaced::{ChangeResponse, Context};
use agentworks_core::guard::RelPath;
use agentworks_fs::failpoint::{self, Failpoint, Hit};
use agentworks_fs::staged::StagedFile;
use std::collections::{HashMap, VecDeque};
use std::os::fd::{AsFd, BorrowedFd};
use std::sync::{Arc, Mutex};

/// Most changes one batch takes; the rest wait for the next.
const MAX_BATCH: usize = 64;
/// Threads for prepared transactions: batches of that many projects prepare at once.
const HELPER_THREADS: usize = 8;

type Job = Box<dyn FnOnce() + Send>;

/// A few long-lived threads running jobs in turn; they end when the pool is dropped.
pub(super) struct Helpers {
    jobs: Mutex<std::sync::mpsc::Sender<Job>>,
}

impl Helpers {
    fn start(threads: usize) -> Helpers {
        let (jobs, queue) = std::sync::mpsc::channel::<Job>();
        let queue = Arc::new(Mutex::new(queue));
        for n in 0..threads {
            let queue = Arc::clone(&queue);
            let spawned = std::thread::Builder::new()
                .name(format!("ws-prepare-{n}"))
                .spawn(move || {
                    loop {
                        // The lock is held only while waiting for a job, never while running one.
                        let job = lock_poisoned(&queue).recv();
                        let Ok(job) = job else { return };
                        job();
                    }
                });
            if let Err(error) = spawned {
                // Fewer helpers only queue jobs longer; with none, `run` answers `None`.
                tracing::warn!(%error, "cannot start a prepare thread");
            }
        }
        Helpers {
            jobs: Mutex::new(jobs),
        }
    }

    /// Starts `work` on a helper; the returned waiter gives its result, or `None` if it could
    /// not run (no helper thread, or it panicked).
    fn run<R: Send + 'static>(
        &self,
        work: impl FnOnce() -> R + Send + 'static,
    ) -> impl FnOnce() -> Option<R> {
        let (answer, answered) = std::sync::mpsc::sync_channel(1);
        let job: Job = Box::new(move || {
            let _ = answer.send(work());
        });
        let sent = lock_poisoned(&self.jobs).send(job).is_ok();
        move || if sent { answered.recv().ok() } else { None }
    }
}

/// The plan of a queued change: runs on the leader's thread, under the lock.
pub(super) type BatchPlan =
    Box<dyn FnOnce(&Workspace, &Project) -> Result<Planned, WorkspaceError> + Send>;

/// One change waiting for its batch, with everything it needs owned.
pub(super) struct BatchJob {
    pub(super) ctx: Context,
    pub(super) operation: Operation,
    pub(super) request_id: String,
    pub(super) payload_hash: String,
    /// The path the change touches (a batch never holds two related paths).
    pub(super) path: RelPath,
    pub(super) plan: BatchPlan,
}

impl BatchJob {
    /// Its [`FlightKey`] in `project` (a project's folder name).
    pub(super) fn flight_key(&self, project: &str) -> FlightKey {
        (
            project.to_owned(),
            self.ctx.principal.user_id.clone(),
            self.request_id.clone(),
        )
    }
}

type Answer = Result<ChangeResponse, WorkspaceError>;

/// Where a queued change's answer goes: its caller's task, which awaits it without a thread.
type Reply = tokio::sync::oneshot::Sender<Answer>;

/// One project's waiting changes.
#[derive(Default)]
pub(super) struct Queue {
    state: Mutex<QueueState>,
}

#[derive(Default)]
struct QueueState {
    next_ticket: u64,
    waiting: VecDeque<Waiting>,
    /// A leader runs this project's batches (until the queue is empty).
    leading: bool,
}

/// A change in the queue, untaken.
struct Waiting {
    ticket: u64,
    job: BatchJob,
    reply: Reply,
}

/// The leader of one project's batches, on a blocking thread. If it panics, every change it
/// had taken is answered by its dropped [`Reply`]; this refuses the untaken ones the same way
/// and lets the next change start a leader, so no caller waits forever.
struct Leader<'a> {
    queue: &'a Queue,
    /// The queue was found empty and leadership given up under its lock.
    done: bool,
}

impl Drop for Leader<'_> {
    fn drop(&mut self) {
        if !self.done {
            let mut state = lock_poisoned(&self.queue.state);
            state.waiting.clear();
            state.leading = false;
        }
    }
}

/// `count` refusals for a batch that cannot start: `first`, then a fresh attempt's error for
/// each of the others (errors are not `Clone`). An attempt that now succeeds, in a race, is
/// answered `busy`, as before this helper: this batch already failed, and a retry may not.
fn each_refused(
    count: usize,
    first: WorkspaceError,
    again: impl Fn() -> Option<WorkspaceError>,
) -> Vec<Answer> {
    let mut first = Some(first);
    (0..count)
        .map(|_| {
            Err(first
                .take()
                .or_else(&again)
                .unwrap_or_else(|| LockError::Timeout { waited_ms: 0 }.into()))
        })
        .collect()
}

/// Whether two changes' paths must keep their order: the same path, or one inside the other.
fn related(a: &RelPath, b: &RelPath) -> bool {
    let (a, b) = (a.as_str(), b.as_str());
    let inside = |inner: &str, outer: &str| {
        inner.len() > outer.len()
            && inner.starts_with(outer)
            && inner.as_bytes()[outer.len()] == b'/'
    };
    a == b || inside(a, b) || inside(b, a)
}

/// The next batch: waiting changes from the front, in order, up to the first that must wait.
fn take_batch(waiting: &mut VecDeque<Waiting>) -> Vec<Waiting> {
    let mut batch: Vec<Waiting> = Vec::new();
    while let Some(Waiting { job, .. }) = waiting.front() {
        let must_wait = batch.len() >= MAX_BATCH
            || batch.iter().any(|Waiting { job: taken, .. }| {
                related(&taken.path, &job.path)
                    || (taken.request_id == job.request_id
                        && taken.ctx.principal.user_id == job.ctx.principal.user_id)
            });
        if must_wait {
            break;
        }
        batch.extend(waiting.pop_front());
    }
    batch
}

/// A planned change with its prepared receipt, on its way through the batch.
struct Prepared {
    index: usize,
    planned: Planned,
    receipt: Receipt,
}

impl Workspace {
    fn queue(&self, project: &str) -> Arc<Queue> {
        lock_poisoned(&self.queues)
            .entry(project.to_owned())
            .or_default()
            .clone()
    }

    /// Queue `job` for the next batch of `project` (a project's folder name) and await its
    /// answer. The project's leader, started here on a blocking thread if none runs, makes
    /// it; the caller holds no thread meanwhile. A change still untaken when the lock timeout
    /// passes leaves the queue and is told `busy` (or `request_in_progress`), as a caller
    /// waiting on the lock is.
    pub(super) async fn change_in_batch(self: &Arc<Self>, project: &str, job: BatchJob) -> Answer {
        let queue = self.queue(project);
        let flight_key = job.flight_key(project);
        let request_id = job.request_id.clone();
        let deadline = tokio::time::Instant::now() + self.limits.lock_timeout;
        let (reply, mut answer) = tokio::sync::oneshot::channel();
        let (ticket, lead) = {
            let mut state = lock_poisoned(&queue.state);
            let ticket = state.next_ticket;
            state.next_ticket += 1;
            state.waiting.push_back(Waiting { ticket, job, reply });
            (ticket, !std::mem::replace(&mut state.leading, true))
        };
        if lead {
            let (workspace, project, queue) = (Arc::clone(self), project.to_owned(), queue.clone());
            // Detached: the leader answers through the replies, not its join handle.
            drop(tokio::task::spawn_blocking(move || {
                workspace.lead(&project, &queue);
            }));
        }
        let answered = match tokio::time::timeout_at(deadline, &mut answer).await {
            Ok(answered) => answered,
            Err(_elapsed) => {
                let untaken = {
                    let mut state = lock_poisoned(&queue.state);
                    let at = state.waiting.iter().position(|w| w.ticket == ticket);
                    at.and_then(|at| state.waiting.remove(at))
                };
                if untaken.is_some() {
                    // Never taken into a batch: it left the queue, as a lock wait times out.
                    let waited_ms = self.limits.lock_timeout.as_millis();
                    return Err(self.lock_refused(
                        &flight_key,
                        &request_id,
                        LockError::Timeout { waited_ms },
                    ));
                }
                // Taken: the running batch answers it (its own lock wait is bounded).
                answer.await
            }
        };
        answered.unwrap_or_else(|_dropped| {
            Err(WorkspaceError::InvalidRequest(
                "workspaced failed before answering this change; look it up by request id".into(),
            ))
        })
    }

    /// Run `project`'s batches, each as soon as the last is done, until its queue is empty;
    /// then give up leadership under the queue's lock, so a change queued after that starts
    /// the next leader.
    fn lead(&self, project: &str, queue: &Queue) {
        let mut leader = Leader { queue, done: false };
        loop {
            let batch = {
                let mut state = lock_poisoned(&queue.state);
                let batch = take_batch(&mut state.waiting);
                if batch.is_empty() {
                    state.leading = false;
                    leader.done = true;
                    return;
                }
                batch
            };
            let (replies, jobs): (Vec<Reply>, Vec<BatchJob>) = batch
                .into_iter()
                .map(|Waiting { job, reply, .. }| (reply, job))
                .unzip();
            // Opened for each batch, so a batch never works in a folder that was replaced.
            let answers = match self.project(project) {
                Ok(open) => self.run_batch(&open, jobs),
                Err(first) => each_refused(jobs.len(), first, || self.project(project).err()),
            };
            for (reply, answer) in replies.into_iter().zip(answers) {
                // A caller that went away (its connection closed) needs no answer.
                let _ = reply.send(answer);
            }
        }
    }

    /// One batch through the pipeline's steps; one answer per job, in order.
    fn run_batch(&self, project: &Project, jobs: Vec<BatchJob>) -> Vec<Answer> {
        let mut answers: Vec<Option<Answer>> = jobs.iter().map(|_| None).collect();
        let flight_keys: Vec<FlightKey> = jobs
            .iter()
            .map(|job| job.flight_key(&project.name))
            .collect();
        failpoint::hit(Failpoint::BeforeLock);
        let _lock = match self.lock(project) {
            Ok(lock) => lock,
            Err(error) => {
                return jobs
                    .iter()
                    .zip(&flight_keys)
                    .map(|(job, key)| {
                        Err(self.lock_refused(key, &job.request_id, error.duplicate()))
                    })
                    .collect();
            }
        };
        let store = match self.store(project) {
            Ok(store) => store,
            Err(first) => return each_refused(jobs.len(), first, || self.store(project).err()),
        };
        // 1 and 2, in arrival order: replay what is recorded, otherwise check and plan.
        let mut prepared: Vec<Prepared> = Vec::new();
        for (index, job) in jobs.into_iter().enumerate() {
            let BatchJob {
                ctx,
                operation,
                request_id,
                payload_hash,
                plan,
                ..
            } = job;
            let change = ChangeInFlight {
                ctx: &ctx,
                operation,
                request_id: &request_id,
                payload_hash,
                project,
                flight_key: &flight_keys[index],
            };
            match self.replay_recorded(&change, &store) {
                Ok(Some(replayed)) => {
                    answers[index] = Some(Ok(replayed));
                    continue;
                }
                Ok(None) => {}
                Err(e) => {
                    answers[index] = Some(Err(e));
                    continue;
                }
            }
            // An earlier change of the path left prepared is decided first (`recovery.rs`).
            let planned = match plan(self, project).and_then(|planned| {
                self.decide_prepared_on(project, &store, &[&planned.path])?;
                Ok(planned)
            }) {
                Ok(planned) => planned,
                Err(e) => {
                    answers[index] = Some(Err(e));
                    continue;
                }
            };
            match build_receipt(change, &planned, &store) {
                Ok(receipt) => prepared.push(Prepared {
                    index,
                    planned,
                    receipt,
                }),
                Err(e) => answers[index] = Some(Err(e)),
            }
        }
        // 3, with 4's first half alongside: every prepared receipt durable in one transaction
        // on this thread while the temp files are written and synced on others (a temp file
        // touches nothing anyone can see; the sweep removes one a crash leaves). Nothing is
        // renamed before both are done.
        let receipts: Vec<Receipt> = prepared.iter().map(|p| p.receipt.clone()).collect();
        let prepare_store = Arc::clone(&store);
        let (all_recorded, staged) = self.stage_all(&prepared, move || {
            receipts.is_empty()
                || lock_poisoned(&prepare_store)
                    .insert_prepared_all(&receipts)
                    .is_ok()
        });
        // A helper that could not answer recorded nothing we know of: prepare one by one.
        let all_recorded = all_recorded.unwrap_or(false);
        // Which changes have a durable prepared receipt: all, or (when the one transaction
        // failed) those that could be prepared alone; the others are refused and their temp
        // files dropped (unlinked).
        let recorded: Vec<bool> = if all_recorded {
            vec![true; prepared.len()]
        } else {
            prepared
                .iter()
                .map(
                    |p| match lock_poisoned(&store).insert_prepared(&p.receipt) {
                        Ok(()) => true,
                        Err(e) => {
                            answers[p.index] = Some(Err(e.into()));
                            false
                        }
                    },
                )
                .collect()
        };
        if recorded.iter().any(|r| *r) {
            failpoint::hit(Failpoint::AfterPrepare);
            if staged.iter().any(Option::is_some) {
                failpoint::hit(Failpoint::AfterStage);
            }
        }
        // 4's second half: re-check and rename in order; a failure fails that change alone.
        let outcomes: Vec<Option<Result<(), WorkspaceError>>> = prepared
            .iter()
            .zip(staged)
            .zip(&recorded)
            .map(|((p, staged), recorded)| {
                if !recorded {
                    return None;
                }
                Some(match (staged, &p.planned.action) {
                    (
                        Some(Ok(file)),
                        Action::Replace {
                            parent,
                            name,
                            existing,
                            ..
                        },
                    ) => self.rename_staged(
                        file,
                        parent.as_fd(),
                        name,
                        existing.as_ref(),
                        &p.planned.previous,
                        &p.planned.path,
                    ),
                    (Some(Err(e)), _) => Err(e),
                    _ => self.apply(&p.planned),
                })
            })
            .collect();
        let prepared: Vec<(Prepared, Result<(), WorkspaceError>)> = prepared
            .into_iter()
            .zip(outcomes)
            .filter_map(|(p, outcome)| Some((p, outcome?)))
            .collect();
        let mut marks: Vec<(String, ReceiptState)> = Vec::new();
        let mut applied: Vec<Prepared> = Vec::new();
        for (p, outcome) in prepared {
            match outcome {
                Ok(()) => applied.push(p),
                Err(e) => {
                    // Nothing reached the target (every error of `apply` comes before it).
                    marks.push((p.receipt.receipt_id.clone(), ReceiptState::NotApplied));
                    answers[p.index] = Some(Err(e));
                }
            }
        }
        // 5. Each folder synced once; a change whose folder could not be synced is uncertain.
        let applied = self.sync_folders(applied, &mut answers);
        if !applied.is_empty() {
            failpoint::hit(Failpoint::BeforeMarkApplied);
        }
        // 6. The applied and not_applied marks in one transaction.
        marks.extend(
            applied
                .iter()
                .map(|p| (p.receipt.receipt_id.clone(), ReceiptState::Applied)),
        );
        let marked = match (marks.is_empty(), failpoint::hit(Failpoint::MarkApplied)) {
            (true, _) => Ok(0),
            (false, Hit::Fail) => Err("failpoint".to_owned()),
            (false, Hit::Continue) => {
                let marks: Vec<(&str, ReceiptState)> = marks
                    .iter()
                    .map(|(id, state)| (id.as_str(), *state))
                    .collect();
                lock_poisoned(&store)
                    .set_states_unsynced(&marks)
                    .map_err(|e| e.to_string())
            }
        };
        if !applied.is_empty() {
            failpoint::hit(Failpoint::AfterMarkApplied);
        }
        for mut p in applied {
            let request_id = p.receipt.request_id.clone();
            let answer = match &marked {
                Ok(updated) => {
                    p.receipt.state = ReceiptState::Applied;
                    p.receipt.updated_at_ms = *updated;
                    audit(&p.receipt);
                    Ok(ChangeResponse {
                        state: ReceiptState::Applied,
                        replayed: false,
                        previous_revision: p.receipt.previous_revision.clone(),
                        revision: p.receipt.resulting_revision.clone(),
                        receipt: p.receipt,
                    })
                }
                Err(e) => Err(WorkspaceError::Uncertain {
                    request_id,
                    reason: format!(
                        "the change was made but its receipt could not be confirmed ({e})"
                    ),
                    receipt: Box::new(p.receipt),
                }),
            };
            answers[p.index] = Some(answer);
        }
        answers
            .into_iter()
            .map(|answer| {
                answer.unwrap_or_else(|| {
                    Err(WorkspaceError::InvalidRequest(
                        "the change was not run; retry".into(),
                    ))
                })
            })
            .collect()
    }

    /// Step 4's first half for a batch, with `alongside` (step 3) on a helper thread
    /// meanwhile: each replacement's temp file written, then (for several) every one's
    /// writeback started, then each synced in turn, so the syncs wait for writes already
    /// under way together instead of one after the other. `None` for the other actions, which
    /// stage nothing. `alongside`'s result is `None` when no helper could run it.
    ///
    /// All on this thread: the scoped threads that staged a batch's files at once before cost
    /// more (a thread started and ended for every few files) than the parallel syncs saved.
    fn stage_all<'p, R: Send + 'static>(
        &self,
        prepared: &'p [Prepared],
        alongside: impl FnOnce() -> R + Send + 'static,
    ) -> (
        Option<R>,
        Vec<Option<Result<StagedFile<'p>, WorkspaceError>>>,
    ) {
        let beside = self
            .helpers
            .get_or_init(|| Helpers::start(HELPER_THREADS))
            .run(alongside);
        let mut staged: Vec<Option<Result<StagedFile<'p>, WorkspaceError>>> = prepared
            .iter()
            .map(|p| match &p.planned.action {
                Action::Replace {
                    parent,
                    content,
                    existing,
                    ..
                } => Some(self.stage_unsynced(
                    parent.as_fd(),
                    content,
                    existing.as_ref(),
                    &p.planned.path,
                )),
                _ => None,
            })
            .collect();
        let files = || staged.iter().flatten().flatten();
        if files().nth(1).is_some() {
            files().for_each(StagedFile::start_writeback);
        }
        for (p, file) in prepared.iter().zip(&mut staged) {
            if let Some(Ok(done)) = file
                && let Err(e) = fsync_fd(done.fd(), "fsync staged file", &p.planned.path)
            {
                // Dropping the temp file unlinks it.
                *file = Some(Err(e));
            }
        }
        (beside(), staged)
    }

    /// Step 5 for a batch: fsync every folder the applied changes touched, each once. The
    /// changes whose folder could not be synced are answered `uncertain` (their receipts stay
    /// prepared, reconciled from the disk later); the rest are returned.
    fn sync_folders(
        &self,
        applied: Vec<Prepared>,
        answers: &mut [Option<Answer>],
    ) -> Vec<Prepared> {
        if applied.is_empty() {
            return applied;
        }
        let failed_before = match failpoint::hit(Failpoint::AfterRename) {
            Hit::Continue => None,
            Hit::Fail => Some("failpoint".to_owned()),
        };
        // Folder identity (device, inode) → the sync's outcome.
        let mut synced: HashMap<(u64, u64), Result<(), String>> = HashMap::new();
        let mut kept = Vec::new();
        for p in applied {
            let mut failure = failed_before.clone();
            for folder in folders(&p.planned) {
                if failure.is_some() {
                    break;
                }
                let outcome = match rustix::fs::fstat(folder) {
                    Ok(stat) => synced
                        .entry((stat.st_dev, stat.st_ino))
                        .or_insert_with(|| {
                            fsync_fd(folder, "fsync folder", &p.planned.path)
                                .map_err(|e| e.to_string())
                        })
                        .clone(),
                    Err(e) => Err(format!("fsync folder of {}: {e}", p.planned.path)),
                };
                failure = outcome.err();
            }
            match failure {
                None => kept.push(p),
                Some(error) => {
                    answers[p.index] = Some(Err(WorkspaceError::Uncertain {
                        request_id: p.receipt.request_id.clone(),
                        reason: format!(
                            "the change reached the file but could not be made durable ({error})"
                        ),
                        receipt: Box::new(p.receipt),
                    }));
                }
            }
        }
        failpoint::hit(Failpoint::AfterDirFsync);
        kept
    }
}

/// The folders whose entries a planned change alters.
fn folders(planned: &Planned) -> Vec<BorrowedFd<'_>> {
    match &planned.action {
        Action::Replace { parent, .. } | Action::Delete { parent, .. } => vec![parent.as_fd()],
        Action::Move {
            from_parent,
            to_parent,
            ..
        } => vec![to_parent.as_fd(), from_parent.as_fd()],
    }
}

#[cfg(test)]
impl Workspace {
    /// How many changes wait, untaken, in the project's queue, and whether a batch is running
    /// (tests only).
    fn waiting(&self, project: &str) -> (usize, bool) {
        lock_poisoned(&self.queues)
            .get(project)
            .map(|queue| {
                let state = lock_poisoned(&queue.state);
                (state.waiting.len(), state.leading)
            })
            .unwrap_or((0, false))
    }
}

#[cfg(test)]
mod tests {
    use super::{Workspace, related};
    use crate::lock::ProjectLock;
    use crate::ops::tests::{context, fixture, writable};
    use agentworks_contract::workspaced::WriteRequest;
    use agentworks_core::guard::RelPath;
    use agentworks_core::revision::Revision;
    use std::sync::Arc;
    use std::time::Duration;

    #[test]
    fn related_paths_are_the_same_or_nested_by_component() {
        let p = |s: &str| RelPath::parse(s).unwrap();
        assert!(related(&p("a/b.txt"), &p("a/b.txt")));
        assert!(related(&p("a"), &p("a/b.txt")));
        assert!(related(&p("a/b/c"), &p("a")));
        assert!(!related(&p("a/b.txt"), &p("a/c.txt")));
        assert!(!related(&p("ab"), &p("a")));
        assert!(!related(&p("a/bc"), &p("a/b")));
    }

    fn write(path: &str, content: &str, expected: &str, request_id: &str) -> WriteRequest {
        WriteRequest {
            context: context(writable()),
            path: path.into(),
            content: content.into(),
            expected_revision: expected.into(),
            request_id: request_id.into(),
        }
    }

    /// The project's lock, held as another process would hold it: every write has to queue.
    fn hold_project_lock(ws: &Workspace) -> ProjectLock {
        let lock_path = ws.layout.lock_path(&ws.documents_root().join("demo"));
        ProjectLock::acquire(&lock_path, Duration::from_secs(1)).unwrap()
    }

    /// Sends `requests` one after another, each queued before the next is sent (the first is
    /// the leader's, taken alone, then blocked on `held`), so their order is known; then lets
    /// `held` go and returns every answer, in order.
    async fn queued_in_order(
        ws: &Arc<Workspace>,
        held: ProjectLock,
        requests: &[WriteRequest],
    ) -> Vec<super::Answer> {
        let mut calls = Vec::new();
        for (n, request) in requests.iter().enumerate() {
            let (caller, request) = (Arc::clone(ws), request.clone());
            calls.push(tokio::spawn(async move { caller.write(&request).await }));
            while ws.waiting("demo") != (n, true) {
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
        drop(held);
        let mut answers = Vec::new();
        for call in calls {
            answers.push(call.await.unwrap());
        }
        answers
    }

    /// Waits (up to 5 s) for the project's queue to be empty and its leader gone: the leader
    /// gives up only after its last answer is sent.
    async fn settled(ws: &Workspace) -> (usize, bool) {
        for _ in 0..5000 {
            if ws.waiting("demo") == (0, false) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        ws.waiting("demo")
    }

    /// Writes queued behind the held lock run as one batch: each answered on its own, a stale
    /// revision failing alone, a second write of the same file waiting for the next batch
    /// (so it sees the first), and the same request id twice answered by replay.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn queued_writes_commit_as_one_batch_and_a_stale_one_fails_alone() {
        let f = fixture(&[("old.txt", "old")]);
        let ws = &f.workspace;
        let held = hold_project_lock(ws);
        let stale = Revision::of(b"not what old.txt holds").to_string();
        let requests = [
            write("first.txt", "leader", "missing", "r0"),
            write("a/1.txt", "one", "missing", "r1"),
            write("old.txt", "new", &stale, "r2"),
            write("a/2.txt", "two", "missing", "r3"),
            write("a/1.txt", "again", "missing", "r4"),
            write("a/2.txt", "two", "missing", "r3"),
        ];
        let answers = queued_in_order(ws, held, &requests).await;
        let applied = |n: usize| answers[n].as_ref().unwrap();
        assert!(!applied(0).replayed);
        assert!(!applied(1).replayed && !applied(3).replayed);
        assert_eq!(answers[2].as_ref().unwrap_err().code(), "revision_conflict");
        // The second write of a/1.txt came after the first: it sees the file and conflicts.
        assert_eq!(answers[4].as_ref().unwrap_err().code(), "revision_conflict");
        assert!(applied(5).replayed);
        assert_eq!(applied(5).receipt.receipt_id, applied(3).receipt.receipt_id);
        // r1 and r3 were marked applied in one transaction (one batch): the same time.
        assert_eq!(
            applied(1).receipt.updated_at_ms,
            applied(3).receipt.updated_at_ms
        );
        let read = |p: &str| std::fs::read_to_string(f.project.join(p)).unwrap();
        assert_eq!(read("first.txt"), "leader");
        assert_eq!(read("a/1.txt"), "one");
        assert_eq!(read("a/2.txt"), "two");
        assert_eq!(read("old.txt"), "old");
        // Every receipt agrees with the disk: the conflicts recorded nothing.
        let store = ws.store(&ws.project("demo").unwrap()).unwrap();
        let store = super::lock_poisoned(&store);
        assert!(store.prepared().unwrap().is_empty());
        assert!(store.find("u1", "r2").unwrap().is_none());
        assert!(store.find("u1", "r4").unwrap().is_none());
    }

    /// Changes of one path run one batch each, in order: the leader takes the next batch as
    /// soon as the last is done. Were it to stop early, the next ones would wait until their
    /// lock timeout and be told `busy`.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_leader_runs_batch_after_batch_until_the_queue_is_empty() {
        let mut f = fixture(&[]);
        Arc::get_mut(&mut f.workspace).unwrap().limits.lock_timeout = Duration::from_secs(5);
        let ws = &f.workspace;
        let held = hold_project_lock(ws);
        let requests: Vec<WriteRequest> = (0..5)
            .map(|n| write("same.txt", &format!("v{n}"), "missing", &format!("s{n}")))
            .collect();
        let answers = queued_in_order(ws, held, &requests).await;
        // The first creates the file; each later one finds it there: a conflict, not `busy`.
        assert!(answers[0].is_ok(), "{:?}", answers[0].as_ref().err());
        for answer in &answers[1..] {
            assert_eq!(answer.as_ref().unwrap_err().code(), "revision_conflict");
        }
        assert_eq!(settled(ws).await, (0, false));
    }

    /// A write that waits untaken longer than the lock timeout leaves the queue and is told
    /// `busy`, as a lock wait would be; nothing of it is recorded.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_write_that_waits_past_the_lock_timeout_is_busy_and_leaves_no_trace() {
        let mut f = fixture(&[]);
        Arc::get_mut(&mut f.workspace).unwrap().limits.lock_timeout = Duration::from_millis(200);
        let ws = &f.workspace;
        let held = hold_project_lock(ws);
        let (x, y) = (
            write("x.txt", "x", "missing", "q1"),
            write("y.txt", "y", "missing", "q2"),
        );
        let (leader, waiter) = tokio::join!(ws.write(&x), ws.write(&y));
        drop(held);
        assert_eq!(leader.unwrap_err().code(), "busy");
        assert_eq!(waiter.unwrap_err().code(), "busy");
        assert_eq!(settled(ws).await, (0, false));
        // The queue is usable again once the lock is free.
        ws.write(&write("y.txt", "y", "missing", "q3"))
            .await
            .unwrap();
        assert!(!f.project.join("x.txt").exists());
    }

    /// A caller whose task is dropped while its change waits (its connection closed) does not
    /// stop the change or the queue: the leader makes it, records it, and answers the next.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_caller_that_goes_away_leaves_its_change_to_be_made() {
        let f = fixture(&[]);
        let ws = &f.workspace;
        let held = hold_project_lock(ws);
        let gone = {
            let (ws, request) = (Arc::clone(ws), write("gone.txt", "g", "missing", "g1"));
            tokio::spawn(async move { ws.write(&request).await })
        };
        while ws.waiting("demo") != (0, true) {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        gone.abort();
        assert!(gone.await.unwrap_err().is_cancelled());
        drop(held);
        let next = ws.write(&write("next.txt", "n", "missing", "n1")).await;
        assert!(next.is_ok(), "{:?}", next.err());
        assert_eq!(
            std::fs::read_to_string(f.project.join("gone.txt")).unwrap(),
            "g"
        );
        let store = ws.store(&ws.project("demo").unwrap()).unwrap();
        let recorded = super::lock_poisoned(&store)
            .find("u1", "g1")
            .unwrap()
            .unwrap();
        assert_eq!(recorded.state, crate::receipts::ReceiptState::Applied);
    }
}
