//! workspaced's change protocol as a transition system: what `ops/pipeline.rs`,
//! `ops/group_commit.rs`, `ops/patch_set.rs`, `ops/apply.rs` and `ops/recovery.rs` do, step by
//! step, to the files, the staged temp files and the receipt store, with clients sending,
//! retrying and looking up requests, and the daemon killed or its power cut at any step.
//!
//! Plain Rust with no model checker: `tests/model.rs` explores it with stateright and states
//! the properties, and the crash-point suite (`tests/suite/crash_points.rs` at the root)
//! includes this file to ask it what a crash at each failpoint must leave, then kills the real
//! daemon there and compares. Each step a crash can follow is a [`CrashPoint`], named after the
//! failpoint the code reaches at the same step ([`CrashPoint::failpoint`]).
//!
//! What is abstracted: contents are small numbers (a content is its own revision); two paths,
//! `A` and `B`, in one folder (one folder fsync makes both entries durable), or, in a scenario
//! with [`Config::new_folder`], `B` in a folder of its own that the first change creating `B`
//! makes (its entry durable only once the folder above it is synced); one user (request ids are
//! per user in the code, so one user is where they meet); no outside editor, no lock timeout;
//! I/O errors only where a failpoint's `:fail` injects one ([`Action::Fail`]: a folder sync or
//! the applied mark fails while the daemon keeps running, or a new folder's sync). What is
//! kept exactly: the order of the steps and which of them wait for the disk. The disk keeps, per path, the changes that reached it in order and how many of
//! them are durable (a rename is durable only once its folder is synced); a power cut keeps any
//! prefix of what was not synced, per path (a change whose data was never synced comes back
//! torn). The receipt store keeps what was committed with `synchronous=FULL`, then the
//! commits made without waiting (the group commit's marks) in order; a synced commit makes
//! everything before it durable (SQLite's WAL), and a power cut keeps any prefix of the rest.

#![allow(dead_code)]

/// A file's content, which is also its revision.
pub type Content = u8;
/// No file at the path (`expected_revision: "missing"`).
pub const MISSING: Content = 0;
/// What both paths hold at the start (unless a scenario says otherwise).
pub const INITIAL: Content = 1;
/// A file whose new entry survived a power cut but whose data did not.
pub const TORN: Content = 255;

/// The two paths of the model, `A` and `B`, in one folder.
pub const PATHS: usize = 2;
/// `A`'s and `B`'s index in [`State::files`].
pub const A_PATH: usize = 0;
pub const B_PATH: usize = 1;

/// What a request asks workspaced to do.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Op {
    /// `/v1/write` (and `/v1/patch`): through the group commit.
    Write {
        path: u8,
        expected: Content,
        content: Content,
    },
    /// `/v1/edit` (and `/v1/restore`): a replacement through the one-change pipeline.
    Edit {
        path: u8,
        expected: Content,
        content: Content,
    },
    /// `/v1/delete`.
    Delete { path: u8, expected: Content },
    /// `/v1/move`; the destination must not exist.
    Move { from: u8, to: u8, expected: Content },
    /// `/v1/patch_set`: files in order, each `(path, expected, result)`; a result of
    /// [`MISSING`] deletes the file.
    PatchSet { files: Vec<(u8, Content, Content)> },
}

impl Op {
    /// The receipts the change records: per part, `(path, previous, result)`; a move's one
    /// receipt names its source (its destination is [`Op::move_to`]).
    pub fn parts(&self) -> Vec<(u8, Content, Content)> {
        match self {
            Op::Write {
                path,
                expected,
                content,
            }
            | Op::Edit {
                path,
                expected,
                content,
            } => vec![(*path, *expected, *content)],
            Op::Delete { path, expected } => vec![(*path, *expected, MISSING)],
            Op::Move { from, expected, .. } => vec![(*from, *expected, *expected)],
            Op::PatchSet { files } => files.clone(),
        }
    }

    pub fn move_to(&self) -> Option<u8> {
        match self {
            Op::Move { to, .. } => Some(*to),
            _ => None,
        }
    }

    /// The paths the change alters.
    pub fn paths(&self) -> Vec<u8> {
        let mut paths: Vec<u8> = self.parts().iter().map(|p| p.0).collect();
        paths.extend(self.move_to());
        paths
    }

    fn batched(&self) -> bool {
        matches!(self, Op::Write { .. })
    }
}

/// One request as a client sends it: its id and its payload.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Request {
    pub id: u8,
    pub op: Op,
}

/// A change to the code, to show that a property catches it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Mutation {
    /// The group commit marks its changes applied (and answers) before the folder sync.
    MarkBeforeDirSync,
    /// The group commit releases the project's lock before its applied marks, so the next
    /// batch can prepare and rename before them.
    ReleaseLockBeforeMark,
    /// No folder sync after a rename or unlink.
    SkipDirFsync,
    /// The target is renamed before its prepared receipt is recorded.
    RenameBeforePrepare,
    /// Prepared receipts are committed without waiting for the disk.
    PrepareUnsynced,
    /// The staged file is renamed without its data synced.
    RenameBeforeStageSync,
    /// Recovery and lookups decide from what the disk shows without syncing its folder: the
    /// code before the fix this model found.
    ReconcileWithoutSync,
    /// A request id seen before answers its recorded outcome whatever the payload.
    ReplayIgnoresPayload,
    /// The expected revision is not compared with the file's.
    NoRevisionCheck,
    /// A prepared receipt is decided applied without reading the disk.
    ReconcileGuesses,
    /// A patch set sent again under its id applies the files it had not applied yet.
    SetRetryFinishesSet,
    /// A change is planned on a path whose earlier change is still *prepared* (its folder
    /// sync or its applied mark failed while the daemon kept running) without deciding that
    /// one first: the code before the issue-48 follow-up.
    PlanOverPrepared,
    /// Start-up recovery does not sync the project's folders: a folder made just before a
    /// crash, its entry never synced, stays so while later changes are acknowledged in it.
    NoFolderSyncAtStart,
    /// A folder whose sync failed after its `mkdir` is forgotten: the next change finds it
    /// there and never syncs the folder above it.
    ForgetUnsyncedFolder,
}

