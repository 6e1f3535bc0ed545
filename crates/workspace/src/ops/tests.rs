//! Operations of a real [`Workspace`] on a temporary documents tree, without the socket.

use super::*;
use agentworks_core::guard::Guard;

pub(super) struct Fixture {
    _dir: tempfile::TempDir,
    pub(super) project: PathBuf,
    pub(super) workspace: Arc<Workspace>,
}

pub(super) fn fixture(files: &[(&str, &str)]) -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let documents = dir.path().join("documents");
    let project = documents.join("demo");
    std::fs::create_dir_all(&project).unwrap();
    for (path, content) in files {
        let full = project.join(path);
        std::fs::create_dir_all(full.parent().unwrap()).unwrap();
        std::fs::write(full, content).unwrap();
    }
    let layout = StateLayout {
        root: dir.path().join("state"),
    };
    std::fs::create_dir_all(&layout.root).unwrap();
    let limits = Limits {
        max_file_bytes: 1024 * 1024,
        lock_timeout: Duration::from_secs(5),
        search_max_results: 100,
    };
    let workspace = Arc::new(Workspace::open(&documents, layout, limits).unwrap());
    Fixture {
        _dir: dir,
        project,
        workspace,
    }
}

pub(super) fn context(guard: Guard) -> Context {
    Context {
        project: "demo".into(),
        principal: Principal {
            user_id: "u1".into(),
            user_name: "alice".into(),
            connection_id: None,
            source: "test".into(),
        },
        guard,
    }
}

pub(super) fn writable() -> Guard {
    Guard {
        write_paths: vec![".".into()],
        ..Guard::default()
    }
}

#[test]
fn stat_reports_a_file_a_folder_and_refuses_what_read_refuses() {
    let f = fixture(&[("code/a.txt", "hello\n"), ("secret/k", "k")]);
    let stat = |guard: Guard, path: &str| {
        f.workspace.stat(&StatRequest {
            context: context(guard),
            path: path.into(),
        })
    };
    let file = stat(writable(), "code/a.txt").unwrap();
    assert_eq!(file.kind, EntryKind::File);
    assert_eq!(file.size, Some(6));
    assert_eq!(file.revision, Some(Revision::of(b"hello\n")));
    assert!(file.modified_ms > 0);
    let folder = stat(writable(), "code").unwrap();
    assert_eq!(
        (folder.kind, folder.size, folder.revision),
        (EntryKind::Dir, None, None)
    );
    assert_eq!(
        stat(writable(), "code/none").unwrap_err().code(),
        "not_found"
    );
    assert_eq!(
        stat(writable(), "none/none").unwrap_err().code(),
        "not_found"
    );
    let blocked = Guard {
        blocked_paths: vec!["secret".into()],
        ..Guard::default()
    };
    assert_eq!(stat(blocked, "secret/k").unwrap_err().code(), "forbidden");
    std::os::unix::fs::symlink("/etc/hostname", f.project.join("code/link")).unwrap();
    assert_eq!(
        stat(writable(), "code/link").unwrap_err().code(),
        "path_refused"
    );
}

#[test]
fn an_edit_dry_run_writes_and_records_nothing_and_the_real_one_replays() {
    let f = fixture(&[("a.txt", "one\ntwo\n")]);
    let request = |dry_run| EditRequest {
        context: context(writable()),
        path: "a.txt".into(),
        edits: vec![TextEdit {
            old_text: "two".into(),
            new_text: "2".into(),
            replace_all: false,
        }],
        expected_revision: Revision::of(b"one\ntwo\n").to_string(),
        request_id: "r1".into(),
        dry_run,
    };
    let EditAnswer::Preview(preview) = f.workspace.edit(&request(true)).unwrap() else {
        panic!("a dry run answers a preview");
    };
    assert_eq!(preview.revision, Revision::of(b"one\n2\n"));
    assert_eq!(
        std::fs::read_to_string(f.project.join("a.txt")).unwrap(),
        "one\ntwo\n"
    );
    let history = f
        .workspace
        .history(&HistoryRequest {
            context: context(writable()),
            path: None,
            limit: None,
        })
        .unwrap();
    assert!(history.entries.is_empty());

    let EditAnswer::Applied(applied) = f.workspace.edit(&request(false)).unwrap() else {
        panic!("an edit answers a change");
    };
    assert_eq!(applied.change.revision, preview.revision);
    assert_eq!(applied.diff.as_deref(), Some(preview.diff.as_str()));
    assert_eq!(applied.change.receipt.operation, Operation::Edit);
    assert_eq!(
        std::fs::read_to_string(f.project.join("a.txt")).unwrap(),
        "one\n2\n"
    );
    let EditAnswer::Applied(replayed) = f.workspace.edit(&request(false)).unwrap() else {
        panic!("a replay answers a change");
    };
    assert!(replayed.change.replayed);
    assert_eq!(replayed.diff, applied.diff);
    // An edit's receipt is restorable like a write's: its before-content is complete.
    let restored = f
        .workspace
        .restore(&RestoreRequest {
            context: context(writable()),
            receipt_id: applied.change.receipt.receipt_id.clone(),
            expected_revision: applied.change.revision.to_string(),
            request_id: "r2".into(),
        })
        .unwrap();
    assert_eq!(restored.revision, Revision::of(b"one\ntwo\n"));
    assert_eq!(
        std::fs::read_to_string(f.project.join("a.txt")).unwrap(),
        "one\ntwo\n"
    );
    // The same request as a dry run does not consult the receipts: it checks the file, now
    // back at the expected revision, and would apply again.
    assert!(matches!(
        f.workspace.edit(&request(true)).unwrap(),
        EditAnswer::Preview(_)
    ));
}

