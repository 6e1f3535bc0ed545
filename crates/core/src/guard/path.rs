//! Project-relative paths, normalised and checked before anything opens them.
//!
//! A [`RelPath`] is the only path type the guard and workspaced accept from a caller. Parsing
//! refuses everything that could name something outside the project or a private file:
//! absolute paths, `..`, empty and `.` components, NUL, backslashes-as-separators confusion is
//! not interpreted (a backslash is an ordinary byte on Linux), components that start with a
//! dot (`.git/`, our own temp files and receipts fallback), and control and bidirectional
//! formatting characters ([`crate::text::is_control_or_bidi`]: a newline or an ESC in a name
//! forges the log lines and terminal output that show it, U+202E shows `txt.exe` as
//! `exe.txt`). Matching is by components, never by
//! string prefix, so `docs` never matches `docs2/x`.
//!
//! This module never touches the filesystem: confinement against symlinks happens when the path
//! is opened (`workspace::confine`, with `openat2`).

use std::fmt;

/// Longest relative path accepted, in bytes (Linux `PATH_MAX`).
pub const MAX_PATH_BYTES: usize = 4096;
/// Longest single component accepted, in bytes (Linux `NAME_MAX`).
pub const MAX_COMPONENT_BYTES: usize = 255;

/// Why a path was refused. Each reason is stable and reported to the caller as `reason`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PathError {
    #[error("path is empty; name a file inside the project, e.g. \"docs/readme.md\"")]
    Empty,
    #[error("path {path:?} is absolute; paths are relative to the project root")]
    Absolute { path: String },
    #[error("path {path:?} contains a NUL byte")]
    Nul { path: String },
    #[error(
        "path {path:?} contains the control or bidirectional formatting character {character:?}; names hold printable characters only"
    )]
    Control { path: String, character: char },
    #[error("path {path:?} contains a \"..\" component; traversal out of a folder is refused")]
    Traversal { path: String },
    #[error(
        "path {path:?} contains an empty or \".\" component; write it without \"//\" or \"/./\""
    )]
    EmptyComponent { path: String },
    #[error(
        "path {path:?} names a private file or folder ({component:?}); dot-files are never served"
    )]
    Private { path: String, component: String },
    #[error(
        "path {path:?} is longer than {MAX_PATH_BYTES} bytes or has a component over {MAX_COMPONENT_BYTES}"
    )]
    TooLong { path: String },
}

impl PathError {
    /// Stable machine-readable reason for the error envelope.
    pub fn reason(&self) -> &'static str {
        match self {
            PathError::Empty => "empty",
            PathError::Absolute { .. } => "absolute",
            PathError::Nul { .. } => "nul",
            PathError::Control { .. } => "control_character",
            PathError::Traversal { .. } => "traversal",
            PathError::EmptyComponent { .. } => "empty_component",
            PathError::Private { .. } => "private",
            PathError::TooLong { .. } => "too_long",
        }
    }
}

/// A normalised relative path inside a project: one or more components joined by `/`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct RelPath(String);

impl RelPath {
    /// Parse a caller-supplied path. A single trailing `/` is tolerated (folders are often
    /// written that way); everything else listed in the module doc is refused.
    pub fn parse(raw: &str) -> Result<RelPath, PathError> {
        if raw.contains('\0') {
            return Err(PathError::Nul {
                path: raw.replace('\0', "\\0"),
            });
        }
        if raw.is_empty() {
            return Err(PathError::Empty);
        }
        if let Some(character) = raw.chars().find(|&c| crate::text::is_control_or_bidi(c)) {
            return Err(PathError::Control {
                path: raw.chars().take(256).collect(),
                character,
            });
        }
        if raw.starts_with('/') {
            return Err(PathError::Absolute { path: raw.into() });
        }
        if raw.len() > MAX_PATH_BYTES {
            return Err(PathError::TooLong {
                path: raw.chars().take(64).collect(),
            });
        }
        let trimmed = raw.strip_suffix('/').unwrap_or(raw);
        for component in trimmed.split('/') {
            match component {
                "" | "." => return Err(PathError::EmptyComponent { path: raw.into() }),
                ".." => return Err(PathError::Traversal { path: raw.into() }),
                c if c.starts_with('.') => {
                    return Err(PathError::Private {
                        path: raw.into(),
                        component: c.into(),
                    });
                }
                c if c.len() > MAX_COMPONENT_BYTES => {
                    return Err(PathError::TooLong { path: raw.into() });
                }
                _ => {}
            }
        }
        Ok(RelPath(trimmed.to_owned()))
    }

