//! The one unified-diff parser and strict applier, shared by workspaced's `patch` and (later)
//! the laptop executor.
//!
//! Parsing is `diffy`'s; on top of it we are strict where `diffy` is forgiving: every hunk must
//! match its context exactly at the line its header names (no offset search, no fuzz), hunks
//! must be in order and must not overlap, and a patch that changes nothing is refused. A patch
//! either applies completely or not at all; this module never touches the filesystem.

/// Why a diff was refused. `hunk` numbers start at 1.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PatchError {
    #[error("the diff could not be parsed: {0}")]
    Parse(String),
    #[error("the diff has no hunks")]
    Empty,
    #[error("the diff holds more than one file ({0} file headers); send one file per patch")]
    MultipleFiles(usize),
    #[error(
        "hunk {hunk} does not match the file at line {line}: its context or removed lines differ; re-read the file and make a new diff"
    )]
    ContextMismatch { hunk: usize, line: usize },
    #[error(
        "hunk {hunk} starts before the end of hunk {previous}; hunks must be ordered and must not overlap"
    )]
    Overlap { hunk: usize, previous: usize },
    #[error("the diff is {size} bytes; a patch set takes at most {limit}")]
    DiffTooLarge { size: usize, limit: usize },
    #[error("the diff changes {count} files; a patch set changes at most {limit}")]
    TooManyFiles { count: usize, limit: usize },
    #[error("the diff has {count} hunks; a patch set takes at most {limit}")]
    TooManyHunks { count: usize, limit: usize },
    #[error(
        "file {file} of the diff has no --- / +++ header naming it; every file of a patch set needs one"
    )]
    MissingHeader { file: usize },
    #[error(
        "file {file} of the diff renames {from} to {to}; a patch set cannot rename (move the file first)"
    )]
    Rename {
        file: usize,
        from: String,
        to: String,
    },
    #[error("file {file} of the diff names /dev/null on both sides")]
    NoPath { file: usize },
    #[error(
        "file {file} of the diff names {path:?}, a quoted or escaped path or one with control characters; only plain paths are accepted"
    )]
    QuotedPath { file: usize, path: String },
    #[error(
        "the file is deleted (+++ /dev/null) but its hunks leave {bytes} bytes of it; a deletion's hunks remove every line"
    )]
    DeleteLeavesContent { bytes: usize },
    #[error("the hunks change nothing in the file")]
    NoChange,
    #[error(
        "{path} appears twice in the diff (files {first} and {second}); send one part per file"
    )]
    DuplicatePath {
        path: String,
        first: usize,
        second: usize,
    },
    /// The files are each fine but cannot all be applied, one after the other.
    #[error(transparent)]
    Conflict(#[from] crate::set_effect::SetConflict),
}

/// Apply a single-file unified diff to `base`, matching every hunk exactly where it says.
pub fn apply_strict(base: &str, diff: &str) -> Result<String, PatchError> {
    let headers = diff.lines().filter(|l| l.starts_with("+++ ")).count();
    if headers > 1 {
        return Err(PatchError::MultipleFiles(headers));
    }
    let patch = diffy::Patch::from_str(diff).map_err(|e| PatchError::Parse(e.to_string()))?;
    if patch.hunks().is_empty() {
        return Err(PatchError::Empty);
    }
    let base_lines: Vec<&str> = split_keep_newlines(base);
    let mut previous_end = 0usize;
    for (index, hunk) in patch.hunks().iter().enumerate() {
        let number = index + 1;
        let range = hunk.old_range();
        // A zero-length old range names the line *after which* the hunk inserts.
        let start = if range.is_empty() {
            range.start()
        } else {
            range.start().saturating_sub(1)
        };
        if start < previous_end {
            return Err(PatchError::Overlap {
                hunk: number,
                previous: number - 1,
            });
        }
        let expected: Vec<&str> = hunk
            .lines()
            .iter()
            .filter_map(|line| match line {
                diffy::Line::Context(l) | diffy::Line::Delete(l) => Some(*l),
                diffy::Line::Insert(_) => None,
            })
            .collect();
        // A header may name any line number, up to usize::MAX: one past the end of the range
        // that overflows is no line of the base, so it is a mismatch, never a wrapped range.
        let end = start.checked_add(expected.len());
        let actual = end.and_then(|end| base_lines.get(start..end));
        if actual != Some(expected.as_slice()) {
            return Err(PatchError::ContextMismatch {
                hunk: number,
                line: start.saturating_add(1),
            });
        }
        previous_end = start + expected.len();
    }
    // Every hunk matched exactly where it said, so diffy's search finds those same positions.
    diffy::apply(base, &patch).map_err(|e| PatchError::ContextMismatch {
        hunk: 0,
        line: e.to_string().len(),
    })
}

