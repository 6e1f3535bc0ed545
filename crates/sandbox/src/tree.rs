//! Finding every process a command left, where there is no child subreaper (macOS): the
//! launcher's descendants, the members of its process group, and every process it has seen
//! while the command ran, as long as that pid is still the process it saw.
//!
//! Without a subreaper, a process whose parent exits is re-parented to launchd, out of the
//! launcher's tree. Two things still find it: its process group (the launcher leads its own
//! session and group, and a command's processes stay in that group unless they make their own),
//! and the launcher's record, taken every few milliseconds while the command runs, of every
//! descendant and group member with its start time (so a recorded pid that was reused by an
//! unrelated process is never signalled). A process that made a session of its own *and* lost
//! its parent between two records is not found: that is the residual limit of the macOS back
//! end (the Linux one has the subreaper and cgroups).
//!
//! Owns: the walk over a [`ProcessTable`] (pure, tested with a fake table here); the macOS
//! table over `proc_listchildpids`, `proc_listpgrppids` and `proc_pidinfo` is in
//! `launcher/macos.rs`.
//! Must never: return the launcher itself, a zombie, or a recorded pid whose start time changed.

use std::collections::{BTreeSet, HashMap, VecDeque};

/// What the walk needs to know of one process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProcessInfo {
    /// When it started (any monotonic unit, compared for equality only).
    pub start: u64,
    /// False for a zombie: it cannot be killed, only reaped by its parent.
    pub alive: bool,
}

/// The system's process table as the walk sees it.
pub trait ProcessTable {
    /// The pids whose parent is `pid`.
    fn children(&self, pid: i32) -> Vec<i32>;
    /// The pids in process group `pgid`.
    fn group(&self, pgid: i32) -> Vec<i32>;
    /// `None` when no such process exists (any more).
    fn info(&self, pid: i32) -> Option<ProcessInfo>;
}

/// What the launcher has seen of the command: pid → start time.
pub type Seen = HashMap<i32, u64>;

/// Every live process of the command: descendants of `launcher` (which leads its own process
/// group), members of that group, processes in `seen` that are still the same process, and the
/// descendants of all of these. Never `launcher` itself; no zombies. Sorted, no duplicates.
pub fn command_processes(table: &impl ProcessTable, launcher: i32, seen: &Seen) -> Vec<i32> {
    let mut found = BTreeSet::new();
    let mut queue: VecDeque<i32> = VecDeque::new();
    queue.extend(table.children(launcher));
    queue.extend(table.group(launcher));
    queue.extend(
        seen.iter()
            .filter(|&(&pid, &start)| table.info(pid).is_some_and(|info| info.start == start))
            .map(|(&pid, _)| pid),
    );
    let mut visited = BTreeSet::from([launcher]);
    while let Some(pid) = queue.pop_front() {
        if pid <= 0 || !visited.insert(pid) {
            continue;
        }
        let Some(info) = table.info(pid) else {
            continue;
        };
        if info.alive {
            found.insert(pid);
        }
        // A zombie's children were re-parented already; a live one's are the command's.
        queue.extend(table.children(pid));
    }
    found.into_iter().collect()
}

/// Adds every process [`command_processes`] finds now to `seen`, with its start time.
pub fn record(table: &impl ProcessTable, launcher: i32, seen: &mut Seen) {
    for pid in command_processes(table, launcher, seen) {
        if let Some(info) = table.info(pid) {
            seen.insert(pid, info.start);
        }
    }
    // Forget what is gone, so a reused pid is not mistaken for it.
    seen.retain(|&pid, start| table.info(pid).is_some_and(|info| info.start == *start));
}

#[cfg(test)]
mod tests {
    use super::*;

    /// pid → (parent, group, start, alive).
    struct Fake(HashMap<i32, (i32, i32, u64, bool)>);