/// A scenario: the requests, which client sends which in order, the faults allowed.
#[derive(Clone, Debug)]
pub struct Config {
    pub requests: Vec<Request>,
    /// Each client's requests (indexes into `requests`), sent one after the other.
    pub clients: Vec<Vec<u8>>,
    pub initial: [Content; PATHS],
    /// How many times the daemon may be killed (SIGKILL: the page cache survives).
    pub kills: u8,
    /// How many times the power may be cut (only what was synced survives).
    pub cuts: u8,
    /// Sends of one request (the first and the retries after a lost answer).
    pub attempts: u8,
    /// Whether a client that lost an answer may look its receipt up (`/v1/receipt`).
    pub lookups: bool,
    /// Two requests that expect the same revision of one path: exactly one may apply.
    pub concurrent: Option<(u8, u8)>,
    /// I/O errors the run may inject ([`Action::Fail`]).
    pub faults: u8,
    /// `B` lives in a folder of its own that does not exist at the start (`initial[B]` is
    /// [`MISSING`]); the first change that creates `B` makes it.
    pub new_folder: bool,
    /// The changes to the code this run makes (none: the code as it is).
    pub mutations: Vec<Mutation>,
}

impl Config {
    /// This scenario with `mutation` made too.
    pub fn mutated(&self, mutation: Mutation) -> Config {
        let mut mutated = self.clone();
        mutated.mutations.push(mutation);
        mutated
    }

    fn is(&self, mutation: Mutation) -> bool {
        self.mutations.contains(&mutation)
    }

    fn same_payload(&self, a: u8, b: u8) -> bool {
        self.requests[a as usize] == self.requests[b as usize]
    }

    fn id(&self, req: u8) -> u8 {
        self.requests[req as usize].id
    }

    fn op(&self, req: u8) -> &Op {
        &self.requests[req as usize].op
    }
}

/// A receipt's state, as `receipts.rs` stores it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum RState {
    Prepared,
    Applied,
    NotApplied,
    Uncertain,
}

/// One receipt row: the request id and part it is unique on, and which request's payload it
/// records.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Row {
    pub id: u8,
    pub part: u8,
    pub req: u8,
    pub state: RState,
}

/// The receipt store: rows committed durably, then commits not yet synced, in order.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct Db {
    pub durable: Vec<Row>,
    pub pending: Vec<Vec<Row>>,
}

fn upsert(rows: &mut Vec<Row>, row: Row) {
    match rows
        .iter_mut()
        .find(|r| (r.id, r.part) == (row.id, row.part))
    {
        Some(found) => *found = row,
        None => {
            rows.push(row);
            rows.sort();
        }
    }
}

impl Db {
    /// What a reader sees now: the durable rows and every commit since.
    pub fn visible(&self) -> Vec<Row> {
        self.kept(self.pending.len())
    }

    /// The rows with the first `commits` unsynced commits.
    fn kept(&self, commits: usize) -> Vec<Row> {
        let mut rows = self.durable.clone();
        for commit in &self.pending[..commits] {
            for row in commit {
                upsert(&mut rows, *row);
            }
        }
        rows
    }

    /// A commit with `synchronous=FULL`: it and everything before it durable.
    fn commit_synced(&mut self, rows: &[Row]) {
        let mut all = self.visible();
        for row in rows {
            upsert(&mut all, *row);
        }
        self.durable = all;
        self.pending.clear();
    }

    /// A commit that does not wait for the disk (the group commit's marks).
    fn commit_unsynced(&mut self, rows: &[Row]) {
        self.pending.push(rows.to_vec());
    }

    pub fn rows_of(&self, id: u8) -> Vec<Row> {
        self.visible().into_iter().filter(|r| r.id == id).collect()
    }
}

/// One change that reached a path: which request made it and what it left there.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Change {
    pub req: u8,
    pub content: Content,
    /// Whether the new content's data was synced before its entry (a staged file's fsync).
    pub data_synced: bool,
}

/// A path on disk: the changes that reached it, in order, and how many are durable.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct File {
    pub history: Vec<Change>,
    pub durable: u8,
}

impl File {
    pub fn content(&self, initial: Content) -> Content {
        self.history.last().map_or(initial, |c| c.content)
    }

    /// Whether a change of `req` is on this path now (not undone by a power cut).
    pub fn holds(&self, req: u8) -> bool {
        self.history.iter().any(|c| c.req == req)
    }
}

/// What a client was answered.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Answer {
    /// A change answer (fresh, replayed, or a receipt lookup): the state and the request
    /// whose payload the receipt records.
    Receipt {
        state: RState,
        replayed: bool,
        of: u8,
    },
    /// `revision_conflict`: nothing recorded.
    Conflict,
    /// `request_id_reused`.
    Reused,
    /// A lookup found no receipt.
    NotFound,
    /// An I/O error before anything was recorded (a new folder's sync failed): the caller
    /// may send the request again.
    Failed,
}

/// Where the change (or batch) holding the project's lock is: each is a crash point.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Pc {
    /// The plan made `B`'s folder; the folder above it is not synced yet.
    AfterMkdir,
    ReceiptUnavailable,
    AfterPrepare,
    AfterStage(u8),
    BeforeRename(u8),
    BeforeUnlink(u8),
    AfterRename(u8),
    AfterDirFsync(u8),
    BeforeMarkApplied(u8),
    MarkApplied(u8),
    AfterMarkApplied,
    PatchSetBefore(u8),
    PatchSetRenamed(u8),
    PatchSetApplied(u8),
}

/// Which pipeline a change goes through.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Kind {
    /// `group_commit.rs`: writes queued for the project, taken as one batch.
    Batch,
    /// `pipeline.rs`: edit, delete, move.
    Single,
    /// `patch_set.rs`.
    Set,
}

/// One change of the work under the lock.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Job {
    pub client: u8,
    pub req: u8,
    /// Answered before any step (a replay, a conflict, a reused id).
    pub answer: Option<Answer>,
}

/// The change or batch holding the project's lock.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Work {
    pub kind: Kind,
    pub pc: Pc,
    pub jobs: Vec<Job>,
}

impl Work {
    fn planned(&self) -> Vec<usize> {
        (0..self.jobs.len())
            .filter(|j| self.jobs[*j].answer.is_none())
            .collect()
    }
}

/// The running daemon: requests waiting for the lock (by client, in arrival order) and the
/// work holding it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct Daemon {
    pub waiting: Vec<u8>,
    pub work: Option<Work>,
    /// [`Mutation::ReleaseLockBeforeMark`]: a batch that let the lock go before its marks.
    pub detached: Option<Work>,
}

/// Where a client is with its current request.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Phase {
    /// About to send it (the first time).
    Ready,
    /// Sent; no answer yet.
    Waiting,
    /// Its connection was cut by a crash: no answer.
    Cut,
    /// Every request answered.
    Done,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Client {
    /// Index into its script.
    pub step: u8,
    pub attempts: u8,
    pub looked_up: bool,
    pub phase: Phase,
}

