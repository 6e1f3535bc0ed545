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
        let actual = base_lines.get(start..start + expected.len());
        if actual != Some(expected.as_slice()) {
            return Err(PatchError::ContextMismatch {
                hunk: number,
                line: start + 1,
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
}
