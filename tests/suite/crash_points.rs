//! Every crash point of the receipt protocols' models, on the real daemons: the daemon is
//! killed at the failpoint the model names for it (`AGENTWORKS_FAILPOINT`, SIGKILL), restarted,
//! and what it left is compared with what the model says a crash there must leave. The models'
//! transition systems are included from the crates they describe
//! (`crates/workspace/tests/model/protocol.rs`), so the expectation here is the model's own,
//! not a copy: a change to the code that the model does not follow fails here, and a change to
//! the model that the code does not follow too.
//!
//! Assertions are about content and receipts only, never about time.

#[path = "../../crates/workspace/tests/model/protocol.rs"]
mod workspaced_model;

use super::harness::*;
use agentworks_support::unix_http::ClientError;
use serde_json::{Value, json};
use std::os::unix::process::ExitStatusExt;
use workspaced_model as model;

const PATHS: [&str; 2] = ["a.txt", "b.txt"];
/// The paths when `B` is in a folder of its own that does not exist yet (the model's
/// `Config::new_folder`).
const PATHS_IN_NEW_FOLDER: [&str; 2] = ["a.txt", "new/b.txt"];

fn paths(new_folder: bool) -> [&'static str; 2] {
    if new_folder {
        PATHS_IN_NEW_FOLDER
    } else {
        PATHS
    }
}

/// The text of a model content (`None`: no file). A content is the same text at either
/// path: a move takes it from one to the other.
fn text(content: model::Content) -> Option<String> {
    match content {
        model::MISSING => None,
        model::INITIAL => Some("the first content\n".to_owned()),
        other => Some(format!("content {other}\n")),
    }
}

/// The request body (besides the context and id) and endpoint of a model operation, on
/// `paths` (see [`paths`]).
fn request(op: &model::Op, paths: [&'static str; 2]) -> (&'static str, Value) {
    let rev = |content| match text(content) {
        Some(t) => revision(&t),
        None => "missing".to_owned(),
    };
    let path = |p: u8| paths[p as usize];
    match op {
        model::Op::Write {
            path: p,
            expected,
            content,
        } => (
            "/v1/write",
            json!({"path": path(*p), "content": text(*content),
                   "expected_revision": rev(*expected)}),
        ),
        model::Op::Edit {
            path: p,
            expected,
            content,
        } => (
            "/v1/edit",
            json!({"path": path(*p), "expected_revision": rev(*expected),
                   "edits": [{"old_text": text(*expected).unwrap(),
                              "new_text": text(*content).unwrap()}]}),
        ),
        model::Op::Delete { path: p, expected } => (
            "/v1/delete",
            json!({"path": path(*p), "expected_revision": rev(*expected)}),
        ),
        model::Op::Move { from, to, expected } => (
            "/v1/move",
            json!({"path": path(*from), "to_path": path(*to),
                   "expected_revision": rev(*expected)}),
        ),
        model::Op::PatchSet { files } => {
            let mut diff = String::new();
            let mut expected_revisions = serde_json::Map::new();
            for (p, expected, result) in files {
                let (before, after) = (text(*expected), text(*result));
                let (old, new) = (
                    before
                        .as_ref()
                        .map_or("/dev/null".to_owned(), |_| format!("a/{}", path(*p))),
                    after
                        .as_ref()
                        .map_or("/dev/null".to_owned(), |_| format!("b/{}", path(*p))),
                );
                diff.push_str(&format!("--- {old}\n+++ {new}\n"));
                let lines = |t: &Option<String>| usize::from(t.is_some());
                diff.push_str(&format!(
                    "@@ -{},{} +{},{} @@\n",
                    lines(&before),
                    lines(&before),
                    lines(&after),
                    lines(&after)
                ));
                if let Some(b) = &before {
                    diff.push_str(&format!("-{b}"));
                }
                if let Some(a) = &after {
                    diff.push_str(&format!("+{a}"));
                }
                if before.is_some() && after.is_some() {
                    expected_revisions.insert(path(*p).into(), json!(rev(*expected)));
                }
            }
            (
                "/v1/patch_set",
                json!({"diff": diff, "expected_revisions": expected_revisions}),
            )
        }
    }
}

/// The operations whose crash points the test covers, each with what the paths hold first
/// and whether `B` is in a new folder: between them they reach every one.
fn operations() -> Vec<(model::Op, [model::Content; 2], bool)> {
    use model::{INITIAL, MISSING, Op};
    let in_place = |(op, initial)| (op, initial, false);
    let mut operations: Vec<(model::Op, [model::Content; 2], bool)> = [
        (
            Op::Write {
                path: 0,
                expected: INITIAL,
                content: 2,
            },
            [INITIAL, INITIAL],
        ),
        (
            Op::Edit {
                path: 0,
                expected: INITIAL,
                content: 2,
            },
            [INITIAL, INITIAL],
        ),
        (
            Op::Delete {
                path: 0,
                expected: INITIAL,
            },
            [INITIAL, INITIAL],
        ),
        (
            Op::Move {
                from: 0,
                to: 1,
                expected: INITIAL,
            },
            [INITIAL, MISSING],
        ),
        (
            Op::PatchSet {
                files: vec![(0, INITIAL, 2), (1, INITIAL, MISSING)],
            },
            [INITIAL, INITIAL],
        ),
    ]
    .into_iter()
    .map(in_place)
    .collect();
    // A write that makes its folder (the crash between the `mkdir` and the sync above it).
    operations.push((
        Op::Write {
            path: 1,
            expected: MISSING,
            content: 2,
        },
        [INITIAL, MISSING],
        true,
    ));
    operations
}

fn state_name(state: model::RState) -> &'static str {
    match state {
        model::RState::Prepared => "prepared",
        model::RState::Applied => "applied",
        model::RState::NotApplied => "not_applied",
        model::RState::Uncertain => "uncertain",
    }
}