/// What the properties need that the system does not keep.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct Ghost {
    /// Requests answered applied (fresh, replayed or looked up), by request bit.
    pub acked: u32,
    /// Requests answered not applied.
    pub told_not_applied: u32,
    /// A replay answered with the receipt of another payload.
    pub wrong_payload_answer: bool,
    /// A rename or unlink over content other than the one its change was planned on.
    pub lost_update: bool,
    /// Changes made per `(request id, path)`, never undone by a cut: `id * PATHS + path`.
    pub changes: Vec<u8>,
    /// Each request's last answer.
    pub answers: Vec<Option<Answer>>,
}

/// `B`'s folder in a [`Config::new_folder`] scenario (otherwise it is the one folder, always
/// there and durable).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Folder {
    pub exists: bool,
    /// Its entry in the folder above is durable.
    pub durable: bool,
    /// Its sync after the `mkdir` failed and the daemon remembers it: the next change that
    /// creates a file in it syncs the folder above first.
    pub unsynced: bool,
}

/// The whole system.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct State {
    pub files: [File; PATHS],
    pub folder: Folder,
    /// Staged temp files on disk.
    pub temps: u8,
    pub db: Db,
    /// `None` while the daemon is down.
    pub daemon: Option<Daemon>,
    pub clients: Vec<Client>,
    pub kills: u8,
    pub cuts: u8,
    pub faults: u8,
    pub ghost: Ghost,
}

/// Every crash point, named after its failpoint. A crash while no change holds the lock is
/// [`CrashPoint::BeforeLock`]: any request is still waiting for it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum CrashPoint {
    BeforeLock,
    AfterMkdir,
    ReceiptUnavailable,
    AfterPrepare,
    AfterStage,
    BeforeRename,
    BeforeUnlink,
    AfterRename,
    AfterDirFsync,
    BeforeMarkApplied,
    MarkApplied,
    AfterMarkApplied,
    /// Numbered by file, from 1.
    PatchSetBefore(u8),
    PatchSetRenamed(u8),
    PatchSetApplied(u8),
}

impl CrashPoint {
    /// Every crash point (a patch set's for its first and second file).
    pub const ALL: [CrashPoint; 18] = [
        CrashPoint::BeforeLock,
        CrashPoint::AfterMkdir,
        CrashPoint::ReceiptUnavailable,
        CrashPoint::AfterPrepare,
        CrashPoint::AfterStage,
        CrashPoint::BeforeRename,
        CrashPoint::BeforeUnlink,
        CrashPoint::AfterRename,
        CrashPoint::AfterDirFsync,
        CrashPoint::BeforeMarkApplied,
        CrashPoint::MarkApplied,
        CrashPoint::AfterMarkApplied,
        CrashPoint::PatchSetBefore(1),
        CrashPoint::PatchSetBefore(2),
        CrashPoint::PatchSetRenamed(1),
        CrashPoint::PatchSetRenamed(2),
        CrashPoint::PatchSetApplied(1),
        CrashPoint::PatchSetApplied(2),
    ];

    /// The failpoint's name (`AGENTWORKS_FAILPOINT`), with a patch set's file number.
    pub fn failpoint(self) -> (&'static str, Option<u8>) {
        match self {
            CrashPoint::BeforeLock => ("before_lock", None),
            CrashPoint::AfterMkdir => ("after_mkdir", None),
            CrashPoint::ReceiptUnavailable => ("receipt_unavailable", None),
            CrashPoint::AfterPrepare => ("after_prepare", None),
            CrashPoint::AfterStage => ("after_stage", None),
            CrashPoint::BeforeRename => ("before_rename", None),
            CrashPoint::BeforeUnlink => ("before_unlink", None),
            CrashPoint::AfterRename => ("after_rename", None),
            CrashPoint::AfterDirFsync => ("after_dir_fsync", None),
            CrashPoint::BeforeMarkApplied => ("before_mark_applied", None),
            CrashPoint::MarkApplied => ("mark_applied", None),
            CrashPoint::AfterMarkApplied => ("after_mark_applied", None),
            CrashPoint::PatchSetBefore(n) => ("patch_set_before", Some(n)),
            CrashPoint::PatchSetRenamed(n) => ("patch_set_renamed", Some(n)),
            CrashPoint::PatchSetApplied(n) => ("patch_set_applied", Some(n)),
        }
    }

    /// The `AGENTWORKS_FAILPOINT` value that stops the daemon here.
    pub fn spec(self) -> String {
        match self.failpoint() {
            (name, Some(n)) => format!("{name}_{n}"),
            (name, None) => name.to_owned(),
        }
    }

    fn of(pc: Pc) -> CrashPoint {
        match pc {
            Pc::AfterMkdir => CrashPoint::AfterMkdir,
            Pc::ReceiptUnavailable => CrashPoint::ReceiptUnavailable,
            Pc::AfterPrepare => CrashPoint::AfterPrepare,
            Pc::AfterStage(_) => CrashPoint::AfterStage,
            Pc::BeforeRename(_) => CrashPoint::BeforeRename,
            Pc::BeforeUnlink(_) => CrashPoint::BeforeUnlink,
            Pc::AfterRename(_) => CrashPoint::AfterRename,
            Pc::AfterDirFsync(_) => CrashPoint::AfterDirFsync,
            Pc::BeforeMarkApplied(_) => CrashPoint::BeforeMarkApplied,
            Pc::MarkApplied(_) => CrashPoint::MarkApplied,
            Pc::AfterMarkApplied => CrashPoint::AfterMarkApplied,
            Pc::PatchSetBefore(f) => CrashPoint::PatchSetBefore(f + 1),
            Pc::PatchSetRenamed(f) => CrashPoint::PatchSetRenamed(f + 1),
            Pc::PatchSetApplied(f) => CrashPoint::PatchSetApplied(f + 1),
        }
    }
}

/// One transition.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Action {
    /// The client sends its request (again, after a lost answer).
    Send(u8),
    /// The client that lost an answer looks its receipt up.
    Lookup(u8),
    /// The batch leader takes the waiting writes it may take as one batch.
    TakeBatch,
    /// The waiting edit, delete, move or patch set of this client takes the lock.
    TakeLock(u8),
    /// The work under the lock does its next step.
    Step,
    /// [`Mutation::ReleaseLockBeforeMark`]: the detached batch does its next step.
    StepDetached,
    /// The step the work under the lock is at fails with an I/O error (a failpoint's
    /// `:fail`): the new folder's sync, the folders' sync after the renames, or the applied
    /// mark. The daemon keeps running.
    Fail,
    /// SIGKILL.
    Kill,
    /// The power goes: per path how many changes stay, and how many unsynced commits.
    PowerCut { kept: [u8; PATHS], commits: u8 },
    /// Start again: sweep, reconcile every prepared receipt, serve.
    Restart,
}

