//! workspaced's receipt protocol, model-checked: every interleaving of a few clients' writes,
//! edits, deletes, moves and patch sets (retried and looked up after a lost answer, ids reused)
//! with the daemon killed or its power cut at every step, explored exhaustively with
//! stateright. The transition system is `model/protocol.rs`; this file holds the properties
//! (each named after the guarantee the README states), the scenarios, the mutations each
//! property must catch, and the tie between the model's crash points and the code's
//! failpoints.
//!
//! `cargo test -p agentworks-workspace --test model`; each test prints how many states it
//! explored.

#[path = "model/protocol.rs"]
mod protocol;

use agentworks_fs::failpoint::{Failpoint, Process};
use protocol::*;
use stateright::{Checker, HasDiscoveries, Model, Property};
use std::collections::BTreeSet;

/// The stateright view of one scenario.
struct Workspaced(Protocol);

impl Model for Workspaced {
    type State = State;
    type Action = Action;

    fn init_states(&self) -> Vec<State> {
        vec![self.0.init()]
    }

    fn actions(&self, state: &State, actions: &mut Vec<Action>) {
        actions.extend(self.0.actions(state));
    }

    fn next_state(&self, state: &State, action: Action) -> Option<State> {
        self.0.next(state, &action)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::always(ACKED_NEVER_LOST, |m, s| acked_never_lost(&m.0, s)),
            Property::always(NEVER_TORN, |m, s| never_torn(&m.0, s)),
            Property::always(APPLIED_ONLY_IF_ON_DISK, |m, s| {
                applied_only_if_on_disk(&m.0, s)
            }),
            Property::always(NOT_APPLIED_ONLY_IF_NEVER_REACHED, |m, s| {
                not_applied_only_if_never_reached(&m.0, s)
            }),
            Property::always(ONE_ID_CHANGES_A_FILE_ONCE, |_, s: &State| {
                s.ghost.changes.iter().all(|n| *n <= 1)
            }),
            Property::always(REUSED_ID_REFUSED, |m, s| reused_id_refused(&m.0, s)),
            Property::always(ONE_CONCURRENT_WRITER_APPLIES, |m, s| {
                one_concurrent_writer_applies(&m.0, s)
            }),
            Property::always(APPLIED_ANSWER_STAYS_APPLIED, |m, s| {
                applied_answer_stays_applied(&m.0, s)
            }),
            Property::eventually(EVERY_REQUEST_ANSWERED, |_, s: &State| {
                s.clients.iter().all(|c| c.phase == Phase::Done)
            }),
            // The model reaches what it is about: a crash that leaves a change uncertain or
            // prepared for recovery is possible, and so is the end.
            Property::sometimes("a change is decided by recovery", |_, s: &State| {
                s.db.visible().iter().any(|r| r.state != RState::Prepared) && (s.kills + s.cuts) > 0
            }),
        ]
    }
}

const ACKED_NEVER_LOST: &str =
    "an acknowledged change is never lost or undone after a crash or a power cut";
const NEVER_TORN: &str = "no file is ever torn";
const APPLIED_ONLY_IF_ON_DISK: &str = "a receipt says applied only if its change is on disk";
const NOT_APPLIED_ONLY_IF_NEVER_REACHED: &str =
    "a receipt says not_applied only if its change never reached the file";
const ONE_ID_CHANGES_A_FILE_ONCE: &str = "one request id never changes a file twice";
const REUSED_ID_REFUSED: &str =
    "a reused id with another payload is refused, and every change on disk has its own receipt";
const ONE_CONCURRENT_WRITER_APPLIES: &str =
    "of concurrent writers on one revision exactly one applies";
const APPLIED_ANSWER_STAYS_APPLIED: &str = "a receipt answered applied stays applied";
const EVERY_REQUEST_ANSWERED: &str = "every request is answered";

fn bit(mask: u32, req: u8) -> bool {
    mask & (1 << req) != 0
}

fn acked_never_lost(p: &Protocol, s: &State) -> bool {
    (0..p.config.requests.len() as u8)
        .filter(|r| bit(s.ghost.acked, *r))
        .all(|r| {
            p.config.requests[r as usize]
                .op
                .paths()
                .iter()
                .all(|path| s.files[*path as usize].holds(r))
        })
}

fn never_torn(p: &Protocol, s: &State) -> bool {
    (0..PATHS as u8).all(|path| p.content(s, path) != TORN)
}