/// workspaced killed at each crash point of each operation, restarted: the files, the staged
/// files at the crash and the receipt after recovery are what the model says. Every crash
/// point of the model is covered by some operation.
#[test]
fn workspaced_killed_at_each_crash_point_leaves_what_the_model_says() {
    let alice = ctx("p", "alice");
    let mut covered = std::collections::BTreeSet::new();
    let mut cases = 0;
    for (op, initial, new_folder) in operations() {
        let names = paths(new_folder);
        for point in model::CrashPoint::ALL {
            let Some(expected) = model::after_crash_in(op.clone(), initial, new_folder, point)
            else {
                continue;
            };
            covered.insert(point);
            cases += 1;
            let case = format!("{op:?} killed at {}", point.spec());
            let state = StateRoot::new();
            let files: Vec<(&str, String)> = (0..2)
                .filter_map(|p| text(initial[p]).map(|t| (names[p], t)))
                .collect();
            let refs: Vec<(&str, &str)> = files.iter().map(|(p, t)| (*p, t.as_str())).collect();
            let dir = state.project("p", &refs);
            let (endpoint, mut body) = request(&op, names);
            body["context"] = json!(alice);
            body["request_id"] = json!("r1");

            let mut dying = Workspaced::start_with(
                &state,
                Options {
                    failpoint: Some(point.spec()),
                    ..Options::default()
                },
            );
            let reply = dying.client().post::<_, Value>(endpoint, &body);
            assert!(
                matches!(&reply, Err(e) if !matches!(e, ClientError::Remote { .. })),
                "{case}: answered {reply:?}"
            );
            let status = dying.child.wait().unwrap();
            assert_eq!(status.signal(), Some(9), "{case}: {status}");
            let staged = all_files(&state.documents())
                .into_iter()
                .filter(|f| f.contains(".agentworks-tmp-"))
                .count();
            assert_eq!(
                staged, expected.temps_at_crash as usize,
                "{case}: staged files at the crash"
            );

            let daemon = Workspaced::start(&state);
            let client = daemon.client();
            for (p, name) in names.iter().enumerate() {
                assert_eq!(
                    std::fs::read_to_string(dir.join(name)).ok(),
                    text(expected.contents[p]),
                    "{case}: {name} after the restart"
                );
            }
            let found = client.receipt(&alice, "r1");
            let states: Vec<String> = match &found {
                Err((code, _)) => {
                    assert_eq!(code, "not_found", "{case}: {found:?}");
                    Vec::new()
                }
                Ok(receipt) => match receipt["files"].as_array() {
                    Some(files) => files
                        .iter()
                        .map(|f| f["state"].as_str().unwrap().to_owned())
                        .collect(),
                    None => vec![receipt["state"].as_str().unwrap().to_owned()],
                },
            };
            let want: Vec<&str> = expected.receipt.iter().map(|s| state_name(*s)).collect();
            assert_eq!(states, want, "{case}: the receipt after recovery");
            assert!(
                !all_files(&state.documents())
                    .iter()
                    .any(|f| f.contains(".agentworks-tmp-")),
                "{case}: staged files after recovery"
            );
        }
    }
    assert_eq!(
        covered,
        model::CrashPoint::ALL.into_iter().collect(),
        "crash points no operation reaches"
    );
    eprintln!(
        "workspaced: {cases} kills cover the model's {} crash points",
        covered.len()
    );
}

