//! agentd's file tools (edit_file, move_file, delete_file, read_file ranges, read_files,
//! list_files bounds, get_file_info) end to end: the official Python SDK
//! (`tests/mcp_client/tools.py`) against the real agentd and workspaced, then the disk and
//! workspaced's receipts checked from here. One client run holds every check (success,
//! conflict, replay, reuse, forbidden, protected, traversal), so the suite stays fast; the
//! script says which step failed.

use super::harness::*;
use serde_json::json;

/// The workflow the script expects, laid out on disk; plus a folder beside the documents that
/// two symlinks inside the workflow point to.
fn lay_out(stack: &Stack) -> std::path::PathBuf {
    let demo = stack.state.documents().join("demo");
    let outside = stack.state.root().join("outside");
    std::fs::create_dir_all(&outside).unwrap();
    std::fs::write(outside.join("secret.txt"), "outside\n").unwrap();
    for (path, content) in [
        ("notes.md", "one\ntwo\nthree\n"),
        ("dup.md", "x x\n"),
        ("workflow.json", "{}"),
        ("old.md", "move me\n"),
        ("gone.md", "delete me\n"),
        ("src/a.rs", "fn a() {}\n"),
        ("src/gen/b.rs", "fn b() {}\n"),
        ("node_modules/m.js", "m\n"),
        ("build.log", "log\n"),
        ("p1.md", "alpha\nbeta\n"),
        ("p2.md", "drop\n"),
    ] {
        let file = demo.join(path);
        std::fs::create_dir_all(file.parent().unwrap()).unwrap();
        std::fs::write(file, content).unwrap();
    }
    std::os::unix::fs::symlink(&outside, demo.join("link")).unwrap();
    std::os::unix::fs::symlink(outside.join("secret.txt"), demo.join("linkfile.md")).unwrap();
    outside
}

#[test]
fn the_file_tools_through_the_python_sdk_against_the_real_stack() {
    let stack = Stack::start();
    let (wf, write_token) = stack.user_with_project("alice", "demo", &["workflows:write"]);
    let read_token = stack.token("alice", &["workflows:read"], json!({}));
    stack.admin("users/add", json!({"name": "rita"}));
    stack.admin(
        "members/add",
        json!({"project": "demo", "user": "rita", "role": "runner"}),
    );
    let runner_token = stack.token("rita", &["workflows:write"], json!({}));
    let outside = lay_out(&stack);

    let started = std::time::Instant::now();
    let summary = run_mcp_client(
        "tools.py",
        &stack.mcp_url(),
        &[],
        &[
            ("AW_WRITE_TOKEN", &write_token),
            ("AW_READ_TOKEN", &read_token),
            ("AW_RUNNER_TOKEN", &runner_token),
            ("AW_WORKFLOW", &wf),
        ],
    );
    eprintln!("tools.py ran in {:?}", started.elapsed());
    assert_eq!(summary["ok"], true, "{summary}");

    let demo = stack.state.documents().join("demo");
    let read = |path: &str| std::fs::read_to_string(demo.join(path)).ok();
    // The one applied edit, and replace_all on dup.md; the dry runs wrote nothing.
    assert_eq!(read("notes.md").as_deref(), Some("one\nTWO\nthree\n"));
    assert_eq!(
        summary["notes_revision"],
        revision("one\nTWO\nthree\n"),
        "{summary}"
    );
    assert_eq!(read("dup.md").as_deref(), Some("y y\n"));
    // Moved once, deleted once; the protected file and everything outside untouched.
    assert_eq!(read("old.md"), None);
    assert_eq!(read("moved/new.md").as_deref(), Some("move me\n"));
    assert_eq!(read("elsewhere.md"), None);
    // The one applied patch set: modified, created, deleted; the refused ones wrote nothing.
    assert_eq!(read("p1.md").as_deref(), Some("alpha\nBETA\n"));
    assert_eq!(read("patched/new.md").as_deref(), Some("new\n"));
    assert_eq!(
        (read("p2.md"), read("never.md"), read("x.md")),
        (None, None, None)
    );
    assert!(!stack.state.documents().join("escape.md").exists());
    assert!(!std::path::Path::new("/tmp/escape.md").exists());
    assert_eq!(read("back.md"), None);
    assert_eq!(read("gone.md"), None);
    assert_eq!(read("workflow.json").as_deref(), Some("{}"));
    assert_eq!(read("w.json"), None);
    assert_eq!(read("sub/product.json"), None);
    assert_eq!(read("stolen.md"), None);
    assert_eq!(
        std::fs::read_to_string(outside.join("secret.txt")).unwrap(),
        "outside\n"
    );
    let mut beside: Vec<_> = std::fs::read_dir(&outside)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    beside.sort();
    assert_eq!(
        beside,
        ["secret.txt"],
        "nothing was written through the link"
    );
    assert!(!stack.state.documents().join("escape.md").exists());
    assert!(
        std::fs::symlink_metadata(demo.join("linkfile.md"))
            .unwrap()
            .file_type()
            .is_symlink()
    );

    // The receipts: one per applied change; replays and dry runs recorded nothing more.
    let history = |path: &str| {
        stack
            .workspaced
            .client()
            .json(
                "/v1/history",
                json!({"context": ctx("demo", "alice"), "path": path}),
            )
            .unwrap()["entries"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| {
                (
                    e["receipt"]["operation"].as_str().unwrap().to_owned(),
                    e["receipt"]["source"].as_str().unwrap().to_owned(),
                )
            })
            .collect::<Vec<_>>()
    };
    let mcp = |op: &str| (op.to_owned(), "mcp".to_owned());
    assert_eq!(history("notes.md"), [mcp("edit")]);
    assert_eq!(history("dup.md"), [mcp("edit")]);
    assert_eq!(history("old.md"), [mcp("move")]);
    assert_eq!(history("gone.md"), [mcp("delete")]);
    for path in ["p1.md", "patched/new.md", "p2.md"] {
        assert_eq!(history(path), [mcp("patch_set")], "{path}");
    }
    assert_eq!(history("workflow.json"), []);
}

/// `read_files` keeps its answer within 8 MiB of content: a file that does not fit in what is
/// left is that path's `too_large` error, and the paths after it still answer.
#[test]
fn read_files_answers_each_path_within_one_content_budget() {
    let stack = Stack::start();
    let (wf, token) = stack.user_with_project("alice", "demo", &["workflows:read"]);
    let demo = stack.state.documents().join("demo");
    let five_mib = "a".repeat(5 * 1024 * 1024);
    std::fs::write(demo.join("big1.txt"), &five_mib).unwrap();
    std::fs::write(demo.join("big2.txt"), &five_mib).unwrap();
    std::fs::write(demo.join("small.txt"), "small\n").unwrap();
    let answer = tool_result(
        stack.port,
        &token,
        "read_files",
        json!({"workflow_id": wf, "paths": ["big1.txt", "big2.txt", "small.txt"]}),
    )
    .unwrap();
    let files = answer["files"].as_array().unwrap();
    assert_eq!(
        files[0]["content"].as_str().map(str::len),
        Some(five_mib.len())
    );
    assert_eq!(files[1]["error"]["code"], "too_large", "{}", files[1]);
    assert_eq!(files[1]["error"]["size"], five_mib.len());
    assert!(files[1].get("content").is_none());
    assert_eq!(files[2]["content"], "small\n");
    assert_eq!(
        (answer["read"].as_u64(), answer["failed"].as_u64()),
        (Some(2), Some(1))
    );
}