/// Lines including their `\n`, as diffy represents them.
fn split_keep_newlines(text: &str) -> Vec<&str> {
    text.split_inclusive('\n').collect()
}

// ----- Multi-file diffs (added for the laptop executor) -----
//
// `apply_strict` takes one file. The executor's `diff_patch_workspace_file` may carry a diff
// touching several files, each validated before any changes, so it splits the diff here first
// and applies each part with `apply_strict`.

/// One file's part of a multi-file unified diff.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileDiff {
    /// The `--- ` path with its `a/` prefix removed; `None` for `/dev/null` (a new file).
    pub old_path: Option<String>,
    /// The `+++ ` path with its `b/` prefix removed; `None` for `/dev/null` (a deletion).
    pub new_path: Option<String>,
    /// This file's headers and hunks, ready for [`apply_strict`].
    pub text: String,
}

fn header_path(raw: &str) -> Option<String> {
    let path = raw.split('\t').next().unwrap_or(raw).trim_end();
    if path == "/dev/null" {
        return None;
    }
    let path = path
        .strip_prefix("a/")
        .or_else(|| path.strip_prefix("b/"))
        .unwrap_or(path);
    Some(path.to_owned())
}

/// `(old count, new count)` of a `@@ -a[,b] +c[,d] @@` header (a missing count is 1).
fn hunk_counts(line: &str) -> Result<(usize, usize), PatchError> {
    let bad = || PatchError::Parse(format!("bad hunk header {line:?}"));
    let inner = line.strip_prefix("@@ ").ok_or_else(bad)?;
    let mut parts = inner.split_whitespace();
    let count = |part: Option<&str>, sign: char| -> Result<usize, PatchError> {
        let range = part.and_then(|p| p.strip_prefix(sign)).ok_or_else(bad)?;
        match range.split_once(',') {
            Some((_, n)) => n.parse().map_err(|_| bad()),
            None => range.parse::<usize>().map(|_| 1).map_err(|_| bad()),
        }
    };
    Ok((count(parts.next(), '-')?, count(parts.next(), '+')?))
}

/// Split a unified diff into its files at each `--- `/`+++ ` header pair, counting hunk lines
/// so that a removed line starting with `-- ` is never taken for a header. Lines outside hunks
/// and headers (`diff --git`, `index …`) are dropped. A diff without any header is returned as
/// one part with both paths `None`, for the caller to name.
pub fn split_files(diff: &str) -> Result<Vec<FileDiff>, PatchError> {
    let lines: Vec<&str> = diff.split_inclusive('\n').collect();
    let mut files: Vec<FileDiff> = Vec::new();
    let mut headerless = String::new();
    let (mut old_left, mut new_left) = (0usize, 0usize);
    let mut i = 0;
    while i < lines.len() {
        let line = lines[i];
        let bare = line.trim_end_matches('\n');
        if old_left > 0 || new_left > 0 {
            match bare.chars().next() {
                Some('+') => new_left = new_left.saturating_sub(1),
                Some('-') => old_left = old_left.saturating_sub(1),
                Some('\\') => {}
                _ => {
                    old_left = old_left.saturating_sub(1);
                    new_left = new_left.saturating_sub(1);
                }
            }
        } else if let Some(old) = bare.strip_prefix("--- ")
            && let Some(new) = lines
                .get(i + 1)
                .and_then(|l| l.trim_end_matches('\n').strip_prefix("+++ "))
        {
            files.push(FileDiff {
                old_path: header_path(old),
                new_path: header_path(new),
                text: String::new(),
            });
            for header in &lines[i..i + 2] {
                if let Some(file) = files.last_mut() {
                    file.text.push_str(header);
                }
            }
            i += 2;
            continue;
        } else if bare.starts_with("@@ ") {
            (old_left, new_left) = hunk_counts(bare)?;
        } else if bare.starts_with('\\') {
            // "\ No newline at end of file" after a hunk's last line: keep it with the hunk.
        } else {
            i += 1;
            continue;
        }
        match files.last_mut() {
            Some(file) => file.text.push_str(line),
            None => headerless.push_str(line),
        }
        i += 1;
    }
    if files.is_empty() {
        if headerless.is_empty() {
            return Err(PatchError::Empty);
        }
        return Ok(vec![FileDiff {
            old_path: None,
            new_path: None,
            text: headerless,
        }]);
    }
    if !headerless.is_empty() {
        return Err(PatchError::Parse(
            "hunks appear before the first file header".into(),
        ));
    }
    Ok(files)
}