    impl ProcessTable for Fake {
        fn children(&self, pid: i32) -> Vec<i32> {
            let mut kids: Vec<i32> = self
                .0
                .iter()
                .filter(|(_, p)| p.0 == pid)
                .map(|(&k, _)| k)
                .collect();
            kids.sort_unstable();
            kids
        }
        fn group(&self, pgid: i32) -> Vec<i32> {
            let mut members: Vec<i32> = self
                .0
                .iter()
                .filter(|(_, p)| p.1 == pgid)
                .map(|(&k, _)| k)
                .collect();
            members.sort_unstable();
            members
        }
        fn info(&self, pid: i32) -> Option<ProcessInfo> {
            self.0.get(&pid).map(|p| ProcessInfo {
                start: p.2,
                alive: p.3,
            })
        }
    }

    const LAUNCHER: i32 = 100;

    fn table(rows: &[(i32, i32, i32, u64, bool)]) -> Fake {
        Fake(
            rows.iter()
                .map(|&(pid, parent, group, start, alive)| (pid, (parent, group, start, alive)))
                .collect(),
        )
    }

    #[test]
    fn finds_descendants_group_members_and_seen_orphans() {
        let t = table(&[
            (1, 0, 1, 1, true),                  // launchd
            (LAUNCHER, 50, LAUNCHER, 10, true),  // the launcher
            (101, LAUNCHER, LAUNCHER, 11, true), // sandbox-exec → the shell
            (102, 101, LAUNCHER, 12, true),      // a child of the shell
            (103, 102, 103, 13, true),           // a grandchild that made its own group
            (104, 1, LAUNCHER, 14, true),        // an orphan still in the group
            (105, 1, 105, 15, true),             // an orphan with its own session, recorded
            (106, 105, 105, 16, true),           // …and its child, never recorded
            (107, 1, 107, 17, true),             // an unrelated process
            (108, 101, LAUNCHER, 18, false),     // a zombie of the shell
            (200, 1, 200, 20, true),             // pid 200: recorded once, reused since
        ]);
        let seen: Seen = [(105, 15), (200, 99)].into_iter().collect();
        assert_eq!(
            command_processes(&t, LAUNCHER, &seen),
            vec![101, 102, 103, 104, 105, 106]
        );
    }

    #[test]
    fn never_the_launcher_and_never_in_a_loop() {
        // A table that lies (a cycle through the launcher) still ends and leaves it out.
        let t = table(&[
            (LAUNCHER, 102, LAUNCHER, 10, true),
            (101, LAUNCHER, LAUNCHER, 11, true),
            (102, 101, LAUNCHER, 12, true),
        ]);
        assert_eq!(
            command_processes(&t, LAUNCHER, &Seen::new()),
            vec![101, 102]
        );
    }

    #[test]
    fn recording_keeps_start_times_and_forgets_what_is_gone() {
        let mut t = table(&[
            (LAUNCHER, 50, LAUNCHER, 10, true),
            (101, LAUNCHER, LAUNCHER, 11, true),
            (102, 101, 102, 12, true),
        ]);
        let mut seen = Seen::new();
        record(&t, LAUNCHER, &mut seen);
        assert_eq!(seen, [(101, 11), (102, 12)].into_iter().collect());
        // 101 exits: 102 (its own group) goes to launchd and is found through the record.
        t.0.remove(&101);
        t.0.insert(102, (1, 102, 12, true));
        record(&t, LAUNCHER, &mut seen);
        assert_eq!(seen, [(102, 12)].into_iter().collect());
        assert_eq!(command_processes(&t, LAUNCHER, &seen), vec![102]);
        // 102 exits and its pid is reused by an unrelated process: never signalled.
        t.0.insert(102, (1, 102, 77, true));
        assert_eq!(command_processes(&t, LAUNCHER, &seen), Vec::<i32>::new());
        record(&t, LAUNCHER, &mut seen);
        assert!(seen.is_empty());
    }
}