fn applied_only_if_on_disk(p: &Protocol, s: &State) -> bool {
    s.db.visible()
        .iter()
        .filter(|r| r.state == RState::Applied)
        .all(|r| {
            p.row_paths(*r)
                .iter()
                .all(|path| s.files[*path as usize].holds(r.req))
        })
}

fn not_applied_only_if_never_reached(p: &Protocol, s: &State) -> bool {
    let rows_hold =
        s.db.visible()
            .iter()
            .filter(|r| r.state == RState::NotApplied)
            .all(|r| {
                let (path, ..) = p.config.requests[r.req as usize].op.parts()[r.part as usize];
                !s.files[path as usize].holds(r.req)
            });
    let answers_hold = (0..p.config.requests.len() as u8)
        .filter(|r| bit(s.ghost.told_not_applied, *r))
        .all(|r| {
            p.config.requests[r as usize]
                .op
                .paths()
                .iter()
                .all(|path| !s.files[*path as usize].holds(r))
        });
    rows_hold && answers_hold
}

fn reused_id_refused(p: &Protocol, s: &State) -> bool {
    let rows = s.db.visible();
    let every_change_has_its_receipt = s.files.iter().all(|file| {
        file.history.iter().all(|change| {
            let req = &p.config.requests[change.req as usize];
            rows.iter()
                .any(|r| r.id == req.id && p.config.requests[r.req as usize] == *req)
        })
    });
    !s.ghost.wrong_payload_answer && every_change_has_its_receipt
}

fn one_concurrent_writer_applies(p: &Protocol, s: &State) -> bool {
    if s.ghost.lost_update {
        return false;
    }
    let Some((a, b)) = p.config.concurrent else {
        return true;
    };
    let applied = |r: u8| {
        matches!(
            s.ghost.answers[r as usize],
            Some(Answer::Receipt {
                state: RState::Applied,
                ..
            })
        )
    };
    // At most one ever; exactly one once both are answered in a run without faults.
    let answered = s.ghost.answers[a as usize].is_some() && s.ghost.answers[b as usize].is_some();
    let faultless = s.kills + s.cuts == 0;
    !(applied(a) && applied(b)) && (!answered || !faultless || applied(a) || applied(b))
}

fn applied_answer_stays_applied(p: &Protocol, s: &State) -> bool {
    let rows = s.db.visible();
    (0..p.config.requests.len() as u8)
        .filter(|r| bit(s.ghost.acked, *r))
        .all(|r| {
            let req = &p.config.requests[r as usize];
            req.op
                .parts()
                .iter()
                .enumerate()
                .all(|(part, (path, _, result))| {
                    rows.iter()
                        .find(|row| (row.id, row.part) == (req.id, part as u8))
                        .is_some_and(|row| match row.state {
                            RState::Applied => true,
                            // Recovery will decide it from the disk: it must find the result.
                            RState::Prepared => {
                                p.content(s, *path) == *result
                                    && req
                                        .op
                                        .move_to()
                                        .is_none_or(|to| p.content(s, to) == *result)
                            }
                            _ => false,
                        })
                })
        })
}

// ----- scenarios -----

const A: u8 = 0;
const B: u8 = 1;

fn write(id: u8, path: u8, expected: Content, content: Content) -> Request {
    Request {
        id,
        op: Op::Write {
            path,
            expected,
            content,
        },
    }
}

fn base(requests: Vec<Request>, clients: Vec<Vec<u8>>) -> Config {
    Config {
        requests,
        clients,
        initial: [INITIAL, INITIAL],
        kills: 2,
        cuts: 2,
        attempts: 5,
        lookups: true,
        concurrent: None,
        faults: 0,
        new_folder: false,
        mutations: Vec::new(),
    }
}

/// Two writers of `A` expecting its first revision (one must lose), one of them reusing its
/// id with another payload afterwards.
fn concurrent_writers() -> Config {
    Config {
        concurrent: Some((0, 1)),
        ..base(
            vec![
                write(0, A, INITIAL, 2),
                write(1, A, INITIAL, 3),
                write(0, A, INITIAL, 4),
            ],
            vec![vec![0, 2], vec![1]],
        )
    }
}

/// A write of `A` and, by another client, a write of `B` (the same batch, or not) and then of
/// `A` on top of the first one's result: the group commit's unsynced marks, then the next
/// batch's synced prepare before its rename.
fn group_commit() -> Config {
    base(
        vec![
            write(0, A, INITIAL, 2),
            write(1, B, INITIAL, 3),
            write(2, A, 2, 4),
        ],
        vec![vec![0], vec![1, 2]],
    )
}