// ----- Patch sets: multi-file diffs for workspaced's `/v1/patch_set` -----
//
// The input is hostile: its size, its number of files and of hunks are bounded before any
// per-file work, every file must name itself with a `--- `/`+++ ` pair, and renames, quoted
// paths and a path named twice are refused. Paths are returned as written (after the `a/`/`b/`
// prefix); confining them is the caller's job.

/// Bounds on a patch set's diff, checked before any file is looked at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PatchSetLimits {
    pub max_diff_bytes: usize,
    pub max_files: usize,
    pub max_hunks: usize,
}

/// What a patch set does to one file, read from its headers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FileChange {
    /// `--- /dev/null`: the file must not exist.
    Create,
    /// Same path on both sides.
    Modify,
    /// `+++ /dev/null`: its hunks must remove every line.
    Delete,
}

/// One file of a patch set.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FilePatch {
    /// The path as the headers name it (prefix `a/`/`b/` removed), not yet confined.
    pub path: String,
    pub change: FileChange,
    /// This file's headers and hunks, for [`apply_strict`].
    pub text: String,
    /// Lines the hunks add and remove.
    pub added: usize,
    pub removed: usize,
}

/// `+` and `-` lines of one file's hunks, and its hunk count (headers are not hunk lines:
/// [`split_files`] put exactly two header lines first).
fn hunk_stats(text: &str) -> (usize, usize, usize) {
    let (mut added, mut removed, mut hunks) = (0, 0, 0);
    for line in text.lines().skip(2) {
        if line.starts_with("@@ ") {
            hunks += 1;
        } else if line.starts_with('+') {
            added += 1;
        } else if line.starts_with('-') {
            removed += 1;
        }
    }
    (added, removed, hunks)
}

/// Split and check a multi-file diff: bounded, every part headed, no renames, no path twice.
/// Files are numbered from 1 in errors, in the diff's order.
pub fn parse_patch_set(diff: &str, limits: PatchSetLimits) -> Result<Vec<FilePatch>, PatchError> {
    if diff.len() > limits.max_diff_bytes {
        return Err(PatchError::DiffTooLarge {
            size: diff.len(),
            limit: limits.max_diff_bytes,
        });
    }
    let parts = split_files(diff)?;
    if parts.len() > limits.max_files {
        return Err(PatchError::TooManyFiles {
            count: parts.len(),
            limit: limits.max_files,
        });
    }
    let mut files: Vec<FilePatch> = Vec::with_capacity(parts.len());
    let mut total_hunks = 0usize;
    for (index, part) in parts.into_iter().enumerate() {
        let file = index + 1;
        let (path, change) = match (part.old_path, part.new_path) {
            (None, None) if part.text.starts_with("--- ") => {
                return Err(PatchError::NoPath { file });
            }
            (None, None) => return Err(PatchError::MissingHeader { file }),
            (None, Some(new)) => (new, FileChange::Create),
            (Some(old), None) => (old, FileChange::Delete),
            (Some(old), Some(new)) if old == new => (new, FileChange::Modify),
            (Some(old), Some(new)) => {
                return Err(PatchError::Rename {
                    file,
                    from: old,
                    to: new,
                });
            }
        };
        if path.starts_with('"')
            || path.contains('\\')
            || path.chars().any(crate::text::is_control_or_bidi)
        {
            return Err(PatchError::QuotedPath { file, path });
        }
        if let Some(first) = files.iter().position(|f| f.path == path) {
            return Err(PatchError::DuplicatePath {
                path,
                first: first + 1,
                second: file,
            });
        }
        let (added, removed, hunks) = hunk_stats(&part.text);
        if hunks == 0 {
            return Err(PatchError::Empty);
        }
        total_hunks += hunks;
        if total_hunks > limits.max_hunks {
            return Err(PatchError::TooManyHunks {
                count: total_hunks,
                limit: limits.max_hunks,
            });
        }
        files.push(FilePatch {
            path,
            change,
            text: part.text,
            added,
            removed,
        });
    }
    Ok(files)
}

