//! The `exclude` patterns of `/v1/list`: which entries a listing leaves out (and does not
//! descend into).
//!
//! A pattern without `/` matches any one path component (`node_modules`, `*.log`, `build?`);
//! a pattern with `/` matches the whole path relative to the list's `path` (`src/gen`,
//! `docs/**/*.tmp`; a leading `/` anchors a single name there: `/build` is only the top-level
//! `build`). A trailing `/` is ignored (`build/` is `build`).
//! `*` is any run of characters within a component, `?` one character, and `**` as a whole
//! component any number of components (none included). There are no character classes,
//! braces or negations: `[`, `]`, `{`, `}` and `\` mean themselves.
//!
//! The patterns come from callers and the paths from the tree, so matching must stay linear
//! whatever either holds: a hand-written backtracking matcher is exponential in the number of
//! `**` against a deep path. `globset` (ripgrep's) compiles all patterns into one automaton
//! matched in time linear in the path; we only translate our spelling into its syntax.
//!
//! Excluding only ever hides entries; it never widens what the guard lets the caller see.

use crate::error::WorkspaceError;
use globset::{GlobBuilder, GlobSet, GlobSetBuilder};

/// Most patterns one list call takes.
pub const MAX_EXCLUDE_PATTERNS: usize = 64;
/// Longest accepted pattern.
const MAX_PATTERN_BYTES: usize = 256;

/// A list call's exclude patterns, compiled once.
#[derive(Debug, Clone, Default)]
pub struct Excludes {
    set: Option<GlobSet>,
}

impl Excludes {
    /// Parses and compiles `raw`; a malformed pattern is `invalid_request` naming it.
    pub fn parse(raw: &[String]) -> Result<Excludes, WorkspaceError> {
        if raw.len() > MAX_EXCLUDE_PATTERNS {
            return Err(WorkspaceError::InvalidRequest(format!(
                "at most {MAX_EXCLUDE_PATTERNS} exclude patterns"
            )));
        }
        if raw.is_empty() {
            return Ok(Excludes::default());
        }
        let invalid = |pattern: &str| {
            WorkspaceError::InvalidRequest(format!(
                "exclude pattern {pattern:?} must be 1..={MAX_PATTERN_BYTES} bytes of non-empty components, without . or .."
            ))
        };
        let mut set = GlobSetBuilder::new();
        for pattern in raw {
            let trimmed = pattern.trim_start_matches('/').trim_end_matches('/');
            let parts: Vec<&str> = trimmed.split('/').collect();
            if trimmed.is_empty()
                || pattern.len() > MAX_PATTERN_BYTES
                || parts
                    .iter()
                    .any(|p| p.is_empty() || *p == "." || *p == "..")
            {
                return Err(invalid(pattern));
            }
            let literal = escape_all_but_wildcards(trimmed);
            // A leading `/` anchors the pattern at the list root; a trailing one is ignored.
            let globs = if parts.len() == 1 && !pattern.starts_with('/') {
                // Any component: the entry itself, or an entry below one (`a/x/b` for `x`).
                vec![format!("**/{literal}"), format!("**/{literal}/**")]
            } else {
                vec![literal]
            };
            for glob in globs {
                let glob = GlobBuilder::new(&glob)
                    .literal_separator(true)
                    .backslash_escape(true)
                    .build()
                    .map_err(|_| invalid(pattern))?;
                set.add(glob);
            }
        }
        let set = set.build().map_err(|error| {
            WorkspaceError::InvalidRequest(format!("exclude patterns do not compile: {error}"))
        })?;
        Ok(Excludes { set: Some(set) })
    }

    /// Whether the entry at `relative` (to the list's `path`, `/`-separated) is left out.
    pub fn excludes(&self, relative: &str) -> bool {
        self.set.as_ref().is_some_and(|set| set.is_match(relative))
    }
}