/// The model of one scenario.
#[derive(Clone, Debug)]
pub struct Protocol {
    pub config: Config,
}

impl Protocol {
    pub fn new(config: Config) -> Protocol {
        // A patch set makes its folders at its own turn, after its receipts: not modelled.
        assert!(
            !config.new_folder
                || config
                    .requests
                    .iter()
                    .all(|r| !matches!(r.op, Op::PatchSet { .. })),
            "a new-folder scenario has no patch set"
        );
        Protocol { config }
    }

    pub fn init(&self) -> State {
        let c = &self.config;
        State {
            files: Default::default(),
            folder: Folder {
                exists: !c.new_folder,
                durable: !c.new_folder,
                unsynced: false,
            },
            temps: 0,
            db: Db::default(),
            daemon: Some(Daemon::default()),
            clients: c
                .clients
                .iter()
                .map(|script| Client {
                    step: 0,
                    attempts: 0,
                    looked_up: false,
                    phase: if script.is_empty() {
                        Phase::Done
                    } else {
                        Phase::Ready
                    },
                })
                .collect(),
            kills: 0,
            cuts: 0,
            faults: 0,
            ghost: Ghost {
                changes: vec![0; 16 * PATHS],
                answers: vec![None; c.requests.len()],
                ..Ghost::default()
            },
        }
    }

    pub fn content(&self, s: &State, path: u8) -> Content {
        s.files[path as usize].content(self.config.initial[path as usize])
    }

    /// The request client `c` is on.
    pub fn current(&self, s: &State, c: u8) -> u8 {
        self.config.clients[c as usize][s.clients[c as usize].step as usize]
    }

    /// Where a crash now would stop the daemon.
    pub fn crash_point(&self, s: &State) -> CrashPoint {
        match s.daemon.as_ref().and_then(|d| d.work.as_ref()) {
            Some(work) => CrashPoint::of(work.pc),
            None => CrashPoint::BeforeLock,
        }
    }

    pub fn actions(&self, s: &State) -> Vec<Action> {
        let c = &self.config;
        let mut actions = Vec::new();
        let Some(daemon) = &s.daemon else {
            actions.push(Action::Restart);
            return actions;
        };
        for (i, client) in s.clients.iter().enumerate() {
            let i = i as u8;
            match client.phase {
                Phase::Ready => actions.push(Action::Send(i)),
                Phase::Cut => {
                    if client.attempts < c.attempts {
                        actions.push(Action::Send(i));
                    }
                    if c.lookups && !client.looked_up && daemon.work.is_none() {
                        actions.push(Action::Lookup(i));
                    }
                }
                Phase::Waiting | Phase::Done => {}
            }
        }
        if daemon.work.is_none() {
            if daemon
                .waiting
                .iter()
                .any(|w| c.op(self.current(s, *w)).batched())
            {
                actions.push(Action::TakeBatch);
            }
            for w in &daemon.waiting {
                if !c.op(self.current(s, *w)).batched() {
                    actions.push(Action::TakeLock(*w));
                }
            }
        } else {
            actions.push(Action::Step);
            if s.faults < c.faults && daemon.work.as_ref().is_some_and(|w| self.can_fail(w)) {
                actions.push(Action::Fail);
            }
        }
        if daemon.detached.is_some() {
            actions.push(Action::StepDetached);
        }
        if s.kills < c.kills {
            actions.push(Action::Kill);
        }
        if s.cuts < c.cuts {
            let ranges: Vec<(u8, u8)> = s
                .files
                .iter()
                .map(|f| (f.durable, f.history.len() as u8))
                .collect();
            for a in ranges[0].0..=ranges[0].1 {
                for b in ranges[1].0..=ranges[1].1 {
                    for commits in 0..=s.db.pending.len() as u8 {
                        actions.push(Action::PowerCut {
                            kept: [a, b],
                            commits,
                        });
                    }
                }
            }
        }
        actions
    }

    pub fn next(&self, s: &State, action: &Action) -> Option<State> {
        let mut s = s.clone();
        match *action {
            Action::Send(c) => {
                let client = &mut s.clients[c as usize];
                client.phase = Phase::Waiting;
                client.attempts += 1;
                s.daemon.as_mut()?.waiting.push(c);
            }
            Action::Lookup(c) => self.lookup(&mut s, c),
            Action::TakeBatch => self.take_batch(&mut s),
            Action::TakeLock(c) => self.take_lock(&mut s, c),
            Action::Step => {
                let work = s.daemon.as_mut()?.work.take()?;
                let work = self.step(&mut s, work, false);
                s.daemon.as_mut()?.work = work;
            }
            Action::StepDetached => {
                let work = s.daemon.as_mut()?.detached.take()?;
                let work = self.step(&mut s, work, true);
                s.daemon.as_mut()?.detached = work;
            }
            Action::Fail => {
                s.faults += 1;
                let work = s.daemon.as_mut()?.work.take()?;
                let work = self.fail(&mut s, work);
                s.daemon.as_mut()?.work = work;
            }
            Action::Kill => {
                s.kills += 1;
                self.down(&mut s);
            }
            Action::PowerCut { kept, commits } => {
                s.cuts += 1;
                self.down(&mut s);
                for (file, kept) in s.files.iter_mut().zip(kept) {
                    file.history.truncate(kept as usize);
                    for change in &mut file.history[file.durable as usize..] {
                        if !change.data_synced {
                            change.content = TORN;
                            change.data_synced = true;
                        }
                    }
                    file.durable = kept;
                }
                s.db.durable = s.db.kept(commits as usize);
                s.db.pending.clear();
                // A folder whose entry was never synced is gone, with everything in it.
                if !s.folder.durable {
                    s.folder = Folder {
                        exists: false,
                        durable: false,
                        unsynced: false,
                    };
                    s.files[B_PATH] = File::default();
                }
            }
            Action::Restart => self.restart(&mut s),
        }
        Some(s)
    }

    /// The daemon dies: every waiting caller loses its answer, and what it kept in memory
    /// goes with it.
    fn down(&self, s: &mut State) {
        s.daemon = None;
        s.folder.unsynced = false;
        for client in &mut s.clients {
            if client.phase == Phase::Waiting {
                client.phase = Phase::Cut;
            }
        }
    }

