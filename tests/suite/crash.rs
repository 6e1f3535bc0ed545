//! Crash and concurrency suites: a real workspaced SIGKILLed at every step of a write (through
//! its failpoints) and at random moments, restarted and reconciled; two daemons on one state
//! root; many concurrent writers on one socket.
//!
//! Assertions are about ordering and content only, never about how long something took.

use super::harness::*;
use agentworks_contract::workspaced::Context;
use agentworks_daemon::layout::root_key;
use agentworks_support::unix_http::ClientError;
use serde_json::{Value, json};
use std::collections::HashSet;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Barrier};
use std::time::Duration;

const PROJECT: &str = "p";
const FILE: &str = "notes.txt";
const OLD: &str = "the old content\nline two\n";
const NEW: &str = "the NEW content, longer than the old one\nline two\nline three\n";

/// What one call to workspaced came back with.
#[derive(Debug)]
enum Reply {
    Ok(Value),
    /// The error envelope: its code and the whole body (details flattened).
    Remote(String, Value),
    /// No answer: the connection failed or was cut.
    Transport(String),
}

fn send(client: &Client, endpoint: &str, body: Value) -> Reply {
    match client.post::<_, Value>(endpoint, &body) {
        Ok(v) => Reply::Ok(v),
        Err(ClientError::Remote { body, .. }) => {
            Reply::Remote(body.code.clone(), serde_json::to_value(&body).unwrap())
        }
        Err(e) => Reply::Transport(e.to_string()),
    }
}

fn send_write(
    client: &Client,
    ctx: &Context,
    content: &str,
    expected: &str,
    request_id: &str,
) -> Reply {
    send(
        client,
        "/v1/write",
        json!({"context": ctx, "path": FILE, "content": content,
            "expected_revision": expected, "request_id": request_id}),
    )
}

fn file_content(project_dir: &Path) -> String {
    // A missing or non-UTF-8 file fails here, which is what the callers want.
    std::fs::read_to_string(project_dir.join(FILE)).expect("the target file exists and is text")
}

fn temp_files(state: &StateRoot) -> Vec<String> {
    all_files(&state.documents())
        .into_iter()
        .filter(|f| f.contains(".agentworks-tmp-"))
        .collect()
}

fn assert_no_temp_files(state: &StateRoot, when: &str) {
    let left = temp_files(state);
    assert!(
        left.is_empty(),
        "{when}: staged files left behind: {left:?}"
    );
}

/// The receipt state for `request_id`, or `not_found`.
fn receipt_state(client: &Client, ctx: &Context, request_id: &str) -> (String, Value) {
    match client.receipt(ctx, request_id) {
        Ok(v) => (v["state"].as_str().unwrap().to_owned(), v),
        Err((code, body)) => {
            assert_eq!(code, "not_found", "receipt lookup for {request_id}: {body}");
            (code, body)
        }
    }
}

/// How long the crash tests wait for another daemon to reach a point.
const WAIT: Duration = Duration::from_secs(30);

/// The lock file of a project, as workspaced names it.
fn lock_path(state: &StateRoot, project: &str) -> PathBuf {
    let root = state.documents().canonicalize().unwrap().join(project);
    state
        .root()
        .join("files/locks")
        .join(format!("{}.lock", root_key(&root)))
}

/// Whether someone holds the project's lock right now (probed with a non-blocking flock that
/// is released at once when it succeeds).
fn lock_held(state: &StateRoot, project: &str) -> bool {
    use rustix::fs::{FlockOperation, Mode, OFlags};
    let Ok(fd) = rustix::fs::open(
        lock_path(state, project),
        OFlags::RDWR | OFlags::CLOEXEC | OFlags::NOFOLLOW,
        Mode::empty(),
    ) else {
        return false;
    };
    match rustix::fs::flock(&fd, FlockOperation::NonBlockingLockExclusive) {
        Ok(()) => false,
        Err(rustix::io::Errno::WOULDBLOCK) => true,
        Err(e) => panic!("probing the project lock: {e}"),
    }
}