/// A move of `A` to `B` and a delete of `A`, racing; an edit of `A` afterwards.
fn move_and_delete() -> Config {
    Config {
        initial: [INITIAL, MISSING],
        ..base(
            vec![
                Request {
                    id: 0,
                    op: Op::Move {
                        from: A,
                        to: B,
                        expected: INITIAL,
                    },
                },
                Request {
                    id: 1,
                    op: Op::Delete {
                        path: A,
                        expected: INITIAL,
                    },
                },
                Request {
                    id: 2,
                    op: Op::Edit {
                        path: B,
                        expected: INITIAL,
                        content: 5,
                    },
                },
            ],
            vec![vec![0, 2], vec![1]],
        )
    }
}

/// A patch set changing `A` and deleting `B`, and a write of `A` racing it.
fn patch_set() -> Config {
    base(
        vec![
            Request {
                id: 0,
                op: Op::PatchSet {
                    files: vec![(A, INITIAL, 2), (B, INITIAL, MISSING)],
                },
            },
            write(1, A, INITIAL, 3),
        ],
        vec![vec![0], vec![1]],
    )
}

/// A write of `A` whose folder sync (or applied mark) may fail while the daemon runs on,
/// leaving its receipt prepared and its caller told `uncertain`; another client then writes
/// `A` back to its first content on top of it. Whatever decides the first receipt later (a
/// lookup, a retry, a restart) must not find the first content and call it not applied.
fn failed_sync_then_restore() -> Config {
    Config {
        faults: 1,
        kills: 1,
        cuts: 1,
        attempts: 4,
        ..base(
            vec![write(0, A, INITIAL, 2), write(1, A, 2, INITIAL)],
            vec![vec![0], vec![1]],
        )
    }
}

/// `request`, which creates `B` in a folder that does not exist yet: its plan makes the
/// folder, and a crash (or a failed sync) may come between the `mkdir` and the sync of the
/// folder above; the request is sent again until acknowledged, then the power may go.
fn into_a_new_folder(request: Request) -> Config {
    Config {
        initial: [INITIAL, MISSING],
        new_folder: true,
        faults: 1,
        kills: 1,
        cuts: 1,
        attempts: 4,
        ..base(vec![request], vec![vec![0]])
    }
}

/// A write of `B` into its new folder.
fn write_into_a_new_folder() -> Config {
    into_a_new_folder(write(0, B, MISSING, 2))
}

/// A move of `A` into `B`'s new folder: the move's plan makes the destination's folder.
fn move_into_a_new_folder() -> Config {
    into_a_new_folder(Request {
        id: 0,
        op: Op::Move {
            from: A,
            to: B,
            expected: INITIAL,
        },
    })
}

fn scenarios() -> Vec<(&'static str, Config)> {
    vec![
        ("concurrent writers", concurrent_writers()),
        ("group commit", group_commit()),
        ("move and delete", move_and_delete()),
        ("patch set", patch_set()),
        ("failed sync then restore", failed_sync_then_restore()),
        ("write into a new folder", write_into_a_new_folder()),
        ("move into a new folder", move_into_a_new_folder()),
    ]
}

/// Explores `config` wholly (breadth first, on two threads) and asserts every property.
fn check_all(name: &str, config: Config) -> usize {
    let checker = Workspaced(Protocol::new(config))
        .checker()
        .threads(2)
        .spawn_bfs()
        .join();
    eprintln!(
        "{name}: {} states ({} unique), depth {}",
        checker.state_count(),
        checker.unique_state_count(),
        checker.max_depth()
    );
    checker.assert_properties();
    checker.unique_state_count()
}

/// Explores `config` until `property` fails, and asserts that it does.
fn caught_by(config: Config, property: &'static str) {
    let mutation = config.mutations.clone();
    let checker = Workspaced(Protocol::new(config))
        .checker()
        .threads(2)
        .finish_when(HasDiscoveries::AnyOf(BTreeSet::from([property])))
        .spawn_bfs()
        .join();
    let found = checker.discovery(property);
    assert!(
        found.is_some(),
        "{mutation:?} was not caught by \"{property}\" ({} states)",
        checker.unique_state_count()
    );
    eprintln!(
        "{mutation:?} caught by \"{property}\" after {} states: {:?}",
        checker.unique_state_count(),
        found.map(|path| path.into_actions())
    );
}

#[test]
fn concurrent_writers_keep_every_guarantee() {
    check_all("concurrent writers", concurrent_writers());
}