    /// `recover`: sweep the temp files and sync every folder of the project (so a folder
    /// made before the crash, its entry not yet synced, is durable before anything is
    /// acknowledged in it), reconcile every prepared receipt; then serve.
    fn restart(&self, s: &mut State) {
        s.temps = 0;
        if !self.config.is(Mutation::NoFolderSyncAtStart) {
            self.sync_folders_of(s, &[A_PATH as u8, B_PATH as u8]);
        }
        for row in s.db.visible() {
            if row.state == RState::Prepared {
                self.reconcile(s, row);
            }
        }
        s.daemon = Some(Daemon::default());
    }

    /// `reconcile`: decide a prepared receipt from the disk (its folder synced first) and
    /// record the decision durably.
    fn reconcile(&self, s: &mut State, row: Row) -> RState {
        let c = &self.config;
        let op = c.op(row.req);
        if !c.is(Mutation::ReconcileWithoutSync) {
            self.sync_folders_of(s, &op.paths());
        }
        let (path, previous, result) = op.parts()[row.part as usize];
        let at = self.content(s, path);
        let state = if c.is(Mutation::ReconcileGuesses) {
            RState::Applied
        } else if let Some(to) = op.move_to() {
            let at_to = self.content(s, to);
            if at == MISSING && at_to == result {
                RState::Applied
            } else if at == previous && at_to == MISSING {
                RState::NotApplied
            } else {
                RState::Uncertain
            }
        } else if at == result {
            RState::Applied
        } else if at == previous {
            RState::NotApplied
        } else {
            RState::Uncertain
        };
        s.db.commit_synced(&[Row { state, ..row }]);
        state
    }

    /// `/v1/receipt` (under the lock): every row of the id, the prepared ones reconciled.
    fn lookup(&self, s: &mut State, c: u8) {
        let req = self.current(s, c);
        let rows = s.db.rows_of(self.config.id(req));
        let mut states = Vec::new();
        for row in &rows {
            states.push(if row.state == RState::Prepared {
                self.reconcile(s, *row)
            } else {
                row.state
            });
        }
        s.clients[c as usize].looked_up = true;
        let answer = match rows.first() {
            None => Answer::NotFound,
            Some(first) => Answer::Receipt {
                state: set_state(&states),
                replayed: true,
                of: first.req,
            },
        };
        self.answered(s, c, req, answer, answer != Answer::NotFound, true);
    }

    /// Record `answer` to client `c` for `req`; with `done` the client goes on to its next
    /// request, else it may send this one again. A `lookup` asks by id alone, so its answer
    /// speaks for the payload its receipt records (`of`), which the caller compares with its
    /// own; a change request's replay must be of its own payload.
    fn answered(&self, s: &mut State, c: u8, req: u8, answer: Answer, done: bool, lookup: bool) {
        let g = &mut s.ghost;
        if let Answer::Receipt { state, of, .. } = answer {
            if !lookup && !self.config.same_payload(of, req) {
                g.wrong_payload_answer = true;
            }
            let about = if lookup { of } else { req };
            match state {
                RState::Applied => g.acked |= 1 << about,
                RState::NotApplied => g.told_not_applied |= 1 << about,
                _ => {}
            }
        }
        g.answers[req as usize] = Some(answer);
        let client = &mut s.clients[c as usize];
        if done {
            client.step += 1;
            client.attempts = 0;
            client.looked_up = false;
            client.phase = if (client.step as usize) < self.config.clients[c as usize].len() {
                Phase::Ready
            } else {
                Phase::Done
            };
        } else {
            client.phase = Phase::Cut;
        }
    }

    /// Steps 1 and 2 of a change, under the lock: replay what is recorded under the id (the
    /// prepared rows reconciled), refuse another payload, or check the revisions.
    fn replay_or_plan(&self, s: &mut State, req: u8) -> Option<Answer> {
        let c = &self.config;
        let rows = s.db.rows_of(c.id(req));
        if let Some(first) = rows.first() {
            let same = match c.op(req) {
                Op::PatchSet { files } => {
                    rows.len() == files.len() && rows.iter().all(|r| c.same_payload(r.req, req))
                }
                _ => c.same_payload(first.req, req),
            };
            if !same && !c.is(Mutation::ReplayIgnoresPayload) {
                return Some(Answer::Reused);
            }
            if c.is(Mutation::SetRetryFinishesSet)
                && matches!(c.op(req), Op::PatchSet { .. })
                && rows.iter().any(|r| r.state == RState::NotApplied)
            {
                return None;
            }
            let mut states = Vec::new();
            for row in &rows {
                states.push(if row.state == RState::Prepared {
                    self.reconcile(s, *row)
                } else {
                    row.state
                });
            }
            return Some(Answer::Receipt {
                state: set_state(&states),
                replayed: true,
                of: first.req,
            });
        }
        // An earlier change of these paths still prepared (its folder sync or its applied
        // mark failed while the daemon ran on) is decided from the disk first, before this
        // change can make it look like something else.
        if !c.is(Mutation::PlanOverPrepared) {
            let paths = c.op(req).paths();
            for row in s.db.visible() {
                let touches = self.row_paths(row).iter().any(|p| paths.contains(p));
                if row.state == RState::Prepared && touches {
                    self.reconcile(s, row);
                }
            }
        }
        if c.is(Mutation::NoRevisionCheck) {
            return None;
        }
        let op = c.op(req);
        let fits = op
            .parts()
            .iter()
            .all(|(path, expected, _)| self.content(s, *path) == *expected)
            && op.move_to().is_none_or(|to| self.content(s, to) == MISSING);
        (!fits).then_some(Answer::Conflict)
    }

    /// The batch leader takes the waiting writes from the front, in order, up to the first
    /// of a path already taken or an id already taken; then steps 1 and 2 for each.
    fn take_batch(&self, s: &mut State) {
        let c = &self.config;
        let Some(daemon) = s.daemon.as_mut() else {
            return;
        };
        let mut jobs: Vec<Job> = Vec::new();
        let mut rest = Vec::new();
        let mut stopped = false;
        for w in std::mem::take(&mut daemon.waiting) {
            let req = c.clients[w as usize][s.clients[w as usize].step as usize];
            if !c.op(req).batched() {
                rest.push(w);
                continue;
            }
            let clash = jobs
                .iter()
                .any(|j| c.op(j.req).paths() == c.op(req).paths() || c.id(j.req) == c.id(req));
            if stopped || clash {
                stopped = true;
                rest.push(w);
                continue;
            }
            jobs.push(Job {
                client: w,
                req,
                answer: None,
            });
        }
        daemon.waiting = rest;
        for job in &mut jobs {
            job.answer = self.replay_or_plan(s, job.req);
        }
        let made = self.make_folder(s, &jobs);
        let mut work = Work {
            kind: Kind::Batch,
            pc: made.unwrap_or(Pc::ReceiptUnavailable),
            jobs,
        };
        if work.planned().is_empty() {
            work.pc = Pc::MarkApplied(0);
        }
        if let Some(daemon) = s.daemon.as_mut() {
            daemon.work = Some(work);
        }
    }