/// Regression (issue 48, the model's "failed sync then restore" scenario and its property "a
/// receipt says not_applied only if its change never reached the file"): a change whose
/// folder sync or applied mark fails while workspaced runs on is answered `uncertain`, its
/// receipt left prepared; a later change of the same path then puts the first content back.
/// Before the fix the earlier receipt stayed prepared until the next start (or a lookup),
/// which found the first content on disk and recorded `not_applied`, a guess, and wrong: the
/// change had reached the file, and a caller told "not applied" sends it again. Now the later
/// change decides the earlier receipt from the disk before it is planned. Both failpoints,
/// through the group commit (`/v1/write`) and the one-change pipeline (`/v1/edit`); the
/// daemon is killed and restarted before the receipts are looked at.
#[test]
fn a_change_left_prepared_is_decided_before_the_next_change_of_its_path() {
    const FIRST: &str = "the first content\n";
    const SECOND: &str = "the second content\n";
    let alice = ctx("p", "alice");
    let change = |endpoint: &str, from: &str, to: &str, request_id: &str| match endpoint {
        "/v1/write" => json!({"context": alice, "path": "a.txt", "content": to,
            "expected_revision": revision(from), "request_id": request_id}),
        _ => json!({"context": alice, "path": "a.txt", "expected_revision": revision(from),
            "edits": [{"old_text": from, "new_text": to}], "request_id": request_id}),
    };
    for failpoint in ["after_rename:fail", "mark_applied:fail"] {
        for endpoint in ["/v1/write", "/v1/edit"] {
            let case = format!("{endpoint} with {failpoint}");
            let state = StateRoot::new();
            let dir = state.project("p", &[("a.txt", FIRST)]);
            let read = || std::fs::read_to_string(dir.join("a.txt")).unwrap();
            let mut failing = Workspaced::start_with(
                &state,
                Options {
                    failpoint: Some(failpoint.into()),
                    ..Options::default()
                },
            );
            let client = failing.client();
            // Every change's last step fails in this daemon: each is answered `uncertain`
            // after it reached the file.
            for (from, to, id) in [(FIRST, SECOND, "r1"), (SECOND, FIRST, "r2")] {
                let (code, details) = client
                    .json(endpoint, change(endpoint, from, to, id))
                    .unwrap_err();
                assert_eq!(code, "uncertain", "{case}, {id}: {details}");
                assert_eq!(read(), to, "{case}, {id}");
            }
            failing.kill();
            let daemon = Workspaced::start(&state);
            let client = daemon.client();
            for id in ["r1", "r2"] {
                let found = client.receipt(&alice, id).unwrap();
                assert_eq!(found["state"], "applied", "{case}: {id} {found}");
            }
            // r1's retry is told what happened and changes nothing.
            let again = client
                .json(endpoint, change(endpoint, FIRST, SECOND, "r1"))
                .unwrap();
            assert_eq!(
                (&again["state"], &again["replayed"]),
                (&json!("applied"), &json!(true)),
                "{case}: {again}"
            );
            assert_eq!(read(), FIRST, "{case}");
        }
    }
}

// ----- the laptop request: gatewayd and the executor -----

#[path = "../../crates/laptop/tests/model/protocol.rs"]
mod laptop_model;

use super::agent::{CONFIRM, Setup, api, calls, create_chat, result_of, turn};
use laptop_model::{CrashPoint as LaptopPoint, Kill, Outcome, Report};
use nix::sys::signal::Signal;
use std::time::{Duration, Instant};

