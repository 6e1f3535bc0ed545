//! The folder and policy guard: which project paths a caller may read and write.
//!
//! agentd resolves a [`Guard`] from live data (token scope ∩ role ∩ the token's `file_guard` ∩
//! project policy) and sends it with every request; workspaced (and later the executor)
//! re-applies it here. Blocked, read-only and protected paths win over write grants, and every
//! decision is made on [`RelPath`] components, never on string prefixes.
//!
//! This module never widens: a missing or malformed guard refuses, and an empty
//! `write_paths` means nothing is writable.

pub mod path;

pub use path::{PathError, RelPath};
use serde::{Deserialize, Serialize};

/// File names that are never written through agentworks, wherever they stand in a project.
pub const PROTECTED_FILE_NAMES: [&str; 2] = ["workflow.json", "product.json"];

/// The guard as it travels between daemons: folders written as project-relative paths, with
/// `""`, `"."` or `"/"` meaning the whole project.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Guard {
    /// Folders beneath which writes may happen. Empty: nothing is writable.
    #[serde(default)]
    pub write_paths: Vec<String>,
    /// Folders or files that are neither readable nor writable.
    #[serde(default)]
    pub blocked_paths: Vec<String>,
    /// Folders or files that are readable but never writable (policy `BlockedWritePaths`).
    #[serde(default)]
    pub blocked_write_paths: Vec<String>,
    /// Read-only grants: readable, never writable.
    #[serde(default)]
    pub read_only_paths: Vec<String>,
}

/// Why the guard refused. `reason()` is the stable string callers see.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GuardError {
    #[error("{path} is protected: {name} is never written through agentworks")]
    Protected { path: String, name: String },
    #[error("{path} is blocked by the project's policy or the token's folder caps")]
    Blocked { path: String },
    #[error("{path} is read-only for this caller")]
    ReadOnly { path: String },
    #[error("{path} is outside every folder this caller may write")]
    OutsideWritePaths { path: String },
    #[error("the guard itself is invalid ({field}: {source}); refusing rather than guessing")]
    Invalid {
        field: &'static str,
        source: PathError,
    },
}

impl GuardError {
    pub fn reason(&self) -> &'static str {
        match self {
            GuardError::Protected { .. } => "protected",
            GuardError::Blocked { .. } => "blocked",
            GuardError::ReadOnly { .. } => "read_only",
            GuardError::OutsideWritePaths { .. } => "outside_write_paths",
            GuardError::Invalid { .. } => "invalid_guard",
        }
    }
}

/// A guard whose folders have been parsed; `None` stands for the whole project.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResolvedGuard {
    write: Vec<Option<RelPath>>,
    blocked: Vec<Option<RelPath>>,
    no_write: Vec<Option<RelPath>>,
}

fn parse_all(field: &'static str, raw: &[String]) -> Result<Vec<Option<RelPath>>, GuardError> {
    raw.iter()
        .map(|p| RelPath::parse_folder(p).map_err(|source| GuardError::Invalid { field, source }))
        .collect()
}

fn covers(folders: &[Option<RelPath>], path: &RelPath) -> bool {
    folders.iter().any(|f| match f {
        None => true,
        Some(folder) => path.is_within(folder),
    })
}

impl Guard {
    /// Parse every folder; one bad entry refuses the whole guard.
    pub fn resolve(&self) -> Result<ResolvedGuard, GuardError> {
        let mut no_write = parse_all("blocked_write_paths", &self.blocked_write_paths)?;
        no_write.extend(parse_all("read_only_paths", &self.read_only_paths)?);
        Ok(ResolvedGuard {
            write: parse_all("write_paths", &self.write_paths)?,
            blocked: parse_all("blocked_paths", &self.blocked_paths)?,
            no_write,
        })
    }
}

impl ResolvedGuard {
    /// The write grants (`None`: the whole project), for a sandbox that enforces them itself.
    pub fn write_folders(&self) -> &[Option<RelPath>] {
        &self.write
    }

    /// The blocked paths (`None`: the whole project).
    pub fn blocked_folders(&self) -> &[Option<RelPath>] {
        &self.blocked
    }

