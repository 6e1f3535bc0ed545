//! `/v1/patch_set` through a real workspaced: a multi-file diff (create, modify, delete) under
//! one request id, validated whole before any file changes, one receipt per file, replay and
//! reuse, the guard and confinement, and a real SIGKILL between two files, after which the
//! receipt lookup reports each file from what the disk holds.

use super::harness::*;
use agentworks_contract::workspaced::Context;
use serde_json::{Value, json};
use std::os::unix::fs::symlink;
use std::os::unix::process::ExitStatusExt;
use std::path::Path;

fn patch_set(
    client: &Client,
    ctx: &Context,
    diff: &str,
    expected: Value,
    request_id: &str,
) -> Result<Value, (String, Value)> {
    client.json(
        "/v1/patch_set",
        json!({"context": ctx, "diff": diff, "request_id": request_id,
            "expected_revisions": expected}),
    )
}

fn read(dir: &Path, path: &str) -> Option<String> {
    std::fs::read_to_string(dir.join(path)).ok()
}

fn states(files: &Value) -> Vec<&str> {
    files
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["state"].as_str().unwrap())
        .collect()
}

const MODIFIED: &str = "keep\nold line\nend\n";
const GONE: &str = "bye\nfor now\n";

/// Creates `new/dir/n.txt` (in folders that do not exist), modifies `m.txt`, deletes `gone.txt`.
const THREE_WAY: &str = "diff --git a/new/dir/n.txt b/new/dir/n.txt
new file mode 100644
--- /dev/null
+++ b/new/dir/n.txt
@@ -0,0 +1,2 @@
+hello
+world
diff --git a/m.txt b/m.txt
--- a/m.txt
+++ b/m.txt
@@ -1,3 +1,3 @@
 keep
-old line
+new line
 end
diff --git a/gone.txt b/gone.txt
deleted file mode 100644
--- a/gone.txt
+++ /dev/null
@@ -1,2 +0,0 @@
-bye
-for now
";

