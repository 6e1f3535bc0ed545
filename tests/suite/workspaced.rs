//! workspaced through its real socket: reads, writes, idempotency, conflicts, confinement,
//! the guard, patch/move/delete/history/restore, peer checks.

use super::harness::*;
use agentworks_core::guard::Guard;
use serde_json::json;
use std::os::unix::fs::symlink;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

#[test]
fn read_write_replay_conflict_and_reuse() {
    let state = StateRoot::new();
    let dir = state.project("demo", &[("code/task.py", "print('old')\n")]);
    let daemon = Workspaced::start(&state);
    let client = daemon.client();
    let alice = ctx("demo", "alice");

    let read = client.read(&alice, "code/task.py").unwrap();
    assert_eq!(read["content"], "print('old')\n");
    assert_eq!(read["revision"], revision("print('old')\n"));

    let rev = read["revision"].as_str().unwrap();
    let first = client
        .write(&alice, "code/task.py", "print('updated')\n", rev, "req-1")
        .unwrap();
    assert_eq!(first["state"], "applied");
    assert_eq!(first["replayed"], false);
    assert_eq!(first["revision"], revision("print('updated')\n"));
    assert_eq!(first["receipt"]["previous_revision"], rev);
    assert_eq!(
        std::fs::read_to_string(dir.join("code/task.py")).unwrap(),
        "print('updated')\n"
    );

    // The same request again: the recorded outcome, nothing written twice.
    let again = client
        .write(&alice, "code/task.py", "print('updated')\n", rev, "req-1")
        .unwrap();
    assert_eq!(again["replayed"], true);
    assert_eq!(
        again["receipt"]["receipt_id"],
        first["receipt"]["receipt_id"]
    );

    // Same id, other payload: refused.
    let (code, _) = client
        .write(&alice, "code/task.py", "print('other')\n", rev, "req-1")
        .unwrap_err();
    assert_eq!(code, "request_id_reused");

    // A stale revision: conflict with the current one, file untouched.
    let (code, details) = client
        .write(&alice, "code/task.py", "print('other')\n", rev, "req-2")
        .unwrap_err();
    assert_eq!(code, "revision_conflict");
    assert_eq!(details["current_revision"], revision("print('updated')\n"));
    assert_eq!(
        std::fs::read_to_string(dir.join("code/task.py")).unwrap(),
        "print('updated')\n"
    );

    // Another user's identical request id is theirs alone: it does not replay alice's receipt.
    let bob = ctx("demo", "bob");
    let (code, _) = client.receipt(&bob, "req-1").unwrap_err();
    assert_eq!(code, "not_found");
    let (code, _) = client
        .write(&bob, "code/task.py", "print('updated')\n", rev, "req-1")
        .unwrap_err();
    assert_eq!(
        code, "revision_conflict",
        "bob's req-1 is a new request, checked afresh"
    );

    // Create needs "missing"; creating over an existing file conflicts.
    let created = client
        .write(&alice, "new/dir/file.md", "# hi\n", "missing", "req-3")
        .unwrap();
    assert_eq!(created["previous_revision"], "missing");
    assert_eq!(
        std::fs::read_to_string(dir.join("new/dir/file.md")).unwrap(),
        "# hi\n"
    );
    let (code, _) = client
        .write(&alice, "new/dir/file.md", "x", "missing", "req-4")
        .unwrap_err();
    assert_eq!(code, "revision_conflict");

    let receipt = client.receipt(&alice, "req-1").unwrap();
    assert_eq!(receipt["state"], "applied");
    assert_eq!(receipt["user_name"], "alice");
    assert_eq!(receipt["connection_id"], "conn-test");
}

/// workspaced as systemd runs it with `RestrictSUIDSGID=yes`: every `openat2` fails with
/// `ENOSYS` (here through the debug-only failpoint), so paths are confined by the component walk.
fn without_openat2() -> Options {
    Options {
        failpoint: Some("openat2:fail".into()),
        ..Options::default()
    }
}

#[test]
fn confinement_refuses_every_escape_with_a_clear_reason() {
    confinement_refuses_every_escape(Options::default());
}

#[test]
fn confinement_refuses_every_escape_without_openat2() {
    confinement_refuses_every_escape(without_openat2());
}