/// How long one crash case may take end to end (agentd recovers a lost answer until the
/// command's deadline, its timeout and 30 s).
const CASE: Duration = Duration::from_secs(120);

/// What agentd's turn told the model about the call, as the laptop model names it.
fn report_of(result: &Value) -> Report {
    if result["ok"] == true {
        return if result["result"]["cancelled"] == true {
            Report::Result(Outcome::Cancelled)
        } else {
            Report::Result(Outcome::Completed)
        };
    }
    match result["error"]["code"].as_str() {
        Some("not_run" | "device_offline" | "gateway_unavailable") => Report::NotRun,
        Some("interrupted") => Report::Interrupted,
        Some("outcome_unknown") => Report::Unknown,
        _ => panic!("a tool result the model has no name for: {result}"),
    }
}

/// Everything real with alice's laptop sharing `repo`: gatewayd started with `gatewayd_env`,
/// the executor with `executor_env`. Returns the setup, the executor and the bound chat.
fn laptop_case(
    gatewayd_env: &[(&str, &str)],
    executor_env: &[(&str, &str)],
) -> (Setup, ExecutorProcess, String) {
    let mut setup = Setup::start(false);
    let port = setup.gw.port;
    if !gatewayd_env.is_empty() {
        assert!(setup.gw.stop().success());
        setup.gw = Gatewayd::start_with_env(&setup.stack, port, gatewayd_env);
    }
    let connect = setup.stack.token("alice", &["devices:connect"], json!({}));
    setup.laptop.login(&setup.stack, port, &connect);
    let executor = share(&setup, executor_env);
    setup.device_id = setup.wait_device(true)["device_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let chat = create_chat(&setup.stack, &setup.alice, "app");
    let (status, body) = api(
        &setup.stack,
        &setup.alice,
        "PUT",
        &format!("/v1/chats/{chat}/binding"),
        json!({"device_id": setup.device_id, "folder": "repo", "confirm": CONFIRM}),
    );
    assert_eq!(status, 200, "{body}");
    (setup, executor, chat)
}

fn share(setup: &Setup, env: &[(&str, &str)]) -> ExecutorProcess {
    let repo = setup.laptop.folder("repo");
    setup.laptop.executor_connect(
        &["--name", "laptop", "--write-folder", repo.to_str().unwrap()],
        env,
    )
}

/// The command of every case: it leaves one line per run.
const COMMAND: &str = "echo ran >> runs.txt; sleep 1";

fn runs(setup: &Setup) -> u8 {
    std::fs::read_to_string(setup.laptop.folder("repo").join("runs.txt"))
        .map(|t| t.lines().count() as u8)
        .unwrap_or(0)
}

/// Runs the turn on its own thread while `watch` restarts what dies; returns the call's
/// report and the runs.
fn run_turn(
    setup: &mut Setup,
    chat: &str,
    mut watch: impl FnMut(&mut Setup) -> bool,
) -> (Report, u8) {
    setup.model.play(vec![
        calls(&[(
            "c1",
            "execute_shell_command",
            json!({"command": COMMAND, "timeout": 10}),
        )]),
        super::agent::text("done"),
    ]);
    let (port, token, chat) = (setup.stack.port, setup.alice.clone(), chat.to_owned());
    let turn = std::thread::spawn(move || turn(port, &token, &chat, "run it"));
    let deadline = Instant::now() + CASE;
    // Until the turn has ended and every kill happened (the turn may end first: a lost
    // connection fails the call at once).
    let mut all_done = false;
    while !(turn.is_finished() && all_done) {
        if Instant::now() > deadline {
            let finished = turn.is_finished();
            let events = finished.then(|| turn.join());
            panic!("the turn ended: {finished}; every kill happened: {all_done}; {events:?}");
        }
        all_done |= watch(setup);
        std::thread::sleep(Duration::from_millis(20));
    }
    let events = turn.join().unwrap().expect("the turn");
    (report_of(result_of(&events, "c1")), runs(setup))
}

/// gatewayd killed at each of its crash points (the last after a first crash that loses the
/// dispatch's answer while the command runs, so that a recovery settles it from the
/// executor's receipt), restarted; agentd's real turn reports one of the ends the model
/// reaches from those kills, and the command ran as often as the model says.
#[test]
fn gatewayd_killed_at_each_crash_point_leaves_what_the_model_says() {
    let kill = |point| Kill {
        point,
        command_running: false,
    };
    let cases: Vec<Vec<Kill>> = vec![
        vec![kill(LaptopPoint::DispatchReceived)],
        vec![kill(LaptopPoint::DispatchRecorded)],
        vec![kill(LaptopPoint::DispatchSent)],
        vec![kill(LaptopPoint::ResultRecorded)],
        vec![
            Kill {
                point: LaptopPoint::DispatchSent,
                command_running: true,
            },
            kill(LaptopPoint::ReceiptSettled),
        ],
    ];
    let mut covered = std::collections::BTreeSet::new();
    for kills in cases {
        let expected = laptop_model::after_kills(&kills);
        assert!(
            !expected.is_empty(),
            "{kills:?}: the model never gets there"
        );
        covered.extend(kills.iter().map(|k| k.point));
        // Each kill is a failpoint, or (command_running) the test's own SIGKILL once the
        // command is running; after the last, gatewayd starts clean.
        let env = |k: &Kill| (!k.command_running).then(|| k.point.failpoint().to_owned());
        let first = env(&kills[0]);
        let first_env: Vec<(&str, &str)> = first
            .iter()
            .map(|f| ("AGENTWORKS_FAILPOINT", f.as_str()))
            .collect();
        let (mut setup, _executor, chat) = laptop_case(&first_env, &[]);
        let port = setup.gw.port;
        let mut next = 0;
        let got = run_turn(&mut setup, &chat, |setup| {
            let Some(k) = kills.get(next) else {
                return true;
            };
            if k.command_running && runs(setup) > 0 {
                nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(setup.gw.child.id() as i32),
                    Signal::SIGKILL,
                )
                .unwrap();
            }
            if let Some(status) = setup.gw.child.try_wait().unwrap() {
                assert_eq!(status.signal(), Some(9), "{kills:?}: gatewayd {status}");
                next += 1;
                let following = kills.get(next).and_then(env);
                let env: Vec<(&str, &str)> = following
                    .iter()
                    .map(|f| ("AGENTWORKS_FAILPOINT", f.as_str()))
                    .collect();
                setup.gw = Gatewayd::start_with_env(&setup.stack, port, &env);
            }
            next == kills.len()
        });
        assert!(
            expected.contains(&got),
            "{kills:?}: agentd reported {got:?}; the model allows {expected:?}"
        );
        eprintln!("{kills:?}: {got:?}, of {expected:?}");
    }
    let points: std::collections::BTreeSet<LaptopPoint> = covered;
    assert!(points.iter().all(|p| p.in_gatewayd()));
    assert_eq!(points.len(), 5, "every crash point of gatewayd: {points:?}");
}