#[test]
fn create_modify_and_delete_in_one_request_replay_and_refuse_reuse() {
    let state = StateRoot::new();
    let dir = state.project("demo", &[("m.txt", MODIFIED), ("gone.txt", GONE)]);
    let daemon = Workspaced::start(&state);
    let client = daemon.client();
    let alice = ctx("demo", "alice");
    let expected = json!({"m.txt": revision(MODIFIED)});

    let done = patch_set(&client, &alice, THREE_WAY, expected.clone(), "set-1").unwrap();
    assert_eq!(
        (&done["state"], &done["replayed"]),
        (&json!("applied"), &json!(false))
    );
    let files = done["files"].as_array().unwrap();
    let summary: Vec<_> = files
        .iter()
        .map(|f| {
            (
                f["path"].as_str().unwrap(),
                f["action"].as_str().unwrap(),
                f["added_lines"].as_u64().unwrap(),
                f["removed_lines"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        summary,
        [
            ("new/dir/n.txt", "created", 2, 0),
            ("m.txt", "modified", 1, 1),
            ("gone.txt", "deleted", 0, 2)
        ]
    );
    assert_eq!(states(&done["files"]), ["applied"; 3]);
    let new_modified = "keep\nnew line\nend\n";
    assert_eq!(files[0]["revision"], revision("hello\nworld\n"));
    assert_eq!(files[1]["previous_revision"], revision(MODIFIED));
    assert_eq!(files[1]["revision"], revision(new_modified));
    assert_eq!(files[2]["revision"], Value::Null, "a deleted file has none");
    assert_eq!(
        read(&dir, "new/dir/n.txt").as_deref(),
        Some("hello\nworld\n")
    );
    assert_eq!(read(&dir, "m.txt").as_deref(), Some(new_modified));
    assert_eq!(read(&dir, "gone.txt"), None);

    // The receipt lookup: the first file's receipt with the set's state, and every file's.
    let receipt = client.receipt(&alice, "set-1").unwrap();
    assert_eq!(
        (&receipt["state"], &receipt["operation"]),
        (&json!("applied"), &json!("patch_set"))
    );
    let parts: Vec<_> = receipt["files"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r["path"].as_str().unwrap(),
                r["state"].as_str().unwrap(),
                r["part"]["index"].as_u64().unwrap(),
                r["part"]["count"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        parts,
        [
            ("new/dir/n.txt", "applied", 0, 3),
            ("m.txt", "applied", 1, 3),
            ("gone.txt", "applied", 2, 3)
        ]
    );
    let receipt_ids: Vec<_> = files
        .iter()
        .map(|f| f["receipt"]["receipt_id"].clone())
        .collect();

    // The same request again: the recorded outcome, nothing applied twice (m.txt would not
    // even match any more).
    let again = patch_set(&client, &alice, THREE_WAY, expected.clone(), "set-1").unwrap();
    assert_eq!(
        (&again["state"], &again["replayed"]),
        (&json!("applied"), &json!(true))
    );
    let again_ids: Vec<_> = again["files"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["receipt"]["receipt_id"].clone())
        .collect();
    assert_eq!(again_ids, receipt_ids);
    assert_eq!(read(&dir, "m.txt").as_deref(), Some(new_modified));

    // The same id with another payload, or for a single-file change: refused.
    let other = THREE_WAY.replace("+world", "+there");
    let (code, _) = patch_set(&client, &alice, &other, expected.clone(), "set-1").unwrap_err();
    assert_eq!(code, "request_id_reused");
    let other_revisions = json!({"m.txt": revision("other\n")});
    let (code, _) = patch_set(&client, &alice, THREE_WAY, other_revisions, "set-1").unwrap_err();
    assert_eq!(
        code, "request_id_reused",
        "expected_revisions is payload too"
    );
    let (code, _) = client
        .write(&alice, "x.txt", "x", "missing", "set-1")
        .unwrap_err();
    assert_eq!(code, "request_id_reused");
    // A single-file id under a patch set: refused as well.
    client
        .write(&alice, "w.txt", "w", "missing", "single")
        .unwrap();
    let (code, _) = patch_set(&client, &alice, THREE_WAY, expected, "single").unwrap_err();
    assert_eq!(code, "request_id_reused");
    // The single-file receipt keeps its old shape: no `files`, no `part`.
    let single = client.receipt(&alice, "single").unwrap();
    assert_eq!(single["state"], "applied");
    assert!(
        single.get("files").is_none() && single.get("part").is_none(),
        "{single}"
    );

    // History lists each file's receipt; the deleted file's can be restored like any other.
    let history = client
        .json("/v1/history", json!({"context": alice, "path": "gone.txt"}))
        .unwrap();
    let entry = &history["entries"][0];
    assert_eq!(entry["before_content"], GONE);
    let restored = client
        .json(
            "/v1/restore",
            json!({"context": alice, "receipt_id": entry["receipt"]["receipt_id"],
                "expected_revision": "missing", "request_id": "restore-gone"}),
        )
        .unwrap();
    assert_eq!(restored["state"], "applied");
    assert_eq!(read(&dir, "gone.txt").as_deref(), Some(GONE));
}

#[test]
fn a_failing_hunk_in_the_third_file_leaves_every_file_untouched() {
    let state = StateRoot::new();
    let dir = state.project("demo", &[("b.txt", "b1\nb2\n"), ("c.txt", "c1\nc2\n")]);
    let daemon = Workspaced::start(&state);
    let client = daemon.client();
    let alice = ctx("demo", "alice");
    let diff = "--- /dev/null
+++ b/fresh/a.txt
@@ -0,0 +1 @@
+a
--- a/b.txt
+++ b/b.txt
@@ -1,2 +1,2 @@
-b1
+B1
 b2
--- a/c.txt
+++ b/c.txt
@@ -1,2 +1,2 @@
 c1
-not what c.txt holds
+C2
";
    let expected = json!({"b.txt": revision("b1\nb2\n"), "c.txt": revision("c1\nc2\n")});
    let (code, details) = patch_set(&client, &alice, diff, expected, "bad-hunk").unwrap_err();
    assert_eq!(code, "patch_rejected", "{details}");
    assert_eq!(
        (&details["path"], &details["file_index"]),
        (&json!("c.txt"), &json!(2)),
        "{details}"
    );
    let message = details["message"].as_str().unwrap();
    assert!(
        message.contains("file 3") && message.contains("c.txt") && message.contains("hunk 1"),
        "{message}"
    );
    assert_eq!(read(&dir, "b.txt").as_deref(), Some("b1\nb2\n"));
    assert_eq!(read(&dir, "c.txt").as_deref(), Some("c1\nc2\n"));
    assert!(
        !dir.join("fresh").exists(),
        "not even the new file's folder is made"
    );
    assert_eq!(all_files(&dir).len(), 2, "{:?}", all_files(&dir));
    // Nothing was recorded: the id is still free, and the corrected set applies under it.
    let (code, _) = client.receipt(&alice, "bad-hunk").unwrap_err();
    assert_eq!(code, "not_found");
    let fixed = diff.replace("-not what c.txt holds", "-c2");
    let expected = json!({"b.txt": revision("b1\nb2\n"), "c.txt": revision("c1\nc2\n")});
    let done = patch_set(&client, &alice, &fixed, expected, "bad-hunk").unwrap();
    assert_eq!(states(&done["files"]), ["applied"; 3]);
    assert_eq!(read(&dir, "fresh/a.txt").as_deref(), Some("a\n"));
    assert_eq!(read(&dir, "c.txt").as_deref(), Some("c1\nC2\n"));
}

#[test]
fn protected_traversal_symlinks_and_the_revision_rule_are_refused_before_any_change() {
    let state = StateRoot::new();
    let outside = tempfile::tempdir().unwrap();
    let dir = state.project(
        "demo",
        &[
            ("m.txt", "m\n"),
            ("workflow.json", "{}\n"),
            ("keep.txt", "k\n"),
        ],
    );
    symlink(outside.path(), dir.join("linkdir")).unwrap();
    // A file with a second name: that name could be any file, so it is never read or changed.
    std::fs::write(dir.join("linked.txt"), "m\n").unwrap();
    std::fs::hard_link(dir.join("linked.txt"), dir.join("hl.txt")).unwrap();
    let daemon = Workspaced::start(&state);
    let client = daemon.client();
    let alice = ctx("demo", "alice");
    // Every case starts with a valid creation of ok.txt: it must never appear.
    let create_ok = "--- /dev/null\n+++ b/ok.txt\n@@ -0,0 +1 @@\n+ok\n";
    let modify = |path: &str, old: &str| {
        format!("--- a/{path}\n+++ b/{path}\n@@ -1 +1 @@\n-{old}\n+changed\n")
    };
    let create = |path: &str| format!("--- /dev/null\n+++ b/{path}\n@@ -0,0 +1 @@\n+x\n");
    let m_rev = revision("m\n");
    let cases: Vec<(&str, String, Value, &str, Option<&str>)> = vec![
        (
            "protected",
            modify("workflow.json", "{}"),
            json!({"workflow.json": revision("{}\n")}),
            "forbidden",
            Some("workflow.json"),
        ),
        (
            "traversal",
            create("../escape.txt"),
            json!({}),
            "path_refused",
            Some("../escape.txt"),
        ),
        (
            "symlinked folder",
            create("linkdir/x.txt"),
            json!({}),
            "path_refused",
            Some("linkdir/x.txt"),
        ),
        (
            "absolute",
            create("/etc/agentworks-pwned"),
            json!({}),
            "path_refused",
            None,
        ),
        (
            "hard link",
            modify("hl.txt", "m"),
            json!({"hl.txt": m_rev}),
            "path_refused",
            Some("hl.txt"),
        ),
        (
            "modify without a revision",
            modify("m.txt", "m"),
            json!({}),
            "invalid_request",
            Some("m.txt"),
        ),
        (
            "stale revision",
            modify("m.txt", "m"),
            json!({"m.txt": revision("something else\n")}),
            "revision_conflict",
            Some("m.txt"),
        ),
        (
            "create over an existing file",
            create("keep.txt"),
            json!({}),
            "revision_conflict",
            Some("keep.txt"),
        ),
        (
            "modify a missing file",
            modify("absent.txt", "m"),
            json!({"absent.txt": m_rev}),
            "not_found",
            Some("absent.txt"),
        ),
        (
            "rename",
            "--- a/m.txt\n+++ b/n.txt\n@@ -1 +1 @@\n-m\n+n\n".to_owned(),
            json!({}),
            "patch_rejected",
            None,
        ),
        (
            "a deletion that keeps lines",
            "--- a/keep.txt\n+++ /dev/null\n@@ -1 +1 @@\n-k\n+still here\n".to_owned(),
            json!({}),
            "patch_rejected",
            Some("keep.txt"),
        ),
        (
            "an expected revision for a file not in the diff",
            create("new.txt"),
            json!({"other.txt": m_rev}),
            "invalid_request",
            None,
        ),
        (
            "the same file twice",
            format!("{}{}", modify("m.txt", "m"), modify("m.txt", "m")),
            json!({"m.txt": m_rev}),
            "patch_rejected",
            None,
        ),
    ];
    for (i, (what, tail, expected, want_code, want_path)) in cases.into_iter().enumerate() {
        let diff = format!("{create_ok}{tail}");
        let (code, details) =
            patch_set(&client, &alice, &diff, expected, &format!("refused-{i}")).unwrap_err();
        assert_eq!(code, want_code, "{what}: {details}");
        if let Some(path) = want_path {
            assert_eq!(
                (&details["path"], &details["file_index"]),
                (&json!(path), &json!(1)),
                "{what}: {details}"
            );
        }
        assert!(!dir.join("ok.txt").exists(), "{what}: ok.txt was created");
        assert_eq!(read(&dir, "m.txt").as_deref(), Some("m\n"), "{what}");
        assert_eq!(read(&dir, "keep.txt").as_deref(), Some("k\n"), "{what}");
        assert_eq!(
            read(&dir, "workflow.json").as_deref(),
            Some("{}\n"),
            "{what}"
        );
        let (code, _) = client.receipt(&alice, &format!("refused-{i}")).unwrap_err();
        assert_eq!(code, "not_found", "{what}: nothing recorded");
    }
    assert_eq!(std::fs::read_dir(outside.path()).unwrap().count(), 0);
    assert!(!dir.parent().unwrap().join("escape.txt").exists());
}

/// The two files a crash test starts with, and the diff that modifies the first, deletes the
/// second and creates a third.
const ONE: &str = "one\n";
const TWO: &str = "two\n";
const CRASH_DIFF: &str = "--- a/one.txt
+++ b/one.txt
@@ -1 +1 @@
-one
+ONE
--- a/two.txt
+++ /dev/null
@@ -1 +0,0 @@
-two
--- /dev/null
+++ b/three.txt
@@ -0,0 +1 @@
+three
";

#[test]
fn a_patch_set_killed_between_two_files_reports_each_file_from_the_disk() {
    // The first is killed after file 1's rename and folder fsync, its receipt still prepared;
    // the second after file 1's receipt was marked applied.
    for step in ["patch_set_renamed_1", "patch_set_applied_1"] {
        let state = StateRoot::new();
        let dir = state.project("p", &[("one.txt", ONE), ("two.txt", TWO)]);
        let alice = ctx("p", "alice");
        let expected = json!({"one.txt": revision(ONE), "two.txt": revision(TWO)});
        let mut daemon = Workspaced::start_with(
            &state,
            Options {
                failpoint: Some(step.into()),
                ..Options::default()
            },
        );
        let reply = daemon.client().post::<_, Value>(
            "/v1/patch_set",
            &json!({"context": alice, "diff": CRASH_DIFF, "request_id": "crash",
                "expected_revisions": expected}),
        );
        assert!(reply.is_err(), "{step}: {reply:?}");
        assert_eq!(daemon.child.wait().unwrap().signal(), Some(9), "{step}");
        drop(daemon);
        // What the disk holds at the crash: file 1 changed, files 2 and 3 not.
        assert_eq!(read(&dir, "one.txt").as_deref(), Some("ONE\n"), "{step}");
        assert_eq!(read(&dir, "two.txt").as_deref(), Some(TWO), "{step}");
        assert_eq!(read(&dir, "three.txt"), None, "{step}");

        let daemon = Workspaced::start(&state);
        let client = daemon.client();
        let receipt = client.receipt(&alice, "crash").unwrap();
        assert_eq!(
            receipt["state"], "uncertain",
            "{step}: the set is partly applied"
        );
        let files: Vec<_> = receipt["files"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| (r["path"].as_str().unwrap(), r["state"].as_str().unwrap()))
            .collect();
        assert_eq!(
            files,
            [
                ("one.txt", "applied"),
                ("two.txt", "not_applied"),
                ("three.txt", "not_applied")
            ],
            "{step}"
        );
        assert!(
            all_files(&state.documents())
                .iter()
                .all(|f| !f.contains(".agentworks-tmp-")),
            "{step}: staged files swept"
        );

        // A retry with the same id answers the recorded states and finishes nothing.
        let again = patch_set(&client, &alice, CRASH_DIFF, expected.clone(), "crash").unwrap();
        assert_eq!(
            (&again["state"], &again["replayed"]),
            (&json!("uncertain"), &json!(true)),
            "{step}"
        );
        assert_eq!(
            states(&again["files"]),
            ["applied", "not_applied", "not_applied"],
            "{step}"
        );
        assert_eq!(read(&dir, "two.txt").as_deref(), Some(TWO), "{step}");
        assert_eq!(read(&dir, "three.txt"), None, "{step}");

        // The rest, as a new request: applies.
        let rest = "--- a/two.txt\n+++ /dev/null\n@@ -1 +0,0 @@\n-two\n--- /dev/null\n+++ b/three.txt\n@@ -0,0 +1 @@\n+three\n";
        let done = patch_set(&client, &alice, rest, json!({}), "crash-rest").unwrap();
        assert_eq!(done["state"], "applied", "{step}: {done}");
        assert_eq!(read(&dir, "two.txt"), None, "{step}");
        assert_eq!(
            read(&dir, "three.txt").as_deref(),
            Some("three\n"),
            "{step}"
        );
    }
}

#[test]
fn a_patch_set_killed_after_preparing_is_not_applied_anywhere() {
    let state = StateRoot::new();
    let dir = state.project("p", &[("one.txt", ONE), ("two.txt", TWO)]);
    let alice = ctx("p", "alice");
    let expected = json!({"one.txt": revision(ONE)});
    let mut daemon = Workspaced::start_with(
        &state,
        Options {
            failpoint: Some("after_prepare".into()),
            ..Options::default()
        },
    );
    let reply = daemon.client().post::<_, Value>(
        "/v1/patch_set",
        &json!({"context": alice, "diff": CRASH_DIFF, "request_id": "early",
            "expected_revisions": expected}),
    );
    assert!(reply.is_err(), "{reply:?}");
    assert_eq!(daemon.child.wait().unwrap().signal(), Some(9));
    drop(daemon);
    let daemon = Workspaced::start(&state);
    let receipt = daemon.client().receipt(&alice, "early").unwrap();
    assert_eq!(receipt["state"], "not_applied", "{receipt}");
    assert_eq!(states(&receipt["files"]), ["not_applied"; 3]);
    assert_eq!(read(&dir, "one.txt").as_deref(), Some(ONE));
    assert_eq!(read(&dir, "two.txt").as_deref(), Some(TWO));
    assert_eq!(read(&dir, "three.txt"), None);
}

#[test]
fn a_set_at_the_file_bound_applies_and_one_file_more_is_refused() {
    const MAX_FILES: usize = 64;
    let state = StateRoot::new();
    let dir = state.project("demo", &[]);
    let daemon = Workspaced::start(&state);
    let client = daemon.client();
    let alice = ctx("demo", "alice");
    let create = |i: usize| format!("--- /dev/null\n+++ b/many/f{i}.txt\n@@ -0,0 +1 @@\n+{i}\n");
    let over: String = (0..=MAX_FILES).map(create).collect();
    let (code, details) = patch_set(&client, &alice, &over, json!({}), "over").unwrap_err();
    assert_eq!(code, "patch_rejected", "{details}");
    assert!(!dir.join("many").exists());

    let at: String = (0..MAX_FILES).map(create).collect();
    let started = std::time::Instant::now();
    let done = patch_set(&client, &alice, &at, json!({}), "at").unwrap();
    eprintln!(
        "a patch set of {MAX_FILES} new files applied in {:?}",
        started.elapsed()
    );
    assert_eq!(states(&done["files"]), ["applied"; MAX_FILES]);
    assert_eq!(all_files(&dir.join("many")).len(), MAX_FILES);
    assert_eq!(read(&dir, "many/f63.txt").as_deref(), Some("63\n"));
    let receipt = client.receipt(&alice, "at").unwrap();
    assert_eq!(receipt["files"].as_array().unwrap().len(), MAX_FILES);
}

/// The receipts table as the first workspaced created it (unique on user and request id).
const FIRST_LAYOUT: &str = "
CREATE TABLE receipts (
    receipt_id TEXT PRIMARY KEY, request_id TEXT NOT NULL, operation TEXT NOT NULL,
    project TEXT NOT NULL, path TEXT NOT NULL, to_path TEXT, user_id TEXT NOT NULL,
    user_name TEXT NOT NULL, connection_id TEXT, source TEXT NOT NULL,
    previous_revision TEXT NOT NULL, resulting_revision TEXT NOT NULL, state TEXT NOT NULL,
    created_at_ms INTEGER NOT NULL, updated_at_ms INTEGER NOT NULL, payload_hash TEXT NOT NULL,
    before_content BLOB, before_truncated INTEGER NOT NULL,
    UNIQUE (user_id, request_id)
);
CREATE INDEX receipts_by_path ON receipts (path, created_at_ms);
CREATE INDEX receipts_by_state ON receipts (state);
";

#[test]
fn a_receipt_store_in_the_first_layout_is_migrated_at_start_and_keeps_every_receipt() {
    use std::os::unix::fs::PermissionsExt;
    let state = StateRoot::new();
    let dir = state.project("demo", &[("a.txt", "after\n")]);
    let root = state.documents().canonicalize().unwrap().join("demo");
    let receipts = state
        .root()
        .join("files/receipts")
        .join(agentworks_daemon::layout::root_key(&root));
    std::fs::create_dir_all(&receipts).unwrap();
    for d in [
        state.root().join("files"),
        state.root().join("files/receipts"),
        receipts.clone(),
    ] {
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o700)).unwrap();
    }
    {
        let conn = rusqlite::Connection::open(receipts.join("receipts.db")).unwrap();
        conn.query_row("PRAGMA journal_mode=WAL", [], |r| r.get::<_, String>(0))
            .unwrap();
        conn.execute_batch(FIRST_LAYOUT).unwrap();
        let insert = |id: &str, request: &str, state: &str, before: &str| {
            conn.execute(
                "INSERT INTO receipts VALUES (?1, ?2, 'write', 'demo', 'a.txt', NULL, 'id-alice', \
                 'alice', 'conn-test', 'test', ?3, ?4, ?5, 1000, 1000, 'h', ?6, 0)",
                rusqlite::params![
                    id,
                    request,
                    revision(before),
                    revision("after\n"),
                    state,
                    before.as_bytes()
                ],
            )
            .unwrap();
        };
        insert("rcpt_old", "old-req", "applied", "before\n");
        // Left prepared by a crash of the old daemon; the disk holds its result.
        insert("rcpt_open", "open-req", "prepared", "between\n");
    }
    let daemon = Workspaced::start(&state);
    let client = daemon.client();
    let alice = ctx("demo", "alice");
    let old = client.receipt(&alice, "old-req").unwrap();
    assert_eq!(
        (&old["receipt_id"], &old["state"], &old["operation"]),
        (&json!("rcpt_old"), &json!("applied"), &json!("write"))
    );
    assert!(old.get("files").is_none(), "{old}");
    let open = client.receipt(&alice, "open-req").unwrap();
    assert_eq!(open["state"], "applied", "reconciled from the disk: {open}");
    let history = client
        .json("/v1/history", json!({"context": alice, "path": "a.txt"}))
        .unwrap();
    let entries = history["entries"].as_array().unwrap();
    assert_eq!(entries.len(), 2);
    assert_eq!(entries[1]["before_content"], "before\n");
    // The old ids stay taken; a patch set now lives beside them.
    let (code, _) = client
        .write(&alice, "a.txt", "x", &revision("after\n"), "old-req")
        .unwrap_err();
    assert_eq!(code, "request_id_reused");
    let diff = "--- a/a.txt\n+++ b/a.txt\n@@ -1 +1 @@\n-after\n+later\n--- /dev/null\n+++ b/b.txt\n@@ -0,0 +1 @@\n+b\n";
    let done = patch_set(
        &client,
        &alice,
        diff,
        json!({"a.txt": revision("after\n")}),
        "set",
    )
    .unwrap();
    assert_eq!(states(&done["files"]), ["applied", "applied"]);
    assert_eq!(read(&dir, "a.txt").as_deref(), Some("later\n"));
}

#[test]
fn a_file_failing_part_way_stops_the_set_and_says_which_files_changed() {
    let state = StateRoot::new();
    let dir = state.project("p", &[("one.txt", ONE), ("two.txt", TWO)]);
    let alice = ctx("p", "alice");
    let expected = json!({"one.txt": revision(ONE)});
    let daemon = Workspaced::start_with(
        &state,
        Options {
            failpoint: Some("patch_set_before_2:fail".into()),
            ..Options::default()
        },
    );
    let client = daemon.client();
    let (code, details) =
        patch_set(&client, &alice, CRASH_DIFF, expected.clone(), "part").unwrap_err();
    assert_eq!(code, "partially_applied", "{details}");
    assert_eq!(
        (&details["path"], &details["file_index"]),
        (&json!("two.txt"), &json!(1)),
        "{details}"
    );
    assert_eq!(
        states(&details["files"]),
        ["applied", "not_applied", "not_applied"],
        "{details}"
    );
    assert_eq!(read(&dir, "one.txt").as_deref(), Some("ONE\n"));
    assert_eq!(read(&dir, "two.txt").as_deref(), Some(TWO));
    assert_eq!(read(&dir, "three.txt"), None);
    let receipt = client.receipt(&alice, "part").unwrap();
    assert_eq!(receipt["state"], "uncertain", "{receipt}");
    assert_eq!(
        states(&receipt["files"]),
        ["applied", "not_applied", "not_applied"]
    );
    // The same request again answers the recorded states; it does not finish the set.
    let again = patch_set(&client, &alice, CRASH_DIFF, expected, "part").unwrap();
    assert_eq!(again["replayed"], true);
    assert_eq!(read(&dir, "two.txt").as_deref(), Some(TWO));
}