fn list_paths(f: &Fixture, req: ListRequest) -> (Vec<String>, bool) {
    let answer = f.workspace.list(&req).unwrap();
    (
        answer.entries.into_iter().map(|e| e.path).collect(),
        answer.truncated,
    )
}

fn tree_request(path: &str, recursive: bool) -> ListRequest {
    ListRequest {
        context: context(writable()),
        path: path.into(),
        recursive,
        depth: None,
        exclude: Vec::new(),
        max_entries: None,
    }
}

#[test]
fn list_depth_exclude_and_max_entries_bound_the_walk() {
    let f = fixture(&[
        ("a.txt", "a"),
        ("src/main.rs", "m"),
        ("src/gen/out.rs", "o"),
        ("web/node_modules/x/y.js", "y"),
        ("web/app.log", "l"),
        ("web/app.js", "j"),
    ]);
    // (The walk lists a folder's entries, then each subfolder's, as it always has.)
    // Old requests: recursive false is one level, true unlimited, the same as list().
    let (flat, _) = list_paths(&f, tree_request("", false));
    assert_eq!(flat, ["a.txt", "src", "web"]);
    let (all, truncated) = list_paths(&f, tree_request("", true));
    assert_eq!(all.len(), 11);
    assert!(!truncated);
    // A body of only context, path and recursive (as before the bounds) still decodes.
    let old: ListRequest = serde_json::from_value(serde_json::json!({
        "context": context(writable()),
        "path": "",
        "recursive": true,
    }))
    .unwrap();
    assert_eq!(f.workspace.list(&old).unwrap().entries.len(), 11);

    let mut two = tree_request("", false);
    two.depth = Some(2);
    let (two, _) = list_paths(&f, two);
    assert_eq!(
        two,
        [
            "a.txt",
            "src",
            "web",
            "src/gen",
            "src/main.rs",
            "web/app.js",
            "web/app.log",
            "web/node_modules"
        ]
    );
    let mut zero = tree_request("", true);
    zero.depth = Some(0);
    assert_eq!(
        f.workspace.list(&zero).unwrap_err().code(),
        "invalid_request"
    );

    let mut excluded = tree_request("", true);
    excluded.exclude = vec!["node_modules".into(), "*.log".into(), "src/gen".into()];
    let (kept, _) = list_paths(&f, excluded);
    assert_eq!(kept, ["a.txt", "src", "web", "src/main.rs", "web/app.js"]);
    // Patterns with a slash match from the list's path, not the project root.
    let mut below = tree_request("src", true);
    below.exclude = vec!["gen/out.rs".into()];
    let (below, _) = list_paths(&f, below);
    assert_eq!(below, ["src/gen", "src/main.rs"]);
    let mut bad = tree_request("", true);
    bad.exclude = vec!["../x".into()];
    assert_eq!(
        f.workspace.list(&bad).unwrap_err().code(),
        "invalid_request"
    );

    let mut bounded = tree_request("", true);
    bounded.max_entries = Some(2);
    let (first, truncated) = list_paths(&f, bounded);
    assert_eq!((first.len(), truncated), (2, true));
    let mut exact = tree_request("", false);
    exact.max_entries = Some(3);
    assert_eq!(list_paths(&f, exact), (flat, false));
}

fn read(f: &Fixture, path: &str, offset: Option<u64>, limit: Option<u64>) -> ReadResponse {
    f.workspace
        .read(&ReadRequest {
            context: context(writable()),
            path: path.into(),
            offset,
            limit,
        })
        .unwrap()
}

#[test]
fn a_ranged_read_answers_those_lines_and_the_whole_files_revision() {
    let text = "one\ntwo\r\nthree\nfour";
    let f = fixture(&[("a.txt", text), ("empty.txt", "")]);
    let whole = read(&f, "a.txt", None, None);
    assert_eq!(whole.content, text);
    assert_eq!(
        (whole.total_lines, whole.offset, whole.limit),
        (4, None, None)
    );
    // A body of only context and path (as before the range) still decodes: the whole file.
    let old: ReadRequest = serde_json::from_value(serde_json::json!({
        "context": context(writable()),
        "path": "a.txt",
    }))
    .unwrap();
    assert_eq!(f.workspace.read(&old).unwrap(), whole);

    let middle = read(&f, "a.txt", Some(1), Some(2));
    assert_eq!(middle.content, "two\r\nthree\n");
    assert_eq!((middle.offset, middle.limit), (Some(1), Some(2)));
    assert_eq!(middle.revision, whole.revision);
    assert_eq!((middle.size, middle.total_lines), (whole.size, 4));
    let tail = read(&f, "a.txt", Some(3), None);
    assert_eq!((tail.content.as_str(), tail.limit), ("four", None));
    let head = read(&f, "a.txt", None, Some(1));
    assert_eq!((head.content.as_str(), head.offset), ("one\n", Some(0)));
    let past = read(&f, "a.txt", Some(10), Some(5));
    assert_eq!((past.content.as_str(), past.total_lines), ("", 4));
    assert_eq!(read(&f, "empty.txt", None, None).total_lines, 0);
    let zero = f.workspace.read(&ReadRequest {
        context: context(writable()),
        path: "a.txt".into(),
        offset: None,
        limit: Some(0),
    });
    assert_eq!(zero.unwrap_err().code(), "invalid_request");
}