    /// The paths a receipt row's change touches: its part's path and a move's destination.
    pub fn row_paths(&self, row: Row) -> Vec<u8> {
        let op = self.config.op(row.req);
        let mut paths = vec![op.parts()[row.part as usize].0];
        paths.extend(op.move_to());
        paths
    }

    /// An edit, delete, move or patch set takes the lock; steps 1 and 2.
    fn take_lock(&self, s: &mut State, client: u8) {
        let req = self.current(s, client);
        if let Some(daemon) = s.daemon.as_mut() {
            daemon.waiting.retain(|w| *w != client);
        }
        let answer = self.replay_or_plan(s, req);
        let kind = match self.config.op(req) {
            Op::PatchSet { .. } => Kind::Set,
            _ => Kind::Single,
        };
        let jobs = vec![Job {
            client,
            req,
            answer,
        }];
        let made = self.make_folder(s, &jobs);
        let work = Work {
            kind,
            pc: made.unwrap_or(Pc::ReceiptUnavailable),
            jobs,
        };
        if answer.is_some() {
            self.finish(s, &work);
        } else if let Some(daemon) = s.daemon.as_mut() {
            daemon.work = Some(work);
        }
    }

    /// The prepared receipts of `jobs`, recorded in one transaction.
    fn prepare(&self, s: &mut State, reqs: &[u8]) {
        let c = &self.config;
        let mut rows = Vec::new();
        for req in reqs {
            for part in 0..c.op(*req).parts().len() as u8 {
                let existing =
                    s.db.visible()
                        .into_iter()
                        .find(|r| (r.id, r.part) == (c.id(*req), part));
                // A set finished by its retry (mutation) keeps its rows.
                if existing.is_none() {
                    rows.push(Row {
                        id: c.id(*req),
                        part,
                        req: *req,
                        state: RState::Prepared,
                    });
                }
            }
        }
        if c.is(Mutation::PrepareUnsynced) {
            s.db.commit_unsynced(&rows);
        } else {
            s.db.commit_synced(&rows);
        }
    }

    /// The change of `req`'s part `part` reaches the disk: a staged file renamed over (or to)
    /// its path, an unlink, or a move.
    fn apply(&self, s: &mut State, req: u8, part: u8) {
        let c = &self.config;
        let op = c.op(req).clone();
        let (path, previous, result) = op.parts()[part as usize];
        let id = c.id(req) as usize;
        if self.content(s, path) != previous {
            s.ghost.lost_update = true;
        }
        let staged = result != MISSING && op.move_to().is_none();
        let change = Change {
            req,
            content: result,
            data_synced: !(staged && c.is(Mutation::RenameBeforeStageSync)),
        };
        s.files[path as usize].history.push(Change {
            content: if op.move_to().is_some() {
                MISSING
            } else {
                change.content
            },
            ..change
        });
        s.ghost.changes[id * PATHS + path as usize] += 1;
        if let Some(to) = op.move_to() {
            s.files[to as usize].history.push(Change {
                req,
                content: result,
                data_synced: true,
            });
            s.ghost.changes[id * PATHS + to as usize] += 1;
        }
        if staged {
            s.temps = s.temps.saturating_sub(1);
        }
    }

    /// The folder sync after a change of `paths` (unless the mutation skips it).
    fn sync_folder(&self, s: &mut State, paths: &[u8]) {
        if self.config.is(Mutation::SkipDirFsync) {
            return;
        }
        self.sync_folders_of(s, paths);
    }

    /// Sync the folder that holds each of `paths`: its entries durable. `A`'s folder is the
    /// project's, which holds `B`'s folder's entry too when `B` has one of its own.
    fn sync_folders_of(&self, s: &mut State, paths: &[u8]) {
        for path in paths {
            if *path as usize == B_PATH && self.config.new_folder {
                if s.folder.exists {
                    s.files[B_PATH].durable = s.files[B_PATH].history.len() as u8;
                }
            } else {
                s.files[A_PATH].durable = s.files[A_PATH].history.len() as u8;
                if self.config.new_folder {
                    s.folder.durable = s.folder.exists;
                } else {
                    s.files[B_PATH].durable = s.files[B_PATH].history.len() as u8;
                }
            }
        }
    }

    /// Whether `req` creates a file in `B`'s own folder (a write or move to `B` that expects
    /// it missing), which makes the folder if it is not there.
    fn creates_in_folder(&self, req: u8) -> bool {
        let op = self.config.op(req);
        self.config.new_folder
            && (op.move_to() == Some(B_PATH as u8)
                || op.parts().iter().any(|(path, expected, result)| {
                    *path as usize == B_PATH && *expected == MISSING && *result != MISSING
                }))
    }

    /// The plan's `confine::open_dir_creating` for the planned jobs that create in `B`'s
    /// folder: `Some(Pc::AfterMkdir)` if it makes the folder (the folder above not yet
    /// synced); a folder remembered unsynced is synced now.
    fn make_folder(&self, s: &mut State, jobs: &[Job]) -> Option<Pc> {
        let needed = jobs
            .iter()
            .any(|j| j.answer.is_none() && self.creates_in_folder(j.req));
        if !needed {
            return None;
        }
        if !s.folder.exists {
            s.folder.exists = true;
            s.folder.durable = false;
            return Some(Pc::AfterMkdir);
        }
        if s.folder.unsynced {
            s.folder.durable = true;
            s.folder.unsynced = false;
        }
        None
    }

    /// Whether [`Action::Fail`] can come at the work's step: a step whose failpoint takes
    /// `:fail` and leaves the daemon running.
    fn can_fail(&self, work: &Work) -> bool {
        match (work.kind, work.pc) {
            (_, Pc::AfterMkdir) => true,
            (Kind::Set, _) => false,
            (Kind::Batch, Pc::AfterRename(1)) => false,
            (_, Pc::AfterRename(_) | Pc::MarkApplied(_)) => !work.planned().is_empty(),
            _ => false,
        }
    }