#[cfg(test)]
mod tests {
    use super::*;

    const BASE: &str = "one\ntwo\nthree\nfour\nfive\n";

    #[test]
    fn applies_an_exact_diff() {
        let diff = "--- a/f\n+++ b/f\n@@ -2,2 +2,2 @@\n two\n-three\n+THREE\n";
        assert_eq!(
            apply_strict(BASE, diff).unwrap(),
            "one\ntwo\nTHREE\nfour\nfive\n"
        );
    }

    #[test]
    fn refuses_a_hunk_at_the_wrong_line_even_if_it_would_match_elsewhere() {
        // diffy alone would find "two/three" one line up; we refuse.
        let diff = "--- a/f\n+++ b/f\n@@ -3,2 +3,2 @@\n two\n-three\n+THREE\n";
        assert_eq!(
            apply_strict(BASE, diff).unwrap_err(),
            PatchError::ContextMismatch { hunk: 1, line: 3 }
        );
    }

    #[test]
    fn refuses_a_hunk_numbered_past_any_line_without_overflowing() {
        // Found by fuzz/patch_set: `start + len` overflowed for a start of usize::MAX (diffy
        // takes the hunk's counts loosely, so a ",0" range may still carry a deleted line).
        let diff = format!("--- a/f\n+++ b/f\n@@ -{},0 +0,0 @@\n-one\n", usize::MAX);
        assert_eq!(
            apply_strict(BASE, &diff).unwrap_err(),
            PatchError::ContextMismatch {
                hunk: 1,
                line: usize::MAX,
            }
        );
    }

    #[test]
    fn refuses_changed_context_and_keeps_nothing() {
        let diff = "--- a/f\n+++ b/f\n@@ -1,1 +1,1 @@\n-one\n+ONE\n@@ -4,1 +4,1 @@\n-FOUR\n+4\n";
        assert_eq!(
            apply_strict(BASE, diff).unwrap_err(),
            PatchError::ContextMismatch { hunk: 2, line: 4 }
        );
    }

    #[test]
    fn inserts_into_an_empty_file_and_appends() {
        let diff = "--- /dev/null\n+++ b/f\n@@ -0,0 +1,2 @@\n+a\n+b\n";
        assert_eq!(apply_strict("", diff).unwrap(), "a\nb\n");
        let append = "--- a/f\n+++ b/f\n@@ -5,0 +6,1 @@\n+six\n";
        assert_eq!(apply_strict(BASE, append).unwrap(), format!("{BASE}six\n"));
    }

    #[test]
    fn refuses_garbage_multiple_files_and_empty() {
        assert!(matches!(
            apply_strict(BASE, "@@ nonsense"),
            Err(PatchError::Parse(_))
        ));
        let two =
            "--- a/f\n+++ b/f\n@@ -1 +1 @@\n-one\n+1\n--- a/g\n+++ b/g\n@@ -1 +1 @@\n-x\n+y\n";
        assert_eq!(
            apply_strict(BASE, two).unwrap_err(),
            PatchError::MultipleFiles(2)
        );
        assert_eq!(
            apply_strict(BASE, "--- a/f\n+++ b/f\n").unwrap_err(),
            PatchError::Empty
        );
    }

    #[test]
    fn splits_multi_file_diffs_without_mistaking_removed_lines_for_headers() {
        let diff = "diff --git a/f b/f\nindex 1..2\n--- a/f\n+++ b/f\n@@ -1,2 +1,2 @@\n--- x\n+y\n keep\n--- a/g\n+++ b/g\n@@ -1 +1 @@\n-two\n+2\n--- /dev/null\n+++ b/new\n@@ -0,0 +1 @@\n+n\n";
        let files = split_files(diff).expect("ok");
        assert_eq!(files.len(), 3, "{files:?}");
        assert_eq!(files[0].new_path.as_deref(), Some("f"));
        assert_eq!(
            files[0].text,
            "--- a/f\n+++ b/f\n@@ -1,2 +1,2 @@\n--- x\n+y\n keep\n"
        );
        assert_eq!(
            apply_strict("-- x\nkeep\n", &files[0].text).expect("ok"),
            "y\nkeep\n"
        );
        assert_eq!(files[1].new_path.as_deref(), Some("g"));
        assert_eq!(files[2].old_path, None);
        assert_eq!(apply_strict("", &files[2].text).expect("ok"), "n\n");
        let bare = split_files("@@ -1 +1 @@\n-a\n+b\n").expect("ok");
        assert_eq!(bare.len(), 1);
        assert_eq!(bare[0].new_path, None);
        assert!(split_files("").is_err());
        assert!(split_files("@@ -x +1 @@\n").is_err());
    }

