//! `/v1/edit`: exact-text replacements in one file, through the one change pipeline
//! ([`Workspace::change`]), and the dry run that computes the same answer without it.
//!
//! Matching is exact, byte for byte: no whitespace, line-ending or Unicode normalising, so an
//! edit never changes text the caller did not quote. Each `old_text` must occur exactly once
//! (occurrences counted overlapping, so `aa` in `aaa` is two and refused as ambiguous) unless
//! `replace_all`, then at least once; the edits apply in order, each to the result of the one
//! before. Edits are numbered from 0 (their place in the `edits` array) in every error.
//!
//! A replay (same request id, same payload) answers the recorded outcome; its diff is
//! recomputed from the receipt's before-content by applying the same edits again, and is
//! `null` when that content was truncated (over 128 KiB) or does not reproduce the recorded
//! revisions. This module never writes except through the pipeline, and a dry run takes the
//! lock only to read: it records nothing and never consults or stores the request id.

use super::Workspace;
use super::change::{parse_expected, payload_hash};
use crate::error::WorkspaceError;
use crate::receipts::Operation;
use agentworks_contract::workspaced::*;
use agentworks_core::guard::RelPath;
use agentworks_core::revision::Revision;
use agentworks_fs::confine::ConfineError;

/// How many times `needle` occurs in `haystack`, overlapping occurrences counted (the count is
/// part of the `edit_not_unique` error, so it is counted in full).
fn count_occurrences(haystack: &str, needle: &str) -> usize {
    let mut count = 0;
    let mut from = 0;
    while let Some(found) = haystack[from..].find(needle) {
        count += 1;
        // Step one character, not one match: overlapping occurrences count.
        let start = from + found;
        from = start
            + haystack[start..]
                .chars()
                .next()
                .map(char::len_utf8)
                .unwrap_or(1);
    }
    count
}

/// Refuse a request that cannot be an edit, before anything else.
fn validate_edits(edits: &[TextEdit]) -> Result<(), WorkspaceError> {
    if edits.is_empty() {
        return Err(WorkspaceError::InvalidRequest(
            "edit needs at least one entry in edits".into(),
        ));
    }
    if let Some(index) = edits.iter().position(|e| e.old_text.is_empty()) {
        return Err(WorkspaceError::InvalidRequest(format!(
            "edit {index} (0-based) has an empty old_text; an edit replaces text that exists"
        )));
    }
    Ok(())
}

/// Apply `edits` in order to `base`, each to the result of the previous. A result that would
/// exceed `max_bytes` is refused before it is built: one short `old_text` replaced everywhere
/// by a long `new_text` could otherwise ask for terabytes (and abort the daemon).
pub(super) fn apply_edits(
    path: &RelPath,
    base: &str,
    edits: &[TextEdit],
    max_bytes: u64,
) -> Result<String, WorkspaceError> {
    let mut text = base.to_owned();
    for (edit_index, edit) in edits.iter().enumerate() {
        let matches = count_occurrences(&text, &edit.old_text);
        if matches == 0 {
            return Err(WorkspaceError::EditNoMatch {
                path: path.to_string(),
                edit_index,
            });
        }
        if !edit.replace_all && matches > 1 {
            return Err(WorkspaceError::EditNotUnique {
                path: path.to_string(),
                edit_index,
                matches,
            });
        }
        // `replace` replaces the non-overlapping occurrences: the result's exact size.
        let replaced = if edit.replace_all {
            text.matches(edit.old_text.as_str()).count() as u64
        } else {
            1
        };
        let size = (text.len() as u64 - replaced * edit.old_text.len() as u64)
            .saturating_add(replaced.saturating_mul(edit.new_text.len() as u64));
        if size > max_bytes {
            return Err(WorkspaceError::TooLarge {
                path: path.to_string(),
                size,
                limit: max_bytes,
            });
        }
        text = if edit.replace_all {
            text.replace(&edit.old_text, &edit.new_text)
        } else {
            text.replacen(&edit.old_text, &edit.new_text, 1)
        };
    }
    Ok(text)
}

/// How long a diff may take before it settles for a correct but less minimal one: Myers' diff
/// is O((N+M)·D), hours for a large file whose every line changed.
const DIFF_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(1);

/// The unified diff of `path` from `before` to `after`, headed `a/<path>` → `b/<path>`.
pub(super) fn unified_diff(path: &RelPath, before: &str, after: &str) -> String {
    similar::TextDiff::configure()
        .timeout(DIFF_TIMEOUT)
        .diff_lines(before, after)
        .unified_diff()
        .header(&format!("a/{path}"), &format!("b/{path}"))
        .to_string()
}

/// The idempotency payload: path, expected revision and every edit (not `dry_run`).
fn edit_payload_hash(path: &RelPath, req: &EditRequest) -> String {
    let count = req.edits.len().to_string();
    let mut parts: Vec<&str> = vec!["edit", path.as_str(), &req.expected_revision, &count];
    for edit in &req.edits {
        parts.push(&edit.old_text);
        parts.push(&edit.new_text);
        parts.push(if edit.replace_all { "all" } else { "one" });
    }
    payload_hash(&parts)
}