/// The executor killed at each of its crash points, restarted: agentd's real turn reports one
/// of the ends the model reaches, and the command ran as often as the model says.
#[test]
fn the_executor_killed_at_each_crash_point_leaves_what_the_model_says() {
    for point in [
        LaptopPoint::ExecutorReceived,
        LaptopPoint::ExecutorRunning,
        LaptopPoint::ExecutorRan,
        LaptopPoint::ExecutorDone,
    ] {
        let kills = [Kill {
            point,
            command_running: false,
        }];
        let expected = laptop_model::after_kills(&kills);
        assert!(
            !expected.is_empty(),
            "{point:?}: the model never gets there"
        );
        let (mut setup, executor, chat) =
            laptop_case(&[], &[("AGENTWORKS_FAILPOINT", point.failpoint())]);
        let mut executor = Some(executor);
        let mut restarted = false;
        let got = run_turn(&mut setup, &chat, |setup| {
            if !restarted && let Some(status) = executor.as_mut().unwrap().wait_exit(Duration::ZERO)
            {
                assert_eq!(status.signal(), Some(9), "{point:?}: the executor {status}");
                executor = Some(share(setup, &[]));
                restarted = true;
            }
            restarted
        });
        assert!(
            expected.contains(&got),
            "{point:?}: agentd reported {got:?}; the model allows {expected:?}"
        );
        eprintln!("{point:?}: {got:?}, of {expected:?}");
    }
}