    /// Parse a folder that may also be the project root itself, written `""`, `"."` or `"/"`
    /// (`None`). Used for listing, search and guard folders.
    pub fn parse_folder(raw: &str) -> Result<Option<RelPath>, PathError> {
        match raw {
            "" | "." | "/" | "./" => Ok(None),
            _ => RelPath::parse(raw).map(Some),
        }
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    pub fn components(&self) -> impl Iterator<Item = &str> {
        self.0.split('/')
    }

    /// The last component.
    pub fn file_name(&self) -> &str {
        self.0.rsplit('/').next().unwrap_or(&self.0)
    }

    /// Everything before the last component, if any.
    pub fn parent(&self) -> Option<RelPath> {
        self.0.rsplit_once('/').map(|(p, _)| RelPath(p.to_owned()))
    }

    /// True when `self` is `folder` or lies beneath it, compared component by component.
    pub fn is_within(&self, folder: &RelPath) -> bool {
        let mut mine = self.components();
        folder.components().all(|f| mine.next() == Some(f))
    }

    /// `self` joined with one more component (already known to be valid).
    pub fn join(&self, component: &str) -> Result<RelPath, PathError> {
        RelPath::parse(&format!("{}/{}", self.0, component))
    }
}

impl fmt::Display for RelPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_plain_relative_paths() {
        for ok in ["a", "a/b.txt", "code/task.py", "docs/", "ü/ñ.md", "a b/c"] {
            let p = RelPath::parse(ok).unwrap();
            assert!(!p.as_str().ends_with('/'), "{ok}");
        }
        assert_eq!(
            RelPath::parse("a/b/c").unwrap().parent().unwrap().as_str(),
            "a/b"
        );
        assert_eq!(RelPath::parse("a/b/c").unwrap().file_name(), "c");
        assert!(RelPath::parse("x").unwrap().parent().is_none());
    }

    #[test]
    fn refuses_every_escape_with_its_reason() {
        let cases = [
            ("", "empty"),
            ("/etc/passwd", "absolute"),
            ("a/\0b", "nul"),
            ("../x", "traversal"),
            ("a/../../x", "traversal"),
            ("a//b", "empty_component"),
            ("./a", "empty_component"),
            ("a/./b", "empty_component"),
            (".git/config", "private"),
            ("a/.env", "private"),
            ("a/.agentworks-tmp-1", "private"),
            ("..", "traversal"),
            ("a\nINFO forged.txt", "control_character"),
            ("docs/\x1b[2Jx", "control_character"),
            ("\u{9b}1;1H", "control_character"),
            ("invoice\u{202e}fdp.exe", "control_character"),
            ("a/\u{2066}b", "control_character"),
            ("tab\tname", "control_character"),
        ];
        for (raw, reason) in cases {
            let err = RelPath::parse(raw).unwrap_err();
            assert_eq!(err.reason(), reason, "{raw:?}: {err}");
        }
        let long = "a/".repeat(2100);
        assert_eq!(RelPath::parse(&long).unwrap_err().reason(), "too_long");
        let component = "x".repeat(256);
        assert_eq!(RelPath::parse(&component).unwrap_err().reason(), "too_long");
    }

    #[test]
    fn within_matches_components_not_prefixes() {
        let docs = RelPath::parse("docs").unwrap();
        assert!(RelPath::parse("docs/a.md").unwrap().is_within(&docs));
        assert!(RelPath::parse("docs").unwrap().is_within(&docs));
        assert!(!RelPath::parse("docs2/a.md").unwrap().is_within(&docs));
        assert!(!RelPath::parse("doc").unwrap().is_within(&docs));
        assert!(!RelPath::parse("a/docs/x").unwrap().is_within(&docs));
    }

    #[test]
    fn root_folder_spellings() {
        for root in ["", ".", "/", "./"] {
            assert!(RelPath::parse_folder(root).unwrap().is_none());
        }
        assert!(RelPath::parse_folder("../").is_err());
    }
}