    /// [`Action::Fail`] at the work's step; the work that goes on, if any.
    fn fail(&self, s: &mut State, mut work: Work) -> Option<Work> {
        match work.pc {
            Pc::AfterMkdir => {
                // `open_dir_creating` reports the sync's error: the changes that needed the
                // folder are refused before anything is recorded; the folder stays, its entry
                // not durable, remembered unless the mutation forgets it.
                if !self.config.is(Mutation::ForgetUnsyncedFolder) {
                    s.folder.unsynced = true;
                }
                for job in &mut work.jobs {
                    if job.answer.is_none() && self.creates_in_folder(job.req) {
                        job.answer = Some(Answer::Failed);
                    }
                }
                if work.planned().is_empty() {
                    self.finish(s, &work);
                    return None;
                }
                work.pc = Pc::ReceiptUnavailable;
                Some(work)
            }
            _ => {
                // The folders' sync or the applied mark failed after the renames: each
                // planned change is answered `uncertain`, its receipt left prepared (decided
                // from the disk later); the lock is released.
                for job in &work.jobs {
                    let answer = job.answer.unwrap_or(Answer::Receipt {
                        state: RState::Uncertain,
                        replayed: false,
                        of: job.req,
                    });
                    let done = job.answer.is_some_and(|a| a != Answer::Failed);
                    self.answered(s, job.client, job.req, answer, done, false);
                }
                None
            }
        }
    }

    /// One step of the work under the lock (or detached); `None` when it is done.
    fn step(&self, s: &mut State, mut work: Work, detached: bool) -> Option<Work> {
        match work.kind {
            Kind::Batch => self.step_batch(s, &mut work, detached),
            Kind::Single => self.step_single(s, &mut work),
            Kind::Set => self.step_set(s, &mut work),
        }
        .then_some(work)
    }

    /// `run_batch`, from the receipts built on. False when the batch is done.
    fn step_batch(&self, s: &mut State, work: &mut Work, detached: bool) -> bool {
        let c = &self.config;
        let planned = work.planned();
        let reqs: Vec<u8> = planned.iter().map(|j| work.jobs[*j].req).collect();
        let next_rename = |after: Option<u8>| -> Pc {
            let at = after.map_or(0, |a| a as usize + 1);
            match planned.iter().find(|j| **j >= at) {
                Some(j) => Pc::BeforeRename(*j as u8),
                None => Pc::AfterRename(0),
            }
        };
        work.pc = match work.pc {
            Pc::AfterMkdir => {
                self.sync_folders_of(s, &[A_PATH as u8]);
                Pc::ReceiptUnavailable
            }
            Pc::ReceiptUnavailable => {
                if c.is(Mutation::RenameBeforePrepare) {
                    s.temps += reqs.len() as u8;
                    Pc::AfterStage(0)
                } else {
                    // The prepared transaction and the staged files, both done.
                    self.prepare(s, &reqs);
                    s.temps += reqs.len() as u8;
                    Pc::AfterPrepare
                }
            }
            Pc::AfterPrepare => Pc::AfterStage(0),
            Pc::AfterStage(_) => next_rename(None),
            Pc::BeforeRename(j) => {
                self.apply(s, work.jobs[j as usize].req, 0);
                next_rename(Some(j))
            }
            // The mutation's folder sync, after the answers.
            Pc::AfterRename(1) => {
                self.sync_folder(s, &self.paths_of(&reqs));
                return false;
            }
            Pc::AfterRename(_) => {
                if c.is(Mutation::RenameBeforePrepare) {
                    self.prepare(s, &reqs);
                }
                if c.is(Mutation::MarkBeforeDirSync) {
                    Pc::BeforeMarkApplied(0)
                } else {
                    self.sync_folder(s, &self.paths_of(&reqs));
                    Pc::AfterDirFsync(0)
                }
            }
            Pc::AfterDirFsync(_) => {
                if c.is(Mutation::ReleaseLockBeforeMark) && !detached {
                    // The lock goes; the rest of the batch runs beside the next one.
                    let mut rest = work.clone();
                    rest.pc = Pc::BeforeMarkApplied(0);
                    if let Some(daemon) = s.daemon.as_mut() {
                        daemon.detached = Some(rest);
                    }
                    return false;
                }
                Pc::BeforeMarkApplied(0)
            }
            Pc::BeforeMarkApplied(_) => Pc::MarkApplied(0),
            Pc::MarkApplied(_) => {
                if planned.is_empty() {
                    self.finish(s, work);
                    return false;
                }
                let marks: Vec<Row> = reqs
                    .iter()
                    .map(|req| Row {
                        id: c.id(*req),
                        part: 0,
                        req: *req,
                        state: RState::Applied,
                    })
                    .collect();
                s.db.commit_unsynced(&marks);
                Pc::AfterMarkApplied
            }
            Pc::AfterMarkApplied => {
                self.finish(s, work);
                if c.is(Mutation::MarkBeforeDirSync) {
                    // The answers are out; the folder is synced after them.
                    work.pc = Pc::AfterRename(1);
                    return true;
                }
                return false;
            }
            other => unreachable!("a batch is never at {other:?}"),
        };
        true
    }

    /// `change_in_flight`, from the receipt built on. False when the change is done.
    fn step_single(&self, s: &mut State, work: &mut Work) -> bool {
        let c = &self.config;
        let req = work.jobs[0].req;
        let op = c.op(req).clone();
        let apply_pc = match op {
            Op::Delete { .. } => Pc::BeforeUnlink(0),
            _ => Pc::BeforeRename(0),
        };
        work.pc = match work.pc {
            Pc::AfterMkdir => {
                self.sync_folders_of(s, &[A_PATH as u8]);
                Pc::ReceiptUnavailable
            }
            Pc::ReceiptUnavailable => {
                if c.is(Mutation::RenameBeforePrepare) {
                    if matches!(op, Op::Edit { .. }) {
                        s.temps += 1;
                        Pc::AfterStage(0)
                    } else {
                        apply_pc
                    }
                } else {
                    self.prepare(s, &[req]);
                    Pc::AfterPrepare
                }
            }
            Pc::AfterPrepare => match op {
                Op::Edit { .. } => {
                    s.temps += 1;
                    Pc::AfterStage(0)
                }
                _ => apply_pc,
            },
            Pc::AfterStage(_) => Pc::BeforeRename(0),
            Pc::BeforeRename(_) | Pc::BeforeUnlink(_) => {
                self.apply(s, req, 0);
                Pc::AfterRename(0)
            }
            Pc::AfterRename(_) => {
                if c.is(Mutation::RenameBeforePrepare) {
                    self.prepare(s, &[req]);
                }
                self.sync_folder(s, &op.paths());
                Pc::AfterDirFsync(0)
            }
            Pc::AfterDirFsync(_) => Pc::BeforeMarkApplied(0),
            Pc::BeforeMarkApplied(_) => Pc::MarkApplied(0),
            Pc::MarkApplied(_) => {
                s.db.commit_synced(&[Row {
                    id: c.id(req),
                    part: 0,
                    req,
                    state: RState::Applied,
                }]);
                Pc::AfterMarkApplied
            }
            Pc::AfterMarkApplied => {
                self.finish(s, work);
                return false;
            }
            other => unreachable!("a change is never at {other:?}"),
        };
        true
    }