/// The states of every receipt for the file, newest first, as stored (history does not
/// reconcile).
fn history_states(client: &Client, ctx: &Context) -> Vec<String> {
    let history = client
        .json(
            "/v1/history",
            json!({"context": ctx, "path": FILE, "limit": 100}),
        )
        .unwrap();
    history["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["receipt"]["state"].as_str().unwrap().to_owned())
        .collect()
}

/// A second socket on the state root, for a second daemon.
fn alt_socket(state: &StateRoot, name: &str) -> PathBuf {
    state.root().join("run").join(name)
}

// ----- 1. a crash at each step -----

#[test]
fn crash_at_each_step_leaves_old_or_new_and_reconciles() {
    // (failpoint, the rename happened, a staged file is on disk at the crash). A write's temp
    // file is staged while its prepared receipt is written (group commit), so both are there
    // when the prepare's failpoint is reached.
    let steps = [
        ("after_prepare", false, true),
        ("after_stage", false, true),
        ("before_rename", false, true),
        ("after_rename", true, false),
        ("after_dir_fsync", true, false),
        ("before_mark_applied", true, false),
    ];
    for (step, renamed, staged_left) in steps {
        let state = StateRoot::new();
        let dir = state.project(PROJECT, &[(FILE, OLD)]);
        let alice = ctx(PROJECT, "alice");
        let request_id = format!("r-{step}");
        let mut daemon = Workspaced::start_with(
            &state,
            Options {
                failpoint: Some(step.into()),
                ..Options::default()
            },
        );
        let reply = send_write(&daemon.client(), &alice, NEW, &revision(OLD), &request_id);
        let Reply::Transport(why) = reply else {
            panic!("{step}: the write must get no answer, got {reply:?}");
        };
        let status = daemon.child.wait().unwrap();
        assert_eq!(
            status.signal(),
            Some(9),
            "{step}: {status} (client saw: {why})"
        );

        // What the crash left, before any recovery.
        let on_disk = file_content(&dir);
        assert!(
            on_disk == OLD || on_disk == NEW,
            "{step}: torn file {on_disk:?}"
        );
        assert_eq!(
            !temp_files(&state).is_empty(),
            staged_left,
            "{step}: staged files at the crash: {:?}",
            temp_files(&state)
        );

        let daemon = Workspaced::start(&state);
        let client = daemon.client();
        // Recovery at start already decided it: nothing is left prepared, even before a lookup.
        assert_eq!(
            history_states(&client, &alice),
            vec![if renamed { "applied" } else { "not_applied" }],
            "{step}"
        );
        let on_disk = file_content(&dir);
        let expected_content = if renamed { NEW } else { OLD };
        assert_eq!(on_disk, expected_content, "{step}: file after restart");
        assert_no_temp_files(&state, step);

        let receipt = client.receipt(&alice, &request_id).unwrap();
        let expected_state = if renamed { "applied" } else { "not_applied" };
        assert_eq!(receipt["state"], expected_state, "{step}: {receipt}");
        assert_eq!(receipt["previous_revision"], revision(OLD), "{step}");
        assert_eq!(receipt["resulting_revision"], revision(NEW), "{step}");
        assert_eq!(receipt["request_id"], request_id.as_str());

        // The same request again: the recorded outcome, the file untouched.
        let again = client
            .write(&alice, FILE, NEW, &revision(OLD), &request_id)
            .unwrap();
        assert_eq!(again["replayed"], true, "{step}: {again}");
        assert_eq!(again["state"], expected_state, "{step}: {again}");
        assert_eq!(again["receipt"]["receipt_id"], receipt["receipt_id"]);
        assert_eq!(file_content(&dir), expected_content, "{step}: after retry");
        assert_no_temp_files(&state, step);

        // Exactly one receipt for the request, in the reconciled state.
        let history = client
            .json("/v1/history", json!({"context": alice, "path": FILE}))
            .unwrap();
        let entries = history["entries"].as_array().unwrap();
        assert_eq!(entries.len(), 1, "{step}: {history}");
        assert_eq!(entries[0]["receipt"]["state"], expected_state);
        assert_eq!(entries[0]["before_content"], OLD);
    }
}

#[test]
fn failing_step_before_rename_is_not_applied_without_restart() {
    let state = StateRoot::new();
    let dir = state.project(PROJECT, &[(FILE, OLD)]);
    let alice = ctx(PROJECT, "alice");
    let mut daemon = Workspaced::start_with(
        &state,
        Options {
            failpoint: Some("before_rename:fail".into()),
            ..Options::default()
        },
    );
    let client = daemon.client();
    let (code, body) = client
        .write(&alice, FILE, NEW, &revision(OLD), "r-fail")
        .unwrap_err();
    assert_eq!(code, "io_error", "{body}");
    assert_eq!(file_content(&dir), OLD);
    assert_no_temp_files(&state, "before_rename:fail");
    let receipt = client.receipt(&alice, "r-fail").unwrap();
    assert_eq!(receipt["state"], "not_applied", "{receipt}");
    // Still alive and consistent: a retry replays the recorded refusal.
    let again = client
        .write(&alice, FILE, NEW, &revision(OLD), "r-fail")
        .unwrap();
    assert_eq!(again["replayed"], true);
    assert_eq!(again["state"], "not_applied");
    assert_eq!(file_content(&dir), OLD);
    assert!(daemon.child.try_wait().unwrap().is_none());
    assert!(daemon.stop().success());
}

// ----- 2. someone else changed the file after the crash -----

#[test]
fn uncertain_when_file_changed_by_someone_else_after_crash() {
    const THIRD: &str = "written by an editor outside agentworks\n";
    let state = StateRoot::new();
    let dir = state.project(PROJECT, &[(FILE, OLD)]);
    let alice = ctx(PROJECT, "alice");
    let mut daemon = Workspaced::start_with(
        &state,
        Options {
            failpoint: Some("after_prepare".into()),
            ..Options::default()
        },
    );
    let reply = send_write(&daemon.client(), &alice, NEW, &revision(OLD), "r-unc");
    let Reply::Transport(why) = reply else {
        panic!("the write must get no answer, got {reply:?}");
    };
    let status = daemon.child.wait().unwrap();
    assert_eq!(status.signal(), Some(9), "{status} (client saw: {why})");

    std::fs::write(dir.join(FILE), THIRD).unwrap();
    let daemon = Workspaced::start(&state);
    let client = daemon.client();

    let receipt = client.receipt(&alice, "r-unc").unwrap();
    assert_eq!(receipt["state"], "uncertain", "{receipt}");
    assert_eq!(receipt["previous_revision"], revision(OLD));
    assert_eq!(receipt["resulting_revision"], revision(NEW));
    // Never guessed, never "fixed": the editor's content stays.
    assert_eq!(file_content(&dir), THIRD);

    let again = client
        .write(&alice, FILE, NEW, &revision(OLD), "r-unc")
        .unwrap();
    assert_eq!(again["replayed"], true, "{again}");
    assert_eq!(again["state"], "uncertain", "{again}");
    assert_eq!(again["previous_revision"], revision(OLD));
    assert_eq!(again["revision"], revision(NEW));
    assert_eq!(file_content(&dir), THIRD);

    // A fresh write still needs the revision the file holds now.
    let (code, body) = client
        .write(&alice, FILE, NEW, &revision(OLD), "r-unc-2")
        .unwrap_err();
    assert_eq!(code, "revision_conflict");
    assert_eq!(body["current_revision"], revision(THIRD));
    assert_no_temp_files(&state, "uncertain");
}

// ----- 3. random kills under a stream of writes -----

#[derive(Debug)]
enum Outcome {
    Applied {
        receipt_id: String,
        revision: String,
    },
    Conflict,
    Transport,
}

struct Sent {
    request_id: String,
    content: String,
    outcome: Outcome,
}

/// Sequential writes until the first transport error; returns every write sent, in order.
/// `first_applied` hears once the first write of the round is applied.
fn writer(
    client: Client,
    ctx: Context,
    round: usize,
    first_applied: std::sync::mpsc::Sender<()>,
) -> Vec<Sent> {
    let mut sent = Vec::new();
    let mut known = match send(&client, "/v1/read", json!({"context": ctx, "path": FILE})) {
        Reply::Ok(v) => v["revision"].as_str().unwrap().to_owned(),
        Reply::Transport(_) => return sent,
        Reply::Remote(code, body) => panic!("read: {code} {body}"),
    };
    for i in 0.. {
        let request_id = format!("w-{round}-{i}");
        // Long enough that a torn or partial write could not pass for a whole one.
        let content = format!("round {round} write {i}\n").repeat(300);
        let outcome = match send_write(&client, &ctx, &content, &known, &request_id) {
            Reply::Ok(v) => {
                assert_eq!(v["state"], "applied", "{v}");
                assert_eq!(v["replayed"], false, "{v}");
                known = v["revision"].as_str().unwrap().to_owned();
                let _ = first_applied.send(());
                Outcome::Applied {
                    receipt_id: v["receipt"]["receipt_id"].as_str().unwrap().to_owned(),
                    revision: known.clone(),
                }
            }
            Reply::Remote(code, body) if code == "revision_conflict" => {
                known = body["current_revision"].as_str().unwrap().to_owned();
                Outcome::Conflict
            }
            Reply::Remote(code, body) => panic!("write {request_id}: {code} {body}"),
            Reply::Transport(_) => Outcome::Transport,
        };
        let stop = matches!(outcome, Outcome::Transport);
        sent.push(Sent {
            request_id,
            content,
            outcome,
        });
        if stop {
            break;
        }
    }
    sent
}

#[test]
fn randomized_kills_under_a_stream_of_writes() {
    let state = StateRoot::new();
    let dir = state.project(PROJECT, &[(FILE, OLD)]);
    let alice = ctx(PROJECT, "alice");
    let mut current = OLD.to_owned();
    let mut total_applied = 0;
    let mut lost = std::collections::BTreeMap::<String, usize>::new();
    for round in 0..20 {
        let mut daemon = Workspaced::start(&state);
        let client = daemon.client();
        let thread_ctx = alice.clone();
        let (applied_tx, applied_rx) = std::sync::mpsc::channel();
        let handle = std::thread::spawn(move || writer(client, thread_ctx, round, applied_tx));
        // Kill mid-stream: after the first write of the round is applied (however slow the
        // machine), then at a random point of the writes that follow.
        applied_rx
            .recv_timeout(Duration::from_secs(30))
            .unwrap_or_else(|_| panic!("round {round}: no write was applied within 30 s"));
        std::thread::sleep(Duration::from_millis(rand::random_range(0..=40)));
        daemon.kill();
        let sent = handle.join().unwrap();
        // The writer only stops at a transport error, so the last write (if any) got none.
        if let Some(last) = sent.last() {
            assert!(matches!(last.outcome, Outcome::Transport));
        }

        let daemon = Workspaced::start(&state);
        let client = daemon.client();
        let on_disk = file_content(&dir);
        let mut allowed: HashSet<&str> = sent.iter().map(|s| s.content.as_str()).collect();
        allowed.insert(current.as_str());
        assert!(
            allowed.contains(on_disk.as_str()),
            "round {round}: the file holds content nobody sent ({} bytes)",
            on_disk.len()
        );
        assert_no_temp_files(&state, &format!("round {round}"));
        let stored = history_states(&client, &alice);
        assert!(
            !stored.iter().any(|s| s == "prepared"),
            "round {round}: recovery left prepared receipts: {stored:?}"
        );

        // Replay the round from the receipts: the last applied write is what the file holds.
        let mut expected = current.clone();
        let mut expected_revision = revision(&current);
        for s in &sent {
            let (found, receipt) = receipt_state(&client, &alice, &s.request_id);
            match &s.outcome {
                Outcome::Applied {
                    receipt_id,
                    revision: rev,
                } => {
                    assert_eq!(
                        found, "applied",
                        "round {round} {}: {receipt}",
                        s.request_id
                    );
                    assert_eq!(receipt["receipt_id"], receipt_id.as_str());
                    assert_eq!(receipt["resulting_revision"], rev.as_str());
                }
                Outcome::Conflict => assert_eq!(found, "not_found", "{}", s.request_id),
                Outcome::Transport => {
                    *lost.entry(found.clone()).or_insert(0) += 1;
                    assert!(
                        ["applied", "not_applied", "not_found"].contains(&found.as_str()),
                        "round {round} {}: {found} {receipt}",
                        s.request_id
                    );
                }
            }
            if found == "applied" {
                total_applied += 1;
                // Sequential writes from one writer chain: each starts where the last ended.
                assert_eq!(receipt["previous_revision"], expected_revision.as_str());
                assert_eq!(receipt["resulting_revision"], revision(&s.content));
                expected = s.content.clone();
                expected_revision = revision(&s.content);
            }
        }
        assert!(
            on_disk == expected,
            "round {round}: the file is not the last applied write"
        );
        let read = client.read(&alice, FILE).unwrap();
        assert_eq!(read["revision"], expected_revision.as_str());
        current = expected;
    }
    // Every round applied at least its first write before the kill.
    assert!(
        total_applied >= 20,
        "{total_applied} writes applied in 20 rounds"
    );
    eprintln!(
        "randomized kills: {total_applied} applied writes; unanswered writes by receipt: {lost:?}"
    );
}

// ----- 4. the receipt store is unavailable -----

#[test]
fn receipt_store_unavailable_refuses_and_leaves_file() {
    let state = StateRoot::new();
    let dir = state.project(PROJECT, &[(FILE, OLD)]);
    let alice = ctx(PROJECT, "alice");
    let daemon = Workspaced::start_with(
        &state,
        Options {
            failpoint: Some("receipt_unavailable:fail".into()),
            ..Options::default()
        },
    );
    let client = daemon.client();
    let (code, body) = client
        .write(&alice, FILE, NEW, &revision(OLD), "r-audit")
        .unwrap_err();
    assert_eq!(code, "audit_unavailable", "{body}");
    assert_eq!(body["retryable"], true);
    assert_eq!(file_content(&dir), OLD);
    assert_no_temp_files(&state, "receipt_unavailable");
    let (found, _) = receipt_state(&client, &alice, "r-audit");
    assert_eq!(found, "not_found");
}

#[test]
fn receipt_store_read_only_refuses_and_leaves_file() {
    let (uid, gid) = {
        let _users = users_lock();
        ensure_user("awtest-files", &[])
    };
    // After a clean stop only receipts.db is left; after SIGKILL its -wal and -shm are too.
    read_only_store_refuses(uid, gid, false);
    read_only_store_refuses(uid, gid, true);
}

/// A non-root workspaced whose project receipt store was made read-only after one write.
fn read_only_store_refuses(uid: u32, gid: u32, crash: bool) {
    let state = StateRoot::new();
    let dir = state.project(PROJECT, &[(FILE, OLD)]);
    let owner = Some(nix::unistd::Uid::from_raw(uid));
    let group = Some(nix::unistd::Gid::from_raw(gid));
    nix::unistd::chown(&dir, owner, group).unwrap();
    nix::unistd::chown(&dir.join(FILE), owner, group).unwrap();
    state.give_state_to(uid, gid);
    let options = Options {
        user: Some((uid, gid, vec![])),
        ..Options::default()
    };
    let alice = ctx(PROJECT, "alice");

    let mut daemon = Workspaced::start_with(&state, options.clone());
    let first = daemon
        .client()
        .write(&alice, FILE, NEW, &revision(OLD), "r-ok")
        .unwrap();
    assert_eq!(first["state"], "applied");
    if crash {
        daemon.kill();
    } else {
        assert!(daemon.stop().success());
    }
    assert_eq!(file_content(&dir), NEW);

    let store_dir = {
        let root = state.documents().canonicalize().unwrap().join(PROJECT);
        state.root().join("files/receipts").join(root_key(&root))
    };
    let db = store_dir.join("receipts.db");
    let store_files = all_files(&store_dir);
    assert!(
        store_files.contains(&"receipts.db".to_owned()),
        "{store_files:?}"
    );
    if crash {
        assert!(
            store_files.contains(&"receipts.db-wal".to_owned()),
            "{store_files:?}"
        );
    }
    let set_mode = |path: &Path, mode: u32| {
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
    };
    for side in ["receipts.db-wal", "receipts.db-shm"] {
        let path = store_dir.join(side);
        if let Ok(meta) = std::fs::metadata(&path) {
            set_mode(&path, meta.permissions().mode() & 0o555);
        }
    }
    set_mode(&db, 0o400);
    set_mode(&store_dir, 0o500);

    let daemon = Workspaced::start_with(&state, options);
    let client = daemon.client();
    let (code, body) = client
        .write(&alice, FILE, "a third content\n", &revision(NEW), "r-ro")
        .unwrap_err();
    assert_eq!(code, "audit_unavailable", "crash={crash}: {body}");
    assert_eq!(file_content(&dir), NEW);
    assert_no_temp_files(&state, "read-only receipt store");
    // Reads and the earlier receipt are still served; the refused write left no receipt.
    assert_eq!(client.read(&alice, FILE).unwrap()["content"], NEW);
    assert_eq!(client.receipt(&alice, "r-ok").unwrap()["state"], "applied");
    assert_eq!(receipt_state(&client, &alice, "r-ro").0, "not_found");
    let mode = std::fs::metadata(&db).unwrap().permissions().mode() & 0o777;
    assert_eq!(
        mode, 0o400,
        "the daemon must not make the database writable again"
    );
}

// ----- 5./6. two daemons on one state root -----

#[test]
fn two_daemons_on_one_state_root_serialize() {
    const A: &str = "written through daemon one\n";
    const B: &str = "written through daemon two\n";
    let state = StateRoot::new();
    let dir = state.project(PROJECT, &[(FILE, OLD)]);
    let alice = ctx(PROJECT, "alice");
    let one = Workspaced::start_with(
        &state,
        Options {
            failpoint: Some("after_prepare:sleep:1500".into()),
            socket: Some(alt_socket(&state, "one.sock")),
            ..Options::default()
        },
    );
    let two = Workspaced::start_with(
        &state,
        Options {
            socket: Some(alt_socket(&state, "two.sock")),
            ..Options::default()
        },
    );
    assert!(
        !lock_held(&state, PROJECT),
        "nobody holds the lock before the writes"
    );
    let spawn_writer = |client: Client, content: &'static str, request_id: &'static str| {
        let ctx = alice.clone();
        std::thread::spawn(move || send_write(&client, &ctx, content, &revision(OLD), request_id))
    };
    let a = spawn_writer(one.client(), A, "r-a");
    wait_until("daemon one holds the project lock", WAIT, || {
        lock_held(&state, PROJECT)
    });
    let b = spawn_writer(two.client(), B, "r-b");
    let a_reply = a.join().unwrap();
    let b_reply = b.join().unwrap();

    // Client-side completion order is no evidence (the two replies race once the lock is
    // released). B's conflict naming A's revision is: without the shared lock B would have
    // read OLD while A slept, and won.
    let Reply::Ok(a_ok) = a_reply else {
        panic!("A must win: {a_reply:?}");
    };
    assert_eq!(a_ok["state"], "applied");
    let Reply::Remote(code, body) = b_reply else {
        panic!("B must lose: {b_reply:?}");
    };
    assert_eq!(code, "revision_conflict", "{body}");
    assert_eq!(body["current_revision"], revision(A));
    assert_eq!(file_content(&dir), A);
    // Both daemons agree on the receipts.
    for daemon in [&one, &two] {
        let client = daemon.client();
        assert_eq!(client.receipt(&alice, "r-a").unwrap()["state"], "applied");
        assert_eq!(receipt_state(&client, &alice, "r-b").0, "not_found");
    }
    assert_no_temp_files(&state, "two daemons");
}

#[test]
fn long_operation_in_one_project_does_not_block_another() {
    let state = StateRoot::new();
    let dir1 = state.project("p1", &[(FILE, OLD)]);
    let dir2 = state.project("p2", &[(FILE, OLD)]);
    let one = Workspaced::start_with(
        &state,
        Options {
            failpoint: Some("after_prepare:sleep:2000".into()),
            socket: Some(alt_socket(&state, "one.sock")),
            ..Options::default()
        },
    );
    let two = Workspaced::start_with(
        &state,
        Options {
            socket: Some(alt_socket(&state, "two.sock")),
            ..Options::default()
        },
    );
    let sequence = Arc::new(AtomicUsize::new(0));
    let spawn_writer = |client: Client, project: &'static str, request_id: &'static str| {
        let sequence = sequence.clone();
        let ctx = ctx(project, "alice");
        std::thread::spawn(move || {
            let reply = send_write(&client, &ctx, NEW, &revision(OLD), request_id);
            (sequence.fetch_add(1, Ordering::SeqCst), reply)
        })
    };
    let a = spawn_writer(one.client(), "p1", "r-p1");
    wait_until("daemon one holds p1's lock", WAIT, || {
        lock_held(&state, "p1")
    });
    let b = spawn_writer(two.client(), "p2", "r-p2");
    let (b_order, b_reply) = b.join().unwrap();
    // p1 is still in the middle of its write when p2's is done.
    let p1_still_locked = lock_held(&state, "p1");
    let (a_order, a_reply) = a.join().unwrap();

    assert_eq!((b_order, a_order), (0, 1), "p2's write waited for p1's");
    assert!(
        p1_still_locked,
        "p1's lock was released before p2's write answered"
    );
    for (name, reply, dir) in [("p1", a_reply, &dir1), ("p2", b_reply, &dir2)] {
        let Reply::Ok(v) = reply else {
            panic!("{name}: {reply:?}");
        };
        assert_eq!(v["state"], "applied", "{name}: {v}");
        assert_eq!(v["replayed"], false);
        assert_eq!(file_content(dir), NEW, "{name}");
    }
    assert_no_temp_files(&state, "two projects");
}

// ----- 7./8. many writers on one daemon -----

#[test]
fn concurrent_same_request_id_applies_once() {
    let state = StateRoot::new();
    let dir = state.project(PROJECT, &[(FILE, OLD)]);
    let alice = ctx(PROJECT, "alice");
    let daemon = Workspaced::start(&state);
    let barrier = Arc::new(Barrier::new(8));
    let threads: Vec<_> = (0..8)
        .map(|_| {
            let client = daemon.client();
            let ctx = alice.clone();
            let barrier = barrier.clone();
            std::thread::spawn(move || {
                barrier.wait();
                send_write(&client, &ctx, NEW, &revision(OLD), "r-same")
            })
        })
        .collect();
    let replies: Vec<Reply> = threads.into_iter().map(|t| t.join().unwrap()).collect();

    let mut fresh = 0;
    let mut receipt_ids = HashSet::new();
    for reply in &replies {
        match reply {
            Reply::Ok(v) => {
                assert_eq!(v["state"], "applied", "{v}");
                if v["replayed"] == false {
                    fresh += 1;
                } else {
                    assert_eq!(v["replayed"], true, "{v}");
                }
                receipt_ids.insert(v["receipt"]["receipt_id"].as_str().unwrap().to_owned());
            }
            Reply::Remote(code, _) if code == "request_in_progress" => {}
            other => panic!("unexpected reply: {other:?}"),
        }
    }
    assert_eq!(
        fresh, 1,
        "exactly one reply applies the change: {replies:?}"
    );
    assert_eq!(receipt_ids.len(), 1, "{receipt_ids:?}");
    assert_eq!(file_content(&dir), NEW);

    let history = daemon
        .client()
        .json(
            "/v1/history",
            json!({"context": alice, "path": FILE, "limit": 100}),
        )
        .unwrap();
    let entries = history["entries"].as_array().unwrap();
    let mine: Vec<_> = entries
        .iter()
        .filter(|e| e["receipt"]["request_id"] == "r-same")
        .collect();
    assert_eq!(mine.len(), 1, "{history}");
    assert_eq!(entries.len(), 1, "{history}");
    assert!(receipt_ids.contains(mine[0]["receipt"]["receipt_id"].as_str().unwrap()));
}

#[test]
fn conflicting_writes_same_expected_revision_exactly_one_wins() {
    let state = StateRoot::new();
    let dir = state.project(PROJECT, &[(FILE, OLD)]);
    let alice = ctx(PROJECT, "alice");
    let daemon = Workspaced::start(&state);
    let barrier = Arc::new(Barrier::new(8));
    let threads: Vec<_> = (0..8)
        .map(|i| {
            let client = daemon.client();
            let ctx = alice.clone();
            let barrier = barrier.clone();
            std::thread::spawn(move || {
                let content = format!("writer {i} was here\n");
                barrier.wait();
                let reply = send_write(&client, &ctx, &content, &revision(OLD), &format!("r-{i}"));
                (i, content, reply)
            })
        })
        .collect();
    let results: Vec<_> = threads.into_iter().map(|t| t.join().unwrap()).collect();

    let winners: Vec<_> = results
        .iter()
        .filter(|(_, _, r)| matches!(r, Reply::Ok(_)))
        .collect();
    assert_eq!(winners.len(), 1, "{results:?}");
    let (winner, winning_content, Reply::Ok(won)) = winners[0] else {
        unreachable!()
    };
    assert_eq!(won["state"], "applied");
    assert_eq!(won["revision"], revision(winning_content));
    for (i, _, reply) in &results {
        if i == winner {
            continue;
        }
        let Reply::Remote(code, body) = reply else {
            panic!("writer {i}: {reply:?}");
        };
        assert_eq!(code, "revision_conflict", "writer {i}: {body}");
        assert_eq!(body["current_revision"], revision(winning_content));
        assert_eq!(body["expected_revision"], revision(OLD));
    }
    assert_eq!(&file_content(&dir), winning_content);
    let client = daemon.client();
    for (i, _, _) in &results {
        let (found, _) = receipt_state(&client, &alice, &format!("r-{i}"));
        let expected = if i == winner { "applied" } else { "not_found" };
        assert_eq!(found, expected, "writer {i}");
    }
    assert_no_temp_files(&state, "conflicting writers");
}

// ----- an edit goes through the same pipeline -----

#[test]
fn an_edit_killed_before_or_after_the_rename_reconciles_and_replays_with_its_diff() {
    // (failpoint, the rename happened)
    for (step, renamed) in [("after_prepare", false), ("before_mark_applied", true)] {
        let state = StateRoot::new();
        let dir = state.project(PROJECT, &[(FILE, OLD)]);
        let alice = ctx(PROJECT, "alice");
        let request_id = format!("e-{step}");
        let body = json!({"context": alice, "path": FILE, "request_id": request_id,
            "edits": [{"old_text": "old", "new_text": "edited"}], "expected_revision": revision(OLD)});
        let edited = OLD.replace("old", "edited");
        let mut daemon = Workspaced::start_with(
            &state,
            Options {
                failpoint: Some(step.into()),
                ..Options::default()
            },
        );
        let reply = send(&daemon.client(), "/v1/edit", body.clone());
        assert!(matches!(reply, Reply::Transport(_)), "{step}: {reply:?}");
        assert_eq!(daemon.child.wait().unwrap().signal(), Some(9), "{step}");
        drop(daemon);

        let daemon = Workspaced::start(&state);
        let client = daemon.client();
        let expected_state = if renamed { "applied" } else { "not_applied" };
        assert_eq!(
            history_states(&client, &alice),
            vec![expected_state],
            "{step}"
        );
        let expected_content = if renamed { edited.as_str() } else { OLD };
        assert_eq!(file_content(&dir), expected_content, "{step}");
        assert_no_temp_files(&state, step);
        let receipt = client.receipt(&alice, &request_id).unwrap();
        assert_eq!(
            (&receipt["state"], &receipt["operation"]),
            (&json!(expected_state), &json!("edit")),
            "{step}"
        );
        assert_eq!(receipt["resulting_revision"], revision(&edited), "{step}");

        // The same request again: the recorded outcome with the recorded change's diff, the
        // file untouched (not edited now, even where the first one never reached it).
        let again = client.json("/v1/edit", body).unwrap();
        assert_eq!(
            (&again["replayed"], &again["state"]),
            (&json!(true), &json!(expected_state)),
            "{step}: {again}"
        );
        assert!(
            again["diff"]
                .as_str()
                .unwrap()
                .contains("+the edited content\n"),
            "{step}: {again}"
        );
        assert_eq!(file_content(&dir), expected_content, "{step}: after retry");
    }
}