#[test]
fn the_group_commit_keeps_every_guarantee() {
    check_all("group commit", group_commit());
}

#[test]
fn moves_and_deletes_keep_every_guarantee() {
    check_all("move and delete", move_and_delete());
}

#[test]
fn patch_sets_keep_every_guarantee() {
    check_all("patch set", patch_set());
}

#[test]
fn a_change_after_a_failed_sync_keeps_every_guarantee() {
    check_all("failed sync then restore", failed_sync_then_restore());
}

#[test]
fn changes_into_a_new_folder_keep_every_guarantee() {
    check_all("write into a new folder", write_into_a_new_folder());
    check_all("move into a new folder", move_into_a_new_folder());
}

// ----- the mutations each property must catch -----

#[test]
fn marking_applied_before_the_folder_sync_is_caught() {
    caught_by(
        group_commit().mutated(Mutation::MarkBeforeDirSync),
        ACKED_NEVER_LOST,
    );
}

/// Checked without deciding the earlier prepared receipts before a plan: that decision
/// happens to cover this one (the next batch decides the first one's receipts from the disk,
/// durably, before its own prepare), so the two are taken out together.
#[test]
fn releasing_the_lock_before_the_marks_is_caught() {
    caught_by(
        group_commit()
            .mutated(Mutation::ReleaseLockBeforeMark)
            .mutated(Mutation::PlanOverPrepared),
        APPLIED_ANSWER_STAYS_APPLIED,
    );
}

#[test]
fn skipping_the_folder_sync_is_caught() {
    caught_by(
        move_and_delete().mutated(Mutation::SkipDirFsync),
        APPLIED_ONLY_IF_ON_DISK,
    );
}

#[test]
fn renaming_before_the_prepared_receipt_is_caught() {
    caught_by(
        concurrent_writers().mutated(Mutation::RenameBeforePrepare),
        REUSED_ID_REFUSED,
    );
}

#[test]
fn an_unsynced_prepared_receipt_is_caught() {
    caught_by(
        patch_set().mutated(Mutation::PrepareUnsynced),
        REUSED_ID_REFUSED,
    );
}

#[test]
fn renaming_an_unsynced_staged_file_is_caught() {
    caught_by(
        concurrent_writers().mutated(Mutation::RenameBeforeStageSync),
        NEVER_TORN,
    );
}

/// The bug this model found: recovery decided from entries its folder had not synced. Since
/// start-up recovery syncs every folder before it decides anything, that bug shows at a start
/// only without that walk too; alone, it shows where a receipt is decided while the daemon
/// runs on (a lookup, or the next change's plan, after a failed folder sync).
#[test]
fn reconciling_without_syncing_the_folder_is_caught() {
    for config in [concurrent_writers(), move_and_delete()] {
        caught_by(
            config
                .mutated(Mutation::ReconcileWithoutSync)
                .mutated(Mutation::NoFolderSyncAtStart),
            APPLIED_ONLY_IF_ON_DISK,
        );
    }
    caught_by(
        failed_sync_then_restore().mutated(Mutation::ReconcileWithoutSync),
        APPLIED_ONLY_IF_ON_DISK,
    );
}

#[test]
fn replaying_another_payload_is_caught() {
    caught_by(
        concurrent_writers().mutated(Mutation::ReplayIgnoresPayload),
        REUSED_ID_REFUSED,
    );
}

#[test]
fn skipping_the_revision_check_is_caught() {
    caught_by(
        concurrent_writers().mutated(Mutation::NoRevisionCheck),
        ONE_CONCURRENT_WRITER_APPLIES,
    );
}

#[test]
fn guessing_an_interrupted_change_applied_is_caught() {
    caught_by(
        concurrent_writers().mutated(Mutation::ReconcileGuesses),
        APPLIED_ONLY_IF_ON_DISK,
    );
}

#[test]
fn a_retry_that_finishes_a_patch_set_is_caught() {
    caught_by(
        patch_set().mutated(Mutation::SetRetryFinishesSet),
        NOT_APPLIED_ONLY_IF_NEVER_REACHED,
    );
}

/// Issue 48's first follow-up: a write planned over a path whose earlier change is still
/// prepared (its folder sync failed) restores the old content, and the earlier change is
/// then decided `not_applied` from it.
#[test]
fn planning_over_a_prepared_receipt_is_caught() {
    caught_by(
        failed_sync_then_restore().mutated(Mutation::PlanOverPrepared),
        NOT_APPLIED_ONLY_IF_NEVER_REACHED,
    );
}