    /// The paths readable but never writable (blocked writes and read-only grants).
    pub fn no_write_folders(&self) -> &[Option<RelPath>] {
        &self.no_write
    }

    /// May `path` be read (or listed)?
    pub fn check_read(&self, path: &RelPath) -> Result<(), GuardError> {
        if covers(&self.blocked, path) {
            return Err(GuardError::Blocked {
                path: path.to_string(),
            });
        }
        Ok(())
    }

    /// Is the whole project blocked from reading (a folder listing of the root)?
    pub fn root_blocked(&self) -> bool {
        self.blocked.iter().any(Option::is_none)
    }

    /// May `path` be created, replaced, moved or deleted? Protected, blocked and read-only
    /// paths are checked before write grants, so a grant never outranks them.
    pub fn check_write(&self, path: &RelPath) -> Result<(), GuardError> {
        if let Some(name) = path.components().find(|c| PROTECTED_FILE_NAMES.contains(c)) {
            return Err(GuardError::Protected {
                path: path.to_string(),
                name: name.to_owned(),
            });
        }
        self.check_read(path)?;
        if covers(&self.no_write, path) {
            return Err(GuardError::ReadOnly {
                path: path.to_string(),
            });
        }
        if !covers(&self.write, path) {
            return Err(GuardError::OutsideWritePaths {
                path: path.to_string(),
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn guard(
        write: &[&str],
        blocked: &[&str],
        blocked_write: &[&str],
        ro: &[&str],
    ) -> ResolvedGuard {
        let v = |x: &[&str]| x.iter().map(|s| s.to_string()).collect();
        Guard {
            write_paths: v(write),
            blocked_paths: v(blocked),
            blocked_write_paths: v(blocked_write),
            read_only_paths: v(ro),
        }
        .resolve()
        .unwrap()
    }

    fn p(s: &str) -> RelPath {
        RelPath::parse(s).unwrap()
    }

    #[test]
    fn empty_guard_reads_but_never_writes() {
        let g = guard(&[], &[], &[], &[]);
        assert!(g.check_read(&p("a.txt")).is_ok());
        assert_eq!(
            g.check_write(&p("a.txt")).unwrap_err().reason(),
            "outside_write_paths"
        );
    }

    #[test]
    fn precedence_protected_blocked_readonly_then_grants() {
        let g = guard(&["."], &["secret"], &["plans"], &["vendor"]);
        assert!(g.check_write(&p("code/task.py")).is_ok());
        assert_eq!(
            g.check_write(&p("workflow.json")).unwrap_err().reason(),
            "protected"
        );
        assert_eq!(
            g.check_write(&p("code/product.json")).unwrap_err().reason(),
            "protected"
        );
        assert_eq!(
            g.check_write(&p("secret/k")).unwrap_err().reason(),
            "blocked"
        );
        assert_eq!(
            g.check_read(&p("secret/k")).unwrap_err().reason(),
            "blocked"
        );
        assert_eq!(
            g.check_write(&p("plans/p.md")).unwrap_err().reason(),
            "read_only"
        );
        assert_eq!(
            g.check_write(&p("vendor/x")).unwrap_err().reason(),
            "read_only"
        );
        assert!(g.check_read(&p("plans/p.md")).is_ok());
        // Component matching: "secret2" is not "secret".
        assert!(g.check_write(&p("secret2/k")).is_ok());
    }

    #[test]
    fn write_paths_narrow_by_component() {
        let g = guard(&["code"], &[], &[], &[]);
        assert!(g.check_write(&p("code/a.py")).is_ok());
        assert_eq!(
            g.check_write(&p("codex/a.py")).unwrap_err().reason(),
            "outside_write_paths"
        );
        assert_eq!(
            g.check_write(&p("a.py")).unwrap_err().reason(),
            "outside_write_paths"
        );
    }

    #[test]
    fn a_bad_guard_entry_refuses_the_guard() {
        let g = Guard {
            write_paths: vec!["../".into()],
            ..Guard::default()
        };
        assert_eq!(g.resolve().unwrap_err().reason(), "invalid_guard");
        let unknown = serde_json::from_str::<Guard>(r#"{"write_paths":[],"allow_all":true}"#);
        assert!(unknown.is_err(), "unknown guard fields must not be ignored");
    }
}