/// `pattern` in globset's syntax with only `*`, `?` and `**` special: every other character
/// globset would read (`[`, `]`, `{`, `}`, `\`, `!`, `,`) is escaped.
fn escape_all_but_wildcards(pattern: &str) -> String {
    let mut escaped = String::with_capacity(pattern.len());
    for c in pattern.chars() {
        if matches!(c, '[' | ']' | '{' | '}' | '\\' | '!' | ',') {
            escaped.push('\\');
        }
        escaped.push(c);
    }
    escaped
}

#[cfg(test)]
mod tests {
    use super::*;

    fn excludes(patterns: &[&str]) -> Excludes {
        Excludes::parse(&patterns.iter().map(|p| p.to_string()).collect::<Vec<_>>()).unwrap()
    }

    #[test]
    fn a_pattern_without_a_slash_matches_any_component() {
        let e = excludes(&["node_modules", "*.log"]);
        assert!(e.excludes("node_modules"));
        assert!(e.excludes("web/node_modules/x/y.js"));
        assert!(e.excludes("logs/today.log"));
        assert!(!e.excludes("node_modules_extra"));
        assert!(!e.excludes("log/today.txt"));
    }

    #[test]
    fn a_pattern_with_a_slash_matches_from_the_list_root() {
        let e = excludes(&["src/gen", "/docs/**/*.tmp"]);
        assert!(e.excludes("src/gen"));
        assert!(!e.excludes("lib/src/gen"));
        assert!(
            !e.excludes("src/gen/a.rs"),
            "descendants are pruned by the walk, not matched"
        );
        assert!(e.excludes("docs/a.tmp"));
        assert!(e.excludes("docs/x/y/a.tmp"));
        assert!(!e.excludes("docs/x/a.md"));
        let trailing = excludes(&["build/"]);
        assert!(trailing.excludes("a/build"));
        let anchored = excludes(&["/build"]);
        assert!(anchored.excludes("build") && !anchored.excludes("a/build"));
    }

    #[test]
    fn wildcards_stay_within_a_component() {
        assert!(excludes(&["a*c"]).excludes("abbbc"));
        assert!(excludes(&["a?c"]).excludes("abc"));
        assert!(!excludes(&["a?c"]).excludes("ac"));
        assert!(!excludes(&["a?c"]).excludes("a/c"));
        assert!(excludes(&["*.é"]).excludes("x.é"));
        assert!(!excludes(&["*.rs"]).excludes("a.rsx"));
        assert!(excludes(&["**"]).excludes("anything"));
        let e = excludes(&["a/*"]);
        assert!(e.excludes("a/b"));
        assert!(!e.excludes("a/b/c"));
    }

    #[test]
    fn brackets_braces_and_backslashes_mean_themselves() {
        assert!(excludes(&["[ab]"]).excludes("[ab]"));
        assert!(!excludes(&["[ab]"]).excludes("a"));
        assert!(excludes(&["{a,b}"]).excludes("{a,b}"));
        assert!(!excludes(&["{a,b}"]).excludes("a"));
        assert!(excludes(&["a\\b"]).excludes("a\\b"));
        assert!(excludes(&["!x"]).excludes("!x"));
    }

    #[test]
    fn many_double_stars_against_a_deep_path_answer_at_once() {
        // A backtracking matcher tries every way to split 64 components among 80 `**`s.
        let pattern = format!("{}x", "**/".repeat(80));
        let e = excludes(&[pattern.as_str()]);
        let deep = vec!["a"; 64].join("/");
        assert!(!e.excludes(&deep));
        assert!(e.excludes(&format!("{deep}/x")));
    }

    #[test]
    fn bad_patterns_are_refused() {
        for bad in ["", "/", "a//b", "../x", "a/./b", &"x".repeat(300)] {
            assert!(Excludes::parse(&[bad.to_string()]).is_err(), "{bad:?}");
        }
        let many: Vec<String> = (0..=MAX_EXCLUDE_PATTERNS).map(|i| i.to_string()).collect();
        assert!(Excludes::parse(&many).is_err());
        assert!(!Excludes::default().excludes("anything"));
    }
}