fn as_text<'a>(path: &RelPath, bytes: &'a [u8]) -> Result<&'a str, WorkspaceError> {
    std::str::from_utf8(bytes).map_err(|_| WorkspaceError::NotText {
        path: path.to_string(),
    })
}

impl Workspace {
    pub fn edit(&self, req: &EditRequest) -> Result<EditAnswer, WorkspaceError> {
        let path = RelPath::parse(&req.path)?;
        req.context.guard.resolve()?.check_write(&path)?;
        let expected = parse_expected(&req.expected_revision)?;
        validate_edits(&req.edits)?;
        if req.dry_run {
            return self
                .edit_preview(req, &path, &expected)
                .map(EditAnswer::Preview);
        }
        let hash = edit_payload_hash(&path, req);
        // Set by the plan when the edit is applied now; a replay never runs the plan.
        let mut fresh_diff = None;
        let change = self.change(
            &req.context,
            Operation::Edit,
            &req.request_id,
            hash,
            |project| {
                let (current, edited, diff) = self.edit_current(project, &path, &expected, req)?;
                fresh_diff = Some(diff);
                Ok(self.plan_replace(path.clone(), current, edited.into_bytes()))
            },
        )?;
        let diff = match fresh_diff {
            Some(diff) => Some(diff),
            None => replayed_diff(&path, req, &change.receipt, self.limits.max_file_bytes),
        };
        Ok(EditAnswer::Applied(Box::new(EditResponse { change, diff })))
    }

    /// Read the file under the lock, check the revision, apply the edits: what both the
    /// change and the dry run start from.
    fn edit_current(
        &self,
        project: &super::Project,
        path: &RelPath,
        expected: &Revision,
        req: &EditRequest,
    ) -> Result<(super::Current, String, String), WorkspaceError> {
        let current = self.current(project, path, false)?;
        self.check_expected(path, expected, &current.revision)?;
        let Some(bytes) = &current.content else {
            return Err(ConfineError::NotFound {
                path: path.to_string(),
            }
            .into());
        };
        let base = as_text(path, bytes)?;
        let edited = apply_edits(path, base, &req.edits, self.limits.max_file_bytes)?;
        self.check_size(path, edited.len())?;
        let diff = unified_diff(path, base, &edited);
        Ok((current, edited, diff))
    }

    /// The dry run: the same guard, revision and match checks, under the lock; nothing written
    /// or recorded.
    fn edit_preview(
        &self,
        req: &EditRequest,
        path: &RelPath,
        expected: &Revision,
    ) -> Result<EditPreview, WorkspaceError> {
        let project = self.project(&req.context.project)?;
        let _lock = self.lock(&project)?;
        let (current, edited, diff) = self.edit_current(&project, path, expected, req)?;
        Ok(EditPreview {
            dry_run: true,
            diff,
            previous_revision: current.revision,
            revision: Revision::of(edited.as_bytes()),
        })
    }
}