fn confinement_refuses_every_escape(options: Options) {
    let state = StateRoot::new();
    let outside = tempfile::tempdir().unwrap();
    std::fs::write(outside.path().join("secret"), "top secret").unwrap();
    let dir = state.project("demo", &[("a.txt", "a"), ("workflow.json", "{}")]);
    symlink(outside.path(), dir.join("linkdir")).unwrap();
    symlink(outside.path().join("secret"), dir.join("leaf")).unwrap();
    std::fs::create_dir(dir.join(".git")).unwrap();
    std::fs::write(dir.join(".git/config"), "[core]").unwrap();
    let daemon = Workspaced::start_with(&state, options);
    let client = daemon.client();
    let alice = ctx("demo", "alice");

    let cases = [
        ("../etc/passwd", "path_refused", "traversal"),
        ("/etc/passwd", "path_refused", "absolute"),
        ("a\u{0}b", "path_refused", "nul"),
        (".git/config", "path_refused", "private"),
        ("a/./b", "path_refused", "empty_component"),
        ("linkdir/secret", "path_refused", "symlink"),
        ("leaf", "path_refused", "symlink"),
        ("workflow.json", "forbidden", "protected"),
    ];
    for (path, want_code, want_reason) in cases {
        let (code, details) = client
            .write(&alice, path, "pwned", "missing", "w")
            .unwrap_err();
        assert_eq!(
            (code.as_str(), details["reason"].as_str()),
            (want_code, Some(want_reason)),
            "write {path:?}: {details}"
        );
        assert!(
            details["message"].as_str().unwrap().len() > 10,
            "a message a person can act on"
        );
        if want_code == "path_refused" {
            let (code, _) = client.read(&alice, path).unwrap_err();
            assert_eq!(code, want_code, "read {path:?}");
        }
    }
    assert_eq!(
        std::fs::read_to_string(outside.path().join("secret")).unwrap(),
        "top secret"
    );
    assert_eq!(std::fs::read_dir(outside.path()).unwrap().count(), 1);
    // Reading a protected file is allowed; writing it never is.
    assert_eq!(
        client.read(&alice, "workflow.json").unwrap()["content"],
        "{}"
    );
    // An unknown project, and a project name that tries to climb out.
    for project in ["nope", "..", "demo/../demo", "/tmp"] {
        let (code, _) = client.read(&ctx(project, "alice"), "a.txt").unwrap_err();
        assert_eq!(code, "not_found", "project {project:?}");
    }
    // Listing hides private entries and never follows the symlinks.
    let list = client
        .json("/v1/list", json!({"context": alice, "recursive": true}))
        .unwrap();
    let paths: Vec<&str> = list["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["path"].as_str().unwrap())
        .collect();
    assert!(paths.contains(&"a.txt"));
    assert!(
        !paths
            .iter()
            .any(|p| p.starts_with(".git") || p.starts_with("linkdir/")),
        "{paths:?}"
    );
}

#[test]
fn swapping_a_directory_for_a_symlink_never_writes_outside() {
    symlink_swap_race(Options::default());
}

#[test]
fn swapping_a_directory_for_a_symlink_never_writes_outside_without_openat2() {
    symlink_swap_race(without_openat2());
}

fn symlink_swap_race(options: Options) {
    let state = StateRoot::new();
    let outside = tempfile::tempdir().unwrap();
    let dir = state.project("demo", &[("sub/seed.txt", "s")]);
    let daemon = Workspaced::start_with(&state, options);
    let client = daemon.client();
    let alice = ctx("demo", "alice");

    // The attacker thread swaps demo/sub between a real directory and a symlink to outside.
    let stop = Arc::new(AtomicBool::new(false));
    let swapper = {
        let stop = stop.clone();
        let sub = dir.join("sub");
        let parked = dir.join("sub-real");
        let target = outside.path().to_path_buf();
        std::thread::spawn(move || {
            let mut swaps = 0u64;
            while !stop.load(Ordering::Relaxed) {
                // workspaced may create `sub` itself while it is missing; then put ours back.
                if std::fs::rename(&sub, &parked).is_err() {
                    continue;
                }
                if symlink(&target, &sub).is_ok() {
                    swaps += 1;
                }
                if std::fs::remove_file(&sub).is_err() {
                    let _ = std::fs::remove_dir_all(&sub);
                }
                while std::fs::rename(&parked, &sub).is_err() {
                    let _ = std::fs::remove_dir_all(&sub);
                }
            }
            swaps
        })
    };
    let mut applied = 0;
    let mut refused = 0;
    for i in 0..300 {
        match client.write(
            &alice,
            &format!("sub/f{i}.txt"),
            "payload",
            "missing",
            &format!("r{i}"),
        ) {
            Ok(_) => applied += 1,
            Err((code, _)) => {
                assert!(
                    ["path_refused", "not_found", "revision_conflict"].contains(&code.as_str()),
                    "unexpected {code}"
                );
                refused += 1;
            }
        }
    }
    stop.store(true, Ordering::Relaxed);
    let swaps = swapper.join().unwrap();
    assert!(swaps > 0);
    let leaked: Vec<_> = std::fs::read_dir(outside.path()).unwrap().collect();
    assert!(
        leaked.is_empty(),
        "bytes written outside the project: {leaked:?}"
    );
    assert_eq!(applied + refused, 300);
    eprintln!(
        "symlink swap race: {swaps} swaps, {applied} writes applied inside, {refused} refused"
    );
}

#[test]
fn guard_is_reapplied_by_workspaced() {
    let state = StateRoot::new();
    state.project(
        "demo",
        &[
            ("code/a.py", "a"),
            ("plans/p.md", "p"),
            ("secret/k", "k"),
            ("docs/d.md", "d"),
        ],
    );
    let daemon = Workspaced::start(&state);
    let client = daemon.client();
    let guard = Guard {
        write_paths: vec!["code".into(), "plans".into(), "secret".into()],
        blocked_paths: vec!["secret".into()],
        blocked_write_paths: vec![],
        read_only_paths: vec!["plans".into()],
    };
    let c = ctx_with_guard("demo", "alice", guard);
    assert!(
        client
            .write(&c, "code/a.py", "b", &revision("a"), "1")
            .is_ok()
    );
    for (path, reason) in [
        ("plans/p.md", "read_only"),
        ("secret/k", "blocked"),
        ("docs/d.md", "outside_write_paths"),
    ] {
        let current = std::fs::read_to_string(state.documents().join("demo").join(path)).unwrap();
        let (code, details) = client
            .write(&c, path, "x", &revision(&current), &format!("w-{path}"))
            .unwrap_err();
        assert_eq!(
            (code.as_str(), details["reason"].as_str()),
            ("forbidden", Some(reason)),
            "{path}"
        );
    }
    let (code, _) = client.read(&c, "secret/k").unwrap_err();
    assert_eq!(code, "forbidden");
    assert!(client.read(&c, "plans/p.md").is_ok());
    // Search and list never show blocked files.
    let found = client
        .json("/v1/search", json!({"context": c, "query": "k"}))
        .unwrap();
    assert!(
        found["matches"]
            .as_array()
            .unwrap()
            .iter()
            .all(|m| !m["path"].as_str().unwrap().starts_with("secret"))
    );
    // A guard that does not parse refuses (fail closed), it is not ignored.
    let bad = ctx_with_guard(
        "demo",
        "alice",
        Guard {
            write_paths: vec!["../x".into()],
            ..Guard::default()
        },
    );
    let (code, details) = client
        .write(&bad, "code/a.py", "c", &revision("b"), "2")
        .unwrap_err();
    assert_eq!(
        (code.as_str(), details["reason"].as_str()),
        ("forbidden", Some("invalid_guard"))
    );
    // Unknown fields in the context are refused, not ignored.
    let (code, _) = client
        .json("/v1/read", json!({"context": {"project": "demo", "principal": {"user_id": "u", "user_name": "u", "source": "t"}, "guard": {"write_paths": [], "allow_everything": true}}, "path": "code/a.py"}))
        .unwrap_err();
    assert_eq!(code, "invalid_request");
}

#[test]
fn content_bounds_and_text_only() {
    let state = StateRoot::new();
    state.set_config("[workspaced]\nmax_file_bytes = 1024\n");
    let dir = state.project("demo", &[]);
    std::fs::write(dir.join("bin.dat"), [0xff, 0xfe, 0x00]).unwrap();
    std::fs::write(dir.join("big.txt"), "x".repeat(2000)).unwrap();
    let daemon = Workspaced::start(&state);
    let client = daemon.client();
    let alice = ctx("demo", "alice");
    let (code, _) = client
        .write(&alice, "a.txt", &"y".repeat(1025), "missing", "1")
        .unwrap_err();
    assert_eq!(code, "too_large");
    assert!(!dir.join("a.txt").exists());
    assert_eq!(client.read(&alice, "bin.dat").unwrap_err().0, "not_text");
    assert_eq!(client.read(&alice, "big.txt").unwrap_err().0, "too_large");
    assert_eq!(client.read(&alice, "none.txt").unwrap_err().0, "not_found");
}

#[test]
fn patch_move_delete_history_restore() {
    let state = StateRoot::new();
    let dir = state.project("demo", &[("a.txt", "one\ntwo\nthree\n")]);
    let daemon = Workspaced::start(&state);
    let client = daemon.client();
    let alice = ctx("demo", "alice");
    let base = revision("one\ntwo\nthree\n");

    // A hunk whose context does not match changes nothing.
    let bad = "--- a/a.txt\n+++ b/a.txt\n@@ -1,2 +1,2 @@\n one\n-TWO\n+2\n";
    let (code, _) = client
        .json("/v1/patch", json!({"context": alice, "path": "a.txt", "diff": bad, "expected_revision": base, "request_id": "p0"}))
        .unwrap_err();
    assert_eq!(code, "patch_rejected");
    assert_eq!(
        std::fs::read_to_string(dir.join("a.txt")).unwrap(),
        "one\ntwo\nthree\n"
    );

    let good = "--- a/a.txt\n+++ b/a.txt\n@@ -1,2 +1,2 @@\n one\n-two\n+2\n";
    let patched = client
        .json("/v1/patch", json!({"context": alice, "path": "a.txt", "diff": good, "expected_revision": base, "request_id": "p1"}))
        .unwrap();
    assert_eq!(patched["revision"], revision("one\n2\nthree\n"));
    assert_eq!(
        std::fs::read_to_string(dir.join("a.txt")).unwrap(),
        "one\n2\nthree\n"
    );

    let moved = client
        .json("/v1/move", json!({"context": alice, "path": "a.txt", "to_path": "b/a.txt", "expected_revision": revision("one\n2\nthree\n"), "request_id": "m1"}))
        .unwrap();
    assert_eq!(moved["receipt"]["to_path"], "b/a.txt");
    assert!(!dir.join("a.txt").exists());
    assert_eq!(
        std::fs::read_to_string(dir.join("b/a.txt")).unwrap(),
        "one\n2\nthree\n"
    );

    let deleted = client
        .json("/v1/delete", json!({"context": alice, "path": "b/a.txt", "expected_revision": revision("one\n2\nthree\n"), "request_id": "d1"}))
        .unwrap();
    assert_eq!(deleted["revision"], "missing");
    assert!(!dir.join("b/a.txt").exists());

    let history = client
        .json("/v1/history", json!({"context": alice, "path": "b/a.txt"}))
        .unwrap();
    let entries = history["entries"].as_array().unwrap();
    assert_eq!(entries[0]["receipt"]["operation"], "delete");
    assert_eq!(entries[0]["before_content"], "one\n2\nthree\n");
    let delete_receipt = entries[0]["receipt"]["receipt_id"].as_str().unwrap();

    let restored = client
        .json("/v1/restore", json!({"context": alice, "receipt_id": delete_receipt, "expected_revision": "missing", "request_id": "r1"}))
        .unwrap();
    assert_eq!(restored["state"], "applied");
    assert_eq!(
        std::fs::read_to_string(dir.join("b/a.txt")).unwrap(),
        "one\n2\nthree\n"
    );
}

#[test]
fn peers_other_than_root_self_and_allowed_users_are_refused() {
    let _users = users_lock();
    let (uid, gid) = ensure_user("awtest-stranger", &[]);
    let state = StateRoot::new();
    state.project("demo", &[("a.txt", "a")]);
    let daemon = Workspaced::start(&state);
    // Let the stranger open the socket at all: only the peer check may stop it.
    std::fs::set_permissions(
        daemon.socket.parent().unwrap(),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    std::fs::set_permissions(
        &daemon.socket,
        std::os::unix::fs::PermissionsExt::from_mode(0o666),
    )
    .unwrap();
    let out = std::process::Command::new("setpriv")
        .args([
            format!("--reuid={uid}"),
            format!("--regid={gid}"),
            "--clear-groups".into(),
        ])
        .args(["curl", "-s", "--unix-socket"])
        .arg(&daemon.socket)
        .arg("http://_/v1/health")
        .output()
        .unwrap();
    let body = String::from_utf8_lossy(&out.stdout);
    assert!(body.contains("peer_forbidden"), "stranger got: {body}");
    // Root is served.
    assert!(daemon.client().read(&ctx("demo", "alice"), "a.txt").is_ok());
}

#[test]
fn sigterm_stops_cleanly_and_restart_keeps_receipts() {
    let state = StateRoot::new();
    state.project("demo", &[("a.txt", "a")]);
    let mut daemon = Workspaced::start(&state);
    let alice = ctx("demo", "alice");
    daemon
        .client()
        .write(&alice, "a.txt", "b", &revision("a"), "keep-1")
        .unwrap();
    let status = daemon.stop();
    assert!(status.success(), "clean exit on SIGTERM: {status}");
    assert!(
        !state.socket().exists()
            || std::os::unix::net::UnixStream::connect(state.socket()).is_err()
    );
    let daemon = Workspaced::start(&state);
    let receipt = daemon.client().receipt(&alice, "keep-1").unwrap();
    assert_eq!(receipt["state"], "applied");
    assert_eq!(receipt["resulting_revision"], revision("b"));
}

#[test]
fn unconfirmed_receipt_is_uncertain_then_resolved_by_request_id() {
    let state = StateRoot::new();
    let dir = state.project("demo", &[("a.txt", "old")]);
    let alice = ctx("demo", "alice");
    {
        let daemon = Workspaced::start_with(
            &state,
            Options {
                failpoint: Some("mark_applied:fail".into()),
                ..Options::default()
            },
        );
        let (code, details) = daemon
            .client()
            .write(&alice, "a.txt", "new", &revision("old"), "u-1")
            .unwrap_err();
        assert_eq!(code, "uncertain");
        assert_eq!(details["previous_revision"], revision("old"));
        assert_eq!(details["resulting_revision"], revision("new"));
        assert_eq!(details["receipt"]["request_id"], "u-1");
        // The change did happen; only its confirmation failed.
        assert_eq!(std::fs::read_to_string(dir.join("a.txt")).unwrap(), "new");
    }
    // Looking it up by request id reconciles from the disk instead of guessing.
    let daemon = Workspaced::start(&state);
    let receipt = daemon.client().receipt(&alice, "u-1").unwrap();
    assert_eq!(receipt["state"], "applied");
}

#[test]
fn a_request_id_still_in_progress_gets_a_retryable_conflict() {
    let state = StateRoot::new();
    state.set_config("[workspaced]\nlock_timeout_ms = 300\n");
    state.project("demo", &[("a.txt", "old")]);
    let daemon = Workspaced::start_with(
        &state,
        Options {
            failpoint: Some("after_prepare:sleep:2000".into()),
            ..Options::default()
        },
    );
    let alice = ctx("demo", "alice");
    let first = {
        let client = daemon.client();
        let alice = alice.clone();
        std::thread::spawn(move || client.write(&alice, "a.txt", "new", &revision("old"), "same"))
    };
    std::thread::sleep(std::time::Duration::from_millis(400));
    let (code, details) = daemon
        .client()
        .write(&alice, "a.txt", "new", &revision("old"), "same")
        .unwrap_err();
    assert_eq!(code, "request_in_progress");
    assert_eq!(details["retryable"], true);
    // Another id waiting on the same project lock gets `busy`, also retryable.
    let (code, details) = daemon
        .client()
        .write(&alice, "a.txt", "x", &revision("old"), "other")
        .unwrap_err();
    assert_eq!(code, "busy");
    assert_eq!(details["retryable"], true);
    let applied = first.join().unwrap().unwrap();
    assert_eq!(applied["replayed"], false);
    // The retry after it finished gets the recorded outcome.
    let retried = daemon
        .client()
        .write(&alice, "a.txt", "new", &revision("old"), "same")
        .unwrap();
    assert_eq!(retried["replayed"], true);
    assert_eq!(
        retried["receipt"]["receipt_id"],
        applied["receipt"]["receipt_id"]
    );
}

#[test]
fn a_failed_folder_sync_after_the_rename_is_uncertain_not_not_applied() {
    // Regression: an error after the rename used to mark the receipt not_applied although the
    // new content was on disk.
    let state = StateRoot::new();
    let dir = state.project("demo", &[("a.txt", "old")]);
    let alice = ctx("demo", "alice");
    {
        let daemon = Workspaced::start_with(
            &state,
            Options {
                failpoint: Some("after_rename:fail".into()),
                ..Options::default()
            },
        );
        let (code, details) = daemon
            .client()
            .write(&alice, "a.txt", "new", &revision("old"), "s-1")
            .unwrap_err();
        assert_eq!(code, "uncertain");
        assert_eq!(details["receipt"]["state"], "prepared");
        assert_eq!(std::fs::read_to_string(dir.join("a.txt")).unwrap(), "new");
        // Looked up while the daemon still runs, it is reconciled from the disk.
        assert_eq!(
            daemon.client().receipt(&alice, "s-1").unwrap()["state"],
            "applied"
        );
    }
}

#[test]
fn edit_applies_exact_edits_replays_previews_and_refuses_clearly() {
    let state = StateRoot::new();
    let dir = state.project(
        "demo",
        &[("code/a.py", "x = 1\ny = 1\nz = 2\n"), ("secret/k", "k")],
    );
    let daemon = Workspaced::start(&state);
    let client = daemon.client();
    let alice = ctx("demo", "alice");
    let base = revision("x = 1\ny = 1\nz = 2\n");
    let after = "x = 10\ny = 1\nz = 3\n";
    let edits = json!([
        {"old_text": "x = 1\n", "new_text": "x = 10\n"},
        {"old_text": "z = 2", "new_text": "z = 3"},
    ]);
    let body = |edits: &serde_json::Value, expected: &str, id: &str, dry_run: bool| {
        json!({"context": alice, "path": "code/a.py", "edits": edits,
            "expected_revision": expected, "request_id": id, "dry_run": dry_run})
    };

    // A dry run answers the diff and the revision it would produce, and writes nothing.
    let preview = client
        .json("/v1/edit", body(&edits, &base, "e1", true))
        .unwrap();
    assert_eq!(preview["dry_run"], true);
    assert_eq!(preview["revision"], revision(after));
    assert_eq!(preview["previous_revision"], base);
    assert!(
        preview["diff"]
            .as_str()
            .unwrap()
            .contains("-x = 1\n+x = 10\n")
    );
    assert_eq!(
        std::fs::read_to_string(dir.join("code/a.py")).unwrap(),
        "x = 1\ny = 1\nz = 2\n"
    );
    let history = client
        .json(
            "/v1/history",
            json!({"context": alice, "path": "code/a.py"}),
        )
        .unwrap();
    assert!(history["entries"].as_array().unwrap().is_empty());

    // Applied: the change answer plus the diff, with an `edit` receipt.
    let applied = client
        .json("/v1/edit", body(&edits, &base, "e1", false))
        .unwrap();
    assert_eq!(applied["state"], "applied");
    assert_eq!(applied["replayed"], false);
    assert_eq!(applied["revision"], revision(after));
    assert_eq!(applied["receipt"]["operation"], "edit");
    assert_eq!(applied["diff"], preview["diff"]);
    assert_eq!(
        std::fs::read_to_string(dir.join("code/a.py")).unwrap(),
        after
    );

    // Replayed after success: the recorded outcome and the same diff, although the edits no
    // longer match the new content.
    let again = client
        .json("/v1/edit", body(&edits, &base, "e1", false))
        .unwrap();
    assert_eq!(again["replayed"], true);
    assert_eq!(
        again["receipt"]["receipt_id"],
        applied["receipt"]["receipt_id"]
    );
    assert_eq!(again["diff"], applied["diff"]);
    // Same id, other edits: refused.
    let other = json!([{"old_text": "y = 1", "new_text": "y = 2"}]);
    let (code, _) = client
        .json("/v1/edit", body(&other, &base, "e1", false))
        .unwrap_err();
    assert_eq!(code, "request_id_reused");

    // A stale revision is a conflict, in a dry run too.
    for dry_run in [true, false] {
        let (code, details) = client
            .json("/v1/edit", body(&other, &base, "e2", dry_run))
            .unwrap_err();
        assert_eq!(code, "revision_conflict");
        assert_eq!(details["current_revision"], revision(after));
    }

    // Missing and ambiguous matches name the edit (0-based) and the count; nothing changes.
    let current = revision(after);
    let missing =
        json!([{"old_text": "y = 1", "new_text": "y = 2"}, {"old_text": "nope", "new_text": ""}]);
    let (code, details) = client
        .json("/v1/edit", body(&missing, &current, "e3", false))
        .unwrap_err();
    assert_eq!(code, "edit_no_match");
    assert_eq!(
        (details["edit_index"].as_u64(), details["matches"].as_u64()),
        (Some(1), Some(0))
    );
    let ambiguous = json!([{"old_text": " = 1", "new_text": " = 5"}]);
    let (code, details) = client
        .json("/v1/edit", body(&ambiguous, &current, "e4", false))
        .unwrap_err();
    assert_eq!(code, "edit_not_unique");
    assert_eq!(
        (details["edit_index"].as_u64(), details["matches"].as_u64()),
        (Some(0), Some(2))
    );
    assert_eq!(
        std::fs::read_to_string(dir.join("code/a.py")).unwrap(),
        after
    );
    let all = json!([{"old_text": " = 1", "new_text": " = 5", "replace_all": true}]);
    let replaced = client
        .json("/v1/edit", body(&all, &current, "e5", false))
        .unwrap();
    assert_eq!(replaced["revision"], revision("x = 50\ny = 5\nz = 3\n"));

    // Empty old_text and no edits are invalid; the guard and confinement apply as for a write.
    for bad in [json!([]), json!([{"old_text": "", "new_text": "a"}])] {
        let (code, _) = client
            .json("/v1/edit", body(&bad, &current, "e6", false))
            .unwrap_err();
        assert_eq!(code, "invalid_request");
    }
    let guard = Guard {
        write_paths: vec!["code".into()],
        blocked_paths: vec!["secret".into()],
        ..Guard::default()
    };
    let guarded = ctx_with_guard("demo", "alice", guard);
    let (code, details) = client
        .json("/v1/edit", json!({"context": guarded, "path": "secret/k", "edits": [{"old_text": "k", "new_text": "j"}], "expected_revision": revision("k"), "request_id": "e7"}))
        .unwrap_err();
    assert_eq!(
        (code.as_str(), details["reason"].as_str()),
        ("forbidden", Some("blocked"))
    );
    let (code, _) = client
        .json("/v1/edit", json!({"context": alice, "path": "../demo/code/a.py", "edits": [{"old_text": "x", "new_text": "y"}], "expected_revision": revision("x = 50\ny = 5\nz = 3\n"), "request_id": "e8", "dry_run": true}))
        .unwrap_err();
    assert_eq!(code, "path_refused");
    assert_eq!(std::fs::read_to_string(dir.join("secret/k")).unwrap(), "k");
}

#[test]
fn an_edit_replay_of_a_file_over_the_before_content_cap_has_no_diff() {
    let state = StateRoot::new();
    let big = format!("head\n{}", "x\n".repeat(80 * 1024));
    let dir = state.project("demo", &[("big.txt", big.as_str())]);
    let daemon = Workspaced::start(&state);
    let client = daemon.client();
    let alice = ctx("demo", "alice");
    let body = json!({"context": alice, "path": "big.txt", "edits": [{"old_text": "head\n", "new_text": "HEAD\n"}],
        "expected_revision": revision(&big), "request_id": "big1"});
    let applied = client.json("/v1/edit", body.clone()).unwrap();
    assert!(applied["diff"].as_str().unwrap().contains("+HEAD\n"));
    assert!(
        std::fs::read_to_string(dir.join("big.txt"))
            .unwrap()
            .starts_with("HEAD\n")
    );
    let again = client.json("/v1/edit", body).unwrap();
    assert_eq!(again["replayed"], true);
    assert_eq!(again["receipt"]["before_truncated"], true);
    assert!(again["diff"].is_null());
}

#[test]
fn stat_answers_kind_size_revision_and_time_under_the_read_guard() {
    let state = StateRoot::new();
    let dir = state.project("demo", &[("code/a.py", "print(1)\n"), ("secret/k", "k")]);
    std::fs::write(dir.join("code/big.bin"), vec![0xffu8; 3000]).unwrap();
    symlink("/etc/passwd", dir.join("code/link")).unwrap();
    let daemon = Workspaced::start(&state);
    let client = daemon.client();
    let alice = ctx("demo", "alice");
    let stat = |c: &agentworks_contract::workspaced::Context, path: &str| {
        client.json("/v1/stat", json!({"context": c, "path": path}))
    };

    let file = stat(&alice, "code/a.py").unwrap();
    assert_eq!(file["kind"], "file");
    assert_eq!(file["size"], 9);
    assert_eq!(file["revision"], revision("print(1)\n"));
    let mtime = std::fs::metadata(dir.join("code/a.py"))
        .unwrap()
        .modified()
        .unwrap()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64;
    assert_eq!(file["modified_ms"].as_i64(), Some(mtime));
    // Binary content is fine: the revision is of the bytes.
    let binary = stat(&alice, "code/big.bin").unwrap();
    assert_eq!(binary["size"], 3000);
    assert!(binary["revision"].as_str().unwrap().starts_with("sha256:"));
    let folder = stat(&alice, "code").unwrap();
    assert_eq!(folder["kind"], "dir");
    assert!(folder.get("revision").is_none() && folder.get("size").is_none());

    // Refused exactly as a read refuses: missing, symlink, traversal, a hidden path.
    assert_eq!(stat(&alice, "code/none").unwrap_err().0, "not_found");
    assert_eq!(stat(&alice, "nowhere/none").unwrap_err().0, "not_found");
    assert_eq!(client.read(&alice, "code/none").unwrap_err().0, "not_found");
    let (code, details) = stat(&alice, "code/link").unwrap_err();
    assert_eq!(
        (code.as_str(), details["reason"].as_str()),
        ("path_refused", Some("symlink"))
    );
    assert_eq!(
        stat(&alice, "../demo/code/a.py").unwrap_err().0,
        "path_refused"
    );
    assert_eq!(
        stat(&alice, ".agentworks-tmp-x").unwrap_err().0,
        "path_refused"
    );
    let guarded = ctx_with_guard(
        "demo",
        "alice",
        Guard {
            blocked_paths: vec!["secret".into()],
            ..Guard::default()
        },
    );
    let (code, details) = stat(&guarded, "secret/k").unwrap_err();
    assert_eq!(
        (code.as_str(), details["reason"].as_str()),
        ("forbidden", Some("blocked"))
    );
    assert_eq!(
        client.read(&guarded, "secret/k").unwrap_err().0,
        "forbidden"
    );
    // A file with a second hard link is refused, never hashed.
    std::fs::hard_link(dir.join("code/a.py"), dir.join("code/again.py")).unwrap();
    let (code, details) = stat(&alice, "code/a.py").unwrap_err();
    assert_eq!(
        (code.as_str(), details["reason"].as_str()),
        ("path_refused", Some("hard_link"))
    );
}

#[test]
fn list_takes_depth_exclude_and_max_entries_and_old_requests_are_unchanged() {
    let state = StateRoot::new();
    state.project(
        "demo",
        &[
            ("a.txt", "aa"),
            ("src/main.rs", "m"),
            ("src/gen/out.rs", "o"),
            ("web/node_modules/x/y.js", "y"),
            ("web/app.log", "l"),
            ("secret/k", "k"),
        ],
    );
    let daemon = Workspaced::start(&state);
    let client = daemon.client();
    let alice = ctx("demo", "alice");
    let paths = |answer: &serde_json::Value| -> Vec<String> {
        answer["entries"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e["path"].as_str().unwrap().to_owned())
            .collect()
    };

    // Old requests: the same answer as before, every entry with its kind and a file's size.
    let flat = client.json("/v1/list", json!({"context": alice})).unwrap();
    assert_eq!(paths(&flat), ["a.txt", "secret", "src", "web"]);
    assert_eq!(
        flat["entries"][0],
        json!({"path": "a.txt", "kind": "file", "size": 2})
    );
    assert_eq!(flat["entries"][1], json!({"path": "secret", "kind": "dir"}));
    assert_eq!(flat["truncated"], false);
    let all = client
        .json("/v1/list", json!({"context": alice, "recursive": true}))
        .unwrap();
    assert_eq!(paths(&all).len(), 12);

    let two = client
        .json(
            "/v1/list",
            json!({"context": alice, "depth": 2, "exclude": ["secret"]}),
        )
        .unwrap();
    assert_eq!(
        paths(&two),
        [
            "a.txt",
            "src",
            "web",
            "src/gen",
            "src/main.rs",
            "web/app.log",
            "web/node_modules"
        ]
    );
    let excluded = client
        .json(
            "/v1/list",
            json!({"context": alice, "recursive": true,
            "exclude": ["node_modules", "*.log", "src/gen", "secret"]}),
        )
        .unwrap();
    assert_eq!(paths(&excluded), ["a.txt", "src", "web", "src/main.rs"]);
    let bounded = client
        .json(
            "/v1/list",
            json!({"context": alice, "recursive": true, "max_entries": 3}),
        )
        .unwrap();
    assert_eq!(
        (paths(&bounded).len(), &bounded["truncated"]),
        (3, &json!(true))
    );

    // The guard still hides what it hides; exclude only ever hides more.
    let guarded = ctx_with_guard(
        "demo",
        "alice",
        Guard {
            blocked_paths: vec!["secret".into()],
            ..Guard::default()
        },
    );
    let hidden = client
        .json("/v1/list", json!({"context": guarded, "depth": 3}))
        .unwrap();
    assert!(paths(&hidden).iter().all(|p| !p.starts_with("secret")));
    for bad in [
        json!({"depth": 0}),
        json!({"exclude": ["../x"]}),
        json!({"exclude": "x"}),
    ] {
        let mut body = bad.clone();
        body["context"] = serde_json::to_value(&alice).unwrap();
        let (code, _) = client.json("/v1/list", body).unwrap_err();
        assert_eq!(code, "invalid_request", "{bad}");
    }
}

#[test]
fn read_takes_a_line_range_and_always_counts_the_lines() {
    let state = StateRoot::new();
    let text = "l1\nl2\nl3\nl4\nl5\n";
    state.project("demo", &[("a.txt", text), ("secret/k", "k")]);
    let daemon = Workspaced::start(&state);
    let client = daemon.client();
    let alice = ctx("demo", "alice");

    // An old request: the whole file, now with its line count, and no range echoed.
    let whole = client.read(&alice, "a.txt").unwrap();
    assert_eq!(whole["content"], text);
    assert_eq!(whole["total_lines"], 5);
    assert!(whole.get("offset").is_none() && whole.get("limit").is_none());

    let ranged = client
        .json(
            "/v1/read",
            json!({"context": alice, "path": "a.txt", "offset": 1, "limit": 2}),
        )
        .unwrap();
    assert_eq!(ranged["content"], "l2\nl3\n");
    assert_eq!(
        (&ranged["offset"], &ranged["limit"]),
        (&json!(1), &json!(2))
    );
    assert_eq!(ranged["total_lines"], 5);
    assert_eq!(ranged["revision"], revision(text));
    assert_eq!(ranged["size"], text.len());
    // A search hit on line 4 (numbered from 1) is offset 3.
    let hit = client
        .json("/v1/search", json!({"context": alice, "query": "l4"}))
        .unwrap();
    let line = hit["matches"][0]["line"].as_u64().unwrap();
    let at = client
        .json(
            "/v1/read",
            json!({"context": alice, "path": "a.txt", "offset": line - 1, "limit": 1}),
        )
        .unwrap();
    assert_eq!(at["content"], "l4\n");

    let (code, _) = client
        .json(
            "/v1/read",
            json!({"context": alice, "path": "a.txt", "limit": 0}),
        )
        .unwrap_err();
    assert_eq!(code, "invalid_request");
    let guarded = ctx_with_guard(
        "demo",
        "alice",
        Guard {
            blocked_paths: vec!["secret".into()],
            ..Guard::default()
        },
    );
    let (code, _) = client
        .json(
            "/v1/read",
            json!({"context": guarded, "path": "secret/k", "offset": 0, "limit": 1}),
        )
        .unwrap_err();
    assert_eq!(code, "forbidden");
}

/// Attacks on `/v1/edit` that cost workspaced its memory or its CPU: a short `old_text`
/// replaced everywhere by a long `new_text` (64 KiB × 1 MiB = 64 GiB asked for: the old code
/// built it, and the allocation failure aborts the daemon), and an edit of a large file whose
/// every line changes (a minimal diff of it takes hours). Both are answered, and workspaced
/// keeps serving.
#[test]
fn edits_that_would_exhaust_memory_or_cpu_are_answered_and_workspaced_stays_up() {
    let state = StateRoot::new();
    let small = "a".repeat(64 * 1024);
    let lines: String = (0..200_000).map(|i| format!("{i}\n")).collect();
    let dir = state.project(
        "demo",
        &[("grow.txt", small.as_str()), ("lines.txt", lines.as_str())],
    );
    let daemon = Workspaced::start(&state);
    let client = daemon.client();
    let alice = ctx("demo", "alice");

    let grow = json!({"context": alice, "path": "grow.txt", "request_id": "g1",
        "expected_revision": revision(&small),
        "edits": [{"old_text": "a", "new_text": "b".repeat(1024 * 1024), "replace_all": true}]});
    let (code, details) = client.json("/v1/edit", grow).unwrap_err();
    assert_eq!(code, "too_large", "{details}");
    assert_eq!(
        std::fs::read_to_string(dir.join("grow.txt")).unwrap(),
        small
    );

    let every_line = json!({"context": alice, "path": "lines.txt", "request_id": "l1",
        "expected_revision": revision(&lines), "dry_run": true,
        "edits": [{"old_text": "\n", "new_text": "x\n", "replace_all": true}]});
    let preview = client.json("/v1/edit", every_line).unwrap();
    let diff = preview["diff"].as_str().unwrap();
    assert_eq!(diff.lines().filter(|l| l.starts_with('+')).count(), 200_001);

    // Still serving.
    assert_eq!(
        client.read(&alice, "grow.txt").unwrap()["content"],
        small.as_str()
    );
}
