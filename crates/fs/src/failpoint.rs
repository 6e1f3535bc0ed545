//! Crash failpoints for tests, compiled only into debug builds, and their catalogue.
//!
//! `AGENTWORKS_FAILPOINT=<name>` makes the process (workspaced, gatewayd or the laptop
//! executor) SIGKILL itself the first time it reaches that point, so tests can crash a real
//! process at each step of a change or a dispatch. `AGENTWORKS_FAILPOINT=<name>:sleep:<ms>`
//! pauses there instead (to hold a lock long). `AGENTWORKS_FAILPOINT=<name>:fail` makes the step
//! report an I/O error (`openat2:fail`: the kernel or a seccomp filter lacks `openat2`, see
//! [`crate::confine`]). Several may be given, separated by commas. A numbered failpoint
//! ([`Failpoint::numbered`]) is named `<name>_<n>`: `patch_set_before_2` is file 2's. In
//! release builds every call compiles to nothing: no environment variable can crash a
//! packaged daemon.
//!
//! Every failpoint is a [`Failpoint`], so a call site cannot name one the catalogue lacks.
//! The receipt protocols' models (`crates/workspace/tests/model.rs`,
//! `crates/laptop/tests/model.rs`) name one for each of their crash points, and their tests
//! check that the two lists are the same: a step added to the code without its crash point
//! in the model, or the other way round, fails them. [`Failpoint::ALL`] is that list; the
//! unit test below checks that it names every failpoint the sources use, and no other.

/// Outcome of a failpoint that did not kill the process.
#[derive(Debug, PartialEq, Eq)]
pub enum Hit {
    Continue,
    Fail,
}

/// The process a failpoint stops.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Process {
    Workspaced,
    Gatewayd,
    /// `agentworks executor connect`, on the laptop.
    Executor,
}

/// Every place a test can stop or fail a process. Each is a step of a receipt protocol (a
/// crash point of its model) except [`Failpoint::Openat2`], which only injects a fault.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Failpoint {
    /// Every confined open, before `openat2` (`:fail` answers `ENOSYS`). Not a step of any
    /// protocol: it is reached at every open, at start too.
    Openat2,
    /// workspaced: a change (or a batch's first) waits for the project's lock; nothing of it
    /// is recorded.
    BeforeLock,
    /// A new folder is made ([`crate::confine::open_dir_creating`]: a change's plan), the
    /// folder above it not yet synced, so its entry is not durable (`:fail`: that sync
    /// fails). Reached by the laptop executor's patches too; the workspaced model names it.
    AfterMkdir,
    /// workspaced: the receipt is built, not yet stored (`:fail`: the store is unavailable).
    ReceiptUnavailable,
    /// workspaced: the prepared receipt (a batch's, a set's) is durable; the file untouched.
    AfterPrepare,
    /// workspaced: the staged temp file is written and synced beside the target.
    AfterStage,
    /// workspaced: before the rename of a staged file or a move (`:fail`: it fails).
    BeforeRename,
    /// workspaced: before a delete's unlink (`:fail`: it fails).
    BeforeUnlink,
    /// workspaced: renamed or unlinked, the folder not yet synced (`:fail`: the sync fails).
    AfterRename,
    /// workspaced: the folder is synced; the receipt still prepared.
    AfterDirFsync,
    /// workspaced: just before the applied mark.
    BeforeMarkApplied,
    /// workspaced: the applied mark (`:fail`: it cannot be recorded, the answer is uncertain).
    MarkApplied,
    /// workspaced: the applied mark is recorded (a batch's without waiting for the disk); the
    /// caller not yet answered.
    AfterMarkApplied,
    /// workspaced, numbered by file: a patch set's file n, before anything of it is written.
    PatchSetBefore,
    /// workspaced, numbered: file n renamed or unlinked and its folder synced, not yet marked.
    PatchSetRenamed,
    /// workspaced, numbered: file n marked applied.
    PatchSetApplied,
    /// gatewayd: a dispatch arrived; nothing of it recorded.
    DispatchReceived,
    /// gatewayd: a dispatch is recorded pending, not yet sent to the executor.
    DispatchRecorded,
    /// gatewayd: the request frame is handed to the executor's connection.
    DispatchSent,
    /// gatewayd: a result is recorded, agentd not yet answered.
    ResultRecorded,
    /// gatewayd: a recovery's outcome, from the device's receipt, is recorded; agentd not yet
    /// answered.
    ReceiptSettled,
    /// executor: a request arrived; its receipt not yet looked at.
    ExecutorReceived,
    /// executor: the request is recorded `running`; nothing of it has run.
    ExecutorRunning,
    /// executor: the command or patch has ended; its outcome not yet recorded.
    ExecutorRan,
    /// executor: the outcome is recorded `done`; the result not yet sent.
    ExecutorDone,
}