/// Issue 48's second follow-up: a folder made just before a kill, its entry never synced,
/// loses a write acknowledged in it after the restart at the next power cut. (A move into the
/// folder is safe without the walk: it syncs the folder it comes from, which holds the new
/// folder's entry.)
#[test]
fn a_folder_left_unsynced_by_a_crash_is_caught() {
    caught_by(
        write_into_a_new_folder().mutated(Mutation::NoFolderSyncAtStart),
        ACKED_NEVER_LOST,
    );
}

/// The same with the daemon running on: the folder's sync failed after its `mkdir`, and the
/// next write into it, finding it there, never synced the folder above.
#[test]
fn forgetting_a_folder_whose_sync_failed_is_caught() {
    caught_by(
        write_into_a_new_folder().mutated(Mutation::ForgetUnsyncedFolder),
        ACKED_NEVER_LOST,
    );
}

// ----- the tie to the code -----

/// Every crash point the model reaches, in any scenario, with the failpoint it names.
fn reached_crash_points() -> BTreeSet<CrashPoint> {
    let mut reached = BTreeSet::new();
    for (_, config) in scenarios() {
        let protocol = Protocol::new(Config {
            kills: 0,
            cuts: 0,
            lookups: false,
            ..config
        });
        // Every state of the scenario without faults: where a crash could come.
        let mut seen = std::collections::HashSet::new();
        let mut todo = vec![protocol.init()];
        while let Some(state) = todo.pop() {
            if !seen.insert(state.clone()) {
                continue;
            }
            if state.daemon.is_some() {
                reached.insert(protocol.crash_point(&state));
            }
            for action in protocol.actions(&state) {
                if let Some(next) = protocol.next(&state, &action) {
                    todo.push(next);
                }
            }
        }
    }
    reached
}

/// The model's crash points are workspaced's failpoints: each crash point names one the code
/// has, and each of the code's steps (a patch set's for its first and second file) is a crash
/// point the model reaches. A step added to either without the other fails here.
#[test]
fn the_crash_points_are_the_failpoints_of_workspaced() {
    let reached = reached_crash_points();
    assert_eq!(
        reached,
        CrashPoint::ALL.into_iter().collect(),
        "crash points the scenarios never reach (or unlisted ones)"
    );
    let model: BTreeSet<String> = reached.into_iter().map(CrashPoint::spec).collect();
    let code: BTreeSet<String> = Failpoint::ALL
        .iter()
        .filter(|f| f.is_step() && f.process() == Some(Process::Workspaced))
        .flat_map(|f| {
            if f.numbered() {
                vec![f.spec(Some(1)), f.spec(Some(2))]
            } else {
                vec![f.spec(None)]
            }
        })
        .collect();
    assert_eq!(
        model, code,
        "the model's crash points (left) and workspaced's failpoints (right) differ"
    );
}

/// What the real crash test (`tests/suite/crash_points.rs`) checks is the model's: a write
/// killed before its rename is not applied, after it applied, with its temp file on disk only
/// between the staging and the rename.
#[test]
fn the_model_predicts_each_crash_of_a_write() {
    let op = Op::Write {
        path: A,
        expected: INITIAL,
        content: 2,
    };
    let at = |point| after_crash(op.clone(), [INITIAL, INITIAL], point).unwrap();
    for point in [
        CrashPoint::ReceiptUnavailable,
        CrashPoint::AfterPrepare,
        CrashPoint::BeforeRename,
    ] {
        let after = at(point);
        assert_eq!(after.contents[0], INITIAL, "{point:?}");
        if point != CrashPoint::ReceiptUnavailable {
            assert_eq!(after.receipt, [RState::NotApplied], "{point:?}");
            assert_eq!(after.temps_at_crash, 1, "{point:?}");
        }
    }
    for point in [
        CrashPoint::AfterRename,
        CrashPoint::AfterDirFsync,
        CrashPoint::BeforeMarkApplied,
        CrashPoint::MarkApplied,
        CrashPoint::AfterMarkApplied,
    ] {
        let after = at(point);
        assert_eq!(
            (
                after.contents[0],
                after.receipt.as_slice(),
                after.temps_at_crash
            ),
            (2, &[RState::Applied][..], 0),
            "{point:?}"
        );
    }
    assert_eq!(at(CrashPoint::BeforeLock).receipt, []);
    assert!(after_crash(op, [INITIAL, INITIAL], CrashPoint::BeforeUnlink).is_none());
}