    const LIMITS: PatchSetLimits = PatchSetLimits {
        max_diff_bytes: 4096,
        max_files: 3,
        max_hunks: 4,
    };

    #[test]
    fn a_patch_set_names_each_file_and_what_happens_to_it() {
        let diff = "diff --git a/new.txt b/new.txt\nnew file mode 100644\n--- /dev/null\n+++ b/new.txt\n@@ -0,0 +1,2 @@\n+a\n+b\n--- a/src/m.rs\n+++ b/src/m.rs\n@@ -1,2 +1,2 @@\n-x\n+y\n z\n--- a/old.txt\n+++ /dev/null\n@@ -1 +0,0 @@\n-gone\n";
        let files = parse_patch_set(diff, LIMITS).expect("parses");
        let summary: Vec<_> = files
            .iter()
            .map(|f| (f.path.as_str(), f.change, f.added, f.removed))
            .collect();
        assert_eq!(
            summary,
            vec![
                ("new.txt", FileChange::Create, 2, 0),
                ("src/m.rs", FileChange::Modify, 1, 1),
                ("old.txt", FileChange::Delete, 0, 1),
            ]
        );
        assert_eq!(apply_strict("", &files[0].text).unwrap(), "a\nb\n");
        assert_eq!(apply_strict("x\nz\n", &files[1].text).unwrap(), "y\nz\n");
        assert_eq!(apply_strict("gone\n", &files[2].text).unwrap(), "");
    }

    #[test]
    fn a_patch_set_refuses_what_it_cannot_do_safely() {
        let one = |path: &str| format!("--- a/{path}\n+++ b/{path}\n@@ -1 +1 @@\n-x\n+y\n");
        let too_big = "x".repeat(LIMITS.max_diff_bytes + 1);
        assert!(matches!(
            parse_patch_set(&too_big, LIMITS),
            Err(PatchError::DiffTooLarge { .. })
        ));
        let four: String = ["a", "b", "c", "d"].iter().map(|p| one(p)).collect();
        assert_eq!(
            parse_patch_set(&four, LIMITS).unwrap_err(),
            PatchError::TooManyFiles { count: 4, limit: 3 }
        );
        let many_hunks = "--- a/f\n+++ b/f\n@@ -1 +1 @@\n-1\n+x\n@@ -2 +2 @@\n-2\n+x\n@@ -3 +3 @@\n-3\n+x\n@@ -4 +4 @@\n-4\n+x\n@@ -5 +5 @@\n-5\n+x\n";
        assert_eq!(
            parse_patch_set(many_hunks, LIMITS).unwrap_err(),
            PatchError::TooManyHunks { count: 5, limit: 4 }
        );
        assert_eq!(
            parse_patch_set("@@ -1 +1 @@\n-x\n+y\n", LIMITS).unwrap_err(),
            PatchError::MissingHeader { file: 1 }
        );
        assert!(matches!(
            parse_patch_set("--- a/f\n+++ b/g\n@@ -1 +1 @@\n-x\n+y\n", LIMITS),
            Err(PatchError::Rename { file: 1, .. })
        ));
        assert_eq!(
            parse_patch_set("--- /dev/null\n+++ /dev/null\n@@ -0,0 +1 @@\n+y\n", LIMITS)
                .unwrap_err(),
            PatchError::NoPath { file: 1 }
        );
        assert!(matches!(
            parse_patch_set(&one("\"q\\tx\""), LIMITS),
            Err(PatchError::QuotedPath { file: 1, .. })
        ));
        let twice = format!("{}{}", one("f"), one("f"));
        assert_eq!(
            parse_patch_set(&twice, LIMITS).unwrap_err(),
            PatchError::DuplicatePath {
                path: "f".into(),
                first: 1,
                second: 2
            }
        );
        assert_eq!(
            parse_patch_set("--- a/f\n+++ b/f\n", LIMITS).unwrap_err(),
            PatchError::Empty
        );
    }
}