impl Failpoint {
    /// Every failpoint, in the order of the steps.
    pub const ALL: [Failpoint; 25] = [
        Failpoint::Openat2,
        Failpoint::BeforeLock,
        Failpoint::AfterMkdir,
        Failpoint::ReceiptUnavailable,
        Failpoint::AfterPrepare,
        Failpoint::AfterStage,
        Failpoint::BeforeRename,
        Failpoint::BeforeUnlink,
        Failpoint::AfterRename,
        Failpoint::AfterDirFsync,
        Failpoint::BeforeMarkApplied,
        Failpoint::MarkApplied,
        Failpoint::AfterMarkApplied,
        Failpoint::PatchSetBefore,
        Failpoint::PatchSetRenamed,
        Failpoint::PatchSetApplied,
        Failpoint::DispatchReceived,
        Failpoint::DispatchRecorded,
        Failpoint::DispatchSent,
        Failpoint::ResultRecorded,
        Failpoint::ReceiptSettled,
        Failpoint::ExecutorReceived,
        Failpoint::ExecutorRunning,
        Failpoint::ExecutorRan,
        Failpoint::ExecutorDone,
    ];

    /// The name `AGENTWORKS_FAILPOINT` uses (a numbered one takes `_<n>` after it).
    pub const fn name(self) -> &'static str {
        match self {
            Failpoint::Openat2 => "openat2",
            Failpoint::BeforeLock => "before_lock",
            Failpoint::AfterMkdir => "after_mkdir",
            Failpoint::ReceiptUnavailable => "receipt_unavailable",
            Failpoint::AfterPrepare => "after_prepare",
            Failpoint::AfterStage => "after_stage",
            Failpoint::BeforeRename => "before_rename",
            Failpoint::BeforeUnlink => "before_unlink",
            Failpoint::AfterRename => "after_rename",
            Failpoint::AfterDirFsync => "after_dir_fsync",
            Failpoint::BeforeMarkApplied => "before_mark_applied",
            Failpoint::MarkApplied => "mark_applied",
            Failpoint::AfterMarkApplied => "after_mark_applied",
            Failpoint::PatchSetBefore => "patch_set_before",
            Failpoint::PatchSetRenamed => "patch_set_renamed",
            Failpoint::PatchSetApplied => "patch_set_applied",
            Failpoint::DispatchReceived => "dispatch_received",
            Failpoint::DispatchRecorded => "dispatch_recorded",
            Failpoint::DispatchSent => "dispatch_sent",
            Failpoint::ResultRecorded => "result_recorded",
            Failpoint::ReceiptSettled => "receipt_settled",
            Failpoint::ExecutorReceived => "executor_received",
            Failpoint::ExecutorRunning => "executor_running",
            Failpoint::ExecutorRan => "executor_ran",
            Failpoint::ExecutorDone => "executor_done",
        }
    }

    /// The process it stops; `None` for [`Failpoint::Openat2`], reached in every process.
    pub const fn process(self) -> Option<Process> {
        match self {
            Failpoint::Openat2 => None,
            Failpoint::DispatchReceived
            | Failpoint::DispatchRecorded
            | Failpoint::DispatchSent
            | Failpoint::ResultRecorded
            | Failpoint::ReceiptSettled => Some(Process::Gatewayd),
            Failpoint::ExecutorReceived
            | Failpoint::ExecutorRunning
            | Failpoint::ExecutorRan
            | Failpoint::ExecutorDone => Some(Process::Executor),
            _ => Some(Process::Workspaced),
        }
    }

    /// Whether it is a step of a receipt protocol, so a crash point of its model: every one
    /// but [`Failpoint::Openat2`], a fault injector.
    pub const fn is_step(self) -> bool {
        !matches!(self, Failpoint::Openat2)
    }

    /// Whether it is reached once per file of a patch set and named `<name>_<n>`.
    pub const fn numbered(self) -> bool {
        matches!(
            self,
            Failpoint::PatchSetBefore | Failpoint::PatchSetRenamed | Failpoint::PatchSetApplied
        )
    }

    /// What `AGENTWORKS_FAILPOINT` names to stop here: the name, or for a numbered failpoint
    /// `<name>_<n>` (`n` from 1).
    pub fn spec(self, n: Option<usize>) -> String {
        match n {
            Some(n) => format!("{}_{n}", self.name()),
            None => self.name().to_owned(),
        }
    }
}