    /// `patch_set`, from the receipts built on. False when the set is done.
    fn step_set(&self, s: &mut State, work: &mut Work) -> bool {
        let c = &self.config;
        let req = work.jobs[0].req;
        let parts = c.op(req).parts();
        let deletes = |f: u8| parts[f as usize].2 == MISSING;
        // With the retry mutation, the files already applied are skipped.
        let done_before = |s: &State, f: u8| {
            s.db.visible()
                .iter()
                .any(|r| r.id == c.id(req) && r.part == f && r.state == RState::Applied)
        };
        work.pc = match work.pc {
            Pc::ReceiptUnavailable => {
                self.prepare(s, &[req]);
                Pc::AfterPrepare
            }
            Pc::AfterPrepare => Pc::PatchSetBefore(0),
            Pc::PatchSetBefore(f) => {
                if done_before(s, f) {
                    if (f as usize) + 1 < parts.len() {
                        Pc::PatchSetBefore(f + 1)
                    } else {
                        self.finish_set(s, work);
                        return false;
                    }
                } else if deletes(f) {
                    Pc::BeforeUnlink(f)
                } else {
                    s.temps += 1;
                    Pc::AfterStage(f)
                }
            }
            Pc::AfterStage(f) => Pc::BeforeRename(f),
            Pc::BeforeRename(f) | Pc::BeforeUnlink(f) => {
                self.apply(s, req, f);
                Pc::AfterRename(f)
            }
            Pc::AfterRename(f) => {
                self.sync_folder(s, &[parts[f as usize].0]);
                Pc::AfterDirFsync(f)
            }
            Pc::AfterDirFsync(f) => Pc::PatchSetRenamed(f),
            Pc::PatchSetRenamed(f) => Pc::MarkApplied(f),
            Pc::MarkApplied(f) => {
                s.db.commit_synced(&[Row {
                    id: c.id(req),
                    part: f,
                    req,
                    state: RState::Applied,
                }]);
                Pc::PatchSetApplied(f)
            }
            Pc::PatchSetApplied(f) => {
                if (f as usize) + 1 < parts.len() {
                    Pc::PatchSetBefore(f + 1)
                } else {
                    self.finish_set(s, work);
                    return false;
                }
            }
            other => unreachable!("a patch set is never at {other:?}"),
        };
        true
    }

    fn finish_set(&self, s: &mut State, work: &Work) {
        let job = &work.jobs[0];
        let rows = s.db.rows_of(self.config.id(job.req));
        let states: Vec<RState> = rows.iter().map(|r| r.state).collect();
        let answer = Answer::Receipt {
            state: set_state(&states),
            replayed: false,
            of: job.req,
        };
        self.answered(s, job.client, job.req, answer, true, false);
    }

    /// Every job of the work answered; the lock released.
    fn finish(&self, s: &mut State, work: &Work) {
        for job in &work.jobs {
            let answer = job.answer.unwrap_or(Answer::Receipt {
                state: RState::Applied,
                replayed: false,
                of: job.req,
            });
            self.answered(
                s,
                job.client,
                job.req,
                answer,
                answer != Answer::Failed,
                false,
            );
        }
    }

    /// Every path the requests change.
    fn paths_of(&self, reqs: &[u8]) -> Vec<u8> {
        reqs.iter()
            .flat_map(|r| self.config.op(*r).paths())
            .collect()
    }
}

/// A patch set's state from its files' (`set_state` in the contract crate); one file's own.
pub fn set_state(states: &[RState]) -> RState {
    let Some(first) = states.first().copied() else {
        return RState::Uncertain;
    };
    let mut result = first;
    for state in &states[1..] {
        if *state == RState::Prepared {
            return RState::Prepared;
        }
        if *state != result {
            result = RState::Uncertain;
        }
    }
    result
}

/// What a single request leaves when the daemon is killed at its first reach of `point`,
/// restarted, and the request's receipt is looked up: the model's answer to the real crash
/// test. `None` if the request never reaches `point`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AfterCrash {
    /// What each path holds after the restart.
    pub contents: [Content; PATHS],
    /// Staged files on disk at the crash.
    pub temps_at_crash: u8,
    /// The receipt's state after recovery (per part), or empty for none.
    pub receipt: Vec<RState>,
}

/// Runs one client's one request, killing the daemon at the first state whose crash point is
/// `point`, then restarts it; see [`AfterCrash`].
pub fn after_crash(op: Op, initial: [Content; PATHS], point: CrashPoint) -> Option<AfterCrash> {
    after_crash_in(op, initial, false, point)
}

/// [`after_crash`], with `B` in a folder of its own that does not exist yet when
/// `new_folder` (see [`Config::new_folder`]).
pub fn after_crash_in(
    op: Op,
    initial: [Content; PATHS],
    new_folder: bool,
    point: CrashPoint,
) -> Option<AfterCrash> {
    let protocol = Protocol::new(Config {
        requests: vec![Request { id: 0, op }],
        clients: vec![vec![0]],
        initial,
        kills: 1,
        cuts: 0,
        attempts: 1,
        lookups: false,
        concurrent: None,
        faults: 0,
        new_folder,
        mutations: Vec::new(),
    });
    let mut s = protocol.init();
    s = protocol.next(&s, &Action::Send(0))?;
    loop {
        let daemon = s.daemon.as_ref()?;
        if protocol.crash_point(&s) == point
            && (point != CrashPoint::BeforeLock || !daemon.waiting.is_empty())
        {
            break;
        }
        let action = if daemon.work.is_some() {
            Action::Step
        } else if s.clients[0].phase == Phase::Waiting {
            if matches!(protocol.config.op(0), Op::Write { .. }) {
                Action::TakeBatch
            } else {
                Action::TakeLock(0)
            }
        } else {
            return None;
        };
        s = protocol.next(&s, &action)?;
    }
    let temps_at_crash = s.temps;
    s = protocol.next(&s, &Action::Kill)?;
    s = protocol.next(&s, &Action::Restart)?;
    Some(AfterCrash {
        contents: [protocol.content(&s, 0), protocol.content(&s, 1)],
        temps_at_crash,
        receipt: s.db.rows_of(0).iter().map(|r| r.state).collect(),
    })
}