/// The diff of a recorded edit, recomputed from the receipt's before-content; `None` when
/// that content is truncated or does not reproduce both recorded revisions.
fn replayed_diff(
    path: &RelPath,
    req: &EditRequest,
    receipt: &Receipt,
    max_bytes: u64,
) -> Option<String> {
    if receipt.before_truncated {
        return None;
    }
    let before = receipt.before_content.as_deref()?;
    if Revision::of(before) != receipt.previous_revision {
        return None;
    }
    let before = std::str::from_utf8(before).ok()?;
    let after = apply_edits(path, before, &req.edits, max_bytes).ok()?;
    if Revision::of(after.as_bytes()) != receipt.resulting_revision {
        return None;
    }
    Some(unified_diff(path, before, &after))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn edit(old: &str, new: &str, all: bool) -> TextEdit {
        TextEdit {
            old_text: old.into(),
            new_text: new.into(),
            replace_all: all,
        }
    }

    fn path() -> RelPath {
        RelPath::parse("a.txt").unwrap()
    }

    const LIMIT: u64 = 8 * 1024 * 1024;

    #[test]
    fn a_result_over_the_limit_is_refused_before_it_is_built() {
        // At the real 8 MiB limit, "a" × 8 Mi replaced everywhere by 1 MiB would ask for
        // 8 TiB; the same arithmetic at a 4 KiB limit, 4 Ki × 1 KiB = 4 MiB.
        let base = "a".repeat(4096);
        let long = "b".repeat(1024);
        let err = apply_edits(&path(), &base, &[edit("a", &long, true)], 4096).unwrap_err();
        assert_eq!(err.code(), "too_large");
        assert!(
            err.to_string().contains(&(4096 * 1024).to_string()),
            "{err}"
        );
        // A result of exactly the limit is fine.
        let same = apply_edits(&path(), &base, &[edit("a", "c", true)], 4096).unwrap();
        assert_eq!(same.len(), 4096);
        let one = apply_edits(&path(), "abc", &[edit("b", "xyz", false)], 5).unwrap();
        assert_eq!(one, "axyzc");
        assert!(apply_edits(&path(), "abc", &[edit("b", "xyzw", false)], 5).is_err());
    }

    #[test]
    fn a_diff_of_a_large_file_whose_every_line_changed_settles_in_time() {
        // Every one of 200,000 lines differs: minimal Myers is O((N+M)·D), ~10^11 steps.
        let before: String = (0..200_000).map(|i| format!("{i}\n")).collect();
        let after: String = (0..200_000).map(|i| format!("x{i}\n")).collect();
        let diff = unified_diff(&path(), &before, &after);
        assert!(
            diff.starts_with("--- a/a.txt\n+++ b/a.txt\n"),
            "{}",
            &diff[..40]
        );
        assert_eq!(diff.lines().filter(|l| l.starts_with('+')).count(), 200_001);
    }

    #[test]
    fn edits_apply_in_order_to_the_previous_result() {
        let out = apply_edits(
            &path(),
            "one two three\n",
            &[edit("one", "1", false), edit("1 two", "12", false)],
            LIMIT,
        )
        .unwrap();
        assert_eq!(out, "12 three\n");
    }

    #[test]
    fn a_missing_match_names_the_edit() {
        let err = apply_edits(
            &path(),
            "abc",
            &[edit("a", "x", false), edit("zzz", "y", false)],
            LIMIT,
        )
        .unwrap_err();
        assert!(matches!(
            err,
            WorkspaceError::EditNoMatch { edit_index: 1, .. }
        ));
        assert_eq!(err.code(), "edit_no_match");
        assert!(err.to_string().contains("edit 1 (0-based)"), "{err}");
    }

    #[test]
    fn a_repeated_match_is_refused_with_its_count_unless_replace_all() {
        let err = apply_edits(&path(), "x x x", &[edit("x", "y", false)], LIMIT).unwrap_err();
        assert!(matches!(
            err,
            WorkspaceError::EditNotUnique {
                edit_index: 0,
                matches: 3,
                ..
            }
        ));
        assert_eq!(err.code(), "edit_not_unique");
        assert_eq!(
            apply_edits(&path(), "x x x", &[edit("x", "y", true)], LIMIT).unwrap(),
            "y y y"
        );
        // Overlapping occurrences make a match ambiguous too.
        assert!(matches!(
            apply_edits(&path(), "aaa", &[edit("aa", "b", false)], LIMIT),
            Err(WorkspaceError::EditNotUnique { matches: 2, .. })
        ));
    }

    #[test]
    fn matching_is_exact_bytes_without_normalising() {
        assert!(matches!(
            apply_edits(&path(), "a  b\r\n", &[edit("a b\n", "c", false)], LIMIT),
            Err(WorkspaceError::EditNoMatch { .. })
        ));
        assert_eq!(
            apply_edits(&path(), "é\r\n", &[edit("é\r\n", "e\n", false)], LIMIT).unwrap(),
            "e\n"
        );
    }

    #[test]
    fn empty_old_text_and_no_edits_are_refused() {
        assert_eq!(validate_edits(&[]).unwrap_err().code(), "invalid_request");
        let err = validate_edits(&[edit("a", "b", false), edit("", "b", false)]).unwrap_err();
        assert_eq!(err.code(), "invalid_request");
        assert!(err.to_string().contains("edit 1"), "{err}");
    }

    #[test]
    fn overlapping_count_handles_multibyte_text() {
        assert_eq!(count_occurrences("ééé", "éé"), 2);
        assert_eq!(count_occurrences("abc", "d"), 0);
        assert_eq!(count_occurrences("abab", "ab"), 2);
    }

    #[test]
    fn the_diff_names_the_path_and_applies_back() {
        let diff = unified_diff(&path(), "one\ntwo\n", "one\n2\n");
        assert!(diff.starts_with("--- a/a.txt\n+++ b/a.txt\n"), "{diff}");
        assert_eq!(
            agentworks_core::patch::apply_strict("one\ntwo\n", &diff).unwrap(),
            "one\n2\n"
        );
    }

    #[test]
    fn the_payload_hash_ignores_dry_run_and_sees_every_edit() {
        let ctx = Context {
            project: "p".into(),
            principal: Principal {
                user_id: "u".into(),
                user_name: "u".into(),
                connection_id: None,
                source: "test".into(),
            },
            guard: Default::default(),
        };
        let req = |edits: Vec<TextEdit>, dry_run| EditRequest {
            context: ctx.clone(),
            path: "a.txt".into(),
            edits,
            expected_revision: "missing".into(),
            request_id: "r".into(),
            dry_run,
        };
        let base = edit_payload_hash(&path(), &req(vec![edit("a", "b", false)], false));
        assert_eq!(
            base,
            edit_payload_hash(&path(), &req(vec![edit("a", "b", false)], true))
        );
        for other in [
            vec![edit("a", "b", true)],
            vec![edit("a", "c", false)],
            vec![edit("ab", "", false)],
            vec![edit("a", "b", false), edit("b", "a", false)],
        ] {
            assert_ne!(base, edit_payload_hash(&path(), &req(other, false)));
        }
    }
}