/// Reach `point` (not a numbered one).
pub fn hit(point: Failpoint) -> Hit {
    debug_assert!(!point.numbered(), "{point:?} needs hit_numbered");
    hit_named(point.name())
}

/// Reach the numbered `point` for the `n`th item (counting from 1).
pub fn hit_numbered(point: Failpoint, n: usize) -> Hit {
    debug_assert!(point.numbered(), "{point:?} is not numbered");
    if cfg!(debug_assertions) {
        hit_named(&point.spec(Some(n)))
    } else {
        Hit::Continue
    }
}

#[cfg(debug_assertions)]
fn hit_named(name: &str) -> Hit {
    use std::sync::OnceLock;
    static SPEC: OnceLock<Option<String>> = OnceLock::new();
    let spec = SPEC.get_or_init(|| std::env::var("AGENTWORKS_FAILPOINT").ok());
    let Some(spec) = spec else {
        return Hit::Continue;
    };
    for entry in spec.split(',') {
        let mut parts = entry.splitn(3, ':');
        if parts.next() != Some(name) {
            continue;
        }
        match (parts.next(), parts.next()) {
            (None, _) => {
                tracing::warn!(
                    failpoint = name,
                    "failpoint: killing the process with SIGKILL"
                );
                let _ = nix::sys::signal::raise(nix::sys::signal::Signal::SIGKILL);
            }
            (Some("sleep"), Some(ms)) => {
                let ms = ms.parse().unwrap_or(1000);
                std::thread::sleep(std::time::Duration::from_millis(ms));
            }
            (Some("fail"), _) => return Hit::Fail,
            _ => {}
        }
    }
    Hit::Continue
}

#[cfg(not(debug_assertions))]
#[inline(always)]
fn hit_named(_name: &str) -> Hit {
    Hit::Continue
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;
    use std::path::{Path, PathBuf};

    fn rust_files(dir: &Path, found: &mut Vec<PathBuf>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                rust_files(&path, found);
            } else if path.extension().is_some_and(|e| e == "rs") {
                found.push(path);
            }
        }
    }

    /// The catalogue is the code's: every `Failpoint::X` the crates' sources use is in
    /// [`Failpoint::ALL`], and every failpoint there is used by some source (outside this
    /// file), so neither can drift from the other.
    #[test]
    fn the_catalogue_names_exactly_the_failpoints_the_sources_reach() {
        let crates = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let mut files = Vec::new();
        for entry in std::fs::read_dir(&crates).unwrap() {
            let src = entry.unwrap().path().join("src");
            if src.is_dir() {
                rust_files(&src, &mut files);
            }
        }
        let this = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/failpoint.rs");
        let mut used = BTreeSet::new();
        for file in files {
            if file.canonicalize().unwrap() == this.canonicalize().unwrap() {
                continue;
            }
            let text = std::fs::read_to_string(&file).unwrap();
            for (at, _) in text.match_indices("Failpoint::") {
                let ident: String = text[at + "Failpoint::".len()..]
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric())
                    .collect();
                used.insert(ident);
            }
        }
        let listed: BTreeSet<String> = Failpoint::ALL.iter().map(|f| format!("{f:?}")).collect();
        assert_eq!(
            used, listed,
            "the failpoints the sources use (left) and the catalogue (right) differ"
        );
        let names: BTreeSet<&str> = Failpoint::ALL.iter().map(|f| f.name()).collect();
        assert_eq!(
            names.len(),
            Failpoint::ALL.len(),
            "two failpoints share a name"
        );
    }

    #[test]
    fn numbered_failpoints_take_the_file_number() {
        assert_eq!(
            Failpoint::PatchSetBefore.spec(Some(2)),
            "patch_set_before_2"
        );
        assert_eq!(Failpoint::AfterPrepare.spec(None), "after_prepare");
        assert!(
            Failpoint::ALL
                .iter()
                .all(|f| f.is_step() == (*f != Failpoint::Openat2))
        );
    }
}
