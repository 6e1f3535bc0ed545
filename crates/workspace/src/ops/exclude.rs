//! The `exclude` patterns of `/v1/list`: which entries a listing leaves out (and does not
//! descend into).
//!
//! A pattern without `/` matches any one path component (`node_modules`, `*.log`, `build?`);
//! a pattern with `/` matches the whole path relative to the list's `path` (`src/gen`,
//! `docs/**/*.tmp`; a leading `/` anchors a single name there: `/build` is only the top-level
//! `build`). A trailing `/` is ignored (`build/` is `build`).
//! `*` is any run of characters within a component, `?` one character, and `**` as a whole
//! component any number of components (none included). There are no character classes,
//! braces or negations: a pattern means only what it literally says.
//!
//! Why a small matcher of our own and not `globset`: `globset` is the maintained, widely used
//! crate, but it is not in this workspace's dependency tree (adding it means a new crate and
//! its `regex` automaton build for three wildcards), and these three wildcards are all a
//! listing needs; the matcher below is a few dozen lines, with no allocation per entry beyond
//! splitting, and its whole behaviour is tested here.
//!
//! Excluding only ever hides entries; it never widens what the guard lets the caller see.

use crate::error::WorkspaceError;

/// Most patterns one list call takes.
pub const MAX_EXCLUDE_PATTERNS: usize = 64;
/// Longest accepted pattern.
const MAX_PATTERN_BYTES: usize = 256;

/// One parsed pattern.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Pattern {
    /// Matches any single component.
    Component(String),
    /// Matches the whole relative path, component by component.
    Path(Vec<String>),
}

/// A list call's exclude patterns, parsed once.
#[derive(Debug, Clone, Default)]
pub struct Excludes {
    patterns: Vec<Pattern>,
}

impl Excludes {
    /// Parse the request's patterns; an empty, over-long or `.`/`..`-bearing one is refused.
    pub fn parse(raw: &[String]) -> Result<Excludes, WorkspaceError> {
        if raw.len() > MAX_EXCLUDE_PATTERNS {
            return Err(WorkspaceError::InvalidRequest(format!(
                "at most {MAX_EXCLUDE_PATTERNS} exclude patterns"
            )));
        }
        let mut patterns = Vec::with_capacity(raw.len());
        for pattern in raw {
            let trimmed = pattern.trim_start_matches('/').trim_end_matches('/');
            let parts: Vec<&str> = trimmed.split('/').collect();
            if trimmed.is_empty()
                || pattern.len() > MAX_PATTERN_BYTES
                || parts
                    .iter()
                    .any(|p| p.is_empty() || *p == "." || *p == "..")
            {
                return Err(WorkspaceError::InvalidRequest(format!(
                    "exclude pattern {pattern:?} must be 1..={MAX_PATTERN_BYTES} bytes of non-empty components, without . or .."
                )));
            }
            // A leading `/` anchors the pattern at the list root; a trailing one is ignored.
            let anchored = pattern.starts_with('/');
            patterns.push(if parts.len() == 1 && !anchored {
                Pattern::Component(trimmed.to_owned())
            } else {
                Pattern::Path(parts.into_iter().map(str::to_owned).collect())
            });
        }
        Ok(Excludes { patterns })
    }

    /// Whether `relative` (the entry's path below the list root, `/`-separated) is excluded.
    pub fn excludes(&self, relative: &str) -> bool {
        if self.patterns.is_empty() {
            return false;
        }
        let components: Vec<&str> = relative.split('/').collect();
        self.patterns.iter().any(|pattern| match pattern {
            Pattern::Component(glob) => components.iter().any(|c| component_matches(glob, c)),
            Pattern::Path(globs) => path_matches(globs, &components),
        })
    }
}

/// `globs` against `components`, `**` standing for any number of components.
fn path_matches(globs: &[String], components: &[&str]) -> bool {
    match globs.split_first() {
        None => components.is_empty(),
        Some((first, rest)) if first == "**" => {
            (0..=components.len()).any(|skip| path_matches(rest, &components[skip..]))
        }
        Some((first, rest)) => match components.split_first() {
            Some((component, remaining)) => {
                component_matches(first, component) && path_matches(rest, remaining)
            }
            None => false,
        },
    }
}

/// One component against a glob of `*` and `?` (a `**` inside a component is a `*`).
fn component_matches(glob: &str, component: &str) -> bool {
    let glob: Vec<char> = glob.chars().collect();
    let text: Vec<char> = component.chars().collect();
    // The classic greedy match with one backtrack point: linear in practice, never exponential.
    let (mut g, mut t) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while t < text.len() {
        if g < glob.len() && (glob[g] == '?' || glob[g] == text[t]) {
            g += 1;
            t += 1;
        } else if g < glob.len() && glob[g] == '*' {
            star = Some((g, t));
            g += 1;
        } else if let Some((star_g, star_t)) = star {
            g = star_g + 1;
            t = star_t + 1;
            star = Some((star_g, star_t + 1));
        } else {
            return false;
        }
    }
    glob[g..].iter().all(|c| *c == '*')
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
        assert!(component_matches("a*c", "abbbc"));
        assert!(component_matches("a?c", "abc"));
        assert!(!component_matches("a?c", "ac"));
        assert!(component_matches("*", ""));
        assert!(component_matches("*.é", "x.é"));
        assert!(!component_matches("*.rs", "a.rsx"));
        assert!(component_matches("**", "anything"));
        let e = excludes(&["a/*"]);
        assert!(e.excludes("a/b"));
        assert!(!e.excludes("a/b/c"));
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
